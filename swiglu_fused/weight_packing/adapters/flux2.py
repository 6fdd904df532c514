"""Flux.2 transformer (diffusers): Flux2FeedForward.linear_in holds halves [gate; up], SiLU.

Both feed-forwards of the double-stream blocks (``ff`` on image tokens, ``ff_context`` on text
tokens) are converted. The single-stream blocks fuse Q, K, V, gate and up into one projection and
are left as they are for now.
"""

from .base import Adapter

ADAPTER = Adapter(
    name="flux2",
    architectures=("Flux2Transformer2DModel",),
    model_types=(),
    mlp_pattern=r"transformer_blocks\.\d+\.ff(?:_context)?",
    gate=None, up=None, fused="linear_in", down="linear_out",
    activation_key=None,
)
