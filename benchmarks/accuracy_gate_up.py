"""Accuracy of the fp8_block128 mainloop against the fp32 reference (a program, not a test):
the sm90 kernel with promotion every 128 / 64 / 32 K, and cuBLAS's block-scaled GEMM
(torch._scaled_mm, fp32 out) followed by the reference epilogue, on the same inputs.

    python -m benchmarks.accuracy_gate_up          (on the GPU machine, from the repo root)
"""

import torch

from benchmarks import harness as b
from swiglu_fused import quant
from swiglu_fused.interleave import deinterleave_rows
from swiglu_fused.kernels import reference
from swiglu_fused.kernels.sm90 import gate_up as k


def run_kernel(cfg, args):
    return k.gate_up(cfg, args["x"], args["weight"], args.get("weight_scale"), args.get("x_scale"))


def main():
    for m, hidden, inter in ((1024, 4096, 14336), (100, 576, 1536)):
        args = b.spread_operands(m, hidden, inter, "fp8_block128", 0)
        h_ref, hs_ref = reference.gate_up(**args, act="silu", h_format="fp8_group128")
        hb_ref, _ = reference.gate_up(**args, act="silu", h_format="bf16")

        def stats(h, hs, hb):
            d = b.e4m3_ulp_distance(h, h_ref)
            srel = (hs - hs_ref).abs() / hs_ref.abs()
            return (f"bf16 h rel_fro={b.rel_frobenius(hb, hb_ref):.2e}  s_rel_max={srel.max().item():.2e} "
                    f"s_rel>1e-4 frac={(srel > 1e-4).float().mean().item():.4f} "
                    f"ulp<=1={(d <= 1).float().mean().item():.5f}")

        for pk in (128, 64, 32):
            cfg = k.GateUpConfig(tile_m=128 if m > 64 else 64, stages=4 if m > 64 else 5, promote_k=pk)
            h, hs = run_kernel(cfg, args)
            hb, _ = run_kernel(k.GateUpConfig(**{**cfg.__dict__, "h_format": "bf16"}), args)
            print(m, hidden, inter, f"kernel promote_k={pk}:", stats(h, hs, hb), flush=True)
        ops = (args["x"], args["x_scale"], args["weight"], args["weight_scale"])
        try:
            try:
                fn, err = b.cublas_gemm(*ops, torch.float32)
            except Exception as e:
                print("cuBLAS fp32 out failed:", str(e)[:300])
                fn, err = b.cublas_gemm(*ops)
            y = fn(*b.peer_sets([ops])[0])
            # cuBLAS output → fp32 epilogue exactly as the reference does
            gate, up = deinterleave_rows(y.float().t(), 128)
            hf = torch.nn.functional.silu(gate.t()) * up.t()
            hq, hsq = quant.quantize_fp8_groups(hf)
            print(m, hidden, inter, f"cuBLAS ({y.dtype} out, gemm rel {err:.2e}):",
                  stats(hq, hsq, hf.to(torch.bfloat16)), flush=True)
        except Exception as e:
            print("cuBLAS failed:", e)


if __name__ == "__main__":
    main()
