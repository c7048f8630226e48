#include "strata/spec/ddtree.h"

#include <algorithm>
#include <queue>
#include <unordered_set>

#include "strata/base/error.h"

namespace strata {

namespace {

void check_positions(const std::vector<PositionCandidates>& positions) {
  for (size_t d = 0; d < positions.size(); ++d) {
    const PositionCandidates& p = positions[d];
    if (p.tokens.size() != p.probs.size())
      fail("draft tree: position ", d, " has ", p.tokens.size(), " tokens but ", p.probs.size(), " probabilities");
    std::unordered_set<int32_t> seen;
    for (size_t r = 0; r < p.tokens.size(); ++r) {
      const float q = p.probs[r];
      if (!(q >= 0.0f && q <= 1.0f)) fail("draft tree: position ", d, " rank ", r, " has probability ", q);
      if (r > 0 && q > p.probs[r - 1]) fail("draft tree: position ", d, " is not sorted by probability at rank ", r);
      if (!seen.insert(p.tokens[r]).second) fail("draft tree: position ", d, " offers token ", p.tokens[r], " twice");
    }
  }
}

// A candidate node: the path of its parent plus rank `rank` at depth `depth`.
struct Candidate {
  double score;    // the path's product of probabilities
  uint64_t order;  // when it was offered: the earlier first among equal scores
  int parent;      // index in the output, -1 at depth 0
  int depth, rank;
};
struct Worse {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.score != b.score ? a.score < b.score : a.order > b.order;
  }
};

}  // namespace

void build_ddtree(const std::vector<PositionCandidates>& positions, int budget, Draft& out) {
  out.clear();
  check_positions(positions);
  if (budget <= 0 || positions.empty() || positions[0].tokens.empty()) return;
  std::priority_queue<Candidate, std::vector<Candidate>, Worse> heap;
  uint64_t offered = 0;
  std::vector<double> node_score;
  heap.push(Candidate{positions[0].probs[0], offered++, -1, 0, 0});
  while (!heap.empty() && static_cast<int>(out.tokens.size()) < budget) {
    const Candidate c = heap.top();
    heap.pop();
    const PositionCandidates& at = positions[static_cast<size_t>(c.depth)];
    const int node = static_cast<int>(out.tokens.size());
    out.tokens.push_back(at.tokens[static_cast<size_t>(c.rank)]);
    out.parents.push_back(c.parent);
    node_score.push_back(c.score);
    // Its next sibling: the same parent with this position's next token.
    if (static_cast<size_t>(c.rank) + 1 < at.tokens.size()) {
      const double parent_score = c.parent < 0 ? 1.0 : node_score[static_cast<size_t>(c.parent)];
      heap.push(Candidate{parent_score * at.probs[static_cast<size_t>(c.rank) + 1], offered++, c.parent, c.depth,
                          c.rank + 1});
    }
    // Its first child: the next position's best token below it.
    const size_t next = static_cast<size_t>(c.depth) + 1;
    if (next < positions.size() && !positions[next].tokens.empty())
      heap.push(Candidate{c.score * positions[next].probs[0], offered++, node, c.depth + 1, 0});
  }
}

}  // namespace strata
