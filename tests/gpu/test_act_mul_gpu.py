"""bf16 gate_up on cuBLAS's GEMM + the sm90 act·mul (DISPATCH D53): the kernel against the reference's
epilogue on the same GEMM output, poisoned outputs; ops.gate_up and the whole MLP on that path
against the reference; CUDA graph replay."""

import pytest
import torch

from swiglu_fused.kernels import cublas, dispatch, ops, reference
from . import premises
from .test_gate_up_gpu import make_operands
from .test_layer_gpu import _mlp, _reference
from .tolerance import assert_bf16_close, rel_frobenius

pytest.importorskip("cutlass")

ACTS = ["silu", "gelu_tanh"]


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("m,inter", [(1, 128), (3, 1536), (100, 3584), (1024, 1536), (577, 14336)])
def test_act_mul_against_the_reference_epilogue(m, inter, act):
    """Every element of h written (NaN poison first) and within a bf16 rounding of the reference's
    fp32 epilogue on the same y (the kernel's exp and reciprocal are the fast approximations the
    fused epilogues use)."""
    from swiglu_fused.kernels.sm90 import act_mul

    g = torch.Generator(device="cuda").manual_seed(m + inter)
    y = (torch.randn(m, 2 * inter, device="cuda", generator=g) * 3).to(torch.bfloat16)
    h = torch.full((m, inter), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert act_mul.takes(y)
    act_mul.act_mul(y, act, out=h)
    ref, _ = reference.gate_up_epilogue(y, act=act, h_format="bf16")
    assert not h.isnan().any()
    assert rel_frobenius(h, ref) <= 2e-3
    # the gate and up columns are the right ones: a swapped pair would be far off
    swapped = y.view(m, -1, 2, 128).flip(2).reshape(m, -1)
    assert rel_frobenius(reference.gate_up_epilogue(swapped, act=act, h_format="bf16")[0], ref) > 0.5


def test_act_mul_propagates_nan():
    from swiglu_fused.kernels.sm90 import act_mul

    y = torch.ones(2, 256, dtype=torch.bfloat16, device="cuda")
    y[0, 5] = float("nan")  # a gate
    y[1, 128 + 7] = float("nan")  # an up
    h = act_mul.act_mul(y)
    assert h[0, 5].isnan() and h[1, 7].isnan() and h.isnan().sum() == 2


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("m,hidden,inter", [(600, 8192, 3584), (1, 576, 1536), (100, 2048, 8192),
                                            (1024, 1040, 1536)])
def test_ops_gate_up_on_cublas(monkeypatch, m, hidden, inter, act):
    """ops.gate_up where the dispatch picks cuBLAS + act·mul (forced at every M here), within DESIGN
    §4's bf16 tolerance of the reference."""
    monkeypatch.setattr(dispatch, "BF16_GATE_UP", "cublas")
    args = make_operands(m, hidden, inter, "bf16", seed=m)
    assert dispatch.gate_up_backend(args["x"], args["weight"], None, None, None, 128, act, "bf16")[0] == dispatch.CUBLAS
    h, hs = ops.gate_up(**args, act=act)
    assert hs is None and h.shape == (m, inter) and h.is_contiguous()
    assert_bf16_close(h, reference.gate_up(**args, act=act)[0])


def test_dispatch_takes_cublas_at_8192x3584_just_past_a_wave():
    """D53's rule on this GPU's SMs: where it fires, ops.gate_up runs cuBLAS's GEMM (not the fused
    kernel) and the result is the reference's within tolerance; fp8 h and the fp8 mainloop never."""
    if not premises.bf16_on_cublas_at_8192x3584(600, sms=torch.cuda.get_device_properties(0).multi_processor_count):
        pytest.skip("the rule does not fire on this GPU's SM count")
    args = make_operands(600, 8192, 3584, "bf16", seed=3)
    calls = []
    real = cublas.gate_up_gemm
    try:
        cublas.gate_up_gemm = lambda *a: calls.append(1) or real(*a)
        h, _ = ops.gate_up(**args)
    finally:
        cublas.gate_up_gemm = real
    assert calls and not h.isnan().any()
    assert_bf16_close(h, reference.gate_up(**args)[0])
    assert dispatch.gate_up_backend(args["x"], args["weight"], None, None, None, 128, "silu",
                                    "fp8_group128")[0] == dispatch.SM90


def test_mlp_on_cublas_gate_up_in_a_cuda_graph(monkeypatch):
    """The bf16 MLP with gate_up on cuBLAS + act·mul: within tolerance of the reference MLP, and a
    CUDA graph of it replays the eager output bit for bit (poisoned first)."""
    monkeypatch.setattr(dispatch, "BF16_GATE_UP", "cublas")
    mlp = _mlp(2048, 8192, "bf16")
    x = torch.randn(300, 2048, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        y = mlp(x)
        graph, static_x = torch.cuda.CUDAGraph(), x.clone()
        with torch.cuda.graph(graph):
            static_y = mlp(static_x)
        static_y.fill_(float("nan"))
        graph.replay()
    assert_bf16_close(y, _reference(mlp, x).cuda())
    assert torch.equal(static_y, y)


@pytest.mark.parametrize("act", ACTS)
def test_scaled_act_mul_applies_the_global_scale_multipliers(act):
    """act_mul's ``multipliers`` (y over a weight dequantized to the true one · 2^-UNSHIFT): gate and
    up times their own multiplier · 2^UNSHIFT before the act·mul (unequal, so a swap shows)."""
    from swiglu_fused.kernels.sm90 import act_mul

    g = torch.Generator(device="cuda").manual_seed(7)
    y = (torch.randn(300, 2 * 1536, device="cuda", generator=g) * 2.0 ** -act_mul.UNSHIFT).to(torch.bfloat16)
    mult = torch.tensor([0.75, 3.0], device="cuda")
    h = torch.full((300, 1536), float("nan"), dtype=torch.bfloat16, device="cuda")
    act_mul.act_mul(y, act, out=h, multipliers=mult)
    scaled = (y.float().view(300, -1, 2, 128) * (mult * 2.0 ** act_mul.UNSHIFT).view(2, 1)).flatten(1)
    ref, _ = reference.gate_up_epilogue(scaled, act=act, h_format="bf16")
    assert not h.isnan().any() and rel_frobenius(h, ref) <= 2e-3
    swapped, _ = reference.gate_up_epilogue((y.float().view(300, -1, 2, 128) * (mult.flip(0) * 2.0 ** act_mul.UNSHIFT)
                                             .view(2, 1)).flatten(1), act=act, h_format="bf16")
    assert rel_frobenius(swapped, ref) > 0.1


@pytest.mark.parametrize("tile_major", [False, True])
@pytest.mark.parametrize("m,hidden,inter", [(1500, 8192, 3584), (1409, 576, 1536)])
def test_ops_gate_up_nvfp4_prefill_on_cublas(monkeypatch, m, hidden, inter, tile_major):
    """An nvfp4 gate_up at a prefill M (dequantized for the call) on cuBLAS + the scaled act·mul: within
    the nvfp4 tests' tolerance of the reference, unequal gate/up global scales, both weight orders."""
    from swiglu_fused.kernels import nvfp4_layout
    from .test_nvfp4_gpu import TOL, gate_up_operands

    monkeypatch.setattr(dispatch, "BF16_GATE_UP", "cublas")
    x, w, ws, gs = gate_up_operands(m, hidden, inter, seed=m)
    want = reference.gate_up(x, w, ws, None, gs)[0]
    if tile_major:
        w, ws = nvfp4_layout.to_tile_major(w, ws)
    assert dispatch.gate_up_backend(x, w, ws, None, gs, 128, "silu", "bf16", tile_major)[0] == dispatch.CUBLAS
    h, _ = ops.gate_up(x, w, ws, None, gs, tile_major=tile_major)
    assert rel_frobenius(h, want) <= TOL
