#include "strata/cuda/bench_gpu.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "strata/cuda/cuda_check.h"
#include "strata/cuda/device_memory.h"
#include "strata/cuda/gpu_session.h"

namespace strata::cuda {

std::vector<std::pair<std::string, size_t>> gpu_vram_by_tier(const Sequence& sequence) {
  const auto* gpu = dynamic_cast<const GpuSession*>(&sequence);
  if (gpu == nullptr) return {};
  return {{"weights", gpu->weight_bytes()}, {"state+workspace", gpu->state_bytes()}};
}

BandwidthResult measure_gpu_copy_bandwidth(size_t bytes, int passes) {
  struct Buffer {  // freed on every way out
    void* p;
    ~Buffer() { device_free(p); }
  };
  const Buffer ba{device_alloc(bytes, "the bandwidth copy")}, bb{device_alloc(bytes, "the bandwidth copy")};
  void* a = ba.p;
  void* b = bb.p;
  check_cuda(cudaMemset(a, 1, bytes), "cudaMemset");
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  check_cuda(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy");  // warm-up
  float best_ms = 1e30f;
  for (int i = 0; i < passes; ++i) {
    check_cuda(cudaEventRecord(start), "cudaEventRecord");
    check_cuda(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy");
    check_cuda(cudaEventRecord(stop), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    best_ms = std::min(best_ms, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  BandwidthResult r;
  r.triad_gbs = 2.0 * static_cast<double>(bytes) / (best_ms * 1e-3) / 1e9;
  r.array_bytes = bytes;
  r.threads = 0;
  r.passes = passes;
  r.source = "GPU device-to-device copy (read+write)";
  return r;
}

std::string format_host_read_paths(const HostReadPaths& r) {
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "host read paths (%zu MiB each, %s): CPU %d threads %.1f GB/s alone, GPU zero-copy over PCIe %.1f "
                "GB/s alone; both at once %.1f + %.1f = %.1f GB/s; pinning and filling %.1f GB/s\n",
                r.bytes >> 20, r.gpu.c_str(), r.cpu_threads, r.cpu_alone_gbs, r.gpu_alone_gbs, r.cpu_shared_gbs,
                r.gpu_shared_gbs, r.cpu_shared_gbs + r.gpu_shared_gbs, r.pin_gbs);
  return buf;
}

}  // namespace strata::cuda
