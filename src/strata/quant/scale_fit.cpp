#include "strata/quant/scale_fit.h"

#include <algorithm>
#include <cmath>

namespace strata::quant_detail {

int round_clamp(float v, int lo, int hi) {
  if (!(v >= static_cast<float>(lo))) return lo;  // also catches NaN
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(std::nearbyint(v));
}

namespace {

// Squared error of x against scale*q - min with q chosen by rounding; also returns the
// least-squares (scale, min) for those codes.
double asym_trial(const float* x, int n, int nmax, float scale, float min, float& ls_scale, float& ls_min) {
  double sq = 0, sx = 0, sqq = 0, sqx = 0;
  const float inv = scale > 0 ? 1.0f / scale : 0.0f;
  for (int i = 0; i < n; ++i) {
    const int q = round_clamp((x[i] + min) * inv, 0, nmax);
    sq += q;
    sx += x[i];
    sqq += static_cast<double>(q) * q;
    sqx += static_cast<double>(q) * x[i];
  }
  // Fit x ~ s*q + off; off = -min must stay <= 0.
  const double det = n * sqq - sq * sq;
  double s = 0, off = 0;
  if (det > 0) {
    s = (n * sqx - sq * sx) / det;
    off = (sx - s * sq) / n;
  }
  if (off > 0 || det <= 0) {
    off = 0;
    s = sqq > 0 ? sqx / sqq : 0;
  }
  if (s < 0) s = 0;
  ls_scale = static_cast<float>(s);
  ls_min = static_cast<float>(-off);
  double err = 0;
  const float linv = ls_scale > 0 ? 1.0f / ls_scale : 0.0f;
  for (int i = 0; i < n; ++i) {
    const int q = round_clamp((x[i] + ls_min) * linv, 0, nmax);
    const double e = x[i] - (static_cast<double>(ls_scale) * q - ls_min);
    err += e * e;
  }
  return err;
}

}  // namespace

void fit_scale_min(const float* x, int n, int nmax, float& scale, float& min) {
  float lo = 0, hi = -INFINITY;
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  scale = 0;
  min = -lo;
  if (!(hi > lo)) return;
  double best = INFINITY;
  for (int k = -4; k <= 8; ++k) {
    // Spread the range over slightly fewer or more steps than nmax: clipping a few outliers or
    // leaving headroom sometimes lowers the total error.
    const float s0 = (hi - lo) / (static_cast<float>(nmax) + 0.25f * static_cast<float>(k));
    float s, m;
    const double err = asym_trial(x, n, nmax, s0, -lo, s, m);
    if (err < best) {
      best = err;
      scale = s;
      min = m;
    }
  }
}

float fit_scale_symmetric(const float* x, int n, int qmin, int qmax) {
  float amax = 0, vmax = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      vmax = x[i];
    }
  }
  if (amax == 0) return 0;
  double best = INFINITY;
  float best_scale = vmax / static_cast<float>(qmin);
  for (int k = 0; k <= 10; ++k) {
    // Map the extreme value onto the negative end (qmin), a little inside it for k > 0.
    const float s0 = vmax / (static_cast<float>(qmin) + 0.3f * static_cast<float>(k));
    const float inv = 1.0f / s0;
    double sqq = 0, sqx = 0;
    for (int i = 0; i < n; ++i) {
      const int q = round_clamp(x[i] * inv, qmin, qmax);
      sqq += static_cast<double>(q) * q;
      sqx += static_cast<double>(q) * x[i];
    }
    if (sqq <= 0) continue;
    for (float s : {s0, static_cast<float>(sqx / sqq)}) {
      const float si = 1.0f / s;
      double err = 0;
      for (int i = 0; i < n; ++i) {
        const int q = round_clamp(x[i] * si, qmin, qmax);
        const double e = x[i] - static_cast<double>(s) * q;
        err += e * e;
      }
      if (err < best) {
        best = err;
        best_scale = s;
      }
    }
  }
  return best_scale;
}

}  // namespace strata::quant_detail
