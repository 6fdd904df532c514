"""The torch quantizers give the same bytes on CUDA as on the CPU (conversion may run on either)."""

import pytest
import torch

from swiglu_fused import quant


def _bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).cpu()


@pytest.mark.parametrize("shape", [(384, 256), (200, 330), (7168, 4096)])
def test_fp8_block_cuda_equals_cpu(shape):
    w = torch.randn(*shape) * torch.rand(shape[0], 1) * 3
    for a, b in zip(quant.quantize_fp8_block(w), quant.quantize_fp8_block(w.cuda())):
        assert torch.equal(_bytes(a), _bytes(b))


def test_fp8_groups_cuda_equals_cpu():
    x = torch.randn(1000, 4096) * 5
    for a, b in zip(quant.quantize_fp8_groups(x), quant.quantize_fp8_groups(x.cuda())):
        assert torch.equal(_bytes(a), _bytes(b))


@pytest.mark.parametrize("shape", [(96, 256), (1024, 2880)])
def test_nvfp4_cuda_equals_cpu(shape):
    torch.manual_seed(shape[0])
    w = torch.randn(*shape).to(torch.bfloat16)
    cpu, gpu = quant.quantize_nvfp4(w), quant.quantize_nvfp4(w.cuda())
    for a, b in zip(cpu, gpu):
        assert torch.equal(_bytes(a), _bytes(b))
    assert torch.equal(quant.dequantize_nvfp4(*cpu), quant.dequantize_nvfp4(*gpu).cpu())


def test_nvfp4_cuda_equals_cpu_on_rounding_ties():
    """With global scale 6 a block scale is its group's amax, a bf16 value that often sits exactly
    on an e4m3 rounding tie: both devices must round it alike. (A CUDA division by a Python scalar
    multiplies by the reciprocal, an ulp away, which flipped such ties: this test failed then.)"""
    torch.manual_seed(0)
    w = (torch.randn(256, 512) * 100).to(torch.bfloat16)
    gs = torch.tensor([6.0])
    cpu, gpu = quant.quantize_nvfp4(w, gs), quant.quantize_nvfp4(w.cuda(), gs.cuda())
    for a, b in zip(cpu, gpu):
        assert torch.equal(_bytes(a), _bytes(b))
