"""Write tests/data/tiny-llama-nvfp4: an nvfp4-pack-quantized checkpoint made by compressed-tensors'
own NVFP4A16 preset and compressor (tests/conftest.py: make_ct_nvfp4), from a tiny random LLaMA
whose every projection side suits the nvfp4 kernels (K % 64 == 0).

The GPU machine has no compressed-tensors, so the GPU whole-model test reads this committed copy;
the CPU suite makes its own with the same function. Usage (CPU, the CI venv):
python tests/data/make_nvfp4_checkpoint.py OUT_DIR
"""

import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import make_ct_nvfp4  # noqa: E402

CONFIG = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, head_dim=64, vocab_size=128, max_position_embeddings=64,
              tie_word_embeddings=False, architectures=["LlamaForCausalLM"])


def main(out: str) -> None:
    torch.manual_seed(0)
    make_ct_nvfp4(Path(out), LlamaForCausalLM(LlamaConfig(**CONFIG)).to(torch.bfloat16))
    import compressed_tensors
    print("wrote", out, "with compressed-tensors", compressed_tensors.__version__)


if __name__ == "__main__":
    main(sys.argv[1])
