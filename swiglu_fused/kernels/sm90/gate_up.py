"""gate_up on sm_90a: h = act(x @ gate^T) · (x @ up^T) in one persistent, warp-specialized GEMM.

Operands (ground truth: reference.gate_up):

    mainloop fp8_block128   x e4m3 [M, K] + x_scale fp32 [M, ceil(K/128)]
                            weight e4m3 [2I, K] (interleave g = 128) + weight_scale fp32 [2I/128, ceil(K/128)]
    mainloop bf16           x bf16 [M, K], weight bf16 [2I, K]
    h_format fp8_group128   h e4m3 [M, I] + h_scale fp32 [M, I/128]  (s = amax/448 per row per 128 cols),
                            h_scale stored M-major (strides (1, M)): the layout both downs read,
                            ours (down.py) and cuBLAS's block-scaled GEMM (no transpose copy)
    h_format bf16           h bf16 [M, I]

The kernel is gemm256.Gemm256Kernel (mainloop, fragment layout and stores are drawn there) with
the "swiglu" epilogue: a tile of 256 packed rows = 128 gate rows + 128 up rows yields h columns
[128n, 128n+128), one fp8 scale group (for bf16 → bf16 h, where waves fit better, a tile of
224 or 192 rows: 112 or 96 h columns, granule_tile_n). This module holds its configuration, the
shipped configs, the config selection and the host launch.
Performance and accuracy measurements: benchmarks/NOTES.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from cutlass import Float32

from . import epilogue
from .gemm256 import launch
from .kernel_host import compile_kernel
from ...quant import cdiv
from .tile_config import BF16_MAINLOOP, FP8_MAINLOOP, G, MAINLOOPS, TILE_N_GRANULES, TileConfig


@dataclass(frozen=True)
class GateUpConfig(TileConfig):
    """Compile-time configuration of gate_up (the cache key; benchmarks print it)."""

    act: str = "silu"
    h_format: str = "fp8_group128"

    epilogue = "swiglu"
    residual = False

    def __post_init__(self):
        epilogue.activation(self.act)
        if self.h_format not in epilogue.H_FORMATS:
            raise ValueError(f"GateUpConfig.h_format: expected one of {epilogue.H_FORMATS}, got {self.h_format!r}")
        super().__post_init__()

    @property
    def h_fmt(self) -> epilogue.HFormat:
        """How the epilogue stores h (epilogue.h_format of h_format)."""
        return epilogue.h_format(self.h_format)

    @property
    def out_bytes(self) -> int:
        return self.h_fmt.bits // 8



# ---------------------------------------------------------------- host side


def compile_gate_up(config: GateUpConfig):
    """Compile for sm_90a (no GPU needed: fake pointers, runtime Int32 sizes)."""
    return compile_kernel(config, config.h_fmt.dtype, Float32, 4)


# Shipped configurations: what select_config can return (and what CI compile-checks).
DECODE_M = 64  # M ≤ this uses the 64-row tile
# The swap-AB tile (swap_ab.py): (tokens, stages), both mainloops. Measured (benchmarks/NOTES.md)
# against the 64-row tile: faster at M ≤ 32 on every shape (8192×3584, M = 16: fp8 26.6 vs 31.7 µs,
# bf16 50.9 vs 63.8), and at M ≤ 64 where its ceil(M/16) M tiles fit one wave of SMs (8192×3584,
# M = 64: 26.9 vs 33.2; 4096×14336, 448 tiles: 52.6 vs 47.5, so not there). 32- and 64-token swap
# tiles were no faster (the 64-token one, two warpgroups, spills): not shipped. Five stages, not the
# six that fit: 8192×3584 M = 1 / 16 (K pairs) 1.015-1.039× fp8, 1.026-1.053× bf16; 4096×14336
# M = 1-32 1.00-1.02× (ab_gate_up.py, 5 rounds, eleventh session); four were slower again.
SWAP_TILES = ((16, 5),)
# ... except where one CTA streams a K of at least SWAP_LONG_K (whole tiles, not K pairs): there six
# stages are faster, 8192×3584 M = 32 / 48 / 64 fp8 1.045-1.055×, bf16 M = 32 / 64 1.064-1.081×, while
# six are 0.95-0.99× wherever the CTA's K is 4096 or less (K pairs at 8192; 4096×14336, 2048×8192;
# ab_gate_up.py, 3 rounds, twelfth session).
SWAP_LONG_K, SWAP_LONG_K_STAGES = 8192, 6
SWAP_M = 32  # M ≤ this: the swap-AB tile
SWAP_M_ONE_WAVE = 64  # M ≤ this: the swap-AB tile if its tiles fit one wave


ONE_WAVE_64_M = 256  # M ≤ this: the 64-row tile if its tiles fit one wave (else the 128-row tile)

# The swap-AB tile splits K over cluster pairs (TileConfig.cluster_k = 2, DSMEM) where its tiles
# are at most this fraction of the SMs. fp8: 8192×3584 (28 tiles) at M = 1 / 16: 26.6 / 26.2 µs
# against 28.2 / 27.8 with whole tiles and 29.0 / 28.5 with stream-K split 2; at M = 32 (56 tiles)
# the same 26.9, at 2048×8192 (64 tiles) slower, 16.6 vs 15.8. bf16, 8192×3584 M = 1 / 16: 45.4 /
# 45.1 µs against 46.3 / 46.6, 1.02-1.05× in each of 5 rounds (benchmarks/NOTES.md, eleventh session).
CLUSTER_K_MAX_TILES = 0.25  # × SMs


def cluster_k_applies(m: int, n: int, sms: int, mainloop: str) -> bool:
    """Whether gate_up's swap-AB tile (M rows, N = 2I weight rows) runs as K halves over cluster pairs
    (either mainloop: the rule above)."""
    return _swap_tiles(m, n) <= CLUSTER_K_MAX_TILES * sms


def _swap_tiles(m: int, n: int) -> int:
    """Tiles of the swap-AB tile for M rows and N = 2I weight rows."""
    return cdiv(m, SWAP_TILES[0][0]) * cdiv(n, 2 * G)


def swap_ab_applies(m: int, n: int, sms: int) -> bool:
    """Whether gate_up with M rows and N = 2I weight rows runs the swap-AB tile."""
    return m <= SWAP_M or (m <= SWAP_M_ONE_WAVE and _swap_tiles(m, n) <= sms)


def tile_for(m: int, n: int, sms: int, mainloop: str) -> tuple[int, int, bool]:
    """(tile_m, stages, swap_ab) for M rows and N = 2I weight rows on ``sms`` SMs. Between the
    swap-AB range and M = 256 the 64-row tile wins where its tiles fit one wave, measured at
    M = 128 / 256: 8192×3584 35.4 / 41.0 µs vs 42.3 / 43.7 with the 128-row tile, 2048×8192 (M = 128)
    17.5 vs 19.6; where they do not, the 128-row tile is as fast or faster (4096×14336, M = 256:
    61.3 vs 80.3), except for fp8 up to M = 128 (split64_applies)."""
    if swap_ab_applies(m, n, sms):
        return (*SWAP_TILES[0], True)
    if m <= DECODE_M or (m <= ONE_WAVE_64_M and cdiv(m, 64) * cdiv(n, 2 * G) <= sms):
        return 64, 5, False
    if split64_applies(m, n, sms, mainloop):
        return 64, 5, False
    return 128, 4, False


# The bf16 → bf16 h 128-row tile over 112 or 96 h columns (tile_n = 224 / 192, 16-row gate/up
# granules) where whole waves of it take less time than the 256-row tile's: I = 3584 at M = 1024 has
# 224 tiles of 256 rows on 132 SMs (1.7 waves, two rounds) but 256 of 224 rows (1.94 waves, two
# rounds of 7/8 the work). Needs I % (tile_n / 2) == 0. GRANULE_MIN_GAIN: the predicted time of the
# rounds must be this much lower (measured 7-13 % faster where it is 12.5 % lower, benchmarks/NOTES.md).
GRANULE_MIN_GAIN = 0.95


def granule_tile_n(m: int, n: int, sms: int) -> int | None:
    """The granule tile_n for the 128-row bf16 → bf16 h tile of M rows and N = 2I weight rows, or
    None where the 256-row tile's rounds are as short: the width whose ⌈tiles / SMs⌉ rounds of
    tile_n / 2 h columns are shortest (the wider one on a tie)."""
    i_cols = n // 2
    grid_m = cdiv(m, 128)

    def rounds_cost(cols):
        return cdiv(grid_m * (i_cols // cols), sms) * cols

    best = None
    for tile_n in sorted(TILE_N_GRANULES, reverse=True):
        cols = tile_n // 2
        if i_cols % cols == 0 and rounds_cost(cols) < GRANULE_MIN_GAIN * rounds_cost(G):
            if best is None or rounds_cost(cols) < rounds_cost(best // 2):
                best = tile_n
    return best


# The 128 × 256 tile runs in cluster pairs (TileConfig.cluster_m = 2: the two CTAs take M-adjacent
# tiles and each loads half of the shared weight k tile, TMA-multicast to both) from this M on.
# Prefill runs at the board's power cap (700 W, clocks 1.3-1.6 GHz: benchmarks/clock_probe.py), so
# what counts is energy per tile, and multicast reads a third less from L2 per k tile. Measured
# against the same tile without clusters, interleaved rounds (benchmarks/NOTES.md, eighth
# session): 1-4 % faster at M = 4096-16384 on both shapes and mainloops (faster in 94 of 102
# rounds), level at M = 1024-2048 (where it is not dispatched).
CLUSTER_M_MIN = 4096


def cluster_m_for(m: int, tile_m: int, tile_n: int) -> int:
    """TileConfig.cluster_m for M rows on this tile: 2 for the 128 × 256 tile from CLUSTER_M_MIN on."""
    return 2 if m >= CLUSTER_M_MIN and tile_m == 128 and tile_n == 2 * G else 1


# The fp8 64-row tile runs on two consumer warpgroups, one per B half (TileConfig.split_n, 4 stages).
# Measured against the one-warpgroup tile (benchmarks/NOTES.md, eighth session, 5 interleaved
# rounds): 4096×14336 M = 64 47.4 → 46.1 µs, 2048×8192 M = 64 17.3 → 16.8; level (±1 %) at
# 8192×3584 M = 128 and 256 and 2048×8192 M = 128. h is bit-identical.
SPLIT_N_STAGES = 4

# ... and with a fifth stage where the weight has few 256-row tiles: then few distinct weight
# streams are in flight, and the stream is bound by the bytes each CTA keeps in flight. The fifth
# stage fits when the up half's accumulator is handed over in parts (TileConfig.xacc_parts: 2 with
# fp8 h, 4 with bf16 h's larger staging slab). Measured against 4 stages (benchmarks/NOTES.md,
# ninth session; 3 interleaved rounds, M = 100-256): 16-28 weight tiles (8192×2048, 4096×3584,
# 5120×3456, 8192×3584, 16384×3584) 3-5 % faster; 36 and 40 (8192×4608, 8192×5120) 1-3 %;
# 48-112 (8192×6144, 16384×6656, 8192×7168, 4096×14336, 8192×14336, 5120×13824) 1-4 % slower.
SPLIT_N_DEEP_TILES = 40


def split_n_applies(tile_m: int, swap_ab: bool, mainloop: str) -> bool:
    """TileConfig.split_n for gate_up's tile: the fp8 mainloop's 64-row tile."""
    return mainloop == FP8_MAINLOOP and tile_m == 64 and not swap_ab


def split_n_deep(n: int) -> bool:
    """Whether N = 2I weight rows have few enough 256-row tiles for the 5-stage split_n tile."""
    return cdiv(n, 2 * G) <= SPLIT_N_DEEP_TILES


def split_n_pipeline(deep: bool, h_format: str) -> dict:
    """The split_n tile's stages and xacc_parts: 4 stages, or (deep) 5 with the hand-over in parts."""
    if deep:
        return dict(stages=SPLIT_N_STAGES + 1, xacc_parts=2 if epilogue.h_format(h_format).scaled else 4)
    return dict(stages=SPLIT_N_STAGES)


# fp8, 64 < M ≤ 128 where the 128-row tiles (one M tile) fit one wave of SMs:
# the two-warpgroup 64-row tile over two M tiles instead, measured 2-4 % faster (4096×14336,
# 4096×12288 and 5120×13824 at M = 80 and 128; benchmarks/NOTES.md, eighth session). 8192×28672,
# whose 224 tiles of 128 rows already fill 1.7 waves, was 0-5 % slower with it and keeps them.
SPLIT64_M = 128


def split64_applies(m: int, n: int, sms: int, mainloop: str) -> bool:
    """Whether fp8 gate_up with M rows and N = 2I weight rows takes the 64-row tile (split_n) where
    tile_for's one-wave rule would pick the 128-row one."""
    return mainloop == FP8_MAINLOOP and m <= SPLIT64_M and cdiv(n, 2 * G) <= sms


# The 64-row tile (M ≤ 256, both mainloops) asks L2 to evict the weight k tiles first
# (TileConfig.l2_hint = "w_first"). In the MLP, gate_up follows quant_x and the previous layer's
# down, whose freshly written lines its reads of x compete with: alone, the fp8 tile ran 2 µs faster
# at 8192×3584 M = 128 than inside the pipeline (30.3 against 32.1-32.3 µs; cuBLAS's GEMM 1 µs;
# profile_mlp.py). Measured (benchmarks/NOTES.md, tenth session), h bit-identical:
# - the whole fp8 MLP (bench_mlp.py --interleave 5 --ab, three runs): 8192×3584 M = 128 / 256
#   1.04-1.05 / 1.02-1.05× faster, 4096×14336 M = 64 / 128 1.01-1.02 / 1.02×;
# - bf16 gate_up alone (ab_gate_up.py): 8192×3584 M = 128 1.09×, 4096×14336 M = 64 1.01×.
# Not dispatched: the swap-AB tile (8192×3584 M = 64, MLP 1.00, bf16 alone 0.99) and the 128-row
# tiles (MLP at M = 256-4096 from 0.99 to 1.02×, within run-to-run noise).
def l2_hint_for(tile_m: int, swap_ab: bool) -> str:
    """TileConfig.l2_hint for gate_up's tile (the rule above)."""
    return "w_first" if tile_m == 64 and not swap_ab else ""


def smem_scales_apply(tile_m: int, swap_ab: bool, mainloop: str, h_format: str) -> bool:
    """TileConfig.smem_scales for the fp8 128-row tile with fp8 h (bf16 h leaves no smem for it)."""
    return mainloop == FP8_MAINLOOP and tile_m == 128 and not swap_ab and epilogue.h_format(h_format).scaled


def shipped_configs() -> list[GateUpConfig]:
    out = []
    for mainloop in MAINLOOPS:
        for act in epilogue.ACTIVATIONS:
            for h_format in epilogue.H_FORMATS:
                tiles = [(128, 4, False, 1), (128, 4, False, 2), (64, 5, False, 1)]  # (cluster_m_for)
                tiles += [(t, s, True, 1) for t, s in SWAP_TILES] + [(SWAP_TILES[0][0], SWAP_LONG_K_STAGES, True, 1)]
                for tile_m, stages, swap, cl in tiles:
                    split = split_n_applies(tile_m, swap, mainloop)
                    for deep in (False, True) if split else (False,):  # (split_n_pipeline: 4 or 5 stages)
                        pipe = split_n_pipeline(deep, h_format) if split else dict(stages=stages)
                        out.append(GateUpConfig(tile_m=tile_m, act=act, h_format=h_format, mainloop=mainloop,
                                                swap_ab=swap, cluster_m=cl, split_n=split,
                                                l2_hint=l2_hint_for(tile_m, swap),
                                                smem_scales=smem_scales_apply(tile_m, swap, mainloop, h_format),
                                                **pipe))
                out.append(GateUpConfig(tile_m=SWAP_TILES[0][0], stages=SWAP_TILES[0][1], act=act,  # cluster_k_applies
                                        h_format=h_format, mainloop=mainloop, swap_ab=True, cluster_k=2))
                if mainloop == BF16_MAINLOOP and not epilogue.h_format(h_format).scaled:  # granule_tile_n
                    out.extend(GateUpConfig(tile_m=128, tile_n=tile_n, stages=4, act=act, h_format=h_format,
                                            mainloop=mainloop) for tile_n in TILE_N_GRANULES)
    return out


def select_config(x, weight, weight_scale, x_scale, *, act: str, h_format: str) -> GateUpConfig | None:
    """The config for these operands, or None when the sm90 kernel does not implement them."""
    import torch

    if act not in epilogue.ACTIVATIONS or h_format not in epilogue.H_FORMATS:
        return None
    if weight.dtype == torch.float8_e4m3fn and x.dtype == torch.float8_e4m3fn:
        if weight_scale is None or x_scale is None or weight_scale.dtype != torch.float32:
            return None
        mainloop = FP8_MAINLOOP
    elif weight.dtype == torch.bfloat16 and x.dtype == torch.bfloat16:
        mainloop = BF16_MAINLOOP
    else:
        return None
    if weight.shape[0] % (2 * G):
        return None
    from .schedule import sm_count

    sms = sm_count(x.device)
    tile_m, stages, swap = tile_for(x.shape[0], weight.shape[0], sms, mainloop)
    ck = 2 if swap and cluster_k_applies(x.shape[0], weight.shape[0], sms, mainloop) else 1
    if swap and ck == 1 and x.shape[1] >= SWAP_LONG_K:  # (K pairs keep five: measured at 4096 a CTA only)
        stages = SWAP_LONG_K_STAGES
    tile_n = 2 * G
    if mainloop == BF16_MAINLOOP and not epilogue.h_format(h_format).scaled and tile_m == 128:
        tile_n = granule_tile_n(x.shape[0], weight.shape[0], sms) or tile_n
    split = split_n_applies(tile_m, swap, mainloop)
    pipe = split_n_pipeline(split_n_deep(weight.shape[0]), h_format) if split else dict(stages=stages)
    return GateUpConfig(tile_m=tile_m, tile_n=tile_n, act=act, h_format=h_format, mainloop=mainloop, swap_ab=swap,
                        cluster_k=ck, cluster_m=cluster_m_for(x.shape[0], tile_m, tile_n),
                        smem_scales=smem_scales_apply(tile_m, swap, mainloop, h_format),
                        split_n=split, l2_hint=l2_hint_for(tile_m, swap), **pipe)


# The cluster pair as dispatched for fp8 x and h (tests force it at any M: padding M tiles)
CLUSTER_PAIR = GateUpConfig(tile_m=128, stages=4, cluster_m=2, smem_scales=True)


def gate_up(config: GateUpConfig, x, weight, weight_scale=None, x_scale=None, *, out=None):
    """Run the kernel (operands validated by ops.py). Returns (h, h_scale M-major or None);
    ``out`` = (h, h_scale) writes into given tensors (the tests poison them first; h_scale M-major)."""
    import torch

    from . import compile_cache

    m = x.shape[0]
    n = weight.shape[0]
    i_cols = n // 2
    if config.granules and i_cols % (config.tile_n // 2):
        raise ValueError(f"gate_up: {config} takes {config.tile_n // 2} h columns a tile, and I = {i_cols} is not a "
                         f"multiple of that; use tile_n = 256 (select_config does)")
    fmt = config.h_fmt
    if out is None:
        h = torch.empty((m, i_cols), dtype=getattr(torch, fmt.torch_dtype), device=x.device)
        hs = torch.empty((i_cols // G, m), dtype=torch.float32, device=x.device).t() if fmt.scaled else None
    else:
        h, hs = out
    if m == 0:
        return h, hs
    fn = compile_cache.get("gate_up", config, lambda: compile_gate_up(config))
    scales = (x_scale, weight_scale) if config.fp8 else (None, None)
    launch(fn, config, x, weight, *scales, h, fmt.dtype, hs if fmt.scaled else None, Float32, 4)
    return h, hs
