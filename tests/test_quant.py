"""Quantizers follow the real producers' conventions bit for bit."""

import types

import pytest
import torch

from swiglu_fused import quant


def _bytes(t):
    return t.contiguous().view(torch.uint8)


def _transformers_fp8(w, scale_fmt="float"):
    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import Fp8Quantize

    cfg = FineGrainedFP8Config(weight_block_size=[128, 128], scale_fmt=scale_fmt)
    out = Fp8Quantize(types.SimpleNamespace(quantization_config=cfg))._quantize_one("p.weight", w)
    return out["p.weight"], out["p.weight_scale_inv"]


@pytest.mark.parametrize("shape", [(128, 128), (384, 256), (256, 640)])
def test_fp8_block_matches_transformers_quantizer(shape):
    w = (torch.randn(*shape) * torch.rand(shape[0], 1) * 4).to(torch.bfloat16)
    w[:128, :128] = 0  # an all-zero block keeps scale 1, as in transformers
    q, s = quant.quantize_fp8_block(w)
    tq, ts = _transformers_fp8(w)
    assert torch.equal(_bytes(q), _bytes(tq))
    assert torch.equal(s, ts)


def test_fp8_block_partial_blocks_dequantize_close():
    """transformers leaves non-multiple-of-128 matrices unquantized; we use partial blocks."""
    w = torch.randn(200, 330)
    q, s = quant.quantize_fp8_block(w)
    assert s.shape == (2, 3)
    back = quant.dequantize_fp8_block(q, s)
    assert ((back - w).norm() / w.norm()) < 0.04
    # the partial last block has its own amax: its largest element maps to ±448 exactly
    last = w[128:, 256:]
    assert quant.dequantize_fp8_block(q, s)[128:, 256:].abs().max() == pytest.approx(last.abs().max().item(), rel=1e-6)


def test_fp8_groups_scale_is_amax_over_448_and_saturates():
    x = torch.randn(5, 300) * 7
    q, s = quant.quantize_fp8_groups(x)
    assert s.shape == (5, 3)
    expected = torch.stack([x[:, i * 128:(i + 1) * 128].abs().amax(1) for i in range(3)], 1) / 448
    assert torch.equal(s, expected)
    assert q.float().abs().max() == 448  # each group's amax lands on the top code
    assert ((quant.dequantize_fp8_groups(q, s) - x).norm() / x.norm()) < 0.04


def test_fp8_groups_edge_values():
    x = torch.randn(3, 256)
    x[0, :128] = 0  # zero group: scale 1, zeros out
    x[1, 5] = float("nan")  # NaN in → NaN scale and NaN out, never silently 0
    x[2, 200] = 1e30  # huge value: finite scale, saturating codes, no inf
    q, s = quant.quantize_fp8_groups(x)
    assert s[0, 0] == 1 and torch.all(q[0, :128].float() == 0)
    assert s[1, 0].isnan() and q[1, :128].float().isnan().all()
    assert torch.isfinite(s[2]).all() and not q[2].float().isinf().any()
    assert q[2, 200].float() == 448


def test_to_e4m3_saturates():
    assert quant.to_e4m3(torch.tensor([1e6, -1e6])).float().tolist() == [448.0, -448.0]


def test_e2m1_rounds_half_to_even_and_keeps_negative_zero():
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.1, 7.0, -6.0])
    codes = quant._e2m1_codes(x.clamp(-6, 6))
    values = quant.unpack_e2m1((codes[0::2] | codes[1::2] << 4).view(1, -1)).view(-1)
    assert values.tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -0.0, 6.0, -6.0]
    assert codes[7] == 0b1000  # −0 like compressed-tensors and ModelOpt


def test_nvfp4_matches_compressed_tensors_compressor(tmp_path):
    """A checkpoint written by compressed-tensors: our quantizer gives its bytes, our dequantizer
    its decompression."""
    from compressed_tensors.compressors import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from safetensors.torch import load_file

    from conftest import _causal_lm, make_ct_nvfp4

    torch.manual_seed(1)
    model = _causal_lm("llama", 128, 384)
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    make_ct_nvfp4(tmp_path, model)
    sd = load_file(tmp_path / "model.safetensors")
    scheme = QuantizationConfig.model_validate(
        __import__("json").loads((tmp_path / "config.json").read_text())["quantization_config"]).config_groups["group_0"]
    for proj in ("model.layers.0.mlp.gate_proj", "model.layers.1.mlp.down_proj", "model.layers.0.self_attn.q_proj"):
        packed, scale, gs = quant.quantize_nvfp4(original[proj + ".weight"])
        assert torch.equal(gs, sd[proj + ".weight_global_scale"])
        assert torch.equal(_bytes(scale), _bytes(sd[proj + ".weight_scale"]))
        assert torch.equal(packed, sd[proj + ".weight_packed"])
        ct = NVFP4PackedCompressor.decompress(
            {k: sd[f"{proj}.{k}"] for k in ("weight_packed", "weight_scale", "weight_global_scale")}, scheme)["weight"]
        ours = quant.dequantize_nvfp4(packed, scale, gs)
        assert torch.equal(ct, ours.to(ct.dtype))


def test_nvfp4_multiplier_kind_dequantizes_the_same():
    w = torch.randn(32, 64)
    packed, s, gs = quant.quantize_nvfp4(w)
    a = quant.dequantize_nvfp4(packed, s, gs, divisor=True)
    b = quant.dequantize_nvfp4(packed, s, 1 / gs, divisor=False)
    assert torch.allclose(a, b, rtol=1e-6, atol=0)


def test_nvfp4_needs_even_columns():
    with pytest.raises(ValueError, match="even number of columns"):
        quant.quantize_nvfp4(torch.randn(4, 33))
