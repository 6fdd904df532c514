"""The gated MLP as three calls, quant_x → gate_up → down, on one projection pair's packed tensors.

``mlp(impl, ...)`` composes ``impl.quant_x`` / ``impl.gate_up`` / ``impl.down``: ``ops.mlp`` passes
the dispatching ops (the production forward of FusedSwiGLUMLP), ``reference.mlp`` the reference
ops (its ground truth). What the format needs (whether x is quantized, which tensors are the
weight, its scales and its per-tensor scales, which h format gate_up writes) comes from its
formats.WeightFormat.
"""

from __future__ import annotations

from typing import Mapping

import torch

from .. import formats
from . import dispatch


def runtime_global_scale(t: torch.Tensor | None, kind: str | None) -> torch.Tensor | None:
    """Stored per-tensor (nvfp4 global) scales → the multipliers the ops take."""
    if t is None:
        return None
    return 1.0 / t.float() if kind == formats.DIVISOR else t.float()


def held_multiplier(held: torch.Tensor | None, source: torch.Tensor | None, t: torch.Tensor,
                    kind: str | None) -> torch.Tensor:
    """runtime_global_scale(t, kind) for a module to hold and pass to the ops (as formats.MULTIPLIER),
    made when its tensors load or move instead of by a kernel launch a call (at decode sizes such a
    launch costs as much as a projection's tail: history/nvfp4.md v23). Written into ``held``, the
    multiplier it holds (made from ``source``), where it can be, so that a CUDA graph reading it
    sees a reloaded value; a multiplier stored as fp32 is ``t`` itself, never written."""
    value = runtime_global_scale(t, kind)
    if (value is not t and held is not None and held is not source and held.device == value.device
            and held.shape == value.shape):
        return held.copy_(value)
    return value


def operands(fmt, tensors: Mapping[str, torch.Tensor], global_scale_kind: str | None) -> tuple:
    """One projection's packed tensors → (weight, its scales or None, its per-tensor multipliers or
    None): the arguments the ops take after x (``fmt``: the formats.WeightFormat)."""
    scale = tensors.get(fmt.scale_name) if fmt.scale_name else None
    gs = tensors.get(fmt.global_scale_name) if fmt.global_scale_name else None
    return tensors[fmt.weight_name], scale, runtime_global_scale(gs, global_scale_kind)


def activation_operand(impl, fmt, x2: torch.Tensor) -> tuple:
    """x [rows, K] → (the activation operand the ops take, its scales or None): bf16, then
    ``impl.quant_x`` where the format quantizes activations (``fmt``: the formats.WeightFormat). The
    modules take any x, as nn.Linear does: quant_x reads rows that lie in whole 16 bytes further
    apart than K (dispatch.rows_in_place; SplitProjectionProcessor's [attention | h]); anything
    else is made contiguous first, as the bf16 mainloops read rows K apart, and so is every x under
    torch.compile (dynamo traces no data_ptr; contiguous is free where x is)."""
    x2 = x2.to(torch.bfloat16)
    eager = not torch.compiler.is_compiling()
    if not (eager and fmt.quantizes_x and dispatch.rows_in_place(x2, 8)):
        x2 = x2.contiguous()
    if eager and x2.is_cuda and x2.data_ptr() % 16:
        x2 = x2.clone()  # a view starting off 16 bytes (the kernels' accesses): an aligned, contiguous copy
    return impl.quant_x(x2) if fmt.quantizes_x else (x2, None)


def check_features(x, in_features: int) -> None:
    """x must be a tensor [..., in_features] (the packed modules' forward)."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[-1] != in_features:
        raise ValueError(f"x: expected a tensor [..., {in_features}], got "
                         f"{list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")


def mlp(
    impl,
    x: torch.Tensor,
    gate_up_tensors: Mapping[str, torch.Tensor],
    down_tensors: Mapping[str, torch.Tensor],
    *,
    weight_format: str,
    interleave: int = formats.DEFAULT_INTERLEAVE,
    act: str = "silu",
    global_scale_kind: str | None = formats.DIVISOR,
    residual: torch.Tensor | None = None,
    tile_major: tuple[bool, bool] = (False, False),
) -> torch.Tensor:
    """x [..., H] → y [..., H] (x's dtype) through ``impl``'s quant_x, gate_up and down;
    ``tile_major``: whether gate_up's and down's weights are in their tile-major order (nvfp4_layout's;
    fp8_layout's for an fp8 gate_up)."""
    fmt = formats.weight_format(weight_format)
    lead, hidden = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, hidden)

    gw, gscale, ggs = operands(fmt, gate_up_tensors, global_scale_kind)
    x2, x_scale = activation_operand(impl, fmt, x2)
    # h_order "auto": h in the k order an nvfp4 down decoding into registers reads (DISPATCH D45), so
    # that no copy runs between the two; each op decides it for the call (dispatch.h_in_rs_order)
    h, h_scale = impl.gate_up(x2, gw, gscale, x_scale, ggs, interleave=interleave, act=act, h_format=fmt.h_format,
                               tile_major=tile_major[0], h_order="auto")
    dw, dscale, dgs = operands(fmt, down_tensors, global_scale_kind)
    res = None if residual is None else residual.reshape(-1, hidden)
    y = impl.down(h, dw, dscale, h_scale, dgs, residual=res, out_dtype=x.dtype, tile_major=tile_major[1],
                  h_order="auto")
    return y.reshape(*lead, y.shape[-1])
