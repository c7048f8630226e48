#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "strata/cuda/bench_gpu.h"
#include "strata/cuda/cuda_check.h"

namespace strata::cuda {
namespace {

// Reads n 16-byte words of mapped host memory (each crossing PCIe), four loads in flight per thread;
// each block's XOR goes to out so that no load can be dropped.
__global__ void zero_copy_read_kernel(const uint4* p, size_t n, unsigned* out) {
  unsigned acc = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = __ldcv(p + i), b = __ldcv(p + i + stride), c = __ldcv(p + i + 2 * stride),
                d = __ldcv(p + i + 3 * stride);
    acc ^= a.x ^ a.w ^ b.y ^ b.z ^ c.x ^ c.w ^ d.y ^ d.z;
  }
  for (; i < n; i += stride) acc ^= __ldcv(p + i).x;
  __shared__ unsigned red;
  if (threadIdx.x == 0) red = 0;
  __syncthreads();
  atomicXor(&red, acc);
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = red;
}

// One thread's share of a CPU pass over buf: its slice read 8 bytes at a time (the compiler vectorises
// the loop), the XOR kept so the reads stay.
uint64_t read_slice(const uint64_t* p, size_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a ^= p[i];
    b ^= p[i + 1];
    c ^= p[i + 2];
    d ^= p[i + 3];
  }
  for (; i < n; ++i) a ^= p[i];
  return a ^ b ^ c ^ d;
}

// Freed on every way out.
struct Pinned {
  void* p = nullptr;
  ~Pinned() {
    if (p) cudaFreeHost(p);
  }
};
struct DeviceWords {
  unsigned* p = nullptr;
  ~DeviceWords() {
    if (p) cudaFree(p);
  }
};
struct Events {
  cudaEvent_t start = nullptr, stop = nullptr;
  ~Events() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
  }
};

}  // namespace

HostReadPaths measure_host_read_paths(size_t bytes, int cpu_threads, int passes) {
  HostReadPaths r;
  bytes -= bytes % sizeof(uint4);  // whole 16-byte words, as the kernel reads them
  r.bytes = bytes;
  r.cpu_threads = std::max(1, cpu_threads);
  passes = std::max(1, passes);
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    cudaGetLastError();
    r.error = "no CUDA device";
    return r;
  }
  check_cuda(cudaFree(nullptr), "CUDA context");  // the context is made here, outside the pinning's time
  Pinned gpu_buf, cpu_buf;
  // Both buffers pinned: cold experts read by either path would sit in such memory.
  const auto a0 = std::chrono::steady_clock::now();
  cudaError_t e = cudaHostAlloc(&gpu_buf.p, bytes, cudaHostAllocMapped);
  if (e == cudaSuccess) e = cudaHostAlloc(&cpu_buf.p, bytes, cudaHostAllocDefault);
  if (e != cudaSuccess) {
    cudaGetLastError();
    r.error = "two pinned buffers of " + std::to_string(bytes >> 20) + " MiB: " + cudaGetErrorString(e);
    return r;
  }
  std::memset(gpu_buf.p, 1, bytes);
  std::memset(cpu_buf.p, 2, bytes);
  r.pin_gbs = 2.0 * static_cast<double>(bytes) /
              std::chrono::duration<double>(std::chrono::steady_clock::now() - a0).count() / 1e9;
  void* dev_view = nullptr;
  check_cuda(cudaHostGetDevicePointer(&dev_view, gpu_buf.p, 0), "cudaHostGetDevicePointer");
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  r.gpu = prop.name;
  const int sms = prop.multiProcessorCount;
  const int blocks = sms * 8, threads = 256;
  DeviceWords out_buf;
  check_cuda(cudaMalloc(&out_buf.p, static_cast<size_t>(blocks) * sizeof(unsigned)), "cudaMalloc");
  unsigned* out = out_buf.p;
  Events ev;
  check_cuda(cudaEventCreate(&ev.start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&ev.stop), "cudaEventCreate");
  const cudaEvent_t start = ev.start, stop = ev.stop;
  const size_t words = bytes / sizeof(uint4);
  // The GPU's passes, timed by events; the best pass's rate.
  auto gpu_passes = [&] {
    float best = 1e30f;
    for (int i = 0; i < passes; ++i) {
      check_cuda(cudaEventRecord(start), "cudaEventRecord");
      zero_copy_read_kernel<<<blocks, threads>>>(static_cast<const uint4*>(dev_view), words, out);
      check_cuda(cudaGetLastError(), "zero-copy read kernel");
      check_cuda(cudaEventRecord(stop), "cudaEventRecord");
      check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      best = std::min(best, ms);
    }
    return static_cast<double>(bytes) / (best * 1e-3) / 1e9;
  };
  // CPU threads read cpu_buf pass after pass until `stop_flag` (or `passes` passes when it is null); the
  // rate is the bytes of whole passes over the time they took.
  const uint64_t* hp = static_cast<const uint64_t*>(cpu_buf.p);
  const size_t n64 = bytes / sizeof(uint64_t);
  std::atomic<uint64_t> sink{0};
  auto cpu_run = [&](const std::atomic<bool>* stop_flag) {
    const int T = r.cpu_threads;
    std::vector<std::thread> pool;
    std::vector<double> rate(static_cast<size_t>(T), 0.0);
    for (int t = 0; t < T; ++t)
      pool.emplace_back([&, t] {
        const size_t lo = n64 * static_cast<size_t>(t) / static_cast<size_t>(T);
        const size_t hi = n64 * static_cast<size_t>(t + 1) / static_cast<size_t>(T);
        uint64_t x = 0;
        int done = 0;
        double best_s = 1e30;
        const auto t0 = std::chrono::steady_clock::now();
        while (stop_flag ? !stop_flag->load(std::memory_order_relaxed) : done < passes) {
          const auto a = std::chrono::steady_clock::now();
          x ^= read_slice(hp + lo, hi - lo);
          best_s = std::min(best_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
          ++done;
        }
        const double span = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double slice = static_cast<double>(hi - lo) * sizeof(uint64_t);
        // Alone: the best pass; sharing: the average from this thread's start to its last whole pass.
        rate[static_cast<size_t>(t)] = stop_flag ? slice * done / span : slice / best_s;
        sink.fetch_xor(x, std::memory_order_relaxed);
      });
    for (std::thread& th : pool) th.join();
    double sum = 0;
    for (double v : rate) sum += v;
    return sum / 1e9;
  };
  zero_copy_read_kernel<<<blocks, threads>>>(static_cast<const uint4*>(dev_view), words, out);  // warm-up
  check_cuda(cudaGetLastError(), "zero-copy read kernel");
  check_cuda(cudaDeviceSynchronize(), "zero-copy read");
  r.gpu_alone_gbs = gpu_passes();
  r.cpu_alone_gbs = cpu_run(nullptr);
  std::atomic<bool> stop_flag{false};
  double cpu_shared = 0;
  std::thread readers([&] { cpu_shared = cpu_run(&stop_flag); });
  struct Join {  // the readers stop and are joined on every way out, a failed GPU pass included
    std::atomic<bool>& flag;
    std::thread& t;
    ~Join() {
      flag = true;
      if (t.joinable()) t.join();
    }
  } join{stop_flag, readers};
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the readers are running
  r.gpu_shared_gbs = gpu_passes();
  stop_flag = true;
  readers.join();
  r.cpu_shared_gbs = cpu_shared;
  r.checksum = sink.load() ^ static_cast<uint64_t>(words);
  return r;
}

}  // namespace strata::cuda
