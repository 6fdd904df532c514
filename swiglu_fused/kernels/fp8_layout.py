"""fp8's tile-major weight layout: each kernel k tile's 32 KB contiguous (gate_up's weight, DISPATCH D38).

The packed format stores an fp8 weight row-major, [N, K] e4m3. A k tile of the sm90 kernels (256
weight rows × 128 columns, TileConfig.tile_n × tile_k) is then 256 runs of 128 bytes, K bytes
apart. Tile-major puts each k tile's bytes together:

    weight  [N/256][K/128][256 rows][128 bytes]     one 32 KB run a k tile

A Triton read of the same bytes in the kernels' access pattern is 3-10 % faster tile-major at
decode sizes on the H200; our kernels' TMA loads (`TileConfig.tile_major` on the fp8 mainloop) gain
2-5 % on gate_up alone, 1-2.5 % on the whole MLP at M <= 64, level at prefill
(benchmarks/history/mlp.md, 2026-11-29). The weight scales ([N/128, K/128] fp32, one per
128 × 128 block) keep their order.

As for nvfp4 (nvfp4_layout.py), the tensor keeps its canonical shape [N, K]; only the byte order
differs, so its owner says which order it is in (``tile_major`` of the ops; gate_up only: down's
cuBLAS and DeepGEMM read the packed order). FusedSwiGLUMLP and the vLLM plugin's MLP hold
gate_up's weight so where dispatch.fp8_tile_major says (on an sm90 GPU, whole tiles). Checkpoints
always hold the packed order. Plain torch, any device: one copy of the tensor.
"""

from __future__ import annotations

import torch

ROWS = 256  # weight rows of a k tile: the fp8 kernels' tile_n (two 128-row halves)
K_TILE = 128  # columns of a k tile: tile_config's tile_k for fp8 (one weight-scale block)


def fits(n: int, k: int) -> bool:
    """Whether an [n, k] weight has whole k tiles (the tile-major order is defined for those only)."""
    return n % ROWS == 0 and k % K_TILE == 0


def _check(weight: torch.Tensor) -> tuple[int, int]:
    if weight.dtype != torch.float8_e4m3fn or weight.dim() != 2:
        raise ValueError(f"weight: expected a 2-D float8_e4m3fn tensor, got {weight.dtype} of shape "
                         f"{tuple(weight.shape)}")
    n, k = weight.shape
    if not fits(n, k):
        raise ValueError(f"weight: the tile-major order needs N a multiple of {ROWS} and K of {K_TILE}, "
                         f"got [{n}, {k}]")
    return n, k


def to_tile_major(weight: torch.Tensor) -> torch.Tensor:
    """A packed-order fp8 weight [N, K] → the same shape, bytes in k-tile order (a new tensor)."""
    n, k = _check(weight)
    tiles = weight.contiguous().view(torch.uint8).view(n // ROWS, ROWS, k // K_TILE, K_TILE)
    return tiles.permute(0, 2, 1, 3).contiguous().view(n, k).view(torch.float8_e4m3fn)


def from_tile_major(weight: torch.Tensor) -> torch.Tensor:
    """The inverse of to_tile_major (a new tensor in the packed order)."""
    n, k = _check(weight)
    tiles = weight.contiguous().view(torch.uint8).view(n // ROWS, k // K_TILE, ROWS, K_TILE)
    return tiles.permute(0, 2, 1, 3).contiguous().view(n, k).view(torch.float8_e4m3fn)
