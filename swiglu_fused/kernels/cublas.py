"""bf16 gate_up's GEMM where dispatch.bf16_gate_up_on_cublas predicts it faster with a separate
act·mul (D53), and down on CUDA through cuBLAS: ops.down's path wherever the sm90 down kernel (sm90/down.py) was
not measured faster (dispatch.beats_cublas: for bf16 where the kernel's tiles do not fill the SMs
or M > 4096; for fp8 all but the decode tiles, small M with a long K shared out by stream-K, and
the static 128-row tile's whole waves), and for fp16/fp32 outputs, non-bf16 residuals, GPUs other
than sm_90, SWIGLU_FUSED_DISABLE_KERNELS=1.

fp8_block128: ``torch._scaled_mm`` with 1×128 activation scales and 128×128 weight scales (cuBLAS
block scaling, Hopper and later); bf16: a plain cuBLAS GEMM. Both give the reference's numbers up
to fp32 summation order (the residual is added after the bf16 rounding, a second rounding the
tolerance of DESIGN §4 covers).
"""

from __future__ import annotations

import torch

from .. import formats, quant

FP8 = torch.float8_e4m3fn
# cuBLAS' block-scaled heuristics reject some row counts (M = 1 and M = 10 seen on the H100, while
# 16, 64 and 300 run); rows are padded to a multiple of this, which costs a copy of h only then.
ROWS = 16
# The 128×128 weight scales reach cuBLAS transposed, K/128 floats apart: with K/128 not a multiple of
# this (16-byte strides) torch._scaled_mm accepts them and returns wrong values (H200, torch 2.11:
# K = 1664, relative error ~1e3), and it refuses them padded to that stride; such K (down's I or an
# attention linear's H not a multiple of 512, e.g. I = 11008, H = 896) run on the sm90 kernel, or the
# reference.
SCALE_STRIDE_BLOCKS = 4


def reads_scales_right(k: int) -> bool:
    """Whether cuBLAS's block-scaled GEMM gets a K-column fp8 weight's 128×128 scales right
    (SCALE_STRIDE_BLOCKS)."""
    return k % (formats.FP8_BLOCK * SCALE_STRIDE_BLOCKS) == 0


def _pad_rows(h: torch.Tensor, h_scale: torch.Tensor, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """pad zero rows (scale 1); the scales come out M-major, as cuBLAS reads them."""
    if pad == 0:
        return h, h_scale
    zeros = torch.zeros(pad, h.shape[1], dtype=torch.uint8, device=h.device)
    h = torch.cat([h.view(torch.uint8), zeros]).view(FP8)
    return h, torch.cat([h_scale.t(), h_scale.new_ones(h_scale.shape[1], pad)], dim=1).t()


def supports_down(h: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor | None,
                  h_scale: torch.Tensor | None, global_scale: torch.Tensor | None) -> bool:
    """Whether cuBLAS can run this down projection (else the reference does)."""
    if h.device.type != "cuda" or global_scale is not None:
        return False
    if weight.dtype == torch.bfloat16:
        return h.dtype == torch.bfloat16
    n, k = weight.shape
    return (weight.dtype == FP8 and h.dtype == FP8 and weight_scale is not None and h_scale is not None
            and weight_scale.dtype == torch.float32 and n % formats.FP8_BLOCK == 0
            and reads_scales_right(k) and torch.cuda.get_device_capability(h.device) >= (9, 0))


def supports_gate_up(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether bf16 gate_up can run as cuBLAS's GEMM + the sm90 act·mul (sm90/act_mul.py; the
    dispatch has checked the kernels are usable and the interleave is theirs), on a bf16 weight or an
    nvfp4 one dequantized for the call (uint8: the dispatch has checked it is at a prefill M)."""
    return (x.is_cuda and x.dtype == torch.bfloat16 and weight.dtype in (torch.bfloat16, torch.uint8)
            and weight.shape[0] % (2 * formats.FP8_BLOCK) == 0)


def gate_up_gemm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """bf16 gate_up's GEMM (D53): y [M, 2I] = x @ W^T in the packed column order, rounded to bf16 as
    torch.mm rounds it (one rounding more than the fused kernel's; DESIGN §4's bf16 tolerance covers
    it). ops applies the act·mul to it (sm90/act_mul.py)."""
    return x @ weight.t()


def down(h, weight, weight_scale, h_scale, residual, out_dtype):
    if weight.dtype == torch.bfloat16:
        y = h @ weight.t()
    else:
        m = h.shape[0]
        h, h_scale = _pad_rows(h, h_scale, -m % ROWS)
        # cuBLAS wants the 1×128 scales M-major (as gate_up returns them: then m_major is a view,
        # not a copy) and the weight K-major (its transpose is a view).
        y = torch._scaled_mm(h, weight.t(), scale_a=quant.m_major(h_scale), scale_b=weight_scale.t(),
                             out_dtype=torch.bfloat16)[:m]
    if residual is not None:
        y = y + residual
    return y.to(out_dtype)
