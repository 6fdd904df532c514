"""The pair tile of the sm90 gate_up GEMM (TileConfig.tile_n = 128; fp8_block128, tile_m = 128):
128 rows of x × 128 packed weight rows, the two CTAs of a cluster taking the two 64-column halves
of one h scale group. Correct (GPU tests) but measured slower than the 256-row tile, so not
dispatched (gate_up.PAIR_TILE; benchmarks/NOTES.md, sixth session): 8192×3584 M = 4096 488 vs
466 µs; without the epilogue 457-461 vs 425-448 µs. It is the groundwork for a ping-pong schedule
(its 64-register accumulator leaves room for a warpgroup to own a whole 64-row tile with two temps).

Why: the 256-row tile's accumulator (64 × 256 fp32 per warpgroup, 128 registers a thread) leaves
room for one wgmma temp only, so each warpgroup waits for its wgmma chain before promoting it (the
tensor pipe measured 73.5 % busy, cuBLAS's block-scaled GEMM 81.7 %: benchmarks/NOTES.md). With
128 weight rows the accumulator is 64 registers, and two temps fit: k tile kt + 1's chain runs
while kt is promoted (the schedule of the swap-AB tile, swap_ab.py). cuBLAS's kernel for these
shapes is a 128 × 128 tile in clusters of two. The x tile is multicast over the pair (each CTA
loads half of it): both CTAs of a pair always work on the same M tile.

Tile t of the persistent schedule is pair p = t // 2, half s = t % 2 (= the CTA's rank in its
cluster: the grid is even and CTA b takes tiles b, b + grid, …); p is (M tile tm, weight block j)
in gemm256's m-fastest order over j < I/128. The tile's weight rows are two 64-row TMA boxes:

    gate rows  [256j + 64s, +64)         → B rows 0..63    (weight scale row 2j)
    up rows    [256j + 128 + 64s, +64)   → B rows 64..127  (weight scale row 2j + 1)

so h columns [128j + 64s, +64) come out of it. Warpgroup w has rows 64w..64w+63; in its wgmma C
fragment (gemm256's formula with 128 columns) value v < 32 is gate column c and v + 32 up column c:
act(gate)·up is register-local. The fp8 h scale of a row covers both halves: each CTA reduces
its row amax over its 64 columns (in-thread, then the quad), sends it into the peer CTA's smem with
st.async (completing bytes on the peer's mbarrier; two slots by tile parity, so a slot is reused
only after the peer has read it) and takes the max with the peer's. Half 0 writes h_scale.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32

from .gemm256 import FP8_MAX, Gemm256Kernel
from .ptx import cvt_bf16x2, cvt_e4m3x2, div_rn, f32_bits


class PairNKernel(Gemm256Kernel):
    """Gemm256Kernel with the 128 × 128 pair tile (see the module docstring)."""

    @cute.jit
    def _produce(self, mainloop, tma_a, tAgA, tAsA, tma_b, tBgB, tBsB, a_mask, cursor_end, bidx, nctas, dp_iters,
                 k_tiles, dp_tiles, it_begin, it_end, tiling, scales):
        """The producer warp: per k tile its half of the x tile (multicast to both CTAs of the pair,
        which share it) and the tile's two 64-row weight boxes."""
        pairs = (tiling[0], tiling[1] // 2, tiling[2])
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.cfg.stages)
        cursor = Int32(0)
        while cursor < cursor_end:
            tile, kb0, kb1 = self._segment(cursor, bidx, nctas, dp_iters, k_tiles, dp_tiles, it_begin, it_end)
            tm, j = self._tile_mn(tile // 2, pairs)
            gate_box = 4 * j + tile % 2  # 64-row boxes of the packed weight
            cursor += kb1 - kb0
            for kt in cutlass.range(kb0, kb1, unroll=1):
                mainloop.producer_acquire(state)
                bar = mainloop.producer_get_barrier(state)
                cute.copy(tma_a, tAgA[(None, tm, kt)], tAsA[(None, state.index)], tma_bar_ptr=bar, mcast_mask=a_mask)
                cute.copy(tma_b, tBgB[(None, gate_box, kt)], tBsB[0][(None, state.index)], tma_bar_ptr=bar)
                cute.copy(tma_b, tBgB[(None, gate_box + 2, kt)], tBsB[1][(None, state.index)], tma_bar_ptr=bar)
                mainloop.producer_commit(state)
                state.advance()
        mainloop.producer_tail(state)

    @cute.jit
    def _consume(self, tiled_mma, mainloop, sA, sB, storage, mAS, mWS, outs, mAux, mPart, mCtr, m, n, tidx, wg_idx,
                 bidx, k_tiles, nctas, tiling, dp_tiles, sk_iters, it_begin, it_end, dp_iters, cursor_end):
        """The consumer warpgroups: two wgmma temps (k tile kt + 1 in flight while kt is promoted),
        then the epilogue with the pair's amax exchange."""
        cfg = self.cfg
        mOut = outs[0]
        pairs = (tiling[0], tiling[1] // 2, tiling[2])
        t = tidx - 128
        thr_mma = tiled_mma.get_slice(t)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))  # (MMA, 1, MMA_K, STAGES)
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))  # (MMA, 1, MMA_K, STAGES): gate | up rows
        num_k_blocks = cute.size(tCrA, mode=[2])
        tCcC = thr_mma.partition_C(cute.make_identity_tensor((cfg.tile_m, cfg.tile_n)))  # (MMA, 1, 1)
        acc = cute.make_rmem_tensor(tCcC.shape, self.acc_dtype)
        temp = cute.make_rmem_tensor(tCcC.shape, self.acc_dtype)
        temp2 = cute.make_rmem_tensor(tCcC.shape, self.acc_dtype)
        n_vals = cute.size(tCcC, mode=[0])  # 64: gate columns (v < 32), up columns (v ≥ 32)
        crd0 = tCcC[(0, 0, 0)]
        r0 = crd0[0]  # tile rows r0 (values with (v/2)%2 == 0) and r0 + 8
        col0 = crd0[1]
        ws_last = (n + 127) // 128 - 1
        sO = storage.sO.get_tensor(cute.make_layout((cfg.tile_m, cfg.out_row_words), stride=(cfg.out_row_words, 1)))
        sX = storage.xamax.get_tensor(cute.make_layout((2, cfg.tile_m), stride=(cfg.tile_m, 1)))

        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, cfg.stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, cfg.stages)
        pipe = (mainloop, tiled_mma, tCrA, tCrB, num_k_blocks)
        epi_count = Int32(0)  # this CTA's epilogues so far: amax slot and mbarrier phase
        cursor = Int32(0)
        while cursor < cursor_end:
            tile, kb0, kb1 = self._segment(cursor, bidx, nctas, dp_iters, k_tiles, dp_tiles, it_begin, it_end)
            tm, j = self._tile_mn(tile // 2, pairs)
            cursor += kb1 - kb0
            acc.fill(0.0)
            arow_a = cutlass.min(tm * cfg.tile_m + r0, m - 1)  # rows past M read row M-1's scale
            arow_b = cutlass.min(tm * cfg.tile_m + r0 + 8, m - 1)
            scales = (mAS, mWS, arow_a, arow_b, cutlass.min(2 * j, ws_last), cutlass.min(2 * j + 1, ws_last))
            # k tiles alternate between temp and temp2, as in swap_ab.py: issue k + 1, wait for k
            # only, release its stage, promote it; branch-free body, the last one or two drained after
            sc_a = self._pair_scales(scales, kb0)
            sc_b = sc_a
            mainloop.consumer_wait(state)
            self._issue(tiled_mma, temp, tCrA, tCrB, state.index, num_k_blocks)
            state.advance()
            for kt in cutlass.range(kb0, kb1 - 2, 2, unroll=1):  # temp holds kt, in flight
                sc_b = self._pair_scales(scales, kt + 1)
                mainloop.consumer_wait(state)
                self._issue(tiled_mma, temp2, tCrA, tCrB, state.index, num_k_blocks)
                state.advance()
                self._retire(pipe, release, 1, acc, temp, sc_a, n_vals)
                release.advance()
                sc_a = self._pair_scales(scales, kt + 2)
                mainloop.consumer_wait(state)
                self._issue(tiled_mma, temp, tCrA, tCrB, state.index, num_k_blocks)
                state.advance()
                self._retire(pipe, release, 1, acc, temp2, sc_b, n_vals)
                release.advance()
            if (kb1 - kb0) % 2 == 0:  # temp holds kb1 - 2; kb1 - 1 is left
                sc_b = self._pair_scales(scales, kb1 - 1)
                mainloop.consumer_wait(state)
                self._issue(tiled_mma, temp2, tCrA, tCrB, state.index, num_k_blocks)
                state.advance()
                self._retire(pipe, release, 1, acc, temp, sc_a, n_vals)
                release.advance()
                self._retire(pipe, release, 0, acc, temp2, sc_b, n_vals)
                release.advance()
            else:  # temp holds kb1 - 1
                self._retire(pipe, release, 0, acc, temp, sc_a, n_vals)
                release.advance()
            self._epilogue_pair(acc, n_vals, r0, col0, tm, j, tile % 2, m, sO, sX, storage, mOut, mAux, epi_count,
                                wg_idx - 1, t)
            epi_count += 1

    # trace-time helpers (plain Python, inlined where called)
    def _pair_scales(self, scales, kt):
        """Promotion scales of k block kt: (row a, row b) × (gate, up)."""
        mAS, mWS, arow_a, arow_b, wrow_g, wrow_u = scales
        xa = mAS[arow_a, kt]
        xb = mAS[arow_b, kt]
        wg_ = mWS[wrow_g, kt]
        wu = mWS[wrow_u, kt]
        return (xa * wg_, xb * wg_, xa * wu, xb * wu)

    def _retire(self, pipe, release, pending, acc, done, sc, n_vals):
        """Wait until at most ``pending`` wgmma groups are in flight (``done`` has finished),
        release its stage, promote it: acc += done · x_scale[row] · w_scale[gate or up]."""
        cute.nvgpu.warpgroup.wait_group(pending)
        pipe[0].consumer_release(release)
        for v in range(n_vals):
            s = sc[(2 if v >= n_vals // 2 else 0) + (v // 2) % 2]
            acc[(v, 0, 0)] = acc[(v, 0, 0)] + done[(v, 0, 0)] * s

    @cute.jit
    def _epilogue_pair(self, acc, n_vals: cutlass.Constexpr, r0, col0, tm, j, half, m, sH, sX, storage, mH, mHS,
                       epi_count, wg, t):
        """h = act(gate) · up for this CTA's 64 columns; fp8: row amax over both CTAs of the pair
        (DSMEM), s = amax/448, q = h · (1/s); stage the warpgroup's 64 × 64 slab, copy it out."""
        cfg = self.cfg
        tid = t % 128
        gates = n_vals // 2
        for v in cutlass.range_constexpr(gates):
            acc[(v, 0, 0)] = self.act(acc[(v, 0, 0)]) * acc[(v + gates, 0, 0)]
        ra = r0
        rb = r0 + 8
        row_a = tm * cfg.tile_m + ra
        row_b = row_a + 8
        bar = pipeline.NamedBarrier(barrier_id=1 + wg, num_threads=128)
        bar.arrive_and_wait()  # the previous tile's copy-out of this slab is done
        if cutlass.const_expr(cfg.h_format == "fp8_group128"):
            amax_a = Float32(0.0)
            amax_b = Float32(0.0)
            for v in cutlass.range_constexpr(gates):
                if cutlass.const_expr((v // 2) % 2 == 0):
                    amax_a = cute.arch.fmax(amax_a, abs(acc[(v, 0, 0)]), nan=True)
                else:
                    amax_b = cute.arch.fmax(amax_b, abs(acc[(v, 0, 0)]), nan=True)
            for off in cutlass.range_constexpr(2):  # the quad holds the row's 64 columns
                amax_a = cute.arch.fmax(amax_a, cute.arch.shuffle_sync_bfly(amax_a, offset=1 << off), nan=True)
                amax_b = cute.arch.fmax(amax_b, cute.arch.shuffle_sync_bfly(amax_b, offset=1 << off), nan=True)
            # the pair's exchange: slot epi_count % 2, its barrier's phase (epi_count / 2) % 2
            slot = epi_count % 2
            xbar = storage.xabar.data_ptr() + slot
            if t == 0:
                cute.arch.mbarrier_arrive_and_expect_tx(xbar, cfg.tile_m * 4)
            if col0 == 0:  # one thread per quad sends its two rows' amax to the peer CTA
                peer = 1 - half
                cute.arch.store_async_dsmem(sX.iterator + (slot * cfg.tile_m + ra), f32_bits(amax_a), xbar, peer)
                cute.arch.store_async_dsmem(sX.iterator + (slot * cfg.tile_m + rb), f32_bits(amax_b), xbar, peer)
            cute.arch.mbarrier_wait(xbar, (epi_count // 2) % 2)
            amax_a = cute.arch.fmax(amax_a, sX[slot, ra], nan=True)
            amax_b = cute.arch.fmax(amax_b, sX[slot, rb], nan=True)
            s_a = div_rn(amax_a, Float32(FP8_MAX))
            if amax_a == Float32(0.0):
                s_a = Float32(1.0)
            s_b = div_rn(amax_b, Float32(FP8_MAX))
            if amax_b == Float32(0.0):
                s_b = Float32(1.0)
            inv_a = div_rn(Float32(1.0), s_a)
            inv_b = div_rn(Float32(1.0), s_b)
            sH16 = cute.make_tensor(
                cute.recast_ptr(sH.iterator, dtype=cutlass.Int16),
                cute.make_layout((cfg.tile_m, 2 * cfg.out_row_words), stride=(2 * cfg.out_row_words, 1)),
            )
            for v in cutlass.range_constexpr(0, gates, 2):
                c2 = (col0 + 8 * (v // 4)) // 2  # 16-bit word (column pair) in the row
                if cutlass.const_expr((v // 2) % 2 == 0):
                    sH16[ra, c2] = cvt_e4m3x2(acc[(v, 0, 0)] * inv_a, acc[(v + 1, 0, 0)] * inv_a)
                else:
                    sH16[rb, c2] = cvt_e4m3x2(acc[(v, 0, 0)] * inv_b, acc[(v + 1, 0, 0)] * inv_b)
            if half == 0:
                if col0 == 0:
                    if row_a < m:
                        mHS[row_a, j] = s_a
                    if row_b < m:
                        mHS[row_b, j] = s_b
        else:
            for v in cutlass.range_constexpr(0, gates, 2):
                c2 = (col0 + 8 * (v // 4)) // 2  # 32-bit word (bf16 pair) in the row
                word = cvt_bf16x2(acc[(v, 0, 0)], acc[(v + 1, 0, 0)])
                if cutlass.const_expr((v // 2) % 2 == 0):
                    sH[ra, c2] = word
                else:
                    sH[rb, c2] = word
        bar.arrive_and_wait()
        self._copy_slab(sH, mH, tm, 2 * j + half, m, Int32(0), wg, tid, False)
