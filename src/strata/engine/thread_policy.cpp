#include "strata/engine/thread_policy.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "strata/base/error.h"

namespace strata {

namespace {
constexpr uint64_t kSmallModelBytes = 256ull << 20;
}  // namespace

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

ThreadPlan plan_threads(const ThreadRequest& r, int cores) {
  if (r.threads < 0) fail("--threads must be >= 0 (0: automatic), got ", r.threads);
  if (r.slots < 1) fail("a thread plan needs at least one slot, got ", r.slots);
  ThreadPlan p;
  p.cores = std::max(1, cores);
  int total = r.threads;
  if (total == 0) {
    const bool small = r.weight_bytes > 0 && r.weight_bytes < kSmallModelBytes;
    total = small ? r.slots : p.cores;
  } else if (total > p.cores && !r.force) {
    p.warning = cat("--threads ", total, " is more than the ", p.cores, " usable cores; using ", p.cores,
                    " (oversubscribed threads slow every parallel step; --threads-force keeps ", total, ")");
    total = p.cores;
  }
  if (r.slots > p.cores && !r.force) {
    if (!p.warning.empty()) p.warning += "; ";
    p.warning += cat(r.slots, " slots on ", p.cores, " cores: each slot gets one thread and the slots take turns on the cores");
  }
  p.per_slot = std::max(1, total / r.slots);
  return p;
}

ThreadPlan apply_thread_policy(const ThreadRequest& request) {
  const ThreadPlan p = plan_threads(request, usable_cores());
  if (!p.warning.empty()) std::fprintf(stderr, "strata: warning: %s\n", p.warning.c_str());
  omp_set_num_threads(p.per_slot);
  return p;
}

}  // namespace strata
