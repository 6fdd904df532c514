"""Accuracy of the fp8_block128 mainloop against the fp32 reference (a program, not a test):
the sm90 kernel with promotion every 128 / 64 / 32 K, and cuBLAS's block-scaled GEMM
(torch._scaled_mm, fp32 out) followed by the reference epilogue, on the same inputs.

    python benchmarks/accuracy_gate_up.py          (on the GPU machine, from the repo root)
"""
import sys
import torch
sys.path.insert(0, "."); sys.path.insert(0, "tests"); sys.path.insert(0, "benchmarks")
from gpu.test_gate_up_gpu import make_operands, run_kernel
from swiglu_fused.kernels import reference
from swiglu_fused.kernels.sm90 import gate_up as k
from gpu.tolerance import rel_frobenius, e4m3_ulp_distance
import bench_gate_up as b

for m, hidden, inter in ((1024, 4096, 14336), (100, 576, 1536)):
    args = make_operands(m, hidden, inter, "fp8_block128", 0)
    h_ref, hs_ref = reference.gate_up(**args, act="silu", h_format="fp8_group128")
    hb_ref, _ = reference.gate_up(**args, act="silu", h_format="bf16")
    def stats(h, hs, hb):
        d = e4m3_ulp_distance(h, h_ref)
        srel = ((hs - hs_ref).abs() / hs_ref.abs()).max().item()
        return f"bf16 h rel_fro={rel_frobenius(hb, hb_ref):.2e}  s_rel_max={srel:.2e} s_rel>1e-4 frac={(((hs - hs_ref).abs() / hs_ref.abs()) > 1e-4).float().mean().item():.4f} ulp<=1={(d<=1).float().mean().item():.5f}"
    for pk in (128, 64, 32):
        cfg = k.GateUpConfig(tile_m=128 if m > 64 else 64, stages=4 if m > 64 else 5, promote_k=pk)
        h, hs = run_kernel(cfg, args)
        hb, _ = run_kernel(k.GateUpConfig(**{**cfg.__dict__, "h_format": "bf16"}), args)
        print(m, hidden, inter, f"kernel promote_k={pk}:", stats(h, hs, hb), flush=True)
    try:
        try:
            fn, err = b.cublas_gemm(args["x"], args["x_scale"], args["weight"], args["weight_scale"], torch.float32)
        except Exception as e:
            print("cuBLAS fp32 out failed:", str(e)[:300])
            fn, err = b.cublas_gemm(args["x"], args["x_scale"], args["weight"], args["weight_scale"])
        y = fn(*b.peer_sets([(args["x"], args["x_scale"], args["weight"], args["weight_scale"])])[0])
        # cuBLAS output → fp32 epilogue exactly as the reference does
        from swiglu_fused.weight_packing.interleave import deinterleave_rows
        gate, up = deinterleave_rows(y.float().t(), 128)
        hf = torch.nn.functional.silu(gate.t()) * up.t()
        from swiglu_fused import quant
        hq, hsq = quant.quantize_fp8_groups(hf)
        print(m, hidden, inter, f"cuBLAS ({y.dtype} out, gemm rel {err:.2e}):", stats(hq, hsq, hf.to(torch.bfloat16)), flush=True)
    except Exception as e:
        print("cuBLAS failed:", e)
