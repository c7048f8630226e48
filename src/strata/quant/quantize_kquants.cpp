// K-quant encoders: per sub-block scale (and min) search, then the sub-block scales are themselves
// quantised against the super-block's f16 scale(s), and the codes are chosen against the final,
// stored scales so that the decoder reproduces exactly what the error was minimised for.
#include "strata/quant/quantize_kquants.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "strata/quant/blocks.h"
#include "strata/quant/fp16.h"
#include "strata/quant/scale_fit.h"

namespace strata::quant_detail {
namespace {

using namespace blocks;

// Packs eight 6-bit scales and mins into the 12-byte Q4_K/Q5_K layout (inverse of k4_scale_min).
void pack_k4_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t out[12]) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
}

// Shared by Q4_K (nmax 15) and Q5_K (nmax 31): fills d, dmin, scales and the codes q[256].
void choose_k4_block(const float* x, int nmax, uint16_t& d16, uint16_t& dmin16, uint8_t scales[12],
                     uint8_t q[256]) {
  float s[8], mn[8];
  float smax = 0, mmax = 0;
  for (int j = 0; j < 8; ++j) {
    fit_scale_min(x + 32 * j, 32, nmax, s[j], mn[j]);
    smax = std::max(smax, s[j]);
    mmax = std::max(mmax, mn[j]);
  }
  d16 = fp32_to_fp16(smax / 63.0f);
  dmin16 = fp32_to_fp16(mmax / 63.0f);
  const float d = fp16_to_fp32(d16), dmin = fp16_to_fp32(dmin16);
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(d > 0 ? round_clamp(s[j] / d, 0, 63) : 0);
    m[j] = static_cast<uint8_t>(dmin > 0 ? round_clamp(mn[j] / dmin, 0, 63) : 0);
    const float ds = d * sc[j], dm = dmin * m[j];
    const float inv = ds > 0 ? 1.0f / ds : 0.0f;
    for (int l = 0; l < 32; ++l) q[32 * j + l] = static_cast<uint8_t>(round_clamp((x[32 * j + l] + dm) * inv, 0, nmax));
  }
  pack_k4_scales(sc, m, scales);
}

}  // namespace

void quantize_q4_k(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK_K, dst += sizeof(Q4_K)) {
    Q4_K blk{};
    uint8_t q[256];
    choose_k4_block(x, 15, blk.d, blk.dmin, blk.scales, q);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) blk.qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
    std::memcpy(dst, &blk, sizeof blk);
  }
}

void quantize_q5_k(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK_K, dst += sizeof(Q5_K)) {
    Q5_K blk{};
    uint8_t q[256];
    choose_k4_block(x, 31, blk.d, blk.dmin, blk.scales, q);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l)
        blk.qs[32 * c + l] = static_cast<uint8_t>((q[64 * c + l] & 15) | ((q[64 * c + 32 + l] & 15) << 4));
    for (int sb = 0; sb < 8; ++sb)
      for (int l = 0; l < 32; ++l) blk.qh[l] = static_cast<uint8_t>(blk.qh[l] | ((q[32 * sb + l] >> 4) << sb));
    std::memcpy(dst, &blk, sizeof blk);
  }
}

void quantize_q6_k(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK_K, dst += sizeof(Q6_K)) {
    Q6_K blk{};
    float s[16];
    float amax = 0;
    for (int j = 0; j < 16; ++j) {
      s[j] = fit_scale_symmetric(x + 16 * j, 16, -32, 31);
      amax = std::max(amax, std::fabs(s[j]));
    }
    blk.d = fp32_to_fp16(amax / 127.0f);
    const float d = fp16_to_fp32(blk.d);
    uint8_t q[256];
    for (int j = 0; j < 16; ++j) {
      const int sc = d > 0 ? round_clamp(s[j] / d, -128, 127) : 0;
      blk.scales[j] = static_cast<int8_t>(sc);
      const float ds = d * static_cast<float>(sc);
      const float inv = ds != 0 ? 1.0f / ds : 0.0f;
      for (int l = 0; l < 16; ++l) q[16 * j + l] = static_cast<uint8_t>(round_clamp(x[16 * j + l] * inv, -32, 31) + 32);
    }
    // Inverse of the decoder's layout (see dequantize.cpp, dequant_q6_k).
    for (int n = 0; n < 2; ++n)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l) {
          const int v = q[128 * n + 32 * k + l];
          uint8_t& lb = blk.ql[64 * n + l + 32 * (k & 1)];
          lb = static_cast<uint8_t>(lb | ((v & 15) << (k < 2 ? 0 : 4)));
          blk.qh[32 * n + l] = static_cast<uint8_t>(blk.qh[32 * n + l] | ((v >> 4) << (2 * k)));
        }
    std::memcpy(dst, &blk, sizeof blk);
  }
}

void quantize_q8_k(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK_K, dst += sizeof(Q8_K)) {
    Q8_K blk{};
    float amax = 0;
    for (int j = 0; j < kQK_K; ++j) amax = std::max(amax, std::fabs(x[j]));
    blk.d = amax / 127.0f;
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    for (int j = 0; j < kQK_K; ++j) blk.qs[j] = static_cast<int8_t>(round_clamp(x[j] * inv, -127, 127));
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += blk.qs[16 * g + l];
      blk.bsums[g] = static_cast<int16_t>(sum);
    }
    std::memcpy(dst, &blk, sizeof blk);
  }
}

}  // namespace strata::quant_detail
