// strata synth: files with the naming contract's names/shapes/types and keys, loadable and runnable
// by the engine, reproducible for any thread count, with router skew that really skews routing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "strata/base/error.h"
#include "strata/convert/synth.h"
#include "strata/engine/model.h"
#include "strata/engine/session.h"
#include "strata/gguf/gguf.h"
#include "strata/text/vocab.h"

namespace fs = std::filesystem;
using strata::GgmlType;

namespace {

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() / ("strata_test_synth_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

std::string synth(const std::string& preset, const std::string& quant, const std::string& skew, uint64_t seed,
                  int threads, const std::string& name) {
  strata::convert::SynthOptions o;
  o.preset = preset;
  o.quant = quant;
  o.skew = skew;
  o.seed = seed;
  o.threads = threads;
  o.out_path = (temp_dir() / name).string();
  strata::convert::synth_model(o);
  return o.out_path;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<int64_t> shape(const strata::GgufTensorInfo& t) {
  std::vector<int64_t> s;
  for (uint32_t d = 0; d < t.n_dims; ++d) s.push_back(t.ne[d]);
  return s;
}

void expect_tensor(const strata::GgufFile& f, const std::string& name, std::vector<int64_t> ne, GgmlType type) {
  const auto* t = f.find_tensor(name);
  ASSERT_NE(t, nullptr) << name;
  EXPECT_EQ(shape(*t), ne) << name;
  EXPECT_EQ(t->type, type) << name;
}

const float* f32_data(const strata::GgufFile& f, const std::string& name) {
  const auto& t = f.tensor(name);
  EXPECT_EQ(t.type, GgmlType::F32) << name;
  return reinterpret_cast<const float*>(t.data);
}

void run_a_few_tokens(const std::string& path) {
  auto model = strata::Model::load(path);
  strata::Session s(*model, 64);
  const int64_t V = model->config().n_vocab;
  std::vector<int32_t> prompt = {1, 17, 300, 42, 7};
  std::vector<float> logits(static_cast<size_t>(V * prompt.size()));
  s.forward(prompt.data(), static_cast<int>(prompt.size()), logits.data(), true);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  // Logits are not all equal (the model is not degenerate).
  const auto [lo, hi] = std::minmax_element(logits.begin(), logits.end());
  EXPECT_GT(*hi - *lo, 1e-3f);
  for (int i = 0; i < 4; ++i) {
    const int32_t next = strata::argmax(logits.data(), V);
    s.forward(&next, 1, logits.data(), false);
    for (int64_t j = 0; j < V; ++j) ASSERT_TRUE(std::isfinite(logits[static_cast<size_t>(j)]));
  }
}

}  // namespace

// Names, shapes and types written from /work/notes/gguf-naming.md sections 1, 3 and 6 (q4_k_m mix:
// n_layer 4 -> "more bits" layers are i >= 7*4/8 = 3 and (i - 0) % 3 == 2 -> layers 2 and 3).
TEST(Synth, Qwen35MoeTinyFollowsNamingContract) {
  const std::string path = synth("tiny-qwen35moe", "q4_k_m", "zipf:1", 7, 0, "t35.gguf");
  const auto f = strata::GgufFile::open(path);
  EXPECT_EQ(f.get_string("general.architecture"), "qwen35moe");
  EXPECT_EQ(f.get_u32("general.file_type"), 15u);
  EXPECT_EQ(f.get_u32("qwen35moe.block_count"), 4u);
  EXPECT_EQ(f.get_u32("qwen35moe.embedding_length"), 256u);
  EXPECT_EQ(f.get_u32("qwen35moe.expert_count"), 16u);
  EXPECT_EQ(f.get_u32("qwen35moe.expert_used_count"), 4u);
  EXPECT_EQ(f.get_u32("qwen35moe.expert_shared_feed_forward_length"), 256u);
  EXPECT_EQ(f.get_u32("qwen35moe.rope.dimension_count"), 16u);  // 64 * 0.25
  EXPECT_EQ(f.get_int_array("qwen35moe.rope.dimension_sections").size(), 4u);
  EXPECT_EQ(f.get_u32("qwen35moe.ssm.inner_size"), 256u);  // 4 v heads x 64
  EXPECT_EQ(f.get_u32("qwen35moe.full_attention_interval"), 4u);
  EXPECT_FALSE(f.has("qwen35moe.feed_forward_length"));

  const int64_t E = 256, V = 512;
  expect_tensor(f, "token_embd.weight", {E, V}, GgmlType::Q4_K);
  expect_tensor(f, "output.weight", {E, V}, GgmlType::Q6_K);
  expect_tensor(f, "output_norm.weight", {E}, GgmlType::F32);
  // Layer 0: DeltaNet. conv_dim = 2 * (2 * 64) + 4 * 64 = 512.
  expect_tensor(f, "blk.0.attn_qkv.weight", {E, 512}, GgmlType::Q4_K);
  expect_tensor(f, "blk.0.attn_gate.weight", {E, 256}, GgmlType::Q4_K);
  expect_tensor(f, "blk.0.ssm_beta.weight", {E, 4}, GgmlType::F32);
  expect_tensor(f, "blk.0.ssm_alpha.weight", {E, 4}, GgmlType::F32);
  expect_tensor(f, "blk.0.ssm_conv1d.weight", {4, 512}, GgmlType::F32);
  expect_tensor(f, "blk.0.ssm_dt.bias", {4}, GgmlType::F32);
  expect_tensor(f, "blk.0.ssm_a", {4}, GgmlType::F32);
  expect_tensor(f, "blk.0.ssm_norm.weight", {64}, GgmlType::F32);
  expect_tensor(f, "blk.0.ssm_out.weight", {256, E}, GgmlType::Q4_K);
  expect_tensor(f, "blk.0.post_attention_norm.weight", {E}, GgmlType::F32);
  expect_tensor(f, "blk.0.ffn_gate_inp.weight", {E, 16}, GgmlType::F32);
  expect_tensor(f, "blk.0.ffn_gate_exps.weight", {E, 256, 16}, GgmlType::Q4_K);
  expect_tensor(f, "blk.0.ffn_down_exps.weight", {256, E, 16}, GgmlType::Q4_K);
  expect_tensor(f, "blk.2.ffn_down_exps.weight", {256, E, 16}, GgmlType::Q6_K);
  expect_tensor(f, "blk.2.attn_qkv.weight", {E, 512}, GgmlType::Q6_K);
  expect_tensor(f, "blk.0.ffn_gate_inp_shexp.weight", {E}, GgmlType::F32);
  expect_tensor(f, "blk.0.ffn_down_shexp.weight", {256, E}, GgmlType::Q4_K);
  // Layer 3: full attention ((3 + 1) % 4 == 0); attn_q carries query + gate per head.
  expect_tensor(f, "blk.3.attn_q.weight", {E, 2 * 4 * 64}, GgmlType::Q4_K);
  expect_tensor(f, "blk.3.attn_k.weight", {E, 2 * 64}, GgmlType::Q4_K);
  expect_tensor(f, "blk.3.attn_v.weight", {E, 2 * 64}, GgmlType::Q6_K);
  expect_tensor(f, "blk.3.attn_output.weight", {4 * 64, E}, GgmlType::Q4_K);
  expect_tensor(f, "blk.3.attn_q_norm.weight", {64}, GgmlType::F32);
  EXPECT_EQ(f.find_tensor("blk.3.attn_qkv.weight"), nullptr);
  EXPECT_EQ(f.find_tensor("blk.0.attn_q.weight"), nullptr);
  EXPECT_EQ(f.find_tensor("blk.0.ffn_norm.weight"), nullptr);

  // Values: stored norms are multipliers near 1, A = -exp(A_log) < 0, dt bias is softplus^-1 of a
  // small step (negative), router rows of different experts have different scales under skew.
  const float* norm = f32_data(f, "blk.0.attn_norm.weight");
  for (int i = 0; i < E; ++i) EXPECT_NEAR(norm[i], 1.0f, 0.11f);
  const float* a = f32_data(f, "blk.0.ssm_a");
  const float* dt = f32_data(f, "blk.0.ssm_dt.bias");
  for (int i = 0; i < 4; ++i) {
    EXPECT_LT(a[i], 0.0f);
    EXPECT_LT(dt[i], 0.0f);
    EXPECT_TRUE(std::isfinite(dt[i]));
  }

  // Tokenizer: a valid gpt2 vocabulary of exactly n_vocab tokens with ChatML specials.
  const strata::Vocab v = strata::vocab_from_gguf(f);
  EXPECT_EQ(static_cast<int64_t>(v.tokens.size()), V);
  EXPECT_EQ(v.pre, "qwen35");
  ASSERT_GE(v.eos_id, 0);
  EXPECT_EQ(v.tokens[static_cast<size_t>(v.eos_id)], "<|im_end|>");

  run_a_few_tokens(path);
}

TEST(Synth, Qwen3MoeTinyFollowsNamingContract) {
  const std::string path = synth("tiny-qwen3moe", "q8_0", "none", 7, 0, "t3.gguf");
  const auto f = strata::GgufFile::open(path);
  EXPECT_EQ(f.get_string("general.architecture"), "qwen3moe");
  EXPECT_EQ(f.get_u32("general.file_type"), 7u);
  EXPECT_EQ(f.get_u32("qwen3moe.feed_forward_length"), 768u);
  EXPECT_EQ(f.get_u32("qwen3moe.attention.key_length"), 64u);
  EXPECT_FALSE(f.has("qwen3moe.rope.dimension_count"));
  const int64_t E = 256;
  expect_tensor(f, "blk.1.attn_q.weight", {E, 4 * 64}, GgmlType::Q8_0);
  expect_tensor(f, "blk.1.attn_k.weight", {E, 2 * 64}, GgmlType::Q8_0);
  expect_tensor(f, "blk.1.attn_output.weight", {4 * 64, E}, GgmlType::Q8_0);
  expect_tensor(f, "blk.1.ffn_norm.weight", {E}, GgmlType::F32);
  expect_tensor(f, "blk.1.ffn_gate_inp.weight", {E, 16}, GgmlType::F32);
  expect_tensor(f, "blk.1.ffn_up_exps.weight", {E, 256, 16}, GgmlType::Q8_0);
  expect_tensor(f, "blk.1.ffn_down_exps.weight", {256, E, 16}, GgmlType::Q8_0);
  EXPECT_EQ(f.find_tensor("blk.1.ffn_gate_shexp.weight"), nullptr);
  EXPECT_EQ(f.find_tensor("blk.1.post_attention_norm.weight"), nullptr);
  EXPECT_EQ(strata::vocab_from_gguf(f).pre, "qwen2");
  run_a_few_tokens(path);
}

TEST(Synth, EveryQuantTypeLoadsAndRuns) {
  for (const char* q : {"f32", "f16", "bf16", "q4_k", "q5_k", "q6_k"}) {
    SCOPED_TRACE(q);
    run_a_few_tokens(synth("tiny-qwen35moe", q, "none", 3, 0, std::string("q_") + q + ".gguf"));
  }
}

TEST(Synth, SameSeedSameBytesForAnyThreadCount) {
  const std::string a = slurp(synth("tiny-qwen35moe", "q4_k_m", "zipf:1.2", 99, 1, "d1.gguf"));
  const std::string b = slurp(synth("tiny-qwen35moe", "q4_k_m", "zipf:1.2", 99, 2, "d2.gguf"));
  const std::string c = slurp(synth("tiny-qwen35moe", "q4_k_m", "zipf:1.2", 100, 2, "d3.gguf"));
  ASSERT_GT(a.size(), 100000u);
  EXPECT_TRUE(a == b) << "thread count changed the output";
  EXPECT_EQ(a.size(), c.size());
  EXPECT_FALSE(a == c) << "a different seed gave the same weights";
}

// Routing under skew, computed here from the file's router weights on random hidden states: softmax
// top-k as the engine does (the top-k of the logits). With zipf:1 the most-picked 20% of experts must
// take clearly more than 20% of picks (measured ~0.34 with 16 experts, 4 used), zipf:2 more still;
// without skew they must not dominate.
static double top20_share(const std::string& path) {
  const auto f = strata::GgufFile::open(path);
  const int E = static_cast<int>(f.get_u32("qwen35moe.embedding_length"));
  const int X = static_cast<int>(f.get_u32("qwen35moe.expert_count"));
  const int K = static_cast<int>(f.get_u32("qwen35moe.expert_used_count"));
  const int L = static_cast<int>(f.get_u32("qwen35moe.block_count"));
  std::mt19937 rng(5);
  std::normal_distribution<double> normal;
  double share = 0;
  for (int l = 0; l < L; ++l) {
    const float* w = f32_data(f, "blk." + std::to_string(l) + ".ffn_gate_inp.weight");
    std::vector<long> picks(static_cast<size_t>(X), 0);
    for (int s = 0; s < 2000; ++s) {
      std::vector<double> h(static_cast<size_t>(E));
      for (auto& x : h) x = normal(rng);
      std::vector<std::pair<double, int>> logit;
      for (int e = 0; e < X; ++e) {
        double z = 0;
        for (int i = 0; i < E; ++i) z += static_cast<double>(w[static_cast<size_t>(e) * E + i]) * h[static_cast<size_t>(i)];
        logit.emplace_back(z, e);
      }
      std::partial_sort(logit.begin(), logit.begin() + K, logit.end(), std::greater<>());
      for (int k = 0; k < K; ++k) picks[static_cast<size_t>(logit[static_cast<size_t>(k)].second)]++;
    }
    std::sort(picks.begin(), picks.end(), std::greater<>());
    const int top = std::max(1, X / 5);
    long top_sum = 0, all = 0;
    for (int e = 0; e < X; ++e) {
      all += picks[static_cast<size_t>(e)];
      if (e < top) top_sum += picks[static_cast<size_t>(e)];
    }
    share += static_cast<double>(top_sum) / static_cast<double>(all) / L * (static_cast<double>(X) / 5 / top);
  }
  return share;  // normalised so a uniform router gives ~0.2
}

TEST(Synth, ZipfSkewConcentratesRouting) {
  const double flat = top20_share(synth("tiny-qwen35moe", "f32", "none", 11, 0, "flat.gguf"));
  const double skewed = top20_share(synth("tiny-qwen35moe", "f32", "zipf:1", 11, 0, "skew.gguf"));
  const double steeper = top20_share(synth("tiny-qwen35moe", "f32", "zipf:2", 11, 0, "skew2.gguf"));
  EXPECT_LT(flat, 0.26);
  EXPECT_GT(skewed, 0.30);
  EXPECT_GT(skewed, flat + 0.08);
  EXPECT_GT(steeper, skewed + 0.02);  // a larger exponent concentrates routing further
}

TEST(Synth, BadOptionsFailClearly) {
  auto msg = [](auto&& f) {
    try {
      f();
    } catch (const strata::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg([] { synth("gpt-5", "q4_k_m", "none", 1, 0, "x.gguf"); }).find("unknown preset 'gpt-5'"), std::string::npos);
  EXPECT_NE(msg([] { synth("tiny-qwen3moe", "q3_xl", "none", 1, 0, "x.gguf"); }).find("'q3_xl'"), std::string::npos);
  for (const char* bad : {"zipf", "zipf:", "zipf:abc", "zipf:-1", "zipf:nan", "pareto:1"}) {
    EXPECT_NE(msg([&] { synth("tiny-qwen3moe", "q8_0", bad, 1, 0, "x.gguf"); }).find("--skew"), std::string::npos) << bad;
  }
  EXPECT_FALSE(fs::exists(temp_dir() / "x.gguf"));
  EXPECT_DOUBLE_EQ(strata::convert::parse_skew("zipf:1.5"), 1.5);
  EXPECT_DOUBLE_EQ(strata::convert::parse_skew("none"), 0.0);
}

TEST(Synth, CliListsPresetsAndRejectsBadPreset) {
  const std::string out = (temp_dir() / "cli_list.txt").string();
  ASSERT_EQ(std::system((std::string(STRATA_CLI) + " synth --list > " + out).c_str()), 0);
  const std::string list = slurp(out);
  for (const char* p : {"qwen3.6-35b-a3b", "qwen3-30b-a3b", "qwen3-235b-a22b", "tiny-qwen3moe", "tiny-qwen35moe"})
    EXPECT_NE(list.find(p), std::string::npos) << p;
  const std::string err = (temp_dir() / "cli_err.txt").string();
  const int rc = std::system((std::string(STRATA_CLI) + " synth --preset nope -o " + (temp_dir() / "n.gguf").string() +
                              " > " + err + " 2>&1").c_str());
  EXPECT_NE(rc, 0);
  EXPECT_NE(slurp(err).find("unknown preset 'nope'"), std::string::npos);
}
