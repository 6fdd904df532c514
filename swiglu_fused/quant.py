"""Quantizers and dequantizers, in plain torch (CPU or CUDA).

The conventions are those of the real producers, so that their checkpoints repack bit-exactly
and our own quantization of a bf16 checkpoint gives the same bytes they would:

* FP8 weight blocks follow transformers' fine-grained FP8 (``Fp8Quantize``): per 128×128 block,
  ``scale = 448 / amax`` (1 where amax = 0), ``q = e4m3(clamp(w · scale))`` and the stored
  ``weight_scale_inv = 1 / scale`` — a dequantization *multiplier*. Unlike transformers we also
  quantize matrices whose sides are not multiples of 128: the last block is partial.
* FP8 activations (x and h) are quantized per row and per 128 consecutive columns:
  ``s = amax / 448`` (fp32), ``q = e4m3(clamp(x / s))``. A group of zeros gets s = 1.
* NVFP4 follows compressed-tensors' ``nvfp4-pack-quantized``: e2m1 codes, two per byte with the
  even element in the low nibble, an e4m3 scale per 16 elements and an fp32 per-tensor
  ``global_scale = 448 · 6 / amax`` that *divides*: w = e2m1 · scale / global_scale.

Everything saturates instead of overflowing to inf, and NaN stays NaN.
"""

from __future__ import annotations

import torch

# The one home of the numeric constants every layer uses (formats.py re-exports the block sizes as
# part of the format spec; the kernels import them from here): this module imports nothing of the
# package, so formats.py's format classes can quantize with it.
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
E2M1_MAX = 6.0
FP8_BLOCK = 128  # fp8 weight blocks are 128x128; x and h are scaled per 128 columns
NVFP4_GROUP = 16  # nvfp4 weights have one e4m3 scale per 16 columns
NVFP4_VALUES_PER_BYTE = 2  # two e2m1 codes a byte: a packed nvfp4 weight has cols / 2 bytes a row

# e2m1 magnitudes by 3-bit index; the code's bit 3 is the sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for integers (grid sizes, tile counts)."""
    return -(-a // b)


def m_major(scale: torch.Tensor) -> torch.Tensor:
    """Per-row group scales [M, G] stored M-fastest (strides (1, M)): the layout cuBLAS's
    block-scaled GEMM reads its 1×128 scales in, and that gate_up writes h_scale in. A view (no
    copy) when ``scale`` is laid out so already."""
    return scale.t().contiguous().t()


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Saturating cast to e4m3 (torch's plain cast turns out-of-range values into NaN)."""
    return x.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def _pad_to(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    pad_r, pad_c = rows - x.shape[0], cols - x.shape[1]
    if pad_r == 0 and pad_c == 0:
        return x
    return torch.nn.functional.pad(x, (0, pad_c, 0, pad_r))


def _blocks(x: torch.Tensor, br: int, bc: int) -> torch.Tensor:
    """[N, K] → [ceil(N/br), br, ceil(K/bc), bc], zero-padded (zeros never raise an amax)."""
    nb, kb = cdiv(x.shape[0], br), cdiv(x.shape[1], bc)
    return _pad_to(x, nb * br, kb * bc).view(nb, br, kb, bc)


def _expand_grid(scale: torch.Tensor, br: int, bc: int, rows: int, cols: int) -> torch.Tensor:
    """Scale grid [ceil(N/br), ceil(K/bc)] → per-element [N, K]."""
    return scale.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:rows, :cols]


# ---------------------------------------------------------------- FP8 128×128 weight blocks
def quantize_fp8_block(w: torch.Tensor, block: int = FP8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] → (e4m3 [N, K], weight_scale_inv fp32 [ceil(N/b), ceil(K/b)])."""
    n, k = w.shape
    blocks = _blocks(w.float(), block, block)
    amax = blocks.abs().amax(dim=(1, 3))
    # The very expression transformers' Fp8Quantize evaluates, so the same device gives the same bytes.
    scale = torch.where(amax > 0, FP8_MAX / amax, torch.ones_like(amax))
    scale = torch.where(amax.isnan(), amax, scale)
    q = (blocks * scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    q = q.view(blocks.shape[0] * block, blocks.shape[2] * block)[:n, :k].contiguous()
    return q, (1.0 / scale).float()


def dequantize_fp8_block(q: torch.Tensor, scale_inv: torch.Tensor, block: int = FP8_BLOCK) -> torch.Tensor:
    """(e4m3 [N, K], multiplier grid) → fp32 [N, K]. Accepts e8m0 scales (exact powers of two)."""
    n, k = q.shape
    return q.float() * _expand_grid(scale_inv.float(), block, block, n, k)


# ---------------------------------------------------------------- FP8 per-token groups of 128
def quantize_fp8_groups(x: torch.Tensor, group: int = FP8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] → (e4m3 [M, K], scale fp32 [M, ceil(K/group)]) with s = amax/448 per group."""
    m, k = x.shape
    groups = _blocks(x.float(), 1, group).view(m, -1, group)
    amax = groups.abs().amax(dim=2)
    # Tensor / tensor is a true division on every device (with a scalar divisor torch's CUDA kernel
    # multiplies by the reciprocal, an ulp away); the sm90 kernels divide exactly too (div.rn).
    s = torch.where(amax > 0, amax / torch.full_like(amax, FP8_MAX), torch.ones_like(amax))
    s = torch.where(amax.isnan(), amax, s)
    q = to_e4m3(groups / s[:, :, None]).view(m, -1)[:, :k].contiguous()
    return q, s


def dequantize_fp8_groups(q: torch.Tensor, s: torch.Tensor, group: int = FP8_BLOCK) -> torch.Tensor:
    m, k = q.shape
    return q.float() * _expand_grid(s.float(), 1, group, m, k)


# ---------------------------------------------------------------- NVFP4
def _e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """fp32 values already scaled into [-6, 6] → 4-bit codes, round-to-nearest-even on the grid.

    The sign bit comes from ``signbit``, so a small negative value that rounds to zero becomes −0
    (code 0b1000), as compressed-tensors and ModelOpt write it.
    """
    table = _e2m1_magnitudes(torch.arange(8, device=x.device))
    dist = (x.abs().clamp(max=E2M1_MAX)[..., None] - table).abs()
    nearest = dist == dist.min(dim=-1, keepdim=True).values
    # A tie has two neighbours, exactly one with an even index (mantissa bit 0): take that one.
    even = torch.arange(8, device=x.device) % 2 == 0
    pick = torch.where(nearest.sum(-1, keepdim=True) > 1, nearest & even, nearest)
    idx = pick.to(torch.uint8).argmax(dim=-1).to(torch.uint8)
    return (torch.signbit(x).to(torch.uint8) << 3) | idx


def nvfp4_global_scale(w: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' per-tensor divisor: 448·6 / amax, fp32, shape [1] (1 if not finite)."""
    amax = w.float().abs().amax().clamp(min=torch.finfo(torch.float32).tiny)
    gs = (FP8_MAX * E2M1_MAX / amax).reshape(1)
    return torch.where(gs.isfinite(), gs, torch.ones_like(gs)).to(torch.float32)


def quantize_nvfp4(
    w: torch.Tensor, global_scale: torch.Tensor | None = None, group: int = NVFP4_GROUP
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [N, K] → (packed uint8 [N, K/2], e4m3 scales [N, ceil(K/16)], divisor global scale [1])."""
    n, k = w.shape
    if k % 2:
        raise ValueError(f"NVFP4 needs an even number of columns (two codes per byte); got K = {k}")
    if global_scale is None:
        global_scale = nvfp4_global_scale(w)
    gs = global_scale.float().reshape(())
    groups = _blocks(w.float(), 1, group).view(n, -1, group)
    amax = groups.abs().amax(dim=2)
    # a true division on every device (see quantize_fp8_groups): with the scalar divisor, CUDA's
    # reciprocal multiply flipped block scales that sit on an e4m3 rounding tie (GPU tests)
    block_scale = to_e4m3(gs * (amax / torch.full_like(amax, E2M1_MAX)))
    # A block scale that rounds to 0 divides by e4m3's 0.125 instead (compressed-tensors' eps);
    # it dequantizes to 0 either way, but the stored codes must match.
    divisor = torch.where(block_scale.float() == 0, 0.125, block_scale.float()) / gs
    codes = _e2m1_codes((groups / divisor[:, :, None]).clamp(-E2M1_MAX, E2M1_MAX)).view(n, -1)[:, :k]
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.contiguous(), block_scale, global_scale.reshape(1).float()


def _e2m1_magnitudes(idx: torch.Tensor) -> torch.Tensor:
    """3-bit e2m1 magnitude indices (exponent e = idx >> 1, mantissa m = idx & 1) → fp32
    E2M1_VALUES[idx]: m / 2 for e = 0, else 2^(e-1) · (1 + m/2). Computed on idx's device, not
    looked up in a table built from Python values: that table would be a host → device copy, which
    a CUDA graph cannot capture (the reference path must be capturable, issue 22)."""
    e, m = (idx >> 1).float(), (idx & 1).float()
    return torch.where(e == 0, m * 0.5, torch.exp2(e - 1) * (1 + m * 0.5))


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] → fp32 [N, K] e2m1 values (low nibble = even element)."""
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).view(packed.shape[0], -1)
    values = _e2m1_magnitudes(codes & 7)
    return torch.where((codes & 8) != 0, -values, values)


def dequantize_nvfp4(
    packed: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor, *, divisor: bool = True,
    group: int = NVFP4_GROUP,
) -> torch.Tensor:
    """→ fp32 [N, K]. ``divisor`` says whether ``global_scale`` divides (compressed-tensors) or
    multiplies (ModelOpt's weight_scale_2); one per tensor, or one per row ([N] or [N, 1])."""
    values = unpack_e2m1(packed)
    n, k = values.shape
    gs = global_scale.float()
    gs = gs.reshape(()) if gs.numel() == 1 else gs.reshape(n, 1)
    per_elem = _expand_grid(scale.float(), 1, group, n, k)
    return values * per_elem / gs if divisor else values * per_elem * gs
