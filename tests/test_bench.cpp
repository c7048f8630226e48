// strata bench: statistics, the byte counts behind the floors, the timing loop's protocol (with a
// fake backend that records what it is asked), the triad, and the CLI's JSON.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "strata/base/error.h"
#include "strata/cpu/cold_experts.h"
#include "strata/cpu/matmul.h"
#include "strata/cpu/ops.h"
#include "strata/quant/quantize.h"
#include "strata/convert/synth.h"
#include "strata/engine/bench_backend.h"
#include "strata/engine/bench_bandwidth.h"
#include "strata/engine/bench_cold.h"
#include "strata/engine/bench_floor.h"
#include "strata/engine/bench_report.h"
#include "strata/engine/bench_runner.h"
#include "strata/engine/model.h"
#include "strata/engine/session.h"
#include "process_temp_dir.h"

namespace fs = std::filesystem;

namespace {

fs::path temp_dir() { return process_temp_dir("strata_test_bench_"); }

std::string tiny_model(const std::string& quant) {
  static std::string cached[2];
  const int i = quant == "f32" ? 0 : 1;
  if (!cached[i].empty()) return cached[i];
  strata::convert::SynthOptions o;
  o.preset = "tiny-qwen35moe";
  o.quant = quant;
  o.out_path = (temp_dir() / ("tiny_" + quant + ".gguf")).string();
  strata::convert::synth_model(o);
  return cached[i] = o.out_path;
}

// Records calls; logits put the maximum at (last token + 1) % vocab so greedy decode is predictable.
class FakeBackend : public strata::BenchBackend {
 public:
  std::string name() const override { return "fake"; }
  int64_t n_vocab() const override { return 50; }
  void reset() override {
    resets++;
    seen.clear();
  }
  void forward(const int32_t* tokens, int n, float* logits, bool all_positions) override {
    EXPECT_FALSE(all_positions);
    calls.push_back(n);
    for (int i = 0; i < n; ++i) seen.push_back(tokens[i]);
    for (int64_t v = 0; v < 50; ++v) logits[v] = 0.0f;
    logits[(tokens[n - 1] + 1) % 50] = 1.0f;
  }
  int resets = 0;
  std::vector<int> calls;
  std::vector<int32_t> seen;
};

}  // namespace

TEST(Bench, Summarize) {
  const auto s = strata::summarize({3.0, 1.0, 2.0});
  EXPECT_DOUBLE_EQ(s.median, 2.0);
  EXPECT_DOUBLE_EQ(s.min, 1.0);
  EXPECT_DOUBLE_EQ(s.max, 3.0);
  EXPECT_DOUBLE_EQ(s.stddev, 1.0);  // sample sd of 1, 2, 3
  const auto e = strata::summarize({4.0, 1.0, 2.0, 3.0});
  EXPECT_DOUBLE_EQ(e.median, 2.5);
  EXPECT_NEAR(e.stddev, std::sqrt(5.0 / 3.0), 1e-12);
  EXPECT_THROW(strata::summarize({}), strata::Error);
}

TEST(Bench, RunnerProtocol) {
  FakeBackend b;
  strata::BenchParams p;
  p.n_prompt = 7;
  p.n_gen = 5;
  p.reps = 3;
  p.warmup = false;
  const auto run = strata::run_bench(b, p);
  EXPECT_EQ(b.resets, 3);
  ASSERT_EQ(b.calls.size(), 3u * 6u);
  EXPECT_EQ(b.calls[0], 7);
  for (int i = 1; i < 6; ++i) EXPECT_EQ(b.calls[static_cast<size_t>(i)], 1);
  // Last repetition: prompt, then greedy tokens, each the previous token + 1 (the fake's argmax).
  ASSERT_EQ(b.seen.size(), 12u);
  for (size_t i = 7; i < 12; ++i) EXPECT_EQ(b.seen[i], (b.seen[i - 1] + 1) % 50);
  EXPECT_EQ(std::vector<int32_t>(b.seen.begin(), b.seen.begin() + 7), strata::bench_prompt(7, 50, p.seed, 2));
  EXPECT_EQ(run.prefill_tps.size(), 3u);
  EXPECT_EQ(run.decode_tps.size(), 3u);
  EXPECT_EQ(run.ttft_ms.size(), 3u);
  for (double x : run.prefill_tps) EXPECT_GT(x, 0.0);
  // Prompts differ between repetitions but are reproducible.
  EXPECT_NE(strata::bench_prompt(7, 50, 1, 0), strata::bench_prompt(7, 50, 1, 1));
  EXPECT_EQ(strata::bench_prompt(7, 50, 1, 0), strata::bench_prompt(7, 50, 1, 0));
  p.n_prompt = 0;
  EXPECT_THROW(strata::run_bench(b, p), strata::Error);
  p.n_prompt = 4;
  p.reps = 0;
  EXPECT_THROW(strata::run_bench(b, p), strata::Error);
}

// With F32 weights every byte count follows from the shapes: 4 bytes per element.
TEST(Bench, ActiveBytesFromShapes) {
  auto model = strata::Model::load(tiny_model("f32"));
  const auto a = strata::count_active_bytes(model->file(), model->config());
  const double E = 256, V = 512, F = 256, X = 16, L = 4;
  EXPECT_DOUBLE_EQ(a.embd_row, 4 * E);
  EXPECT_DOUBLE_EQ(a.output, 4 * E * V);
  EXPECT_DOUBLE_EQ(a.experts_all, 4 * L * 3 * E * F * X);
  EXPECT_DOUBLE_EQ(a.expert_fraction, 4.0 / 16.0);
  // Shared expert (3 x E x 256) and router (E x X) of every layer are in the dense part.
  EXPECT_GT(a.dense, 4 * L * (3 * E * 256 + E * X));
  EXPECT_DOUBLE_EQ(a.decode_per_token(), a.dense + a.embd_row + a.output + a.experts_all / 4);
  // Prefill of one token reads what decode reads; of many tokens, nearly every expert.
  EXPECT_NEAR(a.prefill(1), a.decode_per_token(), 1e-6 * a.decode_per_token());
  EXPECT_NEAR(a.prefill(512), a.dense + 512 * a.embd_row + a.output + a.experts_all, 1.0);
}

TEST(Bench, TriadBandwidthIsPositive) {
  const auto r = strata::measure_triad_bandwidth(16u << 20, 2);
  EXPECT_GT(r.triad_gbs, 0.1);
  EXPECT_LT(r.triad_gbs, 10000.0);
  EXPECT_EQ(r.array_bytes, 16u << 20);
  EXPECT_THROW(strata::measure_triad_bandwidth(100, 1), strata::Error);
}

// bench-cold's in-memory experts: the stacks have the asked shapes and type, back to back, and an
// expert computed from them through the pool equals the float64 SwiGLU of its dequantised rows
// within the int8 rounding (so the benchmark times real work on well-formed blocks).
TEST(Bench, SyntheticExpertsAreWellFormed) {
  const int64_t d = 512, ff = 256;
  const strata::SyntheticExperts ex(strata::GgmlType::Q4_K, d, ff, 5, 2, 7);
  ASSERT_EQ(ex.layers().size(), 2u);
  const strata::ExpertFfn& w = ex.layers()[1];
  EXPECT_EQ(w.gate.first.type, strata::GgmlType::Q4_K);
  EXPECT_EQ(w.gate.first.n_rows, ff);
  EXPECT_EQ(w.gate.first.n_cols, d);
  EXPECT_EQ(w.down.first.n_rows, d);
  EXPECT_EQ(w.down.first.n_cols, ff);
  EXPECT_EQ(w.gate.n_expert, 5);
  EXPECT_EQ(strata::cold_expert_bytes(w), 3 * strata::row_bytes(strata::GgmlType::Q4_K, d) * ff);
  EXPECT_EQ(ex.bytes(), 2 * 5 * strata::cold_expert_bytes(w));
  std::vector<float> x(d), out(d);
  for (int64_t i = 0; i < d; ++i) x[static_cast<size_t>(i)] = std::sin(0.37f * static_cast<float>(i));
  strata::ColdExpertPool pool(2);
  strata::ColdPick pick{3, out.data()};
  pool.run(w, x.data(), &pick, 1);
  const auto rows = [](const strata::ExpertStack& s, int e) {
    const strata::WeightMatrix m = s.expert(e);
    std::vector<float> v(static_cast<size_t>(m.n_rows * m.n_cols));
    for (int64_t r = 0; r < m.n_rows; ++r)
      strata::dequantize_row(m.type, m.data + static_cast<size_t>(r) * m.row_stride, v.data() + r * m.n_cols, m.n_cols);
    return v;
  };
  const auto g = rows(w.gate, 3), u = rows(w.up, 3), dn = rows(w.down, 3);
  std::vector<double> h(ff);
  for (int64_t r = 0; r < ff; ++r) {
    double sg = 0, su = 0;
    for (int64_t i = 0; i < d; ++i) {
      sg += static_cast<double>(g[static_cast<size_t>(r * d + i)]) * x[static_cast<size_t>(i)];
      su += static_cast<double>(u[static_cast<size_t>(r * d + i)]) * x[static_cast<size_t>(i)];
    }
    h[static_cast<size_t>(r)] = sg / (1.0 + std::exp(-sg)) * su;
  }
  double amax = 0, err = 0;
  for (int64_t r = 0; r < d; ++r) {
    double s = 0;
    for (int64_t i = 0; i < ff; ++i) s += static_cast<double>(dn[static_cast<size_t>(r * ff + i)]) * h[static_cast<size_t>(i)];
    amax = std::max(amax, std::fabs(s));
    err = std::max(err, std::fabs(s - out[static_cast<size_t>(r)]));
  }
  EXPECT_GT(amax, 0.0);
  EXPECT_LE(err, 0.03 * amax + 1e-6);
  EXPECT_THROW(strata::SyntheticExperts(strata::GgmlType::Q4_K, 100, ff, 1, 1, 1), strata::Error);  // partial block
}

// The cold bench's bookkeeping (no timing is asserted): bytes per job and the cold cycle's working set.
TEST(Bench, ColdBenchCountsBytes) {
  const strata::SyntheticExperts ex(strata::GgmlType::Q8_0, 64, 32, 6, 3, 1);
  strata::ColdExpertPool pool(2);
  strata::ColdBenchOptions o;
  o.picks = 4;
  o.seconds = 0.01;
  const auto r = strata::bench_cold_experts(pool, ex.layers(), o);
  const double per = static_cast<double>(strata::cold_expert_bytes(ex.layers()[0]));
  EXPECT_EQ(r.picks, 4);
  EXPECT_EQ(r.threads, 2);
  EXPECT_DOUBLE_EQ(r.bytes_per_job, 4 * per);
  EXPECT_DOUBLE_EQ(r.working_set_bytes, 3 * 4 * per);  // 6 / 4 = one round per layer, 3 layers
  EXPECT_GE(r.cold_jobs, 3);
  EXPECT_GE(r.cached_jobs, 16);
  EXPECT_GT(r.cold_gbs, 0.0);
  o.picks = 7;
  EXPECT_THROW(strata::bench_cold_experts(pool, ex.layers(), o), strata::Error);
}

TEST(Bench, CpuBackendRunsRealModel) {
  auto model = strata::Model::load(tiny_model("q4_k_m"));
  auto backend = strata::make_cpu_bench_backend(*model, 32);
  EXPECT_EQ(backend->name(), "cpu");
  EXPECT_TRUE(backend->vram_by_tier().empty());
  strata::BenchParams p;
  p.n_prompt = 8;
  p.n_gen = 4;
  p.reps = 2;
  const auto run = strata::run_bench(*backend, p);
  EXPECT_FALSE(run.greedy_on_device) << "the CPU engine picks on the host";
  EXPECT_EQ(run.decode_tps.size(), 2u);
  for (double x : run.decode_tps) EXPECT_TRUE(std::isfinite(x) && x > 0);
  // The context is p + n: one more decode step would not fit, so the runner must reset between reps.
  p.reps = 3;
  EXPECT_NO_THROW(strata::run_bench(*backend, p));
}

TEST(Bench, CliJson) {
  const std::string model = tiny_model("q4_k_m");
  const std::string out = (temp_dir() / "bench.json").string();
  const std::string cmd = std::string(STRATA_CLI) + " bench -m " + model +
                          " -p 8 -n 4 -r 2 --threads 1 --triad-mib 8 --json > " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(out);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["threads"], 1);
  EXPECT_EQ(j["backend"], "cpu");
  EXPECT_EQ(j["model"]["arch"], "qwen35moe");
  EXPECT_NE(j["command_line"].get<std::string>().find("-p 8 -n 4 -r 2"), std::string::npos);
  EXPECT_FALSE(j["cpu_model"].get<std::string>().empty());
  EXPECT_FALSE(j["date"].get<std::string>().empty());
  EXPECT_EQ(j["results"]["decode"]["samples"].size(), 2u);
  EXPECT_EQ(j["results"]["prefill"]["samples"].size(), 2u);
  EXPECT_GT(j["results"]["decode"]["floor"].get<double>(), 0.0);
  EXPECT_GT(j["bandwidth"]["triad_gbs"].get<double>(), 0.0);
  EXPECT_TRUE(j["vram_by_tier"].is_null());
  EXPECT_EQ(j["vram_note"], "cpu backend: none");
  // The decode floor is bandwidth / bytes per token.
  EXPECT_NEAR(j["results"]["decode"]["floor"].get<double>(),
              j["bandwidth"]["triad_gbs"].get<double>() * 1e9 / j["active_bytes"]["decode_per_token"].get<double>(),
              1e-6 * j["results"]["decode"]["floor"].get<double>());
}

// A sequence timed as it is: the tiers callback reports its memory, greedy steps go through the
// sampler interface and match the host arg-max of the same logits.
TEST(Bench, SequenceBackendTimesAnySequence) {
  auto model = strata::Model::load(tiny_model("q4_k_m"));
  strata::SequenceBenchBackend b(std::make_unique<strata::Session>(*model, 16), "seq",
                                 [](const strata::Sequence& s) {
                                   return std::vector<std::pair<std::string, size_t>>{{"ctx", s.max_ctx()}};
                                 });
  EXPECT_EQ(b.name(), "seq");
  ASSERT_EQ(b.vram_by_tier().size(), 1u);
  EXPECT_EQ(b.vram_by_tier()[0].second, 16u);
  strata::Session ref(*model, 16);
  const std::vector<int32_t> prompt = strata::bench_prompt(4, b.n_vocab(), 7, 0);
  std::vector<float> logits(static_cast<size_t>(b.n_vocab()));
  b.forward(prompt.data(), 4, logits.data(), false);
  ref.forward(prompt.data(), 4, logits.data(), false);
  int32_t want = strata::argmax(logits.data(), b.n_vocab());
  int32_t got = want;
  for (int i = 0; i < 3; ++i) {
    got = b.decode_greedy(got, nullptr);
    ref.forward(&want, 1, logits.data(), false);
    want = strata::argmax(logits.data(), b.n_vocab());
    EXPECT_EQ(got, want) << "step " << i;
  }
  EXPECT_FALSE(b.greedy_on_device());
}

// bench takes run's backend flags, checked by the same rules.
TEST(Bench, CliTakesTheBackendFlags) {
  const std::string model = tiny_model("q4_k_m");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--expert-budget 50%", "--expert-budget needs --gpu"},
      {"--gpu-mem 8G", "--gpu-mem needs --gpu"},
      {"--numerics exact", "--numerics needs --gpu"},
      {"--profile p.json", "--profile needs --gpu"},
      {"--gpu --gpu-mem 8X", "--gpu-mem: invalid size"},
  };
  for (const auto& [flags, message] : cases) {
    const auto r = strata::testing_cli::run_cli("bench -m " + model + " -p 4 -n 2 -r 1 " + flags);
    EXPECT_NE(r.exit_code, 0) << flags;
    EXPECT_NE(r.err.find(message), std::string::npos) << flags << ": " << r.err;
  }
}
