"""nvfp4's tile-major weight layout (DESIGN §3.3): the order the W4A16 kernels read fastest.

The packed format stores an nvfp4 weight row-major: ``weight_packed`` [N, K/2] (two e2m1 codes a
byte) and ``weight_scale`` [N, K/16] (e4m3). A kernel k tile (256 weight rows × 64 columns) is then
256 pieces of 32 bytes, K/2 bytes apart, and its scales 256 words of 4 bytes; the TMA engine and the
scale loads stream such short runs at ~1.8 TB/s against ~2.4 for long ones
(benchmarks/history/nvfp4.md, v10). Tile-major puts each k tile's bytes together:

    codes   [N/256][K/64][256 rows][32 bytes]     one 8 KB run a k tile
    scales  [N/256][K/64][256 rows][4 e4m3]       one 1 KB run (a row's four scales: one word)

and each 32-bit word of codes (8 columns) has its bits in the decode's order (PAIR_SHIFTS below),
so that the kernels build the word's four bf16 pairs in 11 integer ops instead of 21.

The tensors keep their canonical shapes ([N, K/2] and [N, K/16]); only the byte and bit order
differs. So a tensor does not say which order it is in: its owner does
(layer._PackedProjection.tile_major) and passes ``tile_major`` to the ops. The modules reorder
once, when the weight lands on a GPU whose kernels read it (``fits`` and
dispatch.sm90_kernels_usable), and give the packed order back in state_dict and on the CPU;
checkpoints always hold the packed order.

Plain torch, any device: a reorder is one copy of the tensor (the old one is freed by its owner),
its bits then moved in place a few million words at a time.
"""

from __future__ import annotations

import torch

ROWS = 256  # weight rows of a tile: the W4A16 kernels' tile_n (two 128-row halves)
K_TILE = 64  # columns of a k tile: tile_config.NVFP4_K_ALIGN (a row's four e4m3 scales, one word)
_BYTES = K_TILE // 2  # code bytes of a row in a k tile
_SCALES = K_TILE // 16  # e4m3 scales of a row in a k tile

# The decode's bit order. The kernels turn a word of 8 codes into four bf16 pairs (columns 2j and
# 2j + 1, the even one in the low half), each code's sign at bit 15 and its three magnitude bits
# (e1 e0 m) at 8..6 of its half: the bf16 code · 2^-126, times the scale by one fma
# (ptx.e2m1x8_to_bf16x2x4). From the packed order's nibbles that placement takes five integer ops
# a pair. A tile-major word holds its bits so that pair j is
#     (word << s_j) & 0x80008000  |  (word << m_j) & 0x01C001C0        (s_j, m_j) = PAIR_SHIFTS[j]
# (a negative shift goes right; a field never crosses between the halves), one mask where
# s_j = m_j: 11 integer ops a word, and 4 of them left shifts, which ptxas may issue as IMAD.SHL on
# the FMA pipe beside the ALU pipe's masks. (Searched: no order makes every pair one masked shift
# or rotation, and none takes fewer than 11 ops.)
PAIR_SHIFTS = ((0, 0), (1, 3), (2, -4), (6, 6))  # (sign, magnitude) left shifts of pair j
SIGN_MASK, MAGNITUDE_MASK = 0x80008000, 0x01C001C0


def _decode_order() -> list[int]:
    """new_bit[b]: where bit b of a packed-order word (nibble i = column i, bit 3 its sign) goes."""
    new_bit = [0] * 32
    for j, (s, m) in enumerate(PAIR_SHIFTS):
        for half in range(2):  # column 2j + half: nibble 2j + half of the packed word
            old, at = 8 * j + 4 * half, 16 * half
            new_bit[old + 3] = at + 15 - s
            for i in range(3):
                new_bit[old + i] = at + 6 + i - m
    assert sorted(new_bit) == list(range(32)) and all(
        (nb >= 16) == (b % 8 >= 4) for b, nb in enumerate(new_bit)), "PAIR_SHIFTS must place every bit once"
    return new_bit


_NEW_BIT = _decode_order()
_OLD_BIT = [_NEW_BIT.index(b) for b in range(32)]


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
    w = _copy(weight.reshape(n // ROWS, ROWS, kt, _BYTES).transpose(1, 2)).view(weight.shape)
    s = _copy(weight_scale.reshape(n // ROWS, ROWS, kt, _SCALES).transpose(1, 2)).view(weight_scale.shape)
    _move_bits_(w, _NEW_BIT)
    return w, s


def to_packed(weight: torch.Tensor, weight_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tile-major weight and scales → new tensors in the packed format's row-major order."""
    n, kt = _check(weight, weight_scale, "weight")
    w = _copy(weight.reshape(n // ROWS, kt, ROWS, _BYTES).transpose(1, 2)).view(weight.shape)
    s = _copy(weight_scale.reshape(n // ROWS, kt, ROWS, _SCALES).transpose(1, 2)).view(weight_scale.shape)
    _move_bits_(w, _OLD_BIT)
    return w, s


def _copy(t: torch.Tensor) -> torch.Tensor:
    """A new contiguous tensor (``contiguous()`` would return ``t`` itself where one tile spans K)."""
    return t.clone(memory_format=torch.contiguous_format)


def _move_bits_(codes: torch.Tensor, new_bit: list[int], chunk: int = 1 << 22) -> None:
    """Move bit b of every 32-bit word of ``codes`` (contiguous uint8, rows of whole words) to
    new_bit[b], in place, ``chunk`` words at a time (a few such temporaries at once)."""
    masks: dict[int, int] = {}  # left rotation → the bits that take it
    for b, nb in enumerate(new_bit):
        masks[(nb - b) % 32] = masks.get((nb - b) % 32, 0) | 1 << b
    words = codes.view(-1).view(torch.int32)
    for lo in range(0, words.numel(), chunk):
        part = words[lo:lo + chunk]
        out = torch.zeros_like(part)
        for rot, mask in masks.items():
            out |= _rotl(part & _i32(mask), rot)
        part.copy_(out)


def _i32(v: int) -> int:
    return v - (1 << 32) if v >= 1 << 31 else v


def _rotl(t: torch.Tensor, r: int) -> torch.Tensor:
    """int32 words rotated left by r (a logical right shift: the arithmetic one's sign bits masked off)."""
    return t if r == 0 else (t << r) | ((t >> (32 - r)) & ((1 << r) - 1))


def rs_k_order(x: torch.Tensor) -> torch.Tensor:
    """Activations [..., K] (K % 64 == 0) → a new contiguous tensor with each 64-column k tile's
    columns in the order of the register-sourced decode (TileConfig.rs_decode): position 16j + 8c +
    2q + e holds column 16q + 8c + 2j + e (q, j = 0-3; c, e = 0-1), i.e. the 16-column scale group
    and the column pair inside an 8-column word trade places. Its own inverse."""
    k = x.shape[-1]
    if k % K_TILE:
        raise ValueError(f"x: the register-sourced decode's k order needs K a multiple of {K_TILE}, got {k}")
    if x.element_size() == 2 and x.is_contiguous():  # a pair of columns as one 4-byte element: a faster copy
        w = x.view(torch.int32)
        return _copy(w.reshape(*w.shape[:-1], k // K_TILE, 4, 2, 4).transpose(-3, -1)).view(x.dtype).view(x.shape)
    return _copy(x.reshape(*x.shape[:-1], k // K_TILE, 4, 2, 4, 2).transpose(-4, -2)).view(x.shape)


def reorder_in_place(weight: torch.Tensor, weight_scale: torch.Tensor, tile_major: bool) -> None:
    """Rewrite contiguous ``weight`` and ``weight_scale`` into tile-major order (or back to the packed
    one), keeping the tensors themselves (vLLM's parameters: its loader and graphs hold them); the
    new order passes through one temporary copy."""
    if not (weight.is_contiguous() and weight_scale.is_contiguous()):
        raise ValueError("weight, weight_scale: an in-place reorder needs contiguous tensors")
    w, s = (to_tile_major if tile_major else to_packed)(weight, weight_scale)
    weight.copy_(w)
    weight_scale.copy_(s)
