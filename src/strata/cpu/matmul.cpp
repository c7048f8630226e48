// First, plain implementation: dequantise each row once, dot it with every token in float.
// The fast kernels replace the inner loop; this remains the reference they are tested against.
#include "strata/cpu/matmul.h"

#include <omp.h>

#include <vector>

#include "strata/base/error.h"
#include "strata/quant/quantize.h"

namespace strata {

void matmul(const WeightMatrix& w, const float* X, int64_t n_tok, float* Y) {
  if (w.row_stride < row_bytes(w.type, w.n_cols)) fail("matmul: row stride smaller than a row");
  const bool nested = omp_in_parallel();
#pragma omp parallel if (!nested)
  {
    std::vector<float> row(static_cast<size_t>(w.n_cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < w.n_rows; ++r) {
      dequantize_row(w.type, w.data + static_cast<size_t>(r) * w.row_stride, row.data(), w.n_cols);
      for (int64_t t = 0; t < n_tok; ++t) {
        const float* x = X + t * w.n_cols;
        float acc = 0.0f;
        for (int64_t c = 0; c < w.n_cols; ++c) acc += row[c] * x[c];
        Y[t * w.n_rows + r] = acc;
      }
    }
  }
}

void matvec(const WeightMatrix& w, const float* x, float* y) { matmul(w, x, 1, y); }

}  // namespace strata
