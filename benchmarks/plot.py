"""Charts from the benchmarks' JSON: python -m benchmarks.plot RESULT.json [...] (writes RESULT.png).

Understands bench_gate_up.py output (fused vs cuBLAS alone and vs cuBLAS + separate act·quant, with the
roofline floor where the run recorded one, else the weight-bandwidth floor), bench_down.py output (kernel vs
cuBLAS, with and without residual), bench_quack.py output (ours vs QuACK vs cuBLAS),
bench_mlp.py output (every peer, per shape; --interleave: the medians over rounds) and
`swiglu-fused bench --out` output; x = tokens M (log), y = µs (log). The drawing itself is
swiglu_fused.bench.plot_panels, the one `swiglu-fused bench` uses (needs matplotlib).
"""

import json
import sys
from pathlib import Path

from swiglu_fused.bench import plot_panels, result_pipelines


def series_of(data: dict) -> tuple[dict, str]:
    """(label → row key, title) for a results JSON of any of the benchmarks above."""
    rows = data.get("rows") or data.get("interleaved")  # bench_mlp --interleave: medians over rounds
    if not rows:
        raise SystemExit("no 'rows' (quant_x results are a table only)")
    if data.get("benchmark") == "swiglu-fused bench":
        return ({n: f"{n}_us" for n in result_pipelines(data)}, "whole gated MLP")
    if "fused_us" in rows[0]:
        series = {"ours (fused)": "fused_us", "cuBLAS GEMM + separate act·quant": "separate_us",
                  "cuBLAS GEMM alone (no activation)": "gemm_us"}
        # runs since the roofline column: max(memory, compute floor), which equals the older
        # weight-bandwidth floor where memory bounds, so one line of the two
        series.update({"roofline floor (max of memory, compute)": "roofline_us"} if "roofline_us" in rows[0]
                      else {"weight-bandwidth floor": "floor_us"})
        return series, f"gate_up, {rows[0]['mainloop']} mainloop"
    if "quack_us" in rows[0]:
        return ({"ours (bf16 gate_up)": "ours_us", "QuACK gemm_gated": "quack_us",
                 "cuBLAS GEMM alone (no activation)": "cublas_us"}, "bf16 SwiGLU gate_up vs QuACK")
    if "kernel_us" in rows[0]:
        return ({"ours": "kernel_us", "cuBLAS": "cublas_us", "ours + residual (fused)": "kernel_res_us",
                 "cuBLAS + residual add": "cublas_res_us", "weight-bandwidth floor": "floor_us"},
                f"down, {rows[0].get('mainloop', 'fp8_block128')} mainloop")
    return ({k: f"{k}_us" for k in ("hf_bf16", "hf_compiled", "fp8_unfused", "ours_fp8", "ours_bf16")},
            "whole gated MLP")


def plot(path: Path) -> Path:
    data = json.loads(path.read_text())
    series, title = series_of(data)
    title = f"{title} — {data.get('device', '')}, torch {data.get('torch', '')} {data.get('date', '')[:10]}"
    return plot_panels(data.get("rows") or data.get("interleaved"), series, title, path.with_suffix(".png"))


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print("wrote", plot(Path(arg)))
