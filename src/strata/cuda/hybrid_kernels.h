// CUDA kernels of the hybrid hot/cold MoE step (issue 8), as host launchers on a stream.
// The GPU and the CPU workers share one HostJob in mapped pinned host memory (cudaHostAlloc with
// cudaHostAllocMapped): the ring kernel writes a layer's job into it, the CPU writes cold rows and a
// done sequence number, the combine kernel reads them over PCIe. At most one job is in flight: a
// layer's combine waits for its job before any later layer can ring.
// Plain C++ header (no CUDA language features).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "strata/cuda/kernels.h"

namespace strata::cuda {

constexpr int kHybridMaxK = 64;  // the most routed experts per token the hybrid step handles

// Lives in mapped pinned memory. The GPU writes layer/ids/cold then the doorbell (the job's sequence
// number, > 0); the CPU writes done. The two flags sit on their own cache lines.
struct HostJob {
  alignas(64) unsigned long long doorbell;  // seq of the last job rung
  alignas(64) unsigned long long done;      // seq of the last job the CPU finished
  alignas(64) int layer;
  int k;
  int n_cold;
  int ids[kHybridMaxK];   // expert id of each pick
  int cold[kHybridMaxK];  // 1: the pick is cold (its row comes from the CPU)
};

// Device-side counters of the hybrid step.
struct HybridDevCounters {
  unsigned long long seq;           // last job sequence number handed out
  unsigned long long wait_ns;       // combine kernels' time waiting for the CPU
  unsigned long long timeouts;      // never > 0 unless the CPU side died (then the kernel traps)
};

// After route_topk: classifies layer il's k picks through slot_of (device, [n_expert]: slot or -1);
// counts calls[il] += 1, cold_picks[il] += cold picks and expert_picks[ids[p]] += 1 (the layer's row of
// the model's per-expert counts; also seq_picks[ids[p]] += 1 when seq_picks, the sequence's row); when
// there are cold picks, takes the next sequence number, copies xn (d floats) to xn_host and the picks to *job (device pointers of mapped
// memory), fences, and rings job->doorbell; wait_seq[il] = that seq, or 0 with no cold pick.
void hybrid_ring(int il, const int* ids, int k, const int* slot_of, const float* xn, int d, HostJob* job,
                 float* xn_host, HybridDevCounters* ctr, unsigned long long* wait_seq, unsigned long long* calls,
                 unsigned long long* cold_picks, unsigned long long* expert_picks, unsigned long long* seq_picks,
                 cudaStream_t s);

// x[j] += sum over the k picks in ascending expert id of weights[p] * row_p[j] (+ sigmoid(*shared_gate)
// * ys[j] when ys is not null), where row_p is ye_cold + p*d (mapped host memory, written by the CPU)
// for a cold pick and ye_hot + p*d otherwise -- the arithmetic of moe_combine_add_norm. When *wait_seq > 0
// it first waits until job->done >= *wait_seq (the CPU finished this layer), adding the wait to
// ctr->wait_ns; after timeout_s seconds without an answer it reports and traps.
void hybrid_combine_add(float* x, const float* ye_hot, const float* ye_cold, const int* ids, const int* slot_of,
                        const float* weights, int k, int d, const float* ys, const float* shared_gate,
                        const unsigned long long* wait_seq, const HostJob* job, HybridDevCounters* ctr,
                        double timeout_s, cudaStream_t s);

}  // namespace strata::cuda
