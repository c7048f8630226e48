// matmul/matvec: rows are processed in tiles of kMaxDotRows. Each tile's weights are decoded (to
// float, or to int8 codes on the int8 path; see cpu_kernels.h) once per chunk of tokens and then
// dotted with every token of the chunk, so unpacked weights are reused across tokens during
// prefill. K-quants take the fused int8 path instead: dots straight on the quantised blocks, one
// token at a time for few tokens, in row x token tiles (dot_tile_fused, the same results) for more;
// Q8_0 decode skips the decode buffer (dot_rows_direct, same results). F32
// rows are used in place when aligned. Token chunks keep the activations a thread re-reads small
// enough to stay in cache.
#include "strata/cpu/matmul.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "strata/base/error.h"
#include "strata/cpu/cpu_kernels.h"
#include "strata/cpu/tile_rows.h"

namespace strata {
namespace {

constexpr int64_t kTokenChunk = 64;
// From this many tokens on, fused formats take the batched kernel (bitwise the per-token results):
// unpacking a tile's rows once costs about what a couple of per-token dots do.
constexpr int64_t kTileMinTokens = 3;

void check_matrix(const WeightMatrix& w) {
  if (w.n_rows < 0 || w.n_cols < 0) fail("matmul: negative shape ", w.n_rows, " x ", w.n_cols);
  const size_t rb = row_bytes(w.type, w.n_cols);  // also rejects partial blocks
  if (w.n_rows > 1 && w.row_stride < rb)
    fail("matmul: row stride ", w.row_stride, " smaller than a row of ", w.n_cols, " ", type_traits(w.type).name,
         " (", rb, " bytes)");
  if (w.n_rows > 0 && w.n_cols > 0 && w.data == nullptr) fail("matmul: weight data is null");
}

// How a matrix's rows meet the activations: the one choice of kernel path, made by matmul and by
// matvec_rows alike so that a matvec is bitwise the matmul of its one token. int8_ok: the activations
// may take the int8 path (a PreparedVec holds its int8 form).
enum class RowPath { I8Fused, I8Unpacked, DirectFloat, FloatRows };
struct RowChoice {
  RowPath path;
  I8Format fmt;  // the int8 paths' format
};
RowChoice row_path(const CpuKernels& k, GgmlType type, int64_t n_cols, bool int8_ok) {
  if (int8_ok && k.i8_format != nullptr && n_cols % 32 == 0) {
    const I8Format fmt = k.i8_format(type);
    if (fmt.supported) return {fmt.fused ? RowPath::I8Fused : RowPath::I8Unpacked, fmt};
  }
  if (k.direct_float != nullptr && k.direct_float(type) && cpu_fused_path()) return {RowPath::DirectFloat, I8Format{}};
  return {RowPath::FloatRows, I8Format{}};
}

// Row tiles of w against every token, unpacking each tile once per chunk of tokens (prefill).
void matmul_i8_unpacked(const CpuKernels& k, I8Format fmt, const WeightMatrix& w, const int8_t* xq,
                        const float* xd, const float* xs, int64_t n_tok, float* Y) {
  const int64_t n = w.n_cols;
  const size_t un = static_cast<size_t>(n);
  const int64_t n_tiles = (w.n_rows + kMaxDotRows - 1) / kMaxDotRows;
  std::vector<uint8_t> codes(kMaxDotRows * un);
  std::vector<float> scales8(kMaxDotRows * un / 4), bias16(kMaxDotRows * un / 16 + 1);
  for (int64_t t0 = 0; t0 < n_tok; t0 += kTokenChunk) {
    const int64_t t1 = std::min(n_tok, t0 + kTokenChunk);
#pragma omp for schedule(static)
    for (int64_t tile = 0; tile < n_tiles; ++tile) {
      const int64_t r0 = tile * kMaxDotRows;
      const int nr = static_cast<int>(std::min<int64_t>(kMaxDotRows, w.n_rows - r0));
      I8Row rows[kMaxDotRows];
      i8_tile_rows(k, w, r0, nr, codes.data(), scales8.data(), bias16.data(), rows);
      float out[kMaxDotRows];
      for (int64_t t = t0; t < t1; ++t) {
        const I8Act act{xq + t * n, xd + t * n / 32, xs + t * n / 16};
        k.dot_rows_i8(rows, nr, act, n, fmt, out);
        for (int i = 0; i < nr; ++i) Y[t * w.n_rows + r0 + i] = out[i];
      }
    }
  }
}

// Fused formats: dots straight on the quantised rows (no unpacked copy). A tile of rows stays in L1
// while a chunk of tokens streams past it.
void matmul_i8_fused(const CpuKernels& k, const WeightMatrix& w, const int8_t* xq, const float* xd,
                     const float* xs, int64_t n_tok, float* Y) {
  const int64_t n = w.n_cols;
  const int64_t n_tiles = (w.n_rows + kMaxDotRows - 1) / kMaxDotRows;
  for (int64_t t0 = 0; t0 < n_tok; t0 += kTokenChunk) {
    const int64_t t1 = std::min(n_tok, t0 + kTokenChunk);
#pragma omp for schedule(static)
    for (int64_t tile = 0; tile < n_tiles; ++tile) {
      const int64_t r0 = tile * kMaxDotRows;
      const int nr = static_cast<int>(std::min<int64_t>(kMaxDotRows, w.n_rows - r0));
      const uint8_t* rows[kMaxDotRows];
      raw_tile_rows(w, r0, nr, rows);
      float out[kMaxDotRows];
      for (int64_t t = t0; t < t1; ++t) {
        const I8Act act{xq + t * n, xd + t * n / 32, xs + t * n / 16};
        k.dot_rows_fused(w.type, rows, nr, act, n, out);
        for (int i = 0; i < nr; ++i) Y[t * w.n_rows + r0 + i] = out[i];
      }
    }
  }
}

// Fused formats, many tokens: tiles of kMaxTileRows rows, each unpacked once per chunk of tokens
// and dotted with the chunk in register tiles (dot_tile_fused). xi, xb: the tokens' interleaved
// activations and block sums.
void matmul_i8_tiles(const CpuKernels& k, const WeightMatrix& w, const int8_t* xi, const float* xd, const float* xs,
                     const float* xb, int64_t n_tok, float* Y) {
  const int64_t n = w.n_cols;
  const int64_t n_tiles = (w.n_rows + kMaxTileRows - 1) / kMaxTileRows;
  std::vector<uint8_t> scratch(fused_tile_scratch_bytes(n));
  std::vector<I8TileAct> acts(static_cast<size_t>(kTokenChunk));
  std::vector<float*> outs(static_cast<size_t>(kTokenChunk));
  for (int64_t t0 = 0; t0 < n_tok; t0 += kTokenChunk) {
    const int64_t t1 = std::min(n_tok, t0 + kTokenChunk);
    for (int64_t t = t0; t < t1; ++t) acts[static_cast<size_t>(t - t0)] = {xi + t * n, xd + t * n / 32, xs + t * n / 16, xb + t * n / 32};
#pragma omp for schedule(static)
    for (int64_t tile = 0; tile < n_tiles; ++tile) {
      const int64_t r0 = tile * kMaxTileRows;
      const int nr = static_cast<int>(std::min<int64_t>(kMaxTileRows, w.n_rows - r0));
      const uint8_t* rows[kMaxTileRows];
      raw_tile_rows(w, r0, nr, rows);
      for (int64_t t = t0; t < t1; ++t) outs[static_cast<size_t>(t - t0)] = Y + t * w.n_rows + r0;
      k.dot_tile_fused(w.type, rows, nr, acts.data(), static_cast<int>(t1 - t0), n, scratch.data(), outs.data());
    }
  }
}

void matmul_i8(const CpuKernels& k, I8Format fmt, const WeightMatrix& w, const float* X, int64_t n_tok, float* Y) {
  const int64_t n = w.n_cols;
  const size_t un = static_cast<size_t>(n);
  std::vector<int8_t> xq(static_cast<size_t>(n_tok) * un);
  std::vector<float> xd(static_cast<size_t>(n_tok) * un / 32), xs(static_cast<size_t>(n_tok) * un / 16);
  const bool tiles = fmt.fused && n_tok >= kTileMinTokens && k.dot_tile_fused != nullptr && cpu_tile_path() &&
                     n % 256 == 0 && tile_fused_type(w.type);
  std::vector<int8_t> xi(tiles ? static_cast<size_t>(n_tok) * un : 0);
  std::vector<float> xb(tiles ? static_cast<size_t>(n_tok) * un / 32 : 0);
  const bool nested = omp_in_parallel();
#pragma omp parallel if (!nested)
  {
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n_tok; ++t) {
      quantize_activations_i8(X + t * n, n, xq.data() + t * n, xd.data() + t * n / 32, xs.data() + t * n / 16);
      if (tiles) interleave_act_i8(w.type, xq.data() + t * n, xs.data() + t * n / 16, 0, n / 32, xi.data() + t * n, xb.data() + t * n / 32);
    }
    if (tiles) {
      matmul_i8_tiles(k, w, xi.data(), xd.data(), xs.data(), xb.data(), n_tok, Y);
    } else if (fmt.fused) {
      matmul_i8_fused(k, w, xq.data(), xd.data(), xs.data(), n_tok, Y);
    } else {
      matmul_i8_unpacked(k, fmt, w, xq.data(), xd.data(), xs.data(), n_tok, Y);
    }
  }
}

}  // namespace

void matmul(const WeightMatrix& w, const float* X, int64_t n_tok, float* Y) {
  check_matrix(w);
  if (n_tok <= 0 || w.n_rows == 0) return;
  const int64_t n = w.n_cols;
  const CpuKernels& k = cpu_kernels();
  const RowChoice rc = row_path(k, w.type, n, true);
  if (rc.path == RowPath::I8Fused || rc.path == RowPath::I8Unpacked) {
    matmul_i8(k, rc.fmt, w, X, n_tok, Y);
    return;
  }
  const int64_t n_tiles = (w.n_rows + kMaxDotRows - 1) / kMaxDotRows;
  const bool nested = omp_in_parallel();
  if (rc.path == RowPath::DirectFloat && n_tok <= kDirectMaxTokens) {
    // Decode: dots straight from the quantised rows (the same numbers as decoding first).
#pragma omp parallel for schedule(static) if (!nested)
    for (int64_t tile = 0; tile < n_tiles; ++tile) {
      const int64_t r0 = tile * kMaxDotRows;
      const int nr = static_cast<int>(std::min<int64_t>(kMaxDotRows, w.n_rows - r0));
      const uint8_t* rows[kMaxDotRows];
      raw_tile_rows(w, r0, nr, rows);
      float out[kMaxDotRows];
      for (int64_t t = 0; t < n_tok; ++t) {
        k.dot_rows_direct(w.type, rows, nr, X + t * n, n, out);
        for (int i = 0; i < nr; ++i) Y[t * w.n_rows + r0 + i] = out[i];
      }
    }
    return;
  }
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
        float_tile_rows(k, w, r0, nr, buf.data(), rows);
        float out[kMaxDotRows];
        for (int64_t t = t0; t < t1; ++t) {
          k.dot_rows(rows, nr, X + t * n, n, out);
          for (int i = 0; i < nr; ++i) Y[t * w.n_rows + r0 + i] = out[i];
        }
      }
    }
  }
}

void prepare_vec(const float* x, int64_t n, PreparedVec& v) {
  v.x = x;
  v.n = n;
  const CpuKernels& k = cpu_kernels();
  if (k.i8_format == nullptr || n % 32 != 0) {
    v.q.clear();
    return;
  }
  const size_t un = static_cast<size_t>(n);
  v.q.resize(un);
  v.d32.resize(un / 32);
  v.sum16.resize(un / 16);
  quantize_activations_i8(x, n, v.q.data(), v.d32.data(), v.sum16.data());
}

// matmul's path (row_path) for one token, rows [r0, r1) in its tiles.
void matvec_rows(const WeightMatrix& w, const PreparedVec& v, int64_t r0, int64_t r1, float* y, MatvecScratch& s) {
  const int64_t n = w.n_cols;
  if (n != v.n) fail("matvec_rows: a vector of ", v.n, " values for ", n, " columns");
  const CpuKernels& k = cpu_kernels();
  const RowChoice rc = row_path(k, w.type, n, !v.q.empty());
  const size_t un = static_cast<size_t>(n);
  float out[kMaxDotRows];
  for (int64_t r = r0; r < r1; r += kMaxDotRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kMaxDotRows, r1 - r));
    const I8Act act{v.q.data(), v.d32.data(), v.sum16.data()};
    if (rc.path == RowPath::I8Fused) {
      const uint8_t* rows[kMaxDotRows];
      raw_tile_rows(w, r, nr, rows);
      k.dot_rows_fused(w.type, rows, nr, act, n, out);
    } else if (rc.path == RowPath::I8Unpacked) {
      if (s.codes.size() < kMaxDotRows * un) {
        s.codes.resize(kMaxDotRows * un);
        s.scales8.resize(kMaxDotRows * un / 4);
        s.bias16.resize(kMaxDotRows * un / 16 + 1);
      }
      I8Row rows[kMaxDotRows];
      i8_tile_rows(k, w, r, nr, s.codes.data(), s.scales8.data(), s.bias16.data(), rows);
      k.dot_rows_i8(rows, nr, act, n, rc.fmt, out);
    } else if (rc.path == RowPath::DirectFloat) {
      const uint8_t* rows[kMaxDotRows];
      raw_tile_rows(w, r, nr, rows);
      k.dot_rows_direct(w.type, rows, nr, v.x, n, out);
    } else {
      if (s.fbuf.size() < kMaxDotRows * un) s.fbuf.resize(kMaxDotRows * un);
      const float* rows[kMaxDotRows];
      float_tile_rows(k, w, r, nr, s.fbuf.data(), rows);
      k.dot_rows(rows, nr, v.x, n, out);
    }
    for (int i = 0; i < nr; ++i) y[r + i] = out[i];
  }
}

void MatvecTasks::add(const WeightMatrix& w, const PreparedVec* v, float* y, size_t task_bytes) {
  check_matrix(w);
  const size_t rb = std::max<size_t>(1, row_bytes(w.type, w.n_cols));
  const int64_t rows = static_cast<int64_t>((task_bytes + rb - 1) / rb);
  const int64_t step = std::max<int64_t>(kMaxDotRows, (rows + kMaxDotRows - 1) / kMaxDotRows * kMaxDotRows);
  products_.push_back({w, v, y, step, n_tasks_});
  n_tasks_ += (w.n_rows + step - 1) / step;
}

void MatvecTasks::run(MatvecScratch& s) const {
#pragma omp for schedule(guided)
  for (int64_t t = 0; t < n_tasks_; ++t) {
    // The last product whose first task is at or before t.
    const auto p = std::upper_bound(products_.begin(), products_.end(), t,
                                    [](int64_t i, const Product& q) { return i < q.first; }) - 1;
    const int64_t r0 = (t - p->first) * p->step;
    matvec_rows(p->w, *p->v, r0, std::min(p->w.n_rows, r0 + p->step), p->y, s);
  }
}

void MatvecTasks::run_parallel() const {
#pragma omp parallel if (!omp_in_parallel())
  {
    MatvecScratch s;
    run(s);
  }
}

void matvec_many(const WeightMatrix* const* ws, float* const* ys, int m, const float* x) {
  if (m <= 0) return;
  const int64_t n = ws[0]->n_cols;
  for (int i = 0; i < m; ++i)
    if (ws[i]->n_cols != n) fail("matvec_many: matrices of ", n, " and ", ws[i]->n_cols, " columns");
  PreparedVec v;
  prepare_vec(x, n, v);
  MatvecTasks tasks;
  for (int i = 0; i < m; ++i) tasks.add(*ws[i], &v, ys[i]);
  tasks.run_parallel();
}

void matvec(const WeightMatrix& w, const float* x, float* y) {
  float* const ys[] = {y};
  const WeightMatrix* const ws[] = {&w};
  matvec_many(ws, ys, 1, x);
}

}  // namespace strata
