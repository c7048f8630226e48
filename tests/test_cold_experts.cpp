// The CPU cold-expert pool (cpu/cold_experts.h): each cold expert's SwiGLU FFN output must equal,
// bitwise, what the CPU engine computes for that expert (the public matvec + swiglu the engine's MoE
// block calls), for the quant types of real MoE files, any thread count and many jobs in a row; and
// it must stay within the int8-activation rounding of a float64 reference written here.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "strata/base/error.h"
#include "strata/cpu/cpu_kernels.h"
#include "strata/cpu/matmul.h"
#include "strata/cpu/ops.h"
#include "strata/cpu/cold_experts.h"
#include "strata/model/weights.h"
#include "strata/quant/quantize.h"
#include "strata/quant/types.h"

namespace {

using strata::ColdExpertPool;
using strata::ColdPick;
using strata::ColdTokenPick;
using strata::ExpertStack;
using strata::GgmlType;
using strata::MoeWeights;
using strata::WeightMatrix;

struct Stack {
  std::vector<uint8_t> bytes;
  ExpertStack s;
};

Stack make_stack(GgmlType t, int n_exp, int64_t rows, int64_t cols, std::mt19937& rng, float sd) {
  Stack st;
  const size_t rb = strata::row_bytes(t, cols);
  st.bytes.resize(rb * static_cast<size_t>(rows) * static_cast<size_t>(n_exp));
  std::normal_distribution<float> g(0.0f, sd);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows * n_exp; ++r) {
    for (auto& v : row) v = g(rng);
    strata::quantize_row(t, row.data(), st.bytes.data() + static_cast<size_t>(r) * rb, cols);
  }
  st.s.first = WeightMatrix{t, st.bytes.data(), rows, cols, rb};
  st.s.expert_stride = rb * static_cast<size_t>(rows);
  st.s.n_expert = n_exp;
  return st;
}

struct Experts {
  Stack gate, up, down;
  MoeWeights w;
};

Experts make_experts(GgmlType gu, GgmlType dn, int n_exp, int64_t d, int64_t ff, uint32_t seed) {
  std::mt19937 rng(seed);
  Experts e;
  e.gate = make_stack(gu, n_exp, ff, d, rng, 0.08f);
  e.up = make_stack(gu, n_exp, ff, d, rng, 0.08f);
  e.down = make_stack(dn, n_exp, d, ff, rng, 0.08f);
  e.w.gate = e.gate.s;
  e.w.up = e.up.s;
  e.w.down = e.down.s;
  return e;
}

// What the CPU engine's MoE block computes for one expert and one token.
std::vector<float> engine_expert(const MoeWeights& w, int e, const float* xn) {
  const int64_t ff = w.gate.first.n_rows, d = w.gate.first.n_cols;
  std::vector<float> g(static_cast<size_t>(ff)), u(static_cast<size_t>(ff)), y(static_cast<size_t>(d));
  strata::matvec(w.gate.expert(e), xn, g.data());
  strata::matvec(w.up.expert(e), xn, u.data());
  strata::swiglu(g.data(), u.data(), ff, g.data());
  strata::matvec(w.down.expert(e), g.data(), y.data());
  return y;
}

// Independent float64 reference: dequantise each row, double dots, double SiLU.
std::vector<double> reference_expert(const MoeWeights& w, int e, const float* xn) {
  const int64_t ff = w.gate.first.n_rows, d = w.gate.first.n_cols;
  auto dot_rows = [](const WeightMatrix& m, const std::vector<double>& x) {
    std::vector<double> y(static_cast<size_t>(m.n_rows));
    std::vector<float> row(static_cast<size_t>(m.n_cols));
    for (int64_t r = 0; r < m.n_rows; ++r) {
      strata::dequantize_row(m.type, m.data + static_cast<size_t>(r) * m.row_stride, row.data(), m.n_cols);
      double acc = 0.0;
      for (int64_t i = 0; i < m.n_cols; ++i)
        acc += static_cast<double>(row[static_cast<size_t>(i)]) * x[static_cast<size_t>(i)];
      y[static_cast<size_t>(r)] = acc;
    }
    return y;
  };
  std::vector<double> x(xn, xn + d);
  const auto g = dot_rows(w.gate.expert(e), x);
  const auto u = dot_rows(w.up.expert(e), x);
  std::vector<double> h(static_cast<size_t>(ff));
  for (size_t i = 0; i < h.size(); ++i) h[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  return dot_rows(w.down.expert(e), h);
}

std::vector<float> random_x(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = g(rng);
  return x;
}

struct Case {
  GgmlType gu, dn;
  int64_t d, ff;
};

class ColdExperts : public ::testing::TestWithParam<Case> {};

TEST_P(ColdExperts, EqualsEngineBitwiseAndReferenceWithinRounding) {
  const Case c = GetParam();
  const int n_exp = 7;
  Experts ex = make_experts(c.gu, c.dn, n_exp, c.d, c.ff, 1234);
  const std::vector<float> xn = random_x(c.d, 99);
  const std::vector<int> ids = {1, 4, 6, 0};
  const strata::CpuKernelLevel saved = strata::cpu_kernel_level();
  // Every level this CPU has (CI's runners give the AVX2 and scalar ones), every thread count.
  for (strata::CpuKernelLevel level :
       {strata::CpuKernelLevel::Scalar, strata::CpuKernelLevel::Avx2, strata::CpuKernelLevel::Avx512}) {
    if (!strata::cpu_supports(level)) continue;
    strata::set_cpu_kernel_level(level);
    const char* lv = strata::cpu_kernel_level_name(level);
    for (int threads : {1, 3, 5}) {
      ColdExpertPool pool(threads);
      std::vector<std::vector<float>> out(ids.size(), std::vector<float>(static_cast<size_t>(c.d), NAN));
      std::vector<ColdPick> picks;
      for (size_t j = 0; j < ids.size(); ++j) picks.push_back({ids[j], out[j].data()});
      pool.run(ex.w, xn.data(), picks.data(), static_cast<int>(picks.size()));
      for (size_t j = 0; j < ids.size(); ++j) {
        const auto want = engine_expert(ex.w, ids[j], xn.data());
        const auto ref = reference_expert(ex.w, ids[j], xn.data());
        double amax = 0.0, err = 0.0;
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_EQ(out[j][i], want[i]) << lv << " threads " << threads << " expert " << ids[j] << " row " << i;
          amax = std::max(amax, std::fabs(ref[i]));
          err = std::max(err, std::fabs(out[j][i] - ref[i]));
        }
        // int8 activations round each value by up to half a step of max|x|/127 per 32 values.
        EXPECT_LE(err, 0.03 * amax + 1e-5) << lv << " threads " << threads << " expert " << ids[j];
      }
    }
  }
  strata::set_cpu_kernel_level(saved);
}

INSTANTIATE_TEST_SUITE_P(Types, ColdExperts,
                         ::testing::Values(Case{GgmlType::Q4_K, GgmlType::Q6_K, 256, 512},
                                           Case{GgmlType::Q5_K, GgmlType::Q5_K, 512, 256},
                                           Case{GgmlType::Q8_0, GgmlType::Q8_0, 128, 96},
                                           Case{GgmlType::Q4_0, GgmlType::Q4_0, 96, 160},
                                           Case{GgmlType::F16, GgmlType::F32, 64, 40}));

TEST(ColdExpertsPool, ManyJobsInARowWithSleepsBetween) {
  Experts ex = make_experts(GgmlType::Q4_K, GgmlType::Q6_K, 5, 256, 256, 7);
  ColdExpertPool pool(4);
  std::mt19937 rng(5);
  for (int job = 0; job < 60; ++job) {
    const int n = 1 + static_cast<int>(rng() % 5);
    const std::vector<float> xn = random_x(256, 1000 + job);
    std::vector<std::vector<float>> out(static_cast<size_t>(n), std::vector<float>(256, NAN));
    std::vector<ColdPick> picks;
    for (int j = 0; j < n; ++j) picks.push_back({static_cast<int>(rng() % 5), out[static_cast<size_t>(j)].data()});
    pool.run(ex.w, xn.data(), picks.data(), n);
    for (int j = 0; j < n; ++j) {
      const auto want = engine_expert(ex.w, picks[static_cast<size_t>(j)].expert, xn.data());
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(out[static_cast<size_t>(j)][i], want[i]) << "job " << job;
    }
    // Now and then let the workers fall asleep (past their spin window) so waking is exercised.
    if (job % 20 == 19) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

TEST(ColdExpertsPool, RejectsBadInput) {
  Experts ex = make_experts(GgmlType::Q8_0, GgmlType::Q8_0, 3, 64, 64, 3);
  ColdExpertPool pool(2);
  std::vector<float> xn = random_x(64, 1), out(64);
  ColdPick bad{3, out.data()};
  EXPECT_THROW(pool.run(ex.w, xn.data(), &bad, 1), strata::Error);
  ColdPick null_out{0, nullptr};
  EXPECT_THROW(pool.run(ex.w, xn.data(), &null_out, 1), strata::Error);
  EXPECT_THROW(ColdExpertPool(0), strata::Error);
  // Still usable after a rejected job.
  ColdPick ok{2, out.data()};
  pool.run(ex.w, xn.data(), &ok, 1);
  EXPECT_EQ(out, engine_expert(ex.w, 2, xn.data()));
}

// The batched entry point (prefill): many tokens, picks in any order, several per expert, for each CPU
// kernel level this machine has, quant mixes of real files, and thread counts that split groups
// unevenly. With run()'s row kernels every output row must equal, bitwise, what run() gives for that
// token and expert (itself checked against the engine above), and so must it with the batched int8
// kernel (K-quants); with the SIMD float tiles (other types) it must be within float rounding of the
// float64 reference and within int8 rounding of run().
struct BatchCase {
  GgmlType gu, dn;
  int64_t d, ff;
};

class ColdExpertsBatch : public ::testing::TestWithParam<BatchCase> {};

TEST_P(ColdExpertsBatch, EqualsPerTokenRun) {
  const BatchCase c = GetParam();
  const int n_exp = 9, n_tok = 70, k = 3;
  Experts ex = make_experts(c.gu, c.dn, n_exp, c.d, c.ff, 4321);
  const std::vector<float> X = random_x(static_cast<int64_t>(n_tok) * c.d, 77);
  // Skewed picks: expert 2 takes most tokens (a group longer than one 64-token chunk), some experts none.
  std::mt19937 rng(11);
  std::vector<std::pair<int, int>> tp;  // (token, expert)
  for (int t = 0; t < n_tok; ++t) {
    std::vector<int> chosen;
    while (static_cast<int>(chosen.size()) < k) {
      static const int others[] = {0, 1, 3, 5, 6, 8};  // 7 never picked, 4 only below
      const int e = (rng() % 3 == 0) ? 2 : others[rng() % 6];
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
    if (t % 4 == 0) chosen.pop_back();  // not every token has k cold picks
    if (t == 5 || t == 9) chosen.push_back(4);  // a group of two tokens (the float tiles skip small groups)
    for (int e : chosen) tp.push_back({t, e});
  }
  std::shuffle(tp.begin(), tp.end(), rng);
  const strata::CpuKernelLevel saved = strata::cpu_kernel_level();
  for (strata::CpuKernelLevel level :
       {strata::CpuKernelLevel::Scalar, strata::CpuKernelLevel::Avx2, strata::CpuKernelLevel::Avx512}) {
    if (!strata::cpu_supports(level)) continue;
    strata::set_cpu_kernel_level(level);
    for (int mode = 0; mode < 3; ++mode) {
      // Float tiles (SIMD levels, mode 1): float math, so within float rounding of the float64 reference
      // and within run()'s int8 rounding of run(); off (mode 0, and at the scalar level) or declined by
      // the call (mode 2: run_batch's bitwise argument, with the tiles on): bitwise equal to run().
      // K-quant experts take the batched int8 kernel instead of float tiles: bitwise equal to run() too.
      const bool tiles = mode >= 1, ask_bitwise = mode == 2;
      const bool bitwise = !tiles || ask_bitwise || level == strata::CpuKernelLevel::Scalar ||
                           (strata::tile_fused_type(c.gu) && strata::tile_fused_type(c.dn));
      for (int threads : {1, 4, 7}) {
        ColdExpertPool pool(threads);
        pool.set_batch_float_tiles(tiles);
        std::vector<float> out(tp.size() * static_cast<size_t>(c.d), NAN);
        std::vector<ColdTokenPick> picks;
        for (size_t i = 0; i < tp.size(); ++i)
          picks.push_back({tp[i].first, tp[i].second, out.data() + i * static_cast<size_t>(c.d)});
        pool.run_batch(ex.w, X.data(), n_tok, picks.data(), static_cast<int>(picks.size()), ask_bitwise);
        // Twice in a row (the pool reuses its buffers; a second batch must not see the first's state).
        std::vector<float> again(out.size(), NAN);
        for (size_t i = 0; i < tp.size(); ++i) picks[i].out = again.data() + i * static_cast<size_t>(c.d);
        pool.run_batch(ex.w, X.data(), n_tok, picks.data(), static_cast<int>(picks.size()), ask_bitwise);
        std::vector<float> one(static_cast<size_t>(c.d));
        const std::string what = std::string(strata::cpu_kernel_level_name(level)) +
                                 (ask_bitwise ? " tiles declined"
                                  : tiles     ? " tiles"
                                              : " rows") +
                                 " threads " + std::to_string(threads);
        for (size_t i = 0; i < tp.size(); ++i) {
          const float* x = X.data() + static_cast<size_t>(tp[i].first) * static_cast<size_t>(c.d);
          ColdPick p{tp[i].second, one.data()};
          pool.run(ex.w, x, &p, 1);
          const float* got = out.data() + i * static_cast<size_t>(c.d);
          for (size_t r = 0; r < one.size(); ++r)
            ASSERT_EQ(again[i * static_cast<size_t>(c.d) + r], got[r]) << what << " second batch, pick " << i;
          if (bitwise) {
            for (size_t r = 0; r < one.size(); ++r) ASSERT_EQ(got[r], one[r]) << what << " pick " << i << " row " << r;
            continue;
          }
          if (i % 7 != 0) continue;  // the float64 reference is slow: every seventh pick
          const std::vector<double> ref = reference_expert(ex.w, tp[i].second, x);
          double amax = 0.0, e_ref = 0.0, e_run = 0.0;
          for (size_t r = 0; r < one.size(); ++r) {
            amax = std::max(amax, std::fabs(ref[r]));
            e_ref = std::max(e_ref, std::fabs(got[r] - ref[r]));
            e_run = std::max(e_run, std::fabs(double(got[r]) - one[r]));
          }
          EXPECT_LE(e_ref, 1e-4 * amax + 1e-6) << what << " pick " << i;
          EXPECT_LE(e_run, 0.03 * amax + 1e-5) << what << " pick " << i;
        }
      }
    }
  }
  strata::set_cpu_kernel_level(saved);
}

INSTANTIATE_TEST_SUITE_P(Types, ColdExpertsBatch,
                         ::testing::Values(BatchCase{GgmlType::Q4_K, GgmlType::Q6_K, 256, 512},
                                           BatchCase{GgmlType::Q5_K, GgmlType::Q5_K, 256, 256},
                                           BatchCase{GgmlType::Q8_0, GgmlType::Q8_0, 128, 96},
                                           BatchCase{GgmlType::F16, GgmlType::F32, 64, 40}));

TEST(ColdExpertsPool, BatchRejectsBadInput) {
  Experts ex = make_experts(GgmlType::Q8_0, GgmlType::Q8_0, 3, 64, 64, 3);
  ColdExpertPool pool(2);
  std::vector<float> X = random_x(2 * 64, 1), out(64);
  ColdTokenPick bad_token{2, 0, out.data()};
  EXPECT_THROW(pool.run_batch(ex.w, X.data(), 2, &bad_token, 1), strata::Error);
  ColdTokenPick bad_expert{1, 3, out.data()};
  EXPECT_THROW(pool.run_batch(ex.w, X.data(), 2, &bad_expert, 1), strata::Error);
  ColdTokenPick null_out{0, 0, nullptr};
  EXPECT_THROW(pool.run_batch(ex.w, X.data(), 2, &null_out, 1), strata::Error);
  // Still usable, and batch and single jobs interleave (row kernels: the batch equals run() bitwise).
  pool.set_batch_float_tiles(false);
  ColdTokenPick ok{1, 2, out.data()};
  pool.run_batch(ex.w, X.data(), 2, &ok, 1);
  std::vector<float> single_out(64);
  ColdPick single{2, single_out.data()};
  pool.run(ex.w, X.data() + 64, &single, 1);
  EXPECT_EQ(out, single_out);
  ColdTokenPick ok0{0, 0, out.data()};
  pool.run_batch(ex.w, X.data(), 2, &ok0, 1);
  single.expert = 0;
  pool.run(ex.w, X.data(), &single, 1);
  EXPECT_EQ(out, single_out);
}

}  // namespace
