// Decode lookahead: the next greedy step is launched before the host has read the token it will consume.
//
// A decode step that runs from a host-chosen token leaves the GPU idle between two steps for the time
// the host needs to see the picked token, copy it back and launch the next graph (~4% of a token at 40
// layers, docs/PERF.md 2026-11-23 05:40). With lookahead, every step ends with publish_pick: the pick
// becomes the next step's input on the device (token and position advance there) and is written to a
// word of mapped host memory. The host launches the next step's *gated* graph first and only then waits
// for that word. The gated graph is a one-thread gate kernel followed by an IF node whose body is the
// step: the gate waits until the host writes a command for it, "go" (the caller fed the pick back: the
// body runs) or "stop" (anything else happened: the body is skipped, so the KV cache, the DeltaNet state,
// the routing counts and the logits stay exactly as the last committed step left them). The host writes
// the command as soon as it knows, so the step is never speculative: lossless by construction.
//
// The gate gives up after kGateWaitNs without a command (the body is skipped; it tells the host so): a
// caller that stops asking for tokens must not leave a kernel waiting on the GPU, and work that needs
// the whole device idle (another session building its graphs, in tests on the same thread) would wait
// for it forever. The host then runs the step from its token as without lookahead: only slower.
// Plain C++ header (no CUDA syntax): gpu_session.cpp includes it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>

namespace strata::cuda {

// The host side of the hand-shake: two words of pinned host memory mapped into the device.
constexpr unsigned long long kGateWaitNs = 2'000'000;  // 2 ms: ~60x the host's turn between tokens

struct LookaheadLink {
  unsigned long long* host_cmd = nullptr;   // host writes (gated launch number << 1) | go
  unsigned long long* host_pick = nullptr;  // device writes (publish number << 32) | uint32(pick)
  unsigned long long* host_gave_up = nullptr;  // device writes the number of a gate that timed out
  unsigned long long* dev_cmd = nullptr;    // the device's addresses of the three host words
  unsigned long long* dev_pick = nullptr;
  unsigned long long* dev_gave_up = nullptr;
  unsigned long long* dev_counts = nullptr;  // device memory: [0] gated launches seen by the gate, [1] publishes
  unsigned long long launched = 0;  // gated graphs launched (host)
  unsigned long long published = 0;  // publishes the host has counted (bodies that ran)

  void allocate();
  void release();
  // Writes the command for the most recent gated launch.
  void command(bool go);
  // Waits until publish number `publish` has been written (true, *pick set) or, when gate > 0, until gate
  // number `gate` has given up (false: its body did not run). Checks the stream for errors while it
  // waits (a failed kernel never publishes), so it cannot wait forever.
  bool wait(cudaStream_t s, unsigned long long publish, unsigned long long gate, int32_t* pick) const;
};

// Enqueues the one-thread kernel that ends a lookahead step: io[0] = *pick, io[1] += 1 (the next step's
// token and position), and the pick published to the host word.
void publish_pick(const LookaheadLink& link, const int* pick, int* io, cudaStream_t s);

// Builds the gated graph: gate kernel -> IF node whose body is what enqueue_body puts on `s` (captured
// into the body graph). The caller instantiates nothing else; the returned exec is its to destroy.
cudaGraphExec_t build_gated_graph(const LookaheadLink& link, cudaStream_t s, const std::function<void()>& enqueue_body);

}  // namespace strata::cuda
