// Generated routing with a real model's statistics, for benchmarks when no recorded trace is at hand
// (bench --routing generate:NAME, routing-stats --generate NAME). Per layer, independently seeded:
//   - static popularity: Zipf(s) over the experts in a random order per layer;
//   - a context: a working set of `working_set` experts drawn from that popularity, whose members are
//     each replaced with probability `drift` per token (a slowly moving topic), and which gets
//     `boost` times its static weight;
//   - each of a token's k picks repeats one of the previous token's picks with probability `repeat`,
//     else is drawn from the context distribution; no expert twice in a token.
// Deterministic from the seed. The named settings are tuned so routing-stats on their output lands
// on the published figures each names (tests/test_routing_generator.cpp checks them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/engine/routing_trace.h"

namespace strata {

struct RoutingSetting {
  std::string name;
  int n_layer = 0, n_expert = 0, k = 0;  // the model shape the setting describes (bench uses the model's)
  double zipf = 0;                       // static popularity exponent (0: uniform)
  double repeat = 0;                     // probability a pick repeats one of the previous token's
  int working_set = 0;                   // context experts (0: no context, the static popularity only)
  double boost = 0;                      // the working set's weight multiplier
  double drift = 0;                      // per-token replacement probability of a working-set member
  std::string note;                      // what it is calibrated to
};

// "uniform", "qwen3-30b-a3b-like", "laguna-xs2-like": the named settings.
const std::vector<RoutingSetting>& routing_settings();
// A named setting (fails listing the names).
const RoutingSetting& routing_setting(const std::string& name);
std::string routing_setting_names();

class RoutingGenerator : public RoutingSource {
 public:
  // The setting's statistics over a model of n_layer x n_expert experts, top-k.
  RoutingGenerator(const RoutingSetting& setting, int n_layer, int n_expert, int k, uint64_t seed);
  void next(int n_tokens, int* picks) override;
  int n_layer() const override { return n_layer_; }
  int n_expert() const override { return n_expert_; }
  int k() const override { return k_; }
  std::string label() const override;

 private:
  struct Layer {
    uint64_t rng = 0;
    std::vector<double> popularity;  // static weight per expert
    std::vector<int> working;        // the context's experts
    std::vector<int> previous;       // the last token's picks
    std::vector<double> cumulative;  // scratch: the context distribution's running sums
  };
  void token(Layer& L, int* out);
  RoutingSetting setting_;
  int n_layer_, n_expert_, k_;
  uint64_t seed_;
  std::vector<Layer> layers_;
};

// n_tokens generated tokens as a one-stream trace (source: "generated NAME seed S").
RoutingTrace generate_routing_trace(const RoutingSetting& setting, int n_layer, int n_expert, int k, uint64_t seed,
                                    int n_tokens);

// A replay spec as bench --routing takes it: "FILE" (a trace) or "generate:NAME[:SEED]". Checks the
// syntax and the name only (the file is read later); fails with the flag's name.
struct RoutingReplaySpec {
  bool generated = false;
  std::string path;  // a trace file
  std::string name;  // a setting
  uint64_t seed = 1;
};
RoutingReplaySpec parse_routing_replay(const std::string& spec);

}  // namespace strata
