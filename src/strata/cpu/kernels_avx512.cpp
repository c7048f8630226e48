// AVX-512 level (F, BW, VL, VNNI; plus FMA/F16C): 16-wide float dots and int8->float expansion on
// the float path, VNNI dot products (vpdpbusd) on the int8 path. Compiled for those extensions by
// the target pragma below; only used when cpu_supports(CpuKernelLevel::Avx512).
#include <immintrin.h>

#include <cstring>

#include "strata/cpu/cpu_kernels.h"
#include "strata/quant/blocks.h"
#include "strata/quant/fp16.h"
#include "strata/quant/quantize.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
// GCC 12's AVX-512 intrinsics start from _mm*_undefined_*() and then warn about it at -O3
// (GCC bug 105593): a false positive inside the compiler's own header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define STRATA_X86_512 1
#include "strata/cpu/kernels_x86_impl.h"
#undef STRATA_X86_512
#pragma GCC diagnostic pop
#pragma GCC pop_options

namespace strata {

const CpuKernels& cpu_kernels_avx512() {
  static constexpr CpuKernels k = {CpuKernelLevel::Avx512, decode_row_simd, dot_rows_simd, direct_float, dot_rows_direct, i8_format, unpack_i8, dot_rows_i8,
                                   dot_rows_fused, dot_tile_fused, quantize_act_simd};
  return k;
}

}  // namespace strata
