// Per-operation timing of the decode step (where the time goes), for tuning: with the environment
// variable STRATA_GPU_PROFILE=1 a GpuSession launches its kernels directly (no graph), records a CUDA
// event after every operation, and at destruction prints each operation's mean time per token to
// stderr ("[gpu-profile] ..."). Events sit between launches, so the figures include the launch gaps
// a graph would hide; their sum exceeds a graph step's time. STRATA_GPU_PROFILE=graph keeps the graph
// and times only each whole step on the device (no host work: the step's pure GPU time).
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <string>
#include <vector>

namespace strata::cuda {

class DecodeProfile {
 public:
  DecodeProfile();
  ~DecodeProfile() { release(); }
  DecodeProfile(const DecodeProfile&) = delete;
  DecodeProfile& operator=(const DecodeProfile&) = delete;

  // Records an event after the operation `what` (nullptr: the start of a step). No-op when off.
  void mark(const char* what, cudaStream_t s);
  // The same around a graph launch (graph mode only).
  void mark_graph(const char* what, cudaStream_t s);
  // After the stream has synchronised: adds the times between the recorded events to the totals.
  void collect();
  // Prints the table (when on and anything was measured) and frees the events.
  void release();

  // Steps recorded while a tag is set are timed apart (e.g. "T8: " for the multi-token step).
  std::string tag;
  bool on = false;        // per-operation events (direct launches)
  bool graph_on = false;  // whole graph steps only

 private:
  struct Total {
    double ms = 0;
    long calls = 0;
  };
  std::vector<cudaEvent_t> events_;
  std::vector<const char*> names_;
  size_t used_ = 0;
  std::string step_tag_;  // `tag` when the recorded step started
  std::map<std::string, long> steps_;
  std::map<std::string, std::map<std::string, Total>> totals_;
};

}  // namespace strata::cuda
