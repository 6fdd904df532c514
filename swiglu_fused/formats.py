"""The packed format, version 1: the one place that spells tensor names, dtypes and metadata keys.

A packed checkpoint is a normal Hugging Face directory (config.json + safetensors) in which every
gated MLP ``P`` (``model.layers.0.mlp``, ``transformer_blocks.0.ff``, ...) is stored as two
projections, ``P.gate_up_proj`` (2·I rows, interleaved) and ``P.down_proj`` (H rows, I columns),
each with the tensors of its weight format:

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
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import torch

FORMAT_VERSION = 1
QUANT_METHOD = "swiglu_fused"
METADATA_KEY = "swiglu_fused"  # key of the JSON blob in each safetensors __metadata__

FP8_BLOCK = 128
NVFP4_GROUP = 16
DEFAULT_INTERLEAVE = 128

GATE_UP = "gate_up_proj"
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


def suggest_interleaves(intermediate: int, multiple: int = 1) -> list[int]:
    """Granularities g that divide I and are multiples of ``multiple``, best (largest ≤ 128 / 128·k) first."""
    good = [g for g in range(multiple, intermediate + 1, multiple) if intermediate % g == 0]
    return sorted(good, key=lambda g: (g != DEFAULT_INTERLEAVE, abs(math.log2(g / DEFAULT_INTERLEAVE))))[:3]


def check_interleave(intermediate: int, g: int, fmt: WeightFormat, where: str = "") -> None:
    """Raise FormatError naming a g that would work when (I, g, format) are incompatible."""
    at = f"{where}: " if where else ""
    if not isinstance(g, int) or g < 1:
        raise FormatError(f"{at}interleave must be a positive integer, got {g!r}")
    if g % fmt.interleave_multiple:
        raise FormatError(
            f"{at}interleave {g} is not a multiple of {fmt.interleave_multiple}, which format "
            f"{fmt.name} needs so that 128-row scale blocks stay whole; use --interleave "
            f"{' or '.join(map(str, suggest_interleaves(intermediate, fmt.interleave_multiple))) or 'none: I is too small'}"
        )
    if intermediate % g:
        options = suggest_interleaves(intermediate, fmt.interleave_multiple)
        hint = f"use --interleave {' or '.join(map(str, options))}" if options else (
            f"no interleave works for format {fmt.name}: I must be a multiple of {fmt.interleave_multiple}")
        raise FormatError(f"{at}intermediate size I = {intermediate} is not a multiple of --interleave {g}; {hint}")


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
    if not isinstance(version, int):
        bad(K_VERSION, f"missing or not an integer: {version!r}")
    elif version > FORMAT_VERSION:
        bad(K_VERSION, f"format version {version} is newer than this swiglu-fused supports "
                       f"({FORMAT_VERSION}); upgrade swiglu-fused to read it")
    elif version < 1:
        bad(K_VERSION, f"invalid format version {version}")
    fmt = d.get(K_WEIGHT_FORMAT)
    if fmt not in WEIGHT_FORMATS:
        bad(K_WEIGHT_FORMAT, f"unsupported weight format {fmt!r}; expected one of {sorted(WEIGHT_FORMATS)}")
    g = d.get(K_INTERLEAVE)
    if not isinstance(g, int) or g < 1:
        bad(K_INTERLEAVE, f"must be a positive integer, found {g!r}")
    elif fmt in WEIGHT_FORMATS and g % WEIGHT_FORMATS[fmt].interleave_multiple:
        bad(K_INTERLEAVE, f"interleave {g} is not a multiple of {WEIGHT_FORMATS[fmt].interleave_multiple}, "
                          f"required by format {fmt}")
    if d.get(K_ACTIVATION) not in ACTIVATIONS:
        bad(K_ACTIVATION, f"unsupported activation {d.get(K_ACTIVATION)!r}; expected one of {list(ACTIVATIONS)}")
    if fmt == "nvfp4" and d.get(K_GLOBAL_SCALE_KIND) not in GLOBAL_SCALE_KINDS:
        bad(K_GLOBAL_SCALE_KIND, f"nvfp4 needs one of {list(GLOBAL_SCALE_KINDS)}, found {d.get(K_GLOBAL_SCALE_KIND)!r}")
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
                                 f"down_proj is {list(dn_shape)} but gate_up_proj implies [H, I] = {[hidden, rows // 2]}"))
    return out


def file_metadata_problems(metadata: Mapping[str, str] | None, cfg: PackedConfig, file: str) -> list[Violation]:
    """The facts in a safetensors __metadata__ must be present and agree with config.json."""
    if not metadata or METADATA_KEY not in metadata:
        return [Violation(file, None, f"__metadata__.{METADATA_KEY}", "missing: not a swiglu-fused packed file")]
    try:
        blob = json.loads(metadata[METADATA_KEY])
    except json.JSONDecodeError as e:
        return [Violation(file, None, f"__metadata__.{METADATA_KEY}", f"not valid JSON ({e})")]
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
    return out


def validate(path: str | Path) -> list[Violation]:
    """Every violation found in a packed checkpoint directory (empty list = valid)."""
    from .weight_packing import safetensors_io as sio  # reading files is packing's business

    path = Path(path)
    cfg_path = path / CONFIG_FILE
    if not cfg_path.is_file():
        return [Violation(str(cfg_path), None, None, "missing config.json")]
    try:
        qcfg = json.loads(cfg_path.read_text()).get("quantization_config")
    except json.JSONDecodeError as e:
        return [Violation(str(cfg_path), None, None, f"not valid JSON ({e})")]
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
    out: list[Violation] = []
    for f in files:
        try:
            header = sio.read_header(f)
        except sio.CheckpointError as e:
            out.append(Violation(str(f), None, None, str(e)))
            continue
        out += file_metadata_problems(header.metadata, cfg, str(f))
        # Meta tensors carry dtype and shape without reading a byte of data.
        for name, t in header.meta_tensors().items():
            tensors[name] = t
            file_of[name] = str(f)
    out += validate_state_dict(tensors, cfg, file_of)
    return out
