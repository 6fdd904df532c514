"""down sm_90a kernel against reference.down (DESIGN §4: bf16 y within 1e-2 relative Frobenius),
y poisoned with NaN before the kernel runs."""

import zlib

import pytest
import torch

from swiglu_fused import quant
from swiglu_fused.kernels import ops, reference
from .tolerance import assert_bf16_close

pytest.importorskip("cutlass")

M_ALL = [1, 3, 16, 40, 64, 100, 1024, 4096]  # ≤ 64: the fp8 swap-AB tile (1-4 M tiles)
SHAPES = [(4096, 14336), (8192, 3584), (576, 1536), (2048, 8192)]  # (H, I)


def make_operands(m, hidden, inter, mainloop, residual, seed):
    """h as gate_up writes it (e4m3 + per-row per-128-column scales, or bf16) and W_down [H, I];
    per-row and per-block magnitudes vary over 2^±3 so that a wrong scale index shows up."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    h = torch.randn(m, inter, device="cuda", generator=g)
    h = h * torch.exp2(torch.randint(-3, 4, (m, 1), device="cuda", generator=g).float())
    w = torch.randn(hidden, inter, device="cuda", generator=g) * 0.05
    nb, kb = quant.cdiv(hidden, 128), quant.cdiv(inter, 128)
    block_mag = torch.exp2(torch.randint(-3, 4, (nb, kb), device="cuda", generator=g).float())
    w = w * block_mag.repeat_interleave(128, 0).repeat_interleave(128, 1)[:hidden, :inter]
    res = None
    if residual:
        res = (torch.randn(m, hidden, device="cuda", generator=g) * 4).to(torch.bfloat16)
    if mainloop == "bf16":
        return dict(h=h.to(torch.bfloat16), weight=w.to(torch.bfloat16), residual=res)
    hq, hs = reference.quant_x(h.to(torch.bfloat16))
    wq, ws = quant.quantize_fp8_block(w)
    return dict(h=hq, weight=wq, weight_scale=ws, h_scale=quant.m_major(hs), residual=res)


def check(mainloop, m, hidden, inter, residual):
    from swiglu_fused.kernels.sm90 import down as k

    seed = zlib.crc32(repr(("down", mainloop, m, hidden, inter, residual)).encode())  # reproducible
    args = make_operands(m, hidden, inter, mainloop, residual, seed)
    cfg = k.select_config(args["h"], args["weight"], args.get("weight_scale"), args.get("h_scale"),
                          args["residual"], torch.bfloat16)
    assert cfg is not None and cfg.mainloop == mainloop and cfg.residual == residual
    y = torch.full((m, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
    k.down(cfg, args["h"], args["weight"], args.get("weight_scale"), args.get("h_scale"), args["residual"], out=y)
    y_ref = reference.down(**args)
    assert_bf16_close(y, y_ref)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("hidden,inter", SHAPES)
@pytest.mark.parametrize("m", M_ALL)
def test_down_fp8_block128(m, hidden, inter, residual):
    check("fp8_block128", m, hidden, inter, residual)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("hidden,inter", [(4096, 14336), (576, 1536)])
@pytest.mark.parametrize("m", [3, 64, 100, 1024])
def test_down_bf16_mainloop(m, hidden, inter, residual):
    check("bf16", m, hidden, inter, residual)


@pytest.mark.parametrize("m", [3, 100, 1024])
def test_down_takes_row_major_h_scale(m):
    """gate_up writes h_scale M-major, the layout the kernel reads; a row-major one (reference.quant_x's)
    is copied to it first and gives the same y."""
    from swiglu_fused.kernels.sm90 import down as k

    args = make_operands(m, 4096, 14336, "fp8_block128", False, seed=m)
    cfg = k.select_config(args["h"], args["weight"], args["weight_scale"], args["h_scale"], None, torch.bfloat16)
    y_m = k.down(cfg, args["h"], args["weight"], args["weight_scale"], args["h_scale"])
    y_r = k.down(cfg, args["h"], args["weight"], args["weight_scale"], args["h_scale"].contiguous())
    assert args["h_scale"].stride() == (1, m) and torch.equal(y_m, y_r)


def test_down_does_not_write_past_h():
    """H = 576 (a partial last N tile, half of it past H): nothing is written past the end of y."""
    from swiglu_fused.kernels.sm90 import down as k

    args = make_operands(100, 576, 1536, "fp8_block128", True, seed=3)
    cfg = k.select_config(args["h"], args["weight"], args["weight_scale"], args["h_scale"], args["residual"],
                          torch.bfloat16)
    # the kernel writes a contiguous [M, H]: run it into the first 100·576 elements of a larger buffer
    flat = torch.full((100 * 576 + 1024,), 7.0, dtype=torch.bfloat16, device="cuda")
    flat[: 100 * 576] = float("nan")
    y = flat[: 100 * 576].view(100, 576)
    k.down(cfg, args["h"], args["weight"], args["weight_scale"], args["h_scale"], args["residual"], out=y)
    assert torch.all(flat[100 * 576:] == 7.0), "the kernel wrote past the end of y"
    assert_bf16_close(y, reference.down(**args))


def test_ops_down_dispatch(monkeypatch):
    """ops.down runs the fp8 kernel with the swap-AB tile (M ≤ 64), where its 64-row tile shares a
    long K out by stream-K (H = 4096, I = 14336, M = 128) and where its static 128-row tile's waves
    beat cuBLAS's (M = 1024, H = 4096, K whole rings of 512: D36), the bf16 kernel only where its tiles
    fill the SMs (M = 1024, H = 4096; not at decode with stream-K, D44), and otherwise only where
    cuBLAS does not take the shape (H = 576; K/128 not a multiple of 4, where cuBLAS would return
    wrong values: cublas.py); cuBLAS keeps the other shapes it supports (as fast or faster there,
    dispatch.beats_cublas)."""
    def no_fallback(*a, **kw):
        raise AssertionError("ops.down did not run the sm90 kernel on an sm_90 GPU")

    cases = [
        make_operands(100, 576, 1536, "fp8_block128", True, seed=1),
        make_operands(3, 576, 1536, "fp8_block128", False, seed=4),
        make_operands(1024, 4096, 1536, "bf16", False, seed=2),
        make_operands(16, 4096, 14336, "fp8_block128", True, seed=8),  # swap-AB tile, stream-K
        make_operands(128, 4096, 14336, "fp8_block128", False, seed=9),  # 64-row tile, stream-K
        make_operands(1024, 4096, 1536, "fp8_block128", True, seed=6),  # the static 128-row tile (D36)
        make_operands(1024, 4096, 1664, "fp8_block128", False, seed=7),  # K/128 odd: cuBLAS would be wrong
    ]
    monkeypatch.setattr(ops.reference, "down", no_fallback)
    monkeypatch.setattr(ops.cublas, "down", no_fallback)
    ys = [ops.down(c["h"], c["weight"], c.get("weight_scale"), c.get("h_scale"), residual=c["residual"]) for c in cases]
    monkeypatch.undo()
    for y, c in zip(ys, cases):
        assert_bf16_close(y, reference.down(**c))
    # an fp16 output is not the kernel's, nor small M on a shape cuBLAS takes: cuBLAS runs them
    calls = []
    real = ops.cublas.down
    monkeypatch.setattr(ops.cublas, "down", lambda *a: calls.append(1) or real(*a))
    bf16 = cases[2]
    y16 = ops.down(bf16["h"], bf16["weight"], out_dtype=torch.float16)
    dec = make_operands(256, 4096, 1536, "fp8_block128", False, seed=5)
    yd = ops.down(dec["h"], dec["weight"], dec["weight_scale"], dec["h_scale"])
    full = make_operands(1152, 4096, 1536, "fp8_block128", True, seed=6)  # a wave and 16 tiles: cuBLAS for fp8
    yf = ops.down(full["h"], full["weight"], full["weight_scale"], full["h_scale"], residual=full["residual"])
    bdec = make_operands(16, 4096, 14336, "bf16", False, seed=10)  # bf16 at decode: cuBLAS, not stream-K (D44)
    yb = ops.down(bdec["h"], bdec["weight"])
    assert len(calls) == 4 and y16.dtype == torch.float16
    assert_bf16_close(yb, reference.down(**bdec))
    assert_bf16_close(y16, reference.down(**bf16, out_dtype=torch.float16))
    assert_bf16_close(yd, reference.down(**dec))
    assert_bf16_close(yf, reference.down(**full))


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("hidden,inter,m", [(4096, 14336, 16), (4096, 14336, 64), (4096, 14336, 256), (2048, 8192, 3)])
def test_stream_k_is_repeatable(hidden, inter, m, residual):
    """Decode-sized down GEMMs with a long K run stream-K (schedule.plan): bit-identical launches
    (partials summed in CTA order) and the residual added once, by the CTA that runs the epilogue."""
    from swiglu_fused.kernels.sm90 import down as k, gemm

    args = make_operands(m, hidden, inter, "fp8_block128", residual, seed=11)
    cfg = k.select_config(args["h"], args["weight"], args["weight_scale"], args["h_scale"], args["residual"],
                          torch.bfloat16)
    assert gemm.launch_plan(cfg, m, hidden, inter, torch.device("cuda"))[1] > 0
    ys = []
    for _ in range(3):
        y = torch.full((m, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
        ys.append(k.down(cfg, args["h"], args["weight"], args["weight_scale"], args["h_scale"], args["residual"], out=y))
    assert all(torch.equal(y, ys[0]) for y in ys[1:])
    assert_bf16_close(ys[0], reference.down(**args))


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("hidden,inter,m,tile_m,ck", [(8192, 3584, 16, 16, 2), (4096, 14336, 5, 16, 2),
                                                      (576, 1536, 40, 16, 2), (8192, 3584, 128, 64, 2),
                                                      (4096, 14336, 77, 64, 2), (4096, 14336, 1, 16, 4),
                                                      (4096, 14336, 16, 16, 4), (2048, 8192, 9, 16, 4),
                                                      (576, 1536, 3, 16, 4)])
def test_cluster_k_matches_stream_k(hidden, inter, m, tile_m, ck, residual, monkeypatch):
    """cluster_k = 2 or 4 (K parts over a cluster, the peers' accumulators through DSMEM, added in
    rank order) gives stream-K split 2's or 4's y bit for bit; the residual is added once, by the
    CTA that runs the epilogue (I = 1536: 12 k tiles over 4 CTAs)."""
    import dataclasses

    from swiglu_fused.kernels.sm90 import down as k, schedule

    args = make_operands(m, hidden, inter, "fp8_block128", residual, seed=m + 3)
    swap = tile_m == 16
    stages = 3 if not swap else 6 if ck == 2 else 5
    cfg = k.DownConfig(tile_m=tile_m, stages=stages, swap_ab=swap, cluster_k=ck, residual=residual)
    ys = []
    for c in (cfg, dataclasses.replace(cfg, cluster_k=1)):
        if c.cluster_k == 1:
            monkeypatch.setattr(schedule, "plan", lambda tiles, *a, **kw: (ck * tiles, tiles))
        y = torch.full((m, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
        ys.append(k.down(c, args["h"], args["weight"], args["weight_scale"], args["h_scale"], args["residual"], out=y))
    assert torch.equal(ys[0], ys[1])
    assert_bf16_close(ys[0], reference.down(**args))


@pytest.mark.parametrize("hidden,inter,m", [(4096, 14336, 128), (8192, 3584, 100), (576, 1536, 3)])
def test_l2_hint_changes_no_bit(hidden, inter, m):
    """The fp8 64-row down tile's evict_first weight loads (and the hint forced on the swap-AB tile)
    give bit-identical y."""
    import dataclasses

    from swiglu_fused.kernels.sm90 import down as k

    args = make_operands(m, hidden, inter, "fp8_block128", False, seed=m)
    cfg = k.select_config(args["h"], args["weight"], args["weight_scale"], args["h_scale"], None, torch.bfloat16)
    ys = []
    for c in (cfg, dataclasses.replace(cfg, l2_hint="" if cfg.l2_hint else "w_first")):
        y = torch.full((m, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
        ys.append(k.down(c, args["h"], args["weight"], args["weight_scale"], args["h_scale"], None, out=y))
    assert torch.equal(ys[0], ys[1])
    assert_bf16_close(ys[0], reference.down(**args))


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("hidden,inter,m,plan", [(4096, 14336, 1024, "whole"), (8192, 3584, 4097, "whole"),
                                                 (2048, 8192, 300, "whole"), (576, 512, 77, "whole"),
                                                 (4096, 14336, 256, "stream-K"), (8192, 3584, 100, "stream-K")])
def test_y_slabs_of_any_width_store_the_same_bits(hidden, inter, m, plan, residual, monkeypatch):
    """TileConfig.y_slab_cols: y staged 64 columns at a time equals the 128-column slabs' y bit for bit,
    every element written (poisoned outputs): on the 128-row tile with the slab's room taken by staged
    scales, the static k loop and cluster pairs (DISPATCH D36), and on the 64-row tile; as whole tiles,
    and under a stream-K plan (the last CTA's epilogue)."""
    import dataclasses

    from swiglu_fused.kernels.sm90 import down as k, schedule

    if plan == "whole":
        monkeypatch.setattr(schedule, "plan", lambda tiles, k_tiles, sms, *a, **kw: (max(1, min(tiles, sms)), 0))
    else:
        monkeypatch.setattr(schedule, "plan", lambda tiles, k_tiles, sms, *a, **kw: (2 * tiles, tiles))
    args = make_operands(m, hidden, inter, "fp8_block128", residual, seed=m + 57)
    fast = dict(smem_scales=True, uniform_ab=True)
    cases = [(k.DownConfig(tile_m=64, stages=5, residual=residual), {})]
    if plan == "whole":
        staged = k.DownConfig(tile_m=128, stages=4, residual=residual)
        cases += [(staged, dict(static_stages=True, **fast)), (dataclasses.replace(staged, cluster_m=2), fast)]
    else:  # (down_config's 128-row tile where plan() splits it: staged scales, the dynamic k loop)
        cases += [(k.DownConfig(tile_m=128, stages=4, residual=residual), fast)]
    for base, fields in cases:
        ys = []
        for c in (base, dataclasses.replace(base, y_slab_cols=64, **fields)):
            y = torch.full((m, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
            ys.append(k.down(c, args["h"], args["weight"], args["weight_scale"], args["h_scale"], args["residual"],
                             out=y))
        assert torch.equal(ys[0].view(torch.int16), ys[1].view(torch.int16)), (base, fields)
        assert_bf16_close(ys[1], reference.down(**args))
