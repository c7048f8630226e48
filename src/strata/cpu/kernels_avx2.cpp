// AVX2 + FMA + F16C level. Compiled for those extensions by the target pragma below (the rest of
// the build stays portable); only used when cpu_supports(CpuKernelLevel::Avx2).
#include <immintrin.h>

#include <cstring>

#include "strata/cpu/cpu_kernels.h"
#include "strata/quant/blocks.h"
#include "strata/quant/fp16.h"
#include "strata/quant/quantize.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define STRATA_X86_512 0
#include "strata/cpu/kernels_x86_impl.h"
#undef STRATA_X86_512
#pragma GCC pop_options

namespace strata {

const CpuKernels& cpu_kernels_avx2() {
  static constexpr CpuKernels k = {CpuKernelLevel::Avx2, decode_row_simd, dot_rows_simd, direct_float, dot_rows_direct, i8_format, unpack_i8, dot_rows_i8,
                                   dot_rows_fused, dot_tile_fused, quantize_act_simd};
  return k;
}

}  // namespace strata
