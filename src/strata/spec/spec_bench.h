// `strata bench --spec ...`: greedy generation of a text prompt with and without the drafter on fresh
// sequences, reporting decode tok/s of both, the acceptance, and what one verification costs against
// one decode step (the break-even acceptance follows from the two).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "strata/engine/bench_runner.h"
#include "strata/engine/drafter.h"
#include "strata/engine/generate.h"
#include "strata/engine/sequence.h"
#include "strata/text/tokenizer.h"

namespace strata {

struct SpecBenchResult {
  std::string drafter;
  Stats plain_tps, spec_tps;  // decode tokens per second over the repetitions
  int drafted = 0, accepted = 0, verifies = 0;  // summed over the speculative runs
  int verify_tokens = 0;   // tokens per timed verification: the last token + draft_max drafts
  double verify_ms = 0;    // median time of one such verification (pending forward, nothing kept)
  double step_ms = 0;      // median time of one plain decode step
  bool same_tokens = true;  // every speculative run generated what the plain run did
};

// reps >= 1 repetitions (after a warm-up one) of n_gen greedy tokens after `prompt`, without and with the
// drafter, on two sequences from make() reset between repetitions: what a server's slots see once
// their first request has run (a GPU session keeps the graphs it captured).
SpecBenchResult run_spec_bench(const std::function<std::unique_ptr<Sequence>()>& make, const Tokenizer& tokenizer,
                               const std::vector<int32_t>& prompt, int n_gen, int reps, Drafter& drafter,
                               const SpeculativeParams& spec);

std::string format_spec_bench(const SpecBenchResult& r);

// `strata bench --verify-cost SHAPES`: what verifying a draft of a given shape costs against one decode
// step, on any backend (random tokens; acceptance is not measured). A chain of n drafted tokens, or a
// tree of n ("caterpillar": a main chain of ceil(n/2) drafts with one more candidate beside each, the
// shape of a per-position top-2 draft). A verification is the pending forward of the last token and
// the drafts, then keeping the main path.
struct VerifyShape {
  bool tree = false;
  int n = 0;  // drafted tokens, >= 1
  std::string label() const;
  int depth() const { return tree ? (n + 1) / 2 : n; }  // drafts on the main path
  std::vector<int> parents() const;  // Draft::parents form (empty for a chain)
};
// "chain:2,4,8,16,tree:8,16,22": comma-separated sizes, each after "chain:" or "tree:" or continuing
// the kind before it. Throws strata::Error naming --verify-cost on anything else.
std::vector<VerifyShape> parse_verify_shapes(const std::string& text);

struct VerifyCostRow {
  VerifyShape shape;
  double verify_ms = 0;  // median
  double step_ms = 0;    // median of the decode steps timed between the verifications
};
// After n_prompt random tokens, reps verifications of each shape on one sequence from make(), a
// plain decode step timed beside each. The sequence needs room for n_prompt + (reps + 1) * (the largest
// depth + 2) tokens: verify_cost_context gives it.
int verify_cost_context(int n_prompt, const std::vector<VerifyShape>& shapes, int reps);
std::vector<VerifyCostRow> run_verify_cost(const std::function<std::unique_ptr<Sequence>()>& make, int n_prompt,
                                           const std::vector<VerifyShape>& shapes, int reps, uint64_t seed);
// The table, with the speed-up each shape implies when a verification yields L = 2, 3, 4 tokens
// (L one-step tokens for one verification: L * step / verify; "-" where L exceeds depth + 1).
std::string format_verify_cost(const std::vector<VerifyCostRow>& rows);

}  // namespace strata
