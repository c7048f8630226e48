// Block formats: production decoders against an independent float64 decoder written here from the
// public GGUF/ggml layout description (bit positions counted from the start of each block), on
// hand-built blocks that hit every scale/min packing case and on random blocks; quantiser error
// bounds and exactness properties; f16/bf16 conversions; type table helpers.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "strata/base/error.h"
#include "strata/quant/fp16.h"
#include "strata/quant/quantize.h"
#include "strata/quant/types.h"

namespace {

using strata::GgmlType;

// ---------------------------------------------------------------------------------------------
// Independent reference: little-endian bit fields, float64 arithmetic.

uint32_t bits(const uint8_t* p, size_t pos, int width) {
  uint32_t v = 0;
  for (int i = 0; i < width; ++i) v |= static_cast<uint32_t>((p[(pos + i) / 8] >> ((pos + i) % 8)) & 1u) << i;
  return v;
}

void set_bits(uint8_t* p, size_t pos, int width, uint32_t v) {
  for (int i = 0; i < width; ++i) {
    const size_t b = pos + i;
    p[b / 8] = static_cast<uint8_t>((p[b / 8] & ~(1u << (b % 8))) | (((v >> i) & 1u) << (b % 8)));
  }
}

int32_t sign_extend(uint32_t v, int width) {
  return static_cast<int32_t>(v << (32 - width)) >> (32 - width);
}

double ref_f16(uint32_t h) {
  const double sign = (h >> 15) ? -1.0 : 1.0;
  const int e = static_cast<int>((h >> 10) & 31);
  const int m = static_cast<int>(h & 1023);
  if (e == 0) return sign * std::ldexp(m, -24);
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  return sign * std::ldexp(1024 + m, e - 25);
}

double ref_bf16(uint32_t b) {
  const double sign = (b >> 15) ? -1.0 : 1.0;
  const int e = static_cast<int>((b >> 7) & 255);
  const int m = static_cast<int>(b & 127);
  if (e == 0) return sign * std::ldexp(m, -133);
  if (e == 255) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  return sign * std::ldexp(128 + m, e - 134);
}

double ref_f32(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

const int kIQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// E2M1: sign bit 3, exponent bits 1..2 (bias 1), mantissa bit 0; exponent 0 is subnormal.
double ref_e2m1(uint32_t code) {
  const double sign = (code & 8) ? -1.0 : 1.0;
  const int e = static_cast<int>((code >> 1) & 3);
  const int m = static_cast<int>(code & 1);
  if (e == 0) return sign * 0.5 * m;
  return sign * (1.0 + 0.5 * m) * std::ldexp(1.0, e - 1);
}

// Nibble j of a 32-weight block whose 16 code bytes start at bit `at`: weight j < 16 in the low
// nibble of byte j, weight j >= 16 in the high nibble of byte j - 16.
uint32_t nib32(const uint8_t* p, size_t at, int j) { return bits(p, at + 8 * (j % 16) + 4 * (j / 16), 4); }

// Q4_K/Q5_K 6-bit scale (what = 0) or min (what = 1) of sub-block s, from the 12 bytes at bit `at`.
uint32_t k4_field(const uint8_t* p, size_t at, int s, int what) {
  if (s < 4) return bits(p, at + 8 * (s + 4 * what), 6);
  const uint32_t low = bits(p, at + 8 * (s + 4) + 4 * what, 4);
  const uint32_t high = bits(p, at + 8 * (s - 4 + 4 * what) + 6, 2);
  return low | (high << 4);
}

std::vector<double> ref_decode_block(GgmlType t, const uint8_t* p) {
  std::vector<double> y;
  switch (t) {
    case GgmlType::F32: y.push_back(ref_f32(p)); break;
    case GgmlType::F16: y.push_back(ref_f16(bits(p, 0, 16))); break;
    case GgmlType::BF16: y.push_back(ref_bf16(bits(p, 0, 16))); break;
    case GgmlType::Q8_0: {
      const double d = ref_f16(bits(p, 0, 16));
      for (int j = 0; j < 32; ++j) y.push_back(d * sign_extend(bits(p, 16 + 8 * j, 8), 8));
      break;
    }
    case GgmlType::Q4_0: {
      const double d = ref_f16(bits(p, 0, 16));
      for (int j = 0; j < 32; ++j) y.push_back(d * (static_cast<int>(nib32(p, 16, j)) - 8));
      break;
    }
    case GgmlType::Q4_1: {
      const double d = ref_f16(bits(p, 0, 16)), m = ref_f16(bits(p, 16, 16));
      for (int j = 0; j < 32; ++j) y.push_back(d * nib32(p, 32, j) + m);
      break;
    }
    case GgmlType::Q5_0: {
      const double d = ref_f16(bits(p, 0, 16));
      for (int j = 0; j < 32; ++j)
        y.push_back(d * (static_cast<int>(nib32(p, 48, j) + 16 * bits(p, 16 + j, 1)) - 16));
      break;
    }
    case GgmlType::Q5_1: {
      const double d = ref_f16(bits(p, 0, 16)), m = ref_f16(bits(p, 16, 16));
      for (int j = 0; j < 32; ++j) y.push_back(d * (nib32(p, 64, j) + 16 * bits(p, 32 + j, 1)) + m);
      break;
    }
    case GgmlType::Q2_K: {  // scales[16] @0, qs[64] @16, d @80, dmin @82 (bytes)
      const double d = ref_f16(bits(p, 640, 16)), dmin = ref_f16(bits(p, 656, 16));
      for (int i = 0; i < 256; ++i) {
        const int n = i / 128, j = (i % 128) / 32, l = i % 32, s = i / 16;
        const uint32_t q = bits(p, 128 + 8 * (32 * n + l) + 2 * j, 2);
        y.push_back(d * bits(p, 8 * s, 4) * q - dmin * bits(p, 8 * s + 4, 4));
      }
      break;
    }
    case GgmlType::Q3_K: {  // hmask[32] @0, qs[64] @32, scales[12] @96, d @108
      const double d = ref_f16(bits(p, 864, 16));
      for (int i = 0; i < 256; ++i) {
        const int n = i / 128, j = (i % 128) / 32, l = i % 32, s = i / 16;
        const int low = static_cast<int>(bits(p, 256 + 8 * (32 * n + l) + 2 * j, 2));
        const int hb = static_cast<int>(bits(p, 8 * l + 4 * n + j, 1));
        const uint32_t sc_low = s < 8 ? bits(p, 768 + 8 * s, 4) : bits(p, 768 + 8 * (s - 8) + 4, 4);
        const uint32_t sc_high = bits(p, 768 + 8 * (8 + s % 4) + 2 * (s / 4), 2);
        const int sc = static_cast<int>(sc_low | (sc_high << 4)) - 32;
        y.push_back(d * sc * (low + 4 * hb - 4));
      }
      break;
    }
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {  // d @0, dmin @2, scales @4; Q4_K: qs @16; Q5_K: qh @16, qs @48
      const bool five = t == GgmlType::Q5_K;
      const double d = ref_f16(bits(p, 0, 16)), dmin = ref_f16(bits(p, 16, 16));
      const size_t qs_at = five ? 384 : 128;
      for (int i = 0; i < 256; ++i) {
        const int s = i / 32, l = i % 32;
        uint32_t q = bits(p, qs_at + 8 * (32 * (s / 2) + l) + 4 * (s % 2), 4);
        if (five) q += 16 * bits(p, 128 + 8 * l + s, 1);
        y.push_back(d * k4_field(p, 32, s, 0) * q - dmin * k4_field(p, 32, s, 1));
      }
      break;
    }
    case GgmlType::Q6_K: {  // ql[128] @0, qh[64] @128, scales[16] @192, d @208
      const double d = ref_f16(bits(p, 1664, 16));
      for (int i = 0; i < 256; ++i) {
        const int n = i / 128, k = (i % 128) / 32, l = i % 32;
        const int low = static_cast<int>(bits(p, 8 * (64 * n + l + 32 * (k % 2)) + 4 * (k / 2), 4));
        const int high = static_cast<int>(bits(p, 1024 + 8 * (32 * n + l) + 2 * k, 2));
        const int sc = sign_extend(bits(p, 1536 + 8 * (8 * n + 2 * k + l / 16), 8), 8);
        y.push_back(d * sc * (low + 16 * high - 32));
      }
      break;
    }
    case GgmlType::Q8_K: {  // f32 d @0, qs[256] @4, bsums @260
      const double d = ref_f32(p);
      for (int i = 0; i < 256; ++i) y.push_back(d * sign_extend(bits(p, 32 + 8 * i, 8), 8));
      break;
    }
    case GgmlType::IQ4_NL: {
      const double d = ref_f16(bits(p, 0, 16));
      for (int j = 0; j < 32; ++j) y.push_back(d * kIQ4NL[nib32(p, 16, j)]);
      break;
    }
    case GgmlType::MXFP4: {
      const int e = static_cast<int>(bits(p, 0, 8));
      for (int j = 0; j < 32; ++j) y.push_back(std::ldexp(ref_e2m1(nib32(p, 8, j)), e - 127));
      break;
    }
  }
  return y;
}

const GgmlType kAllTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,
                              GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                              GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                              GgmlType::Q6_K, GgmlType::Q8_K, GgmlType::IQ4_NL, GgmlType::MXFP4};

// Bit offsets of the f16 fields of each block (forced finite in random blocks).
std::vector<size_t> f16_fields(GgmlType t) {
  switch (t) {
    case GgmlType::Q8_0: case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::IQ4_NL: return {0};
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K: return {0, 16};
    case GgmlType::Q2_K: return {640, 656};
    case GgmlType::Q3_K: return {864};
    case GgmlType::Q6_K: return {1664};
    default: return {};
  }
}

// Production float against the float64 reference: equal to within 1 ulp of float (most formats are
// exact; a final subtraction may round), infinities where the reference exceeds float's range.
void expect_close(float got, double want, const std::string& where) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << where;
    return;
  }
  if (std::fabs(want) > FLT_MAX) {
    EXPECT_TRUE(std::isinf(got) && (got > 0) == (want > 0)) << where << " want " << want << " got " << got;
    return;
  }
  const float w = static_cast<float>(want);
  const bool ok = got == w || got == std::nextafter(w, INFINITY) || got == std::nextafter(w, -INFINITY);
  EXPECT_TRUE(ok) << where << ": want " << want << " got " << got;
}

void check_blocks(GgmlType t, const std::vector<uint8_t>& bytes, const std::string& label) {
  const auto& tr = strata::type_traits(t);
  const size_t nb = bytes.size() / tr.block_bytes;
  const int64_t n = static_cast<int64_t>(nb) * tr.block_elems;
  std::vector<float> got(static_cast<size_t>(n));
  strata::dequantize_row(t, bytes.data(), got.data(), n);
  for (size_t b = 0; b < nb; ++b) {
    const auto want = ref_decode_block(t, bytes.data() + b * tr.block_bytes);
    ASSERT_EQ(static_cast<int64_t>(want.size()), tr.block_elems);
    for (size_t i = 0; i < want.size(); ++i) {
      expect_close(got[b * tr.block_elems + i], want[i],
                   strata::cat(tr.name, " ", label, " block ", b, " elem ", i));
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// (a) decoders

TEST(QuantDecode, RandomBlocksMatchReference) {
  std::mt19937 rng(1234);
  for (GgmlType t : kAllTypes) {
    const auto& tr = strata::type_traits(t);
    const size_t nb = tr.block_elems == 1 ? 4096 : 300;
    std::vector<uint8_t> bytes(nb * tr.block_bytes);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    for (size_t b = 0; b < nb; ++b) {
      uint8_t* blk = bytes.data() + b * tr.block_bytes;
      for (size_t at : f16_fields(t)) {
        if (bits(blk, at + 10, 5) == 31) set_bits(blk, at + 14, 1, 0);  // finite scale
      }
      if (t == GgmlType::Q8_K) {  // finite f32 scale
        if (bits(blk, 23, 8) == 255) set_bits(blk, 30, 1, 0);
      }
    }
    // Also an unaligned copy: rows in files need not be aligned.
    check_blocks(t, bytes, "random");
    std::vector<uint8_t> shifted(bytes.size() + 1);
    std::memcpy(shifted.data() + 1, bytes.data(), bytes.size());
    std::vector<float> a(nb * tr.block_elems), c(nb * tr.block_elems);
    strata::dequantize_row(t, bytes.data(), a.data(), static_cast<int64_t>(a.size()));
    strata::dequantize_row(t, shifted.data() + 1, c.data(), static_cast<int64_t>(c.size()));
    EXPECT_EQ(0, std::memcmp(a.data(), c.data(), a.size() * 4)) << tr.name;
  }
}

uint16_t h(double v) { return strata::fp32_to_fp16(static_cast<float>(v)); }

// K-quant scale/min packing: sub-block s gets scale 40+s and min 33+3s (all use the high 2 bits),
// written bit by bit at the spec's positions; with d = 1, dmin = 0 the decoder must return
// (40+s)*q, and with d = 0, dmin = 1 it must return -(33+3s).
TEST(QuantDecode, K4ScaleMinPackingEveryPosition) {
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K}) {
    const bool five = t == GgmlType::Q5_K;
    for (int pass = 0; pass < 2; ++pass) {
      std::vector<uint8_t> blk(strata::type_traits(t).block_bytes, 0);
      set_bits(blk.data(), 0, 16, h(pass == 0 ? 1.0 : 0.0));
      set_bits(blk.data(), 16, 16, h(pass == 0 ? 0.0 : 1.0));
      for (int s = 0; s < 8; ++s) {
        const uint32_t sc = 40 + s, mn = 33 + 3 * s;
        if (s < 4) {
          set_bits(blk.data(), 32 + 8 * s, 6, sc);
          set_bits(blk.data(), 32 + 8 * (s + 4), 6, mn);
        } else {
          set_bits(blk.data(), 32 + 8 * (s + 4), 4, sc & 15);
          set_bits(blk.data(), 32 + 8 * (s + 4) + 4, 4, mn & 15);
          set_bits(blk.data(), 32 + 8 * (s - 4) + 6, 2, sc >> 4);
          set_bits(blk.data(), 32 + 8 * s + 6, 2, mn >> 4);
        }
      }
      // Codes: weight 32s + l gets (l + s) % 16 (+16 for Q5_K when (l + s) is odd).
      for (int s = 0; s < 8; ++s)
        for (int l = 0; l < 32; ++l) {
          set_bits(blk.data(), (five ? 384 : 128) + 8 * (32 * (s / 2) + l) + 4 * (s % 2), 4, (l + s) % 16);
          if (five) set_bits(blk.data(), 128 + 8 * l + s, 1, (l + s) % 2);
        }
      std::vector<float> y(256);
      strata::dequantize_row(t, blk.data(), y.data(), 256);
      for (int s = 0; s < 8; ++s)
        for (int l = 0; l < 32; ++l) {
          const int q = (l + s) % 16 + (five && (l + s) % 2 ? 16 : 0);
          const float want = pass == 0 ? static_cast<float>((40 + s) * q) : -static_cast<float>(33 + 3 * s);
          ASSERT_EQ(y[32 * s + l], want) << strata::type_traits(t).name << " pass " << pass << " s " << s << " l " << l;
        }
      check_blocks(t, blk, "packing");
    }
  }
}

// Q3_K: 16 six-bit scales (stored biased by 32) with every high-bit pair, and every hmask bit.
TEST(QuantDecode, Q3KScalesAndHighBits) {
  std::vector<uint8_t> blk(110, 0);
  set_bits(blk.data(), 864, 16, h(1.0));
  int want_scale[16];
  for (int s = 0; s < 16; ++s) {
    const uint32_t stored = (s * 4 + 3 + 16 * (s % 4)) & 63;  // varied low and high bits
    want_scale[s] = static_cast<int>(stored) - 32;
    if (s < 8) set_bits(blk.data(), 768 + 8 * s, 4, stored & 15);
    else set_bits(blk.data(), 768 + 8 * (s - 8) + 4, 4, stored & 15);
    set_bits(blk.data(), 768 + 8 * (8 + s % 4) + 2 * (s / 4), 2, stored >> 4);
  }
  for (int i = 0; i < 256; ++i) {
    const int n = i / 128, j = (i % 128) / 32, l = i % 32;
    set_bits(blk.data(), 256 + 8 * (32 * n + l) + 2 * j, 2, (i / 3) % 4);
    set_bits(blk.data(), 8 * l + 4 * n + j, 1, (i / 5) % 2);
  }
  std::vector<float> y(256);
  strata::dequantize_row(GgmlType::Q3_K, blk.data(), y.data(), 256);
  for (int i = 0; i < 256; ++i) {
    const int q = (i / 3) % 4 + ((i / 5) % 2 ? 0 : -4);
    ASSERT_EQ(y[i], static_cast<float>(want_scale[i / 16] * q)) << "i " << i;
  }
  check_blocks(GgmlType::Q3_K, blk, "scales");
}

// Q2_K: scale/min nibbles of all 16 sub-blocks, all 2-bit codes.
TEST(QuantDecode, Q2KScalesAndMins) {
  std::vector<uint8_t> blk(84, 0);
  set_bits(blk.data(), 640, 16, h(1.0));
  set_bits(blk.data(), 656, 16, h(0.5));
  for (int s = 0; s < 16; ++s) blk[s] = static_cast<uint8_t>((s << 4) | (15 - s));
  for (int i = 0; i < 256; ++i) {
    const int n = i / 128, j = (i % 128) / 32, l = i % 32;
    set_bits(blk.data(), 128 + 8 * (32 * n + l) + 2 * j, 2, (i * 7) % 4);
  }
  std::vector<float> y(256);
  strata::dequantize_row(GgmlType::Q2_K, blk.data(), y.data(), 256);
  for (int i = 0; i < 256; ++i) {
    const int s = i / 16;
    ASSERT_EQ(y[i], static_cast<float>((15 - s) * ((i * 7) % 4) - 0.5 * s)) << "i " << i;
  }
  check_blocks(GgmlType::Q2_K, blk, "scales");
}

// Q6_K: signed scales including -128 and 127, all 6-bit codes.
TEST(QuantDecode, Q6KSignedScales) {
  std::vector<uint8_t> blk(210, 0);
  set_bits(blk.data(), 1664, 16, h(0.25));
  const int scales[16] = {-128, 127, -1, 1, 0, 64, -64, 100, -100, 7, -7, 33, -33, 90, -90, 2};
  for (int s = 0; s < 16; ++s) set_bits(blk.data(), 1536 + 8 * s, 8, static_cast<uint32_t>(scales[s]) & 255);
  for (int i = 0; i < 256; ++i) {
    const int n = i / 128, k = (i % 128) / 32, l = i % 32;
    const uint32_t code = (i * 5) % 64;
    set_bits(blk.data(), 8 * (64 * n + l + 32 * (k % 2)) + 4 * (k / 2), 4, code & 15);
    set_bits(blk.data(), 1024 + 8 * (32 * n + l) + 2 * k, 2, code >> 4);
  }
  std::vector<float> y(256);
  strata::dequantize_row(GgmlType::Q6_K, blk.data(), y.data(), 256);
  for (int i = 0; i < 256; ++i)
    ASSERT_EQ(y[i], static_cast<float>(0.25 * scales[i / 16] * (static_cast<int>((i * 5) % 64) - 32))) << "i " << i;
  check_blocks(GgmlType::Q6_K, blk, "scales");
}

// Q5_0 / Q5_1: high bit set and unset on both halves of the block.
TEST(QuantDecode, Q5HighBits) {
  for (GgmlType t : {GgmlType::Q5_0, GgmlType::Q5_1}) {
    const bool one = t == GgmlType::Q5_1;
    std::vector<uint8_t> blk(strata::type_traits(t).block_bytes, 0);
    set_bits(blk.data(), 0, 16, h(2.0));
    if (one) set_bits(blk.data(), 16, 16, h(-3.0));
    const size_t qh_at = one ? 32 : 16, qs_at = one ? 64 : 48;
    for (int j = 0; j < 32; ++j) {
      set_bits(blk.data(), qh_at + j, 1, (j % 3) == 0);
      set_bits(blk.data(), qs_at + 8 * (j % 16) + 4 * (j / 16), 4, (j * 3) % 16);
    }
    std::vector<float> y(32);
    strata::dequantize_row(t, blk.data(), y.data(), 32);
    for (int j = 0; j < 32; ++j) {
      const int q = (j * 3) % 16 + ((j % 3) == 0 ? 16 : 0);
      ASSERT_EQ(y[j], one ? 2.0f * q - 3.0f : 2.0f * (q - 16)) << strata::type_traits(t).name << " j " << j;
    }
    check_blocks(t, blk, "highbits");
  }
}

// MXFP4: every code (negative values included) at the exponent extremes.
TEST(QuantDecode, Mxfp4CodesAndExponents) {
  const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int e : {0, 1, 2, 100, 127, 128, 200, 254, 255}) {
    std::vector<uint8_t> blk(17, 0);
    blk[0] = static_cast<uint8_t>(e);
    for (int j = 0; j < 32; ++j) set_bits(blk.data(), 8 + 8 * (j % 16) + 4 * (j / 16), 4, j % 16);
    std::vector<float> y(32);
    strata::dequantize_row(GgmlType::MXFP4, blk.data(), y.data(), 32);
    for (int j = 0; j < 32; ++j) {
      const double want = std::ldexp(static_cast<double>(e2m1[j % 16]), e - 127);
      if (std::fabs(want) > FLT_MAX) {
        EXPECT_TRUE(std::isinf(y[j])) << e << " " << j;
      } else {
        EXPECT_EQ(y[j], static_cast<float>(want)) << "e " << e << " j " << j;
      }
    }
    check_blocks(GgmlType::MXFP4, blk, strata::cat("e=", e));
  }
}

TEST(QuantDecode, IQ4NLTable) {
  std::vector<uint8_t> blk(18, 0);
  set_bits(blk.data(), 0, 16, h(0.5));
  for (int j = 0; j < 32; ++j) set_bits(blk.data(), 16 + 8 * (j % 16) + 4 * (j / 16), 4, 15 - j % 16);
  std::vector<float> y(32);
  strata::dequantize_row(GgmlType::IQ4_NL, blk.data(), y.data(), 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 0.5f * kIQ4NL[15 - j % 16]) << j;
}

// ---------------------------------------------------------------------------------------------
// f16 / bf16 conversions

TEST(Fp16, DecodeEveryHalf) {
  for (uint32_t v = 0; v < 65536; ++v) {
    const float got = strata::fp16_to_fp32(static_cast<uint16_t>(v));
    const double want = ref_f16(v);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << v;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << v;
    }
    const float gotb = strata::bf16_to_fp32(static_cast<uint16_t>(v));
    const double wantb = ref_bf16(v);
    if (std::isnan(wantb)) {
      ASSERT_TRUE(std::isnan(gotb)) << v;
    } else {
      ASSERT_EQ(static_cast<double>(gotb), wantb) << v;
    }
  }
}

TEST(Fp16, EncodeRoundsToNearestEven) {
  // Every finite half survives f16 -> f32 -> f16; NaNs stay NaN.
  for (uint32_t v = 0; v < 65536; ++v) {
    const float f = strata::fp16_to_fp32(static_cast<uint16_t>(v));
    const uint16_t back = strata::fp32_to_fp16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(strata::fp16_to_fp32(back))) << v;
    } else {
      ASSERT_EQ(back, v) << v;
    }
  }
  // Midpoints between neighbouring non-negative halves (subnormal and normal) go to the even
  // code; a hair above goes up, a hair below goes down.
  for (uint32_t v = 0; v < 0x7bff; ++v) {
    const double a = ref_f16(v), b = ref_f16(v + 1);
    const float mid = static_cast<float>((a + b) / 2);  // exact in float
    ASSERT_EQ(static_cast<double>(mid), (a + b) / 2);
    const uint32_t even = (v % 2 == 0) ? v : v + 1;
    ASSERT_EQ(strata::fp32_to_fp16(mid), even) << v;
    ASSERT_EQ(strata::fp32_to_fp16(-mid), even | 0x8000u) << v;
    ASSERT_EQ(strata::fp32_to_fp16(std::nextafter(mid, INFINITY)), v + 1) << v;
    ASSERT_EQ(strata::fp32_to_fp16(std::nextafter(mid, 0.0f)), v) << v;
  }
  EXPECT_EQ(strata::fp32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(strata::fp32_to_fp16(65519.99f), 0x7bff);
  EXPECT_EQ(strata::fp32_to_fp16(65520.0f), 0x7c00);  // midpoint to inf rounds to even (inf)
  EXPECT_EQ(strata::fp32_to_fp16(1e30f), 0x7c00);
  EXPECT_EQ(strata::fp32_to_fp16(-INFINITY), 0xfc00);
  EXPECT_EQ(strata::fp32_to_fp16(1e-30f), 0);
  EXPECT_EQ(strata::fp32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(strata::fp32_to_fp16(std::ldexp(1.0f, -25)), 0);                       // tie to even zero
  EXPECT_EQ(strata::fp32_to_fp16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 1);  // above the tie
  EXPECT_TRUE(std::isnan(strata::fp16_to_fp32(strata::fp32_to_fp16(NAN))));
}

TEST(Bf16, EncodeRoundsToNearestEven) {
  for (uint32_t v = 0; v < 65536; ++v) {
    const float f = strata::bf16_to_fp32(static_cast<uint16_t>(v));
    const uint16_t back = strata::fp32_to_bf16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(strata::bf16_to_fp32(back))) << v;
    } else {
      ASSERT_EQ(back, v) << v;
    }
  }
  for (uint32_t v = 0; v < 0x7f7f; v += 7) {
    const double a = ref_bf16(v), b = ref_bf16(v + 1);
    const float mid = static_cast<float>((a + b) / 2);
    const uint32_t even = (v % 2 == 0) ? v : v + 1;
    ASSERT_EQ(strata::fp32_to_bf16(mid), even) << v;
    ASSERT_EQ(strata::fp32_to_bf16(std::nextafter(mid, INFINITY)), v + 1) << v;
    ASSERT_EQ(strata::fp32_to_bf16(std::nextafter(mid, 0.0f)), v) << v;
  }
  EXPECT_EQ(strata::fp32_to_bf16(FLT_MAX), 0x7f80);  // rounds up to inf
  EXPECT_EQ(strata::fp32_to_bf16(-INFINITY), 0xff80);
  EXPECT_TRUE(std::isnan(strata::bf16_to_fp32(strata::fp32_to_bf16(NAN))));
}

// ---------------------------------------------------------------------------------------------
// (b) quantisers

std::vector<float> gaussian(size_t n, uint32_t seed, bool outliers) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = g(rng) * 0.02f;
  if (outliers) {
    std::uniform_int_distribution<size_t> pick(0, n - 1);
    for (size_t i = 0; i < n / 100; ++i) x[pick(rng)] *= 25.0f;
  }
  return x;
}

double rel_rms(GgmlType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(strata::row_bytes(t, static_cast<int64_t>(x.size())));
  std::vector<float> y(x.size());
  strata::quantize_row(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
  check_blocks(t, q, "quantised");  // encoder output must decode identically under the reference
  strata::dequantize_row(t, q.data(), y.data(), static_cast<int64_t>(x.size()));
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
    den += static_cast<double>(x[i]) * x[i];
  }
  return std::sqrt(num / den);
}

struct Bound {
  GgmlType type;
  double gaussian, outliers;
};

TEST(QuantEncode, RelativeErrorBounds) {
  // Measured (gaussian / 1% outliers x25) and then given ~25% margin; a typical uniform
  // quantiser with b bits has relative RMS around 2^-b * sqrt(3) * (range / rms) / 2.
  const Bound bounds[] = {
      {GgmlType::F32, 0.0, 0.0},         {GgmlType::F16, 3e-4, 3e-4},       {GgmlType::BF16, 2.2e-3, 2.2e-3},
      {GgmlType::Q8_0, 7e-3, 1.5e-2},    {GgmlType::Q8_K, 9e-3, 3.5e-2},    {GgmlType::Q6_K, 2.2e-2, 4e-2},
      {GgmlType::Q5_K, 4.5e-2, 6.2e-2},  {GgmlType::Q4_K, 9e-2, 1.2e-1},    {GgmlType::Q4_0, 1.05e-1, 1.6e-1},
  };
  for (const auto& b : bounds) {
    const auto name = strata::type_traits(b.type).name;
    const double eg = rel_rms(b.type, gaussian(256 * 64, 7, false));
    const double eo = rel_rms(b.type, gaussian(256 * 64, 8, true));
    std::printf("  %-5s rel rms gaussian %.5f outliers %.5f\n", name, eg, eo);
    EXPECT_LE(eg, b.gaussian) << name;
    EXPECT_LE(eo, b.outliers) << name;
  }
}

TEST(QuantEncode, ExactnessProperties) {
  for (GgmlType t : kAllTypes) {
    const auto& tr = strata::type_traits(t);
    if (!tr.can_quantize) continue;
    const int64_t n = 512;
    std::vector<float> zeros(n, 0.0f), y(n, 1.0f);
    std::vector<uint8_t> q(strata::row_bytes(t, n));
    strata::quantize_row(t, zeros.data(), q.data(), n);
    strata::dequantize_row(t, q.data(), y.data(), n);
    for (float v : y) ASSERT_EQ(v, 0.0f) << tr.name << ": zeros must stay zero";
    // A block with one non-zero value keeps it within the type's precision and the rest at zero.
    std::vector<float> spike(n, 0.0f);
    spike[37] = 1.5f;
    strata::quantize_row(t, spike.data(), q.data(), n);
    strata::dequantize_row(t, q.data(), y.data(), n);
    EXPECT_NEAR(y[37], 1.5f, 1.5f * 0.01f) << tr.name;
    for (int64_t i = 0; i < n; ++i) {
      if (i != 37) {
        ASSERT_NEAR(y[i], 0.0f, 1e-6f) << tr.name << " i " << i;
      }
    }
  }
  // F32 round trip is exact; F16/BF16 exact for values they can represent.
  auto x = gaussian(1024, 3, true);
  std::vector<float> y(x.size());
  std::vector<uint8_t> q(x.size() * 4);
  strata::quantize_row(GgmlType::F32, x.data(), q.data(), 1024);
  strata::dequantize_row(GgmlType::F32, q.data(), y.data(), 1024);
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), 4096));
  for (GgmlType t : {GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K,
                     GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_K}) {
    // Requantising a decoded row reproduces the decoded values (stability); exact for the
    // 8-bit and float formats, and within a small tolerance for scale-searching K-quants.
    const auto name = strata::type_traits(t).name;
    std::vector<uint8_t> q1(strata::row_bytes(t, 1024)), q2(q1.size());
    std::vector<float> y1(1024), y2(1024);
    strata::quantize_row(t, x.data(), q1.data(), 1024);
    strata::dequantize_row(t, q1.data(), y1.data(), 1024);
    strata::quantize_row(t, y1.data(), q2.data(), 1024);
    strata::dequantize_row(t, q2.data(), y2.data(), 1024);
    if (t == GgmlType::F16 || t == GgmlType::BF16 || t == GgmlType::Q8_0) {
      EXPECT_EQ(q1, q2) << name << ": quantize(dequantize(q)) must be q";
    } else {
      double num = 0, den = 0;
      for (int i = 0; i < 1024; ++i) {
        num += (static_cast<double>(y1[i]) - y2[i]) * (static_cast<double>(y1[i]) - y2[i]);
        den += static_cast<double>(y1[i]) * y1[i];
      }
      EXPECT_LE(std::sqrt(num / den), 0.05) << name;
    }
  }
}

TEST(QuantEncode, Q8KBlockSums) {
  auto x = gaussian(512, 11, true);
  std::vector<uint8_t> q(strata::row_bytes(GgmlType::Q8_K, 512));
  strata::quantize_row(GgmlType::Q8_K, x.data(), q.data(), 512);
  for (int b = 0; b < 2; ++b) {
    const uint8_t* p = q.data() + 292 * b;
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += sign_extend(bits(p, 32 + 8 * (16 * g + l), 8), 8);
      EXPECT_EQ(sign_extend(bits(p, 8 * 260 + 16 * g, 16), 16), sum) << "block " << b << " group " << g;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// (c) type table helpers

TEST(QuantTypes, RowBytesAndNames) {
  EXPECT_EQ(strata::row_bytes(GgmlType::Q4_K, 512), 288u);
  EXPECT_EQ(strata::row_bytes(GgmlType::Q8_0, 64), 68u);
  EXPECT_EQ(strata::row_bytes(GgmlType::F16, 3), 6u);
  EXPECT_EQ(strata::row_bytes(GgmlType::MXFP4, 64), 34u);
  EXPECT_EQ(strata::row_bytes(GgmlType::Q6_K, 0), 0u);
  EXPECT_THROW(strata::row_bytes(GgmlType::Q4_K, 100), strata::Error);
  EXPECT_THROW(strata::row_bytes(GgmlType::Q8_0, -32), strata::Error);
  EXPECT_EQ(strata::type_from_name("Q4_K"), GgmlType::Q4_K);
  EXPECT_EQ(strata::type_from_name("bf16"), GgmlType::BF16);
  EXPECT_EQ(strata::type_from_name("IQ4_nl"), GgmlType::IQ4_NL);
  EXPECT_FALSE(strata::type_from_name("q4_k_m").has_value());
  EXPECT_FALSE(strata::type_from_name("").has_value());
  EXPECT_EQ(strata::find_type(99), nullptr);
  EXPECT_STREQ(strata::ggml_type_name(23), "iq4_xs");
  for (GgmlType t : kAllTypes) {
    const auto& tr = strata::type_traits(t);
    EXPECT_EQ(strata::type_from_name(tr.name), t);
  }
}

TEST(QuantTypes, UnsupportedQuantiseFailsLoudly) {
  std::vector<float> x(256, 1.0f);
  std::vector<uint8_t> q(1024);
  for (GgmlType t : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                     GgmlType::IQ4_NL, GgmlType::MXFP4}) {
    try {
      strata::quantize_row(t, x.data(), q.data(), 256);
      ADD_FAILURE() << "expected failure for " << strata::type_traits(t).name;
    } catch (const strata::Error& e) {
      EXPECT_NE(std::string(e.what()).find(strata::type_traits(t).name), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(strata::dequantize_row(GgmlType::Q4_K, q.data(), x.data(), 100), strata::Error);
}

}  // namespace
