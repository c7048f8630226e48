// Host DRAM bandwidth, measured the way STREAM's triad does (a[i] = b[i] + s * c[i] over arrays far
// larger than the caches, all threads, best of several passes), so decode floors use this machine's
// real number rather than a datasheet figure.
#pragma once

#include <cstddef>
#include <string>

namespace strata {

struct BandwidthResult {
  double triad_gbs = 0;      // 3 arrays x bytes / best time (STREAM counts no write-allocate traffic)
  size_t array_bytes = 0;    // bytes per array
  int threads = 0;
  int passes = 0;
  std::string source = "host DRAM triad";  // what was measured (the GPU backend measures HBM instead)
};

// array_bytes: size of each of the three double arrays. passes >= 1.
BandwidthResult measure_triad_bandwidth(size_t array_bytes = 256u << 20, int passes = 5);

}  // namespace strata
