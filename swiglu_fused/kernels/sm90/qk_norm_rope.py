"""Flux.2's per-head RMS norm and rotary embedding of Q (or K) in one pass, on sm_90a: x bf16 [T, heads·128]
(any row stride, 16-byte rows) → out bf16 (its own row stride). Ground truth: reference.qk_norm_rope.

diffusers runs these steps between the split projection and the attention as ~20 elementwise kernels
with fp32 intermediates, ~0.85 ms of a single-stream block at Flux.2-dev width and 4608 tokens on the
H200 (benchmarks/history/flux2.md); one pass reads and writes each value once.

Sixteen threads take a head's 128 columns of one token, 8 each (one 16-byte load): the sum of squares
is reduced over the 16 lanes by butterfly shuffles, each value is normed in fp32 ((x · rstd) · w, as
torch.nn.RMSNorm) and rounded to bf16, then each pair (2i, 2i + 1), the low and high halves of one
word, is rotated by its token's cos and sin (fp32, row t % S of the [S, 128] tables: the batch's
sequences one after the other) as x·cos + rot(x)·sin, rounded once. Memory-bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .ptx import bf16_hi_to_f32, bf16_lo_to_f32, cvt_bf16x2

HEAD_DIM = 128  # Flux.2's (attention_head_dim)
CHUNK_WORDS = 4  # a thread's 8 columns: one 16-byte chunk of bf16 pairs
LANES = HEAD_DIM // (2 * CHUNK_WORDS)  # threads a head: 16


@dataclass(frozen=True)
class QkNormRopeConfig:
    """Compile-time configuration (the cache key)."""

    threads: int = 256

    def __post_init__(self):
        if self.threads not in (128, 256, 512):
            raise ValueError(f"QkNormRopeConfig.threads: expected 128, 256 or 512, got {self.threads}")


class QkNormRopeKernel:
    def __init__(self, config: QkNormRopeConfig):
        self.config = config

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, o_ptr: cute.Pointer, w_ptr: cute.Pointer, cos_ptr: cute.Pointer,
                 sin_ptr: cute.Pointer, t: Int32, heads: Int32, s: Int32, ld: Int32, ldo: Int32, eps: Float32,
                 stream: cuda.CUstream):
        """ld, ldo: the rows' strides in words (bf16 pairs), multiples of CHUNK_WORDS."""
        cfg = self.config
        ld4, ldo4 = cute.assume(ld, divby=CHUNK_WORDS), cute.assume(ldo, divby=CHUNK_WORDS)
        mX = cute.make_tensor(cute.recast_ptr(x_ptr, dtype=Int32), cute.make_layout((t, ld4), stride=(ld4, 1)))
        mO = cute.make_tensor(cute.recast_ptr(o_ptr, dtype=Int32), cute.make_layout((t, ldo4), stride=(ldo4, 1)))
        mW = cute.make_tensor(cute.recast_ptr(w_ptr, dtype=Int32), cute.make_layout((1, HEAD_DIM // 2)))
        mC = cute.make_tensor(cos_ptr, cute.make_layout((s, HEAD_DIM), stride=(HEAD_DIM, 1)))
        mS = cute.make_tensor(sin_ptr, cute.make_layout((s, HEAD_DIM), stride=(HEAD_DIM, 1)))
        grid = (t * heads * LANES + cfg.threads - 1) // cfg.threads
        self.kernel(mX, mO, mW, mC, mS, t, heads, s, eps).launch(grid=[grid, 1, 1], block=[cfg.threads, 1, 1],
                                                                 stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mO: cute.Tensor, mW: cute.Tensor, mC: cute.Tensor, mS: cute.Tensor, t: Int32,
               heads: Int32, s: Int32, eps: Float32):
        cfg = self.config
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        idx = bidx * cfg.threads + tidx
        head_row = idx // LANES
        lane = idx - head_row * LANES
        tok = head_row // heads
        chunk = (head_row - tok * heads) * LANES + lane  # the token's 16-byte chunk
        vec = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Int32, num_bits_per_copy=32 * CHUNK_WORDS)
        vecf = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32, num_bits_per_copy=32 * CHUNK_WORDS)
        words = cute.make_layout(CHUNK_WORDS)
        x = cute.make_rmem_tensor(words, Int32)
        w = cute.make_rmem_tensor(words, Int32)
        c = cute.make_rmem_tensor(cute.make_layout(2 * CHUNK_WORDS), Float32)
        sn = cute.make_rmem_tensor(cute.make_layout(2 * CHUNK_WORDS), Float32)
        o = cute.make_rmem_tensor(words, Int32)
        live = tok < t
        tok = cutlass.min(tok, t - 1)  # (a dead lane computes a live token's values: the shuffles see whole warps)
        cute.copy(vec, cute.zipped_divide(mX, (1, CHUNK_WORDS))[((0, None), (tok, chunk))], x)
        cute.copy(vec, cute.zipped_divide(mW, (1, CHUNK_WORDS))[((0, None), (0, lane))], w)
        pos = tok % s
        gC = cute.zipped_divide(mC, (1, CHUNK_WORDS))
        gS = cute.zipped_divide(mS, (1, CHUNK_WORDS))
        for half in cutlass.range_constexpr(2):
            cute.copy(vecf, gC[((0, None), (pos, 2 * lane + half))],
                      cute.make_tensor(c.iterator + CHUNK_WORDS * half, words))
            cute.copy(vecf, gS[((0, None), (pos, 2 * lane + half))],
                      cute.make_tensor(sn.iterator + CHUNK_WORDS * half, words))
        ss = Float32(0.0)
        for i in cutlass.range_constexpr(CHUNK_WORDS):
            lo, hi = bf16_lo_to_f32(x[i]), bf16_hi_to_f32(x[i])
            ss = ss + lo * lo + hi * hi
        for off in cutlass.range_constexpr(4):  # the head's 16 lanes
            ss = ss + cute.arch.shuffle_sync_bfly(ss, offset=LANES >> (off + 1))
        rstd = cute.math.rsqrt(ss * Float32(1.0 / HEAD_DIM) + eps)
        for i in cutlass.range_constexpr(CHUNK_WORDS):
            # normed, rounded to bf16 (the norm's output), back in fp32 for the rotation
            nw = cvt_bf16x2(bf16_lo_to_f32(x[i]) * rstd * bf16_lo_to_f32(w[i]),
                            bf16_hi_to_f32(x[i]) * rstd * bf16_hi_to_f32(w[i]))
            a, b = bf16_lo_to_f32(nw), bf16_hi_to_f32(nw)
            o[i] = cvt_bf16x2(a * c[2 * i] + (-b) * sn[2 * i], b * c[2 * i + 1] + a * sn[2 * i + 1])
        if live:
            cute.copy(vec, o, cute.zipped_divide(mO, (1, CHUNK_WORDS))[((0, None), (tok, chunk))])


# ---------------------------------------------------------------- host side
def compile_qk_norm_rope(config: QkNormRopeConfig = QkNormRopeConfig()):
    """Compile for sm_90a (works without a GPU: pointers are fake, sizes are runtime Int32)."""
    from .compile_cache import COMPILE_OPTIONS, fake_ptr, null_stream

    return cute.compile(QkNormRopeKernel(config), fake_ptr(cutlass.BFloat16, 16), fake_ptr(cutlass.BFloat16, 16),
                        fake_ptr(cutlass.BFloat16, 16), fake_ptr(Float32, 16), fake_ptr(Float32, 16), Int32(1),
                        Int32(1), Int32(1), Int32(CHUNK_WORDS), Int32(CHUNK_WORDS), Float32(1e-6), null_stream(),
                        options=COMPILE_OPTIONS)


def shipped_configs() -> list[QkNormRopeConfig]:
    return [QkNormRopeConfig()]


def takes(q, k, weight_q, weight_k, cos, sin) -> bool:
    """Whether the kernel reads these (the ops' validated arguments): CUDA bf16 q, k with unit column
    stride and 16-byte aligned rows, head dim 128, bf16 weights and fp32 [S, 128] tables, contiguous,
    offsets within its 32-bit indexing."""
    import torch

    def rows_ok(x):
        return (x.is_cuda and x.dtype == torch.bfloat16 and x.stride(1) == 1 and x.stride(0) % 8 == 0
                and x.data_ptr() % 16 == 0 and x.shape[0] * x.stride(0) < 2 ** 31)

    return (weight_q.numel() == HEAD_DIM and rows_ok(q) and rows_ok(k)
            and all(w.dtype == torch.bfloat16 and w.is_contiguous() and w.data_ptr() % 16 == 0 and w.is_cuda
                    for w in (weight_q, weight_k))
            and all(t.dtype == torch.float32 and t.is_contiguous() and t.data_ptr() % 16 == 0 and t.is_cuda
                    for t in (cos, sin)))


def qk_norm_rope(q, k, weight_q, weight_k, cos, sin, eps: float, out=None):
    """Q', K' bf16 [2, T, inner] (``takes``; the caller checks), into ``out`` (the tests' poisoned one:
    contiguous, 16-byte aligned) or a new tensor: two launches, Q's then K's."""
    import torch

    from . import compile_cache

    t, inner = q.shape
    out = torch.empty(2, t, inner, dtype=torch.bfloat16, device=q.device) if out is None else out
    if t == 0:
        return out
    config = QkNormRopeConfig()
    fn = compile_cache.get("qk_norm_rope", config, lambda: compile_qk_norm_rope(config))
    stream = cuda.CUstream(torch.cuda.current_stream(q.device).cuda_stream)
    for x, w, o in ((q, weight_q, out[0]), (k, weight_k, out[1])):
        fn(compile_cache.ptr(cutlass.BFloat16, x, 16), compile_cache.ptr(cutlass.BFloat16, o, 16),
           compile_cache.ptr(cutlass.BFloat16, w, 16), compile_cache.ptr(Float32, cos, 16),
           compile_cache.ptr(Float32, sin, 16), Int32(t), Int32(inner // HEAD_DIM), Int32(cos.shape[0]),
           Int32(x.stride(0) // 2), Int32(o.stride(0) // 2), Float32(eps), stream)
    return out
