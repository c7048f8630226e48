// Device-side decoding of the weight block formats, 32 weights (one "chunk") at a time.
// Layouts: src/strata/quant/blocks.h (byte offsets restated here for device code, which cannot use the
// host structs' memcpy loaders). Rows start at a multiple of the block size in a cudaMalloc'd buffer and
// every block size used here is even, so 16-bit loads are aligned.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "strata/quant/types.h"

namespace strata::cuda {

__device__ __forceinline__ float f16_at(const uint8_t* p) {
  return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(p)));
}

__device__ __forceinline__ float bf16_bits_to_float(unsigned short b) {
  return __uint_as_float(static_cast<unsigned int>(b) << 16);
}

// 6-bit scale and min of sub-block j of a Q4_K/Q5_K 12-byte scales array (same packing as
// blocks::k4_scale_min): j < 4 low 6 bits of bytes j / j+4; else nibbles of byte j+4 plus the top two
// bits of bytes j-4 / j.
__device__ __forceinline__ void k4_scale_min_dev(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Quantised types: decodes the 32 weights of chunk c of a row into out[32] (weights 32c .. 32c+31),
// with the same float expressions as quant/dequantize.cpp.
template <GgmlType T>
__device__ __forceinline__ void decode_chunk(const uint8_t* row, int64_t c, float* out);

template <>
__device__ __forceinline__ void decode_chunk<GgmlType::Q8_0>(const uint8_t* row, int64_t c, float* out) {
  const uint8_t* b = row + c * 34;
  const float d = f16_at(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
#pragma unroll
  for (int l = 0; l < 32; ++l) out[l] = d * static_cast<float>(qs[l]);
}

template <>
__device__ __forceinline__ void decode_chunk<GgmlType::Q4_K>(const uint8_t* row, int64_t c, float* out) {
  const uint8_t* b = row + (c >> 3) * 144;
  const int sb = static_cast<int>(c & 7);
  const float d = f16_at(b), dmin = f16_at(b + 2);
  int sc, m;
  k4_scale_min_dev(b + 4, sb, sc, m);
  const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
  const uint8_t* q = b + 16 + 32 * (sb / 2);
  const int shift = 4 * (sb % 2);
#pragma unroll
  for (int l = 0; l < 32; ++l) out[l] = dl * static_cast<float>((q[l] >> shift) & 15) - ml;
}

template <>
__device__ __forceinline__ void decode_chunk<GgmlType::Q5_K>(const uint8_t* row, int64_t c, float* out) {
  const uint8_t* b = row + (c >> 3) * 176;
  const int sb = static_cast<int>(c & 7);
  const float d = f16_at(b), dmin = f16_at(b + 2);
  int sc, m;
  k4_scale_min_dev(b + 4, sb, sc, m);
  const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
  const uint8_t* qh = b + 16;
  const uint8_t* q = b + 48 + 32 * (sb / 2);
  const int shift = 4 * (sb % 2);
#pragma unroll
  for (int l = 0; l < 32; ++l) {
    const int v = ((q[l] >> shift) & 15) | (((qh[l] >> sb) & 1) << 4);
    out[l] = dl * static_cast<float>(v) - ml;
  }
}

// Q6_K: chunk k8 of a block is quarter k = k8 % 4 of half n = k8 / 4 (see dequant_q6_k).
template <>
__device__ __forceinline__ void decode_chunk<GgmlType::Q6_K>(const uint8_t* row, int64_t c, float* out) {
  const uint8_t* b = row + (c >> 3) * 210;
  const int k8 = static_cast<int>(c & 7);
  const int n = k8 >> 2, k = k8 & 3;
  const uint8_t* ql = b + 64 * n + 32 * (k & 1);
  const uint8_t* qh = b + 128 + 32 * n;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192) + 8 * n + 2 * k;
  const float d = f16_at(b + 208);
#pragma unroll
  for (int l = 0; l < 32; ++l) {
    const int low = (k < 2) ? (ql[l] & 15) : (ql[l] >> 4);
    const int high = (qh[l] >> (2 * k)) & 3;
    const int sc = scales[l / 16];
    out[l] = d * static_cast<float>(sc * ((low | (high << 4)) - 32));
  }
}

// Element i of a row of a float type.
template <GgmlType T>
__device__ __forceinline__ float float_elem(const uint8_t* row, int64_t i);

template <>
__device__ __forceinline__ float float_elem<GgmlType::F32>(const uint8_t* row, int64_t i) {
  return reinterpret_cast<const float*>(row)[i];
}
template <>
__device__ __forceinline__ float float_elem<GgmlType::F16>(const uint8_t* row, int64_t i) {
  return __half2float(__ushort_as_half(reinterpret_cast<const unsigned short*>(row)[i]));
}
template <>
__device__ __forceinline__ float float_elem<GgmlType::BF16>(const uint8_t* row, int64_t i) {
  return bf16_bits_to_float(reinterpret_cast<const unsigned short*>(row)[i]);
}

template <GgmlType T>
__host__ __device__ constexpr bool is_float_type() {
  return T == GgmlType::F32 || T == GgmlType::F16 || T == GgmlType::BF16;
}

}  // namespace strata::cuda
