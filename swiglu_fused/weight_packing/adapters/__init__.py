"""Model-family adapters: one small module per family, looked up from config.json."""

from __future__ import annotations

from typing import Mapping

from ...formats import FormatError
from . import flux2, gemma, llama, phi3
from .base import Adapter, MLPSource

ADAPTERS: tuple[Adapter, ...] = (llama.ADAPTER, gemma.ADAPTER, phi3.ADAPTER, flux2.ADAPTER)


def for_config(config: Mapping, where: str = "config.json") -> Adapter:
    archs = config.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise FormatError(f"{where}: architectures must be a list of class names (e.g. [\"LlamaForCausalLM\"]), "
                          f"found {archs!r:.100}")
    for key in ("_class_name", "model_type"):
        if config.get(key) is not None and not isinstance(config.get(key), str):
            raise FormatError(f"{where}: {key} must be a string, found {config.get(key)!r:.100}")
    names = archs + [config.get("_class_name")]
    for adapter in ADAPTERS:
        if any(n in adapter.architectures for n in names if n):
            return adapter
    for adapter in ADAPTERS:
        if config.get("model_type") in adapter.model_types:
            return adapter
    found = [n for n in names if n] or [config.get("model_type")]
    supported = sorted(a for ad in ADAPTERS for a in ad.architectures if "ForCausalLM" in a or "2D" in a)
    raise FormatError(f"{where}: unknown architecture {found}; swiglu-fused converts {', '.join(supported)}")


__all__ = ["ADAPTERS", "Adapter", "MLPSource", "for_config"]
