// CUDA kernels of the hybrid hot/cold MoE decode step (issue 8), as host launchers on a stream.
// The GPU and the CPU workers share one HostJob in mapped pinned host memory (cudaHostAlloc with
// cudaHostAllocMapped): the route-ring kernel writes a layer's job into it, the CPU writes cold rows and
// a done sequence number, the cold-add kernel reads them over PCIe. At most one job is in flight: a
// layer's cold add waits for its job before any later layer can ring.
// A job covers the tokens of one step: one for a decode step, up to kHybridMaxTokens for the multi-token
// step that verifies drafts (pick p of token t at index t * k + p of ids / cold, its input row t of xn,
// its output row t * k + p of ye_cold).
// Plain C++ header (no CUDA language features).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "strata/cuda/kernels.h"

namespace strata::cuda {

constexpr int kHybridMaxK = 64;  // the most routed experts per token the hybrid step handles
constexpr int kHybridMaxTokens = 32;  // the most tokens of one job (the multi-token step's)

// Lives in mapped pinned memory. The GPU writes layer/ids/cold then the doorbell (the job's sequence
// number, > 0); the CPU writes done. The two flags sit on their own cache lines.
struct HostJob {
  alignas(64) unsigned long long doorbell;  // seq of the last job rung
  alignas(64) unsigned long long done;      // seq of the last job the CPU finished
  alignas(64) int layer;
  int k;
  int n_tokens;
  int n_cold;
  int ids[kHybridMaxTokens * kHybridMaxK];   // expert id of each pick
  int cold[kHybridMaxTokens * kHybridMaxK];  // 1: the pick is cold (its row comes from the CPU)
};

// Device-side counters of the hybrid step.
struct HybridDevCounters {
  unsigned long long seq;           // last job sequence number handed out
  unsigned long long jobs;          // decode layer passes with cold picks (less those of dropped steps)
  unsigned long long wait_ns;       // combine kernels' time waiting for the CPU
  unsigned long long timeouts;      // never > 0 unless the CPU side died (then the kernel traps)
  unsigned long long rung_at;       // %globaltimer when the last doorbell rang (its cold add's answer_ns)
  unsigned long long answer_ns;     // decode jobs: from each doorbell to the GPU seeing its done, summed
};

// The model's side of the decode mailbox and its counters (device pointers; job and xn_host in mapped
// pinned memory).
struct HybridRing {
  HostJob* job = nullptr;
  float* xn_host = nullptr;        // [kHybridMaxTokens x n_embd]: the cold experts' inputs
  const float* ye_cold = nullptr;  // [kHybridMaxTokens x k x n_embd]: the cold picks' rows (CPU)
  HybridDevCounters* ctr = nullptr;
  unsigned long long* wait_seq = nullptr;    // [n_layer]: the job each layer's cold add waits for (0: none)
  unsigned long long* calls = nullptr;       // [n_layer] token passes
  unsigned long long* cold_picks = nullptr;  // [n_layer]
  unsigned long long* expert_picks = nullptr;  // [n_layer x n_expert]
  // The expert cache (issue 20): a pick whose slot is at least pinned[il] is a cache hit.
  const int* pinned = nullptr;               // [n_layer] pinned slots per layer
  unsigned long long* cache_hits = nullptr;  // [n_layer]
};

// Slot-map writes applied between two steps, in order, by one small launch (passed by value, so the
// host's plan may change as soon as the launch is enqueued).
constexpr int kMaxSlotWrites = 128;
struct SlotWrites {
  int n = 0;
  int index[kMaxSlotWrites];  // layer * n_expert + expert
  int slot[kMaxSlotWrites];   // -1: cold
};

// Decode, after the router's launch: layer il's top-k of logits under rule (warp_route, the routing of
// every GPU path, so the picks are those the session's expert launch routes and stores); the model's
// counters; the picks classified through slot_of (device, [n_expert]: slot or -1). When some pick is cold it takes the
// next job number, writes xn = rmsnorm(x) * norm_w (rmsnorm_rows' arithmetic) and the job to host memory, fences and
// rings the doorbell; wait_seq[il] = that number, or 0 with no cold pick; the ring's time in ctr->rung_at. One small
// launch. n_tokens > 1 (the multi-token step): token t's logits at logits + t * logits_stride, its input at x + t *
// x_stride, its replayed picks (rule.replay) at + t * rule.replay_stride; each token's routing and input are what a
// launch for that token alone gives, and all go in one job.
void hybrid_route_ring(int il, const float* logits, int n_expert, int k, const RouteRule& rule, const int* slot_of,
                       const float* x, const float* norm_w, float eps, int d, const HybridRing& ring, cudaStream_t s,
                       int n_tokens, int64_t logits_stride, int64_t x_stride);

// After the hot experts were added into x: when wait_seq[il] > 0, waits until the CPU finished that job
// (the wait counted in ctr->wait_ns; after timeout_s it reports and traps), then x[j] += the cold
// picks' weights[p] * ye_cold[p][j], summed in ascending expert id (the order of the CPU engine's
// combine); the time since the ring goes to ctr->answer_ns. Returns at once on the device when the layer
// had no cold pick. n_tokens > 1: token t's row x + t * x_stride, its picks at ids / weights + t * k.
void hybrid_cold_add(int il, float* x, const int* ids, const float* weights, const int* slot_of, int k, int d,
                     const HybridRing& ring, double timeout_s, cudaStream_t s, int n_tokens, int64_t x_stride);

// Takes a dropped decode step's picks (ids: [n_layer x k], every layer's) back out of the model's
// counters: calls, cold picks, cache hits and per-expert picks.
void hybrid_uncount(const int* ids, int n_layer, int k, int n_expert, const int* slot_maps, const HybridRing& ring,
                    cudaStream_t s);

// slot_maps[w.index[i]] = w.slot[i] for i in order, on s (stream order puts it between two steps).
void hybrid_write_slots(int* slot_maps, const SlotWrites& w, cudaStream_t s);

}  // namespace strata::cuda
