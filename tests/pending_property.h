// The property every backend's pending forward must have (Sequence::forward_pending / keep): running n
// drafted tokens (a chain or a random token tree), keeping a root path of m of them and continuing gives
// exactly what running those m tokens and continuing gives: bit-equal logits, and (where the caller can
// read it) bit-equal state, and the same routing counts (only kept tokens count). Shared by the CPU and
// GPU test files. A backend that keeps the state its pending forward computed (the GPU's batched prefill
// of all n tokens) instead of running the m kept ones again is held to a tolerance instead of bits.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "logits_compare.h"
#include "strata/engine/routing_counts.h"
#include "strata/engine/sequence.h"
#include "strata/engine/token_tree.h"

namespace strata::pending_test {

struct Trial {
  std::vector<int32_t> prompt, drafts, after;  // after: tokens run once the path is kept
  std::vector<int> parents;                    // empty: a chain
  std::vector<int> path;                       // the root path kept
};

// A random trial: prompt of 1..max_prompt tokens, 1..max_n drafts as a chain (every other trial) or a
// random tree, a random root path (possibly empty), 1..3 tokens after it.
inline Trial random_trial(std::mt19937& rng, int vocab, int max_prompt, int max_n, bool tree) {
  auto uni = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Trial t;
  t.prompt.resize(static_cast<size_t>(uni(1, max_prompt)));
  for (int32_t& id : t.prompt) id = uni(0, vocab - 1);
  const int n = uni(1, max_n);
  t.drafts.resize(static_cast<size_t>(n));
  for (int32_t& id : t.drafts) id = uni(0, vocab - 1);
  t.after.resize(static_cast<size_t>(uni(1, 3)));
  for (int32_t& id : t.after) id = uni(0, vocab - 1);
  if (tree) {
    t.parents.resize(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) t.parents[i] = uni(-1, i - 1);
    const TokenTree tt = TokenTree::from_parents(t.parents.data(), n);
    const int leaf = uni(-1, n - 1);
    if (leaf >= 0) {
      t.path = tt.path_to(leaf);
      t.path.resize(static_cast<size_t>(uni(0, static_cast<int>(t.path.size()))));
    }
  } else {
    const int m = uni(0, n);
    for (int j = 0; j < m; ++j) t.path.push_back(j);
  }
  return t;
}

struct Outcome {
  RoutingCounts routes;               // what the sequence counted over the whole trial
  std::vector<float> pending_logits;  // [n x vocab] of the pending forward (empty for the reference)
  std::vector<float> path_logits;     // the reference: [m x vocab] of the path run as a chain
  std::vector<float> after_logits;    // [after x vocab]
  int n_past = 0;
};

// Runs the trial through a fresh sequence: prompt, pending drafts, keep(path), after tokens one by one.
inline void run_prompt(Sequence& s, const Trial& t) {
  std::vector<float> scratch(static_cast<size_t>(s.model().config().n_vocab));
  s.forward(t.prompt.data(), static_cast<int>(t.prompt.size()), scratch.data(), false);
}

// The tokens after the kept ones, one by one; their logits and the final position go into o.
inline void run_after(Sequence& s, const Trial& t, Outcome& o) {
  const int64_t V = s.model().config().n_vocab;
  for (int32_t id : t.after) {
    std::vector<float> l(static_cast<size_t>(V));
    s.forward(&id, 1, l.data(), false);
    o.after_logits.insert(o.after_logits.end(), l.begin(), l.end());
  }
  o.n_past = s.n_past();
  s.set_routing_counts(nullptr);  // flushes what the backend still holds
}

inline Outcome run_pending(Sequence& s, const Trial& t) {
  const int64_t V = s.model().config().n_vocab;
  Outcome o;
  s.set_routing_counts(&o.routes);
  run_prompt(s, t);
  const int n = static_cast<int>(t.drafts.size());
  o.pending_logits.resize(static_cast<size_t>(n * V));
  s.forward_pending(t.drafts.data(), n, t.parents.empty() ? nullptr : t.parents.data(), o.pending_logits.data());
  EXPECT_TRUE(s.has_pending());
  EXPECT_EQ(s.n_past(), static_cast<int>(t.prompt.size()));
  s.keep(t.path.data(), static_cast<int>(t.path.size()));
  EXPECT_FALSE(s.has_pending());
  run_after(s, t, o);
  return o;
}

// The reference: prompt, the path's tokens as one chain forward, after tokens one by one.
inline Outcome run_reference(Sequence& s, const Trial& t) {
  const int64_t V = s.model().config().n_vocab;
  Outcome o;
  s.set_routing_counts(&o.routes);
  run_prompt(s, t);
  std::vector<int32_t> kept;
  for (int i : t.path) kept.push_back(t.drafts[static_cast<size_t>(i)]);
  if (!kept.empty()) {
    o.path_logits.resize(kept.size() * static_cast<size_t>(V));
    s.forward(kept.data(), static_cast<int>(kept.size()), o.path_logits.data(), true);
  }
  run_after(s, t, o);
  return o;
}

inline std::string describe(const Trial& t) {
  std::ostringstream s;
  s << "prompt " << t.prompt.size() << ", drafts " << t.drafts.size() << (t.parents.empty() ? " (chain)" : " (tree)")
    << ", parents";
  for (int p : t.parents) s << ' ' << p;
  s << ", path";
  for (int p : t.path) s << ' ' << p;
  return s.str();
}

// Checks `trials` random trials. make() returns a fresh sequence. pending_rows_exact: the pending
// forward's logits of the kept path's tokens must equal the reference chain's bit for bit (the CPU
// engine's row-independent arithmetic); otherwise only the continuation is compared exactly. same_state
// (optional) compares two sequences' state after both ran (bit-exact where the backend can read it).
// after_tol: 0 for bit-equal continuation logits, else their largest row relative error.
inline void check_pending_property(const std::function<std::unique_ptr<Sequence>()>& make, uint32_t seed, int trials,
                                   int max_prompt, int max_n, bool pending_rows_exact,
                                   const std::function<void(Sequence&, Sequence&, const std::string&)>& same_state = {},
                                   double after_tol = 0) {
  std::mt19937 rng(seed);
  for (int i = 0; i < trials; ++i) {
    std::unique_ptr<Sequence> a = make(), b = make();
    const int64_t V = a->model().config().n_vocab;
    const Trial t = random_trial(rng, static_cast<int>(V), max_prompt, max_n, i % 2 == 1);
    const std::string what = describe(t);
    const Outcome got = run_pending(*a, t);
    const Outcome want = run_reference(*b, t);
    EXPECT_EQ(got.n_past, want.n_past) << what;
    if (after_tol == 0) {
      EXPECT_EQ(got.after_logits, want.after_logits) << what;
    } else {
      EXPECT_LE(test_util::max_row_rel_err(got.after_logits, want.after_logits, static_cast<size_t>(V)), after_tol)
          << what;
    }
    // Only kept tokens count as routed traffic, each once.
    EXPECT_EQ(got.routes.n_tokens, want.routes.n_tokens) << what;
    EXPECT_EQ(got.routes.counts, want.routes.counts) << what;
    if (pending_rows_exact) {
      for (size_t j = 0; j < t.path.size(); ++j)
        EXPECT_TRUE(std::equal(want.path_logits.begin() + static_cast<std::ptrdiff_t>(j * V),
                               want.path_logits.begin() + static_cast<std::ptrdiff_t>((j + 1) * V),
                               got.pending_logits.begin() + static_cast<std::ptrdiff_t>(t.path[j] * V)))
            << what << ": pending logits of path entry " << j;
    }
    if (same_state) same_state(*a, *b, what);
  }
}

}  // namespace strata::pending_test
