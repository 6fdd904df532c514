"""Swap-AB decode tiles (kernels/sm90/swap_ab.py) against the 64-row tile (with and without the
overlapped fp8 promotion) and, above M = 32, the 128-row tile:
gate_up (fp8 h) and down (bf16 y), each tile under forced schedules (whole tiles; stream-K split
2, 3, 4 ways) and under what schedule.plan picks. Every variant is first checked against the
reference (relative max error) on its first operand set and captured as a CUDA graph (operands
rotated past L2); then the graphs are timed in turn, --rounds times (median), so that drift of the
board's clocks reaches every variant alike (use --rounds 5 or more for margins of a few %).
cuBLAS's block-scaled GEMM is the yardstick (for down: ops' cuBLAS path, cublas.down).

    python -m benchmarks.bench_swap_ab [--op gate_up|down] [--mainloop fp8_block128|bf16] [--rounds 5]
                                       [--shapes 4096x14336,...] [--m 1,16,32] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
from unittest import mock

import torch

from benchmarks import harness as b
from swiglu_fused import quant
from swiglu_fused.kernels import cublas, reference
from swiglu_fused.kernels.sm90 import down as kd, gate_up as kg, schedule


def forced(split):
    """plan() replaced: whole tiles (split 1), every tile stream-K split ``split`` ways, or
    "hybrid": whole waves of tiles, then the tiles of the last partial wave stream-K over all CTAs."""
    def plan(tiles, k_tiles, sms, *_, **__):
        if split == "hybrid":
            return (min(tiles, sms), tiles % sms if tiles > sms else 0)
        return (tiles * split, tiles) if split > 1 else (min(tiles, sms), 0)
    return plan


def h_error(cfg, ops):
    xq, xs, wq, ws = ops
    h, hs = kg.gate_up(cfg, xq, wq, ws, xs)
    h_ref, hs_ref = reference.gate_up(xq, wq, ws, xs, act="silu", h_format="fp8_group128")
    deq = (h.float().view(h.shape[0], -1, 128) * hs[..., None]).view(h.shape)
    ref = (h_ref.float().view(h.shape[0], -1, 128) * hs_ref[..., None]).view(h.shape)
    return ((deq - ref).abs().max() / ref.abs().max()).item()


def y_error(cfg, ops):
    hq, hs, wq, ws = ops
    y = kd.down(cfg, hq, wq, ws, hs).float()
    ref = reference.down(hq, wq, ws, hs).float()
    return ((y - ref).abs().max() / ref.abs().max()).item()


def down_operands(m, hidden, inter, seed, bf16=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(hidden, inter, device="cuda", generator=g) * 0.05
    h = torch.randn(m, inter, device="cuda", generator=g).to(torch.bfloat16)
    if bf16:
        return h, None, w.to(torch.bfloat16), None
    hq, hs = reference.quant_x(h)
    return (hq, quant.m_major(hs), *quant.quantize_fp8_block(w))  # h_scale M-major, as gate_up writes it


def variants(op, m, tiles, sms, mainloop):
    make = kg.GateUpConfig if op == "gate_up" else kd.DownConfig
    out = [("tile64 plan", make(tile_m=64, stages=5, mainloop=mainloop), None)]
    if mainloop == "fp8_block128":  # the 64-row tile's v1 promotion schedule (no overlap)
        out.append(("tile64 v1 plan", make(tile_m=64, stages=5, mainloop=mainloop, overlap=False), None))
    if m > 64:
        out.append(("tile64 whole", make(tile_m=64, stages=5, mainloop=mainloop), 1))
    if m > 32 and 2 * -(-m // 64) * tiles <= sms:  # K halves over cluster pairs (DSMEM), 3 stages fit
        out.append(("tile64 ck2", make(tile_m=64, stages=3, cluster_k=2, mainloop=mainloop), None))
        out.append(("tile64 s3 whole", make(tile_m=64, stages=3, mainloop=mainloop), 1))
    if m > 32:
        out.append(("tile128 plan", make(tile_m=128, stages=4, mainloop=mainloop), None))
    if m > 512:
        out.append(("tile128 hybrid", make(tile_m=128, stages=4, mainloop=mainloop), "hybrid"))
    if m > 64:  # weight k tiles multicast over a cluster of two M tiles
        out.append(("tile64 cl2", make(tile_m=64, stages=5, mainloop=mainloop, cluster_m=2), None))
        out.append(("tile128 cl2", make(tile_m=128, stages=4, mainloop=mainloop, cluster_m=2), None))
    for tm, stages in ((16, 6), (32, 6), (64, 5)):  # shipped: SWAP_TILES
        if m <= tm or (tm == 16 and m <= 64):  # the 16-token tile also as several M tiles
            cfg = make(tile_m=tm, stages=stages, swap_ab=True, mainloop=mainloop)
            out.append((f"swap{tm} plan", cfg, None))
            if tm == 16 and 2 * -(-m // tm) * tiles <= sms:  # K halves over cluster pairs (DSMEM)
                out.append(("swap16 ck2", make(tile_m=tm, stages=stages, swap_ab=True, cluster_k=2,
                                               mainloop=mainloop), None))
            for split in (1, 2, 3, 4, 6, 8):
                if tiles * split <= sms:
                    out.append((f"swap{tm} split{split}", cfg, split))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--op", default="gate_up", choices=["gate_up", "down"])
    p.add_argument("--mainloop", default="fp8_block128", choices=["fp8_block128", "bf16"])
    p.add_argument("--shapes", default="4096x14336,8192x3584,2048x8192")
    p.add_argument("--m", default="1,16,32")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--rounds", type=int, default=1, help="time the variants in turn this many times (median)")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for shape in a.shapes.split(","):
        hidden, inter = map(int, shape.split("x"))
        for m in map(int, a.m.split(",")):
            gu = a.op == "gate_up"
            n, k = (2 * inter, hidden) if gu else (hidden, inter)
            bf16 = a.mainloop == "bf16"
            if gu:
                make_set = b.bf16_operands if bf16 else (lambda *args: b.operands(*args[:3], seed=args[3]))
                sets = b.rotation(lambda s: make_set(m, hidden, inter, s), n * k * (2 if bf16 else 1))
            else:
                sets = b.rotation(lambda s: down_operands(m, hidden, inter, s, bf16), n * k * (2 if bf16 else 1))
            try:
                psets = sets
                if gu and bf16:
                    peer = lambda x, xs, w, ws: x @ w.t()  # noqa: E731
                elif gu:
                    peer, _ = b.cublas_gemm(*sets[0])
                    psets = b.peer_sets(sets)
                else:
                    peer = lambda hq, hs, wq, ws: cublas.down(hq, wq, ws, hs, None, torch.bfloat16)  # noqa: E731
                t_cublas = b.graph_time_us(b.cycling(peer, psets), a.iters)
                del psets
            except RuntimeError:  # cuBLAS's block-scaled GEMM takes no M = 1
                t_cublas = None
            floor = n * k * (2 if bf16 else 1) / 2.96e6  # µs at a plain copy's HBM rate
            print(f"M={m} {hidden}x{inter}: cuBLAS GEMM {t_cublas or float('nan'):.1f} µs, floor {floor:.1f} µs",
                  flush=True)
            tiles = -(-n // 256)
            runs = []  # (name, cfg, error, graph, ctas, sk_tiles): every variant captured first
            for name, cfg, split in variants(a.op, m, tiles, sms, a.mainloop):
                patch = mock.patch.object(schedule, "plan", forced(split)) if split else mock.patch.object(
                    schedule, "plan", schedule.plan)
                with patch:  # the schedule is fixed at capture
                    if gu:
                        err = h_error(cfg, sets[0])
                        fn = b.cycling(lambda x, xs_, w, ws_, c=cfg: kg.gate_up(c, x, w, ws_, xs_), sets)
                    else:
                        err = y_error(cfg, sets[0])
                        fn = b.cycling(lambda h, hs_, w, ws_, c=cfg: kd.down(c, h, w, ws_, hs_), sets)
                    ctas, sk, _, _ = schedule.launch_plan(cfg, m, n, k, sets[0][0].device)
                    runs.append((name, cfg, err, b.capture(fn), ctas, sk))
            # then timed in turn, --rounds times, so that drift reaches every variant alike
            times = {name: [] for name, *_ in runs}
            for _ in range(a.rounds):
                for name, _, _, graph, _, _ in runs:
                    times[name].append(b.replay_us(graph, a.iters))
            for name, cfg, err, _, ctas, sk in runs:
                t = statistics.median(times[name])
                flag = "" if err < 0.07 else "  WRONG"
                spread = f"  rounds {min(times[name]):.1f}–{max(times[name]):.1f}" if a.rounds > 1 else ""
                print(f"  {name:>16}: {t:7.1f} µs  {t / floor:5.2f}× floor  ctas {ctas:4d} sk_tiles {sk:4d}  "
                      f"h err {err:.3f}{flag}{spread}", flush=True)
                rows.append(dict(op=a.op, m=m, hidden=hidden, inter=inter, variant=name, us=t, us_per_round=times[name],
                                 floor_us=floor, cublas_us=t_cublas, ctas=ctas, sk_tiles=sk, h_rel_err=err))
            del runs
            del sets
    if a.json:
        b.write_json(a.json, bench=f"swap_ab_{a.op}_{a.mainloop}", rows=rows)


if __name__ == "__main__":
    main()
