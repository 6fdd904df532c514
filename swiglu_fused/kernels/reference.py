"""Pure-torch reference ops: the ground truth for every kernel, and the CPU execution path.

Each op takes the same arguments as its sm90 kernel twin (STYLE §1) and computes in fp32 from
the *quantized* operands, so a kernel differs from it only by accumulation order:

    quant_x(x)                       → xq e4m3 [M, K], x_scale fp32 [M, ceil(K/128)]
    gate_up(x, weight, ...)          → h [M, I] (bf16, or e4m3 + h_scale fp32 [M, ceil(I/128)])
    gate_up_epilogue(acc, ...)       → the same h from a given fp32 GEMM result [M, 2I]
    down(h, weight, ...)             → y [M, H] (+ residual)
    mlp(x, gate_up, down, ...)       → the three in a row, any leading batch dims

The operand format follows from the weight's dtype:
    bfloat16       bf16 mainloop: x bf16 (or fp16 / fp32), weight bf16
    float8_e4m3fn  fp8_block128: x e4m3 + x_scale, weight e4m3 + weight_scale [ceil(N/128), ceil(K/128)]
    uint8          nvfp4 (weight-only): x bf16, weight packed e2m1 + weight_scale e4m3 [N, ceil(K/16)]
                   + global_scale fp32 [2] (gate, up) or [1], as a *multiplier* (1/divisor)
"""

from __future__ import annotations

import sys
from typing import Callable, Mapping

import torch

from .. import formats, quant
from ..weight_packing.interleave import deinterleave_rows

# ---------------------------------------------------------------- epilogue pieces
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": torch.nn.functional.silu,
    "gelu_tanh": lambda g: torch.nn.functional.gelu(g, approximate="tanh"),
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"act: unknown activation {name!r}; expected one of {sorted(ACTIVATIONS)}") from None


def _store_h(h: torch.Tensor, h_format: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    if h_format == "bf16":
        return h.to(torch.bfloat16), None
    if h_format == "fp8_group128":
        return quant.quantize_fp8_groups(h)
    raise ValueError(f"h_format: unknown output format {h_format!r}; expected one of {list(formats.H_FORMATS)}")


# ---------------------------------------------------------------- operand dequantization
def _dequant_operand(a: torch.Tensor, scale: torch.Tensor | None, name: str) -> torch.Tensor:
    """An activation operand (x or h) to fp32: bf16/fp16/fp32 as is, e4m3 with its group scales."""
    if a.dtype == quant.FP8_DTYPE:
        if scale is None:
            raise ValueError(f"{name}: an e4m3 operand needs its per-token-group-128 scales ({name}_scale)")
        return quant.dequantize_fp8_groups(a, scale)
    return a.float()


def dequant_weight(weight: torch.Tensor, weight_scale: torch.Tensor | None = None,
                   global_scale: torch.Tensor | None = None) -> torch.Tensor:
    """A packed or plain weight [N, K] to fp32. For nvfp4, ``global_scale`` multiplies per row half:
    with 2 entries the first applies to gate rows and the second to up rows — callers pass the
    per-row multiplier already expanded when rows are interleaved (see ``_row_global_scale``)."""
    if weight.dtype == quant.FP8_DTYPE:
        if weight_scale is None:
            raise ValueError("weight_scale: an e4m3 weight needs its 128x128 block scale grid")
        return quant.dequantize_fp8_block(weight, weight_scale)
    if weight.dtype == torch.uint8:
        if weight_scale is None or global_scale is None:
            raise ValueError("weight_scale, global_scale: an nvfp4 weight needs both")
        w = quant.dequantize_nvfp4(weight, weight_scale, torch.ones(1), divisor=False)
        return w * global_scale.float().reshape(-1, 1)
    return weight.float()


def _row_global_scale(global_scale: torch.Tensor, rows: int, g: int) -> torch.Tensor:
    """[2] (gate, up) multipliers → one per packed row, following the interleave."""
    gs = global_scale.float().reshape(-1)
    if gs.numel() == 1:
        return gs.expand(rows)
    return gs.view(1, 2, 1).expand(rows // (2 * g), 2, g).reshape(rows)


# ---------------------------------------------------------------- ops
def quant_x(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16/fp16/fp32 x [M, K] → (e4m3 [M, K], x_scale fp32 [M, ceil(K/128)]), s = amax/448."""
    return quant.quantize_fp8_groups(x)


def gate_up(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor | None = None,
    x_scale: torch.Tensor | None = None,
    global_scale: torch.Tensor | None = None,
    *,
    interleave: int = formats.DEFAULT_INTERLEAVE,
    act: str = "silu",
    h_format: str = "bf16",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """h = act(x @ gate^T) · (x @ up^T) from the interleaved packed weight [2I, K]."""
    gs = None if global_scale is None else _row_global_scale(global_scale, weight.shape[0], interleave)
    w = dequant_weight(weight, weight_scale, gs)
    acc = _dequant_operand(x, x_scale, "x") @ w.t()
    return gate_up_epilogue(acc, interleave=interleave, act=act, h_format=h_format)


def gate_up_epilogue(acc: torch.Tensor, *, interleave: int = formats.DEFAULT_INTERLEAVE, act: str = "silu",
                     h_format: str = "bf16") -> tuple[torch.Tensor, torch.Tensor | None]:
    """gate_up's epilogue alone: the fp32 GEMM result [M, 2I] in the packed (interleaved) column
    order → h. Lets a test put another GEMM's accumulator (cuBLAS's) in front of it."""
    gate, up = deinterleave_rows(acc.float().t(), interleave)
    h = (activation(act)(gate) * up).t().contiguous()
    return _store_h(h, h_format)


def down(
    h: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor | None = None,
    h_scale: torch.Tensor | None = None,
    global_scale: torch.Tensor | None = None,
    *,
    residual: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """y = h @ down^T (+ residual), computed in fp32, rounded once to ``out_dtype``."""
    y = _dequant_operand(h, h_scale, "h") @ dequant_weight(weight, weight_scale, global_scale).t()
    if residual is not None:
        y = y + residual.float()
    return y.to(out_dtype)


def runtime_global_scale(t: torch.Tensor | None, kind: str | None) -> torch.Tensor | None:
    """Stored nvfp4 per-tensor scales → the multipliers the ops take."""
    if t is None:
        return None
    return 1.0 / t.float() if kind == "divisor" else t.float()


def mlp(
    x: torch.Tensor,
    gate_up_tensors: Mapping[str, torch.Tensor],
    down_tensors: Mapping[str, torch.Tensor],
    *,
    weight_format: str,
    interleave: int = formats.DEFAULT_INTERLEAVE,
    act: str = "silu",
    global_scale_kind: str | None = "divisor",
    residual: torch.Tensor | None = None,
    ops=None,
) -> torch.Tensor:
    """The whole gated MLP on packed tensors (keys as in formats.py), x [..., H] → y [..., H].

    ``ops`` supplies quant_x / gate_up / down (default: this module; ``kernels.ops`` dispatches
    to the sm90 kernels), so the reference and the fast path compose the same three calls.
    """
    ops = ops or sys.modules[__name__]
    fmt = formats.weight_format(weight_format)
    lead, hidden = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, hidden)
    wn = fmt.weight_name()

    def args(t: Mapping[str, torch.Tensor]) -> tuple:
        scale = t.get("weight_scale_inv", t.get("weight_scale"))
        return t[wn], scale, runtime_global_scale(t.get("weight_global_scale"), global_scale_kind)

    gw, gscale, ggs = args(gate_up_tensors)
    x_scale = None
    if fmt.name == "fp8_block128":
        x2, x_scale = ops.quant_x(x2.to(torch.bfloat16))
    else:
        x2 = x2.to(torch.bfloat16)
    h, h_scale = ops.gate_up(x2, gw, gscale, x_scale, ggs, interleave=interleave, act=act, h_format=fmt.h_format)
    dw, dscale, dgs = args(down_tensors)
    res = None if residual is None else residual.reshape(-1, hidden)
    y = ops.down(h, dw, dscale, h_scale, dgs, residual=res, out_dtype=x.dtype)
    return y.reshape(*lead, y.shape[-1])
