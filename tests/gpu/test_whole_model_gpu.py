"""Whole-model correctness on the GPU path (issue 21): the packed non-MLP linears (PackedLinear)
run quant_x + the down GEMM on CUDA, checked against the same module on the CPU reference, and a
converted transformers FP8 checkpoint runs on CUDA as transformers runs its source there."""

import pytest
import torch

import swiglu_fused  # noqa: F401  (registers the swiglu_fused quantization method)
from swiglu_fused import convert
from swiglu_fused.linear import PackedLinear

from test_whole_model import FP8_DATA, LOGITS_BOUND, _generate, _load, _rel, _tokens
from .tolerance import rel_frobenius


@pytest.mark.parametrize("fmt", ["fp8_block128", "bf16", "nvfp4"])
@pytest.mark.parametrize("m", [1, 16, 100, 1024])
@pytest.mark.parametrize("in_features,out_features,bias", [(4096, 1024, False), (576, 1536, True),
                                                           (3584, 8192, False)])
def test_packed_linear_on_cuda_is_its_cpu_reference(fmt, m, in_features, out_features, bias):
    g = torch.Generator().manual_seed(m + in_features)
    w = torch.randn(out_features, in_features, generator=g) * 0.02
    b = torch.randn(out_features, generator=g).to(torch.bfloat16) if bias else None
    layer = PackedLinear.from_weight(w, b, weight_format=fmt)
    x = torch.randn(m, in_features, generator=g).to(torch.bfloat16)
    ref = layer(x)  # CPU: the reference ops
    out = layer.cuda()(x.cuda())
    assert out.dtype == torch.bfloat16 and out.shape == (m, out_features)
    assert torch.isfinite(out).all()
    # fp8: the kernel quantizes x and accumulates in Hopper's fp8 MMA (DESIGN §4); bf16 / nvfp4
    # differ by accumulation order only
    assert rel_frobenius(out.cpu(), ref) < (2e-2 if fmt == "fp8_block128" else 1e-2)


def test_converted_fp8_checkpoint_runs_the_whole_model_on_cuda(tmp_path):
    """The converted transformers FP8 checkpoint on CUDA (attention on PackedLinear, MLPs on the sm90
    kernels) against the same checkpoint on the CPU reference, which the CPU suite holds to
    transformers loading the source (tests/test_whole_model.py). transformers cannot load the
    source on this machine: with CUDA present its FP8 integration fetches a kernel from the hub."""
    dst = tmp_path / "dst"
    convert(FP8_DATA, dst, progress=False)
    model = _load(dst, device_map="cuda")
    on_cpu = _load(dst)
    assert isinstance(model.model.layers[0].self_attn.q_proj, PackedLinear)
    assert model.model.layers[0].mlp.backend == "sm90"
    tokens = _tokens()
    with torch.no_grad():
        got, expected = model(tokens.cuda()).logits.cpu(), on_cpu(tokens).logits
    assert _rel(got, expected) < LOGITS_BOUND["fp8_block128"] / 2, _rel(got, expected)
    assert torch.equal(_generate(model, tokens.cuda()).cpu(), _generate(on_cpu, tokens))


NVFP4_DATA = FP8_DATA.parent / "tiny-llama-nvfp4"  # compressed-tensors' own NVFP4A16 (make_nvfp4_checkpoint.py)


def test_converted_nvfp4_checkpoint_runs_the_whole_model_on_cuda(tmp_path):
    """A compressed-tensors NVFP4 checkpoint, converted (bytes moved), on CUDA: MLPs and attention
    on the W4A16 kernels, against the same checkpoint on the CPU reference (which the CPU suite
    holds to compressed-tensors loading the source: tests/test_whole_model.py). compressed-tensors
    is not installed on this machine, hence the committed checkpoint."""
    dst = tmp_path / "dst"
    report = convert(NVFP4_DATA, dst, progress=False)
    assert report.weight_format == "nvfp4" and report.quantized == 0
    model = _load(dst, device_map="cuda")
    on_cpu = _load(dst)
    assert isinstance(model.model.layers[0].self_attn.q_proj, PackedLinear)
    assert all(layer.mlp.backend == "sm90" for layer in model.model.layers)
    tokens = _tokens()
    with torch.no_grad():
        got, expected = model(tokens.cuda()).logits.cpu(), on_cpu(tokens).logits
    assert _rel(got, expected) < 1e-2, _rel(got, expected)  # the same W4A16 numerics, another summation order
    assert torch.equal(_generate(model, tokens.cuda()).cpu(), _generate(on_cpu, tokens))
