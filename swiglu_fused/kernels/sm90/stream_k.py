"""The device side of the sm_90a GEMM's tile schedule (gemm.py, swap_ab.py): the walk of a CTA
over its work, and the fix-up of the tiles that several CTAs share.

The plan (how many tiles go stream-K, how their K iterations are dealt out to CTAs, the band
order) is schedule.py's and is made on the host. On the device each CTA first takes whole tiles
b, b + grid, … < dp_tiles, then its equal share of the K iterations of the last sk_tiles tiles.
Its work is a list of segments (tile, k tiles [kb0, kb1)), walked with a cursor over the CTA's k
iterations by both warpgroup roles (the producer and the consumers see the same segments).

A CTA that finishes only part of a tile stores its fp32 accumulator as a partial; the last of the
tile's CTAs to arrive (an atomic counter per tile) sums every partial in CTA order and runs the
epilogue (_fixup). K pairs (TileConfig.cluster_k = 2 or 4) split every tile over the CTAs of one
cluster and hand the accumulators over through DSMEM instead (_cluster_fixup).

StreamKMixin is a base class of GemmKernel: its methods are traced into the kernel. The
kernel's accumulator layout enters only through _partial, which swap_ab.SwapABKernel overrides.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32

from .ptx import f32_bits
from .schedule import sk_cta_of, sk_iter_begin


class Schedule(NamedTuple):
    """This CTA's share of the work, computed once in the kernel (GemmKernel._prologue) and
    read by the producer and the consumers. Values of the trace (Int32) except ``tiling``."""

    bidx: Any  # this CTA
    nctas: Any  # the persistent grid
    k_tiles: Any  # k tiles per tile
    tiling: tuple  # (grid_m, n_tiles, band): the band order of the tiles (GemmKernel._tile_mn)
    dp_tiles: Any  # whole tiles (data-parallel), dealt round-robin; the rest are stream-K
    sk_iters: Any  # k iterations of the stream-K tiles, in all
    it_begin: Any  # this CTA's stream-K iterations [it_begin, it_end)
    it_end: Any
    dp_iters: Any  # this CTA's k iterations of whole tiles (they come first)
    cursor_end: Any  # this CTA's k iterations, in all


class StreamKMixin:

    @cute.jit
    def _segment(self, cursor, sched: Schedule):
        """The work at this CTA's cursor: (tile, kb0, kb1), k tiles [kb0, kb1) of one tile."""
        k_tiles, dp_iters, it_begin, it_end = sched.k_tiles, sched.dp_iters, sched.it_begin, sched.it_end
        dp_tiles = sched.dp_tiles
        tile = sched.bidx + cursor // k_tiles * sched.nctas
        kb0 = Int32(0)
        kb1 = k_tiles
        if cursor >= dp_iters:
            it = it_begin + cursor - dp_iters
            s = it // k_tiles
            tile = dp_tiles + s
            kb0 = it - s * k_tiles
            kb1 = cutlass.min(k_tiles, kb0 + it_end - it)
        return tile, kb0, kb1

    @cute.jit
    def _finish_tile(self, acc, n_vals: cutlass.Constexpr, row_a, m, tile, sched: Schedule, mPart, mCtr, storage,
                     t):
        """1 if this CTA runs the tile's epilogue: a whole tile, or a stream-K tile shared with
        other CTAs that this one is the last to finish (_fixup has then summed the partials)."""
        dp_tiles, k_tiles, nctas, sk_iters = sched.dp_tiles, sched.k_tiles, sched.nctas, sched.sk_iters
        epi = Int32(1)
        if tile >= dp_tiles:
            s = tile - dp_tiles
            c_first = sk_cta_of(s * k_tiles, nctas, sk_iters)
            c_last = sk_cta_of(s * k_tiles + k_tiles - 1, nctas, sk_iters)
            if c_first != c_last:
                if cutlass.const_expr(self.cfg.fixup_groups):
                    epi = self._fixup_groups(acc, n_vals, row_a, m, s, c_first, c_last, sched, mPart, mCtr, storage, t)
                else:
                    epi = self._fixup(acc, n_vals, row_a, m, s, c_first, c_last, sched, mPart, mCtr, storage, t)
        return epi

    @cute.jit
    def _fixup(self, acc, n_vals: cutlass.Constexpr, row_a, m, s, c_first, c_last, sched: Schedule, mPart, mCtr,
               storage, t):
        """Stream-K tile s is shared by CTAs c_first..c_last. Store this CTA's fp32 partial (rows
        < M only), count arrivals on mCtr[s]; the last to arrive sums every partial in CTA order
        (deterministic whatever the arrival order) into acc, re-zeroes the counter for the next
        launch and returns 1 (run the epilogue); the others return 0."""
        bidx = sched.bidx
        if cutlass.const_expr(self.cfg.cluster_k > 1):
            return self._cluster_fixup(acc, bidx, storage, t)
        sFlag = storage.flag.get_tensor(cute.make_layout(4))
        bar = pipeline.NamedBarrier(barrier_id=3, num_threads=128 * self.num_mma_wg)
        row_b = row_a + 8
        slot = self._sk_slot(bidx, s, sched)
        self._partial(acc, n_vals, row_a < m, row_b < m, mPart, bidx * 2 + slot, t, False)
        # Memory order (the pattern of CUTLASS's split-K semaphore): the CTA barrier orders every
        # thread's partial stores before thread 0's gpu-scope acq_rel atomic, whose release is
        # cumulative; on the last CTA the atomic's acquire, then the barrier, order the loads after.
        # (A fence in every thread as well measured 1 µs slower and changes nothing.)
        bar.arrive_and_wait()
        if t == 0:
            sFlag[0] = cute.arch.atomic_add(mCtr.iterator + s, Int32(1), sem="acq_rel", scope="gpu")
        bar.arrive_and_wait()
        last = Int32(0)
        if sFlag[0] == c_last - c_first:
            last = Int32(1)
            acc.fill(0.0)
            for c in cutlass.range(c_first, c_last + 1, unroll=self.cfg.fixup_unroll):  # (TileConfig)
                slot_c = self._sk_slot(c, s, sched)
                self._partial(acc, n_vals, row_a < m, row_b < m, mPart, c * 2 + slot_c, t, True)
            if t == 0:
                mCtr[s] = Int32(0)
        return last

    @cute.jit
    def _fixup_groups(self, acc, n_vals: cutlass.Constexpr, row_a, m, s, c_first, c_last, sched: Schedule, mPart,
                      mCtr, storage, t):
        """_fixup in two levels (TileConfig.fixup_groups): the tile's n CTAs, ranked r = c - c_first, in
        groups of g = ceil(sqrt(n)) ranks. The last of a group to arrive sums its group's partials in
        CTA order into the slot of the group's first CTA; the last group to finish sums the group sums
        in order. So the last CTA reads about 2·sqrt(n) partials, not n, at the cost of a second
        arrival; the bits are the same whoever arrives last. Counter words (2 a CTA): a group's at
        2 (c_first + its first rank), the tile's second level at 2 c_first + 1; a group of one CTA
        arrives nowhere (in a hybrid schedule it may be the next tile's first CTA, whose word is
        2 c_first of that tile). Memory order as _fixup, at both arrivals. Returns 1 on the CTA that
        runs the epilogue."""
        sFlag = storage.flag.get_tensor(cute.make_layout(4))
        bar = pipeline.NamedBarrier(barrier_id=3, num_threads=128 * self.num_mma_wg)
        row_b = row_a + 8
        n = c_last - c_first + 1
        r = sched.bidx - c_first
        g = Int32(1)
        while g * g < n:
            g = g + 1
        groups = (n + g - 1) // g
        g0 = r // g * g
        g1 = cutlass.min(g0 + g, n)
        lead = c_first + g0
        self._partial(acc, n_vals, row_a < m, row_b < m, mPart, sched.bidx * 2 + self._sk_slot(sched.bidx, s, sched),
                      t, False)
        grouped = Int32(1)
        if g1 - g0 > 1:
            grouped = self._arrive(mCtr, 2 * lead, g1 - g0, sFlag, bar, t)
        last = Int32(0)
        if grouped != 0:
            if g1 - g0 > 1:
                acc.fill(0.0)
                for c in cutlass.range(lead, c_first + g1, unroll=self.cfg.fixup_unroll):
                    self._partial(acc, n_vals, row_a < m, row_b < m, mPart, c * 2 + self._sk_slot(c, s, sched), t,
                                  True)
                self._partial(acc, n_vals, row_a < m, row_b < m, mPart, lead * 2 + self._sk_slot(lead, s, sched), t,
                              False)
            if self._arrive(mCtr, 2 * c_first + 1, groups, sFlag, bar, t) != 0:
                last = Int32(1)
                acc.fill(0.0)
                for q in cutlass.range(groups, unroll=self.cfg.fixup_unroll):
                    c = c_first + q * g
                    self._partial(acc, n_vals, row_a < m, row_b < m, mPart, c * 2 + self._sk_slot(c, s, sched), t,
                                  True)
        return last

    @cute.jit
    def _arrive(self, mCtr, word, count, sFlag, bar, t):
        """1 on the last of ``count`` arrivals at counter ``word`` (which it re-zeroes for the next
        launch), 0 on the others: the CTA's stores before it are released to the last, whose loads
        after it see them (_fixup's memory order)."""
        bar.arrive_and_wait()
        if t == 0:
            sFlag[0] = cute.arch.atomic_add(mCtr.iterator + word, Int32(1), sem="acq_rel", scope="gpu")
        bar.arrive_and_wait()
        last = Int32(0)
        if sFlag[0] == count - 1:
            last = Int32(1)
            if t == 0:
                mCtr[word] = Int32(0)
        return last

    @cute.jit
    def _sk_slot(self, c, s, sched: Schedule):
        """CTA c keeps its partial of stream-K tile s in slot 0 if s is its first tile, else 1
        (a CTA shares at most its first and its last tile with others)."""
        nctas, sk_iters, k_tiles = sched.nctas, sched.sk_iters, sched.k_tiles
        slot = Int32(1)
        if sk_iter_begin(c, nctas, sk_iters) // k_tiles == s:
            slot = Int32(0)
        return slot

    @cute.jit
    def _partial(self, acc, n_vals: cutlass.Constexpr, ok_a, ok_b, mPart, idx, t, add: cutlass.Constexpr):
        """acc → mPart[idx] (or acc += mPart[idx]) for this thread's rows < M; [idx, value, thread]
        so that a warp's 32 threads touch 128 contiguous bytes per value. (The accumulator of the
        64/128-row tiles: two halves of n_vals values, rows a / b by value; swap_ab overrides it.)"""
        for half in cutlass.range_constexpr(2):
            for par in cutlass.range_constexpr(2):  # values of row_a (par 0) / row_b (par 1)
                ok = ok_a if par == 0 else ok_b
                if ok:
                    for v in cutlass.range_constexpr(n_vals):
                        if cutlass.const_expr((v // 2) % 2 == par):
                            if cutlass.const_expr(add):
                                acc[(v, 0, half)] = acc[(v, 0, half)] + mPart[idx, half * n_vals + v, t]
                            else:
                                mPart[idx, half * n_vals + v, t] = acc[(v, 0, half)]

    # ------------------------------------------------------------------ K pairs (cluster_k)
    @cute.jit
    def _init_xbar(self, storage):
        """cluster_k: the barrier the peer's st.async bytes complete on (one arrival: expect_tx)."""
        if cute.arch.thread_idx()[0] == 0:
            cute.arch.mbarrier_init(storage.xbar.data_ptr(), 1)
        cute.arch.mbarrier_init_fence()

    @cute.jit
    def _cluster_fixup(self, acc, bidx, storage, t):
        """cluster_k = 2 or 4: CTA r > 0 of the cluster (the tile's K part r) sends its accumulator
        into slot r - 1 of CTA 0's smem with st.async, which completes bytes on CTA 0's xbar; CTA 0
        waits for all of them, adds them in rank order (part 0 + part 1 + ...: the same sum, bit for
        bit, as stream-K split cluster_k) and returns 1 (run the epilogue). Value i of consumer
        thread t goes to word (slot · values + i) · threads + t."""
        ck = self.cfg.cluster_k
        threads = 128 * self.num_mma_wg
        n = cute.size(acc)
        sX = storage.xacc.get_tensor(cute.make_layout((n * (ck - 1), threads), stride=(threads, 1)))
        bar = storage.xbar.data_ptr()
        rank = bidx % ck
        last = Int32(1)
        if rank != 0:
            last = Int32(0)
            for i in cutlass.range_constexpr(n):
                word = i * threads + t
                if cutlass.const_expr(ck > 2):
                    word = ((rank - 1) * n + i) * threads + t
                cute.arch.store_async_dsmem(sX.iterator + word, f32_bits(acc[i]), bar, 0)
        else:
            if t == 0:
                cute.arch.mbarrier_arrive_and_expect_tx(bar, (ck - 1) * n * threads * 4)
            cute.arch.mbarrier_wait(bar, 0)
            for r in cutlass.range_constexpr(ck - 1):
                for i in cutlass.range_constexpr(n):
                    acc[i] = acc[i] + sX[r * n + i, t]
        return last
