"""The sm_90a GEMM behind gate_up and down: a persistent, warp-specialized, block-scaled fp8 (or
bf16) GEMM over tiles of 256 weight rows, with the epilogue chosen at compile time
(``TileConfig.epilogue``, STYLE §4):

    "gated"   gate_up:  h = act(x @ gate^T) · (x @ up^T)            (gate_up.py: GateUpConfig)
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
dispatch.cluster_m_for): CTAs 2c and 2c + 1 form a cluster and
take tiles of the same weight tile at adjacent M (grid_m padded to even, whole tiles only); each
loads its x tile and one half of the weight k tile, TMA-multicast into both CTAs' smem, and a stage
is free once the consumers of both CTAs have released it. Weight traffic from L2 halves.
K pairs (TileConfig.cluster_k = 2, swap-AB decode tiles, dispatched by dispatch.gate_up_cluster_k;
the 64-row tile with 3 stages is not dispatched, DISPATCH D23): the stream-K schedule with every
tile split in two halves, CTAs 2t and 2t + 1 a cluster, and the fix-up through DSMEM instead of
global memory: the second CTA st.async's its fp32 accumulator into the first's smem (completing
bytes on its mbarrier), the first adds it and runs the epilogue. cluster_k = 4 (swap-AB tiles; fp8
down's, dispatch.down_cluster_k, D37): four K parts, CTAs 1-3 each into a slot of CTA 0's smem,
added in rank order.
A tile's 256 weight rows are two 128-row halves, each with its own 128×128 weight scale per k
block:

    tile n:  W rows [256n, 256n+128)       → B half 0   (gate_up: gate rows [128n, 128n+128))
             W rows [256n+128, 256n+256)   → B half 1   (gate_up: up rows   [128n, 128n+128))

so for gate_up (interleave g = 128) the tile yields h columns [128n, 128n+128): exactly one fp8
scale group; for down it is output columns [256n, 256n+256). The granule tile (tile_n = 224, bf16
mainloop and bf16 h only, dispatch.granule_tile_n; also tile_n = 192: 96 columns) yields h columns
[112n, 112n+112) instead, which straddle the g = 128 chunks: its B stage is 7 granules, each 16 gate
rows then the 16 up rows of the same h columns, one 16-row TMA box each; one wgmma of N = 224
covers them, and the up partner of gate value v is value v + 8 (_epilogue_gated_granules).
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
row-contiguous, 16 bytes per thread per step (masked at M, and for "linear" at N). "gated" stages
one slab (h), "linear" two in turn (the two halves; the residual, when compiled in, is first
copied into the slab the same way in reverse, then added in fp32 in fragment order before the
single rounding to bf16, as reference.down does). TileConfig.tma_store (measured slower, off) has
gate_up's 64/128-row tiles stage h unpadded and 128-byte swizzled instead and store each 64-row
slab with one TMA store.
Where the pieces are: the configuration (TileConfig and the constants) in tile_config.py; the
tile schedule's plan (plan(), stream-K, band order, launch_plan) in schedule.py and its device side
(segments, the stream-K and K-pair fix-ups) in stream_k.py; the mainloops in mainloop.py; the
epilogues' stores in epilogue_stores.py; the swap-AB decode tiles (a subclass) in swap_ab.py; Flux.2's split projection (a subclass: prefix
tiles stored as they are, pair tiles gated) in split.py;
the choice of kernel class and compile_kernel in kernel_host.py; the setup both warpgroup roles share
(shared storage, the TMA pipeline and partitions), the CTA's schedule and the producer's loads in
producer.py. This file holds the kernel (host tensors and TMA atoms, the entry, the consumers' walk
over their tiles and their epilogues) and launch. Measurements: benchmarks/STATUS.md, benchmarks/history/, docs/DISPATCH.md.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32

from . import activations_and_h
from .epilogue_stores import EpilogueMixin
from .mainloop import MainloopMixin, RowOperands, TileWork
from .nvfp4 import Nvfp4Mixin
from .producer import Gmem, ProducerMixin
from .schedule import launch_plan
from .stream_k import Schedule, StreamKMixin
from .tile_config import HALF_N, N_ALIGN, NVFP4_GROUP, W_BLOCK, TileConfig


class GemmKernel(ProducerMixin, MainloopMixin, Nvfp4Mixin, StreamKMixin, EpilogueMixin):
    def __init__(self, config: TileConfig):
        self.cfg = config
        # the wgmma's operand type; the weight as TMA loads it (nvfp4: packed bytes, decoded to bf16)
        self.ab_dtype = cutlass.Float8E4M3FN if config.fp8 else cutlass.BFloat16
        self.w_dtype = cutlass.Uint8 if config.nvfp4 else self.ab_dtype
        self.acc_dtype = Float32
        self.num_mma_wg = config.consumer_threads // 128
        self.threads = 128 * (1 + self.num_mma_wg)
        self.tile_mnk = (config.tile_m, config.tile_n, config.tile_k)
        self.overlap = (config.fp8 and config.overlap and not config.swap_ab and self.num_mma_wg == 1
                        and config.promote_k == W_BLOCK)
        # registers per consumer thread after setmaxnreg (the producer keeps 40): the 64K register
        # file holds 40·128 + 232·256 with two consumer warpgroups; with one, the kernel starts with
        # up to 255 (256 threads) and the consumer may keep them all (ptxas reports 237-249)
        # (three: 24·128 + 160·384 of the 64K, for the 192-row tile's 128 accumulators and its epilogue)
        self.consumer_regs = {1: 256, 2: 232, 3: 160}[self.num_mma_wg]
        self.producer_regs = 24 if self.num_mma_wg == 3 else 40
        # warpgroups the tiled MMA spreads over M (split_n: each warpgroup runs its own 64-row MMA)
        self.mma_wgs_m = 1 if config.split_n else self.num_mma_wg
        if config.epilogue == "gated":
            self.act = activations_and_h.activation(config.act)
            self.h_spec = config.h_spec
            self.h_dtype = self.h_spec.dtype
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
        kb = (k + W_BLOCK - 1) // W_BLOCK
        mA = cute.make_tensor(a_ptr, cute.make_layout((m, k), stride=(k, 1)))
        if cutlass.const_expr(cfg.nvfp4):
            # the packed weight [N, K/2] (bytes), its e4m3 scales [N, K/16] as 32-bit words (a k
            # tile's four of a row: one word) and, in a_scale's place, the global scale
            # multipliers [2] (gate, up; down: one value twice; split.py: [3], prefix, gate, up)
            mAS = cute.make_tensor(as_ptr, cute.make_layout(cfg.global_scales))
            kw = k // (NVFP4_GROUP * 4)
            mB = self._weight_tensor(w_ptr, n, n_tiles, k // 2, kw)
            if cutlass.const_expr(cfg.tile_major):  # [N/256][K/64][256 rows][1 word]
                rows, row_strides = self._tile_major_rows(n_tiles, 1, kw)
                mWS = cute.make_tensor(cute.recast_ptr(ws_ptr, dtype=Int32), cute.make_layout(
                    (rows, kw), stride=(row_strides, 2 * HALF_N)))
            else:
                mWS = cute.make_tensor(cute.recast_ptr(ws_ptr, dtype=Int32),
                                       cute.make_layout((n, kw), stride=(kw, 1)))
        else:
            mB = self._weight_tensor(w_ptr, n, n_tiles, k, kb)
            # a_scale: gate_up's x_scale as quant_x writes it (row-major); down's h_scale as gate_up
            # writes it, M-major (strides (1, M), the layout cuBLAS's block-scaled GEMM reads)
            if cutlass.const_expr(cfg.dequantized):  # the global scale multipliers, as for nvfp4
                mAS = cute.make_tensor(as_ptr, cute.make_layout(cfg.global_scales))
            else:
                as_stride = (1, m) if cfg.epilogue == "linear" else (kb, 1)
                mAS = cute.make_tensor(as_ptr, cute.make_layout((m, kb), stride=as_stride))
            mWS = cute.make_tensor(ws_ptr, cute.make_layout(((n + W_BLOCK - 1) // W_BLOCK, kb), stride=(kb, 1)))
        mOut, mAux = self._out_tensors(out_ptr, aux_ptr, m, n_units, n_tiles)

        # the granule tile: one wgmma of N = tile_n per k step; B arrives in boxes of 16 weight rows
        tiled_mma = self._tiled_mma(cfg.tile_n) if cfg.granules else self._tiled_mma()
        a_layout = self._smem_layout(cfg.tile_m)
        b_layout = self._w_smem_layout(cfg.tile_n)
        b_box = cfg.b_box_rows
        tma_a, tma_tA = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp(), mA,
            cute.slice_(a_layout, (None, None, 0)), (cfg.tile_m, cfg.tile_k),
        )
        b_op = (cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp() if cfg.cluster_m > 1
                else cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp())
        tma_b, tma_tB = cute.nvgpu.cpasync.make_tiled_tma_atom(
            b_op, mB, cute.slice_(self._w_smem_layout(b_box), (None, None, 0)), (b_box, self._w_tile_cols()),
            num_multicast=cfg.cluster_m,
        )
        tma_o, mO_tma = tma_a, mA  # (placeholders: the kernel reads them only with h_tma_store)
        if cutlass.const_expr(self._prefetches_weights()):  # (no h TMA store with nvfp4)
            mO_tma = mB  # the raw weight, whose k tiles _prefetch_weights_early names by address
        if cutlass.const_expr(cfg.h_tma_store):
            i_cols = cute.assume(n_tiles * HALF_N, divby=HALF_N)
            mH = cute.make_tensor(
                cute.recast_ptr(out_ptr, dtype=self.h_dtype), cute.make_layout((m, i_cols), stride=(i_cols, 1))
            )
            box = self._h_store_layout()
            tma_o, mO_tma = cute.nvgpu.cpasync.make_tiled_tma_atom(
                cute.nvgpu.cpasync.CopyBulkTensorTileS2GOp(), mH, cute.slice_(box, (None, None, 0)), self.h_box,
            )

        self.shared_storage = self._shared_storage(a_layout, b_layout)

        consumers, values = 128 * self.num_mma_wg, cfg.acc_values
        mPart = cute.make_tensor(
            part_ptr, cute.make_layout((ctas * 2, values, consumers), stride=(values * consumers, consumers, 1))
        )
        mCtr = cute.make_tensor(ctr_ptr, cute.make_layout((2 * ctas if cfg.fixup_groups else sk_tiles) + 1))  # (counter_words)
        extra = {"cluster": [cfg.cluster_size, 1, 1]} if cfg.cluster_size > 1 else {}
        if cutlass.const_expr(cfg.ctas_per_sm > 0):
            extra["min_blocks_per_mp"] = cfg.ctas_per_sm
        self.kernel(
            tma_a, tma_tA, tma_b, tma_tB, tma_o, mO_tma, mAS, mWS, mOut, mAux, mPart, mCtr, tiled_mma, a_layout,
            b_layout, m, n, n_tiles, sk_tiles,
        ).launch(grid=[ctas, 1, 1], block=[self.threads, 1, 1], stream=stream, use_pdl=cfg.pdl, **extra)

    def _out_tensors(self, out_ptr, aux_ptr, m, n_units, n_tiles):
        """The epilogue's global tensors (plain Python, inlined into __call__): the output as 32-bit
        words (4 e4m3 or 2 bf16 each, written 16 bytes at a time) and its companion: h_scale
        (M-major) for "gated", the residual for "linear". (split.py: y and h.)"""
        cfg = self.cfg
        if cutlass.const_expr(cfg.epilogue == "gated"):
            out_words = cute.assume(n_tiles * (cfg.out_chunks * 4), divby=cfg.out_chunks * 4)
        else:
            out_words = cute.assume(n_units * (N_ALIGN // 2), divby=N_ALIGN // 2)
        mOut = cute.make_tensor(
            cute.recast_ptr(out_ptr, dtype=Int32), cute.make_layout((m, out_words), stride=(out_words, 1))
        )
        if cutlass.const_expr(cfg.epilogue == "gated"):
            mAux = cute.make_tensor(aux_ptr, cute.make_layout((m, n_tiles), stride=(1, m)))  # h_scale, M-major
        else:  # residual, bf16 pairs as words like y
            mAux = cute.make_tensor(
                cute.recast_ptr(aux_ptr, dtype=Int32), cute.make_layout((m, out_words), stride=(out_words, 1))
            )
        return mOut, mAux

    def _shared_storage(self, a_layout, b_layout, out_row_words: int | None = None):
        """The kernel's shared storage, a cute.struct. Built from a dict (this module's annotations
        are strings) so that nvfp4's decode buffers are declared for it alone: the other mainloops'
        storage stays as it was, to the byte. ``out_row_words``: the staging slab's row, where it is
        not this config's (decode_mlp.py: the wider of two epilogues')."""
        cfg = self.cfg
        Align, MemRange = cute.struct.Align, cute.struct.MemRange
        fields = {
            "sA": Align[MemRange[self.ab_dtype, cute.cosize(a_layout)], 1024],
            "sB": Align[MemRange[self.w_dtype, cute.cosize(b_layout)], 1024],
            "sO": Align[MemRange[Int32, cfg.tile_m * (out_row_words or cfg.out_row_words)], 1024],
            "mbar": MemRange[cutlass.Int64, cfg.stages * 2],
            "flag": MemRange[Int32, 4],  # stream-K: the arrival count seen by this CTA
            "red": MemRange[Float32, cfg.red_words],  # swap-AB: cross-warp amax
            "xacc": Align[MemRange[Float32, cfg.xacc_words], 16],  # cluster_k: peer's acc
            "xbar": MemRange[cutlass.Int64, 1],  # cluster_k: its arrival (st.async bytes)
            "scl": Align[MemRange[Float32, cfg.scale_words], 16],  # smem_scales
        }
        if cfg.decode_elems:  # the bf16 k tiles the weight is decoded into (nvfp4.py; not rs_decode)
            fields["sD"] = Align[MemRange[cutlass.BFloat16, cfg.decode_elems], 1024]
        if cfg.x_permute:  # a stage's x is in rs_k_order (nvfp4.py's _permute_stages arrives)
            fields["xready"] = MemRange[cutlass.Int64, cfg.stages]
        return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))

    def _h_store_layout(self):
        """gate_up's h slab (h_tma_store) as TMA boxes of 64 rows × 128 bytes (fp8: 128 h columns,
        bf16: 64), 128-byte swizzled: (64, box columns, boxes), box 2w + j (bf16) or w (fp8) for
        warpgroup w; the same bytes as the unpadded slab rows, the swizzle aside."""
        cfg = self.cfg
        atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(utils.LayoutEnum.ROW_MAJOR, self.h_dtype, self.h_box[1]), self.h_dtype
        )
        return cute.tile_to_shape(atom, (*self.h_box, cfg.tile_m // 64 * cfg.out_bytes), order=(0, 1, 2))

    def _tiled_mma(self, tile_n: int = HALF_N):
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

    def _smem_layout(self, rows: int, stages: int | None = None):
        """A wgmma operand's k tiles in smem: (rows, tile_k, stages), 128-byte swizzled."""
        cfg = self.cfg
        atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(utils.LayoutEnum.ROW_MAJOR, self.ab_dtype, cfg.tile_k),
            self.ab_dtype,
        )
        return cute.tile_to_shape(atom, (rows, cfg.tile_k, stages or cfg.stages), order=(0, 1, 2))

    def _weight_tensor(self, w_ptr, n, n_tiles, row_bytes, k_tiles):
        """The weight as the TMA reads it: row-major [N, row_bytes], or (TileConfig.tile_major) each
        k tile contiguous, [N/256][k tiles][256 rows][_w_tile_cols bytes] (nvfp4: 32 bytes of codes;
        fp8: 128 bytes), indexed by the same (row, byte) coordinates (_tile_major_rows)."""
        if cutlass.const_expr(self.cfg.tile_major):
            cols = self._w_tile_cols()
            rows, row_strides = self._tile_major_rows(n_tiles, cols, k_tiles)
            return cute.make_tensor(w_ptr, cute.make_layout(
                (rows, (cols, k_tiles)), stride=(row_strides, (1, 2 * HALF_N * cols))))
        return cute.make_tensor(w_ptr, cute.make_layout((n, row_bytes), stride=(row_bytes, 1)))

    def _tile_major_rows(self, n_tiles, row_stride, k_tiles):
        """(shape, stride) of a tile-major tensor's rows mode (the weight's, row_stride = its k tile's
        bytes a row; the scales', 1 word): tile tn's tile_n rows, in 256-row tiles (nvfp4_layout.ROWS,
        fp8_layout.ROWS) of k_tiles k tiles each; nvfp4_half_rows: tile tn the half tn % 2 of 256-row
        tile tn // 2; half_row_pairs: 64-row quarters, (0, q) the q-th of the weight (_w_quarters))."""
        rows, tile_stride = self.cfg.tile_n, k_tiles * 2 * HALF_N * row_stride
        if cutlass.const_expr(self.cfg.half_row_pairs):  # (one mode of 4·tiles: a TMA tensor has at most 5)
            quarter = rows // 2
            return (quarter, (4, n_tiles // 2)), (row_stride, (quarter * row_stride, tile_stride))
        if cutlass.const_expr(self.cfg.nvfp4_half_rows):
            return (rows, (2, n_tiles // 2)), (row_stride, (rows * row_stride, tile_stride))
        return (rows, n_tiles), (row_stride, tile_stride)

    def _w_tile_cols(self) -> int:
        """Columns of a weight k tile as TMA loads it (nvfp4: bytes, two codes each)."""
        return self.cfg.tile_k // 2 if self.cfg.nvfp4 else self.cfg.tile_k

    def _w_smem_layout(self, rows: int):
        """The weight stages: as the wgmma reads them, or (nvfp4) packed bytes, row-major and
        unswizzled (the decode's 8-byte reads of a warp cover 256 contiguous bytes); an identity
        swizzle keeps the type the kernel's signature names."""
        cfg = self.cfg
        if not cfg.nvfp4:
            return self._smem_layout(rows)
        cols = self._w_tile_cols()
        return cute.make_composed_layout(cute.make_swizzle(0, 4, 3), 0, cute.make_layout(
            (rows, cols, cfg.stages), stride=(cols, 1, rows * cols)))

    def _decode_layout(self):
        """nvfp4: the bf16 decode buffers, as the wgmma reads them (the bf16 mainloop's stages)."""
        return self._smem_layout(self.cfg.tile_n, self.cfg.decode_buffers)

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
        if warp_idx == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_a)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_b)

        storage, mainloop, sA, sB, loads, sched = self._prologue(
            tma_a, mA, tma_b, mB, a_layout, b_layout, m, n_tiles, sk_tiles, bidx
        )
        if cutlass.const_expr(self.cfg.pdl and not self._producer_works_before_wait()):
            cute.arch.griddepcontrol_wait()  # the previous kernel's outputs (x, scales) are complete
        gmem = Gmem(mAS, mWS, mOut, mAux, mPart, mCtr, tma_o, mO_tma, m, n)

        if wg_idx == 0:
            # ---------------- producer warpgroup: one warp issues the TMA loads
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                self._produce(mainloop, loads, sched, gmem, storage)
            elif cutlass.const_expr(self.cfg.x_permute):  # warps 1-3 (nvfp4.X_PERMUTE_WARPS) put x in the k order
                self._permute_stages(mainloop, sched, storage, warp_idx - 1)
        else:
            # ---------------- consumer warpgroups: wgmma, promotion, epilogue
            cute.arch.setmaxregister_increase(self.consumer_regs)
            if cutlass.const_expr(self._producer_works_before_wait()):  # (the producer waits in _produce)
                cute.arch.griddepcontrol_wait()
            self._consume(tiled_mma, mainloop, sA, sB, storage, gmem, sched, tidx, wg_idx)
        if cutlass.const_expr(self.cfg.cluster_k > 1):
            # no CTA leaves while its peer may still be sending to it (or its st.async are in flight)
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()

    @cute.jit
    def _consume(self, tiled_mma, mainloop, sA, sB, storage, gmem: Gmem, sched: Schedule, tidx, wg_idx):
        """The consumer warpgroups (tidx ≥ 128): for each segment of this CTA's work (stream_k.py),
        the mainloop (mainloop.py), the stream-K fix-up and the epilogue (epilogue_stores.py).
        swap_ab.py overrides this."""
        cfg = self.cfg
        m = gmem.m
        ops, acc, n_vals, col0 = self._row_operands(tiled_mma, sA, sB, storage, gmem, tidx, wg_idx)
        r0 = ops.r0
        # output staging slab in smem: (tile_m rows, out_row_words) 32-bit words; each warpgroup owns its 64 rows
        sO = storage.sO.get_tensor(cute.make_layout((cfg.tile_m, cfg.out_row_words), stride=(cfg.out_row_words, 1)))
        h_store = None
        if cutlass.const_expr(cfg.h_tma_store):
            # the same smem as TMA boxes: (64 rows, 128 bytes of h, box), box = warpgroup · boxes + j
            box = self._h_store_layout()
            sBox = storage.sO.get_tensor(box.outer, swizzle=box.inner, dtype=self.h_dtype)
            gBox = cute.local_tile(gmem.mO_tma, self.h_box, (None, None))
            tHs, tHg = cute.nvgpu.cpasync.tma_partition(
                gmem.tma_o, 0, cute.make_layout(1), cute.group_modes(sBox, 0, 2), cute.group_modes(gBox, 0, 2)
            )
            h_store = (gmem.tma_o, tHs, tHg)

        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, cfg.stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, cfg.stages)
        cursor = Int32(0)
        cursor_end = sched.cursor_end
        while cursor < cursor_end:
            tile, kb0, kb1 = self._segment(cursor, sched)
            tm, tn = self._tile_mn(tile, sched.tiling)
            cursor += kb1 - kb0
            row_a = tm * cfg.tile_m + r0
            row_b = row_a + 8
            acc.fill(0.0)
            # (storage is a value this loop carries: the tracer carries a name it sees a method called
            # on. The mainloops, inline here before, made it so, and the K pairs' fix-up then
            # recomputes its barrier's address in the loop; kept so that every config's PTX stays
            # as it was, benchmarks/ptx_md5.py. The call itself compiles to nothing.)
            storage.xbar.data_ptr()
            state, release = self._row_mainloop(mainloop, state, release, ops, acc,
                                                TileWork(tm, tn, kb0, kb1, row_a, row_b))
            epi = Int32(1)
            if cutlass.const_expr(not cfg.whole_tiles):  # (schedule())
                epi = self._finish_tile(acc, n_vals, tm * cfg.tile_m + r0, m, tile, sched, gmem.mPart, gmem.mCtr,
                                        storage, tidx - 128)
            if epi != 0:
                self._row_epilogue(acc, n_vals, r0, col0, tm, tn, sO, gmem, storage, h_store, tidx, wg_idx)
        if cutlass.const_expr(cfg.h_tma_store):
            if tidx % 128 == 0:  # the last h stores have read this CTA's smem before it exits
                cute.arch.cp_async_bulk_wait_group(0, read=True)

    def _row_operands(self, tiled_mma, sA, sB, storage, gmem: Gmem, tidx, wg_idx):
        """The consumer's per-CTA operands of the 64/128-row tiles (plain Python, inlined): the
        mainloops' RowOperands, the accumulator (both halves: 128 fp32 per thread), its values per
        half and this thread's first column."""
        cfg = self.cfg
        ws_last = (gmem.n + W_BLOCK - 1) // W_BLOCK - 1  # last weight-scale row (a partial last tile reads no further)
        split = cfg.split_n
        t_mma = (tidx - 128) % 128 if split else tidx - 128  # (split_n: each warpgroup its own MMA)
        thr_mma = tiled_mma.get_slice(t_mma)
        # the wgmma's smem operands depend only on the warpgroup, not the lane: sliced by a warp-uniform
        # index, their descriptors are built in uniform registers (no R2UR before every QGMMA)
        thr_ab = tiled_mma.get_slice(0 if split else (wg_idx - 1) * 128) if cfg.uniform_ab else thr_mma
        tCsA = thr_ab.partition_A(sA)
        tCrA = tiled_mma.make_fragment_A(tCsA)  # (MMA, 1, MMA_K, STAGES)
        dec = None
        if cfg.nvfp4:  # the wgmma reads the weight from the decode buffers (decode_buffers k tiles, not STAGES)
            d_layout = self._decode_layout()
            tCrB = tiled_mma.make_fragment_B(thr_ab.partition_B(storage.sD.get_tensor(d_layout.outer,
                                                                                       swizzle=d_layout.inner)))
            dec = self._decode_operands(storage, gmem, tidx - 128)
        else:
            tCrB = tiled_mma.make_fragment_B(thr_ab.partition_B(sB))
        tCrB_half = [
            tiled_mma.make_fragment_B(
                thr_ab.partition_B(cute.local_tile(sB, (HALF_N, cfg.tile_k, cfg.stages), (h, 0, 0)))
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
        if cfg.fp8:
            temp = cute.make_rmem_tensor(
                thr_mma.partition_C(cute.make_identity_tensor((cfg.tile_m, HALF_N))).shape, self.acc_dtype
            )  # (MMA, 1, 1): one half
        if split:
            temp2 = cute.make_rmem_tensor(temp.shape, self.acc_dtype)
        mmas_per_promotion = cfg.promote_k // cute.size(tiled_mma.shape_mnk, mode=[2])
        quarters = None
        if self.overlap:
            # wgmma chains over 64-row quarters of B (quarter c: B rows [64c, 64c + 64), half c // 2)
            # into two 32-register temps, so that one is promoted while the other is computed
            mma_q = self._tiled_mma(HALF_N // 2)
            thr_q = mma_q.get_slice(t_mma)
            tCrA_q = mma_q.make_fragment_A(thr_q.partition_A(sA))
            tCrB_q = [
                mma_q.make_fragment_B(
                    thr_q.partition_B(cute.local_tile(sB, (HALF_N // 2, cfg.tile_k, cfg.stages), (c, 0, 0)))
                )
                for c in range(4)
            ]
            temp_q = thr_q.partition_C(cute.make_identity_tensor((64, HALF_N // 2))).shape
            tq = (cute.make_rmem_tensor(temp_q, self.acc_dtype), cute.make_rmem_tensor(temp_q, self.acc_dtype))
            quarters = (mma_q, tCrA_q, tCrB_q, tq, num_k_blocks)
        ops = RowOperands(tiled_mma, thr_mma, sB, tCrA, tCrB, tCrB_half, num_k_blocks, temp, temp2, quarters,
                          mmas_per_promotion, storage, gmem.mAS, gmem.mWS, gmem.m, ws_last, r0, wg_idx, dec)
        return ops, acc, n_vals, col0

    @cute.jit
    def _row_epilogue(self, acc, n_vals: cutlass.Constexpr, r0, col0, tm, tn, sO, gmem: Gmem, storage, h_store, tidx,
                      wg_idx):
        """The finished tile's stores (epilogue_stores.py), chosen at compile time."""
        cfg = self.cfg
        m, mOut, mAux = gmem.m, gmem.mOut, gmem.mAux
        if cutlass.const_expr(cfg.granules):
            self._epilogue_gated_granules(acc, n_vals, r0, col0, tm, tn, m, sO, mOut, wg_idx - 1, tidx % 128)
        elif cutlass.const_expr(cfg.split_n):
            self._split_n_epilogue(acc, n_vals, r0, col0, tm, tn, m, sO, mOut, mAux, storage, h_store, tidx, wg_idx)
        elif cutlass.const_expr(cfg.epilogue == "gated"):
            self._epilogue_gated(acc, n_vals, r0, col0, tm, tn, m, sO, mOut, mAux, wg_idx - 1, tidx % 128, h_store)
        else:
            self._epilogue_linear(acc, n_vals, r0, col0, tm, tn, m, gmem.n, sO, mOut, mAux, wg_idx - 1, tidx % 128)

    @cute.jit
    def _split_n_epilogue(self, acc, n_vals: cutlass.Constexpr, r0, col0, tm, tn, m, sO, mOut, mAux, storage, h_store,
                          tidx, wg_idx):
        """split_n: the up half's warpgroup hands its accumulator to the gate half's through smem
        (value v of thread t at word v · 128 + t: same fragment positions on both sides), which then
        runs the whole tile's epilogue. Barrier 4: the previous tile's values have been read;
        barrier 5: this tile's are written. (xacc_parts > 1: part by part through a smaller buffer,
        the two barriers per part.)"""
        cfg = self.cfg
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
            self._epilogue_gated(acc, n_vals, r0, col0, tm, tn, m, sO, mOut, mAux, 0, t, h_store)

# ---------------------------------------------------------------- host: launch
def operand_dtypes(config: TileConfig) -> tuple:
    """The pointer types of (A, W, a_scale, w_scale) that GemmKernel.__call__ takes for this config:
    fp8 e4m3 operands with fp32 scales; bf16 operands; nvfp4 bf16 A, the packed weight and its e4m3
    scales as bytes, and in a_scale's place the fp32 global scale multipliers."""
    if config.fp8:
        return cutlass.Float8E4M3FN, cutlass.Float8E4M3FN, Float32, Float32
    if config.nvfp4:
        return cutlass.BFloat16, cutlass.Uint8, Float32, cutlass.Uint8
    return cutlass.BFloat16, cutlass.BFloat16, Float32, Float32


def nvfp4_global_scales(global_scale, count: int = 2):
    """An nvfp4 weight's global scale multipliers ([1], or [2]: gate, up; the split projection's
    [3]) as the kernel reads them: ``count`` fp32 values (one repeated where there is one). A view
    where the tensor has them (a copy is a kernel launch, at decode the length of a projection's
    tail). Device ops only (CUDA-graph capturable)."""
    import torch

    gs = global_scale.to(torch.float32).reshape(-1)
    return gs[:count] if gs.numel() >= count else gs.expand(count).contiguous()


def weight_operands(config: TileConfig, weight, weight_scale, a_scale, global_scale, tile_major: bool = False):
    """(the weight the kernel reads, (a_scale, w_scale) pointers' tensors) for ``config``: fp8's
    scales; nvfp4's global scale multipliers in a_scale's place (with its e4m3 scales); for
    ``dequantized`` the nvfp4 weight turned into bf16 for this call, and the multipliers.
    ``tile_major``: the weight's order (nvfp4_layout, fp8_layout), which an nvfp4 W4A16 or fp8 config
    has compiled in."""
    if (config.fp8 or config.nvfp4) and config.tile_major != tile_major:
        raise ValueError(f"tile_major: the weight is {'tile-major' if tile_major else 'in packed order'}, "
                         f"but {config} reads the other order")
    if config.fp8:
        from .. import fp8_layout

        if tile_major and not fp8_layout.fits(*weight.shape):
            raise ValueError(f"tile_major: an fp8 weight of shape {tuple(weight.shape)} has no tile-major order "
                             f"(N a multiple of {fp8_layout.ROWS}, K of {fp8_layout.K_TILE})")
        return weight, (a_scale, weight_scale)
    if config.nvfp4:
        return weight, (nvfp4_global_scales(global_scale, config.global_scales), weight_scale)
    if config.dequantized:
        from .nvfp4_dequant import dequantize

        return (dequantize(weight, weight_scale, tile_major=tile_major),
                (nvfp4_global_scales(global_scale, config.global_scales), None))
    return weight, (None, None)


def launch(fn, config: TileConfig, a, w, a_scale, w_scale, out, out_dtype, aux, aux_dtype, aux_align: int) -> None:
    """Run the compiled ``fn`` (compile_kernel's arguments) for A [M, K] and W [N, K] into ``out``
    on the current stream, with launch_plan's schedule. Absent operands (None: the bf16 mainloop's
    scales, a bf16 h's scales, no residual, no stream-K workspace) get ``out``'s pointer, a valid
    allocation the kernel never reads through them."""
    import torch

    from . import compile_cache

    m, k = a.shape
    n = w.shape[0]
    a_t, w_t, as_t, ws_t = operand_dtypes(config)
    torch_stream = torch.cuda.current_stream(a.device)
    stream = cuda.CUstream(torch_stream.cuda_stream)
    ctas, sk_tiles, parts, ctr = launch_plan(config, m, n, k, a.device, torch_stream)

    def ptr(dtype, t, align):
        return compile_cache.ptr(dtype, out if t is None else t, align)

    fn(
        ptr(a_t, a, 16), ptr(w_t, w, 16),
        ptr(as_t, a_scale, 4), ptr(ws_t, w_scale, 4),
        ptr(out_dtype, out, 16), ptr(aux_dtype, aux, aux_align),
        ptr(Float32, parts, 4), ptr(Int32, ctr, 4),
        Int32(m), Int32(k // config.k_align), Int32(n // N_ALIGN), Int32(ctas), Int32(sk_tiles),
        stream,
    )
