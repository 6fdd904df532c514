"""swiglu-fused: one GEMM for the gate and up projections of gated MLPs, with SiLU·up in its epilogue.

Public API:
    convert, verify, inspect           offline checkpoint packing (swiglu_fused.weight_packing)
    FusedSwiGLUMLP                     the gated MLP on packed weights
    patch_model, PatchReport           a loaded transformers / diffusers model's MLPs made fused
    PackedConfig, FORMAT_VERSION, WEIGHT_FORMATS, FormatError   the packed format (swiglu_fused.formats)
    validate                           a packed directory's headers (swiglu_fused.weight_packing.verify)

The names load on first use (PEP 562): ``import swiglu_fused`` imports neither torch nor
transformers, so the command starts, answers --help and takes a Ctrl-C at once, and
``import swiglu_fused`` in a model script costs nothing until a name is used.
"""

from importlib import import_module
from importlib.util import find_spec
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name → the module that defines it
_API = {
    "FORMAT_VERSION": "formats", "WEIGHT_FORMATS": "formats", "FormatError": "formats", "PackedConfig": "formats",
    "FusedSwiGLUMLP": "layer",
    "patch_model": "integrations.transformers", "PatchReport": "integrations.transformers",
    "ConvertReport": "weight_packing.convert", "convert": "weight_packing.convert",
    "inspect": "weight_packing.verify", "validate": "weight_packing.verify", "verify": "weight_packing.verify",
}

__all__ = [*_API, "__version__"]

if TYPE_CHECKING:  # the same names for type checkers and editors (tests/test_cli.py keeps the two lists equal)
    from .formats import FORMAT_VERSION, WEIGHT_FORMATS, FormatError, PackedConfig
    from .integrations.transformers import PatchReport, patch_model
    from .layer import FusedSwiGLUMLP
    from .weight_packing.convert import ConvertReport, convert
    from .weight_packing.verify import inspect, validate, verify


def __getattr__(name: str):
    if name in _API:
        value = getattr(import_module(f".{_API[name]}", __name__), name)
        globals()[name] = value  # (once: later lookups do not come here)
        return value
    if not name.startswith("_") and find_spec(f"{__name__}.{name}") is not None:
        return import_module(f".{name}", __name__)  # a subpackage or module: swiglu_fused.formats, ...
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})


# transformers has no entry-point discovery for quantization methods: register "swiglu_fused" so
# that from_pretrained(packed_dir) works after `import swiglu_fused`, as soon as transformers loads
# its quantizer registry; diffusers likewise (Flux2Transformer2DModel.from_pretrained(packed_dir)).
from .integrations import import_hook  # noqa: E402

import_hook.register_integrations()
