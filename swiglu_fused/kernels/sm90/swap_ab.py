"""Swap-AB tiles of the sm90 GEMM for decode-sized M (gate_up and down; fp8_block128, and bf16 for
gate_up): the weights are the wgmma's A operand (its M side: a tile's 256 weight rows are 4 blocks
of 64) and the tokens its B operand (N side: tile_m = 16, 32 or 64 tokens), so the tensor cores
compute 256 × tile_m per k step instead of 64 × 256 with the 64-row tile. Shipped: 16 tokens
(dispatch.gate_up_tile_for, dispatch.down_tile_for); 32 and 64 not shipped (DISPATCH D2). nvfp4
(W4A16) runs only swap-AB tiles: every multiple of 16 tokens to 160, and 192 for gate_up
(dispatch_nvfp4.nvfp4_tile_for; D24, D31, D32, D62-D64), where the weight rows on the M side also read fewer
smem bytes a k tile; and 224-256 tokens on tiles of 128 weight rows (TileConfig.nvfp4_half_rows: one block
a warpgroup; down's the tile's one 128-column half of y, D67; gate_up's 64 gate rows and their up rows,
TileConfig.half_row_pairs, D68: _epilogue_swap_pairs).

Why: with the 64-row tile a 32 KB weight k tile costs one SM 4.2 MFLOP whatever M is, 0.59 µs,
so a CTA streams weights at ~55 GB/s (tensor-bound), and HBM needs ≥ 55 busy SMs; at M = 16 three
quarters of that work is zero rows. With 16 tokens on the N side the same k tile is 1 MFLOP.

Everything but the consumer warpgroups (_consume) is gemm.GemmKernel's: the TMA producer
(A = x tile [tile_m, 128], W = weight tile [256, 128]), the persistent / stream-K schedule and its
fix-up (stream_k.py; _partial is overridden here for this accumulator), the slab copy-out, and the
bf16 mainloop (mainloop.py's, with the weights as the wgmma's A operand). The consumer warpgroups
(one for 16 and 32 tokens, two for 64) hold the 256 × tile_m accumulator: W = 1 or 2 warpgroups
side by side along the weight rows, repeated 4/W times (blocks) over the 256 rows, tile_m/2 fp32
per block and thread (32 or 64 registers in all, and as many for the wgmma temp).

Fragment of block b (wgmma C layout, value v of thread t, w = t / 128, lane = t % 32, warp = t / 32):

    weight row = 64·(W·b + w) + 16·(warp % 4) + lane/4 + 8·((v/2)%2)
    token      = 8·(v/4) + 2·(lane%4) + v%2

The first half of a thread's blocks are the tile's gate rows (h columns 0..127 of the tile), the
second half its up rows, in the same order: gate and up of one h column are the same value index of
blocks b and b + B/2 (B = 4/W blocks), so act(gate)·up stays register-local. fp8 promotion per
128-wide k block: acc += temp · x_scale[token] · w_scale[half], the weight half being b / (B/2);
the bf16 mainloop accumulates straight into acc. The fp8 mainloop (_mainloop_fp8_swap) keeps two
wgmma temps so that k tile kt+1's MMAs run while kt is promoted (a branch-free loop over pairs of
k tiles).

Epilogue "gated" (gate_up): per token, amax over the tile's 128 h columns = in-thread (B/2 blocks
× 2 rows), butterfly over lane/4 (xor 4, 8, 16), then over the 4·W warps through smem. h is staged
in smem token-major (one byte or bf16 per value) and copied out 16 bytes per thread (each
warpgroup its share of the tokens); h_scale per token.
Epilogue "linear" (down): gate-position blocks are output columns [256n, 256n+128), the others the
next 128; each half is staged token-major as bf16 (the residual, when compiled in, copied into the
slab first and added in fp32 before the one rounding) and copied out masked at M and N.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32

from .gemm import GemmKernel, Gmem
from .mainloop import TileWork
from .ptx import bf16_lo_to_f32, cvt_bf16x2, div_rn
from .stream_k import Schedule
from .tile_config import BF16_MAINLOOP, HALF_N, N_ALIGN, W_BLOCK


class SwapOperands(NamedTuple):
    """What the swap-AB mainloops read, per CTA (SwapABKernel._consume; trace values)."""

    tiled_mma: Any
    tCrW: Any  # the weights: the wgmma's A operand, (MMA, blocks, MMA_K, STAGES)
    tCrX: Any  # the tokens: its B operand, (MMA, 1, MMA_K, STAGES)
    num_k_blocks: int  # wgmma k steps per k tile
    temp: Any  # fp8: the two wgmma temps
    temp2: Any
    xrow: Any  # fp8: the a_scale rows of this thread's tokens (clamped to M - 1)
    xs_a: Any  # x scales of temp's k tile
    xs_b: Any  # and of temp2's
    sc: Any  # promotion scales (scratch)
    n_vals: int  # values per block
    n_tok: int  # distinct tokens of a thread
    tok0: Any  # token of value j = 0
    mAS: Any
    mWS: Any
    m: Any
    ws_last: Any  # the last weight-scale row
    dec: Any = None  # nvfp4: the decode's operands (nvfp4.DecodeOperands)


def _pair(inv, j: int):
    """(1/s of value j, of value j + 1): the two tokens of a packed pair; (None, None) unscaled."""
    return (None, None) if inv is None else (inv[j], inv[j + 1])


def _rs_column(col):
    """Where h column ``col`` goes in nvfp4_layout.rs_k_order (its bits 1-2 and 4-5 trade places)."""
    return (col & ~0x36) | ((col >> 3) & 0x6) | ((col & 0x6) << 3)


class SwapABKernel(GemmKernel):
    """GemmKernel with the swap-AB consumer (config.swap_ab; see the module docstring)."""

    def __init__(self, config):
        super().__init__(config)
        self.blocks = self.cfg.tile_n // 64 // self.num_mma_wg  # 64-row blocks per thread (1: nvfp4_half_rows)
        self.halves = self.cfg.tile_n // HALF_N  # 128-row halves of the tile (gate_up: gate, up)

    def _tiled_mma(self):
        major = cute.nvgpu.warpgroup.OperandMajorMode.K
        source = cute.nvgpu.warpgroup.OperandSource  # rs_decode: the weight (A) from registers
        return sm90_utils.make_trivial_tiled_mma(
            self.ab_dtype, self.ab_dtype, major, major, self.acc_dtype, (self.num_mma_wg, 1, 1),
            tiler_mn=(64, self.cfg.tile_m), a_source=source.RMEM if self.cfg.rs_decode else source.SMEM,
        )

    @cute.jit
    def _consume(self, tiled_mma, mainloop, sA, sB, storage, gmem: Gmem, sched: Schedule, tidx, wg_idx):
        """The swap-AB consumer warpgroups (see the module docstring); its output leaves by vector
        stores (gmem.mOut, the output as 32-bit words)."""
        cfg = self.cfg
        ops, acc, tCcC, sRed = self._swap_operands(tiled_mma, sA, sB, storage, gmem, tidx, wg_idx)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, cfg.stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, cfg.stages)
        self._swap_tiles(mainloop, state, release, ops, acc, tCcC, self._slab(storage), sRed, storage, gmem, sched,
                         tidx - 128)

    def _slab(self, storage):
        """The epilogue's staging slab in smem: (tile_m rows, out_row_words) 32-bit words."""
        cfg = self.cfg
        return storage.sO.get_tensor(cute.make_layout((cfg.tile_m, cfg.out_row_words), stride=(cfg.out_row_words, 1)))

    def _swap_operands(self, tiled_mma, sA, sB, storage, gmem: Gmem, tidx, wg_idx):
        """(SwapOperands, the accumulator, its coordinates, the amax exchange in smem): what the
        consumer's mainloops and epilogues read, per CTA (plain Python, inlined)."""
        cfg = self.cfg
        ws_last = (gmem.n + W_BLOCK - 1) // W_BLOCK - 1
        t = tidx - 128
        thr_mma = tiled_mma.get_slice(t)
        dec = None
        if cutlass.const_expr(cfg.nvfp4):
            dec = self._decode_operands(storage, gmem, t)
        thr_ab = tiled_mma.get_slice((wg_idx - 1) * 128) if cfg.uniform_ab else thr_mma  # (gemm.py)
        if cutlass.const_expr(cfg.rs_decode):  # the decoded weight: this thread's A fragments of a k tile
            tCrW = cute.make_rmem_tensor(thr_mma.partition_shape_A((cfg.tile_n, cfg.tile_k)), self.ab_dtype)
        else:
            if cutlass.const_expr(cfg.nvfp4):  # the wgmma reads the weight from the decode buffers
                d_layout = self._decode_layout()
                sB = storage.sD.get_tensor(d_layout.outer, swizzle=d_layout.inner)
            tCrW = tiled_mma.make_fragment_A(thr_ab.partition_A(sB))  # (MMA, blocks, MMA_K, STAGES or 2 buffers)
        tCrX = tiled_mma.make_fragment_B(thr_ab.partition_B(sA))  # (MMA, 1, MMA_K, STAGES)
        num_k_blocks = cute.size(tCrX, mode=[2])
        tCcC = thr_mma.partition_C(cute.make_identity_tensor((cfg.tile_n, cfg.tile_m)))  # (MMA, blocks, 1)
        acc = cute.make_rmem_tensor(tCcC.shape, self.acc_dtype)
        # fp8: two wgmma temps, so that k tile kt+1's MMAs run while kt is promoted
        temp = cute.make_rmem_tensor(tCcC.shape, self.acc_dtype)
        temp2 = cute.make_rmem_tensor(tCcC.shape, self.acc_dtype)
        n_vals = cute.size(tCcC, mode=[0])  # tile_m / 2 per block
        n_tok = n_vals // 2  # distinct tokens of a thread: value v has token j(v) = 2·(v/4) + v%2
        tok0 = tCcC[(0, 0, 0)][1]  # token of j = 0; token of j is tok0 + 8·(j/2) + j%2
        # x_scale rows of this thread's tokens (tokens past M read row M-1: their x rows are zero-fill)
        xrow = cute.make_rmem_tensor(cute.make_layout(n_tok), Int32)
        xs_a = cute.make_rmem_tensor(cute.make_layout(n_tok), Float32)  # x scales of temp's k tile
        xs_b = cute.make_rmem_tensor(cute.make_layout(n_tok), Float32)  # and of temp2's
        sc = cute.make_rmem_tensor(cute.make_layout(n_tok), Float32)
        sRed = storage.red.get_tensor(cute.make_layout((4 * self.num_mma_wg, cfg.tile_m), stride=(cfg.tile_m, 1)))
        ops = SwapOperands(tiled_mma, tCrW, tCrX, num_k_blocks, temp, temp2, xrow, xs_a, xs_b, sc, n_vals, n_tok,
                           tok0, gmem.mAS, gmem.mWS, gmem.m, ws_last, dec)
        return ops, acc, tCcC, sRed

    @cute.jit
    def _swap_tiles(self, mainloop, state, release, ops: SwapOperands, acc, tCcC, sO, sRed, storage, gmem: Gmem,
                    sched: Schedule, t, after_epilogue=None):
        """This CTA's segments (stream_k.py): mainloop, fix-up, epilogue; ``after_epilogue()`` (trace
        time: decode_mlp.py's hand-over of h) after each epilogue. Returns the pipeline states."""
        cfg = self.cfg
        m, n, mOut, mAux = gmem.m, gmem.n, gmem.mOut, gmem.mAux
        n_vals, n_tok, tok0 = ops.n_vals, ops.n_tok, ops.tok0
        cursor = Int32(0)
        cursor_end = sched.cursor_end
        while cursor < cursor_end:
            tile, kb0, kb1 = self._segment(cursor, sched)
            tm, tn = self._tile_mn(tile, sched.tiling)
            cursor += kb1 - kb0
            acc.fill(0.0)
            state, release = self._swap_mainloop(mainloop, state, release, ops, acc, TileWork(tm, tn, kb0, kb1))
            epi = self._finish_tile(acc, n_vals, Int32(0), m, tile, sched, gmem.mPart, gmem.mCtr, storage, t)
            if epi != 0:
                if cutlass.const_expr(cfg.half_row_pairs):
                    self._epilogue_swap_pairs(acc, tCcC, n_vals, tm, tn, m, sO, mOut, t)
                elif cutlass.const_expr(cfg.epilogue == "gated"):
                    self._epilogue_swap(acc, tCcC, n_vals, n_tok, tok0, tm, tn, m, sO, sRed, mOut, mAux, t)
                else:
                    self._epilogue_swap_linear(acc, tCcC, n_vals, tm, tn, m, n, sO, mOut, mAux, t)
                if cutlass.const_expr(after_epilogue is not None):
                    after_epilogue()
        return state, release

    def _swap_mainloop(self, mainloop, state, release, ops: SwapOperands, acc, work: TileWork):
        """The swap-AB tile's mainloop for cfg.mainloop (chosen at trace time; the interface of
        mainloop.py's): the bf16 one is the row tiles' with the weights as the wgmma's A operand."""
        if self.cfg.nvfp4:  # W4A16 (nvfp4.py): global scale of the block's half (gate blocks first)
            run = self._mainloop_nvfp4_rs if self.cfg.rs_decode else self._mainloop_nvfp4
            state, release = run(mainloop, state, release, ops.tiled_mma, acc, ops.tCrW, ops.tCrX, ops.dec, work.kb0,
                                 work.kb1, ops.num_k_blocks)
            if self.cfg.half_row_pairs:
                self._scale_pairs(acc, ops.dec.mGS)
            else:
                self._scale_halves(acc, ops.dec.mGS, lambda b, h: b // (self.blocks // self.halves))
            return state, release
        if self.cfg.mainloop == BF16_MAINLOOP:
            return self._mainloop_bf16(mainloop, state, release, ops.tiled_mma, acc, ops.tCrW, ops.tCrX, work.kb0,
                                       work.kb1, ops.num_k_blocks)
        return self._mainloop_fp8_swap(mainloop, state, release, ops, acc, work)

    @cute.jit
    def _mainloop_fp8_swap(self, mainloop, state, release, ops: SwapOperands, acc, work: TileWork):
        """k tiles alternate between temp and temp2: issue tile k + 1, wait for tile k only
        (wait_group(1)), release its stage, promote it. The loop body has no branches (with them,
        ptxas cannot tell which group is in flight and injects waits); the last one or two tiles
        drain after it."""
        cfg = self.cfg
        tiled_mma, tCrW, tCrX, num_k_blocks, temp, temp2 = (ops.tiled_mma, ops.tCrW, ops.tCrX, ops.num_k_blocks,
                                                            ops.temp, ops.temp2)
        xrow, xs_a, xs_b, sc = ops.xrow, ops.xs_a, ops.xs_b, ops.sc
        n_vals, n_tok, tok0 = ops.n_vals, ops.n_tok, ops.tok0
        mAS, mWS, m, ws_last = ops.mAS, ops.mWS, ops.m, ops.ws_last
        tm, tn, kb0, kb1 = work.tm, work.tn, work.kb0, work.kb1
        for j in cutlass.range_constexpr(n_tok):
            xrow[j] = cutlass.min(tm * cfg.tile_m + tok0 + 8 * (j // 2) + j % 2, m - 1)
        wrow_0 = cutlass.min(2 * tn, ws_last)
        wrow_1 = cutlass.min(2 * tn + 1, ws_last)
        scales = (mAS, mWS, xrow, wrow_0, wrow_1, n_tok)
        ws_a0, ws_a1 = self._scales(mAS, mWS, xrow, xs_a, wrow_0, wrow_1, kb0, n_tok)
        ws_b0 = ws_a0
        ws_b1 = ws_a1
        mainloop.consumer_wait(state)
        self._issue(tiled_mma, temp, tCrW, tCrX, state.index, num_k_blocks)
        state.advance()
        pipe = (mainloop, tiled_mma, tCrW, tCrX, num_k_blocks)
        # (state / release advance here, not in the helpers: the tracer carries pipeline states
        # through the loop only where it sees them advanced)
        for kt in cutlass.range(kb0, kb1 - 2, 2, unroll=1):  # temp holds kt, in flight
            ws_b0, ws_b1 = self._issue_next(pipe, state, scales, temp2, xs_b, kt + 1)
            state.advance()
            self._retire(pipe, release, 1, acc, temp, xs_a, ws_a0, ws_a1, sc, n_vals, n_tok)
            release.advance()
            ws_a0, ws_a1 = self._issue_next(pipe, state, scales, temp, xs_a, kt + 2)
            state.advance()
            self._retire(pipe, release, 1, acc, temp2, xs_b, ws_b0, ws_b1, sc, n_vals, n_tok)
            release.advance()
        if (kb1 - kb0) % 2 == 0:  # temp holds kb1 - 2; kb1 - 1 is left
            ws_b0, ws_b1 = self._issue_next(pipe, state, scales, temp2, xs_b, kb1 - 1)
            state.advance()
            self._retire(pipe, release, 1, acc, temp, xs_a, ws_a0, ws_a1, sc, n_vals, n_tok)
            release.advance()
            self._retire(pipe, release, 0, acc, temp2, xs_b, ws_b0, ws_b1, sc, n_vals, n_tok)
            release.advance()
        else:  # temp holds kb1 - 1
            self._retire(pipe, release, 0, acc, temp, xs_a, ws_a0, ws_a1, sc, n_vals, n_tok)
            release.advance()
        return state, release

    # trace-time helpers of the fp8 mainloop (plain Python, inlined where called: Python loops unroll)
    def _scales(self, mAS, mWS, xrow, xs, wrow_0, wrow_1, kt, n_tok):
        """x scales of this thread's tokens into xs, and the tile's two weight scales, for k block kt."""
        for j in range(n_tok):
            xs[j] = mAS[xrow[j], kt]
        return mWS[wrow_0, kt], mWS[wrow_1, kt]

    def _issue_next(self, pipe, state, scales, into, xs_into, k_next):
        """Load k tile k_next's scales (x scales into xs_into), wait for its stage, issue its wgmma
        chain into ``into``. Returns its two weight scales."""
        mainloop, tiled_mma, tCrW, tCrX, num_k_blocks = pipe
        mAS, mWS, xrow, wrow_0, wrow_1, n_tok = scales
        ws = self._scales(mAS, mWS, xrow, xs_into, wrow_0, wrow_1, k_next, n_tok)
        mainloop.consumer_wait(state)
        self._issue(tiled_mma, into, tCrW, tCrX, state.index, num_k_blocks)
        return ws

    def _retire(self, pipe, release, pending, acc, done, xs_done, ws_done_0, ws_done_1, sc, n_vals, n_tok):
        """Wait until at most ``pending`` wgmma groups are in flight (the oldest, ``done``, has
        finished), release its stage and promote it."""
        cute.nvgpu.warpgroup.wait_group(pending)
        pipe[0].consumer_release(release)
        self._promote(acc, done, xs_done, ws_done_0, ws_done_1, sc, n_vals, n_tok)

    def _promote(self, acc, temp, xs, ws_0, ws_1, sc, n_vals, n_tok):
        """acc += temp · x_scale[token] · w_scale[half of the block]."""
        for b in range(self.blocks):
            ws = ws_0 if b < self.blocks // 2 else ws_1
            for j in range(n_tok):
                sc[j] = xs[j] * ws
            for v in range(n_vals):
                acc[(v, b, 0)] = acc[(v, b, 0)] + temp[(v, b, 0)] * sc[2 * (v // 4) + v % 2]

    @cute.jit
    def _partial(self, acc, n_vals: cutlass.Constexpr, ok_a, ok_b, mPart, idx, t, add: cutlass.Constexpr):
        """acc → mPart[idx] (or acc += mPart[idx]), [idx, value, thread]; all values (padding
        tokens are zero: their x rows are TMA zero-fill), so ok_a / ok_b are not used."""
        for b in cutlass.range_constexpr(self.blocks):
            for v in cutlass.range_constexpr(n_vals):
                if cutlass.const_expr(add):
                    acc[(v, b, 0)] = acc[(v, b, 0)] + mPart[idx, b * n_vals + v, t]
                else:
                    mPart[idx, b * n_vals + v, t] = acc[(v, b, 0)]

    @cute.jit
    def _epilogue_swap(self, acc, tCcC, n_vals: cutlass.Constexpr, n_tok: cutlass.Constexpr, tok0, tm, tn, m,
                       sH, sRed, mH, mHS, t):
        """h = act(gate) · up into blocks 0, 1; per-token amax and fp8 quantization (or bf16);
        stage token-major in smem; copy out; h_scale per token."""
        cfg = self.cfg
        gates = self.blocks // 2
        for b in cutlass.range_constexpr(gates):
            for v in cutlass.range_constexpr(n_vals):
                acc[(v, b, 0)] = self.act(acc[(v, b, 0)]) * acc[(v, b + gates, 0)]
        bar = pipeline.NamedBarrier(barrier_id=1, num_threads=128 * self.num_mma_wg)
        bar.arrive_and_wait()  # the previous tile's copy-out and amax reads are done
        lane = t % 32
        warp = t // 32
        fmt = self.h_spec
        inv = None  # 1/s per token value j of this thread (scaled formats)
        if cutlass.const_expr(fmt.scaled):
            amax = cute.make_rmem_tensor(cute.make_layout(n_tok), Float32)
            inv = cute.make_rmem_tensor(cute.make_layout(n_tok), Float32)
            for j in cutlass.range_constexpr(n_tok):
                amax[j] = Float32(0.0)
            for b in cutlass.range_constexpr(gates):
                for v in cutlass.range_constexpr(n_vals):
                    j = 2 * (v // 4) + v % 2
                    amax[j] = cute.arch.fmax(amax[j], abs(acc[(v, b, 0)]), nan=True)
            for j in cutlass.range_constexpr(n_tok):
                a = amax[j]
                for off in cutlass.range_constexpr(3):  # lanes with the same lane % 4 share tokens
                    a = cute.arch.fmax(a, cute.arch.shuffle_sync_bfly(a, offset=4 << off), nan=True)
                amax[j] = a
            if lane < 4:
                for j in cutlass.range_constexpr(n_tok):
                    sRed[warp, tok0 + 8 * (j // 2) + j % 2] = amax[j]
            bar.arrive_and_wait()
            for j in cutlass.range_constexpr(n_tok):
                tok = tok0 + 8 * (j // 2) + j % 2
                a = sRed[0, tok]
                for w in cutlass.range_constexpr(1, 4 * self.num_mma_wg):
                    a = cute.arch.fmax(a, sRed[w, tok], nan=True)
                sj = fmt.scale(a)
                inv[j] = div_rn(Float32(1.0), sj)  # q = h · (1/s), as the 64/128-row epilogue
                if warp == 0:
                    if lane < 4:
                        if tm * cfg.tile_m + tok < m:
                            mHS[tm * cfg.tile_m + tok, tn] = sj
        if cutlass.const_expr(fmt.bits == 8):  # a pair is tokens tok, tok + 1 of one column: split it
            sH8 = cute.make_tensor(
                cute.recast_ptr(sH.iterator, dtype=cutlass.Int8),
                cute.make_layout((cfg.tile_m, 4 * cfg.out_row_words), stride=(4 * cfg.out_row_words, 1)),
            )
            for b in cutlass.range_constexpr(gates):
                for v in cutlass.range_constexpr(0, n_vals, 2):  # v, v + 1: tokens tok, tok + 1 of one column
                    col = tCcC[(v, b, 0)][0]
                    tok = tCcC[(v, b, 0)][1]
                    j = 2 * (v // 4)
                    pair = Int32(fmt.pack(acc[(v, b, 0)], acc[(v + 1, b, 0)], *_pair(inv, j)))
                    sH8[tok, col] = cutlass.Int8(pair & 0xFF)
                    sH8[tok + 1, col] = cutlass.Int8((pair >> 8) & 0xFF)
        else:
            sH16 = cute.make_tensor(
                cute.recast_ptr(sH.iterator, dtype=cutlass.Int16),
                cute.make_layout((cfg.tile_m, 2 * cfg.out_row_words), stride=(2 * cfg.out_row_words, 1)),
            )
            for b in cutlass.range_constexpr(gates):
                for v in cutlass.range_constexpr(0, n_vals, 2):
                    col = tCcC[(v, b, 0)][0]
                    if cutlass.const_expr(cfg.h_rs_order):
                        col = _rs_column(col)
                    tok = tCcC[(v, b, 0)][1]
                    word = fmt.pack(acc[(v, b, 0)], acc[(v + 1, b, 0)], *_pair(inv, 2 * (v // 4)))
                    sH16[tok, col] = cutlass.Int16(word & 0xFFFF)
                    sH16[tok + 1, col] = cutlass.Int16((word >> 16) & 0xFFFF)
        bar.arrive_and_wait()
        rows = cfg.tile_m // self.num_mma_wg  # each warpgroup copies out its share of the tokens
        self._copy_slab(sH, mH, tm, tn, m, Int32(0), t // 128, t % 128, False, rows)

    @cute.jit
    def _epilogue_swap_pairs(self, acc, tCcC, n_vals: cutlass.Constexpr, tm, tn, m, sH, mH, t):
        """half_row_pairs (bf16 h): values v, v + 1 of a 4-value group are the gate of pair _pair_of(t)
        at tokens tok, tok + 1, values v + 2, v + 3 its up at the same tokens: h = act(gate) · up, one
        bf16 pair word a token pair, staged token-major in the slab's 64 columns, copied out."""
        cfg = self.cfg
        fmt = self.h_spec
        bar = pipeline.NamedBarrier(barrier_id=1, num_threads=128 * self.num_mma_wg)
        bar.arrive_and_wait()  # the previous tile's copy-out is done
        col = self._pair_of(t)
        if cutlass.const_expr(cfg.h_rs_order):
            col = _rs_column(col)
        sH16 = cute.make_tensor(
            cute.recast_ptr(sH.iterator, dtype=cutlass.Int16),
            cute.make_layout((cfg.tile_m, 2 * cfg.out_row_words), stride=(2 * cfg.out_row_words, 1)),
        )
        for v in cutlass.range_constexpr(0, n_vals, 4):
            tok = tCcC[(v, 0, 0)][1]
            word = fmt.pack(self.act(acc[(v, 0, 0)]) * acc[(v + 2, 0, 0)],
                            self.act(acc[(v + 1, 0, 0)]) * acc[(v + 3, 0, 0)], None, None)
            sH16[tok, col] = cutlass.Int16(word & 0xFFFF)
            sH16[tok + 1, col] = cutlass.Int16((word >> 16) & 0xFFFF)
        bar.arrive_and_wait()
        rows = cfg.tile_m // self.num_mma_wg  # each warpgroup copies out its share of the tokens
        self._copy_slab(sH, mH, tm, tn, m, Int32(0), t // 128, t % 128, False, rows)

    @cute.jit
    def _epilogue_swap_linear(self, acc, tCcC, n_vals: cutlass.Constexpr, tm, tn, m, n, sY, mY, mR, t):
        """y = acc (+ residual) rounded once to bf16, one 128-column half (its blocks) at a time."""
        cfg = self.cfg
        n_chunks = n // N_ALIGN
        gates = self.blocks // self.halves  # blocks a half
        rows = cfg.tile_m // self.num_mma_wg  # each warpgroup copies its share of the tokens
        bar = pipeline.NamedBarrier(barrier_id=1, num_threads=128 * self.num_mma_wg)
        sY16 = cute.make_tensor(
            cute.recast_ptr(sY.iterator, dtype=cutlass.Int16),
            cute.make_layout((cfg.tile_m, 2 * cfg.out_row_words), stride=(2 * cfg.out_row_words, 1)),
        )
        for half in cutlass.range_constexpr(self.halves):
            bar.arrive_and_wait()  # the previous copy-out of the slab is done
            if cutlass.const_expr(cfg.residual):
                self._copy_slab(sY, mR, tm, self.halves * tn + half, m, n_chunks, t // 128, t % 128, True, rows)
                bar.arrive_and_wait()  # the residual slab is in smem
            for bb in cutlass.range_constexpr(gates):
                b = gates * half + bb
                for v in cutlass.range_constexpr(0, n_vals, 2):  # v, v + 1: tokens tok, tok + 1 of one column
                    col = tCcC[(v, b, 0)][0] - HALF_N * half
                    tok = tCcC[(v, b, 0)][1]
                    lo = acc[(v, b, 0)]
                    hi = acc[(v + 1, b, 0)]
                    if cutlass.const_expr(cfg.residual):  # each (token, column) is this thread's alone
                        lo = lo + bf16_lo_to_f32(Int32(sY16[tok, col]))
                        hi = hi + bf16_lo_to_f32(Int32(sY16[tok + 1, col]))
                    word = cvt_bf16x2(lo, hi)
                    sY16[tok, col] = cutlass.Int16(word & 0xFFFF)
                    sY16[tok + 1, col] = cutlass.Int16((word >> 16) & 0xFFFF)
            bar.arrive_and_wait()
            self._copy_slab(sY, mY, tm, self.halves * tn + half, m, n_chunks, t // 128, t % 128, False, rows)
