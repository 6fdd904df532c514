"""The 192-row tile (three consumer warpgroups, TileConfig.tile_m = TILE_M_WG3) of the bf16 mainloop:
each warpgroup runs the same 64-row wgmma chains in the same k order as in the 128-row tile, so h
and y are bit-identical to the 128-row tile's; and every element is written (poisoned outputs)
and within bf16 rounding of the reference, for gate_up (both activations, bf16 and fp8 h), down
(with and without a residual), nvfp4 prefill (dequantized) and the split projection, at M that
leave a partial last M tile."""

import dataclasses
import zlib

import pytest
import torch

from swiglu_fused.kernels import reference

from . import test_gate_up_gpu as gu
from . import test_down_gpu as dn
from . import test_nvfp4_gpu as nv
from . import test_split_gpu as sp
from .tolerance import assert_bf16_close

pytest.importorskip("cutlass")

from swiglu_fused.kernels.sm90 import down as kd, gate_up as kg, split as ks  # noqa: E402
from swiglu_fused.kernels.sm90.tile_config import TILE_M_WG3  # noqa: E402

WG3 = dict(tile_m=TILE_M_WG3, stages=3, cluster_m=1)
ROW128 = dict(tile_m=128, stages=4, cluster_m=1)
# (H, I, M): a partial last M tile everywhere but 4608 = 24 · 192; H = 576 and 1040 end in a partial k tile
CASES = [(4096, 14336, 1024), (8192, 3584, 4608), (576, 1536, 100), (1040, 1536, 193), (2048, 8192, 385)]


def _same(a, b):
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("h_format", ["bf16", "fp8_group128"])
@pytest.mark.parametrize("act", gu.ACTS)
@pytest.mark.parametrize("hidden,inter,m", CASES)
def test_gate_up(hidden, inter, m, act, h_format):
    args = gu.make_operands(m, hidden, inter, "bf16", seed=zlib.crc32(repr((hidden, inter, m, act)).encode()))
    cfg = kg.GateUpConfig(mainloop="bf16", act=act, h_format=h_format, **WG3)
    h, hs = gu.run_kernel(cfg, args)
    h2, hs2 = gu.run_kernel(dataclasses.replace(cfg, **ROW128), args)
    _same(h, h2)
    assert hs is None or torch.equal(hs, hs2)
    gu.assert_matches_reference(h, hs, args, act, h_format, "bf16")


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("hidden,inter,m", CASES)
def test_down(hidden, inter, m, residual):
    args = dn.make_operands(m, hidden, inter, "bf16", residual, seed=m + hidden)
    cfg = kd.DownConfig(mainloop="bf16", residual=residual, **WG3)
    ys = []
    for c in (cfg, dataclasses.replace(cfg, **ROW128)):
        y = torch.full((m, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
        ys.append(kd.down(c, args["h"], args["weight"], None, None, args["residual"], out=y))
    _same(*ys)
    assert_bf16_close(ys[0], reference.down(**args))


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("hidden,inter,m", [(4096, 14336, 1024), (2048, 4096, 4100)])
def test_nvfp4_prefill(hidden, inter, m, residual):
    """The dequantized nvfp4 weight (DISPATCH D26) through the 192-row tile: gate_up with unequal
    gate / up global scales, and down with and without a residual."""
    x, w, ws, gs = nv.gate_up_operands(m, hidden, inter, seed=m)
    cfg = kg.GateUpConfig(mainloop="bf16", dequantized=True, h_format="bf16", **WG3)
    h = nv._kernel_gate_up(cfg, x, w, ws, gs)
    _same(h, nv._kernel_gate_up(dataclasses.replace(cfg, **ROW128), x, w, ws, gs))
    h_ref, _ = reference.gate_up(x, w, ws, None, gs, interleave=128, h_format="bf16")
    assert_bf16_close(h, h_ref, nv.TOL)
    hd, wd, wsd, gsd = nv.down_operands(m, hidden, inter, seed=m)
    res = (torch.randn(m, hidden, device="cuda") * 4).to(torch.bfloat16) if residual else None
    cfg = kd.DownConfig(mainloop="bf16", dequantized=True, residual=residual, **WG3)
    y = kd.down(cfg, hd, wd, wsd, None, res, gsd)
    _same(y, kd.down(dataclasses.replace(cfg, **ROW128), hd, wd, wsd, None, res, gsd))
    assert_bf16_close(y, reference.down(hd, wd, wsd, None, gsd, residual=res), nv.TOL)


@pytest.mark.parametrize("mainloop", ["bf16", "nvfp4"])
@pytest.mark.parametrize("shape,m", [((1024, 384, 1536), 300), ((3072, 9216, 9216), 4608)],
                         ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_split(shape, m, mainloop):
    k, p, i = shape
    if mainloop == "nvfp4" and p % 256:
        pytest.skip("nvfp4's split kernel takes P a multiple of 256")
    args = sp.make_operands(m, k, p, i, mainloop, seed=m + p)
    cfg = ks.SplitConfig(mainloop="bf16", dequantized=mainloop == "nvfp4", h_format="bf16", prefix=p, **WG3)
    outs = []
    for c in (cfg, dataclasses.replace(cfg, **ROW128)):
        out = torch.full((m, p + i), float("nan"), dtype=torch.bfloat16, device="cuda")
        ks.gate_up_split(c, args["x"], args["weight"], args.get("weight_scale"), None, args.get("global_scale"),
                         out=out)
        outs.append(out)
    _same(*outs)
    sp.assert_matches_reference(outs[0], args, p, "silu")
