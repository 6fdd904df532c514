"""Ping-pong consumers for the sm_90a GEMM's fp8 64-row gate_up tile (TileConfig.pingpong; prepared,
not measured yet: benchmarks/STATUS.md).

The 128-row tile's two consumer warpgroups share each tile: both finish its k loop together and run
the epilogue (act·up, the amax, the quantization, the copy-out) together, with the tensor pipe idle
(8 % of the stall samples at M = 4096: benchmarks/history/deepgemm.md). Here each warpgroup runs a
64 × 256 tile of its own and the two take alternate tiles of the CTA's schedule (warpgroup w the
tiles j ≡ w mod 2), so that one's epilogue runs under the other's mainloop:

    producer   tile 0 k tiles | tile 1 k tiles | tile 2 k tiles | ...   (one pipeline, in order)
    wg 0       mainloop 0     | epilogue 0     | mainloop 2     | epilogue 2 ...
    wg 1                      | mainloop 1     | epilogue 1     | mainloop 3 ...

A stage holds one warpgroup's k tile: its empty barrier waits for that warpgroup's four warps
(GemmKernel._prologue), and each warpgroup steps its pipeline states over the other's k tiles.
The mainloops take turns (two named barriers, ORDER_BARRIER): a warpgroup waits for its tile's
first full barrier only once the other has waited for every one of its own. Without the turns the
phase parity a stage's full barrier is waited on would alias: warpgroup 1, its state stepped over
tile 0's k tiles, waits on a parity that the barrier shows before tile 0's fills are even done,
and reads (and releases) stages that hold tile 0's k tiles (the first GPU run: a launch failure).
With them, every fill before the one a warpgroup waits for has been waited for already.
Whole tiles only, so every tile has the same k tiles. The mainloop is the halves schedule
(_mainloop_fp8_halves: 128 + 64 accumulator registers of the 232 a consumer thread gets); the
epilogue is the 64-row tile's (_epilogue_gated), each warpgroup staging h in a 64-row slab of its
own.

PingpongMixin is a base class of GemmKernel: its method is traced into the kernel.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32

from .mainloop import TileWork

ORDER_BARRIER = 8  # named barrier ids 8 (warpgroup 0's mainloop waited for all its k tiles), 9 (warpgroup 1's)


class PingpongMixin:

    @cute.jit
    def _consume_pingpong(self, tiled_mma, mainloop, sA, sB, storage, gmem, sched, tidx, wg_idx):
        """The consumer warpgroups of the pingpong tile (module docstring): warpgroup w runs the
        CTA's tiles j = w, w + 2, ... (whole tiles: tile j is cursor j · k_tiles of the schedule)."""
        cfg = self.cfg
        w = wg_idx - 1
        ops, acc, n_vals, col0 = self._row_operands(tiled_mma, sA, sB, storage, gmem, tidx, wg_idx)
        r0 = ops.r0
        sO = storage.sO.get_tensor(cute.make_layout((2 * cfg.tile_m, cfg.out_row_words), stride=(cfg.out_row_words, 1)))
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, cfg.stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, cfg.stages)
        k_tiles = sched.k_tiles
        tiles = sched.cursor_end // k_tiles
        for _ in cutlass.range(w * k_tiles, unroll=1):  # warpgroup 1: the first tile is warpgroup 0's
            state.advance()
            release.advance()
        j = w
        while j < tiles:
            tile, kb0, kb1 = self._segment(j * k_tiles, sched)
            tm, tn = self._tile_mn(tile, sched.tiling)
            row_a = tm * cfg.tile_m + r0
            acc.fill(0.0)
            if j > 0:  # the other warpgroup's mainloop of tile j - 1 has waited for all its k tiles
                pipeline.NamedBarrier(barrier_id=ORDER_BARRIER + 1 - w, num_threads=256).arrive_and_wait()
            state, release = self._row_mainloop(mainloop, state, release, ops, acc,
                                                TileWork(tm, tn, kb0, kb1, row_a, row_a + 8))
            if j + 1 < tiles:  # the other warpgroup's turn (tile j + 1)
                pipeline.NamedBarrier(barrier_id=ORDER_BARRIER + w, num_threads=256).arrive()
            # the epilogue places a value of tile row r at slab row r and global row tm·64 + r: so row
            # r0 + 64w of tile tm - w is this warpgroup's slab (rows [64w, 64w + 64)) and row r0 of tm
            self._epilogue_gated(acc, n_vals, r0 + 64 * w, col0, tm - w, tn, gmem.m, sO, gmem.mOut, gmem.mAux, w,
                                 tidx % 128, None)
            for _ in cutlass.range(k_tiles, unroll=1):  # the other warpgroup's next tile
                state.advance()
                release.advance()
            j += Int32(2)
