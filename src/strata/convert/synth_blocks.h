// Fast path of `strata synth` for quantised tensors: the block codes are drawn straight from the
// counter-based RNG and the block scales are chosen so that the decoded weights are uniformly spread
// with the standard deviation the tensor's init asks for (synth_tensors.h: a / sqrt(3) of the
// uniform(-a, a) that synth_row draws), and mean zero. No float row is generated and no scale search
// runs, so generation costs a few RNG calls per block instead of a least-squares search per sub-block
// (the float path needed ~160 ns per weight; this one well under 1 ns).
//
// How each type gets mean 0 and the target std s (codes uniform over their whole range):
//   Q4_K / Q5_K  w = d*sc*q - dmin*m, q uniform in 0..15 (0..31): every sub-block has sc = 8 and
//                m = 15 (31) with dmin = 4*d, so the offset is exactly the middle code 7.5 (15.5)
//                steps; step d*8 = s / sqrt((16^2-1)/12) (Q5_K: 32 levels).
//   Q6_K         w = d*sc*(q-32), q uniform in 0..63: sub-block scales +8 / -8 alternate, cancelling
//                the -0.5 mean of q-32; step = s / sqrt(E[(q-32)^2]) = s / sqrt(341.5).
//   Q8_0         w = d*q, q a uniform int8 with -128 mapped to 0 (q in -127..127, mean 0).
//   Q4_0         w = d*(q-8), q uniform in 0..15; d alternates in sign per block (cancelling -0.5).
// The codes are random bytes taken 8 at a time from one 64-bit RNG output (little-endian byte order,
// as on every machine strata runs on), so a file is a pure function of (seed, tensor name, row).
#pragma once

#include <cstdint>

#include "strata/convert/synth_tensors.h"
#include "strata/quant/types.h"

namespace strata::convert {

// Whether synth_quant_row can write tensor `t` as `type` (a block type above and an init whose
// values are uniform and zero-centred: Matrix, Router, Embedding). Other pairs take the float path
// (synth_row then quantize_row).
bool synth_quant_direct(const SynthTensor& t, GgmlType type);

// Standard deviation row `row` of `t` is meant to have (Matrix/Router/Embedding inits).
float synth_row_std(const SynthTensor& t, int64_t row);

// Writes row `row` of `t` (row_bytes(type, ne[0]) bytes) as `type` at dst. Requires
// synth_quant_direct(t, type); throws strata::Error otherwise.
void synth_quant_row(const SynthTensor& t, GgmlType type, uint64_t seed, int64_t row, uint8_t* dst);

}  // namespace strata::convert
