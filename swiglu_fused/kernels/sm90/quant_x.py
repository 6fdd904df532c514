"""quant_x on sm_90a: bf16 x [M, K] → e4m3 q [M, K] + fp32 x_scale [M, ceil(K/128)].

x's rows may lie further apart than K (a row stride that is a multiple of 8 elements): the Flux.2
single-stream processor hands ``to_out`` [attention | h], a view of the split projection's output,
and a quantized ``to_out`` quantizes it where it lies instead of copying it first.

Same numerics as ``quant.quantize_fp8_groups`` (the reference): per row and per 128 consecutive
columns s = amax/448 (s = 1 where amax = 0, NaN propagates), q = e4m3(satfinite(x / s)), with
IEEE division so the bytes match torch's.

Memory-bound, 16-byte loads. Thread ↔ data map (CTA of T threads, V = 8 or 16 columns per
thread, L = 128/V lanes per group, G = T/L groups per CTA and round):

    CTA  b, round r < R    G consecutive (row, k-group) pairs   g = G·(R·b + r) + tid/L
    row, kgroup            g // KB, g % KB                      (KB = ceil(K/128))
    thread t in its group  columns [128·kgroup + V·(t%L), … + V)   (V/8 16-byte loads)

    L lanes of a warp ─ one 128-column group ─ amax by log2(L) butterfly shuffles (L/2, …, 1)

Columns at or past K (partial last group) load as 0 and are not stored; K % V == 0 is required
so that every thread's V columns are either all inside or all outside the row.
"""

from __future__ import annotations

from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .. import dispatch
from ...quant import FP8_BLOCK, FP8_MAX, cdiv
from .ptx import cvt_e4m3x4, div_rn

GROUP = FP8_BLOCK
IN_DTYPES = ("bf16",)  # x dtypes the kernel reads (CuTe DSL names)
VEC = 8  # bf16 elements per 16-byte load
THREADS = 256
ROUNDS = 4  # (row, k-group) pairs per thread: 4 × 16 B loads in flight


@dataclass(frozen=True)
class QuantXConfig:
    """Compile-time configuration of quant_x (the cache key)."""

    in_dtype: str = "bf16"
    threads: int = THREADS
    pdl: bool = False  # programmatic dependent launch (the fp8 MLP at decode sizes: dispatch.quant_x_map, DISPATCH D20)
    # (row, k-group) pairs per thread, their 16-byte loads in flight together: 4 where there are
    # enough groups to fill the SMs that way, 1 for decode-sized x (dispatch.quant_x_map)
    rounds: int = ROUNDS
    # columns per thread: 8 (one 16-byte load, 16 lanes per group) or 16 (two loads, one 16-byte
    # store, 8 lanes per group); 16 needs K % 16 == 0
    vec: int = VEC

    def __post_init__(self):
        if self.rounds not in (1, 2, ROUNDS):
            raise ValueError(f"QuantXConfig.rounds: expected 1, 2 or {ROUNDS}, got {self.rounds}")
        if self.in_dtype not in IN_DTYPES:
            raise ValueError(f"QuantXConfig.in_dtype: only {IN_DTYPES} is implemented, got {self.in_dtype!r}")
        if self.threads not in (128, 256, 512):
            raise ValueError(f"QuantXConfig.threads: expected 128, 256 or 512, got {self.threads}")
        if self.vec not in (VEC, 2 * VEC):
            raise ValueError(f"QuantXConfig.vec: expected {VEC} or {2 * VEC}, got {self.vec}")

    @property
    def lanes(self) -> int:
        """Threads per 128-column group."""
        return GROUP // self.vec

    @property
    def groups_per_cta(self) -> int:
        """(row, k-group) pairs one CTA quantizes per round."""
        return self.threads // self.lanes


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
        kv: Int32,
        ldv: Int32,
        stream: cuda.CUstream,
    ):
        cfg = self.config
        k = cute.assume(kv * cfg.vec, divby=cfg.vec)  # lets the row accesses be proven aligned
        ld = cute.assume(ldv * VEC, divby=VEC)  # x's row stride: whole 16-byte chunks
        kb = (k + GROUP - 1) // GROUP
        mX = cute.make_tensor(x_ptr, cute.make_layout((m, k), stride=(ld, 1)))
        # e4m3 output viewed as 32-bit words: vec/4 words per thread
        kw = cute.assume(kv * (cfg.vec // 4), divby=cfg.vec // 4)
        mQ = cute.make_tensor(
            cute.recast_ptr(q_ptr, dtype=Int32), cute.make_layout((m, kw), stride=(kw, 1))
        )
        mS = cute.make_tensor(s_ptr, cute.make_layout((m, kb), stride=(kb, 1)))
        groups = m * kb
        per_cta = cfg.groups_per_cta * cfg.rounds
        grid = (groups + per_cta - 1) // per_cta
        self.kernel(mX, mQ, mS, m, k, kb).launch(grid=[grid, 1, 1], block=[cfg.threads, 1, 1], stream=stream,
                                                 use_pdl=cfg.pdl)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor, m: Int32, k: Int32, kb: Int32):
        cfg = self.config
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        if cutlass.const_expr(cfg.pdl):  # start the next kernel (gate_up) early; then wait for x
            cute.arch.griddepcontrol_launch_dependents()
            cute.arch.griddepcontrol_wait()
        lanes = cfg.lanes
        loads = cfg.vec // VEC  # 16-byte loads per thread and group
        words = cfg.vec // 4  # e4m3 words per thread and group
        sub = tidx % lanes
        gX = cute.zipped_divide(mX, (1, VEC))  # ((1, 8), (M, K/8))
        gQ = cute.zipped_divide(mQ, (1, words))  # ((1, words), (M, K/vec)) in words
        # explicit 16-byte loads / (2 or 4)·4-byte stores: compilation fails if alignment is not provable
        load16 = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.BFloat16, num_bits_per_copy=128)
        store = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Int32, num_bits_per_copy=32 * words)

        # issue all loads first (more bytes in flight per thread), then quantize each group
        rows, kgroups, cols, valids, regs = [], [], [], [], []
        for r in cutlass.range_constexpr(cfg.rounds):
            group = (bidx * cfg.rounds + r) * cfg.groups_per_cta + tidx // lanes
            row = group // kb
            kgroup = group - row * kb
            col = kgroup * GROUP + sub * cfg.vec
            valid = (row < m) & (col < k)
            parts = []
            for j in cutlass.range_constexpr(loads):
                rX = cute.make_rmem_tensor(cute.make_layout(VEC), cutlass.BFloat16)
                rX.fill(0.0)
                if valid:
                    cute.copy(load16, gX[((0, None), (row, col // VEC + j))], rX)
                parts.append(rX)
            rows.append(row)
            kgroups.append(kgroup)
            cols.append(col)
            valids.append(valid)
            regs.append(parts)

        for r in cutlass.range_constexpr(cfg.rounds):
            rF = []  # the thread's vec columns as fp32, in 8-column parts
            for j in cutlass.range_constexpr(loads):
                part = cute.make_rmem_tensor(cute.make_layout(VEC), Float32)
                part.store(regs[r][j].load().to(Float32))
                rF.append(part)
            amax = Float32(0.0)
            for i in cutlass.range_constexpr(cfg.vec):
                amax = cute.arch.fmax(amax, abs(rF[i // VEC][i % VEC]), nan=True)
            for off in cutlass.range_constexpr(lanes.bit_length() - 1):
                other = cute.arch.shuffle_sync_bfly(amax, offset=lanes >> (off + 1))
                amax = cute.arch.fmax(amax, other, nan=True)
            s = div_rn(amax, Float32(FP8_MAX))
            if amax == Float32(0.0):
                s = Float32(1.0)
            rQ = cute.make_rmem_tensor(cute.make_layout(words), Int32)
            for w in cutlass.range_constexpr(words):
                part, i = rF[4 * w // VEC], 4 * w % VEC
                rQ[w] = cvt_e4m3x4(
                    div_rn(part[i + 0], s),
                    div_rn(part[i + 1], s),
                    div_rn(part[i + 2], s),
                    div_rn(part[i + 3], s),
                )
            if valids[r]:
                cute.copy(store, rQ, gQ[((0, None), (rows[r], cols[r] // cfg.vec))])
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
        Int32(1),
        null_stream(),
        options=COMPILE_OPTIONS,
    )


def select_config(m: int, k: int) -> QuantXConfig:
    """The thread ↔ data map for x [M, K]: kernels/dispatch.py's quant_x_map (DISPATCH D1)."""
    return QuantXConfig(**dispatch.quant_x_map(m, k))


def shipped_configs() -> list[QuantXConfig]:
    return [QuantXConfig(rounds=1), QuantXConfig(rounds=1, pdl=True), QuantXConfig(rounds=ROUNDS),
            QuantXConfig(rounds=1, vec=2 * VEC), QuantXConfig(rounds=1, vec=2 * VEC, threads=128)]


def quant_x(x, config: QuantXConfig | None = None, *, out=None):
    """Run the kernel on a CUDA bf16 x [M, K] (unit column stride, a row stride that is a multiple of
    8, K % 8 == 0, 16-byte aligned);
    the caller (ops.py) validates. Returns (q e4m3 [M, K], x_scale fp32 [M, ceil(K/128)]);
    ``out`` = (q, x_scale) writes into given tensors (the tests poison them first)."""
    import torch

    from . import compile_cache

    m, k = x.shape
    if config is None:
        config = select_config(m, k)
    if out is None:
        q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
        s = torch.empty((m, cdiv(k, GROUP)), dtype=torch.float32, device=x.device)
    else:
        q, s = out
    if m == 0 or k == 0:
        return q, s
    if k % config.vec:
        raise ValueError(f"x: K = {k} is not a multiple of {config.vec}, which {config} needs; "
                         f"use a config with vec={VEC} (select_config picks one)")
    fn = compile_cache.get("quant_x", config, lambda: compile_quant_x(config))
    stream = cuda.CUstream(torch.cuda.current_stream(x.device).cuda_stream)
    fn(
        compile_cache.ptr(cutlass.BFloat16, x, 16),
        compile_cache.ptr(cutlass.Float8E4M3FN, q, 16),
        compile_cache.ptr(cutlass.Float32, s, 4),
        Int32(m),
        Int32(k // config.vec),
        Int32(x.stride(0) // VEC if m > 1 else k // VEC),
        stream,
    )
    return q, s
