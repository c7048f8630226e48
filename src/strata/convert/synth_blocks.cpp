#include "strata/convert/synth_blocks.h"

#include <cmath>
#include <cstring>

#include "strata/base/error.h"
#include "strata/convert/synth_random.h"
#include "strata/quant/blocks.h"
#include "strata/quant/fp16.h"

namespace strata::convert {

namespace {

using namespace blocks;

// n (a multiple of 8) random bytes at p.
void random_bytes(RowRng& rng, uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t r = rng.next();
    std::memcpy(p + i, &r, 8);
  }
}

// Standard deviation of codes uniform over `levels` consecutive integers: sqrt((levels^2 - 1) / 12).
float uniform_levels_std(int levels) {
  return std::sqrt((static_cast<float>(levels) * static_cast<float>(levels) - 1.0f) / 12.0f);
}

// The 12-byte Q4_K/Q5_K scale array for the same 6-bit scale `sc` and min `m` in all eight
// sub-blocks (layout: blocks.h, k4_scale_min).
void k4_scales_all(uint8_t sc, uint8_t m, uint8_t out[12]) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>(sc | ((sc >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>(m | ((m >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc & 15) | ((m & 15) << 4));
  }
}

// Q4_K (levels 16) and Q5_K (levels 32): sub-block scale 8, min (levels-1)/2 * 8 / dmin with
// dmin = 4d, i.e. m = levels - 1 (15 / 31), so the offset is exactly the middle code.
template <class Block>
void write_k4_row(RowRng& rng, float std, int levels, uint8_t* dst, int64_t nb) {
  constexpr uint8_t kSc = 8;
  const float step = std / uniform_levels_std(levels);
  Block head{};
  head.d = fp32_to_fp16(step / kSc);
  head.dmin = fp32_to_fp16(4.0f * fp16_to_fp32(head.d));  // exact: a power-of-two multiple
  k4_scales_all(kSc, static_cast<uint8_t>(levels - 1), head.scales);
  for (int64_t b = 0; b < nb; ++b, dst += sizeof(Block)) {
    Block blk = head;
    if constexpr (sizeof(Block) == sizeof(Q5_K)) random_bytes(rng, blk.qh, sizeof blk.qh);
    random_bytes(rng, blk.qs, sizeof blk.qs);
    std::memcpy(dst, &blk, sizeof blk);
  }
}

void write_q6_k_row(RowRng& rng, float std, uint8_t* dst, int64_t nb) {
  constexpr int kSc = 8;
  // E[(q-32)^2] for q uniform in 0..63: variance 341.25 plus the squared mean 0.25.
  const float step = std / std::sqrt(341.5f);
  Q6_K head{};
  head.d = fp32_to_fp16(step / kSc);
  for (int j = 0; j < 16; ++j) head.scales[j] = static_cast<int8_t>(j % 2 == 0 ? kSc : -kSc);
  for (int64_t b = 0; b < nb; ++b, dst += sizeof(Q6_K)) {
    Q6_K blk = head;
    random_bytes(rng, blk.ql, sizeof blk.ql);
    random_bytes(rng, blk.qh, sizeof blk.qh);
    std::memcpy(dst, &blk, sizeof blk);
  }
}

void write_q8_0_row(RowRng& rng, float std, uint8_t* dst, int64_t nb) {
  // q uniform in -128..127 with -128 -> 0: E[q^2] = 2 * (127 * 128 * 255 / 6) / 256.
  const uint16_t d = fp32_to_fp16(std / std::sqrt(2.0f * 127.0f * 128.0f * 255.0f / 6.0f / 256.0f));
  for (int64_t b = 0; b < nb; ++b, dst += sizeof(Q8_0)) {
    Q8_0 blk;
    blk.d = d;
    uint8_t bytes[32];
    random_bytes(rng, bytes, sizeof bytes);
    for (int i = 0; i < 32; ++i) blk.qs[i] = static_cast<int8_t>(bytes[i] == 0x80 ? 0 : bytes[i]);
    std::memcpy(dst, &blk, sizeof blk);
  }
}

void write_q4_0_row(RowRng& rng, float std, uint8_t* dst, int64_t nb) {
  // E[(q-8)^2] for q uniform in 0..15: (64 + 2 * (1 + 4 + ... + 49)) / 16 = 21.5.
  const float d = std / std::sqrt(21.5f);
  const uint16_t pos = fp32_to_fp16(d), neg = fp32_to_fp16(-d);
  for (int64_t b = 0; b < nb; ++b, dst += sizeof(Q4_0)) {
    Q4_0 blk;
    blk.d = b % 2 == 0 ? pos : neg;
    random_bytes(rng, blk.qs, sizeof blk.qs);
    std::memcpy(dst, &blk, sizeof blk);
  }
}

}  // namespace

bool synth_quant_direct(const SynthTensor& t, GgmlType type) {
  switch (t.init) {
    case SynthInit::Matrix:
    case SynthInit::Router:
    case SynthInit::Embedding: break;
    default: return false;
  }
  switch (type) {
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::Q8_0:
    case GgmlType::Q4_0: return t.meta.ne[0] % type_traits(type).block_elems == 0;
    default: return false;
  }
}

float synth_row_std(const SynthTensor& t, int64_t row) {
  switch (t.init) {
    case SynthInit::Matrix: return 1.0f / std::sqrt(static_cast<float>(t.meta.ne[0]));
    case SynthInit::Router: {
      const float s = 1.0f / std::sqrt(static_cast<float>(t.meta.ne[0]));
      return t.row_scale.empty() ? s : s * t.row_scale.at(static_cast<size_t>(row));
    }
    case SynthInit::Embedding: return 1.0f;
    default: break;
  }
  fail("internal: synth_row_std: ", t.meta.name, " has no uniform zero-centred init");
}

void synth_quant_row(const SynthTensor& t, GgmlType type, uint64_t seed, int64_t row, uint8_t* dst) {
  if (!synth_quant_direct(t, type))
    fail("internal: synth_quant_row: ", t.meta.name, " cannot be generated directly as ", type_traits(type).name);
  RowRng rng(stream_key(seed, t.meta.name), static_cast<uint64_t>(row));
  const float std = synth_row_std(t, row);
  const int64_t nb = t.meta.ne[0] / type_traits(type).block_elems;
  switch (type) {
    case GgmlType::Q4_K: write_k4_row<Q4_K>(rng, std, 16, dst, nb); return;
    case GgmlType::Q5_K: write_k4_row<Q5_K>(rng, std, 32, dst, nb); return;
    case GgmlType::Q6_K: write_q6_k_row(rng, std, dst, nb); return;
    case GgmlType::Q8_0: write_q8_0_row(rng, std, dst, nb); return;
    case GgmlType::Q4_0: write_q4_0_row(rng, std, dst, nb); return;
    default: break;
  }
  fail("internal: synth_quant_row: no direct writer for ", type_traits(type).name);
}

}  // namespace strata::convert
