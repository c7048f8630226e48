// GpuSession's routing statistics for profiles (issue 8): moves the device counters into the caller's
// RoutingCounts when asked (see set_routing_counts in gpu_session.h).
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
  if (route_sink_ && counts != route_sink_) flush_routing_counts();  // what was counted belongs to the old table
  if (counts && counts != route_sink_) reset_routing_counts();  // whatever the device counted before belongs to no one
  route_sink_ = counts;
}

void GpuSession::flush_routing_counts() {
  // Pending tokens' picks are not counts yet (only the kept ones become counts): the next flush after
  // keep() moves them.
  if (!route_sink_ || has_pending()) return;
  const ModelConfig& c = model().config();
  const std::vector<uint64_t> delta = routing_counts();
  reset_routing_counts();
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
