// Scalar level: the reference decoders of strata/quant and a plain float dot. Portable; also the
// baseline the SIMD levels are tested against.
#include "strata/cpu/cpu_kernels.h"
#include "strata/quant/quantize.h"

namespace strata {
namespace {

void decode_row_scalar(GgmlType type, const uint8_t* src, float* dst, int64_t n) {
  dequantize_row(type, src, dst, n);
}

void dot_rows_scalar(const float* const* rows, int nr, const float* x, int64_t n, float* out) {
  for (int r = 0; r < nr; ++r) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) acc += rows[r][i] * x[i];
    out[r] = acc;
  }
}

constexpr CpuKernels kScalar = {CpuKernelLevel::Scalar, decode_row_scalar, dot_rows_scalar, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};

}  // namespace

const CpuKernels& cpu_kernels_scalar() { return kScalar; }

}  // namespace strata
