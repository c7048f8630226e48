#include <vector>

#include "strata/base/error.h"
#include "strata/cpu/ops.h"
#include "strata/engine/blocks.h"
#include "strata/quant/quantize.h"

namespace strata {

void project(const WeightMatrix& w, const float* X, int n, float* Y) {
  if (n == 1) {
    matvec(w, X, Y);
  } else {
    matmul(w, X, n, Y);
  }
}

void project_many(const WeightMatrix* const* ws, float* const* ys, int m, const float* X, int n) {
  if (n == 1) {
    matvec_many(ws, ys, m, X);
  } else {
    for (int i = 0; i < m; ++i) project(*ws[i], X, n, ys[i]);
  }
}

void project_around(const WeightMatrix* const* ws, float* const* ys, int m, const float* xn,
                    const std::function<void()>& mid, const WeightMatrix& w_out, const float* o, float* out) {
  PreparedVec xv, ov;
  prepare_vec(xn, ws[0]->n_cols, xv);
  MatvecTasks in, proj_out;
  for (int i = 0; i < m; ++i) in.add(*ws[i], &xv, ys[i]);
  proj_out.add(w_out, &ov, out);
#pragma omp parallel
  {
    MatvecScratch s;
    in.run(s);
    mid();
#pragma omp single
    prepare_vec(o, w_out.n_cols, ov);
    proj_out.run(s);
  }
}

void embed_tokens(const WeightMatrix& embd, const int32_t* tokens, int n, float* X) {
  for (int t = 0; t < n; ++t) {
    const int32_t id = tokens[t];
    if (id < 0 || id >= embd.n_rows) fail("token id ", id, " is out of range (vocabulary of ", embd.n_rows, ")");
    dequantize_row(embd.type, embd.data + static_cast<size_t>(id) * embd.row_stride, X + static_cast<int64_t>(t) * embd.n_cols,
                   embd.n_cols);
  }
}

void rmsnorm_rows(const float* X, const float* w, float eps, int n, int d, float* out) {
  for (int t = 0; t < n; ++t) rmsnorm(X + static_cast<int64_t>(t) * d, w, eps, d, out + static_cast<int64_t>(t) * d);
}

void output_logits(const ModelConfig& c, const ModelWeights& w, const float* X, int n, bool all_positions,
                   float* logits) {
  const int first = all_positions ? 0 : n - 1;
  const int rows = n - first;
  std::vector<float> xn(static_cast<size_t>(rows) * c.n_embd);
  rmsnorm_rows(X + static_cast<int64_t>(first) * c.n_embd, w.output_norm.data(), c.rms_eps, rows, c.n_embd, xn.data());
  project(w.output, xn.data(), rows, logits);
}

}  // namespace strata
