"""The stores of the sm_90a GEMM's finished tiles (gemm.py): the "gated" epilogue of gate_up
(h = act(gate) · up, quantized to e4m3 with its group scale or rounded to bf16, staged in smem as a
64 × 128 slab per warpgroup, then stored by TMA or copied out by the threads), its granule-tile
variant, and the "linear" epilogue of down (bf16 y, + an optional residual). The fragment layout
they rely on is drawn at the top of gemm.py; the activations and h formats are activations_and_h.py's.

EpilogueMixin is a base class of GemmKernel: its methods are traced into the kernel.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32

from .ptx import bf16_hi_to_f32, bf16_lo_to_f32, cvt_bf16x2, div_rn
from .tile_config import HALF_N, N_ALIGN


class EpilogueMixin:

    @cute.jit
    def _epilogue_gated(self, acc, n_vals: cutlass.Constexpr, r0, col0, tm, tn, m, sH, mH, mHS, wg, tid, h_store):
        """h = act(gate) · up in place in the gate half; quantize (fp8) or round (bf16); stage the
        warpgroup's 64 × 128 h slab in smem (fragment order), then store it: TMA (h_store =
        (atom, smem boxes, gmem boxes), cfg.h_tma_store) or a copy-out by the threads."""
        cfg = self.cfg
        tma = cfg.h_tma_store
        for v in cutlass.range_constexpr(n_vals):
            acc[(v, 0, 0)] = self.act(acc[(v, 0, 0)]) * acc[(v, 0, 1)]
        ra = r0  # tile-local rows of values with (v/2)%2 == 0 / 1
        rb = r0 + 8
        row_a = tm * cfg.tile_m + ra
        row_b = row_a + 8
        bar = pipeline.NamedBarrier(barrier_id=1 + wg, num_threads=128)
        if cutlass.const_expr(tma):
            if tid == 0:  # the previous tile's TMA store has read the slab
                cute.arch.cp_async_bulk_wait_group(0, read=True)
        bar.arrive_and_wait()  # the previous tile's copy-out of this slab is done
        # TMA: the slab is 128-byte swizzled (_h_store_layout): 16-byte chunk c of row r is stored
        # at chunk c ^ (r % 8), so a warp's 8 rows of fragment stores hit 8 different chunks
        fmt = self.h_spec
        inv_a = None  # 1/s of rows ra / rb (scaled formats)
        inv_b = None
        if cutlass.const_expr(fmt.scaled):
            amax_a = Float32(0.0)
            amax_b = Float32(0.0)
            for v in cutlass.range_constexpr(n_vals):
                if cutlass.const_expr((v // 2) % 2 == 0):
                    amax_a = cute.arch.fmax(amax_a, abs(acc[(v, 0, 0)]), nan=True)
                else:
                    amax_b = cute.arch.fmax(amax_b, abs(acc[(v, 0, 0)]), nan=True)
            for off in cutlass.range_constexpr(2):  # the quad holds the row's 128 columns
                amax_a = cute.arch.fmax(amax_a, cute.arch.shuffle_sync_bfly(amax_a, offset=1 << off), nan=True)
                amax_b = cute.arch.fmax(amax_b, cute.arch.shuffle_sync_bfly(amax_b, offset=1 << off), nan=True)
            s_a = fmt.scale(amax_a)
            s_b = fmt.scale(amax_b)
            inv_a = div_rn(Float32(1.0), s_a)
            inv_b = div_rn(Float32(1.0), s_b)
        if cutlass.const_expr(fmt.bits == 8):  # 16-bit words (column pairs)
            sH16 = cute.make_tensor(
                cute.recast_ptr(sH.iterator, dtype=cutlass.Int16),
                cute.make_layout((cfg.tile_m, 2 * cfg.out_row_words), stride=(2 * cfg.out_row_words, 1)),
            )
            sw = (ra % 8) * 8 if tma else 0  # (ra and rb = ra + 8 have the same row % 8)
            for v in cutlass.range_constexpr(0, n_vals, 2):
                c2 = (col0 + 8 * (v // 4)) // 2 ^ sw  # 16-bit word (column pair) in the row
                if cutlass.const_expr((v // 2) % 2 == 0):
                    sH16[ra, c2] = fmt.pack(acc[(v, 0, 0)], acc[(v + 1, 0, 0)], inv_a, inv_a)
                else:
                    sH16[rb, c2] = fmt.pack(acc[(v, 0, 0)], acc[(v + 1, 0, 0)], inv_b, inv_b)
        elif cutlass.const_expr(tma):  # 16-bit elements: two boxes of 64 columns (128 bytes) per row
            sBox = cute.make_tensor(sH.iterator, cute.make_layout((cfg.tile_m // 32, 64, 32), stride=(2048, 32, 1)))
            sw = (ra % 8) * 4
            for v in cutlass.range_constexpr(0, n_vals, 2):
                c2 = (col0 + 8 * (v // 4)) // 2  # 32-bit word (element pair) in the row: box c2 // 32
                r = rb % 64
                inv = inv_b
                if cutlass.const_expr((v // 2) % 2 == 0):
                    r = ra % 64
                    inv = inv_a
                sBox[2 * wg + (v // 4) // 8, r, c2 % 32 ^ sw] = fmt.pack(acc[(v, 0, 0)], acc[(v + 1, 0, 0)], inv, inv)
        else:
            for v in cutlass.range_constexpr(0, n_vals, 2):
                c2 = (col0 + 8 * (v // 4)) // 2  # 32-bit word (element pair) in the row
                if cutlass.const_expr((v // 2) % 2 == 0):
                    sH[ra, c2] = fmt.pack(acc[(v, 0, 0)], acc[(v + 1, 0, 0)], inv_a, inv_a)
                else:
                    sH[rb, c2] = fmt.pack(acc[(v, 0, 0)], acc[(v + 1, 0, 0)], inv_b, inv_b)
        if cutlass.const_expr(fmt.scaled):
            if col0 == 0:
                if row_a < m:
                    mHS[row_a, tn] = s_a
                if row_b < m:
                    mHS[row_b, tn] = s_b
        if cutlass.const_expr(tma):
            cute.arch.fence_proxy("async.shared", space="cta")  # the stores are visible to the TMA unit
            bar.arrive_and_wait()
            if tid == 0:
                tma_o, tHs, tHg = h_store
                boxes = cfg.out_bytes  # per warpgroup: 128 columns of h in 128-byte boxes
                for j in cutlass.range_constexpr(boxes):
                    cute.copy(tma_o, tHs[(None, boxes * wg + j)],
                              tHg[(None, tm * (cfg.tile_m // 64) + wg, boxes * tn + j)])
                cute.arch.cp_async_bulk_commit_group()
        else:
            bar.arrive_and_wait()
            self._copy_slab(sH, mH, tm, tn, m, Int32(0), wg, tid, False)

    @cute.jit
    def _epilogue_gated_granules(self, acc, n_vals: cutlass.Constexpr, r0, col0, tm, tn, m, sH, mH, wg, tid):
        """The granule tile's bf16 h: smem B row (= wgmma column) c holds gate row 16·(c // 32) + c % 16
        of the tile's tile_n / 2 if c % 32 < 16, else the up row of c - 16, so the up partner of gate
        value v is value v + 8 (col(v) = 8·(v/4) + 2·(lane%4) + v%2, module docstring). Staged like
        the 128-column slab (rows of cfg.out_chunks 16-byte chunks), then copied out."""
        bar = pipeline.NamedBarrier(barrier_id=1 + wg, num_threads=128)
        bar.arrive_and_wait()  # the previous tile's copy-out of this slab is done
        for v in cutlass.range_constexpr(0, n_vals, 2):
            if cutlass.const_expr((v // 8) % 2 == 0):  # a gate pair
                lo = self.act(acc[(v, 0, 0)]) * acc[(v + 8, 0, 0)]
                hi = self.act(acc[(v + 1, 0, 0)]) * acc[(v + 9, 0, 0)]
                c2 = (col0 + 16 * (v // 16) + 8 * ((v // 4) % 2)) // 2  # 32-bit word (bf16 pair) in the row
                if cutlass.const_expr((v // 2) % 2 == 0):
                    sH[r0, c2] = cvt_bf16x2(lo, hi)
                else:
                    sH[r0 + 8, c2] = cvt_bf16x2(lo, hi)
        bar.arrive_and_wait()
        self._copy_slab(sH, mH, tm, tn, m, Int32(0), wg, tid, False)

    @cute.jit
    def _epilogue_linear(self, acc, n_vals: cutlass.Constexpr, r0, col0, tm, tn, m, n, sY, mY, mR, wg, tid):
        """y = acc (+ residual) rounded once to bf16, slab by slab: output columns [256·tn + c·w, +w)
        for w = y_slab_cols (a half or a quarter of the tile), staged through the slab and copied out
        masked at M and N. The residual slab is first copied into the same smem slab (16-byte
        coalesced loads, same mask), then each thread adds the pairs it is about to overwrite
        (fragment order, no race)."""
        cfg = self.cfg
        ra = r0
        rb = r0 + 8
        n_chunks = n // N_ALIGN
        per_half = HALF_N // cfg.y_slab_cols  # slabs a tile half
        v_slab = n_vals // per_half  # a thread's values of one slab, one half
        bar = pipeline.NamedBarrier(barrier_id=1 + wg, num_threads=128)
        for half in cutlass.range_constexpr(2):
            for q in cutlass.range_constexpr(per_half):
                slab = (2 * tn + half) * per_half + q  # global columns [slab · w, slab · w + w)
                bar.arrive_and_wait()  # the previous copy-out of this slab is done
                if cutlass.const_expr(cfg.residual):
                    self._copy_slab(sY, mR, tm, slab, m, n_chunks, wg, tid, True)
                    bar.arrive_and_wait()  # the residual slab is in smem
                for v in cutlass.range_constexpr(q * v_slab, (q + 1) * v_slab, 2):
                    c2 = (col0 + 8 * (v // 4)) // 2 - q * (cfg.y_slab_cols // 2)  # bf16-pair word in the slab row
                    r = rb
                    if cutlass.const_expr((v // 2) % 2 == 0):
                        r = ra
                    lo = acc[(v, 0, half)]
                    hi = acc[(v + 1, 0, half)]
                    if cutlass.const_expr(cfg.residual):
                        res = sY[r, c2]
                        lo = lo + bf16_lo_to_f32(res)
                        hi = hi + bf16_hi_to_f32(res)
                    sY[r, c2] = cvt_bf16x2(lo, hi)
                bar.arrive_and_wait()
                self._copy_slab(sY, mY, tm, slab, m, n_chunks, wg, tid, False)

    @cute.jit
    def _copy_slab(self, sO, mO, tm, slab, m, n_chunks, wg, tid, into_smem: cutlass.Constexpr,
                   rows: cutlass.Constexpr = 64):
        """Copy the warpgroup's ``rows`` × out_chunks slab (16-byte chunks: 128 columns, or fewer) to
        (or, into_smem, from) the same columns of global slab ``slab``, 16 bytes per thread per step,
        row-contiguous; rows ≥ M skipped, and for the linear epilogue 16-byte chunks ≥ n_chunks (its
        column mask at N)."""
        cfg = self.cfg
        chunks = cfg.out_chunks
        gO = cute.zipped_divide(mO, (1, 4))  # ((1, 4), (M, words / 4))
        sOv = cute.zipped_divide(sO, (1, 4))
        copy16 = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Int32, num_bits_per_copy=128)
        rO = cute.make_rmem_tensor(cute.make_layout(4), Int32)
        for q in cutlass.range_constexpr((rows * chunks + 127) // 128):
            c = tid + 128 * q
            rl = wg * rows + c // chunks
            ch = c % chunks
            grow = tm * cfg.tile_m + rl
            gch = slab * chunks + ch
            end = m
            if cutlass.const_expr(128 * (q + 1) > rows * chunks):  # a partial last step: not past the warpgroup's rows
                end = cutlass.min(m, tm * cfg.tile_m + wg * rows + rows)
            if grow < end:
                if cutlass.const_expr(cfg.epilogue == "linear"):
                    if gch < n_chunks:
                        self._copy16(copy16, sOv[((0, None), (rl, ch))], gO[((0, None), (grow, gch))], rO, into_smem)
                else:
                    self._copy16(copy16, sOv[((0, None), (rl, ch))], gO[((0, None), (grow, gch))], rO, into_smem)

    @cute.jit
    def _copy16(self, copy16, s, g, r, into_smem: cutlass.Constexpr):
        if cutlass.const_expr(into_smem):
            cute.copy(copy16, g, r)
            cute.copy(copy16, r, s)
        else:
            cute.copy(copy16, s, r)
            cute.copy(copy16, r, g)
