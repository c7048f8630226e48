// KV cache rows on the GPU in the cache's storage type (model/kv_type.h): float or __half elements
// (device_math.cuh's kv_load / kv_store read and write them as float), and the host-side dispatch that picks a kernel instance for the K and V
// types of a sequence. q8_0 caches are CPU-only (check_gpu_kv_types refuses them).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "strata/base/error.h"
#include "strata/cuda/device_math.cuh"
#include "strata/model/kv_type.h"

namespace strata::cuda {

// Four consecutive values from a row (p 16-byte aligned for float, 8-byte for __half).
__device__ __forceinline__ float4 kv_load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 kv_load4(const __half* p) {
  const __half2* h = reinterpret_cast<const __half2*>(p);
  const float2 a = __half22float2(h[0]), b = __half22float2(h[1]);
  return make_float4(a.x, a.y, b.x, b.y);
}

// Cache row of position p: the position itself, or p % rows in a sliding layer's ring of rows rows
// (DeviceLayerState::rows; a full layer's rows are the context, so p < rows there).
// 32-bit: the attention loops call it for every cache row they read, and a 64-bit remainder costs several
// times a 32-bit one (positions are below the int context size).
__device__ __forceinline__ int64_t ring_row(int p, int rows) { return p < rows ? p : p % rows; }

// Calls f(TK{}, TV{}) with the element types of the K and V caches (float for f32, __half for f16).
template <typename F>
void with_kv_types(KvCacheTypes kv, F&& f) {
  auto with_v = [&](auto tk) {
    if (kv.v == KvType::F32) return f(tk, float{});
    if (kv.v == KvType::F16) return f(tk, __half{});
    fail("CUDA backend: KV cache type ", kv_type_name(kv.v), " for values is not supported on the GPU (f32, f16)");
  };
  if (kv.k == KvType::F32) return with_v(float{});
  if (kv.k == KvType::F16) return with_v(__half{});
  fail("CUDA backend: KV cache type ", kv_type_name(kv.k), " for keys is not supported on the GPU (f32, f16)");
}

}  // namespace strata::cuda
