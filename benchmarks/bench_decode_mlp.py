"""The fp8 MLP at decode in one launch (kernels/sm90/decode_mlp.py) against the dispatched MLP (quant_x,
gate_up, down: three launches), in one process on the same layers (GPU). Variants of the one launch:

  whole    gate_up's tiles whole (the SMs past them go straight to down's weight)
  g<s>     gate_up stream-K over s CTAs a tile (the others go straight to down's weight)
  _d<s>    down stream-K over s CTAs a tile (the others leave after gate_up)
  _u<n>    the stream-K fix-ups' sums with n partials' loads in flight at a time
  pdl      launched with PDL under quant_x (its first stages' weight loads before the wait)

Each line: µs medians per variant, the range over rounds of shipped's time over the variant's
(> 1: the one launch is faster) and the relative Frobenius distance of its y from shipped's.

    python -m benchmarks.bench_decode_mlp --shapes 4096x14336,8192x3584 --m 1,4,16 --rounds 5

``--trace`` prints, per variant, each CTA's timeline in one launch (decode_mlp.TRACE_POINTS, µs after
the first CTA's start: earliest / median / latest over the CTAs) instead of timing.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from swiglu_fused import bench
from swiglu_fused.kernels import ops

VARIANTS = {"whole_d8_u4": dict(gate_up_stream_k=False, down_split=8, fixup_unroll=4),
            "whole_pdl_u4": dict(gate_up_stream_k=False, pdl=True, fixup_unroll=4),
            "g2_u4": dict(gate_up_split=2, fixup_unroll=4), "g2_pdl_u4": dict(gate_up_split=2, pdl=True, fixup_unroll=4),
            "g3_pdl_u4": dict(gate_up_split=3, pdl=True, fixup_unroll=4),
            "g1_pdl_u4": dict(gate_up_split=1, pdl=True, fixup_unroll=4)}


def one_launch(module, trace=None, **options):
    """The module's MLP as quant_x and the one-launch kernel, on the module's own tensors."""
    from swiglu_fused import formats
    from swiglu_fused.kernels.pipeline import operands
    from swiglu_fused.kernels.sm90.decode_mlp import decode_mlp

    gu, dn = module.gate_up_interleaved, module.down_proj
    if not gu.tile_major:
        raise SystemExit("bench_decode_mlp: the module holds gate_up's weight in packed order (not an sm_90 GPU?)")
    fmt = formats.weight_format("fp8_block128")
    (gw, gs, _), (dw, ds, _) = (operands(fmt, p.op_tensors(), None) for p in (gu, dn))

    def run(x):
        xq, xs = ops.quant_x(x)
        return decode_mlp(xq, xs, gw, gs, dw, ds, trace=trace, **options)
    return run


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="4096x14336,8192x3584")
    p.add_argument("--m", default="1,4,16")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--trace", action="store_true", help="print each variant's timeline instead of timing")
    a = p.parse_args(argv)
    try:
        print(bench.require_gpu())
        shapes, ms = bench.parse_shapes(a.shapes), bench.parse_ms(a.m)
    except bench.BenchError as e:
        raise SystemExit(f"bench_decode_mlp: {e}") from None
    names = ("shipped", *VARIANTS)
    if a.trace:
        return timelines(shapes, ms)
    for hidden, inter in shapes:
        layers = []
        for seed in range(bench.layer_count(hidden, inter)):
            module = bench.fused(bench.hf_mlp(hidden, inter, seed), "fp8_block128")
            layers.append({"shipped": module, **{v: one_launch(module, **o) for v, o in VARIANTS.items()}})
        for m in ms:
            x = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
            with torch.no_grad():
                ref = layers[0]["shipped"](x).float()
                dist = {v: ((layers[0][v](x).float() - ref).norm() / ref.norm()).item() for v in VARIANTS}
                t = bench.interleaved_us({v: bench.rotating(layers, v, x) for v in names}, a.iters, a.rounds)
            med = {v: statistics.median(t[v]) for v in names}
            print(f"{hidden}x{inter} M={m:>3} shipped {med['shipped']:6.1f} "
                  + " ".join(f"| {v} {med[v]:6.1f} ({min(s / o for s, o in zip(t['shipped'], t[v])):.3f}-"
                             f"{max(s / o for s, o in zip(t['shipped'], t[v])):.3f}x, y {dist[v]:.1e})"
                             for v in VARIANTS), flush=True)
        del layers
        torch.cuda.empty_cache()


def timelines(shapes, ms):
    from swiglu_fused.kernels.sm90.decode_mlp import TRACE_POINTS
    from swiglu_fused.kernels.sm90.schedule import sm_count

    for hidden, inter in shapes:
        layers = [bench.fused(bench.hf_mlp(hidden, inter, seed), "fp8_block128")
                  for seed in range(bench.layer_count(hidden, inter))]
        trace = torch.zeros(sm_count(torch.device("cuda")), 8, dtype=torch.int64, device="cuda")
        for m in ms:
            x = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
            for v, options in VARIANTS.items():
                runs = [one_launch(layer, trace=trace, **options) for layer in layers]
                for _ in range(3):  # (compiled, warm; the last launch's timeline is kept)
                    for run in runs:
                        trace.zero_()
                        run(x)
                torch.cuda.synchronize()
                t = trace.cpu()
                t0 = t[:, 0][t[:, 0] > 0].min()
                cols = []
                for i, point in enumerate(TRACE_POINTS):
                    col = t[:, i][t[:, i] > 0].double().sub(t0).div(1000)
                    cols.append(f"{point} {col.min():.1f}/{col.median():.1f}/{col.max():.1f}")
                print(f"{hidden}x{inter} M={m:>3} {v:>8}: " + " | ".join(cols), flush=True)
        del layers
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
