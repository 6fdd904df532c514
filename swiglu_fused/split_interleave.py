"""Pack a split projection ("plain prefix + pairs", formats.py) and back: rows only, so exact.

    source rows                                  packed rows (formats.SPLIT)
    [0, P)        prefix (Q; K; V)      ──────►  [0, P)       prefix, unchanged
    [P, P+I)      gate                  ─┐       [P, P+2I)    gate/up interleaved in g-chunks
    [P+I, P+2I)   up                    ─┴─────►               (interleave.pack_gate_up)

Per-tensor scales (nvfp4) go side by side as [3]: (prefix, gate, up). FP8 block scales move with
their 128-row blocks, so P must be a multiple of 128 (formats.split_shape_problem).
"""

from __future__ import annotations

import torch

from . import formats
from .formats import FormatError, WeightFormat
from .interleave import pack_gate_up, unpack_gate_up


def _scale_rows(fmt: WeightFormat, suffix: str) -> int:
    """Weight rows per row of tensor ``suffix`` (128 for fp8 block scales, else 1)."""
    return fmt.scale_rows if suffix == fmt.scale_name else 1


def pack_split(prefix: dict[str, torch.Tensor], gate: dict[str, torch.Tensor], up: dict[str, torch.Tensor],
               g: int, fmt: WeightFormat) -> dict[str, torch.Tensor]:
    """The prefix's, gate's and up's tensors in format ``fmt`` (by suffix) → the packed tensors."""
    pairs = pack_gate_up(gate, up, g, fmt)
    out = {}
    for suffix, p in prefix.items():
        if suffix == fmt.global_scale_name:
            out[suffix] = torch.cat([p.reshape(1).float(), pairs[suffix].float()])
            continue
        rows = p.shape[0] * _scale_rows(fmt, suffix)
        if rows % fmt.scale_rows:  # (only the weight's row count can be off; checked once)
            raise FormatError(f"prefix of {rows} rows: {fmt.name} needs a multiple of {fmt.scale_rows}")
        out[suffix] = torch.cat([p, pairs[suffix]])
    return out


def unpack_split(tensors: dict[str, torch.Tensor], prefix_rows: int, g: int, fmt: WeightFormat,
                 ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The inverse of ``pack_split``: packed tensors → (prefix, gate, up) tensors by suffix."""
    problem = formats.split_shape_problem(tensors[fmt.weight_name].shape[0], prefix_rows, g, fmt)
    if problem:
        raise FormatError(f"split projection: {problem}")
    prefix, pairs = {}, {}
    for suffix, t in tensors.items():
        if suffix == fmt.global_scale_name:
            prefix[suffix], pairs[suffix] = t[0:1], t[1:3]
            continue
        cut = prefix_rows // _scale_rows(fmt, suffix)
        prefix[suffix], pairs[suffix] = t[:cut], t[cut:]
    gate, up = unpack_gate_up(pairs, g, fmt)
    return prefix, gate, up


def quantize_split(weight: torch.Tensor, prefix_rows: int, g: int, fmt: WeightFormat, name: str,
                   kind: str | None = None) -> dict[str, torch.Tensor]:
    """A dense [P + 2I, K] weight whose rows are [prefix; gate; up] → the packed tensors in ``fmt``,
    each segment quantized on its own (its own scales; nvfp4: its own global scale)."""
    problem = formats.split_shape_problem(weight.shape[0], prefix_rows, g, fmt)
    if problem:
        raise FormatError(f"{name}: {problem}")
    inter = (weight.shape[0] - prefix_rows) // 2
    w = weight.detach().float()
    segments = (w[:prefix_rows], w[prefix_rows:prefix_rows + inter], w[prefix_rows + inter:])
    parts = [fmt.quantize(s, f"{name}[{what}]", kind) for s, what in zip(segments, formats.SPLIT_SEGMENTS)]
    return pack_split(*parts, g, fmt)
