"""Phi-3: one fused gate_up_proj whose rows are the halves [gate; up], SiLU."""

from .base import Adapter

ADAPTER = Adapter(
    name="phi3",
    architectures=("Phi3ForCausalLM", "Phi3Model"),
    model_types=("phi3",),
    mlp_pattern=r"(?:model\.)?layers\.\d+\.mlp",
    gate=None, up=None, fused="gate_up_proj", down="down_proj",
)
