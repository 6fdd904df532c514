"""nvfp4 (W4A16) sm_90a kernels against the reference (issue 22): gate_up with both activations and
unequal gate/up global scales, down with and without a residual, outputs poisoned first; the
whole module on the kernels, in a CUDA graph and under torch.compile."""

import dataclasses

import pytest
import torch

from swiglu_fused import FusedSwiGLUMLP, quant
from swiglu_fused.kernels import dispatch, dispatch_nvfp4, ops, reference
from swiglu_fused.linear import PackedLinear

from . import premises
from .tolerance import assert_bf16_close, rel_frobenius

pytest.importorskip("cutlass")

M_ISSUE = [1, 3, 16, 64, 100, 1024, 4096]
# (H, I): H = 576 is 9 k tiles of 64 (the nvfp4 kernels need K % 64 == 0); H = 1040 is not: the
# reference runs, with a warning
SHAPES = [(4096, 14336), (8192, 3584), (576, 1536), (2048, 8192)]
ACTS = ["silu", "gelu_tanh"]
TOL = 5e-3  # h and y within bf16 rounding of the reference (relative Frobenius)


def _sms() -> int:
    from swiglu_fused.kernels.sm90 import schedule

    return schedule.sm_count(torch.device("cuda"))


def _nvfp4(w: torch.Tensor):
    """Quantize like compressed-tensors (divisor global scale); returns (packed, scale, divisor)."""
    return quant.quantize_nvfp4(w)


def gate_up_operands(m, hidden, inter, seed, equal_scales=False):
    """x bf16 and a packed gate_up weight whose gate and up halves have their own global scales
    (magnitudes 4x apart, so that a swapped pair shows), as multipliers [2]."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(m, hidden, device="cuda", generator=g)
         * torch.exp2(torch.randint(-3, 4, (m, 1), device="cuda", generator=g).float())).to(torch.bfloat16)
    gate = torch.randn(inter, hidden, device="cuda", generator=g) * 0.05
    up = torch.randn(inter, hidden, device="cuda", generator=g) * (0.05 if equal_scales else 0.2)
    (gp, gs, gd), (upk, us, ud) = _nvfp4(gate), _nvfp4(up)
    from swiglu_fused.interleave import interleave_rows

    weight = interleave_rows(gp, upk, 128)
    scale = interleave_rows(gs, us, 128)
    multipliers = torch.cat([1.0 / gd, 1.0 / ud]).float()
    return x, weight.contiguous(), scale.contiguous(), multipliers


def _kernel_gate_up(cfg, x, w, ws, gs):
    from swiglu_fused.kernels.sm90 import gate_up as k

    h = torch.full((x.shape[0], w.shape[0] // 2), float("nan"), dtype=torch.bfloat16, device="cuda")
    return k.gate_up(cfg, x, w, ws, None, gs, out=(h, None))[0]


@pytest.mark.parametrize("hidden,inter", SHAPES)
@pytest.mark.parametrize("m", M_ISSUE)
@pytest.mark.parametrize("act", ACTS)
def test_gate_up_matches_the_reference(hidden, inter, m, act):
    x, w, ws, gs = gate_up_operands(m, hidden, inter, seed=m + hidden)
    cfg = dispatch.gate_up_config(x, w, ws, None, act=act, h_format="bf16")
    assert cfg is not None and cfg.nvfp4_weight
    h = _kernel_gate_up(cfg, x, w, ws, gs)
    ref, _ = reference.gate_up(x, w, ws, None, gs, interleave=128, act=act, h_format="bf16")
    assert_bf16_close(h, ref, TOL)


@pytest.mark.parametrize("m", [1, 100])
def test_gate_up_one_global_scale_and_the_op_dispatches_to_the_kernel(m):
    x, w, ws, _ = gate_up_operands(m, 1024, 2048, seed=7, equal_scales=True)
    gs = torch.tensor([0.75], device="cuda")
    assert dispatch.gate_up_backend(x, w, ws, None, gs, 128, "silu", "bf16")[0] == dispatch.SM90
    h, hs = ops.gate_up(x, w, ws, None, gs, interleave=128, act="silu", h_format="bf16")
    assert hs is None
    ref, _ = reference.gate_up(x, w, ws, None, gs, interleave=128, act="silu", h_format="bf16")
    assert_bf16_close(h, ref, TOL)


def down_operands(m, hidden, inter, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    h = (torch.randn(m, inter, device="cuda", generator=g) * 0.5).to(torch.bfloat16)
    wp, ws, gd = _nvfp4(torch.randn(hidden, inter, device="cuda", generator=g) * 0.03)
    return h, wp, ws, (1.0 / gd).float()


@pytest.mark.parametrize("hidden,inter", SHAPES)
@pytest.mark.parametrize("m", M_ISSUE)
@pytest.mark.parametrize("residual", [False, True])
def test_down_matches_the_reference(hidden, inter, m, residual):
    from swiglu_fused.kernels.sm90 import down as k

    h, w, ws, gs = down_operands(m, hidden, inter, seed=3 * m + inter)
    res = torch.randn(m, hidden, device="cuda").to(torch.bfloat16) if residual else None
    cfg = dispatch.down_config(h, w, ws, None, res, torch.bfloat16)
    assert cfg is not None and cfg.nvfp4_weight
    y = torch.full((m, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
    k.down(cfg, h, w, ws, None, res, gs, out=y)
    ref = reference.down(h, w, ws, None, gs, residual=res)
    assert_bf16_close(y, ref, TOL)
    assert dispatch.down_backend(h, w, ws, None, gs, res, torch.bfloat16)[0] == dispatch.SM90


def test_dequantization_is_the_decode_exactly():
    """nvfp4_dequant: code · scale · 2^-62 in bf16, bit for bit (every such product is a bf16 value)."""
    from swiglu_fused.kernels.sm90 import nvfp4_dequant

    g = torch.Generator(device="cuda").manual_seed(2)
    packed, scale, _ = _nvfp4(torch.randn(384, 1024, device="cuda", generator=g) * 0.1)
    out = torch.full((384, 1024), float("nan"), dtype=torch.bfloat16, device="cuda")
    nvfp4_dequant.dequantize(packed, scale, out=out)
    expected = quant.dequantize_nvfp4(packed, scale, torch.ones(1, device="cuda")) * 2.0 ** -62
    assert torch.equal(out, expected.to(torch.bfloat16)) and torch.equal(expected.to(torch.bfloat16).float(), expected)


@pytest.mark.parametrize("m", [dispatch_nvfp4.NVFP4_DEQUANT_M - 1, dispatch_nvfp4.NVFP4_DEQUANT_M, 4096])
def test_prefill_dequantizes_and_agrees_with_the_w4a16_mainloop(m):
    """From NVFP4_DEQUANT_M on, gate_up and down dequantize the weight and run the bf16 mainloop;
    on the same operands the W4A16 mainloop's h and y (its tiles below that M) agree with it to fp32
    summation order."""
    from swiglu_fused.kernels.sm90 import down as k

    x, w, ws, gs = gate_up_operands(m, 2048, 4096, seed=m)
    cfg = dispatch.gate_up_config(x, w, ws, None, act="silu", h_format="bf16")
    assert cfg.dequantized == (m >= dispatch_nvfp4.NVFP4_DEQUANT_M) and cfg.nvfp4_weight
    w4a16 = dataclasses.replace(cfg, mainloop="nvfp4", dequantized=False, cluster_m=1, **dispatch_nvfp4.nvfp4_tile_for(m))
    h = _kernel_gate_up(cfg, x, w, ws, gs)
    assert rel_frobenius(h, _kernel_gate_up(w4a16, x, w, ws, gs)) < 1e-3
    hd, wd, wsd, gsd = down_operands(m, 2048, 4096, seed=m)
    cfg = dispatch.down_config(hd, wd, wsd, None, None, torch.bfloat16)
    assert cfg.dequantized == (m >= dispatch_nvfp4.NVFP4_DEQUANT_M)
    w4a16 = dataclasses.replace(cfg, mainloop="nvfp4", dequantized=False, **dispatch_nvfp4.nvfp4_tile_for(m, "down"))
    assert rel_frobenius(k.down(cfg, hd, wd, wsd, None, None, gsd), k.down(w4a16, hd, wd, wsd, None, None, gsd)) < 1e-3


def test_k_not_a_multiple_of_64_runs_the_reference_with_a_warning():
    x, w, ws, gs = gate_up_operands(4, 1040, 1536, seed=1)
    with pytest.warns(UserWarning, match="1040 columns, not a multiple of 64"):
        backend, _ = dispatch.gate_up_backend(x, w, ws, None, gs, 128, "silu", "bf16")
    assert backend == dispatch.REFERENCE
    h, _ = ops.gate_up(x, w, ws, None, gs, interleave=128, act="silu", h_format="bf16")
    assert_bf16_close(h, reference.gate_up(x, w, ws, None, gs, interleave=128, h_format="bf16")[0], TOL)


def _mlp(hidden=2048, inter=4096, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = [torch.randn(*s, generator=g) / s[1] ** 0.5 for s in ((inter, hidden), (inter, hidden), (hidden, inter))]
    return FusedSwiGLUMLP.from_linear(*w, weight_format="nvfp4").cuda()


def _cpu_reference(mlp, x):
    t = ({k: v.cpu() for k, v in mlp.gate_up_interleaved.tensors().items()},
         {k: v.cpu() for k, v in mlp.down_proj.tensors().items()})
    return reference.mlp(x.cpu(), *t, weight_format="nvfp4", interleave=mlp.interleave, act=mlp.activation,
                         global_scale_kind=mlp.global_scale_kind)


@pytest.mark.parametrize("m,hidden,inter", [(1, 2048, 4096), (16, 2048, 4096), (300, 2048, 4096),
                                           (24, 2048, 4096), (24, 3072, 4096)])  # (24: warp-MMA, the 32-token tile: D62)
def test_module_runs_the_kernels_and_matches_the_reference(m, hidden, inter):
    mlp = _mlp(hidden, inter)
    assert mlp.backend == "sm90"
    x = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
    assert_bf16_close(mlp(x), _cpu_reference(mlp, x).cuda(), 1e-2)


def test_module_under_torch_compile_fullgraph():
    mlp = _mlp()
    x = torch.randn(4, 2048, device="cuda").to(torch.bfloat16)
    compiled = torch.compile(mlp, fullgraph=True)
    assert rel_frobenius(compiled(x), mlp(x)) < 1e-6


def test_packed_linear_runs_the_down_kernel():
    g = torch.Generator().manual_seed(5)
    lin = PackedLinear.from_weight(torch.randn(1536, 2048, generator=g) * 0.02, weight_format="nvfp4").cuda()
    x = torch.randn(8, 2048, device="cuda").to(torch.bfloat16)
    t = lin.tensors()
    gs = 1.0 / t["weight_global_scale"].float()
    assert dispatch.down_backend(x, t["weight_packed"], t["weight_scale"], None, gs, None,
                                 torch.bfloat16)[0] == dispatch.SM90
    ref = reference.down(x.cpu(), *(t[k].cpu() for k in ("weight_packed", "weight_scale")), None, gs.cpu())
    assert_bf16_close(lin(x), ref.cuda(), 1e-2)


@pytest.mark.parametrize("hidden,inter", [(1024, 1536), (4096, 14336), (8192, 3584)])
@pytest.mark.parametrize("m", [1, 16, 100, dispatch_nvfp4.NVFP4_DEQUANT_M])
@pytest.mark.parametrize("rs", [True, False])
def test_tile_major_weights_give_the_same_bits(hidden, inter, m, rs, monkeypatch):
    """The weight and scales in nvfp4_layout's tile-major order (TileConfig.tile_major for the W4A16
    tiles; the dequantization's output map at prefill) compute bit for bit what the packed order
    does, gate_up (both global scales) and down: the swap-AB and dequantized tiles; where a
    tile-major weight runs the warp-MMA kernel (decode sizes) or the register-sourced tiles (D45,
    ``rs``), within bf16 rounding of the packed order's (_same)."""
    from swiglu_fused.kernels import nvfp4_layout

    monkeypatch.setattr(dispatch_nvfp4, "NVFP4_RS", rs)

    x, w, ws, gs = gate_up_operands(m, hidden, inter, seed=m)
    want = ops.gate_up(x, w, ws, None, gs)[0]
    cfg = dispatch.gate_up_config(x, w, ws, None, act="silu", h_format="bf16", tile_major=True)
    assert cfg.tile_major == (not cfg.dequantized)
    got = ops.gate_up(x, *nvfp4_layout.to_tile_major(w, ws), None, gs, tile_major=True)[0]
    _same(got, want, m)
    h = torch.randn(m, inter, device="cuda").to(torch.bfloat16)
    p, s, d = _nvfp4(torch.randn(hidden, inter, device="cuda") * 0.05)
    gs1 = (1 / d).float()
    want = ops.down(h, p, s, None, gs1)
    _same(ops.down(h, *nvfp4_layout.to_tile_major(p, s), None, gs1, tile_major=True), want, m)


def _same(got, want, m):
    """Bit for bit where both orders run the same kernel; up to WARP_MMA_M rows a tile-major weight
    runs the warp-MMA kernel (D33), and with dispatch_nvfp4.NVFP4_RS to NVFP4_DEQUANT_M the
    register-sourced tiles (D45, their own k order): other summation orders, within bf16 rounding."""
    assert not want.isnan().any()
    if m <= max(dispatch_nvfp4.WARP_MMA_M.values()) or (dispatch_nvfp4.NVFP4_RS and not dispatch_nvfp4.nvfp4_dequantizes(m)):
        assert_bf16_close(got, want, TOL)
    else:
        assert torch.equal(got, want)


def test_dequantization_of_a_tile_major_weight_is_the_packed_ones():
    from swiglu_fused.kernels import nvfp4_layout
    from swiglu_fused.kernels.sm90 import nvfp4_dequant

    g = torch.Generator(device="cuda").manual_seed(3)
    packed, scale, _ = _nvfp4(torch.randn(768, 1152, device="cuda", generator=g) * 0.1)
    out = torch.full((768, 1152), float("nan"), dtype=torch.bfloat16, device="cuda")
    nvfp4_dequant.dequantize(*nvfp4_layout.to_tile_major(packed, scale), out=out, tile_major=True)
    assert torch.equal(out, nvfp4_dequant.dequantize(packed, scale))


@pytest.mark.parametrize("m", [1, 16, 100, dispatch_nvfp4.NVFP4_DEQUANT_M])
@pytest.mark.parametrize("rs", [True, False])
def test_module_holds_the_tile_major_order_and_computes_what_the_packed_one_does(m, rs, monkeypatch):
    """On the GPU the module keeps both projections tile-major (2048 × 4096: whole tiles), computes
    what it computes in the packed order (bit for bit where both run the same kernels: _same), gives
    the packed order back in state_dict, tensors() and .cpu(), and a CUDA graph of it replays the same
    (eager graphs, M ≤ 64)."""
    import copy

    monkeypatch.setattr(dispatch_nvfp4, "NVFP4_RS", rs)

    mlp = _mlp()
    assert mlp.gate_up_interleaved.tile_major and mlp.down_proj.tile_major
    packed = copy.deepcopy(mlp)
    packed.gate_up_interleaved._set_tile_major(False)
    packed.down_proj._set_tile_major(False)
    x = torch.randn(m, 2048, device="cuda").to(torch.bfloat16)
    got = mlp(x)
    _same(got, packed(x), m)
    assert torch.equal(mlp(x), got)
    cpu = _mlp().cpu()
    assert not cpu.gate_up_interleaved.tile_major
    for (k, a), (_, b) in zip(mlp.state_dict().items(), cpu.state_dict().items()):
        assert torch.equal(a.cpu().view(torch.uint8), b.view(torch.uint8)), k
    moved = copy.deepcopy(mlp).cpu()
    assert not moved.down_proj.tile_major and torch.equal(moved.down_proj.weight_packed, cpu.down_proj.weight_packed)
    assert mlp.down_proj.weight_packed.device.type == "cuda"


@pytest.mark.parametrize(premises.nvfp4_128_token_tiles.names, premises.nvfp4_128_token_tiles.cases)
def test_128_token_tile_across_m_tiles_and_k_shares(m):
    """The 128-token swap-AB tile (DISPATCH D31) over several M tiles (at M = 300 three of 112 tokens:
    D64's equal M tiles without its model), stream-K split past 2 M tiles
    (down at 4096 × 14336, M = 300 and 512: 48 and 64 tiles for the SMs), M tiles partial: h and y
    against the reference, tile-major weights, gate_up with unequal global scales, down with a residual."""
    from swiglu_fused.kernels import nvfp4_layout
    from swiglu_fused.kernels.sm90 import down as kd
    from swiglu_fused.kernels.sm90 import gate_up as kg

    cfg, dcfg = premises.nvfp4_128_token_tiles(m, sms=_sms())  # (not D64's pick)
    x, w, ws, gs = gate_up_operands(m, 4096, 14336, seed=m)
    h = torch.full((m, 14336), float("nan"), dtype=torch.bfloat16, device="cuda")
    kg.gate_up(cfg, x, *nvfp4_layout.to_tile_major(w, ws), None, gs, out=(h, None), tile_major=True)
    assert_bf16_close(h, reference.gate_up(x, w, ws, None, gs, interleave=128, act="silu", h_format="bf16")[0], TOL)
    hd, wd, wsd, gsd = down_operands(m, 4096, 14336, seed=m)
    res = torch.randn(m, 4096, device="cuda").to(torch.bfloat16)
    y = torch.full((m, 4096), float("nan"), dtype=torch.bfloat16, device="cuda")
    kd.down(dcfg, hd, *nvfp4_layout.to_tile_major(wd, wsd), None, res, gsd, out=y, tile_major=True)
    assert_bf16_close(y, reference.down(hd, wd, wsd, None, gsd, residual=res), TOL)


@pytest.mark.parametrize(premises.nvfp4_hybrid_tiles.names, premises.nvfp4_hybrid_tiles.cases)
def test_hybrid_stream_k_past_a_partial_wave(hidden, inter, m, rs):
    """D46: the 128-token tiles' whole waves, then the last full and the partial wave stream-K over
    all SMs (schedule.nvfp4_hybrid_sk), with the register-sourced decode and without it: h and y (down
    with a residual) within bf16 rounding of the reference and of the same tile in whole waves (the
    stream-K tiles sum partials: fp32 rounding apart)."""
    from unittest import mock

    from swiglu_fused.kernels import nvfp4_layout
    from swiglu_fused.kernels.sm90 import down as kd
    from swiglu_fused.kernels.sm90 import gate_up as kg
    from swiglu_fused.kernels.sm90 import schedule

    cfg, dcfg = premises.nvfp4_hybrid_tiles(hidden, inter, m, rs, sms=_sms())
    x, w, ws, gs = gate_up_operands(m, hidden, inter, seed=m + 11)
    hd, wd, wsd, gsd = down_operands(m, hidden, inter, seed=m + 12)
    res = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
    wt, wst = nvfp4_layout.to_tile_major(w, ws)
    wdt, wsdt = nvfp4_layout.to_tile_major(wd, wsd)
    h, y = {}, {}
    for hybrid in (True, False):
        with mock.patch.object(schedule, "NVFP4_HYBRID_MIN_GAIN", 0.0 if hybrid else 1e9):
            h[hybrid] = torch.full((m, inter), float("nan"), dtype=torch.bfloat16, device="cuda")
            kg.gate_up(cfg, x, wt, wst, None, gs, out=(h[hybrid], None), tile_major=True)
            y[hybrid] = torch.full((m, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
            kd.down(dcfg, hd, wdt, wsdt, None, res, gsd, out=y[hybrid], tile_major=True)
            torch.cuda.synchronize()
    for got in (h[True], h[False]):
        assert_bf16_close(got, reference.gate_up(x, w, ws, None, gs, interleave=128, act="silu", h_format="bf16")[0], TOL)
    for got in (y[True], y[False]):
        assert_bf16_close(got, reference.down(hd, wd, wsd, None, gsd, residual=res), TOL)
    assert rel_frobenius(h[True], h[False]) < 1e-3 and rel_frobenius(y[True], y[False]) < 1e-3


@pytest.mark.parametrize("hidden,inter,m", [(4096, 14336, 192), (4096, 14336, 384), (8192, 3584, 640),
                                           (576, 1536, 100)])
@pytest.mark.parametrize("act", ACTS)
def test_192_token_tile_is_the_128_token_tile_bit_for_bit(hidden, inter, m, act):
    """gate_up's 192-token swap-AB tile (DISPATCH D32; whole tiles, the last one partial) gives the
    128-token tile's h bit for bit (the same wgmma k order per value), within bf16 rounding of the
    reference; dispatched where D64's model picks it (nvfp4_tiling)."""
    from unittest import mock

    from swiglu_fused.kernels import nvfp4_layout
    from swiglu_fused.kernels.sm90 import gate_up as kg
    from swiglu_fused.kernels.sm90 import schedule

    x, w, ws, gs = gate_up_operands(m, hidden, inter, seed=m + 1)
    cfg = dispatch.gate_up_config(x, w, ws, None, act=act, h_format="bf16", tile_major=True)
    picked = dispatch_nvfp4.nvfp4_tiling("gate_up", m, w.shape[0], hidden, schedule.sm_count(x.device))
    assert cfg.tile_m == picked[0] and cfg.swap_ab
    wt, wst = nvfp4_layout.to_tile_major(w, ws)
    cfg = dataclasses.replace(cfg, rs_decode=False, rs_prefetch=False)  # (D45's 128-token tile sums in another k order)
    tiles = {False: dispatch_nvfp4._nvfp4_tile(dispatch_nvfp4._nvfp4_share_tile("gate_up", 128)),
             True: dispatch_nvfp4._nvfp4_tile(dispatch_nvfp4.NVFP4_WIDE_TILE)}
    h = {}
    for wide in (False, True):
        c = dataclasses.replace(cfg, **tiles[wide])
        h[wide] = torch.full((m, inter), float("nan"), dtype=torch.bfloat16, device="cuda")
        with mock.patch.object(schedule, "NVFP4_HYBRID_MIN_GAIN", 1e9):  # (whole tiles: D46's stream-K sums partials)
            kg.gate_up(c, x, wt, wst, None, gs, out=(h[wide], None), tile_major=True)
    assert torch.equal(h[True], h[False])
    assert_bf16_close(h[True], reference.gate_up(x, w, ws, None, gs, interleave=128, act=act, h_format="bf16")[0], TOL)


@pytest.mark.parametrize("hidden,inter,m", [(4096, 14336, 64), (4096, 14336, 300), (8192, 3584, 1000),
                                           (576, 1536, 100)])
def test_register_sourced_decode_on_k_ordered_activations(hidden, inter, m):
    """TileConfig.rs_decode (DISPATCH D45, history/nvfp4.md v28): the swap-AB tiles with each thread's
    A fragments decoded into registers (one register set), their activations in
    nvfp4_layout.rs_k_order (gate_up's x reordered by its launcher; down's h given so, or reordered):
    h (unequal global scales) and y (with a residual) within bf16 rounding of the reference; the k
    order is its own inverse, and h written in it by gate_up (GateUpConfig.h_rs_order) is the natural
    h reordered, bit for bit."""
    from swiglu_fused.kernels import nvfp4_layout
    from swiglu_fused.kernels.sm90 import down as kd
    from swiglu_fused.kernels.sm90 import gate_up as kg

    x, w, ws, gs = gate_up_operands(m, hidden, inter, seed=m + 7)
    xr = nvfp4_layout.rs_k_order(x)
    assert torch.equal(nvfp4_layout.rs_k_order(xr), x) and not torch.equal(xr, x)
    cfg = dispatch.gate_up_config(x, w, ws, None, act="silu", h_format="bf16", tile_major=True)
    cfg = dataclasses.replace(cfg, **dispatch_nvfp4.nvfp4_tile_for(m, tile_major=True))
    assert cfg.rs_decode and cfg.decode_buffers == 1
    wt, wst = nvfp4_layout.to_tile_major(w, ws)
    h = torch.full((m, inter), float("nan"), dtype=torch.bfloat16, device="cuda")
    kg.gate_up(cfg, x, wt, wst, None, gs, out=(h, None), tile_major=True)
    assert_bf16_close(h, reference.gate_up(x, w, ws, None, gs, interleave=128, act="silu", h_format="bf16")[0], TOL)
    h_rs = torch.full((m, inter), float("nan"), dtype=torch.bfloat16, device="cuda")  # h in the k order itself
    kg.gate_up(dataclasses.replace(cfg, h_rs_order=True), x, wt, wst, None, gs, out=(h_rs, None), tile_major=True)
    assert torch.equal(h_rs, nvfp4_layout.rs_k_order(h))
    if not nvfp4_layout.fits(hidden, inter):  # (down's 576 rows: not tile-major, so not rs_decode)
        return
    hd, wd, wsd, gsd = down_operands(m, hidden, inter, seed=m)
    res = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
    dcfg = dispatch.down_config(hd, wd, wsd, None, res, torch.bfloat16, True)
    dcfg = dataclasses.replace(dcfg, **dispatch_nvfp4.nvfp4_tile_for(m, "down", tile_major=True))
    assert dcfg.rs_decode
    want = reference.down(hd, wd, wsd, None, gsd, residual=res)
    for given, ordered in ((nvfp4_layout.rs_k_order(hd), True), (hd, False)):
        y = torch.full((m, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
        kd.down(dcfg, given, *nvfp4_layout.to_tile_major(wd, wsd), None, res, gsd, out=y, tile_major=True,
                h_rs_order=ordered)
        assert_bf16_close(y, want, TOL)


@pytest.mark.parametrize("m,k", [(1, 64), (3, 576), (100, 4096), (1000, 14336), (257, 8192)])
def test_k_order_kernel_is_rs_k_order(m, k):
    """kernels/sm90/k_order.py (the launchers' copy of x or h into nvfp4_layout.rs_k_order, DISPATCH
    D45) gives that function's bytes, on random bf16 rows; a view the kernel does not read (a column
    slice) takes the torch copy, with the same result."""
    from swiglu_fused.kernels import nvfp4_layout
    from swiglu_fused.kernels.sm90 import k_order

    x = torch.randn(m, k + 64, device="cuda").to(torch.bfloat16)
    for a in (x[:, :k].contiguous(), x[:, 64:]):
        want = nvfp4_layout.rs_k_order(a)
        got = k_order.rs_order(a)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert torch.equal(k_order.k_order(want), x[:, 64:].contiguous())  # (its own inverse)


@pytest.mark.parametrize(premises.nvfp4_64_token_tile_past_a_wave.names, premises.nvfp4_64_token_tile_past_a_wave.cases)
def test_64_token_tile_past_a_partial_wave_as_dispatched(m, monkeypatch):
    """D61: the 64-token tile (at M = 24 / 48 the 32- / 48-token one, D62, D63) past one wave
    (2048×17408: 136 tiles on 132 SMs) runs D46's hybrid stream-K, as ops.gate_up dispatches it on the
    tile-major weight (at M = 24 with the warp-MMA kernel kept out); h (poisoned first) within bf16
    rounding of the reference, and of the same tile in whole tiles."""
    from unittest import mock

    from swiglu_fused.kernels import nvfp4_layout
    from swiglu_fused.kernels.sm90 import schedule

    if _sms() != premises.SMS:
        pytest.skip("the tile counts are for 132 SMs")
    monkeypatch.setattr(dispatch_nvfp4, "WARP_MMA_M", {"gate_up": 16, "down": 16})
    hidden, inter = 2048, 17408
    premises.nvfp4_64_token_tile_past_a_wave(m)  # (ops.gate_up below dispatches it)
    x, w, ws, gs = gate_up_operands(m, hidden, inter, seed=m + 61)
    wt, wst = nvfp4_layout.to_tile_major(w, ws)
    want = reference.gate_up(x, w, ws, None, gs, interleave=128, act="silu", h_format="bf16")[0]
    h = {}
    for hybrid in (True, False):
        with mock.patch.object(schedule, "NVFP4_HYBRID_MIN_GAIN", 1.05 if hybrid else 1e9):
            torch.full((m, inter), float("nan"), dtype=torch.bfloat16, device="cuda")  # (freed: the poison)
            h[hybrid] = ops.gate_up(x, wt, wst, None, gs, tile_major=True)[0]
            torch.cuda.synchronize()
        assert_bf16_close(h[hybrid], want, TOL)
    assert rel_frobenius(h[True], h[False]) < 1e-3


@pytest.mark.parametrize(premises.nvfp4_32_and_48_token_tiles.names, premises.nvfp4_32_and_48_token_tiles.cases)
def test_32_and_48_token_tiles_as_dispatched(hidden, inter, m):
    """D62, D63: 17-32 rows where the MLP's H and I exceed WARP_MMA_32_MAX_SIDE run the 32-token wgmma
    tile (register-sourced decode on the tile-major weight), not the warp-MMA kernel, and 33-48 rows the
    48-token one (down's partials four at a time): h and y (with a residual; both poisoned first) within
    bf16 rounding of the reference, through the ops; on both weight orders the tile's h and y are the
    64-token tile's bit for bit (the same sums, less of the MMA)."""
    from swiglu_fused.kernels import nvfp4_layout
    from swiglu_fused.kernels.sm90 import down as kd

    tokens = 32 if m <= 32 else 48
    cfg, dcfg = premises.nvfp4_32_and_48_token_tiles(hidden, inter, m, sms=_sms())

    x, w, ws, gs = gate_up_operands(m, hidden, inter, seed=m + 41)
    wt, wst = nvfp4_layout.to_tile_major(w, ws)
    want = reference.gate_up(x, w, ws, None, gs, interleave=128, act="silu", h_format="bf16")[0]
    torch.full((m, inter), float("nan"), dtype=torch.bfloat16, device="cuda")  # (freed: the poison)
    assert_bf16_close(ops.gate_up(x, wt, wst, None, gs, tile_major=True)[0], want, TOL)
    packed = dict(tile_major=False, rs_decode=False, rs_prefetch=False, h_rs_order=False, x_permute=False)  # (the packed order decodes into smem)
    h = _kernel_gate_up(dataclasses.replace(cfg, **packed, **dispatch_nvfp4.nvfp4_tile_for(m)), x, w, ws, gs)
    assert_bf16_close(h, want, TOL)
    assert torch.equal(h, _kernel_gate_up(dataclasses.replace(cfg, **packed, **dispatch_nvfp4.nvfp4_tile_for(64)), x, w, ws, gs))

    hd, wd, wsd, gsd = down_operands(m, hidden, inter, seed=m + 43)
    res = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
    want = reference.down(hd, wd, wsd, None, gsd, residual=res)
    wdt, wsdt = nvfp4_layout.to_tile_major(wd, wsd)
    torch.full((m, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert_bf16_close(ops.down(hd, wdt, wsdt, None, gsd, residual=res, tile_major=True), want, TOL)
    y = {}
    for t, major in ((tokens, True), (64, True), (tokens, False), (64, False)):
        y[t, major] = torch.full((m, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
        fields = {"rs_decode": False, **dispatch_nvfp4.nvfp4_tile_for(t, "down", tile_major=major)}
        args = (wdt, wsdt) if major else (wd, wsd)
        kd.down(dataclasses.replace(dcfg, tile_major=major, **fields), hd, *args, None, res, gsd, out=y[t, major],
                tile_major=major)
    assert_bf16_close(y[tokens, True], want, TOL)
    assert_bf16_close(y[tokens, False], want, TOL)
    assert torch.equal(y[tokens, True], y[64, True]) and torch.equal(y[tokens, False], y[64, False])


@pytest.mark.parametrize("hidden,inter", [(4096, 14336), (8192, 3584)])
@pytest.mark.parametrize("tokens", [80, 96, 112, 144, 160])
@pytest.mark.parametrize("m_tiles", [1, 2])
def test_80_to_160_token_tiles_against_the_128_token_tile(hidden, inter, tokens, m_tiles):
    """The 80-112-, 144- and 160-token swap-AB tiles (DISPATCH D64) at M = m_tiles · tokens - 8 on the
    tile-major weight with the register-sourced decode, as schedule() plans them: h and y (with a
    residual) within bf16 rounding of the reference (outputs poisoned first), and where they and the
    128-token tile run one M tile, its bits."""
    from swiglu_fused.kernels import nvfp4_layout
    from swiglu_fused.kernels.sm90 import down as kd
    from swiglu_fused.kernels.sm90 import gate_up as kg

    m = m_tiles * tokens - 8
    same_bits = m_tiles == 1 and tokens < 128
    x, w, ws, gs = gate_up_operands(m, hidden, inter, seed=m + 83)
    wt, wst = nvfp4_layout.to_tile_major(w, ws)
    cfg = dispatch.gate_up_config(x, w, ws, None, act="silu", h_format="bf16", tile_major=True)
    h = {}
    for t in (tokens, 128):
        tile = dispatch_nvfp4._nvfp4_rs(dispatch_nvfp4._nvfp4_tile(dispatch_nvfp4._nvfp4_share_tile("gate_up", t)), True)
        c = dataclasses.replace(cfg, **tile)
        assert c.tile_m == t and c.rs_decode
        h[t] = torch.full((m, inter), float("nan"), dtype=torch.bfloat16, device="cuda")
        kg.gate_up(c, x, wt, wst, None, gs, out=(h[t], None), tile_major=True)
    want = reference.gate_up(x, w, ws, None, gs, interleave=128, act="silu", h_format="bf16")[0]
    for t in (tokens, 128):
        assert_bf16_close(h[t], want, TOL)
    assert not same_bits or torch.equal(h[tokens], h[128])

    hd, wd, wsd, gsd = down_operands(m, hidden, inter, seed=m + 87)
    res = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
    wdt, wsdt = nvfp4_layout.to_tile_major(wd, wsd)
    dcfg = dispatch.down_config(hd, wd, wsd, None, res, torch.bfloat16, True)
    y = {}
    for t in (tokens, 128):
        tile = dispatch_nvfp4._nvfp4_rs(dispatch_nvfp4._nvfp4_tile(dispatch_nvfp4._nvfp4_share_tile("down", t)), True)
        c = dataclasses.replace(dcfg, **tile)
        y[t] = torch.full((m, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
        kd.down(c, hd, wdt, wsdt, None, res, gsd, out=y[t], tile_major=True)
    want = reference.down(hd, wd, wsd, None, gsd, residual=res)
    for t in (tokens, 128):
        assert_bf16_close(y[t], want, TOL)
    assert not same_bits or torch.equal(y[tokens], y[128])



@pytest.mark.parametrize(premises.nvfp4_144_and_160_token_tiles_split.names,
                         premises.nvfp4_144_and_160_token_tiles_split.cases)
def test_144_and_160_token_tiles_in_stream_k(hidden, inter, m):
    """The 144- and 160-token tiles (DISPATCH D64) as dispatched where schedule() splits some of their
    tiles over K: each thread's stream-K partials are its 144 or 160 accumulator values
    (TileConfig.acc_values; slots of 128 had let them overrun each other, h 0.7 off the reference at
    8192×3584 M = 700). h and y (with a residual) within bf16 rounding of the reference, outputs
    poisoned first."""
    from swiglu_fused.kernels import nvfp4_layout
    from swiglu_fused.kernels.sm90 import down as kd
    from swiglu_fused.kernels.sm90 import gate_up as kg

    cfg, dcfg = premises.nvfp4_144_and_160_token_tiles_split(hidden, inter, m, sms=_sms())
    x, w, ws, gs = gate_up_operands(m, hidden, inter, seed=m + 91)
    hd, wd, wsd, gsd = down_operands(m, hidden, inter, seed=m + 93)
    res = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
    h = torch.full((m, inter), float("nan"), dtype=torch.bfloat16, device="cuda")
    kg.gate_up(cfg, x, *nvfp4_layout.to_tile_major(w, ws), None, gs, out=(h, None), tile_major=True)
    assert_bf16_close(h, reference.gate_up(x, w, ws, None, gs, interleave=128, act="silu", h_format="bf16")[0], TOL)
    y = torch.full((m, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
    kd.down(dcfg, hd, *nvfp4_layout.to_tile_major(wd, wsd), None, res, gsd, out=y, tile_major=True)
    assert_bf16_close(y, reference.down(hd, wd, wsd, None, gsd, residual=res), TOL)



def _tilings_past_128_rows(widths, sms):
    """{(H, I, M)} with one M for each (op, tile, kind of plan) that dispatch_nvfp4.nvfp4_tile_for and
    schedule() give nvfp4 at 129-1408 rows of these widths on ``sms`` SMs (kind: whole tiles, plan()'s
    split over K, D46's hybrid, or every tile stream-K)."""
    from swiglu_fused.kernels.sm90 import schedule
    from swiglu_fused.kernels.sm90.tile_config import DownConfig, GateUpConfig

    first = {}
    for hidden, inter in widths:
        for m in range(129, dispatch_nvfp4.NVFP4_DEQUANT_M):
            for op, n, k, cls, kw in (("gate_up", 2 * inter, hidden, GateUpConfig, {"h_format": "bf16"}),
                                      ("down", hidden, inter, DownConfig, {})):
                cfg = cls(mainloop="nvfp4", tile_major=True, **dispatch_nvfp4.nvfp4_tile_for(m, op, True, (n, k, sms)), **kw)
                ctas, sk = schedule.schedule(cfg, m, n, k, sms)
                tiles = -(-m // cfg.tile_m) * (n // 256)
                kind = "whole" if not sk else "split" if ctas > tiles else "hybrid" if sk < tiles else "stream-K"
                first.setdefault((op, cfg.tile_m, kind), (hidden, inter, m))
    return sorted(set(first.values()))


def test_every_tiling_the_model_picks_past_128_rows():
    """D64's model (nvfp4_tiling) past 128 rows at three widths: for each tile and kind of plan it picks
    for either op (whole tiles, plan()'s split, D46's hybrid, all stream-K), one M that gets it, and
    there h and y (with a residual) from the dispatched configs within bf16 rounding of the reference,
    outputs poisoned first. (The 144/160-token tiles' split plans once overran their partials: v43.)"""
    from swiglu_fused.kernels import nvfp4_layout
    from swiglu_fused.kernels.sm90 import down as kd
    from swiglu_fused.kernels.sm90 import gate_up as kg

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cases = _tilings_past_128_rows([(4096, 14336), (8192, 3584), (2048, 8192)], sms)
    assert len(cases) >= 10
    for hidden, inter, m in cases:
        x, w, ws, gs = gate_up_operands(m, hidden, inter, seed=m)
        cfg = dispatch.gate_up_config(x, w, ws, None, act="silu", h_format="bf16", tile_major=True)
        h = torch.full((m, inter), float("nan"), dtype=torch.bfloat16, device="cuda")
        kg.gate_up(cfg, x, *nvfp4_layout.to_tile_major(w, ws), None, gs, out=(h, None), tile_major=True)
        want = reference.gate_up(x, w, ws, None, gs, interleave=128, act="silu", h_format="bf16")[0]
        assert rel_frobenius(h, want) <= TOL, (hidden, inter, m, cfg)
        hd, wd, wsd, gsd = down_operands(m, hidden, inter, seed=m + 1)
        res = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
        dcfg = dispatch.down_config(hd, wd, wsd, None, res, torch.bfloat16, True)
        y = torch.full((m, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
        kd.down(dcfg, hd, *nvfp4_layout.to_tile_major(wd, wsd), None, res, gsd, out=y, tile_major=True)
        assert rel_frobenius(y, reference.down(hd, wd, wsd, None, gsd, residual=res)) <= TOL, (hidden, inter, m, dcfg)


@pytest.mark.parametrize("hidden,inter,m", [(4096, 14336, 40), (4096, 14336, 64), (8192, 3584, 96),
                                           (4096, 14336, 300), (8192, 3584, 1000)])
def test_prefetched_words_give_the_same_bits(hidden, inter, m):
    """TileConfig.rs_prefetch (DISPATCH D66: the next k tile's packed words loaded while this one's chain
    runs) on the tiles and plans dispatched for these M, stream-K included: h and y bit for bit what
    the same tiles give without it (the same arithmetic), outputs poisoned first."""
    from swiglu_fused.kernels import nvfp4_layout
    from swiglu_fused.kernels.sm90 import down as kd
    from swiglu_fused.kernels.sm90 import gate_up as kg

    x, w, ws, gs = gate_up_operands(m, hidden, inter, seed=m + 99)
    cfg = dispatch.gate_up_config(x, w, ws, None, act="silu", h_format="bf16", tile_major=True)
    hd, wd, wsd, gsd = down_operands(m, hidden, inter, seed=m + 101)
    res = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
    dcfg = dispatch.down_config(hd, wd, wsd, None, res, torch.bfloat16, True)
    assert cfg.rs_decode and dcfg.rs_decode
    h, y = {}, {}
    for pf in (False, True):
        h[pf] = torch.full((m, inter), float("nan"), dtype=torch.bfloat16, device="cuda")
        kg.gate_up(dataclasses.replace(cfg, rs_prefetch=pf), x, *nvfp4_layout.to_tile_major(w, ws), None, gs,
                   out=(h[pf], None), tile_major=True)
        y[pf] = torch.full((m, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
        kd.down(dataclasses.replace(dcfg, rs_prefetch=pf), hd, *nvfp4_layout.to_tile_major(wd, wsd), None, res, gsd,
                out=y[pf], tile_major=True)
    assert_bf16_close(h[True], reference.gate_up(x, w, ws, None, gs, interleave=128, act="silu", h_format="bf16")[0], TOL)
    assert torch.equal(h[True], h[False]) and torch.equal(y[True], y[False])


@pytest.mark.parametrize("hidden,inter", [(4096, 14336), (8192, 3584), (2048, 8192)])
@pytest.mark.parametrize("m", [100, 256, 300, 1000, 1024])
@pytest.mark.parametrize("tokens", dispatch_nvfp4.NVFP4_HALF_ROWS_TOKENS)
def test_half_row_down_tile_against_the_reference(hidden, inter, m, tokens):
    """Down's 128-row tiles of 224-256 tokens (TileConfig.nvfp4_half_rows, DISPATCH D67: one 64-row block
    a warpgroup, each CTA half of a tile-major 256-row weight tile) as schedule() plans them, whole M
    tiles, a partial last one and stream-K alike: y (with a residual) within bf16 rounding of the
    reference, outputs poisoned first."""
    from swiglu_fused.kernels import nvfp4_layout
    from swiglu_fused.kernels.sm90 import down as kd

    hd, wd, wsd, gsd = down_operands(m, hidden, inter, seed=m + 113)
    res = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
    wdt, wsdt = nvfp4_layout.to_tile_major(wd, wsd)
    dcfg = dispatch.down_config(hd, wd, wsd, None, res, torch.bfloat16, True)
    tile = dispatch_nvfp4._nvfp4_rs(dispatch_nvfp4._nvfp4_tile(dispatch_nvfp4._nvfp4_share_tile("down", tokens, half_rows=True)), True)
    half = dataclasses.replace(dcfg, **{"ctas_per_sm": 0, **tile})
    assert half.nvfp4_half_rows and half.tile_m == tokens and half in dispatch.down_shipped()
    y = torch.full((m, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
    kd.down(half, hd, wdt, wsdt, None, res, gsd, out=y, tile_major=True)
    assert_bf16_close(y, reference.down(hd, wd, wsd, None, gsd, residual=res), TOL)


@pytest.mark.parametrize("hidden,inter", [(4096, 14336), (8192, 3584), (2048, 8192)])
@pytest.mark.parametrize("m", [100, 256, 300, 1000, 1024])
@pytest.mark.parametrize("tokens", dispatch_nvfp4.NVFP4_HALF_ROWS_TOKENS)
def test_half_row_gate_up_tile_against_the_reference(hidden, inter, m, tokens):
    """gate_up's 128-row tiles of 224-256 tokens (TileConfig.half_row_pairs: 64 gate rows and their 64 up
    rows a CTA, each thread's A rows g and g + 8 a gate row and its up row) as schedule() plans them,
    whole M tiles, a partial last one and stream-K alike: h (unequal global scales, both activations)
    within bf16 rounding of the reference, outputs poisoned first; h written in the k order
    (h_rs_order) is that h reordered, bit for bit."""
    from swiglu_fused.kernels import nvfp4_layout
    from swiglu_fused.kernels.sm90 import gate_up as kg

    act = "silu" if m % 2 == 0 else "gelu_tanh"
    x, w, ws, gs = gate_up_operands(m, hidden, inter, seed=m + 127)
    wt, wst = nvfp4_layout.to_tile_major(w, ws)
    cfg = dispatch.gate_up_config(x, w, ws, None, act=act, h_format="bf16", tile_major=True)
    tile = dispatch_nvfp4._nvfp4_rs(dispatch_nvfp4._nvfp4_tile(dispatch_nvfp4._nvfp4_share_tile("gate_up", tokens, half_rows=True)),
                              True)
    half = dataclasses.replace(cfg, **{"ctas_per_sm": 0, "pdl": False, **tile})
    assert half.half_row_pairs and half.tile_m == tokens and half in dispatch.gate_up_shipped()
    h = torch.full((m, inter), float("nan"), dtype=torch.bfloat16, device="cuda")
    kg.gate_up(half, x, wt, wst, None, gs, out=(h, None), tile_major=True)
    assert_bf16_close(h, reference.gate_up(x, w, ws, None, gs, interleave=128, act=act, h_format="bf16")[0], TOL)
    h_rs = torch.full((m, inter), float("nan"), dtype=torch.bfloat16, device="cuda")
    kg.gate_up(dataclasses.replace(half, h_rs_order=True), x, wt, wst, None, gs, out=(h_rs, None), tile_major=True)
    assert torch.equal(h_rs, nvfp4_layout.rs_k_order(h))


@pytest.mark.parametrize("hidden,inter", [(4096, 14336), (8192, 3584), (2048, 8192), (5120, 13824)])
@pytest.mark.parametrize("tokens", dispatch_nvfp4.x_permute_tokens())
def test_gate_up_permuting_x_against_the_copy(hidden, inter, tokens):
    """gate_up's rs_decode tiles taking x in natural order and permuting each stage into the k order in shared
    memory (TileConfig.x_permute) at M of one partial M tile and of three and a part, as schedule() plans them
    (whole tiles and stream-K splits): h bit for bit what the same tile makes of the copied x (the same sums in
    the same order), in both h orders, and within bf16 rounding of the reference; outputs poisoned first."""
    from swiglu_fused.kernels import nvfp4_layout
    from swiglu_fused.kernels.sm90 import gate_up as kg
    from swiglu_fused.kernels.sm90.tile_config import GateUpConfig

    for m in (tokens - 5, 3 * tokens + 7):
        act = "silu" if m % 2 else "gelu_tanh"
        x, w, ws, gs = gate_up_operands(m, hidden, inter, seed=m + tokens + 11)
        wt, wst = nvfp4_layout.to_tile_major(w, ws)
        half_rows = tokens in dispatch_nvfp4.NVFP4_HALF_ROWS_TOKENS
        tile = dispatch_nvfp4._nvfp4_rs(dispatch_nvfp4._nvfp4_tile(
            dispatch_nvfp4._nvfp4_share_tile("gate_up", tokens, half_rows=half_rows)), True)
        cfg = GateUpConfig(mainloop=dispatch_nvfp4.NVFP4_MAINLOOP, tile_major=True, act=act, h_format="bf16", **tile)
        assert cfg.tile_m == tokens and cfg.rs_decode
        h = {}
        for permute in (False, True):
            for rs in (False, True):
                c = dataclasses.replace(cfg, x_permute=permute, h_rs_order=rs)
                assert c in dispatch.gate_up_shipped(), c
                h[permute, rs] = torch.full((m, inter), float("nan"), dtype=torch.bfloat16, device="cuda")
                kg.gate_up(c, x, wt, wst, None, gs, out=(h[permute, rs], None), tile_major=True)
        assert torch.equal(h[True, False], h[False, False]) and torch.equal(h[True, True], h[False, True])
        assert torch.equal(h[True, True], nvfp4_layout.rs_k_order(h[True, False]))
        assert_bf16_close(h[True, False],
                          reference.gate_up(x, w, ws, None, gs, interleave=128, act=act, h_format="bf16")[0], TOL)


@pytest.mark.parametrize(premises.nvfp4_narrow_down.names, premises.nvfp4_narrow_down.cases)
def test_narrow_down_at_97_to_128_rows(hidden, inter, m):
    """D69: down at 97-128 rows runs the 224-token 128-row tile where the model predicts it no slower than the one
    M tile (narrow H; not 4096×14336; 2048×8192 from 113 rows since D71): y (with a residual) from the dispatched
    config within bf16 rounding of the reference, outputs poisoned first."""
    from swiglu_fused.kernels import nvfp4_layout
    from swiglu_fused.kernels.sm90 import down as kd

    dcfg = premises.nvfp4_narrow_down(hidden, inter, m, sms=_sms())
    hd, wd, wsd, gsd = down_operands(m, hidden, inter, seed=m + 131)
    res = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
    y = torch.full((m, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
    kd.down(dcfg, hd, *nvfp4_layout.to_tile_major(wd, wsd), None, res, gsd, out=y, tile_major=True)
    assert_bf16_close(y, reference.down(hd, wd, wsd, None, gsd, residual=res), TOL)


@pytest.mark.parametrize(premises.nvfp4_down_tiles_of_the_fixup_model.names,
                         premises.nvfp4_down_tiles_of_the_fixup_model.cases)
def test_down_tiles_of_the_split_fixup_model(hidden, inter, m, tokens):
    """D71: the down tiles nvfp4_swap_us's refitted fix-up picks (several split over K, some summed in two levels):
    y (with a residual) from the dispatched config within bf16 rounding of the reference, outputs poisoned first."""
    from swiglu_fused.kernels import nvfp4_layout
    from swiglu_fused.kernels.sm90 import down as kd

    dcfg = premises.nvfp4_down_tiles_of_the_fixup_model(hidden, inter, m, tokens, sms=_sms())
    hd, wd, wsd, gsd = down_operands(m, hidden, inter, seed=m + 171)
    res = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
    y = torch.full((m, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
    kd.down(dcfg, hd, *nvfp4_layout.to_tile_major(wd, wsd), None, res, gsd, out=y, tile_major=True)
    assert_bf16_close(y, reference.down(hd, wd, wsd, None, gsd, residual=res), TOL)


@pytest.mark.parametrize(premises.nvfp4_gate_up_tiles_of_the_fixup_model.names,
                         premises.nvfp4_gate_up_tiles_of_the_fixup_model.cases)
def test_gate_up_tiles_of_the_split_fixup_model(hidden, inter, m, tokens):
    """D71 for gate_up: the tiles nvfp4_swap_us's refitted fix-up picks where gate_up's pick moved (three 112-token
    tiles, not two of 160; two of 80, not one of 144), split over K as schedule() plans them: h from the dispatched
    config (unequal global scales) within bf16 rounding of the reference, outputs poisoned first."""
    from swiglu_fused.kernels import nvfp4_layout
    from swiglu_fused.kernels.sm90 import gate_up as kg

    cfg = premises.nvfp4_gate_up_tiles_of_the_fixup_model(hidden, inter, m, tokens, sms=_sms())
    x, w, ws, gs = gate_up_operands(m, hidden, inter, seed=m + 173)
    h = torch.full((m, inter), float("nan"), dtype=torch.bfloat16, device="cuda")
    kg.gate_up(cfg, x, *nvfp4_layout.to_tile_major(w, ws), None, gs, out=(h, None), tile_major=True)
    assert_bf16_close(h, reference.gate_up(x, w, ws, None, gs, interleave=128, act="silu", h_format="bf16")[0], TOL)


@pytest.mark.parametrize(premises.nvfp4_fixup_groups.names, premises.nvfp4_fixup_groups.cases)
def test_fixup_groups_against_the_reference(hidden, inter, m):
    """D70: where plan() splits every tile of down over K 11-32 ways (here 32, 16, 16, 16, 11, 11, 22 and 13: groups
    of 4-6, the last group short where sqrt does not divide), the dispatched config sums the partials in
    two levels: y (with a residual) within bf16 rounding of the reference, poisoned first, and close to
    the CTA-order sum's (another order of fp32 additions). The counters are back at zero afterwards
    (conftest)."""
    from swiglu_fused.kernels import nvfp4_layout
    from swiglu_fused.kernels.sm90 import down as kd

    cfg = premises.nvfp4_fixup_groups(hidden, inter, m, sms=_sms())
    h, w, ws, gs = down_operands(m, hidden, inter, seed=m + hidden + 7)
    res = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
    wt, wst = nvfp4_layout.to_tile_major(w, ws)
    y = {}
    for groups in (True, False):
        y[groups] = torch.full((m, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
        kd.down(dataclasses.replace(cfg, fixup_groups=groups), h, wt, wst, None, res, gs, out=y[groups], tile_major=True)
    assert_bf16_close(y[True], reference.down(h, w, ws, None, gs, residual=res), TOL)
    assert rel_frobenius(y[True], y[False]) < 1e-2 * TOL
