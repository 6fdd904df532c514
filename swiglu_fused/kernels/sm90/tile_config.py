"""Compile-time configuration of the sm_90a GEMM (gemm.py) and the constants it is built on.

TileConfig is the mainloop part of a configuration: tile shape, stages, mainloop, and the tile
variants (swap-AB, cluster pairs along M or K, split_n, smem_scales, L2 hints). GateUpConfig
(gate_up.py's kernel) and DownConfig (down.py's) add the epilogue. A config is frozen: it is the
compile-cache key, what a benchmark prints and what an error names. Which config runs a call is
kernels/dispatch.py's choice.
"""

from __future__ import annotations

from dataclasses import dataclass

from ... import formats
from ...quant import FP8_MAX  # noqa: F401 (the kernels' name for it)
from . import activations_and_h


# formats.FP8_BLOCK (128) under the name of each thing it sizes here (all equal, by design):
W_BLOCK = formats.FP8_BLOCK  # rows and K columns of a weight-scale block (one fp32 weight_scale)
HALF_N = W_BLOCK  # weight rows of a tile half (gate or up; 256-row tile = 2 halves): h columns a tile
INTERLEAVE = HALF_N  # gate_up's packed weight: chunks of this many gate rows, then as many up rows
H_GROUP = formats.FP8_BLOCK  # h columns that share one h_scale (fp8 h)
ACC_VALUES = 64 * 2 * HALF_N // 128  # fp32 accumulator values per consumer thread (64 rows × 256 / 128)
SMEM_BYTES = 227 * 1024
# the mainloops, named by the weight format they implement (formats.WeightFormat.sm90_kernels)
FP8_MAINLOOP, BF16_MAINLOOP, NVFP4_MAINLOOP = formats.FP8Block128.name, formats.BF16.name, formats.NVFP4.name
MAINLOOPS = (FP8_MAINLOOP, BF16_MAINLOOP, NVFP4_MAINLOOP)
NVFP4_GROUP = formats.NVFP4_GROUP  # K columns per e4m3 weight scale of an nvfp4 weight
NVFP4_K_ALIGN = 64  # nvfp4's K: a multiple of its k tile (a row's scales of a k tile: one 32-bit word)
DECODE_BUFFERS = (1, 2)  # nvfp4: bf16 weight k tiles in smem (TileConfig.decode_buffers)
Y_SLAB_COLS = (128, 64)  # down: y columns a staging slab holds (TileConfig.y_slab_cols)
N_ALIGN = 8  # weight rows (N) must be a multiple of this: 16-byte rows of a bf16 output
# TMA cache_policy operands (CUTLASS's CacheHintSm90 encodings) and TileConfig.l2_hint's values
EVICT_FIRST = 0x12F0000000000000
EVICT_LAST = 0x14F0000000000000
L2_HINTS = ("", "w_first", "w_first_x_last")
# tokens (tile_m) that only nvfp4's 128-row register-sourced tiles take (TileConfig.nvfp4_half_rows):
# with one 64-row block a warpgroup their accumulator holds up to 256 tokens (the wgmma's widest N) in the
# registers a 256-row tile's holds 128 in
NVFP4_HALF_ROWS_TILE_M = (224, 240, 256)
TILE_N_GRANULES = (192, 224)  # TileConfig.tile_n of the granule tiles (96 and 112 h columns)
# the three-consumer-warpgroup tile's rows: 192 × 256 reads fewer smem bytes per flop than 128 × 256
# (the TMA writes of A and B are shared by three warpgroups' wgmma instead of two)
TILE_M_WG3 = 192
GRANULE = 16  # gate (and up) rows per TMA box: 16 divides 96, 112 and INTERLEAVE, so no box straddles a chunk


def mainloop_tile_k(mainloop: str) -> int:
    """K columns a k tile of ``mainloop`` (TileConfig.tile_k): 128 bytes of K per row, one 128B-swizzle
    atom (fp8: 128 columns; bf16 and nvfp4's decoded bf16: 64)."""
    return 128 if mainloop == FP8_MAINLOOP else 64


@dataclass(frozen=True)
class TileConfig:
    """Mainloop part of a compile-time configuration; subclasses name the epilogue."""

    # 128 (prefill: 2 consumer warpgroups) or 64 (decode: 1); swap-AB: 16, 32 or 64 tokens (nvfp4 also
    # every multiple of 16 to 160, and 192: DISPATCH D31, D32, D62-D64; 56 and 72 do not compile,
    # 176 spills); 192 (three consumer warpgroups: the bf16 mainloop's whole-tile
    # prefill tile, TILE_M_WG3)
    tile_m: int = 128
    # weight rows per tile: 256 = two 128-row halves (h columns [128n, 128n + 128)), or 192 / 224
    # (bf16 mainloop, bf16 h, 128-row tile: TILE_N_GRANULES): 6 / 7 granules of 16 gate + 16 up rows,
    # h columns [96n, 96n + 96) / [112n, 112n + 112), where whole waves of them are shorter
    # (dispatch.granule_tile_n)
    tile_n: int = 256
    stages: int = 4
    mainloop: str = "fp8_block128"
    promote_k: int = 128  # fp8: K elements per wgmma chain before promotion into the fp32 accumulator
    swap_ab: bool = False  # tokens on the wgmma N side, weights on its M side (swap_ab.py): decode tiles
    # fp8 with one consumer warpgroup (tile_m = 64): promote each 64-column quarter while the next
    # quarter's wgmma runs (two temps). False: the v1 schedule (benchmarks compare them). No effect
    # elsewhere: the 128-row tile's second warpgroup hides the promotion, swap_ab has its own temps.
    overlap: bool = True
    # CTAs per cluster along M (1 or 2): the CTAs of a cluster take M-adjacent tiles of the same weight
    # tile, each loads half of its weight k tiles and TMA multicasts it to both (half the L2
    # traffic for weights). Whole tiles only (no stream-K); the M tiles are padded to a multiple.
    cluster_m: int = 1
    # CTAs per cluster along K (1, 2 or 4; 2: swap-AB tiles, and the 64-row tile with 3 stages, not
    # dispatched: DISPATCH D23; 4: swap-AB tiles, fp8 down's dispatched, D37): every tile is split in
    # K parts run by the CTAs of a cluster, and the others send their fp32 accumulators into the
    # first's shared memory (st.async, DSMEM), which adds them in rank order and runs the epilogue.
    # More CTAs streaming weights at decode, without stream-K's global partials and counters.
    # One tile per cluster: the grid is exactly cluster_k · tiles (≤ the SM count; schedule()).
    cluster_k: int = 1
    # Programmatic dependent launch (DISPATCH D20): the kernel is launched with the programmatic
    # stream-serialization attribute, so its CTAs may be placed while the previous kernel on the
    # stream finishes. The producer issues its first stages' weight loads (constant across launches;
    # a tile-major nvfp4 weight: L2 prefetches of its first 2 · stages k tiles instead, not
    # dispatched yet) and then griddepcontrol.wait, which returns once that kernel is complete and
    # its writes visible; every other global access, the consumers' included, comes after a wait.
    # The producer lets the next kernel launch (launch_dependents) once it has issued its last load.
    pdl: bool = False
    # CTAs an SM the kernel is compiled for (nvvm.minctasm; 0: none). Without it ptxas sizes the
    # registers by need and, where that is below the cap, drops setmaxnreg (warning C7508): the
    # swap-AB tiles run every warp at 95 (nvfp4) or 231 (fp8) registers. With 1 it takes the cap at
    # entry (168 for 384 threads) and keeps setmaxnreg. Dispatched for nvfp4's register-sourced tiles
    # of 48-96 tokens (DISPATCH D65: 1.5-12 % faster there); elsewhere measured level or slower
    # (history/nvfp4.md v22-v23, v43).
    ctas_per_sm: int = 0
    # gate_up's 64/128-row tiles: each warpgroup's h slab leaves smem by a TMA store (issued by one
    # thread, asynchronous: the warpgroup goes on to its next tile while the TMA unit writes, rows
    # ≥ M clipped by the tensor map) instead of the threads' 16-byte copy-out (which the swap-AB
    # tiles and the linear epilogue always use). Correct (GPU tests: bit-identical h) but off
    # (the TMA unit also serves the producer's loads): DISPATCH D22.
    tma_store: bool = False
    # the 128-row fp8 tile: the producer warp stages each k tile's promotion scales (the tile's 128
    # A-row scales and its 2 weight-block scales) in smem beside the stage, and the consumers read
    # them there instead of from global memory (as cuBLAS's block-scaled kernel does); the stage's
    # full barrier takes a second arrival for them. Dispatched for gate_up with fp8 h (DISPATCH
    # D13); with bf16 h its 4 stages leave no room for the scales.
    smem_scales: bool = False
    # the fp8 64-row gate_up tile with two consumer warpgroups instead of one: warpgroup w runs B
    # half w (gate, up) over all 64 rows in N = 128 chains, double-buffered; the up warpgroup hands
    # its accumulator to the gate one through smem for the epilogue. The one-warpgroup tile uses
    # N = 64 chains (its registers hold no more), whose SS operands take all of smem's 128 B/clk
    # at the tensor pipe's rate. Whole tiles, unless split_n_sk.
    split_n: bool = False
    # split_n with the stream-K fix-up compiled in, so that plan() may split its tiles over K (the
    # whole tiles of a long K over few of them leave SMs idle: DISPATCH D57)
    split_n_sk: bool = False
    # split_n: k tiles per run of back-to-back wgmma chains (2 temps alternate; each chain is
    # promoted while the next runs, the last one of a run with the tensor pipe idle)
    split_unroll: int = 2
    # split_n: the up half's accumulator is handed over in this many parts through a buffer of
    # 1/parts of it (32 KB / parts of smem: with 2, a fifth stage fits)
    xacc_parts: int = 1
    # L2 eviction priority the producer's TMA loads ask for (cache_policy operand): "" none (normal);
    # "w_first" the weight k tiles evict_first (each is read by the few CTAs of its M tiles, then
    # never again in this kernel), so the activations and the lines the previous kernels wrote stay;
    # "w_first_x_last" also the activation k tiles (read by every N tile) evict_last
    l2_hint: str = ""
    # the bf16 mainloop over an nvfp4 weight that nvfp4_dequant.py turned into bf16 (code · scale ·
    # 2^-62, exact) for this call, then the accumulator times the global scales · 2^62 per half, as
    # the nvfp4 mainloop ends: prefill of nvfp4 weights (dispatch_nvfp4.nvfp4_dequantizes)
    dequantized: bool = False
    # nvfp4: the packed weight and its scale words in tile-major order (nvfp4.tile_major: each
    # 256-row × 64-column k tile's 8 KB of codes and 1 KB of scale words contiguous), so that a k
    # tile is one contiguous TMA box and its scales one contiguous run, instead of 32-byte row
    # pieces and 4-byte words 2 KB apart (history/nvfp4.md; the modules hold it so: DISPATCH D27).
    # fp8: the weight's 256-row × 128-column k tiles contiguous (kernels/fp8_layout.py; its scales
    # keep their order), gate_up's and down's 256-row tiles (not the split projection's): measured,
    # not dispatched.
    tile_major: bool = False
    # nvfp4: bf16 k tiles the weight is decoded into. 2: tile kt + 1 is decoded while tile kt's
    # wgmma reads the other; 1 (the swap-AB tiles): each warpgroup waits for its wgmma of tile kt
    # before it decodes tile kt + 1, and the two warpgroups, no longer in step, decode in turn
    # (the 16-token tile: 1-7 % faster, DISPATCH D30)
    decode_buffers: int = 2
    # nvfp4's swap-AB tiles on a tile-major weight: each consumer thread decodes its own wgmma A
    # fragments into registers and the wgmma reads A there (register-sourced): no decode buffer in
    # smem, no proxy fence, no barrier a k tile. Thread t % 4 of a quad takes whole words (its rows'
    # scale group t % 4 of each k tile: 8 bytes and one scale a row), so the k order inside a k tile
    # is permuted and the activations must come in the same order (nvfp4_layout.rs_k_order). One
    # register set: decode_buffers = 1 (two, decoded under the warpgroup's own wgmma, measured
    # slower: history/nvfp4.md v28; DISPATCH D45).
    rs_decode: bool = False
    # rs_decode: the next k tile's packed words and scale words loaded from smem into registers while
    # this k tile's chain runs, so that the decode after the wait is arithmetic only (the same bits;
    # the 64-160-token tiles, DISPATCH D66: 2-8 % faster at M = 1024, slower on the 48-token tile)
    rs_prefetch: bool = False
    # rs_decode, gate_up: x comes by TMA in its natural order and producer warps 1-3 permute each stage
    # into rs_k_order in shared memory (one thread a row's 64-byte half: four 16-byte loads, four
    # stores, the 4 × 4 transpose of pairs in its registers) before the consumers read it, instead of
    # a copy of x a call in front of the kernel (nvfp4.py's _permute_x; the 32- and 48-token tiles and
    # the 64-token one where I ≤ 8192, DISPATCH D72: 1-4.5 % faster; on larger tiles the stage's extra
    # shared-memory traffic costs more)
    x_permute: bool = False
    # the fp8 128-row tile with smem_scales, as whole tiles whose k tiles are a whole number of rings
    # of stages (check_k refuses other K): the k loop steps a ring at a time with its stages
    # unrolled, so every stage index, barrier and wgmma descriptor is a compile-time offset
    # (mainloop._mainloop_fp8_halves_static; DeepGEMM's k loop is unrolled this way:
    # history/deepgemm.md; DISPATCH D34). The bf16 mainloop's form measured level and was taken out,
    # and so was down's tile with its scales from global memory (history/down.md).
    static_stages: bool = False
    # the wgmma's smem operands sliced by a warp-uniform index (the warpgroup's first thread), so that
    # their descriptors are built in uniform registers: no R2UR before each QGMMA (SASS: the static
    # fp8 k tile 196 -> 172 instructions; nvfp4's 128-token tile 36 -> 5 R2UR). Dispatched for the fp8
    # mainloop's gate_up (dispatch.uniform_ab_applies, D35); False: sliced by the thread's own index.
    uniform_ab: bool = False
    # the linear epilogue (down) of the 64/128-row tiles: the y columns a warpgroup stages through
    # its smem slab at a time: 128 (a tile half: the 128-row tile's slab is 34 KB) or 64 (a quarter:
    # 18 KB). With 64 the slab's room holds the 128-row tile's staged scales (smem_scales) beside four
    # stages, and so its static k loop (DISPATCH D36). (Storing y straight from registers, no slab,
    # measured slower where K is short: history/down.md.)
    y_slab_cols: int = HALF_N
    # stream-K's fix-up: the last CTA of a shared tile sums the others' partials this many at a time
    # (their loads in flight together; StreamKMixin). 4 took 1-2 µs off the one-launch decode MLP, whose
    # tiles have 8-16 contributors; on the fp8 tiles (2-5) it measured level, so they keep 1
    # (launch_ab --ab gate_up:fixup_unroll=4,down:fixup_unroll=4; history/mlp.md); nvfp4's down takes 4
    # on its 32-64-token tiles (DISPATCH D63)
    fixup_unroll: int = 1
    # stream-K's fix-up in two levels (StreamKMixin._fixup_groups): the last CTA of each group of about
    # sqrt(n) of a tile's n CTAs sums its group, the last group sums the group sums, so the last CTA reads
    # ~2·sqrt(n) partials, not n, through its SM's one L2 port (~125 GB/s), for a second arrival (~1.8 µs).
    # Where a tile is split 16-32 ways over K (nvfp4's down on a narrow H, partials of 49-131 KB) the
    # serial sum was most of the GEMM (1024×8192 M = 128: ~20 of 31 µs; DISPATCH D70). Deterministic too,
    # with other bits (another order of the fp32 additions)
    fixup_groups: bool = False

    # the epilogue and the bytes per element of the staged output (set by subclasses)
    epilogue = "gated"
    out_bytes = 2

    def __post_init__(self):
        name = type(self).__name__
        nvfp4_swap = (48, 80, 96, 112, 128, 144, 160, TILE_M_WG3, *NVFP4_HALF_ROWS_TILE_M) if self.nvfp4 else ()
        allowed = (16, 32, 64, *nvfp4_swap) if self.swap_ab else (64, 128, TILE_M_WG3)
        if self.tile_m not in allowed:
            raise ValueError(f"{name}.tile_m: expected one of {allowed} (swap_ab={self.swap_ab}), got {self.tile_m}")
        if self.tile_m in NVFP4_HALF_ROWS_TILE_M and self.swap_ab and not self.nvfp4_half_rows:
            raise ValueError(f"{name}.tile_m = {self.tile_m} tokens: only on nvfp4's 128-row tile (tile_n = {HALF_N}; "
                             f"a 256-row tile's accumulator would not fit in registers); got {self}")
        if self.tile_m == TILE_M_WG3 and not self.swap_ab and (
                self.mainloop != BF16_MAINLOOP or self.granules or self.cluster_size > 1 or self.tma_store):
            raise ValueError(f"{name}.tile_m = {TILE_M_WG3} is the bf16 mainloop's tile of 256 weight rows "
                             f"(no granules, clusters or tma_store); got {self}")

        if self.fixup_groups and (self.cluster_k > 1 or self.whole_tiles):
            raise ValueError(f"{name}.fixup_groups: only for stream-K tiles (not cluster_k > 1 nor whole tiles)")
        if self.fixup_unroll not in (1, 2, 4, 8):
            raise ValueError(f"{name}.fixup_unroll: expected 1, 2, 4 or 8 partials at a time, got {self.fixup_unroll}")
        if self.ctas_per_sm not in (0, 1, 2):
            raise ValueError(f"{name}.ctas_per_sm: expected 0 (none), 1 or 2, got {self.ctas_per_sm}")
        if self.cluster_m not in (1, 2) or (self.swap_ab and self.cluster_m != 1):
            raise ValueError(f"{name}.cluster_m: expected 1 or 2 (1 with swap_ab), got {self.cluster_m}")
        if (self.cluster_k not in (1, 2, 4) or (self.cluster_k == 2 and not (self.swap_ab or self.tile_m == 64))
                or (self.cluster_k == 4 and not self.swap_ab)):
            raise ValueError(f"{name}.cluster_k: expected 1, 2 or 4 (2 only with swap_ab or tile_m = 64, 4 only "
                             f"with swap_ab), got {self.cluster_k}")
        if self.tile_n not in (2 * HALF_N, *TILE_N_GRANULES) and not self.nvfp4_half_rows:
            raise ValueError(f"{name}.tile_n: expected {2 * HALF_N} (two 128-row weight blocks), one of "
                             f"{TILE_N_GRANULES} (16-row granules) or {HALF_N} (nvfp4's register-sourced down "
                             f"tile), got {self.tile_n}")
        if self.granules and (self.mainloop != BF16_MAINLOOP or self.out_bytes != 2 or self.epilogue != "gated"
                              or self.tile_m != 128 or self.swap_ab or self.cluster_size > 1 or self.tma_store):
            raise ValueError(f"{name}.tile_n = {self.tile_n} is the bf16 mainloop's 128-row gate_up tile with "
                             f"bf16 h (no swap_ab, clusters or tma_store); got {self}")
        if self.mainloop not in MAINLOOPS:
            raise ValueError(f"{name}.mainloop: expected one of {MAINLOOPS}, got {self.mainloop!r}")
        if self.nvfp4 and (self.cluster_size > 1 or self.tile_n not in (2 * HALF_N, HALF_N) or self.tma_store
                           or (self.epilogue == "gated" and self.out_bytes != 2)):
            raise ValueError(f"{name}: the nvfp4 mainloop runs 256-row tiles (128-row: nvfp4_half_rows) without "
                             f"clusters or tma_store, and gate_up writes bf16 h; got {self}")
        if self.tile_n == HALF_N and not (self.nvfp4 and self.swap_ab and self.rs_decode and self.tile_major):
            raise ValueError(f"{name}.tile_n = {HALF_N}: only nvfp4's register-sourced swap-AB tiles (one 64-row "
                             f"block a warpgroup, a tile-major weight); got {self}")
        if self.split_n and (self.tile_m != 64 or not self.fp8 or self.swap_ab or self.cluster_size > 1
                             or self.tma_store or self.epilogue != "gated" or self.tile_n != 2 * HALF_N):
            raise ValueError(f"{name}.split_n: the fp8 mainloop's 64-row gate_up tile only (no swap_ab, clusters "
                             f"or tma_store); got {self}")
        if self.split_n_sk and not self.split_n:
            raise ValueError(f"{name}.split_n_sk: the split_n tile's stream-K, so split_n too; got {self}")
        if self.xacc_parts not in (1, 2, 4) or (self.xacc_parts > 1 and not self.split_n):
            raise ValueError(f"{name}.xacc_parts: expected 1, 2 or 4 (more than 1 with split_n only), "
                             f"got {self.xacc_parts}")
        if self.split_unroll not in (1, 2, 3, 4, 6, 8):
            raise ValueError(f"{name}.split_unroll: expected 1, 2, 3, 4, 6 or 8 k tiles, got {self.split_unroll}")
        if self.smem_scales and (not self.fp8 or self.tile_m != 128 or self.swap_ab):
            raise ValueError(f"{name}.smem_scales: the fp8 mainloop's 128-row tile only; got {self}")
        if self.static_stages and not self.smem_scales:
            raise ValueError(f"{name}.static_stages: the fp8 128-row tile with smem_scales only; got {self}")
        if self.y_slab_cols not in Y_SLAB_COLS or (self.y_slab_cols != HALF_N and (self.epilogue != "linear"
                                                                                 or self.swap_ab)):
            raise ValueError(f"{name}.y_slab_cols: expected one of {Y_SLAB_COLS}, other than {HALF_N} only in the "
                             f"linear epilogue (down) of the 64/128-row tiles; got {self}")
        if self.tile_major and not (self.nvfp4 or (self.fp8 and self.tile_n == 2 * HALF_N
                                                   and self.b_box_rows == self.tile_n)):
            raise ValueError(f"{name}.tile_major: the nvfp4 mainloop's weight layout, or the fp8 mainloop's on "
                             f"whole 256-row tiles; got {self}")
        if self.decode_buffers not in DECODE_BUFFERS or (self.decode_buffers == 1 and not (self.nvfp4 and self.swap_ab)):
            raise ValueError(f"{name}.decode_buffers: 2, or 1 on the nvfp4 mainloop's swap-AB tiles; got {self}")
        if self.rs_decode and not (self.nvfp4 and self.swap_ab and self.tile_major and not self.uniform_ab
                                   and self.decode_buffers == 1):
            raise ValueError(f"{name}.rs_decode: the nvfp4 mainloop's swap-AB tiles on a tile-major weight, with "
                             f"decode_buffers = 1 (one register set) and without uniform_ab; got {self}")
        if self.rs_prefetch and not self.rs_decode:
            raise ValueError(f"{name}.rs_prefetch: only with rs_decode; got {self}")
        if self.x_permute and not (self.rs_decode and self.epilogue == "gated" and self.tile_m % 16 == 0
                                   and self.cluster_m == self.cluster_k == 1):
            raise ValueError(f"{name}.x_permute: only with rs_decode, in gate_up (the gated epilogue), tile_m a "
                             f"multiple of 16 (the permute's row groups), without clusters; got {self}")
        if self.l2_hint not in L2_HINTS:
            raise ValueError(f"{name}.l2_hint: expected one of {L2_HINTS}, got {self.l2_hint!r}")
        if self.dequantized and (self.mainloop != BF16_MAINLOOP or self.swap_ab or self.granules):
            raise ValueError(f"{name}.dequantized: the bf16 mainloop's 64/128-row tiles of 256 weight rows only; "
                             f"got {self}")
        if self.promote_k not in (32, 64, 128):
            raise ValueError(f"{name}.promote_k: expected 32, 64 or 128, got {self.promote_k}")
        if self.epilogue not in activations_and_h.EPILOGUES:
            raise ValueError(f"{name}.epilogue: expected one of {activations_and_h.EPILOGUES}, got {self.epilogue!r}")
        stage_bytes = self.x_stage_bytes + self.w_stage_bytes
        # output staging + the swap-AB amax exchange + the cluster_k accumulator + nvfp4's decoded
        # weight buffers + mbarriers (16 B a stage; 64 reserved)
        fixed = (self.out_stage_bytes + 4 * self.red_words + 4 * self.xacc_words + 4 * self.scale_words
                 + 2 * self.decode_elems + 64 * self.stages)
        if self.stages < 2 or self.stages * stage_bytes + fixed > SMEM_BYTES:
            raise ValueError(
                f"{name}.stages: {self.stages} stages of {stage_bytes} B plus {self.out_stage_bytes} B of "
                f"output staging do not fit in {SMEM_BYTES} B of shared memory "
                f"(at most {(SMEM_BYTES - fixed) // stage_bytes})"
            )

    @property
    def scale_words(self) -> int:
        """32-bit words of smem for scales the producer stages beside each stage: smem_scales, the
        tile_m + 2 promotion scales; nvfp4, the k tile's four e4m3 scales of each weight row."""
        if self.nvfp4:
            return self.stages * self.tile_n
        return self.stages * (self.tile_m + 2) if self.smem_scales else 4

    def check_k(self, k: int, op: str) -> None:
        """Refuses a K this config cannot run, before any GPU work: static_stages steps K a ring of
        stages at a time."""
        ring = self.stages * self.tile_k
        if self.static_stages and k % ring:
            raise ValueError(f"{op}: {self} steps K a ring of {ring} columns at a time, and K = {k} is not a "
                             f"multiple of that; use static_stages = False (kernels/dispatch.py does)")

    @property
    def acc_values(self) -> int:
        """fp32 values of a stream-K partial slot, a consumer thread's: its share of the tile_m × tile_n
        accumulator, at least ACC_VALUES (more only on nvfp4's 144- and 160-token tiles: 144 and 160)."""
        return max(ACC_VALUES, self.tile_m * self.tile_n // self.consumer_threads)

    @property
    def whole_tiles(self) -> bool:
        """Whether the tiles run whole (no stream-K: their epilogues have no fix-up)."""
        # (nvfp4's 192-token swap-AB tile: measured faster than the 128-token one only in whole waves, D32)
        return (self.granules or (self.split_n and not self.split_n_sk) or self.tile_m == TILE_M_WG3
                or self.static_stages)

    @property
    def nvfp4_half_rows(self) -> bool:
        """Whether the tile is half of a tile-major 256-row weight tile: 128 rows, one 64-row block a
        consumer warpgroup (nvfp4's register-sourced down tile, whose accumulator then holds twice the
        tokens of a 256-row tile's: the decode of a weight row serves more MMA)."""
        return self.tile_n == HALF_N and self.nvfp4

    @property
    def half_row_pairs(self) -> bool:
        """nvfp4_half_rows for gate_up: the CTA reads 64 gate rows and their 64 up rows (rows 64c.. and
        128 + 64c.. of 256-row tile tn // 2, c = tn % 2: two TMA boxes), and each consumer thread decodes a gate row as
        its A fragment's row g and the row's up row as g + 8, so that act(gate) · up stays in the
        thread (swap_ab.py) and the CTA writes h's 64 columns [64·tn, 64·tn + 64)."""
        return self.nvfp4_half_rows and self.epilogue == "gated"

    @property
    def granules(self) -> bool:
        """Whether the tile is 16-row gate/up granules (tile_n in TILE_N_GRANULES), not two 128-row halves."""
        return self.tile_n in TILE_N_GRANULES

    @property
    def b_box_rows(self) -> int:
        """Weight rows per TMA box of B: the whole tile, one 16-row granule (the granule tile), or a
        64-row quarter of a 256-row tile (half_row_pairs: its gate rows, then their up rows)."""
        if self.half_row_pairs:
            return HALF_N // 2
        return GRANULE if self.granules else self.tile_n

    @property
    def global_scales(self) -> int:
        """nvfp4 (and dequantized): fp32 global scale multipliers the kernel reads (gate and up;
        down: its one, as the ops get it: repeating it would be a copy, a kernel launch a call)."""
        return 1 if self.epilogue == "linear" else 2

    @property
    def nvfp4_weight(self) -> bool:
        """Whether the weight is nvfp4's (decoded in the mainloop, or dequantized for the call)."""
        return self.nvfp4 or self.dequantized

    @property
    def b_boxes(self) -> int:
        """TMA boxes of B per stage (each loaded by its own copy)."""
        return self.tile_n // self.b_box_rows

    @property
    def out_chunks(self) -> int:
        """16-byte chunks per row of a staged output slab: 128 columns, the granule tile's tile_n / 2, or
        down's y_slab_cols."""
        cols = self.y_slab_cols if self.epilogue == "linear" else self.tile_n // 2
        return cols * self.out_bytes // 16

    @property
    def h_tma_store(self) -> bool:
        """Whether h leaves through TMA stores (tma_store; the gated epilogue of the 64/128-row tiles)."""
        return self.tma_store and self.epilogue == "gated" and not self.swap_ab

    @property
    def out_row_words(self) -> int:
        """32-bit words per row of the smem staging slab: 128 output columns + 16 bytes of padding,
        so that a warp's 8 rows × 4 lanes of fragment stores hit distinct banks and rows stay
        16-byte aligned for the vector copy-out. With TMA stores no padding: the slab is 128-byte
        swizzled instead (GemmKernel._h_store_layout), which spreads those stores as well."""
        return HALF_N * self.out_bytes // 4 if self.h_tma_store else (self._slab_row_cols * self.out_bytes + 16) // 4

    @property
    def _slab_row_cols(self) -> int:
        """Columns a slab row has room for: 128 (the granule tiles' 96 / 112 too), 64 (half_row_pairs' h),
        or down's y_slab_cols."""
        if self.epilogue == "linear":
            return self.y_slab_cols
        return HALF_N // 2 if self.half_row_pairs else HALF_N

    @property
    def out_stage_bytes(self) -> int:
        return self.tile_m * self.out_row_words * 4

    @property
    def consumer_threads(self) -> int:
        """Three consumer warpgroups for the 192-row tile; two for the 128-row tile, the 64-token
        swap-AB tile (whose accumulator, 256 × 64 fp32, is too large for one), the split_n 64-row
        tile and every nvfp4 tile (one weight row each to decode per k tile); else one."""
        if self.tile_m == TILE_M_WG3 and not self.swap_ab:
            return 384
        return 256 if self.tile_m >= (64 if self.swap_ab else 128) or self.split_n or self.nvfp4 else 128

    @property
    def red_words(self) -> int:
        """fp32 words of smem for the swap-AB epilogue's cross-warp amax (consumer warps × tokens)."""
        return self.consumer_threads // 32 * self.tile_m if self.swap_ab else 4

    @property
    def xacc_words(self) -> int:
        """fp32 words of smem that receive the peer CTAs' accumulators (cluster_k > 1: the whole tile
        from each of the cluster_k - 1 others)."""
        if self.split_n:  # the up half's accumulator, handed to the gate half's warpgroup
            return HALF_N * self.tile_m // self.xacc_parts
        return (self.cluster_k - 1) * self.tile_n * self.tile_m if self.cluster_k > 1 else 4

    @property
    def cluster_size(self) -> int:
        return self.cluster_m * self.cluster_k

    @property
    def fp8(self) -> bool:
        return self.mainloop == FP8_MAINLOOP

    @property
    def nvfp4(self) -> bool:
        """W4A16: bf16 A, the weight e2m1 codes + e4m3 scales per 16 columns, decoded to bf16 in smem."""
        return self.mainloop == NVFP4_MAINLOOP

    @property
    def elem_bytes(self) -> int:
        """Bytes per element of A (and of the weight, but for nvfp4's packed one: w_stage_bytes)."""
        return 1 if self.fp8 else 2

    @property
    def x_row_bytes(self) -> int:
        """Bytes of one row of A's k tile in smem (128: the TMA box's 128-byte swizzle)."""
        return self.tile_k * self.elem_bytes

    @property
    def x_stage_bytes(self) -> int:
        """Bytes of one k tile of A (x, or h for down) in smem."""
        return self.tile_m * self.x_row_bytes

    @property
    def w_stage_bytes(self) -> int:
        """Bytes of one weight k tile in smem as TMA loads it (nvfp4: two codes a byte)."""
        return self.tile_n * self.tile_k // 2 if self.nvfp4 else self.tile_n * self.tile_k * self.elem_bytes

    @property
    def decode_elems(self) -> int:
        """bf16 elements of smem nvfp4 decodes its weight k tiles into (decode_buffers of them; the
        other mainloops have no such buffer)."""
        return self.decode_buffers * self.tile_n * self.tile_k if self.nvfp4 and not self.rs_decode else 0

    @property
    def tile_k(self) -> int:
        return mainloop_tile_k(self.mainloop)

    @property
    def k_align(self) -> int:
        """K must be a multiple of this: TMA's 16-byte row stride (nvfp4: a k tile's four scales
        of a row are one aligned 32-bit word)."""
        return NVFP4_K_ALIGN if self.nvfp4 else 16 // self.elem_bytes


@dataclass(frozen=True)
class GateUpConfig(TileConfig):
    """Compile-time configuration of gate_up (the cache key; benchmarks print it)."""

    act: str = "silu"
    h_format: str = "fp8_group128"
    # nvfp4's swap-AB tiles with bf16 h: h's columns leave in the k order a rs_decode down reads
    # (nvfp4_layout.rs_k_order of each 64 columns), so that h needs no reordering pass between them
    h_rs_order: bool = False

    epilogue = "gated"
    residual = False

    def __post_init__(self):
        activations_and_h.activation(self.act)
        if self.h_format not in activations_and_h.H_FORMATS:
            raise ValueError(f"GateUpConfig.h_format: expected one of {activations_and_h.H_FORMATS}, "
                             f"got {self.h_format!r}")
        if self.h_rs_order and not self.writes_h_rs_order:
            raise ValueError(f"GateUpConfig.h_rs_order: nvfp4's swap-AB tiles with bf16 h only; got {self}")
        super().__post_init__()

    @property
    def writes_h_rs_order(self) -> bool:
        """Whether this config can take h_rs_order (its epilogue then writes h in nvfp4_layout.rs_k_order):
        nvfp4's swap-AB tiles with bf16 h; elsewhere ops.gate_up reorders h after the kernel."""
        return self.nvfp4 and self.swap_ab and self.h_format == formats.NVFP4.h_format

    @property
    def h_spec(self) -> activations_and_h.HFormat:
        """How the epilogue stores h (activations_and_h.h_spec of the name h_format)."""
        return activations_and_h.h_spec(self.h_format)

    @property
    def out_bytes(self) -> int:
        return self.h_spec.bits // 8


@dataclass(frozen=True)
class DownConfig(TileConfig):
    """Compile-time configuration of down (the cache key; benchmarks print it)."""

    residual: bool = False  # y = h @ W^T + residual

    epilogue = "linear"
    out_bytes = 2  # bf16 y


@dataclass(frozen=True)
class SplitConfig(GateUpConfig):
    """Compile-time configuration of the split projection's GEMM (split.py): ``prefix`` plain rows
    (stored as bf16 y), then gate/up pairs reduced to bf16 h. P is compiled in (one model has one
    P: each width compiles once, then comes from the disk cache), so the tiles' row offsets are
    constants: with P a multiple of the 256-row tile, the weight tiles are gate_up's; with P = 128
    mod 256 the pair tiles start 128 rows earlier than the tile grid, and B arrives in two 128-row boxes."""

    prefix: int = 0

    def __post_init__(self):
        name = type(self).__name__
        if self.prefix <= 0 or self.prefix % HALF_N:
            raise ValueError(f"{name}.prefix: expected a positive multiple of {HALF_N} rows, got {self.prefix}")
        if (self.out_bytes != 2 or self.h_spec.scaled or self.granules or self.swap_ab or self.split_n
                or self.cluster_k > 1 or self.tma_store or self.smem_scales or (self.tile_major and self.fp8)):
            raise ValueError(f"{name}: the split GEMM runs the 64/128-row tiles of 256 weight rows with bf16 h "
                             f"(no granules, swap_ab, split_n, K pairs, tma_store, smem_scales or a tile-major fp8 "
                             f"weight); got {self}")
        if self.nvfp4_weight and (self.prefix % self.tile_n or self.tile_m < 128):
            raise ValueError(f"{name}: the nvfp4 split GEMM runs the 128/192-row tiles with the pair tiles on the "
                             f"256-row grid (prefix a multiple of {self.tile_n}); got {self}")
        if self.cluster_m > 1 and self.prefix % self.tile_n:
            raise ValueError(f"{name}.cluster_m: cluster pairs need the pair tiles on the 256-row grid (prefix a "
                             f"multiple of {self.tile_n}), got prefix {self.prefix}")
        super().__post_init__()

    @property
    def global_scales(self) -> int:
        """nvfp4: the prefix's, gate's and up's multipliers."""
        return 3

    @property
    def prefix_shift(self) -> int:
        """Rows the pair tiles start before the 256-row tile grid: 0 or 128."""
        return -self.prefix % self.tile_n

    @property
    def prefix_tiles(self) -> int:
        """N tiles of prefix rows (the last one half pair rows, unstored, when prefix_shift = 128)."""
        return -(-self.prefix // self.tile_n)

    @property
    def b_box_rows(self) -> int:
        return HALF_N if self.prefix_shift else self.tile_n
