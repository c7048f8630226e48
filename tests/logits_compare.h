// Comparing logits in tests: the error measure the CPU and GPU suites share.
#pragma once

#include <algorithm>
#include <cmath>
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

}  // namespace strata::test_util
