"""Per-kernel time of the whole MLP: ours and the unfused fp8 pipeline, kernel by kernel (GPU).

Where bench_mlp.py gives one number per pipeline, this says which kernel (or which gap between
kernels) the difference is in. Each pipeline is captured as a CUDA graph of REPS calls, replayed
under torch.profiler, and the trace's kernel records are cut into calls: per position in the call,
the kernel's name, its median duration and the median gap to the next kernel (the launch latency
a graph still pays, plus any wait of a kernel for its predecessor's tail).

    python -m benchmarks.profile_mlp [--shapes 8192x3584] [--m 128,256] [--layers N] [--json out.json]
        [--ab gate_up:l2_hint=''] (each --ab: one more pipeline of ours, as in bench_mlp.py)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

import torch

from benchmarks.bench_mlp import unfused_runs
from benchmarks.harness import (
    REPS, capture, fused, hf_mlp, layer_count, parse_ab, rotating, unfused_fp8, with_configs,
)

from swiglu_fused import FusedSwiGLUMLP, quant


def kernel_records(graph, replays, cats=("kernel",)):
    """Kernel (name, start µs, duration µs) of ``replays`` graph replays, in launch order (``cats``: the
    trace's activity categories to keep, e.g. also "gpu_memset" and "gpu_memcpy")."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    kernels = [e for e in events if e.get("cat") in cats]
    kernels.sort(key=lambda e: e["ts"])
    return [(e["name"], float(e["ts"]), float(e["dur"])) for e in kernels]


def per_position(records, calls):
    """Cut the records into ``calls`` equal calls; per kernel position: name, median µs, median gap
    to the next kernel's start. Also the median µs from one call's start to the next's."""
    n = len(records) // calls
    if n * calls != len(records):
        raise RuntimeError(f"{len(records)} kernel records do not split into {calls} calls")
    rows = []
    for p in range(n):
        durs = [records[c * n + p][2] for c in range(calls)]
        gaps = [records[c * n + p + 1][1] - (records[c * n + p][1] + records[c * n + p][2])
                for c in range(calls) if c * n + p + 1 < len(records)]
        # (names cut to 48 characters: enough to tell the kernels apart, and the JSON stays small)
        rows.append({"name": records[p][0][:48], "us": statistics.median(durs), "gap_us": statistics.median(gaps)})
    spans = [records[(c + 1) * n][1] - records[c * n][1] for c in range(calls - 1)]
    return rows, statistics.median(spans)


def short(name, width=70):
    return name if len(name) <= width else name[:width - 3] + "..."


def parts(ours: FusedSwiGLUMLP, x):
    """Pieces of our pipeline and cuBLAS's gate_up GEMM, next to the whole MLPs in the same process:
    whether a kernel runs slower inside the pipeline than alone, and which neighbour slows it.

    gate_up_alone   our gate_up on x quantized once beforehand
    gemm_alone      cuBLAS's block GEMM of the unfused pipeline, likewise
    quant_gate_up   quant_x then gate_up (x freshly quantized, no down)
    copy_gate_up    a copy rewrites the quantized x, then gate_up reads it (fresh lines, no quant_x)
    gate_up_down    gate_up then down (no quant_x)
    """
    from swiglu_fused.kernels import ops

    gu, dn = ours.gate_up_interleaved.tensors(), ours.down_proj.tensors()
    xq, xs = ops.quant_x(x)
    xq2 = torch.empty_like(xq)
    xs_m = quant.m_major(xs)  # cuBLAS reads the x scales M-major

    def gate_up(q=xq, s=xs):
        return ops.gate_up(q, gu["weight"], gu["weight_scale_inv"], s, act="silu", h_format="fp8_group128")

    def down(h):
        return ops.down(h[0], dn["weight"], dn["weight_scale_inv"], h[1])

    def gemm(_x):
        return torch._scaled_mm(xq, gu["weight"].t(), scale_a=xs_m, scale_b=gu["weight_scale_inv"].t(),
                                out_dtype=torch.bfloat16)
    return {"gate_up_alone": lambda _x: gate_up(), "gemm_alone": gemm,
            "quant_gate_up": lambda x_: gate_up(*ops.quant_x(x_)),
            "copy_gate_up": lambda _x: gate_up(xq2.copy_(xq), xs),
            "gate_up_down": lambda _x: down(gate_up())}


def profile_shape(hidden, inter, ms, replays, layers=None, ab=()):
    """Both pipelines at each M, cycling through ``layers`` MLPs of their own weights (default
    bench_mlp.layer_count: no call finds its weights in L2; 1 shows what reuse of one MLP's does).
    ``ab``: bench_mlp --ab specs, each one more pipeline of ours with kernel config fields replaced."""
    made = []
    for seed in range(layers or layer_count(hidden, inter)):
        mlp = hf_mlp(hidden, inter, seed)
        ours = fused(mlp)
        made.append({"ours_fp8": ours, "fp8_unfused": unfused_fp8(ours)})
        for spec in ab:
            made[-1][f"ours_fp8_{spec}"] = with_configs(fused(mlp), parse_ab(spec))
        del mlp
    out = []
    for m in ms:
        x = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
        for layer in made:
            layer.update(parts(layer["ours_fp8"], x))
        for name in ("ours_fp8", *(f"ours_fp8_{spec}" for spec in ab), "fp8_unfused", "gate_up_alone", "gemm_alone",
                     "quant_gate_up", "copy_gate_up", "gate_up_down"):
            # (the unfused act·quant picks its kernel on the first call, outside the graph; cuBLAS's
            # block-scaled GEMM rejects M = 1: that pipeline is then skipped, not fatal)
            if not all(unfused_runs(layer[name], x, m, name) for layer in made):
                continue
            rows, span = per_position(kernel_records(capture(rotating(made, name, x)), replays), replays * REPS)
            out.append({"hidden": hidden, "inter": inter, "m": m, "layers": len(made), "pipeline": name,
                        "call_us": span, "kernels": rows})
            print(f"\n{hidden}x{inter} M={m} {name}, {len(made)} layers: {span:.1f} µs per call (start to start)")
            for r in rows:
                print(f"  {r['us']:>7.2f} µs  then gap {r['gap_us']:>5.2f}  {short(r['name'])}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="8192x3584", help="HxI list, comma-separated")
    ap.add_argument("--m", default="128,256", help="token counts, comma-separated")
    ap.add_argument("--replays", type=int, default=5, help="graph replays profiled (each REPS calls)")
    ap.add_argument("--layers", type=int, default=None,
                    help="MLPs cycled through (default: enough that no call finds its weights in L2)")
    ap.add_argument("--ab", action="append", default=[], metavar="FAMILY:FIELD=VALUE,...",
                    help="also profile ours with these kernel config fields changed (as bench_mlp.py --ab)")
    ap.add_argument("--json", help="write the per-kernel rows here")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    ms = [int(v) for v in args.m.split(",")]
    rows = [r for h, i in shapes for r in profile_shape(h, i, ms, args.replays, args.layers, args.ab)]
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows}, separators=(",", ":")))


if __name__ == "__main__":
    main()
