"""transformers: patch a loaded model; load and save a packed checkpoint with from_pretrained."""

import copy

import pytest
import torch

import swiglu_fused  # noqa: F401  (registers the swiglu_fused quantization method)
from swiglu_fused import FusedSwiGLUMLP, convert, patch_model

from conftest import make_causal_lm

LOGITS_BOUND = {"fp8_block128": 0.08, "nvfp4": 0.25}  # relative Frobenius error of logits vs unpatched


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _tokens(seed=0):
    return torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(seed))


def _generate(model, tokens):
    with torch.no_grad():
        return model.generate(tokens, max_new_tokens=8, do_sample=False, pad_token_id=0)


FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma", "phi3"]


# The check_* functions take the device, so tests/gpu/test_transformers_gpu.py runs the same
# checks on the sm90 kernels.
def check_patched_bf16_generates_the_same_tokens(tmp_path, family, device="cpu"):
    model = make_causal_lm(tmp_path / "m", family).to(device)
    tokens = _tokens().to(device)
    expected = _generate(model, tokens)
    report = patch_model(model, weight_format="bf16")
    assert report.swapped == ["model.layers.0.mlp", "model.layers.1.mlp"] and not report.skipped
    assert all(isinstance(layer.mlp, FusedSwiGLUMLP) for layer in model.model.layers)
    if family == "gemma":
        assert model.model.layers[0].mlp.activation == "gelu_tanh"
    assert torch.equal(_generate(model, tokens), expected)
    return model


def check_patched_quantized_logits_within_tolerance(tmp_path, fmt, device="cpu"):
    model = make_causal_lm(tmp_path / "m", "llama").to(device)
    tokens = _tokens().to(device)
    with torch.no_grad():
        expected = model(tokens).logits
    report = patch_model(model, weight_format=fmt)
    assert report.bytes_saved > 0 and "swapped 2 MLPs" in str(report)
    with torch.no_grad():
        got = model(tokens).logits
    assert _rel(got, expected) < LOGITS_BOUND[fmt]
    assert "format=" + fmt in repr(model.model.layers[0].mlp)
    # plain buffers: no autograd graph back to the bf16 weights (it kept them alive), so the
    # patched model deep-copies and its eager calls take the ops' direct path
    for name, b in model.model.layers[0].mlp.named_buffers():
        assert b.grad_fn is None and not b.requires_grad, name
    with torch.no_grad():
        assert torch.equal(copy.deepcopy(model)(tokens).logits, got)
    return model


@pytest.mark.parametrize("family", FAMILIES)
def test_patched_bf16_generates_the_same_tokens(tmp_path, family):
    check_patched_bf16_generates_the_same_tokens(tmp_path, family)


@pytest.mark.parametrize("fmt", ["fp8_block128", "nvfp4"])
def test_patched_quantized_logits_within_tolerance(tmp_path, fmt):
    check_patched_quantized_logits_within_tolerance(tmp_path, fmt)


def test_modules_it_cannot_handle_are_listed(tmp_path):
    from transformers.models.llama.modeling_llama import LlamaMLP

    model = make_causal_lm(tmp_path / "m", "llama")
    narrow = copy.deepcopy(model.config)
    narrow.intermediate_size = 320  # no multiple of 128
    model.model.layers[1].mlp = LlamaMLP(narrow).to(torch.bfloat16)
    report = patch_model(model, weight_format="fp8_block128")
    assert report.swapped == ["model.layers.0.mlp"]
    assert set(report.skipped) == {"model.layers.1.mlp"}
    assert "I = 320 is not a multiple of" in report.skipped["model.layers.1.mlp"]
    assert isinstance(model.model.layers[1].mlp, LlamaMLP)


def check_from_pretrained_and_save_pretrained(tmp_path, fmt, family, device="cpu"):
    """A packed checkpoint loads through from_pretrained (as stored, no bf16 detour), matches the
    unpacked model, and save_pretrained writes one that verifies and loads again."""
    from transformers import AutoModelForCausalLM

    src, dst = tmp_path / "src", tmp_path / "packed"
    make_causal_lm(src, family)
    convert(src, dst, weight_format=fmt, progress=False)
    # the unpacked model as transformers loads it (a model built in fp32 and cast to bf16 differs
    # slightly: its rotary inv_freq buffer is cast too)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16, device_map=device)
    loaded = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.bfloat16, device_map=device)
    assert loaded.model.embed_tokens.weight.dtype == torch.bfloat16
    mlp = loaded.model.layers[1].mlp
    assert isinstance(mlp, FusedSwiGLUMLP) and mlp.weight_format == fmt
    packed = swiglu_fused.weight_packing.packed_checkpoint.PackedCheckpoint(dst)
    held = mlp.gate_up_interleaved.tensors()  # (the packed format's order, whatever order the module holds)
    for name, t in packed.module("model.layers.1.mlp")[0].items():  # loaded as stored, no bf16 detour
        got = held[name]
        assert got.device.type == device and got.dtype == t.dtype
        assert torch.equal(got.cpu().view(torch.uint8), t.view(torch.uint8))
    tokens = _tokens(1).to(device)
    with torch.no_grad():
        expected, got = model(tokens).logits, loaded(tokens).logits
    assert _rel(got, expected) < LOGITS_BOUND.get(fmt, 0.01)
    if fmt == "bf16":
        assert torch.equal(_generate(loaded, tokens), _generate(model, tokens))
    loaded.save_pretrained(tmp_path / "again")
    assert swiglu_fused.verify(tmp_path / "again").ok
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "again", device_map=device)
    with torch.no_grad():
        assert torch.equal(again(tokens).logits, got)
    return loaded


FROM_PRETRAINED_CASES = [("bf16", "qwen3"), ("nvfp4", "qwen3")] + [("fp8_block128", f) for f in FAMILIES]


@pytest.mark.parametrize("fmt,family", FROM_PRETRAINED_CASES)
def test_from_pretrained_loads_packed_checkpoint_and_saves_it_again(tmp_path, fmt, family):
    check_from_pretrained_and_save_pretrained(tmp_path, fmt, family)


def check_patched_model_saves_and_loads_again(tmp_path, fmt, family, device="cpu"):
    """save_pretrained of a patch_model'd model writes a packed checkpoint (config included) that
    verifies and loads as the same model."""
    from transformers import AutoModelForCausalLM

    make_causal_lm(tmp_path / "src", family)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "src", dtype=torch.bfloat16, device_map=device)
    report = patch_model(model, weight_format=fmt)
    assert len(report.swapped) == 2
    model.save_pretrained(tmp_path / "saved")
    assert swiglu_fused.verify(tmp_path / "saved").ok
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved", dtype=torch.bfloat16, device_map=device)
    assert isinstance(loaded.model.layers[0].mlp, FusedSwiGLUMLP)
    for (name, a), (_, b) in zip(model.model.layers[1].mlp.state_dict().items(),
                                 loaded.model.layers[1].mlp.state_dict().items()):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
    tokens = _tokens(2).to(device)
    with torch.no_grad():
        assert torch.equal(loaded(tokens).logits, model(tokens).logits)
    return loaded


@pytest.mark.parametrize("fmt,family", [("fp8_block128", "llama"), ("nvfp4", "gemma"), ("bf16", "phi3")])
def test_patched_model_saves_and_loads_again(tmp_path, fmt, family):
    check_patched_model_saves_and_loads_again(tmp_path, fmt, family)


def test_import_registers_without_importing_transformers(tmp_path):
    """`import swiglu_fused` does not pay for importing transformers, yet from_pretrained of a packed
    checkpoint in the same process builds the fused modules (registration on transformers' import)."""
    import subprocess
    import sys

    src, dst = tmp_path / "src", tmp_path / "packed"
    make_causal_lm(src, "llama")
    convert(src, dst, weight_format="fp8_block128", progress=False)
    code = f"""
import sys
import swiglu_fused
assert "transformers" not in sys.modules, "import swiglu_fused imported transformers"
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained({str(dst)!r})
print(type(model.model.layers[0].mlp).__name__)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "FusedSwiGLUMLP"
