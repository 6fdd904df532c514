"""Schedule benchmark: the same sm90 kernels (gate_up fp8, down fp8) run with whole tiles only
against the stream-K schedule schedule.plan picks, and stream-K with its workspace preallocated
(isolates the per-call counter memset). Inputs rotated past L2, CUDA graphs (benchmarks/harness.py).

    python -m benchmarks.bench_schedule [--shapes 4096x14336,8192x3584] [--m 16,256,1024] [--json out.json]
"""

from __future__ import annotations

import argparse
from unittest import mock

import torch

from benchmarks import harness as b
from swiglu_fused import quant
from swiglu_fused.kernels import reference
from swiglu_fused.kernels.sm90 import down as kd, gate_up as kg, gemm, schedule


def whole_tiles(tiles, k_tiles, sms, *_, **__):
    return min(tiles, sms), 0


def preallocated(real):
    """launch_plan with one workspace and one counter tensor reused (the kernel re-zeroes counters)."""
    cache = {}

    def plan(config, m, n, k, device):
        key = (config, m, n, k)
        if key not in cache:
            cache[key] = real(config, m, n, k, device)
        return cache[key]

    return plan


def time_variants(fn, iters):
    out = {}
    with mock.patch.object(schedule, "plan", whole_tiles):
        out["whole"] = b.graph_time_us(fn, iters)
    out["stream_k"] = b.graph_time_us(fn, iters)
    with mock.patch.object(gemm, "launch_plan", preallocated(gemm.launch_plan)):
        out["stream_k_prealloc"] = b.graph_time_us(fn, iters)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="4096x14336,8192x3584")
    p.add_argument("--m", default="1,16,64,256,1024")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    rows = []
    print(f"{'op':>7} {'M':>6} {'H':>6} {'I':>6} {'tiles':>6} {'sk_tiles':>8} {'whole us':>9} {'sk us':>8} "
          f"{'sk prealloc':>11} {'whole/sk':>8}")
    for shape in a.shapes.split(","):
        hidden, inter = map(int, shape.split("x"))
        for m in map(int, a.m.split(",")):
            sets = b.rotation(lambda s: b.operands(m, hidden, inter, seed=s), 2 * inter * hidden)
            xq, xs, wq, ws = sets[0]
            cfg = b.gate_up_config(xq, wq, ws, xs, act="silu", h_format="fp8_group128")
            fn = b.cycling(lambda x, xs_, w, ws_: kg.gate_up(cfg, x, w, ws_, xs_), sets)
            tiles = -(-m // cfg.tile_m) * (2 * inter // 256)
            t = time_variants(fn, a.iters)
            rows.append(dict(op="gate_up", m=m, hidden=hidden, inter=inter, tiles=tiles,
                             sk_tiles=gemm.launch_plan(cfg, m, 2 * inter, hidden, xq.device)[1], **t))
            del sets

            def down_set(seed):
                g = torch.Generator(device="cuda").manual_seed(seed)
                w = torch.randn(hidden, inter, device="cuda", generator=g) * 0.05
                hq, hs = reference.quant_x(torch.randn(m, inter, device="cuda", generator=g).to(torch.bfloat16))
                return (hq, hs, *quant.quantize_fp8_block(w))

            dsets = b.rotation(down_set, hidden * inter)
            hq, hs, wq, ws = dsets[0]
            dcfg = b.down_config(hq, wq, ws, hs, None, torch.bfloat16)
            fn = b.cycling(lambda h, hs_, w, ws_: kd.down(dcfg, h, w, ws_, hs_), dsets)
            tiles = -(-m // dcfg.tile_m) * -(-hidden // 256)
            t = time_variants(fn, a.iters)
            rows.append(dict(op="down", m=m, hidden=hidden, inter=inter, tiles=tiles,
                             sk_tiles=gemm.launch_plan(dcfg, m, hidden, inter, hq.device)[1], **t))
            del dsets
            for r in rows[-2:]:
                print(f"{r['op']:>7} {m:>6} {hidden:>6} {inter:>6} {r['tiles']:>6} {r['sk_tiles']:>8} "
                      f"{r['whole']:>9.1f} {r['stream_k']:>8.1f} {r['stream_k_prealloc']:>11.1f} "
                      f"{r['whole'] / r['stream_k']:>8.2f}", flush=True)
    if a.json:
        b.write_json(a.json, bench="schedule", rows=rows)


if __name__ == "__main__":
    main()
