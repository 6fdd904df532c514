"""Hugging Face transformers: patch a loaded model, or load a packed checkpoint directly.

* ``patch_model(model, weight_format=…, interleave=…)`` swaps every gated MLP of a loaded model for
  a FusedSwiGLUMLP, quantizing on the fly, and reports what it swapped and what it could not.
* ``register()`` (run by ``import swiglu_fused`` when transformers is installed) registers the
  ``swiglu_fused`` quantization method, so ``AutoModelForCausalLM.from_pretrained(packed_dir)``
  builds FusedSwiGLUMLP modules before the weights load and fills them straight from the packed
  tensors (no bf16 detour); ``save_pretrained`` writes a packed checkpoint that loads again, from
  such a model or from one ``patch_model`` changed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from .. import formats, interleave as il
from ..formats import FormatError
from ..layer import FusedSwiGLUMLP, _PackedProjection
from ..linear import PackedLinear
from ..weight_packing import adapters
from . import hf_quantized

# activation module class names (transformers.activations) → our activation names
_ACT_CLASSES = {"SiLU": "silu", "SiLUActivation": "silu", "PytorchGELUTanh": "gelu_tanh", "GELUTanh": "gelu_tanh",
                "NewGELUActivation": "gelu_tanh", "GELUPytorchTanh": "gelu_tanh"}


@dataclass
class PatchReport:
    swapped: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # module → why it was left as it was
    bytes_before: int = 0
    bytes_after: int = 0
    weight_format: str | None = None
    source: str | None = None  # the transformers quantizer that loaded the model (hf_quantized.producer)
    moved: int = 0  # quantized projections (MLPs' and linears') whose bytes moved unchanged
    requantized: int = 0  # quantized projections dequantized and quantized to weight_format
    linears: list[str] = field(default_factory=list)  # quantized non-MLP linears → PackedLinear (bf16: Linear)
    left: dict[str, str] = field(default_factory=dict)  # quantized module left to the source's quantizer → why

    @property
    def bytes_saved(self) -> int:
        return self.bytes_before - self.bytes_after

    def __str__(self) -> str:
        lines = [f"swapped {len(self.swapped)} MLPs, {self.bytes_before / 2**20:.1f} MiB → "
                 f"{self.bytes_after / 2**20:.1f} MiB of MLP weights"]
        if self.moved or self.requantized:
            lines.append(f"  quantized projections of the {self.source} model: {self.moved} repacked bit-exactly, "
                         f"{self.requantized} re-quantized (dequantized, then quantized to {self.weight_format})")
        if self.linears:
            what = ("PackedLinear" if formats.weight_format(self.weight_format).packs_linears
                    else "Linear (dequantized bf16)")
            lines.append(f"  {len(self.linears)} quantized non-MLP linears became {what}: {', '.join(self.linears)}")
        lines += [f"  left to {self.source} quantizer: {name}: {why}" for name, why in self.left.items()]
        lines += [f"  left as is: {name}: {why}" for name, why in self.skipped.items()]
        return "\n".join(lines)


def _projections(module: nn.Module):
    """(gate, up, down) weights of a gated MLP module, or None if it is not one."""
    lin = lambda n: getattr(module, n, None) if isinstance(getattr(module, n, None), nn.Linear) else None  # noqa: E731
    down = lin("down_proj")
    if down is None:
        return None
    if lin("gate_proj") is not None and lin("up_proj") is not None:
        return (module.gate_proj, module.up_proj, down)
    if lin("gate_up_proj") is not None:
        return (module.gate_up_proj, None, down)
    return None


def _activation(module: nn.Module, config) -> str:
    act = getattr(module, "act_fn", None) or getattr(module, "activation_fn", None)
    name = _ACT_CLASSES.get(type(act).__name__)
    if name is None and isinstance(act, nn.GELU) and act.approximate == "tanh":
        name = "gelu_tanh"
    if name is None:
        try:
            name = adapters.for_config(config.to_dict()).activation(config.to_dict())
        except FormatError as e:
            raise FormatError(f"activation {type(act).__name__} is not supported ({e})") from None
    return name


def _swap(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _intermediate(gate: nn.Linear, up: nn.Linear | None) -> int:
    return gate.out_features if up is not None else gate.out_features // 2


def patch_model(model: nn.Module, weight_format: str | None = None,
                interleave: int = formats.DEFAULT_INTERLEAVE) -> PatchReport:
    """Replace every gated MLP (gate/up/down or Phi-3's gate_up/down) with a FusedSwiGLUMLP. MLPs the
    format cannot hold (a bias; an I that ``interleave`` does not divide) stay as they are, with the
    reason in the report; an ``interleave`` no MLP could use raises FormatError (naming the I found),
    before anything is changed. MLPs that already are FusedSwiGLUMLP stay as they are, reported as
    skipped with their format: packing is not redone from packed weights (load the original model
    to pack it another way).

    A model that transformers loaded from a quantized checkpoint (its FP8 or compressed-tensors
    quantizer; hf_quantized.py lists what is read) is patched by moving bytes: ``weight_format``
    None follows the model's quantization (fp8_block128 for a dense model), the MLPs' quantized
    projections are repacked bit-exactly and its other quantized linears become PackedLinear, so
    the patched model computes what the source computed. Another weight_format dequantizes and
    re-quantizes them (the report counts them). Modules whose bytes cannot move stay as the
    source's quantizer built them (``report.left``, with the reason); such a model runs, but
    save_pretrained refuses it (one quantization_config cannot describe it)."""
    from . import diffusers  # a diffusers model (Flux.2): its own module names and quantizer registry
    if diffusers.is_diffusers_model(model):
        return diffusers.patch_model(model, weight_format, interleave)
    quantized = hf_quantized.scan(model)
    if weight_format is None:
        weight_format = hf_quantized.default_format(quantized)
    fmt = formats.weight_format(weight_format)
    if formats.interleave_problem(interleave, fmt):
        raise FormatError(f"interleave: {interleave!r} is not a positive multiple of {fmt.interleave_multiple}, "
                          f"which weight_format {weight_format} needs (default {formats.DEFAULT_INTERLEAVE})")
    report = PatchReport(weight_format=fmt.name, source=hf_quantized.producer(model))
    config = getattr(model, "config", None)
    for name, module in model.named_modules():
        if isinstance(module, FusedSwiGLUMLP):
            report.skipped[name] = (f"already packed as {module.weight_format} (g={module.interleave}); "
                                    "load the original model to pack it again")
    candidates = [(n, m) for n, m in model.named_modules() if _projections(m) is not None]
    _check_some_mlp_fits(candidates, interleave, fmt)
    kind = hf_quantized.target_kind(quantized, fmt)
    for name, module in candidates:
        try:
            fused, before, moved, requantized = _fuse(module, name, quantized, fmt, interleave, kind,
                                                      _activation(module, config))
        except FormatError as e:
            report.skipped[name] = str(e)
            continue
        fused.to(_device(_projections(module)[2]))
        report.bytes_before += before
        report.bytes_after += _nbytes(*fused.buffers())
        report.moved, report.requantized = report.moved + moved, report.requantized + requantized
        _swap(model, name, fused)
        report.swapped.append(name)
    _pack_linears(model, quantized, fmt, kind, report)
    report.left = {n: q.why or "not read" for n, q in hf_quantized.scan(model).items()}
    _declare_packed(model, report)
    return report


def _check_some_mlp_fits(candidates, interleave: int, fmt: formats.WeightFormat) -> None:
    """FormatError, before anything is changed, when ``interleave`` divides no MLP's I."""
    sizes = {_intermediate(*_projections(m)[:2]) for _, m in candidates}
    if sizes and all(i % interleave for i in sizes):
        hint = ""
        try:
            formats.check_interleave(min(sizes), interleave, fmt)
        except FormatError as e:  # names the g that would work
            hint = f": {e}"
        raise FormatError(f"interleave: {interleave} divides the intermediate size of none of the "
                          f"{len(candidates)} MLPs (I = {', '.join(map(str, sorted(sizes)))}){hint}; "
                          "nothing was changed")


def _device(linear: nn.Module) -> torch.device:
    return next(iter(hf_quantized.own_tensors(linear).values())).device


def _fuse(module: nn.Module, name: str, quantized: dict, fmt: formats.WeightFormat, g: int, kind: str | None,
          activation: str) -> tuple[FusedSwiGLUMLP, int, int, int]:
    """The FusedSwiGLUMLP for gated MLP ``module``, and (bytes of its projections, quantized
    projections whose bytes moved, quantized projections re-quantized). Plain projections are
    quantized by FusedSwiGLUMLP.from_linear; a quantizer's move into ``fmt`` unchanged when they
    are in it already (hf_quantized.in_format), then interleave as convert interleaves them.
    FormatError: the MLP stays as it is."""
    gate, up, down = _projections(module)
    projections = [p for p in (gate, up, down) if p is not None]
    if any(getattr(p, "bias", None) is not None for p in projections):
        raise FormatError("projections with a bias are not supported")
    child = {id(m): f"{name}.{n}" for n, m in module.named_children()}
    names = [child[id(p)] for p in projections]
    found = [quantized.get(n) for n in names]
    before = sum(_nbytes(*hf_quantized.own_tensors(p).values()) for p in projections)
    if all(q is None for q in found):
        weights = ([gate.weight, up.weight] if up is not None else list(gate.weight.chunk(2, dim=0))) + [down.weight]
        return FusedSwiGLUMLP.from_linear(*weights, weight_format=fmt.name, interleave=g,
                                          activation=activation), before, 0, 0
    for n, q in zip(names, found):
        if q is not None and q.format is None:
            raise FormatError(f"{n} is left to {q.producer} quantizer: {q.why}")
    # (tensors, format, global-scale kind) of each projection; a plain one is a dense {weight}
    sources = [(q.tensors, q.format, q.kind) if q is not None else ({"weight": p.weight.detach()}, None, None)
               for p, q in zip(projections, found)]
    if up is None:  # Phi-3: cut [gate; up] in two, bytes kept
        tensors, source_fmt, source_kind = sources[0]
        halves = hf_quantized.split_fused(tensors, source_fmt, names[0])
        sources = [(h, source_fmt, source_kind) for h in halves] + sources[1:]
        names = [f"{names[0]}[gate]", f"{names[0]}[up]", names[1]]
    converted = [hf_quantized.in_format(t, src, src_kind, fmt, kind, n)
                 for (t, src, src_kind), n in zip(sources, names)]
    (gate_q, _), (up_q, _), (down_q, _) = converted
    formats.check_interleave(gate_q[fmt.weight_name].shape[0], g, fmt, name)
    fused = FusedSwiGLUMLP(il.pack_gate_up(gate_q, up_q, g, fmt), down_q, weight_format=fmt.name,
                           interleave=g, activation=activation, global_scale_kind=kind)
    was_quantized = [src is not None for _, src, _ in sources]
    moved = sum(kept for (_, kept), q in zip(converted, was_quantized) if q)
    return fused, before, moved, sum(was_quantized) - moved


def _pack_linears(model: nn.Module, quantized: dict, fmt: formats.WeightFormat, kind: str | None,
                  report: PatchReport) -> None:
    """Every quantized module still in the model whose bytes can move (attention q/k/v/o, the
    projections of an MLP that stayed) → a PackedLinear in ``fmt`` (bf16: a plain Linear holding
    the dequantized weight, as convert stores it), bias kept as it was."""
    for name, q in quantized.items():
        if q.format is None or not _holds(model, name, q.module):
            continue
        tensors, kept = hf_quantized.in_format(q.tensors, q.format, q.kind, fmt, kind, name)
        bias = getattr(q.module, "bias", None)
        _swap(model, name, _linear(tensors, fmt, kind, None if bias is None else bias.detach()))
        report.linears.append(name)
        report.moved, report.requantized = report.moved + kept, report.requantized + (not kept)


def _holds(model: nn.Module, name: str, module: nn.Module) -> bool:
    try:
        return model.get_submodule(name) is module
    except AttributeError:  # it was inside an MLP that was swapped
        return False


def _linear(tensors: dict, fmt: formats.WeightFormat, kind: str | None, bias: torch.Tensor | None) -> nn.Module:
    if fmt.packs_linears:
        return PackedLinear(tensors, weight_format=fmt.name, global_scale_kind=kind, bias=bias)
    weight = tensors[fmt.weight_name]
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    linear.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias, requires_grad=False)
    return linear


def _declare_packed(model: nn.Module, report: PatchReport) -> None:
    """Give a transformers model what from_pretrained gives one loaded from a packed checkpoint
    (config.quantization_config, hf_quantizer), so that save_pretrained writes a packed checkpoint
    that loads again: without it the config says nothing, and from_pretrained would build plain
    MLPs and fill them with packed bytes. When modules were left to the source's quantizer, or
    no MLP holds the packed linears, one quantization_config cannot describe the model:
    save_pretrained is made to refuse it instead (``_refuse_save``)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict") or not hasattr(model, "save_pretrained"):
        return  # not a transformers model
    mlps = {n: mod for n, mod in model.named_modules() if isinstance(mod, FusedSwiGLUMLP)}
    linears = tuple(n for n, mod in model.named_modules() if isinstance(mod, PackedLinear))
    kinds = {(m.weight_format, m.interleave, m.activation, m.global_scale_kind) for m in mlps.values()}
    if report.left and (mlps or linears):
        names = ", ".join(list(report.left)[:3]) + (f" and {len(report.left) - 3} more" if len(report.left) > 3 else "")
        return _refuse_save(model, f"{len(report.left)} quantized modules ({names}) were left to {report.source} "
                                   "quantizer, and one quantization_config cannot describe a model that is partly "
                                   "packed and partly theirs")
    if linears and not mlps:
        return _refuse_save(model, f"{len(linears)} linears were packed but no MLP, and a packed checkpoint "
                                   "needs at least one packed MLP")
    if not (report.swapped or report.linears) or len(kinds) != 1:
        return  # nothing packed now, or MLPs packed differently: one quantization_config cannot describe them
    register()
    config_cls, quantizer_cls = _classes()
    weight_format, interleave, activation, global_scale_kind = kinds.pop()
    source = {"via": "patch_model", **({"quantized_by": report.source} if report.source else {})}
    packed = formats.PackedConfig(weight_format, interleave, activation, tuple(mlps), global_scale_kind,
                                  source=source, linears=linears)
    hook = getattr(model, "ct_decompress_hook", None)
    if hook is not None:  # compressed-tensors' first-forward decompression: nothing of theirs is left to it
        hook.remove()
        del model.ct_decompress_hook
    qcfg = config_cls(**packed.to_dict())
    config.quantization_config = qcfg
    model.hf_quantizer = quantizer_cls(qcfg, pre_quantized=True)
    model.is_quantized, model.quantization_method = True, formats.QUANT_METHOD


def _refuse_save(model: nn.Module, why: str) -> None:
    """Make save_pretrained raise FormatError(why + the fix) before it writes anything. The
    source's quantizer stays (its modules still run through it); save_pretrained asks it
    ``is_serializable()`` first thing, so that is where the refusal goes, on this instance only."""
    message = (f"save_pretrained: {why}, so no checkpoint is written (it would not load as this model "
               "computes). To store it packed, convert the source checkpoint with `swiglu-fused convert SRC DST` "
               "(it says what it cannot hold); or save the unpatched source model.")
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        return

    def refuse():
        raise FormatError(message)
    quantizer.is_serializable = refuse


# ---------------------------------------------------------------- from_pretrained / save_pretrained
def _packed_linear(model: nn.Module, name: str, cfg: formats.PackedConfig, stored: dict):
    """The empty PackedLinear (on meta) that replaces the model's Linear ``name``, a module listed in
    quantization_config.linears; FormatError when the model and the stored tensors disagree."""
    from ..linear import PackedLinear

    try:
        module = model.get_submodule(name)
    except AttributeError:
        raise FormatError(f"quantization_config.linears names {name}, which {type(model).__name__} "
                          "does not have") from None
    if not isinstance(module, nn.Linear):
        raise FormatError(f"quantization_config.linears names {name}, a {type(module).__name__}, not a Linear")
    bias_file, _ = stored.get(f"{name}.bias", (None, None))
    if (module.bias is not None) != (bias_file is not None):
        has = "has a bias" if module.bias is not None else "has no bias"
        raise FormatError(f"{name}: the model that config.json describes {has}, but the checkpoint "
                          f"{'does not store one' if bias_file is None else f'stores {name}.bias in {bias_file}'}; "
                          "config.json and the packed tensors are not from the same model")
    bias_dtype = None
    if bias_file is not None:
        from ..weight_packing import safetensors_io as sio
        bias_dtype = sio.read_header(Path(bias_file)).entries[f"{name}.bias"].dtype
    linear = PackedLinear.empty(module.in_features, module.out_features, weight_format=cfg.weight_format,
                                global_scale_kind=cfg.global_scale_kind, bias_dtype=bias_dtype)
    for key, buffer in linear.state_dict().items():
        file, shape = stored.get(f"{name}.{key}", (None, None))
        if shape is not None and tuple(shape) != tuple(buffer.shape):
            raise FormatError(f"{file} / {name}.{key} / shape: {list(shape)}, but the model that config.json "
                              f"describes needs {list(buffer.shape)} (a Linear {module.in_features} → "
                              f"{module.out_features}); config.json and the packed tensors are not from the "
                              "same model: re-run `swiglu-fused convert` on the source")
    return linear


_REGISTERED = False  # (register runs once transformers loads its quantizer registry: import_hook.REGISTRIES)

def register() -> None:
    """Register the ``swiglu_fused`` quantization method with transformers (idempotent)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers.quantizers import auto

    config_cls, quantizer_cls = _classes()
    if formats.QUANT_METHOD not in auto.AUTO_QUANTIZATION_CONFIG_MAPPING:
        auto.register_quantization_config(formats.QUANT_METHOD)(config_cls)
    if formats.QUANT_METHOD not in auto.AUTO_QUANTIZER_MAPPING:
        auto.register_quantizer(formats.QUANT_METHOD)(quantizer_cls)
    _REGISTERED = True


@functools.cache  # one pair of classes: the registered ones
def _classes():
    from transformers.quantizers.base import HfQuantizer
    from transformers.utils.quantization_config import QuantizationConfigMixin

    class SwigluFusedConfig(QuantizationConfigMixin):
        """The packed checkpoint's quantization_config (formats.PackedConfig) as transformers wants it."""

        def __init__(self, **kwargs):
            kwargs.setdefault(formats.K_QUANT_METHOD, formats.QUANT_METHOD)
            kwargs.pop(formats.K_H_FORMAT, None)  # derived from the weight format
            self.packed = formats.PackedConfig.from_dict(kwargs, f"{formats.CONFIG_FILE}: quantization_config")
            self.quant_method = formats.QUANT_METHOD

        def to_dict(self):
            return self.packed.to_dict()

        def __iter__(self):
            yield from self.to_dict().items()

    class SwigluFusedHfQuantizer(HfQuantizer):
        """Builds FusedSwiGLUMLP modules (empty, on meta) where the packed checkpoint has MLPs."""

        requires_calibration = True  # only loads packed checkpoints; patch_model quantizes live models

        def validate_environment(self, *args, **kwargs):
            pass

        def _process_model_before_weight_loading(self, model, **kwargs):
            stored = self._check_checkpoint(kwargs.get("checkpoint_files"),
                                            getattr(getattr(model, "config", None), "name_or_path", None))
            cfg = self.quantization_config.packed
            for name in cfg.modules:
                try:
                    module = model.get_submodule(name)
                except AttributeError:
                    raise FormatError(f"quantization_config.modules names {name}, which {type(model).__name__} "
                                      "does not have") from None
                projections = _projections(module)
                if projections is None:
                    raise FormatError(f"{name} ({type(module).__name__}) is not a gated MLP")
                gate, up, _ = projections
                fused = FusedSwiGLUMLP.empty(
                    gate.in_features, _intermediate(gate, up), weight_format=cfg.weight_format,
                    interleave=cfg.interleave, activation=cfg.activation, global_scale_kind=cfg.global_scale_kind)
                for key, buffer in fused.state_dict().items():
                    file, shape = stored.get(f"{name}.{key}", (None, None))
                    if shape is not None and tuple(shape) != tuple(buffer.shape):
                        raise FormatError(
                            f"{file} / {name}.{key} / shape: {list(shape)}, but the model that config.json "
                            f"describes needs {list(buffer.shape)} (hidden_size {gate.in_features}, "
                            f"intermediate_size {_intermediate(gate, up)}); config.json and the packed "
                            "tensors are not from the same model: re-run `swiglu-fused convert` on the source")
                _swap(model, name, fused)
            for name in cfg.linears:
                _swap(model, name, _packed_linear(model, name, cfg, stored))
            return model

        def _process_model_after_weight_loading(self, model, **kwargs):
            # the loader assigned the packed tensors to the buffers directly: each nvfp4 weight
            # now takes the order its device's kernels read (layer._PackedProjection)
            for module in model.modules():
                if isinstance(module, _PackedProjection):
                    module.settle_layout()
            return model

        def _check_checkpoint(self, checkpoint_files, name_or_path) -> dict:
            """Before a byte is loaded, the files must say what config.json says and hold tensors of
            the format's dtypes and shapes: the weight loader would cast a tensor of another dtype
            than the module's buffer silently (a bf16 label on e4m3 data). Returns tensor name →
            (file, shape). transformers 5 passes the checkpoint files; 4.x does not: then the
            directory from_pretrained was given."""
            from ..weight_packing import packed_checkpoint, safetensors_io as sio

            if checkpoint_files is None and name_or_path and Path(name_or_path).is_dir():
                checkpoint_files = sio.checkpoint_files(Path(name_or_path))
            files = [Path(f) for f in checkpoint_files or () if str(f).endswith(".safetensors")]
            if not files:
                raise FormatError(f"from_pretrained({name_or_path!r}): a swiglu_fused packed checkpoint is checked "
                                  f"and loaded from its safetensors files, found {checkpoint_files!r}; pass its "
                                  "local directory (transformers 4.x does not tell a quantizer which files it loads)")
            headers = {f: sio.read_header(f) for f in files}
            packed_checkpoint.check_files_match_config(self.quantization_config.packed,
                                                       files[0].parent / formats.CONFIG_FILE, headers)
            return {n: (f, e.shape) for f, h in headers.items() for n, e in h.entries.items()}

        def get_state_dict_and_metadata(self, model):
            metadata = self.quantization_config.packed.file_metadata()
            metadata.pop("format")
            return None, metadata

        def is_serializable(self):
            return True

        @property
        def is_trainable(self) -> bool:
            return False

    return SwigluFusedConfig, SwigluFusedHfQuantizer
