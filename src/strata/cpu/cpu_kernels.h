// Row-dot kernels behind matmul/matvec, in several instruction-set levels chosen at run time.
// Every level computes the same thing: weights are decoded to float32 (on the fly, a few rows at a
// time) and dotted with float32 activations, so F32/F16/BF16 weights keep full float precision.
// Levels differ only in speed; tests/test_matmul.cpp checks each against a float64 reference.
#pragma once

#include <cstdint>

#include "strata/quant/types.h"

namespace strata {

enum class CpuKernelLevel { Scalar = 0, Avx2 = 1, Avx512 = 2 };

// Maximum rows one dot call handles (the row tile of matmul).
constexpr int kMaxDotRows = 4;

struct CpuKernels {
  CpuKernelLevel level;
  // Decodes n weights (a whole number of blocks) of `type` at src (any alignment) into dst.
  // Fails loudly for a type the level cannot decode (none today: every level covers types.h).
  void (*decode_row)(GgmlType type, const uint8_t* src, float* dst, int64_t n);
  // out[r] = dot(rows[r][0..n), x[0..n)) for r < nr (1 <= nr <= kMaxDotRows).
  void (*dot_rows)(const float* const* rows, int nr, const float* x, int64_t n, float* out);
};

// Name as STRATA_CPU_KERNELS spells it: "scalar", "avx2", "avx512".
const char* cpu_kernel_level_name(CpuKernelLevel level);
// Whether this CPU can run the level (CPUID via __builtin_cpu_supports).
bool cpu_supports(CpuKernelLevel level);
// The level matmul uses: STRATA_CPU_KERNELS when set (fails if unknown or unsupported by the CPU),
// otherwise the best supported one. Decided on first use.
CpuKernelLevel cpu_kernel_level();
// Forces a level for the rest of the process (tests, benchmarks). Throws if the CPU lacks it.
void set_cpu_kernel_level(CpuKernelLevel level);
// Kernels of the active level.
const CpuKernels& cpu_kernels();

// Per-level tables (defined in kernels_*.cpp). Only call one the CPU supports.
const CpuKernels& cpu_kernels_scalar();
const CpuKernels& cpu_kernels_avx2();
const CpuKernels& cpu_kernels_avx512();

}  // namespace strata
