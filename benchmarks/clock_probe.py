"""SM clock and board power while one gate_up config runs back to back (GPU).

The same variants as ab_gate_up.py (the dispatched config with fields replaced), plus cuBLAS's
block-scaled GEMM for fp8. Each is replayed from a CUDA graph for --seconds while a thread
samples NVML every 20 ms; printed: µs per call, median SM clock, median power, and the throttle
reasons seen. A kernel that moves fewer bytes may run at a higher clock under the same power cap,
which a timing alone does not show.

With --mlp FORMAT,...: the whole MLP (FusedSwiGLUMLP in each format, and transformers' bf16 MLP as
hf_bf16) instead, cycling through bench.layer_count layers as `swiglu-fused bench` does; each line
also gives the energy a call (median power × µs), and below it each kernel's µs profiled right
after the run, still at the clock the power cap holds (--repeat: the formats in turn, again).

    python -m benchmarks.clock_probe --shape 4096x14336 --m 4096 --variant resident:probe=resident
    python -m benchmarks.clock_probe --shape 8192x3584 --m 1024 --mlp nvfp4,bf16,hf_bf16
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import threading
import time

import torch

from benchmarks import harness as b
from benchmarks.harness import parse_variant
from benchmarks.profile_mlp import kernel_records, per_position, short
from swiglu_fused import bench
from swiglu_fused.kernels.sm90 import gate_up as kg


def nvml_sampler():
    """(start(), stop() → samples [(sm MHz, watts, throttle bitmask)]) over NVML (nvidia-smi
    where pynvml is not installed)."""
    try:
        import pynvml
    except ImportError:
        return smi_sampler()

    pynvml.nvmlInit()
    dev = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    samples, stop = [], threading.Event()

    def loop():
        while not stop.is_set():
            samples.append((pynvml.nvmlDeviceGetClockInfo(dev, pynvml.NVML_CLOCK_SM),
                            pynvml.nvmlDeviceGetPowerUsage(dev) / 1000.0,
                            pynvml.nvmlDeviceGetCurrentClocksEventReasons(dev)))
            time.sleep(0.02)

    thread = threading.Thread(target=loop, daemon=True)

    def start():
        thread.start()

    def finish():
        stop.set()
        thread.join()
        return samples

    return start, finish


def smi_sampler():
    import subprocess

    query = "clocks.sm,power.draw,clocks_event_reasons.active"
    cmd = ["nvidia-smi", "-i", str(torch.cuda.current_device()), f"--query-gpu={query}",
           "--format=csv,noheader,nounits", "-lms", "20"]
    proc = None

    def start():
        nonlocal proc
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)

    def finish():
        proc.terminate()
        out = proc.communicate()[0]
        samples = []
        for line in out.splitlines():
            try:
                mhz, watts, reasons = (v.strip() for v in line.split(","))
                samples.append((float(mhz), float(watts), int(reasons, 16)))
            except ValueError:
                continue
        return samples

    return start, finish


ACTIVITIES = ("kernel", "gpu_memset", "gpu_memcpy")  # what --mlp's profiled timeline lists
THROTTLE = {0x4: "sw_power_cap", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake",
            0x8: "hw_slowdown"}


def run(graph, seconds):
    """µs a call, median SM clock and power, and the throttle reasons seen while ``graph`` (of
    b.REPS calls) replays back to back for ``seconds``."""
    start, finish = nvml_sampler()
    torch.cuda.synchronize()
    start()
    t0 = time.perf_counter()
    calls = 0
    a = torch.cuda.Event(enable_timing=True)
    e = torch.cuda.Event(enable_timing=True)
    a.record()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            graph.replay()
        calls += 20 * b.REPS
        torch.cuda.synchronize()  # keeps the host from queueing far ahead of the sampled interval
    e.record()
    e.synchronize()
    samples = finish()[5:]  # (the first samples may predate the first launch)
    reasons = 0
    for _, _, r in samples:
        reasons |= r
    return dict(us=a.elapsed_time(e) * 1e3 / calls, sm_mhz=statistics.median(s[0] for s in samples),
                watts=statistics.median(s[1] for s in samples),
                throttle=[name for bit, name in THROTTLE.items() if reasons & bit])


def report(label: str, r: dict) -> None:
    print(f"{label:>34}: {r['us']:8.1f} µs  SM {r['sm_mhz']:5.0f} MHz  {r['watts']:5.0f} W"
          f"  {r['watts'] * r['us'] / 1e3:6.1f} mJ a call  throttle {','.join(r['throttle']) or '-'}", flush=True)


def hot_timeline(graph, replays: int = 20) -> tuple[list, float]:
    """(each kernel, memset and copy of one call: profile_mlp.per_position's rows, medians over
    ``replays`` replays of ``graph``; the median µs from one call's start to the next's). Called right
    after run() on the same graph, so at the clock the power cap holds (a profile of a cool GPU runs
    at a higher clock and says less about a sustained run: history/method.md)."""
    return per_position(kernel_records(graph, replays, ACTIVITIES), replays * b.REPS)


def probe_mlps(a, hidden: int, inter: int) -> None:
    """--mlp: each format's whole MLP replayed for --seconds, cycling through its own layers."""
    names = a.mlp.split(",")
    layers = []
    for seed in range(bench.layer_count(hidden, inter)):
        mlp = bench.hf_mlp(hidden, inter, seed)
        layers.append({n: mlp if n == bench.HF else bench.fused(mlp, n) for n in names})
    x = torch.randn(a.m, hidden, device="cuda").to(torch.bfloat16)
    rows = []
    with torch.no_grad():
        for n in [n for _ in range(a.repeat) for n in names]:
            graph = b.capture(bench.rotating(layers, n, x))
            r = dict(format=n, **run(graph, a.seconds))
            r["kernels"], r["span_us"] = hot_timeline(graph)
            report(f"{a.shape} M={a.m} {n}", r)
            print(" " * 36 + f"profiled: {r['span_us']:.1f} µs a call | " + " | ".join(
                f"{short(k['name'], 24)} {k['us']:.1f} ({k['gap_us']:+.1f})" for k in r["kernels"]), flush=True)
            rows.append(r)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), shape=a.shape, m=a.m, rows=rows), f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="4096x14336", help="HxI")
    p.add_argument("--m", type=int, default=4096)
    p.add_argument("--mainloop", default="fp8_block128", choices=["fp8_block128", "bf16"])
    p.add_argument("--variant", action="append", default=[], metavar="NAME:FIELD=VALUE,...")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--json", default=None)
    p.add_argument("--repeat", type=int, default=1, help="--mlp: probe the formats in turn this many times")
    p.add_argument("--mlp", default=None, metavar="FORMAT,...",
                   help="the whole MLP in these formats (and hf_bf16: transformers' bf16 MLP) instead of gate_up")
    a = p.parse_args()
    hidden, inter = map(int, a.shape.split("x"))
    if a.mlp:
        return probe_mlps(a, hidden, inter)
    fp8 = a.mainloop == "fp8_block128"
    make = (lambda s: b.operands(a.m, hidden, inter, s)) if fp8 else (lambda s: b.bf16_operands(a.m, hidden, inter, s))
    first = make(0)
    sets = b.rotation(make, sum(t.nbytes for t in first if t is not None))
    del first
    x, xs, w, ws = sets[0]
    base = b.gate_up_config(x, w, ws, xs, act="silu", h_format="fp8_group128" if fp8 else "bf16")
    cfgs = {"dispatched": base} | {n: dataclasses.replace(base, **f) for n, f in map(parse_variant, a.variant)}
    fns = {n: b.cycling(lambda x, xs, w, ws, c=c: kg.gate_up(c, x, w, ws, xs), sets) for n, c in cfgs.items()}
    if fp8:
        gemm, _ = b.cublas_gemm(*sets[0])
        fns["cublas_gemm"] = b.cycling(gemm, b.peer_sets(sets))
    else:
        fns["cublas_gemm"] = b.cycling(lambda x, xs, w, ws: x @ w.t(), sets)
    rows = {}
    for name, fn in fns.items():
        r = run(b.capture(fn), a.seconds)
        rows[name] = r
        report(f"{a.shape} M={a.m} {name}", r)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), shape=a.shape, m=a.m, mainloop=a.mainloop,
                           configs={n: str(c) for n, c in cfgs.items()}, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
