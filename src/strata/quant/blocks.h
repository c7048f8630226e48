// Byte layouts of the ggml block formats (facts from the public GGUF specification's block
// definitions). The structs document
// the layout and give sizes; code never dereferences a struct pointer into file data (rows may be
// unaligned), it copies a block into a local struct with load_block() instead.
#pragma once

#include <cstdint>
#include <cstring>

namespace strata::blocks {

constexpr int kQK = 32;    // weights per block of the "_0/_1" formats, IQ4_NL, MXFP4
constexpr int kQK_K = 256;  // weights per K-quant super-block

struct Q8_0 { uint16_t d; int8_t qs[32]; };                                   // w = d*q
struct Q4_0 { uint16_t d; uint8_t qs[16]; };                                  // w = d*(q-8)
struct Q4_1 { uint16_t d; uint16_t m; uint8_t qs[16]; };                      // w = d*q + m
struct Q5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };                   // w = d*(q-16)
struct Q5_1 { uint16_t d; uint16_t m; uint8_t qh[4]; uint8_t qs[16]; };       // w = d*q + m
// Q2_K: 16 sub-blocks of 16; scales[i] = (min4 << 4) | scale4; w = d*sc*q - dmin*m, q in 0..3.
struct Q2_K { uint8_t scales[16]; uint8_t qs[64]; uint16_t d; uint16_t dmin; };
// Q3_K: 16 sub-blocks of 16; 6-bit scales biased by 32; q = low2 | hbit<<2, minus 4.
struct Q3_K { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; };
// Q4_K/Q5_K: 8 sub-blocks of 32 with 6-bit scale and min packed in 12 bytes.
struct Q4_K { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct Q5_K { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
// Q6_K: 16 sub-blocks of 16 with signed 8-bit scales; w = d*sc*(q-32).
struct Q6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };
// Q8_K: activation format; bsums[i] = sum of qs[16i..16i+15].
struct Q8_K { float d; int8_t qs[256]; int16_t bsums[16]; };
struct IQ4_NL { uint16_t d; uint8_t qs[16]; };  // w = d*kIQ4NLValues[q]
struct MXFP4 { uint8_t e; uint8_t qs[16]; };    // w = E2M1(q) * 2^(e-127)

static_assert(sizeof(Q8_0) == 34);
static_assert(sizeof(Q4_0) == 18);
static_assert(sizeof(Q4_1) == 20);
static_assert(sizeof(Q5_0) == 22);
static_assert(sizeof(Q5_1) == 24);
static_assert(sizeof(Q2_K) == 84);
static_assert(sizeof(Q3_K) == 110);
static_assert(sizeof(Q4_K) == 144);
static_assert(sizeof(Q5_K) == 176);
static_assert(sizeof(Q6_K) == 210);
static_assert(sizeof(Q8_K) == 292);
static_assert(sizeof(IQ4_NL) == 18);
static_assert(sizeof(MXFP4) == 17);

// The 16 non-uniform levels of IQ4_NL.
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
// E2M1 (fp4) values times 2, indexed by the 4-bit code (sign in bit 3); halving is folded into
// the exponent so the table stays integer.
inline constexpr int8_t kE2M1TimesTwo[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

template <class Block>
inline Block load_block(const void* p) {
  Block b;
  std::memcpy(&b, p, sizeof b);
  return b;
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K scales[12] array.
inline void k4_scale_min(const uint8_t* s, int j, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// Signed scale of sub-block i (0..15) of a Q3_K scales[12] array: low 4 bits from byte i%8
// (low nibble for i<8, high nibble for i>=8), high 2 bits from byte 8 + i%4 at bit 2*(i/4).
inline int q3k_scale(const uint8_t* s, int i) {
  const int low = (i < 8) ? (s[i] & 15) : (s[i - 8] >> 4);
  const int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// 2^(e-128) as float for an E8M0 byte (exact, including the subnormal results of e = 0 and 1).
inline float e8m0_half(uint8_t e) {
  uint32_t bits = (e < 2) ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace strata::blocks
