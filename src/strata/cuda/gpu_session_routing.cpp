// GpuSession's routing statistics for profiles (issue 8): moves the device counters into the
// caller's RoutingCounts after each forward (see set_routing_counts in gpu_session.h).
#include <algorithm>

#include "strata/base/error.h"
#include "strata/cuda/gpu_session.h"

namespace strata::cuda {

void GpuSession::set_routing_counts(RoutingCounts* counts) {
  const ModelConfig& c = model().config();
  if (counts && counts->empty() && counts->n_layer == 0) counts->reset(c.n_layer, c.n_expert);
  if (counts && (counts->n_layer != c.n_layer || counts->n_expert != c.n_expert))
    fail("routing counts of ", counts->n_layer, " layers x ", counts->n_expert, " experts do not fit the model (",
         c.n_layer, " x ", c.n_expert, ")");
  if (counts) {
    // Whatever the device counted before belongs to no one: start from here.
    if (hybrid())
      hybrid_picks_seen_ = hybrid_telemetry().expert_picks;
    else
      reset_routing_counts();
  }
  route_sink_ = counts;
}

void GpuSession::collect_routing_counts() {
  const ModelConfig& c = model().config();
  std::vector<uint64_t> delta;
  if (hybrid()) {
    const std::vector<uint64_t> now = hybrid_telemetry().expert_picks;
    // A counter below what was seen means someone reset the telemetry since: count from zero.
    if (hybrid_picks_seen_.size() != now.size()) hybrid_picks_seen_.assign(now.size(), 0);
    delta.resize(now.size());
    for (size_t i = 0; i < now.size(); ++i)
      delta[i] = now[i] >= hybrid_picks_seen_[i] ? now[i] - hybrid_picks_seen_[i] : now[i];
    hybrid_picks_seen_ = now;
  } else {
    delta = routing_counts();
    reset_routing_counts();
  }
  const size_t ne = static_cast<size_t>(c.n_expert);
  if (delta.size() != static_cast<size_t>(c.n_layer) * ne)
    fail("GPU routing counters hold ", delta.size(), " entries, expected ", c.n_layer, " x ", c.n_expert);
  // Tokens counted: every routed token adds n_expert_used picks in each MoE layer, so the busiest
  // layer's picks / k is the number of tokens whose routes reached the counters.
  uint64_t most = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    uint64_t layer = 0;
    for (size_t e = 0; e < ne; ++e) {
      const uint64_t v = delta[static_cast<size_t>(l) * ne + e];
      if (v) route_sink_->add(l, static_cast<int>(e), v);
      layer += v;
    }
    most = std::max(most, layer);
  }
  if (c.n_expert_used > 0) route_sink_->n_tokens += most / static_cast<uint64_t>(c.n_expert_used);
}

}  // namespace strata::cuda
