"""One tolerance helper per output format (DESIGN §4)."""

from __future__ import annotations

import json
import os

import torch

FP8 = torch.float8_e4m3fn


def rel_frobenius(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def assert_bf16_close(out: torch.Tensor, ref: torch.Tensor, tol: float = 1e-2) -> None:
    assert not out.isnan().any(), "bf16 output has NaN (unwritten or poisoned elements)"
    err = rel_frobenius(out, ref)
    assert err <= tol, f"relative Frobenius error {err:.3e} > {tol:.0e}"


def e4m3_ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|code(a) - code(b)| on the ordered e4m3 code line (sign-magnitude → monotone integer)."""
    def ordered(t):
        c = t.view(torch.uint8).to(torch.int32)
        mag = c & 0x7F
        return torch.where(c & 0x80 != 0, -mag, mag)

    return (ordered(a) - ordered(b)).abs()


def _log(stats: dict) -> None:
    """With SWIGLU_FUSED_TOL_LOG=FILE, append each comparison's statistics (one JSON line, with the
    test's id): how close the kernels come, not only that they pass."""
    path = os.environ.get("SWIGLU_FUSED_TOL_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0], **stats}) + "\n")


def assert_fp8_group_close(q, s, q_ref, s_ref, min_frac: float = 0.999, scale_rtol: float = 1e-4,
                           scale_fro: float = 1e-4) -> dict:
    """≥ min_frac of elements within 1 e4m3 ulp; scales within scale_rtol relative each and
    scale_fro relative Frobenius together (DESIGN §4 defaults; the fp8 mainloop's measured limits
    are in test_gate_up_gpu.TOL)."""
    assert q.dtype == FP8 and q.shape == q_ref.shape, (q.dtype, q.shape, q_ref.shape)
    assert s.shape == s_ref.shape, (s.shape, s_ref.shape)
    nan_ref = s_ref.isnan()
    assert torch.equal(s.isnan(), nan_ref), "scale NaN pattern differs from the reference (or poison left)"
    srel = ((s - s_ref).abs() / s_ref.abs().clamp_min(1e-30))[~nan_ref]
    smax = srel.max().item() if srel.numel() else 0.0
    qnan, qnan_ref = q.float().isnan(), q_ref.float().isnan()
    assert torch.equal(qnan, qnan_ref), f"{(qnan != qnan_ref).sum().item()} elements differ in NaN-ness"
    d = e4m3_ulp_distance(q, q_ref)[~qnan_ref]
    frac = (d <= 1).float().mean().item() if d.numel() else 1.0
    exact = (d == 0).float().mean().item() if d.numel() else 1.0
    sfro = rel_frobenius(s[~nan_ref], s_ref[~nan_ref]) if srel.numel() else 0.0
    stats = {"within_1ulp": frac, "exact": exact, "scale_max_rel": smax, "scale_rel_fro": sfro,
             "max_ulp": d.max().item() if d.numel() else 0, "n": d.numel()}
    _log(stats)
    assert smax <= scale_rtol, f"scale relative error {smax:.3e} > {scale_rtol:.0e}; {stats}"
    assert sfro <= scale_fro, f"scale relative Frobenius error {sfro:.3e} > {scale_fro:.0e}; {stats}"
    assert frac >= min_frac, f"only {frac:.5f} of elements within 1 ulp; {stats}"
    return stats
