"""bf16 gate_up next to QuACK's gated GEMM (Dao-AILab/quack: a GEMM whose epilogue writes
act(gate)·up) and next to cuBLAS alone, all in one process on the same random inputs.

    python -m benchmarks.bench_quack --json out.json

What it needs besides the package: an sm_90 GPU, the CuTe DSL (`pip install 'swiglu-fused[cuda]'`,
nvidia-cutlass-dsl 4.8.1) and QuACK's Python sources at commit c7cbc61 on PYTHONPATH. Two ways:

    git clone https://github.com/Dao-AILab/quack && git -C quack checkout c7cbc61
    PYTHONPATH=$PWD/quack python -m benchmarks.bench_quack ...

or, where the checkout has to travel (our GPU machine receives only the working tree):
`bash benchmarks/quack_bundle.sh /path/to/quack/.git` writes `.quack/` (git-ignored), and
`source .quack/env.sh` unpacks it and sets PYTHONPATH. (On our lent GPU machine the CuTe DSL comes
from a bundle of that machine, sourced before this; that is a detail of the machine, not of the
repository: anywhere else the pip package is the DSL.)

Peers (x [M, H] bf16, packed weight W [2I, H] bf16):
  quack   quack.gemm_interface.gemm_gated(x, W.T, activation="swiglu", store_preact=False) → bf16
          h [M, I]. QuACK's layout: gate = even rows of W, up = odd rows. Autotuned per shape by
          QuACK's own autotuner on its first call (18 sm90 configs; --quack-untuned: its default
          config, 128×192 ping-pong, cluster 2×1).
  ours    swiglu_fused.kernels.ops.gate_up(x, W, interleave=128, h_format="bf16") → bf16 h [M, I]
          (gate/up in chunks of 128 rows).
  cublas  x @ W.T, the packed [M, 2I] GEMM alone, no activation: the reference rate.
Both fused peers get the same W: the interleaving decides which rows are gate, not the work done.
Timing is bench_gate_up's: CUDA graphs of 10 launches, median of --iters replays, operand sets
rotated past twice the 50 MB L2. Every case also checks both fused outputs against silu(gate)·up of
the cuBLAS product, and one small case checks QuACK against an fp32 torch reference first.

QuACK version: .quack/ (built by benchmarks/quack_bundle.sh from a clone of Dao-AILab/quack)
carries commit c7cbc61 (2026-03-08). Later commits compile and launch their
GEMMs through apache-tvm-ffi and import it with `import quack`; that package (about 1 MB of native
libraries) is not on the GPU machine and does not fit the transfer. c7cbc61 needs only torch,
triton and CuTe DSL, and its kernels compile with DSL 4.8.1 once two type names that moved from
cute.core to cute are aliased back (``import_quack``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import traceback
from pathlib import Path

import torch

QUACK_HINT = ("put QuACK c7cbc61's sources on PYTHONPATH (PYTHONPATH=/path/to/quack, or source .quack/env.sh from benchmarks/quack_bundle.sh) and install the CuTe DSL (pip install 'swiglu-fused[cuda]')")


def fail(msg: str, exc: BaseException | None = None):
    """Exit with one readable message (and the last frames of exc), not a traceback wall."""
    if exc is not None:
        frames = "".join(traceback.format_exception(exc, limit=-3)).rstrip()
        msg = f"{msg}\n  {type(exc).__name__}: {exc}\n--- last frames ---\n{frames}"
    sys.exit(f"bench_quack: {msg}")


def import_quack():
    """QuACK's gemm_interface module. c7cbc61 annotates with cute.core.ThrCopy / ThrMma, which
    DSL 4.6+ exposes only as cute.ThrCopy / cute.ThrMma: alias them (nothing else differs)."""
    try:
        from cutlass import cute

        for name in ("ThrCopy", "ThrMma"):
            if not hasattr(cute.core, name):
                setattr(cute.core, name, getattr(cute, name))
        import quack
        from quack import gemm_interface
    except ImportError as e:
        fail(f"cannot import QuACK ({e}); {QUACK_HINT}")
    except Exception as e:
        fail("importing QuACK failed", e)
    return quack, gemm_interface


def rel_err(h, ref):
    return ((h.float() - ref).norm() / ref.norm()).item()


def swiglu_adjacent(y):
    """QuACK's pairing: gate = column 2j, up = column 2j+1 of the packed product y [M, 2I]."""
    y = y.float()
    return torch.nn.functional.silu(y[:, 0::2]) * y[:, 1::2]


def check_small(quack_gated, tol):
    """QuACK on one small case (M not a multiple of any tile) against an fp32 torch reference."""
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(200, 1024, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(2 * 1536, 1024, device="cuda", generator=g) * 0.05).to(torch.bfloat16)
    err = rel_err(quack_gated(x, w), swiglu_adjacent(x.float() @ w.float().t()))
    print(f"QuACK check, M=200 H=1024 I=1536: rel. error {err:.2e} (tolerance {tol:.0e})")
    if not err < tol:
        fail(f"QuACK's output does not match silu(gate)·up (rel. error {err:.2e}): wrong call or layout")
    return err


def ours_config(ops, x, w):
    """The sm90 config ops.gate_up dispatches to (None: it fell back to the torch reference);
    only reported: "?" if it cannot be asked."""
    from benchmarks.harness import gate_up_config

    try:
        return gate_up_config(x, w, None, None, act="silu", h_format="bf16")
    except Exception:
        return "?"


def tile256(cfg):
    """ours with cfg's tile_n set back to 256 (the granule tile's A/B)."""
    import dataclasses

    from swiglu_fused.kernels.sm90 import gate_up as kg

    cfg = dataclasses.replace(cfg, tile_n=256)
    return lambda x, w: kg.gate_up(cfg, x, w)[0]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="4096x14336,8192x3584", help="HxI list")
    p.add_argument("--m", default="16,64,256,1024,4096", help="token counts M")
    p.add_argument("--iters", type=int, default=30, help="graph replays per timing (median)")
    p.add_argument("--rounds", type=int, default=1, help="time the peers in turn this many times (median)")
    p.add_argument("--json", default=None, help="write results here (and a PNG next to it)")
    p.add_argument("--quack-untuned", action="store_true", help="QuACK's default config, no autotuning")
    p.add_argument("--tol", type=float, default=2e-2, help="relative error allowed in the checks")
    a = p.parse_args()
    if not torch.cuda.is_available():
        fail("no CUDA device (this benchmark needs an sm_90 GPU)")
    quack, gi = import_quack()
    from benchmarks.harness import L2_BYTES, REPS, act_mul_bf16, cycling, graph_time_us, rotation

    from swiglu_fused.kernels import ops

    tuned = not a.quack_untuned

    def quack_gated(x, w):
        return gi.gemm_gated(x, w.t(), activation="swiglu", store_preact=False, tuned=tuned)[1]

    def ours(x, w):
        return ops.gate_up(x, w, interleave=128, act="silu", h_format="bf16")[0]

    def cublas(x, w):
        return x @ w.t()

    try:
        small_err = check_small(quack_gated, a.tol)
    except Exception as e:
        fail("QuACK's gemm_gated failed on the check case", e)

    rows = []
    print(f"{'M':>6} {'H':>6} {'I':>6} {'QuACK us':>9} {'ours us':>8} {'cuBLAS us':>9} {'ours/QuACK':>10} "
          f"{'QuACK TF/s':>10} {'ours TF/s':>9}  QuACK config | ours config")
    for shape in a.shapes.split(","):
        hidden, inter = map(int, shape.split("x"))
        for m in map(int, a.m.split(",")):
            def make(seed, m=m, hidden=hidden, inter=inter):
                g = torch.Generator(device="cuda").manual_seed(seed)
                return (torch.randn(m, hidden, device="cuda", generator=g).to(torch.bfloat16),
                        (torch.randn(2 * inter, hidden, device="cuda", generator=g) * 0.05).to(torch.bfloat16))

            first = make(0)
            sets = rotation(make, sum(t.nbytes for t in first))
            del first
            reps = max(REPS, len(sets))
            x, w = sets[0]
            # first calls outside the graphs: QuACK autotunes (compiles each config once per process),
            # ours compiles; both outputs checked against the cuBLAS product
            y = cublas(x, w)
            try:
                h_q = quack_gated(x, w)
            except Exception as e:
                fail(f"QuACK's gemm_gated failed at M={m}, H={hidden}, I={inter}", e)
            h_o = ours(x, w)
            err_q, err_o = rel_err(h_q, swiglu_adjacent(y)), rel_err(h_o, act_mul_bf16(y).float())
            best = getattr(gi.gemm_gated_tuned, "best_config", None) if tuned else None
            q_cfg = best.kwargs["config"] if best is not None else gi.default_config(x.device)
            q_failed = sum(1 for t in getattr(gi.gemm_gated_tuned, "configs_timings", {}).values()
                           if not math.isfinite(t[0])) if tuned else 0
            o_cfg = ours_config(ops, x, w)
            del y, h_q, h_o

            # where ours dispatches the 224-row granule tile, also the 256-row tile it replaced
            peers = [quack_gated, ours, cublas] + ([tile256(o_cfg)] if getattr(o_cfg, "granules", False) else [])
            times = [[] for _ in peers]
            for _ in range(a.rounds):  # in turn, so that clock drift reaches every peer alike
                for f, ts in zip(peers, times):
                    ts.append(graph_time_us(cycling(f, sets), a.iters, reps))
            t_q, t_o, t_c = (statistics.median(ts) for ts in times[:3])
            t_256 = statistics.median(times[3]) if len(times) > 3 else None
            flops = 2 * m * 2 * inter * hidden
            r = dict(m=m, hidden=hidden, inter=inter, quack_us=t_q, ours_us=t_o, cublas_us=t_c,
                     ours_over_quack=t_o / t_q, quack_tflops=flops / t_q / 1e6, ours_tflops=flops / t_o / 1e6,
                     cublas_tflops=flops / t_c / 1e6, quack_rel_err=err_q, ours_rel_err=err_o,
                     quack_config=str(q_cfg), quack_configs_failed=q_failed,
                     ours_config=str(o_cfg), ours_tile256_us=t_256,
                     rotated_sets=len(sets), rounds=a.rounds)
            rows.append(r)
            q_short = (f"{q_cfg.tile_m}x{q_cfg.tile_n} {'pp' if q_cfg.pingpong else 'coop'} "
                       f"c{q_cfg.cluster_m}x{q_cfg.cluster_n}")
            o_short = (f"tile_m={getattr(o_cfg, 'tile_m', '?')}{' swap_ab' if getattr(o_cfg, 'swap_ab', False) else ''}"
                       f"{' cluster_m=2' if getattr(o_cfg, 'cluster_m', 1) == 2 else ''}"
                       if o_cfg is not None else "REFERENCE PATH (no kernel)")
            if t_256 is not None:
                o_short += f" tile_n=224 (tile_n=256: {t_256:.1f} us)"
            flags = "".join(f"  !{n} err {e:.1e}" for n, e in (("QuACK", err_q), ("ours", err_o)) if not e < a.tol)
            if q_failed:
                flags += f"  ({q_failed} QuACK configs failed in autotuning)"
            print(f"{m:>6} {hidden:>6} {inter:>6} {t_q:>9.1f} {t_o:>8.1f} {t_c:>9.1f} {t_o / t_q:>10.2f} "
                  f"{r['quack_tflops']:>10.0f} {r['ours_tflops']:>9.0f}  {q_short} | {o_short}{flags}", flush=True)
            del x, w, sets
            torch.cuda.empty_cache()

    import cutlass

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    data = dict(device=torch.cuda.get_device_name(), date=datetime.datetime.now().isoformat(timespec="seconds"),
                torch=torch.__version__, cuda=torch.version.cuda, cutlass_dsl=cutlass.__version__,
                triton=triton_version, quack=quack.__version__, quack_commit=os.environ.get("QUACK_COMMIT"),
                quack_tuned=tuned, iters=a.iters, graph_launches=REPS, l2_bytes=L2_BYTES,
                quack_check_rel_err=small_err, rows=rows)
    if a.json:
        Path(a.json).write_text(json.dumps(data, indent=1))
        print("wrote", a.json)
        try:
            from benchmarks.plot import plot  # (needs matplotlib)
        except ImportError:
            print("matplotlib not installed: no PNG (the JSON has every number)")
        else:
            print("wrote", plot(Path(a.json)))


if __name__ == "__main__":
    main()
