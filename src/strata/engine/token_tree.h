// The shape of a multi-token forward: n tokens that follow a sequence's kept tokens either as a chain
// (token t's parent is t - 1) or as a tree (parents[t] < t, or -1 for a child of the kept tokens).
// Token t sits at position n_past + depth(t) and attends to the kept tokens and its own ancestors.
// Speculative verification runs drafted chains and trees this way, then keeps one root path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata {

class TokenTree {
 public:
  TokenTree() = default;
  // A chain of n tokens.
  static TokenTree chain(int n);
  // parents[0..n): each -1 or an earlier index; fails (strata::Error) naming the bad entry.
  static TokenTree from_parents(const int* parents, int n);

  int size() const { return static_cast<int>(parent_.size()); }
  bool is_chain() const { return chain_; }
  int parent(int t) const { return parent_[static_cast<size_t>(t)]; }
  int depth(int t) const { return depth_[static_cast<size_t>(t)]; }
  // t's root path: its ancestors from the root down, then t.
  std::vector<int> path_to(int t) const;
  // Checks that path[0..m) is a root path of this tree (path[0] a root, each next entry a child of the
  // previous one); fails naming the first entry that is not.
  void check_path(const int* path, int m) const;

 private:
  std::vector<int> parent_, depth_;
  bool chain_ = true;
};

}  // namespace strata
