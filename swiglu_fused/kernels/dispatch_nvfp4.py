"""Kernel selection for nvfp4 (W4A16): which tile or kernel runs an nvfp4 gate_up or down of M rows,
and every such config CI compile-checks (nvfp4_shipped, warp_mma_shipped).
dispatch.py asks this module for its nvfp4 case (gate_up_config, down_config, the backends) and keeps
what is not the W4A16 tiles' own: the operands' checks, the dequantized prefill (the bf16 mainloop's
tiles) and h's order between the two GEMMs. This module imports nothing of dispatch.py.

Rules chosen by measurement cite a row of docs/DISPATCH.md ("D24"); the constants are module globals
so that launch_ab (``--set dispatch_nvfp4.NAME=...``) and the tests can change them.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from .. import formats
from ..quant import cdiv

NVFP4_MAINLOOP = formats.NVFP4.name  # (= dispatch's, tile_config's)
# The swap-AB tiles of 16, 32, 48 and 64 tokens up to 64 rows (each M tile decodes the whole weight
# again, so the fewest M tiles: DISPATCH D24; the 32- and 48-token ones: the same sums as the 64-token
# tile's, bit for bit, in a half or three quarters of its MMA, the MLP 10-15 % and 8-9 % faster, D62,
# D63), the 80-, 96-, 112- and 128-token ones above (D31: the 128-token tile 6-14 % faster than the 128-row
# tile it replaced, whose wgmma reads more smem a k tile; the smaller ones the same sums in less MMA,
# the MLP 6-22 % faster at 65-112 rows, D64), and past 128 rows the 144- and 160-token ones too (D64,
# below); whole tiles or stream-K, no clusters. The 16-48-token tiles decode into one buffer (D30), as
# do down's 80-160-token ones (D31); the others two (where the register-sourced decode runs, one
# register set: NVFP4_RS_TOKENS; the 144- and 160-token tiles run only so). Down's 32-64-token tiles
# sum their stream-K partials four at a time (a fourth field: TileConfig.fixup_unroll; 8 and more CTAs
# share a tile there): the MLP 1-2 % faster, 6-7 % at 2048×8192 (D63).
# The 224-256-token tiles are 128 weight rows tall (TileConfig.nvfp4_half_rows: one 64-row block a
# consumer warpgroup, so that the accumulator holds 256 tokens), decoding each weight row for twice the
# tokens of a 256-row tile: down's where nvfp4_tiling picks them (27 of 40 points at M = 256-1408, five
# widths) the MLP 1.4-10 % faster, level at one (D67); gate_up's (64 gate rows and their up rows a CTA,
# TileConfig.half_row_pairs) 2-13 % more where it picks them (D68)
NVFP4_HALF_ROWS_TOKENS = (224, 240, 256)
NVFP4_SWAP_TILES = {  # (tokens, stages, decode buffers[, fixup_unroll])
    "gate_up": ((16, 6, 1), (32, 6, 1), (48, 6, 1), (64, 6, 2), (80, 4, 2), (96, 4, 2), (112, 4, 2), (128, 4, 2),
                (144, 4, 2), (160, 4, 2), (224, 4, 1), (240, 4, 1), (256, 4, 1)),
    "down": ((16, 6, 1), (32, 6, 1, 4), (48, 6, 1, 4), (64, 6, 2, 4), (80, 5, 1), (96, 5, 1), (112, 5, 1), (128, 5, 1),
             (144, 5, 1), (160, 5, 1), (224, 4, 1), (240, 4, 1), (256, 4, 1)),
}
# down at 97-128 rows (one M tile of 112 or 128 tokens): the 224-token 128-row tile where the model predicts it
# at most NVFP4_HALF_ROWS_DOWN_GAIN of the one tile's time (narrow H: e.g. 2048×8192, whose 8 tiles of 256 rows
# split K 16 ways; D69). 0.8 with the fix-up as FIXUP_US; 1.0 (no margin) since D71's refit of it
NVFP4_HALF_ROWS_DOWN_MIN_M = 97
NVFP4_HALF_ROWS_DOWN_GAIN = 1.0
# down's register-sourced tiles of these token counts run on 128 weight rows (TileConfig.nvfp4_half_rows) as
# dispatched otherwise: twice the weight tiles split K half as many ways, one 64-row block a warpgroup. The MLP
# 2-20 % faster at 33-128 rows at seven widths (8192×3584 M = 64 44.1 → 42.3 µs, 4096×14336 61.9 → 58.7,
# 1024×8192 32.1 → 26.6), the 32-token tile 2-5 % slower at 4096×14336 and wider; one M tile only (to
# NVFP4_EVEN_MAX rows: several M tiles not measured; D73, history/nvfp4.md v56)
NVFP4_HALF_ROWS_DOWN_RS = (48, 64, 80, 96, 112, 128)
# the ops whose 128-row tiles nvfp4_tiling weighs (launch_ab compares others: "dispatch_nvfp4.NVFP4_HALF_ROWS=('down',)")
NVFP4_HALF_ROWS = ("gate_up", "down")
# Up to NVFP4_EVEN_MAX rows one M tile, the smallest that holds them. Above, M tiles of equal size, each
# the smallest tile that holds its share: on a GPU as many as nvfp4_tiling picks, between the fewest the
# largest tile needs and the fewest NVFP4_EVEN_MAX-token tiles (or gate_up's 192-token tile), by
# schedule.nvfp4_swap_us (D64: M = 144 at 4096×14336 one 144-token tile, at 2048×8192, whose 64 weight
# tiles leave half the SMs idle, two of 80); without the SMs (a CPU tensor's config) the fewest
# NVFP4_EVEN_MAX-token tiles. NVFP4_TILE_MODEL False: those on the GPU too (what launch_ab compares)
NVFP4_EVEN_MAX = 128
NVFP4_TILE_MODEL = True
NVFP4_ROW_TILE = (128, 4)  # the split projection's W4A16 tile (D25), and the dequantized prefill's
# gate_up's 192-token swap-AB tile (whole tiles; 3 stages, two decode buffers; D32), where nvfp4_tiling
# predicts it fastest (D64)
NVFP4_WIDE_TILE = (192, 3, 2)
NVFP4_DEQUANT_M = 1409  # from this M the weight is dequantized to bf16 for the call, then the bf16 mainloop (D26, D49)
# The swap-AB tiles that decode a tile-major weight straight into their wgmma's A registers
# (TileConfig.rs_decode, one register set), their activations in nvfp4_layout.rs_k_order: 2-25 %
# faster alone than decoding into smem at 64 and 128 tokens, slower at 192 (D45; history/nvfp4.md
# v28; the 32- and 48-token tiles since D62, D63, the 80-160-token ones D64). gate_up then orders x by
# a copy a call and writes h in that order where down reads it so (GateUpConfig.h_rs_order; the ops'
# h_order="auto", which pipeline.mlp passes: h_in_rs_order).
NVFP4_RS_TOKENS = (32, 48, 64, 80, 96, 112, 128, 144, 160, *NVFP4_HALF_ROWS_TOKENS)
NVFP4_RS = True  # False: every tile decodes into smem (what launch_ab compares)
# The rs_decode tiles launched with min_blocks_per_mp = 1 (TileConfig.ctas_per_sm), so that ptxas keeps
# their setmaxnreg (producer 40 registers, consumers 232) instead of running every warp at 168: the MLP
# 1.5-12 % faster at 33-96 rows; the 32- and 112-160-token tiles level or slower with it (D65)
NVFP4_FULL_REGS_TOKENS = (48, 64, 80, 96)
# The rs_decode tiles that load the next k tile's packed words while this one's chain runs
# (TileConfig.rs_prefetch): the MLP 1.5-4 % faster at M = 96-128 and 2-8 % at 1024, level at 64, but the
# 48-token tile 1.5-6 % slower (D66)
NVFP4_PREFETCH_TOKENS = (64, 80, 96, 112, 128, 144, 160, *NVFP4_HALF_ROWS_TOKENS)
# gate_up's rs_decode tiles of these token counts take x in its natural order by TMA and permute each stage
# into that k order in shared memory (TileConfig.x_permute: producer warps 1-3), instead of a copy of x a
# call in front of them: the MLP 1-4.5 % faster at 17-48 rows; on larger tiles the permute's shared-memory
# traffic beside the wgmma's reads of x costs more than the copy (DISPATCH D72; history/nvfp4.md v53)
NVFP4_X_PERMUTE_TOKENS: tuple[int, ...] = (32, 48)
# and the 64-token tile where gate_up has at most this many 256-row weight tiles (I ≤ 8192): 1.2-4 % faster at
# 49-64 rows there, 0-3 % slower at I ≥ 13824 (a rule read off ten widths, D72; 0: never)
NVFP4_X_PERMUTE_64_MAX_TILES = 64


def nvfp4_dequantizes(m: int) -> bool:
    """Whether an nvfp4 GEMM of M rows runs as dequantize + the bf16 mainloop (TileConfig.dequantized):
    at prefill the W4A16 mainloop is bound by its decode, repeated for every M tile (D26)."""
    return m >= NVFP4_DEQUANT_M


def nvfp4_tile_for(m: int, op: str = "gate_up", tile_major: bool = False,
                   shape: tuple[int, int, int] | None = None) -> dict:
    """The tile fields (tile_m, stages, swap_ab, decode_buffers, rs_decode) of the nvfp4 mainloop for
    M rows of ``op`` (gate_up or down); ``tile_major``: the weight's order (rs_decode reads only that
    one); ``shape``: (N, K, SMs) of a call on a GPU, whose M tiles
    past NVFP4_EVEN_MAX rows nvfp4_tiling picks (D64) where the register-sourced decode runs (the
    144- and 160-token tiles decode into registers only: two smem buffers leave no room for 4 stages)."""
    if shape and NVFP4_TILE_MODEL and m > NVFP4_EVEN_MAX and NVFP4_RS and tile_major:
        return _x_permute(op, _nvfp4_rs(_nvfp4_tile(nvfp4_tiling(op, m, *shape)), tile_major), shape)
    tile = _nvfp4_share_tile(op, cdiv(m, cdiv(m, NVFP4_EVEN_MAX)))
    if shape and NVFP4_TILE_MODEL and NVFP4_RS and tile_major and op == "down" and m >= NVFP4_HALF_ROWS_DOWN_MIN_M:
        tile = _nvfp4_narrow_down_tile(tile, m, *shape)
    return _x_permute(op, _nvfp4_rs(_nvfp4_tile(tile), tile_major), shape)


def _x_permute(op: str, fields: dict, shape: tuple | None) -> dict:
    """A tile's fields with x_permute where NVFP4_X_PERMUTE_TOKENS or NVFP4_X_PERMUTE_64_MAX_TILES takes it:
    gate_up's rs_decode tiles (``shape``: nvfp4_tile_for's)."""
    tokens = fields["tile_m"]
    few_tiles = tokens == 64 and shape is not None and shape[0] // fields["tile_n"] <= NVFP4_X_PERMUTE_64_MAX_TILES
    on = op == "gate_up" and fields.get("rs_decode") and (tokens in NVFP4_X_PERMUTE_TOKENS or few_tiles)
    return {**fields, "x_permute": True} if on else fields


def x_permute_tokens() -> tuple[int, ...]:
    """The rs_decode tiles' token counts that _x_permute can give x_permute (what nvfp4_shipped compiles)."""
    return NVFP4_X_PERMUTE_TOKENS + ((64,) if NVFP4_X_PERMUTE_64_MAX_TILES else ())


def _nvfp4_narrow_down_tile(tile: tuple, m: int, n: int, k: int, sms: int) -> tuple:
    """Down's tile at NVFP4_HALF_ROWS_DOWN_MIN_M-128 rows: ``tile`` (one M tile), or the 224-token 128-row
    one where schedule.nvfp4_swap_us predicts it at most NVFP4_HALF_ROWS_DOWN_GAIN of ``tile``'s time:
    where H is narrow, its twice as many CTAs split K fewer ways (D69)."""
    from .sm90 import schedule as sch

    constants = (NVFP4_HALF_ROWS_DOWN_GAIN, tuple(NVFP4_SWAP_TILES["down"]), NVFP4_RS_TOKENS, NVFP4_FULL_REGS_TOKENS,
                 NVFP4_PREFETCH_TOKENS, sch.NVFP4_HALF_ROWS_BASE, sch.NVFP4_TILE_BASE, sch.NVFP4_ITER_US,
                 sch.NVFP4_FIXUP_US, sch.NVFP4_HYBRID_MIN_GAIN, sch.NVFP4_HYBRID_TOKENS, sch.FIXUP_US,
                 _split_fixup_constants())
    return _nvfp4_narrow_down(tile, m, n, k, sms, constants)


@functools.lru_cache(maxsize=4096)  # (~35 µs uncached: a call's dispatch in eager mode)
def _nvfp4_narrow_down(tile, m, n, k, sms, constants):
    """_nvfp4_narrow_down_tile, computed (``constants``: the cache key's part that launch_ab and the tests change)."""
    from .sm90.schedule import nvfp4_swap_us
    from .sm90.tile_config import DownConfig

    half = _nvfp4_share_tile("down", NVFP4_HALF_ROWS_TOKENS[0], half_rows=True)

    def us(t):
        cfg = DownConfig(mainloop=NVFP4_MAINLOOP, tile_major=True, **_nvfp4_rs(_nvfp4_tile(t), True))
        return nvfp4_swap_us(with_fixup_groups(cfg, m, n, k, sms), m, n, k, sms)

    return half if us(half) <= NVFP4_HALF_ROWS_DOWN_GAIN * us(tile) else tile


# down's stream-K fix-up in two levels (TileConfig.fixup_groups) where schedule.split_fixup_us predicts it faster
# (DISPATCH D70): g + ceil(n / g) + 1 partials' reads for a second arrival, not n. 1-34 % faster where it fires,
# no measured point slower (history/nvfp4.md v50). Only down: gate_up's N is 2I, so where served widths split its
# tiles it is 4-8 ways. False: never (what launch_ab compares)
FIXUP_GROUPS = True


def with_fixup_groups(config, m: int, n: int, k: int, sms: int):
    """``config`` (a W4A16 swap-AB tile of an nvfp4 op of M rows, N weight rows, K columns on ``sms``
    SMs) with fixup_groups where its schedule splits every tile over K and fixup_groups_gain_us predicts
    a gain (down only)."""
    return _with_fixup_groups(config, m, n, k, sms, _split_fixup_constants())


def _split_fixup_constants() -> tuple:
    """What with_fixup_groups and schedule.nvfp4_swap_us read of the fix-up's model (for the callers' cache keys)."""
    from .sm90 import schedule as sch

    return (FIXUP_GROUPS, sch.NVFP4_SPLIT_FIXUP, sch.NVFP4_SPLIT_ARRIVAL_US, sch.FIXUP_PARTIAL_BYTES_PER_US,
            sch.FIXUP_ARRIVAL_US, sch.NVFP4_PARTIAL_STORE_BYTES_PER_US, sch.NVFP4_SPLIT_FIXUP_EPILOGUES)


@functools.lru_cache(maxsize=4096)  # (eager decode asks it every call)
def _with_fixup_groups(config, m, n, k, sms, constants):
    """with_fixup_groups, computed (``constants``: the module's, in the cache key)."""
    from .sm90.schedule import schedule

    if not FIXUP_GROUPS or config.epilogue != "linear" or config.whole_tiles or config.cluster_k > 1:
        return config
    ctas, sk_tiles = schedule(config, m, n, k, sms)
    tiles = cdiv(m, config.tile_m) * cdiv(n, config.tile_n)
    if sk_tiles == tiles and ctas > tiles and fixup_groups_gain_us(ctas // tiles, 4 * config.tile_m * config.tile_n) > 0:
        return dataclasses.replace(config, fixup_groups=True)  # (plan()'s split: ctas = tiles · split)
    return config


def with_half_rows_down(config, m: int):
    """``config`` (a dispatched W4A16 down tile of M rows) on 128 weight rows where NVFP4_HALF_ROWS_DOWN_RS takes
    it: one M tile (to NVFP4_EVEN_MAX rows; several M tiles not measured)."""
    return _on_half_rows_down(config) if m <= NVFP4_EVEN_MAX else config


def _on_half_rows_down(config):
    """``config`` on 128 weight rows if it is a register-sourced tile of NVFP4_HALF_ROWS_DOWN_RS tokens on 256."""
    if config.rs_decode and config.tile_m in NVFP4_HALF_ROWS_DOWN_RS and not config.nvfp4_half_rows:
        return dataclasses.replace(config, tile_n=formats.FP8_BLOCK)  # (tile_config.HALF_N)
    return config


def fixup_groups_gain_us(split: int, partial_bytes: int) -> float:
    """The predicted µs fixup_groups takes off a tile's fix-up over ``split`` CTAs (partials of ``partial_bytes``)."""
    from .sm90.schedule import split_fixup_us

    return split_fixup_us(split, partial_bytes, False) - split_fixup_us(split, partial_bytes, True)


def _nvfp4_share_tile(op: str, share: int, half_rows: bool = False) -> tuple:
    """The smallest of op's NVFP4_SWAP_TILES that holds ``share`` tokens (the largest past them all),
    of the 256-row tiles unless ``half_rows`` (the 128-row ones too)."""
    tiles = [t for t in NVFP4_SWAP_TILES[op] if half_rows or t[0] not in NVFP4_HALF_ROWS_TOKENS]
    return next((t for t in tiles if share <= t[0]), tiles[-1])


def nvfp4_tiling(op: str, m: int, n: int, k: int, sms: int) -> tuple:
    """The NVFP4_SWAP_TILES entry (or for gate_up NVFP4_WIDE_TILE) that an nvfp4 ``op`` of M rows past
    NVFP4_EVEN_MAX, N weight rows and K columns runs on ``sms`` SMs: of the equal M tilings between the
    fewest the largest tile needs and the fewest NVFP4_EVEN_MAX-token tiles, and gate_up's 192-token
    tile, the one schedule.nvfp4_swap_us predicts fastest (the smaller tile where two tie)."""
    from .sm90 import schedule as sch

    constants = (tuple(NVFP4_SWAP_TILES[op]), NVFP4_WIDE_TILE, NVFP4_EVEN_MAX, NVFP4_RS, NVFP4_RS_TOKENS,
                 NVFP4_FULL_REGS_TOKENS, NVFP4_PREFETCH_TOKENS, NVFP4_HALF_ROWS, sch.NVFP4_HALF_ROWS_BASE,
                 sch.NVFP4_HALF_ROWS_GATE_UP_BASE,
                 sch.NVFP4_TILE_BASE, sch.NVFP4_SMEM_DECODE_COST, sch.NVFP4_ITER_US, sch.NVFP4_FIXUP_US,
                 sch.NVFP4_HYBRID_MIN_GAIN, sch.NVFP4_HYBRID_TOKENS, sch.FIXUP_US, _split_fixup_constants())
    return _nvfp4_tiling(op, m, n, k, sms, constants)


@functools.lru_cache(maxsize=16384)  # (~1 ms uncached: each op's M from 129 to 1408 at a few widths)
def _nvfp4_tiling(op, m, n, k, sms, constants):
    """nvfp4_tiling, computed (``constants``: what it reads of the modules' constants, the cache key's
    last part, so that launch_ab's and the tests' changes take effect)."""
    from .sm90.schedule import nvfp4_swap_us
    from .sm90.tile_config import DownConfig, GateUpConfig

    half_rows = op in NVFP4_HALF_ROWS
    fewest = cdiv(m, _nvfp4_share_tile(op, m, half_rows)[0])
    tiles = {_nvfp4_share_tile(op, cdiv(m, c), half_rows) for c in range(fewest, cdiv(m, NVFP4_EVEN_MAX) + 1)}
    if op == "gate_up":
        tiles.add(NVFP4_WIDE_TILE)
    cls, kw = (GateUpConfig, {"h_format": formats.NVFP4.h_format}) if op == "gate_up" else (DownConfig, {})

    def us(tile):
        cfg = cls(mainloop=NVFP4_MAINLOOP, tile_major=True, **_nvfp4_rs(_nvfp4_tile(tile), True), **kw)
        return nvfp4_swap_us(with_fixup_groups(cfg, m, n, k, sms), m, n, k, sms)  # (down's as dispatched)

    return min(sorted(tiles), key=us)


def _nvfp4_rs(fields: dict, tile_major: bool, on: bool | None = None) -> dict:
    """A swap-AB tile's fields with rs_decode where D45 takes it (NVFP4_RS_TOKENS, a tile-major weight;
    ``on``: NVFP4_RS unless given)."""
    if (NVFP4_RS if on is None else on) and tile_major and fields["tile_m"] in NVFP4_RS_TOKENS:
        regs = {"ctas_per_sm": 1} if fields["tile_m"] in NVFP4_FULL_REGS_TOKENS else {}
        prefetch = {"rs_prefetch": True} if fields["tile_m"] in NVFP4_PREFETCH_TOKENS else {}
        return {**fields, "rs_decode": True, "decode_buffers": 1, **regs, **prefetch}
    return fields


# nvfp4 at decode sizes on warp-level mma.sync (kernels/sm90/warp_mma.py, D33): a tile-major weight
# (the modules' order on the GPU), M ≤ WARP_MMA_M[op], K a multiple of its 128-column step. 0: the
# swap-AB wgmma tiles above run these M too (launch_ab --set "dispatch_nvfp4.WARP_MMA_M={...}" compares). Above
# 16 tokens (four token tiles a warp) only in whole-tile CTAs: in half tiles the 64-token wgmma tile
# was faster there (4096×14336's gate_up at M = 32: 49.0 against 43.5 µs; history/nvfp4.md v22; where
# that tile leaves a second wave nearly empty, its hybrid split (D61) is faster still than half tiles, D60).
WARP_MMA_M = {"gate_up": 32, "down": 32}
# ... and above 16 tokens only where the MLP's hidden or intermediate size is at most this (gate_up:
# K or N / 2; down: N or K): elsewhere the 32-token wgmma tile, whose stream-K then has enough weight
# tiles and k tiles, is 2-22 % faster (3072×8192 12 %, 4096×14336 and 8192×7168 21 %, 8192×3584
# 6-12 %); at H or I ≤ 2048 the warp-MMA kernel is 3-45 % faster (1024×8192, 2048×4096, 4096×2048,
# 8192×2048; DISPATCH D62). One miss measured: 3072×2560 (the warp-MMA kernel 14-18 % faster). 0: no bound
WARP_MMA_32_MAX_SIDE = 2048
# columns a CTA: the first of these that divides K into at most WARP_MMA_SPLITS CTAs a tile (512: the
# probe's best; 1024 where K is long: the tile's last CTA then sums fewer partials; history/nvfp4.md
# v21); where none does, the one whose whole-tile grid is the largest that fits in WARP_MMA_CTAS_PER_SM
# an SM (the SMs' loads most even: 4096×14336's down in 16 shares of 896, 256 CTAs, 2 % faster than 14
# of 1024, 224; v23), else the one of fewest CTAs
WARP_MMA_K_CTA = (512, 1024, 896, 256, 128)
WARP_MMA_SPLITS = 8
# but where even the widest share's whole-tile grid takes more than one wave, the share of at most
# WARP_MMA_SPLITS whose half-tile grid fills its last wave best, the widest of equals (fewer CTAs and
# partials): 4096×14336's gate_up in 4 shares of 1024 (896 CTAs, 1.7 waves of 528) is 1-3 % faster than
# 8 of 512 (3.4 waves); 4096×11008's keeps 8 of 512 (2.6 waves), its 4 of 1024 (1.3) 2-4 % slower
# (history/nvfp4.md v25). False: the rule above alone (what launch_ab compares)
WARP_MMA_WIDE = True
WARP_MMA_DEPTH = {"gate_up": 2, "down": 2}  # 128-column blocks of loads ahead (WarpMmaConfig.depth), by op
# warps a CTA (WarpMmaConfig.warps): 8 (a whole 256-row tile) where the grid of such CTAs fits in one
# wave of WARP_MMA_CTAS_PER_SM an SM (their ~100 registers a thread), else 4 (half a tile: the last
# wave finer). 0: by that rule; 4 or 8: always (history/nvfp4.md v22)
WARP_MMA_WARPS = 0
WARP_MMA_CTAS_PER_SM = 2
# 32 tokens (n8 = 4) take 146 registers a thread uncapped (one 8-warp CTA an SM); capped to keep
# this many warps an SM, as the 8- and 16-token configs have (128 registers, a few bytes spilled)
WARP_MMA_WARPS_PER_SM = 16
# the same for 8 and 16 tokens, by op (0: no cap, what ptxas picks). Loads four blocks ahead (depth 4)
# take 3072×8192's 4-warp gate_up from 96 to 112 registers, five CTAs an SM to four; 20 keeps five (v32)
WARP_MMA_SMALL_WARPS_PER_SM = {"gate_up": 0, "down": 0}
# programmatic dependent launch of the warp-MMA kernels (WarpMmaConfig.pdl): down's launch and first
# weight loads under gate_up's K-share sums. Off while one-value global-scale ops ran between the
# two (2-3 % slower at M = 16); since they are gone (v23) 2-7 % faster at M ≤ 32, except 4096×14336
# at 32 tokens, where gate_up is the wgmma tile (0-1.3 % slower; history/nvfp4.md v23)
WARP_MMA_PDL = True
# ... where down's warp-MMA grid is at most this share of the SMs and gate_up's grid fills at least
# WARP_MMA_LATE_TRIGGER_FILL of one or two CTAs an SM (at 32 tokens: of two), gate_up triggers down's
# launch as its CTAs leave, after its K-share sums and epilogue (WarpMmaConfig.late_trigger), not after
# its k loop. Launched early into such a full grid, down's CTAs shared SMs (2048×8192 M = 1: down 14.4
# against 9.0 µs without PDL); late, they find gate_up's SMs free: 3-22 % faster at 2048×8192,
# 1024×8192 and 2048×4096. Where gate_up leaves slots free (grids of 48-192) late was 1-10 % slower.
# 0: never (history/nvfp4.md v34, v35; DISPATCH D58)
WARP_MMA_LATE_TRIGGER_SHARE = 0.5
WARP_MMA_LATE_TRIGGER_FILL = 0.9


def warp_mma_config(op: str, m: int, n: int, k: int, tile_major: bool, act: str = "silu", residual: bool = False,
                    sms: int = 132):
    """The WarpMmaConfig of an nvfp4 ``op`` (gate_up or down) of M rows, N weight rows and K columns
    on a GPU of ``sms`` SMs, or None where the warp-MMA kernel does not take it (the swap-AB wgmma
    tiles do)."""
    # Eager decode asks this up to four times a call of the MLP (each op's backend, and each op's
    # h order: h_in_rs_order), ~6 µs each uncached. The cache's key holds every constant the answer
    # reads, so that launch_ab's and the tests' changes to them still take effect.
    return _warp_mma_config(op, m, n, k, tile_major, act, residual, sms, _warp_mma_constants())


def _warp_mma_constants() -> tuple:
    """The module constants warp_mma_config's answer depends on (its cache key's last part)."""
    return (tuple(WARP_MMA_M.items()), WARP_MMA_32_MAX_SIDE, tuple(WARP_MMA_K_CTA), WARP_MMA_SPLITS, WARP_MMA_WIDE,
            tuple(WARP_MMA_DEPTH.items()), WARP_MMA_WARPS, WARP_MMA_CTAS_PER_SM, WARP_MMA_WARPS_PER_SM,
            tuple(WARP_MMA_SMALL_WARPS_PER_SM.items()), WARP_MMA_PDL, WARP_MMA_LATE_TRIGGER_SHARE,
            WARP_MMA_LATE_TRIGGER_FILL)


@functools.lru_cache(maxsize=4096)
def _warp_mma_config(op, m, n, k, tile_major, act, residual, sms, constants):
    """warp_mma_config, computed (``constants``: _warp_mma_constants() at the call, read below as the
    module's)."""
    from .sm90 import warp_mma

    if not (tile_major and 0 < m <= min(WARP_MMA_M[op], warp_mma.MAX_TOKENS) and n % warp_mma.ROWS == 0
            and k % warp_mma.BLOCK_K == 0):
        return None
    hidden, inter = (k, n // 2) if op == "gate_up" else (n, k)
    if m > 16 and WARP_MMA_32_MAX_SIDE and min(hidden, inter) > WARP_MMA_32_MAX_SIDE:
        return None
    def one_wave(c):  # the whole-tile CTAs of shares of c columns fit in one wave
        return n // warp_mma.ROWS * (k // c) <= WARP_MMA_CTAS_PER_SM * sms

    fits = [c for c in WARP_MMA_K_CTA if k % c == 0]
    few = [c for c in fits if k // c <= WARP_MMA_SPLITS]  # (at most WARP_MMA_SPLITS shares a tile)
    if WARP_MMA_WIDE and not one_wave(max(fits)):
        k_cta = max(few, default=max(fits),
                    key=lambda c: (_last_wave_fill(2 * n // warp_mma.ROWS * (k // c), 2 * WARP_MMA_CTAS_PER_SM * sms), c))
    elif few:
        k_cta = few[0]
    else:
        k_cta = min(filter(one_wave, fits), default=max(fits))
    warps = WARP_MMA_WARPS or (8 if one_wave(k_cta) else 4)
    n8 = next(n8 for n8 in (1, 2, 4) if m <= 8 * n8)
    if not _warp_mma_takes(warps, n8):
        return None
    cfg = warp_mma.WarpMmaConfig(op, warps=warps, n8=n8, k_cta=k_cta, split_k=k > k_cta, depth=WARP_MMA_DEPTH[op],
                                 act=act if op == "gate_up" else "silu", residual=residual, pdl=WARP_MMA_PDL,
                                 ctas_per_sm=_warp_mma_cap(op, warps, n8))
    late = op == "gate_up" and warps == 8 and WARP_MMA_PDL
    if late and _late_trigger_applies(cfg, m, n, k, tile_major, sms, constants):
        cfg = dataclasses.replace(cfg, late_trigger=True)
    return cfg


def _late_trigger_applies(gate_up, m, n, k, tile_major, sms, constants) -> bool:
    """Whether ``gate_up`` (8 warps, N = 2I, K = H) launches down only as its CTAs leave (D58): down
    runs the warp-MMA kernel on a grid of at most WARP_MMA_LATE_TRIGGER_SHARE of the SMs, and gate_up's
    grid fills WARP_MMA_LATE_TRIGGER_FILL of one CTA an SM (not at 32 tokens) or of two."""
    down = _warp_mma_config("down", m, k, n // 2, tile_major, "silu", False, sms, constants)
    if down is None or math.prod(down.grid(k, n // 2)) > WARP_MMA_LATE_TRIGGER_SHARE * sms:
        return False
    grid = math.prod(gate_up.grid(n, k))
    per_sm = 1 if grid <= sms and gate_up.n8 <= 2 else 2
    return WARP_MMA_LATE_TRIGGER_FILL * per_sm * sms <= grid <= per_sm * sms


def _last_wave_fill(ctas: int, slots: int) -> float:
    """The grid's waves over the whole waves it takes (1: its last wave full)."""
    return ctas / (-(-ctas // slots) * slots)


def _warp_mma_takes(warps: int, n8: int) -> bool:
    """32 tokens only in whole-tile CTAs (WARP_MMA_M's comment), unless WARP_MMA_WARPS forces the
    CTA size (a measurement, a test)."""
    return bool(WARP_MMA_WARPS) or warps == 8 or n8 < 4


def _warp_mma_cap(op: str, warps: int, n8: int) -> int:
    """WarpMmaConfig.ctas_per_sm: WARP_MMA_WARPS_PER_SM for 32 tokens, else the op's WARP_MMA_SMALL_WARPS_PER_SM."""
    return (WARP_MMA_WARPS_PER_SM if n8 == 4 else WARP_MMA_SMALL_WARPS_PER_SM[op]) // warps


def warp_mma_shipped() -> list:
    """Every WarpMmaConfig warp_mma_config can return (what CI compile-checks)."""
    from .sm90 import activations_and_h, warp_mma

    most = min(max(WARP_MMA_M.values()), warp_mma.MAX_TOKENS)
    n8s = [n8 for n8 in (1, 2, 4) if 4 * n8 < most]  # M ≤ 8, ≤ 16, ≤ 32
    shapes = [(w, n8, k_cta, split) for w in ((WARP_MMA_WARPS,) if WARP_MMA_WARPS else (4, 8)) for n8 in n8s
              for k_cta in WARP_MMA_K_CTA for split in (False, True) if _warp_mma_takes(w, n8)]
    # (late_trigger only in whole-tile CTAs, where the rule takes it: the grids it was measured at)
    lates = (False, True) if WARP_MMA_PDL and WARP_MMA_LATE_TRIGGER_SHARE else (False,)
    return ([warp_mma.WarpMmaConfig("gate_up", warps=w, n8=n8, k_cta=c, split_k=s, act=act, pdl=WARP_MMA_PDL,
                                    depth=WARP_MMA_DEPTH["gate_up"], ctas_per_sm=_warp_mma_cap("gate_up", w, n8),
                                    late_trigger=late)
             for act in activations_and_h.ACTIVATIONS for w, n8, c, s in shapes for late in lates
             if not late or w == 8]
            + [warp_mma.WarpMmaConfig("down", warps=w, n8=n8, k_cta=c, split_k=s, residual=r, pdl=WARP_MMA_PDL,
                                      depth=WARP_MMA_DEPTH["down"], ctas_per_sm=_warp_mma_cap("down", w, n8))
               for r in (False, True) for w, n8, c, s in shapes])


def _nvfp4_tile(tile: tuple[int, ...]) -> dict:
    """The config fields of a (tokens, stages, decode buffers[, fixup_unroll]) swap-AB tile (every W4A16
    tile is one; of NVFP4_HALF_ROWS_TOKENS tokens, 128 weight rows tall)."""
    tokens, stages, buffers, *unroll = tile
    fixup = {"fixup_unroll": unroll[0]} if unroll else {}
    rows = (1 if tokens in NVFP4_HALF_ROWS_TOKENS else 2) * formats.FP8_BLOCK  # (tile_config.HALF_N)
    return dict(tile_m=tokens, tile_n=rows, stages=stages, swap_ab=True, decode_buffers=buffers, **fixup)


def call_shape(device: torch.device, n: int, k: int) -> tuple[int, int, int] | None:
    """nvfp4_tile_for's ``shape`` for a call on ``device`` (None on the CPU: no SMs to count)."""
    from .sm90.schedule import planned_sms

    sms = planned_sms(device)
    return (n, k, sms) if sms else None


def nvfp4_shipped(config_cls, variants) -> list:
    """The W4A16 configs of config_cls for each of ``variants`` (keyword dicts), in both weight orders
    (nvfp4_layout); the dequantized prefill's are dispatch.py's (_nvfp4_prefill_shipped)."""
    clusters = config_cls.epilogue == "gated"  # (gate_up: the wide tile, and h in the k order)
    tiles = NVFP4_SWAP_TILES["gate_up"] + (NVFP4_WIDE_TILE,) if clusters else NVFP4_SWAP_TILES["down"]  # (wide: D32)
    # (the 144- and 160-token tiles decode into registers only: nvfp4_tile_for)
    smem = [tile for tile in tiles if tile[0] <= NVFP4_EVEN_MAX or tile == NVFP4_WIDE_TILE]
    w4a16 = [config_cls(mainloop=NVFP4_MAINLOOP, tile_major=major, **_nvfp4_tile(tile), **v)
             for v in variants for tile in smem for major in (False, True)]
    # D45's register-sourced tiles, and gate_up's tiles writing h in their k order
    rs = [config_cls(mainloop=NVFP4_MAINLOOP, tile_major=True, **_nvfp4_rs(_nvfp4_tile(tile), True, on=True), **v)
          for v in variants for tile in tiles if tile[0] in NVFP4_RS_TOKENS]
    wide = [c for c in w4a16 if c.tile_major and c.tile_m == NVFP4_WIDE_TILE[0]]
    h_rs = [dataclasses.replace(c, h_rs_order=True) for c in rs + wide] if clusters else []
    # gate_up's rs_decode tiles permuting x themselves (_x_permute), h in either order
    permute = [dataclasses.replace(c, x_permute=True) for c in rs + h_rs
               if c.rs_decode and c.tile_m in x_permute_tokens()] if clusters else []
    # with_fixup_groups': down's tiles that stream-K splits
    groups = [dataclasses.replace(c, fixup_groups=True) for c in w4a16 + rs if not clusters and not c.whole_tiles]
    # with_half_rows_down's
    half = [h for c in rs + groups if not clusters and (h := _on_half_rows_down(c)) != c]
    return w4a16 + rs + h_rs + permute + groups + half
