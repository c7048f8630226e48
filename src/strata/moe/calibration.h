// The pieces of `strata calibrate` that are not command-line handling: splitting a tokenized corpus
// into a training and a held-out part, counting routes over a part with the CPU engine, and comparing
// placements (profile vs the baselines) by the cold-hit rate they would give.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "strata/engine/routing_counts.h"
#include "strata/engine/sequence.h"
#include "strata/moe/model_fingerprint.h"
#include "strata/moe/placement.h"

namespace strata {

struct CorpusPart {
  std::vector<std::vector<int32_t>> docs;  // token sequences, run independently
  std::vector<std::string> names;          // one per doc ("file.py" or "file.py (last 10%)")
  uint64_t n_tokens() const;
};

struct CorpusSplit {
  CorpusPart train, heldout;
};

// Several documents: the last round(frac * n) of them (at least 1 when frac > 0, at most n - 1) are
// held out, in the order given. One document: its last round(frac * tokens) tokens are held out.
// frac = 0: everything trains. Fails when frac is outside [0, 1), a part would be empty, or no tokens.
CorpusSplit split_corpus(const std::vector<std::vector<int32_t>>& docs, const std::vector<std::string>& names,
                         double holdout_frac);

// Runs every document through the sequence (any backend: the CPU engine or a GPU session) in chunks of
// at most `chunk` tokens, each chunk from an empty state (reset()), counting routes into `counts` (sized
// to the model when empty). progress(tokens done so far) is called after every chunk, counts complete
// at return. The sequence's max_ctx must be >= chunk; it counts into nothing afterwards.
// trace (optional, --collect-routing): every chunk's picks are appended to trace->writer, each chunk its
// own stream (trace->next_stream, counting up across calls).
struct ChunkTrace {
  RoutingTraceWriter* writer = nullptr;
  uint32_t next_stream = 0;
};
void count_routes(Sequence& session, const CorpusPart& part, int chunk, RoutingCounts& counts,
                  const std::function<void(uint64_t)>& progress = {}, ChunkTrace* trace = nullptr);

struct MethodResult {
  std::string name;                       // "profile", "uniform", "by-layer"
  ExpertPlan plan;
  double heldout_rate = 0.0;              // cold-hit rate on the held-out counts
  std::vector<double> heldout_per_layer;
  double train_rate = 0.0;                // on the training counts themselves
};

struct BudgetComparison {
  double percent = 0.0;        // of all expert bytes
  uint64_t budget_bytes = 0;
  // profile, uniform, by-layer (llama.cpp --n-cpu-moe order), oracle (placed from the held-out counts
  // themselves: the best any placement can do on them, a lower bound for the others when all experts
  // have one size).
  std::vector<MethodResult> methods;
};

// For each budget percentage: the profile's placement (hotness from `train`), the uniform placement,
// the by-layer placement and the oracle, with their cold-hit rates on `heldout` and on `train`.
std::vector<BudgetComparison> compare_placements(const std::vector<std::vector<uint64_t>>& expert_bytes,
                                                 const RoutingCounts& train, const RoutingCounts& heldout,
                                                 int n_expert_used, const std::vector<double>& percents);

// Held-out counts from a file instead of held-out text: a strata routing profile (its fingerprint must
// match `model`), or the routing_counts.json that tools/train_tiny/train.py writes next to the tiny model
// ({"tokens": T, "top_k": K, "num_experts": E, "counts": [[...] per layer]}, counted by the Hugging Face
// reference on the model's own held-out split; its shape must match `model`).
RoutingCounts read_heldout_counts(const std::string& path, const ModelIdentity& model);

// "25,50,75" -> {25, 50, 75}; each in 0..100. Fails naming the bad entry.
std::vector<double> parse_percent_list(const std::string& text, const char* option_name);

}  // namespace strata
