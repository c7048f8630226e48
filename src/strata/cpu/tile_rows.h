// One tile of weight rows [r, r + nr) prepared for the CPU kernels' row dots (cpu_kernels.h), as the
// dense products (matmul.cpp) and the cold experts (cold_experts.cpp) both read them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "strata/cpu/cpu_kernels.h"
#include "strata/cpu/matmul.h"

namespace strata {

// Rows read in place (the fused int8 path, dot_rows_direct): pointers to the quantised rows themselves.
inline void raw_tile_rows(const WeightMatrix& w, int64_t r, int nr, const uint8_t** rows) {
  for (int i = 0; i < nr; ++i) rows[i] = w.data + static_cast<size_t>(r + i) * w.row_stride;
}

// Float path: F32 rows used in place when aligned, other rows decoded into buf (nr x n_cols floats).
inline void float_tile_rows(const CpuKernels& k, const WeightMatrix& w, int64_t r, int nr, float* buf,
                            const float** rows) {
  const int64_t n = w.n_cols;
  for (int i = 0; i < nr; ++i) {
    const uint8_t* src = w.data + static_cast<size_t>(r + i) * w.row_stride;
    if (w.type == GgmlType::F32 && reinterpret_cast<uintptr_t>(src) % alignof(float) == 0) {
      rows[i] = reinterpret_cast<const float*>(src);
    } else {
      float* dst = buf + static_cast<size_t>(i) * static_cast<size_t>(n);
      k.decode_row(w.type, src, dst, n);
      rows[i] = dst;
    }
  }
}

// Int8 path: row i unpacked into codes (n_cols bytes), scales8 (n_cols / 4) and bias16 (n_cols / 16)
// at offset i of each buffer.
inline void i8_tile_rows(const CpuKernels& k, const WeightMatrix& w, int64_t r, int nr, uint8_t* codes, float* scales8,
                         float* bias16, I8Row* rows) {
  const int64_t n = w.n_cols;
  const size_t un = static_cast<size_t>(n);
  for (int i = 0; i < nr; ++i) {
    const size_t ui = static_cast<size_t>(i);
    rows[i] = {codes + ui * un, scales8 + ui * un / 4, bias16 + ui * un / 16};
    k.unpack_i8(w.type, w.data + static_cast<size_t>(r + i) * w.row_stride, n, codes + ui * un, scales8 + ui * un / 4,
                bias16 + ui * un / 16);
  }
}

}  // namespace strata
