"""What the GPU tests take for granted about the dispatch, in a form a CPU can check.

Many GPU tests are about one tile or one plan (a split over K, the hybrid past a wave, a fix-up in two
levels) and reach it through the dispatch at chosen (M, H, I): which config that is depends on the
dispatch's rules and the GPU's 132 SMs. Each such premise is a function here, registered with the
cases its GPU test runs: the GPU test takes its configs from it (for the GPU's own SMs), and
tests/test_gpu_premises.py checks every case on the CPU for 132 SMs. So a rule change that moves a
GPU test off what it is about fails CI, not the next GPU run. The configs are planned from meta
tensors (shapes and dtypes only) as on a GPU (schedule.planned_sms); tests/gpu checks that this gives
what the dispatch picks for the GPU's own tensors.
"""

from __future__ import annotations

import contextlib
import dataclasses
from unittest import mock

import torch

from swiglu_fused.kernels import dispatch, dispatch_nvfp4
from swiglu_fused.kernels.sm90 import schedule

SMS = 132  # the H100 SXM's and the H200's, the GPUs the rules were measured on
PREMISES: list = []
E4M3 = torch.float8_e4m3fn


def premise(names: str, cases: list):
    """Registers the decorated function as the premise of a GPU test parametrized by (names, cases)."""
    def register(fn):
        fn.names, fn.cases = names, cases
        PREMISES.append(fn)
        return fn
    return register


@contextlib.contextmanager
def planned_on(sms: int):
    """The dispatch plans meta tensors as on a GPU of ``sms`` SMs."""
    with mock.patch.object(schedule, "sm_count", lambda device: sms), \
            mock.patch.object(schedule, "planned_sms", lambda device: sms):
        yield


def _meta(*shape, dtype=torch.bfloat16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def gate_up_config(mainloop: str, m: int, hidden: int, inter: int, *, act: str = "silu", h_format: str | None = None,
                   sms: int = SMS):
    """The config dispatch gives gate_up of M rows, H → 2I, in ``mainloop``'s format (nvfp4: on the
    tile-major weight the modules hold; h bf16, fp8's h fp8 unless told) on a GPU of ``sms`` SMs."""
    if mainloop == "nvfp4":
        args = _meta(m, hidden), _meta(2 * inter, hidden // 2, dtype=torch.uint8), _meta(2 * inter, hidden // 16, dtype=E4M3), None
        kw = dict(h_format="bf16", tile_major=True)
    elif mainloop == "fp8_block128":
        args = (_meta(m, hidden, dtype=E4M3), _meta(2 * inter, hidden, dtype=E4M3),
                _meta(2 * inter // 128, hidden // 128, dtype=torch.float32), _meta(m, hidden // 128, dtype=torch.float32))
        kw = dict(h_format=h_format or "fp8_group128")
    else:
        args = _meta(m, hidden), _meta(2 * inter, hidden), None, None
        kw = dict(h_format=h_format or "bf16")
    with planned_on(sms):
        return dispatch.gate_up_config(*args, act=act, **kw)


def nvfp4_down_config(m: int, hidden: int, inter: int, *, residual: bool = True, sms: int = SMS):
    """The config dispatch gives the nvfp4 down of M rows, I → H, on the tile-major weight (with a
    residual unless told) on a GPU of ``sms`` SMs."""
    res = _meta(m, hidden) if residual else None
    with planned_on(sms):
        return dispatch.down_config(_meta(m, inter), _meta(hidden, inter // 2, dtype=torch.uint8),
                                    _meta(hidden, inter // 16, dtype=E4M3), None, res, torch.bfloat16, True)


# --- nvfp4 (tests/gpu/test_nvfp4_gpu.py) ---------------------------------------------------------------

@premise("m", [300, 512, 1000])
def nvfp4_128_token_tiles(m, sms=SMS):
    """nvfp4_tile_for's tile without D64's model (three of 112 tokens at M = 300, else 128) at 4096×14336,
    down split over K at three and four M tiles, not at eight. Returns (gate_up, down) configs."""
    tokens = 112 if m == 300 else 128
    cfg = dataclasses.replace(gate_up_config("nvfp4", m, 4096, 14336, sms=sms),
                              **dispatch_nvfp4.nvfp4_tile_for(m, tile_major=True))
    dcfg = dataclasses.replace(nvfp4_down_config(m, 4096, 14336, sms=sms),
                               **dispatch_nvfp4.nvfp4_tile_for(m, "down", tile_major=True))
    assert cfg.swap_ab and cfg.tile_m == tokens and dcfg.swap_ab and dcfg.tile_m == tokens
    assert (schedule.schedule(dcfg, m, 4096, 14336, sms)[1] > 0) == (m < 1000) or sms != SMS
    return cfg, dcfg


@premise("hidden,inter,m,rs", [(8192, 3584, 1024, True), (8192, 3584, 1000, False), (4096, 14336, 768, True),
                               (4096, 14336, 300, True)])
def nvfp4_hybrid_tiles(hidden, inter, m, rs, sms=SMS):
    """nvfp4_tile_for's tiles (register-sourced decode or not) whose gate_up runs D46's hybrid past a
    partial wave on 132 SMs. Returns (gate_up, down) configs."""
    def tile(op):
        return dispatch_nvfp4._nvfp4_rs(dispatch_nvfp4.nvfp4_tile_for(m, op, tile_major=True), True, rs)
    cfg = dataclasses.replace(gate_up_config("nvfp4", m, hidden, inter, sms=sms), **tile("gate_up"))
    dcfg = dataclasses.replace(nvfp4_down_config(m, hidden, inter, sms=sms), **tile("down"))
    assert schedule.schedule(cfg, m, 2 * inter, hidden, sms)[1] > 0 or sms != SMS
    return cfg, dcfg


@premise("m", [24, 48, 64])
def nvfp4_64_token_tile_past_a_wave(m, sms=SMS):
    """2048×17408 (136 weight tiles) with the warp-MMA kernel kept to 16 rows: the 32-, 48- or 64-token
    tile (D62, D63), in D46's hybrid over 132 SMs. Returns the gate_up config."""
    with mock.patch.object(dispatch_nvfp4, "WARP_MMA_M", {"gate_up": 16, "down": 16}):
        cfg = gate_up_config("nvfp4", m, 2048, 17408, sms=sms)
    assert cfg.swap_ab and cfg.tile_m == (32 if m <= 32 else 48 if m <= 48 else 64)
    assert schedule.schedule(cfg, m, 2 * 17408, 2048, sms) == (132, 136) or sms != SMS
    return cfg


@premise("hidden,inter,m", [(h, i, m) for h, i in [(4096, 14336), (8192, 3584)] for m in (17, 32, 33, 48)])
def nvfp4_32_and_48_token_tiles(hidden, inter, m, sms=SMS):
    """17-32 rows on the 32-token wgmma tile and 33-48 on the 48-token one (D62, D63), not the warp-MMA
    kernel, with the register-sourced decode; down's partials four at a time. Returns (gate_up, down)."""
    tokens = 32 if m <= 32 else 48
    cfg, dcfg = gate_up_config("nvfp4", m, hidden, inter, sms=sms), nvfp4_down_config(m, hidden, inter, sms=sms)
    assert cfg.tile_m == tokens and cfg.rs_decode
    assert dcfg.tile_m == tokens and dcfg.rs_decode and dcfg.fixup_unroll == 4
    assert dispatch_nvfp4.warp_mma_config("gate_up", m, 2 * inter, hidden, True, sms=sms) is None
    assert dispatch_nvfp4.warp_mma_config("down", m, hidden, inter, True, sms=sms) is None
    return cfg, dcfg


@premise("hidden,inter,m", [(8192, 3584, 700), (8192, 3584, 300), (4096, 14336, 450), (5120, 13824, 300)])
def nvfp4_144_and_160_token_tiles_split(hidden, inter, m, sms=SMS):
    """gate_up on the 144- or 160-token tile (D64), some of its tiles split over K; each thread's
    partials its 144 or 160 accumulator values. Returns (gate_up, down) configs."""
    cfg = gate_up_config("nvfp4", m, hidden, inter, sms=sms)
    assert cfg.tile_m in (144, 160) and cfg.acc_values == cfg.tile_m
    assert schedule.schedule(cfg, m, 2 * inter, hidden, sms)[1] > 0
    return cfg, nvfp4_down_config(m, hidden, inter, sms=sms)


@premise("hidden,inter,m", [(2048, 8192, 113), (2048, 8192, 128), (1024, 8192, 112), (4096, 2048, 100),
                            (4096, 14336, 128)])
def nvfp4_narrow_down(hidden, inter, m, sms=SMS):
    """D69: down at 97-128 rows on the 224-token 128-row tile where H is narrow (not at 4096×14336, whose one
    M tile of 128 tokens runs on 128 rows too since D73). Returns the down config."""
    dcfg = nvfp4_down_config(m, hidden, inter, sms=sms)
    assert (dcfg.tile_m == 224) == (hidden != 4096 or inter == 2048) and dcfg.nvfp4_half_rows
    assert dcfg in dispatch.down_shipped()
    return dcfg


@premise("hidden,inter,m,tokens", [(1024, 8192, 177, 96), (2048, 8192, 105, 112), (1024, 8192, 489, 256),
                                   (1536, 8960, 777, 112), (2048, 8192, 753, 224), (8192, 3584, 137, 80)])
def nvfp4_down_tiles_of_the_fixup_model(hidden, inter, m, tokens, sms=SMS):
    """D71: the down tile nvfp4_swap_us's refitted fix-up picks. Returns the down config."""
    dcfg = nvfp4_down_config(m, hidden, inter, sms=sms)
    assert dcfg.tile_m == tokens and dcfg in dispatch.down_shipped()
    return dcfg


@premise("hidden,inter,m,tokens", [(2048, 4096, 297, 112), (2048, 4096, 313, 112), (3072, 8192, 131, 80),
                                   (3072, 8192, 144, 80)])
def nvfp4_gate_up_tiles_of_the_fixup_model(hidden, inter, m, tokens, sms=SMS):
    """D71 for gate_up: three 112-token tiles, not two of 160; two of 80, not one of 144. Returns the
    gate_up config."""
    cfg = gate_up_config("nvfp4", m, hidden, inter, sms=sms)
    assert cfg.tile_m == tokens and cfg in dispatch.gate_up_shipped()
    return cfg


@premise("hidden,inter,m", [(1024, 8192, 48), (1024, 8192, 128), (1024, 8192, 256), (2048, 8192, 64),
                            (3072, 8192, 128), (1536, 8960, 256), (1536, 8960, 64), (2560, 6912, 96)])
def nvfp4_fixup_groups(hidden, inter, m, sms=SMS):
    """D70: down's tiles split over K so many ways that the partials are summed in two levels. Returns
    the down config."""
    dcfg = nvfp4_down_config(m, hidden, inter, sms=sms)
    assert dcfg.fixup_groups and dcfg in dispatch.down_shipped()
    return dcfg


# --- fp8 and bf16 gate_up (tests/gpu/test_gate_up_gpu.py) ---------------------------------------------

@premise("mainloop,h_format", [("bf16", "bf16"), ("fp8_block128", "fp8_group128")])
def hybrid_at_8192x3584(mainloop, h_format, sms=SMS):
    """D48: 8192×3584 at M = 600 takes the 128 × 256 tile in the hybrid split (all 140 tiles stream-K;
    fp8 without the static k loop). Returns the gate_up config."""
    cfg = gate_up_config(mainloop, 600, 8192, 3584, h_format=h_format, sms=sms)
    assert (cfg.tile_m, cfg.tile_n, cfg.static_stages, cfg.cluster_m) == (128, 256, False, 1)
    assert schedule.schedule(cfg, 600, 2 * 3584, 8192, sms) == (132, 140)
    return cfg


@premise("hidden,inter,m,h_format", [(h, i, m, f) for h, i, m in [
    (8192, 2048, 65), (8192, 2048, 128), (16384, 2048, 100), (12288, 2560, 128), (8192, 2048, 200), (12288, 2560, 192),
    (8192, 3584, 96)] for f in ("fp8_group128", "bf16")])
def split_n_stream_k(hidden, inter, m, h_format, sms=SMS):
    """D57: fp8's split_n 64-row tile at narrow widths and 64 < M ≤ 256 in plan()'s stream-K (its fix-up
    compiled in). Returns the gate_up config."""
    cfg = gate_up_config("fp8_block128", m, hidden, inter, h_format=h_format, sms=sms)
    assert (cfg.tile_m, cfg.split_n, cfg.split_n_sk) == (64, True, True)
    ctas, sk_tiles = schedule.schedule(cfg, m, 2 * inter, hidden, sms)
    assert sk_tiles == -(-m // 64) * 2 * inter // 256 and ctas > sk_tiles
    return cfg


@premise("m,h_format", [(m, f) for m in (200, 256) for f in ("fp8_group128", "bf16")])
def row_128_stream_k_on_a_long_k(m, h_format, sms=SMS):
    """D56: fp8 16384×2560 at M = 193-256 on the 128 × 256 tile in stream-K (40 tiles, each split 3 ways),
    not the 64-row tile. Returns the gate_up config."""
    cfg = gate_up_config("fp8_block128", m, 16384, 2560, h_format=h_format, sms=sms)
    assert (cfg.tile_m, cfg.split_n, cfg.swap_ab, cfg.static_stages) == (128, False, False, False)
    ctas, sk_tiles = schedule.schedule(cfg, m, 2 * 2560, 16384, sms)
    assert sk_tiles == 40 and ctas > sk_tiles
    return cfg


@premise("hidden,inter,m,mainloop,h_format", [(h, i, m, ml, f) for h, i, m in [(1536, 8960, 160), (4096, 6144, 272),
                                                                               (8192, 2048, 2080)]
                                             for ml, f in [("fp8_block128", "fp8_group128"), ("bf16", "bf16"),
                                                           ("bf16", "fp8_group128")]])
def row_64_tile_over_several_rounds(hidden, inter, m, mainloop, h_format, sms=SMS):
    """D42, D43: the rounds rule takes the 64-row tile above one wave. Returns the gate_up config."""
    cfg = gate_up_config(mainloop, m, hidden, inter, h_format=h_format, sms=sms)
    assert cfg.tile_m == 64 and not cfg.swap_ab
    return cfg


@premise("hidden,inter,m,mainloop,h_format", [(h, i, m, ml, f) for h, i, m in [(576, 3584, 4100), (2048, 8192, 4097)]
                                             for ml, f in [("fp8_block128", "fp8_group128"), ("fp8_block128", "bf16"),
                                                           ("bf16", "bf16"), ("bf16", "fp8_group128")]])
def cluster_pairs_at_a_ragged_m(hidden, inter, m, mainloop, h_format, sms=SMS):
    """From M = 4096 the 128-row tile in cluster pairs (dispatch.cluster_m_for; bf16 where it keeps that tile,
    dispatch.wg3_applies). Returns the gate_up config."""
    cfg = gate_up_config(mainloop, m, hidden, inter, h_format=h_format, sms=sms)
    assert cfg.cluster_m == 2
    return cfg


@premise("m", [600])
def bf16_on_cublas_at_8192x3584(m, sms=SMS):
    """D53: bf16 gate_up at 8192×3584 just past a wave (M = 600) runs cuBLAS's GEMM on 132 SMs. Returns
    whether the rule fires for ``sms``."""
    fires = dispatch.bf16_gate_up_on_cublas(gate_up_config("bf16", m, 8192, 3584, sms=sms), m, 2 * 3584, 8192, sms)
    assert fires or sms != SMS
    return fires
