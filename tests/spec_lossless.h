// Speculative decoding must not change what is generated: greedy generation with a drafter gives the
// tokens, text, stop reason and final sequence state that generation without one gives. Shared by the
// CPU suite (test_spec.cpp) and GPU suites: they pass a factory of their sequences.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "strata/engine/drafter.h"
#include "strata/engine/generate.h"
#include "strata/engine/sequence.h"
#include "strata/sample/sampler.h"
#include "strata/text/tokenizer.h"

namespace strata::spec_test {

using MakeSequence = std::function<std::unique_ptr<Sequence>(int max_ctx)>;
using MakeDrafter = std::function<std::unique_ptr<Drafter>()>;

struct Case {
  std::vector<int32_t> prompt;
  int n_new = 32;
  int max_ctx = 0;  // 0: prompt + n_new + 1
  int draft_max = 8;
  SamplerParams sampling;  // temperature 0 unless a test says otherwise
  std::vector<std::string> stop_strings;
};

struct Outcome {
  GenerationResult result;
  int n_past = 0;
  std::vector<float> next_logits;  // the sequence's logits for the last token, fed after generation
};

// Generates the case on a fresh sequence (with `drafter` when given), then feeds the last generated
// token, which reads the state the generation left.
inline Outcome generate_case(const MakeSequence& make, const Tokenizer& tokenizer, const Case& c, Drafter* drafter) {
  const int ctx = c.max_ctx > 0 ? c.max_ctx : static_cast<int>(c.prompt.size()) + c.n_new + 1;
  std::unique_ptr<Sequence> s = make(ctx);
  Sampler sampler(c.sampling);
  GenerationParams params;
  params.max_new_tokens = c.n_new;
  params.stop_strings = c.stop_strings;
  params.spec.drafter = drafter;
  params.spec.draft_max = c.draft_max;
  Outcome o;
  o.result = generate(*s, tokenizer, sampler, c.prompt, params, {});
  o.n_past = s->n_past();
  const auto& toks = o.result.tokens;
  if (static_cast<int>(toks.size()) > o.result.tokens_in_session && s->n_past() < s->max_ctx()) {
    int32_t last = toks[static_cast<size_t>(o.result.tokens_in_session)];
    o.next_logits.resize(static_cast<size_t>(s->model().config().n_vocab));
    s->forward(&last, 1, o.next_logits.data(), false);
  }
  return o;
}

// Runs the case without and with a drafter from make_drafter and expects the same result (logits after
// it bit-equal when exact_logits, else only the tokens and text). Returns the speculative run's stats.
inline GenerationStats expect_lossless(const MakeSequence& make, const Tokenizer& tokenizer, const Case& c,
                                       const MakeDrafter& make_drafter, bool exact_logits = true,
                                       const std::string& what = "") {
  const Outcome plain = generate_case(make, tokenizer, c, nullptr);
  std::unique_ptr<Drafter> drafter = make_drafter();
  const Outcome spec = generate_case(make, tokenizer, c, drafter.get());
  EXPECT_EQ(spec.result.tokens, plain.result.tokens) << what;
  EXPECT_EQ(spec.result.text, plain.result.text) << what;
  EXPECT_EQ(spec.result.stop_reason, plain.result.stop_reason) << what;
  EXPECT_EQ(spec.result.tokens_in_session, plain.result.tokens_in_session) << what;
  EXPECT_EQ(spec.n_past, plain.n_past) << what;
  EXPECT_EQ(spec.result.stats.generated_tokens, plain.result.stats.generated_tokens) << what;
  EXPECT_EQ(spec.result.stats.decode_tokens, plain.result.stats.decode_tokens) << what;
  if (exact_logits) {
    EXPECT_EQ(spec.next_logits, plain.next_logits) << what << ": the state generation left differs";
  }
  EXPECT_EQ(spec.result.stats.drafter, drafter->name()) << what;
  EXPECT_LE(spec.result.stats.accepted_tokens, spec.result.stats.drafted_tokens) << what;
  return spec.result.stats;
}

}  // namespace strata::spec_test
