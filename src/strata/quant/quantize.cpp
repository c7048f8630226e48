// quantize_row: float rows into the block formats marked can_quantize in types.cpp. The simple
// 32-weight formats live here; K-quants in quantize_kquants.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "strata/base/error.h"
#include "strata/quant/blocks.h"
#include "strata/quant/fp16.h"
#include "strata/quant/quantize.h"
#include "strata/quant/quantize_kquants.h"
#include "strata/quant/scale_fit.h"

namespace strata {
namespace {

using namespace blocks;
using quant_detail::round_clamp;

void quantize_q8_0(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK, dst += sizeof(Q8_0)) {
    Q8_0 blk{};
    float amax = 0;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    // Codes are chosen against the stored (f16-rounded) scale, so dequantising gives d16*q exactly.
    blk.d = fp32_to_fp16(amax / 127.0f);
    const float d = fp16_to_fp32(blk.d);
    const float inv = d > 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < kQK; ++j) blk.qs[j] = static_cast<int8_t>(round_clamp(x[j] * inv, -127, 127));
    std::memcpy(dst, &blk, sizeof blk);
  }
}

void quantize_q4_0(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK, dst += sizeof(Q4_0)) {
    Q4_0 blk{};
    blk.d = fp32_to_fp16(quant_detail::fit_scale_symmetric(x, kQK, -8, 7));
    const float d = fp16_to_fp32(blk.d);
    const float inv = d != 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < 16; ++j) {
      const int lo = round_clamp(x[j] * inv, -8, 7) + 8;
      const int hi = round_clamp(x[j + 16] * inv, -8, 7) + 8;
      blk.qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
    std::memcpy(dst, &blk, sizeof blk);
  }
}

}  // namespace

void quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
  const TypeTraits& t = type_traits(type);
  if (!t.can_quantize) fail("quantize_row: cannot quantise to ", t.name, " (decoding only)");
  row_bytes(type, n);  // validates that n is a whole number of blocks
  auto* out = static_cast<uint8_t*>(dst);
  const int64_t nb = n / t.block_elems;
  switch (type) {
    case GgmlType::F32: std::memcpy(out, src, static_cast<size_t>(n) * 4); return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_fp16(src[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_bf16(src[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case GgmlType::Q8_0: quantize_q8_0(src, out, nb); return;
    case GgmlType::Q4_0: quantize_q4_0(src, out, nb); return;
    case GgmlType::Q4_K: quant_detail::quantize_q4_k(src, out, nb); return;
    case GgmlType::Q5_K: quant_detail::quantize_q5_k(src, out, nb); return;
    case GgmlType::Q6_K: quant_detail::quantize_q6_k(src, out, nb); return;
    case GgmlType::Q8_K: quant_detail::quantize_q8_k(src, out, nb); return;
    default: break;
  }
  fail("quantize_row: no encoder for ", t.name);
}

}  // namespace strata
