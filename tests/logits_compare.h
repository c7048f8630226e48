// Comparing logits in tests: the error measure the CPU and GPU suites share.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace strata::test_util {

// max over rows of max|a-b| / max|b|; infinite when a holds a non-finite value (unwritten outputs are NaN).
inline double max_row_rel_err(const std::vector<float>& a, const std::vector<float>& b, size_t vocab) {
  double worst = 0;
  for (size_t r = 0; r * vocab < b.size(); ++r) {
    double num = 0, den = 0;
    for (size_t i = r * vocab; i < (r + 1) * vocab; ++i) {
      if (!std::isfinite(a[i])) return INFINITY;
      num = std::max(num, std::fabs(double(a[i]) - b[i]));
      den = std::max(den, std::fabs(double(b[i])));
    }
    worst = std::max(worst, num / den);
  }
  return worst;
}

// The rows of a against b under `bound` (max_row_rel_err per row): the largest error among the rows
// within it, and the rows beyond it, each printed with `label` (an expert near-tie that rounding flips
// moves one token's whole row; the tests that allow for that count them).
struct RowsAgainstBound {
  double within = 0;
  int beyond = 0;
};
inline RowsAgainstBound rows_against_bound(const std::vector<float>& a, const std::vector<float>& b, size_t vocab,
                                           double bound, const std::string& label) {
  RowsAgainstBound out;
  for (size_t r = 0; r * vocab < b.size(); ++r) {
    const std::vector<float> ar(a.begin() + r * vocab, a.begin() + (r + 1) * vocab);
    const std::vector<float> br(b.begin() + r * vocab, b.begin() + (r + 1) * vocab);
    const double e = max_row_rel_err(ar, br, vocab);
    if (e > bound) {
      ++out.beyond;
      std::printf("%s: row %zu beyond the bound: %.3g\n", label.c_str(), r, e);
    } else {
      out.within = std::max(out.within, e);
    }
  }
  return out;
}

}  // namespace strata::test_util
