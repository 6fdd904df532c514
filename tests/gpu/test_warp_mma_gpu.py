"""The nvfp4 warp-MMA kernels (kernels/sm90/warp_mma.py, DISPATCH D33: tile-major weights at M ≤ 32)
against the reference: gate_up with both activations and unequal gate/up global scales, down with
and without a residual, K split over CTAs or not, outputs poisoned first (their blocks filled with
NaN before the op allocates them); bit-identical on a second call and in a CUDA graph; the module
dispatches to them."""

import pytest
import torch

from swiglu_fused.kernels import dispatch, dispatch_nvfp4, nvfp4_layout, ops, reference

from .test_nvfp4_gpu import ACTS, TOL, _cpu_reference, _mlp, down_operands, gate_up_operands
from .tolerance import assert_bf16_close

pytest.importorskip("cutlass")

M_DECODE = [1, 3, 8, 9, 16, 17, 32]
# (H, I): gate_up's K = H and down's K = I; 512 runs unsplit (k_cta 512), 384 in three 128-column
# CTAs, 768 in three of 256
SHAPES = [(4096, 14336), (8192, 3584), (2048, 8192), (512, 384), (768, 1536)]


@pytest.fixture(autouse=True)
def every_m_the_kernel_takes(monkeypatch):
    """Up to its 32 tokens at every width, whatever dispatch_nvfp4.WARP_MMA_M and WARP_MMA_32_MAX_SIDE (measured
    bounds) say."""
    from swiglu_fused.kernels.sm90 import warp_mma

    monkeypatch.setattr(dispatch_nvfp4, "WARP_MMA_M", dict.fromkeys(("gate_up", "down"), warp_mma.MAX_TOKENS))
    monkeypatch.setattr(dispatch_nvfp4, "WARP_MMA_32_MAX_SIDE", 0)


@pytest.fixture(params=[8, 4], ids=["warps8", "warps4"])
def warps(request, monkeypatch):
    """Both CTA sizes (WarpMmaConfig.warps), whichever the dispatch picks."""
    monkeypatch.setattr(dispatch_nvfp4, "WARP_MMA_WARPS", request.param)
    return request.param


def _poisoned(*shape):
    """Fill a block of this size with NaN and free it: the op's next torch.empty of the size takes it."""
    t = torch.full(shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    del t


@pytest.mark.parametrize("hidden,inter", SHAPES)
@pytest.mark.parametrize("m", M_DECODE)
@pytest.mark.parametrize("act", ACTS)
def test_gate_up_matches_the_reference(hidden, inter, m, act, warps):
    x, w, ws, gs = gate_up_operands(m, hidden, inter, seed=m + hidden + inter)
    tw, ts = nvfp4_layout.to_tile_major(w, ws)
    backend, cfg = dispatch.gate_up_backend(x, tw, ts, None, gs, 128, act, "bf16", True)
    assert backend == dispatch.SM90 and cfg == dispatch_nvfp4.warp_mma_config("gate_up", m, 2 * inter, hidden, True, act)
    _poisoned(m, inter)
    h, hs = ops.gate_up(x, tw, ts, None, gs, interleave=128, act=act, h_format="bf16", tile_major=True)
    ref, _ = reference.gate_up(x, w, ws, None, gs, interleave=128, act=act, h_format="bf16")
    assert hs is None or hs.numel() == 0
    assert_bf16_close(h, ref, TOL)
    again = ops.gate_up(x, tw, ts, None, gs, interleave=128, act=act, h_format="bf16", tile_major=True)[0]
    assert torch.equal(again, h)


@pytest.mark.parametrize("hidden,inter", SHAPES)
@pytest.mark.parametrize("m", M_DECODE)
@pytest.mark.parametrize("residual", [False, True])
def test_down_matches_the_reference(hidden, inter, m, residual, warps):
    h, w, ws, gs = down_operands(m, hidden, inter, seed=5 * m + inter)
    res = torch.randn(m, hidden, device="cuda").to(torch.bfloat16) if residual else None
    tw, ts = nvfp4_layout.to_tile_major(w, ws)
    backend, cfg = dispatch.down_backend(h, tw, ts, None, gs, res, torch.bfloat16, True)
    assert backend == dispatch.SM90 and cfg == dispatch_nvfp4.warp_mma_config("down", m, hidden, inter, True,
                                                                       residual=residual)
    _poisoned(m, hidden)
    y = ops.down(h, tw, ts, None, gs, residual=res, tile_major=True)
    assert_bf16_close(y, reference.down(h, w, ws, None, gs, residual=res), TOL)
    assert torch.equal(ops.down(h, tw, ts, None, gs, residual=res, tile_major=True), y)


@pytest.mark.parametrize("m", [16, 32])
def test_a_cuda_graph_replays_the_same_bits(m):
    """Captured with its partials' buffer and a counter buffer of the capture's own (kept at zero:
    the conftest checks it after the test), replayed twice with new inputs."""
    x, w, ws, gs = gate_up_operands(m, 2048, 8192, seed=11)
    tw, ts = nvfp4_layout.to_tile_major(w, ws)
    h, w2, ws2, gs2 = down_operands(m, 2048, 8192, seed=12)
    tw2, ts2 = nvfp4_layout.to_tile_major(w2, ws2)

    def run():
        hh = ops.gate_up(x, tw, ts, None, gs, interleave=128, h_format="bf16", tile_major=True)[0]
        return hh, ops.down(h, tw2, ts2, None, gs2, tile_major=True)

    run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for seed in (1, 2):
        x.copy_(torch.randn(x.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)))
        graph.replay()
        want = run()
        assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])


@pytest.mark.parametrize("m", [1, 16, 32])
def test_the_module_runs_them_and_matches_the_reference(m, monkeypatch):
    from swiglu_fused.kernels.sm90 import warp_mma

    launched = []
    launch = warp_mma._launch
    monkeypatch.setattr(warp_mma, "_launch", lambda config, *a: launched.append(config.epilogue) or launch(config, *a))
    mlp = _mlp()
    x = torch.randn(m, 2048, device="cuda").to(torch.bfloat16)
    assert_bf16_close(mlp(x), _cpu_reference(mlp, x).cuda(), 1e-2)
    assert {"gate_up", "down"} <= set(launched)


def test_programmatic_dependent_launch_gives_the_same_bits(monkeypatch):
    """gate_up then down launched with PDL (dispatch_nvfp4.WARP_MMA_PDL), eagerly and in a CUDA graph: the
    same bits as without (the same sums in the same order; down waits for gate_up's h)."""
    monkeypatch.setattr(dispatch_nvfp4, "WARP_MMA_PDL", False)
    mlp = _mlp()
    x = torch.randn(16, 2048, device="cuda").to(torch.bfloat16)
    want = mlp(x)
    monkeypatch.setattr(dispatch_nvfp4, "WARP_MMA_PDL", True)
    pdl = _mlp()
    assert torch.equal(pdl(x), want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = pdl(x)
    graph.replay()
    assert torch.equal(out, want)


@pytest.mark.parametrize("m", [1, 16])
def test_late_trigger_gives_the_same_bits(m, monkeypatch):
    """gate_up launching down only as its CTAs leave (D58: at 2048×4096 down's grid is 64 CTAs, within
    half the SMs, and gate_up's 128 fill one an SM), eagerly and in a CUDA graph: the same bits as the
    trigger after the k loop, and the reference's values."""
    from swiglu_fused.kernels.sm90 import warp_mma

    launched = []
    launch = warp_mma._launch
    monkeypatch.setattr(warp_mma, "_launch", lambda config, *a: launched.append(config) or launch(config, *a))
    x = torch.randn(m, 2048, device="cuda").to(torch.bfloat16)
    monkeypatch.setattr(dispatch_nvfp4, "WARP_MMA_LATE_TRIGGER_SHARE", 0)
    want = _mlp()(x)
    assert not any(c.late_trigger for c in launched)
    monkeypatch.setattr(dispatch_nvfp4, "WARP_MMA_LATE_TRIGGER_SHARE", 0.5)
    late = _mlp()
    _poisoned(m, 4096)
    assert torch.equal(late(x), want)
    assert {c.epilogue for c in launched if c.late_trigger} == {"gate_up"}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = late(x)
    out.fill_(float("nan"))
    graph.replay()
    assert torch.equal(out, want)
    assert_bf16_close(want, _cpu_reference(late, x).cuda(), 1e-2)

