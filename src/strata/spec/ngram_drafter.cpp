#include "strata/spec/ngram_drafter.h"

#include <algorithm>

#include "strata/base/error.h"

namespace strata {

void validate_ngram_params(const NgramParams& p) {
  if (p.min_n < 1) fail("--spec-ngram-min must be >= 1, got ", p.min_n);
  if (p.max_n < p.min_n) fail("--spec-ngram-max ", p.max_n, " is below --spec-ngram-min ", p.min_n);
  if (p.max_n > NgramParams::kMaxNgram)
    fail("--spec-ngram-max must be <= ", NgramParams::kMaxNgram, ", got ", p.max_n);
}

NgramDrafter::NgramDrafter(NgramParams params) : params_(params) { validate_ngram_params(params_); }

void NgramDrafter::propose(const std::vector<int32_t>& history, int max_tokens, Draft& out) {
  out.clear();
  const int64_t len = static_cast<int64_t>(history.size());
  for (int n = params_.max_n; n >= params_.min_n; --n) {
    if (len <= n) continue;
    const auto suffix = history.end() - n;
    // The most recent earlier occurrence: it starts at j <= len - n - 1, so a token follows it.
    for (int64_t j = len - n - 1; j >= 0; --j) {
      if (!std::equal(suffix, history.end(), history.begin() + j)) continue;
      for (int64_t p = j + n; static_cast<int>(out.tokens.size()) < max_tokens; ++p)
        out.tokens.push_back(p < len ? history[static_cast<size_t>(p)] : out.tokens[static_cast<size_t>(p - len)]);
      return;
    }
  }
}

}  // namespace strata
