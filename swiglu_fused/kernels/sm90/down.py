"""down on sm_90a: y = h @ W_down^T (+ residual), bf16, in the gate_up GEMM with its "linear" epilogue.

Operands (ground truth: reference.down):

    mainloop fp8_block128   h e4m3 [M, I] + h_scale fp32 [M, I/128]   (what gate_up writes: M-major,
                                                                     strides (1, M); other layouts copied)
                            weight e4m3 [H, I] + weight_scale fp32 [ceil(H/128), I/128]
    mainloop bf16           h bf16 [M, I], weight bf16 [H, I]
    mainloop nvfp4          h bf16 [M, I], weight uint8 [H, I/2] + weight_scale e4m3 [H, I/16]
                            + global_scale fp32 multiplier [1]
    residual                bf16 [M, H] or none (compile-time: DownConfig.residual)
    y                       bf16 [M, H]

The kernel is gemm.GemmKernel: a tile of 256 weight rows (two 128-row blocks, each with its
own 128×128 scale) is output columns [256n, 256n+256). H needs only be a multiple of 8 (16-byte
output rows): the last tile's weight rows ≥ H are TMA zero-fill, its scale rows are clamped to
ceil(H/128) - 1, and the stores skip columns ≥ H. The residual is added in fp32 before the single
rounding to bf16 (as reference.down does). Its configuration (tile_config.DownConfig), and whether
it or cuBLAS runs a call, are chosen by kernels/dispatch.py.
"""

from __future__ import annotations

import cutlass

from .. import dispatch
from .gemm import launch, weight_operands
from .kernel_host import compile_kernel
from .tile_config import DownConfig  # noqa: F401 (this kernel's config, defined beside TileConfig)


def compile_down(config: DownConfig):
    """Compile for sm_90a (no GPU needed: fake pointers, runtime Int32 sizes)."""
    return compile_kernel(config, cutlass.BFloat16, cutlass.BFloat16, 16)


# The config choice (and sm90 vs cuBLAS) is kernels/dispatch.py's; these names stay for callers
# that select through this module (benchmarks).
select_config = dispatch.down_config
shipped_configs = dispatch.down_shipped
beats_cublas = dispatch.beats_cublas


def down(config: DownConfig, h, weight, weight_scale=None, h_scale=None, residual=None, global_scale=None, *,
         out=None, tile_major: bool = False, h_rs_order: bool = False):
    """Run the kernel (operands validated by ops.py). Returns y bf16 [M, H]; ``out`` = y writes
    into a given tensor (the tests poison it first); ``tile_major``: the nvfp4 weight's order;
    ``h_rs_order``: h's columns in nvfp4_layout.rs_k_order (reordered here to what the config reads)."""
    import torch

    from . import compile_cache, k_order

    if h_rs_order != config.rs_decode:  # (a copy: gate_up's epilogue writes h in the order this reads)
        h = k_order.rs_order(h)

    m = h.shape[0]
    n = weight.shape[0]
    if (residual is not None) != config.residual:
        raise ValueError(f"residual: {config} was compiled {'with' if config.residual else 'without'} a residual")
    config.check_k(h.shape[1], "down")
    y = torch.empty((m, n), dtype=torch.bfloat16, device=h.device) if out is None else out
    if m == 0:
        return y
    fn = compile_cache.get("down", config, lambda: compile_down(config))
    if config.fp8:  # the kernel reads h_scale M-major: gate_up's is already (a view), others are copied
        from ...quant import m_major

        h_scale = m_major(h_scale)
    weight, scales = weight_operands(config, weight, weight_scale, h_scale, global_scale, tile_major)
    launch(fn, config, h, weight, *scales, y, cutlass.BFloat16, residual if config.residual else None,
           cutlass.BFloat16, 16)
    return y
