// Prompt lookup: drafts by copying. The last n tokens of the history (n from max_n down to min_n, the
// longest that occurred before) are looked up among the earlier tokens; the tokens that followed their
// most recent earlier occurrence are proposed (with branches > 1, those of several occurrences, as a
// token tree). Deterministic (no model, q one-hot). Pays off where the
// output repeats its input: code edits, quoting, extraction, repeated structure.
#pragma once

#include "strata/engine/drafter.h"

namespace strata {

struct NgramParams {
  int min_n = 2;  // >= 1; single-token matches are frequent and mostly wrong in ordinary text
  int max_n = 4;  // >= min_n, <= kMaxNgram
  // > 1: the continuations of up to this many earlier occurrences (longest n first, then most recent),
  // merged into a token tree, so a lookup with several candidate continuations drafts them all.
  int branches = 1;  // 1..kMaxBranches
  static constexpr int kMaxNgram = 64;
  static constexpr int kMaxBranches = 16;
};
// Throws strata::Error naming the flag when a value is out of range.
void validate_ngram_params(const NgramParams& p);

class NgramDrafter final : public Drafter {
 public:
  explicit NgramDrafter(NgramParams params);
  std::string name() const override { return "ngram"; }
  // A continuation that runs into the end of the history goes on copying the proposal itself, so a
  // repeating pattern is proposed as far as max_tokens reaches.
  void propose(const std::vector<int32_t>& history, int max_tokens, Draft& out) override;

 private:
  NgramParams params_;
};

}  // namespace strata
