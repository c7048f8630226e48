#include "strata/engine/token_tree.h"

#include <algorithm>

#include "strata/base/error.h"

namespace strata {

TokenTree TokenTree::chain(int n) {
  TokenTree t;
  t.parent_.resize(static_cast<size_t>(n));
  t.depth_.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t.parent_[i] = i - 1, t.depth_[i] = i;
  return t;
}

TokenTree TokenTree::from_parents(const int* parents, int n) {
  if (!parents) return chain(n);
  TokenTree t;
  t.parent_.assign(parents, parents + n);
  t.depth_.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const int p = parents[i];
    if (p < -1 || p >= i) fail("token tree: parent of token ", i, " is ", p, " (expected -1 or an earlier token)");
    t.depth_[i] = p < 0 ? 0 : t.depth_[p] + 1;
    if (p != i - 1) t.chain_ = false;
  }
  return t;
}

std::vector<int> TokenTree::path_to(int t) const {
  std::vector<int> path;
  for (int i = t; i >= 0; i = parent_[static_cast<size_t>(i)]) path.push_back(i);
  std::reverse(path.begin(), path.end());
  return path;
}

void TokenTree::check_path(const int* path, int m) const {
  if (m < 0) fail("keep: negative path length ", m);
  for (int j = 0; j < m; ++j) {
    const int t = path[j];
    if (t < 0 || t >= size()) fail("keep: path entry ", j, " is token ", t, ", outside the ", size(), " pending tokens");
    const int want = j == 0 ? -1 : path[j - 1];
    if (parent_[static_cast<size_t>(t)] != want)
      fail("keep: path entry ", j, " (token ", t, ") is not a child of ",
           j == 0 ? std::string("the kept tokens") : cat("token ", want));
  }
}

}  // namespace strata
