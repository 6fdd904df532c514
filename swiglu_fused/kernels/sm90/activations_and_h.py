"""Epilogue pieces of the sm90 GEMM (gemm.py), chosen at compile time by name (STYLE §4).

An epilogue is what the kernel does with a finished 256-row tile (two 128-column halves):
"gated" (gate_up: h = act(half 0) · half 1, quantized or bf16) or "linear" (down: both halves
as bf16 output columns, + an optional bf16 residual); the store code lives with the fragment
layout in gemm.py.

An activation is a function of one fp32 gate value; the kernel computes h = act(gate) · up in
fp32. An h format (``HFormat``) says how h values become stored bits: the element width, whether a
row's 128 columns share a scale (and how the scale follows from their amax), and how two values
become one packed word. The epilogues (epilogue_stores.py, swap_ab.py) reduce the amax in their
fragment layout and stage words by width; they ask the format for the rest. Adding an activation
or a format is one function or one HFormat and one registry entry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from ... import formats
from ...quant import FP8_MAX
from .ptx import cvt_bf16x2, cvt_e4m3x2, div_rn

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def silu(g: Float32) -> Float32:
    """g · sigmoid(g) = g / (1 + e^-g)."""
    return g * cute.arch.rcp_approx(Float32(1.0) + cute.math.exp(-g, fastmath=True))


def gelu_tanh(g: Float32) -> Float32:
    """0.5 g (1 + tanh(√(2/π) (g + 0.044715 g³))), the tanh approximation (torch approximate="tanh")."""
    inner = Float32(SQRT_2_OVER_PI) * (g + Float32(0.044715) * g * g * g)
    return Float32(0.5) * g * (Float32(1.0) + cute.math.tanh(inner, fastmath=True))


# implementations of the names registered in formats.ACTIVATIONS and formats.H_FORMATS
ACTIVATIONS = {"silu": silu, "gelu_tanh": gelu_tanh}

EPILOGUES = ("gated", "linear")


# ---------------------------------------------------------------- h formats
@cute.jit
def e4m3_group_scale(amax: Float32) -> Float32:
    """s = amax / 448 (IEEE division, as quant.quantize_fp8_groups), 1 for an all-zero group."""
    s = div_rn(amax, Float32(FP8_MAX))
    if amax == Float32(0.0):
        s = Float32(1.0)
    return s


def e4m3_pair(a: Float32, b: Float32, inv_a: Float32, inv_b: Float32):
    """Two h values as e4m3 codes in a 16-bit word, q = h · (1/s): differs from h / s only on e4m3
    rounding ties (≤ 1 ulp, DESIGN §4)."""
    return cvt_e4m3x2(a * inv_a, b * inv_b)


def bf16_pair(a: Float32, b: Float32, inv_a, inv_b):
    """Two h values rounded to bf16 in a 32-bit word (no scale: inv_a / inv_b are unused)."""
    return cvt_bf16x2(a, b)


@dataclass(frozen=True)
class HFormat:
    """How the gated epilogue stores h. ``bits``: element width (8: pairs are 16-bit words, 16:
    32-bit words; the epilogues stage by width). ``scale``: a row's 128 columns share an fp32 scale,
    ``scale(amax)``, stored in h_scale [M, I/128], and values are multiplied by 1/scale; None: no
    scale. ``pack``: (a, b, 1/s_a, 1/s_b) → one word. ``dtype``: h's element type (CuTe DSL);
    ``torch_dtype``: its name in torch."""

    name: str
    bits: int
    dtype: type
    torch_dtype: str
    pack: Callable
    scale: Callable | None = None

    @property
    def scaled(self) -> bool:
        return self.scale is not None


_FORMATS = (
    HFormat("fp8_group128", 8, cutlass.Float8E4M3FN, "float8_e4m3fn", e4m3_pair, e4m3_group_scale),
    HFormat("bf16", 16, cutlass.BFloat16, "bfloat16", bf16_pair),
)
H_FORMATS = tuple(f.name for f in _FORMATS)


def h_spec(name: str) -> HFormat:
    return formats.implementation({f.name: f for f in _FORMATS}, name, "h_format", "sm90 epilogue")


def activation(name: str):
    return formats.implementation(ACTIVATIONS, name, "act", "sm90 epilogue")
