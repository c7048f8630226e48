// Device-side dot products of one weight row with a vector staged in shared memory, for the fast
// matvec (matvec_kernels.cu). A row is cut into "units" (the work of one lane per step):
//   Q4_K, Q5_K: 32 weights = 16 bytes of 4-bit codes (two half sub-blocks of 16) + the block header;
//   Q6_K: 64 weights = 16 bytes of each of ql (two runs) and qh, 4 scales;
//   Q8_0: one 34-byte block; F32: 4 floats; F16/BF16: 8 halves (or 1 element when rows are not
//   16-byte aligned).
// Codes become floats exactly through the exponent trick: a byte b placed in the low mantissa bits of
// 2^23 gives the float 2^23 + b, and subtracting 2^23 (+ the code offset) is exact. Block layouts:
// src/strata/quant/blocks.h (restated in quant_decode.cuh).
//
// Shared-memory layout of x: element i at xs[xpad(i)] (4 floats of padding after every 64, so the
// 16-float runs that the 8 lanes of a quarter-warp read for one Q4_K super-block fall in different
// banks); s16[c] = sum of x[16c .. 16c+15] (K-quant minimums multiply it).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "strata/cuda/quant_decode.cuh"

namespace strata::cuda::rows {

__device__ __forceinline__ int xpad(int i) { return i + ((i >> 6) << 2); }
__host__ __device__ constexpr int xpad_size(int n) { return n + ((n + 63) / 64) * 4; }

constexpr float kMagic = 8388608.0f;  // 2^23

// Byte b of w as the float 2^23 + byte.
template <int B>
__device__ __forceinline__ float byte_f(uint32_t w) {
  return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540u | B));
}

// sum_{i<16} (code_i - off) * x[i], codes in the 16 bytes of v (byte 0 of v[0] first), x at xp
// (16-byte aligned shared memory). off_magic = 2^23 + the code offset.
__device__ __forceinline__ float dot16(const uint32_t v[4], const float* xp, float off_magic) {
  float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const float4 xv = *reinterpret_cast<const float4*>(xp + 4 * w);
    a0 = fmaf(byte_f<0>(v[w]) - off_magic, xv.x, a0);
    a1 = fmaf(byte_f<1>(v[w]) - off_magic, xv.y, a1);
    a0 = fmaf(byte_f<2>(v[w]) - off_magic, xv.z, a0);
    a1 = fmaf(byte_f<3>(v[w]) - off_magic, xv.w, a1);
  }
  return a0 + a1;
}

__device__ __forceinline__ uint4 ld16_aligned(const uint8_t* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// 16 bytes at a 2-byte aligned address: five aligned words (four when p is 4-byte aligned), shifted into
// place (for Q6_K, whose 210-byte blocks put every other block at 2 mod 4). Reads at most 4 bytes past
// p + 16 (callers stay inside the block).
__device__ __forceinline__ void ld16_a2(const uint8_t* p, uint32_t out[4]) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(a & ~uintptr_t{3});
  const uint32_t sh = static_cast<uint32_t>(a & 3) * 8;
  // A 4-byte aligned p needs only four words (its fifth load is predicated off: no memory request).
  const uint32_t w0 = __ldg(w), w1 = __ldg(w + 1), w2 = __ldg(w + 2), w3 = __ldg(w + 3), w4 = sh ? __ldg(w + 4) : 0u;
  out[0] = __funnelshift_r(w0, w1, sh);
  out[1] = __funnelshift_r(w1, w2, sh);
  out[2] = __funnelshift_r(w2, w3, sh);
  out[3] = __funnelshift_r(w3, w4, sh);
}

__device__ __forceinline__ float half_lo(uint32_t w) { return __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu))); }
__device__ __forceinline__ float half_hi(uint32_t w) { return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16))); }

// Byte k (4..15) of a 16-byte K-quant block header held in registers.
__device__ __forceinline__ int hdr_byte(const uint4& h, int k) {
  const uint32_t w = k < 8 ? (k < 4 ? h.x : h.y) : (k < 12 ? h.z : h.w);
  return static_cast<int>((w >> (8 * (k & 3))) & 0xffu);
}

// 6-bit scale and min of sub-block j of a Q4_K/Q5_K header (scales at header bytes 4..15), as
// k4_scale_min_dev in quant_decode.cuh.
__device__ __forceinline__ void k4_sm(const uint4& h, int j, int& sc, int& m) {
  if (j < 4) {
    sc = hdr_byte(h, 4 + j) & 63;
    m = hdr_byte(h, 8 + j) & 63;
  } else {
    sc = (hdr_byte(h, 8 + j) & 15) | ((hdr_byte(h, j) >> 6) << 4);
    m = (hdr_byte(h, 8 + j) >> 4) | ((hdr_byte(h, 4 + j) >> 6) << 4);
  }
}

// Each unit is split into a load (global memory into registers) and a compute step, so a lane issues
// the loads of several units before it waits for the first.

// Q4_K / Q5_K unit u: super-block u/8; within it, half h of the 32-byte code group g covers weights
// 64g + 16h + [0,16) (low nibbles, sub-block 2g) and 64g + 32 + 16h + [0,16) (high nibbles, 2g+1).
struct K45Raw {
  uint4 hd, q, qh;
};

template <bool kFive>
__device__ __forceinline__ K45Raw k45_load(const uint8_t* row, int u) {
  constexpr int kBlock = kFive ? 176 : 144;
  const int sb = u >> 3, j = u & 7, g = j >> 1, h = j & 1;
  const uint8_t* b = row + static_cast<size_t>(sb) * kBlock;
  K45Raw r{};  // qh stays zero for Q4_K
  r.hd = ld16_aligned(b);
  r.q = ld16_aligned(b + (kFive ? 48 : 16) + 32 * g + 16 * h);
  if constexpr (kFive) r.qh = ld16_aligned(b + 16 + 16 * h);
  return r;
}

// The codes of a Q4_K/Q5_K unit, one per byte (0..15 or 0..31): lo = sub-block 2g's 16 weights, hi =
// sub-block 2g+1's (Q5_K adds the fifth bit from qh).
template <bool kFive>
__device__ __forceinline__ void k45_codes(const K45Raw& r, int g, uint32_t lo[4], uint32_t hi[4]) {
  const uint32_t qw[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
  const uint32_t qhw[4] = {r.qh.x, r.qh.y, r.qh.z, r.qh.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    lo[w] = qw[w] & 0x0F0F0F0Fu;
    hi[w] = (qw[w] >> 4) & 0x0F0F0F0Fu;
    if constexpr (kFive) {
      lo[w] |= ((qhw[w] >> (2 * g)) & 0x01010101u) << 4;
      hi[w] |= ((qhw[w] >> (2 * g + 1)) & 0x01010101u) << 4;
    }
  }
}

// A Q4_K/Q5_K unit decoded: its codes, the scale and min of each of its two 16-weight halves
// (d * scale, dmin * min), and the first x index of each half.
struct K45Unit {
  uint32_t lo[4], hi[4];
  float dl0, ml0, dl1, ml1;
  int x0, x1;
};

template <bool kFive>
__device__ __forceinline__ K45Unit k45_unpack(const K45Raw& r, int u) {
  const int sb = u >> 3, j = u & 7, g = j >> 1, h = j & 1;
  K45Unit k;
  k45_codes<kFive>(r, g, k.lo, k.hi);
  int sc0, m0, sc1, m1;
  k4_sm(r.hd, 2 * g, sc0, m0);
  k4_sm(r.hd, 2 * g + 1, sc1, m1);
  const float d = half_lo(r.hd.x), dmin = half_hi(r.hd.x);
  k.dl0 = d * static_cast<float>(sc0), k.ml0 = dmin * static_cast<float>(m0);
  k.dl1 = d * static_cast<float>(sc1), k.ml1 = dmin * static_cast<float>(m1);
  k.x0 = sb * 256 + 64 * g + 16 * h;
  k.x1 = k.x0 + 32;
  return k;
}

template <bool kFive>
__device__ __forceinline__ float k45_compute(const K45Raw& r, int u, const float* xs, const float* s16) {
  const K45Unit k = k45_unpack<kFive>(r, u);
  const float dot0 = dot16(k.lo, xs + xpad(k.x0), kMagic);
  const float dot1 = dot16(k.hi, xs + xpad(k.x1), kMagic);
  return (k.dl0 * dot0 - k.ml0 * s16[k.x0 >> 4]) + (k.dl1 * dot1 - k.ml1 * s16[k.x1 >> 4]);
}

// Q6_K unit u: super-block u/4, half n = (u/2)&1 (128 weights), run t = u&1 of 16 within each of the
// four 32-weight quarters k: weight 128n + 32k + 16t + i has low bits from ql (bytes 64n + 16t + i for
// k = 0/2, + 32 for k = 1/3; low nibble for k < 2) and 2 high bits (2k) of qh byte 128 + 32n + 16t + i;
// scale byte 192 + 8n + 2k + t.
struct Q6Raw {
  uint32_t l0[4], l1[4], qh[4];
  int sc[4];
  float d;
};

__device__ __forceinline__ Q6Raw q6k_load(const uint8_t* row, int u) {
  const int sb = u >> 2, n = (u >> 1) & 1, t = u & 1;
  const uint8_t* b = row + static_cast<size_t>(sb) * 210;
  Q6Raw r;
  ld16_a2(b + 64 * n + 16 * t, r.l0);
  ld16_a2(b + 64 * n + 32 + 16 * t, r.l1);
  ld16_a2(b + 128 + 32 * n + 16 * t, r.qh);
  const int8_t* scp = reinterpret_cast<const int8_t*>(b + 192 + 8 * n + t);
#pragma unroll
  for (int k = 0; k < 4; ++k) r.sc[k] = __ldg(scp + 2 * k);
  r.d = __half2float(__ushort_as_half(__ldg(reinterpret_cast<const unsigned short*>(b + 208))));
  return r;
}

// The 16 codes (0..63, one per byte) of quarter k of a Q6_K unit.
__device__ __forceinline__ void q6k_codes(const Q6Raw& r, int k, uint32_t v[4]) {
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const uint32_t low = (k & 1) ? r.l1[w] : r.l0[w];
    const uint32_t nib = (k < 2) ? (low & 0x0F0F0F0Fu) : ((low >> 4) & 0x0F0F0F0Fu);
    v[w] = nib | (((r.qh[w] >> (2 * k)) & 0x03030303u) << 4);
  }
}

__device__ __forceinline__ float q6k_compute(const Q6Raw& r, int u, const float* xs) {
  const int sb = u >> 2, n = (u >> 1) & 1, t = u & 1;
  const int x0 = sb * 256 + 128 * n + 16 * t;
  constexpr float kOff = kMagic + 32.0f;
  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint32_t v[4];
    q6k_codes(r, k, v);
    const float dot = dot16(v, xs + xpad(x0 + 32 * k), kOff);
    acc += (r.d * static_cast<float>(r.sc[k])) * dot;
  }
  return acc;
}

// Q8_0 unit u: block u (34 bytes: f16 scale, 32 int8 codes); rows are only 2-byte aligned.
struct Q8Raw {
  uint32_t v[8];
  float d;
};

__device__ __forceinline__ Q8Raw q80_load(const uint8_t* row, int u) {
  const unsigned short* hp = reinterpret_cast<const unsigned short*>(row + static_cast<size_t>(u) * 34);
  Q8Raw r;
  r.d = __half2float(__ushort_as_half(__ldg(hp)));
#pragma unroll
  for (int w = 0; w < 8; ++w) {
    const uint32_t lo = __ldg(hp + 1 + 2 * w), hi = __ldg(hp + 2 + 2 * w);
    r.v[w] = (lo | (hi << 16)) ^ 0x80808080u;  // int8 -> uint8 with offset 128
  }
  return r;
}

__device__ __forceinline__ float q80_compute(const Q8Raw& r, int u, const float* xs) {
  constexpr float kOff = kMagic + 128.0f;
  const float dot = dot16(r.v, xs + xpad(32 * u), kOff) + dot16(r.v + 4, xs + xpad(32 * u + 16), kOff);
  return r.d * dot;
}

// F32 unit: 4 floats (one float when rows are not 16-byte aligned: .x only).
__device__ __forceinline__ float4 f32_load(const uint8_t* row, int u, bool wide) {
  if (wide) return __ldg(reinterpret_cast<const float4*>(row) + u);
  return make_float4(__ldg(reinterpret_cast<const float*>(row) + u), 0.0f, 0.0f, 0.0f);
}

__device__ __forceinline__ float f32_compute(const float4& w, int u, const float* xs, bool wide) {
  if (!wide) return w.x * xs[xpad(u)];
  const float4 x = *reinterpret_cast<const float4*>(xs + xpad(4 * u));
  return fmaf(w.x, x.x, fmaf(w.y, x.y, fmaf(w.z, x.z, w.w * x.w)));
}

// F16/BF16 unit: 8 halves (one half when rows are not 16-byte aligned: the low 16 bits of .x only).
__device__ __forceinline__ uint4 h16_load(const uint8_t* row, int u, bool wide) {
  if (wide) return __ldg(reinterpret_cast<const uint4*>(row) + u);
  return make_uint4(__ldg(reinterpret_cast<const unsigned short*>(row) + u), 0u, 0u, 0u);
}

template <bool kBf16>
__device__ __forceinline__ float h16_value(uint32_t bits) {
  if constexpr (kBf16) return __uint_as_float(bits << 16);
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

template <bool kBf16>
__device__ __forceinline__ float h16_compute(const uint4& q, int u, const float* xs, bool wide) {
  if (!wide) return h16_value<kBf16>(q.x & 0xffffu) * xs[xpad(u)];
  const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
  const float* xp = xs + xpad(8 * u);
  const float4 xa = *reinterpret_cast<const float4*>(xp);
  const float4 xb = *reinterpret_cast<const float4*>(xp + 4);
  const float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
  float acc = 0.0f;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    float lo, hi;
    if constexpr (kBf16) {
      lo = __uint_as_float(qw[w] << 16);
      hi = __uint_as_float(qw[w] & 0xffff0000u);
    } else {
      lo = half_lo(qw[w]);
      hi = half_hi(qw[w]);
    }
    acc = fmaf(lo, xv[2 * w], acc);
    acc = fmaf(hi, xv[2 * w + 1], acc);
  }
  return acc;
}

// Units in a row of n_cols weights of type t (the float types use wide units only when every row
// starts 16-byte aligned).
__host__ __device__ inline int units_per_row(GgmlType t, int n_cols) {
  switch (t) {
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q8_0: return n_cols / 32;
    case GgmlType::Q6_K: return n_cols / 64;
    case GgmlType::F32: return n_cols % 4 == 0 ? n_cols / 4 : n_cols;
    case GgmlType::F16:
    case GgmlType::BF16: return n_cols % 8 == 0 ? n_cols / 8 : n_cols;
    default: return 0;
  }
}

// The block's staged input (shared memory), for both arithmetic paths:
// - float path: x at xs[xpad(i)], s16[c] = sum of x[16c .. 16c+15];
// - int8 path (K-quant weights, GemvMath::Int8): the CPU engine's activation quantisation
//   (quantize_activations_i8_scalar: per 32 values d32 = max|x| / 127, q = round-half-even(x * 127 /
//   max|x|)), q 16-byte aligned, isum16 = sum of q over 16 values and sum16 = d32 * isum16.
struct XStage {
  const float* xs;
  const float* s16;
  const int8_t* q;
  const float* d32;
  const float* sum16;
  const int* isum16;
};

// Four int8 dot products of code words (bytes 0..63, so signed and unsigned agree) with 16
// activations q (16-byte aligned shared memory).
__device__ __forceinline__ int dot16_i8(const uint32_t v[4], const int8_t* q) {
  const int4 a = *reinterpret_cast<const int4*>(q);
  int acc = __dp4a(static_cast<int>(v[0]), a.x, 0);
  acc = __dp4a(static_cast<int>(v[1]), a.y, acc);
  acc = __dp4a(static_cast<int>(v[2]), a.z, acc);
  return __dp4a(static_cast<int>(v[3]), a.w, acc);
}

// Q4_K / Q5_K unit on int8 activations: the codes (0..31) times q in integers, then per 16 weights
// d * scale * d32 * dot - dmin * min * sum16 (the CPU fused kernel's terms).
__device__ __forceinline__ float k45_dot_i8(const K45Unit& k, const XStage& X) {
  const int dot0 = dot16_i8(k.lo, X.q + k.x0);
  const int dot1 = dot16_i8(k.hi, X.q + k.x1);
  const float s0 = k.dl0 * X.d32[k.x0 >> 5], s1 = k.dl1 * X.d32[k.x1 >> 5];
  return (s0 * static_cast<float>(dot0) - k.ml0 * X.sum16[k.x0 >> 4]) +
         (s1 * static_cast<float>(dot1) - k.ml1 * X.sum16[k.x1 >> 4]);
}

// A Q6_K unit unpacked: each quarter's codes and d * scale, and where its activations start.
struct Q6Unit {
  uint32_t v[4][4];
  float ds[4];
  int x0;
};

__device__ __forceinline__ Q6Unit q6k_unpack(const Q6Raw& r, int u) {
  const int sb = u >> 2, n = (u >> 1) & 1, t = u & 1;
  Q6Unit k;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    q6k_codes(r, q, k.v[q]);
    k.ds[q] = r.d * static_cast<float>(r.sc[q]);
  }
  k.x0 = sb * 256 + 128 * n + 16 * t;
  return k;
}

// Q6_K unit on int8 activations: per run of 16, d * scale * d32 * (dot of the 0..63 codes - 32 * isum16),
// the offset folded in exact integers.
__device__ __forceinline__ float q6k_dot_i8(const Q6Unit& k, const XStage& X) {
  float acc = 0.0f;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int xk = k.x0 + 32 * q;
    const int dot = dot16_i8(k.v[q], X.q + xk) - 32 * X.isum16[xk >> 4];
    acc += (k.ds[q] * X.d32[xk >> 5]) * static_cast<float>(dot);
  }
  return acc;
}

// Whether weights of type t take the int8 path when it is on (the K-quants, as on the CPU).
__host__ __device__ constexpr bool int8_path_type(GgmlType t) {
  return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K;
}

// Load/compute of one unit of type T, behind one interface (unpack and dot_i8 for int8_path_type only: the
// int8 path's value of a unit is dot_i8(unpack(raw)), so token-shared dots unpack once for all tokens).
template <GgmlType T>
struct Unit;

template <>
struct Unit<GgmlType::Q4_K> {
  using Raw = K45Raw;
  __device__ static Raw load(const uint8_t* row, int u, int) { return k45_load<false>(row, u); }
  __device__ static float compute(const Raw& r, int u, const XStage& X, int) { return k45_compute<false>(r, u, X.xs, X.s16); }
  using Unpacked = K45Unit;
  __device__ static Unpacked unpack(const Raw& r, int u) { return k45_unpack<false>(r, u); }
  __device__ static float dot_i8(const Unpacked& k, const XStage& X) { return k45_dot_i8(k, X); }
};
template <>
struct Unit<GgmlType::Q5_K> {
  using Raw = K45Raw;
  __device__ static Raw load(const uint8_t* row, int u, int) { return k45_load<true>(row, u); }
  __device__ static float compute(const Raw& r, int u, const XStage& X, int) { return k45_compute<true>(r, u, X.xs, X.s16); }
  using Unpacked = K45Unit;
  __device__ static Unpacked unpack(const Raw& r, int u) { return k45_unpack<true>(r, u); }
  __device__ static float dot_i8(const Unpacked& k, const XStage& X) { return k45_dot_i8(k, X); }
};
template <>
struct Unit<GgmlType::Q6_K> {
  using Raw = Q6Raw;
  __device__ static Raw load(const uint8_t* row, int u, int) { return q6k_load(row, u); }
  __device__ static float compute(const Raw& r, int u, const XStage& X, int) { return q6k_compute(r, u, X.xs); }
  using Unpacked = Q6Unit;
  __device__ static Unpacked unpack(const Raw& r, int u) { return q6k_unpack(r, u); }
  __device__ static float dot_i8(const Unpacked& k, const XStage& X) { return q6k_dot_i8(k, X); }
};
template <>
struct Unit<GgmlType::Q8_0> {
  using Raw = Q8Raw;
  __device__ static Raw load(const uint8_t* row, int u, int) { return q80_load(row, u); }
  __device__ static float compute(const Raw& r, int u, const XStage& X, int) { return q80_compute(r, u, X.xs); }
};
template <>
struct Unit<GgmlType::F32> {
  using Raw = float4;
  __device__ static Raw load(const uint8_t* row, int u, int n_cols) { return f32_load(row, u, n_cols % 4 == 0); }
  __device__ static float compute(const Raw& r, int u, const XStage& X, int n_cols) {
    return f32_compute(r, u, X.xs, n_cols % 4 == 0);
  }
};
template <>
struct Unit<GgmlType::F16> {
  using Raw = uint4;
  __device__ static Raw load(const uint8_t* row, int u, int n_cols) { return h16_load(row, u, n_cols % 8 == 0); }
  __device__ static float compute(const Raw& r, int u, const XStage& X, int n_cols) {
    return h16_compute<false>(r, u, X.xs, n_cols % 8 == 0);
  }
};
template <>
struct Unit<GgmlType::BF16> {
  using Raw = uint4;
  __device__ static Raw load(const uint8_t* row, int u, int n_cols) { return h16_load(row, u, n_cols % 8 == 0); }
  __device__ static float compute(const Raw& r, int u, const XStage& X, int n_cols) {
    return h16_compute<true>(r, u, X.xs, n_cols % 8 == 0);
  }
};

template <GgmlType T, bool I8>
__device__ __forceinline__ float unit_value(const typename Unit<T>::Raw& r, int u, const XStage& X, int n_cols) {
  if constexpr (I8) {
    return Unit<T>::dot_i8(Unit<T>::unpack(r, u), X);
  } else {
    return Unit<T>::compute(r, u, X, n_cols);
  }
}

// Calls f(raw, u) for a lane's units u = sub, sub + G, ... of a row, K loads issued per loop step before
// the first use (past the row's U units a step loads unit u again and skips it: unconditional loads keep
// the raw units in registers). The loop itself is not unrolled (below).
template <GgmlType T, int K, class F>
__device__ __forceinline__ void for_each_unit(const uint8_t* row, int n_cols, int sub, int G, F&& f) {
  const int U = units_per_row(T, n_cols);
#pragma unroll 1
  for (int u = sub; u < U; u += K * G) {
    typename Unit<T>::Raw r[K];
#pragma unroll
    for (int i = 0; i < K; ++i) {
      const int ui = u + i * G;
      r[i] = Unit<T>::load(row, ui < U ? ui : u, n_cols);
    }
#pragma unroll
    for (int i = 0; i < K; ++i) {
      const int ui = u + i * G;
      if (ui < U) f(r[i], ui);
    }
  }
}

// A lane's share (units sub, sub + G, ...) of dot(row, x): K units per loop step (all K loads issued
// before the first use), the loop itself not unrolled. Measured on the H100 (docs/PERF.md): fully
// unrolled forms, inlined for every type and mode, made the matvec kernel 1.1 MB of machine code, and
// its launches spent half to three quarters of their cycles waiting for instruction fetch (each launch
// runs a path once per SM, so nothing stays in the instruction cache). A rolled loop body of a few
// hundred instructions runs from the cache after its first step; memory-level parallelism comes from
// more resident warps instead (fewer registers per thread).
template <GgmlType T, int K, bool I8>
__device__ __forceinline__ float row_dot_rolled_t(const uint8_t* row, int n_cols, const XStage& X, int sub, int G) {
  float acc = 0.0f;
  for_each_unit<T, K>(row, n_cols, sub, G,
                      [&](const typename Unit<T>::Raw& r, int u) { acc += unit_value<T, I8>(r, u, X, n_cols); });
  return acc;
}

// Gate and up rows of the same type in one rolled pass: K units of each row per step.
template <GgmlType T, int K, bool I8>
__device__ __forceinline__ void row_dot2_rolled_t(const uint8_t* ra, const uint8_t* rb, int n_cols, const XStage& X,
                                                  int sub, int G, float& oa, float& ob) {
  using Op = Unit<T>;
  const int U = units_per_row(T, n_cols);
  float a = 0.0f, b = 0.0f;
#pragma unroll 1
  for (int u = sub; u < U; u += K * G) {
    typename Op::Raw x[K], y[K];
#pragma unroll
    for (int i = 0; i < K; ++i) {
      const int ui = u + i * G;
      const int uc = ui < U ? ui : u;  // unconditional loads keep x[] and y[] in registers
      x[i] = Op::load(ra, uc, n_cols);
      y[i] = Op::load(rb, uc, n_cols);
    }
#pragma unroll
    for (int i = 0; i < K; ++i) {
      const int ui = u + i * G;
      if (ui < U) {
        a += unit_value<T, I8>(x[i], ui, X, n_cols);
        b += unit_value<T, I8>(y[i], ui, X, n_cols);
      }
    }
  }
  oa = a;
  ob = b;
}

// Units of each row per step of a gate/up pair: 1 (two rows, the same loads in flight as kStep; 2 was
// measured slower on the H100, docs/PERF.md).
constexpr int kPairStep = 1;

// Units of a single row per loop step. Measured on the H100 (docs/PERF.md): 4 per step (and the L2
// prefetch of each block's next tile) decode slower than 2; more loads in flight per thread cost
// registers, and resident warps matter more.
constexpr int kStep = 2;

template <GgmlType T>
struct TypeTag {
  static constexpr GgmlType value = T;
};
template <bool B>
struct MathTag {
  static constexpr bool int8 = B;
};

// The one run-time type switch of the row dots: calls f(TypeTag<T>{}, MathTag<I8>{}) for weight type t,
// with the int8 form only for the K-quants (i8: the block staged the int8 input and t is an
// int8_path_type). Returns false for a type the kernels do not take (the host checks types first).
template <class F>
__device__ __forceinline__ bool with_row_type(GgmlType t, bool i8, F&& f) {
  switch (t) {
    case GgmlType::Q4_K:
      i8 ? f(TypeTag<GgmlType::Q4_K>{}, MathTag<true>{}) : f(TypeTag<GgmlType::Q4_K>{}, MathTag<false>{});
      return true;
    case GgmlType::Q5_K:
      i8 ? f(TypeTag<GgmlType::Q5_K>{}, MathTag<true>{}) : f(TypeTag<GgmlType::Q5_K>{}, MathTag<false>{});
      return true;
    case GgmlType::Q6_K:
      i8 ? f(TypeTag<GgmlType::Q6_K>{}, MathTag<true>{}) : f(TypeTag<GgmlType::Q6_K>{}, MathTag<false>{});
      return true;
    case GgmlType::Q8_0: f(TypeTag<GgmlType::Q8_0>{}, MathTag<false>{}); return true;
    case GgmlType::F32: f(TypeTag<GgmlType::F32>{}, MathTag<false>{}); return true;
    case GgmlType::F16: f(TypeTag<GgmlType::F16>{}, MathTag<false>{}); return true;
    case GgmlType::BF16: f(TypeTag<GgmlType::BF16>{}, MathTag<false>{}); return true;
    default: return false;
  }
}

// The token-shared forms of the row dots (gemv_batch's token-shared launch): the int8 path of one
// K-quant row against nt <= NT staged inputs (token t's int8 form at tok0 + t * tok_stride floats, in
// token_view's layout), each unit's weights loaded once for all of them. Token t's sum takes the
// same units in the same order as row_dot_rolled_t's, so it is that function's result bit for bit.
__host__ __device__ constexpr int token_floats(int n) { return (n / 4 + n / 32 + n / 16 + n / 16 + 3) & ~3; }
__device__ __forceinline__ XStage token_view(const float* base, int n) {
  return XStage{nullptr, nullptr, reinterpret_cast<const int8_t*>(base), base + n / 4, base + n / 4 + n / 32,
                reinterpret_cast<const int*>(base + n / 4 + n / 32 + n / 16)};
}

template <GgmlType T, int NT>
__device__ __forceinline__ void row_dot_tokens_t(const uint8_t* row, int n_cols, const float* tok0, int tok_stride,
                                                 int nt, int sub, int G, float (&acc)[NT]) {
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
  for_each_unit<T, 2>(row, n_cols, sub, G, [&](const typename Unit<T>::Raw& r, int u) {
    // Unpacked once for all the tokens: each token's sum is unit_value's.
    const typename Unit<T>::Unpacked k = Unit<T>::unpack(r, u);
#pragma unroll
    for (int t = 0; t < NT; ++t)
      if (t < nt) acc[t] += Unit<T>::dot_i8(k, token_view(tok0 + t * tok_stride, n_cols));
  });
}

// Gate and up rows of the same type (row_dot2_rolled_t's order), for nt tokens.
template <GgmlType T, int NT>
__device__ __forceinline__ void row_dot2_tokens_t(const uint8_t* ra, const uint8_t* rb, int n_cols, const float* tok0,
                                                  int tok_stride, int nt, int sub, int G, float (&a)[NT],
                                                  float (&b)[NT]) {
  using Op = Unit<T>;
  const int U = units_per_row(T, n_cols);
#pragma unroll
  for (int t = 0; t < NT; ++t) a[t] = b[t] = 0.0f;
#pragma unroll 1
  for (int u = sub; u < U; u += G) {
    const typename Op::Unpacked x = Op::unpack(Op::load(ra, u, n_cols), u);
    const typename Op::Unpacked y = Op::unpack(Op::load(rb, u, n_cols), u);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t < nt) {
        const XStage X = token_view(tok0 + t * tok_stride, n_cols);
        a[t] += Op::dot_i8(x, X);
        b[t] += Op::dot_i8(y, X);
      }
    }
  }
}

// The type switch of the token-shared dots (the int8-path types only; false for any other).
template <class F>
__device__ __forceinline__ bool with_int8_type(GgmlType t, F&& f) {
  switch (t) {
    case GgmlType::Q4_K: f(TypeTag<GgmlType::Q4_K>{}); return true;
    case GgmlType::Q5_K: f(TypeTag<GgmlType::Q5_K>{}); return true;
    case GgmlType::Q6_K: f(TypeTag<GgmlType::Q6_K>{}); return true;
    default: return false;
  }
}

__device__ __forceinline__ float row_dot_rolled(GgmlType t, bool i8, const uint8_t* row, int n_cols, const XStage& X,
                                                int sub, int G) {
  float acc = __int_as_float(0x7fc00000);  // NaN for a type the kernels do not take
  with_row_type(t, i8, [&](auto type, auto math) {
    acc = row_dot_rolled_t<decltype(type)::value, kStep, decltype(math)::int8>(row, n_cols, X, sub, G);
  });
  return acc;
}

__device__ __forceinline__ void row_dot2_rolled(GgmlType t, bool i8, const uint8_t* ra, const uint8_t* rb, int n_cols,
                                                const XStage& X, int sub, int G, float& oa, float& ob) {
  oa = ob = __int_as_float(0x7fc00000);
  with_row_type(t, i8, [&](auto type, auto math) {
    row_dot2_rolled_t<decltype(type)::value, kPairStep, decltype(math)::int8>(ra, rb, n_cols, X, sub, G, oa, ob);
  });
}

}  // namespace strata::cuda::rows
