"""quant_x on sm_90a: bf16 x [M, K] → e4m3 q [M, K] + fp32 x_scale [M, ceil(K/128)].

Same numerics as ``quant.quantize_fp8_groups`` (the reference): per row and per 128 consecutive
columns s = amax/448 (s = 1 where amax = 0, NaN propagates), q = e4m3(satfinite(x / s)), with
IEEE division so the bytes match torch's.

Memory-bound, 16-byte loads and 8-byte stores. Thread ↔ data map (one CTA = 256 threads):

    CTA  b, round r < 4    16 consecutive (row, k-group) pairs  g = 16·(4b + r) + tid/16
    row, kgroup            g // KB, g % KB                      (KB = ceil(K/128))
    thread t in its group  columns [128·kgroup + 8·(t%16), … + 8)   (one 16 B load)

    lanes  0..15 of a warp ─ one 128-column group ─ amax by 4 butterfly shuffles (8, 4, 2, 1)
    lanes 16..31           ─ the next group

Columns at or past K (partial last group) load as 0 and are not stored; K % 8 == 0 is required
so that every thread's 8 columns are either all inside or all outside the row.
"""

from __future__ import annotations

from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .ptx import cvt_e4m3x4, div_rn

FP8_MAX = 448.0
GROUP = 128
VEC = 8  # bf16 elements per thread (16 bytes)
THREADS = 256
GROUPS_PER_CTA = THREADS // (GROUP // VEC)  # per round
ROUNDS = 4  # (row, k-group) pairs per thread: 4 × 16 B loads in flight


@dataclass(frozen=True)
class QuantXConfig:
    """Compile-time configuration of quant_x (the cache key)."""

    in_dtype: str = "bf16"
    threads: int = THREADS
    pdl: bool = False  # programmatic dependent launch, as gemm256.TileConfig.pdl (measured, not shipped)
    # (row, k-group) pairs per thread, their 16-byte loads in flight together: 4 where there are
    # enough groups to fill the SMs that way, 1 for decode-sized x (select_config)
    rounds: int = ROUNDS

    def __post_init__(self):
        if self.rounds not in (1, ROUNDS):
            raise ValueError(f"QuantXConfig.rounds: expected 1 or {ROUNDS}, got {self.rounds}")
        if self.in_dtype != "bf16":
            raise ValueError(f"QuantXConfig.in_dtype: only 'bf16' is implemented, got {self.in_dtype!r}")
        if self.threads != THREADS:
            raise ValueError(f"QuantXConfig.threads: only {THREADS} is implemented, got {self.threads}")


class QuantXKernel:
    def __init__(self, config: QuantXConfig):
        self.config = config

    @cute.jit
    def __call__(
        self,
        x_ptr: cute.Pointer,
        q_ptr: cute.Pointer,
        s_ptr: cute.Pointer,
        m: Int32,
        k8: Int32,
        stream: cuda.CUstream,
    ):
        k = cute.assume(k8 * VEC, divby=VEC)  # lets the 16-byte row accesses be proven aligned
        kb = (k + GROUP - 1) // GROUP
        mX = cute.make_tensor(x_ptr, cute.make_layout((m, k), stride=(k, 1)))
        # e4m3 output viewed as 32-bit words: 2 words per thread
        k4 = cute.assume(k8 * 2, divby=2)
        mQ = cute.make_tensor(
            cute.recast_ptr(q_ptr, dtype=Int32), cute.make_layout((m, k4), stride=(k4, 1))
        )
        mS = cute.make_tensor(s_ptr, cute.make_layout((m, kb), stride=(kb, 1)))
        groups = m * kb
        per_cta = GROUPS_PER_CTA * self.config.rounds
        grid = (groups + per_cta - 1) // per_cta
        self.kernel(mX, mQ, mS, m, k, kb).launch(grid=[grid, 1, 1], block=[THREADS, 1, 1], stream=stream,
                                                 use_pdl=self.config.pdl)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor, m: Int32, k: Int32, kb: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        if cutlass.const_expr(self.config.pdl):  # start the next kernel (gate_up) early; then wait for x
            cute.arch.griddepcontrol_launch_dependents()
            cute.arch.griddepcontrol_wait()
        lanes_per_group = GROUP // VEC
        sub = tidx % lanes_per_group
        gX = cute.zipped_divide(mX, (1, VEC))  # ((1, 8), (M, K/8))
        gQ = cute.zipped_divide(mQ, (1, 2))  # ((1, 2), (M, K/8)) in words
        # explicit 16-byte load / 8-byte store atoms: compilation fails if alignment is not provable
        load16 = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.BFloat16, num_bits_per_copy=128)
        store8 = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Int32, num_bits_per_copy=64)

        # issue all ROUNDS loads first (more bytes in flight per thread), then quantize each
        rows, kgroups, cols, valids, regs = [], [], [], [], []
        rounds = self.config.rounds
        for r in cutlass.range_constexpr(rounds):
            group = (bidx * rounds + r) * GROUPS_PER_CTA + tidx // lanes_per_group
            row = group // kb
            kgroup = group - row * kb
            col = kgroup * GROUP + sub * VEC
            valid = (row < m) & (col < k)
            rX = cute.make_rmem_tensor(cute.make_layout(VEC), cutlass.BFloat16)
            rX.fill(0.0)
            if valid:
                cute.copy(load16, gX[((0, None), (row, col // VEC))], rX)
            rows.append(row)
            kgroups.append(kgroup)
            cols.append(col)
            valids.append(valid)
            regs.append(rX)

        for r in cutlass.range_constexpr(rounds):
            rF = cute.make_rmem_tensor(cute.make_layout(VEC), Float32)
            rF.store(regs[r].load().to(Float32))
            amax = Float32(0.0)
            for i in cutlass.range_constexpr(VEC):
                amax = cute.arch.fmax(amax, abs(rF[i]), nan=True)
            for off in cutlass.range_constexpr(4):
                other = cute.arch.shuffle_sync_bfly(amax, offset=lanes_per_group >> (off + 1))
                amax = cute.arch.fmax(amax, other, nan=True)
            s = div_rn(amax, Float32(FP8_MAX))
            if amax == Float32(0.0):
                s = Float32(1.0)
            rQ = cute.make_rmem_tensor(cute.make_layout(2), Int32)
            for w in cutlass.range_constexpr(2):
                rQ[w] = cvt_e4m3x4(
                    div_rn(rF[4 * w + 0], s),
                    div_rn(rF[4 * w + 1], s),
                    div_rn(rF[4 * w + 2], s),
                    div_rn(rF[4 * w + 3], s),
                )
            if valids[r]:
                cute.copy(store8, rQ, gQ[((0, None), (rows[r], cols[r] // VEC))])
                if sub == 0:
                    mS[rows[r], kgroups[r]] = s


# ---------------------------------------------------------------- host side
def compile_quant_x(config: QuantXConfig = QuantXConfig()):
    """Compile for sm_90a (works without a GPU: pointers are fake, sizes are runtime Int32)."""
    from .compile_cache import COMPILE_OPTIONS, fake_ptr, null_stream

    return cute.compile(
        QuantXKernel(config),
        fake_ptr(cutlass.BFloat16, 16),
        fake_ptr(cutlass.Float8E4M3FN, 16),
        fake_ptr(cutlass.Float32, 4),
        Int32(1),
        Int32(1),
        null_stream(),
        options=COMPILE_OPTIONS,
    )


# Up to this many (row, k-group) pairs one round per thread is faster (more CTAs, each with a shorter
# serial chain), above it 4 (more loads in flight). Measured, µs, 1 / 4 rounds (benchmarks/NOTES.md):
# M = 1..16 × K 4096: 2.2–2.4 / 3.7–5.6; 64 × 8192: 2.5 / 3.6; 256 × 4096: 2.9 / 3.7;
# 4096 × 4096 (2^17 groups): 20.9 / 21.1; 4096 × 8192: 39.6 / 38.9; 16384 × 4096: 75.9 / 72.9.
ONE_ROUND_GROUPS = 1 << 17


def select_config(m: int, k: int) -> QuantXConfig:
    """The rounds per thread for x [M, K] (ONE_ROUND_GROUPS)."""
    groups = m * -(-k // GROUP)
    return QuantXConfig(rounds=1 if groups <= ONE_ROUND_GROUPS else ROUNDS)


def shipped_configs() -> list[QuantXConfig]:
    return [QuantXConfig(rounds=r) for r in (1, ROUNDS)]


def quant_x(x, config: QuantXConfig | None = None, *, out=None):
    """Run the kernel on a CUDA bf16 x [M, K] (contiguous, K % 8 == 0, 16-byte aligned);
    the caller (ops.py) validates. Returns (q e4m3 [M, K], x_scale fp32 [M, ceil(K/128)]);
    ``out`` = (q, x_scale) writes into given tensors (the tests poison them first)."""
    import torch

    from . import compile_cache

    m, k = x.shape
    if config is None:
        config = select_config(m, k)
    if out is None:
        q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
        s = torch.empty((m, -(-k // GROUP)), dtype=torch.float32, device=x.device)
    else:
        q, s = out
    if m == 0 or k == 0:
        return q, s
    fn = compile_cache.get("quant_x", config, lambda: compile_quant_x(config))
    stream = cuda.CUstream(torch.cuda.current_stream(x.device).cuda_stream)
    fn(
        compile_cache.ptr(cutlass.BFloat16, x, 16),
        compile_cache.ptr(cutlass.Float8E4M3FN, q, 16),
        compile_cache.ptr(cutlass.Float32, s, 4),
        Int32(m),
        Int32(k // VEC),
        stream,
    )
    return q, s
