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

// reps >= 1 repetitions of n_gen greedy tokens after `prompt`, each on a sequence from make().
SpecBenchResult run_spec_bench(const std::function<std::unique_ptr<Sequence>()>& make, const Tokenizer& tokenizer,
                               const std::vector<int32_t>& prompt, int n_gen, int reps, Drafter& drafter,
                               const SpeculativeParams& spec);

std::string format_spec_bench(const SpecBenchResult& r);

}  // namespace strata
