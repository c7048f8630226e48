// One thread policy for every command: how many OpenMP threads each sequence's forward passes get.
// Threads beyond the cores do not add arithmetic; they take turns on the cores, and every parallel
// region then waits for its slowest (descheduled) member, so an oversubscribed process is much slower
// than one that fits. The policy therefore never plans more busy threads than usable cores: slot
// threads with their OpenMP teams (the slot thread is its team's first member), unless the user
// forces a larger count. Threads that mostly wait (HTTP connections, a GPU slot blocked on its
// device) are not counted as busy.
#pragma once

#include <cstdint>
#include <string>

namespace strata {

struct ThreadRequest {
  int threads = 0;            // --threads: all threads in all; 0 = automatic
  bool force = false;         // --threads-force: take --threads as given even beyond the cores
  int slots = 1;              // sequences running side by side, each with its own team
  uint64_t weight_bytes = 0;  // the model's tensor bytes; 0 = unknown (treated as large)
};

struct ThreadPlan {
  int per_slot = 1;     // OpenMP threads of each slot's team
  int cores = 1;        // usable cores the plan was made for
  std::string warning;  // "" or one line saying what was capped and how to override it
};

// Cores this process may run on (its CPU affinity mask; at least 1).
int usable_cores();

// The policy, a pure function of the request and the core count:
// - automatic: one thread per slot for a model under 256 MiB (its matrices are too small to split:
//   the team's synchronisation costs more than it saves), else the cores shared among the slots;
// - --threads N above the cores is capped to the cores with a warning, unless forced;
// - more slots than cores cannot fit: one thread each, with a warning.
ThreadPlan plan_threads(const ThreadRequest& request, int cores);

// plan_threads for this machine, the warning printed on stderr (prefixed "strata: warning: "), and
// the per-slot count set as this thread's OpenMP default. Fails on a negative --threads.
ThreadPlan apply_thread_policy(const ThreadRequest& request);

}  // namespace strata
