// Products of a quantised weight matrix with float32 activations: the CPU engine's hot loop.
// A weight matrix is `n_rows` rows of `n_cols` elements of `type`, row r starting at
// w + r * row_stride bytes (row_stride >= row_bytes(type, n_cols)); this is how GGUF stores
// [n_cols x n_rows] tensors (ne[0] = n_cols is contiguous), and expert stacks are sliced the same way.
#pragma once

#include <cstddef>
#include <cstdint>

#include "strata/quant/types.h"

namespace strata {

struct WeightMatrix {
  GgmlType type = GgmlType::F32;
  const uint8_t* data = nullptr;
  int64_t n_rows = 0;
  int64_t n_cols = 0;
  size_t row_stride = 0;  // bytes between consecutive rows
};

// A stack of n_expert matrices of identical shape stored back to back (GGUF [cols x rows x n_expert]).
struct ExpertStack {
  WeightMatrix first;        // expert 0
  size_t expert_stride = 0;  // bytes between consecutive experts
  int n_expert = 0;

  WeightMatrix expert(int e) const {
    WeightMatrix w = first;
    w.data = first.data + static_cast<size_t>(e) * expert_stride;
    return w;
  }
};

// The routed experts of one MoE layer: expert e is down_e(silu(gate_e x) * up_e x).
struct ExpertFfn {
  ExpertStack gate, up, down;
};

// y[r] = dot(W[r], x) for every row. Parallel over rows (OpenMP) unless called from inside a
// parallel region, where it runs on the calling thread.
void matvec(const WeightMatrix& w, const float* x, float* y);

// Y[t][r] = dot(W[r], X[t]) for n_tok tokens; X is [n_tok x n_cols], Y is [n_tok x n_rows], row-major.
void matmul(const WeightMatrix& w, const float* X, int64_t n_tok, float* Y);

}  // namespace strata
