// Choosing the scale (and min) of one group of weights for the quantisers: a small search over
// candidate scales, each refined by a least-squares refit, keeping the lowest squared error.
#pragma once

namespace strata::quant_detail {

// Asymmetric fit for codes 0..nmax: x ~ scale*q - min with scale >= 0, min >= 0 (the offset never
// exceeds the group's minimum clamped at zero, as K-quants require).
void fit_scale_min(const float* x, int n, int nmax, float& scale, float& min);

// Symmetric fit for codes qmin..qmax (qmin < 0 < qmax): x ~ scale*q; scale may be negative so the
// largest-magnitude value can land on the longer (negative) side of the code range.
float fit_scale_symmetric(const float* x, int n, int qmin, int qmax);

// Rounds to nearest (ties to even) and clamps to [lo, hi]; NaN becomes lo.
int round_clamp(float v, int lo, int hi);

}  // namespace strata::quant_detail
