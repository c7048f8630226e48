// Activation quantisation for the int8 dot path: per 32 values, scale d = max|x| / 127 and
// q = round-to-nearest-even(x * (127 / max|x|)), so |x - d*q| <= d/2 (the error bound
// tests/test_matmul.cpp checks). The SIMD levels compute the same numbers (kernels_x86_impl.h).
#include <cmath>

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

}  // namespace strata
