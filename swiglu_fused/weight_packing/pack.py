"""Turn one MLP's source projections into the packed tensors of formats.py.

A source projection is read in whatever format its checkpoint holds (dense, fine-grained FP8,
compressed-tensors NVFP4, ModelOpt NVFP4). When the target format is the source's, bytes are
only moved (rows interleaved, scales with them): bit-exact. Otherwise the weight is dequantized
to fp32 and quantized afresh.

    source gate [I, K]  ─┐                        ┌─ gate_up_proj.*  [2I, K] (interleaved, g)
    source up   [I, K]  ─┼─ same format? repack ──┤
    (or fused [2I, K] ───┘   else dequant→quant   └─ down_proj.*     [H, I]
     halves [gate; up])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .. import formats, quant
from ..formats import FormatError
from . import interleave as il

DENSE = "dense"


@dataclass
class Projection:
    """One projection's weight, in its source format.

    tensors by format: dense {weight}; fp8_block128 {weight, weight_scale_inv (fp32)};
    nvfp4 {weight_packed, weight_scale, weight_global_scale [1]} with ``kind`` saying whether the
    global scale divides (compressed-tensors) or multiplies (ModelOpt).
    """

    format: str
    tensors: dict[str, torch.Tensor]
    name: str
    kind: str | None = None
    dropped: list[str] = field(default_factory=list)  # source tensors with no place in the packed format

    @property
    def shape(self) -> tuple[int, int]:
        if self.format == "nvfp4":
            r, c = self.tensors["weight_packed"].shape
            return r, 2 * c
        return tuple(self.tensors["weight"].shape)


def read_projection(get: Callable[[str], torch.Tensor | None], prefix: str) -> Projection:
    """Detect a projection's format from the tensors it has and collect them."""
    def t(suffix):
        return get(f"{prefix}.{suffix}")

    if t("bias") is not None:
        raise FormatError(f"{prefix}.bias: gated MLPs with a bias are not supported by the packed format")
    if t("weight_packed") is not None:  # compressed-tensors nvfp4-pack-quantized
        gs = t("weight_global_scale")
        if gs is None or t("weight_scale") is None:
            raise FormatError(f"{prefix}: NVFP4 weight_packed without weight_scale / weight_global_scale")
        tensors = {"weight_packed": t("weight_packed"), "weight_scale": t("weight_scale"),
                   "weight_global_scale": gs.float().reshape(1)}
        return Projection("nvfp4", tensors, prefix, "divisor", _present(t, "input_global_scale", prefix))
    w = t("weight")
    if w is None:
        raise FormatError(f"{prefix}.weight: missing from the checkpoint")
    if w.dtype == torch.uint8 and t("weight_scale_2") is not None:  # ModelOpt NVFP4
        tensors = {"weight_packed": w, "weight_scale": t("weight_scale"),
                   "weight_global_scale": t("weight_scale_2").float().reshape(1)}
        return Projection("nvfp4", tensors, prefix, "multiplier", _present(t, "input_scale", prefix))
    if w.dtype == quant.FP8_DTYPE:
        s = t("weight_scale_inv")
        if s is None:
            raise FormatError(f"{prefix}.weight_scale_inv: an e4m3 weight without its block scales "
                              "(only fine-grained FP8 with weight_block_size [128, 128] is supported)")
        _check_fp8_grid(prefix, w, s)
        # e8m0 scales are powers of two: exact in fp32.
        return Projection("fp8_block128", {"weight": w, "weight_scale_inv": s.float()}, prefix,
                          dropped=_present(t, "activation_scale", prefix))
    if not w.dtype.is_floating_point or w.dim() != 2:
        raise FormatError(f"{prefix}.weight: expected a 2-D floating-point or quantized weight, "
                          f"found {w.dtype} {list(w.shape)}")
    return Projection(DENSE, {"weight": w}, prefix)


def _present(t, suffix: str, prefix: str) -> list[str]:
    return [f"{prefix}.{suffix}"] if t(suffix) is not None else []


def _check_fp8_grid(prefix: str, w: torch.Tensor, s: torch.Tensor) -> None:
    expected = (formats.cdiv(w.shape[0], formats.FP8_BLOCK), formats.cdiv(w.shape[1], formats.FP8_BLOCK))
    if tuple(s.shape) != expected:
        raise FormatError(
            f"{prefix}.weight_scale_inv: grid {list(s.shape)} does not match 128x128 blocks of a "
            f"{list(w.shape)} weight (expected {list(expected)}); only weight_block_size [128, 128] is supported")


def split_fused(p: Projection) -> tuple[Projection, Projection]:
    """A [gate; up] projection → gate and up, each keeping its source format and bytes."""
    rows = p.shape[0]
    if rows % 2:
        raise FormatError(f"{p.name}: a fused [gate; up] projection needs an even row count, found {rows}")
    half = rows // 2
    if p.format == "fp8_block128" and half % formats.FP8_BLOCK:
        raise FormatError(f"{p.name}: I = {half} splits a 128-row FP8 block between gate and up")
    halves = ({}, {})
    for suffix, t in p.tensors.items():
        if suffix == "weight_global_scale":  # one per-tensor scale shared by both halves
            halves[0][suffix], halves[1][suffix] = t, t
            continue
        cut = half // formats.FP8_BLOCK if suffix == "weight_scale_inv" else half
        halves[0][suffix], halves[1][suffix] = t[:cut], t[cut:]
    return (Projection(p.format, halves[0], f"{p.name}[gate]", p.kind, p.dropped),
            Projection(p.format, halves[1], f"{p.name}[up]", p.kind))


def dequantize(p: Projection) -> torch.Tensor:
    if p.format in (DENSE, "bf16"):
        return p.tensors["weight"].float()
    if p.format == "fp8_block128":
        return quant.dequantize_fp8_block(p.tensors["weight"], p.tensors["weight_scale_inv"])
    t = p.tensors
    return quant.dequantize_nvfp4(t["weight_packed"], t["weight_scale"], t["weight_global_scale"],
                                  divisor=p.kind == "divisor")


def quantize(w: torch.Tensor, fmt: str, name: str, kind: str | None = None) -> Projection:
    """A dense weight → a Projection in ``fmt`` (nvfp4 global scale stored as ``kind``)."""
    if fmt == "bf16":
        return Projection("bf16", {"weight": w.to(torch.bfloat16)}, name)
    if fmt == "fp8_block128":
        q, s = quant.quantize_fp8_block(w)
        return Projection(fmt, {"weight": q, "weight_scale_inv": s}, name)
    packed, scale, gs = quant.quantize_nvfp4(w)
    if kind == "multiplier":
        gs = 1.0 / gs
    return Projection(fmt, {"weight_packed": packed, "weight_scale": scale, "weight_global_scale": gs},
                      name, kind or "divisor")


def keeps_bytes(p: Projection, fmt: str, kind: str | None) -> bool:
    """Whether ``p`` is already in ``fmt`` (nvfp4: with the same global-scale kind), so that
    converting it moves bytes only."""
    return (p.format == fmt and (fmt != "nvfp4" or p.kind == kind)) or (
        fmt == "bf16" and p.format == DENSE and p.tensors["weight"].dtype == torch.bfloat16)


def to_format(p: Projection, fmt: str, kind: str | None) -> tuple[Projection, bool]:
    """Return (projection in ``fmt``, whether its bytes were kept as they were)."""
    if keeps_bytes(p, fmt, kind):
        return Projection(fmt, p.tensors, p.name, p.kind, p.dropped), True
    return quantize(dequantize(p), fmt, p.name, kind), False


def pack_gate_up(gate: Projection, up: Projection, g: int) -> dict[str, torch.Tensor]:
    """Two projections in the same target format → the packed gate_up tensors (by suffix)."""
    if gate.format != up.format or gate.shape != up.shape:
        raise FormatError(f"{gate.name} and {up.name} differ: {gate.format} {list(gate.shape)} vs "
                          f"{up.format} {list(up.shape)}; gate and up must have the same shape")
    out = {}
    for suffix, gt in gate.tensors.items():
        ut = up.tensors[suffix]
        if suffix == "weight_global_scale":
            out[suffix] = torch.cat([gt.reshape(1), ut.reshape(1)]).float()
        elif suffix == "weight_scale_inv":
            out[suffix] = il.interleave_block_scales(gt, ut, g)
        else:
            out[suffix] = il.interleave_rows(gt, ut, g)
    return out


def unpack_gate_up(tensors: dict[str, torch.Tensor], fmt: str, g: int, kind: str | None = None,
                   ) -> tuple[Projection, Projection]:
    """The inverse of ``pack_gate_up``: packed tensors → gate and up projections."""
    gate, up = {}, {}
    for suffix, t in tensors.items():
        if suffix == "weight_global_scale":
            gate[suffix], up[suffix] = t[0:1], t[1:2]
        elif suffix == "weight_scale_inv":
            gate[suffix], up[suffix] = il.deinterleave_block_scales(t, g)
        else:
            gate[suffix], up[suffix] = il.deinterleave_rows(t, g)
    return Projection(fmt, gate, "gate", kind), Projection(fmt, up, "up", kind)
