"""vLLM's QuantizationConfig for swiglu_fused packed checkpoints (imported only once vLLM is: by
the plugin's ``register`` and by vLLM unpickling the config in its workers)."""

from __future__ import annotations

import torch
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

from .. import formats
from ..formats import FormatError
from . import vllm_linear
from .vllm_layout import MLP_PROJECTIONS


class SwigluFusedConfig(QuantizationConfig):
    """A packed checkpoint's ``quantization_config`` (formats.PackedConfig) as vLLM wants it."""

    def __init__(self, packed: formats.PackedConfig):
        super().__init__()
        self.packed = packed
        self.mlps = set(packed.modules)
        self.linears = set(packed.linears)

    def __repr__(self) -> str:
        p = self.packed
        return (f"SwigluFusedConfig({p.weight_format}, g={p.interleave}, {p.activation}, "
                f"{len(self.mlps)} MLPs, {len(self.linears)} linears)")

    def get_name(self) -> str:
        return formats.QUANT_METHOD

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        # the reference ops run on any GPU torch supports; the sm90 kernels engage on Hopper
        return 70

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []  # quantization_config lives in config.json

    @classmethod
    def from_config(cls, config: dict) -> "SwigluFusedConfig":
        d = dict(config)
        d.pop(formats.K_H_FORMAT, None)  # derived from the weight format
        return cls(formats.PackedConfig.from_dict(d, f"{formats.CONFIG_FILE}: quantization_config"))

    def apply_vllm_mapper(self, mapper) -> None:
        # the model's checkpoint → vLLM module renames, applied to our module lists
        self.mlps = set(mapper.apply_list(sorted(self.mlps)))
        self.linears = set(mapper.apply_list(sorted(self.linears)))

    def get_quant_method(self, layer, prefix: str):
        if not isinstance(layer, LinearBase):
            return None  # embeddings, lm_head, attention: vLLM's defaults
        parent, _, leaf = prefix.rpartition(".")
        if parent in self.mlps and leaf in MLP_PROJECTIONS:
            return vllm_linear.ReplacedMLPProjection(prefix)
        parts = self.packed_modules_mapping.get(leaf, [leaf])
        names = [f"{parent}.{p}" if parent else p for p in parts]
        listed = [n in self.linears for n in names]
        if all(listed):
            return vllm_linear.PackedLinearMethod(self.packed, prefix, parts if len(parts) > 1 else None)
        if any(listed):
            raise FormatError(f"{prefix}: vLLM fuses {', '.join(names)} into one layer, but "
                              f"quantization_config.linears lists only some of them; convert the source again")
        return UnquantizedLinearMethod()
