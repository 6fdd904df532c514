"""Per-kernel time of Flux.2-dev's whole blocks (diffusers' own modules), stock and patched (GPU).

bench_flux2.py times each whole block as one number; this says where a block's time goes: each
block is captured as a CUDA graph of REPS calls (random weights at Flux.2-dev width, attention on
torch's SDPA), replayed under torch.profiler, and its kernels listed per position in the call with
their median µs, then summed by what they do (the projections' GEMMs, attention, and the rest by
the module that launches them).

    python -m benchmarks.profile_flux2 [--image 4096] [--formats bf16,fp8_block128] [--compile] [--json out.json]

``--compile``: each block in torch.compile(fullgraph=True) (inductor) first, diffusers' and ours, as
bench_flux2 --compile times them; the warm-up calls before the capture compile it.
"""

from __future__ import annotations

import argparse
import json

import torch

from benchmarks.bench_flux2 import SHORT, TEXT, block_inputs, block_wrapper, flux2_blocks
from benchmarks.profile_mlp import kernel_records, per_position, short
from swiglu_fused.bench import REPS, capture

# kernel-name fragments → what the kernel does (first match wins; lower-case)
KINDS = (("qk norm + rope", ("sm90qk_",)),  # (ours: kernels/sm90/qk_norm_rope.py)
         ("attention", ("flash", "fmha", "attention", "sdpa", "efficient_attention")),
         ("gemm", ("gemm", "nvjet", "cutlass", "sm90_xmma", "gatherkernel", "swiglu_fused", "kernel_cutlass")),
         ("inductor (fused)", ("triton_",)),  # (torch.compile's kernels: triton_poi_fused_..., _red_, _per_)
         ("norm", ("norm",)),
         ("copy / cat", ("copy", "cat", "catarray")),
         ("elementwise", ("elementwise", "vectorized", "unrolled", "reduce")))


def kind(name: str) -> str:
    low = name.lower()
    return next((k for k, frags in KINDS if any(f in low for f in frags)), "other")


def profile_block(fn, replays: int):
    """(per-position rows, µs a call start to start, {kind: µs a call}) of ``fn`` in a CUDA graph."""
    rows, span = per_position(kernel_records(capture(fn), replays), replays * REPS)
    sums: dict[str, float] = {}
    for r in rows:
        sums[kind(r["name"])] = sums.get(kind(r["name"]), 0.0) + r["us"]
    return rows, span, sums


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", type=int, default=4096, help="image tokens (the single-stream block adds 512 text)")
    ap.add_argument("--formats", default="bf16", help="our weight formats to patch copies to, comma-separated")
    ap.add_argument("--replays", type=int, default=3, help="graph replays profiled (each REPS calls)")
    ap.add_argument("--compile", action="store_true", help="profile each block under torch.compile (inductor)")
    ap.add_argument("--json", help="write the per-kernel rows here")
    args = ap.parse_args()
    models = flux2_blocks(formats=tuple(args.formats.split(",")))
    single, double = block_inputs(models["diffusers_bf16"], args.image)
    wrap = block_wrapper(args.compile)
    out = []
    for block, kwargs, pick in (("single_block", single, lambda m: m.single_transformer_blocks[0]),
                                ("double_block", double, lambda m: m.transformer_blocks[0])):
        for name, model in models.items():
            with torch.no_grad():
                rows, span, sums = profile_block(lambda b=wrap(pick(model)): b(**kwargs), args.replays)
            m = args.image + (TEXT if block == "single_block" else 0)
            label = block + ("_compiled" if args.compile else "")
            out.append({"block": label, "m": m, "model": name, "call_us": span, "kernel_us": sum(sums.values()),
                        "by_kind": sums, "kernels": rows})
            print(f"\n{label} M = {m} {name}: {span:.0f} µs a call (start to start), kernels {sum(sums.values()):.0f}: "
                  + ", ".join(f"{k} {v:.0f}" for k, v in sorted(sums.items(), key=lambda kv: -kv[1])))
            for r in rows:
                print(f"  {r['us']:>8.1f} µs  gap {r['gap_us']:>5.1f}  {kind(r['name']):12s} {short(r['name'])}")
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps({"gpu": torch.cuda.get_device_name(), "formats": [SHORT[f] for f in
                                                                                 args.formats.split(",")],
                                "rows": out}, separators=(",", ":")))


if __name__ == "__main__":
    main()
