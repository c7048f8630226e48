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

// y[r] = dot(W[r], x) for every row: matvec_many of one matrix. Parallel over rows (OpenMP) unless
// called from inside a parallel region, where it runs on the calling thread.
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

// Weight bytes of one task of matvec_many's list: small enough that a decode step's few matrices make
// several tasks per thread, large enough that a task streams whole pages.
constexpr size_t kMatvecTaskBytes = 32 << 10;

// One decode step's products as one list of row-range tasks in memory order (products in the order
// added, each cut into tasks of about task_bytes weight bytes). A team runs the list with guided
// scheduling: large contiguous shares first, then single tasks to whichever thread is free, so a
// region ends within a task of its fastest finish instead of waiting for a slow thread's whole
// static share. Every row bitwise what matvec gives for it, whichever thread runs it.
class MatvecTasks {
 public:
  // y = W v for every row of w. v is read when the tasks run (it may be prepared after this call).
  void add(const WeightMatrix& w, const PreparedVec* v, float* y, size_t task_bytes = kMatvecTaskBytes);
  // To be called by every thread of the calling team (an omp for, ending with the team's barrier).
  void run(MatvecScratch& s) const;
  // In a parallel region of its own; on the calling thread alone from inside a parallel region.
  void run_parallel() const;

 private:
  struct Product {
    WeightMatrix w;
    const PreparedVec* v;
    float* y;
    int64_t step;   // rows per task
    int64_t first;  // index of its first task in the list
  };
  std::vector<Product> products_;
  int64_t n_tasks_ = 0;
};

// y_i = W_i x for m matrices of x's width, as one task list in one parallel region (the vector
// quantised once); each y_i bitwise what matmul(W_i, x, 1, y_i) gives.
void matvec_many(const WeightMatrix* const* ws, float* const* ys, int m, const float* x);

}  // namespace strata
