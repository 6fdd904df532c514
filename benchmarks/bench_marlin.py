"""Our nvfp4 MLP against vLLM's Marlin W4A16 GEMM, the kernel vLLM and SGLang run NVFP4 checkpoints
with on Hopper (issue 22's peer): the whole MLP and each projection alone, same process, same
weights, CUDA graphs, layers rotated past twice the L2, all pipelines timed in turn in a random order
each round (swiglu_fused.bench.interleaved_us).

    python -m benchmarks.bench_marlin --marlin DIR [--shapes 4096x14336,8192x3584] [--m 1,16,64,1024]
        [--rounds 3] [--out DIR]

Pipelines (µs per call; the table also gives each peer over ours):
  ours_nvfp4     FusedSwiGLUMLP in nvfp4 (our W4A16 kernels, as dispatched)
  marlin_nvfp4   what a serving engine runs for the same MLP: Marlin's GEMM over the packed gate_up
                 [M, 2I] (global scale 1), our act·mul kernel with the gate and up global scales
                 (kernels/sm90/act_mul.py: one memory-bound pass, as vLLM's SiLU-and-mul), Marlin's
                 GEMM for down (its global scale)
  ours_bf16, hf_bf16   our bf16 MLP and transformers' LlamaMLP on the bf16 weights (yardsticks)
  *_gate_up, *_down    each projection alone: ours (ops.gate_up with its act·up epilogue, ops.down)
                 and Marlin's GEMM (gate_up without the act·mul)
and the nvfp4 weight floor (codes + e4m3 scales at 4.2 TB/s, the H200's copy rate).

Marlin is not a dependency and is not in this repository: DIR holds ``marlin_peer.py`` and the
library it loads, built from vLLM's source on the GPU machine (a recipe kept out of the repository,
as for DeepGEMM; benchmarks/history/nvfp4.md says which vLLM commit and how). Its interface:
``prepare(weight_packed, weight_scale, global_scale)`` (our packed nvfp4 tensors on the GPU: uint8
[N, K/2] low nibble first, e4m3 [N, K/16], a one-value fp32 multiplier) → an object, and
``gemm(prepared, x)`` → x @ W^T, bf16 [M, N]. Every pipeline's output is first checked against the
fp32 reference on the same packed weights.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import statistics
import sys
from pathlib import Path

import torch

from benchmarks.harness import rel_frobenius
from swiglu_fused import bench, formats
from swiglu_fused.kernels import ops, reference

COPY_TB_S = 4.2  # the H200's measured copy rate (benchmarks/STATUS.md)
ACT = "silu"
MAX_REL_ERR = 2e-2  # bf16 rounding of h and y (DESIGN §4 allows 5e-3 for h; y adds the down GEMM's)


def load_peer(path: str):
    """The marlin_peer module in ``path`` (SystemExit 2 with the reason where it cannot load)."""
    folder = Path(path)
    if not (folder / "marlin_peer.py").is_file():
        raise SystemExit(f"--marlin {path}: no marlin_peer.py there (the module docstring says what it holds)")
    sys.path.insert(0, str(folder.resolve()))
    try:
        return importlib.import_module("marlin_peer")
    except Exception as e:  # noqa: BLE001 (any load failure is the user's to fix: say it)
        raise SystemExit(f"--marlin {path}: marlin_peer does not load: {type(e).__name__}: {e}") from None


def nvfp4_bytes(hidden: int, inter: int) -> int:
    """The MLP's nvfp4 weight bytes: codes (half a byte) and e4m3 scales (one per 16) of 3·H·I values."""
    return 3 * hidden * inter * 9 // 16


def layer_count(hidden: int, inter: int, l2: int) -> int:
    """Independent layers one pass must cycle through to move more than twice the L2 in nvfp4."""
    return max(2, -(-2 * l2 // nvfp4_bytes(hidden, inter)) + 1)


class MarlinMLP:
    """The serving engine's nvfp4 MLP on Marlin (module docstring) over one of our nvfp4 modules'
    packed tensors."""

    def __init__(self, peer, module):
        from swiglu_fused.kernels.sm90 import act_mul

        gu, dn = module.gate_up_interleaved, module.down_proj
        one = torch.ones(1, dtype=torch.float32, device="cuda")
        t = gu.tensors()
        self.gate_up = peer.prepare(t["weight_packed"], t["weight_scale"], one)
        t = dn.tensors()
        self.down = peer.prepare(t["weight_packed"], t["weight_scale"], dn.op_tensors()["weight_global_scale"])
        # act_mul's scaled form multiplies by these · 2^UNSHIFT (its dequantized-GEMM input)
        self.multipliers = (gu.op_tensors()["weight_global_scale"] * 2.0 ** -act_mul.UNSHIFT).contiguous()
        self.peer, self.act_mul = peer, act_mul

    def gate_up_gemm(self, x):
        return self.peer.gemm(self.gate_up, x)

    def __call__(self, x):
        h = self.act_mul.act_mul(self.gate_up_gemm(x), ACT, multipliers=self.multipliers)
        return self.peer.gemm(self.down, h)


def our_gate_up(module, h_order: str = "auto"):
    """ops.gate_up on the module's tensors as held. h_order "auto" (timed): h in the order our down
    reads at this M, as in the MLP; "natural": h as the reference orders it (checked)."""
    t = module.gate_up_interleaved
    w = t.op_tensors()
    return lambda x: ops.gate_up(x, w["weight_packed"], w["weight_scale"], None, w["weight_global_scale"],
                                 interleave=module.interleave, act=ACT, h_format="bf16", tile_major=t.tile_major,
                                 h_order=h_order)[0]


def our_down(module, h_order: str = "auto"):
    """ops.down on the module's tensors as held (h_order: our_gate_up's)."""
    t = module.down_proj
    w = t.op_tensors()
    return lambda h: ops.down(h, w["weight_packed"], w["weight_scale"], None, w["weight_global_scale"],
                              out_dtype=torch.bfloat16, tile_major=t.tile_major, h_order=h_order)


def reference_mlp(module, x):
    """The fp32 reference of the nvfp4 MLP on the module's tensors as held (what both sides compute):
    kernels/reference.py's, as the module passes them to the ops."""
    gu, dn = module.gate_up_interleaved, module.down_proj
    return reference.mlp(x, gu.op_tensors(), dn.op_tensors(), weight_format="nvfp4", interleave=module.interleave,
                         act=ACT, global_scale_kind=formats.MULTIPLIER, tile_major=(gu.tile_major, dn.tile_major))


def run(peer, shapes, ms, rounds: int, iters: int, say=print, out: Path | None = None) -> dict:
    """The result (JSON-ready); written to ``out`` after each shape as well, so that a run cut short
    keeps what it measured."""
    l2 = bench.l2_bytes()
    rows = []
    result = dict(benchmark="bench_marlin", **bench.header(), marlin=getattr(peer, "SOURCE", "unknown"),
                  settings=dict(shapes=[list(s) for s in shapes], m=list(ms), rounds=rounds, iters=iters,
                                reps=bench.REPS, l2_bytes=l2, copy_tb_s=COPY_TB_S), rows=rows)
    for hidden, inter in shapes:
        layers = []
        for seed in range(layer_count(hidden, inter, l2)):
            mlp = bench.hf_mlp(hidden, inter, seed)
            ours = bench.fused(mlp, "nvfp4")
            marlin = MarlinMLP(peer, ours)
            layers.append(dict(hf_bf16=mlp, ours_bf16=bench.fused(mlp, "bf16"), ours_nvfp4=ours, marlin_nvfp4=marlin,
                               ours_gate_up=our_gate_up(ours), marlin_gate_up=marlin.gate_up_gemm,
                               ours_down=our_down(ours), marlin_down=lambda h, m=marlin: peer.gemm(m.down, h)))
        floor = nvfp4_bytes(hidden, inter) / COPY_TB_S / 1e6
        for m in ms:
            x = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
            h = torch.randn(m, inter, device="cuda").to(torch.bfloat16)
            with torch.no_grad():
                errs = _check(layers[0], x, h)
                fns = {n: bench.rotating(layers, n, h if n.endswith("_down") else x) for n in layers[0]}
                per_round = bench.interleaved_us(fns, iters, rounds, bench.REPS, True)
            row = dict(hidden=hidden, inter=inter, m=m, layers=len(layers), floor_us=floor, rel_err=errs,
                       **{f"{n}_us": _median(v) for n, v in per_round.items()},
                       **{f"{n}_us_per_round": v for n, v in per_round.items()})
            rows.append(row)
            say(f"  {hidden}×{inter} M = {m}: " + ", ".join(f"{n} {row[f'{n}_us']:.1f}" for n in per_round)
                + f" µs (floor {floor:.1f})")
        del layers
        torch.cuda.empty_cache()
        if out is not None:
            bench.save_json(out, result)
    return result


def _check(layer, x, h) -> dict:
    """Relative Frobenius error of the MLPs against the fp32 reference, and of Marlin's projections
    against ours (both on the same packed weights); SystemExit where one is off."""
    ref = reference_mlp(layer["ours_nvfp4"], x)
    errs = {n: rel_frobenius(layer[n](x), ref) for n in ("ours_nvfp4", "marlin_nvfp4")}
    gu = layer["marlin_gate_up"](x).float()
    y = gu.view(x.shape[0], -1, 2, bench.GROUP) * layer["marlin_nvfp4"].multipliers.view(2, 1) * 2.0 ** layer[
        "marlin_nvfp4"].act_mul.UNSHIFT
    h_marlin = reference.gate_up_epilogue(y.flatten(1), act=ACT)[0]
    ours = layer["ours_nvfp4"]
    errs["marlin_gate_up_vs_ours"] = rel_frobenius(h_marlin, our_gate_up(ours, "natural")(x))
    errs["marlin_down_vs_ours"] = rel_frobenius(layer["marlin_down"](h), our_down(ours, "natural")(h))
    bad = {n: e for n, e in errs.items() if not e <= MAX_REL_ERR}
    if bad:
        raise SystemExit(f"outputs off (relative Frobenius > {MAX_REL_ERR}): {bad}")
    return errs


def _median(values) -> float:
    good = [v for v in values if math.isfinite(v)]
    return statistics.median(good) if good else math.nan


def table(result: dict) -> str:
    names = [n.removesuffix("_us") for n in result["rows"][0] if n.endswith("_us") and n != "floor_us"]
    lines = ["| H×I | M | floor | " + " | ".join(names) + " | marlin / ours MLP | marlin / ours gate_up | "
             "marlin / ours down |", "|---" * (len(names) + 6) + "|"]
    for r in result["rows"]:
        ratios = [r[f"marlin_{p}_us"] / r[f"ours_{p}_us"] for p in ("nvfp4", "gate_up", "down")]
        lines.append(f"| {r['hidden']}×{r['inter']} | {r['m']} | {r['floor_us']:.1f} | "
                     + " | ".join(f"{r[f'{n}_us']:.1f}" for n in names) + " | "
                     + " | ".join(f"{v:.2f}" for v in ratios) + " |")
    return "\n".join(lines)


def plot(result: dict, out: Path) -> Path:
    """The MLPs and the floor per H×I against M (bench.plot_panels: log-log, one panel a width)."""
    series = {"ours nvfp4 MLP": "ours_nvfp4_us", "Marlin nvfp4 MLP": "marlin_nvfp4_us", "ours bf16 MLP": "ours_bf16_us",
              "transformers bf16 MLP": "hf_bf16_us", "nvfp4 weight floor": "floor_us"}
    title = f"nvfp4 MLP: ours against vLLM's Marlin — {result['device']}, {result['date'][:10]}"
    return bench.plot_panels(result["rows"], series, title, out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--marlin", help="folder holding marlin_peer.py (module docstring); required but with --plot")
    p.add_argument("--shapes", default="4096x14336,8192x3584", help="H×I pairs (default: %(default)s)")
    p.add_argument("--m", default="1,16,64,256,1024,4096", help="token counts (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", help="write bench_marlin.json (and bench_marlin.png, where matplotlib is installed) there")
    p.add_argument("--plot", metavar="JSON", help="only draw the PNG of an earlier run's JSON, beside it")
    a = p.parse_args(argv)
    if a.plot:
        import json

        print("wrote", plot(json.loads(Path(a.plot).read_text()), Path(a.plot).with_suffix(".png")))
        return 0
    if not a.marlin:
        p.error("--marlin DIR is required (the folder holding marlin_peer.py)")
    try:
        shapes, ms = bench.parse_shapes(a.shapes), bench.parse_ms(a.m)
        bench.require_gpu()
    except bench.BenchError as e:
        p.error(str(e))
    out = None
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        out = Path(a.out) / "bench_marlin.json"
    result = run(load_peer(a.marlin), shapes, ms, a.rounds, a.iters, out=out)
    print(table(result))
    if out is not None:
        print("wrote", out)
        if importlib.util.find_spec("matplotlib") is not None:
            print("wrote", plot(result, out.with_suffix(".png")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
