// The CUDA backend as `strata bench` sees it: a BenchBackend over GpuSession, and the GPU memory
// bandwidth that decode floors are computed from when benchmarking on the GPU.
#pragma once

#include <cstddef>
#include <memory>

#include "strata/cuda/gpu_session.h"
#include "strata/engine/bench_backend.h"
#include "strata/engine/bench_bandwidth.h"

namespace strata::cuda {

// A GpuSession on `model` (weights uploaded now) holding at most max_ctx tokens.
// options: e.g. an expert slot map for the hybrid hot/cold mode (issue 8).
std::unique_ptr<BenchBackend> make_gpu_bench_backend(const Model& model, int max_ctx, GpuSessionOptions options = {});

// The hybrid telemetry of a backend from make_gpu_bench_backend; fails when it is not hybrid.
HybridTelemetry gpu_bench_hybrid_telemetry(const BenchBackend& backend);
void gpu_bench_reset_hybrid_telemetry(BenchBackend& backend);

// Device-to-device copy of `bytes`, best of `passes`; counts bytes read + written, as HBM floors do.
BandwidthResult measure_gpu_copy_bandwidth(size_t bytes = size_t(1) << 30, int passes = 5);

}  // namespace strata::cuda
