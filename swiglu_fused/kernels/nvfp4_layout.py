"""nvfp4's tile-major weight layout (DESIGN §3.3): the order the W4A16 kernels read fastest.

The packed format stores an nvfp4 weight row-major: ``weight_packed`` [N, K/2] (two e2m1 codes a
byte) and ``weight_scale`` [N, K/16] (e4m3). A kernel k tile (256 weight rows × 64 columns) is then
256 pieces of 32 bytes, K/2 bytes apart, and its scales 256 words of 4 bytes; the TMA engine and the
scale loads stream such short runs at ~1.8 TB/s against ~2.4 for long ones
(benchmarks/history/nvfp4.md, v10). Tile-major puts each k tile's bytes together:

    codes   [N/256][K/64][256 rows][32 bytes]     one 8 KB run a k tile
    scales  [N/256][K/64][256 rows][4 e4m3]       one 1 KB run (a row's four scales: one word)

The tensors keep their canonical shapes ([N, K/2] and [N, K/16]); only the byte order differs. So a
tensor does not say which order it is in: its owner does (layer._PackedProjection.tile_major) and
passes ``tile_major`` to the ops. The modules reorder once, when the weight lands on a GPU whose
kernels read it (``fits`` and dispatch.sm90_kernels_usable), and give the packed order back in
state_dict and on the CPU; checkpoints always hold the packed order.

Plain torch, any device: a reorder is one copy of the tensor (the old one is freed by its owner).
"""

from __future__ import annotations

import torch

ROWS = 256  # weight rows of a tile: the W4A16 kernels' tile_n (two 128-row halves)
K_TILE = 64  # columns of a k tile: tile_config.NVFP4_K_ALIGN (a row's four e4m3 scales, one word)
_BYTES = K_TILE // 2  # code bytes of a row in a k tile
_SCALES = K_TILE // 16  # e4m3 scales of a row in a k tile


def fits(rows: int, cols: int) -> bool:
    """Whether a weight of ``rows`` × ``cols`` (K, in values) has whole tiles: tile-major needs them."""
    return rows > 0 and cols > 0 and rows % ROWS == 0 and cols % K_TILE == 0


def _check(weight: torch.Tensor, weight_scale: torch.Tensor, name: str) -> tuple[int, int]:
    n, kh = weight.shape
    if weight.dtype != torch.uint8 or not fits(n, 2 * kh):
        raise ValueError(f"{name}: the tile-major layout is an nvfp4 weight's (uint8 [N, K/2]) with N a multiple "
                         f"of {ROWS} and K of {K_TILE}; got {weight.dtype} {list(weight.shape)}")
    if tuple(weight_scale.shape) != (n, 2 * kh // 16) or weight_scale.element_size() != 1:
        raise ValueError(f"weight_scale: expected the e4m3 scales [{n}, {2 * kh // 16}] of weight "
                         f"{list(weight.shape)}, got {weight_scale.dtype} {list(weight_scale.shape)}")
    return n, 2 * kh // K_TILE


def to_tile_major(weight: torch.Tensor, weight_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed-order weight [N, K/2] and scales [N, K/16] → new tensors in tile-major order (same
    shapes, dtypes and device)."""
    n, kt = _check(weight, weight_scale, "weight")
    w = weight.reshape(n // ROWS, ROWS, kt, _BYTES).transpose(1, 2).contiguous().view(weight.shape)
    s = weight_scale.reshape(n // ROWS, ROWS, kt, _SCALES).transpose(1, 2).contiguous().view(weight_scale.shape)
    return w, s


def to_packed(weight: torch.Tensor, weight_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tile-major weight and scales → new tensors in the packed format's row-major order."""
    n, kt = _check(weight, weight_scale, "weight")
    w = weight.reshape(n // ROWS, kt, ROWS, _BYTES).transpose(1, 2).contiguous().view(weight.shape)
    s = weight_scale.reshape(n // ROWS, kt, ROWS, _SCALES).transpose(1, 2).contiguous().view(weight_scale.shape)
    return w, s


def reorder_in_place(weight: torch.Tensor, weight_scale: torch.Tensor, tile_major: bool) -> None:
    """Rewrite contiguous ``weight`` and ``weight_scale`` into tile-major order (or back to the packed
    one), keeping the tensors themselves (vLLM's parameters: its loader and graphs hold them); the
    new order passes through one temporary copy."""
    if not (weight.is_contiguous() and weight_scale.is_contiguous()):
        raise ValueError("weight, weight_scale: an in-place reorder needs contiguous tensors")
    w, s = (to_tile_major if tile_major else to_packed)(weight, weight_scale)
    weight.copy_(w)
    weight_scale.copy_(s)
