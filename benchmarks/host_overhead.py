"""Host (CPU) cost per eager call of the fused MLP and its ops, M = 1 (decode without CUDA graphs,
as transformers' generate() runs): µs of wall time per call with the GPU kept ahead, and where it
goes (cProfile, top functions). GPU time is not what this measures; see bench_mlp.py for that.

    python -m benchmarks.host_overhead [--hidden 4096 --inter 14336] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

from swiglu_fused.kernels import ops, reference
from swiglu_fused.layer import FusedSwiGLUMLP

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU runs the reference (a dry run of the script)


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


class NoOps:
    """ops stand-in returning precomputed outputs: what reference.mlp costs around the three ops."""

    def __init__(self, xq, xs, h, hs, y):
        self.out = (xq, xs, h, hs, y)

    def quant_x(self, x):
        return self.out[0], self.out[1]

    def gate_up(self, *a, **k):
        return self.out[2], self.out[3]

    def down(self, *a, **k):
        return self.out[4]


def device_ctx(device):
    with torch.cuda.device(device):
        pass


def per_call_us(fn, n=300):
    for _ in range(10):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t_host = (time.perf_counter() - t0) / n * 1e6
    sync()
    return t_host


def profile(fn, top: int, n: int = 200) -> None:
    """cProfile of n host calls of fn: the ``top`` functions by own time."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    sync()
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--inter", type=int, default=14336)
    p.add_argument("--profile", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    lin = [torch.nn.Linear(i, o, bias=False, device=DEV, dtype=torch.bfloat16)
           for i, o in ((a.hidden, a.inter), (a.hidden, a.inter), (a.inter, a.hidden))]
    mlp = FusedSwiGLUMLP.from_linear(*lin, weight_format="fp8_block128")
    direct = FusedSwiGLUMLP.from_linear(*lin, weight_format="fp8_block128")
    direct.eager_graph_rows = 0  # the three ops launched one by one
    x = torch.randn(1, a.hidden, device=DEV, dtype=torch.bfloat16)
    gu = mlp.gate_up_interleaved.tensors()
    dn = mlp.down_proj.tensors()
    xq, xs = ops.quant_x(x)
    h, hs = ops.gate_up(xq, gu["weight"], gu["weight_scale_inv"], xs, h_format="fp8_group128")
    rows = {
        "FusedSwiGLUMLP.forward (eager graph)": lambda: mlp(x),
        "FusedSwiGLUMLP.forward, ops direct": lambda: direct(x),
        "ops.quant_x": lambda: ops.quant_x(x),
        "ops.gate_up": lambda: ops.gate_up(xq, gu["weight"], gu["weight_scale_inv"], xs, h_format="fp8_group128"),
        "ops.down": lambda: ops.down(h, dn["weight"], dn["weight_scale_inv"], hs),
        "torch.nn.Linear (reference point)": lambda: lin[0](x),
    }
    if DEV == "cuda":
        import cutlass
        from cutlass import Float32, Int32

        from swiglu_fused.kernels.sm90 import compile_cache, gate_up as kg, gemm

        cfg = kg.select_config(xq, gu["weight"], gu["weight_scale_inv"], xs, act="silu", h_format="fp8_group128")
        kfn = compile_cache.get("gate_up", cfg, lambda: kg.compile_gate_up(cfg))
        fp8 = cutlass.Float8E4M3FN

        def ptrs():
            return (compile_cache.ptr(fp8, xq), compile_cache.ptr(fp8, gu["weight"]),
                    compile_cache.ptr(Float32, xs, 4), compile_cache.ptr(Float32, gu["weight_scale_inv"], 4),
                    compile_cache.ptr(fp8, h), compile_cache.ptr(Float32, hs, 4),
                    compile_cache.ptr(Float32, hs, 4), compile_cache.ptr(Int32, hs, 4))

        import cuda.bindings.driver as cuda
        stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
        fixed = ptrs() + (Int32(1), Int32(a.hidden // 16), Int32(2 * a.inter // 8), Int32(112), Int32(0), stream)
        from swiglu_fused import eager_graphs

        mlp(x)  # captures the M = 1 graph
        state = eager_graphs._per_module[mlp]
        g1 = next(iter(state.graphs.values()))
        x2 = x.reshape(-1, x.shape[-1])
        rows.update({
            "graph path: _plain_eager": lambda: eager_graphs._plain_eager(x2),
            "graph path: tuple(module.buffers())": lambda: tuple(mlp.buffers()),
            "graph path: buffer data_ptrs": lambda: tuple(b.data_ptr() for b in mlp.buffers()),
            "graph path: raw stream": lambda: eager_graphs._raw_stream(0),
            "graph path: static x copy_": lambda: g1.x[:1].copy_(x2),
            "graph path: replay": lambda: g1.graph.replay(),
            "graph path: output clone": lambda: g1.y[:1].clone(),
            "graph path: is_current_stream_capturing": lambda: torch.cuda.is_current_stream_capturing(),
            "sm90 gate_up, no torch.library": lambda: kg.gate_up(cfg, xq, gu["weight"], gu["weight_scale_inv"], xs),
            "8 cute pointers": ptrs,
            "compiled kernel call alone": lambda: kfn(*fixed),
            "launch_plan": lambda: gemm.launch_plan(cfg, 1, 2 * a.inter, a.hidden, x.device),
            "torch.cuda.device ctx": lambda: device_ctx(x.device),
            "compile_cache.get": lambda: compile_cache.get("gate_up", cfg, None),
            "current_stream + CUstream": lambda: cuda.CUstream(torch.cuda.current_stream(x.device).cuda_stream),
            "select_config": lambda: kg.select_config(xq, gu["weight"], gu["weight_scale_inv"], xs, act="silu",
                                                      h_format="fp8_group128"),
            "reference.mlp overhead (ops → no-ops)": lambda: reference.mlp(
                x, gu, dn, weight_format="fp8_block128", interleave=128, act="silu", global_scale_kind=None,
                ops=NoOps(xq, xs, h, hs, x)),
        })
    for name, fn in rows.items():
        print(f"{name:36s} {per_call_us(fn):8.1f} µs host per call", flush=True)
    if a.profile:
        profile(lambda: direct(x), top=25)
        profile(lambda: mlp(x), top=20)


if __name__ == "__main__":
    main()
