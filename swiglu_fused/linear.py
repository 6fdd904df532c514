"""PackedLinear: a non-MLP linear (attention q/k/v/o, ...) on a packed checkpoint's quantized weight.

y = x @ W^T (+ bias), W stored in the checkpoint's weight format exactly as a down_proj is
(formats.py: ``quantization_config.linears``). Forward is the MLP's down GEMM on x: fp8_block128
quantizes x per token group of 128 first (``ops.quant_x``), nvfp4 runs W4A16 on bf16 x.
"""

from __future__ import annotations

from typing import Mapping

import torch

from . import formats
from .kernels import ops
from .kernels.pipeline import activation_operand, check_features, operands
from .layer import _PackedProjection


class PackedLinear(_PackedProjection):
    """A Linear whose weight is in a packed weight format. Buffers are named by the format's tensor
    names (and ``bias``), so state_dict keys are the checkpoint's; a cast (``model.to(bf16)``)
    moves them without changing their dtypes, as in FusedSwiGLUMLP."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], *, weight_format: str,
                 global_scale_kind: str | None = None, bias: torch.Tensor | None = None):
        fmt = formats.weight_format(weight_format)
        if fmt.global_scale_name and global_scale_kind is None:
            global_scale_kind = formats.DIVISOR
        cfg = formats.PackedConfig(weight_format, formats.DEFAULT_INTERLEAVE, "silu", (), global_scale_kind,
                                   linears=("m",))
        given = {f"m.{k}": v for k, v in tensors.items()}
        if bias is not None:
            given["m.bias"] = bias
        problems = formats.linear_problems(given, "m", cfg)
        if problems:
            raise formats.FormatError("PackedLinear: " + "; ".join(str(p).replace("m.", "", 1) for p in problems))
        super().__init__({**tensors, **({"bias": bias} if bias is not None else {})}, fmt.name,
                         global_scale_kind=global_scale_kind)
        self.weight_format = fmt.name
        self.global_scale_kind = global_scale_kind if fmt.global_scale_name else None
        w = tensors[fmt.weight_name]
        self.out_features, self.in_features = w.shape[0], fmt.cols_of(w)

    @classmethod
    def empty(cls, in_features: int, out_features: int, *, weight_format: str, global_scale_kind: str | None = None,
              bias_dtype: torch.dtype | None = None, device: torch.device | str = "meta") -> "PackedLinear":
        """A module with the format's tensors (shapes, dtypes) but no values: a loader fills them."""
        fmt = formats.weight_format(weight_format)
        tensors = {k: torch.empty(shape, dtype=dtype, device=device)
                   for k, (dtype, shape) in fmt.tensors(out_features, in_features, 1).items()}
        bias = None if bias_dtype is None else torch.empty(out_features, dtype=bias_dtype, device=device)
        return cls(tensors, weight_format=weight_format, global_scale_kind=global_scale_kind, bias=bias)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, *, weight_format: str
                    ) -> "PackedLinear":
        """Quantize a dense weight [out, in] (per-tensor scales stored as divisors)."""
        fmt = formats.weight_format(weight_format)
        kind = formats.DIVISOR if fmt.global_scale_name else None
        return cls(fmt.quantize(weight.detach().float(), "weight", kind), weight_format=weight_format,
                   global_scale_kind=kind, bias=None if bias is None else bias.detach())

    def kernel_tensors(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.named_buffers() if k != "bias"}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_features(x, self.in_features)
        if x.dtype not in ops.OUT_DTYPES:
            raise TypeError(f"x: PackedLinear takes {', '.join(map(str, ops.OUT_DTYPES))} activations, got {x.dtype}")
        lead = x.shape[:-1]
        if x.numel() == 0:
            return x.new_empty((*lead, self.out_features))
        fmt = formats.weight_format(self.weight_format)
        weight, scale, gs = operands(fmt, self.op_tensors(), formats.MULTIPLIER if self.global_scale_kind else None)
        x2, x_scale = activation_operand(ops, fmt, x.reshape(-1, self.in_features))
        y = ops.down(x2, weight, scale, x_scale, gs, out_dtype=x.dtype, tile_major=self.tile_major)
        bias = self._buffers.get("bias")
        if bias is not None:
            y = y + bias.to(y.dtype)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, format={self.weight_format}, "
                f"bias={'bias' in self._buffers}")
