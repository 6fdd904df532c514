"""The whole MLP with the launches between its kernels as dispatched, against plain launches, in
one process (DISPATCH D20: programmatic dependent launch of the fp8 MLP at M ≤ dispatch.PDL_M).
Variants, each its own module (its eager CUDA graphs are captured with its launches):

  shipped   as dispatched
  no_pdl    no PDL (every config's pdl off: what dispatch.PDL_M = 0 and WARP_MMA_PDL = False pick)
  memset    a zeroed stream-K counter tensor a launch (schedule.REUSE_COUNTERS off), not one buffer
  ab<i>     with --ab SPEC: the dispatched configs with those fields changed (bench_mlp's form,
            e.g. "gate_up:pdl=True,gate_up:ctas_per_sm=1,down:pdl=True,down:ctas_per_sm=1";
            repeatable), e.g. to time nvfp4 with PDL and a register count fixed at entry
  set<i>    with --set SPEC: the dispatch's or the schedule's module constants changed while the
            variant runs and is captured ("schedule.HBM_BYTES_PER_US=1.05e7;schedule.FIXUP_US=(1, 0.5)":
            MODULE.NAME=literal, ";"-separated; MODULE dispatch, dispatch_nvfp4 (nvfp4's tiles and the
            warp-MMA kernels), schedule or deepgemm; repeatable), e.g. to
            time plans the cost model does not pick

Each line: µs medians and, per variant, the range over rounds of shipped's speed-up over it
(> 1: the dispatched launches are faster), and whether its output differs from shipped's. With
--timeline, each variant's kernels in one call (torch.profiler over its CUDA graph; profile_mlp's
cut): per kernel its median µs and the gap from its end to the next kernel's start (negative: the
next one started before it ended, i.e. a programmatic dependent launch under its tail).

    python -m benchmarks.launch_ab --format fp8_block128 --m 1,16,64,256 --rounds 5
    python -m benchmarks.launch_ab --format nvfp4 --ab gate_up:ctas_per_sm=1,down:ctas_per_sm=1 \
        --ab gate_up:pdl=True,gate_up:ctas_per_sm=1,down:pdl=True,down:ctas_per_sm=1
    python -m benchmarks.launch_ab --m 1,16 --set schedule.HBM_BYTES_PER_US=1.05e7 \
        --set "schedule.HBM_BYTES_PER_US=1.05e7;schedule.FIXUP_US=(1.0, 0.5)"
"""

from __future__ import annotations

import argparse
import ast
import statistics

import torch

from benchmarks.harness import ALL_PDL, parse_ab, with_configs
from swiglu_fused import bench


# what dispatch picks with PDL_M = 0 and WARP_MMA_PDL off (no late trigger without PDL: D58)
NO_PDL = {family: {"pdl": False} | ({"late_trigger": False} if family == "warp_mma_gate_up" else {})
          for family in ALL_PDL}


def variants(abs_: dict, sets: dict) -> dict:
    """{name: wrap(module) → the module's forward as that variant runs it}: shipped, no_pdl, memset,
    then the --ab variants (with_configs' config changes) and the --set ones (constants changed)."""
    out = {"shipped": lambda module: module,
           "no_pdl": lambda module: with_configs(module, NO_PDL),
           "memset": lambda module: with_constants(module, parse_set("schedule.REUSE_COUNTERS=False"))}
    out.update({name: lambda module, f=fields: with_configs(module, f) for name, fields in abs_.items()})
    out.update({name: lambda module, c=constants: with_constants(module, c) for name, constants in sets.items()})
    return out


def parse_set(spec: str) -> dict:
    """{(module, name): value} from "MODULE.NAME=literal;..." (MODULE: dispatch, dispatch_nvfp4, schedule or
    deepgemm)."""
    from swiglu_fused.kernels import deepgemm, dispatch, dispatch_nvfp4
    from swiglu_fused.kernels.sm90 import schedule

    modules = {"dispatch": dispatch, "dispatch_nvfp4": dispatch_nvfp4, "schedule": schedule, "deepgemm": deepgemm}
    out = {}
    for item in filter(None, (part.strip() for part in spec.split(";"))):
        target, _, value = item.partition("=")
        mod, _, name = target.strip().partition(".")
        if mod not in modules or not hasattr(modules[mod], name):
            raise SystemExit(f"launch_ab: --set {item!r}: expected MODULE.NAME=VALUE with MODULE one of "
                             f"{sorted(modules)} and NAME one of its constants")
        try:
            out[(modules[mod], name)] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise SystemExit(f"launch_ab: --set {item!r}: the value is not a Python literal") from None
    return out


def with_constants(module, constants: dict):
    """The module's forward with the module constants changed while it runs (so a CUDA graph
    captured through it keeps the launches they lead to), restored after; the module's weights are
    put in the order the changed constants ask for now (settle_layout: dispatch.FP8_TILE_MAJOR)."""
    modules = module.modules() if hasattr(module, "modules") else ()  # (an nn.Module, or a plain forward)
    under_constants(constants, lambda: [m.settle_layout() for m in modules if hasattr(m, "settle_layout")])
    return lambda x: under_constants(constants, lambda: module(x))


def under_constants(constants: dict, fn):
    """fn() with the module constants changed, restored after."""
    old = {key: getattr(*key) for key in constants}
    for (mod, name), value in constants.items():
        setattr(mod, name, value)
    try:
        return fn()
    finally:
        for (mod, name), value in old.items():
            setattr(mod, name, value)


def same_as_shipped(layer: dict, names: tuple, x) -> dict:
    """{variant: whether its output on x equals shipped's bit for bit}, the ops run at x's M: a plain
    eager call of up to eager_graphs.MAX_ROWS rows would replay the module's eager CUDA graph of a
    power-of-two bucket of rows (48 as 64), not the launches the timings capture at M itself."""
    from swiglu_fused import eager_graphs

    def outputs():
        ref = layer["shipped"](x)
        return {v: torch.equal(layer[v](x), ref) for v in names[1:]}
    return under_constants({(eager_graphs, "ENABLED"): False}, outputs)


def timeline(name: str, call, replays: int = 3) -> str:
    """One line: ``call``'s kernels, one call's worth (profile_mlp's per_position over ``replays``
    replays of a CUDA graph of bench.REPS calls): median µs of each, then the gap to the next start."""
    from benchmarks.profile_mlp import kernel_records, per_position, short

    with torch.no_grad():
        rows, span = per_position(kernel_records(bench.capture(call), replays), replays * bench.REPS)
    return f"    {name:>8}: {span:6.1f} µs a call | " + " | ".join(
        f"{short(r['name'], 28)} {r['us']:.1f} ({r['gap_us']:+.1f})" for r in rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="4096x14336,8192x3584")
    p.add_argument("--m", default="1,16,64,256")
    p.add_argument("--format", action="append", dest="formats")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--ab", action="append", default=[], metavar="FAMILY:FIELD=VALUE,...",
                   help="one more variant: the dispatched configs with these fields changed (repeatable)")
    p.add_argument("--set", action="append", default=[], dest="sets", metavar="MODULE.NAME=VALUE;...",
                   help="one more variant: dispatch's or schedule's constants changed (repeatable)")
    p.add_argument("--skip", default="", metavar="NAME,...",
                   help="leave these of the standing variants out (no_pdl, memset), e.g. where no launch has PDL")
    p.add_argument("--timeline", action="store_true",
                   help="also each variant's kernels in one call: median µs and the gap to the next kernel's start")
    a = p.parse_args(argv)
    abs_ = {f"ab{i + 1}": parse_ab(spec) for i, spec in enumerate(a.ab)}
    sets = {f"set{i + 1}": parse_set(spec) for i, spec in enumerate(a.sets)}
    skip = set(filter(None, a.skip.split(",")))
    if skip - {"no_pdl", "memset"}:
        raise SystemExit(f"launch_ab: --skip {a.skip!r}: only no_pdl and memset can be left out")
    wraps = {name: wrap for name, wrap in variants(abs_, sets).items() if name not in skip}
    names = tuple(wraps)
    shown = {**abs_, **{f"set{i + 1}": spec for i, spec in enumerate(a.sets)}}
    try:
        print(bench.require_gpu(), *(f"{name}: {spec}" for name, spec in shown.items()), sep="\n")
        shapes, ms = bench.parse_shapes(a.shapes), bench.parse_ms(a.m)
    except bench.BenchError as e:
        raise SystemExit(f"launch_ab: {e}") from None
    for hidden, inter in shapes:
        for fmt in a.formats or ["fp8_block128"]:
            layers = []
            for seed in range(bench.layer_count(hidden, inter)):
                mlp = bench.hf_mlp(hidden, inter, seed)
                layers.append({v: wrap(bench.fused(mlp, fmt)) for v, wrap in wraps.items()})
            for m in ms:
                x = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
                with torch.no_grad():
                    same = same_as_shipped(layers[0], names, x)
                    t = bench.interleaved_us({v: bench.rotating(layers, v, x) for v in names}, a.iters, a.rounds)
                med = {v: statistics.median(t[v]) for v in names}
                gain = {v: [o / s for s, o in zip(t["shipped"], t[v])] for v in names[1:]}
                print(f"{fmt:>12} {hidden}x{inter} M={m:>5} shipped {med['shipped']:7.1f} "
                      + " ".join(f"| {v} {med[v]:7.1f} ({min(gain[v]):.3f}-{max(gain[v]):.3f}x"
                                 f"{'' if same[v] else ', DIFFERS'})" for v in names[1:]), flush=True)
                if a.timeline:
                    for v in names:
                        print(timeline(v, bench.rotating(layers, v, x)), flush=True)
            del layers
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
