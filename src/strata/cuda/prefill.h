// Batched prefill on the GPU: runs a prompt of n tokens through the model in chunks of up to max_chunk
// tokens (and at most forward_token_limit when sliding layers keep rings), each chunk one pass over the
// layers with matrix-matrix products, instead of n passes of the decode step. It reads and extends the
// same DeviceSequenceState as the decode step (KV cache rows of positions n_past .., a sliding layer's
// ring wrapping as the decode's does, DeltaNet conv window and recurrent state), so decode continues
// where it left off.
//
// Per chunk and layer (kernels in prefill_kernels.h, arithmetic mode in prefill_math.h):
//   full / sliding-window attention: q/k/v (+ softplus gate) projections as GEMMs, per-head RMSNorm +
//     NEOX rotary (YaRN where the layer has it; k into the cache), tiled causal attention over
//     [cache + chunk] (a sliding layer: the window only) with an online softmax, output gates;
//   DeltaNet: projections, causal conv over the chunk (continuing the stored window), q/k L2 norms, the
//     gated delta rule as an exact sequential scan parallel over heads x value columns, gated RMSNorm;
//   MoE: router GEMM + the decode's routing rule (softmax, or sigmoid with soft-cap, selection bias and
//     weight scale) per token on the GPU, a counting sort of (token, slot) pairs by
//     expert, one grouped GEMM launch per expert matrix over only the tokens routed to each expert, the
//     shared expert (gated or not) as dense GEMMs, and the combine in ascending expert id per token (as the CPU engine).
//     With a HybridMoe (hot/cold experts, issue 8) the grouping takes the layer's slot map: the grouped
//     GEMMs compute the hot experts (by slot in the hot-only stacks) while the HybridMoe computes the
//     cold pairs on the CPU pool, grouped by expert; the combine is the same;
//   dense FFN layers: gate / up / down as dense GEMMs.
// Dense projections run through cuBLAS: on a half copy of the matrix kept from the first prefill (Fast,
// PrefillOptions::cache_dense_f16), else on the matrix decoded into a scratch buffer per call.
// Plain C++ header: include it only where STRATA_HAVE_CUDA is defined.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/cuda/prefill_math.h"

namespace strata::cuda {

class DeviceModel;
class DeviceSequenceState;
class HybridMoe;

struct PrefillOptions {
  PrefillMath math = PrefillMath::Fast;
  int max_chunk = 512;   // tokens per pass; longer prompts run in several chunks
  bool profile = false;  // time the pieces with CUDA events (also on with env STRATA_PREFILL_PROFILE=1)
  // Fast mode: keep a half copy of every dense projection matrix (mixers and shared expert), decoded on
  // the first prefill, instead of decoding the matrix into a scratch buffer on every call. Costs 2 bytes
  // per weight of GPU memory (ModelFootprint::prefill_f16_cache_bytes); obeyed as given: the backend
  // plan decides it (kept only when all-GPU and it fits under the limit).
  bool cache_dense_f16 = true;
};

// Milliseconds per piece of the last run (filled when profiling).
struct PrefillProfile {
  double embed_norm_add = 0, projections = 0, attention = 0, deltanet = 0, routing = 0, experts = 0,
         combine = 0, logits = 0, total = 0;
  int tokens = 0;
  std::string summary() const;
};

// GpuPrefill::run's per-token arg-max: out (host) gets n ids.
struct PrefillPicks {
  int32_t* out = nullptr;
  int32_t n_allowed = 0;
};

class GpuPrefill {
 public:
  // Allocates the workspaces for chunks of opt.max_chunk tokens of this model and a cuBLAS handle.
  explicit GpuPrefill(const DeviceModel& dm, PrefillOptions opt = {});
  ~GpuPrefill();
  GpuPrefill(const GpuPrefill&) = delete;
  GpuPrefill& operator=(const GpuPrefill&) = delete;

  // Runs tokens[0..n) (host ids, already validated by the caller: in range, st.n_past + n <= context)
  // at positions st.n_past .. st.n_past + n - 1 and advances st.n_past by n. logits_out (host) gets
  // [n x n_vocab] floats when all_positions, else the last token's n_vocab; nullptr: no logits.
  // hybrid: when not null, every layer's cold experts run on its CPU pool (hybrid_moe.h, grouped form)
  // and its telemetry counts the picks. route_counts (device, [n_layer x n_expert], optional, all-GPU
  // sessions: GpuSession::routing_counts) += the chunk's picks per (layer, expert). Work is enqueued on
  // s; returns after synchronising it.
  // replay (device, optional): replayed expert picks, [n x routed layers x k] token-major (the routed
  // layers of ModelConfig::routed_layers, as routing traces hold them), instead of the router's top-k.
  // record_steps: token t's DeltaNet state and expert picks go to step t of st's step records
  // (DeviceSequenceState::reserve_steps, room for n), for keeping a prefix of the run without running it
  // again; the DeltaNet layers take the sequential scan then.
  // hidden_out (device, optional): [n x n_embd], each token's rmsnorm(x) * output_norm (what the lm_head
  // scores; the MTP drafter's input).
  // picks (optional): each token's arg-max over ids < picks->n_allowed (argmax_wide's rule) to
  // picks->out[0..n), computed on the device from every position's logits; only the ids are copied back.
  // trace_ids (device, optional, not with record_steps): every token's expert picks, [n x n_layer x k]
  // token-major (rows of layers that route nothing are left as they were), for a routing trace.
  // hidden_layers (with hidden_out): instead of the final rows, each token's residual stream after those
  // layers, side by side ([n x layers x n_embd]; HiddenRecord::layers).
  void run(DeviceSequenceState& st, const int32_t* tokens, int n, float* logits_out, bool all_positions,
           cudaStream_t s, HybridMoe* hybrid = nullptr, unsigned long long* route_counts = nullptr,
           const int* replay = nullptr, bool record_steps = false, float* hidden_out = nullptr,
           const PrefillPicks* picks = nullptr, int* trace_ids = nullptr,
           const std::vector<int>* hidden_layers = nullptr);

  const PrefillOptions& options() const;
  const PrefillProfile& last_profile() const;
  size_t workspace_bytes() const;  // workspaces and the half copies of dense matrices, if any
  size_t dense_cache_bytes() const;  // the half copies alone (0 when not kept)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::cuda
