// The cost of a dependency between decode-step launches (issues 19 and 24): a CUDA graph of 280
// dependent kernel launches (with and without programmatic dependent launch) against one persistent
// cooperative kernel whose 280 steps meet at a grid barrier. Each step reads the previous step's
// 2,048-float vector (as a decode launch reads the residual stream), reduces it per block and reads
// its own slice of B bytes of weights (0, 2, 6 or 12 MiB a step, never re-read: the weights come from
// DRAM). Prints microseconds per step and the weight bandwidth; a streaming kernel over the same bytes
// gives the floor. Last, the PDL chain again with each block staging its input as strata's decode
// matvec does (RMSNorm with a double sum, the vector in shared memory, its int8 form per 32 values):
// the difference is that staging's cost per launch; then staged with the block's weights (its first
// kPre x 16 bytes a thread: at these sizes the whole slice) loaded into registers before the staging.
// Run: build/launch_chain [staging] (CUDA builds only).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                               \
  do {                                                                      \
    cudaError_t e = (x);                                                    \
    if (e != cudaSuccess) {                                                 \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      std::exit(1);                                                         \
    }                                                                       \
  } while (0)

constexpr int N = 2048;
constexpr int TH = 256;

__device__ __forceinline__ void pdl_go() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// The block's sum of v (every thread gets it), for float or double.
template <class T>
__device__ __forceinline__ T block_sum(T v) {
  __shared__ T part[TH / 32];
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(~0u, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  T s = 0;
  for (int i = 0; i < TH / 32; ++i) s += part[i];
  return s;
}

// A decode matvec block's staging of x (N floats, read through L2): rmsnorm with the sum in double,
// the normed vector in shared memory, then its int8 form (per 32 values: amax over eight lanes, codes,
// scale). Returns a value that depends on all of it.
__device__ __forceinline__ float stage_like_strata(const float* x) {
  __shared__ float xs[N];
  __shared__ int8_t q[N];
  __shared__ float d32[N / 32];
  const float4* x4 = reinterpret_cast<const float4*>(x);
  float4 a[2];
  double ss = 0.0;
  for (int i = 0; i < 2; ++i) a[i] = __ldcg(x4 + threadIdx.x + i * TH);
  for (int i = 0; i < 2; ++i)
    ss += static_cast<double>(a[i].x) * a[i].x + static_cast<double>(a[i].y) * a[i].y +
          static_cast<double>(a[i].z) * a[i].z + static_cast<double>(a[i].w) * a[i].w;
  ss = block_sum(ss);
  const float inv = static_cast<float>(1.0 / sqrt(ss / N + 1e-6));
  for (int i = 0; i < 2; ++i) {
    const float4 t = make_float4(a[i].x * inv, a[i].y * inv, a[i].z * inv, a[i].w * inv);
    reinterpret_cast<float4*>(xs)[threadIdx.x + i * TH] = t;
  }
  __syncthreads();
  for (int base = 4 * threadIdx.x; base < N; base += 4 * TH) {
    const float4 t = *reinterpret_cast<const float4*>(xs + base);
    float amax = fmaxf(fmaxf(fabsf(t.x), fabsf(t.y)), fmaxf(fabsf(t.z), fabsf(t.w)));
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(~0u, amax, o));
    const float r = amax > 0.0f ? 127.0f / amax : 0.0f;
    q[base] = static_cast<int8_t>(__float2int_rn(t.x * r));
    q[base + 1] = static_cast<int8_t>(__float2int_rn(t.y * r));
    q[base + 2] = static_cast<int8_t>(__float2int_rn(t.z * r));
    q[base + 3] = static_cast<int8_t>(__float2int_rn(t.w * r));
    if ((threadIdx.x & 7) == 0) d32[base >> 5] = amax / 127.0f;
  }
  __syncthreads();
  return xs[threadIdx.x] + static_cast<float>(q[threadIdx.x]) * d32[threadIdx.x >> 5];
}

// One step's work for virtual block b of nb: read x (2048 floats, L2), reduce (kStage: stage it as
// strata does); read this block's slice of the step's weights; write y[b % N]. pre: the first
// kPre * TH units of the slice, already loaded into registers by the caller (kHasPre).
constexpr int kPre = 8;
template <bool kStage = false, bool kHasPre = false>
__device__ __forceinline__ void step_body(const float* x, float* y, const uint4* w, size_t per_block_u4, int b,
                                          const uint4* pre = nullptr) {
  float v = 0;
  if constexpr (kStage) {
    v = stage_like_strata(x);
  } else {
    for (int i = threadIdx.x; i < N; i += TH) v += __ldcg(x + i);
  }
  unsigned acc = 0;
  const uint4* p = w + per_block_u4 * b;
  size_t i = threadIdx.x;
  if constexpr (kHasPre) {
#pragma unroll
    for (int u = 0; u < kPre; ++u) acc += pre[u].x ^ pre[u].y ^ pre[u].z ^ pre[u].w;
    i += kPre * TH;
  }
  for (; i + 3 * TH < per_block_u4; i += 4 * TH) {
    uint4 a0 = __ldcs(p + i), a1 = __ldcs(p + i + TH), a2 = __ldcs(p + i + 2 * TH), a3 = __ldcs(p + i + 3 * TH);
    acc +=
        a0.x ^ a0.y ^ a0.z ^ a0.w ^ a1.x ^ a1.y ^ a1.z ^ a1.w ^ a2.x ^ a2.y ^ a2.z ^ a2.w ^ a3.x ^ a3.y ^ a3.z ^ a3.w;
  }
  for (; i < per_block_u4; i += TH) {
    uint4 a = __ldcs(p + i);
    acc += a.x ^ a.y ^ a.z ^ a.w;
  }
  float s = block_sum(v + (acc & 1) * 1e-30f);
  if (threadIdx.x == 0) y[b % N] = s * 1e-3f + 1.0f;
}

// The first kPre * TH units of block b's slice into registers (zeros past its end).
__device__ __forceinline__ void load_pre(const uint4* w, size_t per_block_u4, int b, uint4* pre) {
  const uint4* p = w + per_block_u4 * b;
#pragma unroll
  for (int u = 0; u < kPre; ++u) {
    const size_t i = threadIdx.x + static_cast<size_t>(u) * TH;
    pre[u] = i < per_block_u4 ? __ldcs(p + i) : make_uint4(0, 0, 0, 0);
  }
}

__device__ __forceinline__ void prefetch_slice(const uint4* w, size_t per_block_u4, int b) {
  const char* p = reinterpret_cast<const char*>(w + per_block_u4 * b);
  const size_t bytes = per_block_u4 * 16;
  for (size_t o = threadIdx.x * 128; o < bytes; o += TH * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
}

template <bool kStage = false>
__global__ void __launch_bounds__(TH, 3)
    chain_kernel(const float* x, float* y, const uint4* w, size_t per_block_u4, int pf) {
  pdl_go();
  if (pf && per_block_u4) prefetch_slice(w, per_block_u4, blockIdx.x);
  pdl_wait();
  step_body<kStage>(x, y, w, per_block_u4, blockIdx.x);
}

// The staged chain with the block's first weights loaded into registers before the staging: before
// the wait (kBeforeWait: weights no kernel writes) or right after it.
template <bool kBeforeWait>
__global__ void __launch_bounds__(TH, 3)
    chain_pre_kernel(const float* x, float* y, const uint4* w, size_t per_block_u4, int pf) {
  pdl_go();
  uint4 pre[kPre];
  if constexpr (kBeforeWait) load_pre(w, per_block_u4, blockIdx.x, pre);
  if (pf && per_block_u4 > kPre * TH)  // the rest of this block's slice
    prefetch_slice(w + per_block_u4 * blockIdx.x + kPre * TH, per_block_u4 - kPre * TH, 0);
  pdl_wait();
  if constexpr (!kBeforeWait) load_pre(w, per_block_u4, blockIdx.x, pre);
  step_body<true, true>(x, y, w, per_block_u4, blockIdx.x, pre);
}

struct Bar {
  unsigned count;
  unsigned gen;
};

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void grid_barrier(Bar* bar, unsigned nb) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned g = ld_acquire(&bar->gen);
    __threadfence();
    if (atomicAdd(&bar->count, 1u) == nb - 1) {
      bar->count = 0;
      __threadfence();
      atomicExch(&bar->gen, g + 1);
    } else {
      while (ld_acquire(&bar->gen) == g) {
        __nanosleep(20);
      }
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(TH, 3)
    persist_kernel(float* bufs, const uint4* w, size_t per_block_u4, size_t step_u4, int steps, Bar* bar, int pf) {
  const unsigned nb = gridDim.x;
  for (int s = 0; s < steps; ++s) {
    const float* x = bufs + (s & 1) * N;
    float* y = bufs + ((s + 1) & 1) * N;
    step_body(x, y, w + step_u4 * s, per_block_u4, blockIdx.x);
    if (pf && per_block_u4 && s + 1 < steps) prefetch_slice(w + step_u4 * (s + 1), per_block_u4, blockIdx.x);
    grid_barrier(bar, nb);
  }
}

__global__ void stream_kernel(const uint4* w, size_t n_u4, unsigned* out) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * (size_t)TH + threadIdx.x; i < n_u4; i += (size_t)gridDim.x * TH) {
    uint4 a = __ldcs(w + i);
    acc += a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x12345) out[0] = acc;
}

int main(int argc, char** argv) {
  // `launch_chain staging`: the staging table only.
  const bool staging_only = argc > 1 && std::strcmp(argv[1], "staging") == 0;
  const int steps = 280;
  int nsm = 0;
  CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
  int occ = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, persist_kernel, TH, 0));
  printf("SMs %d, persistent blocks/SM %d\n", nsm, occ);
  const size_t total = (size_t)6 << 30;  // 6 GiB of weights
  uint4* w;
  CK(cudaMalloc(&w, total));
  CK(cudaMemset(w, 1, total));
  float* bufs;
  CK(cudaMalloc(&bufs, 2 * N * sizeof(float)));
  CK(cudaMemset(bufs, 0, 2 * N * sizeof(float)));
  Bar* bar;
  CK(cudaMalloc(&bar, sizeof(Bar)));
  CK(cudaMemset(bar, 0, sizeof(Bar)));
  unsigned* out;
  CK(cudaMalloc(&out, 4));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);

  auto time_it = [&](auto&& fn) {
    std::vector<float> t;
    for (int r = 0; r < 12; ++r) {
      CK(cudaEventRecord(e0, st));
      fn();
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float ms;
      cudaEventElapsedTime(&ms, e0, e1);
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };

  // One graph of what capture() launches on st, timed as a whole.
  auto time_graph = [&](auto&& capture) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    capture();
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    const float ms = time_it([&] { CK(cudaGraphLaunch(ge, st)); });
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    return ms;
  };
  // A launch of nb blocks on st with the one attribute at.
  auto config = [&](int nb, cudaLaunchAttribute* at) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(nb);
    cfg.blockDim = dim3(TH);
    cfg.stream = st;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cfg;
  };

  // A graph of `steps` dependent launches of kernel, step s reading the vector step s - 1 wrote and its
  // own weights.
  auto time_chain = [&](auto kernel, int nb, size_t per_block_u4, size_t step_u4, int pf, int pdl) {
    return time_graph([&] {
      for (int s = 0; s < steps; ++s) {
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = pdl;
        const cudaLaunchConfig_t cfg = config(nb, at);
        const float* x = bufs + (s & 1) * N;
        float* y = bufs + ((s + 1) & 1) * N;
        CK(cudaLaunchKernelEx(&cfg, kernel, x, y, (const uint4*)(w + step_u4 * s), per_block_u4, pf));
      }
    });
  };

  for (size_t step_bytes : {(size_t)0, (size_t)2 << 20, (size_t)6 << 20, (size_t)12 << 20}) {
    if (staging_only) break;
    for (int blocks_per_sm : {2, 3}) {
      const int nb = nsm * blocks_per_sm;
      const size_t per_block_u4 = step_bytes / 16 / nb;
      const size_t step_u4 = step_bytes / 16;
      for (int pf : {0, 1}) {
        if (step_bytes == 0 && pf) continue;
        for (int pdl : {0, 1}) {
          const float ms = time_chain(chain_kernel<false>, nb, per_block_u4, step_u4, pf, pdl);
          printf("chain   bytes/step %5.1f MB  blocks %3d  pf %d pdl %d : %7.2f us/step  (%6.0f GB/s)\n",
                 step_bytes / 1048576.0, nb, pf, pdl, ms * 1000 / steps, step_bytes * steps / (ms * 1e6));
        }
        if (blocks_per_sm <= occ) {
          const float ms = time_graph([&] {
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeCooperative;
            at[0].val.cooperative = 1;
            const cudaLaunchConfig_t cfg = config(nb, at);
            CK(cudaLaunchKernelEx(&cfg, persist_kernel, bufs, (const uint4*)w, per_block_u4, step_u4, steps, bar, pf));
          });
          printf("persist bytes/step %5.1f MB  blocks %3d  pf %d       : %7.2f us/step  (%6.0f GB/s)\n",
                 step_bytes / 1048576.0, nb, pf, ms * 1000 / steps, step_bytes * steps / (ms * 1e6));
        }
      }
    }
    if (step_bytes) {
      const size_t n_u4 = step_bytes * steps / 16;
      const float ms = time_it([&] { stream_kernel<<<nsm * 8, TH, 0, st>>>(w, n_u4, out); });
      printf("stream  %.0f MB in one kernel: %.1f GB/s\n", step_bytes * steps / 1048576.0,
             step_bytes * steps / (ms * 1e6));
    }
  }
  // The PDL chain with and without strata's staging of the input in every block, and staged with the
  // block's first kPre x 16 bytes a thread of weights in registers before the staging (loaded before or
  // after the wait). Up to 6 MiB a step the slices are smaller than that: the whole slice is in registers.
  for (size_t step_bytes : {(size_t)0, (size_t)2 << 20, (size_t)6 << 20}) {
    for (int blocks_per_sm : {2, 3}) {
      const int nb = nsm * blocks_per_sm;
      const size_t per_block_u4 = step_bytes / 16 / nb, step_u4 = step_bytes / 16;
      const float plain = time_chain(chain_kernel<false>, nb, per_block_u4, step_u4, 1, 1);
      const float staged = time_chain(chain_kernel<true>, nb, per_block_u4, step_u4, 1, 1);
      const float pre_after = time_chain(chain_pre_kernel<false>, nb, per_block_u4, step_u4, 1, 1);
      const float pre_before = time_chain(chain_pre_kernel<true>, nb, per_block_u4, step_u4, 1, 1);
      printf("staging bytes/step %5.1f MB  blocks %3d  pf 1 pdl 1 : %7.2f us/step plain, %7.2f staged, %7.2f staged "
             "+ registers after the wait, %7.2f before it\n",
             step_bytes / 1048576.0, nb, plain * 1000 / steps, staged * 1000 / steps, pre_after * 1000 / steps,
             pre_before * 1000 / steps);
    }
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
