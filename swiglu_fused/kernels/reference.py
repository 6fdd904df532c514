"""Pure-torch reference ops: the ground truth for every kernel, and the CPU execution path.

Each op takes the same arguments as its sm90 kernel twin (STYLE §1) and computes in fp32 from
the *quantized* operands, so a kernel differs from it only by accumulation order:

    quant_x(x)                       → xq e4m3 [M, K], x_scale fp32 [M, ceil(K/128)]
    gate_up(x, weight, ...)          → h [M, I] (bf16, or e4m3 + h_scale fp32 [M, ceil(I/128)])
    gate_up_epilogue(acc, ...)       → the same h from a given fp32 GEMM result [M, 2I]
    gate_up_split(x, weight, ..., prefix=P)
                                     → y [M, P] bf16 and h from a split projection's packed weight
                                       [P + 2I, K] (formats.SPLIT: plain prefix rows, then pairs)
    down(h, weight, ...)             → y [M, H] (+ residual)
    mlp(x, gate_up, down, ...)       → the three in a row, any leading batch dims (pipeline.mlp
                                       composed of the reference ops: the twin of ops.mlp)
    qk_norm_rope(q, k, weight_q, weight_k, cos, sin, eps)
                                     → [2, T, inner] bf16 (Q', K'): Flux.2's per-head RMS norms of Q and K, then
                                       its rotary embedding (not a GEMM: the steps diffusers runs
                                       between the split projection and the attention)

The operand format follows from the weight's dtype:
    bfloat16       bf16 mainloop: x bf16 (or fp16 / fp32), weight bf16
    float8_e4m3fn  fp8_block128: x e4m3 + x_scale, weight e4m3 + weight_scale [ceil(N/128), ceil(K/128)]
    uint8          nvfp4 (weight-only): x bf16, weight packed e2m1 + weight_scale e4m3 [N, ceil(K/16)]
                   + global_scale fp32 [2] (gate, up) or [1], as a *multiplier* (1/divisor); gate_up
                   and down take ``tile_major=True`` for a weight and scales in nvfp4_layout's
                   tile-major order (the modules' order on an sm90 GPU); gate_up also for an fp8
                   weight in fp8_layout's

``h_order`` (gate_up: h comes out, down: h comes in): "natural"; "rs", each 64 columns of h in
nvfp4_layout.rs_k_order, the order nvfp4's register-sourced down reads (DISPATCH D45); "auto",
"rs" where dispatch.h_in_rs_order says an nvfp4 down of these shapes reads it (what the MLP
passes). The values are the same.
"""

from __future__ import annotations

import sys
from typing import Callable, Mapping

import torch

from .. import formats, quant
from ..interleave import deinterleave_rows
from . import dispatch, fp8_layout, nvfp4_layout, pipeline

# ---------------------------------------------------------------- epilogue pieces
# implementations of the names registered in formats.ACTIVATIONS and formats.H_FORMATS
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": torch.nn.functional.silu,
    "gelu_tanh": lambda g: torch.nn.functional.gelu(g, approximate="tanh"),
}

H_STORES: dict[str, Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]] = {
    "bf16": lambda h: (h.to(torch.bfloat16), None),
    "fp8_group128": quant.quantize_fp8_groups,
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    return formats.implementation(ACTIVATIONS, name, "act", "reference")


def _store_h(h: torch.Tensor, h_format: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    return formats.implementation(H_STORES, h_format, "h_format", "reference")(h)


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
        return quant.dequantize_nvfp4(weight, weight_scale, global_scale.float().reshape(-1, 1), divisor=False)
    return weight.float()


def _packed_order(weight: torch.Tensor, weight_scale: torch.Tensor | None, tile_major: bool) -> tuple:
    """An nvfp4 weight and its scales, or an fp8 weight (its scales keep their order), in the packed
    format's order (``tile_major``: given tile-major)."""
    if not tile_major:
        return weight, weight_scale
    if weight.dtype == torch.float8_e4m3fn:
        return fp8_layout.from_tile_major(weight), weight_scale
    if weight.dtype != torch.uint8 or weight_scale is None:
        raise ValueError(f"tile_major: only an nvfp4 weight (uint8, with its e4m3 weight_scale) or an fp8 one has "
                         f"a tile-major layout, got a {weight.dtype} weight")
    return nvfp4_layout.to_packed(weight, weight_scale)


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
    tile_major: bool = False,
    h_order: str = "natural",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """h = act(x @ gate^T) · (x @ up^T) from the interleaved packed weight [2I, K]."""
    rs = dispatch.gate_up_h_in_rs_order(h_order, x, weight)
    weight, weight_scale = _packed_order(weight, weight_scale, tile_major)
    gs = None if global_scale is None else _row_global_scale(global_scale, weight.shape[0], interleave)
    w = dequant_weight(weight, weight_scale, gs)
    acc = _dequant_operand(x, x_scale, "x") @ w.t()
    h, h_scale = gate_up_epilogue(acc, interleave=interleave, act=act, h_format=h_format)
    return (nvfp4_layout.rs_k_order(h) if rs else h), h_scale  # (h_scale's 128-column groups stay)


def gate_up_epilogue(acc: torch.Tensor, *, interleave: int = formats.DEFAULT_INTERLEAVE, act: str = "silu",
                     h_format: str = "bf16") -> tuple[torch.Tensor, torch.Tensor | None]:
    """gate_up's epilogue alone: the fp32 GEMM result [M, 2I] in the packed (interleaved) column
    order → h. Lets a test put another GEMM's accumulator (cuBLAS's) in front of it."""
    gate, up = deinterleave_rows(acc.float().t(), interleave)
    h = (activation(act)(gate) * up).t().contiguous()
    return _store_h(h, h_format)


def _split_row_global_scale(global_scale: torch.Tensor, prefix: int, rows: int, g: int) -> torch.Tensor:
    """[3] (prefix, gate, up) multipliers → one per packed row of a split projection."""
    gs = global_scale.float().reshape(-1)
    return torch.cat([gs[0:1].expand(prefix), _row_global_scale(gs[1:3], rows - prefix, g)])


def check_split_prefix(prefix, rows: int, interleave: int, fp8: bool) -> None:
    """A split projection's P against its packed weight's rows: 0 < P < rows, the rest whole 2g
    chunks of gate/up pairs and, for an fp8 weight, P whole 128-row scale blocks (ops validates
    with this too). Raises ValueError naming ``prefix``."""
    if not isinstance(prefix, int) or not 0 < prefix < rows:
        raise ValueError(f"prefix: expected the number of plain rows, an int with 0 < prefix < {rows} (the weight's "
                         f"rows), got {prefix!r}")
    if (rows - prefix) % (2 * interleave):
        raise ValueError(f"prefix: {prefix} rows leave {rows - prefix} of the weight's {rows} for gate/up pairs, "
                         f"which must be a multiple of 2·interleave = {2 * interleave}")
    if fp8 and prefix % formats.FP8_BLOCK:
        raise ValueError(f"prefix: {prefix} is not a multiple of {formats.FP8_BLOCK}, so an fp8 scale block "
                         "straddles the prefix and the pairs")


def gate_up_split(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor | None = None,
    x_scale: torch.Tensor | None = None,
    global_scale: torch.Tensor | None = None,
    *,
    prefix: int,
    interleave: int = formats.DEFAULT_INTERLEAVE,
    act: str = "silu",
    h_format: str = "bf16",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The split projection's GEMM and epilogue: one GEMM over the packed weight [P + 2I, K]
    (``prefix`` = P plain rows, then gate/up interleaved as for ``gate_up``), whose first P output
    columns are stored as they are (y, bf16) and whose pairs become h = act(x @ gate^T) · (x @ up^T)
    in ``h_format``. Arguments as ``gate_up``; nvfp4's ``global_scale`` is [3] multipliers (prefix,
    gate, up). Returns (y [M, P], h, h_scale)."""
    rows = weight.shape[0]
    check_split_prefix(prefix, rows, interleave, weight.dtype == quant.FP8_DTYPE)
    gs = None if global_scale is None else _split_row_global_scale(global_scale, prefix, rows, interleave)
    acc = _dequant_operand(x, x_scale, "x") @ dequant_weight(weight, weight_scale, gs).t()
    h, h_scale = gate_up_epilogue(acc[:, prefix:], interleave=interleave, act=act, h_format=h_format)
    return acc[:, :prefix].to(torch.bfloat16), h, h_scale


def down(
    h: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor | None = None,
    h_scale: torch.Tensor | None = None,
    global_scale: torch.Tensor | None = None,
    *,
    residual: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    tile_major: bool = False,
    h_order: str = "natural",
) -> torch.Tensor:
    """y = h @ down^T (+ residual), computed in fp32, rounded once to ``out_dtype``."""
    if dispatch.down_h_in_rs_order(h_order, h, weight):
        h = nvfp4_layout.rs_k_order(h)
    weight, weight_scale = _packed_order(weight, weight_scale, tile_major)
    y = _dequant_operand(h, h_scale, "h") @ dequant_weight(weight, weight_scale, global_scale).t()
    if residual is not None:
        y = y + residual.float()
    return y.to(out_dtype)


runtime_global_scale = pipeline.runtime_global_scale  # (its home is pipeline.py)


def mlp(
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
    """The whole gated MLP on packed tensors (keys as in formats.py), x [..., H] → y [..., H], with
    the reference ops: the ground truth of ops.mlp (both are pipeline.mlp)."""
    return pipeline.mlp(sys.modules[__name__], x, gate_up_tensors, down_tensors, weight_format=weight_format,
                        interleave=interleave, act=act, global_scale_kind=global_scale_kind, residual=residual,
                        tile_major=tile_major)


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, weight_q: torch.Tensor, weight_k: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor, eps: float) -> torch.Tensor:
    """Q', K' bf16 [2, T, inner] from q, k bf16 [T, inner] (any row stride; T = batch · S tokens, the
    batch's sequences one after the other): each head's D columns (D = weight_q.numel(), even) RMS-normed
    with its weight, rounded to bf16, then rotated as Flux's interleaved rotary embedding: pair (2i, 2i + 1)
    of token t by cos, sin [S, D] fp32 at row t % S. The steps and roundings of diffusers'
    Flux2ParallelSelfAttnProcessor with torch.nn.RMSNorm (fp32 math, one rounding) and apply_rotary_emb
    (use_real, unbind dim -1: x·cos + rot(x)·sin in fp32, rounded once)."""
    d = weight_q.numel()
    s = cos.shape[0]

    def one(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        xf = x.float().view(t // s, s, -1, d)
        normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(torch.bfloat16)
        nf = normed.float()
        rot = torch.stack([-nf[..., 1::2], nf[..., 0::2]], dim=-1).flatten(-2)
        c, sn = cos.float().view(1, s, 1, d), sin.float().view(1, s, 1, d)
        return (nf * c + rot * sn).to(torch.bfloat16).view(t, -1)

    return torch.stack([one(q, weight_q), one(k, weight_k)])
