"""benchmarks/probe_warp_mma.py on the CPU: its fragment order holds every code and scale of the
weight once, where the kernel's lanes read them, and its decode arithmetic (emulated in torch with
the kernel's bit operations and bf16 roundings) gives the reference dequantization exactly,
including zero, subnormal and the largest e4m3 scales."""

import torch

from benchmarks import probe_warp_mma as probe
from swiglu_fused import quant


def _weight(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    w, s, _ = quant.quantize_nvfp4(torch.randn(n, k, generator=g))
    raw = s.view(torch.uint8)
    raw[0, :4] = torch.tensor([0x00, 0x01, 0x07, 0x7E], dtype=torch.uint8)  # 0, the two ends of subnormal, 448
    raw[5, 1] = 0x08  # the smallest normal e4m3
    return w, s


def test_the_decode_of_the_fragment_order_is_the_reference_dequantization():
    n, k = 48, 192
    w, s = _weight(n, k)
    codes, scales = probe.to_fragment_order(w, s)
    assert codes.numel() == w.numel() and scales.numel() == s.numel()
    got = probe.emulate_decode(codes, scales, n, k) * 2.0 ** probe.Y_SHIFT
    want = quant.dequantize_nvfp4(w, s, torch.ones(1), divisor=False)
    assert torch.equal(got, want)


def test_a_lane_reads_its_mma_fragment():
    """Lane 4g + t's word s of block (rb, kc) holds rows g, g + 8 at columns 16s + 2t, 2t+1, 2t+8, 2t+9
    (the A fragment of m16n8k16), and its scale bytes rows g and g + 8 of group 4kc + s."""
    n, k = 32, 128
    w = torch.zeros(n, k // 2, dtype=torch.uint8)
    rb, kc, g, t, s = 1, 1, 5, 2, 3
    row, col = 16 * rb + g + 8, 64 * kc + 16 * s + 2 * t + 9  # a3's odd column
    w[row, col // 2] = 0x70  # code 7 (6.0) in the high nibble: the odd column
    scale = torch.zeros(n, k // 16, dtype=torch.uint8)
    scale[row, col // 16] = 0x38  # 1.0
    codes, scales = probe.to_fragment_order(w, scale.view(torch.float8_e4m3fn))
    words = codes.view(torch.int32).view(n // 16, k // 64, 32, 4)
    nonzero = (words != 0).nonzero().tolist()
    assert nonzero == [[rb, kc, 4 * g + t, s]]
    assert (scales.view(n // 16, k // 64, 8, 4, 2) != 0).nonzero().tolist() == [[rb, kc, g, s, 1]]
    value = probe.emulate_decode(codes, scales, n, k) * 2.0 ** probe.Y_SHIFT
    assert value[row, col] == 6.0 and value.count_nonzero() == 1
