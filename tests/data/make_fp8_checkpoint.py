"""Write tests/data/tiny-llama-fp8: a fine-grained FP8 checkpoint made by transformers itself.

transformers quantizes to FP8 only on a GPU, so this runs on the GPU machine (once; the output is
committed as test data). CI then repacks it bit-exactly and compares with transformers' own CPU
dequantization. Usage: python tests/data/make_fp8_checkpoint.py OUT_DIR
"""

import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM, FineGrainedFP8Config, LlamaConfig, LlamaForCausalLM

# Every projection side a multiple of 128 except k/v (64 rows), which transformers leaves in bf16.
CONFIG = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, head_dim=64, vocab_size=128, max_position_embeddings=64,
              tie_word_embeddings=False, architectures=["LlamaForCausalLM"])


def main(out: str) -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).to(torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        fp8 = AutoModelForCausalLM.from_pretrained(
            tmp, quantization_config=FineGrainedFP8Config(weight_block_size=[128, 128]), device_map="cuda")
        fp8.save_pretrained(out, max_shard_size="150KB")  # several shards: weights and scales may split
    print("wrote", out, "with transformers", __import__("transformers").__version__)


if __name__ == "__main__":
    main(sys.argv[1])
