// Scalar decoders for every block format of types.h (the reference the CPU kernels are tested
// against). Layout facts: blocks.h.
#include <cstring>

#include "strata/base/error.h"
#include "strata/quant/blocks.h"
#include "strata/quant/fp16.h"
#include "strata/quant/quantize.h"

namespace strata {
namespace {

using namespace blocks;

void dequant_q8_0(const uint8_t* p, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, p += sizeof(Q8_0), y += kQK) {
    const auto blk = load_block<Q8_0>(p);
    const float d = fp16_to_fp32(blk.d);
    for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(blk.qs[j]);
  }
}

void dequant_q4_0(const uint8_t* p, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, p += sizeof(Q4_0), y += kQK) {
    const auto blk = load_block<Q4_0>(p);
    const float d = fp16_to_fp32(blk.d);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>((blk.qs[j] & 15) - 8);
      y[j + 16] = d * static_cast<float>((blk.qs[j] >> 4) - 8);
    }
  }
}

void dequant_q4_1(const uint8_t* p, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, p += sizeof(Q4_1), y += kQK) {
    const auto blk = load_block<Q4_1>(p);
    const float d = fp16_to_fp32(blk.d), m = fp16_to_fp32(blk.m);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>(blk.qs[j] & 15) + m;
      y[j + 16] = d * static_cast<float>(blk.qs[j] >> 4) + m;
    }
  }
}

// Q5_0 / Q5_1 share the quant layout: bit j of qh is bit 4 of weight j.
inline int q5_value(const uint8_t* qs, uint32_t qh, int j) {
  const int low = (j < 16) ? (qs[j] & 15) : (qs[j - 16] >> 4);
  return low | static_cast<int>(((qh >> j) & 1u) << 4);
}

void dequant_q5_0(const uint8_t* p, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, p += sizeof(Q5_0), y += kQK) {
    const auto blk = load_block<Q5_0>(p);
    const float d = fp16_to_fp32(blk.d);
    uint32_t qh;
    std::memcpy(&qh, blk.qh, 4);
    for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(q5_value(blk.qs, qh, j) - 16);
  }
}

void dequant_q5_1(const uint8_t* p, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, p += sizeof(Q5_1), y += kQK) {
    const auto blk = load_block<Q5_1>(p);
    const float d = fp16_to_fp32(blk.d), m = fp16_to_fp32(blk.m);
    uint32_t qh;
    std::memcpy(&qh, blk.qh, 4);
    for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(q5_value(blk.qs, qh, j)) + m;
  }
}

// Q2_K: each 128-weight half n uses qs[32n..32n+31]; weight 128n + 32j + 16h + l is bits 2j..2j+1
// of qs[32n + 16h + l] and belongs to sub-block 8n + 2j + h.
void dequant_q2_k(const uint8_t* p, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, p += sizeof(Q2_K), y += kQK_K) {
    const auto blk = load_block<Q2_K>(p);
    const float d = fp16_to_fp32(blk.d), dmin = fp16_to_fp32(blk.dmin);
    for (int n = 0; n < 2; ++n)
      for (int j = 0; j < 4; ++j)
        for (int h = 0; h < 2; ++h) {
          const int sb = 8 * n + 2 * j + h;
          const float dl = d * static_cast<float>(blk.scales[sb] & 15);
          const float ml = dmin * static_cast<float>(blk.scales[sb] >> 4);
          float* out = y + 16 * sb;
          const uint8_t* q = blk.qs + 32 * n + 16 * h;
          for (int l = 0; l < 16; ++l) out[l] = dl * static_cast<float>((q[l] >> (2 * j)) & 3) - ml;
        }
  }
}

// Q3_K: as Q2_K for the low 2 bits; the third bit of weight 128n + 32j + 16h + l is bit 4n + j of
// hmask[16h + l]; a clear bit subtracts 4.
void dequant_q3_k(const uint8_t* p, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, p += sizeof(Q3_K), y += kQK_K) {
    const auto blk = load_block<Q3_K>(p);
    const float d = fp16_to_fp32(blk.d);
    for (int n = 0; n < 2; ++n)
      for (int j = 0; j < 4; ++j)
        for (int h = 0; h < 2; ++h) {
          const int sb = 8 * n + 2 * j + h;
          const float dl = d * static_cast<float>(q3k_scale(blk.scales, sb));
          float* out = y + 16 * sb;
          const uint8_t* q = blk.qs + 32 * n + 16 * h;
          const uint8_t* hm = blk.hmask + 16 * h;
          for (int l = 0; l < 16; ++l) {
            const int low = (q[l] >> (2 * j)) & 3;
            const int high = (hm[l] >> (4 * n + j)) & 1;
            out[l] = dl * static_cast<float>(low - (high ? 0 : 4));
          }
        }
  }
}

void dequant_q4_k(const uint8_t* p, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, p += sizeof(Q4_K), y += kQK_K) {
    const auto blk = load_block<Q4_K>(p);
    const float d = fp16_to_fp32(blk.d), dmin = fp16_to_fp32(blk.dmin);
    for (int sb = 0; sb < 8; ++sb) {
      uint8_t sc, m;
      k4_scale_min(blk.scales, sb, sc, m);
      const float dl = d * sc, ml = dmin * m;
      const uint8_t* q = blk.qs + 32 * (sb / 2);
      const int shift = 4 * (sb % 2);
      for (int l = 0; l < 32; ++l) y[32 * sb + l] = dl * static_cast<float>((q[l] >> shift) & 15) - ml;
    }
  }
}

// Q5_K: Q4_K plus bit sb of qh[l] as bit 4 of weight 32*sb + l.
void dequant_q5_k(const uint8_t* p, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, p += sizeof(Q5_K), y += kQK_K) {
    const auto blk = load_block<Q5_K>(p);
    const float d = fp16_to_fp32(blk.d), dmin = fp16_to_fp32(blk.dmin);
    for (int sb = 0; sb < 8; ++sb) {
      uint8_t sc, m;
      k4_scale_min(blk.scales, sb, sc, m);
      const float dl = d * sc, ml = dmin * m;
      const uint8_t* q = blk.qs + 32 * (sb / 2);
      const int shift = 4 * (sb % 2);
      for (int l = 0; l < 32; ++l) {
        const int v = ((q[l] >> shift) & 15) | (((blk.qh[l] >> sb) & 1) << 4);
        y[32 * sb + l] = dl * static_cast<float>(v) - ml;
      }
    }
  }
}

// Q6_K: each 128-weight half n uses ql[64n..], qh[32n..], scales[8n..]. For l in 0..31 and
// quarter k in 0..3, weight 128n + 32k + l has low 4 bits from ql[64n + l + 32*(k&1)] (low
// nibble for k<2, high for k>=2) and high 2 bits from qh[32n + l] at bit 2k; scale 8n + 2k + l/16.
void dequant_q6_k(const uint8_t* p, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, p += sizeof(Q6_K), y += kQK_K) {
    const auto blk = load_block<Q6_K>(p);
    const float d = fp16_to_fp32(blk.d);
    for (int n = 0; n < 2; ++n)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l) {
          const uint8_t lb = blk.ql[64 * n + l + 32 * (k & 1)];
          const int low = (k < 2) ? (lb & 15) : (lb >> 4);
          const int high = (blk.qh[32 * n + l] >> (2 * k)) & 3;
          const int sc = blk.scales[8 * n + 2 * k + l / 16];
          y[128 * n + 32 * k + l] = d * static_cast<float>(sc * ((low | (high << 4)) - 32));
        }
  }
}

void dequant_q8_k(const uint8_t* p, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, p += sizeof(Q8_K), y += kQK_K) {
    const auto blk = load_block<Q8_K>(p);
    for (int j = 0; j < kQK_K; ++j) y[j] = blk.d * static_cast<float>(blk.qs[j]);
  }
}

void dequant_iq4_nl(const uint8_t* p, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, p += sizeof(IQ4_NL), y += kQK) {
    const auto blk = load_block<IQ4_NL>(p);
    const float d = fp16_to_fp32(blk.d);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>(kIQ4NLValues[blk.qs[j] & 15]);
      y[j + 16] = d * static_cast<float>(kIQ4NLValues[blk.qs[j] >> 4]);
    }
  }
}

void dequant_mxfp4(const uint8_t* p, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, p += sizeof(MXFP4), y += kQK) {
    const auto blk = load_block<MXFP4>(p);
    const float d = e8m0_half(blk.e);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>(kE2M1TimesTwo[blk.qs[j] & 15]);
      y[j + 16] = d * static_cast<float>(kE2M1TimesTwo[blk.qs[j] >> 4]);
    }
  }
}

}  // namespace

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  const TypeTraits& t = type_traits(type);
  row_bytes(type, n);  // validates that n is a whole number of blocks
  const auto* p = static_cast<const uint8_t*>(src);
  const int64_t nb = n / t.block_elems;
  switch (type) {
    case GgmlType::F32: std::memcpy(dst, p, static_cast<size_t>(n) * 4); return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(load_u16(p + 2 * i));
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(load_u16(p + 2 * i));
      return;
    case GgmlType::Q8_0: dequant_q8_0(p, dst, nb); return;
    case GgmlType::Q4_0: dequant_q4_0(p, dst, nb); return;
    case GgmlType::Q4_1: dequant_q4_1(p, dst, nb); return;
    case GgmlType::Q5_0: dequant_q5_0(p, dst, nb); return;
    case GgmlType::Q5_1: dequant_q5_1(p, dst, nb); return;
    case GgmlType::Q2_K: dequant_q2_k(p, dst, nb); return;
    case GgmlType::Q3_K: dequant_q3_k(p, dst, nb); return;
    case GgmlType::Q4_K: dequant_q4_k(p, dst, nb); return;
    case GgmlType::Q5_K: dequant_q5_k(p, dst, nb); return;
    case GgmlType::Q6_K: dequant_q6_k(p, dst, nb); return;
    case GgmlType::Q8_K: dequant_q8_k(p, dst, nb); return;
    case GgmlType::IQ4_NL: dequant_iq4_nl(p, dst, nb); return;
    case GgmlType::MXFP4: dequant_mxfp4(p, dst, nb); return;
  }
  fail("dequantize_row: unsupported type ", t.name);
}

}  // namespace strata
