"""The fp8 MLP at decode in one launch (M ≤ 16; issue 25's floor, benchmarks/history/mlp.md): gate_up
and down, each on the 16-token swap-AB tile (swap_ab.py), one after the other in one persistent
kernel of one CTA an SM. Measured, not dispatched: on the H200 it is 6-28 % slower than the
dispatched three launches (4096×14336 M = 1 54.2 against 50.3 µs with quant_x; 8192×3584 36.3
against 29.1); its timeline (trace=True) shows why: both GEMMs are bound by HBM, so down's weight
loaded under gate_up's tail only moves bytes from one phase into the other, gate_up's slowest CTAs
end 6-12 µs after its median one, and every down CTA waits for them (all of h), then down's
stream-K fix-ups add a tail of their own.

The plan was: in two launches down's CTAs start only once gate_up's last CTA has left, then ramp up.
Here each CTA's producer goes on from its last gate_up k tile to its first down k tiles: down's
weight k tiles stream into the stages as gate_up's free them, while the other SMs finish gate_up.

    phase A  gate_up: whole tiles, or every tile stream-K over the first ctas_a CTAs (plan()); the
             epilogue writes h and h_scale, then the CTA counts the h tile done (release, gpu scope:
             every consumer thread's stores, then one atomic add). CTAs without gate_up work go
             straight to phase B.
    phase B  down: every tile stream-K over the first ctas_b CTAs, on the same pipeline and stages
             (the pipeline states go on from phase A). The producer first loads the weight k tiles
             of its first stages, then waits until all h tiles are counted (acquire) and loads h;
             the consumers wait the same way before they read h_scale.

Both GEMMs have the same stage shape (16 × 128 activations, 256 × 128 weight, fp8) and the same
accumulator, so one set of consumer operands serves both; the staging slab is the wider of the two
epilogues'. The stream-K partials and tile counters serve both phases: phase A's are all summed
and re-zeroed before its last h tile is counted. Two more counter words: the h tiles done, and the
CTAs that have left; the last CTA to leave re-zeroes both, so every launch leaves the counters zero
(schedule.stream_k_counters' contract).

Every CTA must be resident at once (a CTA waiting for h would otherwise wait for CTAs that cannot
start): the grid is the device's SM count and a CTA fills an SM's shared memory, so none shares an
SM. Not checked: where a process gets fewer SMs than the device has (MPS limits, green contexts),
a launch could wait forever; one more reason it is not dispatched.
"""

from __future__ import annotations

import dataclasses

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32

from ... import formats
from .gemm import Gmem, operand_dtypes
from .ptx import globaltimer, nanosleep
from .stream_k import Schedule
from .swap_ab import SwapABKernel
from .tile_config import ACC_VALUES, N_ALIGN, W_BLOCK, DownConfig, GateUpConfig, TileConfig

H_DONE_BARRIER = 6  # (named barrier ids 1-5 are the epilogues' and the fix-up's)
H_WAIT_BARRIER = 7
SPIN_NS = 64  # the back-off between two polls of the h tile count
# trace=True: each CTA's global timer (ns) at these points, int64 [ctas, 8]
TRACE_POINTS = ("start", "A loads issued", "A done", "h seen (producer)", "h seen (consumers)", "B done")


def mlp_configs(act: str = formats.ACTIVATIONS[0], pdl: bool = False) -> tuple[GateUpConfig, DownConfig]:
    """The two tiles this kernel runs: gate_up's 16-token swap-AB tile on its tile-major weight (as
    the modules hold it, D38) with fp8 h (GateUpConfig's default h format), and down's, six stages
    each (down's dispatched count)."""
    common = dict(tile_m=16, stages=6, swap_ab=True, uniform_ab=True, pdl=pdl)
    return GateUpConfig(**common, tile_major=True, act=act), DownConfig(**{**common, "pdl": False})


def check_configs(gate_up: TileConfig, down: TileConfig) -> None:
    for name, c, epilogue in (("gate_up", gate_up, "gated"), ("down", down, "linear")):
        if not (c.fp8 and c.swap_ab and c.tile_m == 16 and c.cluster_k == 1 and c.epilogue == epilogue):
            raise ValueError(f"decode_mlp: {name} must be the fp8 16-token swap-AB tile without K clusters; got {c}")
    if gate_up.stages != down.stages or gate_up.uniform_ab != down.uniform_ab:
        raise ValueError(f"decode_mlp: the two tiles share one pipeline: stages and uniform_ab must agree; got "
                         f"{gate_up} and {down}")
    if not gate_up.h_spec.scaled or gate_up.h_spec.bits != 8:
        raise ValueError(f"decode_mlp: down reads fp8 h; got h_format {gate_up.h_format!r}")


class DecodeMlpKernel(SwapABKernel):
    """gate_up's swap-AB kernel (self.cfg) with down's (self.dn) as its second phase."""

    def __init__(self, gate_up: TileConfig, down: TileConfig, trace: bool = False):
        check_configs(gate_up, down)
        super().__init__(gate_up)
        self.dn = SwapABKernel(down)
        self.trace = trace  # compile in the timeline stamps (TRACE_POINTS; benchmarks/bench_decode_mlp.py --trace)

    @cute.jit
    def __call__(
        self,
        x_ptr: cute.Pointer,  # x e4m3 [M, H]
        wg_ptr: cute.Pointer,  # gate_up's weight, tile-major (fp8_layout)
        xs_ptr: cute.Pointer,  # x_scale [M, H/128], row-major
        wgs_ptr: cute.Pointer,  # gate_up's weight scales [2I/128, H/128]
        h_ptr: cute.Pointer,  # h e4m3 [M, I] (written, then read)
        hs_ptr: cute.Pointer,  # h_scale [M, I/128], M-major
        wd_ptr: cute.Pointer,  # down's weight [H, I], packed order
        wds_ptr: cute.Pointer,  # its scales [H/128, I/128]
        y_ptr: cute.Pointer,  # y bf16 [M, H]
        part_ptr: cute.Pointer,  # fp32 stream-K partials [ctas · 2 slots, 128 values, 128 threads]
        ctr_ptr: cute.Pointer,  # int32 [words]: the stream-K counters, then h tiles done, CTAs left; zero
        trace_ptr: cute.Pointer,  # int64 [ctas, 8]: the timeline (trace=True; else not read)
        m: Int32,
        hidden: Int32,  # H / 128
        inter: Int32,  # I / 128
        ctas: Int32,  # the SM count
        sk_a: Int32,  # gate_up: 0 (whole tiles) or its tile count (all stream-K) ...
        ctas_a: Int32,  # ... over CTAs [0, ctas_a); the others go straight to down
        sk_b: Int32,  # down: its tile count
        ctas_b: Int32,  # down: stream-K over CTAs [0, ctas_b); the others leave after gate_up
        words: Int32,
        stream: cuda.CUstream,
    ):
        gu, dn = self.cfg, self.dn.cfg
        hid = cute.assume(hidden * W_BLOCK, divby=W_BLOCK)
        itr = cute.assume(inter * W_BLOCK, divby=W_BLOCK)
        n_gu = cute.assume(2 * itr, divby=2 * W_BLOCK)
        tiles_gu = n_gu // gu.tile_n
        tiles_dn = (hid + dn.tile_n - 1) // dn.tile_n
        mX = cute.make_tensor(x_ptr, cute.make_layout((m, hid), stride=(hid, 1)))
        mXS = cute.make_tensor(xs_ptr, cute.make_layout((m, hidden), stride=(hidden, 1)))
        mWg = self._weight_tensor(wg_ptr, n_gu, tiles_gu, hid, hidden)
        mWgS = cute.make_tensor(wgs_ptr, cute.make_layout((2 * inter, hidden), stride=(hidden, 1)))
        mHo, mHS = self._out_tensors(h_ptr, hs_ptr, m, n_gu // N_ALIGN, tiles_gu)
        mH = cute.make_tensor(h_ptr, cute.make_layout((m, itr), stride=(itr, 1)))
        mWd = self.dn._weight_tensor(wd_ptr, hid, tiles_dn, itr, inter)
        mWdS = cute.make_tensor(wds_ptr, cute.make_layout((hidden, inter), stride=(inter, 1)))
        mY, mR = self.dn._out_tensors(y_ptr, y_ptr, m, hidden * (W_BLOCK // N_ALIGN), tiles_dn)

        tiled_mma = self._tiled_mma()
        a_layout = self._smem_layout(gu.tile_m)
        b_layout = self._w_smem_layout(gu.tile_n)
        a_box = cute.slice_(a_layout, (None, None, 0))
        b_box = cute.slice_(self._w_smem_layout(gu.b_box_rows), (None, None, 0))
        g2s = cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()
        tma_x, tX = cute.nvgpu.cpasync.make_tiled_tma_atom(g2s, mX, a_box, (gu.tile_m, gu.tile_k))
        tma_h, tH = cute.nvgpu.cpasync.make_tiled_tma_atom(g2s, mH, a_box, (gu.tile_m, gu.tile_k))
        w_box = (gu.b_box_rows, self._w_tile_cols())
        tma_wg, tWg = cute.nvgpu.cpasync.make_tiled_tma_atom(g2s, mWg, b_box, w_box)
        tma_wd, tWd = cute.nvgpu.cpasync.make_tiled_tma_atom(g2s, mWd, b_box, w_box)
        self.shared_storage = self._shared_storage(a_layout, b_layout, max(gu.out_row_words, dn.out_row_words))

        consumers = 128 * self.num_mma_wg
        mPart = cute.make_tensor(
            part_ptr, cute.make_layout((ctas * 2, ACC_VALUES, consumers), stride=(ACC_VALUES * consumers, consumers, 1))
        )
        mCtr = cute.make_tensor(ctr_ptr, cute.make_layout(words))
        mTrace = cute.make_tensor(trace_ptr, cute.make_layout((ctas, 8), stride=(8, 1)))
        self.mlp_kernel(
            tma_x, tX, tma_wg, tWg, tma_h, tH, tma_wd, tWd, mXS, mWgS, mHo, mHS, mWdS, mY, mR, mPart, mCtr, mTrace,
            tiled_mma, a_layout, b_layout, m, hid, itr, sk_a, ctas_a, sk_b, ctas_b, words,
        ).launch(grid=[ctas, 1, 1], block=[self.threads, 1, 1], stream=stream, use_pdl=gu.pdl)

    @cute.kernel
    def mlp_kernel(
        self,
        tma_x: cute.CopyAtom,
        mX: cute.Tensor,
        tma_wg: cute.CopyAtom,
        mWg: cute.Tensor,
        tma_h: cute.CopyAtom,
        mH: cute.Tensor,
        tma_wd: cute.CopyAtom,
        mWd: cute.Tensor,
        mXS: cute.Tensor,
        mWgS: cute.Tensor,
        mHo: cute.Tensor,
        mHS: cute.Tensor,
        mWdS: cute.Tensor,
        mY: cute.Tensor,
        mR: cute.Tensor,
        mPart: cute.Tensor,
        mCtr: cute.Tensor,
        mTrace: cute.Tensor,
        tiled_mma: cute.TiledMma,
        a_layout: cute.ComposedLayout,
        b_layout: cute.ComposedLayout,
        m: Int32,
        hid: Int32,
        itr: Int32,
        sk_a: Int32,
        ctas_a: Int32,
        sk_b: Int32,
        ctas_b: Int32,
        words: Int32,
    ):
        gu, dn = self.cfg, self.dn.cfg
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = cute.arch.make_warp_uniform(tidx // 128)
        if warp_idx == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_x)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_wg)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_h)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_wd)
        n_gu = 2 * itr
        tiles_gu = n_gu // gu.tile_n
        tiles_dn = (hid + dn.tile_n - 1) // dn.tile_n
        storage, mainloop, sA, sB, loads_a, sched_a = self._prologue(
            tma_x, mX, tma_wg, mWg, a_layout, b_layout, m, tiles_gu, sk_a, bidx, ctas_a
        )
        loads_b, k_tiles_b = self._tma_loads(tma_h, mH, tma_wd, mWd, sA, sB)
        sched_b = self._cta_schedule(m, itr, tiles_dn, sk_b, k_tiles_b, bidx, ctas_b)
        done = words - 2  # the word counting h tiles done; the next, the CTAs that have left
        h_tiles = sched_a.tiling[0] * tiles_gu
        gm_a = Gmem(mXS, mWgS, mHo, mHS, mPart, mCtr, tma_x, mX, m, n_gu)
        gm_b = Gmem(mHS, mWdS, mY, mR, mPart, mCtr, tma_x, mX, m, hid)
        stamp = lambda point: self._stamp(mTrace, bidx, point)  # noqa: E731 (trace time)
        if tidx == 0:
            stamp(0)

        if wg_idx == 0:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                self._produce_mlp(mainloop, loads_a, sched_a, gm_a, loads_b, sched_b, gm_b, storage, done, h_tiles,
                                  stamp)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            if cutlass.const_expr(self._weights_before_wait()):
                cute.arch.griddepcontrol_wait()
            ops, acc, tCcC, sRed = self._swap_operands(tiled_mma, sA, sB, storage, gm_a, tidx, wg_idx)
            t = tidx - 128
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, gu.stages)
            release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, gu.stages)
            state, release = self._swap_tiles(mainloop, state, release, ops, acc, tCcC, self._slab(storage), sRed,
                                              storage, gm_a, sched_a, t,
                                              after_epilogue=lambda: self._h_tile_done(mCtr, done, t))
            if t == 0:
                stamp(2)
                self._wait_h(mCtr, done, h_tiles)
                stamp(4)
            # (the CTA barrier after thread 0's acquire orders every consumer's h_scale loads after it)
            pipeline.NamedBarrier(barrier_id=H_WAIT_BARRIER, num_threads=128 * self.num_mma_wg).arrive_and_wait()
            ws_last = (hid + W_BLOCK - 1) // W_BLOCK - 1
            ops_b = ops._replace(mAS=mHS, mWS=mWdS, ws_last=ws_last)
            self.dn._swap_tiles(mainloop, state, release, ops_b, acc, tCcC, self.dn._slab(storage), sRed, storage,
                                gm_b, sched_b, t)
            if t == 0:
                stamp(5)
        cute.arch.barrier()
        if tidx == 0:
            self._leave(mCtr, done, cute.arch.grid_dim()[0])

    @cute.jit
    def _produce_mlp(self, mainloop, loads_a, sched_a: Schedule, gm_a: Gmem, loads_b, sched_b: Schedule, gm_b: Gmem,
                     storage, done, h_tiles, stamp):
        """The producer warp: gate_up's k tiles, then down's weight k tiles of the first stages, the
        wait for h, and the rest of down's."""
        lane = cute.arch.lane_idx()
        hints = self._l2_hints()
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.cfg.stages)
        early = None
        if cutlass.const_expr(self._weights_before_wait()):
            early = self._produce_weights_early(mainloop, loads_a, sched_a, gm_a, storage, lane, hints[1])
            cute.arch.griddepcontrol_wait()
        state = self._load_segments(mainloop, loads_a, sched_a, gm_a, storage, state, early, lane, hints)
        if lane == 0:
            stamp(1)
        early_b = self._produce_weights_early(mainloop, loads_b, sched_b, gm_b, storage, lane, hints[1], state)
        if lane == 0:
            self._wait_h(gm_b.mCtr, done, h_tiles)
            stamp(3)
        cute.arch.sync_warp()
        cute.arch.fence_proxy("async.global")  # h's generic stores (other SMs), before this TMA reads them
        state = self._load_segments(mainloop, loads_b, sched_b, gm_b, storage, state, early_b, lane, hints)
        mainloop.producer_tail(state)

    @cute.jit
    def _h_tile_done(self, mCtr, done, t):
        """After an h tile's epilogue: every consumer thread's h and h_scale stores, then one
        release add to the count (the pattern of _fixup's arrival)."""
        cute.arch.fence_proxy("async.global")  # (down's TMA loads read h in the async proxy)
        pipeline.NamedBarrier(barrier_id=H_DONE_BARRIER, num_threads=128 * self.num_mma_wg).arrive_and_wait()
        if t == 0:
            cute.arch.atomic_add(mCtr.iterator + done, Int32(1), sem="release", scope="gpu")

    @cute.jit
    def _wait_h(self, mCtr, done, h_tiles):
        """Poll (acquire, gpu scope; one thread of the consumers and one of the producer warp) until all
        h tiles are counted."""
        seen = cute.arch.load(mCtr.iterator + done, Int32, sem="acquire", scope="gpu")
        while seen < h_tiles:
            nanosleep(SPIN_NS)
            seen = cute.arch.load(mCtr.iterator + done, Int32, sem="acquire", scope="gpu")

    def _stamp(self, mTrace, bidx, point: int):
        """trace=True: this CTA's global timer at TRACE_POINTS[point] (plain Python: nothing otherwise)."""
        if self.trace:
            mTrace[bidx, point] = globaltimer()

    @cute.jit
    def _leave(self, mCtr, done, nctas):
        """The last CTA to leave re-zeroes the two counts (every other CTA is past its waits)."""
        left = cute.arch.atomic_add(mCtr.iterator + done + 1, Int32(1), sem="acq_rel", scope="gpu")
        if left == nctas - 1:
            mCtr[done] = Int32(0)
            mCtr[done + 1] = Int32(0)


# ---------------------------------------------------------------- host
def compile_decode_mlp(gate_up: GateUpConfig, down: DownConfig, trace: bool = False):
    """Compile for sm_90a (no GPU needed: fake pointers, runtime Int32 sizes)."""
    from .compile_cache import COMPILE_OPTIONS, fake_ptr, null_stream

    f8, _, f32, _ = operand_dtypes(gate_up)
    return cute.compile(
        DecodeMlpKernel(gate_up, down, trace),
        fake_ptr(f8, 16), fake_ptr(f8, 16), fake_ptr(f32, 4), fake_ptr(f32, 4),
        fake_ptr(f8, 16), fake_ptr(f32, 4), fake_ptr(f8, 16), fake_ptr(f32, 4),
        fake_ptr(cutlass.BFloat16, 16), fake_ptr(f32, 4), fake_ptr(Int32, 4), fake_ptr(cutlass.Int64, 8),
        Int32(1), Int32(1), Int32(1), Int32(1), Int32(0), Int32(1), Int32(1), Int32(1), Int32(3),
        null_stream(),
        options=COMPILE_OPTIONS,
    )


def shipped_configs() -> list:
    """The (gate_up, down) pairs decode_mlp() compiles: both activations, with and without PDL (CI
    compile-checks them: tests/test_kernels_cpu.py)."""
    return [mlp_configs(act, pdl) for act in formats.ACTIVATIONS for pdl in (False, True)]


def compile_pair(pair: tuple) -> object:
    return compile_decode_mlp(*pair)


MAX_M = 16


def plan(m: int, hidden: int, inter: int, sms: int, gate_up_stream_k: bool = True, down_split: int | None = None,
         gate_up_split: int | None = None) -> tuple[int, int, int, int, int]:
    """(sk_a, ctas_a, sk_b, ctas_b, counter words) of one launch on ``sms`` SMs: gate_up's 2I/256 tiles
    whole (sk_a = 0; the CTAs past them go straight to down), or stream-K over all SMs, or over
    ``gate_up_split`` CTAs a tile (the others go straight to down, whose first stages' weight they
    load while gate_up runs); down's ceil(H/256) tiles stream-K over all SMs, or over ``down_split``
    CTAs a tile; the counters (schedule.launch_plan's) and the two counts."""
    tiles_a, tiles_b = inter // 128, -(-hidden // 256)
    stream_k = gate_up_stream_k or gate_up_split is not None
    sk_a = tiles_a if stream_k else 0
    ctas_a = sms if gate_up_split is None else min(sms, gate_up_split * tiles_a)
    ctas_b = sms if down_split is None else min(sms, down_split * tiles_b)
    if (stream_k and sk_a * (hidden // 128) < ctas_a) or tiles_b * (inter // 128) < ctas_b:
        raise ValueError(f"decode_mlp: {hidden}x{inter} has fewer k tiles than the {sms} SMs")
    return sk_a, ctas_a, tiles_b, ctas_b, max(sk_a, tiles_b) + 3


def decode_mlp(x, x_scale, gate_up_weight, gate_up_scale, down_weight, down_scale, *,
               act: str = formats.ACTIVATIONS[0],
               gate_up_stream_k: bool = True, gate_up_split: int | None = None, down_split: int | None = None,
               pdl: bool = False, out=None,
               h_out=None, trace=None, fixup_unroll: int = 1):
    """y bf16 [M, H] = down(act(x @ gate^T) · (x @ up^T)) in one launch, for M ≤ 16 quantized tokens
    (x e4m3 [M, H] and x_scale [M, H/128] as quant_x writes them), gate_up's weight tile-major
    (fp8_layout) and down's in packed order, both fp8_block128. ``out``: y written into it;
    ``h_out``: (h e4m3 [M, I], h_scale [M, I/128] M-major), the buffers h goes through (the tests
    read it), else new ones. ``gate_up_stream_k``, ``gate_up_split``, ``down_split``, ``pdl``: plan()'s and the launch's
    options. ``trace``: an int64 [SMs, 8] tensor that receives the timeline (TRACE_POINTS; a kernel
    compiled with the stamps). ``fixup_unroll``: both configs' TileConfig.fixup_unroll."""
    import torch

    from . import compile_cache
    from .schedule import sm_count, stream_k_counters

    m, hidden = x.shape
    inter = gate_up_weight.shape[0] // 2
    if not 1 <= m <= MAX_M:
        raise ValueError(f"decode_mlp: x has {m} rows; the one-launch MLP takes 1 to {MAX_M}")
    if hidden % 128 or inter % 128:
        raise ValueError(f"decode_mlp: H = {hidden} and I = {inter} must be multiples of 128")
    gu, dn = (dataclasses.replace(c, fixup_unroll=fixup_unroll) for c in mlp_configs(act, pdl))
    traced = trace is not None
    fn = compile_cache.get("decode_mlp", (gu, dn, traced), lambda: compile_decode_mlp(gu, dn, traced))
    sms = sm_count(x.device)
    sk_a, ctas_a, sk_b, ctas_b, words = plan(m, hidden, inter, sms, gate_up_stream_k, down_split, gate_up_split)
    stream = torch.cuda.current_stream(x.device)
    if h_out is None:
        h = torch.empty((m, inter), dtype=torch.float8_e4m3fn, device=x.device)
        hs = torch.empty((inter // 128, m), dtype=torch.float32, device=x.device).t()
    else:
        h, hs = h_out
    y = torch.empty((m, hidden), dtype=torch.bfloat16, device=x.device) if out is None else out
    parts = torch.empty(sms * 2 * ACC_VALUES * 128, dtype=torch.float32, device=x.device)
    ctr = stream_k_counters(x.device, words, stream)
    ptr = compile_cache.ptr
    f8, f32 = cutlass.Float8E4M3FN, Float32
    fn(ptr(f8, x, 16), ptr(f8, gate_up_weight, 16), ptr(f32, x_scale, 4), ptr(f32, gate_up_scale, 4),
       ptr(f8, h, 16), ptr(f32, hs, 4), ptr(f8, down_weight, 16), ptr(f32, down_scale, 4),
       ptr(cutlass.BFloat16, y, 16), ptr(f32, parts, 4), ptr(Int32, ctr, 4),
       ptr(cutlass.Int64, parts if trace is None else trace, 8),
       Int32(m), Int32(hidden // 128), Int32(inter // 128), Int32(sms), Int32(sk_a), Int32(ctas_a), Int32(sk_b), Int32(ctas_b),
       Int32(words),
       cuda.CUstream(stream.cuda_stream))
    return y
