// Run-time choice of the kernel level: the best CPUID allows, or what set_cpu_kernel_level forced.
#include "strata/cpu/cpu_kernels.h"

#include <atomic>

#include "strata/base/error.h"

namespace strata {
namespace {

std::atomic<int> g_level{-1};
std::atomic<bool> g_fused{true};
std::atomic<bool> g_tiles{true};

CpuKernelLevel best_supported() {
  if (cpu_supports(CpuKernelLevel::Avx512)) return CpuKernelLevel::Avx512;
  if (cpu_supports(CpuKernelLevel::Avx2)) return CpuKernelLevel::Avx2;
  return CpuKernelLevel::Scalar;
}

}  // namespace

const char* cpu_kernel_level_name(CpuKernelLevel level) {
  switch (level) {
    case CpuKernelLevel::Scalar: return "scalar";
    case CpuKernelLevel::Avx2: return "avx2";
    case CpuKernelLevel::Avx512: return "avx512";
  }
  return "?";
}

bool cpu_supports(CpuKernelLevel level) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  switch (level) {
    case CpuKernelLevel::Scalar: return true;
    case CpuKernelLevel::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case CpuKernelLevel::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
             __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
  }
  return false;
#else
  return level == CpuKernelLevel::Scalar;
#endif
}

CpuKernelLevel cpu_kernel_level() {
  int l = g_level.load(std::memory_order_acquire);
  if (l < 0) {
    l = static_cast<int>(best_supported());
    int expected = -1;
    if (!g_level.compare_exchange_strong(expected, l)) l = expected;
  }
  return static_cast<CpuKernelLevel>(l);
}

void set_cpu_kernel_level(CpuKernelLevel level) {
  if (!cpu_supports(level)) fail("CPU kernel level ", cpu_kernel_level_name(level), " is not supported by this CPU");
  g_level.store(static_cast<int>(level), std::memory_order_release);
}

void set_cpu_fused_path(bool on) { g_fused.store(on, std::memory_order_relaxed); }
bool cpu_fused_path() { return g_fused.load(std::memory_order_relaxed); }
void set_cpu_tile_path(bool on) { g_tiles.store(on, std::memory_order_relaxed); }
bool cpu_tile_path() { return g_tiles.load(std::memory_order_relaxed); }

void fail_kernel_type(const char* what, GgmlType type) { fail(what, " for ", type_traits(type).name); }

const CpuKernels& cpu_kernels() {
  switch (cpu_kernel_level()) {
    case CpuKernelLevel::Scalar: return cpu_kernels_scalar();
    case CpuKernelLevel::Avx2: return cpu_kernels_avx2();
    case CpuKernelLevel::Avx512: return cpu_kernels_avx512();
  }
  fail("internal: bad CPU kernel level");
}

}  // namespace strata
