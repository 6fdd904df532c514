"""Kernel selection: for each call, which backend runs it and with which kernel configuration.

    backend     quant_x_backend, gate_up_backend, split_backend, down_backend, module_backend:
                "sm90" (the CuTe DSL kernels), "cublas" (down; bf16 gate_up's GEMM before the sm90
                act·mul, D53), "deepgemm" (down only; where a user has it installed) or "reference"
                (kernels/reference.py)
    config      quant_x_map, gate_up_config, down_config: the sm90 kernel's compile-time
                configuration for these operands (None: the kernel does not implement them)
    shipped     gate_up_shipped, split_shipped, down_shipped: every config the rules can return (CI
                compile-checks them; benchmarks/ptx_md5.py fingerprints them)

nvfp4's W4A16 tiles and its warp-MMA kernels at decode sizes are chosen in dispatch_nvfp4.py, which
this module asks for an nvfp4 call once it has checked the operands (and where the call is not a
dequantized prefill, which runs the bf16 mainloop's tiles chosen here).

The sm90 kernels run on a CUDA tensor of an sm_90 device where CuTe DSL imports, for the formats
and operands they implement; everything else runs the reference (down: cuBLAS on CUDA first).
Rules that were chosen by measurement cite a row of docs/DISPATCH.md ("DISPATCH D4"), which holds
the numbers, the device, the date and the benchmark behind them.

This module imports the sm90 package only inside functions, so it loads (and the reference runs)
without CuTe DSL; the sm90 modules import it for their ``select_config`` / ``shipped_configs``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings

import torch

from .. import formats
from ..quant import cdiv
from . import cublas, deepgemm, dispatch_nvfp4

SM90, CUBLAS, DEEPGEMM, REFERENCE = "sm90", "cublas", "deepgemm", "reference"
GROUP = formats.FP8_BLOCK  # fp8 scale group = weight block = half a gate_up tile (tile_config.W_BLOCK, HALF_N, H_GROUP)
FP8_MAINLOOP, BF16_MAINLOOP, NVFP4_MAINLOOP = formats.FP8Block128.name, formats.BF16.name, formats.NVFP4.name  # = tile_config's

# Set SWIGLU_FUSED_DISABLE_KERNELS=1 to force the reference path everywhere (debugging).
DISABLED = os.environ.get("SWIGLU_FUSED_DISABLE_KERNELS", "") not in ("", "0")


# ================================================================ backends
def rows_in_place(t: torch.Tensor, k_multiple: int) -> bool:
    """Whether a kernel that takes a row stride (quant_x) reads the 2-D t's rows where they lie:
    unit column stride, rows at least their length and whole ``k_multiple`` elements apart (16
    bytes). Alignment of the first row is the caller's check (data_ptr)."""
    return (t.dim() == 2 and (t.shape[1] <= 1 or t.stride(1) == 1)
            and (t.shape[0] <= 1 or (t.stride(0) >= t.shape[1] and t.stride(0) % k_multiple == 0)))


@functools.lru_cache(maxsize=None)
def _cutlass_available() -> bool:
    try:
        import cutlass  # noqa: F401
        import cutlass.cute  # noqa: F401
    except Exception:
        return False
    return True


@functools.lru_cache(maxsize=None)
def _is_sm90(index: int) -> bool:
    return torch.cuda.get_device_capability(index) == (9, 0)


def sm90_kernels_usable(device: torch.device) -> bool:
    """True when tensors on ``device`` can run the sm_90a kernels."""
    if DISABLED or device.type != "cuda" or not _cutlass_available():
        return False
    return _is_sm90(device.index if device.index is not None else torch.cuda.current_device())


def rows_16_bytes(op: str, **tensors: torch.Tensor) -> bool:
    """Whether every matrix has 16-byte rows, which the kernels' TMA and vector accesses need. A
    shape without them (H = 1000 in fp8, say: the format allows it) runs on the reference, slowly
    but correctly, and says so once per op and width."""
    for name, t in tensors.items():
        if t.shape[-1] * t.element_size() % 16:
            multiple = 16 // t.element_size()
            _warn_reference_once(op, name, t.shape[-1], multiple, "16-byte rows",
                                 f"; pad {name}'s last dimension with zeros to "
                                 f"{cdiv(t.shape[-1], multiple) * multiple} for the kernel")
            return False
    return True


@functools.lru_cache(maxsize=None)
def _warn_reference_once(op: str, name: str, cols: int, multiple: int, why: str, fix: str = "",
                         stacklevel: int = 5, unit: str = "columns") -> None:
    """Say once per op and width that the reference runs a call the kernel cannot take, and why."""
    warnings.warn(f"{op}: {name} has {cols} {unit}, not a multiple of {multiple} ({why}), so the sm90 kernel "
                  f"cannot run it and the plain-torch reference does, much more slowly{fix}", stacklevel=stacklevel)


def format_has_kernels(weight_format: str, interleave: int) -> bool:
    """Whether the sm90 kernels implement this weight format at this interleave (formats.py says)."""
    return formats.weight_format(weight_format).has_sm90_kernels(interleave)


def module_backend(weight_format: str, interleave: int, device: torch.device) -> str:
    """Where a FusedSwiGLUMLP's forward runs: SM90 (down partly on cuBLAS or DeepGEMM, see down_backend) or
    REFERENCE."""
    return SM90 if format_has_kernels(weight_format, interleave) and sm90_kernels_usable(device) else REFERENCE


def nvfp4_tile_major(weight: torch.Tensor) -> bool:
    """Whether a module keeps this nvfp4 weight [N, K/2] in nvfp4_layout's tile-major order: on a
    device whose sm90 kernels read it, with whole tiles (N % 256, K % 64; D27). Other weights keep
    the packed order, which every backend reads."""
    from . import nvfp4_layout

    return (weight.dtype == torch.uint8 and weight.dim() == 2 and not weight.is_meta
            and nvfp4_layout.fits(weight.shape[0], 2 * weight.shape[1]) and sm90_kernels_usable(weight.device))


# gate_up's fp8 weight held tile-major by the modules (fp8_layout; D38): the whole MLP 1-2.5 %
# faster at M <= 64 in every round, level at prefill (`launch_ab --set dispatch.FP8_TILE_MAJOR=True`,
# H200, 2026-11-29). Down's stays packed: cuBLAS's and DeepGEMM's GEMMs read only that order.
FP8_TILE_MAJOR = True


def fp8_tile_major(weight: torch.Tensor) -> bool:
    """Whether a module keeps gate_up's fp8 weight [2I, H] in fp8_layout's tile-major order: where
    FP8_TILE_MAJOR is on, on a device whose sm90 kernels read it, with whole k tiles."""
    from . import fp8_layout

    return (FP8_TILE_MAJOR and weight.dtype == torch.float8_e4m3fn and weight.dim() == 2 and not weight.is_meta
            and fp8_layout.fits(*weight.shape) and sm90_kernels_usable(weight.device))


def quant_x_backend(x: torch.Tensor) -> str:
    """SM90 for a bf16 x with 16-byte rows on an sm_90 device whose element offsets fit the
    kernel's 32-bit indexing (M · row stride < 2^31), else REFERENCE."""
    if (x.dtype == torch.bfloat16 and sm90_kernels_usable(x.device) and rows_16_bytes("quant_x", x=x)
            and x.shape[0] * x.stride(0) < 2 ** 31):
        return SM90
    return REFERENCE


def gate_up_backend(x, weight, weight_scale, x_scale, global_scale, interleave, act, h_format, tile_major=False):
    """(SM90, GateUpConfig) where the kernel implements these arguments (g = 128, a global scale
    only with an nvfp4 weight, 16-byte rows, gate_up_config not None) and, for bf16, is predicted the
    faster (else (CUBLAS, None): cuBLAS's GEMM + the sm90 act·mul, D53; for nvfp4 at prefill on the
    weight dequantized for the call, D54), else (REFERENCE, None).
    ``tile_major``: the nvfp4 weight's order (nvfp4_layout), which its W4A16 configs compile in; at
    decode sizes a tile-major nvfp4 weight's config is a WarpMmaConfig (dispatch_nvfp4.warp_mma_config, D33)."""
    nvfp4 = weight.dtype == torch.uint8
    if not sm90_kernels_usable(x.device) or (global_scale is not None) != nvfp4 or interleave != GROUP:
        return REFERENCE, None
    try:
        cfg = gate_up_config(x, weight, weight_scale, x_scale, act=act, h_format=h_format, tile_major=tile_major)
    except ImportError:
        return REFERENCE, None
    if cfg is None or not rows_16_bytes("gate_up", x=x, weight=weight):
        return REFERENCE, None
    from .sm90.schedule import sm_count

    sms = sm_count(x.device)
    if ((weight.dtype == torch.bfloat16 or nvfp4 and cfg.dequantized) and cublas.supports_gate_up(x, weight)
            and bf16_gate_up_on_cublas(cfg, x.shape[0], weight.shape[0], x.shape[1], sms)):
        return CUBLAS, None
    if nvfp4:
        warp = dispatch_nvfp4.warp_mma_config("gate_up", x.shape[0], weight.shape[0], x.shape[1], tile_major, act, sms=sms)
        cfg = cfg if warp is None else warp
    return SM90, cfg


def down_backend(h, weight, weight_scale, h_scale, global_scale, residual, out_dtype, tile_major=False):
    """(DEEPGEMM, None) where DeepGEMM is installed and takes these arguments (fp8_block128 from
    deepgemm.MIN_M rows: DISPATCH D28), else (SM90, DownConfig) where the kernel implements them and
    is the faster one (beats_cublas; a WarpMmaConfig for a tile-major nvfp4 weight at decode sizes,
    D33), else (CUBLAS, None) where cuBLAS takes them (CUDA, fp8_block128 / bf16), else (REFERENCE,
    None)."""
    if not DISABLED and deepgemm.supports_down(h, weight, weight_scale, h_scale, global_scale, residual, out_dtype):
        return DEEPGEMM, None
    takes = cublas.supports_down(h, weight, weight_scale, h_scale, global_scale) and not DISABLED
    if sm90_kernels_usable(h.device) and (global_scale is not None) == (weight.dtype == torch.uint8):
        try:
            from .sm90 import schedule

            cfg = down_config(h, weight, weight_scale, h_scale, residual, out_dtype, tile_major)
        except ImportError:
            cfg = None
        if cfg is not None and not (takes and not beats_cublas(cfg, h.shape[0], weight.shape[0], h.shape[1],
                                                               schedule.sm_count(h.device))):
            if weight.dtype == torch.uint8:
                warp = dispatch_nvfp4.warp_mma_config("down", h.shape[0], weight.shape[0], h.shape[1], tile_major,
                                       residual=residual is not None, sms=schedule.sm_count(h.device))
                cfg = cfg if warp is None else warp
            return SM90, cfg
    return (CUBLAS, None) if takes else (REFERENCE, None)


# ================================================================ programmatic dependent launch
PDL_M = 64  # fp8, M ≤ this: quant_x, gate_up and down launch with PDL (TileConfig.pdl, D20)
# ... except gate_up's swap-AB tile over more M tiles than this (e.g. M = 49-64: four 16-token tiles
# a weight tile) where DeepGEMM's down follows (PDL 2-15 % slower at 6 of 8 shapes), or our own down
# at a hidden size of at least PDL_SWAP_OWN_DOWN_HIDDEN (8192: 1-5 % slower; 3.5-8 % faster below
# it) (D39, D41)
PDL_SWAP_M_TILES = 3
PDL_SWAP_OWN_DOWN_HIDDEN = 8192


def pdl_applies(m: int, mainloop: str) -> bool:
    """Whether a GEMM of M rows launches with programmatic dependent launch (DISPATCH D20): the fp8
    mainloop at decode sizes, where its kernels are a few tens of µs and the boundary between two
    of them is a measurable share (1-13 % of the whole MLP); not nvfp4 (measured slower: its first
    stages' weight loads before the wait cost more than the overlap gave), not bf16 (not measured)."""
    return mainloop == FP8_MAINLOOP and m <= PDL_M


def gate_up_pdl(m: int, tile_m: int, swap: bool, mainloop: str, hidden: int, inter: int) -> bool:
    """TileConfig.pdl for gate_up's tile of M rows, ``hidden`` columns and ``inter`` h columns:
    pdl_applies, except where _swap_without_pdl (D39, D41)."""
    return pdl_applies(m, mainloop) and not _swap_without_pdl(m, tile_m, swap, hidden, inter)


def _swap_without_pdl(m: int, tile_m: int, swap: bool, hidden: int | None, inter: int = 0) -> bool:
    """Whether gate_up's swap-AB tile launches without PDL (D39, D41): over more than
    PDL_SWAP_M_TILES M tiles, where DeepGEMM will take down (deepgemm.takes_down: M × ``inter`` h
    into ``hidden`` outputs) or the hidden size is at least PDL_SWAP_OWN_DOWN_HIDDEN; hidden None:
    whether it can for some hidden size."""
    if not (swap and cdiv(m, tile_m) > PDL_SWAP_M_TILES):
        return False
    return hidden is None or hidden >= PDL_SWAP_OWN_DOWN_HIDDEN or deepgemm.takes_down(m, hidden, inter)


# ================================================================ quant_x: the thread ↔ data map
WIDE_GROUPS = 1 << 15  # from this many (row, k-group) pairs: 16 columns per thread (DISPATCH D1)
ONE_ROUND_GROUPS = 1 << 17  # from this many: 128-thread CTAs; with 8 columns, 4 rounds above it (D1)


def quant_x_map(m: int, k: int) -> dict:
    """QuantXConfig's rounds / vec / threads for x [M, K] (DISPATCH D1): one round of 8 columns in
    256-thread CTAs at decode sizes, launched with PDL up to PDL_M rows (D20); 16 columns (K % 16 ==
    0) from WIDE_GROUPS, in 128-thread CTAs from ONE_ROUND_GROUPS; with 8 columns four rounds above
    ONE_ROUND_GROUPS."""
    groups = m * cdiv(k, GROUP)
    if groups >= WIDE_GROUPS and k % 16 == 0:
        return dict(rounds=1, vec=16, threads=128 if groups >= ONE_ROUND_GROUPS else 256)
    return dict(rounds=1 if groups <= ONE_ROUND_GROUPS else 4, vec=8, threads=256, pdl=m <= PDL_M)


# ================================================================ gate_up: the tile
DECODE_M = 64  # M ≤ this uses the 64-row tile (or the swap-AB tile)
# The swap-AB tile (swap_ab.py): (tokens, stages), both mainloops; 32/64-token tiles not shipped (D2, D3)
GATE_UP_SWAP_TILES = ((16, 5),)
SWAP_LONG_K, SWAP_LONG_K_STAGES = 8192, 6  # a CTA streaming K ≥ this (whole tiles): six stages (D4)
GATE_UP_SWAP_M = 32  # M ≤ this: the swap-AB tile (D2)
SWAP_M_ONE_WAVE = 64  # M ≤ this: the swap-AB tile if its tiles fit one wave (D2)
ONE_WAVE_64_M = 256  # M ≤ this: the 64-row tile if its tiles fit one wave, else the 128-row one (D6)
CLUSTER_K_MAX_TILES = 0.25  # × SMs: the swap-AB tile as K halves over cluster pairs up to this (D5)
GRANULE_MIN_GAIN = 0.95  # the granule tile where its rounds are predicted this much shorter (D7)
CLUSTER_M_MIN = 4096  # the 128 × 256 tile in cluster pairs from this M on (D8)
SPLIT_N_STAGES = 4  # the fp8 64-row tile on two warpgroups (split_n, D9) ...
SPLIT_N_DEEP_TILES = 40  # ... with a fifth stage up to this many 256-row weight tiles (D10)
SPLIT64_M = 128  # fp8, 64 < M ≤ this with one wave of 128-row tiles: the split_n 64-row tile (D11)
# ... or where its rounds of waves take at most this share of the 128-row tile's (D42: e.g. I = 18944,
# 148 tiles of 128 rows, 1.12 waves: two rounds, against three of the 64-row tile's half-height ones,
# 0.75; at 3.2 waves, I = 53248, 0.875 was level to 3 % slower)
SPLIT64_ROUNDS = 0.8
# ... and 0.85 where K ≥ SPLIT64_LONG_K (D52): at 0.83 (5 rounds against 3 of twice the height) the 64-row
# tile was 3-10 % faster at all 4 widths with K = 5120-8192 and 0-8 % slower at 3 of 4 with K ≤ 4096 (one
# level): its tiles' fixed cost, paid twice as often, weighs less over a longer K
SPLIT64_ROUNDS_LONG_K = 0.85
SPLIT64_LONG_K = 5120
# bf16's 64-row tile (one consumer warpgroup) by the same rule (D43), at its own share since D50: where
# its rounds were 0.83-0.87 of the dispatched tile's it was 10-29 % faster at all of 10 points (8 widths);
# at 0.89-0.93 3-10 % (D51, 5 points), at 0.95 level, at 0.98-1.0 2-6 % slower
BF16_TILE64_ROUNDS = 0.94
# the rounds rule (this one, and bf16's, D43) up to this M: measured to 3104, every point it takes 1-39 %
# faster; from 4096 the 128-row tile runs in cluster pairs (D8), not measured against (and at 23 served
# widths the rule would fire at no M from 4096 to 16384 anyway)
SPLIT64_ROUNDS_M = CLUSTER_M_MIN - 1
# fp8's 128-row tile in stream-K instead of the 64-row tile those rules pick, where schedule's cost model
# predicts its plan at most this share of the 64-row tiles' round (D56): at 0.56-0.75 (K = 12288-16384,
# I = 1024-3072, M = 96-256) the MLP was 3-25 % faster at all 22 points, at 0.77-0.95 7 % faster to 15 %
# slower (level on the whole), above 1 7-22 % slower
SK128_SHARE = 0.75
# the bf16 mainloop's 192-row tile (D29): its rows a unit of time over the 128-row tile's in whole
# waves (measured 1.03-1.06 at 40-70 waves), and how much shorter its predicted rounds must be
WG3_SPEED = 1.04
WG3_MIN_GAIN = 0.98
WG3_STAGES = 3  # (what fits beside its 192-row output slab)


def _gate_up_swap_tiles(m: int, n: int) -> int:
    """Tiles of the swap-AB tile for M rows and N = 2I weight rows."""
    return cdiv(m, GATE_UP_SWAP_TILES[0][0]) * cdiv(n, 2 * GROUP)


def gate_up_swap_ab(m: int, n: int, sms: int) -> bool:
    """Whether gate_up with M rows and N = 2I weight rows runs the swap-AB tile (DISPATCH D2)."""
    return m <= GATE_UP_SWAP_M or (m <= SWAP_M_ONE_WAVE and _gate_up_swap_tiles(m, n) <= sms)


def gate_up_cluster_k(m: int, n: int, sms: int, mainloop: str) -> bool:
    """Whether gate_up's swap-AB tile runs as K halves over cluster pairs (TileConfig.cluster_k = 2,
    either mainloop; DISPATCH D5)."""
    return _gate_up_swap_tiles(m, n) <= CLUSTER_K_MAX_TILES * sms


def gate_up_tile_for(m: int, n: int, sms: int, mainloop: str, h_format: str = "bf16", *,
                     k: int) -> tuple[int, int, bool]:
    """(tile_m, stages, swap_ab) for M rows, N = 2I weight rows and K columns on ``sms`` SMs: the
    swap-AB tile (D2), else the 64-row tile up to M = 256 where its tiles fit one wave (D6), in fp8's
    split64 range (D11, D42) or bf16's (D43, D50; both weigh the 128-row tile's hybrid split, whose
    fix-up K carries: D48) unless fp8's 128-row tile in stream-K is predicted far shorter (D56), else
    the 128-row tile (gate_up_config may widen it: D29, D7)."""
    if gate_up_swap_ab(m, n, sms):
        return (*GATE_UP_SWAP_TILES[0], True)
    if m <= DECODE_M or (m <= ONE_WAVE_64_M and cdiv(m, 64) * cdiv(n, 2 * GROUP) <= sms) or (
            split64_applies(m, n, sms, mainloop, k=k) or bf16_tile64_applies(m, n, sms, mainloop, h_format, k=k)):
        return (128, 4, False) if sk128_applies(m, n, sms, mainloop, k=k) else (64, 5, False)
    return 128, 4, False


def granule_tile_n(m: int, n: int, sms: int) -> int | None:
    """The granule tile_n for the 128-row bf16 → bf16 h tile of M rows and N = 2I weight rows, or
    None where the 256-row tile's rounds are as short: the width whose ⌈tiles / SMs⌉ rounds of
    tile_n / 2 h columns are shortest (the wider one on a tie), if GRANULE_MIN_GAIN shorter (D7).
    E.g. I = 3584 at M = 1024: 224 tiles of 256 rows on 132 SMs (1.7 waves, two rounds) but 256 of
    224 rows (1.94 waves, two rounds of 7/8 the work). Needs I % (tile_n / 2) == 0."""
    from .sm90.tile_config import TILE_N_GRANULES

    best = None
    for tile_n in sorted(TILE_N_GRANULES, reverse=True):
        cols = tile_n // 2
        cost = granule_rounds(m, n, sms, cols)
        if n // 2 % cols == 0 and cost < GRANULE_MIN_GAIN * granule_rounds(m, n, sms, GROUP):
            if best is None or cost < granule_rounds(m, n, sms, best // 2):
                best = tile_n
    return best


def granule_rounds(m: int, n: int, sms: int, cols: int) -> int:
    """Rounds of whole waves of the 128-row tile over ``cols`` h columns a tile (N = 2I weight rows),
    times its columns: the granule tile's time in units where the 256-row tile's round is 128."""
    return cdiv(cdiv(m, 128) * (n // 2 // cols), sms) * cols


def bf16_row_tile(m: int, n: int, sms: int, h_format: str, *, k: int) -> tuple[int, int]:
    """(tile_m, tile_n) of bf16 gate_up (M × N × K) where its tile is not the 64-row one: the 128-row
    tile where schedule's hybrid split runs it (just past one wave, D48), else the 192-row tile where
    wg3_applies (D29), else the 128-row tile, over granule_tile_n's width with bf16 h (D7)."""
    from .sm90 import activations_and_h
    from .sm90.schedule import hybrid128_rounds
    from .sm90.tile_config import TILE_M_WG3

    if hybrid128_rounds(BF16_MAINLOOP, m, n, k, sms) is not None:
        return 128, 2 * GROUP
    if wg3_applies(m, n, sms):
        return TILE_M_WG3, 2 * GROUP
    granule = None if activations_and_h.h_spec(h_format).scaled else granule_tile_n(m, n, sms)
    return 128, granule or 2 * GROUP


def rounds_time(m: int, n: int, sms: int, tile_m: int, speed: float) -> float:
    """Rounds of whole waves of a GEMM of M rows (tokens) on tiles of ``tile_m`` rows and 256 weight
    rows (N of them) over ``sms`` SMs, times the tile's rows over its ``speed`` (rows a unit of time,
    relative): how wg3_applies compares two tile heights."""
    return cdiv(cdiv(m, tile_m) * cdiv(n, 2 * GROUP), sms) * tile_m / speed


def wg3_applies(m: int, n: int, sms: int) -> bool:
    """Whether a bf16-mainloop GEMM of M rows and N weight rows that would run the 128-row tile runs
    the 192-row one (three consumer warpgroups, TileConfig.tile_m = TILE_M_WG3; D29): where its
    rounds of whole waves, at WG3_SPEED the 128-row tile's rows a unit of time, are predicted
    WG3_MIN_GAIN shorter. E.g. 8192×3584's gate_up at M = 8192: 43 · 28 tiles of 192 rows are 9.1
    waves (10 rounds), 64 · 28 of 128 rows 13.6 (14 rounds): 10 · 192 / 1.04 > 0.98 · 14 · 128, so not there."""
    from .sm90.tile_config import TILE_M_WG3

    return rounds_time(m, n, sms, TILE_M_WG3, WG3_SPEED) < WG3_MIN_GAIN * rounds_time(m, n, sms, 128, 1.0)


def wg3_on(device: torch.device, m: int, n: int) -> bool:
    """wg3_applies with the SMs of ``device`` (a CPU tensor's config keeps the 128-row tile)."""
    from .sm90.schedule import planned_sms

    sms = planned_sms(device)
    return sms is not None and wg3_applies(m, n, sms)


def cluster_m_for(m: int, tile_m: int, tile_n: int) -> int:
    """TileConfig.cluster_m for M rows on this tile: 2 for the 128 × 256 tile from CLUSTER_M_MIN on
    (D8: the two CTAs take M-adjacent tiles and TMA-multicast the shared weight k tiles)."""
    return 2 if m >= CLUSTER_M_MIN and tile_m == 128 and tile_n == 2 * GROUP else 1


def split_n_applies(tile_m: int, swap_ab: bool, mainloop: str) -> bool:
    """TileConfig.split_n for gate_up's tile: the fp8 mainloop's 64-row tile (D9)."""
    return mainloop == FP8_MAINLOOP and tile_m == 64 and not swap_ab


def split_n_deep(n: int) -> bool:
    """Whether N = 2I weight rows have few enough 256-row tiles for the 5-stage split_n tile (D10)."""
    return cdiv(n, 2 * GROUP) <= SPLIT_N_DEEP_TILES


def split_n_pipeline(deep: bool, h_format: str) -> dict:
    """The split_n tile's stages and xacc_parts: 4 stages, or (deep) 5, which fit when the up half's
    accumulator is handed over in parts (2 with fp8 h, 4 with bf16 h's larger staging slab; D10)."""
    from .sm90 import activations_and_h

    if deep:
        return dict(stages=SPLIT_N_STAGES + 1, xacc_parts=2 if activations_and_h.h_spec(h_format).scaled else 4)
    return dict(stages=SPLIT_N_STAGES)


def split64_applies(m: int, n: int, sms: int, mainloop: str, *, k: int) -> bool:
    """Whether fp8 gate_up with M rows, N = 2I weight rows and K columns takes the 64-row tile
    (split_n) where gate_up_tile_for's one-wave rule would pick the 128-row one: at M ≤ SPLIT64_M
    where the 128-row tiles fit one wave (D11), or at M ≤ SPLIT64_ROUNDS_M where the 64-row tiles'
    rounds of waves take at most SPLIT64_ROUNDS of the 128-row tiles' (D42; SPLIT64_ROUNDS_LONG_K from
    K = SPLIT64_LONG_K, D52), which run whole or, just past one wave, in the hybrid split (D48)."""
    from .sm90.schedule import hybrid128_rounds

    if mainloop != FP8_MAINLOOP:
        return False
    one_wave = m <= SPLIT64_M and cdiv(n, 2 * GROUP) <= sms
    hybrid = hybrid128_rounds(FP8_MAINLOOP, m, n, k, sms)
    tile128 = hybrid * 128 if hybrid is not None else rounds_time(m, n, sms, 128, 1.0)
    share = SPLIT64_ROUNDS_LONG_K if k >= SPLIT64_LONG_K else SPLIT64_ROUNDS
    return one_wave or (m <= SPLIT64_ROUNDS_M and rounds_time(m, n, sms, 64, 1.0) <= share * tile128)


def sk128_applies(m: int, n: int, sms: int, mainloop: str, *, k: int) -> bool:
    """Whether fp8 gate_up with DECODE_M < M rows, N = 2I weight rows and K columns takes the 128-row
    tile in stream-K where gate_up_tile_for's other rules take the 64-row one (D56): where schedule's
    cost model predicts the 128-row tile's plan at most SK128_SHARE of the 64-row tile's plan (whole
    tiles, or D57's split where plan() splits it). E.g. 16384×2560 at M = 256: 80 whole tiles of 64
    rows, each over all 128 k tiles on one SM, against 40 tiles of 128 rows split 3 ways: 0.72."""
    from .sm90.schedule import ITER_US, SPLIT_N_MAX_SK_GRID_M, SPLIT_N_SK_MIN_GAIN, plan_us

    if mainloop != FP8_MAINLOOP or m <= DECODE_M:
        return False
    k_tiles, n_tiles = cdiv(k, 128), cdiv(n, 2 * GROUP)
    t64 = plan_us(cdiv(m, 64) * n_tiles, k_tiles, sms, cdiv(m, 64), iter_us=ITER_US[64],  # (whole, or D57's split)
                  max_sk_grid_m=SPLIT_N_MAX_SK_GRID_M, min_gain=SPLIT_N_SK_MIN_GAIN)[1]
    (_, sk_tiles), t128 = plan_us(cdiv(m, 128) * n_tiles, k_tiles, sms, cdiv(m, 128), iter_us=ITER_US[128])
    return sk_tiles > 0 and t128 <= SK128_SHARE * t64


def bf16_tile64_applies(m: int, n: int, sms: int, mainloop: str, h_format: str, *, k: int) -> bool:
    """Whether bf16 gate_up with M rows and N = 2I weight rows takes the 64-row tile (one consumer
    warpgroup) where the one-wave rule would not (D43): at M ≤ SPLIT64_ROUNDS_M where its rounds of
    waves take at most BF16_TILE64_ROUNDS (D50, D51) of those of the tile gate_up_config would run instead, the
    192-row one (wg3_applies), the granule one (granule_tile_n, with bf16 h) or the 128-row one.
    E.g. I = 18944 at M = 160: 444 tiles of 64 rows, 4 rounds (256 rows of time), against 148 of
    192 rows, 2 rounds (369): 0.69."""
    if mainloop != BF16_MAINLOOP or m > SPLIT64_ROUNDS_M:
        return False
    return rounds_time(m, n, sms, 64, 1.0) <= BF16_TILE64_ROUNDS * 128 * bf16_row_tile_rounds(m, n, sms, h_format,
                                                                                               k=k)


def bf16_row_tile_rounds(m: int, n: int, sms: int, h_format: str, *, k: int) -> float:
    """The predicted time of bf16_row_tile's tile for M × N × K, in rounds of whole 128 × 256 tiles:
    the 192-row tile's rounds at WG3_SPEED, the hybrid's (D48), or the granule tile's."""
    from .sm90.schedule import hybrid128_rounds

    tile_m, tile_n = bf16_row_tile(m, n, sms, h_format, k=k)
    if tile_m != 128:
        return rounds_time(m, n, sms, tile_m, WG3_SPEED) / 128
    hybrid = hybrid128_rounds(BF16_MAINLOOP, m, n, k, sms)
    return hybrid if hybrid is not None else granule_rounds(m, n, sms, tile_n // 2) / GROUP


def tile_rounds(config, m: int, n: int, k: int, sms: int) -> float | None:
    """The predicted time of gate_up ``config``'s tiles for M × N × K on ``sms`` SMs, in rounds of whole
    128 × 256 tiles: the 64-row tile's, the 192-row one's at WG3_SPEED, the hybrid split's where it
    runs them (D48), else the 128-row tile's over its h columns (granule_rounds); None for the swap-AB
    tile, whose decode sizes stream the weight."""
    from .sm90.schedule import hybrid128_applies, hybrid128_rounds

    if config.swap_ab:
        return None
    if config.tile_m != 128:
        return rounds_time(m, n, sms, config.tile_m, 1.0 if config.tile_m == 64 else WG3_SPEED) / 128
    if hybrid128_applies(config, m, n, k, sms):
        return hybrid128_rounds(config.mainloop, m, n, k, sms)
    return granule_rounds(m, n, sms, config.tile_n // 2) / GROUP


# bf16 gate_up as cuBLAS's GEMM + sm90/act_mul.py (D53), where that is predicted CUBLAS_GATE_UP_GAIN of
# our tile's time. cuBLAS's persistent kernels pick tiles whose count fills the SMs (e.g. 144 × 128 at
# 8192×3584 M = 640, 168 × 128 at M = 704: torch.profiler, D48), so its GEMM is modelled as the best of
# 128-row tiles CUBLAS_TILE_NS wide (along 2I) in rounds of whole waves, at our tile's rate, and the act·mul
# as its bytes (2I read, I written a row) at ACT_MUL_BYTES_PER_US plus ACT_MUL_US. Where narrower tiles
# fit one wave, cuBLAS takes them too (128 × 64 at 8192×3584 M = 128, 112 × 128 at M = 256; 64 × 64 at
# 8192×2048 M = 128), so CUBLAS_SMALL_TILE_NS count there, but no shorter than the weight's read at
# CUBLAS_HBM_BYTES_PER_US (the H200's copy rate): a small M's tiles wait on HBM, not the tensor cores (D55).
# "kernel": never (what launch_ab compares); "cublas": wherever cuBLAS takes the operands
BF16_GATE_UP = "rounds"
CUBLAS_TILE_NS = tuple(range(128, 257, 16))
CUBLAS_SMALL_TILE_NS = (64, 96, 112)
CUBLAS_HBM_BYTES_PER_US = 4.1e6
CUBLAS_GATE_UP_GAIN = 1.02
ACT_MUL_BYTES_PER_US, ACT_MUL_US = 3.0e6, 2.0


def cublas_gate_up_rounds(m: int, n: int, k: int, sms: int) -> float:
    """cuBLAS's bf16 GEMM (M × N × K) + the act·mul, in rounds of our whole 128 × 256 tiles (a k tile
    of them at schedule.HYBRID_ITER_US)."""
    from .sm90.schedule import HYBRID_ITER_US, mainloop_tile_k

    round_us = cdiv(k, mainloop_tile_k(BF16_MAINLOOP)) * HYBRID_ITER_US[BF16_MAINLOOP]
    weight_read = 2 * n * k / CUBLAS_HBM_BYTES_PER_US / round_us
    waves = [cdiv(cdiv(m, 128) * cdiv(n, tn), sms) * tn / (2 * GROUP) for tn in CUBLAS_TILE_NS]
    one_wave = [max(tn / (2 * GROUP), weight_read) for tn in CUBLAS_SMALL_TILE_NS if cdiv(m, 128) * cdiv(n, tn) <= sms]
    act_us = ACT_MUL_US + 3 * m * n / ACT_MUL_BYTES_PER_US
    return min(waves + one_wave) + act_us / round_us


def bf16_gate_up_on_cublas(config, m: int, n: int, k: int, sms: int) -> bool:
    """Whether gate_up over a bf16 weight (M × N = 2I × K) with bf16 h runs as cuBLAS's GEMM + act_mul
    instead of ``config``, the bf16 config gate_up_config picked (D53; BF16_GATE_UP), or nvfp4's
    dequantized prefill config, its weight dequantized to bf16 for the call (D54)."""
    hf = formats.H_FORMATS.get(config.h_format)
    if BF16_GATE_UP == "kernel" or hf is None or hf.scaled or hf.dtype != torch.bfloat16:
        return False
    if BF16_GATE_UP == "cublas":
        return True
    ours = tile_rounds(config, m, n, k, sms)
    return ours is not None and cublas_gate_up_rounds(m, n, k, sms) < CUBLAS_GATE_UP_GAIN * ours


def gate_up_l2_hint(tile_m: int, swap_ab: bool) -> str:
    """TileConfig.l2_hint for gate_up's tile: the 64-row tile evicts weight k tiles first, so x and
    what the previous kernels wrote stay in L2 (D12)."""
    return "w_first" if tile_m == 64 and not swap_ab else ""


STATIC_STAGES = True  # (D34; launch_ab --set dispatch.STATIC_STAGES=False measures without it)


def uniform_ab_applies(mainloop: str) -> bool:
    """TileConfig.uniform_ab for gate_up's tiles: the fp8 mainloop's (D35: the whole MLP 1 % faster at
    M = 256-4096; the bf16 mainloop's was level, nvfp4's gate_up 8-17 % slower)."""
    return mainloop == FP8_MAINLOOP


def with_static_stages(config, m: int, n: int, k: int, device):
    """``config`` with TileConfig.static_stages where it applies (D34): the fp8 128-row tile with
    smem_scales, K a whole number of rings of stages, and whole tiles (where plan() would split them
    stream-K, or K does not fit, ``config`` as it is)."""
    if not STATIC_STAGES or not config.smem_scales or k % (config.stages * config.tile_k):
        return config
    from .sm90.schedule import planned_sms, schedule

    sms = planned_sms(device) if config.cluster_m == 1 else None
    if sms and schedule(config, m, n, k, sms)[1]:
        return config
    return dataclasses.replace(config, static_stages=True)


def smem_scales_apply(tile_m: int, swap_ab: bool, mainloop: str, h_format: str) -> bool:
    """TileConfig.smem_scales for the fp8 128-row tile with fp8 h (D13; bf16 h leaves no smem for it)."""
    from .sm90 import activations_and_h

    return mainloop == FP8_MAINLOOP and tile_m == 128 and not swap_ab and activations_and_h.h_spec(h_format).scaled


def gate_up_config(x, weight, weight_scale, x_scale, *, act: str, h_format: str, tile_major: bool = False):
    """The GateUpConfig for these operands (on any device), or None when the sm90 kernel does not
    implement them (``tile_major``: gate_up_backend's)."""
    from .sm90 import activations_and_h
    from .sm90.schedule import sm_count
    from .sm90.tile_config import TILE_M_WG3, GateUpConfig

    if act not in activations_and_h.ACTIVATIONS or h_format not in activations_and_h.H_FORMATS:
        return None
    if weight.dtype == torch.uint8:
        return _nvfp4_gate_up_config(x, weight, weight_scale, act, h_format, tile_major)
    if weight.dtype == torch.float8_e4m3fn and x.dtype == torch.float8_e4m3fn:
        if weight_scale is None or x_scale is None or weight_scale.dtype != torch.float32:
            return None
        mainloop = FP8_MAINLOOP
    elif weight.dtype == torch.bfloat16 and x.dtype == torch.bfloat16:
        mainloop = BF16_MAINLOOP
    else:
        return None
    m, n, k = x.shape[0], weight.shape[0], x.shape[1]
    if n % (2 * GROUP):
        return None
    sms = sm_count(x.device)
    tile_m, stages, swap = gate_up_tile_for(m, n, sms, mainloop, h_format, k=k)
    tile_n = 2 * GROUP
    if mainloop == BF16_MAINLOOP and tile_m == 128:
        tile_m, tile_n = bf16_row_tile(m, n, sms, h_format, k=k)
        stages = WG3_STAGES if tile_m == TILE_M_WG3 else stages
    ck = 2 if swap and gate_up_cluster_k(m, n, sms, mainloop) else 1
    if swap and ck == 1 and k >= SWAP_LONG_K:  # (K pairs keep five: D4 measured them at 4096 a CTA only)
        stages = SWAP_LONG_K_STAGES
    split = split_n_applies(tile_m, swap, mainloop)
    pipe = split_n_pipeline(split_n_deep(n), h_format) if split else dict(stages=stages)
    cfg = GateUpConfig(tile_m=tile_m, tile_n=tile_n, act=act, h_format=h_format, mainloop=mainloop, swap_ab=swap,
                       cluster_k=ck, cluster_m=cluster_m_for(m, tile_m, tile_n),
                       smem_scales=smem_scales_apply(tile_m, swap, mainloop, h_format),
                       split_n=split, l2_hint=gate_up_l2_hint(tile_m, swap),
                       pdl=gate_up_pdl(m, tile_m, swap, mainloop, k, n // 2),
                       uniform_ab=uniform_ab_applies(mainloop), tile_major=tile_major, **pipe)
    return with_static_stages(with_split_n_sk(cfg, m, n, k, sms), m, n, k, x.device)


def with_split_n_sk(config, m: int, n: int, k: int, sms: int):
    """``config`` with TileConfig.split_n_sk where it is the split_n tile and plan() splits that
    over K (D57; schedule.SPLIT_N_MAX_SK_GRID_M = 0: never), else as it is (whole tiles: no fix-up
    compiled in)."""
    from .sm90.schedule import schedule

    if not config.split_n:
        return config
    sk = dataclasses.replace(config, split_n_sk=True)
    return sk if schedule(sk, m, n, k, sms)[1] else config


# ---------------------------------------------------------------- nvfp4: operands, the dequantized prefill, h's order
# (which W4A16 tile or warp-MMA kernel runs a call, and what CI compile-checks of them: dispatch_nvfp4.py)
def _nvfp4_prefill_tile(m: int, wg3: bool = False, clusters: bool = True) -> dict:
    """The dequantized config's tile fields: the bf16 mainloop's 128-row tile, cluster pairs as D8
    (gate_up and the split projection; down never runs in cluster pairs), or (``wg3``: wg3_on) its
    192-row tile."""
    if wg3:
        from .sm90.tile_config import TILE_M_WG3

        return dict(tile_m=TILE_M_WG3, stages=WG3_STAGES, mainloop=BF16_MAINLOOP, dequantized=True)
    tile_m, stages = dispatch_nvfp4.NVFP4_ROW_TILE
    return dict(tile_m=tile_m, stages=stages, mainloop=BF16_MAINLOOP, dequantized=True,
                cluster_m=cluster_m_for(m, tile_m, 2 * GROUP) if clusters else 1)


H_ORDERS = ("natural", "rs", "auto")  # the ops' h_order (ops.gate_up, ops.down)


def h_in_rs_order(h_order: str, nvfp4: bool, m: int, hidden: int, inter: int, device: torch.device) -> bool:
    """Whether an op's h is in nvfp4_layout.rs_k_order for this call: always for h_order "rs", never
    for "natural"; for "auto" (the MLP's, pipeline.mlp) where an nvfp4 down of M rows and H × I runs
    an rs_decode tile (nvfp4_down_reads_rs). gate_up and down get the same answer (gate_up_h_in_rs_order,
    down_h_in_rs_order), each inside its op at run time (no M-dependent choice is traced by
    torch.compile), so they agree without being told."""
    if h_order == "auto":
        return nvfp4 and nvfp4_down_reads_rs(m, hidden, inter, device)
    return h_order == "rs"


def gate_up_h_in_rs_order(h_order: str, x: torch.Tensor, weight: torch.Tensor) -> bool:
    """h_in_rs_order for gate_up's h: H = x's columns, I = the weight's rows / 2."""
    return h_in_rs_order(h_order, weight.dtype == torch.uint8, x.shape[0], x.shape[1], weight.shape[0] // 2, x.device)


def down_h_in_rs_order(h_order: str, h: torch.Tensor, weight: torch.Tensor) -> bool:
    """h_in_rs_order for down's h: H = the weight's rows, I = h's columns."""
    return h_in_rs_order(h_order, weight.dtype == torch.uint8, h.shape[0], weight.shape[0], h.shape[1], h.device)


def nvfp4_down_reads_rs(m: int, hidden: int, inter: int, device: torch.device) -> bool:
    """Whether an nvfp4 down of M rows, H × I, on ``device`` runs an rs_decode tile on the tile-major
    weight the modules hold there (down_backend's choice: not the warp-MMA kernels, not the
    dequantized prefill). A down whose weight is in the packed order after all reorders h back: a
    copy, never a wrong result."""
    # (the cheap tests first: at decode sizes, the latency-bound calls, the 16-token tile answers)
    if (dispatch_nvfp4.nvfp4_dequantizes(m)
            or not dispatch_nvfp4.nvfp4_tile_for(m, "down", tile_major=True).get("rs_decode", False)):
        return False
    from . import nvfp4_layout

    if not (nvfp4_layout.fits(hidden, inter) and sm90_kernels_usable(device)):
        return False
    from .sm90.schedule import sm_count

    return dispatch_nvfp4.warp_mma_config("down", m, hidden, inter, True, sms=sm_count(device)) is None


def _nvfp4_k_ok(op: str, name: str, k: int) -> bool:
    """Whether the nvfp4 kernels take K (tile_config.NVFP4_K_ALIGN); else the reference runs, and
    says so once per op and width."""
    from .sm90.tile_config import NVFP4_K_ALIGN

    if k % NVFP4_K_ALIGN:
        _warn_reference_once(op, name, k, NVFP4_K_ALIGN, f"nvfp4: a row's e4m3 scales of a {NVFP4_K_ALIGN}-column "
                             "k tile are one 32-bit word", stacklevel=7)
        return False
    return True


def _nvfp4_gate_up_config(x, weight, weight_scale, act: str, h_format: str, tile_major: bool):
    """gate_up_config's nvfp4 case: bf16 x, e4m3 weight scales, bf16 h, 2I a multiple of 256, K of
    NVFP4_K_ALIGN. The W4A16 tiles compile the weight's order in (tile_major); the dequantized
    prefill's GEMM reads bf16, and its dequantization is told the order at the call."""
    from .sm90.tile_config import GateUpConfig

    if (x.dtype != torch.bfloat16 or weight_scale is None or weight_scale.dtype != torch.float8_e4m3fn
            or h_format != formats.NVFP4.h_format or weight.shape[0] % (2 * GROUP)
            or not _nvfp4_k_ok("gate_up", "x", x.shape[1])):
        return None
    m = x.shape[0]
    if dispatch_nvfp4.nvfp4_dequantizes(m):
        return GateUpConfig(act=act, h_format=h_format, **_nvfp4_prefill_tile(m, wg3_on(x.device, m, weight.shape[0])))
    shape = dispatch_nvfp4.call_shape(x.device, weight.shape[0], x.shape[1])
    return GateUpConfig(act=act, h_format=h_format, mainloop=NVFP4_MAINLOOP, tile_major=tile_major,
                        **dispatch_nvfp4.nvfp4_tile_for(m, tile_major=tile_major, shape=shape))


def _nvfp4_down_config(h, weight, weight_scale, residual, tile_major: bool):
    """down_config's nvfp4 case: bf16 h, e4m3 weight scales, H a multiple of 8, I of NVFP4_K_ALIGN
    (tile_major as for gate_up)."""
    from .sm90.tile_config import N_ALIGN, DownConfig

    if (h.dtype != torch.bfloat16 or weight_scale is None or weight_scale.dtype != torch.float8_e4m3fn
            or weight.shape[0] % N_ALIGN or not _nvfp4_k_ok("down", "h", h.shape[1])):
        return None
    if dispatch_nvfp4.nvfp4_dequantizes(h.shape[0]):
        m = h.shape[0]
        return DownConfig(residual=residual is not None,
                          **_nvfp4_prefill_tile(m, wg3_on(h.device, m, weight.shape[0]), clusters=False))
    shape = dispatch_nvfp4.call_shape(h.device, weight.shape[0], h.shape[1])
    cfg = DownConfig(mainloop=NVFP4_MAINLOOP, residual=residual is not None, tile_major=tile_major,
                     **dispatch_nvfp4.nvfp4_tile_for(h.shape[0], "down", tile_major=tile_major, shape=shape))
    cfg = dispatch_nvfp4.with_fixup_groups(cfg, h.shape[0], *shape) if shape else cfg
    return dispatch_nvfp4.with_half_rows_down(cfg, h.shape[0])


def _nvfp4_prefill_shipped(config_cls, variants) -> list:
    """The dequantized prefill's configs of config_cls for each of ``variants``: the 128-row tile with and
    without cluster pairs (gate_up; down never runs in them) and the 192-row tile."""
    clusters = config_cls.epilogue == "gated"
    return list(dict.fromkeys(config_cls(**_nvfp4_prefill_tile(m, wg3, clusters), **v) for v in variants
                              for m in (dispatch_nvfp4.NVFP4_DEQUANT_M, CLUSTER_M_MIN) for wg3 in (False, True)))


def _pdl_variants(tile_m: int, swap: bool, mainloop: str) -> tuple[bool, ...]:
    """The TileConfig.pdl values a tile can be picked with (pdl_applies): the swap-AB tiles run at
    M ≤ PDL_M only, the 64-row tile on both sides of it, the 128-row tiles above it."""
    if mainloop != FP8_MAINLOOP or tile_m > 64:
        return (False,)
    return (True,) if swap else (False, True)


def _gate_up_pdl_variants(tile_m: int, swap: bool, mainloop: str) -> tuple[bool, ...]:
    """_pdl_variants, and gate_up's swap-AB tile also without PDL where it can run over more than
    PDL_SWAP_M_TILES M tiles within PDL_M (gate_up_pdl)."""
    out = _pdl_variants(tile_m, swap, mainloop)
    return (False, *out) if out == (True,) and _swap_without_pdl(PDL_M, tile_m, swap, None) else out


def gate_up_shipped() -> list:
    """Every GateUpConfig gate_up_config can return (what CI compile-checks)."""
    from .sm90 import activations_and_h, schedule
    from .sm90.tile_config import TILE_M_WG3, TILE_N_GRANULES, GateUpConfig

    swap_tm, swap_stages = GATE_UP_SWAP_TILES[0]
    nvfp4 = [dict(act=act, h_format=formats.NVFP4.h_format) for act in activations_and_h.ACTIVATIONS]
    out = dispatch_nvfp4.nvfp4_shipped(GateUpConfig, nvfp4) + _nvfp4_prefill_shipped(GateUpConfig, nvfp4)
    for mainloop in (FP8_MAINLOOP, BF16_MAINLOOP):
        for act in activations_and_h.ACTIVATIONS:
            for h_format in activations_and_h.H_FORMATS:
                tiles = [(128, 4, False, 1), (128, 4, False, 2), (64, 5, False, 1)]  # (cluster_m_for)
                tiles += [(t, s, True, 1) for t, s in GATE_UP_SWAP_TILES] + [(swap_tm, SWAP_LONG_K_STAGES, True, 1)]
                for tile_m, stages, swap, cl in tiles:
                    split = split_n_applies(tile_m, swap, mainloop)
                    for deep in (False, True) if split else (False,):  # (split_n_pipeline: 4 or 5 stages)
                        pipe = split_n_pipeline(deep, h_format) if split else dict(stages=stages)
                        for pdl in _gate_up_pdl_variants(tile_m, swap, mainloop):
                            out.append(GateUpConfig(tile_m=tile_m, act=act, h_format=h_format, mainloop=mainloop,
                                                    swap_ab=swap, cluster_m=cl, split_n=split,
                                                    l2_hint=gate_up_l2_hint(tile_m, swap),
                                                    smem_scales=smem_scales_apply(tile_m, swap, mainloop, h_format),
                                                    pdl=pdl, uniform_ab=uniform_ab_applies(mainloop), **pipe))
                out.append(GateUpConfig(tile_m=swap_tm, stages=swap_stages, act=act,  # gate_up_cluster_k
                                        h_format=h_format, mainloop=mainloop, swap_ab=True, cluster_k=2,
                                        pdl=pdl_applies(0, mainloop), uniform_ab=uniform_ab_applies(mainloop)))
                if mainloop == BF16_MAINLOOP:  # wg3_applies
                    out.append(GateUpConfig(tile_m=TILE_M_WG3, stages=WG3_STAGES, act=act, h_format=h_format,
                                            mainloop=mainloop))
                if mainloop == BF16_MAINLOOP and not activations_and_h.h_spec(h_format).scaled:  # granule_tile_n
                    out.extend(GateUpConfig(tile_m=128, tile_n=tile_n, stages=4, act=act, h_format=h_format,
                                            mainloop=mainloop) for tile_n in TILE_N_GRANULES)
    out += [dataclasses.replace(c, static_stages=True) for c in out if c.smem_scales]  # (with_static_stages)
    if schedule.SPLIT_N_MAX_SK_GRID_M:
        out += [dataclasses.replace(c, split_n_sk=True) for c in out if c.split_n]  # (with_split_n_sk)
    if FP8_TILE_MAJOR:  # (fp8_tile_major: the modules' fp8 gate_up weight)
        out += [dataclasses.replace(c, tile_major=True) for c in out if c.fp8]
    return out


# ================================================================ the split projection (Flux.2)
# The 64/128-row tiles of 256 weight rows, one warpgroup a 64-row slab, bf16 y and h, cluster pairs
# as for gate_up (D8) where P keeps the pair tiles on the 256-row grid; no granules (split.py). P
# is compiled in: the shipped configurations are Flux.2-dev's (3 · 48 heads · 128); another P
# compiles on its first call.
SPLIT_PREFIXES = (18432,)
SPLIT_TILES = ((64, 4), (128, 4))  # (tile_m, stages): M ≤ DECODE_M, above; nvfp4: dispatch_nvfp4.NVFP4_ROW_TILE at every M


def split_backend(x, weight, weight_scale, x_scale, global_scale, prefix, interleave, act):
    """(SM90, SplitConfig) where the split kernel implements these arguments (bf16, fp8_block128 or
    nvfp4 with g = 128, P a multiple of 128 (nvfp4: 256), 16-byte rows, nvfp4's K a multiple of
    64), else (REFERENCE, None), with a warning once where P, K or the rows' bytes are the reason."""
    from .sm90 import activations_and_h

    nvfp4 = weight.dtype == torch.uint8
    if (not sm90_kernels_usable(x.device) or (global_scale is not None) != nvfp4 or interleave != GROUP
            or act not in activations_and_h.ACTIVATIONS):
        return REFERENCE, None
    mainloop = _split_mainloop(x, weight, weight_scale, x_scale)
    if mainloop is None or not rows_16_bytes("gate_up_split", x=x, weight=weight):
        return REFERENCE, None
    whole = split_prefix_multiple(nvfp4)
    if prefix % whole:
        _warn_reference_once("gate_up_split", "the prefix", prefix, whole,
                             "nvfp4: the pair tiles on the 256-row grid" if nvfp4 else "whole 128-row weight blocks",
                             unit="rows")
        return REFERENCE, None
    if nvfp4 and not _nvfp4_k_ok("gate_up_split", "x", x.shape[1]):
        return REFERENCE, None
    try:
        from .sm90.tile_config import TILE_M_WG3, SplitConfig
    except ImportError:
        return REFERENCE, None
    m = x.shape[0]
    wg3 = not nvfp4 and mainloop == BF16_MAINLOOP or nvfp4 and dispatch_nvfp4.nvfp4_dequantizes(m)
    wg3 = wg3 and m > DECODE_M and wg3_on(x.device, m, weight.shape[0])
    if nvfp4 and dispatch_nvfp4.nvfp4_dequantizes(m):
        return SM90, SplitConfig(act=act, h_format="bf16", prefix=prefix, **_nvfp4_prefill_tile(m, wg3))
    if wg3:
        return SM90, SplitConfig(tile_m=TILE_M_WG3, stages=WG3_STAGES, mainloop=mainloop, act=act, h_format="bf16",
                                 prefix=prefix)
    tile_m, stages = dispatch_nvfp4.NVFP4_ROW_TILE if nvfp4 else SPLIT_TILES[m > DECODE_M]
    cluster = cluster_m_for(m, tile_m, 2 * GROUP) if prefix % (2 * GROUP) == 0 and not nvfp4 else 1
    return SM90, SplitConfig(tile_m=tile_m, stages=stages, mainloop=mainloop, act=act, h_format="bf16",
                             prefix=prefix, cluster_m=cluster, l2_hint="" if nvfp4 else gate_up_l2_hint(tile_m, False))


def split_prefix_multiple(nvfp4: bool) -> int:
    """Rows the split kernel needs P to be a multiple of: whole 128-row weight blocks; nvfp4, the
    pair tiles on the 256-row grid."""
    return 2 * GROUP if nvfp4 else GROUP


def split_module_backend(weight: torch.Tensor, prefix: int, k: int, weight_format: str, interleave: int) -> str:
    """Where a FusedSplitProjection over the packed ``weight`` [P + 2I, K] runs: SM90 where the
    format has kernels on its device (module_backend) and split_backend's shape rules hold (P in
    whole blocks, 16-byte rows, nvfp4's K in whole k tiles; said here without its warnings), else
    REFERENCE."""
    if module_backend(weight_format, interleave, weight.device) == REFERENCE:
        return REFERENCE
    from .sm90.tile_config import NVFP4_K_ALIGN

    nvfp4 = weight.dtype == torch.uint8
    k_multiple = NVFP4_K_ALIGN if nvfp4 else 16 // weight.element_size()
    return REFERENCE if prefix % split_prefix_multiple(nvfp4) or k % k_multiple else SM90


def _split_mainloop(x, weight, weight_scale, x_scale) -> str | None:
    """The mainloop of the split kernel for these operand dtypes, or None (the reference runs)."""
    if weight.dtype == torch.float8_e4m3fn and x.dtype == torch.float8_e4m3fn:
        ok = weight_scale is not None and x_scale is not None and weight_scale.dtype == torch.float32
        return FP8_MAINLOOP if ok else None
    if weight.dtype == torch.bfloat16 and x.dtype == torch.bfloat16:
        return BF16_MAINLOOP
    if weight.dtype == torch.uint8 and x.dtype == torch.bfloat16:
        ok = weight_scale is not None and weight_scale.dtype == torch.float8_e4m3fn
        return NVFP4_MAINLOOP if ok else None
    return None


def split_shipped() -> list:
    """Every SplitConfig split_backend returns for SPLIT_PREFIXES (what CI compile-checks)."""
    from .sm90 import activations_and_h
    from .sm90.tile_config import TILE_M_WG3, SplitConfig

    tiles = [(tile_m, stages, 1) for tile_m, stages in SPLIT_TILES] + [(*SPLIT_TILES[1], 2)]  # (cluster_m_for)
    out = [SplitConfig(tile_m=tile_m, stages=stages, mainloop=mainloop, act=act, h_format="bf16", prefix=p,
                       cluster_m=cl, l2_hint=gate_up_l2_hint(tile_m, False))
           for p in SPLIT_PREFIXES for mainloop in (FP8_MAINLOOP, BF16_MAINLOOP)
           for act in activations_and_h.ACTIVATIONS for tile_m, stages, cl in tiles]
    out += [SplitConfig(tile_m=TILE_M_WG3, stages=WG3_STAGES, mainloop=BF16_MAINLOOP, act=act, h_format="bf16",
                        prefix=p) for p in SPLIT_PREFIXES for act in activations_and_h.ACTIVATIONS]  # (wg3_on)
    return out + [SplitConfig(tile_m=dispatch_nvfp4.NVFP4_ROW_TILE[0], stages=dispatch_nvfp4.NVFP4_ROW_TILE[1], mainloop=NVFP4_MAINLOOP, act=act,
                              h_format="bf16", prefix=p)
                  for p in SPLIT_PREFIXES for act in activations_and_h.ACTIVATIONS] + [
        SplitConfig(act=act, h_format="bf16", prefix=p, **_nvfp4_prefill_tile(m, wg3))
        for p in SPLIT_PREFIXES for act in activations_and_h.ACTIVATIONS for m in (dispatch_nvfp4.NVFP4_DEQUANT_M, CLUSTER_M_MIN)
        for wg3 in (False, True)]


# ================================================================ down: the tile, and sm90 vs cuBLAS
DOWN_SWAP_TILES = ((16, 6),)  # the fp8 swap-AB tile (swap_ab.py): (tokens, stages) ...
DOWN_SWAP_M = 64  # ... for M ≤ this (D14)
# ... and where plan() would split a few of its tiles in two, their K parts over a cluster instead
# (D17): (CTAs a cluster, stages, PDL). Since D37 four parts (the three peers' 16 KB accumulator
# slots leave room for 5 stages), launched without PDL: clusters of 4 placed under gate_up's tail
# made the MLP slower than launching them all after it. (2, 6, True) until 2026-11-29 ...
DOWN_CLUSTER_K = (4, 5, False)
# ... and still where the clusters of 4 would take more than this share of the SMs (D40: 4096×14336
# at M = 17-32, 32 tiles: 128 CTAs in clusters of 4 took 34 µs alone, K pairs 26)
DOWN_CLUSTER_K_SMS = 0.5
DOWN_CLUSTER_PAIRS = (2, 6, True)
ROWS_64 = 128  # M ≤ this (above the swap-AB range): the 64-row tile
MIN_WAVE = 0.9  # bf16: the kernel from this fraction of a wave of tiles ... (D16)
MAX_M = 4096  # ... up to this M (D16)


def down_swap_ab(m: int) -> bool:
    """Whether down with M rows runs the swap-AB tile (fp8; D14)."""
    return m <= DOWN_SWAP_M


def down_tile_for(m: int, mainloop: str) -> tuple[int, int, bool]:
    """(tile_m, stages, swap_ab) for M rows."""
    if mainloop == FP8_MAINLOOP and down_swap_ab(m):
        return (*DOWN_SWAP_TILES[0], True)
    return (64, 5, False) if m <= ROWS_64 else (128, 4, False)


def down_cluster_k(config, m: int, n: int, k: int, sms: int) -> int:
    """The tiles (0: none) whose K parts the fp8 swap-AB tile runs over a cluster (TileConfig.cluster_k,
    DSMEM) instead of the stream-K split 2 that schedule.plan picks, with few tiles (≤ 0.25 × SMs, as
    gate_up_cluster_k: so that a cluster of 4 a tile fits; D17, D37). Other splits and whole tiles
    keep plan()'s schedule."""
    from .sm90.schedule import schedule

    if not (config.swap_ab and config.fp8):
        return 0
    ctas, sk_tiles = schedule(config, m, n, k, sms)
    fits = 0 < sk_tiles <= 0.25 * sms and ctas == 2 * sk_tiles and DOWN_CLUSTER_K[0] * sk_tiles <= sms
    return sk_tiles if fits else 0


def with_down_cluster_k(config, m: int, n: int, k: int, sms: int):
    """config with its K parts over a cluster where down_cluster_k finds tiles (DOWN_CLUSTER_K, or
    DOWN_CLUSTER_PAIRS where those clusters would take more than DOWN_CLUSTER_K_SMS of the SMs),
    else config."""
    tiles = down_cluster_k(config, m, n, k, sms)
    if not tiles:
        return config
    four = DOWN_CLUSTER_K[0] * tiles <= DOWN_CLUSTER_K_SMS * sms
    ck, stages, pdl = DOWN_CLUSTER_K if four else DOWN_CLUSTER_PAIRS
    return dataclasses.replace(config, cluster_k=ck, stages=stages, pdl=pdl and config.pdl)


DOWN_STAGED_SCALES = True  # (D36; launch_ab --set dispatch.DOWN_STAGED_SCALES=False measures without it)


def down_row_tile_fields(tile_m: int, swap_ab: bool, mainloop: str) -> dict:
    """The fp8 128-row down tile stages y 64 columns at a time (TileConfig.y_slab_cols), so that its
    promotion scales fit staged in smem beside four stages (smem_scales, as gate_up's: D13), and with
    them D34's static k loop (where K is whole rings: with_static_stages) and D35's uniform
    descriptors (D36: 5-11 % faster than cuBLAS at M = 1024-4096 where K is whole rings)."""
    if DOWN_STAGED_SCALES and mainloop == FP8_MAINLOOP and tile_m == 128 and not swap_ab:
        return dict(y_slab_cols=64, smem_scales=True, uniform_ab=True)
    return {}


def down_l2_hint(tile_m: int, swap_ab: bool, mainloop: str) -> str:
    """TileConfig.l2_hint for down's tile: the fp8 64-row tile evicts weight k tiles first, as
    gate_up's does (h was just written by gate_up and every CTA reads it; D18)."""
    return "w_first" if tile_m == 64 and not swap_ab and mainloop == FP8_MAINLOOP else ""


def down_config(h, weight, weight_scale, h_scale, residual, out_dtype, tile_major: bool = False):
    """The DownConfig for these operands, or None when the sm90 kernel does not implement them
    (then down_backend picks cuBLAS or the reference)."""
    from .sm90.tile_config import N_ALIGN, DownConfig

    fp8 = torch.float8_e4m3fn
    if out_dtype != torch.bfloat16:
        return None
    if residual is not None and residual.dtype != torch.bfloat16:
        return None
    if weight.dtype == torch.uint8:
        return _nvfp4_down_config(h, weight, weight_scale, residual, tile_major)
    if weight.dtype == fp8 and h.dtype == fp8:
        if (weight_scale is None or h_scale is None or weight_scale.dtype != torch.float32
                or h_scale.dtype != torch.float32):
            return None
        mainloop, k_align = FP8_MAINLOOP, 16
    elif weight.dtype == torch.bfloat16 and h.dtype == torch.bfloat16:
        mainloop, k_align = BF16_MAINLOOP, 8
    else:
        return None
    if residual is not None and residual.dtype != torch.bfloat16:
        return None
    if weight.shape[0] % N_ALIGN or weight.shape[1] % k_align:
        return None
    tile_m, stages, swap = down_tile_for(h.shape[0], mainloop)
    cfg = DownConfig(tile_m=tile_m, stages=stages, mainloop=mainloop, residual=residual is not None, swap_ab=swap,
                     l2_hint=down_l2_hint(tile_m, swap, mainloop), pdl=pdl_applies(h.shape[0], mainloop),
                     **down_row_tile_fields(tile_m, swap, mainloop))
    cfg = with_static_stages(cfg, h.shape[0], weight.shape[0], h.shape[1], h.device)
    from .sm90.schedule import planned_sms

    sms = planned_sms(h.device)
    return with_down_cluster_k(cfg, h.shape[0], weight.shape[0], h.shape[1], sms) if sms else cfg


def down_shipped() -> list:
    """Every DownConfig down_config can return (what CI compile-checks)."""
    from .sm90.tile_config import DownConfig

    nvfp4 = [dict(residual=r) for r in (False, True)]
    out = dispatch_nvfp4.nvfp4_shipped(DownConfig, nvfp4) + _nvfp4_prefill_shipped(DownConfig, nvfp4)
    for mainloop in (FP8_MAINLOOP, BF16_MAINLOOP):
        swap_tiles = [(t, s, True) for t, s in DOWN_SWAP_TILES] if mainloop == FP8_MAINLOOP else []
        for tile_m, stages, swap in [(128, 4, False), (64, 5, False), *swap_tiles]:
            fields = down_row_tile_fields(tile_m, swap, mainloop)
            statics = (False, True) if fields.get("smem_scales") else (False,)  # (with_static_stages)
            out += [DownConfig(tile_m=tile_m, stages=stages, mainloop=mainloop, residual=residual, swap_ab=swap,
                               l2_hint=down_l2_hint(tile_m, swap, mainloop), pdl=pdl, static_stages=static, **fields)
                    for residual in (False, True) for pdl in _pdl_variants(tile_m, swap, mainloop) for static in statics]
    return out + [DownConfig(tile_m=DOWN_SWAP_TILES[0][0], stages=stages, residual=residual, swap_ab=True,
                             cluster_k=ck, pdl=pdl)  # with_down_cluster_k (fp8)
                  for ck, stages, pdl in (DOWN_CLUSTER_K, DOWN_CLUSTER_PAIRS) for residual in (False, True)]


def fills_gpu(config, m: int, n: int, sms: int) -> bool:
    """Whether the kernel's ceil(M/tile_m) · ceil(H/256) tiles fill at least MIN_WAVE of the SMs."""
    tiles = cdiv(m, config.tile_m) * cdiv(n, config.tile_n)
    return tiles >= MIN_WAVE * sms


# The static 128-row fp8 down tile against cuBLAS's 128 × 128 one (D36), by rounds of whole waves: a
# wave of tiles filling f of the SMs takes (DOWN_WAVE_BASE + f) · a tile's work (each tile runs
# longer with more beside it: bandwidth and the power cap), and cuBLAS's tile does half of ours in
# CUBLAS_HALF_TILE of our tile's time (fitted to bench_down on the H200, M = 384-8192 on both shapes).
DOWN_WAVE_BASE = 2.0
CUBLAS_HALF_TILE = 0.53
# bf16 down by the same model (D47): its 128-row tile lost to cuBLAS by 23-43 % where its tiles took a
# partial second wave (8192×3584 M = 576-768). "waves": D16's wave fraction alone; "cublas": cuBLAS
# wherever it takes the operands (what launch_ab compares)
BF16_DOWN = "rounds"


def _rounds(tiles: int, sms: int) -> float:
    """The waves of ``tiles`` equal tiles on ``sms`` SMs, in units of a tile's work (D36's model)."""
    full, rest = divmod(tiles, sms)
    return full * (DOWN_WAVE_BASE + 1) + (DOWN_WAVE_BASE + rest / sms if rest else 0.0)


def down_rounds_win(config, m: int, n: int, sms: int) -> bool:
    """Whether our 128-row down tile's rounds are predicted shorter than those of cuBLAS's 128 × 128
    tiles: the static fp8 tile (D36), the bf16 tile (D47)."""
    ours = cdiv(m, config.tile_m) * cdiv(n, config.tile_n)
    return _rounds(ours, sms) < CUBLAS_HALF_TILE * _rounds(cdiv(m, 128) * cdiv(n, 128), sms)


def beats_cublas(config, m: int, n: int, k: int, sms: int) -> bool:
    """Where the down kernel was measured faster than cuBLAS: fp8 with the swap-AB tile or with the
    64-row tile where stream-K shares K out (D15), or with the static 128-row tile where its rounds
    of waves are predicted shorter (D36), elsewhere cuBLAS; bf16 from MIN_WAVE of a wave of tiles up
    to MAX_M (D16; not where only stream-K would share K out: cuBLAS was faster at every such M, D44),
    and since D47 only where its rounds are predicted shorter too (BF16_DOWN)."""
    from .sm90.schedule import schedule

    if not config.fp8:
        return (BF16_DOWN != "cublas" and fills_gpu(config, m, n, sms) and m <= MAX_M
                and (BF16_DOWN == "waves" or down_rounds_win(config, m, n, sms)))
    shares_k = config.tile_m == 64 and schedule(config, m, n, k, sms)[1] > 0
    return config.swap_ab or shares_k or (config.static_stages and down_rounds_win(config, m, n, sms))
