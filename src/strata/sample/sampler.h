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

class Sampler {
 public:
  explicit Sampler(SamplerParams params);

  // Picks the next token. `logits` (n_vocab values) is modified in place (bias and penalties applied).
  // `history`: the tokens the penalties look at (prompt and/or generated, the caller's choice).
  // Throws when a logit_bias id is outside the vocabulary or no token has a finite logit.
  int32_t sample(float* logits, int32_t n_vocab, const std::vector<int32_t>& history);

  const SamplerParams& params() const { return params_; }

  // The uniform draw in [0, 1) that sample() takes from the seeded stream for a non-greedy pick, for a
  // backend that picks on its own device (cuda/sample_kernels.h) and keeps the stream's order.
  double draw_uniform() { return uniform(); }

 private:
  double uniform();  // [0, 1) from 53 random bits: the same sequence everywhere for a given seed

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
