// Decode lookahead: the next greedy step runs before the host has read the token it consumes.
//
// A decode step that starts from a host-chosen token leaves the GPU idle between two steps while the
// host sees the picked token, copies it back and launches the next graph, plus whatever the caller does
// with the token (detokenising, streaming it, checking stop conditions). With lookahead every step ends
// with publish_pick: the pick becomes the next step's input on the device (token and position advance
// there) and is written to mapped host memory. The host launches the next step at once, before it waits
// for that pick: the step runs from the pick while the host works. The publish is done by the last
// block of the step's arg-max (argmax_wide with a link; decode_lookahead.cuh), so it costs no launch.
//
// The step is speculative and the session keeps it only when the caller feeds that pick back (greedy
// decoding always does, until it stops). Dropping it is exact because a step writes nothing a later
// step cannot overwrite: the DeltaNet conv and recurrent states are ping-pong pairs (a step reads one
// buffer and writes the other; the session swaps them when it keeps the step), a KV row at a position
// is rewritten by the next step at that position, the logits and pick are rewritten by every step, and
// uncount_routes takes the dropped step's router picks back out of the routing counts.
// Plain C++ header (no CUDA syntax): gpu_session.cpp includes it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda {

// The pick's way to the host: pinned host words mapped into the device, one per publish parity (at most
// two steps are in flight: the one the host waits for and the next one).
struct LookaheadLink {
  unsigned long long* host_pick = nullptr;   // [2]: device writes (publish number << 32) | uint32(pick)
  unsigned long long* dev_pick = nullptr;    // the device's address of host_pick
  unsigned long long* dev_count = nullptr;   // device memory: publishes so far
  unsigned long long launched = 0;           // publishing steps launched (host): the last one's number

  void allocate();
  void release();
  // Waits until publish number n has been written and returns its pick. Checks the stream for errors
  // while it waits (a failed kernel never publishes), so it cannot wait forever.
  int32_t wait(cudaStream_t s, unsigned long long n) const;
};

// Subtracts one from counts[il * n_expert + ids[il * k + p]] for every layer il < n_layer and pick
// p < k: the router picks of a dropped step (each layer routes into its own k ids).
// ids of a layer without routed experts are -1 and skipped.
void uncount_routes(const int* ids, int n_layer, int k, int n_expert, unsigned long long* counts, cudaStream_t s);

}  // namespace strata::cuda
