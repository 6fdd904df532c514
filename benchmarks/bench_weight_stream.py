"""How fast can P SMs stream an fp8 weight [N, K] from HBM in the gate_up kernel's access pattern
(256-row × 128-byte tiles, each program walking K for its weight tiles), and does the memory
layout of the weight matter (GPU, Triton)?

    row-major     W[N, K] as the packed checkpoint stores it: a tile is 256 runs of 128 bytes,
                  8 KB (K = 8192) apart
    tile-major    W as [N/256, K/128, 256, 128]: a tile is one contiguous 32 KB run

Each program takes work items (a tile and a share of its k tiles, as stream-K deals them out, so
that every program has work) and xors them into one value (kept, so that nothing is optimized
away). Reported: µs per pass (median of CUDA-event-timed CUDA-graph replays, operands rotated
past L2) and TB/s. A plain copy (`torch.Tensor.copy_`) of the same bytes is the yardstick (the roofline floor of
bench_gate_up.py uses its rate, 2.96 TB/s).

    python -m benchmarks.bench_weight_stream [--shapes 8192x3584,4096x14336] [--programs 56,112,132]
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from benchmarks.harness import graph_time_us


@triton.jit
def _stream(w_ptr, out_ptr, n_tiles, k_tiles, k_split, K, TILE_MAJOR: tl.constexpr, ROWS: tl.constexpr,
            COLS: tl.constexpr, STAGES: tl.constexpr):
    # work item i = (tile i // k_split, k tiles [c·chunk, (c + 1)·chunk) with c = i % k_split), as
    # stream-K deals out a tile's k tiles, so that every program has work even with few tiles
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    chunk = tl.cdiv(k_tiles, k_split)
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, COLS)
    acc = tl.zeros((ROWS, COLS), dtype=tl.int32)  # 4 weight bytes per element
    for i in range(pid, n_tiles * k_split, progs):
        t = i // k_split
        k0 = (i % k_split) * chunk
        for kt in tl.range(k0, tl.minimum(k0 + chunk, k_tiles), num_stages=STAGES):
            if TILE_MAJOR:
                base = (t * k_tiles + kt).to(tl.int64) * (ROWS * COLS)
                offs = base + rows[:, None] * COLS + cols[None, :]
            else:
                offs = (t * ROWS + rows[:, None]).to(tl.int64) * K + kt * COLS + cols[None, :]
            acc ^= tl.load(w_ptr + offs)
    tl.store(out_ptr + pid, tl.sum(acc))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="8192x3584,4096x14336", help="HxI: W = packed gate_up [2I, H]")
    p.add_argument("--programs", default="56,112,132")
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--cols", type=int, default=128, help="bytes of K per row of a tile")
    p.add_argument("--stages", type=int, default=4, help="loads in flight per program (Triton's pipelining)")
    a = p.parse_args()
    for shape in a.shapes.split(","):
        hidden, inter = map(int, shape.split("x"))
        n, k = 2 * inter, hidden
        rot = max(2, -(-200_000_000 // (n * k)))  # rotate past the 50 MB L2
        ws = [torch.randint(0, 255, (n, k), dtype=torch.uint8, device="cuda").view(torch.int32) for _ in range(rot)]
        cols = a.cols // 4  # int32 words
        tiled = [w.view(n // a.rows, a.rows, k // a.cols, cols).permute(0, 2, 1, 3).contiguous() for w in ws]
        dst = torch.empty_like(ws[0])
        mb = n * k / 1e6
        copy_us = graph_time_us(lambda: [dst.copy_(w) for w in ws], 30, reps=1) / rot
        # a copy moves 2× the bytes: its rate is read + write bytes over time
        print(f"{hidden}x{inter}: W {mb:.1f} MB; copy {copy_us:.1f} µs ({2 * mb / copy_us:.2f} TB/s read+write)")
        for progs in map(int, a.programs.split(",")):
            out = torch.empty(progs, dtype=torch.int32, device="cuda")
            split = -(-progs // (n // a.rows))  # k chunks per tile: at least one work item per program
            for name, bufs, tile_major in (("row-major", ws, False), ("tile-major", tiled, True)):
                def run(bufs=bufs, tile_major=tile_major):
                    for w in bufs:
                        _stream[(progs,)](w, out, n // a.rows, k // a.cols, split, k // 4, TILE_MAJOR=tile_major,
                                          ROWS=a.rows, COLS=cols, STAGES=a.stages, num_warps=8)
                us = graph_time_us(run, 30, reps=1) / rot
                print(f"  {progs:4d} programs ({split} k chunks per tile) {name:>10}: {us:6.1f} µs  {mb / us:.2f} TB/s",
                      flush=True)


if __name__ == "__main__":
    main()
