// Token sampling from logits: greedy, temperature, top-k, top-p, min-p, repetition / presence /
// frequency penalties, logit bias, and a seed that makes a run reproducible on every platform.
//
// Order (as Hugging Face generate applies its processors): logit bias, penalties, then greedy when
// temperature <= 0, else temperature -> top-k -> top-p -> min-p -> draw.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <vector>

namespace strata {

struct SamplerParams {
  float temperature = 1.0f;         // <= 0: greedy (argmax, lowest id on ties); negative is an error
  int32_t top_k = 0;                // 0 = off; keep the k most likely tokens
  float top_p = 1.0f;               // in (0, 1]; 1 = off; keep the smallest set with mass >= top_p
  float min_p = 0.0f;               // in [0, 1]; 0 = off; drop tokens below min_p * p(most likely)
  float repetition_penalty = 1.0f;  // > 0; 1 = off; logits of seen tokens: positive / rp, negative * rp
  float presence_penalty = 0.0f;    // subtracted once from the logit of every token seen
  float frequency_penalty = 0.0f;   // subtracted per occurrence of a token seen
  std::map<int32_t, float> logit_bias;  // added to the logit (-inf bans a token)
  std::optional<uint64_t> seed;     // nullopt: seeded from std::random_device
};

// Throws strata::Error naming the parameter when a value is out of range.
void validate_sampler_params(const SamplerParams& params);

// A distribution over token ids with finite support: weights relative to `total` (unnormalised, so a
// draw walks exactly the sums a plain sample() walks). ids ascending, every weight > 0.
struct TokenDistribution {
  std::vector<int32_t> ids;
  std::vector<double> weights;
  double total = 0;

  double prob(int32_t id) const;  // weight / total; 0 outside the support
  void set_one_hot(int32_t id);
};

// A rule on which tokens may come next (a grammar: grammar/token_mask.h). The sampler asks it to ban
// the tokens it does not allow (their logits become -inf, the others are untouched, so the model's
// relative probabilities among the allowed tokens stay as they were) and tells it the token picked.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  virtual void mask(float* logits, int32_t n_vocab) = 0;
  virtual void accept(int32_t id) = 0;
};

class Sampler {
 public:
  explicit Sampler(SamplerParams params);

  // Picks the next token. `logits` (n_vocab values) is modified in place (constraint, bias and
  // penalties applied). `history`: the tokens the penalties look at (prompt and/or generated, the
  // caller's choice). Throws when a logit_bias id is outside the vocabulary or no token has a finite
  // logit.
  int32_t sample(float* logits, int32_t n_vocab, const std::vector<int32_t>& history);

  const SamplerParams& params() const { return params_; }

  // The distribution sample() draws from on these logits (bias and penalties applied in place, then
  // temperature, top-k, top-p, min-p; one-hot at the arg-max when greedy), for speculative
  // verification. Draws nothing from the seeded stream. Fails while constrained(): a constraint
  // advances with every pick, which a distribution of one position cannot express.
  void distribution(float* logits, int32_t n_vocab, const std::vector<int32_t>& history, TokenDistribution& out);
  // A token drawn from `d` with the seeded stream (walking ids in ascending order, as sample() does); a
  // one-token support returns that token without drawing. Fails on an empty distribution.
  int32_t draw(const TokenDistribution& d);

  // While set, every sample() masks the logits with *constraint first and tells it the pick. The
  // caller owns it. A backend that picks on its device must not do so while constrained().
  void set_constraint(TokenConstraint* constraint) { constraint_ = constraint; }
  bool constrained() const { return constraint_ != nullptr; }
  // Whether the picks read the model's logits as they are (no bias, no penalties, no constraint): a
  // backend may then pick or draw on its device.
  bool plain() const {
    return params_.logit_bias.empty() && params_.repetition_penalty == 1.0f && params_.presence_penalty == 0.0f &&
           params_.frequency_penalty == 0.0f && !constraint_;
  }
  // plain() and greedy: every pick is the logits' arg-max, so a verification may compare drafts with picks.
  bool plain_greedy() const { return plain() && params_.temperature <= 0; }

  // The uniform draw in [0, 1) that sample() takes from the seeded stream for a non-greedy pick, for a
  // backend that picks on its own device (cuda/sample_kernels.h) and keeps the stream's order.
  double draw_uniform() { return uniform(); }

 private:
  double uniform();  // [0, 1) from 53 random bits: the same sequence everywhere for a given seed
  int32_t pick(float* logits, int32_t n_vocab, const std::vector<int32_t>& history);
  // Bias and penalties, then greedy's arg-max (returned) or, when sampling, the kept candidates_
  // with their weights in probs_ and the sum in *total (returns -1).
  int32_t prepare(float* logits, int32_t n_vocab, const std::vector<int32_t>& history, double* total);

  TokenConstraint* constraint_ = nullptr;

  SamplerParams params_;
  std::mt19937_64 rng_;
  struct Candidate {
    float logit;
    int32_t id;
  };
  std::vector<Candidate> candidates_;  // reused between calls
  std::vector<double> probs_;    // by id, valid for the current candidates only
  std::vector<double> weights_;  // by id, for the final draw over many candidates
  std::vector<int> bucket_;      // top-p histogram bucket per candidate
  std::vector<double> hist_;
};

// Greedy choice: the largest logit, lowest id among equals.
int32_t argmax_logit(const float* logits, int32_t n_vocab);

// Bans ids [from, n_vocab): their logits become -inf (padding rows past the tokenizer's vocabulary).
void ban_ids_from(float* logits, int32_t from, int32_t n_vocab);

}  // namespace strata
