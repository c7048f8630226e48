// Sampler property tests. Reference distributions are computed here in float64 from the definitions
// (softmax with temperature, then top-k / top-p / min-p truncation), independently of sampler.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include <omp.h>

#include "strata/base/error.h"
#include "strata/sample/sampler.h"

using namespace strata;

namespace {

std::vector<float> random_logits(int n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// Reference: probabilities after temperature, top-k, top-p, min-p (HF order), in float64.
std::vector<double> reference_distribution(const std::vector<float>& logits, double temp, int top_k, double top_p,
                                           double min_p) {
  const size_t n = logits.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return logits[a] > logits[b]; });
  size_t keep = (top_k > 0 && static_cast<size_t>(top_k) < n) ? static_cast<size_t>(top_k) : n;
  std::vector<double> p(n, 0.0);
  double z = 0;
  for (size_t i = 0; i < keep; ++i) z += std::exp(logits[order[i]] / temp);
  double cum = 0;
  size_t keep_p = keep;
  for (size_t i = 0; i < keep; ++i) {
    cum += std::exp(logits[order[i]] / temp) / z;
    if (cum >= top_p) {
      keep_p = i + 1;
      break;
    }
  }
  const double pmax = std::exp(logits[order[0]] / temp) / z;
  double z2 = 0;
  for (size_t i = 0; i < keep_p; ++i) {
    const double q = std::exp(logits[order[i]] / temp) / z;
    if (q >= min_p * pmax) {
      p[order[i]] = q;
      z2 += q;
    }
  }
  for (auto& q : p) q /= z2;
  return p;
}

// Draws `draws` samples and checks every token's frequency against `expected` within 5 standard
// deviations (binomial), and that tokens with probability 0 never appear.
void check_frequencies(SamplerParams params, const std::vector<float>& logits, const std::vector<double>& expected,
                       int draws) {
  Sampler s(params);
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) {
    std::vector<float> l = logits;
    ++counts[static_cast<size_t>(s.sample(l.data(), static_cast<int32_t>(l.size()), {}))];
  }
  for (size_t t = 0; t < logits.size(); ++t) {
    const double p = expected[t];
    if (p == 0) {
      EXPECT_EQ(counts[t], 0) << "token " << t << " has probability 0";
      continue;
    }
    const double mean = p * draws, sd = std::sqrt(draws * p * (1 - p));
    EXPECT_NEAR(counts[t], mean, 5 * sd + 1) << "token " << t << " p=" << p;
  }
}

}  // namespace

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  SamplerParams p;
  p.temperature = 0;
  Sampler s(p);
  std::vector<float> l = {1, 5, 3, 5, -2};
  EXPECT_EQ(s.sample(l.data(), 5, {}), 1);
  for (uint32_t seed = 0; seed < 50; ++seed) {
    auto v = random_logits(1000, seed);
    const auto best = std::max_element(v.begin(), v.end()) - v.begin();
    EXPECT_EQ(s.sample(v.data(), 1000, {}), best);
  }
}

TEST(Sampler, TemperatureToZeroEqualsGreedy) {
  SamplerParams p;
  p.temperature = 1e-3f;
  p.seed = 7;
  Sampler s(p);
  for (uint32_t seed = 0; seed < 200; ++seed) {
    auto v = random_logits(5000, seed);
    std::vector<float> sorted = v;
    std::sort(sorted.rbegin(), sorted.rend());
    if (sorted[0] - sorted[1] < 0.05f) continue;  // near-ties are legitimately random at T=1e-3
    const auto best = std::max_element(v.begin(), v.end()) - v.begin();
    EXPECT_EQ(s.sample(v.data(), 5000, {}), best) << "seed " << seed;
  }
}

TEST(Sampler, TopKNeverSamplesOutsideTheKBest) {
  SamplerParams p;
  p.top_k = 5;
  p.temperature = 5.0f;  // flat distribution: many tokens would be drawn without top-k
  p.seed = 3;
  Sampler s(p);
  auto v = random_logits(2000, 11);
  std::vector<int> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return v[static_cast<size_t>(a)] > v[static_cast<size_t>(b)]; });
  const std::vector<int> best(order.begin(), order.begin() + 5);
  std::vector<int> seen;
  for (int i = 0; i < 3000; ++i) {
    auto l = v;
    const int t = s.sample(l.data(), 2000, {});
    ASSERT_NE(std::find(best.begin(), best.end(), t), best.end()) << "token " << t << " is not in the top 5";
    seen.push_back(t);
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::unique(seen.begin(), seen.end()) - seen.begin(), 5);  // and all five do occur
}

TEST(Sampler, SeedReproduces) {
  SamplerParams p;
  p.temperature = 1.0f;
  p.top_p = 0.95f;
  p.seed = 1234;
  Sampler a(p), b(p);
  p.seed = 1235;
  Sampler c(p);
  auto v = random_logits(500, 5, 1.0f);
  std::vector<int32_t> ra, rb, rc;
  for (int i = 0; i < 200; ++i) {
    auto l1 = v, l2 = v, l3 = v;
    ra.push_back(a.sample(l1.data(), 500, {}));
    rb.push_back(b.sample(l2.data(), 500, {}));
    rc.push_back(c.sample(l3.data(), 500, {}));
  }
  EXPECT_EQ(ra, rb);
  EXPECT_NE(ra, rc);
}

// The softmax of a large vocabulary runs on the OpenMP team: the same seed gives the same tokens with
// one thread and with several (the probabilities are summed in one fixed order).
TEST(Sampler, LargeVocabularyIsTheSameAtAnyThreadCount) {
  const auto v = random_logits(200000, 9, 3.0f);
  SamplerParams p;
  p.temperature = 0.8f;
  p.top_p = 0.9f;
  p.seed = 77;
  auto draws = [&](int threads) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 40; ++i) {
      auto l = v;
      out.push_back(s.sample(l.data(), static_cast<int32_t>(l.size()), {}));
    }
    omp_set_num_threads(before);
    return out;
  };
  EXPECT_EQ(draws(1), draws(4));
}

TEST(Sampler, FrequenciesMatchTheDistribution) {
  const std::vector<float> logits = {2.0f, 1.5f, 0.3f, 0.0f, -0.5f, -1.0f, -3.0f, 1.0f};
  SamplerParams p;
  p.seed = 99;
  p.temperature = 0.8f;
  check_frequencies(p, logits, reference_distribution(logits, 0.8, 0, 1.0, 0.0), 200000);
  p.top_k = 3;
  check_frequencies(p, logits, reference_distribution(logits, 0.8, 3, 1.0, 0.0), 100000);
  p.top_k = 0;
  p.top_p = 0.7f;
  check_frequencies(p, logits, reference_distribution(logits, 0.8, 0, 0.7, 0.0), 100000);
  p.top_p = 1.0f;
  p.min_p = 0.2f;
  check_frequencies(p, logits, reference_distribution(logits, 0.8, 0, 1.0, 0.2), 100000);
  p.top_k = 6;
  p.top_p = 0.9f;
  p.min_p = 0.1f;
  p.temperature = 1.3f;
  check_frequencies(p, logits, reference_distribution(logits, 1.3, 6, 0.9, 0.1), 100000);
}

TEST(Sampler, TopPOnLargeVocabularyKeepsTheNucleus) {
  auto v = random_logits(150000, 21, 2.0f);
  const auto ref = reference_distribution(v, 1.0, 0, 0.5, 0.0);
  SamplerParams p;
  p.top_p = 0.5f;
  p.seed = 5;
  Sampler s(p);
  for (int i = 0; i < 300; ++i) {
    auto l = v;
    const int32_t t = s.sample(l.data(), 150000, {});
    ASSERT_GT(ref[static_cast<size_t>(t)], 0.0) << "token " << t << " is outside the top-p nucleus";
  }
}

TEST(Sampler, PenaltiesAndBiasChangeLogitsAsDefined) {
  SamplerParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.logit_bias = {{4, 10.0f}};
  Sampler s(p);
  std::vector<float> l = {4.0f, -4.0f, 1.0f, 0.0f, -20.0f};
  const int32_t t = s.sample(l.data(), 5, {0, 0, 1, 2, 0});
  EXPECT_FLOAT_EQ(l[0], 4.0f / 2 - 0.5f - 0.25f * 3);
  EXPECT_FLOAT_EQ(l[1], -4.0f * 2 - 0.5f - 0.25f * 1);
  EXPECT_FLOAT_EQ(l[2], 1.0f / 2 - 0.5f - 0.25f * 1);
  EXPECT_FLOAT_EQ(l[3], 0.0f);
  EXPECT_FLOAT_EQ(l[4], -10.0f);
  EXPECT_EQ(t, 0);  // 0.75 is still the largest
}

TEST(Sampler, BannedTokensAreNeverSampled) {
  SamplerParams p;
  p.logit_bias = {{0, -INFINITY}, {1, -INFINITY}};
  p.seed = 1;
  Sampler s(p);
  for (int i = 0; i < 1000; ++i) {
    std::vector<float> l = {10.0f, 10.0f, 0.0f, 0.1f};
    const int32_t t = s.sample(l.data(), 4, {});
    ASSERT_TRUE(t == 2 || t == 3) << t;
  }
  SamplerParams all;
  all.logit_bias = {{0, -INFINITY}};
  Sampler s2(all);
  std::vector<float> one = {1.0f};
  EXPECT_THROW(s2.sample(one.data(), 1, {}), Error);
}

TEST(Sampler, InvalidParametersFailClearly) {
  auto bad = [](auto mutate) {
    SamplerParams p;
    mutate(p);
    EXPECT_THROW(Sampler{p}, Error);
  };
  bad([](SamplerParams& p) { p.temperature = -0.1f; });
  bad([](SamplerParams& p) { p.temperature = NAN; });
  bad([](SamplerParams& p) { p.top_p = 0.0f; });
  bad([](SamplerParams& p) { p.top_p = 1.5f; });
  bad([](SamplerParams& p) { p.min_p = -0.1f; });
  bad([](SamplerParams& p) { p.top_k = -1; });
  bad([](SamplerParams& p) { p.repetition_penalty = 0.0f; });
  bad([](SamplerParams& p) { p.logit_bias = {{-3, 1.0f}}; });
  try {
    SamplerParams p;
    p.top_p = 2.0f;
    Sampler s(p);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos);
  }
  SamplerParams p;
  p.logit_bias = {{10, 1.0f}};
  Sampler s(p);
  std::vector<float> l(5, 0.0f);
  EXPECT_THROW(s.sample(l.data(), 5, {}), Error);  // bias id outside the vocabulary
}
