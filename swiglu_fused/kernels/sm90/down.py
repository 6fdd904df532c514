"""down on sm_90a: y = h @ W_down^T (+ residual), bf16, in the gate_up GEMM with its "linear" epilogue.

Operands (ground truth: reference.down):

    mainloop fp8_block128   h e4m3 [M, I] + h_scale fp32 [M, I/128]   (what gate_up writes: M-major,
                                                                     strides (1, M); other layouts copied)
                            weight e4m3 [H, I] + weight_scale fp32 [ceil(H/128), I/128]
    mainloop bf16           h bf16 [M, I], weight bf16 [H, I]
    residual                bf16 [M, H] or none (compile-time: DownConfig.residual)
    y                       bf16 [M, H]

The kernel is gemm256.Gemm256Kernel: a tile of 256 weight rows (two 128-row blocks, each with its
own 128×128 scale) is output columns [256n, 256n+256). H needs only be a multiple of 8 (16-byte
output rows): the last tile's weight rows ≥ H are TMA zero-fill, its scale rows are clamped to
ceil(H/128) - 1, and the stores skip columns ≥ H. The residual is added in fp32 before the single
rounding to bf16 (as reference.down does).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import cutlass

from .gemm256 import launch
from .kernel_host import compile_kernel
from ...quant import cdiv
from .tile_config import BF16_MAINLOOP, FP8_MAINLOOP, MAINLOOPS, N_ALIGN, TileConfig


@dataclass(frozen=True)
class DownConfig(TileConfig):
    """Compile-time configuration of down (the cache key; benchmarks print it)."""

    residual: bool = False  # y = h @ W^T + residual

    epilogue = "linear"
    out_bytes = 2  # bf16 y


def compile_down(config: DownConfig):
    """Compile for sm_90a (no GPU needed: fake pointers, runtime Int32 sizes)."""
    return compile_kernel(config, cutlass.BFloat16, cutlass.BFloat16, 16)


# Shipped configurations: what select_config can return (and what CI compile-checks).
# The fp8 swap-AB tile (swap_ab.py): (tokens, stages), for M ≤ SWAP_M. Measured faster than cuBLAS
# and than the 64-row tile at M = 1–64 on every shape (e.g. M = 64: 4096×14336 30.6 vs cuBLAS 42.2
# µs, 8192×3584 15.0 vs 17.4; benchmarks/NOTES.md).
SWAP_TILES = ((16, 6),)
SWAP_M = 64


def swap_ab_applies(m: int, n: int = 0, sms: int = 0) -> bool:
    """Whether down with M rows runs the swap-AB tile (fp8)."""
    return m <= SWAP_M


ROWS_64 = 128  # M ≤ this (above the swap-AB range): the 64-row tile


def cluster_k_applies(config: DownConfig, m: int, n: int, k: int, sms: int) -> bool:
    """Whether the fp8 swap-AB tile runs its K halves over cluster pairs (TileConfig.cluster_k = 2,
    DSMEM) instead of the stream-K split 2 that plan() picks, with few tiles (≤ 0.25 × SMs, as
    gate_up.cluster_k_applies): 4096×14336 at M = 1 / 16 (16 tiles), 26.4 / 27.6 µs against 28.6 /
    30.1 (the same split, without global partials and their memset); at M = 64 (64 tiles) slower,
    38.5 vs 32.3. Other splits (and whole tiles, 8192×3584: 15.0 vs 14.9) keep plan()'s schedule
    (benchmarks/NOTES.md)."""
    from .schedule import schedule

    if not (config.swap_ab and config.fp8):
        return False
    ctas, sk_tiles = schedule(config, m, n, k, sms)
    return 0 < sk_tiles <= 0.25 * sms and ctas == 2 * sk_tiles


def tile_for(m: int, mainloop: str) -> tuple[int, int, bool]:
    """(tile_m, stages, swap_ab) for M rows."""
    if mainloop == FP8_MAINLOOP and swap_ab_applies(m):
        return (*SWAP_TILES[0], True)
    return (64, 5, False) if m <= ROWS_64 else (128, 4, False)


# The fp8 64-row tile asks L2 to evict the weight k tiles first (TileConfig.l2_hint = "w_first"), as
# gate_up's 64-row tile does: h was just written by gate_up and every CTA reads it. Measured in the
# whole MLP (bench_mlp.py --interleave 7 --ab, benchmarks/NOTES.md, tenth session) at 4096×14336
# M = 128, where this tile runs (stream-K): 86.7 → 81.8 µs, 1.035-1.063 in each of 7 rounds (1.034 on
# an H200). The swap-AB tile was level; bf16 down and the 128-row tile were not measured with it.
def l2_hint_for(tile_m: int, swap_ab: bool, mainloop: str) -> str:
    """TileConfig.l2_hint for down's tile (the rule above)."""
    return "w_first" if tile_m == 64 and not swap_ab and mainloop == FP8_MAINLOOP else ""


def shipped_configs() -> list[DownConfig]:
    return [
        DownConfig(tile_m=tile_m, stages=stages, mainloop=mainloop, residual=residual, swap_ab=swap,
                   l2_hint=l2_hint_for(tile_m, swap, mainloop))
        for mainloop in MAINLOOPS
        for residual in (False, True)
        for tile_m, stages, swap in [(128, 4, False), (64, 5, False)]
        + ([(t, s, True) for t, s in SWAP_TILES] if mainloop == FP8_MAINLOOP else [])
    ] + [DownConfig(tile_m=SWAP_TILES[0][0], stages=SWAP_TILES[0][1], residual=residual, swap_ab=True, cluster_k=2)
         for residual in (False, True)]  # cluster_k_applies


def select_config(h, weight, weight_scale, h_scale, residual, out_dtype) -> DownConfig | None:
    """The config for these operands, or None when the sm90 kernel does not implement them
    (then ops.down uses cuBLAS or the reference)."""
    import torch

    fp8 = torch.float8_e4m3fn
    if out_dtype != torch.bfloat16:
        return None
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
    tile_m, stages, swap = tile_for(h.shape[0], mainloop)
    cfg = DownConfig(tile_m=tile_m, stages=stages, mainloop=mainloop, residual=residual is not None, swap_ab=swap,
                     l2_hint=l2_hint_for(tile_m, swap, mainloop))
    if h.is_cuda:
        from .schedule import sm_count

        if cluster_k_applies(cfg, h.shape[0], weight.shape[0], h.shape[1], sm_count(h.device)):
            return dataclasses.replace(cfg, cluster_k=2)
    return cfg


# Where cuBLAS's block-scaled GEMM takes a shape, it is measured against the kernel with both
# reading h_scale M-major, as gate_up writes it (earlier measurements charged cuBLAS a transpose
# copy of the scales and favoured the kernel). Medians of 5 interleaved rounds, operands rotated
# past L2 (bench_down.py --rounds 5, benchmarks/NOTES.md), cuBLAS / kernel time:
#   4096×14336  M = 16: 1.04, 64: 1.27, 128: 1.14 (the kernel's stream-K shares K = 14336 out);
#               256: 0.85, 1024: 0.81-0.91, 4096: 0.89-0.94
#   8192×3584   M = 1: 1.50 (cuBLAS takes no M = 1: cublas.py pads h to 16 rows), 16: 1.00, 64: 0.97,
#               128: 0.88 (whole tiles: K = 3584 is too short to share); 256: 0.58,
#               1024: 0.92-0.96, 4096: 0.90-0.96
# So fp8 runs the kernel with the swap-AB tile (M ≤ 64: at most 3 % slower, and much faster where
# cuBLAS would pad M), with the 64-row tile where stream-K shares K out, and cuBLAS elsewhere.
# bf16 (whose peer, torch.mm, never paid a scale copy) keeps the rule of its 2026-11-22
# measurements: the kernel from MIN_WAVE of a wave of tiles up to MAX_M (M = 1024: 1.04 / 1.26×
# cuBLAS at 4096×14336 / 8192×3584), and the 64-row tile where stream-K shares K out.
MIN_WAVE = 0.9
MAX_M = 4096


def fills_gpu(config: DownConfig, m: int, n: int, sms: int) -> bool:
    """Whether the kernel's ceil(M/tile_m) · ceil(H/256) tiles fill at least MIN_WAVE of the SMs."""
    tiles = cdiv(m, config.tile_m) * cdiv(n, config.tile_n)
    return tiles >= MIN_WAVE * sms


def beats_cublas(config: DownConfig, m: int, n: int, k: int, sms: int) -> bool:
    """Where the kernel was measured faster than cuBLAS (the table above)."""
    from .schedule import schedule

    shares_k = config.tile_m == 64 and schedule(config, m, n, k, sms)[1] > 0
    if config.fp8:
        return config.swap_ab or shares_k
    return (fills_gpu(config, m, n, sms) and m <= MAX_M) or shares_k


def down(config: DownConfig, h, weight, weight_scale=None, h_scale=None, residual=None, *, out=None):
    """Run the kernel (operands validated by ops.py). Returns y bf16 [M, H]; ``out`` = y writes
    into a given tensor (the tests poison it first)."""
    import torch

    from . import compile_cache

    m = h.shape[0]
    n = weight.shape[0]
    if (residual is not None) != config.residual:
        raise ValueError(f"residual: {config} was compiled {'with' if config.residual else 'without'} a residual")
    y = torch.empty((m, n), dtype=torch.bfloat16, device=h.device) if out is None else out
    if m == 0:
        return y
    fn = compile_cache.get("down", config, lambda: compile_down(config))
    if config.fp8:  # the kernel reads h_scale M-major: gate_up's is already (a view), others are copied
        from ...quant import m_major

        h_scale = m_major(h_scale)
    scales = (h_scale, weight_scale) if config.fp8 else (None, None)
    launch(fn, config, h, weight, *scales, y, cutlass.BFloat16, residual if config.residual else None,
           cutlass.BFloat16, 16)
    return y
