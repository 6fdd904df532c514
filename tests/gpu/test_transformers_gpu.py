"""The transformers integration on the GPU path (sm90 kernels behind FusedSwiGLUMLP)."""

import pytest
import torch

import swiglu_fused
from swiglu_fused import FusedSwiGLUMLP, patch_model

from conftest import make_causal_lm  # tests/conftest.py: tiny real transformers models

LOGITS_BOUND = {"bf16": 0.01, "fp8_block128": 0.08}


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("fmt", ["bf16", "fp8_block128"])
def test_patched_model_on_cuda_runs_the_kernels(tmp_path, fmt):
    model = make_causal_lm(tmp_path / "m", "llama").cuda()
    tokens = torch.randint(0, 128, (2, 12), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    with torch.no_grad():
        expected = model(tokens).logits
    report = patch_model(model, weight_format=fmt)
    assert len(report.swapped) == 2 and all(m.mlp.backend == "sm90" for m in model.model.layers)
    with torch.no_grad():
        assert _rel(model(tokens).logits, expected) < LOGITS_BOUND[fmt]
        out = model.generate(tokens, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert out.shape == (2, 16)


def test_from_pretrained_packed_on_cuda(tmp_path):
    from transformers import AutoModelForCausalLM

    src, dst = tmp_path / "src", tmp_path / "packed"
    make_causal_lm(src, "qwen3")
    swiglu_fused.convert(src, dst, weight_format="fp8_block128", progress=False)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16, device_map="cuda")
    loaded = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.bfloat16, device_map="cuda")
    mlp = loaded.model.layers[0].mlp
    assert isinstance(mlp, FusedSwiGLUMLP) and mlp.backend == "sm90"
    assert mlp.gate_up_proj.weight.device.type == "cuda" and mlp.gate_up_proj.weight_scale_inv.dtype == torch.float32
    tokens = torch.randint(0, 128, (1, 9), device="cuda")
    with torch.no_grad():
        assert _rel(loaded(tokens).logits, model(tokens).logits) < LOGITS_BOUND["fp8_block128"]
