"""Charts from the benchmarks' JSON: python benchmarks/plot.py RESULT.json [...] (writes RESULT.png).

Understands bench_gate_up.py output (fused vs cuBLAS alone and vs cuBLAS + separate act·quant, with the
roofline floor where the run recorded one, else the weight-bandwidth floor), bench_down.py output (kernel vs
cuBLAS, with and without residual), bench_quack.py output (ours vs QuACK vs cuBLAS) and
bench_mlp.py output (every peer, per shape; --interleave: the medians over rounds); x = tokens M
(log), y = µs (log).
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _shapes(rows):
    return sorted({(r["hidden"], r["inter"]) for r in rows})


def plot(path: Path) -> Path:
    data = json.loads(path.read_text())
    rows = data.get("rows") or data.get("interleaved")  # bench_mlp --interleave: medians over rounds
    if not rows:
        raise SystemExit(f"{path}: no 'rows' (quant_x results are a table only)")
    if "fused_us" in rows[0]:
        series = {"ours (fused)": "fused_us", "cuBLAS GEMM + separate act·quant": "separate_us",
                  "cuBLAS GEMM alone (no activation)": "gemm_us"}
        # runs since the roofline column: max(memory, compute floor), which equals the older
        # weight-bandwidth floor where memory bounds, so one line of the two
        series.update({"roofline floor (max of memory, compute)": "roofline_us"} if "roofline_us" in rows[0]
                      else {"weight-bandwidth floor": "floor_us"})
        title = f"gate_up, {rows[0]['mainloop']} mainloop"
    elif "quack_us" in rows[0]:
        series = {"ours (bf16 gate_up)": "ours_us", "QuACK gemm_gated": "quack_us",
                  "cuBLAS GEMM alone (no activation)": "cublas_us"}
        title = "bf16 SwiGLU gate_up vs QuACK"
    elif "kernel_us" in rows[0]:
        series = {"ours": "kernel_us", "cuBLAS": "cublas_us", "ours + residual (fused)": "kernel_res_us",
                  "cuBLAS + residual add": "cublas_res_us", "weight-bandwidth floor": "floor_us"}
        title = f"down, {rows[0].get('mainloop', 'fp8_block128')} mainloop"
    else:
        series = {k: f"{k}_us" for k in ("hf_bf16", "hf_compiled", "fp8_unfused", "ours_fp8", "ours_bf16")}
        title = "whole gated MLP"
    shapes = _shapes(rows)
    fig, axes = plt.subplots(1, len(shapes), figsize=(5.5 * len(shapes), 4.2), squeeze=False)
    for ax, (h, i) in zip(axes[0], shapes):
        sel = sorted((r for r in rows if (r["hidden"], r["inter"]) == (h, i)), key=lambda r: r["m"])
        for n, (label, key) in enumerate(series.items()):  # fixed colour per series across panels
            pts = [(r["m"], r[key]) for r in sel if r.get(key) == r.get(key) and r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label, color=f"C{n}",
                        linestyle="--" if "floor" in label or "alone" in label else "-")
        ax.legend(fontsize=7)
        ax.set(xscale="log", yscale="log", xlabel="tokens M", ylabel="µs", title=f"H={h}, I={i}")
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"{title} — {data.get('device', '')}, torch {data.get('torch', '')} {data.get('date', '')[:10]}")
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=60)
    plt.close(fig)
    _shrink(out)
    return out


def _shrink(png: Path) -> None:
    """64-colour palette: a quarter of the bytes, same chart (results/ travels to every GPU run)."""
    from PIL import Image  # a matplotlib dependency

    Image.open(png).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(png, optimize=True)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print("wrote", plot(Path(arg)))
