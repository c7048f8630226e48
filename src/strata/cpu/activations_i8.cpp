// Activation quantisation for the int8 dot path: per 32 values, scale d = max|x| / 127 and
// q = round-to-nearest-even(x * (127 / max|x|)), so |x - d*q| <= d/2 (the error bound
// tests/test_matmul.cpp checks). The SIMD levels compute the same numbers (kernels_x86_impl.h).
#include <cmath>
#include <cstring>

#include "strata/cpu/cpu_kernels.h"

namespace strata {

void quantize_activations_i8_scalar(const float* x, int64_t n, int8_t* q, float* d32, float* sum16) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + 32 * b;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int sums[2] = {0, 0};
    for (int i = 0; i < 32; ++i) {
      long v = std::lrint(xb[i] * inv);
      v = v > 127 ? 127 : (v < -127 ? -127 : v);
      q[32 * b + i] = static_cast<int8_t>(v);
      sums[i / 16] += static_cast<int>(v);
    }
    d32[b] = d;
    sum16[2 * b] = d * static_cast<float>(sums[0]);
    sum16[2 * b + 1] = d * static_cast<float>(sums[1]);
  }
}

void quantize_activations_i8(const float* x, int64_t n, int8_t* q, float* d32, float* sum16) {
  const CpuKernels& k = cpu_kernels();
  if (k.quantize_i8 != nullptr && cpu_fused_path()) {
    k.quantize_i8(x, n, q, d32, sum16);
  } else {
    quantize_activations_i8_scalar(x, n, q, d32, sum16);
  }
}

bool tile_fused_type(GgmlType type) {
  return type == GgmlType::Q4_K || type == GgmlType::Q5_K || type == GgmlType::Q6_K;
}

// Per super-block of 256 values, eight vectors of 32 bytes (eight 4-byte groups). Q4_K/Q5_K: vector
// k, lane j = group k of block j (all of a block's groups meet in one lane). Q6_K scales halves of
// blocks (16 values), so its lanes follow the per-token kernel's order of halves: vector 4h + u, lane
// l = group u + 4 (l / 4) of block 4h + l % 4 (lanes 0-3 first halves, 4-7 second halves).
void interleave_act_i8(GgmlType type, const int8_t* q, const float* sum16, int64_t j0, int64_t j1, int8_t* q_out,
                       float* bsum32) {
  if (!tile_fused_type(type)) fail_kernel_type("batched int8 path: no activation layout", type);
  const bool six = type == GgmlType::Q6_K;
  for (int64_t j = j0; j < j1; ++j) {
    const int64_t base = j / 8 * 256;
    const int jb = static_cast<int>(j % 8);
    for (int g = 0; g < 8; ++g) {
      const int64_t to = six ? base + 32 * (4 * (jb / 4) + g % 4) + 4 * (jb % 4 + 4 * (g / 4)) : base + 32 * g + 4 * jb;
      std::memcpy(q_out + to, q + base + 32 * jb + 4 * g, 4);
    }
    bsum32[j] = sum16[2 * j] + sum16[2 * j + 1];
  }
}

}  // namespace strata
