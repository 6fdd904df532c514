"""Tiny PTX helpers the CuTe DSL does not expose with the exact rounding we need.

* ``div_rn``: IEEE round-to-nearest fp32 division (``div.rn.f32``), so that s = amax/448 and
  q = x/s are bit-identical to torch's fp32 arithmetic in ``quant.quantize_fp8_groups``.
* ``cvt_e4m3x4``: four fp32 → four e4m3 bytes packed little-endian in one 32-bit word
  (``cvt.rn.satfinite.e4m3x2.f32``: round to nearest even, saturate to ±448, NaN stays NaN).
* ``bf16_lo_to_f32`` / ``bf16_hi_to_f32``: one half of a word of two bf16 (a residual pair) as fp32.
* nvfp4 decode (nvfp4.py): shared loads / stores at computed (swizzled) addresses, cp.async of the
  scale words with its mbarrier arrive, e4m3 scales → bf16, e2m1 code pairs × scale → bf16 pairs.
"""

from __future__ import annotations

import cutlass
from cutlass import Float32, Int32
from cutlass.cutlass_dsl import T, dsl_user_op
from cutlass._mlir.dialects import llvm

from .. import nvfp4_layout


def _asm(result_type, operands, asm: str, constraints: str):
    """One pure inline-PTX instruction sequence (no side effects) returning one register."""
    return llvm.inline_asm(result_type, operands, asm, constraints, has_side_effects=False,
                           is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


def _words(res, n: int, loc=None, ip=None) -> tuple:
    """The n 32-bit results of an inline-PTX sequence (a literal struct) as Int32 values."""
    return tuple(Int32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(n))


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


# ---------------------------------------------------------------- nvfp4 (W4A16) decode
DECODE_SHIFT = 64  # the decoded weight is code · scale · 2^(DECODE_SHIFT - 126): one fma a pair
# Shared-memory accesses the decode makes at addresses it computes (the swizzled bf16 tile): marked
# as having side effects, so that the compiler keeps them between the pipeline's waits and barriers.
def _asm_volatile(result_type, operands, asm: str, constraints: str):
    return llvm.inline_asm(result_type, operands, asm, constraints, has_side_effects=True,
                           is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def globaltimer(*, loc=None, ip=None) -> cutlass.Int64:
    """The GPU's global nanosecond timer (the same clock on every SM: timelines across CTAs)."""
    return cutlass.Int64(_asm_volatile(T.i64(), [], "mov.u64 $0, %globaltimer;", "=l"))


@dsl_user_op
def nanosleep(ns: int, *, loc=None, ip=None) -> None:
    """Suspend the thread for up to ``ns`` nanoseconds: a spin's back-off, so that a waiting CTA
    does not hammer the L2 slice of the word it polls."""
    _asm_volatile(None, [], f"nanosleep.u32 {ns};", "")


@dsl_user_op
def ld_shared_b32(addr: Int32, *, loc=None, ip=None) -> Int32:
    """One 32-bit word of shared memory at byte address ``addr``."""
    return Int32(_asm_volatile(T.i32(), [Int32(addr).ir_value(loc=loc, ip=ip)], "ld.shared.b32 $0, [$1];", "=r,r"))


@dsl_user_op
def cp_async_4(dst: Int32, src, *, loc=None, ip=None) -> None:
    """cp.async of 4 bytes from global address ``src`` (Int64) to shared address ``dst``: an
    asynchronous copy the issuing thread does not wait for (cp_async_arrive tracks it)."""
    _asm_volatile(None, [Int32(dst).ir_value(loc=loc, ip=ip), cutlass.Int64(src).ir_value(loc=loc, ip=ip)],
                  "cp.async.ca.shared.global [$0], [$1], 4;", "r,l")


@dsl_user_op
def cp_async_arrive(mbar: Int32, *, loc=None, ip=None) -> None:
    """Hold the mbarrier's current phase open until this thread's cp.async copies so far have
    landed (the pending count goes up now and down then: no arrival of the barrier's count)."""
    _asm_volatile(None, [Int32(mbar).ir_value(loc=loc, ip=ip)], "cp.async.mbarrier.arrive.shared.b64 [$0];", "r")


@dsl_user_op
def bulk_copy_g2s(dst: Int32, src, nbytes: int, mbar: Int32, *, loc=None, ip=None) -> None:
    """One bulk copy (the TMA engine, no tensor map) of ``nbytes`` (a multiple of 16) from global
    address ``src`` (Int64, 16-byte aligned) to shared address ``dst``, completing its bytes on the
    mbarrier at ``mbar`` (whose expected transaction count must include them)."""
    _asm_volatile(None, [Int32(dst).ir_value(loc=loc, ip=ip), cutlass.Int64(src).ir_value(loc=loc, ip=ip),
                         Int32(mbar).ir_value(loc=loc, ip=ip)],
                  f"cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], {nbytes}, [$2];",
                  "r,l,r")


@dsl_user_op
def bulk_prefetch_l2(src, nbytes: int, *, loc=None, ip=None) -> None:
    """A hint to bring ``nbytes`` (a multiple of 16) from global address ``src`` (Int64, 16-byte
    aligned) into L2 (the TMA engine, no tensor map, no destination, nothing to wait for)."""
    _asm_volatile(None, [cutlass.Int64(src).ir_value(loc=loc, ip=ip)],
                  f"cp.async.bulk.prefetch.L2.global [$0], {nbytes};", "l")


@dsl_user_op
def ld_shared_v4(addr: Int32, *, loc=None, ip=None) -> tuple:
    """16 bytes of shared memory at 16-byte aligned ``addr``, as four words (the lowest first)."""
    words = llvm.StructType.get_literal([T.i32()] * 4)
    res = _asm_volatile(words, [Int32(addr).ir_value(loc=loc, ip=ip)],
                        "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r")
    return _words(res, 4, loc, ip)


@dsl_user_op
def ld_shared_v2(addr: Int32, *, loc=None, ip=None) -> tuple:
    """8 bytes of shared memory at 8-byte aligned ``addr``, as two words (the lowest first)."""
    words = llvm.StructType.get_literal([T.i32()] * 2)
    res = _asm_volatile(words, [Int32(addr).ir_value(loc=loc, ip=ip)], "ld.shared.v2.b32 {$0, $1}, [$2];",
                        "=r,=r,r")
    return _words(res, 2, loc, ip)


@dsl_user_op
def st_shared_v4(addr: Int32, a: Int32, b: Int32, c: Int32, d: Int32, *, loc=None, ip=None) -> None:
    """16 bytes (four words, a at the lowest address) into shared memory at 16-byte aligned ``addr``."""
    _asm_volatile(None, [Int32(x).ir_value(loc=loc, ip=ip) for x in (addr, a, b, c, d)],
                  "st.shared.v4.b32 [$0], {$1, $2, $3, $4};", "r,r,r,r,r")


@dsl_user_op
def e4m3x4_to_bf16x2(word: Int32, *, loc=None, ip=None) -> tuple:
    """Four e4m3 codes (the bytes of ``word``, byte 0 first) → four words, each the code's value
    times 2^DECODE_SHIFT as bf16 in both halves (exact: every e4m3 value is a bf16 value, and so
    is it times 2^64). Through f16 and f32: sm_90 converts e4m3 to f16x2 only."""
    words = llvm.StructType.get_literal([T.i32()] * 4)
    res = _asm(
        words,
        [Int32(word).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .b16 a, b, f0, f1, f2, f3;\n\t.reg .b32 h01, h23, p01, p23;\n\t"
        ".reg .f32 x0, x1, x2, x3;\n\t"
        "mov.b32 {a, b}, $4;\n\t"
        "cvt.rn.f16x2.e4m3x2 h01, a;\n\t"
        "cvt.rn.f16x2.e4m3x2 h23, b;\n\t"
        "mov.b32 {f0, f1}, h01;\n\t"
        "mov.b32 {f2, f3}, h23;\n\t"
        "cvt.f32.f16 x0, f0;\n\t"
        "cvt.f32.f16 x1, f1;\n\t"
        "cvt.f32.f16 x2, f2;\n\t"
        "cvt.f32.f16 x3, f3;\n\t"
        "mul.f32 x0, x0, 0f5F800000;\n\t"  # 2^64 (DECODE_SHIFT)
        "mul.f32 x1, x1, 0f5F800000;\n\t"
        "mul.f32 x2, x2, 0f5F800000;\n\t"
        "mul.f32 x3, x3, 0f5F800000;\n\t"
        "cvt.rn.bf16x2.f32 p01, x1, x0;\n\t"  # x0 in the low half
        "cvt.rn.bf16x2.f32 p23, x3, x2;\n\t"
        "prmt.b32 $0, p01, p01, 0x1010;\n\t"  # the low half in both
        "prmt.b32 $1, p01, p01, 0x3232;\n\t"  # the high half in both
        "prmt.b32 $2, p23, p23, 0x1010;\n\t"
        "prmt.b32 $3, p23, p23, 0x3232;\n\t}",
        "=r,=r,=r,=r,r",
    )
    return _words(res, 4, loc, ip)


@dsl_user_op
def e2m1x2_to_bf16x2(word: Int32, shifted: Int32, byte: int, scale2: Int32, *, loc=None, ip=None) -> Int32:
    """Byte ``byte`` (0..3, a constant) of ``word``, two e2m1 codes (low nibble = the even column),
    times the group's scale · 2^DECODE_SHIFT (bf16, both halves of ``scale2``: e4m3x4_to_bf16x2)
    → two bf16, code · scale · 2^(DECODE_SHIFT - 126) (the even column in the low half);
    ``shifted`` = word >> 4 (shared by the word's four calls).

    A code s e1 e0 m placed at bf16 bits 15 and 8..6 is the bf16 value code · 2^-126 (a subnormal
    where e = 0, which bf16 fma keeps), so one fma applies the scale; adding -0 keeps the sign of a
    zero. Exact: code · scale has at most 5 significant bits, and with DECODE_SHIFT = 64 every
    product is a normal bf16 (2^-72 … 2^-50): no underflow, no overflow. The power of two comes
    back with the global scale (nvfp4.py). One prmt puts the byte in byte 0 (the
    even code in its low nibble) and the same byte of ``shifted`` in byte 2 (the odd code), a mask
    keeps the two codes, and code · 64 + (code & 8) · 4032 = (code & 7) << 6 | (code & 8) << 12
    places them (sign bit 3 · 64 + 8 · 4032 = 2^15) without a carry between the halves."""
    sel = ((4 + byte) << 12) | ((4 + byte) << 8) | (byte << 4) | byte
    return Int32(
        _asm(
            T.i32(),
            [Int32(word).ir_value(loc=loc, ip=ip), Int32(shifted).ir_value(loc=loc, ip=ip),
             Int32(scale2).ir_value(loc=loc, ip=ip)],
            "{\n\t.reg .b32 t, u, v, z;\n\t"
            f"prmt.b32 t, $1, $2, {sel:#x};\n\t"
            "and.b32 u, t, 0x000F000F;\n\t"  # the two codes, alone in their halves
            "and.b32 v, t, 0x00080008;\n\t"  # their signs
            "mul.lo.u32 v, v, 4032;\n\t"
            "mad.lo.u32 t, u, 64, v;\n\t"  # code · 64 + sign · 4032: e1 e0 m → bits 8..6, s → bit 15
            "mov.b32 z, 0x80008000;\n\t"  # -0, -0
            "fma.rn.bf16x2 $0, t, $3, z;\n\t}",
            "=r,r,r,r",
        )
    )


@dsl_user_op
def e2m1x8_to_bf16x2x4(word: Int32, scale2: Int32, half: int | None = None, *, loc=None, ip=None) -> tuple:
    """A tile-major word (8 codes, its bits in nvfp4_layout's decode order) times the group's scale
    · 2^DECODE_SHIFT (bf16, both halves of ``scale2``) → four words, pair j = columns 2j and 2j + 1
    (the even one low): the values e2m1x2_to_bf16x2 gives for byte j of the packed word, exactly.
    Pair j is (word << s_j) & SIGN_MASK | (word << m_j) & MAGNITUDE_MASK (PAIR_SHIFTS): the same
    bf16 placement, 11 integer ops a word instead of 21, then the same fma.

    ``half`` (0 or 1): ``scale2`` holds two rows' scales instead (e4m3x2_to_bf16x2's pair) and the
    fma takes half ``half`` in both lanes. ptxas folds that broadcast into the multiply's operand
    (HMUL2 R, R, S.H0_H0 / .H1_H1), where a prmt that builds the broadcast word is an instruction
    of its own: the same bits, two instructions fewer a row pair's scale group."""
    shifts = sorted({r for pair in nvfp4_layout.PAIR_SHIFTS for r in pair} - {0})
    src = {0: "$4", **{r: f"s{r + 32}" for r in shifts}}
    body = [f"shl.b32 {src[r]}, $4, {r};" if r > 0 else f"shr.u32 {src[r]}, $4, {-r};" for r in shifts]
    body.append("mov.b32 z, 0x80008000;")  # (-0, -0)
    scale = "$5"
    if half is not None:  # (lo, lo) or (hi, hi) of the two rows' scales
        body += ["mov.b32 {lo, hi}, $5;", f"mov.b32 b, {{{('lo', 'hi')[half]}, {('lo', 'hi')[half]}}};"]
        scale = "b"
    for j, (sr, mr) in enumerate(nvfp4_layout.PAIR_SHIFTS):
        if sr == mr:
            body.append(f"and.b32 t, {src[sr]}, {nvfp4_layout.SIGN_MASK | nvfp4_layout.MAGNITUDE_MASK:#x};")
        else:
            body += [f"and.b32 t, {src[sr]}, {nvfp4_layout.SIGN_MASK:#x};",
                     f"and.b32 u, {src[mr]}, {nvfp4_layout.MAGNITUDE_MASK:#x};", "or.b32 t, t, u;"]
        body.append(f"fma.rn.bf16x2 ${j}, t, {scale}, z;")
    regs = ", ".join(src[r] for r in shifts)
    words = llvm.StructType.get_literal([T.i32()] * 4)
    res = _asm(
        words,
        [Int32(word).ir_value(loc=loc, ip=ip), Int32(scale2).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .b32 " + regs + ", t, u, z" + ("" if half is None else ", b;\n\t.reg .b16 lo, hi")
        + ";\n\t" + "\n\t".join(body) + "\n\t}",
        "=r,=r,=r,=r,r,r",
    )
    return _words(res, 4, loc, ip)


# ---------------------------------------------------------------- warp-level W4A16 (warp_mma.py)
@dsl_user_op
def ld_global_nc_v4(addr, *, loc=None, ip=None) -> tuple:
    """16 bytes at 16-byte aligned global address ``addr`` (Int64) of memory no thread writes
    during the kernel (the weight), not kept in L1: four words, the lowest first. Issued where it
    stands (side effects), so that loads placed ahead of their use stay ahead."""
    res = _asm_volatile(llvm.StructType.get_literal([T.i32()] * 4), [cutlass.Int64(addr).ir_value(loc=loc, ip=ip)],
                        "ld.global.nc.L1::no_allocate.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l")
    return _words(res, 4, loc, ip)


@dsl_user_op
def ld_global_nc_b32(addr, *, loc=None, ip=None) -> Int32:
    """One word at global address ``addr`` (Int64) of read-only memory (the weight's scales)."""
    return Int32(_asm_volatile(T.i32(), [cutlass.Int64(addr).ir_value(loc=loc, ip=ip)],
                               "ld.global.nc.u32 $0, [$1];", "=r,l"))


@dsl_user_op
def ld_global_v4(addr, *, loc=None, ip=None) -> tuple:
    """16 bytes at 16-byte aligned global address ``addr`` (Int64): four words, the lowest first."""
    res = _asm_volatile(llvm.StructType.get_literal([T.i32()] * 4), [cutlass.Int64(addr).ir_value(loc=loc, ip=ip)],
                        "ld.global.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l")
    return _words(res, 4, loc, ip)


@dsl_user_op
def st_shared_b32(addr: Int32, a: Int32, *, loc=None, ip=None) -> None:
    """One word into shared memory at byte address ``addr``."""
    _asm_volatile(None, [Int32(addr).ir_value(loc=loc, ip=ip), Int32(a).ir_value(loc=loc, ip=ip)],
                  "st.shared.b32 [$0], $1;", "r,r")


@dsl_user_op
def ldmatrix_b(addr: Int32, matrices: int, *, loc=None, ip=None) -> tuple:
    """ldmatrix of ``matrices`` (2 or 4) 8 × 8 bf16 matrices from shared memory, row addresses from
    lanes 8i … 8i + 7 (``addr``: this lane's row): lane 4g + t gets elements 2t, 2t + 1 of row g
    of each, the B fragment words of mma.m16n8k16 for rows = tokens, columns = k."""
    regs = ", ".join(f"${i}" for i in range(matrices))
    res = _asm_volatile(llvm.StructType.get_literal([T.i32()] * matrices), [Int32(addr).ir_value(loc=loc, ip=ip)],
                        f"ldmatrix.sync.aligned.m8n8.x{matrices}.shared.b16 {{{regs}}}, [${matrices}];",
                        ",".join(["=r"] * matrices) + ",r")
    return _words(res, matrices, loc, ip)


@dsl_user_op
def mma_bf16_m16n8k16(a: tuple, b: tuple, c: tuple, *, loc=None, ip=None) -> tuple:
    """d = a · b + c, one warp's mma.sync.m16n8k16 (bf16 in, fp32 accumulate): a four words (rows
    g, g + 8 × columns 2t, 2t + 1, 2t + 8, 2t + 9), b two words, c and d four fp32 (rows g, g + 8 ×
    columns 2t, 2t + 1)."""
    ops = [Int32(v).ir_value(loc=loc, ip=ip) for v in (*a, *b)] + [Float32(v).ir_value(loc=loc, ip=ip) for v in c]
    res = _asm(llvm.StructType.get_literal([T.f32()] * 4), ops,
               "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {$0, $1, $2, $3}, {$4, $5, $6, $7}, "
               "{$8, $9}, {$10, $11, $12, $13};", "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")
    return tuple(Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(4))


@dsl_user_op
def prmt(a: Int32, b: Int32, sel: Int32, *, loc=None, ip=None) -> Int32:
    """prmt.b32: byte i of the result is byte (sel >> 4i) & 7 of (b:a) (a's bytes 0-3, b's 4-7)."""
    return Int32(_asm(T.i32(), [Int32(x).ir_value(loc=loc, ip=ip) for x in (a, b, sel)],
                      "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r"))


@dsl_user_op
def e4m3x2_to_bf16x2(word: Int32, *, loc=None, ip=None) -> Int32:
    """The two e4m3 scales in the low 16 bits of ``word`` → bf16 scale · 2^DECODE_SHIFT in the same
    halves (exact). e4m3 → f16 is exact and every e4m3 value is a normal f16 with a 3-bit mantissa,
    so its bits moved into a bf16 (sign kept, exponent and mantissa shifted down 3) are the value ·
    2^-112 (zero stays zero); two bf16 multiplies by 2^127 and 2^49 restore 2^(112 + 64). Cheaper
    than e4m3x4_to_bf16x2's path through f32 (6 ops for two scales instead of 9 for one)."""
    return Int32(_asm(
        T.i32(), [Int32(word).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .b16 lo, hi;\n\t.reg .b32 h, s, m, z, c1, c2;\n\t"
        "mov.b32 {lo, hi}, $1;\n\t"
        "cvt.rn.f16x2.e4m3x2 h, lo;\n\t"
        "and.b32 s, h, 0x80008000;\n\t"
        "shr.u32 m, h, 3;\n\t"
        "and.b32 m, m, 0x0FFF0FFF;\n\t"
        "or.b32 s, s, m;\n\t"
        "mov.b32 z, 0x80008000;\n\t"
        "mov.b32 c1, 0x7F007F00;\n\t"  # 2^127, 2^127
        "mov.b32 c2, 0x58005800;\n\t"  # 2^49, 2^49 (DECODE_SHIFT + 112 - 127)
        "fma.rn.bf16x2 s, s, c1, z;\n\t"
        "fma.rn.bf16x2 $0, s, c2, z;\n\t}",
        "=r,r",
    ))
