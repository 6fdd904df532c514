"""Flux.2 transformer (diffusers): Flux2FeedForward.linear_in holds halves [gate; up], SiLU; the
single-stream blocks' ``attn.to_qkv_mlp_proj`` holds [Q; K; V; gate; up] (a split projection).

Both feed-forwards of the double-stream blocks (``ff`` on image tokens, ``ff_context`` on text
tokens) are converted as MLPs. Each single-stream ``to_qkv_mlp_proj`` is packed as a split
projection (formats.SPLIT): its 3·inner Q/K/V rows stay as they are, its gate/up halves are
interleaved; ``attn.to_out`` (over cat([attention, h])) is not an MLP projection and stays as it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from ...formats import FormatError
from .base import Adapter, PROJECTION_SUFFIXES, _natural_key


@dataclass(frozen=True)
class SplitAdapter(Adapter):
    """An adapter whose family also has split projections ("plain prefix + pairs")."""

    split_pattern: str = ""  # regex of a split projection's prefix (without the tensor suffix)

    def split_prefix_rows(self, config: Mapping) -> int:
        raise NotImplementedError

    def find_splits(self, names: list[str], config: Mapping) -> dict[str, int]:
        """Every split projection in the checkpoint (layer order) → its prefix rows."""
        rx = re.compile(rf"^({self.split_pattern})\.({'|'.join(PROJECTION_SUFFIXES)})$")
        found = sorted({m.group(1) for m in map(rx.match, names) if m}, key=_natural_key)
        if not found:
            return {}
        prefix = self.split_prefix_rows(config)
        return {name: prefix for name in found}


@dataclass(frozen=True)
class Flux2Adapter(SplitAdapter):
    def split_prefix_rows(self, config: Mapping) -> int:
        """Q, K and V: 3 · heads · head_dim rows (diffusers' Flux2ParallelSelfAttention.inner_dim)."""
        heads, head_dim = config.get("num_attention_heads"), config.get("attention_head_dim")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (heads, head_dim)):
            raise FormatError(f"config.json: num_attention_heads = {heads!r:.40} and attention_head_dim = "
                              f"{head_dim!r:.40} must be positive integers (they give the Q/K/V rows of "
                              "to_qkv_mlp_proj)")
        return 3 * heads * head_dim


ADAPTER = Flux2Adapter(
    name="flux2",
    architectures=("Flux2Transformer2DModel",),
    model_types=(),
    mlp_pattern=r"transformer_blocks\.\d+\.ff(?:_context)?",
    gate=None, up=None, fused="linear_in", down="linear_out",
    activation_key=None,
    split_pattern=r"single_transformer_blocks\.\d+\.attn\.to_qkv_mlp_proj",
)
