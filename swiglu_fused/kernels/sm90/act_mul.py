"""act(gate) · up of a GEMM's output in the packed column order, on sm_90a: y [M, 2I] bf16, its
columns in chunks of 2g (g = 128: g gate columns, then their g up columns) → h [M, I] bf16. The
second half of bf16 gate_up where cuBLAS's GEMM runs the first (DISPATCH D53); ground truth:
reference.gate_up_epilogue on y. ``scaled``: y is the GEMM over an nvfp4 weight dequantized for the
call (nvfp4_dequant.py: the true weight · 2^-UNSHIFT), and gate and up are first multiplied by their
global scale multipliers [2] (read from device memory: no host sync) · 2^UNSHIFT, as the W4A16 and
dequantized GEMMs' epilogues do.

Thread t takes one 16-byte chunk of h (8 columns, 4 words of two bf16): it loads the gate and up
chunks behind it (16 bytes each, g columns apart), computes act(gate) · up in fp32 with the GEMM
epilogues' activation functions (activations_and_h), rounds once to bf16 and stores 16 bytes.
Memory-bound; a warp reads 2 × 512 and writes 512 contiguous bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from ... import formats
from .activations_and_h import ACTIVATIONS, activation
from .ptx import DECODE_SHIFT, bf16_hi_to_f32, bf16_lo_to_f32, cvt_bf16x2

G = formats.FP8_BLOCK  # the interleave the sm90 kernels take (dispatch.GROUP)
CHUNK_WORDS = 4  # a thread's output: one 16-byte chunk, 8 bf16
CHUNKS_PER_GROUP = G // (2 * CHUNK_WORDS)  # 16-byte chunks of h a pair of g-column groups makes
UNSHIFT = 126 - DECODE_SHIFT  # (nvfp4.UNSHIFT: the dequantized weight is the true one · 2^-UNSHIFT)


@dataclass(frozen=True)
class ActMulConfig:
    """Compile-time configuration (the cache key)."""

    act: str = formats.ACTIVATIONS[0]
    threads: int = 256
    scaled: bool = False

    def __post_init__(self):
        activation(self.act)  # raises naming act
        if self.threads not in (128, 256, 512):
            raise ValueError(f"ActMulConfig.threads: expected 128, 256 or 512, got {self.threads}")


class ActMulKernel:
    def __init__(self, config: ActMulConfig):
        self.config = config

    @cute.jit
    def __call__(self, y_ptr: cute.Pointer, h_ptr: cute.Pointer, s_ptr: cute.Pointer, m: Int32, groups_v: Int32,
                 stream: cuda.CUstream):
        cfg = self.config
        chunks = cute.assume(groups_v * CHUNKS_PER_GROUP, divby=CHUNKS_PER_GROUP)  # h's 16-byte chunks a row
        h_words = cute.assume(chunks * CHUNK_WORDS, divby=G // 2)
        mY = cute.make_tensor(cute.recast_ptr(y_ptr, dtype=Int32), cute.make_layout((m, 2 * h_words),
                                                                                     stride=(2 * h_words, 1)))
        mH = cute.make_tensor(cute.recast_ptr(h_ptr, dtype=Int32), cute.make_layout((m, h_words),
                                                                                     stride=(h_words, 1)))
        mS = cute.make_tensor(s_ptr, cute.make_layout(2))
        grid = (m * chunks + cfg.threads - 1) // cfg.threads
        self.kernel(mY, mH, mS, m, chunks).launch(grid=[grid, 1, 1], block=[cfg.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mY: cute.Tensor, mH: cute.Tensor, mS: cute.Tensor, m: Int32, chunks: Int32):
        cfg = self.config
        act = activation(cfg.act)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        idx = bidx * cfg.threads + tidx
        row = idx // chunks
        chunk = idx - row * chunks
        gY = cute.zipped_divide(mY, (1, CHUNK_WORDS))  # ((1, 4), (M, 2 · chunks)) in words
        gH = cute.zipped_divide(mH, (1, CHUNK_WORDS))
        vec = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Int32, num_bits_per_copy=32 * CHUNK_WORDS)
        if row < m:
            group = chunk // CHUNKS_PER_GROUP
            gate = chunk + group * CHUNKS_PER_GROUP  # y's chunk: the group's gate half, then its up half
            words = cute.make_layout(CHUNK_WORDS)
            g = cute.make_rmem_tensor(words, Int32)
            u = cute.make_rmem_tensor(words, Int32)
            h = cute.make_rmem_tensor(words, Int32)
            cute.copy(vec, gY[((0, None), (row, gate))], g)
            cute.copy(vec, gY[((0, None), (row, gate + CHUNKS_PER_GROUP))], u)
            sg, su = Float32(1.0), Float32(1.0)
            if cutlass.const_expr(cfg.scaled):
                sg, su = mS[0] * Float32(2.0 ** UNSHIFT), mS[1] * Float32(2.0 ** UNSHIFT)
            for w in cutlass.range_constexpr(CHUNK_WORDS):
                h[w] = cvt_bf16x2(act(bf16_lo_to_f32(g[w]) * sg) * (bf16_lo_to_f32(u[w]) * su),
                                  act(bf16_hi_to_f32(g[w]) * sg) * (bf16_hi_to_f32(u[w]) * su))
            cute.copy(vec, h, gH[((0, None), (row, chunk))])


# ---------------------------------------------------------------- host side
def compile_act_mul(config: ActMulConfig = ActMulConfig()):
    """Compile for sm_90a (works without a GPU: pointers are fake, sizes are runtime Int32)."""
    from .compile_cache import COMPILE_OPTIONS, fake_ptr, null_stream

    return cute.compile(ActMulKernel(config), fake_ptr(cutlass.BFloat16, 16), fake_ptr(cutlass.BFloat16, 16),
                        fake_ptr(Float32, 4), Int32(1), Int32(1), null_stream(), options=COMPILE_OPTIONS)


def shipped_configs() -> list[ActMulConfig]:
    return [ActMulConfig(act=a, scaled=s) for a in ACTIVATIONS for s in (False, True)]


def takes(y) -> bool:
    """Whether the kernel reads this y: contiguous CUDA bf16 [M, 2I] with I a multiple of g, 16-byte
    aligned, whose word offsets fit its 32-bit indexing."""
    import torch

    return (y.is_cuda and y.dtype == torch.bfloat16 and y.dim() == 2 and y.is_contiguous()
            and y.shape[1] % (2 * G) == 0 and y.data_ptr() % 16 == 0 and y.numel() // 2 < 2 ** 31)


def act_mul(y, act: str = formats.ACTIVATIONS[0], out=None, multipliers=None):
    """h [M, I] bf16 = act(gate) · up of y [M, 2I] (``takes(y)``; the caller checks), into ``out``
    (contiguous, 16-byte aligned: the tests' poisoned h) or a new tensor. ``multipliers``: fp32 [2] on
    y's device (gate, up), each times 2^UNSHIFT first (y over a dequantized nvfp4 weight)."""
    import torch

    from . import compile_cache

    m, n = y.shape
    h = torch.empty(m, n // 2, dtype=torch.bfloat16, device=y.device) if out is None else out
    if m == 0:
        return h
    config = ActMulConfig(act=act, scaled=multipliers is not None)
    fn = compile_cache.get("act_mul", config, lambda: compile_act_mul(config))
    stream = cuda.CUstream(torch.cuda.current_stream(y.device).cuda_stream)
    s = multipliers.contiguous() if multipliers is not None else y  # (not read unscaled)
    fn(compile_cache.ptr(cutlass.BFloat16, y, 16), compile_cache.ptr(cutlass.BFloat16, h, 16),
       compile_cache.ptr(Float32, s, 4), Int32(m), Int32(n // (2 * G)), stream)
    return h
