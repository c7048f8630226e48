// Weight chunks (32 consecutive weights of a row) for the fast grouped expert GEMM, split into a load
// step and a decode step so a kernel can issue the next tile's loads before computing on the current
// one. Q4_K and Q5_K blocks (144 / 176 bytes, rows of whole blocks in a cudaMalloc'd buffer) start on
// 16-byte boundaries, so their header and quant bytes are fetched as 16-byte vectors (3 or 5 loads per
// chunk instead of ~45 single-byte ones); the other types keep decode_chunk / float_elem of
// quant_decode.cuh, loading at decode time. Same float expressions as quant_decode.cuh.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "strata/cuda/quant_decode.cuh"

namespace strata::cuda::prefill {

// Byte j (0..11) of the 12-byte K-quant scales held in words y, z, w of a block header.
__device__ __forceinline__ int k_scale_byte(const uint4& hdr, int j) {
  const unsigned w = j < 4 ? hdr.y : (j < 8 ? hdr.z : hdr.w);
  return static_cast<int>((w >> (8 * (j & 3))) & 0xffu);
}

// Scale and min of sub-block sb, as k4_scale_min_dev.
__device__ __forceinline__ void k_scale_min_vec(const uint4& hdr, int sb, int& sc, int& m) {
  if (sb < 4) {
    sc = k_scale_byte(hdr, sb) & 63;
    m = k_scale_byte(hdr, sb + 4) & 63;
  } else {
    sc = (k_scale_byte(hdr, sb + 4) & 15) | ((k_scale_byte(hdr, sb - 4) >> 6) << 4);
    m = (k_scale_byte(hdr, sb + 4) >> 4) | ((k_scale_byte(hdr, sb) >> 6) << 4);
  }
}

__device__ __forceinline__ float half_bits(unsigned bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xffffu)));
}

// Generic: remembers where the chunk is; decode reads it (zeros when invalid).
template <GgmlType T>
struct RawChunk {
  const uint8_t* row = nullptr;
  int64_t c = 0;
  bool valid = false;
  __device__ __forceinline__ void load(const uint8_t* r, int64_t chunk, bool ok) {
    row = r;
    c = chunk;
    valid = ok;
  }
  __device__ __forceinline__ void decode(float* out) const {
    if (!valid) {
#pragma unroll
      for (int l = 0; l < 32; ++l) out[l] = 0.0f;
      return;
    }
    if constexpr (is_float_type<T>()) {
#pragma unroll
      for (int l = 0; l < 32; ++l) out[l] = float_elem<T>(row, c * 32 + l);
    } else {
      decode_chunk<T>(row, c, out);
    }
  }
};

template <>
struct RawChunk<GgmlType::Q4_K> {
  uint4 hdr, q0, q1;
  int sb = 0;
  bool valid = false;
  __device__ __forceinline__ void load(const uint8_t* r, int64_t chunk, bool ok) {
    valid = ok;
    if (!ok) return;
    const uint8_t* b = r + (chunk >> 3) * 144;
    sb = static_cast<int>(chunk & 7);
    hdr = *reinterpret_cast<const uint4*>(b);
    const uint4* q = reinterpret_cast<const uint4*>(b + 16 + 32 * (sb >> 1));
    q0 = q[0];
    q1 = q[1];
  }
  __device__ __forceinline__ void decode(float* out) const {
    if (!valid) {
#pragma unroll
      for (int l = 0; l < 32; ++l) out[l] = 0.0f;
      return;
    }
    const float d = half_bits(hdr.x), dmin = half_bits(hdr.x >> 16);
    int sc, m;
    k_scale_min_vec(hdr, sb, sc, m);
    const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
    const int shift = 4 * (sb & 1);
    const unsigned qw[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
    for (int l = 0; l < 32; ++l)
      out[l] = dl * static_cast<float>((qw[l >> 2] >> (8 * (l & 3) + shift)) & 15u) - ml;
  }
};

template <>
struct RawChunk<GgmlType::Q5_K> {
  uint4 hdr, h0, h1, q0, q1;
  int sb = 0;
  bool valid = false;
  __device__ __forceinline__ void load(const uint8_t* r, int64_t chunk, bool ok) {
    valid = ok;
    if (!ok) return;
    const uint8_t* b = r + (chunk >> 3) * 176;
    sb = static_cast<int>(chunk & 7);
    hdr = *reinterpret_cast<const uint4*>(b);
    const uint4* qh = reinterpret_cast<const uint4*>(b + 16);
    h0 = qh[0];
    h1 = qh[1];
    const uint4* q = reinterpret_cast<const uint4*>(b + 48 + 32 * (sb >> 1));
    q0 = q[0];
    q1 = q[1];
  }
  __device__ __forceinline__ void decode(float* out) const {
    if (!valid) {
#pragma unroll
      for (int l = 0; l < 32; ++l) out[l] = 0.0f;
      return;
    }
    const float d = half_bits(hdr.x), dmin = half_bits(hdr.x >> 16);
    int sc, m;
    k_scale_min_vec(hdr, sb, sc, m);
    const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
    const int shift = 4 * (sb & 1);
    const unsigned qw[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    const unsigned hw[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const unsigned lo = (qw[l >> 2] >> (8 * (l & 3) + shift)) & 15u;
      const unsigned hi = (hw[l >> 2] >> (8 * (l & 3) + sb)) & 1u;
      out[l] = dl * static_cast<float>(lo | (hi << 4)) - ml;
    }
  }
};

}  // namespace strata::cuda::prefill
