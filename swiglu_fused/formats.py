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
from pathlib import Path
from typing import Mapping

import torch

FORMAT_VERSION = 2
QUANT_METHOD = "swiglu_fused"
METADATA_KEY = "swiglu_fused"  # key of the JSON blob in each safetensors __metadata__

FP8_BLOCK = 128
NVFP4_GROUP = 16
DEFAULT_INTERLEAVE = 128

GATE_UP = "gate_up_interleaved"  # not a Linear's name: see the module docstring
DOWN = "down_proj"

ACTIVATIONS = ("silu", "gelu_tanh")
H_FORMATS = ("bf16", "fp8_group128")
GLOBAL_SCALE_KINDS = ("divisor", "multiplier")  # compressed-tensors vs ModelOpt

# keys of quantization_config (config.json) and of the __metadata__ blob
K_QUANT_METHOD = "quant_method"
K_VERSION = "format_version"
K_WEIGHT_FORMAT = "weight_format"
K_INTERLEAVE = "interleave"
K_ACTIVATION = "activation"
K_H_FORMAT = "h_format"
K_GLOBAL_SCALE_KIND = "global_scale_kind"
K_MODULES = "modules"
K_SOURCE = "source"

# Relative Frobenius error of dequantize(quantize(w)) against w that `verify` accepts for a fresh
# quantization (random normal weights give 0.0017, 0.027 and 0.095).
ROUNDTRIP_BOUND = {"bf16": 0.004, "fp8_block128": 0.04, "nvfp4": 0.12}

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class FormatError(ValueError):
    """A packed checkpoint, or a request to make one, that this version cannot accept."""


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class WeightFormat:
    name: str
    h_format: str  # what gate_up writes for the down projection
    interleave_multiple: int  # g must be a multiple of this (whole 128-row scale blocks)
    description: str

    def tensors(self, rows: int, cols: int, halves: int) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        """Tensor suffix → (dtype, shape) for a projection of ``rows`` × ``cols``.

        ``halves`` is 2 for gate_up (separate per-tensor scales for gate and up), 1 for down.
        """
        if self.name == "bf16":
            return {"weight": (torch.bfloat16, (rows, cols))}
        if self.name == "fp8_block128":
            return {
                "weight": (torch.float8_e4m3fn, (rows, cols)),
                "weight_scale_inv": (torch.float32, (cdiv(rows, FP8_BLOCK), cdiv(cols, FP8_BLOCK))),
            }
        return {
            "weight_packed": (torch.uint8, (rows, cols // 2)),
            "weight_scale": (torch.float8_e4m3fn, (rows, cdiv(cols, NVFP4_GROUP))),
            "weight_global_scale": (torch.float32, (halves,)),
        }

    def weight_name(self) -> str:
        return "weight_packed" if self.name == "nvfp4" else "weight"

    def cols_of(self, weight: torch.Tensor) -> int:
        return weight.shape[1] * (2 if self.name == "nvfp4" else 1)


WEIGHT_FORMATS: dict[str, WeightFormat] = {
    f.name: f
    for f in (
        WeightFormat("bf16", "bf16", 1, "bf16 weights and activations"),
        WeightFormat("fp8_block128", "fp8_group128", FP8_BLOCK,
                     "e4m3 weights with 128x128 block scales, e4m3 activations per token-group of 128"),
        WeightFormat("nvfp4", "bf16", 1,
                     "e2m1 weights with e4m3 scales per 16 and fp32 per-tensor scales; bf16 activations"),
    )
}


def weight_format(name: str) -> WeightFormat:
    try:
        return WEIGHT_FORMATS[name]
    except KeyError:
        raise FormatError(f"unknown weight format {name!r}; expected one of {sorted(WEIGHT_FORMATS)}") from None


def _is_positive_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1  # True is an int to Python


def intermediate_problem(intermediate: int, fmt: WeightFormat) -> str | None:
    """Why no interleave at all can hold an intermediate size I in this format, or None."""
    if not _is_positive_int(intermediate):
        return f"the intermediate size I must be a positive integer, found {intermediate!r:.60}"
    if fmt.name == "nvfp4" and intermediate % 2:
        return (f"I = {intermediate} is odd, and nvfp4 packs two values per byte along down_proj's I columns; "
                "choose --format fp8_block128 or bf16")
    if intermediate % fmt.interleave_multiple:
        return (f"I = {intermediate} is not a multiple of {fmt.interleave_multiple}, which format {fmt.name} "
                "needs for whole 128-row scale blocks; choose --format bf16 or nvfp4")
    return None


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
    if not _is_positive_int(g):
        raise FormatError(f"{at}interleave must be a positive integer (a number of rows, e.g. "
                          f"{DEFAULT_INTERLEAVE}), got {type(g).__name__} {g!r:.60}")
    problem = intermediate_problem(intermediate, fmt)
    if problem:
        raise FormatError(f"{at}no interleave works for format {fmt.name}: {problem}")
    options = " or ".join(map(str, suggest_interleaves(intermediate, fmt)))
    if g % fmt.interleave_multiple:
        raise FormatError(
            f"{at}interleave {g} is not a multiple of {fmt.interleave_multiple}, which format "
            f"{fmt.name} needs so that 128-row scale blocks stay whole; use --interleave {options}")
    if intermediate % g:
        raise FormatError(f"{at}intermediate size I = {intermediate} is not a multiple of --interleave {g}; "
                          f"use --interleave {options}")


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
        if self.global_scale_kind is not None:
            d[K_GLOBAL_SCALE_KIND] = self.global_scale_kind
        return d

    def file_metadata(self) -> dict[str, str]:
        """The safetensors ``__metadata__`` (string values only): the same facts minus the module list."""
        blob = {k: v for k, v in self.to_dict().items() if k not in (K_MODULES, K_SOURCE)}
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
    if not isinstance(g, int) or isinstance(g, bool) or g < 1:
        bad(K_INTERLEAVE, f"must be a positive integer, found {g!r}")
    elif fmt in WEIGHT_FORMATS and g % WEIGHT_FORMATS[fmt].interleave_multiple:
        bad(K_INTERLEAVE, f"interleave {g} is not a multiple of {WEIGHT_FORMATS[fmt].interleave_multiple}, "
                          f"required by format {fmt}")
    if d.get(K_ACTIVATION) not in ACTIVATIONS:
        bad(K_ACTIVATION, f"unsupported activation {d.get(K_ACTIVATION)!r}; expected one of {list(ACTIVATIONS)}")
    if fmt == "nvfp4" and d.get(K_GLOBAL_SCALE_KIND) not in GLOBAL_SCALE_KINDS:
        bad(K_GLOBAL_SCALE_KIND, f"nvfp4 needs one of {list(GLOBAL_SCALE_KINDS)}, found {d.get(K_GLOBAL_SCALE_KIND)!r}")
    modules = d.get(K_MODULES, [])
    if not isinstance(modules, list) or not all(isinstance(m, str) and m for m in modules):
        bad(K_MODULES, f"must be a list of module names (e.g. \"model.layers.0.mlp\"), found {modules!r:.200}")
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
    wname = f"{prefix}.{fmt.weight_name()}"
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
        name = f"{module}.{GATE_UP}.{fmt.weight_name()}"
        if rows % 2:
            out.append(Violation(file_of.get(name), name, "shape", f"gate_up has an odd number of rows ({rows})"))
        else:
            try:
                check_interleave(rows // 2, cfg.interleave, fmt)
            except FormatError as e:
                out.append(Violation(file_of.get(name), name, K_INTERLEAVE, str(e)))
        if dn_shape and dn_shape != (hidden, rows // 2):
            dname = f"{module}.{DOWN}.{fmt.weight_name()}"
            out.append(Violation(file_of.get(dname), dname, "shape",
                                 f"down_proj is {list(dn_shape)} but {GATE_UP} implies [H, I] = {[hidden, rows // 2]}"))
    return out


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
    out += unlisted_module_problems(tensors, cfg, file_of)
    return out


def unlisted_module_problems(tensors, cfg: PackedConfig, file_of: Mapping[str, str] = {}) -> list[Violation]:
    """Packed MLPs (a ``{module}.GATE_UP.<format tensor>``) that quantization_config.modules does not
    list: a loader builds FusedSwiGLUMLPs for the listed ones only, so such an MLP would be left
    with randomly initialised weights."""
    suffixes = {s for f in WEIGHT_FORMATS.values() for s in f.tensors(2, 2, 1)}
    listed, seen, out = set(cfg.modules), set(), []
    for name in tensors:
        prefix, _, suffix = name.rpartition(".")
        if suffix not in suffixes or not prefix.endswith(f".{GATE_UP}"):
            continue
        module = prefix[: -len(GATE_UP) - 1]
        if module not in listed and module not in seen:
            seen.add(module)
            out.append(Violation(file_of.get(name), name, K_MODULES,
                                 f"packed MLP {module!r} is not listed in quantization_config.modules, so a "
                                 "loader would leave it randomly initialised; add it to modules or convert again"))
    return out


def validate(path: str | Path) -> list[Violation]:
    """Every violation found in a packed checkpoint directory (empty list = valid)."""
    from .weight_packing import safetensors_io as sio  # reading files is packing's business

    path = Path(path)
    cfg_path = path / CONFIG_FILE
    if not cfg_path.is_file():
        return [Violation(str(cfg_path), None, None, "missing config.json")]
    try:
        model_config = json.loads(cfg_path.read_text())
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError; nesting too deep
        return [Violation(str(cfg_path), None, None, f"not valid JSON ({str(e) or type(e).__name__:.200})")]
    qcfg = model_config.get("quantization_config") if isinstance(model_config, dict) else None
    if not isinstance(qcfg, dict):
        return [Violation(str(cfg_path), None, "quantization_config", "missing: not a swiglu-fused checkpoint")]
    problems = header_problems(qcfg, str(cfg_path))
    if problems:
        return problems
    cfg = PackedConfig.from_dict(qcfg)
    try:
        files = sio.checkpoint_files(path)
    except sio.CheckpointError as e:
        return [Violation(str(path), None, None, str(e))]
    tensors: dict[str, torch.Tensor] = {}
    file_of: dict[str, str] = {}
    stored: dict[str, list[str]] = {}  # file name → its tensors (readable files only)
    out: list[Violation] = []
    for f in files:
        try:
            header = sio.read_header(f)
        except sio.CheckpointError as e:
            out.append(Violation(str(f), None, None, str(e)))
            continue
        out += file_metadata_problems(header.metadata, cfg, str(f))
        stored[f.relative_to(path).as_posix()] = list(header.entries)
        # Meta tensors carry dtype and shape without reading a byte of data.
        for name, t in header.meta_tensors().items():
            if name in file_of:
                out.append(Violation(str(f), name, None, f"also stored in {file_of[name]}: a loader reads only one"))
            tensors[name] = t
            file_of[name] = str(f)
    index = sio.index_file(path)
    if index is not None:
        single = path / SINGLE_FILE
        if single.is_file() and single not in files:  # transformers loads it and ignores the index
            out.append(Violation(str(single), None, None, f"beside {index.name}: transformers loads this file "
                                 "instead of the index; remove it"))
        # other safetensors files the index does not name: loaders never open them (a Mistral
        # repo's consolidated.safetensors is fine), but they tell where a listed tensor went
        extra = {}
        for f in sorted(set(path.glob("*.safetensors")) - set(files)):
            try:
                extra[f.name] = list(sio.read_header(f).entries)
            except sio.CheckpointError:
                pass
        out += index_problems(index, sio.index_weight_map(index), stored,
                              unreadable={f.relative_to(path).as_posix() for f in files} - stored.keys(), extra=extra)
    out += validate_state_dict(tensors, cfg, file_of)
    return out


def index_problems(index: Path, weight_map: Mapping[str, str], stored: Mapping[str, list[str]],
                   unreadable: set[str] = set(), extra: Mapping[str, list[str]] = {}) -> list[Violation]:
    """The index must list every tensor of the files it names, in the file that holds it, and
    nothing else: a loader reads only what it lists (an unlisted MLP tensor is left randomly
    initialised) and fails on a listed tensor that no file holds. ``stored``: file → tensors of the
    files the index names; ``extra``: the same for safetensors files it does not name."""
    out = []
    weight_map = {n: Path(f).as_posix() for n, f in weight_map.items()}  # "./a.safetensors" is "a.safetensors"
    holder = {n: f for f, names in stored.items() for n in names}
    elsewhere = {n: f for f, names in extra.items() for n in names}
    for name, f in holder.items():
        listed = weight_map.get(name)
        if listed is None:
            out.append(Violation(str(index), name, "weight_map",
                                 f"stored in {f} but not listed: loaders will not read it"))
        elif listed != f:
            out.append(Violation(str(index), name, "weight_map", f"listed in {listed} but stored in {f}"))
    for name, f in weight_map.items():
        if name in holder or f in unreadable:
            continue
        if name in elsewhere:
            out.append(Violation(str(index), name, "weight_map", f"listed in {f} but stored in {elsewhere[name]}, "
                                                                 "a file the index does not name"))
        else:
            out.append(Violation(str(index), name, "weight_map", f"listed in {f}, but no file holds this tensor"))
    return out
