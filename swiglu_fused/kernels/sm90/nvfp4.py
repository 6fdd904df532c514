"""The nvfp4 (W4A16) mainloop of the sm_90a GEMM: Hopper has no FP4 tensor cores, so the weight
streams from HBM as e2m1 codes (two a byte) with an e4m3 scale per 16 columns, 0.5625 byte an
element, and is decoded to bf16 in shared memory for bf16 wgmma against bf16 activations.

Per k tile (64 columns), besides the producer's TMA loads as for the other mainloops (A: x or h
bf16; W: the packed tile, 256 rows × 32 bytes, unswizzled):

    scales      the producer warp copies the tile's e4m3 scales, one 32-bit word a weight row (the
                row's four 16-column groups; K % 64 == 0), beside the stage (TileConfig.scale_words)
                with cp.async, which holds the stage's full barrier open until they land; for a
                tile-major weight (TileConfig.tile_major) they are one 1 KB run, fetched by one
                bulk copy that completes its bytes on the stage's full barrier.
    decode      consumer thread t (two consumer warpgroups, 256 threads: one row each): its row's
                32 packed bytes (two 16-byte shared loads; a warp reads 1 KB contiguous) and its
                scale word → 64 bf16 = code · scale · 2^-62 (exact, one fma a pair of values:
                ptx.e2m1x2_to_bf16x2; the power of two comes back with the global scale), eight 16-byte
                stores into the decode buffer, a bf16 k tile in the layout the bf16 mainloop's
                wgmma reads (128-byte swizzle: chunk c of row r at byte 128·r + 16·(c ^ r % 8); a
                quarter warp's 8 rows hit 8 distinct bank groups).
    wgmma       ss, bf16 × bf16 → fp32 acc (the row tiles: x × W; swap-AB: W × x), as the bf16
                mainloop.

Two decode buffers: k tile kt is decoded while tile kt - 1's wgmma runs; then the warpgroup waits
for that wgmma (it has read buffer (kt - 1) % 2 and the stage's x), releases the stage, fences the
decode's generic-proxy stores for the async proxy and meets the other consumer threads at a named
barrier (every thread's part of buffer kt % 2 is written, and every warpgroup's wgmma kt - 1 is
done, so the next decode may overwrite its buffer) before issuing wgmma kt. On the swap-AB tiles
each warpgroup decodes exactly the rows its own wgmma reads, so its barrier is its own
(_decode_operands).

One decode buffer (TileConfig.decode_buffers = 1; the 16-token swap-AB tile, DISPATCH D30): the
warpgroup waits for wgmma kt - 1 first, then decodes tile kt into the buffer, fences, meets its
barrier and issues wgmma kt. Its own decode no longer overlaps its wgmma, but the two warpgroups
fall out of step and one decodes while the other waits: measured 1-7 % faster at M ≤ 16 (and
slower on the 64-token tile, whose longer wgmma is then exposed), with the same arithmetic in the
same order (bit-identical).

Into registers (TileConfig.rs_decode; the 32- to 160-token swap-AB tiles of a tile-major weight,
DISPATCH D45, D62-D64, and the 128-row tiles of 224-256 tokens, D67, D68): no decode buffer. Thread t of
the wgmma's A layout holds rows g and g + 8 of each of its 64-row blocks; thread q = t % 4 of a quad decodes scale group q of those rows in every k
tile (words 2q and 2q + 1: one 8-byte shared load a row, one scale), pair j of word 2q + c going
to k step j, column half c of its A fragment, and the wgmma reads A from those registers. k
position 16j + 8c + 2q + e of the tile then holds column 16q + 8c + 2j + e, so the activations
come in that order (nvfp4_layout.rs_k_order; the launchers copy x, or with TileConfig.x_permute producer
warps 1-3 permute each stage's x in shared memory, _permute_stages; gate_up writes h so). gate_up's
128-row tiles (TileConfig.half_row_pairs) decode a gate row as row g and its up row as g + 8
(_pair_of, _rs_address), so that act(gate) · up pairs accumulator values in the thread. Per k
tile: wait for the stage, decode, issue, wait for the chain (the other warpgroup's chain runs
meanwhile), release; no fence, no barrier. Not bit-identical to the smem decode (another k order
inside each wgmma step). With TileConfig.rs_prefetch (the 64- to 160-token tiles, D66) the next k
tile's shared loads go right after the issue, before the wait, into registers the decode reads
after it.

The per-tensor global scales (fp32 multipliers: gate and up for gate_up, one for down; the host
turns compressed-tensors' divisor into one) multiply the accumulator once per segment, after the
loop: a linear map, so stream-K partials scaled apart add up to the scaled sum.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32

from ...quant import cdiv
from .ptx import (DECODE_SHIFT, bulk_copy_g2s, bulk_prefetch_l2, cp_async_4, cp_async_arrive, e2m1x2_to_bf16x2,
                  e2m1x8_to_bf16x2x4, e4m3x2_to_bf16x2, e4m3x4_to_bf16x2, ld_shared_b32, ld_shared_v2, ld_shared_v4,
                  prmt, st_shared_v4)
from .tile_config import HALF_N

# the decoded weight is the true one times 2^-UNSHIFT (ptx.e2m1x2_to_bf16x2): the accumulator is
# multiplied back with the global scale, a power of two, so exactly
UNSHIFT = 126 - DECODE_SHIFT

DECODE_BARRIER = 6  # named barrier id, 7 too (1, 2: epilogue; 3: stream-K; 4, 5: split_n)
PDL_PREFETCH_STAGES = 2  # TileConfig.pdl: k tiles prefetched into L2 before the wait, in stages (a guess)
X_PERMUTE_WARPS = 3  # TileConfig.x_permute: producer warps 1-3 permute x (warp 0 issues the TMA loads)


class DecodeOperands(NamedTuple):
    """What the nvfp4 decode reads and writes, per CTA (trace values)."""

    w_addr: Any  # shared address of the packed weight stages
    d_addr: Any  # shared address of the decode buffers
    s_addr: Any  # shared address of the staged scale words (stage, row)
    mGS: Any  # global scale multipliers [2]: gate, up (down: the same value twice)
    row: Any  # the weight row this thread decodes (one each: tile_n consumer threads); rs_decode: its first
    barrier: Any  # the named barrier its decode meets every k tile (pipeline.NamedBarrier; rs_decode: none)
    quad: Any = None  # rs_decode: t % 4, the scale group (8 bytes) of each of its rows' k tiles it decodes
    x_ready: Any = None  # x_permute: the barriers a stage's x is in rs_k_order on (else the stage's full one)


class Nvfp4Mixin:
    """The nvfp4 mainloop; a base class of GemmKernel (its methods are traced into the kernel)."""

    def _decode_operands(self, storage, gmem, t) -> DecodeOperands:
        """Plain Python (inlined): the decode's addresses, tensors, row and barrier for consumer
        thread t. The row tiles' wgmma reads every decoded row from both warpgroups, so all
        consumer threads meet each k tile. The swap-AB tiles' warpgroup w reads the 64-row blocks
        w, w + 2, … of the tile (the tiled wgmma's layout), so its threads decode those rows and it
        meets only itself: the warpgroups no longer wait for each other every k tile."""
        wgs = self.num_mma_wg
        if self.cfg.rs_decode:  # wgmma A fragments: rows row + 8·vb + 64·wgs·b (_decode_fragments)
            row = 64 * (t // 128) + 16 * (t % 128 // 32) + t % 32 // 4
            if self.cfg.half_row_pairs:  # gate / up pair p: rows p and 64 + p (_rs_address)
                row = self._pair_of(t)
            return DecodeOperands(storage.sB.data_ptr().toint(), None, storage.scl.data_ptr().toint(), gmem.mAS,
                                  row, None, t % 4, storage.xready.data_ptr() if self.cfg.x_permute else None)
        if self.cfg.swap_ab:
            wg, lane = t // 128, t % 128
            row = 64 * (wg + wgs * (lane // 64)) + lane % 64
            bar = pipeline.NamedBarrier(barrier_id=DECODE_BARRIER + wg, num_threads=128)
        else:
            row, bar = t, pipeline.NamedBarrier(barrier_id=DECODE_BARRIER, num_threads=128 * wgs)
        return DecodeOperands(storage.sB.data_ptr().toint(), storage.sD.data_ptr().toint(),
                              storage.scl.data_ptr().toint(), gmem.mAS, row, bar)

    def _pair_of(self, t):
        """half_row_pairs: the gate / up pair (h column of the CTA's 64) that consumer thread t's A
        fragment rows g and g + 8 hold, its warp's 8 pairs a quarter of its warpgroup's 32."""
        return 32 * (t // 128) + 8 * (t % 128 // 32) + t % 32 // 4

    def _row_runs(self, tn):
        """(rows coordinate, rows) of tile tn's runs of contiguous tile-major rows (plain Python,
        inlined): the whole tile, or half_row_pairs' gate quarter and up quarter (gemm._w_quarters)."""
        if self.cfg.half_row_pairs:
            return tuple(((0, q), HALF_N // 2) for q in self._w_quarters(tn))
        return (((0, tn), self.cfg.tile_n),)

    # ------------------------------------------------------------------ producer
    @cute.jit
    def _copy_nvfp4_scales(self, storage, mWS, n, tn, kt, lane, stage, bar):
        """The producer warp, once the stage's slot is free and before its TMA loads: k tile kt's
        scale words of the tile's rows lane + 32i into the stage's scale slot by cp.async, each
        lane then holding the stage's full barrier open until its copies land. Nothing waits
        here: the copies of several stages are in flight at once (staging them through registers
        took one global-load latency a stage)."""
        cfg = self.cfg
        base = storage.scl.data_ptr().toint() + stage * (cfg.tile_n * 4)
        for i in cutlass.range_constexpr(cfg.tile_n // 32):
            row = cutlass.min(tn * cfg.tile_n + lane + 32 * i, n - 1)  # rows ≥ N: zero-fill codes
            cp_async_4(base + (lane + 32 * i) * 4, (mWS.iterator + cute.crd2idx((row, kt), mWS.layout)).toint())
        cp_async_arrive(bar.toint())

    @cute.jit
    def _bulk_nvfp4_scales(self, storage, mWS, tn, kt, lane, stage, bar):
        """The same scale words of a tile-major weight (TileConfig.tile_major: a k tile's 256 words
        are one 1 KB run): one bulk copy by lane 0 on the stage's full barrier, whose byte count
        includes them (GemmKernel._prologue)."""
        cfg = self.cfg
        if lane == 0:
            dst = storage.scl.data_ptr().toint() + stage * (cfg.tile_n * 4)
            for crd, rows in self._row_runs(tn):
                src = (mWS.iterator + cute.crd2idx((crd, kt), mWS.layout)).toint()
                bulk_copy_g2s(dst, src, rows * 4, bar.toint())
                dst += rows * 4

    @cute.jit
    def _prefetch_weights_early(self, sched, gmem, lane):
        """TileConfig.pdl on a tile-major nvfp4 weight: before griddepcontrol.wait, L2 prefetches of
        the codes (one 8 KB run) and scales (1 KB) of this CTA's first PDL_PREFETCH_STAGES · stages k
        tiles, by lane 0; the loads after the wait then find them there. Not the early loads into
        the stages fp8 takes (GemmKernel._produce_weights_early): with those, ptxas compiled the
        kernel to 74 registers and a narrower decode (95 without them; history/mlp.md)."""
        cfg = self.cfg
        mW, mWS = gmem.mO_tma, gmem.mWS  # (the raw weight, in the h TMA store's slot: GemmKernel.__call__)
        ahead = cutlass.min(Int32(PDL_PREFETCH_STAGES * cfg.stages), sched.cursor_end)
        cursor = Int32(0)
        while cursor < ahead:
            tn, kb0, kb1 = self._early_segment(cursor, ahead, sched)
            cursor += kb1 - kb0
            if lane == 0:
                for kt in cutlass.range(kb0, kb1, unroll=1):
                    for crd, rows in self._row_runs(tn):
                        bulk_prefetch_l2((mW.iterator + cute.crd2idx((crd, (0, kt)), mW.layout)).toint(),
                                         rows * cfg.tile_k // 2)
                        bulk_prefetch_l2((mWS.iterator + cute.crd2idx((crd, kt), mWS.layout)).toint(),
                                         rows * 4)

    # ------------------------------------------------------------------ consumers
    @cute.jit
    def _mainloop_nvfp4(self, mainloop, state, release, tiled_mma, acc, tW, tX, dec: DecodeOperands, kb0, kb1,
                        num_k_blocks: cutlass.Constexpr):
        """acc += the k tiles [kb0, kb1) (see the module docstring). tW: the wgmma fragments of the
        decode buffers, tX: of the activation stages; the swap-AB tiles have the weight as the
        wgmma's A operand, the row tiles as its B. A thread's packed words and scales of tile
        kt + 1 are loaded into registers right after it decodes tile kt (once that stage is full),
        so their shared-memory latency passes under tile kt's synchronization and wgmma issue
        instead of stalling the next decode (the largest stall, Nsight Compute)."""
        bar = dec.barrier
        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
        mma = (tiled_mma, acc, tW, tX, num_k_blocks)
        regs = cute.make_rmem_tensor(cute.make_layout(9), Int32)  # 8 packed words, the scale word
        mainloop.consumer_wait(state)
        self._load_packed(dec, state.index, regs)
        if cutlass.const_expr(self.cfg.decode_buffers == 1):
            return self._mainloop_one_buffer(mainloop, state, release, mma, bar, dec, regs, kb0, kb1)
        buf = Int32(0)
        for kt in cutlass.range(kb0, kb1 - 1, unroll=1):
            self._decode_regs(dec, regs, buf)
            stage = state.index
            state.advance()
            mainloop.consumer_wait(state)
            self._load_packed(dec, state.index, regs)
            cute.nvgpu.warpgroup.wait_group(0)  # wgmma kt - 1: done with its decode buffer and stage
            if kt > kb0:
                mainloop.consumer_release(release)
                release.advance()
            self._issue_decoded(mma, bar, stage, buf)
            buf = 1 - buf
        self._decode_regs(dec, regs, buf)  # the last tile: nothing to load after it
        cute.nvgpu.warpgroup.wait_group(0)
        if kb1 - 1 > kb0:
            mainloop.consumer_release(release)
            release.advance()
        self._issue_decoded(mma, bar, state.index, buf)
        state.advance()
        cute.nvgpu.warpgroup.wait_group(0)
        mainloop.consumer_release(release)
        release.advance()
        return state, release

    @cute.jit
    def _mainloop_one_buffer(self, mainloop, state, release, mma, bar, dec: DecodeOperands, regs, kb0, kb1):
        """decode_buffers = 1 (see the module docstring): tile kt waits for wgmma kt - 1 (it has
        read the buffer and its stage's x) before it is decoded. Tile kb0's packed words and scales
        are in regs on entry; tile kt + 1's are loaded before wgmma kt is issued."""
        for kt in cutlass.range(kb0, kb1, unroll=1):
            if kt > kb0:
                cute.nvgpu.warpgroup.wait_group(0)
                mainloop.consumer_release(release)
                release.advance()
            self._decode_regs(dec, regs, Int32(0))
            stage = state.index
            state.advance()
            if kt + 1 < kb1:
                mainloop.consumer_wait(state)
                self._load_packed(dec, state.index, regs)
            self._issue_decoded(mma, bar, stage, 0)
        cute.nvgpu.warpgroup.wait_group(0)
        mainloop.consumer_release(release)
        release.advance()
        return state, release

    @cute.jit
    def _mainloop_nvfp4_rs(self, mainloop, state, release, tiled_mma, acc, tW, tX, dec: DecodeOperands, kb0, kb1,
                           num_k_blocks: cutlass.Constexpr):
        """TileConfig.rs_decode (the swap-AB tiles): per k tile this thread decodes the weight values
        of its own wgmma A fragments into registers (tW) and the chain reads A there. Each warpgroup
        goes alone: no decode buffer, no proxy fence, no barrier. Tile kt + 1 is decoded once wgmma
        kt is done with the registers (the other warpgroup's wgmma runs meanwhile); a stage is
        released then too (the chain has read its x). rs_prefetch: tile kt + 1's shared loads are
        issued before that wait (D66). (Two register sets, decoding under the warpgroup's own wgmma,
        and the two warpgroups taking turns measured slower: history/nvfp4.md v28, v43.)"""
        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
        frag = cute.recast_tensor(tW, Int32)  # ((1, 2, 2), blocks, MMA_K): a bf16 pair a word
        mma = (tiled_mma, acc, tX, num_k_blocks)
        if cutlass.const_expr(self.cfg.rs_prefetch):  # tile kt + 1's words loaded while chain kt runs
            blocks = cute.size(frag, mode=[1])
            raw = cute.make_rmem_tensor(cute.make_layout(6 * blocks), Int32)
            self._wait_x(mainloop, state, dec)
            self._load_rs(dec, state.index, raw, blocks)
            for kt in cutlass.range(kb0, kb1, unroll=1):
                self._decode_rs(dec, raw, frag, blocks)
                self._issue_rs(mma, tW, state.index)
                state.advance()
                if kt + 1 < kb1:
                    self._wait_x(mainloop, state, dec)
                    self._load_rs(dec, state.index, raw, blocks)
                cute.nvgpu.warpgroup.wait_group(0)
                mainloop.consumer_release(release)
                release.advance()
        else:
            for kt in cutlass.range(kb0, kb1, unroll=1):
                self._wait_x(mainloop, state, dec)
                self._decode_fragments(dec, state.index, frag)
                self._issue_rs(mma, tW, state.index)
                state.advance()
                cute.nvgpu.warpgroup.wait_group(0)
                mainloop.consumer_release(release)
                release.advance()
        return state, release

    def _wait_x(self, mainloop, state, dec: DecodeOperands):
        """rs_decode: wait until stage ``state`` holds the k tile, its x in rs_k_order: the stage's full
        barrier, or with x_permute the one _permute_stages arrives on after it (plain Python, inlined)."""
        if dec.x_ready is None:
            mainloop.consumer_wait(state)
        else:
            cute.arch.mbarrier_wait(dec.x_ready + state.index, state.phase)

    @cute.jit
    def _init_x_ready(self, storage):
        """x_permute: the barriers of _permute_stages, one a stage, an arrival a permuting thread."""
        if cute.arch.thread_idx()[0] == 0:
            for s in cutlass.range_constexpr(self.cfg.stages):
                cute.arch.mbarrier_init(storage.xready.data_ptr() + s, 32 * X_PERMUTE_WARPS)
        cute.arch.mbarrier_init_fence()

    @cute.jit
    def _permute_stages(self, mainloop, sched, storage, w):
        """x_permute, producer warp 1 + ``w`` (w < X_PERMUTE_WARPS): for each of this CTA's k iterations in
        order, once its stage is full (TMA: x in its natural order), its share of the stage's x put into
        nvfp4_layout.rs_k_order (_permute_x), the writes fenced for the wgmma's async proxy, and an
        arrival on the stage's x_ready barrier, which the consumers wait on instead of the full one."""
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.cfg.stages)
        base = storage.sA.data_ptr().toint()
        ready = storage.xready.data_ptr()
        lane = cute.arch.lane_idx()
        for it in cutlass.range(sched.cursor_end, unroll=1):
            mainloop.consumer_wait(state)
            self._permute_x(base + state.index * self.cfg.x_stage_bytes, lane, w)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.mbarrier_arrive(ready + state.index)
            state.advance()

    @cute.jit
    def _permute_x(self, stage_addr, lane, w):
        """One stage's x (tile_m rows of 64 bf16 columns, 128-byte rows, 16-byte chunk n of row r at
        chunk n ^ r % 8: the TMA box's 128-byte swizzle) from natural order into nvfp4_layout.rs_k_order,
        in place. Pair 8q + 4c + j of a row (columns 16q + 8c + 2j + e) goes to pair 8j + 4c + q: natural
        chunk 2q + c holds pairs j = 0-3 of it, destination chunk 2j + c takes pair j of each, so the
        thread that owns row half c (four chunks, the same four before and after) loads them, transposes
        the 4 × 4 words in its registers and stores them back. A warp takes a group of 16 rows × 2 halves
        at a time (a lane each), the groups dealt out over the X_PERMUTE_WARPS warps; a quarter warp takes 8
        rows of one half (8 distinct chunk columns: no bank conflict)."""
        groups = self.cfg.tile_m // 16
        c = lane // 8 % 2
        swz = lane % 8  # = r % 8
        for i in cutlass.range_constexpr(cdiv(groups, X_PERMUTE_WARPS)):
            g = w + X_PERMUTE_WARPS * i
            if g < groups:
                row = stage_addr + (16 * g + lane % 8 + 8 * (lane // 16)) * self.cfg.x_row_bytes
                words = [ld_shared_v4(row + 16 * ((2 * q + c) ^ swz)) for q in range(4)]
                for j in cutlass.range_constexpr(4):
                    st_shared_v4(row + 16 * ((2 * j + c) ^ swz), words[0][j], words[1][j], words[2][j], words[3][j])

    def _load_rs(self, dec: DecodeOperands, stage, raw, blocks: int):
        """rs_prefetch: _decode_fragments' shared loads of stage ``stage`` into raw, registers carried
        to the next k tile: 6 words a block, row g's and g + 8's scale words, then the two words of
        each (plain Python, inlined)."""
        for b in range(blocks):
            for vb in range(2):
                raw[6 * b + vb] = ld_shared_b32(self._rs_address(dec, stage, b, vb)[0])
            for vb in range(2):
                words = ld_shared_v2(self._rs_address(dec, stage, b, vb)[1])
                for c in range(2):
                    raw[6 * b + 2 + 2 * vb + c] = words[c]

    def _decode_rs(self, dec: DecodeOperands, raw, frag, blocks: int):
        """rs_prefetch: _decode_fragments' arithmetic on the words _load_rs loaded (plain Python, inlined)."""
        for b in range(blocks):
            scales = self._rs_scales((raw[6 * b], raw[6 * b + 1]), dec.quad)
            for vb in range(2):
                self._rs_fragments(frag, b, vb, (raw[6 * b + 2 + 2 * vb], raw[6 * b + 3 + 2 * vb]), scales)

    def _issue_rs(self, mma, tW, stage):
        """Fence this thread's fragment writes for the wgmma, issue the k tile's chain (plain
        Python, inlined)."""
        tiled_mma, acc, tX, num_k_blocks = mma
        cute.nvgpu.warpgroup.fence()
        for kk in range(num_k_blocks):
            cute.gemm(tiled_mma, acc, tW[(None, None, kk)], tX[(None, None, kk, stage)], acc)
        cute.nvgpu.warpgroup.commit_group()

    def _decode_fragments(self, dec: DecodeOperands, stage, frag):
        """This thread's A fragments of packed stage ``stage`` (plain Python, inlined). Block b's rows
        are dec.row + 8·vb + 64·wgs·b (the wgmma A layout, vb = 0, 1); of each the thread q = t % 4
        of the quad takes scale group q: words 2q + c (c = 0, 1; one 8-byte load) and the group's
        scale. k step j's fragment column pairs (2q, 2q + 1) and (2q + 8, 2q + 9) get pair j of
        words 2q and 2q + 1, i.e. columns 16q + 2j (+ 1) and 16q + 8 + 2j (+ 1): k positions 16j + 8c
        + 2q + e hold columns 16q + 8c + 2j + e, which nvfp4_layout.rs_k_order gives the activations."""
        for b in range(cute.size(frag, mode=[1])):
            scales = self._rs_scales([ld_shared_b32(self._rs_address(dec, stage, b, vb)[0]) for vb in range(2)],
                                     dec.quad)
            for vb in range(2):
                self._rs_fragments(frag, b, vb, ld_shared_v2(self._rs_address(dec, stage, b, vb)[1]), scales)

    def _rs_address(self, dec: DecodeOperands, stage, b: int, vb: int):
        """(shared address of the scale word, of the thread's two words) of row dec.row + 8·vb + 64·wgs·b
        in packed stage ``stage`` (plain Python, inlined)."""
        cfg = self.cfg
        row = dec.row + (64 * vb if cfg.half_row_pairs else 64 * self.num_mma_wg * b + 8 * vb)
        words = dec.w_addr + stage * cfg.w_stage_bytes + dec.quad * 8 + row * (cfg.tile_k // 2)
        return dec.s_addr + (stage * cfg.tile_n + row) * 4, words

    def _rs_scales(self, sw, quad):
        """Scale words of rows g and g + 8 → their scale group ``quad`` as one bf16 pair (row g's low)."""
        sel = Int32(0x40) + Int32(0x11) * quad  # byte quad of row g's scale word, then of row g + 8's
        return e4m3x2_to_bf16x2(prmt(sw[0], sw[1], sel))

    def _rs_fragments(self, frag, b: int, vb: int, words, scales):
        """A row's two words → its pairs of block b's fragments (pair j of word c to k step j, half c);
        ``scales``: _rs_scales' pair, of which row g + 8·vb takes half vb."""
        for c in range(2):
            pairs = e2m1x8_to_bf16x2x4(words[c], scales, vb)
            for j in range(4):
                frag[((0, vb, c), b, j)] = pairs[j]

    def _issue_decoded(self, mma, bar, stage, buf):
        """Fence the decode's generic-proxy stores for the async proxy, meet the other consumers
        (every part of ``buf`` written; every warpgroup done with the other buffer), issue the
        tile's wgmma chain (plain Python, inlined)."""
        tiled_mma, acc, tW, tX, num_k_blocks = mma
        cute.arch.fence_proxy("async.shared", space="cta")
        bar.arrive_and_wait()
        cute.nvgpu.warpgroup.fence()
        for kk in range(num_k_blocks):
            if self.cfg.swap_ab:
                cute.gemm(tiled_mma, acc, tW[(None, None, kk, buf)], tX[(None, None, kk, stage)], acc)
            else:
                cute.gemm(tiled_mma, acc, tX[(None, None, kk, stage)], tW[(None, None, kk, buf)], acc)
        cute.nvgpu.warpgroup.commit_group()

    def _load_packed(self, dec: DecodeOperands, stage, regs):
        """Row t of packed stage ``stage`` into regs: its 32 bytes (two 16-byte shared loads; a
        warp reads 1 KB contiguous) and its scale word (plain Python, inlined)."""
        cfg = self.cfg
        src = dec.w_addr + stage * cfg.w_stage_bytes + dec.row * (cfg.tile_k // 2)
        for h in range(2):
            for i, w in enumerate(ld_shared_v4(src + 16 * h)):
                regs[4 * h + i] = w
        regs[8] = ld_shared_b32(dec.s_addr + (stage * cfg.tile_n + dec.row) * 4)

    @cute.jit
    def _decode_regs(self, dec: DecodeOperands, regs, buf):
        """Row t's packed words and scales (regs) → 64 bf16 in decode buffer ``buf``: eight
        16-byte stores (chunk c of row r at 16·(c ^ r % 8): a quarter warp's 8 rows hit 8 distinct
        bank groups)."""
        cfg = self.cfg
        r = dec.row
        scales = e4m3x4_to_bf16x2(regs[8])  # 16-column group q: words 2q, 2q + 1
        dst = dec.d_addr + buf * (cfg.tile_n * cfg.tile_k * 2) + r * (cfg.tile_k * 2)
        sw = r % 8
        for c in cutlass.range_constexpr(8):
            w = regs[c]
            if cutlass.const_expr(cfg.tile_major):  # (its words' bits in the decode order)
                pairs = e2m1x8_to_bf16x2x4(w, scales[c // 2])
            else:
                w4 = w >> 4
                pairs = tuple(e2m1x2_to_bf16x2(w, w4, j, scales[c // 2]) for j in range(4))
            st_shared_v4(dst + ((c ^ sw) << 4), *pairs)

    def _nvfp4_scale(self, acc, mGS, tn):
        """The row tiles' global scales: half 0 (gate) by mGS[0], half 1 (up) by mGS[1]; down's
        both by its one, mGS[0] (plain Python, inlined; split.py picks the prefix's or the pairs'
        by tile)."""
        self._scale_halves(acc, mGS, lambda b, half: half, index=(0, 0) if self.cfg.global_scales == 1 else (0, 1))

    def _scale_pairs(self, acc, mGS):
        """half_row_pairs: the gate values (A rows g, v / 2 even) by mGS[0], the up values by mGS[1],
        · 2^UNSHIFT (plain Python, inlined)."""
        g = (mGS[0] * float(2 ** UNSHIFT), mGS[1] * float(2 ** UNSHIFT))
        for v in range(cute.size(acc, mode=[0])):
            acc[(v, 0, 0)] = acc[(v, 0, 0)] * g[v // 2 % 2]

    def _scale_halves(self, acc, mGS, half_of, index=(0, 1)):
        """acc value i ·= global scale of its weight half · 2^UNSHIFT (plain Python, inlined):
        half_of(mode-1 index, mode-2 index) → 0 (gate / first 128 rows) or 1, whose scales are
        mGS[index[0]] and mGS[index[1]]."""
        g0 = mGS[index[0]] * float(2 ** UNSHIFT)
        g1 = mGS[index[1]] * float(2 ** UNSHIFT)
        for b in range(cute.size(acc, mode=[1])):
            for h in range(cute.size(acc, mode=[2])):
                g = g0 if half_of(b, h) == 0 else g1
                for v in range(cute.size(acc, mode=[0])):
                    acc[(v, b, h)] = acc[(v, b, h)] * g
