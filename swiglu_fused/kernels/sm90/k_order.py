"""The activations' k order of nvfp4's register-sourced tiles on sm_90a (DISPATCH D45): x [M, K] bf16 →
a new x with each 64-column k tile in nvfp4_layout.rs_k_order (ground truth: that function, whose
torch copy ran at 1-2 TB/s: history/nvfp4.md v28).

A column pair (4 bytes) is the unit: in 32-bit words, word 8j + 4c + q of a k tile (its 32 words)
comes from word 8q + 4c + j. Thread t takes one 16-byte chunk of the output, chunk a = 2j + c of
its k tile, i.e. the words (j, c, q = 0..3), and loads them from the four input words 8q + 4c + j
(32 bytes apart, inside the same 128-byte k tile, so the warp's four loads read each input line
once); one 16-byte store. Memory-bound; a warp writes 512 contiguous bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32

from .. import nvfp4_layout

WORDS = nvfp4_layout.K_TILE // 2  # 32-bit words (column pairs) of a k tile's row
CHUNK_WORDS = 4  # a thread's output: one 16-byte chunk


@dataclass(frozen=True)
class KOrderConfig:
    """Compile-time configuration (the cache key)."""

    threads: int = 256

    def __post_init__(self):
        if self.threads not in (128, 256, 512):
            raise ValueError(f"KOrderConfig.threads: expected 128, 256 or 512, got {self.threads}")


class KOrderKernel:
    def __init__(self, config: KOrderConfig):
        self.config = config

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, o_ptr: cute.Pointer, m: Int32, chunks_v: Int32, stream: cuda.CUstream):
        cfg = self.config
        chunks = cute.assume(chunks_v * (WORDS // CHUNK_WORDS), divby=WORDS // CHUNK_WORDS)  # per row
        words = cute.assume(chunks * CHUNK_WORDS, divby=WORDS)
        layout = cute.make_layout((m, words), stride=(words, 1))
        mX = cute.make_tensor(cute.recast_ptr(x_ptr, dtype=Int32), layout)
        mO = cute.make_tensor(cute.recast_ptr(o_ptr, dtype=Int32), layout)
        grid = (m * chunks + cfg.threads - 1) // cfg.threads
        self.kernel(mX, mO, m, chunks).launch(grid=[grid, 1, 1], block=[cfg.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mO: cute.Tensor, m: Int32, chunks: Int32):
        cfg = self.config
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        idx = bidx * cfg.threads + tidx
        row = idx // chunks
        chunk = idx - row * chunks
        gO = cute.zipped_divide(mO, (1, CHUNK_WORDS))  # ((1, 4), (M, chunks)) in words
        store = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Int32, num_bits_per_copy=32 * CHUNK_WORDS)
        if row < m:
            a = chunk % (WORDS // CHUNK_WORDS)  # 2j + c
            src = (chunk - a) * CHUNK_WORDS + 4 * (a % 2) + a // 2  # word 4c + j of the k tile
            words = cute.make_rmem_tensor(cute.make_layout(CHUNK_WORDS), Int32)
            for q in cutlass.range_constexpr(CHUNK_WORDS):
                words[q] = mX[row, src + 8 * q]
            cute.copy(store, words, gO[((0, None), (row, chunk))])


# ---------------------------------------------------------------- host side
def compile_k_order(config: KOrderConfig = KOrderConfig()):
    """Compile for sm_90a (works without a GPU: pointers are fake, sizes are runtime Int32)."""
    from .compile_cache import COMPILE_OPTIONS, fake_ptr, null_stream

    return cute.compile(KOrderKernel(config), fake_ptr(cutlass.BFloat16, 16), fake_ptr(cutlass.BFloat16, 16),
                        Int32(1), Int32(1), null_stream(), options=COMPILE_OPTIONS)


def shipped_configs() -> list[KOrderConfig]:
    return [KOrderConfig()]


def rs_order(x):
    """nvfp4_layout.rs_k_order(x) for the launchers: this kernel where x is what it reads (contiguous
    CUDA bf16, 16-byte aligned), else the torch copy."""
    import torch

    if x.is_cuda and x.dtype == torch.bfloat16 and x.dim() == 2 and x.is_contiguous() and x.data_ptr() % 16 == 0:
        return k_order(x)
    return nvfp4_layout.rs_k_order(x)


def k_order(x, config: KOrderConfig = KOrderConfig()):
    """nvfp4_layout.rs_k_order of a contiguous CUDA bf16 x [M, K] (K % 64 == 0, 16-byte aligned; the
    launchers of gate_up and down check): a new tensor."""
    import torch

    from . import compile_cache

    m, k = x.shape
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if m == 0:
        return out
    fn = compile_cache.get("k_order", config, lambda: compile_k_order(config))
    stream = cuda.CUstream(torch.cuda.current_stream(x.device).cuda_stream)
    fn(compile_cache.ptr(cutlass.BFloat16, x, 16), compile_cache.ptr(cutlass.BFloat16, out, 16), Int32(m),
       Int32(k // nvfp4_layout.K_TILE), stream)
    return out
