"""gate_up on sm_90a: h = act(x @ gate^T) · (x @ up^T) in one persistent, warp-specialized GEMM.

Operands (ground truth: reference.gate_up):

    mainloop fp8_block128   x e4m3 [M, K] + x_scale fp32 [M, ceil(K/128)]
                            weight e4m3 [2I, K] (interleave g = 128) + weight_scale fp32 [2I/128, ceil(K/128)]
    mainloop bf16           x bf16 [M, K], weight bf16 [2I, K]
    mainloop nvfp4          x bf16 [M, K], weight uint8 [2I, K/2] (two e2m1 codes a byte) + weight_scale
                            e4m3 [2I, K/16] + global_scale fp32 multipliers [2] (gate, up) or [1]; h bf16
                            (prefill: the weight dequantized to bf16 first, then the bf16 mainloop,
                            TileConfig.dequantized)
    h_format fp8_group128   h e4m3 [M, I] + h_scale fp32 [M, I/128]  (s = amax/448 per row per 128 cols),
                            h_scale stored M-major (strides (1, M)): the layout both downs read,
                            ours (down.py) and cuBLAS's block-scaled GEMM (no transpose copy)
    h_format bf16           h bf16 [M, I]

The kernel is gemm.GemmKernel (mainloop, fragment layout and stores are drawn there) with
the "gated" epilogue: a tile of 256 packed rows = 128 gate rows + 128 up rows yields h columns
[128n, 128n+128), one fp8 scale group (for bf16 → bf16 h, where waves fit better, a tile of
224 or 192 rows: 112 or 96 h columns, dispatch.granule_tile_n). This module compiles and launches
it; its configuration (tile_config.GateUpConfig) is chosen by kernels/dispatch.py.
"""

from __future__ import annotations

from cutlass import Float32

from .. import dispatch
from .gemm import launch, weight_operands
from .kernel_host import compile_kernel
from .tile_config import H_GROUP, GateUpConfig  # noqa: F401 (GateUpConfig: this kernel's config, defined beside TileConfig)


# ---------------------------------------------------------------- host side


def compile_gate_up(config: GateUpConfig):
    """Compile for sm_90a (no GPU needed: fake pointers, runtime Int32 sizes)."""
    return compile_kernel(config, config.h_spec.dtype, Float32, 4)


# The config choice is kernels/dispatch.py's; these names stay for callers that select through
# this module (benchmarks).
select_config = dispatch.gate_up_config
shipped_configs = dispatch.gate_up_shipped


# The cluster pair as dispatched for fp8 x and h (tests force it at any M: padding M tiles)
CLUSTER_PAIR = GateUpConfig(tile_m=128, stages=4, cluster_m=2, smem_scales=True)


def gate_up(config: GateUpConfig, x, weight, weight_scale=None, x_scale=None, global_scale=None, *, out=None,
            tile_major: bool = False):
    """Run the kernel (operands validated by ops.py). Returns (h, h_scale M-major or None);
    ``out`` = (h, h_scale) writes into given tensors (the tests poison them first; h_scale M-major);
    ``tile_major``: the nvfp4 weight's order (nvfp4_layout). A config with rs_decode reads x in
    nvfp4_layout.rs_k_order: x is reordered here, a copy a call, unless the kernel permutes each stage
    of it (x_permute)."""
    import torch

    from . import compile_cache, k_order

    if config.rs_decode and not config.x_permute:
        x = k_order.rs_order(x)

    m = x.shape[0]
    n = weight.shape[0]
    i_cols = n // 2
    if config.granules and i_cols % (config.tile_n // 2):
        raise ValueError(f"gate_up: {config} takes {config.tile_n // 2} h columns a tile, and I = {i_cols} is not a "
                         f"multiple of that; use tile_n = 256 (dispatch.gate_up_config does)")
    config.check_k(x.shape[1], "gate_up")
    fmt = config.h_spec
    if out is None:
        h = torch.empty((m, i_cols), dtype=getattr(torch, fmt.torch_dtype), device=x.device)
        hs = torch.empty((i_cols // H_GROUP, m), dtype=torch.float32, device=x.device).t() if fmt.scaled else None
    else:
        h, hs = out
    if m == 0:
        return h, hs
    fn = compile_cache.get("gate_up", config, lambda: compile_gate_up(config))
    weight, scales = weight_operands(config, weight, weight_scale, x_scale, global_scale, tile_major)
    launch(fn, config, x, weight, *scales, h, fmt.dtype, hs if fmt.scaled else None, Float32, 4)
    return h, hs
