"""Epilogue pieces of the sm90 GEMM (gemm256.py), chosen at compile time by name (STYLE §4).

An epilogue is what the kernel does with a finished 256-row tile (two 128-column halves):
"swiglu" (gate_up: h = act(half 0) · half 1, quantized or bf16) or "linear" (down: both halves
as bf16 output columns, + an optional bf16 residual); the store code lives with the fragment
layout in gemm256.py.

An activation is a function of one fp32 gate value; the kernel computes h = act(gate) · up in
fp32. An output format turns a thread's h values into stores (see gate_up.py for the fragment
layout they rely on). Adding an activation or a format is one function and one registry entry.
"""

from __future__ import annotations

import math

import cutlass.cute as cute
from cutlass import Float32

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def silu(g: Float32) -> Float32:
    """g · sigmoid(g) = g / (1 + e^-g)."""
    return g * cute.arch.rcp_approx(Float32(1.0) + cute.math.exp(-g, fastmath=True))


def gelu_tanh(g: Float32) -> Float32:
    """0.5 g (1 + tanh(√(2/π) (g + 0.044715 g³))), the tanh approximation (torch approximate="tanh")."""
    inner = Float32(SQRT_2_OVER_PI) * (g + Float32(0.044715) * g * g * g)
    return Float32(0.5) * g * (Float32(1.0) + cute.math.tanh(inner, fastmath=True))


ACTIVATIONS = {"silu": silu, "gelu_tanh": gelu_tanh}

EPILOGUES = ("swiglu", "linear")

# h output formats the swiglu epilogue implements (the store code lives with the fragment layout in gemm256.py)
H_FORMATS = ("bf16", "fp8_group128")


def activation(name: str):
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"act: no sm90 epilogue for activation {name!r}; expected one of {sorted(ACTIVATIONS)}") from None
