"""fp8 weights in the tile-major order (kernels/fp8_layout.py, TileConfig.tile_major on the fp8
mainloop; gate_up's dispatched, D38, down's measured only): every fp8 tile reads them into the same smem bytes, so h and y
are bit-identical to the packed order's, and within DESIGN §4 of the reference."""

import dataclasses

import pytest
import torch

from swiglu_fused.kernels import fp8_layout
from . import test_down_gpu as down_tests, test_gate_up_gpu as gate_up_tests
from .tolerance import assert_bf16_close

pytest.importorskip("cutlass")

# (tile fields, M): the swap-AB tile (whole tiles, K pairs, four K parts), the 64-row tile
# (stream-K), the 128-row tile with staged scales and the static k loop, and in cluster pairs
GATE_UP_TILES = [
    (dict(tile_m=16, stages=5, swap_ab=True, uniform_ab=True), 3),
    (dict(tile_m=16, stages=5, swap_ab=True, cluster_k=2, pdl=True, uniform_ab=True), 16),
    (dict(tile_m=16, stages=5, swap_ab=True, cluster_k=4), 1),
    (dict(tile_m=64, stages=5), 100),
    (dict(tile_m=128, stages=4, smem_scales=True, static_stages=True, uniform_ab=True), 1024),
    (dict(tile_m=128, stages=4, smem_scales=True, static_stages=True, uniform_ab=True, cluster_m=2), 777),
]
DOWN_TILES = [
    (dict(tile_m=16, stages=6, swap_ab=True), 5),
    (dict(tile_m=16, stages=5, swap_ab=True, cluster_k=4), 16),
    (dict(tile_m=64, stages=5, l2_hint="w_first"), 128),
    (dict(tile_m=128, stages=4, y_slab_cols=64, smem_scales=True, static_stages=True, uniform_ab=True), 1024),
]


@pytest.mark.parametrize("hidden,inter", [(4096, 14336), (8192, 3584), (1024, 1536)])
@pytest.mark.parametrize("fields,m", GATE_UP_TILES)
def test_gate_up_reads_a_tile_major_fp8_weight_bit_for_bit(hidden, inter, fields, m):
    from swiglu_fused.kernels.sm90 import gate_up as k

    cfg = k.GateUpConfig(**fields)
    tiles = -(-m // cfg.tile_m) * (2 * inter // 256)
    if cfg.cluster_k > 1 and cfg.cluster_k * tiles > torch.cuda.get_device_properties(0).multi_processor_count:
        pytest.skip(f"{tiles} tiles: a cluster of {cfg.cluster_k} K parts each does not fit on the GPU")
    args = gate_up_tests.make_operands(m, hidden, inter, "fp8_block128", seed=m + hidden)
    h, hs = gate_up_tests.run_kernel(cfg, args)
    tiled = dict(args, weight=fp8_layout.to_tile_major(args["weight"]))
    h_t = torch.full_like(h.view(torch.uint8), 0x7F).view(h.dtype)  # e4m3 NaN
    hs_t = torch.full((inter // 128, m), float("nan"), device="cuda").t()
    k.gate_up(dataclasses.replace(cfg, tile_major=True), tiled["x"], tiled["weight"], tiled["weight_scale"],
              tiled["x_scale"], out=(h_t, hs_t), tile_major=True)
    assert torch.equal(h.view(torch.uint8), h_t.view(torch.uint8)) and torch.equal(hs, hs_t)
    gate_up_tests.assert_matches_reference(h_t, hs_t, args, "silu", "fp8_group128")


@pytest.mark.parametrize("hidden,inter", [(4096, 14336), (8192, 3584), (1024, 1536)])
@pytest.mark.parametrize("fields,m", DOWN_TILES)
def test_down_reads_a_tile_major_fp8_weight_bit_for_bit(hidden, inter, fields, m):
    from swiglu_fused.kernels import reference
    from swiglu_fused.kernels.sm90 import down as k

    args = down_tests.make_operands(m, hidden, inter, "fp8_block128", False, seed=m + inter)
    cfg = k.DownConfig(**fields)
    ys = []
    for c, w, tm in ((cfg, args["weight"], False),
                     (dataclasses.replace(cfg, tile_major=True), fp8_layout.to_tile_major(args["weight"]), True)):
        y = torch.full((m, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
        ys.append(k.down(c, args["h"], w, args["weight_scale"], args["h_scale"], None, out=y, tile_major=tm))
    assert torch.equal(ys[0], ys[1])
    assert_bf16_close(ys[1], reference.down(**args))


def test_a_weight_in_the_other_order_is_refused():
    from swiglu_fused.kernels.sm90 import down as k

    args = down_tests.make_operands(16, 1024, 1536, "fp8_block128", False, seed=1)
    cfg = k.DownConfig(tile_m=16, stages=6, swap_ab=True)
    with pytest.raises(ValueError, match="tile_major"):
        k.down(cfg, args["h"], args["weight"], args["weight_scale"], args["h_scale"], tile_major=True)
    with pytest.raises(ValueError, match="tile_major"):  # 1000 rows: no whole 256-row tiles
        k.down(dataclasses.replace(cfg, tile_major=True), args["h"][:, :1536], args["weight"][:1000],
               args["weight_scale"][:8], args["h_scale"], tile_major=True)


@pytest.mark.parametrize("hidden,inter", [(4096, 14336), (8192, 3584)])
def test_a_module_holding_gate_ups_fp8_weight_tile_major_gives_the_same_bits(hidden, inter, monkeypatch):
    """dispatch.FP8_TILE_MAJOR (D38): the module holds gate_up's fp8
    weight tile-major and every tile dispatch picks for it (swap-AB, K pairs, the 64-row tiles,
    the 128-row static tile, cluster pairs) gives the packed order's y bit for bit."""
    from swiglu_fused import FusedSwiGLUMLP
    from swiglu_fused.kernels import dispatch

    g = torch.Generator(device="cuda").manual_seed(hidden)
    gate, up = (torch.randn(inter, hidden, device="cuda", generator=g) * 0.05 for _ in range(2))
    down = torch.randn(hidden, inter, device="cuda", generator=g) * 0.05
    monkeypatch.setattr(dispatch, "FP8_TILE_MAJOR", False)
    plain = FusedSwiGLUMLP.from_linear(gate, up, down, weight_format="fp8_block128").cuda()
    assert not plain.gate_up_interleaved.tile_major
    monkeypatch.setattr(dispatch, "FP8_TILE_MAJOR", True)
    held = FusedSwiGLUMLP.from_linear(gate, up, down, weight_format="fp8_block128").cuda()
    assert held.gate_up_interleaved.tile_major and not held.down_proj.tile_major
    for m in (1, 16, 100, 1024, 4096):
        x = torch.randn(m, hidden, device="cuda", generator=g).to(torch.bfloat16)
        assert torch.equal(held(x), plain(x)), m
