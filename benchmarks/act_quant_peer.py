"""The separate SiLU·up (+ group-128 e4m3 quantization) kernel the unfused peers run (GPU).

The packed GEMM output y [M, 2I] (bf16, interleave g = 128: group j's gate columns are
[256j, 256j + 128), its up columns the next 128) becomes h [M, I] (e4m3 with fp32 scales
s = amax/448 per row and group, M-major as cuBLAS's down GEMM reads them; or bf16). Two
implementations, and the benchmarks take whichever is faster on the shape at hand:

    compiled   bench_gate_up.act_quant / act_mul_bf16 under torch.compile (inductor)
    triton     one pass: a program loads a block of rows of one group's gate and up halves,
               forms h in fp32, reduces the row amax in registers and writes q and s

Both are checked against each other before timing. ``bytes_moved`` gives the traffic for the
achieved-bandwidth columns (the copy rate on the lent H100 is 2.96 TB/s, DESIGN §6).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

G = 128
FP8_MAX = 448.0


@triton.jit
def _act_quant(y_ptr, h_ptr, s_ptr, M, I, BLOCK_M: tl.constexpr, FP8_OUT: tl.constexpr):
    pid_m = tl.program_id(0)
    j = tl.program_id(1)  # h group: gate columns [256j, 256j + 128) of y, up the next 128
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, 128)
    ok = rows[:, None] < M
    y_off = rows[:, None].to(tl.int64) * (2 * I) + j * 256 + cols[None, :]
    g = tl.load(y_ptr + y_off, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(y_ptr + y_off + 128, mask=ok, other=0.0).to(tl.float32)
    h = g / (1.0 + tl.exp(-g)) * u
    h_off = rows[:, None].to(tl.int64) * I + j * 128 + cols[None, :]
    if FP8_OUT:
        amax = tl.max(tl.abs(h), axis=1)
        s = tl.where(amax > 0, amax / 448.0, 1.0)
        q = tl.clamp(h / s[:, None], -448.0, 448.0)
        tl.store(h_ptr + h_off, q.to(tl.float8e4nv), mask=ok)
        tl.store(s_ptr + j.to(tl.int64) * M + rows, s, mask=rows < M)  # M-major: [I/128, M]
    else:
        tl.store(h_ptr + h_off, h.to(tl.bfloat16), mask=ok)


def act_quant_triton(y: torch.Tensor, fp8: bool = True, block_m: int = 32):
    """y [M, 2I] bf16 → (h e4m3 [M, I], s fp32 [M, I/128] M-major), or bf16 h [M, I] (fp8=False)."""
    m, n = y.shape
    i_cols = n // 2
    if fp8:
        h = torch.empty((m, i_cols), dtype=torch.float8_e4m3fn, device=y.device)
        s = torch.empty((i_cols // G, m), dtype=torch.float32, device=y.device)
    else:
        h = torch.empty((m, i_cols), dtype=torch.bfloat16, device=y.device)
        s = h  # (not written)
    _act_quant[(triton.cdiv(m, block_m), i_cols // G)](y, h, s, m, i_cols, BLOCK_M=block_m, FP8_OUT=fp8,
                                                      num_warps=4)
    return (h, s.t()) if fp8 else h


def bytes_moved(m: int, i_cols: int, fp8: bool) -> int:
    """y read once, h (and its scales) written once."""
    return m * 2 * i_cols * 2 + m * i_cols * (1 if fp8 else 2) + (m * (i_cols // G) * 4 if fp8 else 0)


def check_same(a, b, fp8: bool) -> None:
    """The two implementations agree: scales to 1e-5 relative, h within one e4m3 step (or bf16 rounding)."""
    if fp8:
        (ha, sa), (hb, sb) = a, b
        torch.testing.assert_close(sa, sb, rtol=1e-5, atol=0)
        da = ha.float() * sa.repeat_interleave(G, 1)
        db = hb.float() * sb.repeat_interleave(G, 1)
        err = ((da - db).norm() / db.norm()).item()
        assert err < 1e-3, f"act·quant implementations differ: rel err {err:.2e}"
    else:
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-2)


def best(y_example: torch.Tensor, fp8: bool, compiled, time_us):
    """(name, callable y → h (, s)) of the faster implementation on this shape, after checking that
    both agree; ``time_us(fn)`` times a no-argument callable (bench_gate_up.graph_time_us)."""
    tri = (lambda y: act_quant_triton(y, fp8))
    check_same(tri(y_example), compiled(y_example), fp8)
    t_tri = time_us(lambda: tri(y_example))
    t_cmp = time_us(lambda: compiled(y_example))
    return ("triton", tri) if t_tri < t_cmp else ("compiled", compiled)
