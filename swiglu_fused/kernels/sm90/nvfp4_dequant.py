"""nvfp4 weight → bf16 on sm_90a, for prefill: from dispatch_nvfp4.NVFP4_DEQUANT_M rows (nvfp4_dequantizes)
the nvfp4 GEMMs run as this kernel followed by the bf16 mainloop (TileConfig.dequantized), because
the W4A16 mainloop decodes every weight k tile once per M tile with the threads that also issue
the wgmma, and at prefill that decode, not the MMA, bounds the k loop (benchmarks/history/nvfp4.md).

    packed uint8 [N, K/2] (two e2m1 codes a byte), scale e4m3 [N, K/16]
        → w bf16 [N, K] = code · scale · 2^(DECODE_SHIFT - 126)

exactly the values the W4A16 mainloop decodes into shared memory (ptx.e2m1x2_to_bf16x2: exact in
bf16), so the GEMM after it multiplies its accumulator by the same global scale · 2^UNSHIFT and
the result is the W4A16 kernel's up to the order of the fp32 sums. The bf16 weight is a per-call
buffer: it exists from this kernel to the end of the GEMM (the caching allocator keeps the block
for the next layer's); no copy is kept with the module.

Thread ↔ data map: the weight, its scales and the output are flat arrays of 8-column chunks (rows
are whole chunks: K % 64 == 0, as for the W4A16 kernels): chunk j is packed word j (8 codes), scale
byte j // 2 and output 16 bytes j. Thread t of T takes chunks t, t + T, t + 2T, …, so each load and
store instruction of a warp covers contiguous bytes (a warp's 16-byte stores: 512 bytes in a row).
A tile-major weight (DequantConfig.tile_major, kernels/nvfp4_layout.py): thread t still takes
output chunks t, t + T, … (a warp's stores stay one contiguous run) and reads the word and scale
byte of that chunk where the reorder put them: output chunk 8·kt + c of row 256·tn + r is word
((tn · K/64 + kt) · 256 + r) · 8 + c, scale byte that // 2 (codes and scales are reordered alike), so
a warp's loads are 32-byte runs, whole sectors.
"""

from __future__ import annotations

from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32

from .ptx import e2m1x2_to_bf16x2, e2m1x8_to_bf16x2x4, e4m3x4_to_bf16x2
from .. import nvfp4_layout
from .tile_config import NVFP4_K_ALIGN

THREADS = 256
K_CHUNKS = nvfp4_layout.K_TILE // 8  # 8-column chunks of a row in a k tile


@dataclass(frozen=True)
class DequantConfig:
    """Compile-time configuration of the nvfp4 dequantization (the cache key)."""

    threads: int = THREADS
    chunks_per_thread: int = 4  # 8-column chunks a thread (loads in flight together)
    tile_major: bool = False  # the weight and scales in nvfp4_layout's tile-major order


class DequantKernel:
    def __init__(self, config: DequantConfig):
        self.config = config

    @cute.jit
    def __call__(self, w_ptr: cute.Pointer, s_ptr: cute.Pointer, out_ptr: cute.Pointer, chunks: Int32,
                 row_chunks: Int32, stream: cuda.CUstream):
        mW = cute.make_tensor(cute.recast_ptr(w_ptr, dtype=Int32), cute.make_layout(chunks))
        mS = cute.make_tensor(s_ptr, cute.make_layout(chunks // 2))
        mO = cute.make_tensor(cute.recast_ptr(out_ptr, dtype=Int32), cute.make_layout((4, chunks), stride=(1, 4)))
        cfg = self.config
        per_cta = cfg.threads * cfg.chunks_per_thread
        grid = (chunks + per_cta - 1) // per_cta
        self.kernel(mW, mS, mO, chunks, row_chunks).launch(grid=[grid, 1, 1], block=[cfg.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mW: cute.Tensor, mS: cute.Tensor, mO: cute.Tensor, chunks: Int32, row_chunks: Int32):
        cfg = self.config
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        base = bidx * (cfg.threads * cfg.chunks_per_thread) + tidx
        copy16 = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Int32, num_bits_per_copy=128)
        # all loads first (more bytes in flight), then decode and store
        words, scales = [], []
        for i in cutlass.range_constexpr(cfg.chunks_per_thread):
            # (clamped loads; the stores are masked)
            j = self._in_chunk(cutlass.min(base + i * cfg.threads, chunks - 1), row_chunks)
            words.append(mW[j])
            scales.append(Int32(mS[j // 2]))
        out = cute.make_rmem_tensor(cute.make_layout(4), Int32)
        for i in cutlass.range_constexpr(cfg.chunks_per_thread):
            j = base + i * cfg.threads
            scale2 = e4m3x4_to_bf16x2(scales[i])[0]  # the chunk's scale · 2^DECODE_SHIFT, both halves
            w = words[i]
            if cutlass.const_expr(cfg.tile_major):  # (its words' bits in the decode order)
                for b, pair in enumerate(e2m1x8_to_bf16x2x4(w, scale2)):
                    out[b] = pair
            else:
                w4 = w >> 4
                for b in cutlass.range_constexpr(4):
                    out[b] = e2m1x2_to_bf16x2(w, w4, b, scale2)
            if j < chunks:
                cute.copy(copy16, out, mO[(None, j)])

    def _in_chunk(self, j, row_chunks):
        """The weight chunk (word) that output chunk j decodes (K / 8 = row_chunks chunks a row;
        module docstring)."""
        if cutlass.const_expr(not self.config.tile_major):
            return j
        row, col = j // row_chunks, j % row_chunks
        tile_k, c = col // K_CHUNKS, col % K_CHUNKS
        tile_n, r = row // nvfp4_layout.ROWS, row % nvfp4_layout.ROWS
        return ((tile_n * (row_chunks // K_CHUNKS) + tile_k) * nvfp4_layout.ROWS + r) * K_CHUNKS + c


# ---------------------------------------------------------------- host side
def compile_dequant(config: DequantConfig = DequantConfig()):
    """Compile for sm_90a (no GPU needed)."""
    from .compile_cache import COMPILE_OPTIONS, fake_ptr, null_stream

    return cute.compile(DequantKernel(config), fake_ptr(cutlass.Uint8, 16), fake_ptr(cutlass.Uint8, 4),
                        fake_ptr(cutlass.BFloat16, 16), Int32(2), Int32(K_CHUNKS), null_stream(),
                        options=COMPILE_OPTIONS)


def shipped_configs() -> list[DequantConfig]:
    return [DequantConfig(), DequantConfig(tile_major=True)]


def dequantize(weight, weight_scale, *, out=None, tile_major: bool = False):
    """The nvfp4 weight [N, K/2] and its scales [N, K/16] (CUDA, contiguous, K % 64 == 0; the caller
    validates; ``tile_major``: in nvfp4_layout's tile-major order) → bf16 [N, K] of
    code · scale · 2^(DECODE_SHIFT - 126), row-major; ``out`` writes into a given tensor."""
    import torch

    from . import compile_cache

    n, k = weight.shape[0], 2 * weight.shape[1]
    if k % NVFP4_K_ALIGN:
        raise ValueError(f"weight: K = {k} is not a multiple of {NVFP4_K_ALIGN}, which the dequantization needs")
    if out is None:
        out = torch.empty((n, k), dtype=torch.bfloat16, device=weight.device)
    if n == 0 or k == 0:
        return out
    if tile_major and not nvfp4_layout.fits(n, k):
        raise ValueError(f"weight: a tile-major weight has whole {nvfp4_layout.ROWS}-row tiles, got N = {n}")
    config = DequantConfig(tile_major=tile_major)
    fn = compile_cache.get("nvfp4_dequant", config, lambda: compile_dequant(config))
    stream = cuda.CUstream(torch.cuda.current_stream(weight.device).cuda_stream)
    fn(compile_cache.ptr(cutlass.Uint8, weight, 16), compile_cache.ptr(cutlass.Uint8, weight_scale, 4),
       compile_cache.ptr(cutlass.BFloat16, out, 16), Int32(n * k // 8), Int32(k // 8), stream)
    return out
