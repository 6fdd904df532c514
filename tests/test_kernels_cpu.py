"""CPU tests (CI): the ops dispatch to the reference off-GPU, validate their arguments, have working
fake implementations; and every shipped sm_90a kernel configuration compiles (CuTe DSL compiles
for sm_90a without a GPU; skipped only where nvidia-cutlass-dsl is not installed)."""

import dataclasses

import pytest
import torch

from swiglu_fused import quant
from swiglu_fused.kernels import dispatch, dispatch_nvfp4, ops, reference


def _fp8_operands(m=5, hidden=200, inter=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, hidden, generator=g).to(torch.bfloat16)
    w = torch.randn(2 * inter, hidden, generator=g) * 0.05
    xq, xs = reference.quant_x(x)
    wq, ws = quant.quantize_fp8_block(w)
    return dict(x=xq, weight=wq, weight_scale=ws, x_scale=xs)


# ---------------------------------------------------------------- dispatch on CPU = reference
def test_quant_x_cpu_is_reference():
    x = torch.randn(3, 300).to(torch.bfloat16)
    q, s = ops.quant_x(x)
    q_ref, s_ref = reference.quant_x(x)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("h_format", ["bf16", "fp8_group128"])
def test_gate_up_cpu_is_reference(act, h_format):
    args = _fp8_operands()
    h, hs = ops.gate_up(**args, act=act, h_format=h_format)
    h_ref, hs_ref = reference.gate_up(**args, act=act, h_format=h_format)
    assert h.is_contiguous() and torch.equal(h.view(torch.uint8), h_ref.contiguous().view(torch.uint8))
    assert (hs is None) == (hs_ref is None) and (hs is None or torch.equal(hs, hs_ref))
    # h_scale M-major on every backend (the layout both down GEMMs read)
    assert hs is None or hs.stride() == (1, hs.shape[0])


def test_gate_up_bf16_cpu_is_reference():
    x = torch.randn(4, 64).to(torch.bfloat16)
    w = torch.randn(256, 64).to(torch.bfloat16)
    h, hs = ops.gate_up(x, w)
    assert hs is None and torch.equal(h, reference.gate_up(x, w)[0])


def test_down_cpu_is_reference():
    h = torch.randn(3, 256).to(torch.bfloat16)
    w = torch.randn(64, 256).to(torch.bfloat16)
    r = torch.randn(3, 64).to(torch.bfloat16)
    assert torch.equal(ops.down(h, w, residual=r), reference.down(h, w, residual=r))


def _split_operands(fp8: bool, m=5, k=200, p=384, inter=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    w = torch.randn(p + 2 * inter, k, generator=g) * 0.05
    if not fp8:
        return dict(x=x, weight=w.to(torch.bfloat16))
    xq, xs = reference.quant_x(x)
    wq, ws = quant.quantize_fp8_block(w)
    return dict(x=xq, weight=wq, weight_scale=ws, x_scale=xs)


@pytest.mark.parametrize("fp8", [False, True])
def test_gate_up_split_cpu_is_reference(fp8):
    """[y | h] in one bf16 tensor: the reference's y and h, concatenated."""
    args = _split_operands(fp8)
    out = ops.gate_up_split(**args, prefix=384, act="gelu_tanh")
    y, h, _ = reference.gate_up_split(**args, prefix=384, act="gelu_tanh")
    assert out.dtype == torch.bfloat16 and torch.equal(out, torch.cat([y, h], dim=-1))


def test_gate_up_split_errors_name_the_argument():
    args = _split_operands(True)
    with pytest.raises(ValueError, match="prefix: 300 rows leave 596 of the weight's 896"):
        ops.gate_up_split(**args, prefix=300)
    with pytest.raises(ValueError, match="x_scale"):
        ops.gate_up_split(args["x"], args["weight"], args["weight_scale"], None, prefix=384)
    with pytest.raises(ValueError, match=r"prefix: expected the number of plain rows, an int with 0 < prefix < 896"):
        ops.gate_up_split(**args, prefix=0)
    with pytest.raises(ValueError, match=r"weight_scale: expected shape .*\(one multiplier per 128x128"):
        ops.gate_up_split(args["x"], args["weight"], args["weight_scale"][:-1], args["x_scale"], prefix=384)
    wide = _split_operands(True, p=320, inter=128)
    with pytest.raises(ValueError, match="prefix: 64 is not a multiple of 128"):
        ops.gate_up_split(**wide, prefix=64)
    with pytest.raises(ValueError, match="x: has 199 columns"):
        ops.gate_up_split(torch.randn(2, 199).bfloat16(), _split_operands(False)["weight"], prefix=384)
    w4, s4 = torch.zeros(384 + 512, 32, dtype=torch.uint8), torch.zeros(384 + 512, 4, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"global_scale: expected 3 elements \(\[3\]: prefix, gate and up\)"):
        ops.gate_up_split(torch.randn(2, 64).bfloat16(), w4, s4, None, torch.ones(2), prefix=384)


def test_gate_up_split_fake_and_config_checks():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        out = torch.ops.swiglu_fused.gate_up_split(torch.empty(7, 64, dtype=torch.bfloat16),
                                                   torch.empty(384 + 512, 64, dtype=torch.bfloat16),
                                                   None, None, None, 384, 128, "silu")
        assert out.shape == (7, 384 + 256) and out.dtype == torch.bfloat16
    args = _split_operands(False, k=64)
    torch.library.opcheck(torch.ops.swiglu_fused.gate_up_split.default,
                          (args["x"], args["weight"], None, None, None, 384, 128, "silu"))
    pytest.importorskip("cutlass")
    from swiglu_fused.kernels.sm90.tile_config import SplitConfig

    assert SplitConfig(prefix=384, h_format="bf16").prefix_shift == 128
    assert SplitConfig(prefix=512, h_format="bf16").prefix_tiles == 2
    with pytest.raises(ValueError, match="SplitConfig.prefix: expected a positive multiple of 128"):
        SplitConfig(prefix=200, h_format="bf16")
    with pytest.raises(ValueError, match="bf16 h"):
        SplitConfig(prefix=256, h_format="fp8_group128")


def test_split_dispatch_picks_a_shipped_config(monkeypatch):
    """On an sm_90 device (pretended here) Flux.2-dev's projection gets a config CI compile-checks,
    nvfp4 and a prefix off the 128-row blocks the reference (the latter with a warning)."""
    pytest.importorskip("cutlass")
    monkeypatch.setattr(dispatch, "sm90_kernels_usable", lambda device: True)
    for fp8 in (False, True):
        for m in (16, 4608):
            args = _split_operands(fp8, m=m, k=128, p=18432, inter=128)
            backend, cfg = dispatch.split_backend(args["x"], args["weight"], args.get("weight_scale"),
                                                  args.get("x_scale"), None, 18432, 128, "silu")
            assert backend == dispatch.SM90 and cfg in dispatch.split_shipped()
    x = torch.randn(4, 64).bfloat16()
    w4, s4 = torch.empty(18432 + 256, 32, dtype=torch.uint8), torch.empty(18432 + 256, 4, dtype=torch.float8_e4m3fn)
    backend, cfg = dispatch.split_backend(x, w4, s4, None, torch.ones(3), 18432, 128, "silu")
    assert backend == dispatch.SM90 and cfg.nvfp4 and cfg in dispatch.split_shipped()
    assert dispatch.split_backend(x, w4, None, None, torch.ones(3), 18432, 128, "silu") == (dispatch.REFERENCE, None)
    dispatch._warn_reference_once.cache_clear()
    with pytest.warns(UserWarning, match="gate_up_split: the prefix has 384 rows, not a multiple of 256"):
        assert dispatch.split_backend(x, w4[128:], s4[128:], None, torch.ones(3), 384, 128, "silu")[0] == "reference"
    with pytest.warns(UserWarning, match="gate_up_split: the prefix has 64 rows, not a multiple of 128"):
        dispatch.split_backend(x, torch.empty(64 + 256, 64, dtype=torch.bfloat16), None, None, None, 64, 128, "silu")


# ---------------------------------------------------------------- argument validation
def test_gate_up_errors_name_the_argument():
    args = _fp8_operands()
    with pytest.raises(ValueError, match="x_scale"):
        ops.gate_up(args["x"], args["weight"], args["weight_scale"], None)
    with pytest.raises(ValueError, match="weight_scale"):
        ops.gate_up(args["x"], args["weight"], args["weight_scale"][:, :1], args["x_scale"])
    with pytest.raises(ValueError, match="^x: "):
        ops.gate_up(args["x"][:, :100], args["weight"], args["weight_scale"], args["x_scale"])
    with pytest.raises(ValueError, match="^act: "):
        ops.gate_up(**args, act="relu")
    with pytest.raises(ValueError, match="^h_format: "):
        ops.gate_up(**args, h_format="nvfp4")
    with pytest.raises(ValueError, match="^weight: .*interleave"):
        ops.gate_up(torch.randn(2, 64).bfloat16(), torch.randn(200, 64).bfloat16())
    with pytest.raises(TypeError, match="^x: "):
        ops.quant_x(torch.zeros(2, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match="^weight: is on meta but x is on cpu"):
        ops.gate_up(args["x"], args["weight"].to("meta"), args["weight_scale"], args["x_scale"])
    with pytest.raises(ValueError, match="^x_scale: is on meta"):
        ops.gate_up(args["x"], args["weight"], args["weight_scale"], args["x_scale"].to("meta"))


def test_static_stages_take_only_whole_rings_of_k():
    """TileConfig.static_stages (the fp8 128-row tile with smem_scales only) steps K a ring of stages at
    a time: a K that is not whole rings is refused by name before any GPU work."""
    pytest.importorskip("cutlass")
    from swiglu_fused.kernels.sm90 import gate_up as kg

    for fields in (dict(tile_m=64), dict(tile_m=16, swap_ab=True), dict(tile_m=128, mainloop="bf16"),
                   dict(tile_m=128)):
        with pytest.raises(ValueError, match="static_stages: the fp8 128-row tile with smem_scales only"):
            kg.GateUpConfig(stages=4, static_stages=True, **fields)
    cfg = kg.GateUpConfig(tile_m=128, stages=4, smem_scales=True, static_stages=True)
    assert cfg.whole_tiles
    args = _fp8_operands(m=5, hidden=576, inter=256)
    with pytest.raises(ValueError, match="gate_up: .* K = 576 is not a multiple of that; use static_stages = False"):
        kg.gate_up(cfg, args["x"], args["weight"], args["weight_scale"], args["x_scale"])


def test_static_stages_follow_k_and_the_stream_k_plan(monkeypatch):
    """with_static_stages (DISPATCH D34): the fp8 128-row tile with smem_scales takes static_stages
    where K is whole rings of its stages and the tiles run whole: not at K = 576, not where plan()
    splits the tiles stream-K (cluster pairs never are), not without smem_scales, and not with the
    switch off."""
    pytest.importorskip("cutlass")
    from swiglu_fused.kernels.sm90 import schedule
    from swiglu_fused.kernels.sm90.tile_config import GateUpConfig

    class Cuda:  # the rule asks the stream-K plan only for a CUDA device
        type = "cuda"

    split = {"on": False}
    monkeypatch.setattr(schedule, "sm_count", lambda device: 132)
    monkeypatch.setattr(schedule, "schedule", lambda cfg, m, n, k, sms: (264, 132) if split["on"] else (132, 0))
    tile = GateUpConfig(tile_m=128, stages=4, smem_scales=True)
    assert dispatch.with_static_stages(tile, 1024, 28672, 4096, Cuda()).static_stages
    assert not dispatch.with_static_stages(tile, 1024, 3072, 576, Cuda()).static_stages
    assert not dispatch.with_static_stages(GateUpConfig(tile_m=128, stages=4), 1024, 28672, 4096, Cuda()).static_stages
    split["on"] = True
    assert not dispatch.with_static_stages(tile, 256, 28672, 4096, Cuda()).static_stages
    pair = GateUpConfig(tile_m=128, stages=4, smem_scales=True, cluster_m=2)
    assert dispatch.with_static_stages(pair, 4096, 28672, 4096, Cuda()).static_stages
    monkeypatch.setattr(dispatch, "STATIC_STAGES", False)
    assert not dispatch.with_static_stages(pair, 4096, 28672, 4096, Cuda()).static_stages


def test_gate_ups_swap_ab_tile_over_four_m_tiles_launches_without_pdl(monkeypatch):
    """DISPATCH D39, D41: fp8 gate_up takes PDL at decode sizes (D20) except its swap-AB tile over
    more than PDL_SWAP_M_TILES M tiles (M = 49-64: four 16-token tiles) where DeepGEMM takes down
    or the hidden size is at least PDL_SWAP_OWN_DOWN_HIDDEN (8192×3584), where PDL was measured
    slower; with our own down at a narrower hidden size (4096×3584) it keeps PDL (measured faster).
    The configs it picks either way are shipped (compile-checked)."""
    pytest.importorskip("cutlass")
    from swiglu_fused.kernels import deepgemm
    from swiglu_fused.kernels.sm90 import schedule

    monkeypatch.setattr(schedule, "sm_count", lambda device: 132)
    monkeypatch.setattr(deepgemm, "module", lambda: None)  # (as in CI: DeepGEMM not installed)

    def config(m, hidden, inter):
        x, w = torch.empty(m, hidden, dtype=torch.float8_e4m3fn), torch.empty(2 * inter, hidden, dtype=torch.float8_e4m3fn)
        return dispatch.gate_up_config(x, w, torch.empty(2 * inter // 128, hidden // 128), torch.empty(m, hidden // 128),
                                       act="silu", h_format="fp8_group128")

    for m, pdl in ((16, True), (48, True), (49, False), (64, False), (65, False)):
        cfg = config(m, 8192, 3584)
        assert cfg.pdl is pdl and cfg in dispatch.gate_up_shipped(), (m, cfg)
    assert config(64, 8192, 3584).swap_ab and config(64, 4096, 14336).pdl  # (the 64-row tile there: one M tile)
    narrow = config(64, 4096, 3584)
    assert narrow.swap_ab and narrow.pdl and narrow in dispatch.gate_up_shipped()
    monkeypatch.setattr(deepgemm, "module", lambda: object())  # DeepGEMM takes down from MIN_M rows
    assert not config(64, 4096, 3584).pdl and config(48, 4096, 3584).pdl
    assert config(64, 4096, 2688).pdl  # (I / 128 not a multiple of 4: down stays ours, cublas.reads_scales_right)
    monkeypatch.setattr(deepgemm, "ENABLED", False)
    assert config(64, 4096, 3584).pdl
    monkeypatch.setattr(dispatch, "PDL_SWAP_M_TILES", 99)
    assert config(64, 8192, 3584).pdl


@pytest.mark.parametrize("k,takes", [(512, True), (1536, True), (14336, True), (3584, True),
                                     (1664, False), (1792, False), (5504, False), (11008, False), (896, False)])
def test_cublas_takes_fp8_down_only_where_its_weight_scales_are_16_byte_strided(k, takes, monkeypatch):
    """cuBLAS's block-scaled GEMM returns wrong values where K/128 is not a multiple of 4 (measured on the
    H200: kernels/cublas.py), so cublas.supports_down refuses those K (the sm90 kernel or the reference
    runs them); bf16 down is not concerned. (CUDA tensors stood in for by their attributes.)"""
    from types import SimpleNamespace

    from swiglu_fused.kernels import cublas

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    cuda, fp8 = torch.device("cuda"), torch.float8_e4m3fn
    h = SimpleNamespace(device=cuda, dtype=fp8)
    w = SimpleNamespace(shape=(4096, k), dtype=fp8)
    scale = SimpleNamespace(dtype=torch.float32)
    assert cublas.supports_down(h, w, scale, scale, None) == takes
    assert cublas.supports_down(SimpleNamespace(device=cuda, dtype=torch.bfloat16),
                                SimpleNamespace(shape=(4096, k), dtype=torch.bfloat16), None, None, None)


def test_down_errors_name_the_argument():
    with pytest.raises(ValueError, match="^h: "):
        ops.down(torch.randn(2, 100).bfloat16(), torch.randn(64, 256).bfloat16())
    with pytest.raises(ValueError, match="^residual: "):
        ops.down(torch.randn(2, 256).bfloat16(), torch.randn(64, 256).bfloat16(), residual=torch.randn(2, 63))
    hq, hs = reference.quant_x(torch.randn(2, 256))
    wq, ws = quant.quantize_fp8_block(torch.randn(576, 256))
    with pytest.raises(ValueError, match="^h_scale: "):
        ops.down(hq, wq, ws, None)
    with pytest.raises(ValueError, match="^h_scale: "):
        ops.down(hq, wq, ws, hs[:, :1])
    with pytest.raises(ValueError, match="^weight_scale: "):
        ops.down(hq, wq, None, hs)
    with pytest.raises(ValueError, match="^weight_scale: "):
        ops.down(hq, wq, ws[:4], hs)


def test_nvfp4_scales_interleave_and_down_dtypes_are_checked_by_name():
    from swiglu_fused.weight_packing import pack

    g, u = (pack.quantize(torch.randn(384, 256), "nvfp4", n, "divisor") for n in ("gate", "up"))
    t = pack.pack_gate_up(g, u, 128)
    x = torch.randn(2, 256).bfloat16()
    ws, gs = t["weight_scale"], t["weight_global_scale"]
    ops.gate_up(x, t["weight_packed"], ws, global_scale=gs)  # the right ones run
    with pytest.raises(ValueError, match="^weight_scale: expected shape"):
        ops.gate_up(x, t["weight_packed"], ws[:, :4], global_scale=gs)
    with pytest.raises(ValueError, match="^weight_scale, global_scale: an nvfp4 weight needs"):
        ops.gate_up(x, t["weight_packed"], ws)
    with pytest.raises(ValueError, match="^global_scale: expected 1 or 2 elements"):
        ops.gate_up(x, t["weight_packed"], ws, global_scale=torch.ones(3))
    for g_bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="^interleave: expected a positive integer"):
            ops.gate_up(x, torch.randn(256, 256).bfloat16(), interleave=g_bad)
    w = torch.randn(64, 256).bfloat16()
    with pytest.raises(TypeError, match="^h: dtype torch.int64"):
        ops.down(torch.ones(2, 256, dtype=torch.int64), w)
    with pytest.raises(TypeError, match="^weight: dtype torch.float32"):
        ops.down(torch.randn(2, 256).bfloat16(), w.float())
    with pytest.raises(TypeError, match="^out_dtype: "):
        ops.down(torch.randn(2, 256).bfloat16(), w, out_dtype="bfloat16")
    with pytest.raises(TypeError, match="^residual: dtype torch.int32"):
        ops.down(torch.randn(2, 256).bfloat16(), w, residual=torch.ones(2, 64, dtype=torch.int32))


def test_down_configs():
    pytest.importorskip("cutlass")
    from swiglu_fused.kernels.sm90 import down

    hq, hs = reference.quant_x(torch.randn(200, 256))
    wq, ws = quant.quantize_fp8_block(torch.randn(576, 256))
    cfg = dispatch.down_config(hq, wq, ws, hs, None, torch.bfloat16)
    assert cfg == down.DownConfig(tile_m=128, stages=4, mainloop="fp8_block128", residual=False, y_slab_cols=64,
                                  smem_scales=True, uniform_ab=True)  # (D36; K = 256 is not whole rings: no static loop)
    assert dispatch.down_config(hq[:100], wq, ws, hs[:100], None, torch.bfloat16).tile_m == 64  # M ≤ 128
    assert cfg in dispatch.down_shipped()
    res = torch.zeros(3, 576, dtype=torch.bfloat16)
    assert dispatch.down_config(hq[:3], wq, ws, hs[:3], res, torch.bfloat16).residual
    assert dispatch.down_config(hq, wq, ws, hs, None, torch.float16) is None  # y is bf16 only
    assert dispatch.down_config(hq, wq[:570], ws, hs, None, torch.bfloat16) is None  # H % 8
    # bf16: ops.down prefers cuBLAS (where it takes the shape) when the kernel's tiles cannot fill the SMs
    prefill = down.DownConfig(tile_m=128, stages=4, mainloop="bf16")
    assert dispatch.fills_gpu(prefill, 1024, 4096, 132) and not dispatch.fills_gpu(prefill, 256, 4096, 132)
    assert dispatch.beats_cublas(prefill, 1024, 4096, 14336, 132) and not dispatch.beats_cublas(prefill, 8192, 4096, 14336, 132)
    with pytest.raises(ValueError, match="DownConfig.stages"):
        down.DownConfig(stages=5)


def test_stream_k_partials_hold_every_accumulator_value():
    """A stream-K partial slot is a consumer thread's whole accumulator: 128 fp32 values for the row
    tiles and the swap-AB tiles up to 128 tokens, 144 and 160 for nvfp4's 144- and 160-token tiles
    (slots of 128 had let their partials overrun each other: wrong h past 128 rows, DISPATCH D64)."""
    pytest.importorskip("cutlass")
    from swiglu_fused.kernels.sm90.tile_config import ACC_VALUES, DownConfig, GateUpConfig

    assert GateUpConfig(tile_m=128, stages=4).acc_values == ACC_VALUES == 128
    assert GateUpConfig(tile_m=16, stages=6, swap_ab=True).acc_values == 128  # (32 values, one warpgroup)
    for tokens in (32, 80, 128, 144, 160):
        tile = dispatch_nvfp4._nvfp4_tile(dispatch_nvfp4._nvfp4_share_tile("down", tokens))
        cfg = DownConfig(mainloop="nvfp4", tile_major=True, **dispatch_nvfp4._nvfp4_rs(tile, True))
        values = cfg.tile_m * 2 * 128 // cfg.consumer_threads  # (256 weight rows × tile_m tokens a CTA)
        assert cfg.tile_m == tokens and cfg.acc_values == max(128, values) == max(128, tokens)
    for tokens in dispatch_nvfp4.NVFP4_HALF_ROWS_TOKENS:  # the 128-row tiles (D67, D68): 128 × tile_m a CTA
        for op, cls, kw in (("down", DownConfig, {}), ("gate_up", GateUpConfig, {"h_format": "bf16"})):
            tile = dispatch_nvfp4._nvfp4_tile(dispatch_nvfp4._nvfp4_share_tile(op, tokens, half_rows=True))
            cfg = cls(mainloop="nvfp4", tile_major=True, **dispatch_nvfp4._nvfp4_rs(tile, True), **kw)
            assert cfg.nvfp4_half_rows and cfg.half_row_pairs == (op == "gate_up")
            assert cfg.tile_m == tokens and cfg.acc_values == 128


def test_x_permute_takes_the_small_tiles_and_the_64_token_one_where_i_is_narrow():
    """D72: gate_up's 32- and 48-token tiles permute x in shared memory at every width, the 64-token one where
    gate_up has at most NVFP4_X_PERMUTE_64_MAX_TILES weight tiles (I ≤ 8192), the larger tiles and down never;
    every config that can come out is compile-checked (shipped)."""
    from swiglu_fused.kernels import dispatch_nvfp4 as dn
    from swiglu_fused.kernels.sm90.tile_config import GateUpConfig

    shipped = dispatch.gate_up_shipped()
    for hidden, inter in ((4096, 14336), (8192, 3584), (2048, 8192), (5120, 13824), (8192, 2048)):
        for m in (17, 33, 49, 64, 80, 128):
            fields = dn.nvfp4_tile_for(m, "gate_up", True, (2 * inter, hidden, 132))
            tokens = fields["tile_m"]
            want = tokens in (32, 48) or (tokens == 64 and inter <= 8192)
            assert fields.get("x_permute", False) == want, (hidden, inter, m)
            assert not dn.nvfp4_tile_for(m, "down", True, (hidden, inter, 132)).get("x_permute"), (hidden, inter, m)
            cfg = GateUpConfig(mainloop=dn.NVFP4_MAINLOOP, tile_major=True, act="silu", h_format="bf16", **fields)
            assert cfg in shipped, cfg


def test_nvfp4_configs_decode_buffers(monkeypatch):
    """The 16-48-token swap-AB tiles decode into one buffer (D30, D62, D63), the 64-128-token tiles into two
    (down's 80-128-token ones into one: D31, D64; down's 32-64-token tiles sum their partials four at a time: D63);
    the register-sourced ones launch for the full register split at 48-96 tokens (D65) and prefetch from 64
    (D66); every pick is shipped (compile-checked), and one buffer is refused where no mainloop reads it."""
    pytest.importorskip("cutlass")
    from swiglu_fused.kernels.sm90 import down, gate_up
    from swiglu_fused.weight_packing import pack

    g, u = (pack.quantize(torch.randn(256, 256), "nvfp4", n, "divisor") for n in ("gate", "up"))
    w, ws = (pack.pack_gate_up(g, u, 128)[k] for k in ("weight_packed", "weight_scale"))
    d = pack.quantize(torch.randn(256, 128), "nvfp4", "down", "divisor").tensors
    dw, dws = d["weight_packed"], d["weight_scale"]
    for rs in (True, False):  # (D45: the register-sourced tiles of 32-128 tokens hold one register set)
        monkeypatch.setattr(dispatch_nvfp4, "NVFP4_RS", rs)
        for m, tokens, buffers in ((1, 16, (1, 1)), (16, 16, (1, 1)), (17, 32, (1, 1)), (32, 32, (1, 1)),
                                   (33, 48, (1, 1)), (48, 48, (1, 1)), (49, 64, (2, 2)), (64, 64, (2, 2)),
                                   (65, 80, (2, 1)), (80, 80, (2, 1)), (81, 96, (2, 1)), (100, 112, (2, 1)),
                                   (113, 128, (2, 1)), (1023, 128, (2, 1))):
            x = torch.randn(m, 256).bfloat16()
            gcfg = dispatch.gate_up_config(x, w, ws, None, act="silu", h_format="bf16", tile_major=True)
            dcfg = dispatch.down_config(x[:, :128], dw, dws, None, None, torch.bfloat16, True)
            assert gcfg.rs_decode == dcfg.rs_decode == (rs and tokens > 16), (m, rs)
            buffers = (1, 1) if gcfg.rs_decode else buffers
            assert (gcfg.decode_buffers, dcfg.decode_buffers) == buffers and gcfg.swap_ab and dcfg.swap_ab, m
            assert gcfg.tile_m == dcfg.tile_m == tokens, m
            assert (gcfg.fixup_unroll, dcfg.fixup_unroll) == (1, 4 if 32 <= tokens <= 64 else 1), m
            # (D65: ptxas keeps the 48-96-token tiles' register split; D66: the 64-160-token tiles prefetch)
            assert gcfg.ctas_per_sm == dcfg.ctas_per_sm == (1 if gcfg.rs_decode and 48 <= tokens <= 96 else 0), m
            assert gcfg.rs_prefetch == dcfg.rs_prefetch == (gcfg.rs_decode and tokens >= 64), m
            assert gcfg.x_permute == (gcfg.rs_decode and tokens in dispatch_nvfp4.NVFP4_X_PERMUTE_TOKENS), m
            assert not dcfg.x_permute, m
            assert gcfg in dispatch.gate_up_shipped() and dcfg in dispatch.down_shipped()
            h_rs = dataclasses.replace(gcfg, h_rs_order=True)
            assert (h_rs in dispatch.gate_up_shipped()) == gcfg.rs_decode, m
            packed = dispatch.gate_up_config(x, w, ws, None, act="silu", h_format="bf16")  # (smem decode only)
            assert not packed.rs_decode and packed in dispatch.gate_up_shipped()
    for bad in (dict(mainloop="bf16", swap_ab=True, tile_m=16), dict(mainloop="nvfp4", tile_m=128),
                dict(mainloop="nvfp4", swap_ab=True, tile_m=16, decode_buffers=3)):
        with pytest.raises(ValueError, match="decode_buffers"):
            down.DownConfig(**{"decode_buffers": 1, **bad})
    gate_up.GateUpConfig(tile_m=16, swap_ab=True, stages=6, mainloop="nvfp4", h_format="bf16", decode_buffers=1)
    for bad in (dict(mainloop="nvfp4", tile_m=128), dict(mainloop="bf16", swap_ab=True, tile_m=64),
                dict(mainloop="nvfp4", swap_ab=True, tile_m=128),  # (not tile-major)
                dict(mainloop="nvfp4", swap_ab=True, tile_m=128, tile_major=True, decode_buffers=2)):
        with pytest.raises(ValueError, match="rs_decode"):
            down.DownConfig(rs_decode=True, **bad)
    with pytest.raises(ValueError, match="h_rs_order"):
        gate_up.GateUpConfig(tile_m=128, stages=4, mainloop="bf16", h_format="bf16", h_rs_order=True)
    with pytest.raises(ValueError, match="rs_prefetch"):
        down.DownConfig(mainloop="nvfp4", swap_ab=True, tile_m=128, tile_major=True, rs_prefetch=True)
    rs = dict(mainloop="nvfp4", swap_ab=True, tile_m=128, tile_major=True, decode_buffers=1, h_format="bf16")
    assert gate_up.GateUpConfig(rs_decode=True, x_permute=True, pdl=True, **rs).x_permute
    with pytest.raises(ValueError, match="x_permute"):
        gate_up.GateUpConfig(x_permute=True, **{**rs, "rs_decode": False})
    with pytest.raises(ValueError, match="x_permute"):
        down.DownConfig(mainloop="nvfp4", swap_ab=True, tile_m=128, tile_major=True, decode_buffers=1, rs_decode=True,
                        x_permute=True)


def test_l2_hints_go_to_the_weight_loads():
    """TileConfig.l2_hint's evict_first is for the weight k tiles on every tile: the producer's B
    loads, the swap-AB tiles' too (their weights are the wgmma's A operand, not the TMA's)."""
    pytest.importorskip("cutlass")
    from swiglu_fused.kernels.sm90.kernel_host import kernel_class
    from swiglu_fused.kernels.sm90.tile_config import EVICT_FIRST, EVICT_LAST, GateUpConfig

    for swap, tile_m in ((False, 64), (True, 16)):
        for hint, act_policy in (("w_first", None), ("w_first_x_last", EVICT_LAST)):
            cfg = GateUpConfig(tile_m=tile_m, stages=4, swap_ab=swap, l2_hint=hint)
            act, weight = (({k: int(v) for k, v in d.items()}) for d in kernel_class(cfg)(cfg)._l2_hints())
            assert weight == {"cache_policy": EVICT_FIRST}, cfg
            assert act == ({} if act_policy is None else {"cache_policy": act_policy}), cfg


# ---------------------------------------------------------------- fake (meta) implementations
def test_ops_opcheck():
    args = _fp8_operands(m=4, hidden=128, inter=128)
    # e4m3 outputs: torch's schema checker cannot compare e4m3 on the CPU, so fake-tensor checks only
    fake_only = ("test_faketensor",)
    torch.library.opcheck(torch.ops.swiglu_fused.quant_x.default, (torch.randn(4, 136).bfloat16(),),
                          test_utils=fake_only)
    torch.library.opcheck(
        torch.ops.swiglu_fused.gate_up.default,
        (args["x"], args["weight"], args["weight_scale"], args["x_scale"], None, 128, "silu", "fp8_group128"),
        test_utils=fake_only,
    )
    torch.library.opcheck(
        torch.ops.swiglu_fused.gate_up.default,
        (torch.randn(4, 64).bfloat16(), torch.randn(256, 64).bfloat16(), None, None, None, 128, "gelu_tanh", "bf16"),
    )
    torch.library.opcheck(
        torch.ops.swiglu_fused.down.default,
        (torch.randn(2, 256).bfloat16(), torch.randn(64, 256).bfloat16(), None, None, None, None, torch.bfloat16),
    )


def test_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(7, 576, dtype=torch.float8_e4m3fn)
        w = torch.empty(2 * 1536, 576, dtype=torch.float8_e4m3fn)
        h, hs = torch.ops.swiglu_fused.gate_up(x, w, torch.empty(24, 5), torch.empty(7, 5), None, 128, "silu",
                                               "fp8_group128")
        assert h.shape == (7, 1536) and h.dtype == torch.float8_e4m3fn and hs.shape == (7, 12)
        q, s = torch.ops.swiglu_fused.quant_x(torch.empty(7, 576, dtype=torch.bfloat16))
        assert q.shape == (7, 576) and s.shape == (7, 5)


def test_warp_mma_configs_follow_m_and_k(monkeypatch):
    """nvfp4 at decode sizes (DISPATCH D33): n8 by M, k_cta 512 or as dispatch_nvfp4.WARP_MMA_K_CTA says,
    unsplit where K is one CTA's, half-tile CTAs where whole-tile ones exceed a wave, 32 tokens only
    in whole-tile CTAs (capped to 16 warps an SM), every one compile-checked; none above
    WARP_MMA_M, for the packed order or a K not a multiple of 128."""
    pytest.importorskip("cutlass")
    c = dispatch_nvfp4.warp_mma_config
    shipped = dispatch_nvfp4.warp_mma_shipped()
    for m, k in [(1, 4096), (16, 14336), (3, 384), (9, 512), (16, 3584), (1, 8192)]:
        assert c("gate_up", m, 8192, k, True, "gelu_tanh") in shipped
        assert c("down", m, 8192, k, True, residual=True) in shipped
    assert [c("down", m, 4096, 14336, True).n8 for m in (8, 9, 16)] == [1, 2, 2]
    assert [c("down", 1, 4096, k, True).k_cta for k in (4096, 14336, 384, 768)] == [512, 896, 128, 256]
    # K in more than 8 shares: the largest grid in one wave of two an SM (16 × 16 shares of 896 = 256
    # CTAs), else the fewest CTAs (32 tiles × 28 shares of 1024)
    assert c("down", 1, 4096, 14336, True, sms=120).k_cta == 1024 and c("down", 1, 8192, 28672, True).k_cta == 1024
    assert not c("down", 1, 4096, 512, True).split_k and c("down", 1, 4096, 1024, True).split_k
    assert c("down", dispatch_nvfp4.WARP_MMA_M["down"] + 1, 4096, 4096, True) is None
    assert c("gate_up", 32, 28672, 4096, True) is None  # 32 tokens in half-tile CTAs: the wgmma tile
    assert c("down", 1, 4096, 4096, False) is None and c("down", 1, 4096, 576, True) is None
    # half-tile CTAs where whole-tile ones would take more than one wave of two an SM
    assert c("gate_up", 1, 28672, 4096, True).warps == 4  # 112 tiles × 4 K shares = 448 > 264
    # where the whole-tile grid takes more than a wave at any width, the share whose half-tile grid
    # fills its last wave best, the widest of equals: 896 CTAs (1.7 waves of 528) against 1792 (3.4);
    # 4096×11008 keeps 8 of 512 (1376 CTAs, 2.6 waves, against 688, 1.3); one wave at 1024: as before
    assert c("gate_up", 1, 28672, 4096, True).k_cta == 1024 and c("gate_up", 1, 22016, 4096, True).k_cta == 512
    assert c("gate_up", 1, 16384, 2048, True).k_cta == 512 and c("down", 1, 8192, 28672, True).k_cta == 1024
    monkeypatch.setattr(dispatch_nvfp4, "WARP_MMA_WIDE", False)
    assert c("gate_up", 1, 28672, 4096, True).k_cta == 512
    monkeypatch.setattr(dispatch_nvfp4, "WARP_MMA_WIDE", True)
    assert c("down", 1, 4096, 14336, True).warps == 8  # 16 × 16 = 256
    assert c("down", 1, 4096, 14336, True, sms=100).warps == 4
    # 32 tokens (four token tiles) in whole-tile CTAs, 16 warps an SM, where H or I ≤ 2048 (D62)
    assert [c("down", m, 2048, 8192, True).n8 for m in (16, 17, 32)] == [2, 4, 4]
    assert [c("down", m, 2048, 8192, True).ctas_per_sm for m in (16, 32)] == [0, 2]  # 16 warps an SM
    assert c("gate_up", 32, 16384, 2048, True) in shipped and c("gate_up", 32, 4096, 8192, True) in shipped
    assert c("down", 24, 8192, 2048, True) is not None and c("down", 24, 4096, 14336, True) is None
    assert c("gate_up", 17, 7168, 8192, True) is None and c("down", 17, 8192, 3584, True) is None
    assert c("down", 16, 4096, 14336, True) is not None  # (up to 16 tokens at any width)
    assert not [cfg for cfg in shipped if cfg.n8 == 4 and cfg.warps == 4]
    monkeypatch.setattr(dispatch_nvfp4, "WARP_MMA_M", {"gate_up": 16, "down": 16})
    assert c("down", 17, 4096, 14336, True) is None and all(cfg.n8 < 4 for cfg in dispatch_nvfp4.warp_mma_shipped())


@pytest.mark.parametrize("hidden,inter,late", [
    # down's grid within half of 132 SMs and gate_up's filling one CTA an SM (128 CTAs) or two (256):
    # 2048×8192 (down 64 CTAs, gate_up 256), 1024×8192 (32, 128), 2048×4096 (64, 128) ...
    (2048, 8192, True), (1024, 8192, True), (2048, 4096, True),
    # ... not where gate_up leaves SMs free: 1536×4096 (48, 96), 2048×6144 (48, 192), 1024×3072 (24, 48)
    (1536, 4096, False), (2048, 6144, False), (1024, 3072, False),
    # ... nor above half the SMs: 3072×8192 (96), 8192×3584 (224), 4096×14336 (256)
    (3072, 8192, False), (8192, 3584, False), (4096, 14336, False),
])
def test_warp_mma_gate_up_triggers_late_before_a_small_down(hidden, inter, late, monkeypatch):
    """DISPATCH D58: nvfp4 gate_up's warp-MMA kernel launches down only as its CTAs leave where down's
    warp-MMA grid is at most WARP_MMA_LATE_TRIGGER_SHARE of the SMs and gate_up's fills its SMs (at 32
    tokens only two CTAs an SM); down never; not without PDL or with the share 0; every such config
    shipped."""
    pytest.importorskip("cutlass")
    c = dispatch_nvfp4.warp_mma_config
    shipped = dispatch_nvfp4.warp_mma_shipped()
    for m in (1, 8, 16):
        gu, dn = c("gate_up", m, 2 * inter, hidden, True), c("down", m, hidden, inter, True)
        assert gu.late_trigger == late and not dn.late_trigger and gu in shipped
    assert c("gate_up", 32, 16384, 2048, True).late_trigger and not c("gate_up", 32, 16384, 1024, True).late_trigger
    monkeypatch.setattr(dispatch_nvfp4, "WARP_MMA_LATE_TRIGGER_SHARE", 0)
    assert not c("gate_up", 1, 16384, 2048, True).late_trigger
    monkeypatch.setattr(dispatch_nvfp4, "WARP_MMA_LATE_TRIGGER_SHARE", 0.5)
    monkeypatch.setattr(dispatch_nvfp4, "WARP_MMA_PDL", False)
    assert not c("gate_up", 1, 16384, 2048, True).late_trigger


def test_warp_mma_config_cache_follows_the_constants(monkeypatch):
    """warp_mma_config's answers are cached (eager decode's host time) on the arguments and every
    constant they read: each cached answer is the one computed afresh, and a changed constant (as
    launch_ab and the tests change them) gives the changed answer, also for a key seen before."""
    pytest.importorskip("cutlass")
    c = dispatch_nvfp4.warp_mma_config
    fresh = dispatch_nvfp4._warp_mma_config.__wrapped__
    cases = [(op, m, n, k) for op in ("gate_up", "down") for m in (1, 9, 16, 24, 32)
             for n, k in ((28672, 4096), (4096, 14336), (7168, 8192), (8192, 3584))]
    for op, m, n, k in cases:
        for _ in range(2):  # (the second from the cache)
            assert c(op, m, n, k, True) == fresh(op, m, n, k, True, "silu", False, 132, dispatch_nvfp4._warp_mma_constants())
    # the loads' depth and the register cap at 8-16 tokens are per op (launch_ab moves one kernel alone)
    monkeypatch.setattr(dispatch_nvfp4, "WARP_MMA_DEPTH", {"gate_up": 4, "down": 2})
    monkeypatch.setattr(dispatch_nvfp4, "WARP_MMA_SMALL_WARPS_PER_SM", {"gate_up": 20, "down": 0})
    gu, dn = c("gate_up", 16, 16384, 3072, True), c("down", 16, 3072, 8192, True)
    assert (gu.warps, gu.depth, gu.ctas_per_sm, dn.warps, dn.depth, dn.ctas_per_sm) == (4, 4, 5, 8, 2, 0)
    monkeypatch.undo()
    assert c("down", 1, 4096, 14336, True).pdl
    monkeypatch.setattr(dispatch_nvfp4, "WARP_MMA_PDL", False)
    assert not c("down", 1, 4096, 14336, True).pdl
    before = c("down", 1, 4096, 4096, True)
    monkeypatch.setattr(dispatch_nvfp4, "WARP_MMA_K_CTA", [1024, 512])  # (a list, as launch_ab's --set may give)
    assert before.k_cta == 512 and c("down", 1, 4096, 4096, True).k_cta == 1024


# ---------------------------------------------------------------- sm_90a compile check
def _shipped():
    cutlass = pytest.importorskip("cutlass")  # noqa: F841
    from swiglu_fused.kernels.sm90 import (act_mul, decode_mlp, down, gate_up, k_order, nvfp4_dequant, qk_norm_rope,
                                           quant_x, split, warp_mma)

    return (
        [("quant_x", c, quant_x.compile_quant_x) for c in quant_x.shipped_configs()]
        + [("k_order", c, k_order.compile_k_order) for c in k_order.shipped_configs()]
        + [("act_mul", c, act_mul.compile_act_mul) for c in act_mul.shipped_configs()]
        + [("qk_norm_rope", c, qk_norm_rope.compile_qk_norm_rope) for c in qk_norm_rope.shipped_configs()]
        + [("nvfp4_dequant", c, nvfp4_dequant.compile_dequant) for c in nvfp4_dequant.shipped_configs()]
        + [("gate_up", c, gate_up.compile_gate_up) for c in dispatch.gate_up_shipped()]
        + [("down", c, down.compile_down) for c in dispatch.down_shipped()]
        + [("gate_up_split", c, split.compile_split) for c in dispatch.split_shipped()]
        + [("nvfp4_warp_mma", c, warp_mma.compile_warp_mma) for c in dispatch_nvfp4.warp_mma_shipped()]
        # the fp8 decode MLP in one launch (measured, not dispatched: history/mlp.md)
        + [("decode_mlp", pair, decode_mlp.compile_pair) for pair in decode_mlp.shipped_configs()]
        # the warp-MMA kernels without programmatic dependent launch (dispatch_nvfp4.WARP_MMA_PDL: measured)
        + [("nvfp4_warp_mma", warp_mma.WarpMmaConfig(op, n8=2, pdl=False), warp_mma.compile_warp_mma)
           for op in ("gate_up", "down")]
        # down's CTAs one an SM by a shared-memory floor (history/nvfp4.md v34: measured, not dispatched)
        + [("nvfp4_warp_mma", warp_mma.WarpMmaConfig("down", n8=1, k_cta=1024, pdl=True, smem_floor_kb=120),
            warp_mma.compile_warp_mma)]
        # ... and down launching the next kernel only as its CTAs leave (late_trigger: measured slower, v35;
        # gate_up's is shipped, D58)
        + [("nvfp4_warp_mma", warp_mma.WarpMmaConfig("down", n8=1, pdl=True, late_trigger=True),
            warp_mma.compile_warp_mma)]
        # the warp-MMA kernels' 32 tokens (dispatch_nvfp4.WARP_MMA_M), uncapped and capped
        + [("nvfp4_warp_mma", warp_mma.WarpMmaConfig(op, warps=w, n8=4, ctas_per_sm=c), warp_mma.compile_warp_mma)
           for op in ("gate_up", "down") for w in (4, 8) for c in (0, 16 // w)]
        # the split GEMM with its pair tiles 128 rows off the 256-row grid (P = 128 mod 256)
        + [("gate_up_split", split.SplitConfig(tile_m=tm, mainloop=ml, h_format="bf16", prefix=384),
            split.compile_split) for tm in (64, 128) for ml in ("fp8_block128", "bf16")]
        # programmatic dependent launch (TileConfig.pdl) where it is not dispatched: nvfp4 (its weight's
        # L2 prefetch before the wait) and the dequantized prefill (none: its weight is the previous kernel's)
        + [("gate_up", gate_up.GateUpConfig(tile_m=16, stages=6, mainloop="nvfp4", swap_ab=True, tile_major=True,
                                            decode_buffers=1, h_format="bf16", pdl=True), gate_up.compile_gate_up),
           ("down", down.DownConfig(**dispatch._nvfp4_prefill_tile(2048), pdl=True), down.compile_down)]
        # the register count fixed at entry (TileConfig.ctas_per_sm; to be measured): nvfp4 down with PDL
        + [("down", down.DownConfig(tile_m=16, stages=6, mainloop="nvfp4", swap_ab=True, tile_major=True,
                                    decode_buffers=1, pdl=True, ctas_per_sm=1), down.compile_down)]
        # the stream-K fix-up's partials summed 4 at a time (TileConfig.fixup_unroll: level on the shipped
        # tiles, kept for decode_mlp), on the swap-AB decode tiles and down's 64-row tile
        + [("gate_up", gate_up.GateUpConfig(tile_m=16, stages=5, swap_ab=True, fixup_unroll=4), gate_up.compile_gate_up),
           ("down", down.DownConfig(tile_m=16, stages=5, swap_ab=True, fixup_unroll=4), down.compile_down),
           ("down", down.DownConfig(tile_m=64, stages=5, fixup_unroll=4), down.compile_down)]
        # measured, not dispatched: the wgmma operands sliced by a warp-uniform index (TileConfig.uniform_ab)
        # on the bf16 and nvfp4 mainloops (D35)
        + [("gate_up", gate_up.GateUpConfig(uniform_ab=True, **f), gate_up.compile_gate_up) for f in (
            dict(tile_m=128, stages=4, mainloop="bf16", h_format="bf16"),
            dict(tile_m=128, stages=4, swap_ab=True, mainloop="nvfp4", tile_major=True, h_format="bf16"))]
        # nvfp4's A fragments decoded into registers on k-ordered activations (TileConfig.rs_decode):
        # measured, not dispatched (history/nvfp4.md v28)
        + [("gate_up", gate_up.GateUpConfig(tile_m=128, stages=4, swap_ab=True, mainloop="nvfp4", tile_major=True,
                                            decode_buffers=1, rs_decode=True, h_rs_order=True, h_format="bf16"),
            gate_up.compile_gate_up),
           ("down", down.DownConfig(tile_m=128, stages=5, swap_ab=True, mainloop="nvfp4", tile_major=True,
                                    decode_buffers=1, rs_decode=True, residual=True), down.compile_down)]
        # nvfp4's 80-112-token tiles (register-sourced decode): compiled for the next measurement, not
        # dispatched (history/nvfp4.md v40)
        + [("gate_up", gate_up.GateUpConfig(tile_m=t, stages=4, swap_ab=True, mainloop="nvfp4", tile_major=True,
                                            decode_buffers=1, rs_decode=True, h_rs_order=True, h_format="bf16"),
            gate_up.compile_gate_up) for t in (80, 96, 112)]
        + [("down", down.DownConfig(tile_m=t, stages=5, swap_ab=True, mainloop="nvfp4", tile_major=True,
                                    decode_buffers=1, rs_decode=True), down.compile_down) for t in (80, 96, 112)]
        # h by TMA stores (TileConfig.tma_store) and the 64-row tile's K pairs: measured, not dispatched
        + [("gate_up", gate_up.GateUpConfig(tile_m=128, stages=4, tma_store=True, h_format=f), gate_up.compile_gate_up)
           for f in ("fp8_group128", "bf16")]
        + [("gate_up", gate_up.GateUpConfig(tile_m=64, stages=3, cluster_k=2), gate_up.compile_gate_up)]
        # the swap-AB tile's K in four parts over a cluster of 4: measured level with pairs, not dispatched
        + [("gate_up", gate_up.GateUpConfig(tile_m=16, stages=5, swap_ab=True, cluster_k=4, mainloop=ml),
            gate_up.compile_gate_up) for ml in ("fp8_block128", "bf16")]
        # down's fp8 weight in the tile-major order (fp8_layout): measured, not dispatched (gate_up's
        # tile-major configs are shipped, D38)
        + [("down", down.DownConfig(tile_major=True, **f), down.compile_down) for f in (
            dict(tile_m=16, stages=5, swap_ab=True, cluster_k=4),
            dict(tile_m=128, stages=4, y_slab_cols=64, smem_scales=True, static_stages=True, uniform_ab=True))]

    )


def test_warp_mma_refuses_a_config_that_does_not_fit_the_operands():
    """A forced WarpMmaConfig (a harness A/B) whose k_cta does not divide K would sum part of K:
    the launcher refuses it before any GPU work."""
    pytest.importorskip("cutlass")
    from swiglu_fused.kernels.sm90 import warp_mma

    w, s = torch.zeros(512, 1792, dtype=torch.uint8), torch.zeros(512, 224, dtype=torch.uint8)
    gs = torch.ones(1)
    for cfg, m, k in [(warp_mma.WarpMmaConfig("down", k_cta=1024), 1, 3584),
                      (warp_mma.WarpMmaConfig("down", k_cta=512, split_k=False), 1, 3584),
                      (warp_mma.WarpMmaConfig("down", k_cta=512, n8=1), 9, 3584)]:
        h = torch.zeros(m, k, dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="does not fit"):
            warp_mma.down(cfg, h, w[:, : k // 2], s[:, : k // 16], gs)


def test_every_shipped_sm90_config_compiles():
    """Every configuration the dispatch can pick compiles for sm_90a (ptxas included)."""
    for family, cfg, compile_fn in _shipped():
        fn = compile_fn(cfg)
        assert fn is not None, (family, cfg)


def test_a_new_h_format_is_one_entry(monkeypatch):
    """An h output format is one activations_and_h.HFormat (width, dtype, pack, optional scale rule): a
    made-up format (e4m3 with a scale of 2^ceil(log2(amax/448)), a power of two) compiles into the
    128-row, 64-row and swap-AB epilogues for sm_90a with no other change."""
    from cutlass import Float32
    import cutlass.cute as cute

    from swiglu_fused.kernels.sm90 import activations_and_h, gate_up

    def pow2_scale(amax):
        return cute.math.exp2(cute.math.ceil(cute.math.log2(amax * Float32(1.0 / 448.0) + Float32(1e-30))))

    ah = activations_and_h
    pow2 = ah.HFormat("fp8_pow2_group128", 8, ah.h_spec("fp8_group128").dtype, "float8_e4m3fn",
                      ah.e4m3_pair, pow2_scale)
    monkeypatch.setattr(ah, "_FORMATS", ah._FORMATS + (pow2,))
    monkeypatch.setattr(activations_and_h, "H_FORMATS", activations_and_h.H_FORMATS + (pow2.name,))
    for fields in (dict(tile_m=128, stages=4), dict(tile_m=64, stages=5), dict(tile_m=16, stages=6, swap_ab=True)):
        cfg = gate_up.GateUpConfig(h_format=pow2.name, **fields)
        assert cfg.out_bytes == 1 and gate_up.compile_gate_up(cfg) is not None, cfg
    with pytest.raises(ValueError, match="h_format: unknown h format 'int4'"):
        activations_and_h.h_spec("int4")


def test_eager_calls_skip_the_dispatcher_only_when_safe():
    """Plain eager calls run the op's implementation directly (the dispatcher's host cost matters
    at decode); compile, fake tensors and autograd inputs go through the registered op."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(3, 256, dtype=torch.bfloat16)
    assert ops.runs_directly(x, None)
    assert not ops.runs_directly(x.requires_grad_(True))
    x = x.detach()
    with FakeTensorMode() as mode:
        assert not ops.runs_directly(mode.from_tensor(x))
    xq, xs = ops.quant_x(x)
    xq2, xs2 = torch.ops.swiglu_fused.quant_x(x)
    assert torch.equal(xq.view(torch.uint8), xq2.view(torch.uint8)) and torch.equal(xs, xs2)


@pytest.mark.parametrize("fmt", ["fp8_block128", "bf16", "nvfp4"])
def test_layer_traces_whole_under_torch_compile(fmt):
    """fullgraph=True: nothing on the forward path (eager-call checks included) breaks the graph;
    the eager backend keeps this a tracing test, cheap enough for CI."""
    from swiglu_fused import FusedSwiGLUMLP

    g = torch.Generator().manual_seed(0)
    w = [torch.randn(*s, generator=g) / s[1] ** 0.5 for s in ((256, 128), (256, 128), (128, 256))]
    mlp = FusedSwiGLUMLP.from_linear(*w, weight_format=fmt)
    x = torch.randn(2, 3, 128, generator=g).to(torch.bfloat16)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(mlp, fullgraph=True, backend="eager")(x), mlp(x))


def test_quant_x_map_follows_the_measured_rule():
    """One (row, k-group) pair of 8 columns per thread at decode sizes; 16 columns per thread from
    2^15 pairs, in 128-thread CTAs from 2^17 (measured faster on each side, benchmarks/history/quant_x.md);
    where K % 16 != 0, 8 columns with one round up to 2^17 pairs, four above. All shipped."""
    pytest.importorskip("cutlass")
    from swiglu_fused.kernels.sm90 import quant_x

    def pick(m, k):
        c = quant_x.select_config(m, k)
        return c.rounds, c.threads, c.vec

    assert pick(16, 4096) == pick(256, 8192) == (1, 256, 8)
    assert pick(1024, 4096) == pick(1024, 8192) == (1, 256, 16)
    assert pick(4096, 4096) == pick(16384, 4096) == (1, 128, 16)
    assert pick(2048, 4104) == (1, 256, 8) and pick(8192, 4104) == (4, 256, 8)
    assert {pick(m, k) for m, k in [(16, 4096), (1024, 4096), (4096, 4096), (8192, 4104)]} == {
        (c.rounds, c.threads, c.vec) for c in quant_x.shipped_configs()}
    with pytest.raises(ValueError, match="QuantXConfig.rounds"):
        quant_x.QuantXConfig(rounds=3)
    with pytest.raises(ValueError, match="QuantXConfig.vec"):
        quant_x.QuantXConfig(vec=4)
    with pytest.raises(ValueError, match="QuantXConfig.threads"):
        quant_x.QuantXConfig(threads=96)
