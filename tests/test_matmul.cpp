// CPU matmul/matvec: every weight type at every kernel level this CPU supports, against a float64
// reference (reference decode + double dot), on odd shapes, several token counts and padded row
// strides; SIMD decoders must reproduce the scalar reference decoder's values exactly; the int8
// path must stay within the activation-rounding bound.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "strata/base/error.h"
#include "strata/cpu/cpu_kernels.h"
#include "strata/cpu/matmul.h"
#include "strata/quant/fp16.h"
#include "strata/quant/quantize.h"
#include "strata/quant/types.h"

namespace {

using strata::CpuKernelLevel;
using strata::GgmlType;

const GgmlType kAllTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,
                              GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                              GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                              GgmlType::Q6_K, GgmlType::Q8_K, GgmlType::IQ4_NL, GgmlType::MXFP4};
const CpuKernelLevel kLevels[] = {CpuKernelLevel::Scalar, CpuKernelLevel::Avx2, CpuKernelLevel::Avx512};

// Byte offsets of f16 scale fields per block, for making random blocks finite.
std::vector<size_t> f16_field_bytes(GgmlType t) {
  switch (t) {
    case GgmlType::Q8_0: case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::IQ4_NL: return {0};
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K: return {0, 2};
    case GgmlType::Q2_K: return {80, 82};
    case GgmlType::Q3_K: return {108};
    case GgmlType::Q6_K: return {208};
    default: return {};
  }
}

// One row of n weights: quantised from gaussian floats where the type has an encoder, otherwise
// random bytes with sane scales (decoders must handle any codes).
std::vector<uint8_t> make_row(GgmlType t, int64_t n, std::mt19937& rng) {
  const auto& tr = strata::type_traits(t);
  std::vector<uint8_t> row(strata::row_bytes(t, n));
  if (tr.can_quantize) {
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = g(rng);
    strata::quantize_row(t, x.data(), row.data(), n);
    return row;
  }
  for (auto& b : row) b = static_cast<uint8_t>(rng());
  const size_t nb = row.size() / tr.block_bytes;
  std::uniform_real_distribution<float> scale(0.001f, 0.1f);
  for (size_t b = 0; b < nb; ++b) {
    uint8_t* blk = row.data() + b * tr.block_bytes;
    for (size_t off : f16_field_bytes(t)) {
      const uint16_t h = strata::fp32_to_fp16(scale(rng));
      std::memcpy(blk + off, &h, 2);
    }
    if (t == GgmlType::MXFP4) blk[0] = static_cast<uint8_t>(120 + rng() % 10);
    if (t == GgmlType::Q8_K) {
      const float d = scale(rng);
      std::memcpy(blk, &d, 4);
    }
  }
  return row;
}

struct Problem {
  strata::WeightMatrix w;
  std::vector<uint8_t> storage;
  std::vector<float> X;
  int64_t n_tok;
};

Problem make_problem(GgmlType t, int64_t rows, int64_t cols, int64_t n_tok, size_t pad, uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p;
  const size_t rb = strata::row_bytes(t, cols);
  const size_t stride = rb + pad;
  p.storage.assign(stride * static_cast<size_t>(rows) + 64, 0xAB);
  for (int64_t r = 0; r < rows; ++r) {
    const auto row = make_row(t, cols, rng);
    std::memcpy(p.storage.data() + static_cast<size_t>(r) * stride, row.data(), rb);
  }
  p.w = {t, p.storage.data(), rows, cols, stride};
  std::normal_distribution<float> g(0.0f, 1.0f);
  p.X.resize(static_cast<size_t>(n_tok * cols));
  for (auto& v : p.X) v = g(rng);
  p.n_tok = n_tok;
  return p;
}

// Float64 reference of one product, the sum of |w*x| that bounds float rounding, and
// act_err = sum |w_i| * d_i / 2 with d_i = max|x| / 127 over x_i's block of 32: the most that
// rounding the activations to int8 (the int8 path) can change the result.
void reference(const Problem& p, std::vector<double>& want, std::vector<double>& scale,
               std::vector<double>& act_err) {
  const auto& w = p.w;
  want.assign(static_cast<size_t>(p.n_tok * w.n_rows), 0.0);
  scale.assign(want.size(), 0.0);
  act_err.assign(want.size(), 0.0);
  std::vector<float> row(static_cast<size_t>(w.n_cols));
  for (int64_t r = 0; r < w.n_rows; ++r) {
    strata::dequantize_row(w.type, w.data + static_cast<size_t>(r) * w.row_stride, row.data(), w.n_cols);
    for (int64_t t = 0; t < p.n_tok; ++t) {
      double acc = 0, mag = 0, aerr = 0;
      const float* x = p.X.data() + t * w.n_cols;
      for (int64_t c = 0; c < w.n_cols; ++c) {
        const double v = static_cast<double>(row[c]) * x[c];
        acc += v;
        mag += std::fabs(v);
        if (w.n_cols % 32 == 0) {
          double amax = 0;
          for (int64_t j = c / 32 * 32; j < c / 32 * 32 + 32; ++j) amax = std::max(amax, std::fabs(static_cast<double>(x[j])));
          aerr += std::fabs(static_cast<double>(row[c])) * amax / 127.0 / 2.0;
        }
      }
      want[t * w.n_rows + r] = acc;
      scale[t * w.n_rows + r] = mag;
      act_err[t * w.n_rows + r] = aerr;
    }
  }
}

int64_t cols_for(GgmlType t, int variant) {
  const int64_t be = strata::type_traits(t).block_elems;
  if (be == 1) return variant == 0 ? 37 : 515;  // odd lengths exercise the SIMD tails
  if (be == 32) return variant == 0 ? 96 : 544;
  return variant == 0 ? 256 : 768;
}

class MatmulLevels : public ::testing::Test {
 protected:
  void TearDown() override {
    strata::set_cpu_kernel_level(CpuKernelLevel::Scalar);
    strata::set_cpu_fused_path(true);
  }
};

TEST_F(MatmulLevels, EveryTypeEveryLevelMatchesFloat64Reference) {
  int levels_run = 0, int8_cases = 0;
  for (CpuKernelLevel level : kLevels) {
    if (!strata::cpu_supports(level)) {
      std::printf("  [skip] CPU kernel level %s: not supported by this CPU\n", strata::cpu_kernel_level_name(level));
      continue;
    }
    ++levels_run;
    strata::set_cpu_kernel_level(level);
    for (GgmlType t : kAllTypes) {
      for (int variant = 0; variant < 2; ++variant) {
        for (int64_t n_tok : {1, 3, 70}) {
          const int64_t rows = variant == 0 ? 7 : 13;
          const size_t pad = variant == 0 ? 4 : 6;  // aligned and unaligned row starts
          const Problem p = make_problem(t, rows, cols_for(t, variant), n_tok, pad, 100 + variant);
          std::vector<double> want, mag, act_err;
          reference(p, want, mag, act_err);
          std::vector<float> got(want.size(), NAN);
          strata::matmul(p.w, p.X.data(), p.n_tok, got.data());
          // Float accumulation error is bounded by ~n*eps*sum|w*x| (all levels decode to the same
          // values); the int8 path adds at most act_err (activation rounding).
          const double tol = 2e-6 * std::sqrt(static_cast<double>(p.w.n_cols)) + 1e-6;
          const auto& k = strata::cpu_kernels();
          const bool int8 = k.i8_format != nullptr && k.i8_format(t).supported && p.w.n_cols % 32 == 0;
          if (int8) ++int8_cases;
          for (size_t i = 0; i < want.size(); ++i) {
            const double extra = int8 ? 1.001 * act_err[i] : 0.0;
            ASSERT_LE(std::fabs(got[i] - want[i]), tol * mag[i] + extra + 1e-30)
                << strata::cpu_kernel_level_name(level) << " " << strata::type_traits(t).name << " cols "
                << p.w.n_cols << " n_tok " << n_tok << " out " << i << ": got " << got[i] << " want " << want[i];
          }
        }
      }
    }
  }
  EXPECT_GE(levels_run, 1);
  if (strata::cpu_supports(CpuKernelLevel::Avx2)) {
    EXPECT_GT(int8_cases, 0);  // the int8 path was exercised
  }
}

TEST(MatmulInt8, ActivationQuantisationErrorBound) {
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(256);
  for (auto& v : x) v = g(rng);
  x[5] = 40.0f;   // an outlier coarsens its block only
  for (int i = 64; i < 96; ++i) x[i] = 0.0f;  // an all-zero block
  std::vector<int8_t> q(256);
  std::vector<float> d(8), s(16);
  strata::quantize_activations_i8(x.data(), 256, q.data(), d.data(), s.data());
  for (int b = 0; b < 8; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[32 * b + i]));
    EXPECT_FLOAT_EQ(d[b], amax / 127.0f);
    for (int h = 0; h < 2; ++h) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) {
        const int idx = 32 * b + 16 * h + i;
        EXPECT_LE(std::fabs(x[idx] - d[b] * q[idx]), d[b] * 0.5f * 1.0001f + 1e-30f) << idx;
        sum += q[idx];
      }
      EXPECT_FLOAT_EQ(s[2 * b + h], d[b] * static_cast<float>(sum));
    }
  }
  EXPECT_EQ(q[5], 127);
  for (int i = 64; i < 96; ++i) EXPECT_EQ(q[i], 0);
}

TEST_F(MatmulLevels, SimdDecodersAreExact) {
  for (CpuKernelLevel level : kLevels) {
    if (!strata::cpu_supports(level)) {
      std::printf("  [skip] CPU kernel level %s: not supported by this CPU\n", strata::cpu_kernel_level_name(level));
      continue;
    }
    strata::set_cpu_kernel_level(level);
    const strata::CpuKernels& k = strata::cpu_kernels();
    ASSERT_EQ(k.level, level);
    std::mt19937 rng(5);
    for (GgmlType t : kAllTypes) {
      const int64_t n = cols_for(t, 1);
      for (int rep = 0; rep < 20; ++rep) {
        const auto row = make_row(t, n, rng);
        std::vector<uint8_t> shifted(row.size() + 3);
        std::memcpy(shifted.data() + 3, row.data(), row.size());  // unaligned source
        std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
        strata::dequantize_row(t, row.data(), want.data(), n);
        k.decode_row(t, shifted.data() + 3, got.data(), n);
        // Equal values (an fma may give +0 where the reference gives -0: same number).
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(want[i], got[i]) << strata::cpu_kernel_level_name(level) << " "
                                     << strata::type_traits(t).name << " elem " << i;
        }
      }
    }
  }
}

TEST_F(MatmulLevels, MatvecAndNestedParallelAgree) {
  const Problem p = make_problem(GgmlType::Q4_K, 33, 512, 5, 0, 9);
  std::vector<float> all(static_cast<size_t>(5 * 33)), one(33), nested(all.size());
  strata::matmul(p.w, p.X.data(), 5, all.data());
  for (int t = 0; t < 5; ++t) {
    strata::matvec(p.w, p.X.data() + t * 512, one.data());
    for (int r = 0; r < 33; ++r) ASSERT_EQ(one[r], all[t * 33 + r]) << t << " " << r;
  }
  // Called from inside a parallel region (as the MoE layer does per expert), it runs on the calling thread.
#pragma omp parallel for
  for (int t = 0; t < 5; ++t) strata::matvec(p.w, p.X.data() + t * 512, nested.data() + t * 33);
  EXPECT_EQ(0, std::memcmp(all.data(), nested.data(), all.size() * 4));
}

// Decode's task lists (matvec_many: several matrices of one vector in one region, row ranges through
// matvec_rows) give each row bitwise what matmul gives for one token, for every path (fused, unpacked
// int8, direct Q8_0, decoded float) at every level.
TEST_F(MatmulLevels, MatvecManyEqualsMatvecBitwise) {
  for (CpuKernelLevel level : kLevels) {
    if (!strata::cpu_supports(level)) continue;
    strata::set_cpu_kernel_level(level);
    const GgmlType types[] = {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_K, GgmlType::Q4_0,
                              GgmlType::Q8_0, GgmlType::F32,  GgmlType::F16};
    std::vector<Problem> ps;
    uint32_t seed = 21;
    // Row counts off the task and tile sizes; one vector (the first problem's) for all.
    for (GgmlType t : types) ps.push_back(make_problem(t, 37 + 120 * static_cast<int64_t>(ps.size()), 512, 1, 3, seed++));
    std::vector<const strata::WeightMatrix*> ws;
    std::vector<std::vector<float>> got(ps.size()), want(ps.size());
    std::vector<float*> ys;
    for (size_t i = 0; i < ps.size(); ++i) {
      ws.push_back(&ps[i].w);
      got[i].assign(static_cast<size_t>(ps[i].w.n_rows), -1.0f);
      want[i].resize(got[i].size());
      ys.push_back(got[i].data());
      strata::matmul(ps[i].w, ps[0].X.data(), 1, want[i].data());
    }
    strata::matvec_many(ws.data(), ys.data(), static_cast<int>(ws.size()), ps[0].X.data());
    for (size_t i = 0; i < ps.size(); ++i)
      EXPECT_EQ(0, std::memcmp(got[i].data(), want[i].data(), got[i].size() * 4))
          << strata::type_traits(ps[i].w.type).name << " level " << static_cast<int>(level);
  }
}

// The SIMD activation quantiser must give bitwise the scalar one's numbers (cold experts and the
// engine may quantise with either and still have to agree).
TEST_F(MatmulLevels, SimdActivationQuantisationEqualsScalar) {
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const int64_t n = 2048;
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = g(rng);
  for (int i = 64; i < 96; ++i) x[static_cast<size_t>(i)] = 0.0f;   // all-zero block
  x[200] = -300.0f;                                                  // outlier
  for (int i = 256; i < 288; ++i) x[static_cast<size_t>(i)] = 0.5f * static_cast<float>(i - 272);  // exact halves
  for (int i = 288; i < 320; ++i) x[static_cast<size_t>(i)] = 1e-30f * static_cast<float>(i - 300);  // tiny values
  std::vector<int8_t> q0(static_cast<size_t>(n)), q1(static_cast<size_t>(n));
  std::vector<float> d0(n / 32), d1(n / 32), s0(n / 16), s1(n / 16);
  strata::quantize_activations_i8_scalar(x.data(), n, q0.data(), d0.data(), s0.data());
  int levels = 0;
  for (CpuKernelLevel level : kLevels) {
    if (!strata::cpu_supports(level)) continue;
    strata::set_cpu_kernel_level(level);
    if (strata::cpu_kernels().quantize_i8 == nullptr) continue;
    ++levels;
    std::fill(q1.begin(), q1.end(), int8_t{99});
    strata::quantize_activations_i8(x.data(), n, q1.data(), d1.data(), s1.data());
    EXPECT_EQ(0, std::memcmp(q0.data(), q1.data(), q0.size())) << strata::cpu_kernel_level_name(level);
    EXPECT_EQ(0, std::memcmp(d0.data(), d1.data(), d0.size() * 4)) << strata::cpu_kernel_level_name(level);
    EXPECT_EQ(0, std::memcmp(s0.data(), s1.data(), s0.size() * 4)) << strata::cpu_kernel_level_name(level);
  }
  if (strata::cpu_supports(CpuKernelLevel::Avx2)) {
    EXPECT_GE(levels, 1);
  }
}

// Cold-expert shapes (gate/up 2048 columns, down 512) on the K-quants: the fused path and the
// unpacking path both stay within the activation-rounding bound of the float64 reference and
// agree with each other to float rounding; unpack_i8 + dot_rows_i8 (what cpu/cold_experts.cpp
// calls) equals matvec bitwise.
TEST_F(MatmulLevels, FusedInt8PathMatchesUnpackedAndReference) {
  int fused_cases = 0;
  for (CpuKernelLevel level : kLevels) {
    if (!strata::cpu_supports(level) || level == CpuKernelLevel::Scalar) continue;
    strata::set_cpu_kernel_level(level);
    const strata::CpuKernels& k = strata::cpu_kernels();
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
      for (int64_t cols : {2048, 512}) {
        const Problem p = make_problem(t, 22, cols, 2, 0, 40 + static_cast<uint32_t>(cols));
        std::vector<double> want, mag, act_err;
        reference(p, want, mag, act_err);
        const double tol = 2e-6 * std::sqrt(static_cast<double>(cols)) + 1e-6;
        std::vector<float> fused(want.size()), unpacked(want.size());
        strata::set_cpu_fused_path(true);
        ASSERT_TRUE(k.i8_format(t).fused) << strata::type_traits(t).name;
        strata::matmul(p.w, p.X.data(), p.n_tok, fused.data());
        strata::set_cpu_fused_path(false);
        ASSERT_FALSE(k.i8_format(t).fused);
        strata::matmul(p.w, p.X.data(), p.n_tok, unpacked.data());
        strata::set_cpu_fused_path(true);
        ++fused_cases;
        for (size_t i = 0; i < want.size(); ++i) {
          const auto where = [&] {
            return ::testing::Message() << strata::cpu_kernel_level_name(level) << " " << strata::type_traits(t).name
                                        << " cols " << cols << " out " << i;
          };
          ASSERT_LE(std::fabs(fused[i] - want[i]), tol * mag[i] + 1.001 * act_err[i] + 1e-30) << where();
          ASSERT_LE(std::fabs(unpacked[i] - want[i]), tol * mag[i] + 1.001 * act_err[i] + 1e-30) << where();
          // Same integer products, only the float summation order differs.
          ASSERT_LE(std::fabs(fused[i] - unpacked[i]), 2 * tol * mag[i] + 1e-30) << where();
        }
        // unpack_i8 + dot_rows_i8 in 4-row tiles, as the cold-expert pool calls them.
        const strata::I8Format fmt = k.i8_format(t);
        const size_t un = static_cast<size_t>(cols);
        std::vector<int8_t> xq(un);
        std::vector<float> xd(un / 32), xs(un / 16), y(static_cast<size_t>(p.w.n_rows));
        std::vector<uint8_t> codes(strata::kMaxDotRows * un);
        std::vector<float> scales8(strata::kMaxDotRows * un / 4), bias16(strata::kMaxDotRows * un / 16);
        strata::quantize_activations_i8(p.X.data(), cols, xq.data(), xd.data(), xs.data());
        const strata::I8Act act{xq.data(), xd.data(), xs.data()};
        for (int64_t r0 = 0; r0 < p.w.n_rows; r0 += strata::kMaxDotRows) {
          const int nr = static_cast<int>(std::min<int64_t>(strata::kMaxDotRows, p.w.n_rows - r0));
          strata::I8Row rows[strata::kMaxDotRows];
          for (int i = 0; i < nr; ++i) {
            const size_t ui = static_cast<size_t>(i);
            rows[i] = {codes.data() + ui * un, scales8.data() + ui * un / 4, bias16.data() + ui * un / 16};
            k.unpack_i8(t, p.w.data + static_cast<size_t>(r0 + i) * p.w.row_stride, cols, codes.data() + ui * un,
                        scales8.data() + ui * un / 4, bias16.data() + ui * un / 16);
          }
          k.dot_rows_i8(rows, nr, act, cols, fmt, y.data() + r0);
        }
        std::vector<float> mv(y.size());
        strata::matvec(p.w, p.X.data(), mv.data());
        EXPECT_EQ(0, std::memcmp(mv.data(), y.data(), y.size() * 4)) << strata::type_traits(t).name << " " << cols;
        for (size_t i = 0; i < mv.size(); ++i) ASSERT_EQ(mv[i], fused[i]) << "matvec vs matmul token 0, row " << i;
      }
    }
  }
  if (strata::cpu_supports(CpuKernelLevel::Avx2)) {
    EXPECT_GT(fused_cases, 0);
  }
}

// The batched fused kernel (dot_tile_fused) against the per-token one (dot_rows_fused, one row a call;
// several rows a call too), bitwise, at every SIMD level: 1..37 tokens, 1..kMaxTileRows rows (partial
// register tiles), rows at odd addresses; and matmul over many tokens equals matvec per token bitwise
// (its tiles are this kernel).
TEST_F(MatmulLevels, BatchedFusedKernelEqualsPerTokenBitwise) {
  int cases = 0;
  for (CpuKernelLevel level : kLevels) {
    if (level == CpuKernelLevel::Scalar) continue;
    if (!strata::cpu_supports(level)) {
      std::printf("  [skip] CPU kernel level %s: not supported by this CPU\n", strata::cpu_kernel_level_name(level));
      continue;
    }
    strata::set_cpu_kernel_level(level);
    const strata::CpuKernels& k = strata::cpu_kernels();
    ASSERT_NE(k.dot_tile_fused, nullptr);
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
      ASSERT_TRUE(strata::tile_fused_type(t));
      for (int64_t cols : {256, 768}) {
        const int max_tok = cols == 256 ? 37 : 9;
        const Problem p = make_problem(t, strata::kMaxTileRows, cols, max_tok, 3, 90 + static_cast<uint32_t>(cols));
        const size_t un = static_cast<size_t>(cols);
        std::vector<int8_t> xq(un * max_tok), xi(un * max_tok);
        std::vector<float> xd(un / 32 * max_tok), xs(un / 16 * max_tok), xb(un / 32 * max_tok);
        std::vector<strata::I8TileAct> acts;
        for (int tok = 0; tok < max_tok; ++tok) {
          const size_t o = static_cast<size_t>(tok) * un;
          strata::quantize_activations_i8(p.X.data() + o, cols, xq.data() + o, xd.data() + o / 32, xs.data() + o / 16);
          // In two slices, as the cold-expert pool's threads write them.
          strata::interleave_act_i8(t, xq.data() + o, xs.data() + o / 16, 0, 3, xi.data() + o, xb.data() + o / 32);
          strata::interleave_act_i8(t, xq.data() + o, xs.data() + o / 16, 3, cols / 32, xi.data() + o, xb.data() + o / 32);
          acts.push_back({xi.data() + o, xd.data() + o / 32, xs.data() + o / 16, xb.data() + o / 32});
        }
        // want[tok][row] from the per-token kernel, one row per call.
        std::vector<float> want(static_cast<size_t>(max_tok) * strata::kMaxTileRows);
        for (int tok = 0; tok < max_tok; ++tok) {
          const size_t o = static_cast<size_t>(tok) * un;
          const strata::I8Act a{xq.data() + o, xd.data() + o / 32, xs.data() + o / 16};
          for (int r = 0; r < strata::kMaxTileRows; ++r) {
            const uint8_t* row = p.w.data + static_cast<size_t>(r) * p.w.row_stride;
            k.dot_rows_fused(t, &row, 1, a, cols, want.data() + tok * strata::kMaxTileRows + r);
          }
        }
        // The per-token kernel on 2..kMaxDotRows rows in one call gives each row its one-row result.
        for (int tok : {0, max_tok - 1}) {
          const size_t o = static_cast<size_t>(tok) * un;
          const strata::I8Act a{xq.data() + o, xd.data() + o / 32, xs.data() + o / 16};
          for (int nr = 2; nr <= strata::kMaxDotRows; ++nr) {
            const uint8_t* rows[strata::kMaxDotRows];
            for (int i = 0; i < nr; ++i) rows[i] = p.w.data + static_cast<size_t>(i + 1) * p.w.row_stride;
            float got[strata::kMaxDotRows];
            k.dot_rows_fused(t, rows, nr, a, cols, got);
            for (int i = 0; i < nr; ++i)
              ASSERT_EQ(0, std::memcmp(&got[i], &want[tok * strata::kMaxTileRows + i + 1], 4))
                  << strata::cpu_kernel_level_name(level) << " " << strata::type_traits(t).name << " cols " << cols
                  << " dot_rows_fused of " << nr << " rows: row " << i;
          }
        }
        std::vector<uint8_t> scratch(strata::fused_tile_scratch_bytes(cols) + 1);
        for (int nr = 1; nr <= strata::kMaxTileRows; ++nr) {
          for (int nt = 1; nt <= max_tok; nt += (nr == strata::kMaxTileRows || nr == 3) ? 1 : 5) {
            const int r_first = strata::kMaxTileRows - nr;  // the last nr rows
            const uint8_t* rows[strata::kMaxTileRows];
            for (int i = 0; i < nr; ++i) rows[i] = p.w.data + static_cast<size_t>(r_first + i) * p.w.row_stride;
            std::vector<float> got(static_cast<size_t>(nt) * nr, NAN);
            std::vector<float*> outs;
            for (int tok = 0; tok < nt; ++tok) outs.push_back(got.data() + tok * nr);
            k.dot_tile_fused(t, rows, nr, acts.data(), nt, cols, scratch.data() + 1, outs.data());  // unaligned scratch
            ++cases;
            for (int tok = 0; tok < nt; ++tok)
              for (int i = 0; i < nr; ++i)
                ASSERT_EQ(0, std::memcmp(&got[tok * nr + i], &want[tok * strata::kMaxTileRows + r_first + i], 4))
                    << strata::cpu_kernel_level_name(level) << " " << strata::type_traits(t).name << " cols " << cols
                    << " rows " << nr << " tokens " << nt << ": token " << tok << " row " << i << " got "
                    << got[tok * nr + i] << " want " << want[tok * strata::kMaxTileRows + r_first + i];
          }
        }
      }
      // matmul (tiles of kMaxTileRows, token chunks) equals matvec token by token; 21 rows leave a
      // partial tile.
      for (int64_t n_tok : {3, 4, 9, 70}) {
        const Problem p = make_problem(t, 21, 512, n_tok, 5, 120 + static_cast<uint32_t>(n_tok));
        std::vector<float> all(static_cast<size_t>(n_tok * 21)), one(21);
        strata::matmul(p.w, p.X.data(), n_tok, all.data());
        for (int64_t tok = 0; tok < n_tok; ++tok) {
          strata::matvec(p.w, p.X.data() + tok * 512, one.data());
          ASSERT_EQ(0, std::memcmp(one.data(), all.data() + tok * 21, 21 * 4))
              << strata::cpu_kernel_level_name(level) << " " << strata::type_traits(t).name << " n_tok " << n_tok
              << " token " << tok;
        }
      }
    }
  }
  if (strata::cpu_supports(CpuKernelLevel::Avx2)) {
    EXPECT_GT(cases, 0);
  } else {
    GTEST_SKIP() << "no SIMD kernel level on this CPU: the batched kernel needs AVX2 or AVX-512";
  }
}

// Q8_0 decode skips the float buffer (dot_rows_direct) but must give bitwise what decode_row +
// dot_rows give (the cold-expert pool computes Q8_0 rows that way and must equal matvec).
TEST_F(MatmulLevels, Q8_0DirectDotEqualsDecodeThenDot) {
  int cases = 0;
  for (CpuKernelLevel level : kLevels) {
    if (!strata::cpu_supports(level) || level == CpuKernelLevel::Scalar) continue;
    strata::set_cpu_kernel_level(level);
    const strata::CpuKernels& k = strata::cpu_kernels();
    ASSERT_TRUE(k.direct_float != nullptr && k.direct_float(GgmlType::Q8_0));
    for (int64_t cols : {2048, 512, 96}) {
      const Problem p = make_problem(GgmlType::Q8_0, 23, cols, 1, 6, 70 + static_cast<uint32_t>(cols));
      std::vector<float> mv(static_cast<size_t>(p.w.n_rows)), want(mv.size());
      strata::matvec(p.w, p.X.data(), mv.data());
      std::vector<float> buf(strata::kMaxDotRows * static_cast<size_t>(cols));
      for (int64_t r0 = 0; r0 < p.w.n_rows; r0 += strata::kMaxDotRows) {
        const int nr = static_cast<int>(std::min<int64_t>(strata::kMaxDotRows, p.w.n_rows - r0));
        const float* rows[strata::kMaxDotRows];
        for (int i = 0; i < nr; ++i) {
          float* dst = buf.data() + static_cast<size_t>(i) * static_cast<size_t>(cols);
          k.decode_row(GgmlType::Q8_0, p.w.data + static_cast<size_t>(r0 + i) * p.w.row_stride, dst, cols);
          rows[i] = dst;
        }
        k.dot_rows(rows, nr, p.X.data(), cols, want.data() + r0);
      }
      ++cases;
      EXPECT_EQ(0, std::memcmp(mv.data(), want.data(), mv.size() * 4))
          << strata::cpu_kernel_level_name(level) << " cols " << cols;
    }
  }
  if (strata::cpu_supports(CpuKernelLevel::Avx2)) {
    EXPECT_GT(cases, 0);
  }
}

TEST(MatmulErrors, BadShapesFailLoudly) {
  std::vector<uint8_t> data(4096);
  std::vector<float> x(1024), y(16);
  strata::WeightMatrix w{GgmlType::Q4_K, data.data(), 2, 100, 512};
  EXPECT_THROW(strata::matvec(w, x.data(), y.data()), strata::Error);  // not whole blocks
  w = {GgmlType::Q4_K, data.data(), 2, 512, 100};
  EXPECT_THROW(strata::matvec(w, x.data(), y.data()), strata::Error);  // stride < row bytes
  EXPECT_TRUE(strata::cpu_supports(CpuKernelLevel::Scalar));
  if (!strata::cpu_supports(CpuKernelLevel::Avx512)) {
    EXPECT_THROW(strata::set_cpu_kernel_level(CpuKernelLevel::Avx512), strata::Error);
  }
}

}  // namespace

namespace {

// Without a set_cpu_kernel_level call the level is the best this CPU supports (decided on first use,
// so the check runs in a fresh child process); the setter then switches it.
TEST(MatmulLevelDeathTest, DefaultIsTheBestSupportedLevel) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const CpuKernelLevel best = strata::cpu_supports(CpuKernelLevel::Avx512) ? CpuKernelLevel::Avx512
                              : strata::cpu_supports(CpuKernelLevel::Avx2) ? CpuKernelLevel::Avx2
                                                                            : CpuKernelLevel::Scalar;
  EXPECT_EXIT(
      {
        if (strata::cpu_kernel_level() != best) std::exit(5);
        strata::set_cpu_kernel_level(CpuKernelLevel::Scalar);
        std::exit(strata::cpu_kernel_level() == CpuKernelLevel::Scalar ? 4 : 6);
      },
      ::testing::ExitedWithCode(4), "");
}

}  // namespace
