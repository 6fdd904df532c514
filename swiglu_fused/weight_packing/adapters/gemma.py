"""Gemma: separate gate_proj / up_proj with a GELU-tanh gate (config hidden_activation)."""

from .base import Adapter

ADAPTER = Adapter(
    name="gemma",
    architectures=("GemmaForCausalLM", "Gemma2ForCausalLM", "GemmaModel", "Gemma2Model"),
    model_types=("gemma", "gemma2"),
    mlp_pattern=r"(?:model\.)?layers\.\d+\.mlp",
    gate="gate_proj", up="up_proj", fused=None, down="down_proj",
    default_activation="gelu_tanh",
    activation_key="hidden_activation",
    activations={"gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"},
)
