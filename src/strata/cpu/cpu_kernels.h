// Row-dot kernels behind matmul/matvec, in several instruction-set levels chosen at run time.
// Two paths:
// - float path (every level, every type): weights are decoded to float32 a few rows at a time and
//   dotted with float32 activations. F32/F16/BF16 weights always take it (full float precision).
// - int8 path (SIMD levels, for Q4_0/Q4_K/Q5_K/Q6_K): activations are quantised per 32 values
//   to int8 with a float scale (Q8_0-style), weights are unpacked to small integer codes with
//   per-16 float scales and biases, and the products are summed in integers. The only extra error
//   is the activation rounding: at most |w_i| * d_block / 2 per element.
//   For Q4_K/Q5_K/Q6_K the int8 path is fused (I8Format::fused): the integer dots run straight on
//   the quantised blocks (nibbles split in registers, sub-block scales applied once per block of
//   32), with no unpacked copy: dot_rows_fused on the rows themselves. For those types unpack_i8
//   just copies the raw row into `codes` and dot_rows_i8 runs the fused kernel on it, so callers of
//   unpack_i8 + dot_rows_i8 (cpu/cold_experts.cpp) get bitwise the same results as matvec.
// - batched fused int8 path (dot_tile_fused, SIMD levels, Q4_K/Q5_K/Q6_K): a tile of rows times many
//   tokens. Each row's blocks are unpacked once per call into a panel whose 32-bit groups are
//   transposed (lane j of a vector holds activation block j's bytes), so the integer dots land one
//   block per lane with no horizontal reduction, and every unpacked vector serves several tokens.
//   The tokens' activations are interleaved to match (interleave_act_i8). The float steps per
//   (row, token) are the per-token kernel's, in its order: results equal dot_rows_fused's bitwise.
// tests/test_matmul.cpp checks each level and path against a float64 reference.
#pragma once

#include <cstddef>
#include <cstdint>

#include "strata/quant/types.h"

namespace strata {

enum class CpuKernelLevel { Scalar = 0, Avx2 = 1, Avx512 = 2 };

// Maximum rows one dot call handles (the row tile of matmul).
constexpr int kMaxDotRows = 4;
// matmul uses dot_rows_direct up to this many tokens (beyond, decoding a tile once is cheaper).
constexpr int64_t kDirectMaxTokens = 2;

// One weight row unpacked for the int8 path: weight i = scale16(i/16) * code_i + bias16[i/16].
// codes are unsigned 0..63; scales8 holds each per-16 scale four times in a row (8 floats per 32
// weights, the lane layout of the dot kernels).
struct I8Row {
  const uint8_t* codes;
  const float* scales8;
  const float* bias16;
};

// One token's activations for the int8 path: x_i ~ d32[i/32] * q_i; sum16[h] = d32 * sum of q over
// the 16 values h.
struct I8Act {
  const int8_t* q;
  const float* d32;
  const float* sum16;
};

// One token's activations for the batched fused kernel: q interleaved for the weight type
// (interleave_act_i8), d32 and sum16 as in I8Act, bsum32[j] = sum16[2j] + sum16[2j+1].
struct I8TileAct {
  const int8_t* q;
  const float* d32;
  const float* sum16;
  const float* bsum32;
};

// Most rows one dot_tile_fused call takes.
constexpr int kMaxTileRows = 8;
// Scratch bytes dot_tile_fused needs for rows of n columns (n % 256 == 0); any alignment.
constexpr size_t fused_tile_scratch_bytes(int64_t n) {
  return static_cast<size_t>(kMaxTileRows) * static_cast<size_t>(n / 256) * 448 + 64;
}

// Whether dot_tile_fused takes this type (Q4_K, Q5_K, Q6_K).
bool tile_fused_type(GgmlType type);

// Writes the 32-value blocks [j0, j1) of one token's quantised activations (q, sum16: natural
// layout, as quantize_activations_i8 wrote them; n % 256 == 0) in the layout dot_tile_fused reads
// for weights of `type`: q_out (n bytes, the same blocks' bytes only) and bsum32 (entries [j0, j1)).
// Blocks go to disjoint places, so slices of a row may be written by different threads.
void interleave_act_i8(GgmlType type, const int8_t* q, const float* sum16, int64_t j0, int64_t j1, int8_t* q_out,
                       float* bsum32);

// What the int8 path knows about a weight type.
struct I8Format {
  bool supported = false;
  bool has_bias = false;  // bias16 is used (K-quant mins, Q4_0's -8, Q6_K's -32)
  bool fused = false;     // fused kernels: see the top of this file
  GgmlType type = GgmlType::F32;
};

struct CpuKernels {
  CpuKernelLevel level;
  // Decodes n weights (a whole number of blocks) of `type` at src (any alignment) into dst.
  // Fails loudly for a type the level cannot decode (none today: every level covers types.h).
  void (*decode_row)(GgmlType type, const uint8_t* src, float* dst, int64_t n);
  // out[r] = dot(rows[r][0..n), x[0..n)) for r < nr (1 <= nr <= kMaxDotRows).
  void (*dot_rows)(const float* const* rows, int nr, const float* x, int64_t n, float* out);
  // Float path without the decode buffer, for the types direct_float accepts (Q8_0): out[r] =
  // dot(row r, x) straight from the quantised rows, bitwise equal to decode_row + dot_rows (same
  // products, same summation order), so callers of either agree. Both null at the scalar level.
  bool (*direct_float)(GgmlType type);
  void (*dot_rows_direct)(GgmlType type, const uint8_t* const* rows, int nr, const float* x, int64_t n, float* out);
  // int8 path; all null at the scalar level.
  I8Format (*i8_format)(GgmlType type);
  // Unpacks n weights (n % 32 == 0) into codes[n], scales8[n/4], bias16[n/16]. For fused formats:
  // copies the raw row (fewer than n bytes) into codes, leaving scales8 and bias16 alone.
  void (*unpack_i8)(GgmlType type, const uint8_t* src, int64_t n, uint8_t* codes, float* scales8, float* bias16);
  // out[r] = dot(row r, x) for r < nr (1 <= nr <= kMaxDotRows), bias terms included.
  void (*dot_rows_i8)(const I8Row* rows, int nr, const I8Act& x, int64_t n, I8Format fmt, float* out);
  // Fused int8 path (types with I8Format::fused): out[r] = dot(row r, x) for r < nr
  // (1 <= nr <= kMaxDotRows), rows[r] pointing at the quantised row itself (any alignment).
  // Each row's result depends only on that row and x (not on nr or its place in the tile).
  void (*dot_rows_fused)(GgmlType type, const uint8_t* const* rows, int nr, const I8Act& x, int64_t n, float* out);
  // Batched fused int8 path (types with tile_fused_type): out[t][i] = dot(row i, token t) for
  // i < nr (1 <= nr <= kMaxTileRows), t < nt (nt >= 1), rows[i] pointing at the quantised rows (any
  // alignment), xs[t] interleaved for this type. Bitwise equal to dot_rows_fused on each row and
  // token. scratch: fused_tile_scratch_bytes(n) bytes of the caller's. Null at the scalar level.
  void (*dot_tile_fused)(GgmlType type, const uint8_t* const* rows, int nr, const I8TileAct* xs, int nt, int64_t n,
                         uint8_t* scratch, float* const* out);
  // SIMD form of quantize_activations_i8 (bitwise the same results); null at the scalar level.
  void (*quantize_i8)(const float* x, int64_t n, int8_t* q, float* d32, float* sum16);
};

// Turns the fused int8 path off or on (on by default), for benchmarks and tests comparing the two.
// Off is the CPU path as it was before the fused kernels: K-quants unpacked to int8 codes, the
// activations quantised by the scalar code (same numbers as the SIMD one), Q8_0 decoded to a
// float buffer before the dot (same numbers as dot_rows_direct). Not while kernels are
// running: a caller's I8Format and its unpack_i8/dot_rows_i8 calls must see the same setting.
void set_cpu_fused_path(bool on);
bool cpu_fused_path();
// Turns the batched fused kernel (dot_tile_fused) off or on (on by default) in matmul and the
// cold-expert pool's batches, for benchmarks comparing it with the per-token kernel it equals bitwise.
void set_cpu_tile_path(bool on);
bool cpu_tile_path();

// Throws strata::Error "<what> for <type name>" (non-template, so ISA-specific kernel files can call it).
[[noreturn]] void fail_kernel_type(const char* what, GgmlType type);

// Quantises n activations (n % 32 == 0) for the int8 path: d32[n/32], sum16[n/16], q[n]. Uses the
// active level's quantize_i8 when it has one and the fused path is on (same results as the scalar
// code, which is quantize_activations_i8_scalar).
void quantize_activations_i8_scalar(const float* x, int64_t n, int8_t* q, float* d32, float* sum16);
void quantize_activations_i8(const float* x, int64_t n, int8_t* q, float* d32, float* sum16);

// "scalar", "avx2", "avx512".
const char* cpu_kernel_level_name(CpuKernelLevel level);
// Whether this CPU can run the level (CPUID via __builtin_cpu_supports).
bool cpu_supports(CpuKernelLevel level);
// The level matmul uses: the one set_cpu_kernel_level forced, otherwise the best supported one
// (decided on first use). The levels are not bitwise alike (the SIMD ones take the int8 path).
CpuKernelLevel cpu_kernel_level();
// Forces a level for the rest of the process (tests, benchmarks). Throws if the CPU lacks it.
void set_cpu_kernel_level(CpuKernelLevel level);
// Kernels of the active level.
const CpuKernels& cpu_kernels();

// Per-level tables (defined in kernels_*.cpp). Only call one the CPU supports.
const CpuKernels& cpu_kernels_scalar();
const CpuKernels& cpu_kernels_avx2();
const CpuKernels& cpu_kernels_avx512();

}  // namespace strata
