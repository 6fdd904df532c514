"""The persistent stream-K schedule of the sm90 GEMM (schedule.plan / sk_iter_begin / sk_cta_of),
checked on the host: the kernel evaluates the same integer formulas in Int32, and walks the
segments that `segments` below lists (GemmKernel._segment)."""

import dataclasses
import itertools
import math

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("cutlass")
from swiglu_fused.kernels import dispatch, dispatch_nvfp4  # noqa: E402
from swiglu_fused.kernels.sm90 import gemm, schedule as g, tile_config  # noqa: E402


def segments(b, ctas, tiles, sk_tiles, k_tiles):
    """CTA b's work as the kernel walks it: [(tile, kb0, kb1)]."""
    dp_tiles = tiles - sk_tiles
    sk_iters = sk_tiles * k_tiles
    it_begin, it_end = g.sk_iter_begin(b, ctas, sk_iters), g.sk_iter_begin(b + 1, ctas, sk_iters)
    dp_iters = (dp_tiles - b + ctas - 1) // ctas * k_tiles
    out, v = [], 0
    while v < dp_iters + it_end - it_begin:
        if v < dp_iters:
            seg = (b + v // k_tiles * ctas, 0, k_tiles)
        else:
            it = it_begin + v - dp_iters
            s = it // k_tiles
            kb0 = it - s * k_tiles
            seg = (dp_tiles + s, kb0, min(k_tiles, kb0 + it_end - it))
        out.append(seg)
        v += seg[2] - seg[1]
    return out


def check_schedule(ctas, tiles, sk_tiles, k_tiles):
    """Every k tile of every tile done exactly once; shared tiles' contributors found by
    sk_cta_of; their partial slots distinct. Returns each CTA's k-tile count."""
    dp_tiles = tiles - sk_tiles
    sk_iters = sk_tiles * k_tiles
    covered = {}
    work = []
    for b in range(ctas):
        segs = segments(b, ctas, tiles, sk_tiles, k_tiles)
        work.append(sum(k1 - k0 for _, k0, k1 in segs))
        shared = []
        for tile, k0, k1 in segs:
            assert 0 <= tile < tiles and 0 <= k0 < k1 <= k_tiles
            for kt in range(k0, k1):
                assert (tile, kt) not in covered
                covered[(tile, kt)] = b
            if (k0, k1) != (0, k_tiles):
                shared.append(tile)
        # only the first and the last stream-K tile of a CTA can be shared: two partial slots suffice
        sk = [tile for tile, _, _ in segs if tile >= dp_tiles]
        assert len(shared) <= 2 and all(t in (sk[0], sk[-1]) for t in shared)
    assert len(covered) == tiles * k_tiles  # every k tile of every tile exactly once
    slots = set()
    for s in range(sk_tiles):
        tile = dp_tiles + s
        owners = sorted({covered[(tile, kt)] for kt in range(k_tiles)})
        c_first = g.sk_cta_of(s * k_tiles, ctas, sk_iters)
        c_last = g.sk_cta_of(s * k_tiles + k_tiles - 1, ctas, sk_iters)
        assert owners == list(range(c_first, c_last + 1))
        if c_first != c_last:
            for c in owners:  # the fix-up finds each partial where its CTA stored it
                slot = 0 if g.sk_iter_begin(c, ctas, sk_iters) // k_tiles == s else 1
                assert (c, slot) not in slots
                slots.add((c, slot))
    return work


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 140), st.integers(1, 600), st.integers(0, 600), st.integers(1, 200))
def test_schedule_covers_every_k_tile_once(ctas, tiles, sk_tiles, k_tiles):
    """Any split between whole tiles and stream-K tiles the kernel can be launched with (plan()
    uses all-or-nothing, the kernel does not depend on that). Precondition of the kernel: every CTA
    gets at least one stream-K k tile (ctas ≤ sk_tiles · k_tiles), or a shared tile's contributor
    range would include a CTA that never arrives."""
    sk_tiles = min(sk_tiles, tiles)
    assume(sk_tiles == 0 or ctas <= sk_tiles * k_tiles)
    check_schedule(ctas, tiles, sk_tiles, k_tiles)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 2000), st.integers(1, 300), st.integers(1, 140), st.integers(1, 4))
def test_plan_is_a_valid_balanced_schedule(tiles, k_tiles, sms, grid_m):
    ctas, sk_tiles = g.plan(tiles, k_tiles, sms, grid_m)
    assert 1 <= ctas <= sms and sk_tiles in (0, tiles)
    work = check_schedule(ctas, tiles, sk_tiles, k_tiles)
    if sk_tiles:
        assert max(work) - min(work) <= 1 and min(work) >= g.SK_MIN_ITERS


@given(st.integers(1, 10**4), st.integers(1, 200))
def test_sk_cta_of_inverts_sk_iter_begin(sk_iters, ctas):
    for it in itertools.islice(range(sk_iters), 0, sk_iters, max(1, sk_iters // 97)):
        c = g.sk_cta_of(it, ctas, sk_iters)
        assert g.sk_iter_begin(c, ctas, sk_iters) <= it < g.sk_iter_begin(c + 1, ctas, sk_iters)


@pytest.mark.parametrize(
    "tiles,k_tiles,grid_m,expect_ctas",
    [
        (56, 64, 2, 56),  # gate_up M = 128, H 8192, I 3584: whole tiles (measured faster, ITER_US)
        (16, 112, 1, 48),  # down decode, H 4096, I 14336: 16 tiles split in 3
        (112, 32, 1, 112),  # gate_up decode, H 4096, I 14336: 112 CTAs already saturate HBM
        (32, 28, 1, 32),  # down decode, H 8192, I 3584: K too short for the fix-up to pay
        (224, 64, 8, 132),  # gate_up M = 1024, H 8192: more than 2 M tiles, whole tiles only
        (12, 5, 1, 12),  # K = 640: too few k tiles to share
    ],
)
def test_plan_picks_stream_k_where_it_pays(tiles, k_tiles, grid_m, expect_ctas):
    ctas, sk_tiles = g.plan(tiles, k_tiles, 132, grid_m)
    assert ctas == expect_ctas and (sk_tiles > 0) == (ctas > tiles)


def test_plan_keeps_whole_tiles_for_the_swap_ab_tile():
    """The 16-token tile streams a k tile in 0.4 µs: its 28 whole tiles at H 8192, I 3584 measured
    faster (28.3 µs) than any stream-K split (29.2-29.8 µs), and plan() agrees."""
    assert g.plan(28, 64, 132, 1, iter_us=g.ITER_US["swap16"]) == (28, 0)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5000), st.sampled_from([576, 2048, 4096, 8192, 14336, 28672]),
       st.sampled_from([1024, 2048, 4096, 7168, 8192, 28672]), st.sampled_from(["gate_up", "down"]),
       st.sampled_from(["fp8_block128", "bf16"]))
@example(16, 8192, 7168, "gate_up", "fp8_block128")  # stream-K: gate_up decode, I = 3584
@example(100, 14336, 4096, "down", "bf16")  # stream-K: down, 128-row tile
@example(4096, 4096, 28672, "gate_up", "fp8_block128")  # whole tiles
def test_launch_plan_meets_the_kernels_preconditions(m, k, n, op, mainloop):
    """What the host hands the kernel for every shipped tile: a grid within the SMs, every CTA with
    a stream-K k tile, and a workspace of exactly two slots of 128 fp32 per consumer thread."""
    from unittest import mock

    import torch

    if op == "gate_up":
        (tile_m, _, swap), shipped = dispatch.gate_up_tile_for(m, n, 132, mainloop, k=k), dispatch.gate_up_shipped()
    else:
        (tile_m, _, swap), shipped = dispatch.down_tile_for(m, mainloop), dispatch.down_shipped()
    cfg = next(c for c in shipped
               if c.mainloop == mainloop and c.tile_m == tile_m and c.swap_ab == swap)
    with mock.patch.object(g, "sm_count", lambda device: 132):
        ctas, sk_tiles, parts, ctr = g.launch_plan(cfg, m, n, k, torch.device("cpu"))
    tiles = -(-m // cfg.tile_m) * -(-n // cfg.tile_n)
    k_tiles = -(-k // cfg.tile_k)
    assert 1 <= ctas <= 132
    if sk_tiles == 0:
        assert parts is None and ctr is None and ctas == min(tiles, 132)
    else:
        assert sk_tiles == tiles and ctas <= sk_tiles * k_tiles
        assert parts.numel() == ctas * 2 * 128 * cfg.consumer_threads and parts.dtype == torch.float32
        assert ctr.numel() == sk_tiles + 1 and not ctr.any()


@pytest.mark.parametrize("m,hidden,inter,expect", [
    # cuBLAS / kernel, both reading h_scale M-major (down.py)
    (16, 4096, 14336, True),  # swap-AB tile, stream-K over K = 14336: 1.04
    (64, 4096, 14336, True),  # swap-AB tile, 4 M tiles, stream-K: 1.27
    (128, 4096, 14336, True),  # 64-row tile, stream-K: 1.14
    (16, 8192, 3584, True),  # swap-AB tile, whole tiles (K = 3584): 1.00 (M = 1: 1.50, cuBLAS pads)
    (64, 8192, 3584, True),  # 0.97
    (128, 8192, 3584, False),  # 64-row tile, whole tiles: 0.88
    (256, 4096, 14336, False),  # 128-row tile, stream-K (no static k loop): 0.85
    # the static 128-row tile (D36, H200): where its rounds of waves beat cuBLAS's 128 × 128 tiles'
    (1024, 4096, 14336, True),  # one wave against cuBLAS's two: 1.05
    (4096, 8192, 3584, True),  # 1.09
    (384, 8192, 3584, True),  # 96 tiles: 1.07-1.22
    (512, 4096, 14336, False),  # 64 tiles, half a wave, against cuBLAS's one: 0.48
    (1152, 4096, 14336, False),  # a wave and 16 tiles: 0.80
    (640, 8192, 3584, False),  # a wave and 28 tiles: 0.85
    (1024, 4096, 5504, False),  # K not whole rings of 512: no static k loop, cuBLAS
])
def test_down_runs_the_kernel_where_it_was_measured_faster(m, hidden, inter, expect):
    import torch

    fp8 = torch.float8_e4m3fn
    h, w = torch.empty(m, inter, dtype=fp8), torch.empty(hidden, inter, dtype=fp8)
    hs, ws = torch.empty(m, inter // 128), torch.empty(hidden // 128, inter // 128)
    cfg = dispatch.down_config(h, w, ws, hs, None, torch.bfloat16)
    if m > 128 and (m + 127) // 128 <= 2:  # (with_static_stages leaves a tile stream-K may split on the GPU)
        cfg = dataclasses.replace(cfg, static_stages=False)
    assert dispatch.beats_cublas(cfg, m, hidden, inter, 132) == expect


@pytest.mark.parametrize("m,hidden,inter,expect", [
    (1, 4096, 14336, False), (16, 4096, 14336, False), (128, 4096, 14336, False),  # stream-K would share K: cuBLAS
    (64, 2048, 8192, False), (16, 3584, 18944, False), (16, 8192, 3584, False),  # (D44)
    (1024, 4096, 14336, True), (8192, 4096, 14336, False),  # tiles that fill the SMs, up to MAX_M (D16)
    (1024, 8192, 3584, True), (2048, 4096, 14336, True),
    # ... whose rounds are shorter than cuBLAS's 128 × 128 tiles' (D47): not a partial second wave
    (576, 8192, 3584, False), (768, 8192, 3584, False), (1152, 4096, 14336, False), (2560, 4096, 14336, False),
])
def test_bf16_down_runs_the_kernel_only_where_its_tiles_fill_the_gpu(m, hidden, inter, expect):
    import torch

    h, w = torch.empty(m, inter, dtype=torch.bfloat16), torch.empty(hidden, inter, dtype=torch.bfloat16)
    cfg = dispatch.down_config(h, w, None, None, None, torch.bfloat16)
    assert dispatch.beats_cublas(cfg, m, hidden, inter, 132) == expect


@pytest.mark.parametrize("m,inter,expect", [
    (1, 14336, (16, True)),  # swap-AB at M ≤ 32 on every shape
    (32, 14336, (16, True)),
    (64, 3584, (16, True)),  # 4 M tiles × 28 fit one wave
    (64, 14336, (64, False)),  # 4 × 112 do not: the 64-row tile
    (128, 3584, (64, False)),  # 2 × 28 64-row tiles fit one wave
    (256, 3584, (64, False)),
    (128, 14336, (128, False)),  # 2 × 112 do not: the 128-row tile (bf16; fp8: split64_applies)
    (1024, 3584, (128, False)),
])
def test_gate_up_tile_for_follows_the_measured_rule(m, inter, expect):
    tile_m, _, swap = dispatch.gate_up_tile_for(m, 2 * inter, 132, "bf16", k=4096)
    assert (tile_m, swap) == expect
    fp8 = dispatch.gate_up_tile_for(m, 2 * inter, 132, "fp8_block128", k=4096)
    assert fp8 == ((64, 5, False) if dispatch.split64_applies(m, 2 * inter, 132, "fp8_block128", k=4096) and not swap
                   else dispatch.gate_up_tile_for(m, 2 * inter, 132, "bf16", k=4096))


@pytest.mark.parametrize("m,n", [(1, 7168), (129, 3072), (1100, 28672), (4096, 28672), (16384, 7168)])
def test_cluster_pairs_launch_whole_tiles_in_pairs(m, n):
    """Cluster pairs (gate_up.CLUSTER_PAIR): M tiles padded to pairs, whole tiles, an even grid."""
    from swiglu_fused.kernels.sm90 import gate_up

    ctas, sk_tiles = g.schedule(gate_up.CLUSTER_PAIR, m, n, 4096, 132)
    tiles = -(-m // 256) * 2 * -(-n // 256)
    assert sk_tiles == 0 and ctas % 2 == 0 and ctas == min(tiles, 132)
    # with static_stages too (whole tiles by itself), and on a GPU of an odd number of SMs
    static = dataclasses.replace(gate_up.CLUSTER_PAIR, static_stages=True)
    assert g.schedule(static, m, n, 4096, 132) == (ctas, 0)
    assert g.schedule(static, m, n, 4096, 131) == g.schedule(gate_up.CLUSTER_PAIR, m, n, 4096, 131)
    assert g.schedule(static, m, n, 4096, 131)[0] % 2 == 0


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.integers(1, 30), st.integers(1, 40), st.sampled_from([1, 2]))
def test_banded_tile_order_is_a_bijection_that_keeps_cluster_pairs(grid_m, n_tiles, band, cl):
    """_tile_mn maps the tile indices one to one onto (tm, tn); a cluster pair (tiles 2c, 2c + 1)
    gets one weight tile and adjacent M tiles; within a band, m varies fastest."""
    grid_m = -(-grid_m // cl) * cl
    band = max(cl, min(grid_m, band // cl * cl))
    kernel = gemm.GemmKernel.__new__(gemm.GemmKernel)
    coords = [kernel._tile_mn(t, (grid_m, n_tiles, band)) for t in range(grid_m * n_tiles)]
    assert sorted(coords) == [(tm, tn) for tm in range(grid_m) for tn in range(n_tiles)]
    if cl == 2:
        for t in range(0, len(coords), 2):
            assert coords[t + 1] == (coords[t][0] + 1, coords[t][1])
    for t in range(len(coords) - 1):
        (m0, n0), (m1, n1) = coords[t], coords[t + 1]
        assert (m1, n1) == (m0 + 1, n0) or m1 % band == 0 or m1 == m0 - (m0 % band)


def test_band_rows_keep_a_within_the_l2_budget():
    # gate_up 8192×3584 at M = 16384, fp8, 128-row tiles in pairs: 1 MiB of x per M tile
    assert g.band_rows(128, 128 * 8192, 2) == 32
    # M = 4096 fits in one band: plain m-fastest order, as measured before bands existed
    assert g.band_rows(32, 128 * 8192, 2) == 32 and g.band_rows(32, 128 * 4096, 1) == 32
    # an A tile larger than the budget still makes bands of one cluster
    assert g.band_rows(64, 64 << 20, 2) == 2


def test_cluster_k_where_few_swap_tiles_leave_hbm_idle():
    """The swap-AB tile (either mainloop) splits K over cluster pairs at ≤ 0.25 × SMs tiles (8192×3584 at M ≤ 16:
    28 tiles), measured faster there and not at 56 or 64 tiles; the grid is then 2 CTAs a tile."""
    from swiglu_fused.kernels.sm90 import gate_up

    assert dispatch.gate_up_cluster_k(16, 7168, 132, "fp8_block128")
    assert not dispatch.gate_up_cluster_k(32, 7168, 132, "fp8_block128")  # 56 tiles
    assert not dispatch.gate_up_cluster_k(16, 16384, 132, "fp8_block128")  # 2048×8192: 64 tiles
    assert dispatch.gate_up_cluster_k(16, 7168, 132, "bf16")  # measured 1.02-1.05× there too
    cfg = gate_up.GateUpConfig(tile_m=16, stages=5, swap_ab=True, cluster_k=2, pdl=True,  # (fp8 decode: D20)
                               uniform_ab=True)  # (D35)
    assert cfg in dispatch.gate_up_shipped()
    assert g.schedule(cfg, 16, 7168, 8192, 132) == (56, 28)
    import torch
    from unittest import mock

    with mock.patch.object(g, "sm_count", lambda device: 132):
        ctas, sk_tiles, parts, ctr = g.launch_plan(cfg, 16, 7168, 8192, torch.device("cpu"))
    assert (ctas, sk_tiles, parts, ctr) == (56, 28, None, None)  # the partials go through DSMEM
    with pytest.raises(ValueError, match="cluster_k"):
        g.schedule(cfg, 64, 16384, 2048, 132)  # 256 tiles: no cluster pair for each
    with pytest.raises(ValueError, match="cluster_k"):
        gate_up.GateUpConfig(tile_m=128, stages=2, cluster_k=2)  # swap-AB and 64-row tiles only
    with pytest.raises(ValueError, match="stages"):
        gate_up.GateUpConfig(tile_m=64, stages=4, cluster_k=2)  # the 64 KB accumulator leaves room for 3


@pytest.mark.parametrize("m,hidden,inter,ck", [(1, 4096, 14336, 4), (16, 4096, 14336, 4), (17, 4096, 14336, 2),
                                                 (32, 4096, 14336, 2), (64, 4096, 14336, 1), (1, 8192, 3584, 1),
                                                 (16, 8192, 3584, 1), (16, 2048, 8192, 1)])
def test_down_k_parts_over_clusters_of_4_without_pdl(m, hidden, inter, ck):
    """DISPATCH D17, D37, D40: where plan() would split a few fp8 swap-AB down tiles in two (4096×14336
    at M ≤ 16: 16 tiles), their K runs in four parts over a cluster (64 CTAs, 5 stages), launched
    without PDL; where the clusters of 4 would take more than half the SMs (M = 17-32: 32 tiles),
    in K pairs (64 clusters of 2, 6 stages) with PDL; whole tiles (8192×3584: 32 of them; 2048×8192)
    and many tiles (M = 64) keep plan()'s schedule and PDL. Every config so picked is one CI compiles."""
    import torch

    fp8 = torch.float8_e4m3fn
    h, dw = torch.empty(m, inter, dtype=fp8, device="meta"), torch.empty(hidden, inter, dtype=fp8, device="meta")
    scale = torch.empty(1, device="meta")
    cfg = dispatch.down_config(h, dw, scale, scale, None, torch.bfloat16)  # (meta: no cluster picked yet)
    cfg = dispatch.with_down_cluster_k(cfg, m, hidden, inter, 132)
    assert cfg.cluster_k == ck and cfg.pdl == (ck != 4) and cfg in dispatch.down_shipped()
    if ck == 4:
        assert cfg.stages == 5 and g.schedule(cfg, m, hidden, inter, 132) == (64, 16)
    if ck == 2:
        assert cfg.stages == 6 and g.schedule(cfg, m, hidden, inter, 132) == (64, 32)


@pytest.mark.parametrize("mainloop", [tile_config.FP8_MAINLOOP, tile_config.BF16_MAINLOOP])  # (nvfp4: one tile)
@pytest.mark.parametrize("m,hidden,inter,ck,stages", [
    (32, 8192, 3584, 1, 6), (64, 8192, 3584, 1, 6),  # a CTA streams all 8192 of K: six stages
    (16, 8192, 3584, 2, 5),  # K pairs (4096 a CTA, and measured only so): five
    (16, 4096, 14336, 1, 5), (32, 2048, 8192, 1, 5), (1, 16384, 1024, 2, 5),
])
def test_gate_up_swap_tile_stages_follow_the_k_a_cta_streams(mainloop, m, hidden, inter, ck, stages):
    import torch
    from unittest import mock

    dt = torch.float8_e4m3fn if mainloop == "fp8_block128" else torch.bfloat16
    x, w = torch.empty(m, hidden, dtype=dt, device="meta"), torch.empty(2 * inter, hidden, dtype=dt, device="meta")
    scales = (torch.empty(1, device="meta"),) * 2 if mainloop == "fp8_block128" else (None, None)
    h_format = "fp8_group128" if mainloop == "fp8_block128" else "bf16"
    with mock.patch.object(g, "sm_count", lambda device: 132):
        cfg = dispatch.gate_up_config(x, w, *scales, act="silu", h_format=h_format)
    assert (cfg.swap_ab, cfg.cluster_k, cfg.stages) == (True, ck, stages)
    assert cfg in dispatch.gate_up_shipped()


@pytest.mark.parametrize("m,inter,expect", [
    (1024, 3584, 224),  # 28 → 32 h tiles a row of M tiles: 224 → 256 tiles, two rounds of 7/8 the work
    (256, 14336, 224),
    (512, 3584, 224),  # one round either way, of 112 columns instead of 128
    (1024, 14336, None),  # 896 → 1024 tiles: seven rounds → eight of 7/8, no gain
    (4096, 3584, None),
    (1024, 1536, 192),  # 96 → 128 tiles: one round of 3/4 the work (I % 112 != 0)
    (256, 12288, 192),  # (Qwen3-8B) 192 → 256 tiles: two rounds of 3/4
    (1024, 12288, None),  # 768 → 1024: six rounds → eight of 3/4, a tie
    (1024, 8192, None),  # neither width divides I
])
def test_gate_up_granule_tile_where_its_rounds_are_shorter(m, inter, expect):
    from swiglu_fused.kernels.sm90 import gate_up

    assert dispatch.granule_tile_n(m, 2 * inter, 132) == expect
    for tile_n in tile_config.TILE_N_GRANULES:
        cfg = gate_up.GateUpConfig(tile_m=128, tile_n=tile_n, stages=4, mainloop="bf16", h_format="bf16")
        assert cfg in dispatch.gate_up_shipped()
        tiles = -(-m // 128) * -(-inter // (tile_n // 2))
        assert g.schedule(cfg, m, 2 * inter, 4096, 132) == (min(132, tiles), 0)  # whole tiles


@pytest.mark.parametrize("m,n,expect", [
    # (M, N weight rows): the measured speed-ups of the 192-row tile over the dispatched 128-row one
    (16384, 2 * 14336, True), (8192, 2 * 14336, True), (4096, 2 * 14336, True),  # 1.03, 1.02-1.03, 0.98-1.05
    (8192, 2 * 8192, True), (16384, 2 * 8192, True),  # 1.05-1.08, 1.05-1.06
    (16384, 2 * 3584, True), (4608, 18432 + 2 * 18432, True),  # 1.01-1.02; Flux.2-dev's projection 1.00-1.02
    (8192, 2 * 3584, False), (4096, 2 * 3584, False), (4096, 2 * 8192, False),  # 0.96-0.98, 0.96-1.00, 0.97-0.99
    (1024, 2 * 14336, False), (1024, 2 * 3584, False),  # 0.85, 0.60: a partial last wave
])
def test_wg3_tile_where_its_rounds_are_shorter(m, n, expect):
    from swiglu_fused.kernels.sm90 import gate_up

    assert dispatch.wg3_applies(m, n, 132) == expect
    cfg = gate_up.GateUpConfig(tile_m=tile_config.TILE_M_WG3, stages=dispatch.WG3_STAGES, mainloop="bf16",
                               h_format="bf16")
    assert cfg in dispatch.gate_up_shipped() and cfg.consumer_threads == 384
    assert g.schedule(cfg, m, n, 4096, 132) == (min(132, -(-m // 192) * -(-n // 256)), 0)  # whole tiles


@pytest.mark.parametrize("kw", [dict(mainloop="fp8_block128"), dict(mainloop="nvfp4"), dict(cluster_m=2),
                                dict(tile_n=224, h_format="bf16"), dict(tma_store=True), dict(swap_ab=True)])
def test_wg3_tile_only_for_the_bf16_mainloop_on_256_rows(kw):
    from swiglu_fused.kernels.sm90 import gate_up

    with pytest.raises(ValueError, match="tile_m"):
        gate_up.GateUpConfig(**{"tile_m": 192, "stages": 3, "mainloop": "bf16", **kw})


@pytest.mark.parametrize("kw", [dict(mainloop="fp8_block128", h_format="bf16"), dict(mainloop="bf16"),
                                dict(mainloop="bf16", h_format="bf16", tile_m=64),
                                dict(mainloop="bf16", h_format="bf16", cluster_m=2)])
def test_granule_tile_only_for_bf16_to_bf16_on_128_rows(kw):
    from swiglu_fused.kernels.sm90 import gate_up

    with pytest.raises(ValueError, match="tile_n = 224"):
        gate_up.GateUpConfig(**{"tile_m": 128, "tile_n": 224, "stages": 4, **kw})


@pytest.mark.parametrize("m,tile_m,tile_n,expect", [
    (4096, 128, 256, 2), (16384, 128, 256, 2),  # measured 1-4 % faster in cluster pairs
    (4095, 128, 256, 1), (1024, 128, 256, 1),  # level there: no clusters
    (4096, 128, 224, 1), (4096, 64, 256, 1),  # the granule and 64-row tiles have no pairs
])
def test_gate_up_cluster_pairs_from_m_4096(m, tile_m, tile_n, expect):
    from swiglu_fused.kernels.sm90 import gate_up

    assert dispatch.cluster_m_for(m, tile_m, tile_n) == expect
    for mainloop in (tile_config.FP8_MAINLOOP, tile_config.BF16_MAINLOOP):  # (nvfp4 has no clusters)
        for h_format in ("fp8_group128", "bf16"):
            cfg = gate_up.GateUpConfig(tile_m=128, stages=4, cluster_m=2, mainloop=mainloop, h_format=h_format,
                                       smem_scales=dispatch.smem_scales_apply(128, False, mainloop, h_format),
                                       uniform_ab=dispatch.uniform_ab_applies(mainloop))
            assert cfg in dispatch.gate_up_shipped()


def test_gate_up_fp8_64_row_tile_on_two_warpgroups():
    """The fp8 64-row tile is shipped as split_n (4 stages: the up half's 32 KB hand-over takes a
    stage's room; 5 with the hand-over in parts); bf16 keeps the one-warpgroup tile; split_n is
    that tile only."""
    from swiglu_fused.kernels.sm90 import gate_up

    assert dispatch.split_n_applies(64, False, "fp8_block128")
    assert not dispatch.split_n_applies(64, False, "bf16") and not dispatch.split_n_applies(128, False, "fp8_block128")
    assert not dispatch.split_n_applies(16, True, "fp8_block128")
    shipped = dispatch.gate_up_shipped()
    assert gate_up.GateUpConfig(tile_m=64, stages=4, split_n=True, l2_hint="w_first", uniform_ab=True) in shipped
    assert gate_up.GateUpConfig(tile_m=64, stages=5, split_n=True, xacc_parts=2, l2_hint="w_first",
                                uniform_ab=True) in shipped
    assert gate_up.GateUpConfig(tile_m=64, stages=5, split_n=True, xacc_parts=4, h_format="bf16",
                                l2_hint="w_first", uniform_ab=True) in shipped
    assert gate_up.GateUpConfig(tile_m=64, stages=5, uniform_ab=True) not in shipped
    assert gate_up.GateUpConfig(tile_m=64, stages=5, mainloop="bf16", l2_hint="w_first") in shipped
    for bad in (dict(tile_m=128), dict(mainloop="bf16"), dict(cluster_k=2, stages=3)):
        with pytest.raises(ValueError, match="split_n"):
            gate_up.GateUpConfig(**{"tile_m": 64, "stages": 4, "split_n": True, **bad})
    for parts, h_format in ((1, "fp8_group128"), (2, "bf16")):  # a fifth stage needs the hand-over in parts
        with pytest.raises(ValueError, match="stages"):
            gate_up.GateUpConfig(tile_m=64, stages=5, split_n=True, xacc_parts=parts, h_format=h_format)
    with pytest.raises(ValueError, match="xacc_parts"):
        gate_up.GateUpConfig(tile_m=64, stages=5, xacc_parts=2)


def test_fixup_unroll_is_on_only_in_nvfp4_downs_32_to_64_token_tiles():
    """TileConfig.fixup_unroll (the stream-K fix-up's partials in flight at a time): 1 in every other
    config the dispatch returns (level where measured, history/mlp.md), 4 in nvfp4 down's 32-64-token
    swap-AB tiles (DISPATCH D63); 1, 2, 4 or 8 only."""
    from swiglu_fused.kernels.sm90 import gate_up

    unrolled = [c for c in dispatch.gate_up_shipped() + dispatch.down_shipped() if c.fixup_unroll != 1]
    assert unrolled and all(c.epilogue == "linear" and c.nvfp4 and c.swap_ab and 32 <= c.tile_m <= 64
                            and c.fixup_unroll == 4 for c in unrolled)
    assert gate_up.GateUpConfig(tile_m=16, stages=5, swap_ab=True, fixup_unroll=4).fixup_unroll == 4
    with pytest.raises(ValueError, match="fixup_unroll"):
        gate_up.GateUpConfig(tile_m=16, stages=5, swap_ab=True, fixup_unroll=3)


@pytest.mark.parametrize("inter,stages", [
    (1024, 5), (3584, 5), (5120, 5),  # 8, 28, 40 weight tiles of 256 rows: few streams, a fifth stage
    (5248, 4), (7168, 4), (14336, 4),  # 41, 56, 112
])
def test_gate_up_split_n_fifth_stage_where_the_weight_has_few_tiles(inter, stages):
    from swiglu_fused.kernels.sm90 import gate_up

    for h_format in ("fp8_group128", "bf16"):
        pipe = dispatch.split_n_pipeline(dispatch.split_n_deep(2 * inter), h_format)
        assert pipe["stages"] == stages
        cfg = gate_up.GateUpConfig(tile_m=64, split_n=True, h_format=h_format, l2_hint="w_first", uniform_ab=True,
                                   **pipe)
        assert cfg in dispatch.gate_up_shipped()


@pytest.mark.parametrize("m,hidden,inter,expect", [
    # D52: at 0.83 faster where K ≥ 5120 (measured at these four) ...
    (600, 8192, 7168, True), (225, 7168, 18432, True), (1200, 8192, 3584, True), (300, 5120, 13824, True),
    # ... not where K ≤ 4096 (0-8 % slower or level at these four)
    (289, 4096, 14336, False), (577, 2048, 8192, False), (400, 4096, 11008, False), (225, 3584, 18944, False),
    (321, 7168, 18432, False),  # (long K at 0.875, 3.3 waves: as D42, not taken)
])
def test_gate_up_fp8_64_row_tile_share_over_a_long_k(m, hidden, inter, expect):
    """DISPATCH D52: fp8's 64-row tile where its rounds take at most 0.85 of the 128-row tiles' when
    K ≥ SPLIT64_LONG_K, 0.8 below."""
    assert dispatch.split64_applies(m, 2 * inter, 132, "fp8_block128", k=hidden) == expect


@pytest.mark.parametrize("m,hidden,inter,expect", [
    # D56: predicted at 0.56-0.75 of the 64-row tiles' round, measured 3-25 % faster (the MLP) ...
    (96, 16384, 2048, True), (256, 16384, 2048, True), (128, 16384, 1024, True), (192, 12288, 1536, True),
    (96, 12288, 2048, True), (256, 16384, 2560, True), (65, 16384, 2048, True),
    # ... not at 0.77-0.95 (7 % faster to 15 % slower) nor above 1 (7-22 % slower)
    (96, 12288, 2560, False), (128, 16384, 3072, False), (192, 16384, 3072, False), (128, 12288, 3072, False),
    (128, 8192, 2048, False), (256, 7168, 2048, False), (128, 8192, 3584, False), (128, 4096, 2048, False),
    (128, 2048, 8192, False),
    # ... nor past two M tiles of 128 rows (plan() keeps them whole), nor at decode (the swap-AB tiles)
    (257, 16384, 2048, False), (64, 16384, 2048, False),
])
def test_gate_up_fp8_128_row_stream_k_over_a_long_k(monkeypatch, m, hidden, inter, expect):
    """DISPATCH D56: fp8 gate_up takes the 128-row tile in stream-K instead of the 64-row tile where
    schedule's cost model predicts its plan at most SK128_SHARE of the 64-row tiles' whole round
    (as measured, before D57 split the 64-row tile too); never bf16."""
    from swiglu_fused.kernels.sm90 import schedule

    monkeypatch.setattr(schedule, "SPLIT_N_MAX_SK_GRID_M", 0)  # (the split_n tile's split off)
    assert dispatch.sk128_applies(m, 2 * inter, 132, "fp8_block128", k=hidden) == expect
    assert not dispatch.sk128_applies(m, 2 * inter, 132, "bf16", k=hidden)
    tile = dispatch.gate_up_tile_for(m, 2 * inter, 132, "fp8_block128", k=hidden)
    assert tile == (128, 4, False) if expect else tile[0] != 128 or m > 256


@pytest.mark.parametrize("m,hidden,inter,expect", [
    # D57: the split_n 64-row tile in stream-K, measured 8-67 % faster than its whole tiles and 3-27 % than
    # D56's 128-row split at all 30 points (10 widths, M = 65-128) ...
    (65, 16384, 2048, (96, 32)), (128, 16384, 1024, (96, 16)), (96, 12288, 1536, (96, 24)),
    (128, 12288, 2048, (96, 32)), (96, 16384, 2560, (120, 40)), (128, 12288, 2560, (120, 40)),
    (96, 16384, 3072, (96, 48)), (65, 12288, 3072, (96, 48)), (128, 8192, 2048, (96, 32)), (96, 7168, 2048, (96, 32)),
    # ... and past two M tiles, to four (SPLIT_N_MAX_SK_GRID_M): 3-11 % faster at all 7 points measured
    (192, 8192, 2048, (96, 48)), (200, 8192, 2048, (128, 64)), (256, 16384, 2048, (128, 64)),
    (192, 12288, 2560, (120, 60)), (192, 7168, 2048, (96, 48)),
    # ... and at any predicted gain (D59: SPLIT_N_SK_MIN_GAIN 1.0; 1.4-4.2 % faster at M = 65-128)
    (65, 8192, 3584, (112, 56)), (128, 8192, 3584, (112, 56)),
    # ... not where plan() keeps whole tiles (predicted no faster split) nor past four M tiles
    (96, 4096, 2048, None), (128, 2048, 8192, None), (320, 8192, 2048, None),
    (256, 12288, 2560, None),
])
def test_gate_up_fp8_split_n_stream_k(m, hidden, inter, expect):
    """DISPATCH D57: gate_up_config gives the split_n tile its stream-K fix-up (split_n_sk) exactly where
    plan() splits it, and then D56's 128-row tile does not beat it."""
    from unittest import mock

    import torch

    from swiglu_fused.kernels.sm90 import schedule

    x, w = torch.empty(m, hidden, dtype=torch.float8_e4m3fn), torch.empty(2 * inter, hidden, dtype=torch.float8_e4m3fn)
    xs, ws = torch.empty(m, hidden // 128), torch.empty(2 * inter // 128, hidden // 128)
    with mock.patch("swiglu_fused.kernels.sm90.schedule.sm_count", lambda device: 132):
        cfg = dispatch.gate_up_config(x, w, ws, xs, act="silu", h_format="fp8_group128", tile_major=True)
    assert cfg.tile_m == 64 and cfg.split_n and cfg.split_n_sk == (expect is not None)
    if expect:
        assert schedule.schedule(cfg, m, 2 * inter, hidden, 132) == expect
        assert cfg in dispatch.gate_up_shipped()
    else:
        assert cfg.whole_tiles


def test_plan_us_is_plan_with_its_time():
    """schedule.plan_us: plan()'s answer, and the cost model's time for it (whole tiles: their rounds,
    at least the weight's read; stream-K: the split's share plus the fix-up)."""
    from swiglu_fused.kernels.sm90 import schedule

    for tiles, k_tiles, grid_m in ((16, 128, 1), (28, 64, 1), (112, 32, 2), (300, 128, 1), (16, 4, 1), (40, 64, 3)):
        (grid, sk), t = schedule.plan_us(tiles, k_tiles, 132, grid_m, iter_us=0.84)
        assert (grid, sk) == schedule.plan(tiles, k_tiles, 132, grid_m, iter_us=0.84) and t > 0
    assert schedule.plan_us(16, 128, 132, 1, iter_us=0.84)[1] == pytest.approx(max(26 * 0.84, 16 * 128 * 32768 / 2.6e6)
                                                                               + 4.0 + 2.5 * 5)


@pytest.mark.parametrize("m,inter,expect", [
    (128, 14336, True), (80, 12288, True), (128, 13824, True),  # 112 / 96 / 108 tiles of 128 rows: one wave
    (128, 28672, False), (80, 27648, False),  # 224 / 216 tiles of 128 rows already fill 1.7 / 1.6 waves
    # D42: 148 / 192 / 160 tiles of 128 rows take two rounds where the 64-row tiles take three of half
    # the height (0.75 of the time); 416 tiles: 7 against 4 rounds (0.875), not enough
    (128, 18944, True), (80, 24576, True), (100, 20480, True), (128, 53248, False),
    # ... and from 129 rows to SPLIT64_ROUNDS_M: 4096×14336 at M = 129-192 (2 rounds of 128-row tiles
    # against 3 of 64-row ones), not at 224-256 (2 against 4); 3072×24576 at 160 (3 against 5: 0.83)
    (129, 14336, True), (192, 14336, True), (224, 14336, False), (256, 14336, False), (160, 24576, False),
    # at 193-2336 measured where it fires: e.g. I = 11008 at 200 (3 rounds against 2 of twice the height),
    # I = 6144 at 272 (2 against 2), I = 3584 at 576 (2 against 2) and 832 (3 against 2)
    (200, 11008, True), (272, 6144, True), (576, 3584, True), (832, 3584, True), (640, 14336, False),
    (4096, 3584, False),  # (from 4096 rows the 128-row tile runs in cluster pairs, D8: not measured against)
])
def test_gate_up_fp8_64_row_tile_where_128_row_tiles_fit_a_wave_or_take_longer_rounds(m, inter, expect):
    """DISPATCH D11, D42: fp8 gate_up at 64 < M ≤ 128 takes the split_n 64-row tile where the 128-row
    tiles fit one wave, and up to SPLIT64_ROUNDS_M where its rounds of waves take at most
    SPLIT64_ROUNDS of the 128-row tiles'."""
    assert dispatch.split64_applies(m, 2 * inter, 132, "fp8_block128", k=4096) == expect
    assert not dispatch.split64_applies(m, 2 * inter, 132, "bf16", k=4096)
    assert dispatch.gate_up_tile_for(m, 2 * inter, 132, "fp8_block128", k=4096)[0] == (64 if expect else 128)


@pytest.mark.parametrize("m,hidden,inter,expect", [
    # 148 / 160 tiles of 128 rows: 2 rounds, against 3 of the 64-row tile (0.75); at 160-192 rows
    # the 192-row tile (wg3) would take 2 rounds of 192 / 1.04, the 64-row one 4 of 64 (0.69)
    (100, 3584, 18944, True), (160, 3584, 18944, True), (128, 7168, 20480, True), (160, 1536, 8960, True),
    (160, 4096, 11008, True), (256, 4096, 11008, True), (288, 8192, 2048, True), (544, 8192, 3584, True),
    (160, 4096, 14336, False),  # the 192-row tile fits one wave: 3 rounds of 64 rows against 192 / 1.04
    (128, 4096, 14336, False),  # the granule tile (224: 112 h columns) fits one wave
    # D50: at 0.83-0.87 measured 10-29 % faster, e.g. 5 rounds against 3 of twice the height (0.83)
    (256, 3584, 18944, True), (224, 3584, 18944, True), (288, 4096, 14336, True), (800, 8192, 3584, True),
    (576, 2048, 8192, True), (224, 1536, 8960, True), (448, 8192, 7168, True), (448, 4096, 11008, True),
    # D51: at 0.89-0.93 3-10 % faster; at 0.95 level, at 0.98-1.0 slower
    (480, 3584, 18944, True), (449, 3584, 18944, True), (385, 7168, 18432, True), (321, 7168, 18432, True),
    (513, 4096, 14336, True), (449, 5120, 13824, True),
    (705, 4096, 14336, False), (449, 4096, 14336, False), (1025, 8192, 3584, False), (800, 8192, 7168, False),
])
def test_gate_up_bf16_64_row_tile_where_its_rounds_are_shorter(m, hidden, inter, expect):
    """DISPATCH D43, D50, D51: the bf16 mainloop's gate_up takes the 64-row tile above one wave where its
    rounds take at most BF16_TILE64_ROUNDS of those of the tile gate_up_config would otherwise run; the
    configs gate_up_config returns agree."""
    from unittest import mock

    import torch

    x, w = torch.empty(m, hidden, dtype=torch.bfloat16), torch.empty(2 * inter, hidden, dtype=torch.bfloat16)
    with mock.patch("swiglu_fused.kernels.sm90.schedule.sm_count", lambda device: 132):
        cfg = dispatch.gate_up_config(x, w, None, None, act="silu", h_format="bf16")
    assert dispatch.bf16_tile64_applies(m, 2 * inter, 132, "bf16", "bf16", k=hidden) == expect
    assert (cfg.tile_m == 64) == expect
    assert not dispatch.bf16_tile64_applies(m, 2 * inter, 132, "fp8_block128", "bf16", k=hidden)


def test_smem_scales_only_where_they_fit():
    """gate_up's fp8 128-row tile stages its promotion scales in smem with fp8 h; with bf16 h the
    four stages and the wider h slab leave no room, so that config keeps the global loads."""
    from swiglu_fused.kernels.sm90 import gate_up

    assert dispatch.smem_scales_apply(128, False, "fp8_block128", "fp8_group128")
    assert not dispatch.smem_scales_apply(128, False, "fp8_block128", "bf16")
    assert not dispatch.smem_scales_apply(64, False, "fp8_block128", "fp8_group128")
    assert not dispatch.smem_scales_apply(128, False, "bf16", "bf16")
    assert gate_up.GateUpConfig(tile_m=128, stages=4, smem_scales=True, uniform_ab=True) in dispatch.gate_up_shipped()
    with pytest.raises(ValueError, match="stages"):
        gate_up.GateUpConfig(tile_m=128, stages=4, h_format="bf16", smem_scales=True)
    with pytest.raises(ValueError, match="smem_scales"):
        gate_up.GateUpConfig(tile_m=64, stages=5, smem_scales=True)



def test_uniform_operand_slices_on_the_fp8_gate_up_tiles_only():
    """D35: the fp8 mainloop's gate_up tiles slice their wgmma operands by a warp-uniform index (1-2 %
    faster); the bf16 mainloop's were level and nvfp4's slower, and down was level alone: they keep the
    per-thread slices, but for down's fp8 128-row tile with staged scales (D36)."""
    import torch
    from unittest import mock

    shipped = dispatch.gate_up_shipped()
    assert {c.uniform_ab for c in shipped if c.fp8} == {True}
    assert {c.uniform_ab for c in shipped if not c.fp8} == {False}
    assert {c.uniform_ab for c in dispatch.down_shipped()} == {True, False}
    assert all(c.uniform_ab == (c.fp8 and c.tile_m == 128 and not c.swap_ab) for c in dispatch.down_shipped())
    for mainloop, dtype, h_format in (("fp8_block128", torch.float8_e4m3fn, "fp8_group128"),
                                      ("bf16", torch.bfloat16, "bf16")):
        for m in (1, 64, 1024):
            x, w = torch.empty(m, 4096, dtype=dtype, device="meta"), torch.empty(28672, 4096, dtype=dtype, device="meta")
            scales = (torch.empty(1, device="meta"),) * 2 if dtype != torch.bfloat16 else (None, None)
            with mock.patch.object(g, "sm_count", lambda device: 132):
                cfg = dispatch.gate_up_config(x, w, *scales, act="silu", h_format=h_format)
            assert cfg.uniform_ab == (mainloop == "fp8_block128") and cfg in shipped

@pytest.mark.parametrize("tile_m,swap_ab,expect", [
    (64, False, "w_first"),  # the MLP 2-5 % faster at M = 64-256 (fp8), bf16 gate_up 9 % at 8192×3584 M = 128
    (128, False, ""),  # within noise at M = 256-4096
    (16, True, ""),  # level
])
def test_gate_up_weight_loads_evict_first_on_the_64_row_tile(tile_m, swap_ab, expect):
    from swiglu_fused.kernels.sm90 import gate_up

    assert dispatch.gate_up_l2_hint(tile_m, swap_ab) == expect
    shipped = dispatch.gate_up_shipped()
    assert {c.l2_hint for c in shipped if c.tile_m == tile_m and c.swap_ab == swap_ab} == {expect}
    assert gate_up.GateUpConfig(tile_m=64, stages=5, mainloop="bf16", l2_hint="w_first") in shipped
    with pytest.raises(ValueError, match="l2_hint"):
        gate_up.GateUpConfig(l2_hint="evict_everything")


def test_down_weight_loads_evict_first_on_the_fp8_64_row_tile():
    """down's fp8 64-row tile (stream-K at 4096×14336 M = 128: the MLP 1.04-1.06× faster with it)
    takes the hint; the swap-AB, 128-row and bf16 tiles were not measured faster and do not."""

    assert dispatch.down_l2_hint(64, False, "fp8_block128") == "w_first"
    assert dispatch.down_l2_hint(16, True, "fp8_block128") == dispatch.down_l2_hint(128, False, "fp8_block128") == ""
    assert dispatch.down_l2_hint(64, False, "bf16") == ""
    shipped = dispatch.down_shipped()
    assert {c.l2_hint for c in shipped if c.tile_m == 64 and c.fp8 and not c.swap_ab} == {"w_first"}
    assert {c.l2_hint for c in shipped if not (c.tile_m == 64 and c.fp8 and not c.swap_ab)} == {""}


def test_schedule_consults_the_module_plan():
    """The GPU tests and benchmarks force a stream-K split by patching schedule.plan: schedule()
    must look plan up there at call time (not hold its own reference)."""
    from unittest import mock

    cfg = g.TileConfig(tile_m=64, stages=5)
    real = g.schedule(cfg, 100, 7168, 8192, 132)
    with mock.patch.object(g, "plan", lambda tiles, *a, **kw: (3 * tiles, tiles)):
        tiles = 2 * 28
        assert g.schedule(cfg, 100, 7168, 8192, 132) == (3 * tiles, tiles) != real


def test_nvfp4_128_token_tile_shares_k_at_any_m_it_runs():
    """nvfp4's 128-token swap-AB tile (M ≤ 1024) may be stream-K split past 2 M tiles (its k tiles are
    decode-bound): down at H 4096, I 14336, M = 512 is 64 tiles for 132 SMs, split in 2 (D31); the
    64/128-row tiles keep whole tiles there."""
    from swiglu_fused.kernels.sm90.tile_config import DownConfig

    nv = DownConfig(tile_m=128, stages=5, swap_ab=True, mainloop="nvfp4", decode_buffers=1)
    assert g.schedule(nv, 512, 4096, 14336, 132) == (128, 64)
    assert g.schedule(DownConfig(tile_m=128, stages=4), 512, 4096, 14336, 132) == (64, 0)


def test_nvfp4_hybrid_stream_k_past_a_partial_wave():
    """D46, D61: nvfp4's 128- and 64-token swap-AB tiles whose last wave is partial run the last full wave and the
    partial one stream-K over all SMs where predicted 5 % faster: gate_up 8192×3584 at M = 1024 (224
    tiles: all stream-K, 1.8 rounds against 2), not 4096×14336 at M = 1024 (896 tiles: 6.8 waves, the
    fix-up costs what the evened wave saves) nor a whole wave; 4096×14336 at M = 768 (672 tiles) 144 of
    them. The fp8 128-row tile at 8192×3584 M = 1024 keeps whole tiles (history/gate_up.md)."""
    from swiglu_fused.kernels.sm90.tile_config import DownConfig, GateUpConfig

    nv = GateUpConfig(act="silu", h_format="bf16", mainloop="nvfp4", tile_m=128, stages=4, swap_ab=True,
                      decode_buffers=1, rs_decode=True, tile_major=True)
    assert g.schedule(nv, 1024, 7168, 8192, 132) == (132, 224)
    assert g.schedule(nv, 1024, 28672, 4096, 132) == (132, 0)
    assert g.schedule(nv, 768, 28672, 4096, 132) == (132, 144)
    assert g.schedule(nv, 1024, 16384, 2048, 132) == (132, 0)  # (512 tiles: 3.9 waves)
    assert g.schedule(nv, 512, 7168, 8192, 132) == (112, 0)  # (one wave, not full: plan()'s)
    down = DownConfig(tile_m=128, stages=5, swap_ab=True, mainloop="nvfp4", decode_buffers=1, rs_decode=True,
                      tile_major=True)
    assert g.schedule(down, 640, 8192, 3584, 132) == (132, 160)
    assert g.schedule(down, 1024, 8192, 3584, 132) == (132, 0)  # (256 tiles: 1.94 waves)
    for tiles, k_tiles in ((224, 128), (672, 64), (160, 56), (140, 128)):
        sk = g.nvfp4_hybrid_sk(tiles, k_tiles, 132)
        assert sk == tiles % 132 + 132 and (tiles - sk) % 132 == 0
        assert min(check_schedule(132, tiles, sk, k_tiles)) > 0  # (every CTA gets k tiles)
    fp8 = GateUpConfig(act="silu", h_format="fp8_group128", tile_m=128, stages=4)
    assert g.schedule(fp8, 1024, 7168, 8192, 132) == (132, 0)
    # the 64-token tile likewise (D61): 148 tiles at I = 18944 all stream-K, 224 at I = 28672; one wave whole
    t64 = dataclasses.replace(nv, tile_m=64, stages=6)
    assert g.schedule(t64, 64, 37888, 3584, 132) == (132, 148)
    assert g.schedule(t64, 48, 57344, 8192, 132) == (132, 224)
    assert g.schedule(t64, 64, 28672, 4096, 132) == (112, 0)
    # and the 32-token tile (D62): the same plans
    t32 = dataclasses.replace(nv, tile_m=32, stages=6)
    assert g.schedule(t32, 24, 37888, 3584, 132) == (132, 148)
    assert g.schedule(t32, 32, 28672, 4096, 132) == (112, 0)
    # the 80-112-token tiles (not dispatched) plan as the 128-token one: 4096×14336's down stream-K
    for t in (80, 96, 112, 128):
        assert g.schedule(dataclasses.replace(down, tile_m=t), 72, 4096, 14336, 132) == (128, 16), t


@pytest.mark.parametrize("m,hidden,inter,expect", [
    (577, 8192, 3584, True), (600, 8192, 3584, True), (640, 8192, 3584, True),  # 140 tiles: spread 0.3, K 8192
    (576, 8192, 3584, False),  # (the same 140 tiles, but the 64-row tile's 2 rounds are shorter: D42, D43)
    (704, 8192, 3584, False),  # 168 tiles: spread 1.6 (bf16 207 µs against the 192-row tile's 140)
    (1100, 8192, 2048, False),  # 144 tiles, 9 M tiles: spread 0.8 (bf16 170 against 148)
    (256, 1536, 8960, False),  # K = 1536: the fix-up is 2 rounds (bf16 40 against the 64-row tile's 30)
    (128, 5120, 17408, False),  # 136 tiles of one M tile, K 5120: 1.64 rounds (bf16 level with the 64-row tile)
    (512, 8192, 3584, False),  # (112 tiles: one wave)
])
@pytest.mark.parametrize("mainloop", [tile_config.BF16_MAINLOOP, tile_config.FP8_MAINLOOP])
def test_hybrid_just_past_one_wave(m, hidden, inter, expect, mainloop):
    """D48: gate_up's bf16 and fp8 128 × 256 tiles run nvfp4's hybrid split (every tile stream-K over
    all SMs) where their tiles end just past one wave, the CTAs sharing a weight column run close in K
    and K carries the fix-up; gate_up_config then takes that tile (bf16: over the 192-row and granule
    ones), and the 64-row tile only where its rounds are SPLIT64_ROUNDS of the hybrid's."""
    from unittest import mock

    import torch

    from swiglu_fused.kernels.sm90.tile_config import SplitConfig

    fp8 = mainloop == tile_config.FP8_MAINLOOP
    dtype, h_format = (torch.float8_e4m3fn, "fp8_group128") if fp8 else (torch.bfloat16, "bf16")
    x, w = torch.empty(m, hidden, dtype=dtype), torch.empty(2 * inter, hidden, dtype=dtype)
    scales = (torch.ones(2 * inter // 128, hidden // 128), torch.ones(hidden // 128, m).t()) if fp8 else (None, None)
    with mock.patch("swiglu_fused.kernels.sm90.schedule.sm_count", lambda device: 132):
        cfg = dispatch.gate_up_config(x, w, *scales, act="silu", h_format=h_format)
    cfg = dataclasses.replace(cfg, static_stages=False)  # (on the GPU with_static_stages sees the split)
    tiles = -(-m // 128) * (2 * inter // 256)
    assert (g.schedule(cfg, m, 2 * inter, hidden, 132) == (132, tiles % 132 + 132)) == expect
    if expect:
        assert (cfg.tile_m, cfg.tile_n) == (128, 256) and g.hybrid128_rounds(mainloop, m, 2 * inter, hidden, 132) < 1.6
        k_tiles = hidden // cfg.tile_k
        assert min(check_schedule(132, tiles, tiles % 132 + 132, k_tiles)) > 0
        for other in (dataclasses.replace(cfg, tile_m=64, stages=5, smem_scales=False),
                      dataclasses.replace(cfg, mainloop="nvfp4", smem_scales=False, h_format="bf16"),
                      SplitConfig(act="silu", h_format="bf16", mainloop=mainloop, tile_m=128, stages=4, prefix=256)):
            assert not g.hybrid128_applies(other, m, 2 * inter, hidden, 132)
    if not fp8 and expect:
        assert not g.hybrid128_applies(dataclasses.replace(cfg, tile_n=224), m, 2 * inter, hidden, 132)
        assert not g.hybrid128_applies(dataclasses.replace(cfg, dequantized=True), m, 2 * inter, hidden, 132)
        assert g.hybrid128_applies(dataclasses.replace(cfg, h_format="fp8_group128"), m, 2 * inter, hidden, 132)


def test_nvfp4_tiling_follows_its_model(monkeypatch):
    """D64: past 128 rows on a GPU, each op's M tiles (equal, between the fewest 160-token tiles and the
    fewest 128-token ones) and gate_up's 192-token tile (D32) by schedule.nvfp4_swap_us, as measured on
    the H200: 4096×14336 (gate_up N 28672, K 4096; down N 4096, K 14336) at M = 144 on one 144-token
    tile (19 % faster than two of 80); 2048×8192 (N 16384, K 2048: one M tile leaves half the SMs idle)
    on two of 80 (one of 144: 40 % slower); gate_up's 192-token tile at 4096×14336 M = 192 (6 % faster
    than two of 96), not at 160 (19 % slower than one of 160). Without the SMs (a CPU tensor's config)
    the fewest 128-token tiles; up to 128 rows one tile, the smallest that holds them. D67: down's
    128-row tiles of 224-256 tokens join the candidates (8192×3584 M = 1024: four of 256, not eight of
    128; M = 1152 stays on 144-token tiles, where five of 256 would be 10-17 % slower)."""
    from swiglu_fused.kernels.sm90.tile_config import DownConfig, GateUpConfig

    tiling = dispatch_nvfp4.nvfp4_tiling
    down_shipped = dispatch.down_shipped()
    assert tiling("gate_up", 144, 28672, 4096, 132)[0] == tiling("down", 144, 4096, 14336, 132)[0] == 144
    assert tiling("gate_up", 144, 16384, 2048, 132)[0] == tiling("down", 144, 2048, 8192, 132)[0] == 80
    assert tiling("gate_up", 192, 28672, 4096, 132) == dispatch_nvfp4.NVFP4_WIDE_TILE
    assert tiling("gate_up", 160, 28672, 4096, 132)[0] == 160
    assert [tiling("down", m, 8192, 3584, 132)[0] for m in (300, 640, 1024, 1152)] == [160, 160, 256, 144]
    half = DownConfig(mainloop=tile_config.NVFP4_MAINLOOP, tile_major=True,
                      **dispatch_nvfp4._nvfp4_rs(dispatch_nvfp4._nvfp4_tile(tiling("down", 1024, 8192, 3584, 132)), True))
    assert half.nvfp4_half_rows and half.rs_decode and half.rs_prefetch and half.stages == 4 and half in down_shipped
    # D68: gate_up's 128-row tiles too (4096×14336 M = 1024: four of 256; M = 512 stays on 128-token tiles, where
    # the model with down's constant tied them and the MLP measured level to 1.5 % slower)
    assert [tiling("gate_up", m, 28672, 4096, 132)[0] for m in (256, 512, 1024)] == [256, 128, 256]
    pairs = GateUpConfig(mainloop=tile_config.NVFP4_MAINLOOP, tile_major=True, h_format="bf16",
                         **dispatch_nvfp4._nvfp4_rs(dispatch_nvfp4._nvfp4_tile(tiling("gate_up", 1024, 28672, 4096, 132)), True))
    assert pairs.half_row_pairs and pairs.b_boxes == 2 and pairs in dispatch.gate_up_shipped()
    monkeypatch.setattr(dispatch_nvfp4, "NVFP4_HALF_ROWS", ())
    assert tiling("down", 1024, 8192, 3584, 132)[0] == 128 and tiling("gate_up", 1024, 28672, 4096, 132)[0] == 160
    monkeypatch.setattr(dispatch_nvfp4, "NVFP4_HALF_ROWS", ("gate_up", "down"))
    tile = dispatch_nvfp4.nvfp4_tile_for
    assert tile(100, shape=(28672, 4096, 132), tile_major=True)["tile_m"] == 112
    assert tile(300, tile_major=True)["tile_m"] == 112 and tile(144, tile_major=True)["tile_m"] == 80
    assert tile(144, shape=(28672, 4096, 132), tile_major=False)["tile_m"] == 80  # (144, 160: registers only)
    monkeypatch.setattr(g, "NVFP4_SMEM_DECODE_COST", 0.5)  # (the cache's key holds the model's constants)
    assert tiling("gate_up", 160, 28672, 4096, 132) == dispatch_nvfp4.NVFP4_WIDE_TILE
    monkeypatch.setattr(dispatch_nvfp4, "NVFP4_TILE_MODEL", False)
    assert tile(144, shape=(28672, 4096, 132), tile_major=True)["tile_m"] == 80
    cfgs = [c for c in dispatch.gate_up_shipped() if c.nvfp4 and c.swap_ab and c.tile_m == 192]
    assert len(cfgs) == 6 and all(c.whole_tiles and c.stages == 3 for c in cfgs)
    assert sorted(c.act for c in cfgs if c.h_rs_order) == ["gelu_tanh", "silu"]  # (D45: h in down's k order)
    big = [c for c in dispatch.gate_up_shipped() + dispatch.down_shipped() if c.nvfp4 and c.tile_m in (144, 160)]
    assert big and all(c.rs_decode and c.tile_major for c in big)


@pytest.mark.parametrize("mainloop", [tile_config.FP8_MAINLOOP, tile_config.BF16_MAINLOOP])
@pytest.mark.parametrize("m", [1, 16, 33, 64, 65, 128, 256, 4096])
@pytest.mark.parametrize("hidden,inter", [(4096, 14336), (8192, 3584)])
def test_pdl_on_the_fp8_mlp_at_decode_sizes(mainloop, m, hidden, inter):
    """DISPATCH D20: quant_x, gate_up and down launch with PDL for fp8 at M ≤ PDL_M (whatever tile
    that M gets), never for bf16, except gate_up's swap-AB tile over more than PDL_SWAP_M_TILES M
    tiles at a hidden size of 8192 (D39, D41: 8192×3584 at M = 64); every config so picked is one CI
    compiles."""
    import torch
    from unittest import mock

    fp8 = mainloop == tile_config.FP8_MAINLOOP
    dt = torch.float8_e4m3fn if fp8 else torch.bfloat16
    x, w = torch.empty(m, hidden, dtype=dt, device="meta"), torch.empty(2 * inter, hidden, dtype=dt, device="meta")
    h, dw = torch.empty(m, inter, dtype=dt, device="meta"), torch.empty(hidden, inter, dtype=dt, device="meta")
    scales = (torch.empty(1, device="meta"),) * 2 if fp8 else (None, None)
    want = fp8 and m <= dispatch.PDL_M
    with mock.patch.object(g, "sm_count", lambda device: 132):
        gcfg = dispatch.gate_up_config(x, w, *scales, act="silu", h_format="fp8_group128" if fp8 else "bf16")
        dcfg = dispatch.down_config(h, dw, *scales, None, torch.bfloat16)
    swap_tiles = -(-m // gcfg.tile_m) if gcfg.swap_ab else 0
    assert (gcfg.pdl, dcfg.pdl) == (want and swap_tiles <= dispatch.PDL_SWAP_M_TILES, want)
    assert gcfg in dispatch.gate_up_shipped() and dcfg in dispatch.down_shipped()
    if fp8:
        from swiglu_fused.kernels.sm90 import quant_x

        qcfg = quant_x.select_config(m, hidden)
        assert qcfg.pdl == (m <= dispatch.PDL_M) and qcfg in quant_x.shipped_configs()


def test_nvfp4_takes_no_pdl():
    """DISPATCH D20: PDL made the nvfp4 MLP slower; none of its shipped configs has it."""
    assert not any(c.pdl for c in dispatch.gate_up_shipped() + dispatch.down_shipped() if c.nvfp4)


class _FakeCuda:
    """What stream_k_counters asks torch.cuda and the driver, on the host: the current stream, whether
    it is capturing and the capture's id; its slabs are CPU tensors."""

    def __init__(self, monkeypatch):
        import types

        import torch

        self.stream, self.capture = 7, None
        monkeypatch.setattr(torch.cuda, "current_stream",
                            lambda device=None: types.SimpleNamespace(device_index=0, cuda_stream=self.stream))
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: self.capture is not None)
        monkeypatch.setattr(g, "capture_id", lambda stream: self.capture)
        monkeypatch.setattr(g, "_driver_zeros", lambda idx, words: torch.zeros(words, dtype=torch.int32))
        for name in ("_EAGER_COUNTERS", "_CAPTURE_COUNTERS", "_FREE"):
            monkeypatch.setattr(g, name, {})
        monkeypatch.setattr(g, "_ALL_SLABS", [])

    def counters(self, words=17):
        import torch

        return g.stream_k_counters(torch.device("cuda", 0), words)


def _buffer(t):
    """Which buffer of which slab a counters tensor is (its storage and offset)."""
    return t.untyped_storage().data_ptr(), t.storage_offset()


def test_stream_k_counters_a_stream_and_a_capture(monkeypatch):
    """Eager launches of a stream share its buffer, another stream gets another; each capture (each
    stream of it) takes a buffer no launch has used, the same for all its launches; none is made
    during a capture."""
    cuda = _FakeCuda(monkeypatch)
    a = cuda.counters()
    assert a.shape == (17,) and not a.any() and _buffer(cuda.counters(40)) == _buffer(a)
    cuda.stream = 8
    b = cuda.counters()
    assert _buffer(b) != _buffer(a)
    seen = {_buffer(a), _buffer(b)}
    for capture in (101, 102):
        cuda.capture = capture
        for stream in (7, 9):
            cuda.stream = stream
            c = cuda.counters()
            assert _buffer(c) not in seen and _buffer(cuda.counters()) == _buffer(c)
            seen.add(_buffer(c))
    cuda.capture, cuda.stream = None, 7
    assert _buffer(cuda.counters()) == _buffer(a)


def test_stream_k_counters_in_a_capture_with_no_buffer_left(monkeypatch):
    """A capture never allocates: with no buffer left it gets none (a zeroed tensor of the launch's
    own, then); the next eager launch makes a new slab, so that SPARE_BUFFERS are ready again, and
    the buffers left in the old one are still handed out (no slab is dropped half used)."""
    cuda = _FakeCuda(monkeypatch)
    cuda.counters()
    assert len(g._FREE[0]) == g.SLAB_BUFFERS - 1 >= g.SPARE_BUFFERS
    left = g._FREE[0][:3]
    g._FREE[0][:] = left
    cuda.capture = 5
    taken = [g._take_buffer(0, allocate=False) for _ in range(4)]
    assert taken[3] is None and {_buffer(t) for t in taken[:3]} == {_buffer(t) for t in left}
    g._FREE[0][:] = left
    cuda.capture = None
    cuda.counters()
    assert len(g._ALL_SLABS) == 2 and len(g._FREE[0]) == g.SLAB_BUFFERS + 3
    assert {_buffer(t) for t in left} <= {_buffer(t) for t in g._FREE[0]}


def test_stream_k_counters_off_or_too_many(monkeypatch):
    """REUSE_COUNTERS off (the A/B's memset variant), or more counters than a buffer holds: a zeroed
    tensor a launch, no buffer taken."""
    import torch

    cuda = _FakeCuda(monkeypatch)
    monkeypatch.setattr(torch, "zeros", lambda n, dtype, device: ("fresh", n))
    assert cuda.counters(g.COUNTER_WORDS + 1) == ("fresh", g.COUNTER_WORDS + 1)
    monkeypatch.setattr(g, "REUSE_COUNTERS", False)
    assert cuda.counters() == ("fresh", 17) and not g._ALL_SLABS


def test_stream_k_counters_threads_on_their_own_streams(monkeypatch):
    """Threads making their streams' first launches at once get a buffer each."""
    import threading
    import types

    import torch

    _FakeCuda(monkeypatch)
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: types.SimpleNamespace(device_index=0, cuda_stream=threading.get_ident()))
    start, got = threading.Barrier(16), []

    def first_launch():
        start.wait()
        got.append(_buffer(g.stream_k_counters(torch.device("cuda", 0), 17)))

    threads = [threading.Thread(target=first_launch) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 16


# hidden × intermediate of models people serve (and their tensor-parallel shards): LLaMA-3-8B, Mistral-7B,
# LLaMA-3-70B TP1/2/4/8, LLaMA-3.2-1B/3B, LLaMA-2-7B/13B, Qwen2.5-7B/14B/32B/72B, Gemma-7B, Yi-34B, Mixtral experts
WIDTHS = [(4096, 14336), (8192, 28672), (8192, 14336), (8192, 7168), (8192, 3584), (2048, 8192), (3072, 8192),
          (4096, 11008), (5120, 13824), (3584, 18944), (5120, 27648), (8192, 29568), (3072, 24576), (7168, 20480),
          (4096, 12288), (16384, 53248), (576, 1536)]
MS = [1, 2, 8, 16, 17, 24, 32, 33, 48, 49, 64, 65, 80, 100, 128, 129, 160, 192, 224, 256, 257, 384, 512, 1000, 1024,
      1025, 2048, 4096, 16384]


@pytest.mark.parametrize("deepgemm_down", [False, True])
def test_every_dispatched_config_at_common_widths_is_shipped(deepgemm_down, monkeypatch):
    """Whatever gate_up_config / down_config / warp_mma_config pick for fp8 (both h formats, both
    weight orders), bf16 and nvfp4 at the widths models are served at and M = 1 … 16384 is in the
    shipped lists, which CI compile-checks (test_kernels_cpu): a rule that reaches a config nobody
    compiled fails here, not on a user's GPU. With and without DeepGEMM taking down (D41)."""
    import torch
    from unittest import mock

    from swiglu_fused.kernels import deepgemm

    monkeypatch.setattr(deepgemm, "module", (lambda: object()) if deepgemm_down else (lambda: None))
    shipped_g, shipped_d = set(dispatch.gate_up_shipped()), set(dispatch.down_shipped())
    shipped_w = set(dispatch_nvfp4.warp_mma_shipped())
    meta = dict(device="meta")
    one = torch.empty(1, **meta)
    missing, seen = [], set()

    def check(what, cfg, shipped, hidden, inter, m):
        seen.add(cfg)
        if cfg is not None and cfg not in shipped:
            missing.append((what, hidden, inter, m, cfg))

    with mock.patch.object(g, "sm_count", lambda device: 132):
        for (hidden, inter), m in itertools.product(WIDTHS, MS):
            at = (hidden, inter, m)
            f8, bf = torch.float8_e4m3fn, torch.bfloat16
            for dt, h_formats, scales in ((f8, ("fp8_group128", "bf16"), (one, one)), (bf, ("bf16",), (None, None))):
                x, w = torch.empty(m, hidden, dtype=dt, **meta), torch.empty(2 * inter, hidden, dtype=dt, **meta)
                for h_format, tile_major in itertools.product(h_formats, (False, True) if dt == f8 else (False,)):
                    cfg = dispatch.gate_up_config(x, w, *scales, act="silu", h_format=h_format, tile_major=tile_major)
                    check("gate_up", cfg, shipped_g, *at)
                h, dw = torch.empty(m, inter, dtype=dt, **meta), torch.empty(hidden, inter, dtype=dt, **meta)
                check("down", dispatch.down_config(h, dw, *scales, None, torch.bfloat16), shipped_d, *at)
            u8 = torch.uint8
            x = torch.empty(m, hidden, dtype=bf, **meta)
            w = torch.empty(2 * inter, hidden // 2, dtype=u8, **meta)  # e2m1 pairs, e4m3 scales a 16
            ws = torch.empty(2 * inter, hidden // 16, dtype=f8, **meta)
            cfg = dispatch.gate_up_config(x, w, ws, None, act="silu", h_format="bf16", tile_major=True)
            check("nvfp4 gate_up", cfg, shipped_g, *at)
            h = torch.empty(m, inter, dtype=bf, **meta)
            dw = torch.empty(hidden, inter // 2, dtype=u8, **meta)
            dws = torch.empty(hidden, inter // 16, dtype=f8, **meta)
            check("nvfp4 down", dispatch.down_config(h, dw, dws, None, None, torch.bfloat16, True), shipped_d, *at)
            for op, n, k in (("gate_up", 2 * inter, hidden), ("down", hidden, inter)):
                check(f"nvfp4 {op} warp-MMA", dispatch_nvfp4.warp_mma_config(op, m, n, k, True, sms=132), shipped_w, *at)
    assert not missing, missing[:5]
    # (the sweep reaches most of what is shipped: every family, tile and mainloop)
    kinds = {(type(c).__name__, getattr(c, "mainloop", "nvfp4"), getattr(c, "tile_m", 0), getattr(c, "swap_ab", 0))
             for c in seen - {None}}
    assert len(seen) > 60 and len(kinds) > 15, (len(seen), sorted(kinds))


@pytest.mark.parametrize("m,hidden,inter,expect", [
    # D53: where it fires, the bf16 MLP on cuBLAS + act·mul was 2-27 % faster at 74 of 104 points (launch_ab, H200)
    (300, 8192, 3584, True), (640, 8192, 3584, True), (704, 8192, 3584, True), (1200, 8192, 3584, True),
    (3600, 8192, 3584, True), (480, 4096, 11008, True),
    (640, 8192, 2048, True), (270, 8192, 7168, True), (321, 4096, 14336, True), (200, 3584, 4736, True),
    (350, 7168, 20480, True),
    # ... and where it does not, cuBLAS's was level or 2-15 % slower
    (449, 4096, 14336, False), (1024, 8192, 3584, False), (704, 2048, 8192, False), (2600, 8192, 2048, False),
    (1100, 5120, 27648, False),
    (704, 5120, 13824, False), (16, 4096, 14336, False),  # (the swap-AB tile streams the weight)
    # D55: cuBLAS's narrower tiles where they fit one wave, no faster than the weight's read: 3-32 % faster ...
    (65, 8192, 3584, True), (128, 8192, 3584, True), (256, 8192, 3584, True), (256, 8192, 2048, True),
    (200, 16384, 2048, True), (100, 4096, 3584, True), (64, 8192, 4608, True), (200, 12288, 3072, True),
    # ... and not where the read sets the pace (8192×7168) or K is short (H = 1536, 2048): 1-7 % slower there
    (96, 8192, 7168, False), (128, 8192, 7168, False), (80, 2048, 6144, False), (64, 2048, 5632, False),
    (100, 1536, 4096, False),
])
def test_bf16_gate_up_on_cublas_where_predicted_faster(m, hidden, inter, expect, monkeypatch):
    """DISPATCH D53: bf16 gate_up with bf16 h runs cuBLAS's GEMM + the act·mul kernel where the rounds of
    cuBLAS's best-fitting tiles and the act·mul are predicted shorter than the dispatched tile's; never
    with fp8 h; BF16_GATE_UP "kernel" / "cublas" force either (what launch_ab compares)."""
    def on_cublas(h_format):
        return dispatch.bf16_gate_up_on_cublas(_bf16_gate_up_config(m, hidden, inter, h_format), m, 2 * inter, hidden,
                                               132)

    assert on_cublas("bf16") == expect
    assert not on_cublas("fp8_group128")
    monkeypatch.setattr(dispatch, "BF16_GATE_UP", "kernel")
    assert not on_cublas("bf16")
    monkeypatch.setattr(dispatch, "BF16_GATE_UP", "cublas")
    assert on_cublas("bf16")


def _bf16_gate_up_config(m, hidden, inter, h_format):
    """gate_up_config's pick for bf16 x and weight on 132 SMs."""
    from unittest import mock

    import torch

    x, w = torch.empty(m, hidden, dtype=torch.bfloat16), torch.empty(2 * inter, hidden, dtype=torch.bfloat16)
    with mock.patch("swiglu_fused.kernels.sm90.schedule.sm_count", lambda device: 132):
        return dispatch.gate_up_config(x, w, None, None, act="silu", h_format=h_format)


def test_cublas_gate_up_needs_cuda_bf16_operands():
    import torch

    from swiglu_fused.kernels import cublas

    x, w = torch.empty(4, 256, dtype=torch.bfloat16), torch.empty(512, 256, dtype=torch.bfloat16)
    assert not cublas.supports_gate_up(x, w)  # (CPU: the reference runs)
    assert dispatch.gate_up_backend(x, w, None, None, None, 128, "silu", "bf16")[0] == dispatch.REFERENCE


@pytest.mark.parametrize("m,hidden,inter,expect", [
    # D54: nvfp4's dequantized prefill on cuBLAS + the scaled act·mul, where measured 2.5-11 % faster ...
    (1500, 8192, 3584, True), (1536, 8192, 3584, True), (1850, 8192, 3584, True), (2048, 8192, 3584, True),
    (1500, 8192, 7168, True),
    # ... and never at these widths from M = 1409 (its 128- / 192-row tiles fill their waves)
    (1536, 4096, 14336, False), (2048, 4096, 14336, False), (2048, 2048, 8192, False), (4096, 3072, 8192, False),
])
def test_nvfp4_prefill_gate_up_on_cublas_where_predicted_faster(m, hidden, inter, expect):
    """DISPATCH D54: D53's model against the dequantized prefill's own tile (the 192-row one where
    wg3_applies, else whole 128-row tiles: the config gate_up_config picks on a GPU of 132 SMs)."""
    from swiglu_fused.kernels.sm90.tile_config import GateUpConfig

    cfg = GateUpConfig(act="silu", h_format="bf16",
                       **dispatch._nvfp4_prefill_tile(m, dispatch.wg3_applies(m, 2 * inter, 132)))
    assert cfg.dequantized and dispatch.bf16_gate_up_on_cublas(cfg, m, 2 * inter, hidden, 132) == expect


def test_narrow_down_takes_the_128_row_tile_at_97_to_128_rows(monkeypatch):
    """D69: nvfp4's down at 97-128 rows (one M tile of 112 or 128 tokens) runs D67's 224-token 128-row tile where
    schedule.nvfp4_swap_us predicts it at most NVFP4_HALF_ROWS_DOWN_GAIN of the one tile's time: narrow H, whose few
    256-row tiles split K many ways (2048×8192, 1024×8192, 2048×5632, 4096×2048: the MLP 3-42 % faster on the H200),
    not 4096×14336 nor 3072×8192 (measured 4 % slower at M = 100); gate_up, and a call without the SMs (a CPU
    tensor's config), as before. Since D71's fix-up model (gain 1.0) 2048×8192 at 97-105 rows takes the 112-token
    tile (4 % faster than the 224-token one at M = 97 and 105), at 113-128 still the 224-token one (3 % faster)."""
    from swiglu_fused.kernels.sm90.tile_config import DownConfig

    tile = dispatch_nvfp4.nvfp4_tile_for
    assert [tile(m, "down", True, (2048, 8192, 132))["tile_m"] for m in (96, 97, 105, 113, 128)] == [96, 112, 112, 224, 224]
    assert tile(112, "down", True, (1024, 8192, 132))["tile_m"] == tile(100, "down", True, (4096, 2048, 132))["tile_m"] == 224
    assert tile(128, "down", True, (4096, 14336, 132))["tile_m"] == tile(128, "down", True, (3072, 8192, 132))["tile_m"] == 128
    assert tile(128, "gate_up", True, (16384, 2048, 132))["tile_m"] == tile(128, "down", True)["tile_m"] == 128
    assert tile(128, "down", False, (2048, 8192, 132))["tile_m"] == 128  # (a packed-order weight: no rs_decode)
    cfg = DownConfig(mainloop=tile_config.NVFP4_MAINLOOP, tile_major=True, **tile(128, "down", True, (2048, 8192, 132)))
    assert cfg.nvfp4_half_rows and cfg.rs_decode and cfg in dispatch.down_shipped()
    monkeypatch.setattr(dispatch_nvfp4, "NVFP4_HALF_ROWS_DOWN_MIN_M", 129)
    assert tile(128, "down", True, (2048, 8192, 132))["tile_m"] == 128
    monkeypatch.setattr(dispatch_nvfp4, "NVFP4_HALF_ROWS_DOWN_MIN_M", 97)
    monkeypatch.setattr(g, "NVFP4_SPLIT_FIXUP", False)
    monkeypatch.setattr(dispatch_nvfp4, "NVFP4_HALF_ROWS_DOWN_GAIN", 0.8)  # (D69 as it shipped)
    assert tile(97, "down", True, (2048, 8192, 132))["tile_m"] == 224


def test_down_sums_partials_in_groups_where_predicted_faster(monkeypatch):
    """D70: nvfp4's down sums its stream-K partials in two levels (TileConfig.fixup_groups) where plan() splits
    every tile over K and fixup_groups_gain_us predicts a gain: 1024×8192 (32 and 16 ways) and 2048×8192 at
    M = 48-96 (16 ways), not 3072×8192 at 48 tokens (11 ways, partials of 49 KB: measured level to 1 % slower), nor
    4096×14336 / 8192×3584 (8 and 4 ways), nor gate_up or whole tiles; the
    configs so picked are shipped (compile-checked), and FIXUP_GROUPS = False turns it off. The groups are
    ceil(sqrt(n)) CTAs, as the kernel counts them."""
    from swiglu_fused.kernels.sm90.tile_config import DownConfig, GateUpConfig

    def pick(op, m, n, k, **kw):
        cls = DownConfig if op == "down" else GateUpConfig
        base = cls(mainloop=tile_config.NVFP4_MAINLOOP, tile_major=True,
                   **dispatch_nvfp4.nvfp4_tile_for(m, op, True, (n, k, 132)), **kw)
        return dispatch_nvfp4.with_fixup_groups(base, m, n, k, 132)

    for m in (48, 128, 256):
        assert pick("down", m, 1024, 8192).fixup_groups and pick("down", m, 1024, 8192) in dispatch.down_shipped()
    assert pick("down", 48, 2048, 8192, residual=True).fixup_groups and not pick("down", 48, 3072, 8192).fixup_groups
    assert pick("down", 96, 2048, 8192, residual=True) in dispatch.down_shipped()
    assert not any(pick("down", m, h, i).fixup_groups for m in (48, 64, 128) for h, i in ((4096, 14336), (8192, 3584)))
    assert not pick("gate_up", 64, 7168, 8192, h_format="bf16").fixup_groups  # (gate_up at 8192×3584)
    assert not pick("down", 1024, 8192, 3584).fixup_groups  # (whole tiles)
    monkeypatch.setattr(dispatch_nvfp4, "FIXUP_GROUPS", False)
    assert not pick("down", 48, 1024, 8192).fixup_groups
    assert [math.isqrt(n - 1) + 1 for n in (2, 4, 5, 9, 11, 16, 17, 32)] == [2, 2, 3, 3, 4, 4, 5, 6]
    assert dispatch_nvfp4.fixup_groups_gain_us(16, 4 * 48 * 256) > 0 > dispatch_nvfp4.fixup_groups_gain_us(13, 4 * 48 * 256)


def test_nvfp4_tiles_by_the_split_fixup_as_measured(monkeypatch):
    """D71: schedule.nvfp4_swap_us prices plan()'s split of either op's tiles as split_fixup_us (the partials' stores,
    the arrival, the last CTA's reads in one or two levels), so that nvfp4_tiling picks what the H200 measured
    faster (the MLP, launch_ab): at 161-185 rows two 96-token tiles, not one of 224 (2-7 %), 1024×8192 M = 489 four
    of 256, 1536×8960 M = 777 seven of 112, 2048×8192 M = 753 four of 224 (2-6 %), and not 4096×14336 /
    8192×3584 M = 153 on one 160-token tile (5 % slower than two of 80); gate_up's at 2048×4096 M = 297 three of 112,
    not two of 160 (9 % faster), at 3072×8192 M = 131 two of 80, not one of 144 (3.5 %); the picked configs are
    shipped; NVFP4_SPLIT_FIXUP = False gives the picks before."""
    from swiglu_fused.kernels.sm90.tile_config import DownConfig, GateUpConfig

    def tokens(m, h, i, op="down"):
        n, k = (h, i) if op == "down" else (2 * i, h)
        return dispatch_nvfp4.nvfp4_tile_for(m, op, True, (n, k, 132))["tile_m"]

    measured = {(177, 1024, 8192): 96, (169, 2048, 8192): 96, (177, 4096, 14336): 96, (489, 1024, 8192): 256,
                (777, 1536, 8960): 112, (753, 2048, 8192): 224, (153, 4096, 14336): 80, (153, 8192, 3584): 80}
    assert {key: tokens(*key) for key in measured} == measured
    for m, h, i in measured:
        cfg = DownConfig(mainloop=tile_config.NVFP4_MAINLOOP, tile_major=True,
                         **dispatch_nvfp4.nvfp4_tile_for(m, "down", True, (h, i, 132)))
        assert dispatch_nvfp4.with_fixup_groups(cfg, m, h, i, 132) in dispatch.down_shipped()
    gate_up = ((297, 2048, 4096), (131, 3072, 8192), (145, 2560, 6912), (273, 2048, 4096))
    assert [tokens(m, h, i, "gate_up") for m, h, i in gate_up] == [112, 80, 80, 96]
    fields = dispatch_nvfp4.nvfp4_tile_for(297, "gate_up", True, (8192, 2048, 132))
    assert GateUpConfig(mainloop=tile_config.NVFP4_MAINLOOP, tile_major=True, h_format="bf16",
                        **fields) in dispatch.gate_up_shipped()
    assert g.split_fixup_us(16, 4 * 224 * 128, True, 128) < g.split_fixup_us(16, 4 * 224 * 128, False, 128)
    monkeypatch.setattr(g, "NVFP4_SPLIT_FIXUP", False)
    assert [tokens(m, h, i) for m, h, i in ((177, 1024, 8192), (489, 1024, 8192), (153, 4096, 14336))] == [224, 224, 80]
    assert [tokens(m, h, i, "gate_up") for m, h, i in gate_up] == [160, 144, 80, 96]
