"""gate_up fp8_block128 benchmark: the fused sm90 kernel against cuBLAS block-scaled GEMM
(torch._scaled_mm, 1x128 / 128x128 scales) followed by the best separate SiLU·up + group-quant
(the faster of torch.compile's and a one-pass Triton kernel on each shape, swiglu_fused/bench.py; its
achieved TB/s is printed). Peers run in the same process on the same inputs; every timing is a CUDA graph of
``REPS`` launches (so Python launch cost is excluded for both), median of ``--iters`` replays. Operands
rotate over enough independent sets that one pass moves more than twice the 50 MB L2 (``rotated_sets``
in the JSON), so small shapes are not timed from cache.

    python -m benchmarks.bench_gate_up [--shapes 4096x14336,...] [--m 16,64,1024,4096] [--json out.json]
                                       [--rounds 5]   # ours and the peers timed in turn, 5 times

Prints a table: µs and TFLOP/s (2·M·H·2I) of every GEMM pipeline (ours: the fused kernel, and for bf16 where
the dispatch runs cuBLAS + act·mul instead (D53) that too, "dispatched"; cuBLAS GEMM alone, cuBLAS GEMM
+ separate act·quant; where DeepGEMM is importable, its GEMM alone and with the act·quant too), the act·quant kernel's µs and TB/s, ours' speed-up over each cuBLAS peer, and
ours against the roofline floor: the larger of a memory floor (weight + x + h bytes at the 2.96 TB/s
copy rate) and a compute floor (the flops at cuBLAS's 8192³ rate: 1257 TFLOP/s fp8 block-scaled, 775
bf16; DESIGN §6). With --json NAME.json it writes the rows (JSON keys: speedup = separate/ours,
speedup_vs_gemm = GEMM alone/ours, fused_over_roofline, roofline_bound) and NAME.png (plot.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics

import torch

from benchmarks.harness import (
    COPY_BPS, PEAK_TFLOPS, REPS, act_mul_bf16, act_quant, act_quant_bytes, best_act_quant, bf16_operands,
    block_gemm_reference, cublas_gemm, cycling, deep_gemm, deep_gemm_block_gemm, gate_up_config, graph_time_us, interleaved_us, operands, parse_variant, peer_sets,
    quant_x_m_major, rotation, write_json,
)
from swiglu_fused import quant
from swiglu_fused.kernels import dispatch, ops
from swiglu_fused.kernels.sm90 import gate_up as k

# table/JSON name of each timed pipeline whose time covers the GEMM (act·quant alone has no GEMM flops)
GEMM_PIPELINES = {"fused": "fused", "gemm": "gemm", "sep": "separate", "tile256": "tile256", "copyout": "copyout",
                  "dg": "deepgemm", "dgsep": "deepgemm_separate", "dispatched": "dispatched"}

QX_SHAPES = ((1, 4096), (16, 4096), (64, 8192), (128, 4096), (128, 8192), (256, 4096), (256, 8192),
             (1024, 4096), (1024, 8192), (4096, 4096), (4096, 8192), (16384, 4096))


def bench_quant_x(iters, variants=(), rounds=3):
    """quant_x kernel (the shipped pick, and each QuantXConfig in ``variants``, e.g. "rounds=1,vec=16")
    vs the torch.compile'd quantization of the unfused pipeline (harness.quant_x_m_major): µs and
    GB/s (bytes read + written). Every variant's output is checked against the shipped kernel's."""
    from swiglu_fused.kernels.sm90 import quant_x as kq

    configs = {v: kq.QuantXConfig(**parse_variant(":" + v)[1]) for v in variants}
    ref_c = torch.compile(quant_x_m_major, dynamic=False)
    print(f"{'M':>6} {'K':>6} {'shipped':>16} {'us':>6} {'GB/s':>6} {'compiled':>9} "
          + " ".join(f"{v:>20}" for v in variants))
    rows = []
    for m, kk in QX_SHAPES:
        x = torch.randn(m, kk, device="cuda").to(torch.bfloat16)
        nbytes = x.nbytes + x.numel() + m * quant.cdiv(kk, 128) * 4
        q0, s0 = kq.quant_x(x)
        fns = {"kernel": lambda x=x: kq.quant_x(x), "compiled": lambda x=x: ref_c(x)}
        for v, c in configs.items():
            if kk % c.vec:
                continue
            q1, s1 = kq.quant_x(x, c)
            if not (torch.equal(q1.view(torch.uint8), q0.view(torch.uint8)) and torch.equal(s1, s0)):
                raise RuntimeError(f"quant_x {c} differs from the shipped config at M={m} K={kk}")
            fns[v] = lambda x=x, c=c: kq.quant_x(x, c)
        t = {name: statistics.median(v) for name, v in interleaved_us(fns, iters, rounds).items()}
        cfg = kq.select_config(m, kk)
        pick = f"r{cfg.rounds} t{cfg.threads} v{cfg.vec}"
        rows.append(dict(m=m, k=kk, config=pick, kernel_us=t["kernel"], compiled_us=t["compiled"],
                         kernel_gbs=nbytes / t["kernel"] / 1e3, variants={v: t.get(v) for v in variants}))
        print(f"{m:>6} {kk:>6} {pick:>16} {t['kernel']:>6.2f} {nbytes / t['kernel'] / 1e3:>6.0f} "
              f"{t['compiled']:>9.2f} " + " ".join(f"{t[v]:>20.2f}" if v in t else f"{'-':>20}" for v in variants),
              flush=True)
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="4096x14336,8192x3584,2048x8192,576x1536")
    p.add_argument("--m", default="1,16,64,256,1024,4096,16384")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--json", default=None)
    p.add_argument("--mainloop", default="fp8_block128", choices=["fp8_block128", "bf16"],
                   help="bf16: bf16 x and weight, bf16 h; peers torch.mm (cuBLAS) + compiled SiLU·up")
    p.add_argument("--quant-x", action="store_true", help="benchmark quant_x instead of gate_up")
    p.add_argument("--qx-variants", default="", help="with --quant-x: QuantXConfig fields of extra variants, "
                   "';'-separated (e.g. 'rounds=1,vec=16;rounds=1,threads=128')")
    p.add_argument("--rounds", type=int, default=1,
                   help="time ours and the peers in turn this many times (medians; per-round speed-ups in the JSON)")
    p.add_argument("--store-ab", action="store_true",
                   help="also time the dispatched config with h copied out by the threads instead of TMA stores "
                        "(TileConfig.tma_store = False), in the same rounds")
    a = p.parse_args()
    if a.quant_x:
        write_json(a.json, quant_x=bench_quant_x(a.iters, [v for v in a.qx_variants.split(";") if v], a.rounds))
        return
    fp8 = a.mainloop == "fp8_block128"
    act_quant_c = torch.compile(act_quant if fp8 else act_mul_bf16, dynamic=False)
    rows = []
    print_header(a.mainloop)
    for shape in a.shapes.split(","):
        hidden, inter = map(int, shape.split("x"))
        for m in map(int, a.m.split(",")):
            rows.append(bench_point(a, m, hidden, inter, act_quant_c))
            torch.cuda.empty_cache()
    write_json(a.json, chart=True, rows=rows)



def peer_gemm(mainloop, m, xq, xs, wq, ws):
    """(cuBLAS's GEMM as a callable of an operand set, its relative error); (None, NaN) at an M that
    cuBLAS's block scaling does not take (e.g. M = 1): reported, not hidden."""
    if mainloop == "bf16":
        return (lambda x, _xs, w, _ws: x @ w.t()), 0.0
    try:
        return cublas_gemm(xq, xs, wq, ws)
    except RuntimeError as e:
        print(f"  (M={m}: no cuBLAS peer: {str(e)[:90]})")
        return None, float("nan")


def ours(a, cfg, sets):
    """{name: callable}: our kernel as dispatched, and the A/B configs where asked (--store-ab) or where
    they apply (a granule tile against the 256-row tile it replaces)."""
    def run(c):
        return cycling(lambda x, xs, w, ws: k.gate_up(c, x, w, ws, xs), sets)

    fns = {"fused": run(cfg)}
    if cfg.mainloop == dispatch.BF16_MAINLOOP and dispatch_takes_cublas(sets[0]):  # what ops.gate_up runs (D53)
        fns["dispatched"] = cycling(lambda x, xs, w, ws: ops.gate_up(x, w)[0], sets)
    if a.store_ab and cfg.h_tma_store:
        fns["copyout"] = run(dataclasses.replace(cfg, tma_store=False))
    if cfg.granules:
        fns["tile256"] = run(dataclasses.replace(cfg, tile_n=256))
    return fns


def dispatch_takes_cublas(operands) -> bool:
    """Whether ops.gate_up runs these bf16 operands as cuBLAS's GEMM + the act·mul (DISPATCH D53), not
    the fused kernel the table's "ours" column times."""
    x, _, w, _ = operands
    return dispatch.gate_up_backend(x, w, None, None, None, 128, "silu", "bf16")[0] == dispatch.CUBLAS


def peers(gemm_fn, psets, fp8, act_quant_c):
    """(act·quant kernel name, {name: callable}) of the cuBLAS GEMM alone, the separate act·quant alone
    (on GEMM outputs made beforehand) and the two in sequence. The act·quant kernel is the faster of
    inductor's and a one-pass Triton kernel on this shape."""
    ys = [(gemm_fn(*ops),) for ops in psets]
    name, actq_fn = best_act_quant(ys[0][0], fp8, act_quant_c, lambda f: graph_time_us(f, 10))
    return name, dict(gemm=cycling(gemm_fn, psets), actq=cycling(actq_fn, ys),
                      sep=cycling(lambda *ops: actq_fn(gemm_fn(*ops)), psets))


def deep_gemm_peers(psets, act_quant_c):
    """({dg: DeepGEMM's GEMM alone, dgsep: it + the separate act·quant}, its relative error), where
    DeepGEMM is importable ({}, NaN elsewhere, or where it refuses the shape: said, not hidden)."""
    dg = deep_gemm()
    if dg is None:
        return {}, float("nan")
    gemm = deep_gemm_block_gemm(dg)
    xq, xs, wq, ws = psets[0]
    try:
        y = gemm(xq, xs, wq, ws)
    except Exception as e:
        print(f"  (no DeepGEMM peer: {str(e).splitlines()[0][:90]})")
        return {}, float("nan")
    ref = block_gemm_reference(xq, xs, wq, ws)
    err = ((y.float() - ref).norm() / ref.norm()).item()
    _, actq_fn = best_act_quant(y, True, act_quant_c, lambda f: graph_time_us(f, 10))
    return dict(dg=cycling(gemm, psets), dgsep=cycling(lambda *ops: actq_fn(gemm(*ops)), psets)), err


def bench_point(a, m, hidden, inter, act_quant_c):
    """One row at (M, H, I): ours and the peers on the same rotated operand sets, every pipeline captured
    first and then timed in turn (--rounds times), so that the board's drift reaches all alike."""
    fp8 = a.mainloop == "fp8_block128"
    make = functools.partial(operands if fp8 else bf16_operands, m, hidden, inter)
    sets = rotation(make, sum(t.nbytes for t in make(0) if t is not None))
    xq, xs, wq, ws = sets[0]
    cfg = gate_up_config(xq, wq, ws, xs, act="silu", h_format="fp8_group128" if fp8 else "bf16")
    gemm_fn, gemm_err = peer_gemm(a.mainloop, m, *sets[0])
    fns, actq_name = ours(a, cfg, sets), None
    if gemm_fn is not None:  # cuBLAS reads the x scales M-major (peer_sets)
        actq_name, peer_fns = peers(gemm_fn, peer_sets(sets) if fp8 else sets, fp8, act_quant_c)
        fns.update(peer_fns)
    dg_err = float("nan")
    if fp8:
        dg_fns, dg_err = deep_gemm_peers(peer_sets(sets), act_quant_c)
        fns.update(dg_fns)
    per_round = interleaved_us(fns, a.iters, a.rounds, max(REPS, len(sets)))
    t = {name: statistics.median(v) for name, v in per_round.items()}
    for name in ("gemm", "actq", "sep"):  # no cuBLAS peer at this M: NaN in the table and JSON
        t.setdefault(name, float("nan"))
    # weight (+ scales), x and h each moved once: the memory floor (the former weight-bandwidth floor)
    nbytes = wq.nbytes + (ws.nbytes if ws is not None else 0) + xq.nbytes + m * inter * (1 if fp8 else 2)
    r = dict(mainloop=a.mainloop, m=m, hidden=hidden, inter=inter, config=str(cfg), rotated_sets=len(sets),
             fused_us=t["fused"], gemm_us=t["gemm"], act_quant_us=t["actq"], separate_us=t["sep"],
             cublas_rel_err=gemm_err, deepgemm_rel_err=dg_err, act_quant_kernel=actq_name,
             act_quant_tbps=act_quant_bytes(m, inter, fp8) / t["actq"] / 1e6,
             **derived(t, per_round, gemm_flops(m, hidden, inter), nbytes, a.mainloop))
    for name in ("tile256", "copyout", "dg", "dgsep", "dispatched"):
        if name in t:
            r.update({f"{name}_us": t[name], f"{name}_per_round": per_round[name]})
    if "copyout" in t:
        r["fused_per_round"] = per_round["fused"]
    print_row(r, cfg, a.rounds)
    return r


def gemm_flops(m, hidden, inter):
    """The gate_up GEMM's flops, 2·M·H·2I (the activation's are not counted)."""
    return 2 * m * hidden * 2 * inter


def derived(t, per_round, flops, nbytes, mainloop):
    """A row's columns derived from the median µs ``t`` (by pipeline name; per round in ``per_round``):
    TFLOP/s of every pipeline that runs the GEMM, ours' speed-up over each cuBLAS peer (speedup:
    GEMM + separate act·quant; speedup_vs_gemm: the GEMM alone), and ours against the roofline floor,
    the larger of the memory floor (``nbytes`` at the copy rate) and the compute floor (``flops`` at
    cuBLAS's 8192³ rate for the mainloop); ``roofline_bound`` says which of the two it is."""
    mem_us, cmp_us = nbytes / COPY_BPS * 1e6, flops / PEAK_TFLOPS[mainloop] / 1e6
    roof = max(mem_us, cmp_us)

    def over_fused(peer):
        return [p / f for p, f in zip(per_round.get(peer, []), per_round["fused"])]

    r = {f"{GEMM_PIPELINES[n]}_tflops": flops / us / 1e6 for n, us in t.items() if n in GEMM_PIPELINES}
    r.update(speedup=t["sep"] / t["fused"], speedup_vs_gemm=t["gemm"] / t["fused"], floor_us=mem_us,
             compute_floor_us=cmp_us, roofline_us=roof, roofline_bound="memory" if mem_us >= cmp_us else "compute",
             fused_over_roofline=t["fused"] / roof, speedup_per_round=over_fused("sep"),
             speedup_vs_gemm_per_round=over_fused("gemm"))
    if "dg" in t:
        r.update(speedup_vs_deepgemm=t["dg"] / t["fused"], speedup_vs_deepgemm_separate=t["dgsep"] / t["fused"],
                 speedup_vs_deepgemm_per_round=over_fused("dg"))
    return r


def print_header(mainloop):
    print(f"roofline = max(memory floor: weight + x + h at {COPY_BPS / 1e12:.2f} TB/s, compute floor: "
          f"2·M·H·2I at {PEAK_TFLOPS[mainloop]} TFLOP/s, cuBLAS {mainloop} 8192³); 'bound' says which applies")
    print(f"{'M':>6} {'H':>6} {'I':>6} {'config':>34} {'ours us':>8} {'TF/s':>5} {'gemm us':>8} {'TF/s':>5} "
          f"{'actq us':>8} {'TB/s':>5} {'kernel':>9} {'sep us':>8} {'TF/s':>5} {'gemm/ours':>9} {'sep/ours':>8} "
          f"{'mem us':>7} {'comp us':>7} {'ours/roof':>9} {'bound':>7}")


def config_tag(cfg):
    """The dispatched config's fields that vary between shapes, for the table."""
    return f"tile_m={cfg.tile_m},stages={cfg.stages}" + (",swap_ab" if cfg.swap_ab else "") + (
        f",cluster_m={cfg.cluster_m}" if cfg.cluster_m > 1 else "") + (
        f",cluster_k={cfg.cluster_k}" if cfg.cluster_k > 1 else "") + (
        f",tile_n={cfg.tile_n}" if cfg.tile_n != 256 else "") + (",smem_scales" if cfg.smem_scales else "")


def print_row(r, cfg, rounds):
    """One row of print_header's table; with rounds > 1 the range of the per-round speed-ups, and the
    A/B pipelines (copy-out, tile_n=256) where they ran."""
    extra = "".join(f"  rounds {label} {min(r[key]):.2f}–{max(r[key]):.2f}"
                    for label, key in (("gemm/ours", "speedup_vs_gemm_per_round"), ("sep/ours", "speedup_per_round"))
                    if rounds > 1 and r[key])
    for name, label in (("copyout", "copy-out"), ("tile256", "tile_n=256"), ("dg", "DeepGEMM GEMM alone"),
                        ("dgsep", "DeepGEMM + act·quant"), ("dispatched", "dispatched: cuBLAS + act·mul (D53)")):
        if f"{name}_us" in r:
            extra += f"  {label} {r[f'{name}_us']:.1f} µs {r[f'{GEMM_PIPELINES[name]}_tflops']:.0f} TF/s"
    if "speedup_vs_deepgemm" in r:
        extra += f"  DeepGEMM alone/ours {r['speedup_vs_deepgemm']:.2f}"
    print(f"{r['m']:>6} {r['hidden']:>6} {r['inter']:>6} {config_tag(cfg):>34} {r['fused_us']:>8.1f} "
          f"{r['fused_tflops']:>5.0f} {r['gemm_us']:>8.1f} {r['gemm_tflops']:>5.0f} {r['act_quant_us']:>8.1f} "
          f"{r['act_quant_tbps']:>5.2f} {r['act_quant_kernel'] or '-':>9} {r['separate_us']:>8.1f} "
          f"{r['separate_tflops']:>5.0f} {r['speedup_vs_gemm']:>9.2f} {r['speedup']:>8.2f} {r['floor_us']:>7.1f} "
          f"{r['compute_floor_us']:>7.1f} {r['fused_over_roofline']:>9.2f} {r['roofline_bound']:>7}" + extra,
          flush=True)



if __name__ == "__main__":
    main()
