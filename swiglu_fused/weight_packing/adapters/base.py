"""What a model-family adapter says about a checkpoint: where its gated MLPs are and which activation.

An adapter is data plus two small functions, not a branch in the converter: the names of the
source projections, whether gate and up come separate or fused as halves [gate; up], and the
activation read from the model's config.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from ...formats import FormatError

# Suffixes a projection's tensors may carry in the checkpoints we read (dense, fine-grained FP8,
# compressed-tensors NVFP4, ModelOpt NVFP4).
PROJECTION_SUFFIXES = (
    "weight", "weight_scale_inv", "weight_packed", "weight_scale", "weight_global_scale", "weight_scale_2",
    "input_global_scale", "input_scale", "activation_scale", "bias",
)
_SUFFIX_RE = "|".join(PROJECTION_SUFFIXES)


@dataclass(frozen=True)
class MLPSource:
    """One gated MLP: the packed prefix it gets and the source projections it is made from."""

    module: str  # packed prefix: {module}.gate_up_interleaved / {module}.down_proj
    gate: str | None  # source projection prefixes (without the tensor suffix)
    up: str | None
    fused: str | None  # a [gate; up] projection, when the family stores one
    down: str

    @property
    def projections(self) -> tuple[str, ...]:
        return tuple(p for p in (self.gate, self.up, self.fused, self.down) if p)


@dataclass(frozen=True)
class Adapter:
    name: str
    architectures: tuple[str, ...]  # config.json "architectures" / diffusers "_class_name"
    model_types: tuple[str, ...]
    mlp_pattern: str  # regex of an MLP module prefix, e.g. r"model\.layers\.\d+\.mlp"
    gate: str | None  # child names of the projections inside the MLP module
    up: str | None
    fused: str | None
    down: str
    default_activation: str = "silu"
    activation_key: str | None = "hidden_act"  # config field naming the activation
    activations: Mapping[str, str] = None  # config value → our activation name

    def activation(self, config: Mapping) -> str:
        if self.activation_key is None:
            return self.default_activation
        value = config.get(self.activation_key)
        if value is None and self.activation_key == "hidden_activation":
            value = config.get("hidden_act")
        if value is None:
            return self.default_activation
        table = self.activations or {"silu": "silu", "swish": "silu"}
        if not isinstance(value, str) or value not in table:
            raise FormatError(
                f"config.json: {self.activation_key} = {value!r:.100} is not supported for {self.name}; "
                f"supported: {sorted(table)}")
        return table[value]

    def find_mlps(self, names: list[str]) -> list[MLPSource]:
        """Every MLP in the checkpoint, in natural (layer) order."""
        children = [c for c in (self.gate, self.up, self.fused, self.down) if c]
        rx = re.compile(rf"^({self.mlp_pattern})\.({'|'.join(map(re.escape, children))})\.({_SUFFIX_RE})$")
        modules: dict[str, set[str]] = {}
        for n in names:
            m = rx.match(n)
            if m:
                modules.setdefault(m.group(1), set()).add(m.group(2))
        out = []
        for module in sorted(modules, key=_natural_key):
            def p(child):
                return f"{module}.{child}" if child else None
            out.append(MLPSource(module, p(self.gate), p(self.up), p(self.fused), p(self.down)))
        return out


def _natural_key(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]
