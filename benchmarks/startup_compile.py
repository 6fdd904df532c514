"""How long the first gate_up / quant_x call of a process takes (compilation or disk-cache load).

Run it twice in separate processes: the first compiles and fills the on-disk kernel cache
($SWIGLU_FUSED_CACHE_DIR, default ~/.cache/swiglu_fused); the second should load from it and
compile nothing (DESIGN §5). Each run also checks the gate_up output against the reference, so
a kernel loaded from disk is exercised, not just loaded.

    python -m benchmarks.startup_compile
"""

import time

import torch

from swiglu_fused import quant
from swiglu_fused.kernels import ops, reference

x = torch.randn(64, 4096, device="cuda").to(torch.bfloat16)
w, ws = quant.quantize_fp8_block(torch.randn(2 * 14336, 4096, device="cuda") * 0.02)
torch.cuda.synchronize()
t0 = time.perf_counter()
# the import the first call would do anyway (cutlass + kernel modules), timed on its own
from swiglu_fused.kernels.sm90 import compile_cache, gate_up, quant_x  # noqa: E402, F401

t_import = time.perf_counter() - t0
t_get = 0.0
_get = compile_cache.get


def timed_get(*a, **k):  # time spent obtaining kernels (compile or disk load), inside the calls
    global t_get
    t = time.perf_counter()
    try:
        return _get(*a, **k)
    finally:
        t_get += time.perf_counter() - t


compile_cache.get = timed_get
xq, xs = ops.quant_x(x)
h, hs = ops.gate_up(xq, w, ws, xs, h_format="fp8_group128")
torch.cuda.synchronize()
t1 = time.perf_counter()
compile_cache.get = _get
ops.gate_up(xq, w, ws, xs, h_format="fp8_group128")
torch.cuda.synchronize()
t2 = time.perf_counter()

h_ref, hs_ref = reference.gate_up(xq, w, ws, xs, h_format="fp8_group128")


def deq(q, s):
    return q.float() * s.repeat_interleave(128, dim=1)


a, b = deq(h, hs), deq(h_ref, hs_ref)
err = ((a - b).norm() / b.norm()).item()
print(f"first quant_x + gate_up call: {t1 - t0:.2f} s (import {t_import:.2f} s, compile/load {t_get:.2f} s, "
      f"rest incl. first launches {t1 - t0 - t_import - t_get:.2f} s); second: {t2 - t1:.4f} s")
print(f"cache: {compile_cache.stats} in {compile_cache.cache_dir()}; gate_up rel. error vs reference {err:.2e}")
