"""gate_up config variants against the dispatched config, timed in turn on the same operands (GPU).

Each variant is the dispatched config (harness.gate_up_config) with some fields replaced:

    python -m benchmarks.ab_gate_up --shapes 8192x3584 --m 1024,4096 --rounds 5 \\
        --variant stagger:stagger=True --variant tile64:tile_m=64,stages=5

``--set MODULE.NAME=VALUE;...`` (launch_ab's form; repeatable) adds a variant that is the config
dispatched, and launched, with dispatch's or the schedule's constants changed, e.g. a schedule the
cost model does not pick:

    python -m benchmarks.ab_gate_up --mainloop bf16 --shapes 8192x3584 --m 640 \
        --set "schedule.HYBRID_SPREAD=-1" --set "dispatch.WG3_MIN_GAIN=0;dispatch.SPLIT64_ROUNDS=10"

Every variant's h is first compared with the dispatched config's (bit-identical, or the largest
difference is printed), then all are captured as CUDA graphs (operands rotated past L2, as in
bench_gate_up) and timed in turn, --rounds times: medians and per-round ratios to the dispatched.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import torch

from benchmarks import harness as b
from benchmarks.launch_ab import parse_set, under_constants
from swiglu_fused.kernels.sm90 import gate_up as kg



def same_h(cfg_a, cfg_b, ops, constants=None) -> str:
    x, xs, w, ws = ops
    h_a, hs_a = kg.gate_up(cfg_a, x, w, ws, xs)
    (x, xs, w, ws), = b.in_weight_order(cfg_b, [ops], 2)
    h_b, hs_b = under_constants(constants or {},
                                lambda: kg.gate_up(cfg_b, x, w, ws, xs, tile_major=cfg_b.tile_major))
    if torch.equal(h_a.view(torch.uint8), h_b.view(torch.uint8)) and (hs_a is None or torch.equal(hs_a, hs_b)):
        return "bit-identical"
    return f"max |dh| {(h_a.float() - h_b.float()).abs().max().item():.3g}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="8192x3584,4096x14336", help="HxI list")
    p.add_argument("--m", default="1024,4096")
    p.add_argument("--mainloop", default="fp8_block128", choices=["fp8_block128", "bf16"])
    p.add_argument("--variant", action="append", default=[], metavar="NAME:FIELD=VALUE,...",
                   help="a GateUpConfig with these fields replaced (repeatable)")
    p.add_argument("--set", action="append", default=[], dest="sets", metavar="MODULE.NAME=VALUE;...",
                   help="a variant dispatched and launched with dispatch's or schedule's constants changed "
                        "(repeatable)")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    variants = [b.parse_variant(v) for v in a.variant]
    consts = {f"set{i + 1}": parse_set(spec) for i, spec in enumerate(a.sets)}
    for name, spec in zip(consts, a.sets):
        print(f"{name}: {spec}")
    h_format = "fp8_group128" if a.mainloop == "fp8_block128" else "bf16"
    rows = []
    for shape in a.shapes.split(","):
        hidden, inter = map(int, shape.split("x"))
        for m in map(int, a.m.split(",")):
            def make(seed, m=m, hidden=hidden, inter=inter):
                if a.mainloop == "bf16":
                    return b.bf16_operands(m, hidden, inter, seed)
                return b.operands(m, hidden, inter, seed)

            first = make(0)
            ops = b.rotation(make, sum(t.nbytes for t in first if t is not None))
            del first
            x, xs, w, ws = ops[0]
            base = b.gate_up_config(x, w, ws, xs, act="silu", h_format=h_format)
            if base is None:
                print(f"H={hidden} I={inter} M={m}: no sm90 config (the reference would run); skipped")
                continue
            cfgs = {"dispatched": base}
            for n, f in variants:
                try:
                    cfgs[n] = dataclasses.replace(base, **f)
                except ValueError as e:  # e.g. a split_n field where the dispatched tile is not split_n
                    print(f"H={hidden} I={inter} M={m}: variant {n} does not apply ({e})")
            for n, constants in consts.items():
                cfgs[n] = under_constants(constants,
                                          lambda: b.gate_up_config(x, w, ws, xs, act="silu", h_format=h_format))
            checks = {n: same_h(base, c, ops[0], consts.get(n)) for n, c in cfgs.items() if n != "dispatched"}
            fns = {n: b.cycling(lambda x, xs, w, ws, c=c, k=consts.get(n, {}): under_constants(
                       k, lambda: kg.gate_up(c, x, w, ws, xs, tile_major=c.tile_major)),
                       b.in_weight_order(c, ops, 2)) for n, c in cfgs.items()}
            per_round = b.interleaved_us(fns, a.iters, a.rounds, max(b.REPS, len(ops)))
            med = {n: statistics.median(v) for n, v in per_round.items()}
            ratios = {n: [d / t for d, t in zip(per_round["dispatched"], v)] for n, v in per_round.items()}
            rows.append(dict(hidden=hidden, inter=inter, m=m, configs={n: str(c) for n, c in cfgs.items()},
                             us=med, us_per_round=per_round, checks=checks))
            print(f"H={hidden} I={inter} M={m}: dispatched {med['dispatched']:.1f} µs ({base})")
            for n in cfgs:
                if n != "dispatched":
                    print(f"  {n:>14}: {med[n]:8.1f} µs  speed-up {min(ratios[n]):.3f}–{max(ratios[n]):.3f}"
                          f"  (h {checks[n]})", flush=True)
            del ops
            torch.cuda.empty_cache()
    b.write_json(a.json, rounds=a.rounds, rows=rows)


if __name__ == "__main__":
    main()
