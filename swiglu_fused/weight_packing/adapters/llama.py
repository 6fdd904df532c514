"""LLaMA, Mistral, Qwen2, Qwen3: separate gate_proj / up_proj, SiLU."""

from .base import Adapter

ADAPTER = Adapter(
    name="llama",
    architectures=("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                   "LlamaModel", "MistralModel", "Qwen2Model", "Qwen3Model"),
    model_types=("llama", "mistral", "qwen2", "qwen3"),
    mlp_pattern=r"(?:model\.)?layers\.\d+\.mlp",
    gate="gate_proj", up="up_proj", fused=None, down="down_proj",
)
