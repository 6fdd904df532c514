"""The mainloops of the sm_90a GEMM (gemm.py): what the consumer warpgroups do with one tile's
k tiles [kb0, kb1) between the producer's TMA loads and the epilogue, one method per mainloop.

    _mainloop_bf16           bf16 operands: wgmma chains accumulate straight into acc. Shared by
                             the 64/128-row tiles and the swap-AB tiles (swap_ab.py), which differ
                             only in which smem operand is the wgmma's A and which its B.
    fp8_block128             e4m3 operands, 128 × 128 block scales: each k block's chain runs into
                             a temp, promoted into acc times a_scale · w_scale. Three schedules of
                             the 64/128-row tiles (the swap-AB tile's is in swap_ab.py):
      _mainloop_fp8_halves     per B half, chain then promotion (the 128-row tile, whose other
                               warpgroup's wgmma runs under this one's promotion; the 64-row tile
                               with overlap off); smem_scales reads the scales the producer staged
                               beside the stage; static_stages (_static) a ring of stages at a time
      _mainloop_fp8_quarters   one warpgroup (TileConfig.overlap): 64-column quarter chains into
                               two temps, quarter c promoted while c + 1 runs
      _mainloop_fp8_split_n    two warpgroups, one per B half (TileConfig.split_n), k tiles in runs

The promotion formula, the C fragment layout and the tile's two 128-row weight halves are drawn in
gemm.py's docstring.

Interface. A 64/128-row mainloop is a method (mainloop, state, release, ops, acc, work) →
(state, release): ``mainloop`` the TMA pipeline (PipelineTmaAsync), ``state`` / ``release`` its
consumer states (the stage to wait for next, the stage to release next; returned advanced, since
the tracer carries the pipeline states through a loop only where it sees them assigned or
advanced), ``ops`` the CTA's RowOperands (made once, GemmKernel._row_operands), ``acc`` the
zeroed fp32 accumulator, ``work`` the tile's TileWork. _row_mainloop picks it at trace time from
the config.

A new mainloop is one more method of that interface, its name in tile_config.MAINLOOPS, its entry
in _row_mainloop (and, for its operands, fields of RowOperands filled by _row_operands), plus what
it needs of the producer; none of the others change. The decode tiles (swap_ab.SwapABKernel._consume)
pick theirs the same way. The nvfp4 (W4A16) mainloop is the example: nvfp4.py (a mixin of its own,
for its decode), RowOperands.dec, one branch here and one in swap_ab._swap_mainloop, and the
producer's cp.async of its scales.

MainloopMixin is a base class of GemmKernel: its methods are traced into the kernel. The
methods without @cute.jit are plain Python, inlined where called (their Python loops unroll).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, pipeline

from .tile_config import BF16_MAINLOOP, HALF_N


class RowOperands(NamedTuple):
    """What the 64/128-row mainloops read, per CTA (GemmKernel._row_operands; trace values)."""

    tiled_mma: Any
    thr_mma: Any  # this thread's slice of tiled_mma
    sB: Any  # the B stages in smem (split_n cuts its warpgroup's half from it)
    tCrA: Any  # (MMA, 1, MMA_K, STAGES)
    tCrB: Any  # (MMA, 2, MMA_K, STAGES): both halves (the granule tile: (MMA, 1, MMA_K, STAGES))
    tCrB_half: list  # fp8: the two halves of B on their own, (MMA, 1, MMA_K, STAGES) each
    num_k_blocks: int  # wgmma k steps per k tile
    temp: Any  # fp8: a wgmma temp of one half (MMA, 1, 1)
    temp2: Any  # split_n: the second temp
    quarters: Any  # overlap: (quarter tiled_mma, its A fragment, B fragments of quarters 0..3, 2 temps, k steps)
    mmas_per_promotion: int  # fp8_halves: wgmma k steps per chain (promote_k)
    storage: Any  # the kernel's shared storage (smem_scales: the staged scales)
    mAS: Any  # a_scale [M, ceil(K/128)]
    mWS: Any  # w_scale [ceil(N/128), ceil(K/128)]
    m: Any
    ws_last: Any  # the last weight-scale row (a partial last tile reads no further)
    r0: Any  # this thread's first row in the tile (its other row is r0 + 8)
    wg_idx: Any  # this warpgroup (1, 2: consumers)
    dec: Any = None  # nvfp4: the decode's operands (nvfp4.DecodeOperands)


class TileWork(NamedTuple):
    """One segment of a tile: M tile tm, N tile tn, k tiles [kb0, kb1); this thread's rows."""

    tm: Any
    tn: Any
    kb0: Any
    kb1: Any
    row_a: Any = None  # (the 64/128-row tiles)
    row_b: Any = None  # row_a + 8


class MainloopMixin:

    def _row_mainloop(self, mainloop, state, release, ops: RowOperands, acc, work: TileWork):
        """Run the 64/128-row tile's mainloop for cfg.mainloop (chosen at trace time) over one
        segment; returns the advanced (state, release)."""
        cfg = self.cfg
        if cfg.nvfp4:  # W4A16 (nvfp4.py): the weight is the wgmma's B, decoded; global scales per half
            state, release = self._mainloop_nvfp4(mainloop, state, release, ops.tiled_mma, acc, ops.tCrB, ops.tCrA,
                                                  ops.dec, work.kb0, work.kb1, ops.num_k_blocks)
            self._nvfp4_scale(acc, ops.dec.mGS, work.tn)
            return state, release
        if cfg.mainloop == BF16_MAINLOOP:
            state, release = self._mainloop_bf16(mainloop, state, release, ops.tiled_mma, acc, ops.tCrA, ops.tCrB,
                                                 work.kb0, work.kb1, ops.num_k_blocks)
            if cfg.dequantized:  # an nvfp4 weight dequantized for this call (nvfp4_dequant.py)
                self._nvfp4_scale(acc, ops.mAS, work.tn)
            return state, release
        # fp8_block128: the schedule that suits the tile
        if self.overlap:
            return self._mainloop_fp8_quarters(mainloop, state, release, ops, acc, work)
        if cfg.split_n:
            return self._mainloop_fp8_split_n(mainloop, state, release, ops, acc, work)
        if cfg.static_stages:
            return self._mainloop_fp8_halves_static(mainloop, state, release, ops, acc, work)
        return self._mainloop_fp8_halves(mainloop, state, release, ops, acc, work)

    # ------------------------------------------------------------------ bf16
    @cute.jit
    def _mainloop_bf16(self, mainloop, state, release, tiled_mma, acc, tA, tB, kb0, kb1,
                       num_k_blocks: cutlass.Constexpr):
        """acc += A · B over k tiles [kb0, kb1), tA / tB the wgmma's A and B fragments (the row
        tiles: x / h and the weights; swap-AB: the weights and x). One wgmma group in flight: stage
        kt - 1 is released once group kt is issued."""
        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
        for kt in cutlass.range(kb0, kb1, unroll=1):
            mainloop.consumer_wait(state)
            cute.nvgpu.warpgroup.fence()
            for kk in cutlass.range_constexpr(num_k_blocks):
                cute.gemm(
                    tiled_mma, acc,
                    tA[(None, None, kk, state.index)],
                    tB[(None, None, kk, state.index)],
                    acc,
                )
            cute.nvgpu.warpgroup.commit_group()
            cute.nvgpu.warpgroup.wait_group(1)
            if kt > kb0:
                mainloop.consumer_release(release)
                release.advance()
            state.advance()
        cute.nvgpu.warpgroup.wait_group(0)
        mainloop.consumer_release(release)
        release.advance()
        return state, release

    # ------------------------------------------------------------------ fp8_block128
    @cute.jit
    def _mainloop_fp8_halves(self, mainloop, state, release, ops: RowOperands, acc, work: TileWork):
        """Per k tile and per B half: the chain into temp (promote_k at a time), then its promotion."""
        cfg = self.cfg
        mAS, mWS, r0, storage = ops.mAS, ops.mWS, ops.r0, ops.storage
        kb0, kb1 = work.kb0, work.kb1
        arow_a, arow_b, wrow_0, wrow_1 = self._scale_rows(ops, work)
        # scales of k block kt are loaded one iteration ahead (global-load latency), or
        # (smem_scales) read from the stage once it is full: the producer staged them
        na_a = na_b = nw_0 = nw_1 = Float32(0.0)
        sScl = None
        if cutlass.const_expr(cfg.smem_scales):
            sScl = storage.scl.get_tensor(self._scale_layout())
        else:
            na_a = mAS[arow_a, kb0]
            na_b = mAS[arow_b, kb0]
            nw_0 = mWS[wrow_0, kb0]
            nw_1 = mWS[wrow_1, kb0]
        for kt in cutlass.range(kb0, kb1, unroll=1):
            as_a = na_a
            as_b = na_b
            ws_0 = nw_0
            ws_1 = nw_1
            if cutlass.const_expr(not cfg.smem_scales):
                kn = cutlass.min(kt + 1, kb1 - 1)
                na_a = mAS[arow_a, kn]
                na_b = mAS[arow_b, kn]
                nw_0 = mWS[wrow_0, kn]
                nw_1 = mWS[wrow_1, kn]
            mainloop.consumer_wait(state)
            if cutlass.const_expr(cfg.smem_scales):
                as_a = sScl[state.index, r0]
                as_b = sScl[state.index, r0 + 8]
                ws_0 = sScl[state.index, cfg.tile_m]
                ws_1 = sScl[state.index, cfg.tile_m + 1]
            self._halves(ops, acc, state.index, (as_a, as_b), (ws_0, ws_1))
            mainloop.consumer_release(state)
            state.advance()
        return state, release

    @cute.jit
    def _mainloop_fp8_halves_static(self, mainloop, state, release, ops: RowOperands, acc, work: TileWork):
        """_mainloop_fp8_halves (smem_scales) where every segment starts at stage 0 and spans a whole
        number of rings (TileConfig.static_stages): the k loop steps a ring at a time and unrolls its
        stages, so each k tile's stage is a compile-time constant: its wgmma descriptors, barrier and
        scale addresses are fixed offsets from the ring's base, and only the phase is carried."""
        cfg = self.cfg
        r0 = ops.r0
        sScl = ops.storage.scl.get_tensor(self._scale_layout())
        phase = state.phase
        for kt in cutlass.range(work.kb0, work.kb1, cfg.stages, unroll=1):
            for s in cutlass.range_constexpr(cfg.stages):
                stage = pipeline.PipelineState(cfg.stages, state.count, Int32(s), phase)
                mainloop.consumer_wait(stage)
                self._halves(ops, acc, s, (sScl[s, r0], sScl[s, r0 + 8]), (sScl[s, cfg.tile_m], sScl[s, cfg.tile_m + 1]))
                mainloop.consumer_release(stage)
            phase = phase ^ 1
        return self._after_rings(state, work.kb1 - work.kb0), release

    def _after_rings(self, state, k_tiles):
        """``state`` advanced by k_tiles, a whole number of rings (static_stages): the same stage, the
        phase flipped once a ring (plain Python, inlined)."""
        rings = k_tiles // self.cfg.stages
        return pipeline.PipelineState(self.cfg.stages, state.count + k_tiles, state.index, state.phase ^ (rings % 2))

    @cute.jit
    def _mainloop_fp8_quarters(self, mainloop, state, release, ops: RowOperands, acc, work: TileWork):
        """One warpgroup (TileConfig.overlap): wgmma chains over 64-row quarters of B (quarter c:
        B rows [64c, 64c + 64), half c // 2) into two 32-register temps, so that one is promoted
        while the other is computed.

        Per k tile, quarters 0..3 alternate between the two temps: issue quarter c + 1, wait for c
        only (wait_group(1)), promote c. The loop takes k tiles in pairs: the second tile's quarter
        0 is issued before the first tile's quarter 3 is promoted; after the second, wait for its
        quarter 3, release, promote. (Overlapping every boundary would leave a wgmma group in
        flight across the loop's back-edge, and ptxas then serializes every wgmma: C7514.) An odd
        last k tile runs alone. The scales of a pair are loaded one pair ahead: loaded at the top
        of the body, as v5 did, the pair's first wgmma waited for them (the largest stall in Nsight
        Compute's source view, benchmarks/history/gate_up.md). (Multiplying them only after that wgmma is
        issued changes nothing: ptxas hoists the multiply above it.)"""
        quarters = ops.quarters
        mma_q, tCrA_q, tCrB_q, tq, num_k_blocks = quarters
        mAS, mWS, m, ws_last = ops.mAS, ops.mWS, ops.m, ops.ws_last
        tn, kb0, kb1, row_a, row_b = work.tn, work.kb0, work.kb1, work.row_a, work.row_b
        arow_a = cutlass.min(row_a, m - 1)
        arow_b = cutlass.min(row_b, m - 1)
        wrow_0 = cutlass.min(self._w_block(tn), ws_last)
        wrow_1 = cutlass.min(self._w_block(tn) + 1, ws_last)
        scales = (mAS, mWS, arow_a, arow_b, wrow_0, wrow_1)
        raw0 = self._load_scales(scales, kb0)
        raw1 = self._load_scales(scales, cutlass.min(kb0 + 1, kb1 - 1))
        for kt in cutlass.range(kb0, kb1 - 1, 2, unroll=1):
            sc0 = self._scale_products(raw0)
            sc1 = self._scale_products(raw1)
            raw0 = self._load_scales(scales, cutlass.min(kt + 2, kb1 - 1))
            raw1 = self._load_scales(scales, cutlass.min(kt + 3, kb1 - 1))
            mainloop.consumer_wait(state)
            self._issue(mma_q, tq[0], tCrA_q, tCrB_q[0], state.index, num_k_blocks)
            self._quarters_1_to_3(quarters, state.index, acc, sc0)
            state.advance()
            mainloop.consumer_wait(state)
            self._issue(mma_q, tq[0], tCrA_q, tCrB_q[0], state.index, num_k_blocks)
            cute.nvgpu.warpgroup.wait_group(1)
            mainloop.consumer_release(release)
            release.advance()
            self._promote_quarter(acc, tq[1], 3, sc0[2], sc0[3])
            self._quarters_1_to_3(quarters, state.index, acc, sc1)
            cute.nvgpu.warpgroup.wait_group(0)
            mainloop.consumer_release(release)
            release.advance()
            state.advance()
            self._promote_quarter(acc, tq[1], 3, sc1[2], sc1[3])
        if (kb1 - kb0) % 2 == 1:  # the last k tile, alone (its scales are in raw0)
            sc0 = self._scale_products(raw0)
            mainloop.consumer_wait(state)
            self._issue(mma_q, tq[0], tCrA_q, tCrB_q[0], state.index, num_k_blocks)
            self._quarters_1_to_3(quarters, state.index, acc, sc0)
            cute.nvgpu.warpgroup.wait_group(0)
            mainloop.consumer_release(release)
            release.advance()
            state.advance()
            self._promote_quarter(acc, tq[1], 3, sc0[2], sc0[3])
        return state, release

    @cute.jit
    def _mainloop_fp8_split_n(self, mainloop, state, release, ops: RowOperands, acc, work: TileWork):
        """split_n, warpgroup w: B half w (0: gate, 1: up) over all 64 rows, N = 128 chains (no smem
        bandwidth spent re-reading A per quarter) into two temps, k tiles in runs of split_unroll:
        each tile's chain runs while the one before is promoted (the run's last promotion has the
        tensor pipe to itself). Scales a run ahead. The half lands in acc half 0 (the epilogue
        hands the up half over: GemmKernel._split_n_handoff)."""
        cfg = self.cfg
        tiled_mma, thr_mma, sB, tCrA, temp, temp2 = ops.tiled_mma, ops.thr_mma, ops.sB, ops.tCrA, ops.temp, ops.temp2
        num_k_blocks = ops.num_k_blocks
        mAS, mWS, m, ws_last = ops.mAS, ops.mWS, ops.m, ops.ws_last
        tn, kb0, kb1, row_a, row_b = work.tn, work.kb0, work.kb1, work.row_a, work.row_b
        w = ops.wg_idx - 1
        tCrB_w = tiled_mma.make_fragment_B(
            thr_mma.partition_B(cute.local_tile(sB, (HALF_N, cfg.tile_k, cfg.stages), (w, 0, 0)))
        )
        wrow = cutlass.min(self._w_block(tn) + w, ws_last)
        scales = (mAS, mWS, cutlass.min(row_a, m - 1), cutlass.min(row_b, m - 1), wrow, wrow)
        run = cfg.split_unroll
        temps = (temp, temp2)
        # (both weight scales are this half's: _scale_products' first pair is the one used)
        raws = tuple(self._load_scales(scales, cutlass.min(kb0 + i, kb1 - 1)) for i in range(run))
        for kt in cutlass.range(kb0, kb1 - (run - 1), run, unroll=1):
            scs = tuple(self._scale_products(r) for r in raws)
            raws = tuple(self._load_scales(scales, cutlass.min(kt + run + i, kb1 - 1)) for i in range(run))
            for i in cutlass.range_constexpr(run):
                mainloop.consumer_wait(state)
                self._issue(tiled_mma, temps[i % 2], tCrA, tCrB_w, state.index, num_k_blocks)
                state.advance()
                if cutlass.const_expr(i > 0):
                    cute.nvgpu.warpgroup.wait_group(1)
                    mainloop.consumer_release(release)
                    release.advance()
                    self._promote_half(acc, temps[(i - 1) % 2], 0, scs[i - 1][0], scs[i - 1][1])
            cute.nvgpu.warpgroup.wait_group(0)
            mainloop.consumer_release(release)
            release.advance()
            self._promote_half(acc, temps[(run - 1) % 2], 0, scs[run - 1][0], scs[run - 1][1])
        left = (kb1 - kb0) % run
        for i in cutlass.range_constexpr(run - 1):  # the last k tiles, one at a time (scales in raws)
            if i < left:
                sc = self._scale_products(raws[i])
                mainloop.consumer_wait(state)
                self._issue(tiled_mma, temp, tCrA, tCrB_w, state.index, num_k_blocks)
                state.advance()
                cute.nvgpu.warpgroup.wait_group(0)
                mainloop.consumer_release(release)
                release.advance()
                self._promote_half(acc, temp, 0, sc[0], sc[1])
        return state, release

    # trace-time helpers of the fp8 mainloops (plain Python, inlined where called)
    def _scale_rows(self, ops: RowOperands, work: TileWork):
        """(x scale row of row a, of row b, weight scale row of half 0, of half 1) for this thread's
        rows of the tile: rows past M read the last row's scale (their A rows are TMA zero-fill),
        weight rows past N (a partial last tile) the last scale row (their B rows are zero-fill)."""
        m, ws_last, tn = ops.m, ops.ws_last, work.tn
        # (_w_block called twice, as the loop this came from did: the shipped configs' PTX stays as
        # it was, benchmarks/ptx_md5)
        return (cutlass.min(work.row_a, m - 1), cutlass.min(work.row_b, m - 1),
                cutlass.min(self._w_block(tn), ws_last), cutlass.min(self._w_block(tn) + 1, ws_last))

    def _halves(self, ops: RowOperands, acc, stage, a_scales, w_scales):
        """The halves schedule's k tile in ``stage``: per B half, its chain into temp (promote_k at a
        time), then its promotion with (row a, row b) x scales times that half's weight scale."""
        tiled_mma, tCrA, tCrB_half, temp = ops.tiled_mma, ops.tCrA, ops.tCrB_half, ops.temp
        num_k_blocks, mmas_per_promotion = ops.num_k_blocks, ops.mmas_per_promotion
        for half in range(2):
            sc_a = a_scales[0] * w_scales[half]
            sc_b = a_scales[1] * w_scales[half]
            for grp in range(num_k_blocks // mmas_per_promotion):
                cute.nvgpu.warpgroup.fence()
                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
                for j in range(mmas_per_promotion):
                    kk = grp * mmas_per_promotion + j
                    cute.gemm(tiled_mma, temp, tCrA[(None, None, kk, stage)], tCrB_half[half][(None, None, kk, stage)],
                              temp)
                    tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                cute.nvgpu.warpgroup.commit_group()
                cute.nvgpu.warpgroup.wait_group(0)
                self._promote_half(acc, temp, half, sc_a, sc_b)

    def _issue(self, tiled_mma, temp, tCrA, tCrB, stage, num_k_blocks):
        """One k tile's wgmma chain into temp (the first wgmma overwrites it), committed as one
        group. tiled_mma.set rebinds the atom's IR value; inside the branches that call this (in
        swap_ab) the new value would escape them (an IR dominance error), so the value from before
        is put back."""
        outer = tiled_mma._trait.value  # private: see above
        cute.nvgpu.warpgroup.fence()
        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
        for kk in range(num_k_blocks):
            cute.gemm(tiled_mma, temp, tCrA[(None, None, kk, stage)], tCrB[(None, None, kk, stage)], temp)
            tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
        cute.nvgpu.warpgroup.commit_group()
        tiled_mma._trait.value = outer

    def _load_scales(self, scales, kt):
        """Raw scales of k block kt: x scale of row a, of row b; weight scale of half 0, of half 1."""
        mAS, mWS, arow_a, arow_b, wrow_0, wrow_1 = scales
        return mAS[arow_a, kt], mAS[arow_b, kt], mWS[wrow_0, kt], mWS[wrow_1, kt]

    def _scale_products(self, raw):
        """(row a, row b) promotion scales for weight half 0, then half 1, from _load_scales."""
        xa, xb, w0, w1 = raw
        return (xa * w0, xb * w0, xa * w1, xb * w1)

    def _quarters_1_to_3(self, quarters, stage, acc, sc):
        """With quarter 0 of the k tile in ``stage`` in flight in temp 0: issue quarters 1, 2, 3,
        each time promoting the one before; returns with quarter 3 in flight in temp 1.
        sc = (row a, row b) scales of half 0, then of half 1."""
        mma_q, tCrA_q, tCrB_q, tq, num_k_blocks = quarters
        for c in range(1, 4):
            self._issue(mma_q, tq[c % 2], tCrA_q, tCrB_q[c], stage, num_k_blocks)
            cute.nvgpu.warpgroup.wait_group(1)
            half = (c - 1) // 2
            self._promote_quarter(acc, tq[(c - 1) % 2], c - 1, sc[2 * half], sc[2 * half + 1])

    def _promote_half(self, acc, temp, half, sc_a, sc_b):
        """acc half ``half`` += temp (one B half's chain) · scale (row a / row b values). split_n
        promotes into half 0 whichever B half its warpgroup runs."""
        for v in range(cute.size(temp, mode=[0])):
            sc = sc_a if (v // 2) % 2 == 0 else sc_b
            acc[(v, 0, half)] = acc[(v, 0, half)] + temp[(v, 0, 0)] * sc

    def _promote_quarter(self, acc, temp, c, sc_a, sc_b):
        """acc[quarter c] += temp · scale: temp value v is column 64·(c % 2) + col(v) of half c // 2,
        i.e. acc value v + 32·(c % 2) (the C fragment formula in gemm.py's docstring)."""
        half = c // 2
        n_q = cute.size(temp, mode=[0])
        for v in range(n_q):
            sc = sc_a if (v // 2) % 2 == 0 else sc_b
            acc[(v + n_q * (c % 2), 0, half)] = acc[(v + n_q * (c % 2), 0, half)] + temp[(v, 0, 0)] * sc
