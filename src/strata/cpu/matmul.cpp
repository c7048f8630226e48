// matmul/matvec: rows are processed in tiles of kMaxDotRows. Each tile's weights are decoded to
// float once per chunk of tokens (F32 rows are used in place when aligned) and then dotted with
// every token of the chunk, so a decoded block is reused across tokens during prefill. Token
// chunks keep the activations a thread re-reads small enough to stay in cache.
#include "strata/cpu/matmul.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "strata/base/error.h"
#include "strata/cpu/cpu_kernels.h"

namespace strata {
namespace {

constexpr int64_t kTokenChunk = 64;

void check_matrix(const WeightMatrix& w) {
  if (w.n_rows < 0 || w.n_cols < 0) fail("matmul: negative shape ", w.n_rows, " x ", w.n_cols);
  const size_t rb = row_bytes(w.type, w.n_cols);  // also rejects partial blocks
  if (w.n_rows > 1 && w.row_stride < rb)
    fail("matmul: row stride ", w.row_stride, " smaller than a row of ", w.n_cols, " ", type_traits(w.type).name,
         " (", rb, " bytes)");
  if (w.n_rows > 0 && w.n_cols > 0 && w.data == nullptr) fail("matmul: weight data is null");
}

}  // namespace

void matmul(const WeightMatrix& w, const float* X, int64_t n_tok, float* Y) {
  check_matrix(w);
  if (n_tok <= 0 || w.n_rows == 0) return;
  const int64_t n = w.n_cols;
  const CpuKernels& k = cpu_kernels();
  const int64_t n_tiles = (w.n_rows + kMaxDotRows - 1) / kMaxDotRows;
  const bool nested = omp_in_parallel();
#pragma omp parallel if (!nested)
  {
    std::vector<float> buf(static_cast<size_t>(kMaxDotRows) * static_cast<size_t>(n));
    for (int64_t t0 = 0; t0 < n_tok; t0 += kTokenChunk) {
      const int64_t t1 = std::min(n_tok, t0 + kTokenChunk);
#pragma omp for schedule(static)
      for (int64_t tile = 0; tile < n_tiles; ++tile) {
        const int64_t r0 = tile * kMaxDotRows;
        const int nr = static_cast<int>(std::min<int64_t>(kMaxDotRows, w.n_rows - r0));
        const float* rows[kMaxDotRows];
        for (int i = 0; i < nr; ++i) {
          const uint8_t* src = w.data + static_cast<size_t>(r0 + i) * w.row_stride;
          if (w.type == GgmlType::F32 && reinterpret_cast<uintptr_t>(src) % alignof(float) == 0) {
            rows[i] = reinterpret_cast<const float*>(src);
          } else {
            float* dst = buf.data() + static_cast<size_t>(i) * static_cast<size_t>(n);
            k.decode_row(w.type, src, dst, n);
            rows[i] = dst;
          }
        }
        float out[kMaxDotRows];
        for (int64_t t = t0; t < t1; ++t) {
          k.dot_rows(rows, nr, X + t * n, n, out);
          for (int i = 0; i < nr; ++i) Y[t * w.n_rows + r0 + i] = out[i];
        }
      }
    }
  }
}

void matvec(const WeightMatrix& w, const float* x, float* y) { matmul(w, x, 1, y); }

}  // namespace strata
