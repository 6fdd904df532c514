"""Interleave gate and up rows into the packed gate_up matrix, and back (formats.py draws the layout).

Everything here moves rows only, so it is exact for any dtype (bf16, e4m3, packed e2m1 bytes)
and for row-aligned side tensors (NVFP4's per-16 scales, whose rows are the weight's rows).
FP8 block scales are per 128 rows, so they move in blocks of g/128 rows: g must be a multiple
of 128, which keeps every 128×128 weight block whole and makes FP8 repacking bit-exact.
"""

from __future__ import annotations

import torch

from .formats import FP8_BLOCK, FormatError, WeightFormat


def _check(gate: torch.Tensor, up: torch.Tensor, g: int, unit: int = 1) -> int:
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise FormatError(
            f"gate and up must have the same shape and dtype; got gate {list(gate.shape)} {gate.dtype}, "
            f"up {list(up.shape)} {up.dtype}")
    rows = gate.shape[0]
    if g < 1 or g % unit or (rows * unit) % g:
        raise FormatError(f"interleave {g} must be a positive multiple of {unit} dividing I = {rows * unit}")
    return g // unit


def interleave_rows(gate: torch.Tensor, up: torch.Tensor, g: int) -> torch.Tensor:
    """gate, up [I, ...] → packed [2I, ...]: per chunk j, gate rows [jg, (j+1)g) then up rows."""
    _check(gate, up, g)
    rest = gate.shape[1:]
    return torch.stack([gate.reshape(-1, g, *rest), up.reshape(-1, g, *rest)], dim=1).reshape(-1, *rest)


def deinterleave_rows(packed: torch.Tensor, g: int) -> tuple[torch.Tensor, torch.Tensor]:
    """packed [2I, ...] → (gate [I, ...], up [I, ...]); the exact inverse of ``interleave_rows``."""
    rows = packed.shape[0]
    if rows % (2 * g):
        raise FormatError(f"packed gate_up has {rows} rows, not a multiple of 2·interleave = {2 * g}")
    rest = packed.shape[1:]
    chunks = packed.reshape(-1, 2, g, *rest)
    return chunks[:, 0].reshape(-1, *rest).contiguous(), chunks[:, 1].reshape(-1, *rest).contiguous()


def interleave_block_scales(gate_s: torch.Tensor, up_s: torch.Tensor, g: int) -> torch.Tensor:
    """FP8 block-scale grids [I/128, Kb] → [2I/128, Kb]; each 128-row block moves with its rows."""
    if g % FP8_BLOCK:
        raise FormatError(f"interleave {g} must be a multiple of {FP8_BLOCK} to keep FP8 128x128 blocks whole")
    _check(gate_s, up_s, g, FP8_BLOCK)
    return interleave_rows(gate_s, up_s, g // FP8_BLOCK)


def deinterleave_block_scales(packed_s: torch.Tensor, g: int) -> tuple[torch.Tensor, torch.Tensor]:
    if g % FP8_BLOCK:
        raise FormatError(f"interleave {g} must be a multiple of {FP8_BLOCK} to keep FP8 128x128 blocks whole")
    return deinterleave_rows(packed_s, g // FP8_BLOCK)


def split_halves(fused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A [gate; up] fused projection (Phi-3, Flux.2) → its two halves."""
    if fused.shape[0] % 2:
        raise FormatError(f"a fused [gate; up] projection needs an even row count, found {fused.shape[0]}")
    half = fused.shape[0] // 2
    return fused[:half], fused[half:]


def h_column_order(intermediate: int, g: int) -> torch.Tensor:
    """For each column of h, the intermediate index it holds: gate_up tile j writes columns
    [jg, (j+1)g) from packed rows [2jg, 2jg+g) (gate) and [2jg+g, 2(j+1)g) (up), so the
    order is the identity — down_proj is never permuted. Tests check this against the packing."""
    packed_idx = interleave_rows(torch.arange(intermediate), torch.arange(intermediate), g)
    chunks = packed_idx.view(-1, 2, g)
    return chunks[:, 0].reshape(-1)


def pack_gate_up(gate: dict[str, torch.Tensor], up: dict[str, torch.Tensor], g: int, fmt: WeightFormat,
                 ) -> dict[str, torch.Tensor]:
    """Gate's and up's tensors in format ``fmt`` (by suffix) → the packed gate_up tensors: row
    tensors interleaved, block scales in blocks of ``fmt.scale_rows`` rows, the per-tensor scales
    side by side ([2]: gate, up)."""
    out = {}
    for suffix, gt in gate.items():
        ut = up[suffix]
        if suffix == fmt.global_scale_name:
            out[suffix] = torch.cat([gt.reshape(1), ut.reshape(1)]).float()
        elif suffix == fmt.scale_name and fmt.scale_rows > 1:
            out[suffix] = interleave_block_scales(gt, ut, g)
        else:
            out[suffix] = interleave_rows(gt, ut, g)
    return out


def unpack_gate_up(tensors: dict[str, torch.Tensor], g: int, fmt: WeightFormat,
                   ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The inverse of ``pack_gate_up``: packed gate_up tensors → gate's and up's."""
    gate, up = {}, {}
    for suffix, t in tensors.items():
        if suffix == fmt.global_scale_name:
            gate[suffix], up[suffix] = t[0:1], t[1:2]
        elif suffix == fmt.scale_name and fmt.scale_rows > 1:
            gate[suffix], up[suffix] = deinterleave_block_scales(t, g)
        else:
            gate[suffix], up[suffix] = deinterleave_rows(t, g)
    return gate, up
