"""The transformers integration on the GPU path: the CPU suite's checks (tests/
test_transformers_integration.py) run again with the model on CUDA, where FusedSwiGLUMLP runs
the sm90 kernels (nvfp4 included: W4A16)."""

import pytest
import torch

from swiglu_fused import patch_model

from conftest import make_causal_lm  # tests/conftest.py: tiny real transformers models
from test_transformers_integration import (FAMILIES, FROM_PRETRAINED_CASES,
                                           check_from_pretrained_and_save_pretrained,
                                           check_patched_bf16_generates_the_same_tokens,
                                           check_patched_model_saves_and_loads_again,
                                           check_patched_quantized_logits_within_tolerance)


def _on_kernels(model, fmt):
    mlps = [layer.mlp for layer in model.model.layers]
    return all(m.weight_format == fmt and m.backend == "sm90" for m in mlps)


@pytest.mark.parametrize("family", FAMILIES)
def test_patched_bf16_generates_the_same_tokens_on_cuda(tmp_path, family):
    model = check_patched_bf16_generates_the_same_tokens(tmp_path, family, device="cuda")
    assert _on_kernels(model, "bf16")


@pytest.mark.parametrize("fmt", ["fp8_block128", "nvfp4"])
def test_patched_quantized_logits_within_tolerance_on_cuda(tmp_path, fmt):
    model = check_patched_quantized_logits_within_tolerance(tmp_path, fmt, device="cuda")
    assert _on_kernels(model, fmt)


@pytest.mark.parametrize("fmt,family", FROM_PRETRAINED_CASES)
def test_from_pretrained_and_save_pretrained_on_cuda(tmp_path, fmt, family):
    loaded = check_from_pretrained_and_save_pretrained(tmp_path, fmt, family, device="cuda")
    assert _on_kernels(loaded, fmt)


@pytest.mark.parametrize("fmt,family", [("fp8_block128", "llama"), ("bf16", "phi3")])
def test_patched_model_saves_and_loads_again_on_cuda(tmp_path, fmt, family):
    loaded = check_patched_model_saves_and_loads_again(tmp_path, fmt, family, device="cuda")
    assert _on_kernels(loaded, fmt)


def test_patched_fp8_model_generates_on_cuda(tmp_path):
    """generate() through the fp8 kernels (prefill, then one row per sequence per step): its first
    token is the argmax of the same model's forward over the prompt."""
    model = make_causal_lm(tmp_path / "m", "llama").cuda()
    tokens = torch.randint(0, 128, (2, 12), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    patch_model(model, weight_format="fp8_block128")
    with torch.no_grad():
        out = model.generate(tokens, max_new_tokens=4, do_sample=False, pad_token_id=0)
        first = model(tokens).logits[:, -1].argmax(-1)
    assert out.shape == (2, 16) and torch.equal(out[:, 12], first)
