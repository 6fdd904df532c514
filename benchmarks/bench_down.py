"""down benchmark: the sm90 kernel (gemm with the linear epilogue) against cuBLAS block-scaled
GEMM (torch._scaled_mm, 1x128 / 128x128 scales, as kernels/cublas.py calls it), with and without
the residual (cuBLAS: GEMM then a separate add). Same process, same inputs; every timing is a CUDA
graph of REPS launches, median of --iters replays (harness.graph_time_us).

    python -m benchmarks.bench_down [--shapes 4096x14336,8192x3584] [--m 16,1024,4096] [--json out.json]
    python -m benchmarks.bench_down --rounds 5 [...]   # kernel vs cuBLAS (no residual) only, in turn
    python -m benchmarks.bench_down --rounds 5 --variant s5:stages=5   # + DownConfig variants

--rounds N: the kernel and cuBLAS (and DeepGEMM's ``fp8_gemm_nt`` where ``deep_gemm`` imports: a peer
we time, never a dependency), each on operand sets rotated past L2 (as bench_gate_up), captured
once and timed in turn N times (harness.interleaved_us): medians and the per-round ratio,
for the dispatch decisions (beats_cublas) whose margins are a few %. --variant (as in
ab_gate_up.py) adds the dispatched config with fields replaced, timed in the same turns.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import torch

from benchmarks import harness as b
from benchmarks.harness import parse_variant
from swiglu_fused import quant
from swiglu_fused.kernels import cublas, reference
from swiglu_fused.kernels.sm90 import down as k


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="4096x14336,8192x3584")  # H x I
    p.add_argument("--m", default="1,16,64,256,1024,4096")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--json", default=None)
    p.add_argument("--mainloop", default="fp8_block128", choices=["fp8_block128", "bf16"],
                   help="bf16: bf16 h and weight; peer torch.mm (cuBLAS)")
    p.add_argument("--rounds", type=int, default=0, help="only kernel vs cuBLAS (and DeepGEMM), no residual, timed "
                                                         "in turn this many times")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:FIELD=VALUE,...",
                   help="with --rounds: the dispatched DownConfig with these fields replaced (repeatable)")
    a = p.parse_args()
    if a.rounds:
        return b.write_json(a.json, rows=interleaved(a))
    bf16 = a.mainloop == "bf16"
    rows = []
    print(f"{'M':>6} {'H':>6} {'I':>6} {'tile_m':>6} {'kernel us':>10} {'TF/s':>6} {'cuBLAS us':>10} {'TF/s':>6} "
          f"{'k+res us':>9} {'cB+res us':>10} {'cuBLAS/k':>8} {'floor us':>8} {'err k':>8} {'err cB':>8}")
    for shape in a.shapes.split(","):
        hidden, inter = map(int, shape.split("x"))
        g = torch.Generator(device="cuda").manual_seed(0)
        w = torch.randn(hidden, inter, device="cuda", generator=g) * 0.05
        wq, ws = (w.to(torch.bfloat16), None) if bf16 else quant.quantize_fp8_block(w)
        del w
        for m in map(int, a.m.split(",")):
            hb = torch.randn(m, inter, device="cuda", generator=g).to(torch.bfloat16)
            hq, hs = (hb, None) if bf16 else reference.quant_x(hb)
            hs = hs if bf16 else quant.m_major(hs)  # M-major, as gate_up writes it (and both downs read)
            res = torch.randn(m, hidden, device="cuda", generator=g).to(torch.bfloat16)
            cfg = b.down_config(hq, wq, ws, hs, None, torch.bfloat16)
            cfg_r = b.down_config(hq, wq, ws, hs, res, torch.bfloat16)
            y_ref = reference.down(hq, wq, ws, hs)
            y_k = k.down(cfg, hq, wq, ws, hs)
            y_c = cublas.down(hq, wq, ws, hs, None, torch.bfloat16)
            err_k = ((y_k.float() - y_ref.float()).norm() / y_ref.float().norm()).item()
            err_c = ((y_c.float() - y_ref.float()).norm() / y_ref.float().norm()).item()
            t_k = b.graph_time_us(lambda: k.down(cfg, hq, wq, ws, hs), a.iters)
            t_kr = b.graph_time_us(lambda: k.down(cfg_r, hq, wq, ws, hs, res), a.iters)
            t_c = b.graph_time_us(lambda: cublas.down(hq, wq, ws, hs, None, torch.bfloat16), a.iters)
            t_cr = b.graph_time_us(lambda: cublas.down(hq, wq, ws, hs, res, torch.bfloat16), a.iters)
            flops = 2 * m * hidden * inter
            floor = (wq.nbytes + hq.nbytes + m * hidden * 2 + (0 if bf16 else ws.nbytes + hs.nbytes)) / 2.96e12 * 1e6
            r = dict(mainloop=a.mainloop, m=m, hidden=hidden, inter=inter, config=str(cfg), kernel_us=t_k, kernel_res_us=t_kr,
                     cublas_us=t_c, cublas_res_us=t_cr, floor_us=floor, err_kernel=err_k, err_cublas=err_c)
            rows.append(r)
            print(f"{m:>6} {hidden:>6} {inter:>6} {cfg.tile_m:>6} {t_k:>10.1f} {flops / t_k / 1e6:>6.0f} {t_c:>10.1f} "
                  f"{flops / t_c / 1e6:>6.0f} {t_kr:>9.1f} {t_cr:>10.1f} {t_c / t_k:>8.2f} {floor:>8.1f} "
                  f"{err_k:>8.1e} {err_c:>8.1e}", flush=True)
            del hq, hs, hb, res, y_ref, y_k, y_c
        del wq, ws
        torch.cuda.empty_cache()
    b.write_json(a.json, rows=rows)


def interleaved(a):
    """Kernel (the config ops would pick, forced) against cuBLAS, no residual, in turn (DeepGEMM
    too where it imports, fp8 only)."""
    rows = []
    bf16 = a.mainloop == "bf16"
    dg = None if bf16 else b.deep_gemm()
    dg_gemm = b.deep_gemm_block_gemm(dg) if dg is not None else None
    print(f"{'M':>6} {'H':>6} {'I':>6} {'config':>24} {'kernel us':>10} {'cuBLAS us':>10}  cuBLAS/kernel per round")
    for shape in a.shapes.split(","):
        hidden, inter = map(int, shape.split("x"))
        for m in map(int, a.m.split(",")):
            def make(seed):
                g = torch.Generator(device="cuda").manual_seed(seed)
                hb = torch.randn(m, inter, device="cuda", generator=g).to(torch.bfloat16)
                w = torch.randn(hidden, inter, device="cuda", generator=g) * 0.05
                if bf16:
                    return hb, None, w.to(torch.bfloat16), None
                hq, hs = reference.quant_x(hb)
                return (hq, quant.m_major(hs), *quant.quantize_fp8_block(w))
            sets = b.rotation(make, hidden * inter)
            hq0, hs0, wq0, ws0 = sets[0]
            cfg = b.down_config(hq0, wq0, ws0, hs0, None, torch.bfloat16)
            variants = {n: dataclasses.replace(cfg, **f) for n, f in map(parse_variant, a.variant)}
            y0 = k.down(cfg, hq0, wq0, ws0, hs0) if variants else None
            vsets = {n: b.in_weight_order(c, sets, 2) for n, c in variants.items()}  # (h, h_scale, w, w_scale)
            checks = {n: "bit-identical" if torch.equal(y0, k.down(c, hq0, vsets[n][0][2], ws0, hs0,
                                                                   tile_major=c.tile_major)) else "differs"
                      for n, c in variants.items()}
            t = b.interleaved_us({
                "kernel": b.cycling(lambda hq, hs, wq, ws: k.down(cfg, hq, wq, ws, hs), sets),
                "cublas": b.cycling(lambda hq, hs, wq, ws: cublas.down(hq, wq, ws, hs, None, torch.bfloat16), sets),
                **{n: b.cycling(lambda hq, hs, wq, ws, c=c: k.down(c, hq, wq, ws, hs, tile_major=c.tile_major),
                                vsets[n]) for n, c in variants.items()},
                **({"deepgemm": b.cycling(lambda hq, hs, wq, ws: dg_gemm(hq, hs, wq, ws), sets)}
                   if dg_gemm else {}),
            }, a.iters, a.rounds, max(b.REPS, len(sets)))
            ratios = [c / kk for c, kk in zip(t["cublas"], t["kernel"])]
            tag = f"tile_m={cfg.tile_m}" + (",swap_ab" if cfg.swap_ab else "")
            med = {name: statistics.median(v) for name, v in t.items()}
            print(f"{m:>6} {hidden:>6} {inter:>6} {tag:>24} {med['kernel']:>10.1f} {med['cublas']:>10.1f}  "
                  + " ".join(f"{r:.3f}" for r in ratios), flush=True)
            if dg_gemm:
                y_k, y_d = k.down(cfg, hq0, wq0, ws0, hs0).float(), dg_gemm(hq0, hs0, wq0, ws0).float()
                dr = [kk / d for kk, d in zip(t["kernel"], t["deepgemm"])]
                diff = ((y_d - y_k).norm() / y_k.norm()).item()
                print(f"{'':>6} {'DeepGEMM fp8_gemm_nt':>38} {med['deepgemm']:>10.1f}  kernel/DeepGEMM "
                      f"{min(dr):.3f}–{max(dr):.3f} (rel diff to the kernel {diff:.1e})", flush=True)
            for n in variants:
                vr = [kk / v for kk, v in zip(t["kernel"], t[n])]
                print(f"{'':>6} {n:>38} {med[n]:>10.1f}  speed-up {min(vr):.3f}–{max(vr):.3f} (y {checks[n]})", flush=True)
            rows.append(dict(m=m, hidden=hidden, inter=inter, config=str(cfg), kernel_us=med["kernel"],
                             cublas_us=med["cublas"], kernel_us_per_round=t["kernel"], cublas_us_per_round=t["cublas"],
                             deepgemm_us=med.get("deepgemm"), deepgemm_us_per_round=t.get("deepgemm"),
                             variants={n: dict(config=str(c), us=med[n], us_per_round=t[n], check=checks[n])
                                       for n, c in variants.items()}))
            del sets
            torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":
    main()
