"""gate_up sm_90a kernel against reference.gate_up (DESIGN §4 tolerances), outputs poisoned first."""

import dataclasses
import zlib

import pytest
import torch

from swiglu_fused import quant
from swiglu_fused.kernels import dispatch, ops, reference
from . import premises
from .tolerance import FP8, assert_bf16_close, assert_fp8_group_close

pytest.importorskip("cutlass")

M_ALL = [1, 3, 16, 20, 32, 64, 100, 256, 1024, 4096]  # ≤ 32 (≤ 64 in one wave): swap-AB; ≤ 256 in one wave: 64-row
M_ISSUE = [1, 3, 16, 64, 100, 1024, 4096]  # the M values every mainloop × h format is checked at
# (H, I); H = 576 ends in half a 128-deep k block, H = 1040 in a 16-column one (the bf16 mainloop's
# 64-deep k tile too): TMA fills the rest with zeros
SHAPES = [(4096, 14336), (8192, 3584), (576, 1536), (2048, 8192), (1040, 1536)]
ACTS = ["silu", "gelu_tanh"]


def make_operands(m, hidden, inter, mainloop, seed):
    """Random normal x and packed weight; per-row and per-block magnitudes vary over 2^±3 so
    that a wrong scale index shows up."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, hidden, device="cuda", generator=g)
    x = x * torch.exp2(torch.randint(-3, 4, (m, 1), device="cuda", generator=g).float())
    w = torch.randn(2 * inter, hidden, device="cuda", generator=g) * 0.05
    nb, kb = quant.cdiv(2 * inter, 128), quant.cdiv(hidden, 128)
    block_mag = torch.exp2(torch.randint(-3, 4, (nb, kb), device="cuda", generator=g).float())
    w = w * block_mag.repeat_interleave(128, 0).repeat_interleave(128, 1)[: 2 * inter, :hidden]
    x = x.to(torch.bfloat16)
    if mainloop == "bf16":
        return dict(x=x, weight=w.to(torch.bfloat16))
    xq, xs = reference.quant_x(x)
    wq, ws = quant.quantize_fp8_block(w)
    return dict(x=xq, weight=wq, weight_scale=ws, x_scale=xs)


def run_kernel(cfg, ops_args):
    from swiglu_fused.kernels.sm90 import gate_up as k

    m, i = ops_args["x"].shape[0], ops_args["weight"].shape[0] // 2
    if cfg.h_format == "fp8_group128":
        h = torch.full((m, i), 0x7F, dtype=torch.uint8, device="cuda").view(FP8)  # e4m3 NaN
        hs = torch.full((i // 128, m), float("nan"), device="cuda").t()  # M-major, as gate_up allocates it
    else:
        h = torch.full((m, i), float("nan"), dtype=torch.bfloat16, device="cuda")
        hs = None
    return k.gate_up(cfg, ops_args["x"], ops_args["weight"], ops_args.get("weight_scale"),
                     ops_args.get("x_scale"), out=(h, hs))


# DESIGN §4 asks: h scales equal to 1e-4 relative, ≥ 99.9 % of h within 1 e4m3 ulp. The bf16
# mainloop meets both (max scale error seen 2e-5, 100 % within 1 ulp). The fp8 mainloop cannot:
# Hopper's fp8 wgmma accumulates each 128-deep k block with reduced precision, and cuBLAS's
# block-scaled GEMM (torch._scaled_mm, fp32 out, then the reference epilogue) on the same inputs
# gives *identical* statistics to this kernel (H=4096, I=14336, M=1024: max scale error 1.07e-3,
# 99.937 % within 1 ulp; benchmarks/accuracy_gate_up.py). Across the test matrix the worst seen is
# 1.5e-3 and 99.86 %. Promoting more often helps (GateUpConfig.promote_k=64: 4.4e-4, 99.97 %,
# +18 % time; promote_k=32: 3e-4, 99.99 %). So against the plain fp32 reference the fp8 mainloop is
# held to the measured hardware limits below; against the reference with Hopper's accumulator in it
# (hopper_gemm_reference) it is held to DESIGN §4's own numbers, which it meets with room: scales
# within 1.1e-5 (1.4e-6 Frobenius), 100 % of h within 1 ulp (twelfth session).
# Over this file's matrix (SWIGLU_FUSED_TOL_LOG, eleventh session, benchmarks/history/numerics.md) the fp8
# mainloop's scales came within 2.3e-4 relative Frobenius (1.4e-3 each) and ≥ 99.84 % of h within
# 1 ulp (≥ 99.92 % in outputs of ≥ 1e5 elements); the bf16 mainloop's within 1.7e-5 (4.2e-5 each)
# and 100 %.
TOL = {
    "bf16": dict(scale_rtol=1e-4, scale_fro=1e-4, min_frac=0.999),
    "fp8_block128": dict(scale_rtol=2e-3, scale_fro=5e-4, min_frac=0.998),
}


def assert_matches_reference(h, hs, args, act, h_format, mainloop="fp8_block128"):
    """h (and its scales) within the tolerance of the mainloop against reference.gate_up."""
    h_ref, hs_ref = reference.gate_up(**args, act=act, h_format=h_format)
    if h_format == "fp8_group128":
        assert_fp8_group_close(h, hs, h_ref, hs_ref, **TOL[mainloop])
    else:
        assert_bf16_close(h, h_ref)


def check(mainloop, h_format, act, m, hidden, inter):
    from swiglu_fused.kernels.sm90 import gate_up as k

    seed = zlib.crc32(repr((mainloop, h_format, act, m, hidden, inter)).encode())  # reproducible
    args = make_operands(m, hidden, inter, mainloop, seed=seed)
    cfg = k.select_config(args["x"], args["weight"], args.get("weight_scale"), args.get("x_scale"),
                          act=act, h_format=h_format)
    assert cfg is not None and cfg.mainloop == mainloop
    h, hs = run_kernel(cfg, args)
    assert_matches_reference(h, hs, args, act, h_format, mainloop)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("hidden,inter", SHAPES)
@pytest.mark.parametrize("m", M_ALL)
def test_gate_up_fp8_block128_fp8_h(m, hidden, inter, act):
    check("fp8_block128", "fp8_group128", act, m, hidden, inter)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("hidden,inter", SHAPES)
@pytest.mark.parametrize("m", M_ISSUE)
def test_gate_up_fp8_block128_bf16_h(m, hidden, inter, act):
    check("fp8_block128", "bf16", act, m, hidden, inter)


@pytest.mark.parametrize("h_format", ["bf16", "fp8_group128"])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("hidden,inter", SHAPES)
@pytest.mark.parametrize("m", M_ISSUE)
def test_gate_up_bf16_mainloop(m, hidden, inter, act, h_format):
    check("bf16", h_format, act, m, hidden, inter)


def hopper_gemm_reference(args, act, h_format):
    """reference.gate_up with Hopper's fp8 MMA accumulator in place of exact fp32 products: cuBLAS's
    block-scaled GEMM (torch._scaled_mm, fp32 out; the same wgmma, promoted every 128 of K as
    DESIGN §5 prescribes), then the reference epilogue."""
    from swiglu_fused.kernels import cublas

    x, xs = args["x"], args["x_scale"]
    m = x.shape[0]
    x, xs = cublas._pad_rows(x, xs, -m % cublas.ROWS)  # cuBLAS rejects some row counts (M = 1)
    acc = torch._scaled_mm(x, args["weight"].t(), scale_a=quant.m_major(xs), scale_b=args["weight_scale"].t(),
                           out_dtype=torch.float32)[:m]
    return reference.gate_up_epilogue(acc, act=act, h_format=h_format)


# DESIGN §4: "Hopper's fp8 MMA accumulator [differs] slightly from the reference; more than that is
# a bug". Against the reference with that accumulator in it, the fp8 mainloop is held to §4's numbers
# themselves (scales within 1e-4, each and in Frobenius norm; ≥ 99.9 % of h within 1 ulp): whatever
# separates it from the plain fp32 reference (TOL above) is the accumulator's, not the kernel's.
@pytest.mark.parametrize("h_format,act", [("fp8_group128", "silu"), ("fp8_group128", "gelu_tanh"), ("bf16", "silu")])
@pytest.mark.parametrize("hidden,inter", [s for s in SHAPES if s[0] % 128 == 0])  # cuBLAS: whole k blocks
@pytest.mark.parametrize("m", M_ISSUE)
def test_fp8_mainloop_design_tolerance_against_hopper_accumulator(m, hidden, inter, h_format, act):
    from swiglu_fused.kernels.sm90 import gate_up as k

    args = make_operands(m, hidden, inter, "fp8_block128", seed=zlib.crc32(repr(("hopper", m, hidden, inter)).encode()))
    cfg = k.select_config(args["x"], args["weight"], args["weight_scale"], args["x_scale"], act=act, h_format=h_format)
    h, hs = run_kernel(cfg, args)
    h_ref, hs_ref = hopper_gemm_reference(args, act, h_format)
    if h_format == "fp8_group128":
        assert_fp8_group_close(h, hs, h_ref, hs_ref)  # DESIGN §4 defaults
    else:
        assert_bf16_close(h, h_ref)


def test_ops_gate_up_dispatches_to_kernel(monkeypatch):
    args = make_operands(100, 576, 1536, "fp8_block128", seed=1)
    ref_gate_up = reference.gate_up

    def no_reference(*a, **kw):
        raise AssertionError("ops.gate_up ran the reference on an sm_90 GPU")

    monkeypatch.setattr(ops.reference, "gate_up", no_reference)
    h, hs = ops.gate_up(**args, act="silu", h_format="fp8_group128")
    assert hs.stride() == (1, 100)  # M-major: what ops.down's kernel and cuBLAS read without a copy
    hb, _ = ops.gate_up(**args, act="gelu_tanh", h_format="bf16")
    monkeypatch.setattr(ops.reference, "gate_up", ref_gate_up)
    h_ref, hs_ref = reference.gate_up(**args, act="silu", h_format="fp8_group128")
    assert_fp8_group_close(h, hs, h_ref, hs_ref, **TOL["fp8_block128"])
    assert_bf16_close(hb, reference.gate_up(**args, act="gelu_tanh", h_format="bf16")[0])
    # formats without a kernel (interleave 256 here) still run, on the reference
    h2, hs2 = ops.gate_up(**args, interleave=256, h_format="fp8_group128")
    h2_ref, hs2_ref = reference.gate_up(**args, interleave=256, h_format="fp8_group128")
    assert torch.equal(h2.view(torch.uint8), h2_ref.view(torch.uint8)) and torch.equal(hs2, hs2_ref)
    with pytest.raises(ValueError, match="x_scale"):
        ops.gate_up(args["x"], args["weight"], args["weight_scale"], args["x_scale"][:, :2])
    # the kernel path's layout needs: contiguous rows, 16-byte aligned data
    wide = torch.empty(args["weight"].shape[0], 2 * 576, dtype=args["weight"].dtype, device="cuda")
    wide[:, :576] = args["weight"]
    with pytest.raises(ValueError, match="^weight: the sm90 kernel needs a contiguous tensor"):
        ops.gate_up(args["x"], wide[:, :576], args["weight_scale"], args["x_scale"])
    x_off = torch.empty(100 * 576 + 1, dtype=args["x"].dtype, device="cuda")[1:].view(100, 576)
    x_off.copy_(args["x"])
    with pytest.raises(ValueError, match="^x: the sm90 kernel needs a 16-byte aligned data pointer"):
        ops.gate_up(x_off, args["weight"], args["weight_scale"], args["x_scale"])
    with pytest.raises(ValueError, match="^weight: is on cpu but x is on cuda"):
        ops.gate_up(args["x"], args["weight"].cpu(), args["weight_scale"], args["x_scale"])


@pytest.mark.parametrize("mainloop", ["fp8_block128", "bf16"])
def test_ops_gate_up_without_16_byte_rows_runs_the_reference(mainloop):
    """The format allows any H; the kernels' TMA needs 16-byte rows. H = 1000 (not a multiple of
    16 in fp8) and H = 1004 (not of 8 in bf16) run on the reference, with a warning that says how
    to get the kernel."""
    hidden = 1000 if mainloop == "fp8_block128" else 1004
    args = make_operands(5, hidden, 256, mainloop, seed=2)
    with pytest.warns(UserWarning, match=f"gate_up: x has {hidden} columns, not a multiple of .*pad"):
        h, hs = ops.gate_up(**args, h_format="fp8_group128")
    h_ref, hs_ref = reference.gate_up(**args, h_format="fp8_group128")
    assert torch.equal(h.view(torch.uint8), h_ref.view(torch.uint8)) and torch.equal(hs, hs_ref)


def reuse_first_counters(monkeypatch) -> list:
    """Hand every later launch the first launch's stream-K counter tensor (through gemm.launch_plan,
    what gemm.launch calls): a counter a launch left non-zero would skip an epilogue in the next one
    and leave the NaN poison in h. Returns [(sk_tiles, counters)] of the first launch, once it ran."""
    from swiglu_fused.kernels.sm90 import gemm

    first, real_plan = [], gemm.launch_plan

    def reuse(*a):
        ctas, sk_tiles, parts, ctr = real_plan(*a)
        if not first:
            first.append((sk_tiles, ctr))
        return ctas, sk_tiles, parts, first[0][1]

    monkeypatch.setattr(gemm, "launch_plan", reuse)
    return first


@pytest.mark.parametrize("mainloop", ["fp8_block128", "bf16"])
@pytest.mark.parametrize("hidden,inter,m", [(8192, 3584, 16), (8192, 3584, 20), (8192, 1792, 64), (8192, 3584, 100)])
def test_stream_k_is_repeatable_and_leaves_counters_zero(monkeypatch, mainloop, hidden, inter, m):
    """Shapes whose few tiles leave HBM idle share K out (schedule.plan). The fix-up sums the
    partials in CTA order, so launches are bit-identical whatever order CTAs arrive in; the kernel
    re-zeroes the arrival counters it used (here one counter tensor is reused on purpose: a counter
    left non-zero would skip the epilogue next time and leave the NaN poison in h)."""
    from swiglu_fused.kernels.sm90 import gate_up as k, gemm, schedule

    args = make_operands(m, hidden, inter, mainloop, seed=7)
    cfg = k.select_config(args["x"], args["weight"], args.get("weight_scale"), args.get("x_scale"),
                          act="silu", h_format="fp8_group128")
    cfg = dataclasses.replace(cfg, cluster_k=1)  # K pairs (no counters) have their own test
    if cfg.split_n:  # (the fp8 64-row tile: with its fix-up compiled in, D57)
        cfg = dataclasses.replace(cfg, split_n_sk=True)
    if gemm.launch_plan(cfg, m, 2 * inter, hidden, args["x"].device)[1] == 0:
        # plan() keeps whole tiles here (the cost model's choice): test the stream-K path split 3 ways
        monkeypatch.setattr(schedule, "plan", lambda tiles, *a, **kw: (3 * tiles, tiles))
    first = reuse_first_counters(monkeypatch)
    outs = [run_kernel(cfg, args) for _ in range(3)]
    torch.cuda.synchronize()
    sk_tiles, ctr = first[0]
    assert sk_tiles > 0 and not ctr.any()
    for h, hs in outs[1:]:
        assert torch.equal(h.view(torch.uint8), outs[0][0].view(torch.uint8)) and torch.equal(hs, outs[0][1])
    assert_matches_reference(outs[0][0], outs[0][1], args, "silu", "fp8_group128", mainloop)


@pytest.mark.parametrize("h_format", ["bf16", "fp8_group128"])
@pytest.mark.parametrize("mainloop", ["bf16", "fp8_block128"])
@pytest.mark.parametrize("waves", [1.06, 1.27])
def test_hybrid_past_one_wave(monkeypatch, waves, mainloop, h_format):
    """The 128-row tile past one wave in the hybrid split (schedule.hybrid128_applies, D48; at 1.27
    waves only where its rule is widened): every tile stream-K over all SMs, each CTA's k iterations
    over up to three tiles, M ragged. h within the reference's tolerance, launches bit-identical, the
    counters left zero."""
    from swiglu_fused.kernels.sm90 import gate_up as k, schedule

    hidden, inter = 8192, 3584
    sms = schedule.sm_count(torch.device("cuda"))
    m = 128 * quant.cdiv(int(waves * sms), 2 * inter // 256) - 37
    args = make_operands(m, hidden, inter, mainloop, seed=m)
    cfg = k.GateUpConfig(tile_m=128, stages=4, mainloop=mainloop, h_format=h_format,
                         smem_scales=dispatch.smem_scales_apply(128, False, mainloop, h_format))
    monkeypatch.setattr(schedule, "HYBRID_SPREAD", 10.0)
    monkeypatch.setattr(schedule, "HYBRID_MAX_ROUNDS", 10.0)
    tiles = quant.cdiv(m, 128) * (2 * inter // 256)
    assert sms < tiles <= 1.3 * sms and schedule.schedule(cfg, m, 2 * inter, hidden, sms) == (sms, tiles)
    first = reuse_first_counters(monkeypatch)
    outs = [run_kernel(cfg, args) for _ in range(2)]
    torch.cuda.synchronize()
    assert not first[0][1].any()
    assert torch.equal(outs[0][0].view(torch.uint8), outs[1][0].view(torch.uint8))
    assert_matches_reference(*outs[0], args, "silu", h_format, mainloop)


@pytest.mark.parametrize(premises.hybrid_at_8192x3584.names, premises.hybrid_at_8192x3584.cases)
def test_dispatched_hybrid_at_8192x3584(mainloop, h_format):
    """D48 as dispatched: 8192×3584 at M = 600 on 132 SMs takes the 128 × 256 tile in the hybrid split
    (all 140 tiles stream-K over the SMs; fp8 without the static k loop, whose tiles run whole), and
    h is the reference's."""
    from swiglu_fused.kernels.sm90 import schedule

    hidden, inter, m = 8192, 3584, 600
    sms = schedule.sm_count(torch.device("cuda"))
    if sms != premises.SMS:
        pytest.skip(f"the rule's shape is one just past a wave of 132 SMs; this GPU has {sms}")
    cfg = premises.hybrid_at_8192x3584(mainloop, h_format)
    args = make_operands(m, hidden, inter, mainloop, seed=m)
    h, hs = run_kernel(cfg, args)
    assert_matches_reference(h, hs, args, "silu", h_format, mainloop)


@pytest.mark.parametrize(premises.split_n_stream_k.names, premises.split_n_stream_k.cases)
def test_dispatched_split_n_stream_k(hidden, inter, m, h_format):
    """D57 as dispatched: fp8's split_n 64-row tile at narrow widths and 64 < M ≤ 256 on 132 SMs runs
    in plan()'s stream-K (its fix-up compiled in: split_n_sk), and h is the reference's (poisoned
    before the run); 8192×3584 M = 96 at a predicted gain below SK_MIN_GAIN (D59)."""
    from swiglu_fused.kernels.sm90 import schedule

    sms = schedule.sm_count(torch.device("cuda"))
    if sms != premises.SMS:
        pytest.skip(f"the rule's shapes are ones measured on 132 SMs; this GPU has {sms}")
    cfg = premises.split_n_stream_k(hidden, inter, m, h_format)
    args = make_operands(m, hidden, inter, "fp8_block128", seed=m + hidden)
    h, hs = run_kernel(cfg, args)
    assert_matches_reference(h, hs, args, "silu", h_format)


@pytest.mark.parametrize(premises.row_128_stream_k_on_a_long_k.names, premises.row_128_stream_k_on_a_long_k.cases)
def test_dispatched_128_row_stream_k_on_a_long_k(m, h_format):
    """D56 as dispatched: fp8 16384×2560 at M = 193-256 on 132 SMs takes the 128 × 256 tile in stream-K
    (40 tiles, each split 3 ways) instead of the 64-row tile (whole tiles: plan() does not split its 80),
    and h is the reference's (poisoned before the run)."""
    from swiglu_fused.kernels.sm90 import schedule

    hidden, inter = 16384, 2560
    sms = schedule.sm_count(torch.device("cuda"))
    if sms != premises.SMS:
        pytest.skip(f"the rule's shape is one measured on 132 SMs; this GPU has {sms}")
    cfg = premises.row_128_stream_k_on_a_long_k(m, h_format)
    args = make_operands(m, hidden, inter, "fp8_block128", seed=m)
    h, hs = run_kernel(cfg, args)
    assert_matches_reference(h, hs, args, "silu", h_format)


@pytest.mark.parametrize("h_format", ["fp8_group128", "bf16"])
@pytest.mark.parametrize("hidden,inter,m", [(4096, 14336, 1), (576, 1536, 129), (2048, 8192, 1100), (8192, 3584, 300)])
def test_cluster_pairs_with_a_padding_m_tile(hidden, inter, m, h_format):
    """Cluster pairs (cluster_m = 2, weight k tiles multicast to two M tiles) pad the M tiles to
    an even count; here the last pair's second tile is partly or wholly past M (its rows read
    zero-fill, its stores are masked), and every CTA of every pair must still be written."""
    from swiglu_fused.kernels.sm90 import gate_up as k

    args = make_operands(m, hidden, inter, "fp8_block128", seed=m)
    cfg = dataclasses.replace(k.CLUSTER_PAIR, h_format=h_format,
                              smem_scales=dispatch.smem_scales_apply(128, False, "fp8_block128", h_format))
    h, hs = run_kernel(cfg, args)
    assert_matches_reference(h, hs, args, "silu", h_format)


@pytest.mark.parametrize(premises.cluster_pairs_at_a_ragged_m.names, premises.cluster_pairs_at_a_ragged_m.cases)
def test_dispatched_cluster_pairs_at_a_ragged_m(hidden, inter, m, mainloop, h_format):
    """From M = 4096 on the 128-row tile runs in cluster pairs (dispatch.cluster_m_for); with 33
    M tiles the last pair's second tile lies wholly past M. (Shapes where bf16 keeps the 128-row
    tile: dispatch.wg3_applies.)"""
    cfg = premises.cluster_pairs_at_a_ragged_m(hidden, inter, m, mainloop, h_format,
                                               sms=torch.cuda.get_device_properties(0).multi_processor_count)
    args = make_operands(m, hidden, inter, mainloop, seed=m + hidden)
    h, hs = run_kernel(cfg, args)
    assert_matches_reference(h, hs, args, "silu", h_format, mainloop)


@pytest.mark.parametrize("mainloop", ["fp8_block128", "bf16"])
@pytest.mark.parametrize("hidden,inter,m,tile_m", [(8192, 3584, 16, 16), (8192, 3584, 3, 16), (2048, 8192, 16, 16),
                                                   (576, 1536, 1, 16), (8192, 3584, 128, 64), (8192, 3584, 100, 64),
                                                   (576, 1536, 70, 64)])
def test_cluster_k_pairs_match_stream_k_split_2(hidden, inter, m, tile_m, mainloop, monkeypatch):
    """cluster_k = 2: the two CTAs of a cluster run the two K halves of a tile (the 16-token
    swap-AB tile or the 64-row tile) and the second sends its accumulator through DSMEM; the sum
    (first half + second half) is the one stream-K split 2 forms through global partials, bit for
    bit, and every h element is written."""
    from swiglu_fused.kernels.sm90 import gate_up as k, schedule

    args = make_operands(m, hidden, inter, mainloop, seed=m + 5)
    swap = tile_m == 16
    cfg = k.GateUpConfig(tile_m=tile_m, stages=6 if swap else 3, swap_ab=swap, cluster_k=2, mainloop=mainloop)
    h, hs = run_kernel(cfg, args)
    monkeypatch.setattr(schedule, "plan", lambda tiles, *a, **kw: (2 * tiles, tiles))
    h2, hs2 = run_kernel(dataclasses.replace(cfg, cluster_k=1), args)
    assert torch.equal(h.view(torch.uint8), h2.view(torch.uint8))
    assert torch.equal(hs, hs2)
    assert_matches_reference(h, hs, args, "silu", "fp8_group128", mainloop)


@pytest.mark.parametrize("h_format", ["fp8_group128", "bf16"])
@pytest.mark.parametrize("mainloop", ["fp8_block128", "bf16"])
@pytest.mark.parametrize("hidden,inter,m", [(8192, 3584, 16), (8192, 3584, 3), (576, 1536, 1)])
def test_cluster_k_4_matches_stream_k_split_4(hidden, inter, m, mainloop, h_format, monkeypatch):
    """cluster_k = 4 (swap-AB tile): CTAs 1-3 of a cluster send their K parts' accumulators to CTA 0
    through DSMEM, which adds them in rank order: the sum stream-K split 4 forms through global
    partials, bit for bit (H = 576 in fp8: 5 k tiles over 4 CTAs)."""
    from swiglu_fused.kernels.sm90 import gate_up as k, schedule

    args = make_operands(m, hidden, inter, mainloop, seed=m + 9)
    cfg = k.GateUpConfig(tile_m=16, stages=5, swap_ab=True, cluster_k=4, mainloop=mainloop, h_format=h_format)
    h, hs = run_kernel(cfg, args)
    monkeypatch.setattr(schedule, "plan", lambda tiles, *a, **kw: (4 * tiles, tiles))
    h4, hs4 = run_kernel(dataclasses.replace(cfg, cluster_k=1), args)
    assert torch.equal(h.view(torch.uint8), h4.view(torch.uint8))
    assert (hs is None and hs4 is None) or torch.equal(hs, hs4)
    assert_matches_reference(h, hs, args, "silu", h_format, mainloop)


@pytest.mark.parametrize("h_format", ["fp8_group128", "bf16"])
@pytest.mark.parametrize("tile_m", [64, 128])
@pytest.mark.parametrize("hidden,inter,m", [(576, 1536, 1), (576, 1536, 100), (8192, 3584, 1024), (2048, 8192, 300)])
def test_h_by_tma_store_is_the_copy_out_bit_for_bit(hidden, inter, m, tile_m, h_format):
    """TileConfig.tma_store (measured, not dispatched): h leaves smem by TMA stores from a 128-byte
    swizzled slab, rows ≥ M clipped by the tensor map; h and h_scale are bit-identical to the
    threads' copy-out, every element is written (poisoned outputs), and both match the reference."""
    from swiglu_fused.kernels.sm90 import gate_up as k

    args = make_operands(m, hidden, inter, "fp8_block128", seed=m + tile_m)
    cfg = k.GateUpConfig(tile_m=tile_m, stages=4 if tile_m == 128 else 5, h_format=h_format, tma_store=True)
    h, hs = run_kernel(cfg, args)
    h2, hs2 = run_kernel(dataclasses.replace(cfg, tma_store=False), args)
    if h_format == "fp8_group128":
        assert torch.equal(h.view(torch.uint8), h2.view(torch.uint8)) and torch.equal(hs, hs2)
    else:
        assert torch.equal(h, h2)
    assert_matches_reference(h, hs, args, "silu", h_format)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("hidden,inter,m,tile_n", [
    (8192, 3584, 1024, 224), (8192, 3584, 1, 224), (4096, 14336, 256, 224), (4096, 14336, 300, 224),
    (8192, 3584, 2047, 224), (576, 3584, 130, 224),
    (576, 1536, 1024, 192), (4096, 12288, 256, 192), (576, 1536, 77, 192), (4096, 3072, 1500, 192)])
def test_granule_tile(hidden, inter, m, tile_n, act):
    """tile_n = 224 / 192 (bf16 → bf16 h, 112 / 96 h columns a tile from 16-row gate/up granules that
    straddle the g = 128 chunks): every element of h written (poisoned), equal to the reference; and
    dispatch.gate_up_config takes it where granule_tile_n says so."""
    from swiglu_fused.kernels.sm90 import gate_up as k

    args = make_operands(m, hidden, inter, "bf16", seed=zlib.crc32(repr((hidden, inter, m, act)).encode()))
    cfg = k.GateUpConfig(tile_m=128, tile_n=tile_n, stages=4, mainloop="bf16", h_format="bf16", act=act)
    h, _ = run_kernel(cfg, args)
    assert_matches_reference(h, None, args, act, "bf16", "bf16")
    picked = dispatch.gate_up_config(args["x"], args["weight"], None, None, act=act, h_format="bf16")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    expect = (dispatch.gate_up_tile_for(m, 2 * inter, sms, "bf16", k=hidden) == (128, 4, False)
              and not dispatch.wg3_applies(m, 2 * inter, sms) and dispatch.granule_tile_n(m, 2 * inter, sms) == tile_n)
    assert (picked == cfg) == expect


def test_granule_tile_refuses_an_intermediate_size_it_cannot_tile():
    from swiglu_fused.kernels.sm90 import gate_up as k

    args = make_operands(16, 576, 1536, "bf16", seed=1)
    cfg = k.GateUpConfig(tile_m=128, tile_n=224, stages=4, mainloop="bf16", h_format="bf16")
    with pytest.raises(ValueError, match="I = 1536 is not a multiple"):  # (of 112)
        run_kernel(cfg, args)


@pytest.mark.parametrize("hidden,inter,m", [(8192, 3584, 1024), (576, 1536, 130), (4096, 14336, 77), (8192, 3584, 20),
                                            (2048, 8192, 4097)])
def test_smem_scales_are_the_global_loads_bit_for_bit(hidden, inter, m, monkeypatch):
    """TileConfig.smem_scales (dispatched for the fp8 128-row tile): the producer stages the
    promotion scales in smem; h and h_scale equal those of the consumers' own global loads, every
    element written (poisoned outputs), rows past M reading the last row's scale as before."""
    from swiglu_fused.kernels.sm90 import gate_up as k, schedule

    if m == 20:  # stream-K split 3: the producer stages the scales of partial segments too
        monkeypatch.setattr(schedule, "plan", lambda tiles, *a, **kw: (3 * tiles, tiles))
    args = make_operands(m, hidden, inter, "fp8_block128", seed=m + 13)
    cfg = k.GateUpConfig(tile_m=128, stages=4, smem_scales=True)
    h, hs = run_kernel(cfg, args)
    h2, hs2 = run_kernel(dataclasses.replace(cfg, smem_scales=False), args)
    assert torch.equal(h.view(torch.uint8), h2.view(torch.uint8)) and torch.equal(hs, hs2)
    assert_matches_reference(h, hs, args, "silu", "fp8_group128")


@pytest.mark.parametrize("cluster_m", [1, 2])
@pytest.mark.parametrize("hidden,inter,m", [(4096, 14336, 1024), (2048, 8192, 300), (8192, 3584, 4097), (512, 1536, 77)])
def test_static_stages_are_the_dynamic_k_loop_bit_for_bit(hidden, inter, m, cluster_m):
    """TileConfig.static_stages (the k loop a ring of stages at a time, stage indices compile-time
    constants; whole tiles): h and h_scale equal the dynamic loop's, every element written
    (poisoned outputs), over several tiles a CTA (the phase carried from tile to tile), a ragged
    M, cluster pairs and a K of one ring (512)."""
    from swiglu_fused.kernels.sm90 import gate_up as k

    args = make_operands(m, hidden, inter, "fp8_block128", seed=m + 29)
    cfg = k.GateUpConfig(tile_m=128, stages=4, smem_scales=True, cluster_m=cluster_m, static_stages=True)
    h, hs = run_kernel(cfg, args)
    h2, hs2 = run_kernel(dataclasses.replace(cfg, static_stages=False), args)
    assert torch.equal(h.view(torch.uint8), h2.view(torch.uint8)) and torch.equal(hs, hs2)
    assert_matches_reference(h, hs, args, "silu", "fp8_group128")


UNIFORM_CASES = [  # (config fields, mainloop, h_format)
    (dict(tile_m=128, stages=4, smem_scales=True, static_stages=True), "fp8_block128", "fp8_group128"),
    (dict(tile_m=128, stages=4, smem_scales=True, cluster_m=2), "fp8_block128", "fp8_group128"),
    (dict(tile_m=64, stages=4, split_n=True), "fp8_block128", "fp8_group128"),
    (dict(tile_m=64, stages=5), "fp8_block128", "fp8_group128"),
    (dict(tile_m=16, stages=5, swap_ab=True), "fp8_block128", "fp8_group128"),
    (dict(tile_m=128, stages=4, mainloop="bf16"), "bf16", "bf16"),
    (dict(tile_m=192, stages=3, mainloop="bf16"), "bf16", "bf16"),
]


@pytest.mark.parametrize("fields,mainloop,h_format", UNIFORM_CASES)
@pytest.mark.parametrize("hidden,inter,m", [(4096, 14336, 1024), (576, 1536, 77)])
def test_uniform_descriptors_are_the_per_thread_ones_bit_for_bit(hidden, inter, m, fields, mainloop, h_format):
    """TileConfig.uniform_ab (dispatched for fp8 gate_up, D35): the wgmma operands sliced by its first thread
    give h (and h_scale) bit-identical to slicing by each thread's own index."""
    from swiglu_fused.kernels.sm90 import gate_up as k

    if fields.get("static_stages") and hidden % 512:
        pytest.skip("K is not whole rings")
    args = make_operands(m, hidden, inter, mainloop, seed=m + 31)
    cfg = k.GateUpConfig(h_format=h_format, uniform_ab=True, **fields)
    h, hs = run_kernel(cfg, args)
    h2, hs2 = run_kernel(dataclasses.replace(cfg, uniform_ab=False), args)
    view = torch.uint8 if h_format == "fp8_group128" else torch.int16
    assert torch.equal(h.view(view), h2.view(view)) and (hs is None or torch.equal(hs, hs2))
    assert_matches_reference(h, hs, args, "silu", h_format, mainloop)


def test_dispatch_takes_static_stages_where_k_is_whole_rings():
    """with_static_stages (D34): the dispatched fp8 prefill tile runs static_stages where K is whole rings
    of its stages and the tiles run whole, not at a K of 576, nor the decode tiles."""
    from swiglu_fused.kernels import dispatch

    def cfg(m, hidden, inter, mainloop):
        a = make_operands(m, hidden, inter, mainloop, seed=1)
        return dispatch.gate_up_config(a["x"], a["weight"], a.get("weight_scale"), a.get("x_scale"), act="silu",
                                       h_format="fp8_group128" if mainloop == "fp8_block128" else "bf16")

    assert cfg(1024, 4096, 14336, "fp8_block128").static_stages and cfg(4096, 8192, 3584, "fp8_block128").static_stages
    assert not cfg(1024, 576, 1536, "fp8_block128").static_stages  # K = 576: not whole rings of 512
    assert not cfg(16, 4096, 14336, "fp8_block128").static_stages  # the swap-AB tile
    assert not cfg(1024, 4096, 14336, "bf16").static_stages  # (the bf16 mainloop has no static form)


@pytest.mark.parametrize("mainloop,h_format", [("fp8_block128", "fp8_group128"), ("fp8_block128", "bf16"),
                                               ("bf16", "bf16"), ("bf16", "fp8_group128")])
@pytest.mark.parametrize("m", [3, 300])
def test_nan_and_inf_in_x_as_the_reference(m, mainloop, h_format):
    """x row 1 holds a NaN and row 2 a +Inf (in bf16, before quant_x for the fp8 mainloop). h and
    its scales are NaN (or ±Inf) exactly where the reference's are, never a silent 0: row 1 all
    NaN; row 2 all NaN, except with bf16 mainloop and bf16 h, where gate +Inf gives ±Inf and gate
    -Inf gives NaN (SiLU(-Inf) = -Inf · 0). The other rows match as usual. M = 3 runs the swap-AB
    tile, M = 300 the 128-row tile; K = 576 ends in a partial k block."""
    hidden, inter = 576, 1536
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, hidden, device="cuda", generator=g)
    x[1, 7] = float("nan")
    x[2, 100] = float("inf")
    x = x.to(torch.bfloat16)
    w = torch.randn(2 * inter, hidden, device="cuda", generator=g) * 0.05
    if mainloop == "bf16":
        args = dict(x=x, weight=w.to(torch.bfloat16))
    else:
        xq, xs = reference.quant_x(x)
        wq, ws = quant.quantize_fp8_block(w)
        args = dict(x=xq, weight=wq, weight_scale=ws, x_scale=xs)
    from swiglu_fused.kernels.sm90 import gate_up as k

    cfg = k.select_config(args["x"], args["weight"], args.get("weight_scale"), args.get("x_scale"),
                          act="silu", h_format=h_format)
    h, hs = run_kernel(cfg, args)
    h_ref, hs_ref = reference.gate_up(**args, act="silu", h_format=h_format)
    out, ref = h.float(), h_ref.float()
    assert ref[1].isnan().all() and ref[2].isnan().any()  # (the reference's semantics, pinned)
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(out.isinf(), ref.isinf()) and torch.equal(out[out.isinf()], ref[ref.isinf()])
    rows = [0] + list(range(3, m))
    if h_format == "fp8_group128":
        assert torch.equal(hs.isnan(), hs_ref.isnan()) and hs_ref[1:3].isnan().all()
        assert_fp8_group_close(h[rows], hs[rows], h_ref[rows], hs_ref[rows], **TOL[mainloop])
    else:
        assert_bf16_close(h[rows], h_ref[rows])


@pytest.mark.parametrize("h_format", ["fp8_group128", "bf16"])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("deep", [False, True], ids=["4stages", "5stages"])
@pytest.mark.parametrize("hidden,inter,m", [(8192, 3584, 256), (8192, 3584, 100), (576, 1536, 64), (2048, 8192, 1),
                                            (4096, 14336, 64), (4096, 14336, 192)])  # (192: 336 tiles, D42)
def test_split_n_64_row_tile(hidden, inter, m, act, h_format, deep, monkeypatch):
    """TileConfig.split_n: the 64-row tile's two warpgroups each run one B half (gate, up) and the
    up half's accumulator reaches the gate half's warpgroup through smem; against the reference
    on poisoned outputs, and bit for bit the one-warpgroup tile's h and scales (the same k tiles
    promoted in the same order). Both pipelines: 4 stages, and 5 with the hand-over in parts."""
    from swiglu_fused.kernels.sm90 import gate_up as k, schedule

    args = make_operands(m, hidden, inter, "fp8_block128", seed=m + inter)
    pipe = dispatch.split_n_pipeline(deep, h_format)
    cfg = k.GateUpConfig(tile_m=64, act=act, h_format=h_format, split_n=True, **pipe)
    # (whole tiles for both: stream-K would sum the one-warpgroup tile's partials in another order)
    monkeypatch.setattr(schedule, "plan", lambda tiles, k_tiles, sms, *a, **kw: (max(1, min(tiles, sms)), 0))
    h, hs = run_kernel(cfg, args)
    assert_matches_reference(h, hs, args, act, h_format)
    h1, hs1 = run_kernel(dataclasses.replace(cfg, split_n=False, xacc_parts=1), args)
    assert torch.equal(h.view(torch.uint8), h1.view(torch.uint8))
    if h_format == "fp8_group128":
        assert torch.equal(hs, hs1)


@pytest.mark.parametrize(premises.row_64_tile_over_several_rounds.names, premises.row_64_tile_over_several_rounds.cases)
def test_64_row_tile_over_several_rounds(hidden, inter, m, mainloop, h_format):
    """D42, D43: where the rounds rule takes the 64-row tile above one wave (several M tiles on each
    weight tile, several rounds of waves), the dispatched config is that tile and h is the reference's."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if sms != premises.SMS:
        pytest.skip(f"the rounds rule's cases are for 132 SMs; this GPU has {sms}")
    cfg = premises.row_64_tile_over_several_rounds(hidden, inter, m, mainloop, h_format)
    args = make_operands(m, hidden, inter, mainloop, seed=zlib.crc32(repr((mainloop, h_format, m, inter)).encode()))
    h, hs = run_kernel(cfg, args)
    assert_matches_reference(h, hs, args, "silu", h_format, mainloop)


@pytest.mark.parametrize("mainloop,h_format", [("fp8_block128", "fp8_group128"), ("fp8_block128", "bf16"),
                                               ("bf16", "bf16")])
@pytest.mark.parametrize("hidden,inter,m", [(8192, 3584, 128), (576, 1536, 100), (4096, 14336, 1024)])
def test_l2_hint_changes_no_bit(hidden, inter, m, mainloop, h_format):
    """TileConfig.l2_hint only sets the TMA loads' L2 eviction priority: h and h_scale are
    bit-identical with and without it, on the dispatched tile (hinted or not) and the other way."""
    from swiglu_fused.kernels.sm90 import gate_up as k

    args = make_operands(m, hidden, inter, mainloop, seed=m + inter)
    cfg = k.select_config(args["x"], args["weight"], args.get("weight_scale"), args.get("x_scale"),
                          act="silu", h_format=h_format)
    other = dataclasses.replace(cfg, l2_hint="" if cfg.l2_hint else "w_first")
    h, hs = run_kernel(cfg, args)
    h2, hs2 = run_kernel(other, args)
    if h_format == "fp8_group128":
        assert torch.equal(h.view(torch.uint8), h2.view(torch.uint8)) and torch.equal(hs, hs2)
    else:
        assert torch.equal(h, h2)
    assert_matches_reference(h, hs, args, "silu", h_format, mainloop)
