// The live routing picture behind the web page's experts view (GET /v1/strata/experts) and the
// strata_experts_* lines of /metrics: every slot's routing counts since the server started, where each
// routed expert lives (on the GPU backend), and a short history of tokens and cold picks so the page can
// draw the last minutes. Thread-safe: slot workers add counts while request threads read.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "strata/engine/routing_counts.h"
#include "strata/text/chat_template.h"

namespace strata::serve {

// Where a routed expert's weights are when a token picks it.
enum class ExpertHome : uint8_t {
  None,   // the layer has no routed experts
  Gpu,    // resident in VRAM for the whole run (the hot set)
  Cache,  // in a VRAM pool of experts fetched on demand
  Cpu,    // computed on the CPU from host memory (a cold pick)
};
const char* expert_home_name(ExpertHome h);  // "gpu", "cache", "cpu"; "none"

// A GPU backend's placement: [layer][expert] homes and the VRAM receipt it was planned from.
struct ExpertPlacement {
  std::vector<std::vector<ExpertHome>> home;
  std::string receipt;
};

class ExpertStats {
 public:
  using Clock = std::chrono::steady_clock;
  // How far back the history reaches, and the width of one of its buckets.
  static constexpr int kWindowSeconds = 300;
  static constexpr int kBucketSeconds = 5;

  // Sizes the tables for a model (clears everything).
  void reset(int n_layer, int n_expert, int n_expert_used);
  // Placement for the heatmap's marks and the cold-hit rate; fails when its shape is not the model's.
  void set_placement(ExpertPlacement placement);
  // Counting could not be turned on for this backend: the view says why instead of showing zeros.
  void set_unavailable(std::string why);
  // Counts flushed by a slot (a request's, or part of one while it runs); a table of another shape is
  // ignored so that one odd backend cannot take the server down.
  void add(const RoutingCounts& delta, Clock::time_point now = Clock::now());

  // The experts view's JSON (docs/API.md, GET /v1/strata/experts).
  OrderedJson json(const std::string& backend, Clock::time_point now = Clock::now()) const;
  // Prometheus lines: experts per home (no samples without a placement), cold-hit rate since start.
  std::string metrics() const;

 private:
  struct Sample {
    Clock::time_point t;
    uint64_t tokens = 0, picks = 0, cold_picks = 0;
  };
  uint64_t cold_picks_locked(const RoutingCounts& c) const;
  void trim_locked(Clock::time_point now);

  mutable std::mutex mutex_;
  int n_expert_used_ = 0;
  RoutingCounts total_;
  std::optional<ExpertPlacement> placement_;
  std::string unavailable_;
  uint64_t picks_ = 0, cold_picks_ = 0;
  std::deque<Sample> history_;
};

}  // namespace strata::serve
