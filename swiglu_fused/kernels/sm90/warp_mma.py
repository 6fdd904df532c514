"""nvfp4 W4A16 at decode sizes (M ≤ 32) on warp-level mma.sync (DISPATCH D33): gate_up with its
act·up epilogue and down, on the modules' tile-major weight (kernels/nvfp4_layout.py).

Why not the wgmma kernels (gemm.py with nvfp4.py's mainloop): at decode sizes they decode each weight k
tile into shared memory, fence, meet at a barrier and issue one wgmma a tile; that chain, not HBM,
sets their time (the same microseconds on the H200 as on the H100; benchmarks/history/nvfp4.md
v18-v20). Here every warp loads its weight straight into registers, decodes it there and feeds
mma.sync, with no barrier in the k loop, so the warps of an SM run out of step and their loads
stay in flight (benchmarks.probe_warp_mma measured the design: 1.8-2.2× faster at M = 1).

Work: a CTA takes ``warps`` pairs of 16-row blocks of one 256-row weight tile (the tile-major n
tile: for gate_up 128 gate rows, then the 128 up rows of the same h columns) and k_cta of its
columns: with eight warps the whole tile, with four one of its halves (CTA part p, 8 // warps of
them a tile). Warp w of part p takes the blocks 16v and 128 + 16v, v = warps · p + w, so that a
thread holds a gate value and its up value. The K splits of a CTA's rows meet through fp32
partials: the last CTA to arrive (a kept-zero counter, schedule.stream_k_counters) sums them in
split order (deterministic) and runs the epilogue.

A lane's data (lane = 4g + t): each 128-column block, 16 bytes of rows g and g + 8 of each block
(chunk t: k tile t / 2, half t % 2, i.e. columns 32t … 32t + 31; word q of it columns 32t + 8q …
+ 7) and the two rows' scale words of that k tile. mma.m16n8k16 wants a lane's A pairs at columns
2t, 2t+1 and 2t+8, 2t+9 of each k16 step; instead of a layout made for that, the k order is
permuted: step 2q + h takes pairs 2h (a0, a1) and 2h + 1 (a2, a3) of word q, and x is staged in
shared memory in the matching order (columns 32t + 8q + 4h + 2b + e at position 16(2q + h) + 8b +
2t + e of the block), which the B fragments' ldmatrix then reads as usual. The sum over k is the
same sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .. import nvfp4_layout
from .activations_and_h import activation
from .gemm import nvfp4_global_scales
from .nvfp4 import UNSHIFT
from .ptx import (
    e2m1x8_to_bf16x2x4, e4m3x2_to_bf16x2, ld_global_nc_b32, ld_global_nc_v4, ld_global_v4, ldmatrix_b,
    mma_bf16_m16n8k16, prmt, st_shared_b32,
)

ROWS = nvfp4_layout.ROWS  # a tile-major n tile's weight rows (a CTA's with 8 warps, half with 4)
HALF = ROWS // 2  # gate_up: the tile's gate rows, then its up rows (the interleave)
BLOCK_K = 128  # columns of one step of the k loop (a lane's 16-byte loads: two k tiles)
MAX_TOKENS = 32
K_TILE_BYTES = ROWS * nvfp4_layout.K_TILE // 2  # a tile-major k tile's codes (8 KB)
EPILOGUES = ("gate_up", "down")
STAGE_LOADS = 8  # 16-byte loads of x a thread issues at once when it stages x
RED_LOADS = 64  # partial values a thread loads at once when the last CTA of a tile sums the splits


@dataclass(frozen=True)
class WarpMmaConfig:
    """Compile-time configuration (the cache key)."""

    epilogue: str  # "gate_up" (h = act(gate) · up, bf16) or "down" (bf16 y, + residual)
    warps: int = 8  # 8: a CTA takes a whole 256-row tile; 4: half of one (twice the CTAs, half the threads)
    n8: int = 1  # token tiles of 8: M ≤ 8 · n8 (1, 2 or 4)
    k_cta: int = 512  # columns a CTA (a multiple of BLOCK_K dividing K)
    split_k: bool = True  # K > k_cta: the K / k_cta CTAs of a tile meet through fp32 partials
    depth: int = 2  # 128-column blocks loaded ahead
    act: str = "silu"  # gate_up
    residual: bool = False  # down
    # programmatic dependent launch (as TileConfig.pdl, D20): the first blocks' weight loads are
    # issued before griddepcontrol.wait, which x waits behind; the next kernel may launch once this
    # one's k loop is done (its loads all landed), under the K shares' sums and the epilogue
    pdl: bool = False
    # pdl: the next kernel may launch only once this one's K-share sums and epilogue are done (each CTA
    # triggers as it leaves), not after its k loop: its CTAs then find this kernel's SMs freed as they
    # launch (gate_up's where down's grid is small: dispatch_nvfp4.WARP_MMA_LATE_TRIGGER_SHARE, D58)
    late_trigger: bool = False
    # CTAs an SM the registers must allow (ptxas caps them at 65536 / (threads · this)); 0: no cap
    ctas_per_sm: int = 0
    # shared memory a CTA reserves at least, in KB (0: what it uses); > 114 leaves room for one CTA an
    # SM (a measurement of where the block scheduler places a small grid, history/nvfp4.md v34)
    smem_floor_kb: int = 0

    def __post_init__(self):
        if (self.epilogue not in EPILOGUES or self.warps not in (4, 8) or self.n8 not in (1, 2, 4)
                or self.k_cta % BLOCK_K or self.depth < 1 or self.ctas_per_sm < 0 or not 0 <= self.smem_floor_kb <= 227
                or (self.late_trigger and not self.pdl)):
            raise ValueError(f"WarpMmaConfig: not a config of the warp-MMA kernel: {self}")

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def parts(self) -> int:
        """CTAs a 256-row tile."""
        return 8 // self.warps

    def grid(self, n, k):
        """(CTAs along N, K shares) of a launch over N weight rows and K columns (ints, or the
        kernel's traced Int32s)."""
        return n // ROWS * self.parts, k // self.k_cta

    @property
    def values(self) -> int:
        """fp32 accumulator values a thread: two row blocks × n8 token tiles × 4."""
        return 2 * self.n8 * 4

    @property
    def x_words(self) -> int:
        """Shared-memory words of a staged x row: k_cta bf16 + 16 bytes of pad (ldmatrix without
        bank conflicts)."""
        return (self.k_cta + 8) // 2


class WarpMmaKernel:
    def __init__(self, config: WarpMmaConfig):
        self.cfg = config

    @cute.jit
    def __call__(self, w_ptr: cute.Pointer, s_ptr: cute.Pointer, x_ptr: cute.Pointer, gs_ptr: cute.Pointer,
                 out_ptr: cute.Pointer, res_ptr: cute.Pointer, part_ptr: cute.Pointer, ctr_ptr: cute.Pointer,
                 m: Int32, n: Int32, k: Int32, stream: cuda.CUstream):
        cfg = self.cfg
        ctas, splits = cfg.grid(n, k)
        out_cols = n // 2 if cutlass.const_expr(cfg.epilogue == "gate_up") else n
        mOut = cute.make_tensor(out_ptr, cute.make_layout((m, out_cols), stride=(out_cols, 1)))
        mRes = cute.make_tensor(res_ptr, cute.make_layout((m, n), stride=(n, 1)))
        mGS = cute.make_tensor(gs_ptr, cute.make_layout(2))  # (down reads [0] only: one value will do)
        mPart = cute.make_tensor(part_ptr, cute.make_layout((splits * ctas, cfg.values, cfg.threads),
                                                            stride=(cfg.values * cfg.threads, cfg.threads, 1)))
        mCtr = cute.make_tensor(ctr_ptr, cute.make_layout(ctas))
        # (a carveout given, -1 = the driver's default, keeps the DSL from asking a GPU for its
        # shared memory at compile time)
        extra = {"min_blocks_per_mp": cfg.ctas_per_sm, "preferred_smem_carveout": -1} if cfg.ctas_per_sm else {}
        self.kernel(w_ptr, s_ptr, x_ptr, mGS, mOut, mRes, mPart, mCtr, m, k, ctas).launch(
            grid=[ctas, splits, 1], block=[cfg.threads, 1, 1], stream=stream, use_pdl=cfg.pdl, **extra)

    def _storage(self):
        cfg = self.cfg
        Align, MemRange = cute.struct.Align, cute.struct.MemRange
        fields = {"x": Align[MemRange[Int32, 8 * cfg.n8 * cfg.x_words], 16], "flag": MemRange[Int32, 4]}
        pad = cfg.smem_floor_kb * 256 - 8 * cfg.n8 * cfg.x_words - 4  # (words)
        if pad > 0:
            fields["pad"] = MemRange[Int32, pad]
        return cute.struct(type("WarpMmaStorage", (), {"__annotations__": fields}))

    @cute.kernel
    def kernel(self, w_ptr: cute.Pointer, s_ptr: cute.Pointer, x_ptr: cute.Pointer, mGS: cute.Tensor,
               mOut: cute.Tensor, mRes: cute.Tensor, mPart: cute.Tensor, mCtr: cute.Tensor, m: Int32, k: Int32,
               ctas: Int32):
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        cta, split, _ = cute.arch.block_idx()
        storage = cutlass.utils.SmemAllocator().allocate(self._storage())
        block0 = split * (cfg.k_cta // BLOCK_K)
        tn, v = cta, tidx // 32  # the CTA's tile, this warp's row block pair (module docstring)
        if cutlass.const_expr(cfg.parts > 1):
            tn, v = cta // cfg.parts, cta % cfg.parts * cfg.warps + tidx // 32
        lanes = self._lanes(w_ptr, s_ptr, k, tn, v, tidx)
        ring = [self._load(lanes, block0 + i) for i in range(min(cfg.depth, cfg.k_cta // BLOCK_K))]
        if cutlass.const_expr(cfg.pdl):
            cute.arch.griddepcontrol_wait()  # x is the previous kernel's output (the weight is no kernel's)
        self._stage_x(storage, x_ptr, m, k, block0, tidx)
        cute.arch.barrier()
        vals = cute.make_rmem_tensor(cute.make_layout(cfg.values), Float32)
        for i, value in enumerate(self._mainloop(storage, lanes, ring, block0, tidx)):
            vals[i] = value
        if cutlass.const_expr(cfg.pdl and not cfg.late_trigger):
            cute.arch.griddepcontrol_launch_dependents()
        last = Int32(1)
        if cutlass.const_expr(cfg.split_k):
            last = self._reduce(vals, mPart, mCtr, storage, m, cta, split, ctas, tidx)
        if last == 1:
            self._epilogue(vals, mGS, mOut, mRes, m, tn, v, tidx)
        if cutlass.const_expr(cfg.pdl and cfg.late_trigger):
            cute.arch.griddepcontrol_launch_dependents()

    # ------------------------------------------------------------------ the k loop (plain Python:
    # every loop is unrolled at trace time)
    def _lanes(self, w_ptr, s_ptr, k, tn, v, tidx):
        """This lane's constants: (its tile's first code byte and scale word, its rows in the tile
        (row blocks 16v and 128 + 16v, row g; g + 8 is 8 rows on), its chunk t)."""
        lane = tidx % 32
        k_tiles = k // nvfp4_layout.K_TILE
        codes = w_ptr.toint() + cutlass.Int64(tn) * k_tiles * K_TILE_BYTES
        scales = s_ptr.toint() + cutlass.Int64(tn) * k_tiles * (ROWS * 4)
        rows = tuple(HALF * r + 16 * v + lane // 4 for r in range(2))
        return codes, scales, rows, lane % 4

    def _load(self, lanes, block):
        """Block ``block``'s data of this lane, per row block: (16 bytes of row g, of row g + 8, the
        two rows' scale words of the k tile)."""
        codes, scales, rows, t = lanes
        kt = cutlass.Int64(2 * block + t // 2)  # this lane's k tile of the block
        out = []
        for r in range(2):
            code = codes + kt * K_TILE_BYTES + rows[r] * 32 + 16 * (t % 2)
            scale = scales + (kt * ROWS + rows[r]) * 4
            out.append((ld_global_nc_v4(code), ld_global_nc_v4(code + 8 * 32),
                        ld_global_nc_b32(scale), ld_global_nc_b32(scale + 8 * 4)))
        return out

    def _mainloop(self, storage, lanes, ring, block0, tidx):
        """The CTA's columns: decode and mma, ``depth`` blocks of loads ahead → this thread's fp32
        values, (row block r, token tile j, value e) in that order."""
        cfg = self.cfg
        t = lanes[3]
        lane = tidx % 32
        acc = [[(Float32(0.0),) * 4 for _ in range(cfg.n8)] for _ in range(2)]
        row = lane % 8 + (lane // 16) * 8  # this lane's ldmatrix row (token) and its 8-column half
        x_lane = storage.x.data_ptr().toint() + (row * cfg.x_words + (lane // 8 % 2) * 4) * 4
        sel = (2 * (t % 2)) | ((4 + 2 * (t % 2)) << 4)  # byte 2(t % 2) of row g's scale word, of row g + 8's
        blocks = cfg.k_cta // BLOCK_K
        for i in range(blocks):
            data = ring[i % cfg.depth]
            if i + cfg.depth < blocks:
                ring[i % cfg.depth] = self._load(lanes, block0 + i + cfg.depth)
            scales = [self._scales(data[r], sel) for r in range(2)]
            for q in range(4):  # word q: columns 32t + 8q … of each row, scale group 2(t % 2) + q // 2
                pairs = []
                for r in range(2):
                    sc = scales[r][q // 2]
                    pairs.append((e2m1x8_to_bf16x2x4(data[r][0][q], sc, 0), e2m1x8_to_bf16x2x4(data[r][1][q], sc, 1)))
                for h in range(2):  # k16 step 2q + h: pairs 2h and 2h + 1 of the two rows' words
                    b = self._b(x_lane + (i * BLOCK_K + (2 * q + h) * 16) * 2)
                    for r in range(2):
                        pg, pg8 = pairs[r]
                        a = (pg[2 * h], pg8[2 * h], pg[2 * h + 1], pg8[2 * h + 1])
                        for j in range(cfg.n8):
                            acc[r][j] = mma_bf16_m16n8k16(a, (b[2 * j], b[2 * j + 1]), acc[r][j])
        return [acc[r][j][v] for r in range(2) for j in range(cfg.n8) for v in range(4)]

    def _b(self, addr):
        """The B fragments of one k16 step, two words a token tile: one ldmatrix of its 16 tokens'
        rows (x2 for 8 tokens), a second 16 rows on for 32 tokens."""
        n8 = self.cfg.n8
        if n8 <= 2:
            return ldmatrix_b(addr, 2 * n8)
        return ldmatrix_b(addr, 4) + ldmatrix_b(addr + 16 * self.cfg.x_words * 4, 4)

    @staticmethod
    def _scales(data, sel):
        """A row block's scales for its two groups of the block's chunk (words 0-1, words 2-3): each
        one bf16 pair (row g's low, row g + 8's high; e2m1x8_to_bf16x2x4 takes a half), converted
        once a block, not once a word."""
        _, _, scale_g, scale_g8 = data
        return [e4m3x2_to_bf16x2(prmt(scale_g, scale_g8, sel + 0x11 * half)) for half in range(2)]

    def _token(self, i, t):
        """The token of value i (row block r, token tile j, value e): 8j + 2t + e % 2."""
        j, e = i % (self.cfg.n8 * 4) // 4, i % 4
        return 8 * j + 2 * t + e % 2

    # ------------------------------------------------------------------ traced control flow
    @cute.jit
    def _stage_x(self, storage, x_ptr, m, k, block0, tidx):
        """x[:M, this CTA's columns] into shared memory in the mma's k order (module docstring), rows
        M … 8 · n8 - 1 zero: 16-byte loads of pairs p … p + 3 (one chunk t and word q, (h, b) = 00,
        01, 10, 11), each word to its position; a thread's loads issued STAGE_LOADS at a time, each
        round before its stores (more would hold more registers than the k loop needs)."""
        cfg = self.cfg
        chunks = cfg.k_cta // 8  # 16-byte chunks of a row
        total = 8 * cfg.n8 * chunks
        per_thread = (total + cfg.threads - 1) // cfg.threads
        x_base = storage.x.data_ptr().toint()
        got = cute.make_rmem_tensor(cute.make_layout(4 * min(per_thread, STAGE_LOADS)), Int32)
        for j0 in cutlass.range_constexpr(0, per_thread, STAGE_LOADS):
            got.fill(0)
            for j in cutlass.range_constexpr(j0, min(j0 + STAGE_LOADS, per_thread)):
                idx = tidx + j * cfg.threads
                row, c = idx // chunks, idx % chunks
                if idx < total:
                    if row < m:
                        v = ld_global_v4(x_ptr.toint() + (cutlass.Int64(row) * k + block0 * BLOCK_K + c * 8) * 2)
                        for e in cutlass.range_constexpr(4):
                            got[4 * (j - j0) + e] = v[e]
            for j in cutlass.range_constexpr(j0, min(j0 + STAGE_LOADS, per_thread)):
                idx = tidx + j * cfg.threads
                row, c = idx // chunks, idx % chunks
                pb = 4 * c % 64  # the chunk's first pair within its 128 columns: 16t + 4q
                dst = x_base + (row * cfg.x_words + (4 * c - pb) + 16 * (pb // 4 % 4) + pb // 16) * 4
                if idx < total:
                    for e in cutlass.range_constexpr(4):
                        st_shared_b32(dst + 16 * e, got[4 * (j - j0) + e])

    @cute.jit
    def _reduce(self, vals, mPart, mCtr, storage, m, cta, split, ctas, tidx):
        """This CTA's values → its partial (tokens < M only); the last CTA of its rows to arrive sums
        every split's in split order into ``vals`` (deterministic whatever the arrival order),
        re-zeroes the counter (schedule.stream_k_counters keeps them at zero between launches) and
        returns 1; the others return 0. Memory order as stream_k._fixup: the barrier orders the
        stores before thread 0's acq_rel atomic, whose acquire on the last CTA, then the barrier,
        orders the loads after it."""
        cfg = self.cfg
        t = tidx % 4
        splits = mPart.shape[0] // ctas
        for i in cutlass.range_constexpr(cfg.values):
            if self._token(i, t) < m:
                mPart[split * ctas + cta, i, tidx] = vals[i]
        cute.arch.barrier()
        sFlag = storage.flag.get_tensor(cute.make_layout(4))
        if tidx == 0:
            sFlag[0] = cute.arch.atomic_add(mCtr.iterator + cta, Int32(1), sem="acq_rel", scope="gpu")
        cute.arch.barrier()
        last = Int32(0)
        if sFlag[0] == splits - 1:
            last = Int32(1)
            vals.fill(0.0)
            # RED_LOADS partial values in flight a thread: a round trip for every few splits, not each
            batch = max(1, RED_LOADS // cfg.values)
            got = cute.make_rmem_tensor(cute.make_layout(batch * cfg.values), Float32)
            for s0 in cutlass.range(0, splits, batch, unroll=1):
                for u in cutlass.range_constexpr(batch):
                    for i in cutlass.range_constexpr(cfg.values):
                        got[u * cfg.values + i] = Float32(0.0)
                        if s0 + u < splits:
                            if self._token(i, t) < m:
                                got[u * cfg.values + i] = mPart[(s0 + u) * ctas + cta, i, tidx]
                for u in cutlass.range_constexpr(batch):  # (in split order)
                    for i in cutlass.range_constexpr(cfg.values):
                        vals[i] = vals[i] + got[u * cfg.values + i]
            if tidx == 0:
                mCtr[cta] = Int32(0)
        return last

    @cute.jit
    def _epilogue(self, vals, mGS, mOut, mRes, m, tn, v, tidx):
        """gate_up: h[token, 128·tn + 16v + g (+ 8)] = act(gate · gs[0]) · up · gs[1] (each also ·
        2^UNSHIFT), bf16. down: y[token, 256·tn + 128r + 16v + g (+ 8)] = value · gs[0] · 2^UNSHIFT
        (+ residual), bf16. Value (r, j, e): row g + 8 (e // 2) of row block r, token 8j + 2t + e % 2."""
        cfg = self.cfg
        g, t = tidx % 32 // 4, tidx % 4
        unshift = float(2 ** UNSHIFT)
        per_r = cfg.n8 * 4
        if cutlass.const_expr(cfg.epilogue == "gate_up"):
            act = activation(cfg.act)
            g0, g1 = mGS[0] * unshift, mGS[1] * unshift
            for i in cutlass.range_constexpr(per_r):
                tok = self._token(i, t)
                if tok < m:
                    h = act(vals[i] * g0) * (vals[per_r + i] * g1)
                    mOut[tok, HALF * tn + 16 * v + g + 8 * (i % 4 // 2)] = h.to(cutlass.BFloat16)
        else:
            g0 = mGS[0] * unshift
            for i in cutlass.range_constexpr(cfg.values):
                tok = self._token(i, t)
                if tok < m:
                    col = ROWS * tn + HALF * (i // per_r) + 16 * v + g + 8 * (i % 4 // 2)
                    y = vals[i] * g0
                    if cutlass.const_expr(cfg.residual):
                        y = y + mRes[tok, col].to(Float32)
                    mOut[tok, col] = y.to(cutlass.BFloat16)


# ---------------------------------------------------------------- host side
def compile_warp_mma(config: WarpMmaConfig):
    """Compile for sm_90a (no GPU needed)."""
    from .compile_cache import COMPILE_OPTIONS, fake_ptr, null_stream

    bf16 = cutlass.BFloat16
    return cute.compile(WarpMmaKernel(config), fake_ptr(cutlass.Uint8, 16), fake_ptr(cutlass.Uint8, 4),
                        fake_ptr(bf16, 16), fake_ptr(Float32, 4), fake_ptr(bf16, 2), fake_ptr(bf16, 2),
                        fake_ptr(Float32, 16), fake_ptr(Int32, 4), Int32(1), Int32(ROWS), Int32(config.k_cta),
                        null_stream(), options=COMPILE_OPTIONS)


def gate_up(config: WarpMmaConfig, x, weight, weight_scale, global_scale):
    """h [M, N/2] bf16 = act(x @ gate^T · gs[0]) · (x @ up^T · gs[1]) for a tile-major nvfp4 gate_up
    weight [N, K/2] (interleave 128) and its scales; x bf16 [M, K], M ≤ 8 · config.n8. The caller
    (dispatch_nvfp4.warp_mma_config) has checked what the kernel takes."""
    import torch

    h = torch.empty((x.shape[0], weight.shape[0] // 2), dtype=torch.bfloat16, device=x.device)
    _launch(config, x, weight, weight_scale, nvfp4_global_scales(global_scale, 2), h, None)
    return h


def down(config: WarpMmaConfig, h, weight, weight_scale, global_scale, residual=None):
    """y [M, N] bf16 = h @ W^T · gs (+ residual) for a tile-major nvfp4 weight [N, K/2]."""
    import torch

    y = torch.empty((h.shape[0], weight.shape[0]), dtype=torch.bfloat16, device=h.device)
    _launch(config, h, weight, weight_scale, nvfp4_global_scales(global_scale, 1), y, residual)  # ([0] only)
    return y


def _launch(config, a, weight, weight_scale, gs, out, residual):
    import torch

    from . import compile_cache, schedule

    m, k = a.shape
    n = weight.shape[0]
    if k % config.k_cta or config.split_k != (k > config.k_cta) or n % ROWS or m > 8 * config.n8:
        # (dispatch_nvfp4.warp_mma_config never picks such a config; a forced one, a harness A/B, would
        # sum part of K or of the rows and return a wrong result without a word)
        raise ValueError(f"{config} does not fit M = {m}, N = {n}, K = {k}: K must be a multiple of k_cta "
                         f"(split_k: K > k_cta), N of {ROWS}, M at most {8 * config.n8}")
    a = a.contiguous()
    stream = torch.cuda.current_stream(a.device)
    ctas, splits = config.grid(n, k)
    if config.split_k:
        part = torch.empty(splits * ctas * config.values * config.threads, dtype=torch.float32, device=a.device)
        ctr = schedule.stream_k_counters(a.device, ctas, stream)
    else:  # (never dereferenced)
        part, ctr = gs, gs
    res = out if residual is None else residual.contiguous()
    fn = compile_cache.get("nvfp4_warp_mma", config, lambda: compile_warp_mma(config))
    ptr = compile_cache.ptr
    fn(ptr(cutlass.Uint8, weight, 16), ptr(cutlass.Uint8, weight_scale, 4), ptr(cutlass.BFloat16, a, 16),
       ptr(Float32, gs, 4), ptr(cutlass.BFloat16, out, 2), ptr(cutlass.BFloat16, res, 2), ptr(Float32, part, 16),
       ptr(Int32, ctr, 4), Int32(m), Int32(n), Int32(k), cuda.CUstream(stream.cuda_stream))
