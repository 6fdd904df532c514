"""The fp8 cases of tests/test_whole_model_matrix.py on the GPU path: each producer's FP8
checkpoint (transformers' fine-grained FP8 with float32 and ue8m0 scales, compressed-tensors FP8
block; LLaMA, Qwen3 and Gemma shapes, hidden 128 and 320) converted, then loaded on CUDA (MLPs on
the sm90 kernels, attention on PackedLinear: quant_x + the down GEMM) and compared with the same
converted checkpoint on the CPU reference, which the CPU matrix holds to the source. transformers
cannot load the FP8 sources themselves on this machine (with CUDA present its FP8 integration
fetches a kernel from the hub)."""

import pytest
import torch

import swiglu_fused  # noqa: F401  (registers the swiglu_fused quantization method)
from swiglu_fused import convert
from swiglu_fused.linear import PackedLinear

from test_whole_model_matrix import CASES, LOGITS_BOUND, MARGIN, _greedy, _load, _make_source, _tokens
from .tolerance import rel_frobenius

FP8_CASES = [c for c in CASES if c.weight_format == "fp8_block128"]


@pytest.mark.parametrize("case", FP8_CASES, ids=[c.id for c in FP8_CASES])
def test_fp8_matrix_case_on_cuda_is_its_cpu_reference(tmp_path, case):
    if case.producer.startswith("ct_"):
        pytest.importorskip("compressed_tensors", reason="compressed-tensors makes this case's source")
    _, src = _make_source(tmp_path, case, None)
    dst = tmp_path / "dst"
    report = convert(src, dst, progress=False)
    assert report.repacked == 6 and report.linears_repacked == 8, report.summary()
    model, info = _load(dst, device_map="cuda")
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    on_cpu, _ = _load(dst)
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.q_proj, PackedLinear) and layer.self_attn.q_proj.weight.is_cuda
    assert layer.mlp.backend == "sm90", repr(layer.mlp)
    tokens = _tokens()
    with torch.no_grad():
        got, expected = model(tokens.cuda()).logits.cpu(), on_cpu(tokens).logits
    assert torch.isfinite(got).all()
    # the same quantization on both sides (e4m3 x per 128, e4m3 h); the kernels accumulate in
    # Hopper's fp8 MMA in another order (DESIGN §4)
    assert rel_frobenius(got, expected) < LOGITS_BOUND["fp8_block128"] / 2
    _greedy(model, on_cpu, MARGIN["fp8_block128"])
