"""The packed format, version 2: the one place that spells tensor names, dtypes and metadata keys.

A packed checkpoint is a normal Hugging Face directory (config.json + safetensors) in which every
gated MLP ``P`` (``model.layers.0.mlp``, ``transformer_blocks.0.ff``, ...) is stored as two
projections, ``P.gate_up_interleaved`` (2·I rows, interleaved) and ``P.down_proj`` (H rows,
I columns), each with the tensors of its weight format:

    format        tensor                 dtype            shape (N rows, K cols)
    bf16          weight                 bfloat16         [N, K]
    fp8_block128  weight                 float8_e4m3fn    [N, K]
                  weight_scale_inv       float32          [ceil(N/128), ceil(K/128)]   (multiplier)
    nvfp4         weight_packed          uint8            [N, K/2]   (low nibble = even column)
                  weight_scale           float8_e4m3fn    [N, ceil(K/16)]
                  weight_global_scale    float32          [2] for gate_up (gate, up), [1] for down

The interleave of granularity g (rows of the packed gate_up, chunk j = 0 … I/g − 1):

    rows [2jg, 2jg+g)      gate rows [jg, (j+1)g)
    rows [2jg+g, 2(j+1)g)  up   rows [jg, (j+1)g)

so a tile of 2g packed rows yields g finished columns of h, in the original intermediate order.

Non-MLP linears (attention q/k/v/o, ...) of a quantized source are listed in
``quantization_config.linears``; each listed module ``L`` (rows = out_features, cols = in_features)
holds the tensors of the weight format for rows × cols with halves = 1, exactly as a down_proj:

    fp8_block128  L.weight (e4m3), L.weight_scale_inv (fp32 [ceil(N/128), ceil(K/128)])
    nvfp4         L.weight_packed, L.weight_scale, L.weight_global_scale [1] (global_scale_kind)
    any format    L.bias: optional, bf16 / fp16 / fp32 [N], as the source had it

and a loader runs it as ``swiglu_fused.linear.PackedLinear`` (x quantized per token group of 128
for fp8, bf16 for nvfp4; then the down GEMM). A format-bf16 checkpoint lists none: a quantized
source's linears are stored dequantized as a plain bf16 ``L.weight``. Linears the source left
unquantized (lm_head, its ignore list) are stored as they were. Quantized tensors anywhere else
(a scale, or a weight of e4m3 / uint8 codes outside the packed MLPs and ``linears``) are a violation:
a plain Linear would compute with the raw codes.

Split projections ("plain prefix + pairs", Flux.2's single-stream ``to_qkv_mlp_proj``: one Linear
whose rows are [Q; K; V; gate; up]) are listed in ``quantization_config.split_projections``, a map
projection ``S`` → prefix rows P. ``S.prefix_gate_up_interleaved`` holds P plain rows followed by
the gate/up pairs of intermediate size I, interleaved exactly as gate_up (N = P + 2I rows):

    rows [0, P)                       the prefix rows as the source had them (Q; K; V)
    rows [P + 2jg, P + 2jg + g)       gate rows [jg, (j+1)g)
    rows [P + 2jg + g, P + 2(j+1)g)   up   rows [jg, (j+1)g)

with the tensors of the weight format for N × K (scales follow their rows: fp8's 128-row blocks
need P % 128 == 0, so no block straddles the boundary; nvfp4's per-16 scales are per row) and, for
nvfp4, ``weight_global_scale`` [3]: (prefix, gate, up), as the split GEMM applies them per column
segment. The split GEMM writes y [M, P] (bf16) for the prefix columns and h = act(gate)·up [M, I].

Why ``gate_up_interleaved`` (version 2) and not ``gate_up_proj`` (version 1): interleaved rows are
not a Linear's [gate; up] weight, so they must not carry a Linear's name. Under version 1 a packed
Phi-3 bf16 checkpoint loaded without ``import swiglu_fused`` filled Phi3MLP.gate_up_proj with
interleaved rows and ran them as [gate; up], silently wrong. Under version 2 transformers reports
``gate_up_proj.weight`` MISSING and ``gate_up_interleaved.weight`` UNEXPECTED in its load report and
never uses the packed rows (DESIGN.md §3). Loaders and ``verify`` refuse version 1 (re-run
``swiglu-fused convert`` on the source).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Mapping, TypeVar

import torch

from . import quant
from .quant import FP8_BLOCK, FP8_DTYPE, FP8_MAX, NVFP4_GROUP, NVFP4_VALUES_PER_BYTE, cdiv  # noqa: F401 (the spec's)

T = TypeVar("T")

FORMAT_VERSION = 2
QUANT_METHOD = "swiglu_fused"
METADATA_KEY = "swiglu_fused"  # key of the JSON blob in each safetensors __metadata__

from .format_names import DEFAULT_INTERLEAVE  # noqa: E402  (torch-free, for the command's parser)

GATE_UP = "gate_up_interleaved"  # not a Linear's name: see the module docstring
DOWN = "down_proj"
SPLIT = "prefix_gate_up_interleaved"  # a split projection's packed rows (module docstring); not a Linear's name
SPLIT_SEGMENTS = ("prefix", "gate", "up")  # its nvfp4 weight_global_scale entries, in order

# nvfp4's per-tensor scale: compressed-tensors stores a divisor, ModelOpt a multiplier
DIVISOR, MULTIPLIER = "divisor", "multiplier"
GLOBAL_SCALE_KINDS = (DIVISOR, MULTIPLIER)

# keys of quantization_config (config.json) and of the __metadata__ blob
K_QUANT_METHOD = "quant_method"
K_VERSION = "format_version"
K_WEIGHT_FORMAT = "weight_format"
K_INTERLEAVE = "interleave"
K_ACTIVATION = "activation"
K_H_FORMAT = "h_format"
K_GLOBAL_SCALE_KIND = "global_scale_kind"
K_MODULES = "modules"
K_LINEARS = "linears"
K_SPLIT = "split_projections"
K_SOURCE = "source"

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class FormatError(ValueError):
    """A packed checkpoint, or a request to make one, that this version cannot accept."""


# ---------------------------------------------------------------- registries: activations, h formats
# The names are registered here; the reference (kernels/reference.py) and the sm90 epilogue
# (kernels/sm90/activations_and_h.py) register their implementations against them (tests/test_registry.py
# checks that the name sets agree), and look them up with ``implementation``.
ACTIVATIONS = ("silu", "gelu_tanh")


@dataclass(frozen=True)
class HFormat:
    """What gate_up writes for down: h's dtype and, when scaled, the columns that share an fp32
    scale (h_scale [M, ceil(I / scale_group)])."""

    name: str
    dtype: torch.dtype
    scale_group: int | None = None

    @property
    def scaled(self) -> bool:
        return self.scale_group is not None


H_FORMATS: dict[str, HFormat] = {
    h.name: h for h in (HFormat("bf16", torch.bfloat16), HFormat("fp8_group128", FP8_DTYPE, FP8_BLOCK))
}


def implementation(table: Mapping[str, T], name: str, arg: str, backend: str) -> T:
    """``table[name]``: one backend's implementation of an activation or h format, with the error a
    caller can act on (``arg`` is the argument that named it)."""
    if name in table:
        return table[name]
    what, known = ("activation", ACTIVATIONS) if arg == "act" else ("h format", tuple(H_FORMATS))
    if name not in known:
        raise ValueError(f"{arg}: unknown {what} {name!r}; expected one of {sorted(known)}")
    raise ValueError(f"{arg}: no {backend} implementation of {what} {name!r}; it has {sorted(table)}")


# ---------------------------------------------------------------- weight formats
@dataclass(frozen=True)
class SourceLayout:
    """How one producer stores a format in its own checkpoints, so that ``pack.read_projection``
    recognises a projection in it and repacks its bytes. A projection is in this layout when it has
    the ``marker`` tensor and (if ``weight_dtype`` is set) its ``weight`` tensor has that dtype.
    ``names`` maps our tensor suffixes to the producer's; ``dropped`` names its tensors that have
    no place in the packed format (static activation scales: we quantize x per token group)."""

    producer: str
    marker: str
    names: Mapping[str, str]
    global_scale_kind: str | None = None
    weight: str = "weight"
    weight_dtype: torch.dtype | None = None
    dropped: tuple[str, ...] = ()

    def matches(self, get) -> bool:
        """Whether the projection whose tensors ``get(suffix)`` returns is stored in this layout."""
        if get(self.marker) is None:
            return False
        w = get(self.weight)
        return self.weight_dtype is None or (w is not None and w.dtype == self.weight_dtype)


class WeightFormat:
    """One packed weight format: its tensors (names, dtypes, shapes), how a weight is quantized to
    it and dequantized from it, the producers' layouts it repacks from, the h format it feeds to
    down, and whether the sm90 kernels implement it. One subclass per format, one instance in
    WEIGHT_FORMATS; everything else asks the instance instead of comparing names."""

    name: str
    description: str
    h_format: str  # what gate_up writes for the down projection
    interleave_multiple: int = 1  # g must be a multiple of this (whole 128-row scale blocks)
    roundtrip_bound: float  # relative Frobenius error of dequantize(quantize(w)) that verify accepts
    weight_name: str = "weight"  # the tensor that holds the values (rows × stored columns)
    weight_dtype: torch.dtype
    values_per_byte: int = 1  # columns of the matrix per stored column of ``weight_name``
    scale_name: str | None = None  # the per-block scales (ops take them as weight_scale)
    scale_rows: int = 1  # weight rows per row of the ``scale_name`` tensor (its blocks' height)
    global_scale_name: str | None = None  # per-tensor scales (ops take them as global_scale)
    quantizes_x: bool = False  # x is quantized (quant_x) before gate_up
    sm90_kernels: bool = False  # the sm90 kernels implement it (at g = 128; else the reference runs)
    # the modules may hold the weight and its scales in kernels/nvfp4_layout.py's tile-major order
    # on a GPU (never in a checkpoint: DESIGN §3.3)
    tile_major_order: bool = False
    sources: tuple[SourceLayout, ...] = ()
    requantized: str = "quantized"  # what convert's summary says of projections it did not repack
    packs_linears: bool = True  # a quantized source's non-MLP linears are stored in it (else plain dense weights)

    def tensors(self, rows: int, cols: int, halves: int) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        """Tensor suffix → (dtype, shape) for a projection of ``rows`` × ``cols``.

        ``halves`` is 2 for gate_up (separate per-tensor scales for gate and up), 1 for down.
        """
        raise NotImplementedError

    def cols_of(self, weight: torch.Tensor) -> int:
        """The matrix's column count K from its stored ``weight_name`` tensor."""
        return weight.shape[1] * self.values_per_byte

    def size_problem(self, what: str, n: int) -> str | None:
        """Why a matrix side of ``n`` (``what``: "I", "hidden size", ...) cannot be stored, or None."""
        v = self.values_per_byte
        if n % v:
            return (f"{what} = {n} is {'odd' if v == 2 else f'not a multiple of {v}'}, and {self.name} packs "
                    f"{v} values per byte along it")
        return None

    def has_sm90_kernels(self, interleave: int) -> bool:
        """Whether forward runs the sm90 kernels for this format at granularity ``interleave``."""
        return self.sm90_kernels and interleave == FP8_BLOCK

    def quantize(self, w: torch.Tensor, name: str, kind: str | None = None) -> dict[str, torch.Tensor]:
        """A dense fp32 weight [N, K] → this format's tensors (``kind``: how a per-tensor scale is
        stored); FormatError names ``name`` when ``w`` cannot be stored."""
        raise NotImplementedError

    def dequantize(self, tensors: Mapping[str, torch.Tensor], kind: str | None = None) -> torch.Tensor:
        """This format's tensors → the fp32 weight [N, K]."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"WeightFormat({self.name!r})"


class BF16(WeightFormat):
    name = "bf16"
    description = "bf16 weights and activations"
    h_format = "bf16"
    roundtrip_bound = 0.004  # random normal weights give 0.0017
    weight_dtype = torch.bfloat16
    sm90_kernels = True
    requantized = "converted to bf16"
    packs_linears = False  # a plain bf16 Linear holds them

    def tensors(self, rows, cols, halves):
        return {"weight": (torch.bfloat16, (rows, cols))}

    def quantize(self, w, name, kind=None):
        out = w.to(torch.bfloat16)
        over = ~torch.isfinite(out)
        if over.any():  # finite fp32 beyond bfloat16's largest value rounds to inf
            raise FormatError(f"{name}: {int(over.sum())} of {w.numel()} weights exceed bfloat16's range (largest "
                              f"{torch.finfo(torch.bfloat16).max:.3g}); choose weight_format='fp8_block128' or "
                              "weight_format='nvfp4', "
                              "which scale each block")
        return {"weight": out}

    def dequantize(self, tensors, kind=None):
        return tensors["weight"].float()


class FP8Block128(WeightFormat):
    name = "fp8_block128"
    description = "e4m3 weights with 128x128 block scales, e4m3 activations per token-group of 128"
    h_format = "fp8_group128"
    interleave_multiple = FP8_BLOCK
    roundtrip_bound = 0.04  # random normal weights give 0.027
    weight_dtype = FP8_DTYPE
    scale_name = "weight_scale_inv"
    scale_rows = FP8_BLOCK
    quantizes_x = True
    sm90_kernels = True
    # compressed-tensors float-quantized with block [128, 128] weights (llmcompressor's FP8_BLOCK):
    # weight_scale (bf16 or fp32) multiplies, like weight_scale_inv; first, as its weight is e4m3 too.
    # Then transformers' fine-grained FP8 (DeepSeek-V3, Qwen3-FP8).
    sources = (SourceLayout("compressed-tensors FP8 block", "weight_scale",
                            {"weight": "weight", "weight_scale_inv": "weight_scale"}, weight_dtype=FP8_DTYPE),
               SourceLayout("transformers fine-grained FP8", "weight",
                            {"weight": "weight", "weight_scale_inv": "weight_scale_inv"},
                            weight_dtype=FP8_DTYPE, dropped=("activation_scale",)),)

    def tensors(self, rows, cols, halves):
        return {
            "weight": (FP8_DTYPE, (rows, cols)),
            "weight_scale_inv": (torch.float32, (cdiv(rows, FP8_BLOCK), cdiv(cols, FP8_BLOCK))),
        }

    def quantize(self, w, name, kind=None):
        q, s = quant.quantize_fp8_block(w)
        return {"weight": q, "weight_scale_inv": s}

    def dequantize(self, tensors, kind=None):
        return quant.dequantize_fp8_block(tensors["weight"], tensors["weight_scale_inv"])


class NVFP4(WeightFormat):
    name = "nvfp4"
    description = "e2m1 weights with e4m3 scales per 16 and fp32 per-tensor scales; bf16 activations"
    h_format = "bf16"
    roundtrip_bound = 0.12  # random normal weights give 0.095
    weight_name = "weight_packed"
    weight_dtype = torch.uint8
    values_per_byte = NVFP4_VALUES_PER_BYTE
    scale_name = "weight_scale"
    global_scale_name = "weight_global_scale"
    sm90_kernels = True  # W4A16: kernels/sm90/nvfp4.py decodes the weight to bf16 in shared memory
    tile_major_order = True  # each kernel k tile's codes and scales in one run (kernels/nvfp4_layout.py)
    sources = (
        SourceLayout("compressed-tensors", "weight_packed", {"weight_packed": "weight_packed",
                     "weight_scale": "weight_scale", "weight_global_scale": "weight_global_scale"},
                     DIVISOR, weight="weight_packed", dropped=("input_global_scale",)),
        SourceLayout("ModelOpt", "weight_scale_2", {"weight_packed": "weight", "weight_scale": "weight_scale",
                     "weight_global_scale": "weight_scale_2"}, MULTIPLIER, weight_dtype=torch.uint8,
                     dropped=("input_scale",)),
    )

    def tensors(self, rows, cols, halves):
        return {
            "weight_packed": (torch.uint8, (rows, cols // NVFP4_VALUES_PER_BYTE)),
            "weight_scale": (FP8_DTYPE, (rows, cdiv(cols, NVFP4_GROUP))),
            "weight_global_scale": (torch.float32, (halves,)),
        }

    def quantize(self, w, name, kind=None):
        if self.size_problem("K", w.shape[1]):
            raise FormatError(f"{name}: nvfp4 packs two values per byte, so it needs an even number of columns; "
                              f"this projection has {w.shape[1]} (choose weight_format='fp8_block128' or "
                              "weight_format='bf16')")
        packed, scale, gs = quant.quantize_nvfp4(w)
        if kind == MULTIPLIER:
            gs = 1.0 / gs
        return {"weight_packed": packed, "weight_scale": scale, "weight_global_scale": gs}

    def dequantize(self, tensors, kind=None):
        return quant.dequantize_nvfp4(tensors["weight_packed"], tensors["weight_scale"],
                                      tensors["weight_global_scale"], divisor=kind != MULTIPLIER)


WEIGHT_FORMATS: dict[str, WeightFormat] = {f.name: f for f in (BF16(), FP8Block128(), NVFP4())}


def source_layout(get) -> SourceLayout | None:
    """The producer's quantized layout of the projection whose tensors ``get(suffix)`` returns
    (tensors or meta tensors), or None: a dense projection."""
    return next((lay for f in WEIGHT_FORMATS.values() for lay in f.sources if lay.matches(get)), None)
ROUNDTRIP_BOUND = {name: f.roundtrip_bound for name, f in WEIGHT_FORMATS.items()}


def weight_format(name: str) -> WeightFormat:
    try:
        return WEIGHT_FORMATS[name]
    except (KeyError, TypeError):
        raise FormatError(f"unknown weight format {name!r}; expected one of {sorted(WEIGHT_FORMATS)}") from None


def format_of_weight(weight: torch.Tensor) -> WeightFormat | None:
    """The format whose stored weight has this tensor's dtype (the ops tell formats apart by it)."""
    return next((f for f in WEIGHT_FORMATS.values() if f.weight_dtype == weight.dtype), None)


def _is_positive_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1  # True is an int to Python


def interleave_problem(g, fmt: WeightFormat | None = None) -> str | None:
    """Why ``g`` is no interleave granularity (of format ``fmt``, when given), whatever I is, or None."""
    if not _is_positive_int(g):
        return (f"interleave must be a positive integer (a number of rows, e.g. {DEFAULT_INTERLEAVE}), "
                f"got {type(g).__name__} {g!r:.60}")
    if fmt is not None and g % fmt.interleave_multiple:
        return (f"interleave {g} is not a multiple of {fmt.interleave_multiple}, which format {fmt.name} needs "
                "so that 128-row scale blocks stay whole")
    return None


def intermediate_problem(intermediate: int, fmt: WeightFormat) -> str | None:
    """Why no interleave at all can hold an intermediate size I in this format, or None."""
    if not _is_positive_int(intermediate):
        return f"the intermediate size I must be a positive integer, found {intermediate!r:.60}"
    problem = _holding_problem(intermediate, fmt)
    return problem and f"{problem}; choose {_formats_that_hold(intermediate, fmt)}"


def _holding_problem(intermediate: int, fmt: WeightFormat) -> str | None:
    """Why this format cannot hold a positive I at any interleave (intermediate_problem without its
    suggestion), or None."""
    problem = fmt.size_problem("I", intermediate)
    if problem:
        return f"{problem} (down_proj's columns)"
    if intermediate % fmt.interleave_multiple:
        return (f"I = {intermediate} is not a multiple of {fmt.interleave_multiple}, which format {fmt.name} "
                "needs for whole 128-row scale blocks")
    return None


def _formats_that_hold(intermediate: int, fmt: WeightFormat) -> str:
    """Every other format that can hold I, each with the interleave it needs when the default does
    not divide I ("weight_format='bf16' interleave=100 or ..."; the CLI shows its flags: cli.py),
    so that one run of the suggestion converts."""
    flags = []
    for other in WEIGHT_FORMATS.values():
        if other is fmt or _holding_problem(intermediate, other):
            continue
        g = suggest_interleaves(intermediate, other.interleave_multiple)[0]
        flags.append(f"weight_format='{other.name}'" + ("" if g == DEFAULT_INTERLEAVE else f" interleave={g}"))
    return " or ".join(flags) or "another model: no format holds it"


def suggest_interleaves(intermediate: int, multiple: int | WeightFormat = 1) -> list[int]:
    """Up to three granularities g that work for I, best (128, then nearest 128 in log scale) first.

    ``multiple`` is a WeightFormat (then every g returned is valid for that format, and none is
    when the format cannot hold I at all) or, as before, just the multiple g must be of.
    """
    if isinstance(multiple, WeightFormat):
        if intermediate_problem(intermediate, multiple):
            return []
        multiple = multiple.interleave_multiple
    if not _is_positive_int(intermediate) or not _is_positive_int(multiple):
        return []
    divisors = {d for i in range(1, math.isqrt(intermediate) + 1) if intermediate % i == 0
                for d in (i, intermediate // i)}
    good = [g for g in divisors if g % multiple == 0]
    return sorted(good, key=lambda g: (g != DEFAULT_INTERLEAVE, abs(math.log2(g / DEFAULT_INTERLEAVE)), g))[:3]


def check_interleave(intermediate: int, g: int, fmt: WeightFormat, where: str = "") -> None:
    """Raise FormatError when (I, g, format) are incompatible, naming a g that works when one does
    (every g suggested here passes this check)."""
    at = f"{where}: " if where else ""
    problem = interleave_problem(g)
    if problem:
        raise FormatError(f"{at}{problem}")
    problem = intermediate_problem(intermediate, fmt)
    if problem:
        raise FormatError(f"{at}no interleave works for format {fmt.name}: {problem}")
    options = " or ".join(f"interleave={s}" for s in suggest_interleaves(intermediate, fmt))
    problem = interleave_problem(g, fmt)
    if problem:
        raise FormatError(f"{at}{problem}; use {options}")
    if intermediate % g:
        raise FormatError(f"{at}intermediate size I = {intermediate} is not a multiple of interleave={g}; "
                          f"use {options}")


@dataclass(frozen=True)
class PackedConfig:
    """The ``quantization_config`` block of a packed checkpoint."""

    weight_format: str
    interleave: int
    activation: str
    modules: tuple[str, ...] = ()
    global_scale_kind: str | None = None  # nvfp4 only
    source: Mapping = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    linears: tuple[str, ...] = ()  # non-MLP linears stored in weight_format (see the module docstring)
    split_projections: Mapping[str, int] = field(default_factory=dict)  # projection → prefix rows (docstring)

    @property
    def h_format(self) -> str:
        return WEIGHT_FORMATS[self.weight_format].h_format

    def to_dict(self) -> dict:
        d = {
            K_QUANT_METHOD: QUANT_METHOD,
            K_VERSION: self.format_version,
            K_WEIGHT_FORMAT: self.weight_format,
            K_INTERLEAVE: self.interleave,
            K_ACTIVATION: self.activation,
            K_H_FORMAT: self.h_format,
            K_MODULES: list(self.modules),
            K_SOURCE: dict(self.source),
        }
        if self.linears:
            d[K_LINEARS] = list(self.linears)
        if self.split_projections:
            d[K_SPLIT] = dict(self.split_projections)
        if self.global_scale_kind is not None:
            d[K_GLOBAL_SCALE_KIND] = self.global_scale_kind
        return d

    def file_metadata(self) -> dict[str, str]:
        """The safetensors ``__metadata__`` (string values only): the same facts minus the module list."""
        blob = {k: v for k, v in self.to_dict().items() if k not in (K_MODULES, K_SOURCE, K_LINEARS, K_SPLIT)}
        return {"format": "pt", METADATA_KEY: json.dumps(blob, sort_keys=True)}

    @classmethod
    def from_dict(cls, d: Mapping, where: str = "config.json") -> "PackedConfig":
        check_header(d, where)
        if not isinstance(d.get(K_SOURCE, {}), Mapping):
            raise FormatError(f"{where} / {K_SOURCE}: expected an object, found {d.get(K_SOURCE)!r:.80}")
        return cls(
            weight_format=d[K_WEIGHT_FORMAT],
            interleave=int(d[K_INTERLEAVE]),
            activation=d[K_ACTIVATION],
            modules=tuple(d.get(K_MODULES, ())),
            global_scale_kind=d.get(K_GLOBAL_SCALE_KIND),
            source=d.get(K_SOURCE, {}),
            format_version=int(d[K_VERSION]),
            linears=tuple(d.get(K_LINEARS, ())),
            split_projections=dict(d.get(K_SPLIT, {})),
        )


def header_problems(d: Mapping, where: str) -> list["Violation"]:
    """Check the fields a loader must understand before touching any tensor."""
    out: list[Violation] = []

    def bad(fieldname: str, msg: str) -> None:
        out.append(Violation(where, None, fieldname, msg))

    if d.get(K_QUANT_METHOD) != QUANT_METHOD:
        bad(K_QUANT_METHOD, f"expected {QUANT_METHOD!r}, found {d.get(K_QUANT_METHOD)!r}")
    version = d.get(K_VERSION)
    if not isinstance(version, int) or isinstance(version, bool):
        bad(K_VERSION, f"missing or not an integer: {version!r}")
    elif version > FORMAT_VERSION:
        bad(K_VERSION, f"format version {version} is newer than this swiglu-fused supports "
                       f"({FORMAT_VERSION}); upgrade swiglu-fused to read it")
    elif version < 1:
        bad(K_VERSION, f"invalid format version {version}")
    elif version < FORMAT_VERSION:
        bad(K_VERSION, f"format version {version} is no longer read (version 1 named the interleaved projection "
                       f"gate_up_proj, a Linear's name, so a model loaded without swiglu_fused could use it as "
                       f"[gate; up]); re-run `swiglu-fused convert` on the source checkpoint to write version "
                       f"{FORMAT_VERSION}")
    fmt = d.get(K_WEIGHT_FORMAT)
    if fmt not in WEIGHT_FORMATS:
        bad(K_WEIGHT_FORMAT, f"unsupported weight format {fmt!r}; expected one of {sorted(WEIGHT_FORMATS)}")
    g = d.get(K_INTERLEAVE)
    if not _is_positive_int(g):
        bad(K_INTERLEAVE, f"must be a positive integer, found {g!r}")
    elif fmt in WEIGHT_FORMATS and interleave_problem(g, WEIGHT_FORMATS[fmt]):
        bad(K_INTERLEAVE, interleave_problem(g, WEIGHT_FORMATS[fmt]))
    if d.get(K_ACTIVATION) not in ACTIVATIONS:
        bad(K_ACTIVATION, f"unsupported activation {d.get(K_ACTIVATION)!r}; expected one of {list(ACTIVATIONS)}")
    if (fmt in WEIGHT_FORMATS and WEIGHT_FORMATS[fmt].global_scale_name
            and d.get(K_GLOBAL_SCALE_KIND) not in GLOBAL_SCALE_KINDS):
        bad(K_GLOBAL_SCALE_KIND, f"{fmt} needs one of {list(GLOBAL_SCALE_KINDS)}, found {d.get(K_GLOBAL_SCALE_KIND)!r}")
    modules = d.get(K_MODULES, [])
    if not isinstance(modules, list) or not all(isinstance(m, str) and m for m in modules):
        bad(K_MODULES, f"must be a list of module names (e.g. \"model.layers.0.mlp\"), found {modules!r:.200}")
    linears = d.get(K_LINEARS, [])
    if not isinstance(linears, list) or not all(isinstance(m, str) and m for m in linears):
        bad(K_LINEARS, f"must be a list of linear module names (e.g. \"model.layers.0.self_attn.q_proj\"), "
                       f"found {linears!r:.200}")
    elif isinstance(modules, list):
        inside = [lin for lin in linears if any(lin == m or lin.startswith(f"{m}.") for m in modules if isinstance(m, str))]
        if inside:
            bad(K_LINEARS, f"{inside[0]!r} lies in a packed MLP listed in {K_MODULES}; an MLP's projections are "
                           f"stored as {GATE_UP} and {DOWN}, not as linears")
        if len(set(linears)) != len(linears):
            bad(K_LINEARS, "lists a module twice")
    splits = d.get(K_SPLIT, {})
    if not isinstance(splits, Mapping) or not all(isinstance(k, str) and k and _is_positive_int(v)
                                                  for k, v in splits.items()):
        bad(K_SPLIT, f"must map projection names to their prefix rows (e.g. "
                     f"{{\"single_transformer_blocks.0.attn.to_qkv_mlp_proj\": 9216}}), found {splits!r:.200}")
    elif isinstance(linears, list) and set(linears) & set(splits):
        bad(K_SPLIT, f"{sorted(set(linears) & set(splits))[0]!r} is listed in {K_LINEARS} too; a split projection "
                     f"is stored as {SPLIT}, not as a linear")
    return out


def check_header(d: Mapping, where: str) -> None:
    problems = header_problems(d, where)
    if problems:
        raise FormatError("; ".join(str(p) for p in problems))


@dataclass(frozen=True)
class Violation:
    file: str | None
    tensor: str | None
    field: str | None
    message: str

    def __str__(self) -> str:
        parts = [p for p in (self.file, self.tensor, self.field) if p]
        return f"{' / '.join(parts)}: {self.message}" if parts else self.message


def projection_problems(
    tensors: Mapping[str, torch.Tensor], prefix: str, fmt: WeightFormat, halves: int, file_of: Mapping[str, str],
) -> tuple[list[Violation], tuple[int, int] | None]:
    """Check one projection's tensors; returns the problems and its (rows, cols) when readable."""
    wname = f"{prefix}.{fmt.weight_name}"
    if wname not in tensors:
        return [Violation(None, wname, None, "missing")], None
    w = tensors[wname]
    if w.dim() != 2:
        return [Violation(file_of.get(wname), wname, "shape", f"expected 2 dimensions, found {list(w.shape)}")], None
    rows, cols = w.shape[0], fmt.cols_of(w)
    out = []
    for suffix, (dtype, shape) in fmt.tensors(rows, cols, halves).items():
        name = f"{prefix}.{suffix}"
        t = tensors.get(name)
        if t is None:
            out.append(Violation(None, name, None, "missing"))
            continue
        if t.dtype != dtype:
            out.append(Violation(file_of.get(name), name, "dtype", f"expected {dtype}, found {t.dtype}"))
        if tuple(t.shape) != shape:
            out.append(Violation(file_of.get(name), name, "shape", f"expected {list(shape)}, found {list(t.shape)}"))
    return out, (rows, cols)


def module_problems(
    tensors: Mapping[str, torch.Tensor], module: str, cfg: PackedConfig, file_of: Mapping[str, str] = {},
) -> list[Violation]:
    """Check one packed MLP: tensor presence, dtypes, shapes, and the I/H/g relations."""
    fmt = weight_format(cfg.weight_format)
    gu, gu_shape = projection_problems(tensors, f"{module}.{GATE_UP}", fmt, 2, file_of)
    dn, dn_shape = projection_problems(tensors, f"{module}.{DOWN}", fmt, 1, file_of)
    out = gu + dn
    if gu_shape:
        rows, hidden = gu_shape
        name = f"{module}.{GATE_UP}.{fmt.weight_name}"
        if rows % 2:
            out.append(Violation(file_of.get(name), name, "shape", f"gate_up has an odd number of rows ({rows})"))
        else:
            try:
                check_interleave(rows // 2, cfg.interleave, fmt)
            except FormatError as e:
                out.append(Violation(file_of.get(name), name, K_INTERLEAVE, str(e)))
        if dn_shape and dn_shape != (hidden, rows // 2):
            dname = f"{module}.{DOWN}.{fmt.weight_name}"
            out.append(Violation(file_of.get(dname), dname, "shape",
                                 f"down_proj is {list(dn_shape)} but {GATE_UP} implies [H, I] = {[hidden, rows // 2]}"))
    return out


LINEAR_BIAS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def linear_problems(
    tensors: Mapping[str, torch.Tensor], module: str, cfg: PackedConfig, file_of: Mapping[str, str] = {},
) -> list[Violation]:
    """Check one packed non-MLP linear (``cfg.linears``): its format's tensors for rows × cols with
    one per-tensor scale (as down_proj), and an optional bias [rows] in bf16, fp16 or fp32."""
    out, shape = projection_problems(tensors, module, weight_format(cfg.weight_format), 1, file_of)
    bias = tensors.get(f"{module}.bias")
    if bias is not None:
        name = f"{module}.bias"
        if bias.dtype not in LINEAR_BIAS_DTYPES:
            out.append(Violation(file_of.get(name), name, "dtype",
                                 f"expected one of {[str(d) for d in LINEAR_BIAS_DTYPES]}, found {bias.dtype}"))
        if shape and tuple(bias.shape) != (shape[0],):
            out.append(Violation(file_of.get(name), name, "shape", f"expected [{shape[0]}] (the weight's rows), "
                                                                   f"found {list(bias.shape)}"))
    return out


def split_problems(
    tensors: Mapping[str, torch.Tensor], module: str, prefix_rows: int, cfg: PackedConfig,
    file_of: Mapping[str, str] = {},
) -> list[Violation]:
    """Check one split projection (``cfg.split_projections``): its format's tensors for
    (P + 2I) × K with three per-tensor scales (prefix, gate, up), and the P / I / g relations."""
    fmt = weight_format(cfg.weight_format)
    out, shape = projection_problems(tensors, f"{module}.{SPLIT}", fmt, len(SPLIT_SEGMENTS), file_of)
    if shape:
        name = f"{module}.{SPLIT}.{fmt.weight_name}"
        problem = split_shape_problem(shape[0], prefix_rows, cfg.interleave, fmt)
        if problem:
            out.append(Violation(file_of.get(name), name, K_SPLIT, problem))
    return out


def split_shape_problem(rows: int, prefix_rows: int, g: int, fmt: WeightFormat) -> str | None:
    """Why ``rows`` packed rows cannot be P = ``prefix_rows`` plain rows + interleaved gate/up pairs
    in format ``fmt`` at granularity ``g``, or None."""
    pairs = rows - prefix_rows
    if pairs <= 0 or pairs % 2:
        return (f"{rows} rows cannot hold a prefix of {prefix_rows} rows and gate/up pairs (the rest, {pairs}, "
                "must be positive and even)")
    if prefix_rows % fmt.scale_rows:
        return (f"the prefix of {prefix_rows} rows is not a multiple of {fmt.scale_rows}, so a {fmt.name} scale "
                "block would straddle the prefix and the gate/up pairs; choose weight_format='bf16' or "
                "weight_format='nvfp4'")
    try:
        check_interleave(pairs // 2, g, fmt)
    except FormatError as e:
        return str(e)
    return None


def file_metadata_problems(metadata: Mapping[str, str] | None, cfg: PackedConfig, file: str) -> list[Violation]:
    """The facts in a safetensors __metadata__ must be present and agree with config.json."""
    if not metadata or METADATA_KEY not in metadata:
        return [Violation(file, None, f"__metadata__.{METADATA_KEY}", "missing: not a swiglu-fused packed file")]
    try:
        blob = json.loads(metadata[METADATA_KEY])
    except json.JSONDecodeError as e:
        return [Violation(file, None, f"__metadata__.{METADATA_KEY}", f"not valid JSON ({e})")]
    if not isinstance(blob, dict):
        return [Violation(file, None, f"__metadata__.{METADATA_KEY}", f"expected a JSON object, found {blob!r:.200}")]
    out = header_problems(blob, file)
    expected = cfg.to_dict()
    for key in (K_VERSION, K_WEIGHT_FORMAT, K_INTERLEAVE, K_ACTIVATION, K_GLOBAL_SCALE_KIND):
        if blob.get(key) != expected.get(key) and not any(v.field == key for v in out):
            out.append(Violation(file, None, key, f"file says {blob.get(key)!r} but config.json says {expected.get(key)!r}"))
    return out


def validate_state_dict(tensors: Mapping[str, torch.Tensor], cfg: PackedConfig | Mapping,
                        file_of: Mapping[str, str] = {}) -> list[Violation]:
    if not isinstance(cfg, PackedConfig):
        problems = header_problems(cfg, "quantization_config")
        if problems:
            return problems
        cfg = PackedConfig.from_dict(cfg)
    out: list[Violation] = []
    if not cfg.modules:
        out.append(Violation(None, None, K_MODULES, "the packed config lists no MLP modules"))
    for module in cfg.modules:
        out += module_problems(tensors, module, cfg, file_of)
    for module in cfg.linears:
        out += linear_problems(tensors, module, cfg, file_of)
    for module, prefix_rows in cfg.split_projections.items():
        out += split_problems(tensors, module, prefix_rows, cfg, file_of)
    out += unlisted_module_problems(tensors, cfg, file_of)
    out += unlisted_linear_problems(tensors, cfg, file_of)
    return out


def unlisted_module_problems(tensors, cfg: PackedConfig, file_of: Mapping[str, str] = {}) -> list[Violation]:
    """Packed MLPs (a ``{module}.GATE_UP.<format tensor>``) that quantization_config.modules does not
    list: a loader builds FusedSwiGLUMLPs for the listed ones only, so such an MLP would be left
    with randomly initialised weights."""
    suffixes = {s for f in WEIGHT_FORMATS.values() for s in f.tensors(2, 2, 1)}
    listed, seen, out = set(cfg.modules), set(), []
    for name in tensors:
        prefix, _, suffix = name.rpartition(".")
        if suffix in suffixes and prefix.endswith(f".{SPLIT}") and prefix[: -len(SPLIT) - 1] not in cfg.split_projections:
            module = prefix[: -len(SPLIT) - 1]
            if module not in seen:
                seen.add(module)
                out.append(Violation(file_of.get(name), name, K_SPLIT,
                                     f"packed split projection {module!r} is not listed in quantization_config."
                                     f"{K_SPLIT}, so a loader would leave it randomly initialised; convert again"))
            continue
        if suffix not in suffixes or not prefix.endswith(f".{GATE_UP}"):
            continue
        module = prefix[: -len(GATE_UP) - 1]
        if module not in listed and module not in seen:
            seen.add(module)
            out.append(Violation(file_of.get(name), name, K_MODULES,
                                 f"packed MLP {module!r} is not listed in quantization_config.modules, so a "
                                 "loader would leave it randomly initialised; add it to modules or convert again"))
    return out


# tensor suffixes that only a quantized linear has: ours and the producers' (formats.SourceLayout)
_QUANTIZED_SUFFIXES = frozenset(
    {s for f in WEIGHT_FORMATS.values() for s in f.tensors(2, 2, 1) if s != "weight"}
    | {s for f in WEIGHT_FORMATS.values() for lay in f.sources for s in (*lay.names.values(), *lay.dropped)
       if s != "weight"})


def unlisted_linear_problems(tensors, cfg: PackedConfig, file_of: Mapping[str, str] = {}) -> list[Violation]:
    """Quantized tensors outside the packed MLPs and ``cfg.linears`` (a scale tensor, or a weight
    of e4m3 / uint8 codes): a loader builds plain Linears there, which would drop the scales and
    compute with the raw codes (the failure of converters that copied a quantized source's
    attention unchanged)."""
    listed = set(cfg.linears)
    mlps = tuple(f"{m}." for m in (*cfg.modules, *cfg.split_projections))
    out, seen = [], set()
    for name, t in tensors.items():
        prefix, _, suffix = name.rpartition(".")
        if prefix in listed or prefix in seen or name.startswith(mlps):
            continue
        codes = suffix == "weight" and t.dtype in (FP8_DTYPE, torch.uint8)
        if suffix in _QUANTIZED_SUFFIXES or codes:
            seen.add(prefix)
            what = f"a weight of {t.dtype} codes" if codes else "a quantized linear's tensor"
            out.append(Violation(file_of.get(name), name, K_LINEARS,
                                 f"{what} outside the packed MLPs, in a module that quantization_config.{K_LINEARS} "
                                 "does not list, so a loader would build a plain Linear there and compute with "
                                 "raw codes; convert the source checkpoint again"))
    return out
