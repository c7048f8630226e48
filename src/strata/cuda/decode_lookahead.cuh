// The device half of the decode lookahead's publish (decode_lookahead.h): run by one thread at the end
// of a step, after its pick is final (argmax_wide's last block).
#pragma once

#include <cuda_runtime.h>

namespace strata::cuda {

// io[0] = pick (0 for -1: the session fails that call and drops the step run from it), io[1] += 1 (the
// next step's token and position), and the pick written to the host word of its publish parity.
__device__ __forceinline__ void publish_pick_dev(int pick, int* io, unsigned long long* count,
                                                 volatile unsigned long long* host) {
  io[0] = pick >= 0 ? pick : 0;
  io[1] += 1;
  const unsigned long long n = *count + 1;
  *count = n;
  host[n & 1] = (n << 32) | static_cast<unsigned int>(pick);  // one 64-bit store: never seen half written
  __threadfence_system();
}

}  // namespace strata::cuda
