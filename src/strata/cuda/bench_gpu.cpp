#include "strata/cuda/bench_gpu.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "strata/base/error.h"
#include "strata/cuda/cuda_check.h"
#include "strata/cuda/gpu_session.h"
#include "strata/engine/model.h"

namespace strata::cuda {
namespace {

class GpuBenchBackend final : public BenchBackend {
 public:
  GpuBenchBackend(const Model& model, int max_ctx, GpuSessionOptions options)
      : session_(make_gpu_session(model, max_ctx, std::move(options))) {}
  GpuSession& session() const { return *session_; }
  std::string name() const override { return "cuda"; }
  int64_t n_vocab() const override { return session_->model().config().n_vocab; }
  void reset() override { session_->reset(); }
  void forward(const int32_t* tokens, int n, float* logits, bool all_positions) override {
    session_->forward(tokens, n, logits, all_positions);
  }
  // The arg-max runs on the GPU at the end of the step's graph; only the token id comes back.
  int32_t decode_greedy(int32_t token, float*) override { return session_->decode_argmax(token); }
  bool greedy_on_device() const override { return true; }
  std::vector<std::pair<std::string, size_t>> vram_by_tier() const override {
    return {{"weights", session_->weight_bytes()}, {"state+workspace", session_->state_bytes()}};
  }

 private:
  std::unique_ptr<GpuSession> session_;
};

}  // namespace

std::unique_ptr<BenchBackend> make_gpu_bench_backend(const Model& model, int max_ctx, GpuSessionOptions options) {
  return std::make_unique<GpuBenchBackend>(model, max_ctx, std::move(options));
}

namespace {
GpuSession& gpu_session_of(const BenchBackend& backend) {
  const auto* b = dynamic_cast<const GpuBenchBackend*>(&backend);
  if (b == nullptr) fail("hybrid telemetry: the bench backend is not a GPU session");
  return b->session();
}
}  // namespace

HybridTelemetry gpu_bench_hybrid_telemetry(const BenchBackend& backend) {
  return gpu_session_of(backend).hybrid_telemetry();
}

void gpu_bench_reset_hybrid_telemetry(BenchBackend& backend) { gpu_session_of(backend).reset_hybrid_telemetry(); }

BandwidthResult measure_gpu_copy_bandwidth(size_t bytes, int passes) {
  void* a = nullptr;
  void* b = nullptr;
  check_cuda(cudaMalloc(&a, bytes), "cudaMalloc");
  check_cuda(cudaMalloc(&b, bytes), "cudaMalloc");
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
  cudaFree(a);
  cudaFree(b);
  BandwidthResult r;
  r.triad_gbs = 2.0 * static_cast<double>(bytes) / (best_ms * 1e-3) / 1e9;
  r.array_bytes = bytes;
  r.threads = 0;
  r.passes = passes;
  r.source = "GPU device-to-device copy (read+write)";
  return r;
}

}  // namespace strata::cuda
