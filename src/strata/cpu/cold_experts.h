// Cold experts on the CPU (issue 8): the routed experts that are not resident in VRAM are computed
// on a persistent pool of worker threads, straight from the mapped GGUF, with the CPU engine's own
// row kernels (cpu/cpu_kernels.h: the int8-activation path for Q4_0/Q4_K/Q5_K/Q6_K, the float path
// for the other types). Each row is computed exactly as the CPU engine's matvec computes it (same
// activation quantisation, same 4-row tiles), so an expert's output equals the engine's bitwise.
//
// Work split: phase A = row blocks of (gate, up) of every pick, each block also applying SwiGLU to its
// slice of the hidden activation; phase B = row blocks of down, a block of pick j starting once all
// of j's phase-A blocks are done (its thread quantises j's hidden activation for the int8 path, once
// per pick; the quantisation is local to 32-value blocks, so every thread gets the same numbers).
// Blocks are sized to about equal bytes, a dozen per thread per job, so the threads finish together. Tasks are handed out through one atomic counter tagged with the job's
// generation, so a late thread can never take a task of the next job. The batched form (run_batch)
// adds a phase 0 (int8 quantisation of the tokens' inputs) and groups picks by expert: a phase-A/B task
// is a row block of one expert for all of that expert's tokens, each 4-row tile unpacked once per 64
// tokens. Threads spin briefly between jobs (decode sends one job per layer, a few hundred
// microseconds apart) and then sleep.
// No OpenMP inside.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "strata/cpu/matmul.h"

namespace strata {

// One cold expert to compute: expert id of the layer's stacks, and where its FFN output row goes
// (n_embd floats, written by the pool).
struct ColdPick {
  int expert = 0;
  float* out = nullptr;
};

// One cold pick of a batch of tokens (batched prefill): token row of the batch's input, expert id of
// the layer's stacks, and where the expert's FFN output row goes (n_embd floats, written by the pool).
struct ColdTokenPick {
  int token = 0;
  int expert = 0;
  float* out = nullptr;
};

class ColdExpertPool {
 public:
  // n_threads >= 1 compute threads in all: the caller of run() plus n_threads - 1 workers.
  explicit ColdExpertPool(int n_threads);
  ~ColdExpertPool();
  ColdExpertPool(const ColdExpertPool&) = delete;
  ColdExpertPool& operator=(const ColdExpertPool&) = delete;

  int n_threads() const { return n_threads_; }

  // For each pick: out = down_e(silu(gate_e xn) * up_e xn) for one token xn (w.gate.first.n_cols
  // floats). Blocking; one caller at a time. Fails (strata::Error) on a bad expert id or shapes that
  // do not chain.
  void run(const ExpertFfn& w, const float* xn, const ColdPick* picks, int n_picks);

  // Batched form (prefill): for each pick, out = down_e(silu(gate_e x) * up_e x) with x = row
  // picks[i].token of X ([n_tok x n_embd], row-major). The picks are grouped by expert inside, so each
  // cold expert's weights are read (and unpacked) once per batch and dotted with all its tokens; the
  // work (row blocks of each expert group, sized by the group's token count) is split over the pool's
  // threads. With set_batch_float_tiles(false) (or at the scalar level) every output row equals,
  // bitwise, what run() gives for that token and expert (same row kernels, same 4-row tiles, same
  // activation quantisation); so does every call with bitwise set (the hybrid verification's, whose
  // tokens must get what their own decode steps get). Blocking; fails (strata::Error) like run() and on a
  // token outside [0, n_tok).
  void run_batch(const ExpertFfn& w, const float* X, int n_tok, const ColdTokenPick* picks, int n_picks,
                 bool bitwise = false);
  // At the SIMD kernel levels, experts whose three matrices are Q4_K/Q5_K/Q6_K take the batched int8
  // kernel (cpu_kernels.h, dot_tile_fused) for groups of 3 tokens or more: bitwise run()'s results.
  // For other types run_batch multiplies float tiles by default: each 4-row weight tile is
  // decoded to float once per 64 tokens and multiplied in register blocks of 4 rows x 4 (AVX-512) or 2
  // (AVX2) tokens, with float inputs -- several times the int8 row kernels' speed on batches, which
  // re-decode the quantised blocks for every token. Results then agree with run() to its int8 rounding
  // (and with float math to float rounding) rather than bitwise. Off: run()'s row kernels, bitwise
  // equal to run(). The scalar level always uses run()'s kernels. Not while a job runs.
  void set_batch_float_tiles(bool on) { batch_float_tiles_ = on; }

  // Default thread count for this machine: every hardware thread but two (the decode thread, which
  // spins in cudaStreamSynchronize, and the GPU driver's own), at least 1.
  static int default_threads();

 private:
  struct Job;
  struct Scratch;
  void worker_main(int index);
  void work(int index, uint32_t gen);
  void do_task(int index, int64_t task);
  void do_batch_task(int index, int64_t task);
  void check_stacks(const ExpertFfn& w) const;
  void start_and_join(int64_t n_tasks);

  int n_threads_;
  std::vector<std::thread> threads_;
  std::unique_ptr<Job> job_;
  struct BatchJob;
  std::unique_ptr<BatchJob> batch_;
  bool batch_mode_ = false;  // whether the current job is a batch (read by tasks after claiming one)
  bool batch_float_tiles_ = true;
  std::vector<std::unique_ptr<Scratch>> scratch_;
  std::atomic<uint64_t> gen_{0};       // bumped for every job (and at shutdown)
  std::atomic<uint64_t> next_{0};      // (generation << 32) | next task index
  std::atomic<int64_t> finished_{0};   // tasks of the current job completed
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace strata
