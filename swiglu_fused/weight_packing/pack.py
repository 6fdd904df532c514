"""Turn one MLP's source projections into the packed tensors of formats.py.

A source projection is read in whatever format its checkpoint holds (dense, fine-grained FP8,
compressed-tensors FP8 blocks and NVFP4, ModelOpt NVFP4). When the target format is the source's,
bytes are only moved (rows interleaved, scales with them): bit-exact. Otherwise the weight is
dequantized to fp32 and quantized afresh.

    source gate [I, K]  ─┐                        ┌─ gate_up_interleaved.* [2I, K] (interleaved, g)
    source up   [I, K]  ─┼─ same format? repack ──┤
    (or fused [2I, K] ───┘   else dequant→quant   └─ down_proj.*     [H, I]
     halves [gate; up])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .. import formats, interleave as il, quant, split_interleave
from ..formats import FormatError

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
    # our suffix → the narrower dtype the source stored it in (bf16 or e8m0 block scales), widened
    # exactly to the format's fp32: the same values, not the same bytes
    widened: dict[str, torch.dtype] = field(default_factory=dict)

    @property
    def spec(self) -> formats.WeightFormat | None:
        """The packed format this projection is in (None: a dense source)."""
        return formats.WEIGHT_FORMATS.get(self.format)

    @property
    def shape(self) -> tuple[int, int]:
        fmt = self.spec
        if fmt is None:
            return tuple(self.tensors["weight"].shape)
        w = self.tensors[fmt.weight_name]
        return w.shape[0], fmt.cols_of(w)


def read_projection(get: Callable[[str], torch.Tensor | None], prefix: str) -> Projection:
    """Detect a projection's format from the tensors it has, check them (shapes, dtypes and the
    values ``value_problem`` refuses) and collect them; FormatError names the source tensor."""
    def t(suffix):
        return get(f"{prefix}.{suffix}")

    if t("bias") is not None:
        raise FormatError(f"{prefix}.bias: gated MLPs with a bias are not supported by the packed format")
    for fmt in formats.WEIGHT_FORMATS.values():  # a producer's quantized layout (formats.SourceLayout)
        for layout in fmt.sources:
            if layout.matches(t):
                dropped = [f"{prefix}.{d}" for d in layout.dropped if t(d) is not None]
                read = _read_global_scaled if fmt.global_scale_name else _read_block_scaled
                return read(t, prefix, fmt, layout, dropped)
    w = t("weight")
    if w is None:
        raise FormatError(f"{prefix}.weight: missing from the checkpoint")
    if not w.dtype.is_floating_point or w.dim() != 2:
        raise FormatError(f"{prefix}.weight: expected a 2-D floating-point or quantized weight, "
                          f"found {w.dtype} {list(w.shape)}")
    _refuse_bad_values(prefix, {"weight": ("weight", w)}, None)
    return Projection(DENSE, {"weight": w}, prefix)


def _read_block_scaled(t, prefix: str, fmt: formats.WeightFormat, layout: formats.SourceLayout,
                       dropped: list[str]) -> Projection:
    """An e4m3 projection with 128x128 block scales (transformers' fine-grained FP8, whose
    weight_scale_inv multiplies; compressed-tensors FP8 block, whose weight_scale multiplies too)."""
    scale_name = layout.names[fmt.scale_name]
    w, s = t(layout.names[fmt.weight_name]), t(scale_name)
    if s is None:
        raise FormatError(f"{prefix}.{scale_name}: an e4m3 weight without its block scales "
                          "(only fine-grained FP8 with weight_block_size [128, 128] is supported)")
    if w.dim() != 2:
        raise FormatError(f"{prefix}.weight: expected a 2-D e4m3 weight, found shape {list(w.shape)}")
    if not s.is_floating_point():
        raise FormatError(f"{prefix}.{scale_name}: expected floating-point block scales "
                          f"(float32, bfloat16 or float8_e8m0fnu), found {s.dtype}")
    _check_fp8_grid(prefix, w, s, scale_name)
    _refuse_bad_values(prefix, {fmt.weight_name: ("weight", w), fmt.scale_name: (scale_name, s)}, None)
    # bf16 and e8m0 (powers of two) scales are exact in fp32
    widened = {fmt.scale_name: s.dtype} if s.dtype != torch.float32 else {}
    return Projection(fmt.name, {fmt.weight_name: w, fmt.scale_name: s.float()}, prefix, dropped=dropped,
                      widened=widened)


def _read_global_scaled(t, prefix: str, fmt: formats.WeightFormat, layout: formats.SourceLayout,
                        dropped: list[str]) -> Projection:
    """An NVFP4 projection whose tensors are called ``layout.names`` (our suffix → the producer's)."""
    names, kind = layout.names, layout.global_scale_kind
    got = {ours: t(theirs) for ours, theirs in names.items()}
    missing = [f"{prefix}.{names[k]}" for k, v in got.items() if v is None]
    if missing:
        raise FormatError(f"{prefix}.{names['weight_packed']}: an NVFP4 weight without {' and '.join(missing)}")
    packed, scale, gs = got["weight_packed"], got["weight_scale"], got["weight_global_scale"]
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise FormatError(f"{prefix}.{names['weight_packed']}: expected a 2-D uint8 tensor of packed e2m1 codes, "
                          f"found {packed.dtype} {list(packed.shape)}")
    rows, cols = packed.shape[0], fmt.cols_of(packed)
    expected = [rows, formats.cdiv(cols, formats.NVFP4_GROUP)]
    if scale.dtype != quant.FP8_DTYPE or list(scale.shape) != expected:
        raise FormatError(
            f"{prefix}.{names['weight_scale']}: expected float8_e4m3fn {expected} (one scale per "
            f"{formats.NVFP4_GROUP} of the {cols} columns of each of the {rows} rows), found {scale.dtype} "
            f"{list(scale.shape)}; only NVFP4 with groups of {formats.NVFP4_GROUP} is supported")
    if gs.numel() != 1 or not gs.is_floating_point():
        raise FormatError(
            f"{prefix}.{names['weight_global_scale']}: a source projection has exactly one per-tensor global "
            f"scale, found {gs.dtype} of shape {list(gs.shape)} ({gs.numel()} elements); re-export the "
            "checkpoint with one floating-point global scale per projection")
    _refuse_bad_values(prefix, {k: (names[k], v) for k, v in got.items()}, kind)
    tensors = {"weight_packed": packed, "weight_scale": scale, "weight_global_scale": gs.float().reshape(1)}
    return Projection(fmt.name, tensors, prefix, kind, dropped)


def _check_fp8_grid(prefix: str, w: torch.Tensor, s: torch.Tensor, scale_name: str = "weight_scale_inv") -> None:
    expected = (formats.cdiv(w.shape[0], formats.FP8_BLOCK), formats.cdiv(w.shape[1], formats.FP8_BLOCK))
    if tuple(s.shape) != expected:
        raise FormatError(
            f"{prefix}.{scale_name}: grid {list(s.shape)} does not match 128x128 blocks of a "
            f"{list(w.shape)} weight (expected {list(expected)}); only weight_block_size [128, 128] is supported")


def _refuse_bad_values(prefix: str, tensors: dict[str, tuple[str, torch.Tensor]], kind: str | None) -> None:
    """FormatError naming the first source tensor whose values ``value_problem`` refuses."""
    for suffix, (theirs, tensor) in tensors.items():
        problem = value_problem(suffix, tensor, kind)
        if problem:
            raise FormatError(f"{prefix}.{theirs}: {problem}; the source checkpoint is damaged or was "
                              "quantized wrongly: repair or re-export it")


# ---------------------------------------------------------------- values
# The values convert refuses in a source projection and verify reports in a packed one: the same
# rules (this function), so that whatever verify checks, convert guarantees.
#
#   tensor                              refused                                  accepted
#   weight (dense, or e4m3)             NaN, ±inf (e4m3: codes 0x7F, 0xFF)       anything else
#   weight_packed (e2m1 codes)          -                                        every code is a number
#   weight_scale (nvfp4 blocks of 16)   NaN, negative                            0: an all-zero block (a
#   weight_scale_inv (fp8 128x128)      NaN, ±inf, negative, so large that        pruned region) dequantizes
#                                       448 · s overflows fp32                     to exact zeros
#   weight_global_scale (per tensor)    NaN, ±inf, 0, negative, so small (divisor) or large (multiplier)
#                                       that 6 · 448 overflows fp32 at dequantization
_FP32_MAX = torch.finfo(torch.float32).max
_NVFP4_TOP = quant.E2M1_MAX * quant.FP8_MAX  # the largest |code · block scale|


def value_problem(suffix: str, t: torch.Tensor, kind: str | None = None) -> str | None:
    """Why the values of one projection tensor (``suffix`` as in formats.WeightFormat.tensors; source
    or packed) would poison the outputs they touch, or None. ``kind`` is the nvfp4 global scale's
    (divisor / multiplier)."""
    if t.numel() == 0 or suffix == "weight_packed":
        return None
    if suffix == "weight_global_scale":
        return _global_scale_problem(t, kind)
    if t.dtype == quant.FP8_DTYPE:  # e4m3fn has no inf: 0x7F and 0xFF are its NaNs, 0x80 is -0
        b = t.view(torch.uint8)
        bad = (b == 0x7F) | (b > 0x80) if suffix == "weight_scale" else (b & 0x7F) == 0x7F
    elif suffix == "weight":
        bad = ~torch.isfinite(t if t.dtype in (torch.float32, torch.bfloat16, torch.float16) else t.float())
    else:  # scales: small, read as fp32
        x = t.float()
        bad = ~torch.isfinite(x) | (x < 0)
        if suffix == "weight_scale_inv":
            bad |= x > _FP32_MAX / quant.FP8_MAX
    if not bad.any():
        return None
    flat = bad.reshape(-1)
    first = int(flat.to(torch.uint8).argmax())
    at = list(torch.unravel_index(torch.tensor(first), tuple(t.shape))) if t.dim() > 1 else [first]
    value = t.reshape(-1)[first].float().item()
    what = ("values are NaN or infinite" if suffix == "weight" else
            "scales are NaN or negative" if suffix == "weight_scale" else
            f"scales are NaN, infinite, negative or above {_FP32_MAX / quant.FP8_MAX:.3g} (448 times it overflows fp32)")
    return f"{int(flat.sum())} of {t.numel()} {what} (first at {[int(i) for i in at]}: {value})"


def _global_scale_problem(t: torch.Tensor, kind: str | None) -> str | None:
    values = t.float().reshape(-1).tolist()
    for i, v in enumerate(values):
        which = f" ({('gate', 'up')[i]})" if len(values) == 2 else ""
        role = "multiplies" if kind == formats.MULTIPLIER else "divides"
        head = f"global scale{which} is {v}"
        if v != v or v in (float("inf"), float("-inf")):
            return f"{head}: every weight it scales becomes NaN or infinite"
        if v == 0:
            return (f"{head}: it multiplies every weight of the projection to 0" if kind == formats.MULTIPLIER else
                    f"{head}: it divides every weight of the projection, giving inf/NaN at run time")
        if v < 0:
            return f"{head}: negative; it {role} every weight of the projection and must be > 0"
        top = _NVFP4_TOP * v if kind == formats.MULTIPLIER else _NVFP4_TOP / v
        if top > _FP32_MAX:
            return (f"{head}: {'too large' if kind == formats.MULTIPLIER else 'too small'}; the largest code "
                    f"dequantizes to {top:.3g}, beyond fp32 (inf at run time)")
    return None


def split_fused(p: Projection) -> tuple[Projection, Projection]:
    """A [gate; up] projection → gate and up, each keeping its source format and bytes."""
    rows = p.shape[0]
    if rows % 2:
        raise FormatError(f"{p.name}: a fused [gate; up] projection needs an even row count, found {rows}")
    half = rows // 2
    fmt = p.spec
    block = fmt.scale_rows if fmt else 1
    if half % block:
        raise FormatError(f"{p.name}: I = {half} splits a {block}-row scale block of {fmt.name} between gate and up")
    halves = ({}, {})
    for suffix, t in p.tensors.items():
        if fmt and suffix == fmt.global_scale_name:  # one per-tensor scale shared by both halves
            halves[0][suffix], halves[1][suffix] = t, t
            continue
        cut = half // block if fmt and suffix == fmt.scale_name else half
        halves[0][suffix], halves[1][suffix] = t[:cut], t[cut:]
    return (Projection(p.format, halves[0], f"{p.name}[gate]", p.kind, p.dropped, p.widened),
            Projection(p.format, halves[1], f"{p.name}[up]", p.kind, widened=p.widened))


def split_prefix_pairs(p: Projection, prefix_rows: int) -> tuple[Projection, Projection, Projection]:
    """A split projection's source rows [prefix; gate; up] → three projections, each keeping the
    source's format and bytes (a per-tensor scale is shared by all three, as the source had one)."""
    rows = p.shape[0]
    inter = (rows - prefix_rows) // 2
    if inter <= 0 or rows != prefix_rows + 2 * inter:
        raise FormatError(f"{p.name}: {rows} rows cannot be a prefix of {prefix_rows} rows (Q, K, V) and "
                          "two equal halves [gate; up]; config.json and the weights disagree")
    fmt = p.spec
    block = fmt.scale_rows if fmt else 1
    if prefix_rows % block or inter % block:
        raise FormatError(f"{p.name}: the prefix ({prefix_rows} rows) and the gate/up halves ({inter} rows each) "
                          f"must be whole {block}-row scale blocks of the source's {fmt.name}")
    cuts = (0, prefix_rows, prefix_rows + inter, rows)
    parts = ({}, {}, {})
    for suffix, t in p.tensors.items():
        for i in range(3):
            if fmt and suffix == fmt.global_scale_name:
                parts[i][suffix] = t
            else:
                step = block if fmt and suffix == fmt.scale_name else 1
                parts[i][suffix] = t[cuts[i] // step:cuts[i + 1] // step]
    return tuple(Projection(p.format, part, f"{p.name}[{what}]", p.kind, p.dropped if i == 0 else [], p.widened)
                 for i, (part, what) in enumerate(zip(parts, formats.SPLIT_SEGMENTS)))


def pack_split(prefix: Projection, gate: Projection, up: Projection, g: int) -> dict[str, torch.Tensor]:
    """Three projections in the same target format → the packed split-projection tensors (by suffix)."""
    if len({prefix.format, gate.format, up.format}) != 1 or gate.shape != up.shape or prefix.shape[1] != gate.shape[1]:
        raise FormatError(f"{prefix.name}, {gate.name} and {up.name} differ: {prefix.format} {list(prefix.shape)}, "
                          f"{gate.format} {list(gate.shape)}, {up.format} {list(up.shape)}")
    return split_interleave.pack_split(prefix.tensors, gate.tensors, up.tensors, g,
                                       formats.weight_format(gate.format))


def unpack_split(tensors: dict[str, torch.Tensor], prefix_rows: int, fmt: str, g: int, kind: str | None = None,
                 ) -> tuple[Projection, Projection, Projection]:
    """The inverse of ``pack_split``: packed tensors → prefix, gate and up projections."""
    parts = split_interleave.unpack_split(tensors, prefix_rows, g, formats.weight_format(fmt))
    return tuple(Projection(fmt, t, what, kind) for t, what in zip(parts, formats.SPLIT_SEGMENTS))


def widened_note(counts: dict[str, int]) -> str:
    """What convert and verify say of repacked projections whose scales the source stored in a
    narrower dtype (``counts``: that dtype's name → projections): the values are moved exactly, the
    bytes are not."""
    parts = [f"{n} with {dtype} block scales" for dtype, n in sorted(counts.items())]
    return (f"{', '.join(parts)} in the source: scales widened exactly to float32 (the same values, "
            "not the same bytes; e4m3 weights moved byte for byte)")


def dequantize(p: Projection) -> torch.Tensor:
    fmt = p.spec
    return p.tensors["weight"].float() if fmt is None else fmt.dequantize(p.tensors, p.kind)


def quantize(w: torch.Tensor, fmt: str, name: str, kind: str | None = None) -> Projection:
    """A dense weight → a Projection in ``fmt`` (a per-tensor scale stored as ``kind``, default divisor)."""
    spec = formats.weight_format(fmt)
    kind = (kind or formats.DIVISOR) if spec.global_scale_name else None
    return Projection(spec.name, spec.quantize(w, name, kind), name, kind)


def keeps_bytes(p: Projection, fmt: str, kind: str | None) -> bool:
    """Whether ``p`` is already in ``fmt`` (with a per-tensor scale: of the same kind), so that
    converting it moves bytes only. A dense source is already in a format whose one tensor is its
    weight, in the weight's dtype (bf16)."""
    spec = formats.weight_format(fmt)
    if p.spec is not None:
        return p.spec is spec and (not spec.global_scale_name or p.kind == kind)
    return spec.tensors(1, 2, 1).keys() == {"weight"} and p.tensors["weight"].dtype == spec.weight_dtype


def to_format(p: Projection, fmt: str, kind: str | None) -> tuple[Projection, bool]:
    """Return (projection in ``fmt``, whether its bytes were kept as they were)."""
    if keeps_bytes(p, fmt, kind):
        return Projection(fmt, p.tensors, p.name, p.kind, p.dropped, p.widened), True
    return quantize(dequantize(p), fmt, p.name, kind), False


def pack_gate_up(gate: Projection, up: Projection, g: int) -> dict[str, torch.Tensor]:
    """Two projections in the same target format → the packed gate_up tensors (by suffix)."""
    if gate.format != up.format or gate.shape != up.shape:
        raise FormatError(f"{gate.name} and {up.name} differ: {gate.format} {list(gate.shape)} vs "
                          f"{up.format} {list(up.shape)}; gate and up must have the same shape")
    return il.pack_gate_up(gate.tensors, up.tensors, g, formats.weight_format(gate.format))


def unpack_gate_up(tensors: dict[str, torch.Tensor], fmt: str, g: int, kind: str | None = None,
                   ) -> tuple[Projection, Projection]:
    """The inverse of ``pack_gate_up``: packed tensors → gate and up projections."""
    gate, up = il.unpack_gate_up(tensors, g, formats.weight_format(fmt))
    return Projection(fmt, gate, "gate", kind), Projection(fmt, up, "up", kind)
