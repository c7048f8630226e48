// Streaming prefill (issue 21): in a hybrid session, a prompt chunk with enough tokens per expert copies its MoE
// layers' cold experts host-to-GPU and computes them with the prefill's grouped GEMMs, instead of computing them on the
// CPU. A staging thread copies each layer's cold experts from the mapped GGUF into a ring of pinned pieces (a few
// threads at memory speed) and the copy engine moves each piece on to a layer buffer on the GPU, so the host copy of
// one piece overlaps the transfer of the last. Two layer buffers are used in turn: while the GPU computes one layer,
// the next layer's experts are on their way. (Page-locking the mapped file itself would save the host copy, but
// cudaHostRegister over a large file mapping is far too slow for start-up: docs/PERF.md.) The GEMM kernels and the
// combine are the all-GPU prefill's, so a streamed expert's rows are bitwise the all-GPU ones.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/cuda/device_model.h"
#include "strata/moe/gpu_expert_plan.h"

namespace strata::cuda {

// What a chunk's MoE layer computes from a stream buffer: expert e of the layer streams when rank[e] < n (rank: its
// place among the layer's cold experts in ascending id, -1 for experts resident in the layer's stack); its rows sit in
// slot rank[e] of gate/up/down (n_expert = n).
struct StreamedLayer {
  DevMatrix gate, up, down;
  const int* rank = nullptr;  // device [n_expert]
  int n = 0;
};

struct StreamStats {
  uint64_t chunks = 0;   // chunks that streamed some layer
  uint64_t layers = 0;   // (chunk, layer) passes that streamed
  uint64_t experts = 0;  // experts copied
  uint64_t bytes = 0;    // their bytes, host to GPU
};

class ExpertStreamer {
 public:
  // Allocates kBuffers device buffers, each the size of the largest layer's cold experts (placement: the model's slot
  // map, -1 = cold), and the pinned staging ring, and starts the staging thread. Fails (strata::Error) when memory is
  // short; the caller reports that and computes cold experts on the CPU.
  ExpertStreamer(const Model& model, const DeviceModel& dm, const std::vector<std::vector<int>>& placement);
  ~ExpertStreamer();
  ExpertStreamer(const ExpertStreamer&) = delete;
  ExpertStreamer& operator=(const ExpertStreamer&) = delete;

  // A chunk of m tokens starts: decides whether its layers stream (the cost model: enough expected tokens per cold
  // expert that a copy beats the CPU's pass over the expert) and enqueues the first layers' copies.
  void begin_chunk(int m);
  // Layer il of the current chunk: s waits for its copies; n == 0 when the layer does not stream.
  StreamedLayer acquire(int il, cudaStream_t s);
  // Every read of layer il's buffer is enqueued on s: the buffer goes to the layer kBuffers further on.
  void release(int il, cudaStream_t s);
  // Whether layer il's cold experts stream in the current chunk (the CPU then leaves them alone).
  bool streams(int il) const;

  const StreamStats& stats() const { return stats_; }
  // The staging error that turned streaming off for the rest of the session ("" while none).
  const std::string& failure() const { return failure_; }
  uint64_t device_bytes() const { return buffer_bytes_ * kBuffers; }
  int staging_threads() const;
  // The fewest expected tokens per cold expert (chunk tokens x k / n_expert) that stream.
  static constexpr double kMinTokensPerExpert = 4.0;
  static constexpr int kBuffers = kStreamBuffers;  // what the plan reserved
  static constexpr int kMaxStagingThreads = 8;

 private:
  struct Layer {
    std::vector<int> cold;                                // cold expert ids, ascending (rank order)
    int* rank_d = nullptr;                                // device [n_expert]
    const uint8_t* src[3] = {nullptr, nullptr, nullptr};  // host gate/up/down stacks (expert 0)
    size_t stride[3] = {0, 0, 0};                         // bytes per expert
    DevMatrix dev[3];                                     // the layer's resident stacks (type and row shape)
  };
  struct Stager;
  void enqueue(size_t pos);  // hands layers_[pos] of this chunk to the staging thread
  void release_all();

  const ModelConfig& c_;
  std::vector<Layer> layers_;        // MoE layers with cold experts, in layer order
  std::vector<int> layer_index_;     // [n_layer] -> index in layers_ or -1
  bool chunk_streams_ = false;       // this chunk's layers stream (every one of layers_ in turn)
  std::vector<uint64_t> job_of_;     // [layers_] the staging job of each in this chunk, once enqueued
  size_t next_pos_ = 0;              // next index of layers_ to enqueue
  int first_buffer_ = 0;             // buffer of layers_[0] in this chunk
  int next_buffer_ = 0;              // buffer the next chunk's first layer takes
  uint8_t* buffers_[kBuffers] = {};
  uint64_t buffer_bytes_ = 0;
  StreamedLayer views_[kBuffers];
  cudaEvent_t free_[kBuffers] = {};
  std::unique_ptr<Stager> stager_;
  uint64_t jobs_ = 0;  // staging jobs handed out
  StreamStats stats_;
  std::string failure_;
};

}  // namespace strata::cuda
