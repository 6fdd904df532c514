"""diffusers: patch a loaded Flux.2 transformer, or load a packed one with ``from_pretrained``.

* ``patch_model(model, weight_format=…, interleave=…)`` (reached through ``swiglu_fused.patch_model``)
  replaces, in a loaded ``Flux2Transformer2DModel``, every double-stream feed-forward
  (``Flux2FeedForward``: linear_in halves [gate; up], SiLU, linear_out) by a FusedSwiGLUMLP and
  every single-stream ``attn.to_qkv_mlp_proj`` (rows [Q; K; V; gate; up]) by a FusedSplitProjection.
* ``register()`` (run by ``import swiglu_fused`` once diffusers loads its quantizer registry) adds the
  ``swiglu_fused`` method to ``diffusers.quantizers.auto``'s two mappings (diffusers has no
  registration function and no entry points; without the import, diffusers refuses the checkpoint
  with "Unknown quantization type, got swiglu_fused"), so
  ``Flux2Transformer2DModel.from_pretrained(packed_dir)`` builds the fused modules before the
  weights load; ``save_pretrained`` writes a packed checkpoint that loads again.

**How a single-stream block runs the split projection.** diffusers' processors
(``Flux2ParallelSelfAttnProcessor`` and its KV-cache twin) compute
``attn.to_qkv_mlp_proj(x)``, split it into QKV and the MLP part at
``3·inner : mlp_hidden·mlp_mult_factor``, apply ``attn.mlp_act_fn`` to the MLP part, and run
``attn.to_out(cat([attention, mlp]))``. We change three attributes, so that any of diffusers'
processors runs the fused projection: ``to_qkv_mlp_proj`` returns [QKV | h] (width 3·inner +
mlp_hidden: the split epilogue's output), ``mlp_mult_factor`` becomes 1 so the processor's split
lands on the QKV/h boundary, and ``mlp_act_fn`` becomes ``AppliedInProjection`` (the identity:
act·up happened in the projection's epilogue). Where the block has the stock processor, it becomes
``SplitProjectionProcessor``: the same steps with the same diffusers functions, but instead of the
concatenation (M × (inner + mlp_hidden) copied, and slowly: torch's cat leaves its fast path for our
h, a view) the attention output is written over V's columns, and ``to_out`` reads [attention | h]
in place. The KV-cache processor (which the Klein KV pipeline sets) and a user's own keep the cat.

**The QK steps** (DESIGN §5). Our processors run the per-head RMS norms of Q and K and the rotary
embedding as ``ops.qk_norm_rope`` (one pass a tensor; diffusers runs ~20 kernels) where that op
computes exactly the stock steps and no gradient is wanted: ``SplitProjectionProcessor`` on the
single-stream blocks, and ``DoubleStreamProcessor``, which ``patch_model`` and the quantizer put in
place of each double-stream block's stock ``Flux2AttnProcessor`` (``install_processors``). The
attention itself is diffusers' ``dispatch_attention_fn`` in both.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from .. import formats
from ..formats import FormatError
from ..kernels import ops
from ..layer import FusedSwiGLUMLP
from ..linear import PackedLinear
from ..split_projection import FusedSplitProjection


class AppliedInProjection(nn.Module):
    """Stands where diffusers' ``Flux2SwiGLU`` was: act(gate)·up was already applied by the
    FusedSplitProjection's epilogue, so this passes h through."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h


class SplitProjectionProcessor:
    """diffusers' ``Flux2ParallelSelfAttnProcessor`` for a block whose ``to_qkv_mlp_proj`` is a
    FusedSplitProjection, less its concatenation: the attention output is written over V's columns
    of the projection's [Q | K | V | h] output (V is spent once the attention has run), so that
    ``to_out`` reads [attention | h] where they lie (a view whose rows are 3·inner + mlp_hidden
    apart). The steps and the diffusers functions (QK norms, RoPE, ``dispatch_attention_fn`` with the
    backend and parallel config diffusers sets on processors) are the stock processor's."""

    _attention_backend = None
    _parallel_config = None

    def __call__(self, attn: nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 image_rotary_emb: torch.Tensor | None = None) -> torch.Tensor:
        from diffusers.models.transformers import transformer_flux2 as flux2

        if not isinstance(attn.to_qkv_mlp_proj, FusedSplitProjection):  # swapped back by hand: the stock processor
            stock = _with_settings_of(flux2.Flux2ParallelSelfAttnProcessor(), self)
            return stock(attn, hidden_states, attention_mask, image_rotary_emb)
        y = attn.to_qkv_mlp_proj(hidden_states)
        inner = attn.inner_dim
        query, key, value = (y[..., i * inner:(i + 1) * inner].unflatten(-1, (-1, attn.head_dim)) for i in range(3))
        qk = _fused_qk_norm_rope(attn, y, image_rotary_emb)
        if qk is not None:  # the same values in one pass (ops.qk_norm_rope)
            query, key = (t.view(query.shape) for t in qk)
        else:
            query, key = attn.norm_q(query), attn.norm_k(key)
            if image_rotary_emb is not None:
                query = flux2.apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
                key = flux2.apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)
        out = flux2.dispatch_attention_fn(query, key, value, attn_mask=attention_mask,
                                          backend=self._attention_backend, parallel_config=self._parallel_config)
        out = out.flatten(2, 3).to(query.dtype)
        if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
            # the attention kept V for its backward (the QK norms' weights are trainable): V stays
            return attn.to_out(torch.cat([out, y[..., 3 * inner:]], dim=-1))
        to_out_input = y[..., 2 * inner:]
        ops.copy_into(to_out_input[..., :inner], out)
        return attn.to_out(to_out_input)


def _with_settings_of(processor, source):
    """``processor`` with the attention backend and parallel config diffusers set on ``source``
    (``set_attention_backend`` and context parallelism set them on each processor)."""
    processor._attention_backend, processor._parallel_config = source._attention_backend, source._parallel_config
    return processor


def _qk_norms(attn: nn.Module, names: tuple[str, ...], x: torch.Tensor, rotary, rows: int) -> list | None:
    """The block's norms named ``names`` where ops.qk_norm_rope computes their steps exactly: each a
    torch.nn.RMSNorm of the head dim with a weight, one eps, bf16 activations ``x``, Flux's (cos, sin)
    rotary tables of ``rows`` rows, and no gradient wanted; else None (the stock steps)."""
    norms = [getattr(attn, n, None) for n in names]
    if not all(type(n) is nn.RMSNorm and n.weight is not None and tuple(n.normalized_shape) == (attn.head_dim,)
               and n.eps == norms[0].eps for n in norms):
        return None
    if torch.is_grad_enabled() and (x.requires_grad or any(n.weight.requires_grad for n in norms)):
        return None  # (the stock steps have a gradient)
    if not (isinstance(rotary, tuple) and len(rotary) == 2 and x.dtype == torch.bfloat16
            and rotary[0].shape == rotary[1].shape == (rows, attn.head_dim)):
        return None
    return norms


def _eps(norm: nn.RMSNorm, dtype: torch.dtype) -> float:
    return norm.eps if norm.eps is not None else torch.finfo(dtype).eps  # (torch.nn.RMSNorm's default)


def _fused_qk_norm_rope(attn: nn.Module, y: torch.Tensor, rotary) -> torch.Tensor | None:
    """Q', K' [2, B·S, inner] of the single-stream projection's output y [B, S, ·] by ops.qk_norm_rope
    (where _qk_norms allows), else None."""
    norms = _qk_norms(attn, ("norm_q", "norm_k"), y, rotary, y.shape[1]) if y.dim() == 3 else None
    if norms is None:
        return None
    rows, inner = y.reshape(-1, y.shape[-1]), attn.inner_dim
    cos, sin = (t.to(y.device) for t in rotary)
    return ops.qk_norm_rope(rows[:, :inner], rows[:, inner:2 * inner], norms[0].weight, norms[1].weight, cos, sin,
                            _eps(norms[0], y.dtype))


class DoubleStreamProcessor:
    """diffusers' ``Flux2AttnProcessor`` (the double-stream blocks' joint attention) with the four QK norms
    and the rotary embedding as two ops.qk_norm_rope calls, the text tokens' (norm_added_q / _k, the
    tables' first rows) and the image tokens', whose Q and K are then concatenated as the stock processor
    concatenates the normed ones: the same values (the steps are elementwise). Where _qk_norms does not
    allow it (a gradient wanted, other norms, no text stream), the stock processor runs."""

    _attention_backend = None
    _parallel_config = None

    def __call__(self, attn: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None, image_rotary_emb=None):
        from diffusers.models.transformers import transformer_flux2 as flux2

        txt = encoder_hidden_states.shape[1] if encoder_hidden_states is not None else 0
        names = ("norm_q", "norm_k", "norm_added_q", "norm_added_k")
        norms = (_qk_norms(attn, names, hidden_states, image_rotary_emb, txt + hidden_states.shape[1])
                 if txt and getattr(attn, "added_kv_proj_dim", None) is not None and hidden_states.dim() == 3 else None)
        if norms is None:
            stock = _with_settings_of(flux2.Flux2AttnProcessor(), self)
            return stock(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)
        q, k, v, eq, ek, ev = flux2._get_qkv_projections(attn, hidden_states, encoder_hidden_states)
        b, d, inner, eps = hidden_states.shape[0], attn.head_dim, q.shape[-1], _eps(norms[0], q.dtype)
        cos, sin = (t.to(q.device) for t in image_rotary_emb)
        qk = [ops.qk_norm_rope(a.reshape(-1, inner), c.reshape(-1, inner), norms[i].weight, norms[i + 1].weight,
                               cos[rows], sin[rows], eps)
              for a, c, i, rows in ((eq, ek, 2, slice(None, txt)), (q, k, 0, slice(txt, None)))]
        query, key = (torch.cat([t[j].view(b, -1, inner // d, d) for t in qk], dim=1) for j in range(2))
        value = torch.cat([ev.unflatten(-1, (-1, d)), v.unflatten(-1, (-1, d))], dim=1)
        out = flux2.dispatch_attention_fn(query, key, value, attn_mask=attention_mask,
                                          backend=self._attention_backend, parallel_config=self._parallel_config)
        out = out.flatten(2, 3).to(query.dtype)
        text, image = out.split_with_sizes([txt, out.shape[1] - txt], dim=1)
        return attn.to_out[1](attn.to_out[0](image)), attn.to_add_out(text)


def install_processors(model: nn.Module) -> list[str]:
    """DoubleStreamProcessor in place of each double-stream block's stock processor (not the KV-cache
    one, nor a user's own): the names of the attention modules it went to."""
    from diffusers.models.transformers import transformer_flux2 as flux2

    done = []
    for name, module in model.named_modules():
        stock = getattr(module, "processor", None)
        if type(stock) is flux2.Flux2AttnProcessor:
            module.set_processor(_with_settings_of(DoubleStreamProcessor(), stock))
            done.append(name)
    return done


@dataclass
class DiffusersPatchReport:
    swapped: list[str] = field(default_factory=list)  # feed-forwards → FusedSwiGLUMLP
    split_projections: list[str] = field(default_factory=list)  # to_qkv_mlp_proj → FusedSplitProjection
    processors: list[str] = field(default_factory=list)  # double-stream attention → DoubleStreamProcessor
    skipped: dict[str, str] = field(default_factory=dict)  # module → why it was left as it was
    bytes_before: int = 0
    bytes_after: int = 0
    weight_format: str | None = None

    @property
    def bytes_saved(self) -> int:
        return self.bytes_before - self.bytes_after

    def __str__(self) -> str:
        lines = [f"swapped {len(self.swapped)} feed-forwards (FusedSwiGLUMLP) and {len(self.split_projections)} "
                 f"single-stream QKV+MLP projections (FusedSplitProjection), {self.weight_format}: "
                 f"{self.bytes_before / 2**20:.1f} MiB → {self.bytes_after / 2**20:.1f} MiB of weights"]
        if self.processors:
            lines.append(f"  {len(self.processors)} double-stream attentions: QK norms and rotary embedding in one pass "
                         "(DoubleStreamProcessor)")
        lines += [f"  left as is: {name}: {why}" for name, why in self.skipped.items()]
        return "\n".join(lines)


def is_diffusers_model(model) -> bool:
    mixin = getattr(sys.modules.get("diffusers"), "ModelMixin", None)
    return mixin is not None and isinstance(model, mixin)


# ---------------------------------------------------------------- what a Flux.2 block holds
def _is_swiglu(act) -> bool:
    """diffusers' Flux2SwiGLU: SiLU of the first half times the second half."""
    return type(act).__name__ == "Flux2SwiGLU" and isinstance(getattr(act, "gate_fn", None), nn.SiLU)


def _feed_forward(module: nn.Module) -> tuple[nn.Linear, nn.Linear] | None:
    """(linear_in, linear_out) of a Flux2FeedForward-like module, or None."""
    lin_in, lin_out = getattr(module, "linear_in", None), getattr(module, "linear_out", None)
    if isinstance(lin_in, nn.Linear) and isinstance(lin_out, nn.Linear) and _is_swiglu(getattr(module, "act_fn", None)):
        return lin_in, lin_out
    return None


def _split_attention(module: nn.Module) -> tuple[nn.Module, int, int] | None:
    """(to_qkv_mlp_proj, prefix rows, intermediate) of a Flux2ParallelSelfAttention-like module
    still running diffusers' Linear + Flux2SwiGLU, or None."""
    proj = getattr(module, "to_qkv_mlp_proj", None)
    if not isinstance(proj, (nn.Linear, FusedSplitProjection)) or not hasattr(module, "inner_dim"):
        return None
    prefix, inter = 3 * module.inner_dim, module.mlp_hidden_dim
    if isinstance(proj, FusedSplitProjection) or (_is_swiglu(getattr(module, "mlp_act_fn", None))
                                                  and getattr(module, "mlp_mult_factor", None) == 2):
        return proj, prefix, inter
    return None


def install_split(attn: nn.Module, fused: FusedSplitProjection) -> None:
    """Make diffusers' single-stream processor run ``fused`` (module docstring)."""
    attn.to_qkv_mlp_proj = fused
    attn.mlp_act_fn = AppliedInProjection()
    attn.mlp_mult_factor = 1  # the processor splits [QKV | h] at 3·inner : mlp_hidden · 1
    from diffusers.models.transformers import transformer_flux2 as flux2

    stock = getattr(attn, "processor", None)
    if type(stock) is flux2.Flux2ParallelSelfAttnProcessor:  # not the KV-cache one, nor a user's own
        attn.set_processor(_with_settings_of(SplitProjectionProcessor(), stock))


def _swap(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)


def _nbytes(module: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


# ---------------------------------------------------------------- patch_model
def patch_model(model: nn.Module, weight_format: str | None = None,
                interleave: int = formats.DEFAULT_INTERLEAVE) -> DiffusersPatchReport:
    """Replace the gated MLP work of a loaded diffusers Flux.2 transformer: feed-forwards by
    FusedSwiGLUMLP, single-stream QKV+MLP projections by FusedSplitProjection (quantized to
    ``weight_format``, default fp8_block128). Modules the format cannot hold (a bias; an I that
    ``interleave`` does not divide; an fp8 prefix off 128 rows) stay as they are, with the reason."""
    if getattr(model, "hf_quantizer", None) is not None and getattr(model, "quantization_method", None) != formats.QUANT_METHOD:
        raise FormatError(f"patch_model: this {type(model).__name__} was loaded through diffusers' "
                          f"{model.hf_quantizer.quantization_config.quant_method} quantizer, whose modules swiglu-fused "
                          "does not read; load it unquantized (bf16) and patch that, or convert its checkpoint")
    fmt = formats.weight_format(weight_format or "fp8_block128")
    problem = formats.interleave_problem(interleave, fmt)
    if problem:
        raise FormatError(f"interleave: {problem}")
    report = DiffusersPatchReport(weight_format=fmt.name)
    for name, module in list(model.named_modules()):
        if isinstance(module, (FusedSwiGLUMLP, FusedSplitProjection)):
            report.skipped[name] = (f"already packed as {module.weight_format} (g={module.interleave}); load the "
                                    "original model to pack it again")
        elif _feed_forward(module) is not None:
            _patch_feed_forward(model, name, module, fmt, interleave, report)
        elif _split_attention(module) is not None and isinstance(module.to_qkv_mlp_proj, nn.Linear):
            _patch_split(name, module, fmt, interleave, report)
    if report.swapped or report.split_projections:
        _declare_packed(model)
        report.processors = install_processors(model)
    return report


def _patch_feed_forward(model, name: str, module: nn.Module, fmt, g: int, report: DiffusersPatchReport) -> None:
    lin_in, lin_out = _feed_forward(module)
    if lin_in.bias is not None or lin_out.bias is not None:
        report.skipped[name] = "projections with a bias are not supported (the packed format has no bias)"
        return
    try:
        formats.check_interleave(lin_in.out_features // 2, g, fmt, name)
        gate, up = lin_in.weight.chunk(2, dim=0)
        fused = FusedSwiGLUMLP.from_linear(gate, up, lin_out.weight, weight_format=fmt.name, interleave=g,
                                           activation="silu")
    except FormatError as e:
        report.skipped[name] = str(e)
        return
    report.bytes_before += _nbytes(module)
    _swap(model, name, fused.to(lin_in.weight.device))
    report.bytes_after += _nbytes(fused)
    report.swapped.append(name)


def _patch_split(name: str, attn: nn.Module, fmt, g: int, report: DiffusersPatchReport) -> None:
    proj, prefix, _ = _split_attention(attn)
    where = f"{name}.to_qkv_mlp_proj"
    if proj.bias is not None:
        report.skipped[where] = "a projection with a bias is not supported (the packed format has no bias)"
        return
    try:
        fused = FusedSplitProjection.from_weight(proj.weight, prefix, weight_format=fmt.name, interleave=g,
                                                 activation="silu", name=where)
    except FormatError as e:
        report.skipped[where] = str(e)
        return
    report.bytes_before += _nbytes(proj)
    install_split(attn, fused.to(proj.weight.device))
    report.bytes_after += _nbytes(fused)
    report.split_projections.append(where)


def _declare_packed(model: nn.Module) -> None:
    """Give the model what from_pretrained gives one loaded from a packed checkpoint (its config's
    quantization_config, hf_quantizer), so that save_pretrained writes a packed checkpoint that
    loads again. Modules packed in different ways cannot share one quantization_config: then
    save_pretrained is left to refuse (no quantizer is declared, and the packed buffers have names
    no unpatched model loads)."""
    mlps = {n: m for n, m in model.named_modules() if isinstance(m, FusedSwiGLUMLP)}
    splits = {n: m for n, m in model.named_modules() if isinstance(m, FusedSplitProjection)}
    linears = tuple(n for n, m in model.named_modules() if isinstance(m, PackedLinear))
    kinds = {(m.weight_format, m.interleave, m.activation, m.global_scale_kind) for m in (*mlps.values(), *splits.values())}
    if len(kinds) != 1 or not mlps or not hasattr(model, "register_to_config"):
        return
    weight_format, interleave, activation, kind = kinds.pop()
    packed = formats.PackedConfig(weight_format, interleave, activation, tuple(mlps), kind,
                                  source={"via": "patch_model"}, linears=linears,
                                  split_projections={n: m.prefix_rows for n, m in splits.items()})
    register()
    config_cls, quantizer_cls = _classes()
    qcfg = config_cls(**packed.to_dict())
    model.register_to_config(quantization_config=qcfg)
    model.hf_quantizer = quantizer_cls(qcfg, pre_quantized=True)
    model.is_quantized, model.quantization_method = True, qcfg.quant_method


# ---------------------------------------------------------------- from_pretrained / save_pretrained
_REGISTERED = False  # (register runs once diffusers loads its quantizer registry: import_hook.REGISTRIES)

def register() -> None:
    """Add the ``swiglu_fused`` method to diffusers' quantizer mappings (idempotent)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from diffusers.quantizers import auto

    config_cls, quantizer_cls = _classes()
    auto.AUTO_QUANTIZATION_CONFIG_MAPPING.setdefault(formats.QUANT_METHOD, config_cls)
    auto.AUTO_QUANTIZER_MAPPING.setdefault(formats.QUANT_METHOD, quantizer_cls)
    _REGISTERED = True


class _Method(str):
    """diffusers reads ``quantization_config.quant_method.value`` (its methods are an Enum)."""

    @property
    def value(self) -> str:
        return str(self)


def _packed_modules(model: nn.Module):
    """(name, module) of every module whose buffers are packed tensors."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, (FusedSwiGLUMLP, FusedSplitProjection, PackedLinear))]


def _empty_modules(model: nn.Module, cfg: formats.PackedConfig, stored: dict) -> dict[str, nn.Module]:
    """Name → the empty (meta) packed module that replaces it, checked against the stored shapes."""
    def get(name, listed):
        try:
            return model.get_submodule(name)
        except AttributeError:
            raise FormatError(f"quantization_config.{listed} names {name}, which {type(model).__name__} "
                              "does not have") from None

    out = {}
    for name in cfg.modules:
        found = _feed_forward(get(name, formats.K_MODULES))
        if found is None:
            raise FormatError(f"quantization_config.modules names {name}, which is not a Flux.2 feed-forward")
        lin_in, _ = found
        out[name] = FusedSwiGLUMLP.empty(lin_in.in_features, lin_in.out_features // 2, weight_format=cfg.weight_format,
                                         interleave=cfg.interleave, activation=cfg.activation,
                                         global_scale_kind=cfg.global_scale_kind)
    for name, prefix in cfg.split_projections.items():
        parent, _, child = name.rpartition(".")
        found = _split_attention(get(parent, formats.K_SPLIT)) if child == "to_qkv_mlp_proj" else None
        if found is None:
            raise FormatError(f"quantization_config.{formats.K_SPLIT} names {name}, which is not a Flux.2 "
                              "single-stream to_qkv_mlp_proj")
        proj, model_prefix, inter = found
        if prefix != model_prefix:
            raise FormatError(f"quantization_config.{formats.K_SPLIT}: {name} has a prefix of {prefix} rows, but the "
                              f"model that config.json describes has {model_prefix} (3·inner); re-run `swiglu-fused convert`")
        out[name] = FusedSplitProjection.empty(proj.in_features, prefix, inter, weight_format=cfg.weight_format,
                                               interleave=cfg.interleave, activation=cfg.activation,
                                               global_scale_kind=cfg.global_scale_kind)
    for name in cfg.linears:
        linear = get(name, formats.K_LINEARS)
        if not isinstance(linear, nn.Linear):
            raise FormatError(f"quantization_config.linears names {name}, a {type(linear).__name__}, not a Linear")
        bias = stored.get(f"{name}.bias", (None, None, None))[2]
        out[name] = PackedLinear.empty(linear.in_features, linear.out_features, weight_format=cfg.weight_format,
                                       global_scale_kind=cfg.global_scale_kind, bias_dtype=bias)
    for name, module in out.items():
        for key, buffer in module.state_dict().items():
            file, shape, _ = stored.get(f"{name}.{key}", (None, None, None))
            if shape is not None and tuple(shape) != tuple(buffer.shape):
                raise FormatError(f"{file} / {name}.{key} / shape: {list(shape)}, but the model that config.json "
                                  f"describes needs {list(buffer.shape)}; config.json and the packed tensors are "
                                  "not from the same model: re-run `swiglu-fused convert` on the source")
    return out


@functools.cache  # one pair of classes: the registered ones
def _classes():
    from diffusers.quantizers.base import DiffusersQuantizer
    from diffusers.quantizers.quantization_config import QuantizationConfigMixin

    class SwigluFusedDiffusersConfig(QuantizationConfigMixin):
        """The packed checkpoint's quantization_config (formats.PackedConfig) as diffusers wants it."""

        def __init__(self, **kwargs):
            kwargs.setdefault(formats.K_QUANT_METHOD, formats.QUANT_METHOD)
            kwargs.pop(formats.K_H_FORMAT, None)  # derived from the weight format
            self.packed = formats.PackedConfig.from_dict(kwargs, f"{formats.CONFIG_FILE}: quantization_config")
            self.quant_method = _Method(formats.QUANT_METHOD)

        def to_dict(self):
            return self.packed.to_dict()

        def to_json_string(self, use_diff: bool = True) -> str:
            return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

        def __iter__(self):
            yield from self.to_dict().items()

    class SwigluFusedDiffusersQuantizer(DiffusersQuantizer):
        """Builds the fused modules (empty, on meta) where the packed checkpoint has them, and fills
        their buffers from the packed tensors as stored: the tensors bypass diffusers' cast to
        ``torch_dtype`` (it would round fp32 scales to bf16), ``maybe_update_state_dict``."""

        requires_calibration = True  # only loads packed checkpoints; patch_model quantizes live models

        def __init__(self, quantization_config, **kwargs):
            super().__init__(quantization_config, **kwargs)
            self._stored: dict = {}
            self._targets: dict[str, tuple[nn.Module, str]] = {}

        def validate_environment(self, *args, **kwargs):
            pass

        def maybe_update_loaded_keys(self, loaded_keys, checkpoint_files):
            self._stored = self._check_checkpoint(checkpoint_files)
            return loaded_keys

        def _check_checkpoint(self, checkpoint_files) -> dict:
            """Before a byte is loaded, the files must say what config.json says and hold tensors of
            the format's dtypes and shapes (packed_checkpoint.check_files_match_config). Returns
            tensor name → (file, shape, dtype)."""
            from ..weight_packing import packed_checkpoint, safetensors_io as sio

            files = [Path(f) for f in checkpoint_files or () if str(f).endswith(".safetensors")]
            if not files:
                raise FormatError(f"from_pretrained: a swiglu_fused packed checkpoint is loaded from its safetensors "
                                  f"files, found {checkpoint_files!r:.200}")
            headers = {f: sio.read_header(f) for f in files}
            packed_checkpoint.check_files_match_config(self.quantization_config.packed,
                                                       files[0].parent / formats.CONFIG_FILE, headers)
            return {n: (f, e.shape, e.dtype) for f, h in headers.items() for n, e in h.entries.items()}

        def _process_model_before_weight_loading(self, model, **kwargs):
            cfg = self.quantization_config.packed
            for name, module in _empty_modules(model, cfg, self._stored).items():
                if isinstance(module, FusedSplitProjection):
                    install_split(model.get_submodule(name.rpartition(".")[0]), module)
                else:
                    _swap(model, name, module)
            install_processors(model)
            self._targets = {f"{n}.{k}": (owner, k.rpartition(".")[2]) for n, m in _packed_modules(model)
                             for k, _ in m.named_buffers() for owner in [m.get_submodule(k.rpartition(".")[0])]}
            return model

        def maybe_update_state_dict(self, state_dict):
            """Our packed tensors go straight into their buffers, as stored; the rest loads as usual."""
            rest = {}
            for name, t in state_dict.items():
                target = self._targets.get(name)
                if target is None:
                    rest[name] = t
                else:
                    target[0]._buffers[target[1]] = t
            return rest

        @property
        def supports_parallel_loading(self) -> bool:
            return False  # maybe_update_state_dict writes into the modules

        def _process_model_after_weight_loading(self, model, **kwargs):
            empty = [n for n, (m, k) in self._targets.items() if m._buffers[k].is_meta]
            if empty:
                raise FormatError(f"from_pretrained: {len(empty)} packed tensors were not in the checkpoint "
                                  f"({', '.join(empty[:3])}); re-run `swiglu-fused convert` on the source")
            device = next((p.device for p in model.parameters() if not p.is_meta), None)
            if device is not None:
                for _, module in _packed_modules(model):
                    module.to(device)
            return model

        def get_state_dict_and_metadata(self, state_dict, safe_serialization=False):
            if not safe_serialization:
                raise FormatError("save_pretrained(safe_serialization=False): a swiglu_fused packed checkpoint is "
                                  "written as safetensors (its loaders check the files' metadata); use the default")
            metadata = self.quantization_config.packed.file_metadata()
            metadata.pop("format")
            return state_dict, metadata

        @property
        def is_serializable(self):
            return True

        @property
        def is_trainable(self):
            return False

        @property
        def is_compileable(self) -> bool:
            return True

    return SwigluFusedDiffusersConfig, SwigluFusedDiffusersQuantizer
