"""The modules transformers' own quantizers build when they load a quantized checkpoint, read as
source projections of the packed format, so that ``patch_model`` moves their bytes (bit-exact)
instead of dequantizing them:

    quantizer (module it builds)               its tensors                              moved into
    transformers fine-grained FP8 (FP8Linear:  weight e4m3 [N, K],                      fp8_block128
      block_size [128, 128], dynamic x)          weight_scale_inv fp32/e8m0 [N/128, K/128]
    compressed-tensors float-quantized         weight e4m3 [N, K],                      fp8_block128
      (nn.Linear, status COMPRESSED; block       weight_scale bf16/fp32 [N/128, K/128]
      [128, 128] weights, dynamic group-128 x)   (a multiplier, as weight_scale_inv)
    compressed-tensors nvfp4-pack-quantized    weight_packed u8 [N, K/2], weight_scale   nvfp4 (global scale
      (nn.Linear, status COMPRESSED)             e4m3 [N, K/16], weight_global_scale [1]  kind: divisor)

The tensors are recognised by formats.SourceLayout, as ``convert`` recognises them in a checkpoint,
renamed to the format's suffixes and checked against the format's dtypes and shapes
(formats.projection_problems). (The runtime never imports the converter, tests/test_imports.py:
the few lines of pack.py that patching needs, moving a source's tensors into the format or
re-quantizing them, are written here against the same formats.py definitions.) Whatever else a quantizer built
(per-tensor or per-channel FP8, static activation scales, other bit widths, a compressed-tensors
module that its first forward already decompressed, FP8 experts or embeddings) cannot be moved:
``patch_model`` leaves it to its quantizer and says why (``Quantized.why``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .. import formats
from ..formats import FormatError
from ..layer import _PackedProjection

FP8 = "transformers' FP8"
CT = "compressed-tensors"
_PRODUCERS = {"fp8": FP8, "compressed-tensors": CT}  # quantization_config.quant_method → name

# dtypes that only quantized codes or their scales have: a module holding one computes with them
_CODE_DTYPES = {torch.uint8, torch.int8, torch.float8_e4m3fn, torch.float8_e5m2,
                *([torch.float8_e8m0fnu] if hasattr(torch, "float8_e8m0fnu") else [])}


@dataclass
class Quantized:
    """One module a quantizer built: its bytes as a source projection when they can move into a
    packed format (``projection``), else why not (``why``)."""

    module: nn.Module
    producer: str
    format: formats.WeightFormat | None = None  # the packed format its tensors are in (None: why says why not)
    tensors: dict[str, torch.Tensor] | None = None  # by the format's suffixes
    kind: str | None = None  # a per-tensor scale's: divisor (compressed-tensors) or multiplier
    why: str | None = None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in own_tensors(self.module).values())


def producer(model: nn.Module) -> str | None:
    """Which transformers quantizer loaded ``model`` (FP8, CT, another method's name), or None."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        return None
    method = getattr(quantizer.quantization_config, "quant_method", None)
    method = getattr(method, "value", method)
    return _PRODUCERS.get(method, f"transformers' {method}")


def own_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's own parameters and buffers (not its children's), detached: packed buffers must
    not carry an autograd graph back to the source's parameters."""
    found = {**dict(module.named_parameters(recurse=False)), **dict(module.named_buffers(recurse=False))}
    return {k: v.detach() for k, v in found.items() if v is not None}


def scan(model: nn.Module) -> dict[str, Quantized]:
    """Every module of ``model`` that its quantizer built or that holds quantized codes, by name."""
    who = producer(model)
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, _PackedProjection):  # ours (FusedSwiGLUMLP's projections, PackedLinear)
            continue
        q = read(module, name, who)
        if q is not None:
            out[name] = q
    return out


def read(module: nn.Module, name: str, who: str | None) -> Quantized | None:
    """``module`` as a quantized source (None: a plain module, which patch_model quantizes itself)."""
    tensors = own_tensors(module)
    if getattr(module, "quantization_scheme", None) is not None:
        problem, who = _ct_problem(module, tensors), CT
    elif isinstance(module, nn.Linear) and "weight_scale_inv" in tensors:
        problem, who = _fp8_problem(module), FP8
    elif who is not None and any(t.dtype in _CODE_DTYPES for t in tensors.values()):  # (a quantizer's model)
        codes = sorted({str(t.dtype).removeprefix("torch.") for t in tensors.values() if t.dtype in _CODE_DTYPES})
        problem = (f"a {type(module).__name__} holding {', '.join(codes)} tensors, which swiglu_fused does not "
                   "read (it reads quantized Linears)")
    else:
        return None
    q = Quantized(module, who or "its quantizer", why=problem)
    if problem is None:
        q.why = _take_tensors(q, {k: v for k, v in tensors.items() if k != "bias"})
    return q


def _take_tensors(q: Quantized, tensors: dict[str, torch.Tensor]) -> str | None:
    """Fill q.format / tensors / kind from the module's tensors in a producer's layout (the one
    convert recognises, formats.SourceLayout); returns why they cannot be taken, or None."""
    layout = formats.source_layout(tensors.get)
    if layout is None:
        return "no quantized layout that swiglu_fused knows (" + ", ".join(sorted(tensors)) + ")"
    fmt = next(f for f in formats.WEIGHT_FORMATS.values() if layout in f.sources)
    ours = {suffix: tensors.get(theirs) for suffix, theirs in layout.names.items()}
    missing = [layout.names[k] for k, v in ours.items() if v is None]
    if missing:
        return f"{layout.producer} layout without {', '.join(missing)}"
    dtypes = {suffix: dtype for suffix, (dtype, _) in fmt.tensors(2, 2, 1).items()}
    for suffix, t in ours.items():  # scales stored narrower than fp32 (bf16, e8m0) widen exactly
        if dtypes[suffix] == torch.float32 and t.is_floating_point() and t.dtype != torch.float32:
            ours[suffix] = t.float()
    if fmt.global_scale_name:
        ours[fmt.global_scale_name] = ours[fmt.global_scale_name].reshape(-1)
    problems, _ = formats.projection_problems({f"m.{k}": v for k, v in ours.items()}, "m", fmt, 1, {})
    if problems:
        return f"{layout.producer} tensors that {fmt.name} cannot hold: " + "; ".join(
            str(v).replace("m.", "", 1) for v in problems)
    q.format, q.tensors, q.kind = fmt, ours, layout.global_scale_kind
    return None


def _fp8_problem(module: nn.Linear) -> str | None:
    """Why transformers' FP8Linear ``module`` does not compute what fp8_block128 computes, or None."""
    if getattr(module, "n_groups", None):
        return "a grouped FP8 linear (experts); swiglu_fused reads one Linear at a time"
    block = getattr(module, "block_size", None)
    if block is None or list(block) != [formats.FP8_BLOCK, formats.FP8_BLOCK]:
        what = "per-tensor scale (block_size None)" if block is None else f"block_size {list(block)}"
        return f"{what}; fp8_block128 holds 128x128 block scales only"
    if getattr(module, "activation_scheme", "dynamic") != "dynamic":
        return (f"activation_scheme {module.activation_scheme!r} (a static activation scale); fp8_block128 "
                "quantizes activations dynamically per token group of 128")
    return None


def _value(x):
    return getattr(x, "value", x)  # compressed-tensors' enums are str enums; plain strings pass


def _ct_problem(module: nn.Module, tensors: dict) -> str | None:
    """Why compressed-tensors' ``module`` cannot move into a packed format, or None."""
    status = _value(getattr(module, "quantization_status", None))
    if status != "compressed":
        gone = (" (compressed-tensors decompresses a model at its first forward, so its quantized bytes are "
                "gone: patch a freshly loaded model)" if status == "decompressed" else "")
        return f"quantization_status {status!r}, not 'compressed'{gone}"
    scheme = module.quantization_scheme
    w, x = scheme.weights, scheme.input_activations
    fmt = _value(getattr(scheme, "format", None)) or (
        "nvfp4-pack-quantized" if "weight_packed" in tensors else "float-quantized")
    if fmt == "nvfp4-pack-quantized":
        return None  # the tensors are checked by read_projection (groups of 16, one global scale)
    if fmt != "float-quantized":
        return f"format {fmt!r}; swiglu_fused holds nvfp4-pack-quantized and float-quantized FP8 blocks"
    block = list(w.block_structure or []) if w is not None else []
    if w is None or (_value(w.type), w.num_bits, _value(w.strategy), block) != ("float", 8, "block", [128, 128]):
        strategy = _value(getattr(w, "strategy", None))
        return (f"FP8 weights with strategy {strategy!r}" + (f" {block}" if block else "")
                + "; fp8_block128 holds 128x128 block scales only")
    if x is None or (_value(x.type), x.num_bits, x.dynamic, _value(x.strategy), x.group_size) != (
            "float", 8, True, "group", formats.FP8_BLOCK):
        how = "none (weight-only)" if x is None else f"strategy {_value(x.strategy)!r}, dynamic {x.dynamic}"
        return (f"input activations {how}; fp8_block128 quantizes them dynamically per token group of "
                f"{formats.FP8_BLOCK}")
    return None


def default_format(quantized: dict[str, Quantized]) -> str:
    """The weight format patch_model uses when none is asked for: the one the quantized modules
    are in (so their bytes move), fp8_block128 for a model with none."""
    found = sorted({q.format.name for q in quantized.values() if q.format is not None})
    if len(found) > 1:
        raise FormatError(f"weight_format: the model holds modules quantized as {' and '.join(found)}; pass "
                          "weight_format= to choose one (the others are re-quantized)")
    return found[0] if found else "fp8_block128"


def target_kind(quantized: dict[str, Quantized], fmt: formats.WeightFormat) -> str | None:
    """How the packed per-tensor scales are stored: as the source stored them (so nvfp4 bytes
    move), else as a divisor."""
    if not fmt.global_scale_name:
        return None
    kinds = {q.kind for q in quantized.values() if q.format is fmt}
    return kinds.pop() if len(kinds) == 1 else formats.DIVISOR


def in_format(tensors: dict[str, torch.Tensor], source: formats.WeightFormat | None, source_kind: str | None,
              fmt: formats.WeightFormat, kind: str | None, name: str) -> tuple[dict[str, torch.Tensor], bool]:
    """A projection's tensors (``source`` None: a dense {weight}) in ``fmt``, and whether its
    bytes moved unchanged: they do when it already is in ``fmt`` with the same global-scale kind;
    otherwise it is dequantized to fp32 and quantized (FormatError names ``name``)."""
    if source is fmt and (not fmt.global_scale_name or source_kind == kind):
        return tensors, True
    weight = tensors["weight"].float() if source is None else source.dequantize(tensors, source_kind)
    return fmt.quantize(weight, name, kind), False


def split_fused(tensors: dict[str, torch.Tensor], fmt: formats.WeightFormat | None, name: str,
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A [gate; up] projection's tensors (Phi-3's gate_up_proj) → gate's and up's, bytes kept:
    row tensors and block-scale rows cut in half, the one per-tensor scale shared."""
    weight = tensors[fmt.weight_name if fmt else "weight"]
    block = fmt.scale_rows if fmt else 1
    half = weight.shape[0] // 2
    if weight.shape[0] % 2 or half % block:
        raise FormatError(f"{name}: {weight.shape[0]} rows cannot be cut into gate and up halves of whole "
                          f"{block}-row scale blocks")
    gate, up = {}, {}
    for suffix, t in tensors.items():
        if fmt and suffix == fmt.global_scale_name:
            gate[suffix] = up[suffix] = t
        else:
            cut = half // block if fmt and suffix == fmt.scale_name else half
            gate[suffix], up[suffix] = t[:cut], t[cut:]
    return gate, up
