#include "strata/sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "strata/base/error.h"

namespace strata {

namespace {
// Candidates from which the softmax runs on the OpenMP team (below, a thread start costs more).
constexpr int64_t kParallelCandidates = 16384;
}  // namespace

void validate_sampler_params(const SamplerParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0) {
    fail("sampler: temperature must be a finite value >= 0 (0 = greedy), got ", p.temperature);
  }
  if (p.top_k < 0) fail("sampler: top_k must be >= 0 (0 = off), got ", p.top_k);
  if (!(p.top_p > 0 && p.top_p <= 1)) fail("sampler: top_p must be in (0, 1], got ", p.top_p);
  if (!(p.min_p >= 0 && p.min_p <= 1)) fail("sampler: min_p must be in [0, 1], got ", p.min_p);
  if (!std::isfinite(p.repetition_penalty) || p.repetition_penalty <= 0) {
    fail("sampler: repetition_penalty must be > 0 (1 = off), got ", p.repetition_penalty);
  }
  if (!std::isfinite(p.presence_penalty)) fail("sampler: presence_penalty must be finite");
  if (!std::isfinite(p.frequency_penalty)) fail("sampler: frequency_penalty must be finite");
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0) fail("sampler: logit_bias names negative token id ", id);
    if (std::isnan(bias) || bias == INFINITY) fail("sampler: logit_bias for token ", id, " must be a number or -inf");
  }
}

int32_t argmax_logit(const float* logits, int32_t n_vocab) {
  int32_t best = -1;
  float best_v = -INFINITY;
  for (int32_t i = 0; i < n_vocab; ++i) {
    if (logits[i] > best_v) {  // strict: the first (lowest) id wins ties
      best_v = logits[i];
      best = i;
    }
  }
  if (best < 0) fail("sampler: no token has a finite logit (all banned or NaN)");
  return best;
}

void ban_ids_from(float* logits, int32_t from, int32_t n_vocab) {
  for (int32_t id = from; id < n_vocab; ++id) logits[id] = -INFINITY;
}

Sampler::Sampler(SamplerParams params) : params_(std::move(params)) {
  validate_sampler_params(params_);
  rng_.seed(params_.seed ? *params_.seed : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}());
}

double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0); }

int32_t Sampler::sample(float* logits, int32_t n_vocab, const std::vector<int32_t>& history) {
  if (n_vocab <= 0) fail("sampler: empty vocabulary");
  if (!constraint_) return pick(logits, n_vocab, history);
  constraint_->mask(logits, n_vocab);
  const int32_t id = pick(logits, n_vocab, history);
  constraint_->accept(id);
  return id;
}

double TokenDistribution::prob(int32_t id) const {
  const auto it = std::lower_bound(ids.begin(), ids.end(), id);
  if (it == ids.end() || *it != id || total <= 0) return 0.0;
  return weights[static_cast<size_t>(it - ids.begin())] / total;
}

void TokenDistribution::set_one_hot(int32_t id) {
  ids.assign(1, id);
  weights.assign(1, 1.0);
  total = 1.0;
}

void Sampler::distribution(float* logits, int32_t n_vocab, const std::vector<int32_t>& history,
                           TokenDistribution& out) {
  if (n_vocab <= 0) fail("sampler: empty vocabulary");
  if (constraint_) fail("sampler: no per-position distribution under a token constraint");
  double total = 0;
  const int32_t greedy = prepare(logits, n_vocab, history, &total);
  if (greedy >= 0) {
    out.set_one_hot(greedy);
    return;
  }
  out.ids.clear();
  out.weights.clear();
  out.total = 0;
  // Summed in id order, as the draw walks them.
  auto add = [&out](int32_t id, double w) {
    if (w <= 0) return;
    out.ids.push_back(id);
    out.weights.push_back(w);
    out.total += w;
  };
  if (candidates_.size() <= 4096) {
    std::sort(candidates_.begin(), candidates_.end(), [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
    for (const Candidate& c : candidates_) add(c.id, probs_[c.id]);
  } else {  // many candidates: walk the vocabulary in id order instead of sorting them
    weights_.assign(static_cast<size_t>(n_vocab), 0.0);
    for (const Candidate& c : candidates_) weights_[c.id] = probs_[c.id];
    for (int32_t t = 0; t < n_vocab; ++t) add(t, weights_[t]);
  }
  if (out.ids.empty()) fail("sampler: no token has a finite logit (all banned or NaN)");
}

int32_t Sampler::draw(const TokenDistribution& d) {
  if (d.ids.empty() || d.ids.size() != d.weights.size()) fail("sampler: draw from an empty distribution");
  if (d.ids.size() == 1) return d.ids[0];
  const double u = uniform() * d.total;
  double acc = 0;
  for (size_t i = 0; i < d.ids.size(); ++i) {
    acc += d.weights[i];
    if (u < acc) return d.ids[i];
  }
  return d.ids.back();  // u landed on the rounding slack at the very end
}

int32_t Sampler::pick(float* logits, int32_t n_vocab, const std::vector<int32_t>& history) {
  double total = 0;
  const int32_t greedy = prepare(logits, n_vocab, history, &total);
  if (greedy >= 0) return greedy;
  const size_t n = candidates_.size();

  // Draw: walk the candidates in a fixed order (by id) so the result depends only on the seed.
  const double u = uniform() * total;
  double acc = 0;
  if (n <= 4096) {
    std::sort(candidates_.begin(), candidates_.end(), [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
    for (size_t i = 0; i < n; ++i) {
      acc += probs_[candidates_[i].id];
      if (u < acc) return candidates_[i].id;
    }
    return candidates_[n - 1].id;
  }
  // Many candidates: walk the whole vocabulary in id order instead of sorting them.
  weights_.assign(static_cast<size_t>(n_vocab), 0.0);
  for (size_t i = 0; i < n; ++i) weights_[candidates_[i].id] = probs_[candidates_[i].id];
  int32_t last = -1;
  for (int32_t t = 0; t < n_vocab; ++t) {
    if (weights_[t] == 0) continue;
    acc += weights_[t];
    last = t;
    if (u < acc) return t;
  }
  return last;  // u landed on the rounding slack at the very end
}

int32_t Sampler::prepare(float* logits, int32_t n_vocab, const std::vector<int32_t>& history, double* total_out) {
  for (const auto& [id, bias] : params_.logit_bias) {
    if (id >= n_vocab) fail("sampler: logit_bias names token ", id, " outside the vocabulary of ", n_vocab);
    logits[id] += bias;
  }

  const SamplerParams& p = params_;
  if (p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int32_t> counts;
    for (int32_t t : history) {
      if (t < 0 || t >= n_vocab) fail("sampler: history token ", t, " is outside the vocabulary of ", n_vocab);
      ++counts[t];
    }
    for (const auto& [t, c] : counts) {
      float& l = logits[t];
      if (p.repetition_penalty != 1.0f) l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
      l -= p.presence_penalty + p.frequency_penalty * static_cast<float>(c);
    }
  }

  if (p.temperature <= 0) return argmax_logit(logits, n_vocab);

  // Candidates: every token with a finite logit. Order: larger logit first, lower id among equals.
  candidates_.clear();
  for (int32_t i = 0; i < n_vocab; ++i) {
    if (std::isfinite(logits[i])) candidates_.push_back({logits[i], i});
  }
  if (candidates_.empty()) fail("sampler: no token has a finite logit (all banned or NaN)");
  auto better = [](const Candidate& a, const Candidate& b) { return a.logit != b.logit ? a.logit > b.logit : a.id < b.id; };

  size_t n = candidates_.size();
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) {
    std::nth_element(candidates_.begin(), candidates_.begin() + p.top_k, candidates_.end(), better);
    n = static_cast<size_t>(p.top_k);
    candidates_.resize(n);
  }

  // Softmax with temperature, in double, relative to the largest logit.
  float max_l = -INFINITY;
  for (size_t i = 0; i < n; ++i) max_l = std::max(max_l, candidates_[i].logit);
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  probs_.resize(n_vocab > 0 ? static_cast<size_t>(n_vocab) : 0);
  // The exponentials are independent: computed in parallel over a large vocabulary (they are most of a
  // sampled token's cost at 248k candidates: docs/PERF.md). The sum stays sequential in candidate
  // order, so every result is bit-identical at any thread count.
  const int64_t n_cand = static_cast<int64_t>(n);
#pragma omp parallel for schedule(static) if (n_cand >= kParallelCandidates)
  for (int64_t i = 0; i < n_cand; ++i) {
    const Candidate& c = candidates_[static_cast<size_t>(i)];
    probs_[c.id] = std::exp((static_cast<double>(c.logit) - max_l) * inv_t);
  }
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += probs_[candidates_[i].id];

  if (p.top_p < 1.0f) {
    // The nucleus is the m best tokens, m the smallest count whose mass reaches top_p. Without
    // sorting the vocabulary: a histogram of mass by distance from the best logit (buckets are
    // monotone in the logit) finds the bucket where the mass crosses top_p; only that bucket's
    // tokens are sorted to place the exact boundary.
    constexpr int kBuckets = 2048;
    constexpr double kRangeNats = 40.0;  // beyond this everything shares the last bucket
    const double scale = kBuckets / kRangeNats;
    const double target = static_cast<double>(p.top_p) * total;
    bucket_.resize(n);
    hist_.assign(kBuckets + 1, 0.0);
    for (size_t i = 0; i < n; ++i) {
      const double d = (static_cast<double>(max_l) - candidates_[i].logit) * inv_t * scale;
      const int b = d >= kBuckets ? kBuckets : static_cast<int>(d);
      bucket_[i] = b;
      hist_[static_cast<size_t>(b)] += probs_[candidates_[i].id];
    }
    int boundary = kBuckets;
    double acc = 0;
    for (int b = 0; b <= kBuckets; ++b) {
      if (acc + hist_[static_cast<size_t>(b)] >= target) {
        boundary = b;
        break;
      }
      acc += hist_[static_cast<size_t>(b)];
    }
    std::vector<Candidate> edge;
    size_t w = 0;
    for (size_t i = 0; i < n; ++i) {
      if (bucket_[i] < boundary) candidates_[w++] = candidates_[i];
      else if (bucket_[i] == boundary) edge.push_back(candidates_[i]);
    }
    std::sort(edge.begin(), edge.end(), better);
    for (const Candidate& c : edge) {
      candidates_[w++] = c;
      acc += probs_[c.id];
      if (acc >= target) break;
    }
    n = w;
    candidates_.resize(n);
    total = 0;
    for (size_t i = 0; i < n; ++i) total += probs_[candidates_[i].id];
  }

  if (p.min_p > 0.0f) {
    // probs_ are relative to the most likely token (which has exactly 1), so the threshold is min_p.
    const double threshold = static_cast<double>(p.min_p);
    size_t w = 0;
    total = 0;
    for (size_t i = 0; i < n; ++i) {
      const int32_t t = candidates_[i].id;
      if (probs_[t] >= threshold) {
        candidates_[w++] = candidates_[i];
        total += probs_[t];
      }
    }
    n = w;
    candidates_.resize(n);
  }

  *total_out = total;
  return -1;
}

}  // namespace strata
