"""Tile scheduling of the sm_90a GEMM (gemm.py): whole tiles or stream-K, the band order of
M tiles, and the per-launch plan (grid, stream-K workspace). The integer formulas run both in the
kernel (Int32) and on the host (int, tests)."""

from __future__ import annotations

import cutlass

from ...quant import cdiv
from .tile_config import ACC_VALUES, TileConfig


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
         iter_us: float = ITER_US[64], max_sk_grid_m: int = 2) -> tuple[int, int]:
    """(grid, sk_tiles) for ``tiles`` output tiles (``grid_m`` of them along M, sharing weight
    tiles) of ``k_tiles`` k tiles, each reading ``iter_bytes`` of weights in ``iter_us`` per CTA:
    whole tiles (sk_tiles = 0), or all tiles stream-K split ``split`` ways. Stream-K is considered
    only while weights dominate (grid_m ≤ max_sk_grid_m: 2 for the 64/128-row tiles, since with
    more M tiles CTAs on different K ranges no longer share weight tiles in L2 (DISPATCH D19); 4
    for the 16-token swap-AB tile, i.e. M ≤ 64), with about the CTAs that keep HBM busy, and only
    where the cost model predicts SK_MIN_GAIN."""
    whole = (max(1, min(tiles, sms)), 0)
    if tiles <= 0 or grid_m > max_sk_grid_m or k_tiles < 2 * SK_MIN_ITERS:
        return whole
    t_hbm = tiles // grid_m * k_tiles * iter_bytes / HBM_BYTES_PER_US  # each weight byte read once
    t_whole = max(cdiv(tiles, sms) * k_tiles * iter_us, t_hbm)
    hbm_ctas = HBM_BYTES_PER_US * iter_us / iter_bytes * grid_m
    split = int(min(cdiv(hbm_ctas, tiles), k_tiles // SK_MIN_ITERS, sms // tiles))
    if split < 2:
        return whole
    t_sk = max(cdiv(k_tiles, split) * iter_us, t_hbm) + FIXUP_US[0] + FIXUP_US[1] * split
    return (tiles * split, tiles) if t_whole > SK_MIN_GAIN * t_sk else whole


def schedule(config: TileConfig, m: int, n: int, k: int, sms: int) -> tuple[int, int]:
    """plan() for this config and problem: (ctas, sk_tiles); clusters: whole tiles, cluster pairs."""
    cl = config.cluster_m
    grid_m = cdiv(m, config.tile_m * cl) * cl
    tiles = grid_m * cdiv(n, config.tile_n)
    if config.whole_tiles:  # (their epilogues have no stream-K fix-up)
        return max(1, min(tiles, sms)), 0
    if cl > 1:
        return max(cl, min(tiles, sms) // cl * cl), 0
    if config.cluster_k > 1:  # every tile split over the CTAs of a cluster; one tile per cluster
        ck = config.cluster_k
        if ck * tiles > sms:
            raise ValueError(f"{config}: cluster_k = {ck} needs {ck} · tiles ≤ {sms} SMs, got {tiles} tiles (M = {m})")
        return ck * tiles, tiles
    iter_bytes = config.w_stage_bytes
    if config.nvfp4:
        iter_us = ITER_US["nvfp4"]
    else:
        iter_us = ITER_US[f"swap{config.tile_m}" if config.swap_ab else config.tile_m] * iter_bytes / 32768
    return plan(tiles, cdiv(k, config.tile_k), sms, grid_m, iter_bytes, iter_us,
                max_sk_grid_m=_max_sk_grid_m(config))


def _max_sk_grid_m(config: TileConfig) -> int:
    """M tiles up to which plan() considers stream-K: 2 for the 64/128-row tiles, M ≤ 64 for the
    16/64-token swap-AB tiles; 8 (every M it runs at) for nvfp4's 128-token swap-AB tile, whose k
    tiles are bound by the decode, not the weight bytes (DISPATCH D31: down at M = 512 had 64 whole
    tiles for 132 SMs)."""
    if config.swap_ab:
        return 64 // config.tile_m if config.tile_m < 128 else 8
    return 2


def launch_plan(config: TileConfig, m: int, n: int, k: int, device):
    """(ctas, sk_tiles, partials, counters) for one launch. Both are allocated per call, so no two
    launches (concurrent streams, CUDA graphs) ever share them: the partials cost nothing to
    allocate, the zeroed counters one small memset (DISPATCH D19). The kernel
    leaves its counters at zero again, which would let a cached tensor be reused safely on one
    stream (tried in the twenty-second session: 1-5 % on the nvfp4 MLP at decode, but the GPU suite
    then failed in an order-dependent way that was not explained; history/mlp.md)."""
    import torch

    ctas, sk_tiles = schedule(config, m, n, k, sm_count(device))
    if sk_tiles == 0 or config.cluster_k > 1:  # (cluster_k: the partials go through DSMEM)
        return ctas, sk_tiles, None, None
    # per CTA two slots (its first and last tile) of 128 fp32 per consumer thread
    parts = torch.empty(ctas * 2 * ACC_VALUES * config.consumer_threads, dtype=torch.float32, device=device)
    ctr = torch.zeros(sk_tiles + 1, dtype=torch.int32, device=device)
    return ctas, sk_tiles, parts, ctr


_SM_COUNT: dict = {}


def sm_count(device) -> int:
    import torch

    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]
