// IEEE half (f16) and bfloat16 <-> float32 conversions, bit-exact and portable (no F16C needed).
// float -> f16/bf16 rounds to nearest, ties to even; inf stays inf, NaN stays a (quiet) NaN, and
// values below the smallest normal become subnormals (f16) or pass through unchanged (bf16 shares
// float's exponent range).
#pragma once

#include <cstdint>
#include <cstring>

namespace strata {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in float.
    const float mag = static_cast<float>(mant) * bits_float(0x33800000u);  // 2^-24
    return bits_float(float_bits(mag) | sign);
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN (payload kept)
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));        // rebias 15 -> 127
}

inline uint16_t fp32_to_fp16(float f) {
  uint32_t x = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {  // inf or NaN
    if (x == 0x7f800000u) return sign | 0x7c00u;
    return static_cast<uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu));  // quiet NaN
  }
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf
  if (x < 0x38800000u) {
    // Below 2^-14 (f16's smallest normal): adding 0.5 puts the f16 subnormal unit (2^-24) at
    // float's last mantissa bit, so the FPU's own round-to-nearest-even does the rounding.
    const float shifted = bits_float(x) + 0.5f;
    return static_cast<uint16_t>(sign | (float_bits(shifted) - 0x3f000000u));
  }
  // Normal: rebias the exponent and round away 13 mantissa bits, ties to even; a carry out of
  // the mantissa correctly bumps the exponent.
  const uint32_t odd = (x >> 13) & 1u;
  x += 0xc8000fffu + odd;  // (15 - 127) << 23, plus rounding bias
  return static_cast<uint16_t>(sign | (x >> 13));
}

inline float bf16_to_fp32(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

inline uint16_t fp32_to_bf16(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  const uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);  // ties to even; may carry into inf
  return static_cast<uint16_t>(rounded >> 16);
}

}  // namespace strata
