#include "strata/moe/routing_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>

#include "strata/base/error.h"

namespace strata {
namespace {

constexpr double kCoveragePercents[] = {25, 40, 50, 60, 75};
constexpr int kReuseWithin[] = {1, 2, 4, 8, 16, 64};
constexpr int kLruSlots[] = {8, 16, 32, 64};
constexpr double kLruPercents[] = {5, 15, 30, 40, 50, 60};
constexpr int kWindows[] = {8, 16};

int slots_for_percent(double percent, int n_expert) {
  return std::max(1, static_cast<int>(std::lround(percent / 100.0 * n_expert)));
}

}  // namespace

RoutingStats routing_stats(const RoutingTrace& trace) {
  const RoutingTraceHeader& h = trace.header;
  RoutingStats s;
  s.n_layer = h.n_layer, s.n_expert = h.n_expert, s.k = h.k;
  s.tokens = trace.n_tokens();
  s.streams = trace.streams.size();
  s.source = h.source, s.fingerprint = h.fingerprint;
  if (s.tokens == 0) fail("routing-stats: the trace holds no tokens");
  const size_t E = static_cast<size_t>(h.n_expert), K = static_cast<size_t>(h.k);
  const size_t stride = trace.token_stride();
  const double picks_per_layer = static_cast<double>(s.tokens) * h.k;

  std::vector<double> coverage(std::size(kCoveragePercents)), within(std::size(kReuseWithin));
  std::vector<double> lru_pct(std::size(kLruPercents)), lru_slots(std::size(kLruSlots));
  std::vector<double> distinct(std::size(kWindows));
  std::vector<uint64_t> window_count(std::size(kWindows));
  // Reuse distances over all layers, for the median; index 0 holds first picks (infinite).
  std::vector<uint64_t> distance_hist;

  for (int l = 0; l < h.n_layer; ++l) {
    std::vector<uint64_t> counts(E, 0);
    std::vector<int> order;  // most recently picked first (the LRU stack), kept across streams
    std::vector<uint64_t> lru_hits_slots(std::size(kLruSlots)), lru_hits_pct(std::size(kLruPercents));
    std::vector<int> depth(K);
    for (const RoutingStream& st : trace.streams) {
      const size_t n = st.picks.size() / stride;
      std::vector<int64_t> last(E, -1);
      for (size_t t = 0; t < n; ++t) {
        const uint16_t* ids = st.picks.data() + t * stride + static_cast<size_t>(l) * K;
        for (size_t j = 0; j < K; ++j) {
          const int e = ids[j];
          ++counts[static_cast<size_t>(e)];
          const size_t d = last[static_cast<size_t>(e)] < 0 ? 0 : t - static_cast<size_t>(last[static_cast<size_t>(e)]);
          if (distance_hist.size() <= d) distance_hist.resize(d + 1, 0);
          ++distance_hist[d];
          for (size_t i = 0; i < std::size(kReuseWithin); ++i)
            if (d > 0 && d <= static_cast<size_t>(kReuseWithin[i])) within[i] += 1;
          last[static_cast<size_t>(e)] = static_cast<int64_t>(t);
          // The stack depth before this token's picks move up (a cache looks all k up at once).
          const auto it = std::find(order.begin(), order.end(), e);
          depth[j] = it == order.end() ? std::numeric_limits<int>::max() : static_cast<int>(it - order.begin());
        }
        for (size_t j = 0; j < K; ++j) {
          for (size_t i = 0; i < std::size(kLruSlots); ++i) lru_hits_slots[i] += depth[j] < kLruSlots[i];
          for (size_t i = 0; i < std::size(kLruPercents); ++i)
            lru_hits_pct[i] += depth[j] < slots_for_percent(kLruPercents[i], h.n_expert);
        }
        for (size_t j = 0; j < K; ++j) {
          const int e = ids[j];
          const auto it = std::find(order.begin(), order.end(), e);
          if (it != order.end()) order.erase(it);
          order.insert(order.begin(), e);
        }
      }
      for (size_t w = 0; w < std::size(kWindows); ++w) {
        const size_t W = static_cast<size_t>(kWindows[w]);
        for (size_t t0 = 0; t0 + W <= n; t0 += W) {
          std::vector<char> seen(E, 0);
          int d = 0;
          for (size_t t = t0; t < t0 + W; ++t)
            for (size_t j = 0; j < K; ++j) {
              const uint16_t e = st.picks[t * stride + static_cast<size_t>(l) * K + j];
              d += !seen[e];
              seen[e] = 1;
            }
          distinct[w] += d;
          ++window_count[w];
        }
      }
    }
    for (size_t i = 0; i < std::size(kLruSlots); ++i) lru_slots[i] += static_cast<double>(lru_hits_slots[i]) / picks_per_layer;
    for (size_t i = 0; i < std::size(kLruPercents); ++i) lru_pct[i] += static_cast<double>(lru_hits_pct[i]) / picks_per_layer;
    std::sort(counts.begin(), counts.end(), std::greater<>());
    for (size_t i = 0; i < std::size(kCoveragePercents); ++i) {
      const int top = slots_for_percent(kCoveragePercents[i], h.n_expert);
      uint64_t hit = 0;
      for (int e = 0; e < top; ++e) hit += counts[static_cast<size_t>(e)];
      coverage[i] += static_cast<double>(hit) / picks_per_layer;
    }
  }
  const double L = h.n_layer;
  for (size_t i = 0; i < std::size(kCoveragePercents); ++i) s.coverage.push_back({kCoveragePercents[i], coverage[i] / L});
  for (size_t i = 0; i < std::size(kReuseWithin); ++i)
    s.reuse_within.push_back({kReuseWithin[i], within[i] / (picks_per_layer * L)});
  for (size_t i = 0; i < std::size(kLruSlots); ++i) s.lru_slots.push_back({kLruSlots[i], lru_slots[i] / L});
  for (size_t i = 0; i < std::size(kLruPercents); ++i) s.lru_percent.push_back({kLruPercents[i], lru_pct[i] / L});
  for (size_t w = 0; w < std::size(kWindows); ++w)
    if (window_count[w] > 0) s.distinct.push_back({kWindows[w], distinct[w] / static_cast<double>(window_count[w])});
  // Median: the smallest d with at least half the picks at distance <= d (first picks are infinite).
  const double half = picks_per_layer * L / 2.0;
  double acc = 0;
  s.reuse_median = -1;
  for (size_t d = 1; d < distance_hist.size(); ++d) {
    acc += static_cast<double>(distance_hist[d]);
    if (acc >= half) {
      s.reuse_median = static_cast<double>(d);
      break;
    }
  }
  return s;
}

std::string format_routing_stats(const RoutingStats& s) {
  std::string out;
  char buf[256];
  auto line = [&](const char* fmt, auto... args) {
    std::snprintf(buf, sizeof buf, fmt, args...);
    out += buf;
  };
  line("routing: %s%s%s\n", s.source.empty() ? "(unnamed)" : s.source.c_str(), s.fingerprint.empty() ? "" : ", model ",
       s.fingerprint.c_str());
  line("shape: %d layers x %d experts, top-%d; %llu tokens in %zu stream(s); every figure averaged over layers\n",
       s.n_layer, s.n_expert, s.k, static_cast<unsigned long long>(s.tokens), s.streams);
  out += "static coverage (share of picks on the most-picked experts of each layer):";
  for (const auto& [p, v] : s.coverage) line(" top %g%%: %.1f%%;", p, 100 * v);
  out.back() = '\n';
  out += "reuse (share of picks whose expert the layer picked within d tokens):";
  for (const auto& [d, v] : s.reuse_within) line(" <=%d: %.1f%%;", d, 100 * v);
  out.back() = '\n';
  if (s.reuse_median > 0)
    line("median reuse distance: %g tokens\n", s.reuse_median);
  else
    out += "median reuse distance: more than half the picks are first picks\n";
  out += "LRU hit rate per layer cache:";
  for (const auto& [n, v] : s.lru_slots) line(" %d slots: %.1f%%;", n, 100 * v);
  out.back() = '\n';
  out += "LRU hit rate by residency (slots = % of experts):";
  for (const auto& [p, v] : s.lru_percent) line(" %g%%: %.1f%% (%.2f misses/token);", p, 100 * v, (1 - v) * s.k);
  out.back() = '\n';
  if (!s.distinct.empty()) {
    out += "distinct experts per layer in a window:";
    for (const auto& [w, v] : s.distinct) line(" %d tokens: %.1f;", w, v);
    out.back() = '\n';
  }
  return out;
}

std::string routing_stats_json(const RoutingStats& s) {
  nlohmann::json j;
  j["source"] = s.source;
  j["fingerprint"] = s.fingerprint;
  j["n_layer"] = s.n_layer, j["n_expert"] = s.n_expert, j["k"] = s.k;
  j["tokens"] = s.tokens, j["streams"] = s.streams;
  for (const auto& [p, v] : s.coverage) j["static_coverage"].push_back({{"percent", p}, {"share", v}});
  for (const auto& [d, v] : s.reuse_within) j["reuse_within"].push_back({{"tokens", d}, {"share", v}});
  j["reuse_median"] = s.reuse_median > 0 ? nlohmann::json(s.reuse_median) : nlohmann::json(nullptr);
  for (const auto& [n, v] : s.lru_slots) j["lru_slots"].push_back({{"slots", n}, {"hit_rate", v}});
  for (const auto& [p, v] : s.lru_percent) j["lru_percent"].push_back({{"percent", p}, {"hit_rate", v}});
  for (const auto& [w, v] : s.distinct) j["distinct"].push_back({{"window", w}, {"experts", v}});
  return j.dump(2);
}

double stat_coverage(const RoutingStats& s, double percent) {
  for (const auto& [p, v] : s.coverage)
    if (p == percent) return v;
  fail("routing-stats: no coverage figure at ", percent, "%");
}

double stat_reuse_within(const RoutingStats& s, int d) {
  for (const auto& [x, v] : s.reuse_within)
    if (x == d) return v;
  fail("routing-stats: no reuse figure within ", d, " tokens");
}

double stat_lru_percent(const RoutingStats& s, double percent) {
  for (const auto& [p, v] : s.lru_percent)
    if (p == percent) return v;
  fail("routing-stats: no LRU figure at ", percent, "%");
}

}  // namespace strata
