"""Swap-AB decode tiles (kernels/sm90/swap_ab.py) against the 64-row tile: gate_up fp8, fp8 h,
decode M, each tile under forced schedules (whole tiles; stream-K split 2, 3, 4 ways) and under
what gemm256.plan picks. Every variant is first checked against reference.gate_up (dequantized h,
relative max error) on its first operand set; then timed like bench_gate_up (CUDA graphs, operands
rotated past L2, median). cuBLAS's block-scaled GEMM alone is the yardstick.

    python benchmarks/bench_swap_ab.py [--shapes 4096x14336,8192x3584,2048x8192] [--m 1,16,32] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys
from unittest import mock

import torch

sys.path.insert(0, ".")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gate_up as b  # noqa: E402
from swiglu_fused.kernels import reference  # noqa: E402
from swiglu_fused.kernels.sm90 import gate_up as kg, gemm256  # noqa: E402


def forced(split):
    def plan(tiles, k_tiles, sms, *_):
        return (tiles * split, tiles) if split > 1 else (min(tiles, sms), 0)
    return plan


def h_error(cfg, ops):
    xq, xs, wq, ws = ops
    h, hs = kg.gate_up(cfg, xq, wq, ws, xs)
    h_ref, hs_ref = reference.gate_up(xq, wq, ws, xs, act="silu", h_format="fp8_group128")
    deq = (h.float().view(h.shape[0], -1, 128) * hs[..., None]).view(h.shape)
    ref = (h_ref.float().view(h.shape[0], -1, 128) * hs_ref[..., None]).view(h.shape)
    return ((deq - ref).abs().max() / ref.abs().max()).item()


def variants(m, tiles, sms):
    out = [("tile64 plan", kg.GateUpConfig(tile_m=64, stages=5), None)]
    for tm, stages in ((16, 6), (32, 6)):  # shipped: kg.SWAP_TILES
        if m <= tm:
            cfg = kg.GateUpConfig(tile_m=tm, stages=stages)
            out.append((f"swap{tm} plan", cfg, None))
            for split in (1, 2, 3, 4):
                if tiles * split <= sms:
                    out.append((f"swap{tm} split{split}", cfg, split))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="4096x14336,8192x3584,2048x8192")
    p.add_argument("--m", default="1,16,32")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for shape in a.shapes.split(","):
        hidden, inter = map(int, shape.split("x"))
        for m in map(int, a.m.split(",")):
            sets = b.rotation(lambda s: b.operands(m, hidden, inter, seed=s), 2 * inter * hidden)
            try:
                gemm, _ = b.cublas_gemm(*sets[0])
                t_cublas = b.graph_time_us(b.cycling(gemm, sets), a.iters)
            except RuntimeError:  # cuBLAS's block-scaled GEMM takes no M = 1
                t_cublas = None
            floor = 2 * inter * hidden / 2.96e6  # µs at a plain copy's HBM rate
            print(f"M={m} {hidden}x{inter}: cuBLAS GEMM {t_cublas or float('nan'):.1f} µs, floor {floor:.1f} µs",
                  flush=True)
            tiles = 2 * inter // 256
            for name, cfg, split in variants(m, tiles, sms):
                patch = mock.patch.object(gemm256, "plan", forced(split)) if split else mock.patch.object(
                    gemm256, "plan", gemm256.plan)
                with patch:
                    err = h_error(cfg, sets[0])
                    fn = b.cycling(lambda x, xs_, w, ws_, c=cfg: kg.gate_up(c, x, w, ws_, xs_), sets)
                    t = b.graph_time_us(fn, a.iters)
                    ctas, sk, _, _ = gemm256.launch_plan(cfg, m, 2 * inter, hidden, sets[0][0].device)
                flag = "" if err < 0.07 else "  WRONG"
                print(f"  {name:>16}: {t:7.1f} µs  {t / floor:5.2f}× floor  ctas {ctas:4d} sk_tiles {sk:4d}  "
                      f"h err {err:.3f}{flag}", flush=True)
                rows.append(dict(m=m, hidden=hidden, inter=inter, variant=name, us=t, floor_us=floor,
                                 cublas_us=t_cublas, ctas=ctas, sk_tiles=sk, h_rel_err=err))
            del sets
    if a.json:
        b.write_json(a.json, bench="swap_ab", rows=rows)


if __name__ == "__main__":
    main()
