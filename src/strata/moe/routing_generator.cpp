#include "strata/moe/routing_generator.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "strata/base/error.h"

namespace strata {
namespace {

uint64_t splitmix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double uniform01(uint64_t& state) { return static_cast<double>(splitmix(state) >> 11) * 0x1.0p-53; }

// Index i with cumulative[i-1] <= u * total < cumulative[i].
int draw(const std::vector<double>& cumulative, uint64_t& rng) {
  const double u = uniform01(rng) * cumulative.back();
  const auto it = std::upper_bound(cumulative.begin(), cumulative.end(), u);
  return static_cast<int>(std::min<std::ptrdiff_t>(it - cumulative.begin(), static_cast<std::ptrdiff_t>(cumulative.size()) - 1));
}

}  // namespace

const std::vector<RoutingSetting>& routing_settings() {
  static const std::vector<RoutingSetting> settings = {
      {"uniform", 48, 128, 8, 0.0, 0.0, 0, 0.0, 0.0, "every expert equally likely, no temporal reuse (the worst case)"},
      {"qwen3-30b-a3b-like", 48, 128, 8, 0.45, 0.21, 24, 40.0, 0.01,
       "Qwen3-30B-A3B: ~70% of picks on the hottest 40% of experts, ~45% repeat at t+1, ~80% within 8 tokens, "
       "median reuse distance 2, LRU at 5/15/30/40/50% residency ~37/74/89/90-95/96% hits"},
      {"laguna-xs2-like", 40, 256, 8, 0.9, 0.1, 96, 2.0, 0.05,
       "Laguna-XS.2 agent traffic: ~93% of picks on the hottest 60% of experts (a calibrated hot set leaves "
       "6.6% cold); 256 experts top-8: ~39 / ~59 distinct experts per layer in 8 / 15 tokens"},
  };
  return settings;
}

std::string routing_setting_names() {
  std::string s;
  for (const auto& r : routing_settings()) s += (s.empty() ? "" : ", ") + r.name;
  return s;
}

const RoutingSetting& routing_setting(const std::string& name) {
  for (const auto& r : routing_settings())
    if (r.name == name) return r;
  fail("routing setting '", name, "' is not known (expected one of: ", routing_setting_names(), ")");
}

RoutingGenerator::RoutingGenerator(const RoutingSetting& setting, int n_layer, int n_expert, int k, uint64_t seed)
    : setting_(setting), n_layer_(n_layer), n_expert_(n_expert), k_(k), seed_(seed) {
  if (n_layer < 1 || n_expert < 1 || k < 1 || k > n_expert)
    fail("routing generator: invalid shape ", n_layer, " layers x ", n_expert, " experts top-", k);
  layers_.resize(static_cast<size_t>(n_layer));
  for (int l = 0; l < n_layer; ++l) {
    Layer& L = layers_[static_cast<size_t>(l)];
    L.rng = seed * 0x100000001b3ull ^ (static_cast<uint64_t>(l) + 1) * 0x9e3779b97f4a7c15ull;
    // Ranks in a random order per layer, so no expert id is hot everywhere.
    std::vector<int> rank(static_cast<size_t>(n_expert));
    for (int e = 0; e < n_expert; ++e) rank[static_cast<size_t>(e)] = e;
    for (int e = n_expert - 1; e > 0; --e)
      std::swap(rank[static_cast<size_t>(e)], rank[static_cast<size_t>(splitmix(L.rng) % static_cast<uint64_t>(e + 1))]);
    L.popularity.resize(static_cast<size_t>(n_expert));
    for (int e = 0; e < n_expert; ++e)
      L.popularity[static_cast<size_t>(e)] = std::pow(static_cast<double>(rank[static_cast<size_t>(e)] + 1), -setting.zipf);
    L.cumulative.resize(static_cast<size_t>(n_expert));
    std::partial_sum(L.popularity.begin(), L.popularity.end(), L.cumulative.begin());
    const int w = std::min(setting.working_set, n_expert);
    while (static_cast<int>(L.working.size()) < w) {
      const int e = draw(L.cumulative, L.rng);
      if (std::find(L.working.begin(), L.working.end(), e) == L.working.end()) L.working.push_back(e);
    }
  }
}

std::string RoutingGenerator::label() const { return cat("generated ", setting_.name, " seed ", seed_); }

void RoutingGenerator::token(Layer& L, int* out) {
  const size_t E = static_cast<size_t>(n_expert_);
  // The context drifts: each working-set member may give way to a fresh draw from the popularity.
  if (!L.working.empty()) {
    std::partial_sum(L.popularity.begin(), L.popularity.end(), L.cumulative.begin());
    for (int& member : L.working) {
      if (uniform01(L.rng) >= setting_.drift) continue;
      for (int tries = 0; tries < 64; ++tries) {
        const int e = draw(L.cumulative, L.rng);
        if (std::find(L.working.begin(), L.working.end(), e) == L.working.end()) {
          member = e;
          break;
        }
      }
    }
  }
  std::vector<double> weight(L.popularity);
  for (int e : L.working) weight[static_cast<size_t>(e)] *= 1.0 + setting_.boost;
  std::partial_sum(weight.begin(), weight.end(), L.cumulative.begin());
  auto taken = [&](int e, int n) { return std::find(out, out + n, e) != out + n; };
  for (int j = 0; j < k_; ++j) {
    int pick = -1;
    if (!L.previous.empty() && uniform01(L.rng) < setting_.repeat) {
      std::vector<int> free;
      for (int e : L.previous)
        if (!taken(e, j)) free.push_back(e);
      if (!free.empty()) pick = free[splitmix(L.rng) % free.size()];
    }
    for (int tries = 0; pick < 0 && tries < 64; ++tries) {
      const int e = draw(L.cumulative, L.rng);
      if (!taken(e, j)) pick = e;
    }
    if (pick < 0) {  // the context is nearly used up by this token: draw from what is left exactly
      std::vector<double> rest(E);
      double acc = 0;
      for (size_t e = 0; e < E; ++e) rest[e] = acc += taken(static_cast<int>(e), j) ? 0.0 : weight[e];
      pick = draw(rest, L.rng);
    }
    out[j] = pick;
  }
  L.previous.assign(out, out + k_);
}

void RoutingGenerator::next(int n_tokens, int* picks) {
  const size_t stride = static_cast<size_t>(n_layer_) * static_cast<size_t>(k_);
  for (int t = 0; t < n_tokens; ++t)
    for (int l = 0; l < n_layer_; ++l)
      token(layers_[static_cast<size_t>(l)], picks + static_cast<size_t>(t) * stride + static_cast<size_t>(l) * k_);
}

RoutingTrace generate_routing_trace(const RoutingSetting& setting, int n_layer, int n_expert, int k, uint64_t seed,
                                    int n_tokens) {
  if (n_tokens < 1) fail("routing generator: --tokens must be >= 1, got ", n_tokens);
  RoutingGenerator g(setting, n_layer, n_expert, k, seed);
  RoutingTrace t;
  t.header.n_layer = n_layer, t.header.n_expert = n_expert, t.header.k = k;
  t.header.source = g.label();
  t.header.check();
  std::vector<int> picks(static_cast<size_t>(n_tokens) * t.token_stride());
  g.next(n_tokens, picks.data());
  t.streams.push_back(RoutingStream{0, std::vector<uint16_t>(picks.begin(), picks.end())});
  return t;
}

RoutingReplaySpec parse_routing_replay(const std::string& spec) {
  RoutingReplaySpec r;
  if (spec.empty()) fail("--routing: empty (expected a trace FILE or generate:NAME[:SEED])");
  const std::string prefix = "generate:";
  if (spec.rfind(prefix, 0) != 0) {
    r.path = spec;
    return r;
  }
  r.generated = true;
  std::string rest = spec.substr(prefix.size());
  const size_t colon = rest.find(':');
  if (colon != std::string::npos) {
    const std::string num = rest.substr(colon + 1);
    char* end = nullptr;
    const unsigned long long seed = std::strtoull(num.c_str(), &end, 10);
    if (num.empty() || *end != '\0' || num[0] == '-')
      fail("--routing '", spec, "': the seed after the second ':' must be a non-negative integer");
    r.seed = seed;
    rest = rest.substr(0, colon);
  }
  try {
    r.name = routing_setting(rest).name;
  } catch (const Error& e) {
    fail("--routing '", spec, "': ", e.what());
  }
  return r;
}

}  // namespace strata
