"""FusedSplitProjection: a "plain prefix + pairs" projection (Flux.2's single-stream
``to_qkv_mlp_proj``, rows [Q; K; V; gate; up]) on its packed weight, with act(gate)·up applied.

    x [..., K] ──► one GEMM over formats.SPLIT [P + 2I, K] ──► [..., P + I] = [y_prefix | h]

The output is one tensor whose first P columns are the prefix outputs (Q, K, V) and whose last I
columns are h = act(x·gate^T)·(x·up^T): the layout the split epilogue writes (prefix columns stored,
pairs reduced, no concatenation), and what diffusers' single-stream processor reads once its split
point and its activation are set for it (integrations/diffusers.py). Forward runs ``ops.gate_up_split``
(after ``ops.quant_x`` for fp8): the sm90 split kernel (kernels/sm90/split.py) on Hopper, the
reference elsewhere (kernels/dispatch.py: split_backend).
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from . import formats, split_interleave
from .kernels import dispatch, ops, reference
from .kernels.pipeline import activation_operand, check_features, operands
from .layer import _PackedProjection


class FusedSplitProjection(nn.Module):
    """``prefix_rows`` plain output rows, then gate/up pairs of intermediate size I reduced to h.

    Its packed tensors are buffers of the child ``prefix_gate_up_interleaved`` (= formats.SPLIT),
    so state_dict keys are the checkpoint's. Output: x's dtype, [..., prefix_rows + I]; the h
    columns are rounded to bf16 first (the h format its consumer, a bf16 Linear over
    cat([attention, h]), reads)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], *, prefix_rows: int, weight_format: str,
                 interleave: int = formats.DEFAULT_INTERLEAVE, activation: str = "silu",
                 global_scale_kind: str | None = None):
        super().__init__()
        fmt = formats.weight_format(weight_format)
        reference.activation(activation)  # fail early on an unknown name
        if fmt.global_scale_name and global_scale_kind is None:
            global_scale_kind = formats.DIVISOR
        cfg = formats.PackedConfig(fmt.name, interleave, activation, (), global_scale_kind,
                                   split_projections={"m": prefix_rows})
        problems = formats.split_problems({f"m.{formats.SPLIT}.{k}": v for k, v in tensors.items()},
                                          "m", prefix_rows, cfg)
        if problems:
            raise formats.FormatError("FusedSplitProjection: " + "; ".join(str(p).replace("m.", "", 1)
                                                                         for p in problems))
        self.weight_format, self.interleave, self.activation = fmt.name, interleave, activation
        self.global_scale_kind = global_scale_kind if fmt.global_scale_name else None
        self.prefix_gate_up_interleaved = _PackedProjection(tensors)  # = formats.SPLIT
        w = tensors[fmt.weight_name]
        self.prefix_rows, self.in_features = prefix_rows, fmt.cols_of(w)
        self.intermediate_size = (w.shape[0] - prefix_rows) // 2
        self.out_features = prefix_rows + self.intermediate_size

    @classmethod
    def from_weight(cls, weight: torch.Tensor, prefix_rows: int, *, weight_format: str = "fp8_block128",
                    interleave: int = formats.DEFAULT_INTERLEAVE, activation: str = "silu",
                    name: str = "weight") -> "FusedSplitProjection":
        """Quantize and pack a dense weight [P + 2I, K] whose rows are [prefix; gate; up]."""
        fmt = formats.weight_format(weight_format)
        kind = formats.DIVISOR if fmt.global_scale_name else None
        tensors = split_interleave.quantize_split(weight, prefix_rows, interleave, fmt, name, kind)
        return cls(tensors, prefix_rows=prefix_rows, weight_format=fmt.name, interleave=interleave,
                   activation=activation, global_scale_kind=kind)

    @classmethod
    def empty(cls, in_features: int, prefix_rows: int, intermediate: int, *, weight_format: str,
              interleave: int = formats.DEFAULT_INTERLEAVE, activation: str = "silu",
              global_scale_kind: str | None = None, device: torch.device | str = "meta") -> "FusedSplitProjection":
        """A module with the format's tensors (shapes, dtypes) but no values: a loader fills them."""
        fmt = formats.weight_format(weight_format)
        shapes = fmt.tensors(prefix_rows + 2 * intermediate, in_features, len(formats.SPLIT_SEGMENTS))
        tensors = {k: torch.empty(shape, dtype=dtype, device=device) for k, (dtype, shape) in shapes.items()}
        return cls(tensors, prefix_rows=prefix_rows, weight_format=weight_format, interleave=interleave,
                   activation=activation, global_scale_kind=global_scale_kind)

    def tensors(self) -> dict[str, torch.Tensor]:
        return self.prefix_gate_up_interleaved.tensors()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_features(x, self.in_features)
        lead = x.shape[:-1]
        if x.numel() == 0:
            return x.new_empty((*lead, self.out_features))
        fmt = formats.weight_format(self.weight_format)
        weight, scale, gs = operands(fmt, self.tensors(), self.global_scale_kind)
        x2, x_scale = activation_operand(ops, fmt, x.reshape(-1, self.in_features))
        out = ops.gate_up_split(x2, weight, scale, x_scale, gs, prefix=self.prefix_rows, interleave=self.interleave,
                                act=self.activation)
        return out.to(x.dtype).reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, prefix={self.prefix_rows}, intermediate={self.intermediate_size}, "
                f"format={self.weight_format}, g={self.interleave}, activation={self.activation}, "
                f"backend={self.backend}")

    @property
    def backend(self) -> str:
        """Where forward runs on this module's device: "sm90" (the split kernel) or "reference"."""
        weight = self.tensors()[formats.weight_format(self.weight_format).weight_name]
        return dispatch.split_module_backend(weight, self.prefix_rows, self.in_features, self.weight_format,
                                             self.interleave)
