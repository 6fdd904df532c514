"""vLLM model classes with the fused MLP (imported lazily by vLLM's model registry, never by
``import swiglu_fused``).

For each architecture in ``vllm.ARCHITECTURES`` this module provides a subclass of vLLM's own class
of that name: vLLM's ``__init__`` runs unchanged; when the checkpoint's quantization is
``swiglu_fused``, each MLP listed in ``quantization_config.modules`` is then replaced by a
``FusedMLP`` (before any weight loads). Otherwise the subclass is vLLM's class exactly.
"""

from __future__ import annotations

import importlib

import torch
from torch import nn
from torch.nn import Parameter

from .. import formats
from ..formats import FormatError
from ..kernels import dispatch, ops, pipeline
from ..layer import tile_major_layout
from .vllm_config import SwigluFusedConfig
from .vllm_layout import ARCHITECTURES, check_tensor_parallel
from .vllm_linear import load_slice


class _Projection(nn.Module):
    """One packed projection's tensors of this rank, as parameters named by the format's suffixes
    (so vLLM's loader reports any it did not fill), each with a ``weight_loader(param, loaded)``
    that keeps this rank's part of the checkpoint's tensor (``part``). vLLM's in-place reload
    (``reload_weights``) swaps the parameters for fresh ones while it loads, calls these loaders on
    them and copies the result into the originals; a loader that wrote elsewhere would leave the
    originals as they were."""

    def __init__(self, tensors: dict, part):
        super().__init__()
        for suffix, (dtype, shape) in tensors.items():
            param = Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)

            def weight_loader(param, loaded_weight, suffix=suffix):
                param.data.copy_(part(suffix, param, loaded_weight))
            param.weight_loader = weight_loader
            self.register_parameter(suffix, param)


class FusedMLP(nn.Module):
    """The gated MLP of one rank: quant_x → gate_up (act·up epilogue) → down through our ops, then
    the all-reduce of down's partial sums. Rank r of T holds gate_up rows [r·2I/T, (r+1)·2I/T)
    (whole g-chunks of gate and up rows) and down columns [r·I/T, (r+1)·I/T): itself a packed MLP
    of intermediate size I/T."""

    def __init__(self, hidden: int, intermediate: int, packed: formats.PackedConfig, *, tp_rank: int = 0,
                 tp_size: int = 1, reduce_results: bool = True, prefix: str = ""):
        super().__init__()
        fmt = formats.weight_format(packed.weight_format)
        local = intermediate // tp_size
        self.packed, self.prefix = packed, prefix
        self.hidden, self.intermediate, self.tp_rank, self.tp_size = hidden, intermediate, tp_rank, tp_size
        self.reduce_results = reduce_results
        self.gate_up_interleaved = _Projection(fmt.tensors(2 * local, hidden, 2),  # = formats.GATE_UP
                                               lambda suffix, p, t: self._part(formats.GATE_UP, suffix, p, t))
        self.down_proj = _Projection(fmt.tensors(hidden, local, 1),
                                     lambda suffix, p, t: self._part(formats.DOWN, suffix, p, t))
        self.tile_major = (False, False)  # whether gate_up's / down's weight is held tile-major
        # gate_up's / down's per-tensor scale as the ops take it: (multiplier, the parameter it was
        # made from), made by settle_layout (pipeline.held_multiplier); None: converted each call
        self._multipliers: list | None = None

    def _projections(self):
        """(gate_up, down), each with its tile-major layout (layer.tile_major_layout: the one
        FusedSwiGLUMLP's projections take; gate_up's only at the kernels' interleave), or None."""
        fmt = formats.weight_format(self.packed.weight_format)
        kernels = dispatch.format_has_kernels(fmt.name, self.packed.interleave)
        return ((self.gate_up_interleaved, tile_major_layout(fmt, kernels, fp8_tile_major=True)),
                (self.down_proj, tile_major_layout(fmt)))

    def _reorder(self, want) -> None:
        flags = []
        for (proj, layout), have, major in zip(self._projections(), self.tile_major, want):
            if major != have:
                names, order = layout
                order.reorder_in_place([getattr(proj, n).data for n in names], major)
            flags.append(major)
        self.tile_major = tuple(flags)

    def settle_layout(self) -> None:
        """Each weight in the order its device's kernels read (tile-major on an sm90 GPU where its
        tiles are whole and dispatch says so: DESIGN §3.3), in place; the model calls this once its
        weights loaded."""
        fmt = formats.weight_format(self.packed.weight_format)
        self._reorder([layout is not None and getattr(dispatch, layout[1].rule)(getattr(proj, layout[0][0]))
                       for proj, layout in self._projections()])
        if fmt.global_scale_name:  # and each per-tensor scale's multiplier, once, not a launch a call
            held = self._multipliers or [(None, None)] * 2
            self._multipliers = []
            for (proj, _), (mult, source) in zip(self._projections(), held):
                gs = getattr(proj, fmt.global_scale_name)
                self._multipliers.append((pipeline.held_multiplier(mult, source, gs, self.packed.global_scale_kind),
                                          gs))

    def _op_tensors(self) -> tuple[dict, dict, str | None]:
        """(gate_up's tensors, down's, their global_scale_kind) as ops.mlp takes them."""
        fmt = formats.weight_format(self.packed.weight_format)
        out = [dict(proj.named_parameters()) for proj, _ in self._projections()]
        if self._multipliers is None or any(t[fmt.global_scale_name] is not source
                                            for t, (_, source) in zip(out, self._multipliers)):
            return *out, self.packed.global_scale_kind
        for t, (mult, _) in zip(out, self._multipliers):
            t[fmt.global_scale_name] = mult
        return *out, formats.MULTIPLIER

    def load_weights(self, weights) -> set[str]:
        """vLLM's loader hands us (name under this module, full tensor) pairs: each goes through its
        parameter's weight_loader (_Projection), as vLLM's own loaders and its in-place reload expect."""
        fmt = formats.weight_format(self.packed.weight_format)
        # a reload: the checkpoint's bytes are in the packed order (vLLM's in-place reload holds fresh
        # parameters meanwhile, on the meta device, and copies the loaded ones into these)
        if any(p.is_meta for p in self.parameters()):
            self.tile_major = (False, False)
        else:
            self._reorder((False, False))
        loaded = set()
        for name, tensor in weights:
            proj, _, suffix = name.partition(".")
            owner = getattr(self, proj) if proj in (formats.GATE_UP, formats.DOWN) else None
            param = getattr(owner, suffix, None)
            if not isinstance(param, Parameter):
                raise FormatError(f"{self.prefix}.{name}: not a tensor of a packed {fmt.name} MLP "
                                  f"({formats.GATE_UP}.*, {formats.DOWN}.*)")
            param.weight_loader(param, tensor)
            loaded.add(name)
        return loaded

    def _part(self, proj: str, suffix: str, param, tensor) -> torch.Tensor:
        """This rank's part of the checkpoint's ``tensor`` for ``param`` (``proj``.``suffix``)."""
        fmt = formats.weight_format(self.packed.weight_format)
        local = self.intermediate // self.tp_size
        part = tensor
        if param.dim() == 2 and proj == formats.GATE_UP:
            part = load_slice(fmt, suffix, tensor, 0, 2 * local * self.tp_rank, 2 * local, 2 * self.intermediate,
                              f"{self.prefix}.{proj}")
        elif param.dim() == 2:
            part = load_slice(fmt, suffix, tensor, 1, local * self.tp_rank, local, self.intermediate,
                              f"{self.prefix}.{proj}")
        if tuple(part.shape) != tuple(param.shape) or tensor.dtype != param.dtype:
            raise FormatError(f"{self.prefix}.{proj}.{suffix}: the checkpoint holds {tensor.dtype} "
                              f"{list(tensor.shape)}, this rank needs {param.dtype} {list(param.shape)} of it (hidden "
                              f"{self.hidden}, intermediate {self.intermediate}, T = {self.tp_size}); config.json "
                              "and the packed tensors are not from the same model")
        return part

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, down, kind = self._op_tensors()
        y = ops.mlp(x, gate_up, down, weight_format=self.packed.weight_format, interleave=self.packed.interleave,
                    act=self.packed.activation, global_scale_kind=kind, tile_major=self.tile_major)
        if self.reduce_results and self.tp_size > 1:
            from vllm.distributed import tensor_model_parallel_all_reduce

            y = tensor_model_parallel_all_reduce(y)
        return y

    def extra_repr(self) -> str:
        return (f"hidden={self.hidden}, intermediate={self.intermediate // self.tp_size} of {self.intermediate} "
                f"(rank {self.tp_rank} of {self.tp_size}), format={self.packed.weight_format}, "
                f"g={self.packed.interleave}, activation={self.packed.activation}")


def swap_mlps(model: nn.Module, quant_config) -> list[str]:
    """Replace each MLP listed in the checkpoint by a FusedMLP of the same sizes and TP layout."""
    from vllm.model_executor.models.utils import PPMissingLayer

    swapped = []
    for name in sorted(quant_config.mlps):
        parent_name, _, child = name.rpartition(".")
        try:
            parent = model.get_submodule(parent_name) if parent_name else model
        except AttributeError:
            raise FormatError(f"quantization_config.modules names {name}, which vLLM's "
                              f"{type(model).__name__} does not have") from None
        if isinstance(parent, PPMissingLayer):
            continue  # another pipeline stage holds this layer
        mlp = getattr(parent, child, None)
        gate_up, down = getattr(mlp, "gate_up_proj", None), getattr(mlp, "down_proj", None)
        if gate_up is None or down is None:
            raise FormatError(f"{name}: vLLM's {type(mlp).__name__} has no gate_up_proj / down_proj, so "
                              "swiglu_fused cannot replace it")
        setattr(parent, child, FusedMLP(gate_up.input_size, down.input_size, quant_config.packed,
                                        tp_rank=down.tp_rank, tp_size=down.tp_size,
                                        reduce_results=down.reduce_results, prefix=name))
        swapped.append(name)
    return swapped


def _subclass(arch: str) -> type:
    base = getattr(importlib.import_module(ARCHITECTURES[arch]), arch)

    def __init__(self, *, vllm_config, prefix: str = "", **kwargs):
        quant_config = vllm_config.quant_config
        ours = isinstance(quant_config, SwigluFusedConfig)
        if ours:  # before vLLM's layers divide I by T (an assertion there otherwise)
            text = vllm_config.model_config.hf_text_config
            check_tensor_parallel(quant_config.packed, text.intermediate_size,
                                  vllm_config.parallel_config.tensor_parallel_size)
        base.__init__(self, vllm_config=vllm_config, prefix=prefix, **kwargs)
        if ours:
            self.swiglu_fused_mlps = swap_mlps(self, quant_config)

    def load_weights(self, weights, *args, **kwargs):
        loaded = base.load_weights(self, weights, *args, **kwargs)
        for module in self.modules():  # every weight is in: each packed MLP takes its kernels' order
            if isinstance(module, FusedMLP):
                module.settle_layout()
        return loaded

    return type(arch, (base,), {"__init__": __init__, "load_weights": load_weights, "__module__": __name__,
                                "__doc__": f"vLLM's {arch}, with swiglu_fused's FusedMLP for packed checkpoints."})


def __getattr__(name: str):
    # one subclass per architecture, made when vLLM's registry first asks for it (importing
    # vLLM's module of that family only then)
    if name in ARCHITECTURES:
        cls = globals()[name] = _subclass(name)
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
