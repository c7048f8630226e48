// build_ddtree (spec/ddtree.h) against a brute-force reference: every path of random per-position
// candidates scored by the product of its probabilities, the `budget` best kept (any of those tied at
// the cut). The tree holds exactly
// those paths, parents before children, nodes in non-increasing score, each node's children in
// decreasing probability with distinct tokens; bad candidates are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "strata/base/error.h"
#include "strata/spec/ddtree.h"

namespace {

using strata::PositionCandidates;

std::vector<PositionCandidates> random_positions(std::mt19937& rng, const std::vector<int>& ks) {
  std::vector<PositionCandidates> pos(ks.size());
  std::uniform_real_distribution<float> u(0.01f, 1.0f);
  for (size_t d = 0; d < ks.size(); ++d) {
    std::vector<float> p(static_cast<size_t>(ks[d]));
    float sum = 0.0f;
    for (float& v : p) sum += (v = u(rng));
    for (float& v : p) v /= sum;
    std::sort(p.begin(), p.end(), std::greater<float>());
    pos[d].probs = p;
    for (int r = 0; r < ks[d]; ++r) pos[d].tokens.push_back(static_cast<int32_t>(1000 * d + 7 * r + 3));
  }
  return pos;
}

// Every path (as its ranks per depth) with its score, best first.
std::vector<std::pair<double, std::vector<int>>> all_paths(const std::vector<PositionCandidates>& pos) {
  std::vector<std::pair<double, std::vector<int>>> out;
  std::vector<std::pair<double, std::vector<int>>> level = {{1.0, {}}};
  for (const PositionCandidates& p : pos) {
    std::vector<std::pair<double, std::vector<int>>> next;
    for (const auto& [score, ranks] : level)
      for (size_t r = 0; r < p.tokens.size(); ++r) {
        std::vector<int> rr = ranks;
        rr.push_back(static_cast<int>(r));
        next.emplace_back(score * p.probs[r], rr);
      }
    out.insert(out.end(), next.begin(), next.end());
    level = next;
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

// The ranks of node t's path in the built tree (tokens identify ranks: distinct per position).
std::vector<int> ranks_of(const strata::Draft& d, const std::vector<PositionCandidates>& pos, int t) {
  std::vector<int32_t> toks;
  for (int u = t; u >= 0; u = d.parents[static_cast<size_t>(u)])
    toks.insert(toks.begin(), d.tokens[static_cast<size_t>(u)]);
  std::vector<int> ranks;
  for (size_t depth = 0; depth < toks.size(); ++depth) {
    const auto& tk = pos[depth].tokens;
    ranks.push_back(static_cast<int>(std::find(tk.begin(), tk.end(), toks[depth]) - tk.begin()));
  }
  return ranks;
}

double score_of(const std::vector<int>& ranks, const std::vector<PositionCandidates>& pos) {
  double s = 1.0;
  for (size_t d = 0; d < ranks.size(); ++d) s *= pos[d].probs[static_cast<size_t>(ranks[d])];
  return s;
}

TEST(DdTree, HoldsTheBestPathsOfTheBudget) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<int> ks;
    const int depth = 1 + trial % 5;
    for (int d = 0; d < depth; ++d) ks.push_back(1 + static_cast<int>(rng() % 4));
    const auto pos = random_positions(rng, ks);
    const auto ref = all_paths(pos);
    for (int budget = 0; budget <= static_cast<int>(ref.size()) + 2; ++budget) {
      strata::Draft d;
      strata::build_ddtree(pos, budget, d);
      const size_t n = std::min(static_cast<size_t>(budget), ref.size());
      ASSERT_EQ(d.tokens.size(), n) << "trial " << trial << " budget " << budget;
      ASSERT_EQ(d.parents.size(), n);
      EXPECT_TRUE(d.q.empty());
      std::map<std::vector<int>, int> got;
      double last = 2.0;
      for (int t = 0; t < static_cast<int>(n); ++t) {
        ASSERT_LT(d.parents[static_cast<size_t>(t)], t);
        const std::vector<int> ranks = ranks_of(d, pos, t);
        const double s = score_of(ranks, pos);
        EXPECT_LE(s, last) << "node " << t << " scores more than the node before it";
        last = s;
        EXPECT_TRUE(got.emplace(ranks, t).second) << "a path twice";
        // Siblings: decreasing probability, distinct tokens.
        for (int u = 0; u < t; ++u) {
          if (d.parents[static_cast<size_t>(u)] == d.parents[static_cast<size_t>(t)]) {
            EXPECT_NE(d.tokens[static_cast<size_t>(u)], d.tokens[static_cast<size_t>(t)]);
            EXPECT_LT(ranks_of(d, pos, u).back(), ranks.back());
          }
        }
      }
      // The n best paths: every path scoring above the n-th best is in, none scoring below it (paths
      // tied at the cut may go either way: a position with one candidate gives a child its parent's score).
      if (n == 0) continue;
      const double cut = ref[n - 1].first;
      for (const auto& [score, ranks] : ref) {
        if (score > cut) {
          EXPECT_EQ(got.count(ranks), 1u) << "trial " << trial << " budget " << budget;
        }
      }
      for (const auto& [ranks, t] : got) EXPECT_GE(score_of(ranks, pos), cut) << "node " << t;
    }
  }
}

TEST(DdTree, StopsWhereAPositionHasNoCandidates) {
  std::vector<PositionCandidates> pos(3);
  pos[0] = {{5, 6}, {0.7f, 0.3f}};
  pos[2] = {{9}, {1.0f}};  // unreachable: position 1 offers nothing
  strata::Draft d;
  strata::build_ddtree(pos, 10, d);
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(d.parents, (std::vector<int>{-1, -1}));
  strata::build_ddtree({}, 10, d);
  EXPECT_TRUE(d.tokens.empty());
}

TEST(DdTree, RefusesBadCandidates) {
  strata::Draft d;
  const std::vector<std::vector<PositionCandidates>> bad = {
      {{{1, 2}, {0.5f}}},               // sizes differ
      {{{1, 2}, {0.3f, 0.6f}}},         // not sorted
      {{{1, 1}, {0.6f, 0.3f}}},         // a token twice
      {{{1}, {1.5f}}},                  // not a probability
      {{{1}, {0.5f}}, {{2}, {-0.1f}}},  // negative
  };
  for (size_t i = 0; i < bad.size(); ++i)
    EXPECT_THROW(strata::build_ddtree(bad[i], 4, d), strata::Error) << "case " << i;
}

}  // namespace
