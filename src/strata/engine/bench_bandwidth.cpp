#include "strata/engine/bench_bandwidth.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>

#include "strata/base/error.h"

namespace strata {

BandwidthResult measure_triad_bandwidth(size_t array_bytes, int passes) {
  if (passes < 1) fail("bandwidth: passes must be >= 1");
  const int64_t n = static_cast<int64_t>(array_bytes / sizeof(double));
  if (n < 1024) fail("bandwidth: arrays of ", array_bytes, " bytes are too small");
  std::unique_ptr<double[]> a(new double[static_cast<size_t>(n)]);
  std::unique_ptr<double[]> b(new double[static_cast<size_t>(n)]);
  std::unique_ptr<double[]> c(new double[static_cast<size_t>(n)]);
  double* pa = a.get();
  double* pb = b.get();
  double* pc = c.get();
  // First touch on the threads that later stream the same ranges (same static schedule).
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    pa[i] = 0.0;
    pb[i] = 1.0;
    pc[i] = 2.0;
  }
  const double s = 3.0;
  double best = 1e30;
  for (int p = 0; p < passes; ++p) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) pa[i] = pb[i] + s * pc[i];
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  // Use the result so the loop cannot be dropped.
  if (pa[n / 2] != 7.0) fail("bandwidth: triad produced a wrong value ", pa[n / 2]);
  BandwidthResult r;
  r.array_bytes = static_cast<size_t>(n) * sizeof(double);
  r.triad_gbs = 3.0 * static_cast<double>(r.array_bytes) / best / 1e9;
  r.threads = omp_get_max_threads();
  r.passes = passes;
  return r;
}

}  // namespace strata
