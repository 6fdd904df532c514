"""The reference ops compute the unfused MLP from the quantized operands."""

import pytest
import torch

from swiglu_fused import quant
from swiglu_fused.kernels import reference as R
from swiglu_fused.weight_packing import pack

ACTS = {"silu": torch.nn.functional.silu,
        "gelu_tanh": lambda t: 0.5 * t * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (t + 0.044715 * t ** 3)))}


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _weights(hidden, inter, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g) / s[1] ** 0.5 for s in ((inter, hidden), (inter, hidden), (hidden, inter))]


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("g", [1, 128])
def test_bf16_gate_up_is_act_gate_times_up(act, g):
    gate, up, _ = _weights(320, 256)
    x = torch.randn(7, 320).to(torch.bfloat16)
    p = pack.pack_gate_up(pack.quantize(gate, "bf16", "g"), pack.quantize(up, "bf16", "u"), g)
    h, scale = R.gate_up(x, p["weight"], interleave=g, act=act)
    xf, gb, ub = x.float(), gate.bfloat16().float(), up.bfloat16().float()
    expected = ACTS[act](xf @ gb.t()) * (xf @ ub.t())
    assert scale is None and h.dtype == torch.bfloat16
    assert _rel(h, expected) < 4e-3


def test_fp8_gate_up_uses_the_quantized_operands_exactly():
    gate, up, _ = _weights(200, 256)
    x = torch.randn(5, 200)
    xq, xs = R.quant_x(x)
    gq, uq = pack.quantize(gate, "fp8_block128", "g"), pack.quantize(up, "fp8_block128", "u")
    p = pack.pack_gate_up(gq, uq, 128)
    h, hs = R.gate_up(xq, p["weight"], p["weight_scale_inv"], xs, interleave=128, h_format="fp8_group128")
    xd = quant.dequantize_fp8_groups(xq, xs)
    expected = torch.nn.functional.silu(xd @ pack.dequantize(gq).t()) * (xd @ pack.dequantize(uq).t())
    eq, es = quant.quantize_fp8_groups(expected)
    assert h.dtype == torch.float8_e4m3fn and hs.shape == (5, 2)
    assert torch.allclose(hs, es, rtol=1e-5)
    assert (h.float() != eq.float()).float().mean() < 0.01  # fp32 summation order only


def test_nvfp4_gate_up_applies_separate_global_scales():
    gate, up, _ = _weights(64, 128)
    up = up * 50  # very different amax: a shared scale would be wrong for one half
    x = torch.randn(3, 64).to(torch.bfloat16)
    gq, uq = pack.quantize(gate, "nvfp4", "g"), pack.quantize(up, "nvfp4", "u")
    p = pack.pack_gate_up(gq, uq, 16)
    h, _ = R.gate_up(x, p["weight_packed"], p["weight_scale"], None,
                     R.runtime_global_scale(p["weight_global_scale"], "divisor"), interleave=16)
    expected = torch.nn.functional.silu(x.float() @ pack.dequantize(gq).t()) * (x.float() @ pack.dequantize(uq).t())
    assert _rel(h, expected) < 4e-3


def test_down_adds_the_residual_in_fp32():
    _, _, down = _weights(96, 128)
    h = torch.randn(4, 128).to(torch.bfloat16)
    res = torch.randn(4, 96).to(torch.bfloat16)
    y = R.down(h, down.to(torch.bfloat16), residual=res)
    expected = h.float() @ down.bfloat16().float().t() + res.float()
    assert y.dtype == torch.bfloat16 and _rel(y, expected) < 4e-3


@pytest.mark.parametrize("fmt,bound", [("bf16", 0.01), ("fp8_block128", 0.08), ("nvfp4", 0.2)])
def test_mlp_matches_the_unfused_float_mlp(fmt, bound):
    gate, up, down = _weights(192, 384)
    x = torch.randn(2, 3, 192).to(torch.bfloat16)
    kind = "divisor" if fmt == "nvfp4" else None
    gq, uq, dq = (pack.quantize(w, fmt, n, kind) for w, n in zip((gate, up, down), "gud"))
    y = R.mlp(x, pack.pack_gate_up(gq, uq, 128), dq.tensors, weight_format=fmt, interleave=128,
              global_scale_kind=kind)
    xf = x.float()
    expected = (torch.nn.functional.silu(xf @ gate.t()) * (xf @ up.t())) @ down.t()
    assert y.shape == x.shape and y.dtype == x.dtype
    assert _rel(y, expected) < bound


def test_nan_in_x_gives_nan_out():
    gate, up, down = _weights(128, 128)
    x = torch.randn(2, 128)
    x[1, 3] = float("nan")
    gq, uq, dq = (pack.quantize(w, "fp8_block128", n) for w, n in zip((gate, up, down), "gud"))
    y = R.mlp(x, pack.pack_gate_up(gq, uq, 128), dq.tensors, weight_format="fp8_block128")
    assert not y[0].isnan().any() and y[1].isnan().all()


def test_unknown_activation_and_output_are_named():
    with pytest.raises(ValueError, match="act: unknown activation 'relu'"):
        R.gate_up(torch.randn(1, 4), torch.randn(2, 4).bfloat16(), interleave=1, act="relu")
    with pytest.raises(ValueError, match="h_format"):
        R.gate_up(torch.randn(1, 4), torch.randn(2, 4).bfloat16(), interleave=1, h_format="int8")
