"""The act·mul kernel (kernels/sm90/act_mul.py: packed y [M, 2I] bf16 → h [M, I] bf16, the second half
of bf16 gate_up on cuBLAS, DISPATCH D53) against the one-pass Triton kernel the benchmarks' unfused
pipelines use (swiglu_fused/bench.py) and torch's eager SiLU·up, same process, same inputs, operands
rotated past L2, CUDA graphs: µs and TB/s (y read once, h written once), the kernel's outputs checked
against the reference's epilogue first. The rate it reaches is what dispatch.ACT_MUL_BYTES_PER_US
models.

    python -m benchmarks.bench_act_mul [--shapes 3584,14336] [--m 256,640,1024,2048,4096] [--rounds 3]
                                       [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks.harness import write_json
from swiglu_fused import bench
from swiglu_fused.kernels import reference


def point(m: int, inter: int, iters: int, rounds: int) -> dict:
    from swiglu_fused.kernels.sm90 import act_mul

    nbytes = bench.act_quant_bytes(m, inter, fp8=False)
    sets = [torch.randn(m, 2 * inter, device="cuda").to(torch.bfloat16) for _ in range(max(2, 200_000_000 // nbytes))]
    want = reference.gate_up_epilogue(sets[0])[0].float()
    err = ((act_mul.act_mul(sets[0]).float() - want).norm() / want.norm()).item()
    if not err < 2e-3:
        raise RuntimeError(f"act_mul differs from the reference at M = {m}, I = {inter}: {err:.2e}")
    sets = [(y,) for y in sets]
    fns = {"ours": bench.cycling(act_mul.act_mul, sets), "eager": bench.cycling(bench.act_mul_bf16, sets)}
    if bench.triton is not None:
        fns["triton"] = bench.cycling(lambda y: bench.act_quant_triton(y, fp8=False), sets)
    t = {k: statistics.median(v) for k, v in bench.interleaved_us(fns, iters, rounds).items()}
    row = dict(m=m, inter=inter, bytes=nbytes, **{f"{k}_us": v for k, v in t.items()},
               **{f"{k}_tbps": nbytes / v / 1e6 for k, v in t.items()}, rel_err=err)
    print(f"{m:>6} {inter:>6} " + " ".join(f"{k} {v:7.2f} µs {nbytes / v / 1e6:5.2f} TB/s |" for k, v in t.items()),
          flush=True)
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="3584,14336", help="I values (h columns), comma-separated")
    p.add_argument("--m", default="256,640,1024,2048,4096")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    print(bench.require_gpu())
    rows = [point(m, int(i), a.iters, a.rounds) for i in a.shapes.split(",") for m in map(int, a.m.split(","))]
    write_json(a.json, rows=rows)


if __name__ == "__main__":
    main()
