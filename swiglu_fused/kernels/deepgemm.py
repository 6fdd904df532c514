"""down on DeepGEMM, where a user has it installed: an optional backend, never a dependency.

DeepGEMM's sm90 fp8 GEMM (``deep_gemm.fp8_gemm_nt``: 1×128 activation scales, 128×128 weight
scales, bf16 out; the fp8_block128 recipe) ran our down projection 11–72 % faster than our sm90
kernel, and up to 1.65× as fast as cuBLAS (level at one point), from M = 16 on the H100 (DISPATCH
D28). vLLM and SGLang users often have it; dispatch.down_backend then picks it for fp8_block128
down with bf16 out and no residual from MIN_M rows. Up to 16 rows ours is faster (on the H200 since
DISPATCH D37's four K parts; DeepGEMM also asks for its activation scales with M padded to 4: a copy). Everything else (bf16 and nvfp4 weights, a
residual, other outputs, other GPUs) keeps its path. It gives the reference's numbers up to fp32
summation order, as cuBLAS does (DESIGN §4).

DeepGEMM compiles a kernel for each (N, K, tile) on its first call (seconds; cached on disk in its
JIT cache, ``DG_JIT_CACHE_DIR``): run a batch of each size once before capturing CUDA graphs, as
for our own kernels. If a call fails (its JIT needs a CUDA toolkit at run time, which an
installation may lack), it warns once and is not used again in this process: the call and every
later one take the path they would take without DeepGEMM. Set SWIGLU_FUSED_DEEPGEMM=0 to leave it
out.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import warnings

import torch

from .. import formats, quant
from . import cublas

ENABLED = os.environ.get("SWIGLU_FUSED_DEEPGEMM", "") != "0"
MIN_M = 17  # from this many rows DeepGEMM's down is the fastest (DISPATCH D28; 16 until D37 made ours faster there)
_failed = False  # a call failed: not used again in this process


@functools.lru_cache(maxsize=None)
def module():
    """The deep_gemm module where it imports, else None (also when it is installed but broken)."""
    if importlib.util.find_spec("deep_gemm") is None:
        return None
    try:
        import deep_gemm
    except Exception:
        return None
    return deep_gemm if hasattr(deep_gemm, "fp8_gemm_nt") else None


def takes_down(m: int, n: int, k: int) -> bool:
    """Whether an fp8 down of M rows, N = H outputs and K = I will run on DeepGEMM, as far as it can
    be told before h exists (for gate_up's launch, DISPATCH D41; supports_down asks it too, with the
    operands): switched on, not failed, at least MIN_M rows, a weight cuBLAS reads right, importable."""
    return (ENABLED and not _failed and m >= MIN_M and n % formats.FP8_BLOCK == 0 and cublas.reads_scales_right(k)
            and module() is not None)


def supports_down(h: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor | None,
                  h_scale: torch.Tensor | None, global_scale: torch.Tensor | None,
                  residual: torch.Tensor | None, out_dtype: torch.dtype) -> bool:
    """Whether down runs on DeepGEMM: the fp8_block128 operands cuBLAS's block-scaled GEMM takes
    (cublas.supports_down), contiguous, with fp32 h scales, bf16 out, no residual, at least MIN_M
    rows, on an sm_90 GPU, with deep_gemm importable and not switched off."""
    if not (weight.dtype == cublas.FP8 and h.dim() == 2 and residual is None and out_dtype == torch.bfloat16
            and h.is_contiguous() and weight.is_contiguous() and h_scale is not None
            and h_scale.dtype == torch.float32):
        return False
    return (cublas.supports_down(h, weight, weight_scale, h_scale, global_scale)
            and takes_down(h.shape[0], *weight.shape) and torch.cuda.get_device_capability(h.device) == (9, 0))


def down(h: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, h_scale: torch.Tensor):
    """y = h · weightᵀ in bf16 (supports_down's operands): h_scale [M, K/128] in any layout, laid out
    as DeepGEMM reads it (M-major, as gate_up writes it: a copy only where M % 4 != 0). None where
    DeepGEMM fails (then supports_down says no from now on, and the caller dispatches again)."""
    global _failed
    dg = module()
    y = torch.empty(h.shape[0], weight.shape[0], dtype=torch.bfloat16, device=h.device)
    try:
        with torch.cuda.device(h.device):
            dg.fp8_gemm_nt((h, dg.get_mn_major_tma_aligned_tensor(quant.m_major(h_scale))), (weight, weight_scale), y)
    except Exception as e:  # its JIT (a missing toolkit, an unsupported shape): our own paths take over
        _failed = True
        warnings.warn(f"down: DeepGEMM failed ({type(e).__name__}: {e}); fp8 down runs on the sm90 kernel or "
                      "cuBLAS from now on in this process (SWIGLU_FUSED_DEEPGEMM=0 skips DeepGEMM)", stacklevel=4)
        return None
    return y
