"""How long the first gate_up / quant_x call of a process takes (compilation included).

Run it twice in separate processes: if the second run's first call is as slow as the first's,
nothing was reused from disk.    python benchmarks/startup_compile.py
"""

import sys
import time

import torch

sys.path.insert(0, ".")
from swiglu_fused import quant  # noqa: E402
from swiglu_fused.kernels import ops  # noqa: E402

x = torch.randn(64, 4096, device="cuda").to(torch.bfloat16)
w, ws = quant.quantize_fp8_block(torch.randn(2 * 14336, 4096, device="cuda") * 0.02)
torch.cuda.synchronize()
t0 = time.perf_counter()
xq, xs = ops.quant_x(x)
h, hs = ops.gate_up(xq, w, ws, xs, h_format="fp8_group128")
torch.cuda.synchronize()
t1 = time.perf_counter()
ops.gate_up(xq, w, ws, xs, h_format="fp8_group128")
torch.cuda.synchronize()
print(f"first quant_x + gate_up call: {t1 - t0:.2f} s; second: {time.perf_counter() - t1:.4f} s")
