"""vLLM: serve a packed checkpoint with the fused MLP (``vllm serve ./packed`` / ``LLM(model=...)``).

``register()`` is the ``vllm.general_plugins`` entry point (pyproject.toml). vLLM runs it in the
front end, the engine and every worker, so it is idempotent. It registers

* the ``swiglu_fused`` quantization method (``SwigluFusedConfig``), so vLLM accepts a packed
  checkpoint's ``quantization_config`` in the main process and asks us which method every layer
  uses;
* for the architectures we convert, a thin subclass of vLLM's own model class
  (``vllm_models.py``): vLLM's ``__init__`` runs unchanged, then each MLP that the checkpoint lists
  is replaced by ``vllm_models.FusedMLP`` (quant_x → gate_up with the act·up epilogue → down, our
  registered ops, then the tensor-parallel all-reduce). With any other quantization the subclass is
  vLLM's class exactly. Why a swap after vLLM's ``__init__`` and not a linear method: DESIGN §7.

This module imports without vLLM (everything from vLLM is imported inside functions), so
``import swiglu_fused`` never needs it. The tensor-parallel arithmetic (which rows and columns of a
stored tensor rank r holds, which sizes T are valid) is plain Python in vllm_layout.py.
"""

from __future__ import annotations

from .. import formats
from .vllm_layout import ARCHITECTURES

_MODELS_MODULE = "swiglu_fused.integrations.vllm_models"

_registered = False


def register() -> None:
    """The ``vllm.general_plugins`` entry point: register the quantization method and the model
    classes with vLLM. Safe to run any number of times in any process."""
    global _registered
    if _registered:
        return
    from vllm import ModelRegistry
    from vllm.model_executor.layers.quantization import register_quantization_config

    register_quantization_config(formats.QUANT_METHOD)(config_class())
    for arch in ARCHITECTURES:
        # a "module:Class" string: vLLM imports it lazily, in the process that builds the model
        ModelRegistry.register_model(arch, f"{_MODELS_MODULE}:{arch}")
    _registered = True


# ---------------------------------------------------------------- the quantization config
def config_class():
    """vLLM's QuantizationConfig for packed checkpoints (a module-level class in vllm_config.py:
    vLLM pickles the config to its workers)."""
    from .vllm_config import SwigluFusedConfig

    return SwigluFusedConfig
