"""The sm_90a GEMM behind gate_up and down: a persistent, warp-specialized, block-scaled fp8 (or
bf16) GEMM over tiles of 256 weight rows, with the epilogue chosen at compile time
(``TileConfig.epilogue``, STYLE §4):

    "swiglu"  gate_up:  h = act(x @ gate^T) · (x @ up^T)            (gate_up.py: GateUpConfig)
    "linear"  down:     y = h @ W_down^T (+ residual), bf16          (down.py: DownConfig)

Operands: A [M, K] (x, or h) and W [N, K] (the packed gate_up weight with N = 2I, or W_down with
N = H, any N that is a multiple of 8):

    mainloop fp8_block128   A e4m3 [M, K] + a_scale fp32 [M, ceil(K/128)]  (per row per 128 K;
                                row-major x_scale for gate_up, M-major h_scale for down)
                            W e4m3 [N, K] + w_scale fp32 [ceil(N/128), ceil(K/128)] (128×128 blocks)
    mainloop bf16           A bf16 [M, K], W bf16 [N, K]

CTA tile (tile_m × 256 weight rows × tile_k), one TMA producer warpgroup and tile_m/64 consumer
warpgroups (64 rows each); persistent: grid ≤ #SMs, CTA b takes whole tiles b, b + grid, …
(m fastest), the producer running ahead into the next tile during the epilogue. Where a few
whole tiles would leave HBM idle (decode with I = 3584: 28 tiles for 132 SMs) the tiles go
stream-K instead (plan()): their k iterations are dealt out evenly over more CTAs, a CTA finishing
part of a tile stores its fp32 accumulator to a workspace, and the last of the tile's CTAs to
arrive (an atomic counter per tile) sums the partials in CTA order and runs the epilogue (_fixup).
Cluster pairs (TileConfig.cluster_m = 2; gate_up's 128-row tile from M = 4096 on,
gate_up.cluster_m_for): CTAs 2c and 2c + 1 form a cluster and
take tiles of the same weight tile at adjacent M (grid_m padded to even, whole tiles only); each
loads its x tile and one half of the weight k tile, TMA-multicast into both CTAs' smem, and a stage
is free once the consumers of both CTAs have released it. Weight traffic from L2 halves.
K pairs (TileConfig.cluster_k = 2, swap-AB decode tiles, dispatched by gate_up.cluster_k_applies;
and the 64-row tile with 3 stages, measured no faster and not dispatched): the stream-K schedule
with every tile split in two halves, CTAs 2t and 2t + 1 a cluster, and the fix-up through DSMEM
instead of global memory: the second CTA st.async's its fp32 accumulator into the first's smem
(completing bytes on its mbarrier), the first adds it and runs the epilogue.
A tile's 256 weight rows are two 128-row halves, each with its own 128×128 weight scale per k
block:

    tile n:  W rows [256n, 256n+128)       → B half 0   (gate_up: gate rows [128n, 128n+128))
             W rows [256n+128, 256n+256)   → B half 1   (gate_up: up rows   [128n, 128n+128))

so for gate_up (interleave g = 128) the tile yields h columns [128n, 128n+128): exactly one fp8
scale group; for down it is output columns [256n, 256n+256). The granule tile (tile_n = 224, bf16
mainloop and bf16 h only, gate_up.granule_tile_n; also tile_n = 192: 96 columns) yields h columns
[112n, 112n+112) instead, which straddle the g = 128 chunks: its B stage is 7 granules, each 16 gate
rows then the 16 up rows of the same h columns, one 16-row TMA box each; one wgmma of N = 224
covers them, and the up partner of gate value v is value v + 8 (_epilogue_swiglu_granules).
Rows ≥ N of a partial last tile are TMA zero-fill; their weight-scale row is clamped to the last
one (ceil(N/128) - 1), so no scale is read out of bounds, and the linear epilogue masks columns ≥ N.

Mainloop (fp8_block128), per 128-wide k block kb and per B half:

    temp  = wgmma(A_kb, B_half_kb)                 (64×128 per warpgroup, fp32, fresh)
    acc[half] += temp · a_scale[row, kb] · w_scale[2n + half, kb]     (promotion, fp32 FMA)

acc holds both halves (128 fp32 registers per thread) and temp one half (64), so a 64×256
warpgroup tile fits the 232-register budget. With two consumer warpgroups (128-row tile) one
warpgroup's promotion runs under the other's wgmma; there the producer warp stages each k block's
scales in smem beside the stage (TileConfig.smem_scales, dispatched with fp8 h), so the consumers
issue no global loads. With one (64-row tile, TileConfig.overlap) the
k block is four 64-column quarter chains into two 32-register temps, and quarter c is promoted
while quarter c + 1 runs, across pairs of k blocks (measured 10–20 % faster where the tile is
tensor-bound). The bf16 mainloop accumulates straight into acc.

wgmma C fragment of one warpgroup for one 64×128 half (value v = 0..63 of thread t, lane = t%32,
warp = t/32):  ((2,2,16)):((1 col, 8 rows, 8 cols))

    row(v) = 16·warp + lane/4 + 8·((v/2)%2)
    col(v) =  8·(v/4) + 2·(lane%4) + v%2          (the same for half 0 and half 1)

so gate column c and up column c are the same register index of the two halves: act(gate)·up
is register-local, and a row's 128 h columns live in the 4 threads of a quad (32 each):
amax = in-thread max over 32 values + two butterfly shuffles (xor 1, xor 2).

Stores: each warpgroup writes a 64 × 128-column slab into smem in fragment order (rows padded by
16 bytes: the 8 rows × 4 lanes of one store hit distinct banks), then copies it out
row-contiguous, 16 bytes per thread per step (masked at M, and for "linear" at N). "swiglu" stages
one slab (h), "linear" two in turn (the two halves; the residual, when compiled in, is first
copied into the slab the same way in reverse, then added in fp32 in fragment order before the
single rounding to bf16, as reference.down does). TileConfig.tma_store (measured slower, off) has
gate_up's 64/128-row tiles stage h unpadded and 128-byte swizzled instead and store each 64-row
slab with one TMA store.
The configuration (TileConfig and the constants) is in tile_config.py, the tile schedule
(plan(), stream-K, band order, launch_plan) in schedule.py, the epilogues' stores in
gemm256_epilogue.py; this file holds the kernel (producer, consumers, stream-K fix-up) and its
compile and launch. Performance and accuracy measurements: benchmarks/NOTES.md.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Int64
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from . import epilogue
from .gemm256_epilogue import EpilogueMixin
from .ptx import f32_bits
from .schedule import band_rows, launch_plan, sk_cta_of, sk_iter_begin
from .tile_config import EVICT_FIRST, EVICT_LAST, G, GRANULE, N_ALIGN, TileConfig


class Gemm256Kernel(EpilogueMixin):
    def __init__(self, config: TileConfig):
        self.cfg = config
        self.ab_dtype = cutlass.Float8E4M3FN if config.fp8 else cutlass.BFloat16
        self.acc_dtype = Float32
        self.num_mma_wg = config.consumer_threads // 128
        self.threads = 128 * (1 + self.num_mma_wg)
        self.tile_mnk = (config.tile_m, config.tile_n, config.tile_k)
        self.overlap = (config.fp8 and config.overlap and not config.swap_ab and self.num_mma_wg == 1
                        and config.promote_k == G)
        # registers per consumer thread after setmaxnreg (the producer keeps 40): the 64K register
        # file holds 40·128 + 232·256 with two consumer warpgroups; with one, the kernel starts with
        # up to 255 (256 threads) and the consumer may keep them all (ptxas reports 237-249)
        self.consumer_regs = 232 if self.num_mma_wg == 2 else 256
        # warpgroups the tiled MMA spreads over M (split_n: each warpgroup runs its own 64-row MMA)
        self.mma_wgs_m = 1 if config.split_n else self.num_mma_wg
        if config.epilogue == "swiglu":
            self.act = epilogue.activation(config.act)
            self.h_fmt = config.h_fmt
            self.h_dtype = self.h_fmt.dtype
            self.h_box = (64, 128 // config.out_bytes)  # TMA store box of h (tma_store): 128 bytes a row

    # ------------------------------------------------------------------ host
    @cute.jit
    def __call__(
        self,
        a_ptr: cute.Pointer,  # x (gate_up) / h (down)
        w_ptr: cute.Pointer,
        as_ptr: cute.Pointer,  # a_scale
        ws_ptr: cute.Pointer,
        out_ptr: cute.Pointer,  # h (swiglu) / y (linear)
        aux_ptr: cute.Pointer,  # h_scale (swiglu) / residual (linear)
        part_ptr: cute.Pointer,  # fp32 stream-K partials [ctas · 2 slots, 128 values, consumer threads]
        ctr_ptr: cute.Pointer,  # int32 stream-K arrival counters [sk_tiles], zero on entry, zero on exit
        m: Int32,
        k_units: Int32,  # K / k_align
        n_units: Int32,  # N / 8 (weight rows)
        ctas: Int32,  # persistent grid size (plan(): at most the SM count)
        sk_tiles: Int32,  # the last sk_tiles tiles are shared out by K iterations (stream-K); needs
        # ctas ≤ sk_tiles · k_tiles (every CTA gets a k tile, so every contributor arrives)
        stream: cuda.CUstream,
    ):
        cfg = self.cfg
        k = cute.assume(k_units * cfg.k_align, divby=cfg.k_align)  # 16-byte rows
        n = cute.assume(n_units * N_ALIGN, divby=N_ALIGN)
        n_tiles = (n + cfg.tile_n - 1) // cfg.tile_n
        kb = (k + G - 1) // G
        mA = cute.make_tensor(a_ptr, cute.make_layout((m, k), stride=(k, 1)))
        mB = cute.make_tensor(w_ptr, cute.make_layout((n, k), stride=(k, 1)))
        # a_scale: gate_up's x_scale as quant_x writes it (row-major); down's h_scale as gate_up
        # writes it, M-major (strides (1, M), the layout cuBLAS's block-scaled GEMM reads)
        as_stride = (1, m) if cfg.epilogue == "linear" else (kb, 1)
        mAS = cute.make_tensor(as_ptr, cute.make_layout((m, kb), stride=as_stride))
        mWS = cute.make_tensor(ws_ptr, cute.make_layout(((n + G - 1) // G, kb), stride=(kb, 1)))
        # outputs as 32-bit words (4 e4m3 or 2 bf16 each), written 16 bytes at a time
        if cutlass.const_expr(cfg.epilogue == "swiglu"):
            out_words = cute.assume(n_tiles * (cfg.out_chunks * 4), divby=cfg.out_chunks * 4)
        else:
            out_words = cute.assume(n_units * (N_ALIGN // 2), divby=N_ALIGN // 2)
        mOut = cute.make_tensor(
            cute.recast_ptr(out_ptr, dtype=Int32), cute.make_layout((m, out_words), stride=(out_words, 1))
        )
        if cutlass.const_expr(cfg.epilogue == "swiglu"):
            mAux = cute.make_tensor(aux_ptr, cute.make_layout((m, n_tiles), stride=(1, m)))  # h_scale, M-major
        else:  # residual, bf16 pairs as words like y
            mAux = cute.make_tensor(
                cute.recast_ptr(aux_ptr, dtype=Int32), cute.make_layout((m, out_words), stride=(out_words, 1))
            )

        # the granule tile: one wgmma of N = tile_n per k step; B arrives in boxes of 16 weight rows
        tiled_mma = self._tiled_mma(cfg.tile_n) if cfg.granules else self._tiled_mma()
        a_layout = self._smem_layout(cfg.tile_m)
        b_layout = self._smem_layout(cfg.tile_n)
        b_box = cfg.b_box_rows
        tma_a, tma_tA = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp(), mA,
            cute.slice_(a_layout, (None, None, 0)), (cfg.tile_m, cfg.tile_k),
        )
        b_op = (cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp() if cfg.cluster_m > 1
                else cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp())
        tma_b, tma_tB = cute.nvgpu.cpasync.make_tiled_tma_atom(
            b_op, mB, cute.slice_(self._smem_layout(b_box), (None, None, 0)), (b_box, cfg.tile_k),
            num_multicast=cfg.cluster_m,
        )
        tma_o, mO_tma = tma_a, mA  # (placeholders: the kernel reads them only with h_tma_store)
        if cutlass.const_expr(cfg.h_tma_store):
            i_cols = cute.assume(n_tiles * G, divby=G)
            mH = cute.make_tensor(
                cute.recast_ptr(out_ptr, dtype=self.h_dtype), cute.make_layout((m, i_cols), stride=(i_cols, 1))
            )
            box = self._h_store_layout()
            tma_o, mO_tma = cute.nvgpu.cpasync.make_tiled_tma_atom(
                cute.nvgpu.cpasync.CopyBulkTensorTileS2GOp(), mH, cute.slice_(box, (None, None, 0)), self.h_box,
            )

        @cute.struct
        class SharedStorage:
            sA: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(a_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(b_layout)], 1024]
            sO: cute.struct.Align[cute.struct.MemRange[Int32, cfg.tile_m * cfg.out_row_words], 1024]
            mbar: cute.struct.MemRange[cutlass.Int64, cfg.stages * 2]
            flag: cute.struct.MemRange[Int32, 4]  # stream-K: the arrival count seen by this CTA
            red: cute.struct.MemRange[Float32, cfg.red_words]  # swap-AB: cross-warp amax
            xacc: cute.struct.Align[cute.struct.MemRange[Float32, cfg.xacc_words], 16]  # cluster_k: peer's acc
            xbar: cute.struct.MemRange[cutlass.Int64, 1]  # cluster_k: its arrival (st.async bytes)
            scl: cute.struct.Align[cute.struct.MemRange[Float32, cfg.scale_words], 16]  # smem_scales

        self.shared_storage = SharedStorage

        consumers = 128 * self.num_mma_wg
        mPart = cute.make_tensor(
            part_ptr, cute.make_layout((ctas * 2, G, consumers), stride=(G * consumers, consumers, 1))
        )
        mCtr = cute.make_tensor(ctr_ptr, cute.make_layout(sk_tiles + 1))
        cluster = {"cluster": [cfg.cluster_size, 1, 1]} if cfg.cluster_size > 1 else {}
        self.kernel(
            tma_a, tma_tA, tma_b, tma_tB, tma_o, mO_tma, mAS, mWS, mOut, mAux, mPart, mCtr, tiled_mma, a_layout,
            b_layout, m, n, n_tiles, sk_tiles,
        ).launch(grid=[ctas, 1, 1], block=[self.threads, 1, 1], stream=stream, use_pdl=cfg.pdl, **cluster)

    def _h_store_layout(self):
        """gate_up's h slab (h_tma_store) as TMA boxes of 64 rows × 128 bytes (fp8: 128 h columns,
        bf16: 64), 128-byte swizzled: (64, box columns, boxes), box 2w + j (bf16) or w (fp8) for
        warpgroup w; the same bytes as the unpadded slab rows, the swizzle aside."""
        cfg = self.cfg
        atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(utils.LayoutEnum.ROW_MAJOR, self.h_dtype, self.h_box[1]), self.h_dtype
        )
        return cute.tile_to_shape(atom, (*self.h_box, cfg.tile_m // 64 * cfg.out_bytes), order=(0, 1, 2))

    def _tiled_mma(self, tile_n: int = G):
        """64 rows of A × tile_n weight rows per warpgroup: one B half (128) per wgmma chain, or
        one quarter (64) for the overlapped promotion."""
        major = cute.nvgpu.warpgroup.OperandMajorMode.K
        return sm90_utils.make_trivial_tiled_mma(
            self.ab_dtype, self.ab_dtype, major, major, self.acc_dtype, (self.mma_wgs_m, 1, 1), tiler_mn=(64, tile_n)
        )

    def _scale_layout(self):
        """smem_scales: (stage, value), the tile's tile_m A-row scales, then its 2 weight-block scales."""
        cfg = self.cfg
        return cute.make_layout((cfg.stages, cfg.tile_m + 2), stride=(cfg.tile_m + 2, 1))

    def _smem_layout(self, rows: int):
        cfg = self.cfg
        atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(utils.LayoutEnum.ROW_MAJOR, self.ab_dtype, cfg.tile_k),
            self.ab_dtype,
        )
        return cute.tile_to_shape(atom, (rows, cfg.tile_k, cfg.stages), order=(0, 1, 2))

    # ------------------------------------------------------------------ device
    @cute.kernel
    def kernel(
        self,
        tma_a: cute.CopyAtom,
        mA: cute.Tensor,
        tma_b: cute.CopyAtom,
        mB: cute.Tensor,
        tma_o: cute.CopyAtom,  # h_tma_store: the TMA store of h, and h as its tensor
        mO_tma: cute.Tensor,
        mAS: cute.Tensor,
        mWS: cute.Tensor,
        mOut: cute.Tensor,
        mAux: cute.Tensor,
        mPart: cute.Tensor,
        mCtr: cute.Tensor,
        tiled_mma: cute.TiledMma,
        a_layout: cute.ComposedLayout,
        b_layout: cute.ComposedLayout,
        m: Int32,
        n: Int32,
        n_tiles: Int32,
        sk_tiles: Int32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = cute.arch.make_warp_uniform(tidx // 128)
        if cutlass.const_expr(self.cfg.pdl):  # (TileConfig.pdl) the next kernel may set up meanwhile
            cute.arch.griddepcontrol_launch_dependents()

        if warp_idx == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_a)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_b)

        storage, mainloop, sA, sB, tma_parts, sched = self._prologue(
            tma_a, mA, tma_b, mB, a_layout, b_layout, m, n_tiles, sk_tiles, bidx
        )
        if cutlass.const_expr(self.cfg.pdl):  # the previous kernel's outputs (x, scales) are complete
            cute.arch.griddepcontrol_wait()
        tAsA, tAgA, tBsB, tBgB, b_mask = tma_parts
        k_tiles, nctas, tiling, dp_tiles, sk_iters, it_begin, it_end, dp_iters, cursor_end = sched

        if wg_idx == 0:
            # ---------------- producer warpgroup: one warp issues the TMA loads
            cute.arch.setmaxregister_decrease(40)
            if warp_idx == 0:
                self._produce(mainloop, tma_a, tAgA, tAsA, tma_b, tBgB, tBsB, b_mask, cursor_end, bidx, nctas,
                              dp_iters, k_tiles, dp_tiles, it_begin, it_end, tiling, (mAS, mWS, m, n, storage))
        else:
            # ---------------- consumer warpgroups: wgmma, promotion, epilogue
            cute.arch.setmaxregister_increase(self.consumer_regs)
            self._consume(tiled_mma, mainloop, sA, sB, storage, mAS, mWS, (mOut, tma_o, mO_tma), mAux, mPart, mCtr,
                          m, n, tidx, wg_idx, bidx, k_tiles, nctas, tiling, dp_tiles, sk_iters, it_begin, it_end,
                          dp_iters, cursor_end)
        if cutlass.const_expr(self.cfg.cluster_k > 1):
            # no CTA leaves while its peer may still be sending to it (or its st.async are in flight)
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()

    @cute.jit
    def _consume(self, tiled_mma, mainloop, sA, sB, storage, mAS, mWS, outs, mAux, mPart, mCtr, m, n, tidx, wg_idx,
                 bidx, k_tiles, nctas, tiling, dp_tiles, sk_iters, it_begin, it_end, dp_iters, cursor_end):
        """The consumer warpgroups (tidx ≥ 128): wgmma, promotion, stream-K fix-up, epilogue, over this
        CTA's segments (the schedule values come from _prologue). outs = (the output as 32-bit
        words, the TMA store atom of h and h as its tensor). swap_ab.py overrides this."""
        cfg = self.cfg
        mOut, tma_o, mO_tma = outs
        ws_last = (n + G - 1) // G - 1  # last weight-scale row (a partial last tile reads no further)
        split = cfg.split_n
        t_mma = (tidx - 128) % 128 if split else tidx - 128  # (split_n: each warpgroup its own MMA)
        thr_mma = tiled_mma.get_slice(t_mma)
        tCsA = thr_mma.partition_A(sA)
        tCrA = tiled_mma.make_fragment_A(tCsA)  # (MMA, 1, MMA_K, STAGES)
        # (MMA, 2, MMA_K, STAGES): both halves (the granule tile: (MMA, 1, MMA_K, STAGES))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        # the two halves of B on their own, (MMA, 1, MMA_K, STAGES) each (the fp8 mainloop)
        tCrB_half = [
            tiled_mma.make_fragment_B(
                thr_mma.partition_B(cute.local_tile(sB, (G, cfg.tile_k, cfg.stages), (h, 0, 0)))
            )
            for h in range(2 if cfg.fp8 else 0)
        ]
        num_k_blocks = cute.size(tCrA, mode=[2])

        cC = cute.make_identity_tensor((cfg.tile_m, cfg.tile_n))
        tCcC = thr_mma.partition_C(cC)  # (MMA, 1, 2) coordinates of this thread's values
        acc = cute.make_rmem_tensor(tCcC.shape, self.acc_dtype)
        n_vals = cute.size(tCcC, mode=[0])  # 64 values per half (the granule tile: tile_n / 2 in all)
        # this thread's two rows in the tile (value v has row r0 + 8·((v/2)%2)) and first column
        crd0 = tCcC[(0, 0, 0)]
        r0 = crd0[0]
        col0 = crd0[1]
        temp = temp2 = None
        if cutlass.const_expr(cfg.fp8):
            temp = cute.make_rmem_tensor(
                thr_mma.partition_C(cute.make_identity_tensor((cfg.tile_m, G))).shape, self.acc_dtype
            )  # (MMA, 1, 1): one half
        if cutlass.const_expr(split):
            temp2 = cute.make_rmem_tensor(temp.shape, self.acc_dtype)
        mmas_per_promotion = cfg.promote_k // cute.size(tiled_mma.shape_mnk, mode=[2])
        # output staging slab in smem: (tile_m rows, out_row_words) 32-bit words; each warpgroup owns its 64 rows
        sO = storage.sO.get_tensor(cute.make_layout((cfg.tile_m, cfg.out_row_words), stride=(cfg.out_row_words, 1)))
        h_store = None
        if cutlass.const_expr(cfg.h_tma_store):
            # the same smem as TMA boxes: (64 rows, 128 bytes of h, box), box = warpgroup · boxes + j
            box = self._h_store_layout()
            sBox = storage.sO.get_tensor(box.outer, swizzle=box.inner, dtype=self.h_dtype)
            gBox = cute.local_tile(mO_tma, self.h_box, (None, None))
            tHs, tHg = cute.nvgpu.cpasync.tma_partition(
                tma_o, 0, cute.make_layout(1), cute.group_modes(sBox, 0, 2), cute.group_modes(gBox, 0, 2)
            )
            h_store = (tma_o, tHs, tHg)

        if cutlass.const_expr(self.overlap):
            # wgmma chains over 64-row quarters of B (quarter c: B rows [64c, 64c + 64), half c // 2)
            # into two 32-register temps, so that one is promoted while the other is computed
            mma_q = self._tiled_mma(G // 2)
            thr_q = mma_q.get_slice(t_mma)
            tCrA_q = mma_q.make_fragment_A(thr_q.partition_A(sA))
            tCrB_q = [
                mma_q.make_fragment_B(
                    thr_q.partition_B(cute.local_tile(sB, (G // 2, cfg.tile_k, cfg.stages), (c, 0, 0)))
                )
                for c in range(4)
            ]
            temp_q = thr_q.partition_C(cute.make_identity_tensor((64, G // 2))).shape
            tq = (cute.make_rmem_tensor(temp_q, self.acc_dtype), cute.make_rmem_tensor(temp_q, self.acc_dtype))
            quarters = (mma_q, tCrA_q, tCrB_q, tq, num_k_blocks)

        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, cfg.stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, cfg.stages)
        cursor = Int32(0)
        while cursor < cursor_end:
            tile, kb0, kb1 = self._segment(cursor, bidx, nctas, dp_iters, k_tiles, dp_tiles, it_begin, it_end)
            tm, tn = self._tile_mn(tile, tiling)
            cursor += kb1 - kb0
            row_a = tm * cfg.tile_m + r0
            row_b = row_a + 8
            acc.fill(0.0)
            if cutlass.const_expr(self.overlap):
                # Per k tile, quarters 0..3 alternate between the two temps: issue quarter c + 1,
                # wait for c only (wait_group(1)), promote c. The loop takes k tiles in pairs: the
                # second tile's quarter 0 is issued before the first tile's quarter 3 is promoted;
                # after the second, wait for its quarter 3, release, promote. (Overlapping every
                # boundary would leave a wgmma group in flight across the loop's back-edge, and
                # ptxas then serializes every wgmma: C7514.) An odd last k tile runs alone.
                # The scales of a pair are loaded one pair ahead: loaded at the top of the body, as
                # v5 did, the pair's first wgmma waited for them (the largest stall in Nsight
                # Compute's source view, benchmarks/NOTES.md). (Multiplying them only after that
                # wgmma is issued changes nothing: ptxas hoists the multiply above it.)
                arow_a = cutlass.min(row_a, m - 1)
                arow_b = cutlass.min(row_b, m - 1)
                wrow_0 = cutlass.min(2 * tn, ws_last)
                wrow_1 = cutlass.min(2 * tn + 1, ws_last)
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
            elif cutlass.const_expr(split):
                # warpgroup w: B half w (0: gate, 1: up) over all 64 rows, N = 128 chains (no smem
                # bandwidth spent re-reading A per quarter) into two temps, k tiles in runs of
                # split_unroll: each tile's chain runs while the one before is promoted (the run's
                # last promotion has the tensor pipe to itself). Scales a run ahead.
                w = wg_idx - 1
                tCrB_w = tiled_mma.make_fragment_B(
                    thr_mma.partition_B(cute.local_tile(sB, (G, cfg.tile_k, cfg.stages), (w, 0, 0)))
                )
                wrow = cutlass.min(2 * tn + w, ws_last)
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
            elif cutlass.const_expr(cfg.fp8):
                # rows past M read the last row's scale (their A rows are TMA zero-fill)
                arow_a = cutlass.min(row_a, m - 1)
                arow_b = cutlass.min(row_b, m - 1)
                # weight rows past N (partial last tile) read the last scale row (their B rows are zero-fill)
                wrow_0 = cutlass.min(2 * tn, ws_last)
                wrow_1 = cutlass.min(2 * tn + 1, ws_last)
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
                    for half in cutlass.range_constexpr(2):
                        ws = ws_0 if half == 0 else ws_1
                        sc_a = as_a * ws
                        sc_b = as_b * ws
                        for grp in cutlass.range_constexpr(num_k_blocks // mmas_per_promotion):
                            cute.nvgpu.warpgroup.fence()
                            tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
                            for j in cutlass.range_constexpr(mmas_per_promotion):
                                kk = grp * mmas_per_promotion + j
                                cute.gemm(
                                    tiled_mma, temp,
                                    tCrA[(None, None, kk, state.index)],
                                    tCrB_half[half][(None, None, kk, state.index)],
                                    temp,
                                )
                                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                            cute.nvgpu.warpgroup.commit_group()
                            cute.nvgpu.warpgroup.wait_group(0)
                            self._promote_half(acc, temp, half, sc_a, sc_b)
                    mainloop.consumer_release(state)
                    state.advance()
            else:
                # one wgmma group in flight: stage kt-1 is released once group kt is issued
                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                for kt in cutlass.range(kb0, kb1, unroll=1):
                    mainloop.consumer_wait(state)
                    cute.nvgpu.warpgroup.fence()
                    for kk in cutlass.range_constexpr(num_k_blocks):
                        cute.gemm(
                            tiled_mma, acc,
                            tCrA[(None, None, kk, state.index)],
                            tCrB[(None, None, kk, state.index)],
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
            epi = Int32(1)
            if cutlass.const_expr(not (cfg.granules or split)):  # (whole tiles only: schedule())
                epi = self._finish_tile(acc, n_vals, tm * cfg.tile_m + r0, m, tile, dp_tiles, k_tiles, bidx, nctas,
                                        sk_iters, mPart, mCtr, storage, tidx - 128)
            if epi != 0:
                if cutlass.const_expr(cfg.granules):
                    self._epilogue_swiglu_granules(acc, n_vals, r0, col0, tm, tn, m, sO, mOut, wg_idx - 1, tidx % 128)
                elif cutlass.const_expr(split):
                    # the up half's warpgroup hands its accumulator to the gate half's through smem
                    # (value v of thread t at word v · 128 + t: same fragment positions on both
                    # sides), which then runs the whole tile's epilogue. Barrier 4: the previous
                    # tile's values have been read; barrier 5: this tile's are written.
                    # (xacc_parts > 1: part by part through a smaller buffer, the two barriers per part)
                    t = tidx % 128
                    n_part = n_vals // cfg.xacc_parts
                    sX = storage.xacc.get_tensor(cute.make_layout((n_part, 128), stride=(128, 1)))
                    if wg_idx == 2:
                        for part in cutlass.range_constexpr(cfg.xacc_parts):
                            pipeline.NamedBarrier(barrier_id=4, num_threads=256).arrive_and_wait()
                            for v in cutlass.range_constexpr(n_part):
                                sX[v, t] = acc[(part * n_part + v, 0, 0)]
                            pipeline.NamedBarrier(barrier_id=5, num_threads=256).arrive_and_wait()
                    else:
                        for part in cutlass.range_constexpr(cfg.xacc_parts):
                            pipeline.NamedBarrier(barrier_id=4, num_threads=256).arrive_and_wait()
                            pipeline.NamedBarrier(barrier_id=5, num_threads=256).arrive_and_wait()
                            for v in cutlass.range_constexpr(n_part):
                                acc[(part * n_part + v, 0, 1)] = sX[v, t]
                        self._epilogue_swiglu(acc, n_vals, r0, col0, tm, tn, m, sO, mOut, mAux, 0, t, h_store)
                elif cutlass.const_expr(cfg.epilogue == "swiglu"):
                    self._epilogue_swiglu(acc, n_vals, r0, col0, tm, tn, m, sO, mOut, mAux, wg_idx - 1, tidx % 128,
                                          h_store)
                else:
                    self._epilogue_linear(acc, n_vals, r0, col0, tm, tn, m, n, sO, mOut, mAux, wg_idx - 1, tidx % 128)
        if cutlass.const_expr(cfg.h_tma_store):
            if tidx % 128 == 0:  # the last h stores have read this CTA's smem before it exits
                cute.arch.cp_async_bulk_wait_group(0, read=True)

    # trace-time helpers of the fp8 mainloops (plain Python, inlined where called)
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
        i.e. acc value v + 32·(c % 2) (the C fragment formula in the module docstring)."""
        half = c // 2
        n_q = cute.size(temp, mode=[0])
        for v in range(n_q):
            sc = sc_a if (v // 2) % 2 == 0 else sc_b
            acc[(v + n_q * (c % 2), 0, half)] = acc[(v + n_q * (c % 2), 0, half)] + temp[(v, 0, 0)] * sc

    def _prologue(self, tma_a, mA, tma_b, mB, a_layout, b_layout, m, n_tiles, sk_tiles, bidx):
        """The setup both kernels (this one and swap_ab's) share, plain Python inlined at trace time:
        shared storage, the TMA pipeline, the smem / gmem tile partitions and this CTA's schedule."""
        cfg = self.cfg
        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        stage_bytes = cute.size_in_bytes(self.ab_dtype, cute.slice_(a_layout, (None, None, 0))) + cute.size_in_bytes(
            self.ab_dtype, cute.slice_(b_layout, (None, None, 0))
        )
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
        # (a cluster-wide sync when the launch has clusters: the peer's barriers are initialized
        # before anyone signals them)
        pipeline_init_arrive(cluster_shape_mn=(cfg.cluster_size, 1), is_relaxed=True)

        sA = storage.sA.get_tensor(a_layout.outer, swizzle=a_layout.inner)
        sB = storage.sB.get_tensor(b_layout.outer, swizzle=b_layout.inner)

        # (bM, bK, RestM, RestK) and (bN, bK, RestN, RestK)
        gA = cute.local_tile(mA, (cfg.tile_m, cfg.tile_k), (None, None))
        gB = cute.local_tile(mB, (cfg.b_box_rows, cfg.tile_k), (None, None))
        k_tiles = cute.size(gA, mode=[3])
        tAsA, tAgA = cute.nvgpu.cpasync.tma_partition(
            tma_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2)
        )
        rank = 0
        b_mask = None
        if cl > 1:  # trace time: this CTA loads its part of each weight k tile for the whole cluster
            rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
            b_mask = cute.make_layout_image_mask(cute.make_layout((cl, 1, 1)), (rank, 0, 0), mode=0)
        if cfg.granules:  # trace time: smem rows [16r, 16r + 16) of each stage, one box each (_produce)
            tBsB = []
            for r in range(cfg.tile_n // GRANULE):
                sBr = cute.local_tile(sB, (GRANULE, cfg.tile_k, cfg.stages), (r, 0, 0))
                tBsBr, tBgB = cute.nvgpu.cpasync.tma_partition(
                    tma_b, 0, cute.make_layout(1), cute.group_modes(sBr, 0, 2), cute.group_modes(gB, 0, 2)
                )
                tBsB.append(tBsBr)
            tBsB = tuple(tBsB)
        else:
            tBsB, tBgB = cute.nvgpu.cpasync.tma_partition(
                tma_b, rank, cute.make_layout(cl), cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2)
            )

        pipeline_init_wait(cluster_shape_mn=(cfg.cluster_size, 1))

        # persistent schedule (see plan()): CTA b first takes whole tiles b, b + grid, ... < dp_tiles
        # (m varies fastest within bands of M tiles, _tile_mn: the CTAs running together share a
        # few weight tiles, read once from HBM, and a band of A that stays in L2), then its equal
        # share of the K iterations of the last sk_tiles tiles.
        # Both warpgroup roles walk the same segments (tile, k tiles [kb0, kb1)) with a cursor over
        # this CTA's k iterations (not named v: the value loops below rebind v at trace time).
        nctas, _, _ = cute.arch.grid_dim()
        # a cluster's CTAs take tiles b, b + 1 (b even): same weight tile when grid_m is even
        grid_m = (m + cfg.tile_m * cl - 1) // (cfg.tile_m * cl) * cl
        tiling = (grid_m, n_tiles, band_rows(grid_m, cfg.tile_m * cfg.elem_bytes * mA.shape[1], cl))
        dp_tiles = grid_m * n_tiles - sk_tiles
        sk_iters = sk_tiles * k_tiles
        it_begin = sk_iter_begin(bidx, nctas, sk_iters)
        it_end = sk_iter_begin(bidx + 1, nctas, sk_iters)
        dp_iters = (dp_tiles - bidx + nctas - 1) // nctas * k_tiles
        cursor_end = dp_iters + it_end - it_begin
        sched = (k_tiles, nctas, tiling, dp_tiles, sk_iters, it_begin, it_end, dp_iters, cursor_end)
        return storage, mainloop, sA, sB, (tAsA, tAgA, tBsB, tBgB, b_mask), sched

    @cute.jit
    def _init_xbar(self, storage):
        """cluster_k: the barrier the peer's st.async bytes complete on (one arrival: expect_tx)."""
        if cute.arch.thread_idx()[0] == 0:
            cute.arch.mbarrier_init(storage.xbar.data_ptr(), 1)
        cute.arch.mbarrier_init_fence()

    def _l2_hints(self):
        """cute.copy keyword arguments (cache_policy) for the A and B loads, per TileConfig.l2_hint;
        the weights are B, or A in the swap-AB tiles."""
        hint = self.cfg.l2_hint
        weight = {"cache_policy": Int64(EVICT_FIRST)} if hint else {}
        act = {"cache_policy": Int64(EVICT_LAST)} if hint == "w_first_x_last" else {}
        return (weight, act) if self.cfg.swap_ab else (act, weight)

    @cute.jit
    def _produce(self, mainloop, tma_a, tAgA, tAsA, tma_b, tBgB, tBsB, b_mask, cursor_end, bidx, nctas, dp_iters,
                 k_tiles, dp_tiles, it_begin, it_end, tiling, scales):
        """The producer warp: TMA loads of A and W k tiles for this CTA's segments, in order."""
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.cfg.stages)
        cursor = Int32(0)
        mAS, mWS, m, n, storage = scales  # (for smem_scales)
        lane = cute.arch.lane_idx()
        ws_last = (n + G - 1) // G - 1
        sScl = None
        if cutlass.const_expr(self.cfg.smem_scales):
            sScl = storage.scl.get_tensor(self._scale_layout())
        hint_a, hint_b = self._l2_hints()
        while cursor < cursor_end:
            tile, kb0, kb1 = self._segment(cursor, bidx, nctas, dp_iters, k_tiles, dp_tiles, it_begin, it_end)
            tm, tn = self._tile_mn(tile, tiling)
            cursor += kb1 - kb0
            for kt in cutlass.range(kb0, kb1, unroll=1):
                staged = None
                if cutlass.const_expr(self.cfg.smem_scales):  # loaded before the empty-slot wait, which hides them
                    staged = self._load_tile_scales(mAS, mWS, m, ws_last, tm, tn, kt, lane)
                mainloop.producer_acquire(state)
                bar = mainloop.producer_get_barrier(state)
                cute.copy(tma_a, tAgA[(None, tm, kt)], tAsA[(None, state.index)], tma_bar_ptr=bar, **hint_a)
                if cutlass.const_expr(self.cfg.granules):
                    # h-tile tn is granules u = per_tile·tn + j; with c = G / 16 = 8 granules a
                    # g = 128 chunk, granule u's gate rows are 16-row box p = 2c·(u // c) + u % c of
                    # the packed weight, its up rows box p + c
                    per_tile = self.cfg.tile_n // (2 * GRANULE)
                    c = G // GRANULE
                    for j in cutlass.range_constexpr(per_tile):
                        u = tn * per_tile + j
                        p = u + u // c * c
                        cute.copy(tma_b, tBgB[(None, p, kt)], tBsB[2 * j][(None, state.index)], tma_bar_ptr=bar)
                        cute.copy(tma_b, tBgB[(None, p + c, kt)], tBsB[2 * j + 1][(None, state.index)],
                                  tma_bar_ptr=bar)
                elif cutlass.const_expr(self.cfg.cluster_m > 1):
                    cute.copy(tma_b, tBgB[(None, tn, kt)], tBsB[(None, state.index)], tma_bar_ptr=bar,
                              mcast_mask=b_mask, **hint_b)
                else:
                    cute.copy(tma_b, tBgB[(None, tn, kt)], tBsB[(None, state.index)], tma_bar_ptr=bar, **hint_b)
                if cutlass.const_expr(self.cfg.smem_scales):
                    self._store_tile_scales(sScl, state.index, staged, lane, bar)
                mainloop.producer_commit(state)
                state.advance()
        mainloop.producer_tail(state)

    def _load_tile_scales(self, mAS, mWS, m, ws_last, tm, tn, kt, lane):
        """smem_scales, producer lanes (plain Python, inlined): k block kt's scales of the tile's A
        rows lane + 32i (rows ≥ M read the last row's, as the consumers did) and, in lanes 0 and 1,
        of weight block 2·tn + lane (clamped to the last block row)."""
        xs = [mAS[cutlass.min(tm * self.cfg.tile_m + lane + 32 * i, m - 1), kt] for i in range(self.cfg.tile_m // 32)]
        return xs, mWS[cutlass.min(2 * tn + lane % 2, ws_last), kt]

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

    # ------------------------------------------------------------------ stream-K
    @cute.jit
    def _segment(self, cursor, bidx, nctas, dp_iters, k_tiles, dp_tiles, it_begin, it_end):
        """The work at this CTA's cursor: (tile, kb0, kb1), k tiles [kb0, kb1) of one tile."""
        tile = bidx + cursor // k_tiles * nctas
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
    def _finish_tile(self, acc, n_vals: cutlass.Constexpr, row_a, m, tile, dp_tiles, k_tiles, bidx, nctas, sk_iters,
                     mPart, mCtr, storage, t):
        """1 if this CTA runs the tile's epilogue: a whole tile, or a stream-K tile shared with
        other CTAs that this one is the last to finish (_fixup has then summed the partials)."""
        epi = Int32(1)
        if tile >= dp_tiles:
            s = tile - dp_tiles
            c_first = sk_cta_of(s * k_tiles, nctas, sk_iters)
            c_last = sk_cta_of(s * k_tiles + k_tiles - 1, nctas, sk_iters)
            if c_first != c_last:
                epi = self._fixup(acc, n_vals, row_a, m, s, c_first, c_last, bidx, nctas, sk_iters, k_tiles,
                                  mPart, mCtr, storage, t)
        return epi

    @cute.jit
    def _fixup(self, acc, n_vals: cutlass.Constexpr, row_a, m, s, c_first, c_last, bidx, nctas, sk_iters,
               k_tiles, mPart, mCtr, storage, t):
        """Stream-K tile s is shared by CTAs c_first..c_last. Store this CTA's fp32 partial (rows
        < M only), count arrivals on mCtr[s]; the last to arrive sums every partial in CTA order
        (deterministic whatever the arrival order) into acc, re-zeroes the counter for the next
        launch and returns 1 (run the epilogue); the others return 0."""
        if cutlass.const_expr(self.cfg.cluster_k > 1):
            return self._cluster_fixup(acc, bidx, storage, t)
        sFlag = storage.flag.get_tensor(cute.make_layout(4))
        bar = pipeline.NamedBarrier(barrier_id=3, num_threads=128 * self.num_mma_wg)
        row_b = row_a + 8
        slot = self._sk_slot(bidx, s, nctas, sk_iters, k_tiles)
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
            for c in cutlass.range(c_first, c_last + 1, unroll=1):
                slot_c = self._sk_slot(c, s, nctas, sk_iters, k_tiles)
                self._partial(acc, n_vals, row_a < m, row_b < m, mPart, c * 2 + slot_c, t, True)
            if t == 0:
                mCtr[s] = Int32(0)
        return last

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

    @cute.jit
    def _sk_slot(self, c, s, nctas, sk_iters, k_tiles):
        """CTA c keeps its partial of stream-K tile s in slot 0 if s is its first tile, else 1
        (a CTA shares at most its first and its last tile with others)."""
        slot = Int32(1)
        if sk_iter_begin(c, nctas, sk_iters) // k_tiles == s:
            slot = Int32(0)
        return slot

    @cute.jit
    def _partial(self, acc, n_vals: cutlass.Constexpr, ok_a, ok_b, mPart, idx, t, add: cutlass.Constexpr):
        """acc → mPart[idx] (or acc += mPart[idx]) for this thread's rows < M; [idx, value, thread]
        so that a warp's 32 threads touch 128 contiguous bytes per value."""
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

# ---------------------------------------------------------------- host: compile and launch
def kernel_class(config: TileConfig):
    """Gemm256Kernel, or its swap-AB subclass (swap_ab.py, which imports this module) for config.swap_ab."""
    if config.swap_ab:
        from .swap_ab import SwapABKernel

        return SwapABKernel
    return Gemm256Kernel


def compile_kernel(config: TileConfig, out_dtype, aux_dtype, aux_align: int):
    """Compile for sm_90a (no GPU needed: fake pointers, runtime Int32 sizes). ``out`` / ``aux`` are
    the epilogue's pointers: h and h_scale for gate_up, y and the residual for down."""
    from .compile_cache import COMPILE_OPTIONS, fake_ptr, null_stream

    ab = cutlass.Float8E4M3FN if config.fp8 else cutlass.BFloat16
    return cute.compile(
        kernel_class(config)(config),
        fake_ptr(ab, 16), fake_ptr(ab, 16),
        fake_ptr(Float32, 4), fake_ptr(Float32, 4),
        fake_ptr(out_dtype, 16), fake_ptr(aux_dtype, aux_align),
        fake_ptr(Float32, 4), fake_ptr(Int32, 4),
        Int32(1), Int32(1), Int32(1), Int32(1), Int32(0),
        null_stream(),
        options=COMPILE_OPTIONS,
    )


def launch(fn, config: TileConfig, a, w, a_scale, w_scale, out, out_dtype, aux, aux_dtype, aux_align: int) -> None:
    """Run the compiled ``fn`` (compile_kernel's arguments) for A [M, K] and W [N, K] into ``out``
    on the current stream, with launch_plan's schedule. Absent operands (None: the bf16 mainloop's
    scales, a bf16 h's scales, no residual, no stream-K workspace) get ``out``'s pointer, a valid
    allocation the kernel never reads through them."""
    import torch

    from . import compile_cache

    m, k = a.shape
    n = w.shape[0]
    ab = cutlass.Float8E4M3FN if config.fp8 else cutlass.BFloat16
    stream = cuda.CUstream(torch.cuda.current_stream(a.device).cuda_stream)
    ctas, sk_tiles, parts, ctr = launch_plan(config, m, n, k, a.device)

    def ptr(dtype, t, align):
        return compile_cache.ptr(dtype, out if t is None else t, align)

    fn(
        ptr(ab, a, 16), ptr(ab, w, 16),
        ptr(Float32, a_scale, 4), ptr(Float32, w_scale, 4),
        ptr(out_dtype, out, 16), ptr(aux_dtype, aux, aux_align),
        ptr(Float32, parts, 4), ptr(Int32, ctr, 4),
        Int32(m), Int32(k // config.k_align), Int32(n // N_ALIGN), Int32(ctas), Int32(sk_tiles),
        stream,
    )
