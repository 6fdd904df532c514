"""patch_model on the GPU (issue 21 item 4): the transformers FP8 model that from_pretrained builds
on CUDA (FP8Linear holding the checkpoint's e4m3 bytes) is patched by moving those bytes, then runs
the sm90 kernels (MLPs) and quant_x + the down GEMM (attention, PackedLinear), and matches the same
patched model on the CPU reference, which tests/test_patch_quantized.py holds to transformers'
own computation of the source."""

import copy

import pytest
import torch

import swiglu_fused  # noqa: F401  (registers the swiglu_fused quantization method)
from swiglu_fused import FusedSwiGLUMLP, patch_model
from swiglu_fused.linear import PackedLinear

from test_whole_model import ATTENTION, FP8_DATA, LOGITS_BOUND, _generate, _load, _rel, _tokens


def test_patched_fp8_model_runs_the_sm90_kernels_and_matches_its_cpu_reference(tmp_path):
    model = _load(FP8_DATA, device_map="cuda")
    gate = model.model.layers[0].mlp.gate_proj
    if type(gate).__name__ != "FP8Linear":
        pytest.fail(f"transformers built {type(gate).__name__} on CUDA, not its FP8Linear: this test needs "
                    "the e4m3 bytes it keeps on a GPU of compute capability >= 8.9")
    source_weight = gate.weight.detach().clone()
    report = patch_model(model)
    assert report.weight_format == "fp8_block128" and report.moved == 14 and report.requantized == 0
    assert sorted(report.linears) == ATTENTION and not report.left and not report.skipped
    mlp = model.model.layers[0].mlp
    assert isinstance(mlp, FusedSwiGLUMLP) and mlp.backend == "sm90"
    q_proj = model.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj, PackedLinear) and q_proj.weight.is_cuda
    # bytes moved, not re-quantized: gate's first 128 rows are the packed rows [0, 128) at g = 128
    packed = mlp.gate_up_interleaved.weight[:128]
    assert torch.equal(packed.view(torch.uint8), source_weight[:128].view(torch.uint8))

    on_cpu = copy.deepcopy(model).to("cpu")  # the same patched model on the reference ops
    assert on_cpu.model.layers[0].mlp.backend == "reference"
    tokens = _tokens()
    with torch.no_grad():
        got, expected = model(tokens.cuda()).logits.cpu(), on_cpu(tokens).logits
    assert _rel(got, expected) < LOGITS_BOUND["fp8_block128"] / 2, _rel(got, expected)
    assert torch.equal(_generate(model, tokens.cuda()).cpu(), _generate(on_cpu, tokens))

    # and the source as transformers computes it when it dequantizes (its CUDA FP8 path needs a kernel
    # fetched from the hub, which this machine cannot reach)
    from transformers import FineGrainedFP8Config

    source = _load(FP8_DATA, quantization_config=FineGrainedFP8Config(dequantize=True))
    with torch.no_grad():
        reference = source(tokens).logits
    assert _rel(got, reference) < LOGITS_BOUND["fp8_block128"], _rel(got, reference)

    model.save_pretrained(tmp_path / "packed")
    loaded = _load(tmp_path / "packed", device_map="cuda")
    with torch.no_grad():
        assert _rel(loaded(tokens.cuda()).logits.cpu(), got) < 1e-3
