// The router's softmax + top-k for one token, computed by one warp: the one routine behind every GPU
// routing path (the decode's expert launches, matvec_block.cuh; the standalone route_topk of the hybrid
// step, kernels.cu; the batched prefill, prefill_rows.cu), so all of them pick the same experts with the
// same weights. The CPU engine's routing (moe_block.cpp: softmax_inplace, top_k): softmax relative to the
// largest logit with expf, probabilities scaled by the float reciprocal of the sum (here summed in double
// over a warp tree, so weights agree with the CPU's to rounding, not bit for bit); larger probability
// first, the lower id among equals; weights renormalised over the picks in double when norm_topk.
#pragma once

#include <cuda_runtime.h>

#include "strata/cuda/device_math.cuh"
#include "strata/cuda/kernels.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "route_warp.cuh uses __reduce_max_sync / __reduce_min_sync (sm_80 or newer): set CMAKE_CUDA_ARCHITECTURES >= 80"
#endif

namespace strata::cuda {

constexpr int kRouteRegs = 8;  // experts per lane held in registers: up to 256 experts

// The warp's largest (best, bi) pair, the lowest bi among equal values, in every lane.
__device__ __forceinline__ void warp_argmax_lowest(float& best, int& bi) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > best || (ov == best && oi < bi)) {
      best = ov;
      bi = oi;
    }
  }
}

// RouteRule (kernels.h): softmax (null or !sigmoid) or the sigmoid rule below.
// The sigmoid rule's score of one logit: sigmoid of the logit, soft-capped first when the rule says so.
__device__ __forceinline__ float sigmoid_score(float l, const RouteRule& rule) {
  if (rule.softcap > 0.0f) l = tanhf(l / rule.softcap) * rule.softcap;
  return 1.0f / (1.0f + expf(-l));
}

// The sigmoid rule of warp_route (same lane layout and tie rule: the lower id among equal keys).
static __device__ __noinline__ void warp_route_sigmoid(const float* logits, int n_expert, int k, int* chosen,
                                                       float* chosen_p, float* p, const RouteRule& rule) {
  const int lane = threadIdx.x & 31;
  auto score = [&](int i) { return sigmoid_score(__ldcg(logits + i), rule); };
  if (n_expert <= 32 * kRouteRegs) {
    // Every logit and bias load is issued before the first score: the scores' branches (tanhf, expf)
    // kept the compiler from hoisting them, and the block's other warps waited for sixteen L2 round
    // trips one after another.
    float lg[kRouteRegs], bs[kRouteRegs];
#pragma unroll
    for (int m = 0; m < kRouteRegs; ++m) {
      const int i = min(lane + 32 * m, n_expert - 1);  // past the experts: a valid address, value unused
      lg[m] = __ldcg(logits + i);
      bs[m] = rule.bias ? __ldg(rule.bias + i) : 0.0f;
    }
    float sc[kRouteRegs], key[kRouteRegs];
#pragma unroll
    for (int m = 0; m < kRouteRegs; ++m) {
      const int i = lane + 32 * m;
      sc[m] = i < n_expert ? sigmoid_score(lg[m], rule) : 0.0f;
      key[m] = i < n_expert ? (rule.bias ? sc[m] + bs[m] : sc[m]) : -INFINITY;
    }
    for (int j = 0; j < k; ++j) {
      float best = key[0], best_sc = sc[0];
      int bi = lane;
#pragma unroll
      for (int m = 1; m < kRouteRegs; ++m)  // ascending ids: '>' keeps the lowest among equals
        if (key[m] > best) {
          best = key[m];
          best_sc = sc[m];
          bi = lane + 32 * m;
        }
      const unsigned int top = __reduce_max_sync(0xffffffffu, float_order_key(best));
      const int win = static_cast<int>(__reduce_min_sync(
          0xffffffffu, float_order_key(best) == top ? static_cast<unsigned int>(bi) : 0xffffffffu));
      const float win_sc = __shfl_sync(0xffffffffu, best_sc, win & 31);
      if (lane == (win & 31)) {
#pragma unroll
        for (int m = 0; m < kRouteRegs; ++m)
          if (win == lane + 32 * m) key[m] = -INFINITY;  // taken
      }
      if (lane == 0) {
        chosen[j] = win;
        chosen_p[j] = win_sc;
      }
    }
  } else {
    for (int i = lane; i < n_expert; i += 32) p[i] = score(i);
    __syncwarp();
    for (int j = 0; j < k; ++j) {
      float best = -INFINITY;
      int bi = 0x7fffffff;
      for (int i = lane; i < n_expert; i += 32) {
        const float key = p[i] + (rule.bias ? __ldg(rule.bias + i) : 0.0f);
        if (key > best) {
          best = key;
          bi = i;
        }
      }
      warp_argmax_lowest(best, bi);
      if (lane == 0) {
        if (bi >= n_expert) {  // no key above -inf (NaN logits): the lowest id not yet taken
          bi = 0;
          while (bi < n_expert - 1 && p[bi] == -INFINITY) ++bi;
        }
        chosen[j] = bi;
        chosen_p[j] = p[bi];
        p[bi] = -INFINITY;  // taken: its key is -inf from now on
      }
      __syncwarp();
    }
  }
  __syncwarp();
}

// Replayed routing (RouteRule::replay): the picks are given; their weights are what the router gives
// those ids: the softmax probability over all n_expert logits (relative to the largest, the sum in
// double, as warp_route), or the sigmoid score (no selection bias).
static __device__ __noinline__ void warp_route_replayed(const float* logits, int n_expert, int k, int* chosen,
                                                        float* chosen_p, const RouteRule& rule, int replay_row) {
  const int lane = threadIdx.x & 31;
  float mx = -INFINITY;
  double sum = 0.0;
  if (!rule.sigmoid) {
    for (int i = lane; i < n_expert; i += 32) mx = fmaxf(mx, __ldcg(logits + i));
    mx = warp_max(mx);
    for (int i = lane; i < n_expert; i += 32) sum += expf(__ldcg(logits + i) - mx);
    sum = warp_sum_d(sum);
  }
  const float inv = rule.sigmoid ? 1.0f : static_cast<float>(1.0 / sum);
  for (int j = lane; j < k; j += 32) {
    const int e = __ldcg(rule.replay + static_cast<int64_t>(replay_row) * rule.replay_stride + j);
    const float l = __ldcg(logits + e);
    chosen[j] = e;
    chosen_p[j] = rule.sigmoid ? sigmoid_score(l, rule) : expf(l - mx) * inv;
  }
  __syncwarp();
}

// Every lane of one warp calls it. Leaves the k picks in chosen[] / chosen_p[] (written by lane 0;
// visible to the warp on return). p: n_expert floats of shared memory, used only past 256 experts.
// Up to 256 experts each lane holds its eight (ids lane + 32 m) in registers, all loads in flight at
// once, and a round's arg-max is two warp reductions (the largest float_order_key, then the lowest id
// holding it);
// beyond that the probabilities live in p and a round is a shuffle arg-max. Both forms sum the softmax
// in the same order (per lane by ascending id, then the warp's xor tree). Logits are read through L2
// (an earlier kernel or another block wrote them). Replayed picks (rule->replay) are those of row
// replay_row (rule->replay + replay_row * rule->replay_stride).
static __device__ __noinline__ void warp_route(const float* logits, int n_expert, int k, int* chosen, float* chosen_p,
                                               float* p, const RouteRule* rule = nullptr, int replay_row = 0) {
  if (rule && rule->replay) {
    warp_route_replayed(logits, n_expert, k, chosen, chosen_p, *rule, replay_row);
    return;
  }
  if (rule && rule->sigmoid) {
    warp_route_sigmoid(logits, n_expert, k, chosen, chosen_p, p, *rule);
    return;
  }
  const int lane = threadIdx.x & 31;
  if (n_expert <= 32 * kRouteRegs) {
    float v[kRouteRegs];
    float mx = -INFINITY;
#pragma unroll
    for (int m = 0; m < kRouteRegs; ++m) {
      const int i = lane + 32 * m;
      v[m] = i < n_expert ? __ldcg(logits + i) : -INFINITY;
      mx = fmaxf(mx, v[m]);
    }
    mx = warp_max(mx);
    double sum = 0.0;
#pragma unroll
    for (int m = 0; m < kRouteRegs; ++m) {
      if (lane + 32 * m < n_expert) {
        v[m] = expf(v[m] - mx);
        sum += v[m];
      }
    }
    sum = warp_sum_d(sum);
    const float inv = static_cast<float>(1.0 / sum);
#pragma unroll
    for (int m = 0; m < kRouteRegs; ++m) v[m] = lane + 32 * m < n_expert ? v[m] * inv : -1.0f;
    for (int j = 0; j < k; ++j) {
      float best = v[0];
      int bi = lane;
#pragma unroll
      for (int m = 1; m < kRouteRegs; ++m)  // ascending ids: '>' keeps the lowest among equals
        if (v[m] > best) {
          best = v[m];
          bi = lane + 32 * m;
        }
      const unsigned int top = __reduce_max_sync(0xffffffffu, float_order_key(best));
      const int win = static_cast<int>(__reduce_min_sync(
          0xffffffffu, float_order_key(best) == top ? static_cast<unsigned int>(bi) : 0xffffffffu));
      if (lane == (win & 31)) {
#pragma unroll
        for (int m = 0; m < kRouteRegs; ++m)
          if (win == lane + 32 * m) v[m] = -1.0f;  // taken: below every probability
      }
      if (lane == 0) {
        chosen[j] = win;
        chosen_p[j] = order_key_float(top);
      }
    }
  } else {
    float mx = -INFINITY;
    for (int i = lane; i < n_expert; i += 32) {
      const float v = __ldcg(logits + i);
      p[i] = v;
      mx = fmaxf(mx, v);
    }
    mx = warp_max(mx);
    double sum = 0.0;
    for (int i = lane; i < n_expert; i += 32) {
      const float e = expf(p[i] - mx);
      p[i] = e;
      sum += e;
    }
    sum = warp_sum_d(sum);
    const float inv = static_cast<float>(1.0 / sum);
    for (int i = lane; i < n_expert; i += 32) p[i] *= inv;
    __syncwarp();
    for (int j = 0; j < k; ++j) {
      float best = -1.0f;
      int bi = 0x7fffffff;
      for (int i = lane; i < n_expert; i += 32) {  // ascending ids: '>' keeps the lowest among equals
        const float v = p[i];
        if (v > best) {
          best = v;
          bi = i;
        }
      }
      warp_argmax_lowest(best, bi);
      if (lane == 0) {
        if (bi >= n_expert) {  // no probability beat -1 (NaN logits): the lowest id not yet taken
          bi = 0;
          while (bi < n_expert - 1 && p[bi] == -1.0f) ++bi;
          best = p[bi];
        }
        chosen[j] = bi;
        chosen_p[j] = best;
        p[bi] = -1.0f;  // taken: below every probability
      }
      __syncwarp();
    }
  }
  __syncwarp();
}

// The routing outputs of warp_route's picks, by the same warp: ids and weights (renormalised in double
// when norm_topk, then times scale) in pick order, and counts[id] += 1 per pick when counts is not null.
__device__ __forceinline__ void warp_route_store(const int* chosen, const float* chosen_p, int k, bool norm_topk,
                                                 int* ids, float* weights, unsigned long long* counts,
                                                 float scale = 1.0f) {
  const int lane = threadIdx.x & 31;
  double s = 0.0;  // the picks' sum in pick order (the CPU's order), by lane 0, then shared
  if (lane == 0 && norm_topk)
    for (int j = 0; j < k; ++j) s += chosen_p[j];
  s = __shfl_sync(0xffffffffu, s, 0);
  for (int j = lane; j < k; j += 32) {  // one division per lane, not k in a row
    ids[j] = chosen[j];
    weights[j] = (norm_topk ? static_cast<float>(chosen_p[j] / s) : chosen_p[j]) * scale;
    if (counts) atomicAdd(counts + chosen[j], 1ull);
  }
  __syncwarp();
}

}  // namespace strata::cuda
