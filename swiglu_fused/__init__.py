"""swiglu-fused: one GEMM for the gate and up projections of gated MLPs, with SiLU·up in its epilogue.

Public API:
    convert, verify, inspect           offline checkpoint packing (swiglu_fused.weight_packing)
    FusedSwiGLUMLP                     the gated MLP on packed weights
    PackedConfig, FORMAT_VERSION, WEIGHT_FORMATS   the packed format (swiglu_fused.formats)
    validate                           a packed directory's headers (swiglu_fused.weight_packing.verify)
"""

from .formats import FORMAT_VERSION, WEIGHT_FORMATS, FormatError, PackedConfig
from .integrations.transformers import PatchReport, patch_model
from .layer import FusedSwiGLUMLP
from .weight_packing.convert import ConvertReport, convert
from .weight_packing.verify import inspect, validate, verify

__version__ = "0.1.0"


# transformers has no entry-point discovery for quantization methods: register "swiglu_fused" so
# that from_pretrained(packed_dir) works after `import swiglu_fused` (deferred until transformers
# loads its quantizer registry, so that importing us does not import transformers).
from .integrations.transformers import register_when_imported  # noqa: E402

register_when_imported()

# diffusers likewise (Flux2Transformer2DModel.from_pretrained(packed_dir)), once it loads its registry.
from .integrations.diffusers import register_when_imported as _register_diffusers_when_imported  # noqa: E402

_register_diffusers_when_imported()

__all__ = [
    "FORMAT_VERSION", "WEIGHT_FORMATS", "FormatError", "PackedConfig", "validate",
    "FusedSwiGLUMLP", "patch_model", "PatchReport", "ConvertReport", "convert", "inspect", "verify", "__version__",
]
