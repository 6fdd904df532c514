"""Probe: nvfp4 W4A16 at decode sizes (M ≤ 64) on warp-level mma.sync, against our dispatched kernels.

A measurement before a design (issue 22; history/nvfp4.md, "What the decode target needs"). Our
W4A16 kernels take ~2× the weight floor at M ≤ 16 on the H100 and the same microseconds on the
H200, whose HBM is 1.4× faster: their per-k-tile chain (decode to shared memory, fence, barrier,
wgmma), not the weight stream, sets the time. This probe times the other design, the one the
Hopper peers use for NVFP4: every warp loads its weight fragments straight from global memory into
registers (a fragment order built once, as the modules build tile-major), decodes them there and
issues `mma.sync.m16n8k16` with the weight as A and the tokens as B (read from shared memory with
ldmatrix); no CTA barrier in the k loop, so warps run out of step. K is split over CTAs, whose
fp32 partials meet in y by atomic adds (the probe's shortcut: a kernel to ship would reduce them
in order).

It is a probe, not a kernel to ship: CUDA C++ compiled at run time by CuPy (NVRTC), plain GEMM (no
epilogue, no global scale), M ≤ 64 (8, 16, 32 or 64 token columns), N a multiple of the CTA's rows.
It checks its y against the reference dequantization (relative Frobenius), then times each config
and our dispatched nvfp4 gate_up / down (fused epilogue, bf16 out; at M ≤ 16 since D33 the
warp-MMA kernels, above it the 64-token wgmma tile) on the same shapes, weights rotated past L2.

    python -m benchmarks.probe_warp_mma [--shapes 4096x14336,8192x3584] [--m 1,16,32,64]

The fragment order (``to_fragment_order``) and the decode's arithmetic (``emulate_decode``) are
plain torch and tested on the CPU (tests/test_probe_warp_mma.py).

Fragment order. For each 16-row block rb and 64-column block kc, lane l = 4g + t of the warp holds
four words (one 16-byte load), word s for the k16 step s: the A fragment of m16n8k16, rows g and
g + 8, columns 16s + {2t, 2t+1, 2t+8, 2t+9} of the block, as pairs a0 = (g; 2t, 2t+1), a1 = (g+8;
2t, 2t+1), a2 = (g; 2t+8, 2t+9), a3 = (g+8; 2t+8, 2t+9), its bits in the decode order of
kernels/nvfp4_layout.py (pair j = columns 2j, 2j+1 of the word). Scales: for (rb, kc, g) 8 bytes,
byte 2s = row g's scale of group 4kc + s, byte 2s + 1 row g + 8's.
"""

from __future__ import annotations

import argparse

import torch

from swiglu_fused.kernels import nvfp4_layout

DECODE_SHIFT = 64  # scales are decoded as scale · 2^64, codes as code · 2^-126: y comes out · 2^-62
Y_SHIFT = 126 - DECODE_SHIFT


def _index_tables() -> tuple[torch.Tensor, torch.Tensor]:
    """(row [32, 4, 8], col [32, 4, 8]) of the value at (lane, step, column of the word) in its 16 × 64 block."""
    lane = torch.arange(32).view(32, 1, 1)
    step = torch.arange(4).view(1, 4, 1)
    c = torch.arange(8).view(1, 1, 8)
    g, t = lane // 4, lane % 4
    row = g + 8 * ((c // 2) % 2)
    col = 16 * step + 2 * t + c % 2 + 8 * (c // 4)
    return row.expand(32, 4, 8), col.expand(32, 4, 8)


def to_fragment_order(weight: torch.Tensor, weight_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed nvfp4 weight [N, K/2] (uint8) and e4m3 scales [N, K/16] → (codes, scales) as flat uint8
    tensors in the fragment order above. N a multiple of 16, K of 64."""
    n, k = weight.shape[0], 2 * weight.shape[1]
    if n % 16 or k % 64:
        raise ValueError(f"weight: the fragment order needs N % 16 == 0 and K % 64 == 0, got N = {n}, K = {k}")
    nib = torch.stack([weight & 0xF, weight >> 4], dim=-1).view(n // 16, 16, k // 64, 64).transpose(1, 2)
    row, col = (t.to(weight.device) for t in _index_tables())
    frag = nib[:, :, row, col]  # [N/16, K/64, 32, 4, 8]
    codes = (frag[..., 0::2] | (frag[..., 1::2] << 4)).contiguous().view(-1)  # packed order in each word
    nvfp4_layout._move_bits_(codes, nvfp4_layout._NEW_BIT)
    s = weight_scale.view(torch.uint8).view(n // 16, 2, 8, k // 64, 4)  # [rb, row half, g, kc, s]
    return codes, s.permute(0, 3, 2, 4, 1).contiguous().view(-1)


def emulate_decode(codes: torch.Tensor, scales: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The kernel's decode in torch integer and bf16 arithmetic (CPU or GPU): fragment-order codes
    and scales → the fp32 weight [N, K] times 2^-Y_SHIFT, through the same bit operations and
    roundings as the CUDA source's ``f16x2_to_bf16x2_shifted`` and ``decode`` (so a CPU test covers them)."""
    words = codes.view(torch.int32).view(n // 16, k // 64, 32, 4).long() & 0xFFFFFFFF
    pairs = []
    for s_shift, m_shift in nvfp4_layout.PAIR_SHIFTS:
        def shifted(r):
            return (words << r) & 0xFFFFFFFF if r >= 0 else words >> -r
        pairs.append(shifted(s_shift) & nvfp4_layout.SIGN_MASK | shifted(m_shift) & nvfp4_layout.MAGNITUDE_MASK)
    # each pair word: two bf16, low half the even column: value code · 2^-126
    t = torch.stack(pairs, dim=-1)  # [rb, kc, lane, step, pair]
    halves = torch.stack([t & 0xFFFF, t >> 16], dim=-1)
    code_vals = _bf16_bits_to_float(halves)  # [rb, kc, lane, step, pair, 2]
    sc = _scale_values(scales.view(n // 16, k // 64, 8, 4, 2))  # [rb, kc, g, step, row half] = scale · 2^64
    lane = torch.arange(32, device=codes.device)
    g = lane // 4
    per_pair = sc[:, :, g]  # [rb, kc, lane, step, row half]
    pair_half = torch.tensor([0, 1, 0, 1], device=codes.device)  # a0, a2: row g; a1, a3: row g + 8
    vals = (code_vals * per_pair[..., pair_half].unsqueeze(-1))  # exact: ≤ 5 significant bits
    vals = vals.to(torch.bfloat16).float()  # the kernel's fma rounds to bf16: exact, so no change
    row, col = _index_tables()
    out = torch.zeros(n // 16, k // 64, 16, 64, device=codes.device)
    flat = vals.view(n // 16, k // 64, 32, 4, 8)
    out[:, :, row.to(codes.device), col.to(codes.device)] = flat
    return out.transpose(1, 2).reshape(n, k)


def _bf16_bits_to_float(bits: torch.Tensor) -> torch.Tensor:
    """16-bit bf16 patterns (in an integer tensor) → their exact fp32 values (subnormals kept)."""
    return (bits.to(torch.int32) << 16).view(torch.float32)


def _scale_values(raw: torch.Tensor) -> torch.Tensor:
    """e4m3 scale bytes → scale · 2^64 as the kernel forms them: e4m3 → f16 (exact), the f16 bits
    moved into a bf16 (exponent field as is: the value · 2^-112), then · 2^127 and · 2^49."""
    f16 = raw.view(torch.float8_e4m3fn).to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF
    bf = (f16 & 0x8000) | ((f16 >> 3) & 0x0FFF)
    v = _bf16_bits_to_float(bf)
    return (v * 2.0 ** 127).to(torch.bfloat16).float() * 2.0 ** 49


CUDA_SOURCE = r"""
typedef unsigned int u32;

__device__ __forceinline__ u32 prmt(u32 a, u32 sel) {
  u32 d; asm("prmt.b32 %0, %1, %1, %2;" : "=r"(d) : "r"(a), "r"(sel)); return d;
}

// Two e4m3 scales (low byte row g, high byte row g + 8) -> bf16x2 (row g, row g + 8), each
// scale * 2^64: e4m3 -> f16 is exact (cvt below); the f16's bits moved into a bf16 are its value
// * 2^-112 (every e4m3 value is a normal f16 with a 3-bit mantissa); two fma restore 2^176.
__device__ __forceinline__ u32 f16x2_to_bf16x2_shifted(u32 h) {
  u32 b = (h & 0x80008000u) | ((h >> 3) & 0x0FFF0FFFu);
  u32 r;
  asm("{\n\t.reg .b32 c1, c2, z;\n\tmov.b32 c1, 0x7F007F00;\n\tmov.b32 c2, 0x58005800;\n\t"
      "mov.b32 z, 0x80008000;\n\tfma.rn.bf16x2 %0, %1, c1, z;\n\tfma.rn.bf16x2 %0, %0, c2, z;\n\t}"
      : "=r"(r) : "r"(b));
  return r;
}

__device__ __forceinline__ u32 e4m3x2_lo(u32 word) {
  u32 h; asm("{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %1;\n\tcvt.rn.f16x2.e4m3x2 %0, lo;\n\t}" : "=r"(h) : "r"(word));
  return h;
}
__device__ __forceinline__ u32 e4m3x2_hi(u32 word) {
  u32 h; asm("{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %1;\n\tcvt.rn.f16x2.e4m3x2 %0, hi;\n\t}" : "=r"(h) : "r"(word));
  return h;
}

__device__ __forceinline__ u32 fma_bf16x2(u32 a, u32 b) {
  u32 d; asm("{\n\t.reg .b32 z;\n\tmov.b32 z, 0x80008000;\n\tfma.rn.bf16x2 %0, %1, %2, z;\n\t}" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// One word of 8 codes (nvfp4_layout's decode order) -> the A fragment a0..a3, times the scales.
__device__ __forceinline__ void decode(u32 w, u32 sg, u32 sg8, u32* a) {
  a[0] = fma_bf16x2(w & 0x81C081C0u, sg);
  a[1] = fma_bf16x2(((w << 1) & 0x80008000u) | ((w << 3) & 0x01C001C0u), sg8);
  a[2] = fma_bf16x2(((w << 2) & 0x80008000u) | ((w >> 4) & 0x01C001C0u), sg);
  a[3] = fma_bf16x2((w << 6) & 0x81C081C0u, sg8);
}

// One tile-major word (8 columns of one row) -> its four pairs (columns 2j, 2j + 1), times the scale.
__device__ __forceinline__ void decode_word(u32 w, u32 sc, u32* p) {
  p[0] = fma_bf16x2(w & 0x81C081C0u, sc);
  p[1] = fma_bf16x2(((w << 1) & 0x80008000u) | ((w << 3) & 0x01C001C0u), sc);
  p[2] = fma_bf16x2(((w << 2) & 0x80008000u) | ((w >> 4) & 0x01C001C0u), sc);
  p[3] = fma_bf16x2((w << 6) & 0x81C081C0u, sc);
}

__device__ __forceinline__ uint4 ldg_w(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ldg_s(const uint2* p) {
  uint2 v;
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// B fragments of NT token tiles (NT = 1 or even): one ldmatrix.x4 per 16 tokens, rows 16 tokens
// (16 * row_bytes) apart; x2 for one tile.
template <int NT>
__device__ __forceinline__ void ldmatrix_b(u32 addr, u32 row_bytes, u32 (&b)[NT][2]) {
  if constexpr (NT == 1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(b[0][0]), "=r"(b[0][1]) : "r"(addr));
  } else {
#pragma unroll
    for (int i = 0; i < NT / 2; ++i)
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                   : "=r"(b[2 * i][0]), "=r"(b[2 * i][1]), "=r"(b[2 * i + 1][0]), "=r"(b[2 * i + 1][1])
                   : "r"(addr + 16u * row_bytes * i));
  }
}

__device__ __forceinline__ void mma(float (&c)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
               "{%8, %9}, {%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The C fragments (rows g, g + 8 of row block rb0 + r; tokens 8n + 2t, + 1) added to y[token, row].
template <int RB, int NT>
__device__ __forceinline__ void add_to_y(const float (&acc)[RB][NT][4], float* y, int rb0, int lane, int M, int N) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int r = 0; r < RB; ++r) {
    const int row = (rb0 + r) * 16 + g;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        const int tok = n * 8 + 2 * t + v;
        if (tok < M) {
          atomicAdd(y + (size_t)tok * N + row, acc[r][n][v]);
          atomicAdd(y + (size_t)tok * N + row + 8, acc[r][n][2 + v]);
        }
      }
    }
  }
}

// y[M, N] += x[M, K] @ W^T over this CTA's K range (fp32 atomics), times 2^-62.
// Grid (N / (16 * RB * WARPS), K / KC); NT n8 token tiles (M <= 8 * NT).
template <int NT, int WARPS, int RB, int KC, int DEPTH>
__global__ void __launch_bounds__(WARPS * 32) w4a16_warp_mma(
    const uint4* __restrict__ wq, const uint2* __restrict__ ws, const unsigned short* __restrict__ x,
    float* __restrict__ y, int M, int N, int K) {
  constexpr int XS = KC + 8;  // smem row stride in bf16: 16 bytes of pad, ldmatrix without conflicts
  constexpr int ITERS = KC / 64;
  extern __shared__ __align__(16) unsigned short xs[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kcn = K / 64, kc0 = blockIdx.y * ITERS;
  const int rb0 = (blockIdx.x * WARPS + warp) * RB;

  uint4 wbuf[DEPTH][RB];
  uint2 sbuf[DEPTH][RB];
#pragma unroll
  for (int i = 0; i < DEPTH; ++i) {
    if (i < ITERS) {
#pragma unroll
      for (int r = 0; r < RB; ++r) {
        const size_t blk = (size_t)(rb0 + r) * kcn + kc0 + i;
        wbuf[i][r] = ldg_w(wq + blk * 32 + lane);
        sbuf[i][r] = ldg_s(ws + blk * 8 + (lane >> 2));
      }
    }
  }
  // x's slice into shared memory, 16 bytes a copy, every load of a thread issued before its stores
  constexpr int XN = 8 * NT * (KC / 8), PER = (XN + WARPS * 32 - 1) / (WARPS * 32);
  uint4 xv[PER];
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int idx = threadIdx.x + j * WARPS * 32, row = idx / (KC / 8), c8 = idx % (KC / 8);
    xv[j] = make_uint4(0u, 0u, 0u, 0u);
    if (idx < XN && row < M) xv[j] = *reinterpret_cast<const uint4*>(x + (size_t)row * K + (size_t)kc0 * 64 + c8 * 8);
  }
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int idx = threadIdx.x + j * WARPS * 32, row = idx / (KC / 8), c8 = idx % (KC / 8);
    if (idx < XN) *reinterpret_cast<uint4*>(xs + row * XS + c8 * 8) = xv[j];
  }
  __syncthreads();

  float acc[RB][NT][4] = {};

  const int lrow = (lane & 7) + ((lane >> 4) << 3), lcol = ((lane >> 3) & 1) * 8;
  const u32 xaddr = (u32)__cvta_generic_to_shared(xs) + (u32)(lrow * XS + lcol) * 2u;

#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    uint4 w[RB];
    uint2 s[RB];
#pragma unroll
    for (int r = 0; r < RB; ++r) { w[r] = wbuf[it % DEPTH][r]; s[r] = sbuf[it % DEPTH][r]; }
    if (it + DEPTH < ITERS) {
#pragma unroll
      for (int r = 0; r < RB; ++r) {
        const size_t blk = (size_t)(rb0 + r) * kcn + kc0 + it + DEPTH;
        wbuf[it % DEPTH][r] = ldg_w(wq + blk * 32 + lane);
        sbuf[it % DEPTH][r] = ldg_s(ws + blk * 8 + (lane >> 2));
      }
    }
#pragma unroll
    for (int st = 0; st < 4; ++st) {
      u32 b[NT][2];
      ldmatrix_b<NT>(xaddr + (u32)(it * 64 + st * 16) * 2u, 2u * XS, b);
#pragma unroll
      for (int r = 0; r < RB; ++r) {
        const u32 sw = st < 2 ? s[r].x : s[r].y;
        const u32 sc = f16x2_to_bf16x2_shifted((st & 1) ? e4m3x2_hi(sw) : e4m3x2_lo(sw));
        const u32 word = st == 0 ? w[r].x : st == 1 ? w[r].y : st == 2 ? w[r].z : w[r].w;
        u32 a[4];
        decode(word, prmt(sc, 0x1010), prmt(sc, 0x3232), a);
#pragma unroll
        for (int n = 0; n < NT; ++n) mma(acc[r][n], a, b[n]);
      }
    }
  }

  add_to_y<RB, NT>(acc, y, rb0, lane, M, N);
}

// The same product on the modules' tile-major weight (kernels/nvfp4_layout.py: codes
// [N/256][K/64][256 rows][32 bytes], scales [N/256][K/64][256 rows][4 e4m3], each word's bits in the
// decode order), no other layout. Lane (g, t) reads 16 bytes of rows g and g + 8 a 128-column block:
// chunk t (k tile t / 2, its half t % 2), i.e. columns 32t .. 32t + 31; its word q holds columns
// 32t + 8q .. + 7. The mma's k order is permuted instead: step s = 2q + h takes pairs 2h (a0 / a1)
// and 2h + 1 (a2 / a3) of word q, so b0 / b1 must be x at columns 32t + 8q + 4h + {0, 1} / + {2, 3}:
// x is staged in shared memory in that order (pair p = 16t + 4q + 2h + b of a block at pair
// 8(2q + h) + 4b + t). Scales: word q's group is 2(t % 2) + q / 2 of its row's k-tile word.
template <int NT, int WARPS, int RB, int KC, int DEPTH>
__global__ void __launch_bounds__(WARPS * 32) w4a16_warp_mma_tm(
    const unsigned char* __restrict__ wq, const unsigned int* __restrict__ ws, const unsigned int* __restrict__ x,
    float* __restrict__ y, int M, int N, int K) {
  constexpr int XS = KC + 8;
  constexpr int ITERS = KC / 128;
  extern __shared__ __align__(16) unsigned short xs[];
  unsigned int* xs32 = reinterpret_cast<unsigned int*>(xs);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int ktn = K / 64, i0 = blockIdx.y * ITERS;
  const int rb0 = (blockIdx.x * WARPS + warp) * RB;

  // byte offset of (row, k tile) in the codes; word index in the scales
  auto code_at = [&](int row, int kt) { return ((size_t)(row >> 8) * ktn + kt) * 8192 + (size_t)(row & 255) * 32; };
  auto scale_at = [&](int row, int kt) { return ((size_t)(row >> 8) * ktn + kt) * 256 + (row & 255); };

  uint4 wbuf[DEPTH][RB][2];
  u32 sbuf[DEPTH][RB][2];
  auto load = [&](int slot, int i) {
    const int kt = 2 * i + (t >> 1);
#pragma unroll
    for (int r = 0; r < RB; ++r) {
      const int row = (rb0 + r) * 16 + g;
      wbuf[slot][r][0] = ldg_w(reinterpret_cast<const uint4*>(wq + code_at(row, kt) + 16 * (t & 1)));
      wbuf[slot][r][1] = ldg_w(reinterpret_cast<const uint4*>(wq + code_at(row + 8, kt) + 16 * (t & 1)));
      sbuf[slot][r][0] = __ldg(ws + scale_at(row, kt));
      sbuf[slot][r][1] = __ldg(ws + scale_at(row + 8, kt));
    }
  };
#pragma unroll
  for (int i = 0; i < DEPTH; ++i)
    if (i < ITERS) load(i, i0 + i);

  // x's slice into shared memory in the permuted order: 16-byte loads (pairs p .. p + 3: the same t
  // and q, (h, b) = 00, 01, 10, 11 at pairs +0, +4, +8, +12 of the permuted order), all issued first
  constexpr int XN = 8 * NT * (KC / 8), PER = (XN + WARPS * 32 - 1) / (WARPS * 32);
  uint4 xv[PER];
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int idx = threadIdx.x + j * WARPS * 32, row = idx / (KC / 8), p = 4 * (idx % (KC / 8));
    xv[j] = make_uint4(0u, 0u, 0u, 0u);
    if (idx < XN && row < M) xv[j] = *reinterpret_cast<const uint4*>(x + ((size_t)row * K + (size_t)i0 * 128) / 2 + p);
  }
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int idx = threadIdx.x + j * WARPS * 32, row = idx / (KC / 8), p = 4 * (idx % (KC / 8));
    const int pb = p & 63, tt = pb >> 4, q = (pb >> 2) & 3;
    unsigned int* dst = xs32 + row * (XS / 2) + (p & ~63) + 16 * q + tt;
    if (idx < XN) { dst[0] = xv[j].x; dst[4] = xv[j].y; dst[8] = xv[j].z; dst[12] = xv[j].w; }
  }
  __syncthreads();

  float acc[RB][NT][4] = {};

  const int lrow = (lane & 7) + ((lane >> 4) << 3), lcol = ((lane >> 3) & 1) * 8;
  const u32 xaddr = (u32)__cvta_generic_to_shared(xs) + (u32)(lrow * XS + lcol) * 2u;
  const u32 sel_lo = (2 * (t & 1)) | ((4 + 2 * (t & 1)) << 4);  // bytes 2(t%2) of the two rows' words
  const u32 sel_hi = sel_lo + 0x11;                              // and 2(t%2) + 1

#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    uint4 w[RB][2];
    u32 sw[RB][2];
#pragma unroll
    for (int r = 0; r < RB; ++r) {
      w[r][0] = wbuf[it % DEPTH][r][0]; w[r][1] = wbuf[it % DEPTH][r][1];
      sw[r][0] = sbuf[it % DEPTH][r][0]; sw[r][1] = sbuf[it % DEPTH][r][1];
    }
    if (it + DEPTH < ITERS) load(it % DEPTH, i0 + it + DEPTH);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      u32 sg[RB], sg8[RB], a[RB][2][4];
#pragma unroll
      for (int r = 0; r < RB; ++r) {
        u32 pair;
        asm("prmt.b32 %0, %1, %2, %3;" : "=r"(pair) : "r"(sw[r][0]), "r"(sw[r][1]), "r"(q < 2 ? sel_lo : sel_hi));
        const u32 sc = f16x2_to_bf16x2_shifted(e4m3x2_lo(pair));
        sg[r] = prmt(sc, 0x1010);
        sg8[r] = prmt(sc, 0x3232);
        const u32 wg = q == 0 ? w[r][0].x : q == 1 ? w[r][0].y : q == 2 ? w[r][0].z : w[r][0].w;
        const u32 wg8 = q == 0 ? w[r][1].x : q == 1 ? w[r][1].y : q == 2 ? w[r][1].z : w[r][1].w;
        decode_word(wg, sg[r], a[r][0]);
        decode_word(wg8, sg8[r], a[r][1]);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        u32 b[NT][2];
        ldmatrix_b<NT>(xaddr + (u32)(it * 128 + (2 * q + h) * 16) * 2u, 2u * XS, b);
#pragma unroll
        for (int r = 0; r < RB; ++r) {
          const u32 frag[4] = {a[r][0][2 * h], a[r][1][2 * h], a[r][0][2 * h + 1], a[r][1][2 * h + 1]};
#pragma unroll
          for (int n = 0; n < NT; ++n) mma(acc[r][n], frag, b[n]);
        }
      }
    }
  }

  add_to_y<RB, NT>(acc, y, rb0, lane, M, N);
}
"""

# (WARPS, RB, KC, DEPTH) tried at each shape where they divide it: the fragment order's kernel
# (k in 64-column steps) and the tile-major one (128-column steps)
CONFIGS = ((8, 1, 512, 4), (8, 1, 1024, 4), (8, 1, 256, 4), (4, 1, 512, 4), (4, 2, 512, 4), (8, 1, 448, 7))
TM_CONFIGS = ((8, 1, 512, 2), (8, 1, 512, 4), (8, 1, 1024, 4), (4, 1, 512, 4), (8, 1, 256, 2), (8, 1, 896, 4),
              (4, 2, 512, 2))
KERNELS = {False: ("w4a16_warp_mma", CONFIGS), True: ("w4a16_warp_mma_tm", TM_CONFIGS)}
TOKEN_TILES = (1, 2, 4, 8)  # n8 token tiles of a kernel: M ≤ 8, 16, 32, 64


def fits(config, n: int, k: int, tile_major: bool = False) -> bool:
    warps, rb, kc, _depth = config
    return n % (16 * rb * warps) == 0 and k % kc == 0 and (not tile_major or (n % 256 == 0 and kc % 128 == 0))


class Probe:
    """The compiled kernels (CuPy, NVRTC), launched on torch's current stream."""

    def __init__(self):
        import cupy

        self.cupy = cupy
        self.kernels = {}
        names = [self._name(tm, nt, c) for tm, (_, configs) in KERNELS.items() for nt in TOKEN_TILES for c in configs]
        self.module = cupy.RawModule(code=CUDA_SOURCE, options=("-std=c++17", "--gpu-architecture=sm_90a"),
                                     name_expressions=names)

    @staticmethod
    def _name(tile_major, nt, config):
        return f"{KERNELS[tile_major][0]}<{nt}, {', '.join(map(str, config))}>"

    def kernel(self, tile_major, nt, config):
        key = (tile_major, nt, config)
        if key not in self.kernels:
            fn = self.module.get_function(self._name(*key))
            fn.max_dynamic_shared_size_bytes = self.smem(nt, config)
            self.kernels[key] = fn
        return self.kernels[key]

    @staticmethod
    def smem(nt, config):
        return 8 * nt * (config[2] + 8) * 2

    def __call__(self, config, codes, scales, x, y, tile_major=False):
        """y [M, N] fp32 += x [M, K] bf16 @ W^T · 2^-Y_SHIFT (y must be zeroed for a plain product);
        codes / scales in the fragment order, or (``tile_major``) the modules' tile-major tensors."""
        import numpy as np

        m, k = x.shape
        n = y.shape[1]
        nt = next(t for t in TOKEN_TILES if m <= 8 * t)
        warps, rb, kc, _ = config
        fn = self.kernel(tile_major, nt, config)
        cp = self.cupy
        xv = x.view(torch.int32) if tile_major else x.view(torch.int16)
        with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            fn((n // (16 * rb * warps), k // kc), (32 * warps,),
               (cp.asarray(codes.view(torch.uint8)), cp.asarray(scales.view(torch.uint8)), cp.asarray(xv),
                cp.asarray(y), np.int32(m), np.int32(n), np.int32(k)),
               shared_mem=self.smem(nt, config))


def copy_rate(nbytes: int = 2 << 30) -> float:
    """Bytes per µs a device-to-device copy moves, reads and writes counted (the weight floors' rate)."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(8):
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return 2 * nbytes / sorted(times)[len(times) // 2]


def run(shapes, ms, iters: int = 50):
    from benchmarks import bench_nvfp4 as bn
    from swiglu_fused import quant
    from swiglu_fused.bench import cycling, graph_time_us
    from swiglu_fused.kernels import ops

    probe = Probe()
    rate = copy_rate()
    print(f"{torch.cuda.get_device_name()}: a copy moves {rate / 1e6:.2f} TB/s (read + write)", flush=True)
    for hidden, inter in shapes:
        gu = bn._layers(lambda i: bn.nvfp4_gate_up(hidden, inter, i), bn._nbytes(*bn.nvfp4_gate_up(hidden, inter, 99)))
        dn = bn._layers(lambda i: bn._nvfp4_down(hidden, inter, i), bn._nbytes(*bn._nvfp4_down(hidden, inter, 99)))
        for name, layers, (n, k) in (("gate_up", gu, (2 * inter, hidden)), ("down", dn, (hidden, inter))):
            frag = [to_fragment_order(w[0], w[1]) for w in layers]
            tm = [(*nvfp4_layout.to_tile_major(w[0], w[1]), w[2]) for w in layers]
            nbytes = bn._nbytes(*layers[0][:2])
            ref_w = quant.dequantize_nvfp4(layers[0][0], layers[0][1], torch.ones(1, device="cuda"), divisor=False)
            for m in ms:
                x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
                ref = x.float() @ ref_w.T
                y = torch.empty(m, n, device="cuda")
                if name == "gate_up":
                    ours = cycling(lambda w, s, gs: ops.gate_up(x, w, s, None, gs, interleave=128, h_format="bf16",
                                                                tile_major=True), tm)
                else:
                    ours = cycling(lambda w, s, gs: ops.down(x, w, s, None, gs, tile_major=True), tm)
                times = {"ours (dispatched, fused)": graph_time_us(ours, iters)}
                for tile_major, (_, configs) in KERNELS.items():
                    sets = [(t[0], t[1]) for t in tm] if tile_major else frag
                    for config in configs:
                        if not fits(config, n, k, tile_major):
                            continue
                        y.zero_()  # the atomics add to it
                        probe(config, *sets[0], x, y, tile_major)
                        torch.cuda.synchronize()
                        err = ((y * 2.0 ** Y_SHIFT - ref).norm() / ref.norm()).item()
                        label = f"{'tile-major' if tile_major else 'fragment'} {config} (err {err:.1e})"
                        times[label] = graph_time_us(
                            cycling(lambda w, s, c=config, tmj=tile_major: probe(c, w, s, x, y, tmj), sets), iters)
                floor = nbytes / rate
                print(f"{name} {hidden}x{inter} (N {n}, K {k}) M={m}: floor {floor:.1f} µs; "
                      + "; ".join(f"{key} {v:.1f}" for key, v in times.items()), flush=True)
            del frag, tm
            torch.cuda.empty_cache()


def main(argv=None):
    from swiglu_fused.bench import parse_ms, parse_shapes

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="4096x14336,8192x3584")
    p.add_argument("--m", default="1,16")
    p.add_argument("--iters", type=int, default=50)
    a = p.parse_args(argv)
    run(parse_shapes(a.shapes), parse_ms(a.m), a.iters)


if __name__ == "__main__":
    main()
