// `strata bench-cold`: the hybrid decode's CPU side alone. One job is what the hybrid MoE's listener
// posts per layer and token: ColdExpertPool::run for k experts of one layer (gate + up rows, SwiGLU,
// down rows). The cold measurement cycles over every expert of every layer it is given, so the
// weights come from DRAM as they do in decode (the working set is many times any L3); the cached one
// repeats one job's experts, which shows what the kernels reach when memory is not the limit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "strata/cpu/cold_experts.h"
#include "strata/cpu/matmul.h"
#include "strata/quant/types.h"

namespace strata {

// Random expert stacks of one type held in memory (gate, up: ff x d; down: d x ff; per layer),
// for timing the kernels on any type without a GGUF file of it. The rows repeat a small set of
// quantised random rows: the values do not change the speed, and filling gigabytes stays quick.
class SyntheticExperts {
 public:
  SyntheticExperts(GgmlType type, int64_t d, int64_t ff, int n_expert, int n_layer, uint64_t seed);
  const std::vector<ExpertFfn>& layers() const { return layers_; }
  size_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, Free> data_;
  size_t bytes_ = 0;
  std::vector<ExpertFfn> layers_;
};

// Bytes of one expert's three matrices (what one pick reads).
size_t cold_expert_bytes(const ExpertFfn& w);

struct ColdBenchOptions {
  int picks = 8;          // experts per job (distinct, of one layer)
  double seconds = 1.0;   // per measurement (cold; the cached one takes a quarter)
  uint64_t seed = 1;
};

struct ColdBenchResult {
  int picks = 0;
  int threads = 0;
  double bytes_per_job = 0;
  double working_set_bytes = 0;  // bytes the cold cycle goes through
  int64_t cold_jobs = 0;
  double cold_ms_per_job = 0;    // mean
  double cold_median_ms = 0;
  double cold_gbs = 0;           // weight bytes / time
  int64_t cached_jobs = 0;
  double cached_ms_per_job = 0;
  double cached_gbs = 0;
};

// Times pool.run on jobs drawn from `layers` (every layer's stacks of one shape). Needs
// picks <= the experts per layer. A first pass over every expert pages the weights in untimed.
ColdBenchResult bench_cold_experts(ColdExpertPool& pool, const std::vector<ExpertFfn>& layers,
                                   const ColdBenchOptions& opt);

// Batched products (prefill, verify batches, the CPU engine): one expert's gate, up and down
// matmuls with `tokens` tokens each, on `threads` OpenMP threads, the weights cycling over every
// expert of `layers` (dram) or one expert repeated (cache). Timed with the batched fused kernel
// (tiles) and with the per-token kernel (per_token), alternately.
struct BatchBenchResult {
  int tokens = 0;
  int threads = 0;
  bool dram = false;
  double per_token_gops = 0;  // 2 x multiply-adds per second / 1e9
  double tiles_gops = 0;
};
BatchBenchResult bench_batched_experts(const std::vector<ExpertFfn>& layers, int tokens, int threads, bool dram,
                                       double seconds);

}  // namespace strata
