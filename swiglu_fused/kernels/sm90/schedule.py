"""Tile scheduling of the sm_90a GEMM (gemm.py): whole tiles or stream-K, the band order of
M tiles, and the per-launch plan (grid, stream-K workspace). The integer formulas run both in the
kernel (Int32) and on the host (int, tests)."""

from __future__ import annotations

import math
import threading

import cutlass

from ...quant import cdiv
from .tile_config import (BF16_MAINLOOP, FP8_MAINLOOP, HALF_N, GateUpConfig, SplitConfig,
                          TileConfig, mainloop_tile_k)


# Whole tiles leave SMs idle when there are few of them: decode with I = 3584 has 28 gate_up tiles
# for 132 SMs, and each CTA then streams its weights at one SM's rate (~55 GB/s), far below HBM's.
# Stream-K deals the K iterations of all tiles out evenly over more CTAs instead; a CTA finishing
# part of a tile stores an fp32 partial and the last to arrive sums them and runs the epilogue
# (stream_k.StreamKMixin._fixup). That fix-up is not free (partials through L2, an arrival counter, the
# epilogue serialized behind the last contributor, growing with the number of CTAs per tile), so
# plan() uses it only where a cost model predicts a clear gain, and with about enough CTAs to
# saturate HBM. The model's constants are fitted to measurements: DISPATCH D19.
SK_MIN_ITERS = 4  # k tiles per CTA, at least
# A band's A tiles (x or h rows × K) fit in this much of the 50 MB L2, with the few weight tiles the
# running CTAs share: beyond it, m-fastest order would re-read all of A from HBM for every N tile
# (gate_up 8192×3584 at M = 16384: 134 MB of x, 28 times).
BAND_A_BYTES = 32 << 20
# One CTA's time per 32 KB weight k tile when few CTAs run (whole tiles; DISPATCH D19): the 64-row
# tile, the 128-row tile (two consumer warpgroups, more MMA per byte), and the 16/32/64-token
# swap-AB tiles (only the 16-token one is shipped)
ITER_US = {64: 0.52, 128: 0.84, "swap16": 0.40, "swap32": 0.48, "swap64": 1.07,
           # nvfp4, per 8 KB packed k tile (its decode, not the bytes, sets the pace): first version,
           # H100 2026-11-24, from whole-MLP times; every tile shape alike until measured apart
           "nvfp4": 2.0}
HBM_BYTES_PER_US = 2.6e6  # what many CTAs together reach (2.96e6 for a plain copy)
FIXUP_US = (4.0, 2.5)  # fix-up cost: base + per CTA sharing a tile
SK_MIN_GAIN = 1.15  # stream-K only when predicted this much faster
# M tiles up to which plan() considers stream-K for fp8's split_n 64-row tile (DISPATCH D57): 4, not the
# other tiles' 2 (_max_sk_grid_m, measured on wide weights): where this tile splits at all its weight is
# narrow (I ≤ 2560, ≤ 64 tiles), and there four were 2-22 % faster at M = 129-256. 0: the split_n tile
# always runs whole tiles (no fix-up compiled in; before D57)
SPLIT_N_MAX_SK_GRID_M = 4
# ... and the predicted gain it needs: any (1.0, DISPATCH D59). Of 24 widths at M = 17-512 it moves only
# 8192×3584 M = 65-128 (predicted 1.0-1.15× faster), where the split was 1.4-4.2 % faster than whole
# tiles (SK_MIN_GAIN there, as the other tiles keep: every tile's plan() at 1.0 was 2-3 % slower at 8192×7168)
SPLIT_N_SK_MIN_GAIN = 1.0
# nvfp4's 128-token swap-AB tile past one wave (M = 129-1024) is bound by its decode, not by the
# weight's bytes (4 bits: the stream-K tiles' weight stays in L2), so where its tiles end in a partial
# wave, the last full wave and the partial one go stream-K over all CTAs ("hybrid"; every tile then
# shared by at most two CTAs), where predicted NVFP4_HYBRID_MIN_GAIN faster (DISPATCH D46); the 32- to
# 64-token tiles too, past one wave where I > 16896 (D61: the MLP 4-25 % faster at M = 40-64 at four such
# widths; D62: with the 32-token tile 20-25 % faster at M = 17-32 than the 64-token one's hybrid).
# The bf16 and fp8 tiles lost so (history/gate_up.md, deepgemm.md): their k-split CTAs re-read weights
# (but for gate_up just past one wave: D48, below).
# Fitted to gate_up and down alone on the H200 (D46; 4096×14336, 8192×3584, 2048×8192 at M = 384-1024):
NVFP4_ITER_US = 0.85  # a 128-token tile's k tile (64 columns) a CTA, in full waves
NVFP4_FIXUP_US = 15.0  # what the hybrid's stream-K part costs over its even share of k tiles
NVFP4_HYBRID_MIN_GAIN = 1.05
NVFP4_HYBRID_TOKENS = (32, 48, 64, 80, 96, 112, 128, 144, 160)  # the swap-AB tiles (tokens) that run it (D61-D64)
# plan()'s split of an nvfp4 swap-AB tile over K, as nvfp4_swap_us prices it since DISPATCH D71 (split_fixup_us):
# every CTA stores its fp32 partial, all at once through L2 (ctas · bytes at NVFP4_PARTIAL_STORE_BYTES_PER_US); the
# last CTA of a tile split n ways arrives (NVFP4_SPLIT_ARRIVAL_US: its stores drained, the atomic, two barriers) and
# reads the n partials through its SM's L2 port at FIXUP_PARTIAL_BYTES_PER_US; in two levels (TileConfig.fixup_groups,
# D70) groups of g = ceil(sqrt(n)) make it g + ceil(n / g) + 1 reads for a second arrival, FIXUP_ARRIVAL_US.
# The reads and arrivals fitted on the H200 to the MLP at 30 points (six narrow widths, M = 48-256, n = 9-32, partials
# of 49-131 KB; history/nvfp4.md v50), the second arrival 1.8 µs once a grouped launch paid no memset for its
# counters; the stores' rate to which tile runs faster at 44 points (D71, v51: 2.2e6-2.8e6 pick all 44 right; without
# the stores 8 wrong, with FIXUP_US 21), the arrival cancels there. For the ops whose epilogues
# NVFP4_SPLIT_FIXUP_EPILOGUES holds: down ("linear") and gate_up ("gated"; D70's reads alone had moved its picks to
# slower tiles, 5-9 %; with the stores it moves 48 of 15744, 3-9 % faster where measured, v51 run 4). False: FIXUP_US
# for both, groups or not (before D71; launch_ab compares)
NVFP4_SPLIT_FIXUP = True
NVFP4_SPLIT_FIXUP_EPILOGUES = ("linear", "gated")
NVFP4_SPLIT_ARRIVAL_US = 2.8
NVFP4_PARTIAL_STORE_BYTES_PER_US = 2.5e6
FIXUP_PARTIAL_BYTES_PER_US = 1.25e5
FIXUP_ARRIVAL_US = 1.8
# nvfp4_swap_us: a swap-AB tile's k tile costs as NVFP4_TILE_BASE + its tokens (fitted on the H200, the
# MLP at 80-160 tokens in one M tile, 4096×14336 and 8192×3584 alike: the decode's share, as tokens of
# MMA), a tile decoding into smem NVFP4_SMEM_DECODE_COST times one decoding into registers (gate_up's
# 192-token tile against the 160-token one; D64)
NVFP4_TILE_BASE = 79
NVFP4_SMEM_DECODE_COST = 1.17
# ... and down's 128-row tiles (TileConfig.nvfp4_half_rows) NVFP4_HALF_ROWS_BASE + half their tokens: half
# the weight rows of a 256-row tile, for the MMA the same tokens' worth as a 256-row tile of half the tokens;
# fitted on the MLP at M = 1024 (D67: 256-token tiles 7.5-8 % faster than 128-token ones on down's k loop at
# 4096×14336, 8192×3584, 2048×8192; a decode halved would be 19 %, the rest is x's bytes, twice a MAC)
NVFP4_HALF_ROWS_BASE = 62
# gate_up's (TileConfig.half_row_pairs: two weight boxes a stage, h's slab 64 columns): where the model with
# 62 tied them with the 256-row tiles (4096×14336 M = 512, 8192×3584 M = 1024) the MLP measured level to
# 1.5 % slower (forty-ninth session, DISPATCH D68)
NVFP4_HALF_ROWS_GATE_UP_BASE = 64
# The same split for gate_up's bf16 and fp8 128-row tiles just past one wave (DISPATCH D48). It pays
# only where the CTAs that share a weight column run close together in K, so that its k tiles meet in
# L2 (their spread: grid_m · (tiles / SMs - 1) of K), and where K is long enough to carry the fix-up.
# Fitted on the H200, gate_up alone, at 8192×3584 M = 577-640 (140 tiles, spread 0.3): bf16 128-135 µs
# against the 192-row tile's 142-152 and whole tiles' 89 a round; fp8 78-81 against the 64-row tile's
# 91-95 and whole tiles' 51-53 a round. Where it lost: 8192×2048 at M = 1100 (bf16, spread 0.8) 170
# against 148; at 1.27-1.45 waves (spread 1.6-2.5: 8192×3584 M = 704, 8192×7168 and 2048×8192 M = 384)
# 3 % faster to 50 % slower than whole tiles and slower than the tile dispatched there (its CTAs re-read
# the weight from HBM); bf16 1536×8960 at M = 256 (K = 1536) 40 against 30-34.
HYBRID_ITER_US = {BF16_MAINLOOP: 0.70, FP8_MAINLOOP: 0.81}  # a 128-row tile's k tile a CTA, in full waves
HYBRID_FIXUP_US = {BF16_MAINLOOP: 34.0, FP8_MAINLOOP: 25.0}  # what the split costs over its even share
HYBRID_SPREAD = 0.35
HYBRID_MAX_ROUNDS = 1.6  # (of whole tiles) where it runs: 2 rounds of whole tiles or 3 of half-height


def band_rows(grid_m, a_tile_bytes, cl):
    """M tiles per band (_tile_mn): as many as BAND_A_BYTES of A tiles, a multiple of the cluster
    size cl (grid_m is one too), at least cl, at most grid_m. Host ints or device Int32."""
    return cutlass.max(cutlass.min(grid_m, BAND_A_BYTES // a_tile_bytes // cl * cl), cl)


def sk_iter_begin(c, ctas, sk_iters):
    """First stream-K iteration of CTA c: CTA c takes iterations [begin(c), begin(c + 1)), where
    iteration it is k tile it % k_tiles of stream-K tile it // k_tiles."""
    return c * sk_iters // ctas


def sk_cta_of(it, ctas, sk_iters):
    """The CTA whose stream-K range holds iteration it (the inverse of sk_iter_begin)."""
    return ((it + 1) * ctas + sk_iters - 1) // sk_iters - 1


def plan(tiles: int, k_tiles: int, sms: int, grid_m: int = 1, iter_bytes: int = 32768,
         iter_us: float = ITER_US[64], max_sk_grid_m: int = 2, min_gain: float | None = None) -> tuple[int, int]:
    """(grid, sk_tiles) for ``tiles`` output tiles (``grid_m`` of them along M, sharing weight
    tiles) of ``k_tiles`` k tiles, each reading ``iter_bytes`` of weights in ``iter_us`` per CTA:
    whole tiles (sk_tiles = 0), or all tiles stream-K split ``split`` ways. Stream-K is considered
    only while weights dominate (grid_m ≤ max_sk_grid_m: 2 for the 64/128-row tiles, since with
    more M tiles CTAs on different K ranges no longer share weight tiles in L2 (DISPATCH D19), but 4
    for fp8's split_n tile (D57); 4 for the 16-token swap-AB tile, i.e. M ≤ 64), with about the CTAs
    that keep HBM busy, and only where the cost model predicts ``min_gain`` (default SK_MIN_GAIN)."""
    return plan_us(tiles, k_tiles, sms, grid_m, iter_bytes, iter_us, max_sk_grid_m, min_gain)[0]


def plan_us(tiles: int, k_tiles: int, sms: int, grid_m: int = 1, iter_bytes: int = 32768,
            iter_us: float = ITER_US[64], max_sk_grid_m: int = 2,
            min_gain: float | None = None) -> tuple[tuple[int, int], float]:
    """(plan()'s answer, the cost model's µs for it)."""
    whole = (max(1, min(tiles, sms)), 0)
    # (each weight byte read once; grid_m is 0 only with no tiles, M = 0)
    t_hbm = tiles // max(grid_m, 1) * k_tiles * iter_bytes / HBM_BYTES_PER_US
    t_whole = max(cdiv(tiles, sms) * k_tiles * iter_us, t_hbm)
    if tiles <= 0 or grid_m > max_sk_grid_m or k_tiles < 2 * SK_MIN_ITERS:
        return whole, t_whole
    hbm_ctas = HBM_BYTES_PER_US * iter_us / iter_bytes * grid_m
    split = int(min(cdiv(hbm_ctas, tiles), k_tiles // SK_MIN_ITERS, sms // tiles))
    if split < 2:
        return whole, t_whole
    t_sk = max(cdiv(k_tiles, split) * iter_us, t_hbm) + FIXUP_US[0] + FIXUP_US[1] * split
    gain = SK_MIN_GAIN if min_gain is None else min_gain
    return ((tiles * split, tiles), t_sk) if t_whole > gain * t_sk else (whole, t_whole)


def schedule(config: TileConfig, m: int, n: int, k: int, sms: int) -> tuple[int, int]:
    """plan() for this config and problem: (ctas, sk_tiles); clusters: whole tiles, cluster pairs."""
    cl = config.cluster_m
    grid_m = cdiv(m, config.tile_m * cl) * cl
    tiles = grid_m * cdiv(n, config.tile_n)
    if cl > 1:  # whole tiles, whole clusters
        return max(cl, min(tiles, sms) // cl * cl), 0
    if config.whole_tiles:  # (their epilogues have no stream-K fix-up)
        return max(1, min(tiles, sms)), 0
    if config.cluster_k > 1:  # every tile split over the CTAs of a cluster; one tile per cluster
        ck = config.cluster_k
        if ck * tiles > sms:
            raise ValueError(f"{config}: cluster_k = {ck} needs {ck} · tiles ≤ {sms} SMs, got {tiles} tiles (M = {m})")
        return ck * tiles, tiles
    if hybrid128_applies(config, m, n, k, sms):
        return sms, tiles % sms + sms
    k_tiles = cdiv(k, config.tile_k)
    if config.nvfp4 and config.swap_ab and config.tile_m in NVFP4_HYBRID_TOKENS:
        sk_tiles = nvfp4_hybrid_sk(tiles, k_tiles, sms)
        if sk_tiles:
            return sms, sk_tiles
    iter_bytes = config.w_stage_bytes
    if config.nvfp4:
        iter_us = ITER_US["nvfp4"]
    else:
        iter_us = ITER_US[f"swap{config.tile_m}" if config.swap_ab else config.tile_m] * iter_bytes / 32768
    return plan(tiles, k_tiles, sms, grid_m, iter_bytes, iter_us, max_sk_grid_m=_max_sk_grid_m(config),
                min_gain=SPLIT_N_SK_MIN_GAIN if config.split_n else None)


def hybrid128_applies(config: TileConfig, m: int, n: int, k: int, sms: int) -> bool:
    """Whether ``config``'s tiles for M × N × K run nvfp4's hybrid split (above): gate_up's bf16 or fp8
    128 × 256 tile (not the dequantized nvfp4 one, nor the split projection's) where hybrid128_rounds
    runs it."""
    return (isinstance(config, GateUpConfig) and not isinstance(config, SplitConfig) and not config.swap_ab
            and not config.dequantized and config.tile_m == 128 and config.tile_n == 2 * HALF_N
            and hybrid128_rounds(config.mainloop, m, n, k, sms) is not None)


def hybrid128_rounds(mainloop: str, m: int, n: int, k: int, sms: int) -> float | None:
    """The hybrid's predicted time for gate_up's 128 × 256 tiles of ``mainloop`` for M × N × K on ``sms``
    SMs, in rounds of whole tiles (one tile's k loop in one CTA): their even share and the fix-up; None
    where it does not run (another mainloop, at most one wave, too wide a spread, or more than
    HYBRID_MAX_ROUNDS)."""
    if mainloop not in HYBRID_FIXUP_US:
        return None
    grid_m = cdiv(m, 128)
    tiles = grid_m * cdiv(n, 2 * HALF_N)
    if tiles <= sms or grid_m * (tiles / sms - 1) > HYBRID_SPREAD:
        return None
    rounds = tiles / sms + HYBRID_FIXUP_US[mainloop] / (cdiv(k, mainloop_tile_k(mainloop)) * HYBRID_ITER_US[mainloop])
    return rounds if rounds <= HYBRID_MAX_ROUNDS else None


def nvfp4_hybrid_sk(tiles: int, k_tiles: int, sms: int) -> int:
    """The stream-K tiles of nvfp4's hybrid schedule (above) for ``tiles`` swap-AB tiles of ``k_tiles``
    k tiles on ``sms`` SMs: the last full wave and the partial one, over all CTAs; 0: whole tiles."""
    return tiles % sms + sms if _nvfp4_hybrid_pays(tiles, k_tiles, sms) is not None else 0


def _nvfp4_hybrid_pays(tiles: int, k_tiles: int, sms: int) -> float | None:
    """The hybrid schedule's rounds (each CTA an even share of the stream-K tiles' k tiles, and the
    fix-up: every stream-K tile is shared by at most two CTAs) where they are NVFP4_HYBRID_MIN_GAIN
    shorter than whole waves; None where they are not, or the tiles fill whole waves."""
    if tiles <= sms or tiles % sms == 0:
        return None
    sk_k_tiles = cdiv((tiles % sms + sms) * k_tiles, sms)
    hybrid = tiles // sms - 1 + (sk_k_tiles + NVFP4_FIXUP_US / NVFP4_ITER_US) / k_tiles
    return hybrid if hybrid * NVFP4_HYBRID_MIN_GAIN <= cdiv(tiles, sms) else None


def nvfp4_swap_us(config: TileConfig, m: int, n: int, k: int, sms: int) -> float:
    """The predicted µs of an nvfp4 swap-AB GEMM (``config``) of M rows, N weight rows and K columns
    as schedule() runs it on ``sms`` SMs: whole waves of k loops, plan()'s split over K with its
    fix-up, or the hybrid's whole waves, then its stream-K tiles' k tiles over all CTAs and their
    fix-up; a k tile NVFP4_ITER_US at 128 tokens (D64: how nvfp4_tiling weighs M tilings)."""
    ctas, sk_tiles = schedule(config, m, n, k, sms)
    tiles = cdiv(m, config.tile_m) * cdiv(n, config.tile_n)
    k_tiles = cdiv(k, config.tile_k)
    if config.nvfp4_half_rows:
        base = NVFP4_HALF_ROWS_GATE_UP_BASE if config.half_row_pairs else NVFP4_HALF_ROWS_BASE
        it = NVFP4_ITER_US * (base + config.tile_m / 2) / (NVFP4_TILE_BASE + 128)
    else:
        it = NVFP4_ITER_US * (NVFP4_TILE_BASE + config.tile_m) / (NVFP4_TILE_BASE + 128)
    if not config.rs_decode:
        it *= NVFP4_SMEM_DECODE_COST
    if not sk_tiles:
        return cdiv(tiles, ctas) * k_tiles * it
    if ctas > tiles:  # (plan(): every tile split over ctas / tiles CTAs)
        split = ctas // tiles
        if not NVFP4_SPLIT_FIXUP or config.epilogue not in NVFP4_SPLIT_FIXUP_EPILOGUES:
            return cdiv(k_tiles, split) * it + FIXUP_US[0] + FIXUP_US[1] * split
        partial = 4 * config.tile_m * config.tile_n
        return cdiv(k_tiles, split) * it + split_fixup_us(split, partial, config.fixup_groups, ctas)
    return ((tiles - sk_tiles) // ctas * k_tiles + cdiv(sk_tiles * k_tiles, ctas)) * it + NVFP4_FIXUP_US


def split_fixup_us(split: int, partial_bytes: int, groups: bool, ctas: int = 0) -> float:
    """The predicted µs of the fix-up of a tile split ``split`` ways over K (fp32 partials of ``partial_bytes``)
    by ``ctas`` CTAs in all, summed in one level or, where ``groups``, two (above)."""
    stores = ctas * partial_bytes / NVFP4_PARTIAL_STORE_BYTES_PER_US
    reads, second_arrival = split, 0.0
    if groups:
        g = math.isqrt(split - 1) + 1  # ceil(sqrt(split)), as the kernel's
        reads, second_arrival = g + cdiv(split, g) + 1, FIXUP_ARRIVAL_US
    return NVFP4_SPLIT_ARRIVAL_US + stores + second_arrival + reads * partial_bytes / FIXUP_PARTIAL_BYTES_PER_US


def _max_sk_grid_m(config: TileConfig) -> int:
    """M tiles up to which plan() considers stream-K: 2 for the 64/128-row tiles (SPLIT_N_MAX_SK_GRID_M
    for fp8's split_n tile), M ≤ 64 for the
    16-64-token swap-AB tiles; 8 (M ≤ 1024; past it the tiles outnumber the SMs at every served width,
    so plan() keeps them whole) for nvfp4's 128-token swap-AB tile, whose k tiles are bound by the
    decode, not the weight bytes (DISPATCH D31: down at M = 512 had 64 whole tiles for 132 SMs), and for
    its 80-112-, 144- and 160-token tiles (D64; with 64 // tile_m they had run down's 16 tiles whole at
    4096×14336, 1.6-2.1× slower; history/nvfp4.md v40)."""
    if config.swap_ab:
        return 64 // config.tile_m if config.tile_m <= 64 else 8
    return SPLIT_N_MAX_SK_GRID_M if config.split_n else 2


def launch_plan(config: TileConfig, m: int, n: int, k: int, device, stream=None):
    """(ctas, sk_tiles, partials, counters) for one launch on ``stream`` (torch's; None: the current
    one): the partials allocated per call (they cost nothing to allocate), the zeroed tile counters
    from stream_k_counters (DISPATCH D19)."""
    import torch

    ctas, sk_tiles = schedule(config, m, n, k, sm_count(device))
    if sk_tiles == 0 or config.cluster_k > 1:  # (cluster_k: the partials go through DSMEM)
        return ctas, sk_tiles, None, None
    # per CTA two slots (its first and last tile) of the accumulator's fp32 values per consumer thread
    parts = torch.empty(ctas * 2 * config.acc_values * config.consumer_threads, dtype=torch.float32, device=device)
    return ctas, sk_tiles, parts, stream_k_counters(device, counter_words(config, ctas, sk_tiles), stream)


def counter_words(config: TileConfig, ctas: int, sk_tiles: int) -> int:
    """The stream-K counters a launch uses: one a stream-K tile (the fix-up's arrivals), or with
    TileConfig.fixup_groups two a CTA (its groups' and its tiles' arrivals: stream_k._fixup_groups);
    and one more."""
    return (2 * ctas if config.fixup_groups else sk_tiles) + 1


# The stream-K tile counters. Every launch leaves the counters it used at zero again (the last CTA
# of a tile resets its own: stream_k._fixup), so one zeroed buffer serves any launches that never
# overlap, e.g. those of one stream in order (a PDL launch touches them only after
# griddepcontrol.wait). Without it each launch needs a memset of its own in front of it: 1-1.5 µs,
# and a break in a chain of PDL launches (DISPATCH D19).
# - Eager launches: one buffer a (device, stream).
# - Launches captured into a CUDA graph: one buffer a (device, stream, capture), never used before,
#   so zero when the capture takes it and after every replay (a graph may replay on any stream, and
#   graphs may replay at once on two: none shares its buffer). 2 KB a capture, kept.
# Buffers are slices of slabs of driver memory (_driver_zeros) that no CUDA graph pool owns and
# that are never freed: a tensor of torch's allocator made during a capture would have to die with
# it (torch.compile's CUDA-graph trees refuse a live allocation in their pool that is not an output,
# and the caching allocator asserts when a graph's pool goes with one still allocated), and one made
# during a trees warm-up lands in the trees' pool (both seen in the GPU suite, 2026-11-28). A
# capture cannot allocate, so it takes a slice made ready by an eager launch; where none is left (a
# capture before any eager launch), a launch gets a zeroed tensor of its own, as before.
REUSE_COUNTERS = True  # False: a zeroed tensor a launch (what the A/B in benchmarks.launch_ab compares)
# one buffer's size: counter_words ≤ 2 · SMs + 1 (the hybrid's sk_tiles < 2 · SMs; fixup_groups' two words a CTA)
COUNTER_WORDS = 512
SLAB_BUFFERS = 1024  # buffers a driver allocation (2 MB)
SPARE_BUFFERS = 256  # kept ready by eager launches for the captures after them (1 a capture and stream;
#   vLLM captures a piece a layer after one warm-up of the whole model)
_EAGER_COUNTERS: dict = {}  # (device index, raw stream) → int32 [COUNTER_WORDS], zero between launches
_CAPTURE_COUNTERS: dict = {}  # (device index, raw stream, capture id) → the same, the capture under way's
_FREE: dict = {}  # device index → the never-used buffers (slices of its slabs)
_ALL_SLABS: list = []  # every slab made (all zero whenever no launch runs: what the GPU tests check)
_LOCK = threading.Lock()  # taking buffers and making slabs


def stream_k_counters(device, words: int, stream=None):
    """A zeroed int32 tensor of ``words`` tile counters for a launch on ``stream`` (torch's; None:
    the current one; above)."""
    import torch

    device = torch.device(device)
    buf = None
    if device.type == "cuda" and REUSE_COUNTERS and words <= COUNTER_WORDS:  # (else: host-side tests of launch_plan)
        buf = _kept_buffer(torch.cuda.current_stream(device) if stream is None else stream)
    return torch.zeros(words, dtype=torch.int32, device=device) if buf is None else buf[:words]


def _kept_buffer(stream):
    """The counter buffer of ``stream`` (eager) or of the capture under way on it; None where a
    capture finds no buffer left."""
    import torch

    idx = stream.device_index
    if torch.cuda.is_current_stream_capturing():
        key = (idx, stream.cuda_stream, capture_id(stream))
        if key not in _CAPTURE_COUNTERS:
            with _LOCK:  # (threads launching at once must not take the same buffer)
                for old in [old for old in _CAPTURE_COUNTERS if old[2] != key[2]]:  # (captures that are
                    del _CAPTURE_COUNTERS[old]  # over: their graphs keep their slices, which nothing takes)
                _CAPTURE_COUNTERS[key] = _take_buffer(idx, allocate=False)
        return _CAPTURE_COUNTERS[key]
    buf = _EAGER_COUNTERS.get((idx, stream.cuda_stream))
    if buf is None or len(_FREE.get(idx, ())) < SPARE_BUFFERS:
        with _LOCK:  # (a stream's first launch, or the captures since the last launch took the spares)
            if buf is None:
                buf = _EAGER_COUNTERS[(idx, stream.cuda_stream)] = _take_buffer(idx, allocate=True)
            if len(_FREE[idx]) < SPARE_BUFFERS:
                _new_slab(idx)
    return buf


def _take_buffer(idx: int, allocate: bool):
    """A never-used zeroed int32 [COUNTER_WORDS] slice of a slab of device ``idx``; when none is
    left, a new slab with ``allocate`` (outside any capture), else None."""
    free = _FREE.setdefault(idx, [])
    if not free:
        if not allocate:
            return None
        _new_slab(idx)
    return free.pop()


def _new_slab(idx: int) -> None:
    """SLAB_BUFFERS more free buffers on device ``idx``."""
    slab = _driver_zeros(idx, SLAB_BUFFERS * COUNTER_WORDS)
    _ALL_SLABS.append(slab)
    _FREE.setdefault(idx, []).extend(slab.view(SLAB_BUFFERS, COUNTER_WORDS).unbind(0)[::-1])


def capture_id(stream) -> int:
    """The id of the CUDA graph capture under way on ``stream``, unique over the process's life."""
    import cuda.bindings.driver as cu

    err, _, capture, *_ = cu.cuStreamGetCaptureInfo(cu.CUstream(stream.cuda_stream))
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuStreamGetCaptureInfo: {err}")
    return int(capture)


def _driver_zeros(idx: int, words: int):
    """An int32 tensor of ``words`` zeros on device ``idx`` in memory from cuMemAlloc (never freed)."""
    import cuda.bindings.driver as cu
    import torch

    def check(err, *out):
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"stream-K counters: CUDA driver error {err}")
        return out[0] if out else None

    class Raw:  # (what torch.as_tensor takes device memory it does not own through)
        def __init__(self, ptr: int):
            self.__cuda_array_interface__ = {"shape": (words,), "typestr": "<i4", "data": (ptr, False),
                                             "version": 3}

    with torch.cuda.device(idx):
        ptr = int(check(*cu.cuMemAlloc(words * 4)))
        check(*cu.cuMemsetD32(ptr, 0, words))
        check(*cu.cuCtxSynchronize())  # (the memset runs on the legacy stream, which torch's streams do not wait for)
        return torch.as_tensor(Raw(ptr), device=f"cuda:{idx}")


_SM_COUNT: dict = {}


def sm_count(device) -> int:
    import torch

    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def planned_sms(device) -> int | None:
    """The SMs a config for tensors on ``device`` is planned for: its GPU's (sm_count); None off a GPU (a
    CPU tensor's config: no SMs to count). The config choices that differ on and off a GPU (nvfp4's
    tiling, the wg3 tile, the static k loop, down's K clusters) ask here, the others sm_count: replacing
    the two, tests plan meta tensors as on a GPU of a given size (tests/gpu/premises.py)."""
    return sm_count(device) if device.type == "cuda" else None
