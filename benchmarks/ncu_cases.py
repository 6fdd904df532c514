"""Launches chosen kernels once each inside an NVTX range, for Nsight Compute to profile (GPU).

Each case runs ours (the dispatched config, or a named variant), cuBLAS's peer GEMM and, where it is
importable, DeepGEMM's on the same operands. Warm-up (compilation, cuBLAS heuristics) happens outside the ranges, so

    ncu --clock-control none --nvtx --nvtx-include "regex:^prof/" --section SpeedOfLight ... \\
        python -m benchmarks.ncu_cases

profiles exactly the launches listed on stdout, in that order (the stream-K counter memset is a
separate launch and shows up too). Cases: --cases fp8_256,fp8_16,... (see CASES). With --set SPEC (launch_ab's:
module constants changed, e.g. a variant the dispatch does not pick) each case runs again under each spec.
"""

from __future__ import annotations

import argparse
import dataclasses
from unittest import mock

import torch

from benchmarks import harness as b
from benchmarks.launch_ab import parse_set, under_constants
from benchmarks.bench_swap_ab import forced
from swiglu_fused.kernels.sm90 import gate_up as kg, schedule

# name: (mainloop, hidden, inter, M, [(label, config or None for the dispatched one[, forced split])]);
# a forced split is bench_swap_ab.forced's argument (1: whole tiles), fixed at the first call
CASES = {
    "fp8_16": ("fp8_block128", 8192, 3584, 16, [("ours", None)]),
    "fp8_256": ("fp8_block128", 8192, 3584, 256, [
        ("ours tile64 v5", None), ("tile64 v1", kg.GateUpConfig(tile_m=64, stages=5, overlap=False))]),
    "fp8_128": ("fp8_block128", 8192, 3584, 128, [
        ("ours", None), ("tile64 whole tiles", kg.GateUpConfig(tile_m=64, stages=5), 1),
        ("tile64 cl2", kg.GateUpConfig(tile_m=64, stages=5, cluster_m=2))]),
    "fp8_4096": ("fp8_block128", 8192, 3584, 4096, [("ours", None)]),
    "fp8_8b_1024": ("fp8_block128", 4096, 14336, 1024, [("ours", None)]),  # DeepGEMM 15 % ahead (issue 25)
    "fp8_8b_4096": ("fp8_block128", 4096, 14336, 4096, [("ours", None)]),
    "bf16_16": ("bf16", 8192, 3584, 16, [("ours", None)]),  # behind cuBLAS's bf16 GEMM (eleventh session)
    "bf16_1024": ("bf16", 8192, 3584, 1024, [("ours", None)]),
    "bf16_4096": ("bf16", 4096, 14336, 4096, [("ours", None)]),
    # Flux.2-dev's single-stream projection as gate_up (K = 6144, 2I = 3·6144 + 2·18432 rows, M = 4608):
    # our bf16 split GEMM is 3 % behind cuBLAS's there (issue 24)
    "bf16_flux": ("bf16", 6144, 27648, 4608, [("ours", None)]),
    # nvfp4 W4A16 (issue 22) on the tile-major weight the modules hold: decode at 2× its floor
    "nvfp4_8b_1": ("nvfp4", 4096, 14336, 1, [("ours", None)]),
    "nvfp4_8b_256": ("nvfp4", 4096, 14336, 256, [("ours", None)]),
    # the prefill W4A16 tile where nvfp4 is furthest behind our bf16 (0.80-0.87× the MLP, 8192×3584 M = 1024)
    "nvfp4_70b_1024": ("nvfp4", 8192, 3584, 1024, [("ours", None)]),
    # the 64-token tile at 2.7× its floor (issue 22's M = 64 target: 1.35×)
    "nvfp4_8b_64": ("nvfp4", 4096, 14336, 64, [("ours", None)]),
}
# nvfp4's gate_up and down through ops as the modules call them (the dispatched configs: the warp-MMA
# kernels at decode sizes, D33; the wgmma tiles above, with x's copy where it runs): name: (hidden, inter, M)
OPS_CASES = {
    "nvfp4_wm_8b_1": (4096, 14336, 1),
    "nvfp4_wm_8b_8": (4096, 14336, 8),
    "nvfp4_wm_8b_16": (4096, 14336, 16),
    "nvfp4_wm_70b_1": (8192, 3584, 1),
    "nvfp4_ops_8b_64": (4096, 14336, 64),  # (behind our fp8 MLP there: STATUS "What is open")
    "nvfp4_ops_70b_64": (8192, 3584, 64),
}


def operands(mainloop, m, hidden, inter):
    if mainloop == "nvfp4":  # x, the global scale multipliers, and the tile-major weight and scales
        from benchmarks.bench_nvfp4 import nvfp4_gate_up
        from swiglu_fused.kernels import nvfp4_layout

        w, ws, gs = nvfp4_gate_up(hidden, inter, 0)
        x = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
        return x, gs, *nvfp4_layout.to_tile_major(w, ws)
    if mainloop == "bf16":
        x = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
        w = (torch.randn(2 * inter, hidden, device="cuda") * 0.05).to(torch.bfloat16)
        return x, None, w, None
    return b.operands(m, hidden, inter)


def run_ops_case(name):
    from benchmarks.bench_nvfp4 import _nvfp4_down, nvfp4_gate_up
    from swiglu_fused.kernels import nvfp4_layout, ops

    hidden, inter, m = OPS_CASES[name]
    gw, gs, ggs = nvfp4_gate_up(hidden, inter, 0)
    dw, ds, dgs = _nvfp4_down(hidden, inter, 1)
    gw, gs = nvfp4_layout.to_tile_major(gw, gs)
    dw, ds = nvfp4_layout.to_tile_major(dw, ds)
    x = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
    h = torch.randn(m, inter, device="cuda").to(torch.bfloat16)
    calls = [("gate_up", lambda: ops.gate_up(x, gw, gs, None, ggs, interleave=128, h_format="bf16", tile_major=True)),
             ("down", lambda: ops.down(h, dw, ds, None, dgs, tile_major=True))]
    _profile(name, f"{hidden}x{inter} M={m}", calls)


def _profile(name, what, calls):
    for _, fn in calls:  # compile, pick cuBLAS's kernel
        fn(), fn()
    torch.cuda.synchronize()
    for label, fn in calls:
        print(f"{name} {what}: {label}", flush=True)
        torch.cuda.nvtx.range_push("prof")
        fn()
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()


def run_case(name):
    if name in OPS_CASES:
        return run_ops_case(name)
    mainloop, hidden, inter, m, variants = CASES[name]
    x, xs, w, ws = operands(mainloop, m, hidden, inter)
    calls = []
    nvfp4 = mainloop == "nvfp4"  # (xs holds the global scale multipliers there)
    for label, cfg, *split in variants:
        if cfg is None and nvfp4:
            from swiglu_fused.kernels import dispatch

            cfg = dispatch.gate_up_config(x, w, ws, None, act="silu", h_format="bf16", tile_major=True)
        elif cfg is None:  # h as the MLP of that format writes it (bf16's in bf16: until 2026-12-01 fp8 here)
            cfg = b.gate_up_config(x, w, ws, xs, act="silu", h_format="bf16" if mainloop == "bf16" else "fp8_group128")
        else:
            cfg = dataclasses.replace(cfg, mainloop=mainloop)
        plan = forced(split[0]) if split else schedule.plan

        def call(c=cfg, plan=plan):
            with mock.patch.object(schedule, "plan", plan):
                if nvfp4:
                    kg.gate_up(c, x, w, ws, None, xs, tile_major=True)
                else:
                    kg.gate_up(c, x, w, ws, xs)
        calls.append((f"{label} {cfg}", call))
    if mainloop == "bf16":
        calls.append(("cuBLAS bf16 GEMM", lambda: x @ w.t()))
    elif not nvfp4:  # (nvfp4: no peer runs it on Hopper in this process)
        gemm, _ = b.cublas_gemm(x, xs, w, ws)
        peer = b.peer_sets([(x, xs, w, ws)])[0]
        calls.append(("cuBLAS fp8 block GEMM", lambda: gemm(*peer)))
        dg = b.deep_gemm()
        if dg is not None:  # where importable (a peer, issue 25)
            dg_gemm = b.deep_gemm_block_gemm(dg)
            calls.append(("DeepGEMM fp8 block GEMM", lambda: dg_gemm(*peer)))
    _profile(name, f"{hidden}x{inter} M={m}", calls)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    names = [*CASES, *OPS_CASES]
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from {', '.join(names)}")
    p.add_argument("--set", action="append", default=[], metavar="SPEC",
                   help="launch_ab's --set: each case again with these module constants (repeatable)")
    a = p.parse_args()
    for name in a.cases.split(","):
        if name not in names:
            p.error(f"--cases: unknown case {name!r}; choose from {', '.join(names)}")
    specs = [("shipped", {})] + [(spec, parse_set(spec)) for spec in a.set]
    for spec, constants in specs:
        for name in a.cases.split(","):
            torch.manual_seed(0)
            print(f"--- {spec}", flush=True)
            under_constants(constants, lambda: run_case(name))


if __name__ == "__main__":
    main()
