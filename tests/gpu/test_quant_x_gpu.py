"""quant_x sm_90a kernel against reference.quant_x (bit-exact expected; DESIGN §4 tolerance asserted)."""

import pytest
import torch

from swiglu_fused.kernels import ops, reference
from .tolerance import FP8, assert_fp8_group_close

pytest.importorskip("cutlass")


def _poisoned(m, k):
    q = torch.full((m, k), 0x7F, dtype=torch.uint8, device="cuda").view(FP8)  # e4m3 NaN
    s = torch.full((m, -(-k // 128)), float("nan"), device="cuda")
    return q, s


@pytest.mark.parametrize("m", [1, 3, 16, 100, 4096])
@pytest.mark.parametrize("k", [8, 136, 576, 4096, 8192])
def test_quant_x_matches_reference(m, k):
    from swiglu_fused.kernels.sm90 import quant_x as kq

    torch.manual_seed(m * 7919 + k)
    x = (torch.randn(m, k, device="cuda") * 3).to(torch.bfloat16)
    q, s = _poisoned(m, k)
    kq.quant_x(x, out=(q, s))
    q_ref, s_ref = reference.quant_x(x)
    # The kernel divides (s = amax / 448, IEEE); torch on CUDA multiplies by the fp32 reciprocal of
    # a scalar divisor, so s may differ by 1 fp32 ulp and a q on a rounding tie by 1 e4m3 ulp.
    assert_fp8_group_close(q, s, q_ref, s_ref, scale_rtol=1e-6)


def test_quant_x_special_values():
    from swiglu_fused.kernels.sm90 import quant_x as kq

    m, k = 4, 384
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    x[0, :128] = 0  # all-zero group → s = 1, q = 0
    x[1, 5] = float("nan")  # NaN propagates to the group's scale and every q of the group
    x[2, 130] = 3e38  # huge value: saturates nothing else, scale large
    x[3, 256:] = 1e-30  # tiny values (bf16 subnormal range)
    q, s = _poisoned(m, k)
    kq.quant_x(x, out=(q, s))
    q_ref, s_ref = reference.quant_x(x)
    assert_fp8_group_close(q, s, q_ref, s_ref)
    assert s[0, 0].item() == 1.0 and s[1, 0].isnan()


def test_ops_quant_x_uses_kernel_and_validates(monkeypatch):
    x = torch.randn(5, 1000, device="cuda").to(torch.bfloat16)  # K % 8 = 0, partial last group
    ref_quant_x = reference.quant_x
    monkeypatch.setattr(ops.reference, "quant_x", lambda *a: (_ for _ in ()).throw(AssertionError("ran the reference")))
    q, s = ops.quant_x(x)
    monkeypatch.setattr(ops.reference, "quant_x", ref_quant_x)
    q_ref, s_ref = reference.quant_x(x)
    assert_fp8_group_close(q, s, q_ref, s_ref)
    x100 = torch.randn(2, 100, device="cuda").to(torch.bfloat16)  # 200-byte rows: the reference runs it
    with pytest.warns(UserWarning, match="quant_x: x has 100 columns, not a multiple of 8.*pad"):
        q, s = ops.quant_x(x100)
    assert_fp8_group_close(q, s, *reference.quant_x(x100), scale_rtol=0)
    with pytest.raises(ValueError, match="x: .*contiguous"):
        ops.quant_x(torch.randn(256, 64, device="cuda").to(torch.bfloat16).t())


@pytest.mark.parametrize("fields", [dict(rounds=r, threads=t, vec=v) for r in (1, 2, 4) for t in (128, 256, 512)
                                    for v in (8, 16)], ids=lambda f: "r{rounds}-t{threads}-v{vec}".format(**f))
@pytest.mark.parametrize("m,k", [(3, 144), (100, 4096), (257, 8192)])
def test_quant_x_configs_agree(fields, m, k):
    """Every thread ↔ data map (rounds, CTA size, columns per thread) writes the same bytes, ragged
    M and a partial last group included."""
    from swiglu_fused.kernels.sm90 import quant_x as kq

    torch.manual_seed(m + k)
    x = (torch.randn(m, k, device="cuda") * 3).to(torch.bfloat16)
    q, s = _poisoned(m, k)
    kq.quant_x(x, kq.QuantXConfig(**fields), out=(q, s))
    q_ref, s_ref = reference.quant_x(x)
    assert_fp8_group_close(q, s, q_ref, s_ref, scale_rtol=1e-6)
    q0, s0 = kq.quant_x(x, kq.QuantXConfig())
    assert torch.equal(q.view(torch.uint8), q0.view(torch.uint8)) and torch.equal(s, s0)


def test_quant_x_vec16_needs_k_multiple_of_16():
    from swiglu_fused.kernels.sm90 import quant_x as kq

    with pytest.raises(ValueError, match="multiple of 16"):
        kq.quant_x(torch.randn(2, 136, device="cuda").to(torch.bfloat16), kq.QuantXConfig(vec=16))


@pytest.mark.parametrize("vec", [8, 16])
@pytest.mark.parametrize("m", [1, 3, 100])
def test_quant_x_reads_rows_where_they_lie(vec, m):
    """x a view whose rows lie further apart than K (SplitProjectionProcessor's [attention | h]):
    the kernel reads it in place, through ops too, and the columns between the rows (NaN here)
    reach nothing."""
    from swiglu_fused.kernels.sm90 import quant_x as kq

    k, ld = 576, 576 + 136
    torch.manual_seed(m + vec)
    buf = torch.full((m, ld), float("nan"), device="cuda", dtype=torch.bfloat16)
    x = buf[:, 8:8 + k]
    x.copy_((torch.randn(m, k, device="cuda") * 3).to(torch.bfloat16))
    assert not x.is_contiguous() or m == 1
    q, s = _poisoned(m, k)
    kq.quant_x(x, kq.QuantXConfig(rounds=1, vec=vec), out=(q, s))
    q_ref, s_ref = reference.quant_x(x.contiguous())
    assert_fp8_group_close(q, s, q_ref, s_ref, scale_rtol=1e-6)
    q2, s2 = ops.quant_x(x)
    assert torch.equal(q2.view(torch.uint8), kq.quant_x(x.contiguous())[0].view(torch.uint8))
    with pytest.raises(ValueError, match="x: .*contiguous"):  # rows not 16 bytes apart
        ops.quant_x(torch.randn(4, 580, device="cuda").to(torch.bfloat16)[:, :576])
