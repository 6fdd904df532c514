"""The producer side of the sm_90a GEMM (gemm.py's GemmKernel, and swap_ab.py's through it): the
setup both warpgroup roles share (shared storage, the TMA pipeline, the k tiles' TMA partitions:
_prologue, _tma_loads), this CTA's schedule and the band order of its tiles (_cta_schedule, _tile_mn;
plan() in schedule.py decides them on the host), and the producer warpgroup's loads (_produce: each
segment's k tiles of A and W, the weights ahead of griddepcontrol.wait under PDL, the scales staged in
smem, the L2 hints). A mixin of GemmKernel, as mainloop.py (the consumers' k loop), stream_k.py and
epilogue_stores.py are; every method is plain Python inlined at trace time.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32, Int64
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from .schedule import band_rows, sk_iter_begin
from .stream_k import Schedule
from .tile_config import EVICT_FIRST, EVICT_LAST, GRANULE, INTERLEAVE, W_BLOCK


class Gmem(NamedTuple):
    """The kernel's global-memory tensors and sizes, as the producer and the consumers read them."""

    mAS: Any  # a_scale [M, ceil(K/128)]
    mWS: Any  # w_scale [ceil(N/128), ceil(K/128)]
    mOut: Any  # h (swiglu) / y (linear) as 32-bit words
    mAux: Any  # h_scale (swiglu) / residual (linear, as words)
    mPart: Any  # stream-K partials
    mCtr: Any  # stream-K arrival counters
    tma_o: Any  # h_tma_store: the TMA store atom of h ...
    mO_tma: Any  # ... and h as its tensor
    m: Any
    n: Any


class TmaLoads(NamedTuple):
    """The producer's TMA atoms and their smem / gmem partitions (GemmKernel._prologue)."""

    tma_a: Any
    tAgA: Any
    tAsA: Any
    tma_b: Any
    tBgB: Any
    tBsB: Any  # several boxes a stage (TileConfig.b_boxes): a tuple, one partition per box
    b_mask: Any  # cluster_m > 1: the CTAs the weight k tile is multicast to


class ProducerMixin:
    """GemmKernel's producer warpgroup and shared setup (module docstring)."""

    def _prologue(self, tma_a, mA, tma_b, mB, a_layout, b_layout, m, n_tiles, sk_tiles, bidx, nctas=None):
        """The setup both kernels (this one and swap_ab's) share, plain Python inlined at trace time:
        shared storage, the TMA pipeline, the smem / gmem tile partitions and this CTA's schedule
        (over ``nctas`` CTAs: _cta_schedule)."""
        cfg = self.cfg
        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        stage_bytes = cute.size_in_bytes(self.ab_dtype, cute.slice_(a_layout, (None, None, 0))) + cute.size_in_bytes(
            self.w_dtype, cute.slice_(b_layout, (None, None, 0))
        )
        if cutlass.const_expr(cfg.nvfp4 and cfg.tile_major):  # + the bulk copy of the k tile's scale words
            stage_bytes += cfg.tile_n * 4
        cl = cfg.cluster_m
        # a stage is free once every consumer warp of every CTA its weight tile was multicast to
        # has released it (lane r of each consumer warp arrives on CTA r's barrier)
        mainloop = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar.data_ptr(),
            num_stages=cfg.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 2 if cfg.smem_scales else 1),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_wg * 4 * cl),
            tx_count=stage_bytes,
            cta_layout_vmnk=cute.make_layout((1, cl, 1, 1)),
            defer_sync=True,
        )
        if cfg.cluster_k > 1:
            self._init_xbar(storage)
        if cfg.x_permute:
            self._init_x_ready(storage)
        # (a cluster-wide sync when the launch has clusters: the peer's barriers are initialized
        # before anyone signals them)
        pipeline_init_arrive(cluster_shape_mn=(cfg.cluster_size, 1), is_relaxed=True)

        sA = storage.sA.get_tensor(a_layout.outer, swizzle=a_layout.inner)
        sB = storage.sB.get_tensor(b_layout.outer, swizzle=b_layout.inner)
        loads, k_tiles = self._tma_loads(tma_a, mA, tma_b, mB, sA, sB)

        pipeline_init_wait(cluster_shape_mn=(cfg.cluster_size, 1))
        sched = self._cta_schedule(m, mA.shape[1], n_tiles, sk_tiles, k_tiles, bidx, nctas)
        return storage, mainloop, sA, sB, loads, sched

    def _tma_loads(self, tma_a, mA, tma_b, mB, sA, sB):
        """(TmaLoads, k tiles per tile): the producer's TMA atoms with their smem and gmem partitions of
        A's and W's k tiles (plain Python, inlined into _prologue; decode_mlp.py makes a second set over
        the same stages)."""
        cfg = self.cfg
        cl = cfg.cluster_m
        # (bM, bK, RestM, RestK) and (bN, bK, RestN, RestK)
        gA = cute.local_tile(mA, (cfg.tile_m, cfg.tile_k), (None, None))
        gB = cute.local_tile(mB, (cfg.b_box_rows, self._w_tile_cols()), (None, None))
        k_tiles = cute.size(gA, mode=[3])
        tAsA, tAgA = cute.nvgpu.cpasync.tma_partition(
            tma_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2)
        )
        rank = 0
        b_mask = None
        if cl > 1:  # trace time: this CTA loads its part of each weight k tile for the whole cluster
            rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
            b_mask = cute.make_layout_image_mask(cute.make_layout((cl, 1, 1)), (rank, 0, 0), mode=0)
        if cfg.b_boxes > 1:  # trace time: smem rows [b·r, b·(r + 1)) of each stage, one box each (_produce)
            tBsB = []
            for r in range(cfg.b_boxes):
                sBr = cute.local_tile(sB, (cfg.b_box_rows, self._w_tile_cols(), cfg.stages), (r, 0, 0))
                tBsBr, tBgB = cute.nvgpu.cpasync.tma_partition(
                    tma_b, 0, cute.make_layout(1), cute.group_modes(sBr, 0, 2), cute.group_modes(gB, 0, 2)
                )
                tBsB.append(tBsBr)
            tBsB = tuple(tBsB)
        else:
            tBsB, tBgB = cute.nvgpu.cpasync.tma_partition(
                tma_b, rank, cute.make_layout(cl), cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2)
            )
        return TmaLoads(tma_a, tAgA, tAsA, tma_b, tBgB, tBsB, b_mask), k_tiles

    def _cta_schedule(self, m, k, n_tiles, sk_tiles, k_tiles, bidx, nctas=None) -> Schedule:
        """This CTA's work (plain Python, inlined; see plan()): whole tiles b, b + grid, ... <
        dp_tiles first (m varies fastest within bands of M tiles, _tile_mn: the CTAs running
        together share a few weight tiles, read once from HBM, and a band of A that stays in L2),
        then its equal share of the K iterations of the last sk_tiles tiles. Both warpgroup roles
        walk the same segments (tile, k tiles [kb0, kb1)) with a cursor over this CTA's k
        iterations (not named v: the value loops rebind v at trace time). ``nctas``: the CTAs
        [0, nctas) that share the work where not the whole grid (decode_mlp.py's two GEMMs); the
        CTAs past them get none (their iterations clamped to empty ranges)."""
        cfg = self.cfg
        cl = cfg.cluster_m
        part = nctas is not None
        if not part:
            nctas, _, _ = cute.arch.grid_dim()
        # a cluster's CTAs take tiles b, b + 1 (b even): same weight tile when grid_m is even
        grid_m = (m + cfg.tile_m * cl - 1) // (cfg.tile_m * cl) * cl
        tiling = (grid_m, n_tiles, band_rows(grid_m, cfg.tile_m * cfg.elem_bytes * k, cl))
        dp_tiles = grid_m * n_tiles - sk_tiles
        sk_iters = sk_tiles * k_tiles
        it_begin = sk_iter_begin(bidx, nctas, sk_iters)
        it_end = sk_iter_begin(bidx + 1, nctas, sk_iters)
        dp_iters = (dp_tiles - bidx + nctas - 1) // nctas * k_tiles
        if part:  # (trace time: the whole-grid schedule's formulas stay as they were)
            it_begin = cutlass.min(it_begin, sk_iters)
            it_end = cutlass.min(it_end, sk_iters)
            dp_iters = (cutlass.max(dp_tiles - bidx, 0) + nctas - 1) // nctas * k_tiles
        cursor_end = dp_iters + it_end - it_begin
        return Schedule(bidx, nctas, k_tiles, tiling, dp_tiles, sk_iters, it_begin, it_end, dp_iters, cursor_end)

    def _l2_hints(self):
        """cute.copy keyword arguments (cache_policy) for the producer's A (activation) and B
        (weight) loads, per TileConfig.l2_hint. The swap-AB tiles load the same way (the weights
        are the wgmma's A operand there, not the TMA's)."""
        hint = self.cfg.l2_hint
        weight = {"cache_policy": Int64(EVICT_FIRST)} if hint else {}
        act = {"cache_policy": Int64(EVICT_LAST)} if hint == "w_first_x_last" else {}
        return act, weight

    def _weights_before_wait(self) -> bool:
        """TileConfig.pdl: whether the producer issues its first stages' weight loads before
        griddepcontrol.wait, under the previous kernel's tail (DISPATCH D20). The weights are
        constant across launches, except a prefill's dequantized weight, which the kernel before
        this one writes (nvfp4_dequant.py). nvfp4 prefetches them instead (_prefetches_weights)."""
        return self.cfg.pdl and not self.cfg.dequantized and not self.cfg.nvfp4

    def _prefetches_weights(self) -> bool:
        """TileConfig.pdl on a tile-major nvfp4 weight (its k tiles are contiguous runs): the
        producer prefetches its first k tiles into L2 before griddepcontrol.wait (NVFP4's
        _prefetch_weights_early) and loads everything after it."""
        return self.cfg.pdl and self.cfg.nvfp4 and self.cfg.tile_major

    def _producer_works_before_wait(self) -> bool:
        """Whether the producer issues weight loads or prefetches before it waits (the consumers
        then wait on their own, after their register increase), or every thread waits at once."""
        return self._weights_before_wait() or self._prefetches_weights()

    def _due(self, i, early):
        """(plain Python, inlined) whether k iteration i of this CTA still needs its slot acquired
        and its weight loads issued: all of them, unless _produce_weights_early issued the first
        ``early`` ones."""
        return cutlass.Boolean(True) if early is None else i >= early

    @cute.jit
    def _produce(self, mainloop, loads: TmaLoads, sched: Schedule, gmem: Gmem, storage):
        """The producer warp: TMA loads of A and W k tiles for this CTA's segments, in order."""
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.cfg.stages)
        lane = cute.arch.lane_idx()
        hints = self._l2_hints()
        early = None
        if cutlass.const_expr(self._weights_before_wait()):
            early = self._produce_weights_early(mainloop, loads, sched, gmem, storage, lane, hints[1])
            cute.arch.griddepcontrol_wait()
        elif cutlass.const_expr(self._prefetches_weights()):
            self._prefetch_weights_early(sched, gmem, lane)
            cute.arch.griddepcontrol_wait()
        state = self._load_segments(mainloop, loads, sched, gmem, storage, state, early, lane, hints)
        if cutlass.const_expr(self.cfg.pdl):  # the next kernel may be placed and load its weights
            cute.arch.griddepcontrol_launch_dependents()
        mainloop.producer_tail(state)

    @cute.jit
    def _load_segments(self, mainloop, loads: TmaLoads, sched: Schedule, gmem: Gmem, storage, state, early, lane,
                       hints):
        """The TMA loads of this CTA's segments from the producer's pipeline ``state`` on: each k
        tile's slot acquired and its weight loaded, but for the first ``early`` ones (whose
        _produce_weights_early issued those), and its A tile (and staged scales). Returns the state
        after them (decode_mlp.py walks two GEMMs' segments in turn)."""
        tma_a, tAgA, tAsA = loads.tma_a, loads.tAgA, loads.tAsA
        hint_a, hint_b = hints
        cursor = Int32(0)
        mAS, mWS, m, n = gmem.mAS, gmem.mWS, gmem.m, gmem.n  # (for smem_scales)
        cursor_end = sched.cursor_end
        ws_last = (n + W_BLOCK - 1) // W_BLOCK - 1
        sScl = None
        if cutlass.const_expr(self.cfg.smem_scales):
            sScl = storage.scl.get_tensor(self._scale_layout())
        i = Int32(0)
        while cursor < cursor_end:
            tile, kb0, kb1 = self._segment(cursor, sched)
            tm, tn = self._tile_mn(tile, sched.tiling)
            cursor += kb1 - kb0
            for kt in cutlass.range(kb0, kb1, unroll=1):
                staged = None
                if cutlass.const_expr(self.cfg.smem_scales):  # loaded before the empty-slot wait, which hides them
                    staged = self._load_tile_scales(mAS, mWS, m, ws_last, tm, tn, kt, lane)
                due = self._due(i, early)
                if due:
                    mainloop.producer_acquire(state)
                bar = mainloop.producer_get_barrier(state)
                if due:
                    self._load_w_scales(gmem, storage, tn, kt, lane, state.index, bar)
                cute.copy(tma_a, tAgA[(None, tm, kt)], tAsA[(None, state.index)], tma_bar_ptr=bar, **hint_a)
                if due:
                    self._load_b(loads, tn, kt, state.index, bar, hint_b)
                if cutlass.const_expr(self.cfg.smem_scales):
                    self._store_tile_scales(sScl, state.index, staged, lane, bar)
                mainloop.producer_commit(state)
                state.advance()
                i += 1
        return state

    @cute.jit
    def _produce_weights_early(self, mainloop, loads: TmaLoads, sched: Schedule, gmem: Gmem, storage, lane, hint_b,
                               start=None):
        """TileConfig.pdl: the weight loads of this CTA's first k iterations (as many as there are
        stages, all slots free), before griddepcontrol.wait: the slot acquired (its full barrier
        expects the whole stage's bytes, so it completes only once _produce adds the activation
        loads after the wait) and the weight's k tile and its scales loaded. Returns how many.
        ``start``: the producer's pipeline state where it is not fresh (decode_mlp.py's second GEMM,
        whose slots free as the first one's consumers release them)."""
        state = (pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.cfg.stages) if start is None
                 else start.clone())
        early = cutlass.min(Int32(self.cfg.stages), sched.cursor_end)
        cursor = Int32(0)
        while cursor < early:
            tn, kb0, kb1 = self._early_segment(cursor, early, sched)
            cursor += kb1 - kb0
            for kt in cutlass.range(kb0, kb1, unroll=1):
                mainloop.producer_acquire(state)
                bar = mainloop.producer_get_barrier(state)
                self._load_w_scales(gmem, storage, tn, kt, lane, state.index, bar)
                self._load_b(loads, tn, kt, state.index, bar, hint_b)
                state.advance()
        return early

    @cute.jit
    def _early_segment(self, cursor, early, sched: Schedule):
        """(tn, kb0, kb1): the segment at this CTA's cursor, cut at its first ``early`` k iterations
        (the weight k tiles TileConfig.pdl loads or prefetches before griddepcontrol.wait)."""
        tile, kb0, kb1 = self._segment(cursor, sched)
        _, tn = self._tile_mn(tile, sched.tiling)
        return tn, kb0, cutlass.min(kb1, kb0 + early - cursor)

    def _load_w_scales(self, gmem: Gmem, storage, tn, kt, lane, stage, bar):
        """nvfp4: the producer's copy of tile tn's k tile kt's e4m3 scales (the decode's) into
        ``stage``, before the TMA loads (plain Python, inlined; nothing for the other mainloops)."""
        if cutlass.const_expr(self.cfg.nvfp4 and self.cfg.tile_major):  # one run: one bulk copy
            self._bulk_nvfp4_scales(storage, gmem.mWS, tn, kt, lane, stage, bar)
        elif cutlass.const_expr(self.cfg.nvfp4):
            self._copy_nvfp4_scales(storage, gmem.mWS, gmem.n, tn, kt, lane, stage, bar)

    def _load_b(self, loads: TmaLoads, tn, kt, stage, bar, hint_b):
        """The producer's TMA loads of weight tile tn's k tile kt into ``stage`` (plain Python,
        inlined into _produce): one box of the whole tile, multicast for cluster pairs, or the
        granule tile's boxes. (split.py: two 128-row boxes.)"""
        _, _, _, tma_b, tBgB, tBsB, b_mask = loads
        if cutlass.const_expr(self.cfg.granules):
            # h-tile tn is granules u = per_tile·tn + j; with c = INTERLEAVE / 16 = 8 granules a
            # 128-row chunk, granule u's gate rows are 16-row box p = 2c·(u // c) + u % c of
            # the packed weight, its up rows box p + c
            per_tile = self.cfg.tile_n // (2 * GRANULE)
            c = INTERLEAVE // GRANULE
            for j in range(per_tile):
                u = tn * per_tile + j
                p = u + u // c * c
                cute.copy(tma_b, tBgB[(None, p, kt)], tBsB[2 * j][(None, stage)], tma_bar_ptr=bar)
                cute.copy(tma_b, tBgB[(None, p + c, kt)], tBsB[2 * j + 1][(None, stage)],
                          tma_bar_ptr=bar)
        elif cutlass.const_expr(self.cfg.half_row_pairs):
            for j, q in enumerate(self._w_quarters(tn)):
                cute.copy(tma_b, tBgB[(None, q, kt)], tBsB[j][(None, stage)], tma_bar_ptr=bar, **hint_b)
        elif cutlass.const_expr(self.cfg.cluster_m > 1):
            cute.copy(tma_b, tBgB[(None, tn, kt)], tBsB[(None, stage)], tma_bar_ptr=bar,
                      mcast_mask=b_mask, **hint_b)
        else:
            cute.copy(tma_b, tBgB[(None, tn, kt)], tBsB[(None, stage)], tma_bar_ptr=bar, **hint_b)

    def _w_quarters(self, tn):
        """half_row_pairs: the 64-row quarters of the weight that tile tn reads, its gate rows, then
        their up rows: quarters c and c + 2 of 256-row tile tn // 2, c = tn % 2 (plain Python, inlined)."""
        q = tn % 2 + 4 * (tn // 2)
        return q, q + 2

    def _w_block(self, tn):
        """The first 128-row weight block (weight-scale row) of N tile tn: its two halves are
        blocks _w_block(tn) and _w_block(tn) + 1 (plain Python, inlined; split.py shifts the pair tiles)."""
        return 2 * tn

    def _load_tile_scales(self, mAS, mWS, m, ws_last, tm, tn, kt, lane):
        """smem_scales, producer lanes (plain Python, inlined): k block kt's scales of the tile's A
        rows lane + 32i (rows ≥ M read the last row's, as the consumers did) and, in lanes 0 and 1,
        of weight block _w_block(tn) + lane (clamped to the last block row)."""
        xs = [mAS[cutlass.min(tm * self.cfg.tile_m + lane + 32 * i, m - 1), kt] for i in range(self.cfg.tile_m // 32)]
        return xs, mWS[cutlass.min(self._w_block(tn) + lane % 2, ws_last), kt]

    @cute.jit
    def _store_tile_scales(self, sScl, stage, staged, lane, bar):
        """smem_scales: the loaded scales into the stage's slots, then the stage's second arrival
        (after the warp's stores: the arrive releases them to the consumers' wait)."""
        xs, wsc = staged
        for i in cutlass.range_constexpr(self.cfg.tile_m // 32):
            sScl[stage, lane + 32 * i] = xs[i]
        if lane < 2:
            sScl[stage, self.cfg.tile_m + lane] = wsc
        cute.arch.sync_warp()
        if lane == 0:
            cute.arch.mbarrier_arrive(bar)

    def _tile_mn(self, tile, tiling):
        """(tm, tn) of tile index ``tile`` (plain Python, inlined). M tiles go in bands of ``band``
        (the last band may be shorter); tiles walk a band m fastest across every N tile before the
        next band. With one band (every M up to BAND_A_BYTES of A) that is plain m-fastest order."""
        grid_m, n_tiles, band = tiling
        b0 = tile // (band * n_tiles) * band  # first M tile of the band
        rows = cutlass.min(band, grid_m - b0)
        r = tile - b0 * n_tiles
        return b0 + r % rows, r // rows
