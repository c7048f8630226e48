// Products of a quantised weight matrix with float32 activations: the CPU engine's hot loop.
// A weight matrix is `n_rows` rows of `n_cols` elements of `type`, row r starting at
// w + r * row_stride bytes (row_stride >= row_bytes(type, n_cols)); this is how GGUF stores
// [n_cols x n_rows] tensors (ne[0] = n_cols is contiguous), and expert stacks are sliced the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

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

// Decode building blocks: one vector prepared once (its int8 quantisation, shared by every matrix of
// n columns that takes the int8 path) and products of row ranges, so that a caller can run several
// matrices' rows as one task list inside one parallel region. Each row equals, bitwise, what matvec
// gives for it (same kernels, same row tiles).
struct PreparedVec {
  const float* x = nullptr;
  int64_t n = 0;
  std::vector<int8_t> q;  // empty where no int8 path exists for n columns
  std::vector<float> d32, sum16;
};
void prepare_vec(const float* x, int64_t n, PreparedVec& v);

// Per-thread buffers of matvec_rows (the unpacked and decoded paths).
struct MatvecScratch {
  std::vector<uint8_t> codes;
  std::vector<float> scales8, bias16, fbuf;
};

// Rows [r0, r1) of matvec(w, v.x, y): r0 a multiple of kMaxDotRows (cpu_kernels.h), r1 one too or
// w.n_rows. No threads of its own.
void matvec_rows(const WeightMatrix& w, const PreparedVec& v, int64_t r0, int64_t r1, float* y, MatvecScratch& s);

// Rows of a matrix a matvec_rows task of about `bytes` weight bytes covers (a multiple of kMaxDotRows).
int64_t matvec_task_rows(const WeightMatrix& w, size_t bytes);

// y_i = W_i x for m matrices of x's width, in one parallel region over all their row tiles (the
// vector quantised once); each y_i bitwise what matvec(W_i, x, y_i) gives.
void matvec_many(const WeightMatrix* const* ws, float* const* ys, int m, const float* x);

}  // namespace strata
