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
    w = torch.randn(*shape).to(torch.bfloat16)
    cpu, gpu = quant.quantize_nvfp4(w), quant.quantize_nvfp4(w.cuda())
    for a, b in zip(cpu, gpu):
        assert torch.equal(_bytes(a), _bytes(b))
    assert torch.equal(quant.dequantize_nvfp4(*cpu), quant.dequantize_nvfp4(*gpu).cpu())
