"""Tiny PTX helpers the CuTe DSL does not expose with the exact rounding we need.

* ``div_rn``: IEEE round-to-nearest fp32 division (``div.rn.f32``), so that s = amax/448 and
  q = x/s are bit-identical to torch's fp32 arithmetic in ``quant.quantize_fp8_groups``.
* ``cvt_e4m3x4``: four fp32 → four e4m3 bytes packed little-endian in one 32-bit word
  (``cvt.rn.satfinite.e4m3x2.f32``: round to nearest even, saturate to ±448, NaN stays NaN).
* ``bf16_lo_to_f32`` / ``bf16_hi_to_f32``: one half of a word of two bf16 (a residual pair) as fp32.
"""

from __future__ import annotations

import cutlass
from cutlass import Float32, Int32
from cutlass.cutlass_dsl import T, dsl_user_op
from cutlass._mlir.dialects import llvm


def _asm(result_type, operands, asm: str, constraints: str):
    """One pure inline-PTX instruction sequence (no side effects) returning one register."""
    return llvm.inline_asm(result_type, operands, asm, constraints, has_side_effects=False,
                           is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def div_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    return Float32(
        _asm(
            T.f32(),
            [Float32(a).ir_value(loc=loc, ip=ip), Float32(b).ir_value(loc=loc, ip=ip)],
            "div.rn.f32 $0, $1, $2;",
            "=f,f,f",
        )
    )


@dsl_user_op
def cvt_e4m3x4(a: Float32, b: Float32, c: Float32, d: Float32, *, loc=None, ip=None) -> Int32:
    """Byte 0 ← a, byte 1 ← b, byte 2 ← c, byte 3 ← d (memory order on a little-endian store)."""
    return Int32(
        _asm(
            T.i32(),
            [Float32(x).ir_value(loc=loc, ip=ip) for x in (a, b, c, d)],
            "{\n\t.reg .b16 lo, hi;\n\t"
            "cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\n\t"
            "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\n\t"
            "mov.b32 $0, {lo, hi};\n\t}",
            "=r,f,f,f,f",
        )
    )


@dsl_user_op
def cvt_bf16x2(a: Float32, b: Float32, *, loc=None, ip=None) -> Int32:
    """Two fp32 → two bf16 (round to nearest even) in one word, a in the low half."""
    return Int32(
        _asm(
            T.i32(),
            [Float32(b).ir_value(loc=loc, ip=ip), Float32(a).ir_value(loc=loc, ip=ip)],
            "cvt.rn.bf16x2.f32 $0, $1, $2;",
            "=r,f,f",
        )
    )


@dsl_user_op
def cvt_e4m3x2(a: Float32, b: Float32, *, loc=None, ip=None) -> cutlass.Int16:
    """Two fp32 → two e4m3 bytes in one 16-bit word, a in the low byte."""
    return cutlass.Int16(
        _asm(
            T.i16(),
            [Float32(b).ir_value(loc=loc, ip=ip), Float32(a).ir_value(loc=loc, ip=ip)],
            "cvt.rn.satfinite.e4m3x2.f32 $0, $1, $2;",
            "=h,f,f",
        )
    )


@dsl_user_op
def f32_bits(x: Float32, *, loc=None, ip=None) -> Int32:
    """The 32 bits of an fp32, as an integer (for stores that take b32 values)."""
    return Int32(_asm(T.i32(), [Float32(x).ir_value(loc=loc, ip=ip)], "mov.b32 $0, $1;", "=r,f"))


@dsl_user_op
def bf16_lo_to_f32(w: Int32, *, loc=None, ip=None) -> Float32:
    """The bf16 in the low half of a 32-bit word, as fp32 (exact)."""
    return Float32(
        _asm(
            T.f32(),
            [Int32(w).ir_value(loc=loc, ip=ip)],
            "{\n\t.reg .b32 t;\n\tshl.b32 t, $1, 16;\n\tmov.b32 $0, t;\n\t}",
            "=f,r",
        )
    )


@dsl_user_op
def bf16_hi_to_f32(w: Int32, *, loc=None, ip=None) -> Float32:
    """The bf16 in the high half of a 32-bit word, as fp32 (exact)."""
    return Float32(
        _asm(
            T.f32(),
            [Int32(w).ir_value(loc=loc, ip=ip)],
            "{\n\t.reg .b32 t;\n\tand.b32 t, $1, 0xffff0000;\n\tmov.b32 $0, t;\n\t}",
            "=f,r",
        )
    )
