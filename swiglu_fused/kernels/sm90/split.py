"""The split projection on sm_90a (Flux.2's single-stream ``to_qkv_mlp_proj``): one GEMM over the
packed weight [P + 2I, K] (formats.SPLIT: P plain rows, then gate/up interleaved in 128-row chunks)
whose epilogue stores the prefix columns as they are and reduces the pairs to h = act(gate)·up,
both bf16, into one output [M, P + I] = [y | h] (ground truth: reference.gate_up_split):

    N tile t < T = ceil(P / 256)   weight rows [256t, 256t + 256)      → y columns [256t, 256t + 256) ∩ [0, P)
    N tile t ≥ T                    weight rows P + 256(t - T) + [0, 256) → h columns 128(t - T) + [0, 128)

so the 2I-wide gate/up intermediate never reaches memory and no concatenation follows: the
consumer (diffusers' processor) splits the output at P with views. When P is a multiple of 256 the
tiles are gate_up's exactly; when P = 128 mod 256 the pair tiles start 128 rows before the tile
grid (their weight blocks and scale rows shifted by one: _w_block), the last prefix tile's second
half is pair rows that are computed and not stored, and B arrives in two 128-row TMA boxes a stage.
Operands as gate_up's (mainloops bf16, fp8_block128 with quant_x's x and x_scale, and nvfp4 with
bf16 x and the global scales [3]: prefix, gate, up, the prefix's applied to both halves of a prefix
tile; nvfp4 takes P a multiple of 256 only). P is a compile-time constant (SplitConfig): one model
has one P.

SplitKernel is GemmKernel with five hooks replaced: the output tensors (y and h views of one
buffer), the weight tile's row offset and its B loads, nvfp4's global scale per tile, and the epilogue (prefix tiles: the rounded accumulator
staged and copied out per 128-column half; pair tiles: the gated epilogue into h).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32

from .gemm import GemmKernel, launch, weight_operands
from .kernel_host import compile_kernel
from .ptx import cvt_bf16x2
from .tile_config import HALF_N, SplitConfig  # noqa: F401 (SplitConfig: this kernel's config)


class SplitKernel(GemmKernel):

    def _out_tensors(self, out_ptr, aux_ptr, m, n_units, n_tiles):
        """y = the output's first P columns and h = its last I, as 32-bit words (rows of (P + I) / 2
        words; P and I multiples of 128)."""
        p_words = self.cfg.prefix // 2
        h_words = cute.assume(n_tiles * (HALF_N // 2) - self.cfg.prefix_tiles * (HALF_N // 2), divby=HALF_N // 2)
        row_words = cute.assume(h_words + p_words, divby=HALF_N // 2)
        out = cute.recast_ptr(out_ptr, dtype=Int32)
        mY = cute.make_tensor(out, cute.make_layout((m, p_words), stride=(row_words, 1)))
        mH = cute.make_tensor(out + p_words, cute.make_layout((m, h_words), stride=(row_words, 1)))
        return mY, mH

    def _pair_tile(self, tn):
        """1 where N tile tn is a pair tile (tn ≥ prefix_tiles), 0 for a prefix tile: an integer,
        without a branch (plain Python, inlined)."""
        return cutlass.min(cutlass.max(tn - self.cfg.prefix_tiles + 1, 0), 1)

    @cute.jit
    def _w_block(self, tn):
        """Pair tiles start prefix_shift rows early: one 128-row block before 2·tn."""
        b = 2 * tn
        if cutlass.const_expr(self.cfg.prefix_shift):
            b = b - self._pair_tile(tn)
        return b

    def _load_b(self, loads, tn, kt, stage, bar, hint_b):
        """One box of 256 rows, or (prefix_shift) the tile's two 128-row blocks from _w_block."""
        if cutlass.const_expr(not self.cfg.prefix_shift):
            return GemmKernel._load_b(self, loads, tn, kt, stage, bar, hint_b)
        b = self._w_block(tn)
        for j in range(2):
            cute.copy(loads.tma_b, loads.tBgB[(None, b + j, kt)], loads.tBsB[j][(None, stage)], tma_bar_ptr=bar,
                      **hint_b)

    def _nvfp4_scale(self, acc, mGS, tn):
        """nvfp4's global scales (mGS: prefix, gate, up): a prefix tile's by mGS[0] in both halves,
        a pair tile's by mGS[1] (gate) and mGS[2] (up)."""
        pair = self._pair_tile(tn)
        self._scale_halves(acc, mGS, lambda b, half: half, index=(pair, 2 * pair))

    @cute.jit
    def _row_epilogue(self, acc, n_vals: cutlass.Constexpr, r0, col0, tm, tn, sO, gmem, storage, h_store, tidx,
                      wg_idx):
        if tn < self.cfg.prefix_tiles:
            self._epilogue_prefix(acc, n_vals, r0, col0, tm, tn, gmem.m, sO, gmem.mOut, wg_idx - 1, tidx % 128)
        else:
            self._epilogue_gated(acc, n_vals, r0, col0, tm, tn - self.cfg.prefix_tiles, gmem.m, sO, gmem.mAux,
                                 gmem.mAux, wg_idx - 1, tidx % 128, h_store)

    @cute.jit
    def _epilogue_prefix(self, acc, n_vals: cutlass.Constexpr, r0, col0, tm, tn, m, sY, mY, wg, tid):
        """y = acc rounded to bf16, half by half (columns [256·tn + 128·half, +128)), staged through
        the warpgroup's slab and copied out; a half at or past P (the last prefix tile's second
        half when P = 128 mod 256) is pair rows and is not stored."""
        bar = pipeline.NamedBarrier(barrier_id=1 + wg, num_threads=128)
        for half in cutlass.range_constexpr(2):
            if 2 * tn + half < self.cfg.prefix // HALF_N:
                bar.arrive_and_wait()  # the previous copy-out of this slab is done
                for v in cutlass.range_constexpr(0, n_vals, 2):
                    c2 = (col0 + 8 * (v // 4)) // 2  # 32-bit word (bf16 pair) in the slab row
                    r = r0 + 8
                    if cutlass.const_expr((v // 2) % 2 == 0):
                        r = r0
                    sY[r, c2] = cvt_bf16x2(acc[(v, 0, half)], acc[(v + 1, 0, half)])
                bar.arrive_and_wait()
                self._copy_slab(sY, mY, tm, 2 * tn + half, m, Int32(0), wg, tid, False)


def compile_split(config: SplitConfig):
    """Compile for sm_90a (no GPU needed)."""
    return compile_kernel(config, cutlass.BFloat16, Float32, 4, SplitKernel)


def gate_up_split(config: SplitConfig, x, weight, weight_scale=None, x_scale=None, global_scale=None, *, out=None):
    """Run the kernel (operands validated by ops.py): [y | h] bf16 [M, P + I]; ``out`` writes into
    a given tensor of that shape (the tests poison it first). nvfp4: ``global_scale`` the fp32
    multipliers [3] (prefix, gate, up)."""
    import torch

    from . import compile_cache

    m, n = x.shape[0], weight.shape[0]
    cols = config.prefix + (n - config.prefix) // 2
    if out is None:
        out = torch.empty((m, cols), dtype=torch.bfloat16, device=x.device)
    if m == 0:
        return out
    config.check_k(x.shape[1], "gate_up_split")
    fn = compile_cache.get("gate_up_split", config, lambda: compile_split(config))
    weight, scales = weight_operands(config, weight, weight_scale, x_scale, global_scale)
    launch(fn, config, x, weight, *scales, out, cutlass.BFloat16, None, Float32, 4)
    return out
