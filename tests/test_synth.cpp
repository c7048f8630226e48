// strata synth: files with the naming contract's names/shapes/types and keys, loadable and runnable
// by the engine, reproducible for any thread count, with router skew that really skews routing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "strata/base/error.h"
#include "strata/convert/synth.h"
#include "strata/convert/synth_presets.h"
#include "strata/convert/synth_tensors.h"
#include "strata/engine/model.h"
#include "strata/engine/session.h"
#include "strata/gguf/gguf.h"
#include "strata/gguf/writer.h"
#include "strata/quant/quantize.h"
#include "strata/text/vocab.h"
#include "process_temp_dir.h"

namespace fs = std::filesystem;
using strata::GgmlType;

namespace {

fs::path temp_dir() { return process_temp_dir("strata_test_synth_"); }

std::string synth(const std::string& preset, const std::string& quant, const std::string& skew, uint64_t seed,
                  int threads, const std::string& name, int layers = 0, int mtp = 0) {
  strata::convert::SynthOptions o;
  o.layers = layers;
  o.mtp = mtp;
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

// Names, shapes and types as llama.cpp's GGUF files have them (q4_k_m mix:
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

// --mtp 1: one multi-token-prediction block after the trunk under llama.cpp's nextn names, bound by
// the model (ModelConfig::n_mtp, ModelWeights::mtp) while the trunk stays the same.
TEST(Synth, MtpLayerFollowsNextnNamingAndBinds) {
  const std::string path = synth("tiny-qwen35moe", "q8_0", "none", 7, 0, "t35mtp.gguf", 0, 1);
  const auto f = strata::GgufFile::open(path);
  EXPECT_EQ(f.get_u32("qwen35moe.block_count"), 5u);
  EXPECT_EQ(f.get_u32("qwen35moe.nextn_predict_layers"), 1u);
  const int64_t E = 256;
  expect_tensor(f, "blk.4.nextn.eh_proj.weight", {2 * E, E}, GgmlType::Q8_0);
  expect_tensor(f, "blk.4.nextn.enorm.weight", {E}, GgmlType::F32);
  expect_tensor(f, "blk.4.nextn.hnorm.weight", {E}, GgmlType::F32);
  expect_tensor(f, "blk.4.nextn.shared_head_norm.weight", {E}, GgmlType::F32);
  expect_tensor(f, "blk.4.attn_q.weight", {E, 2 * 4 * 64}, GgmlType::Q8_0);  // full attention, gated q
  expect_tensor(f, "blk.4.ffn_gate_exps.weight", {E, 256, 16}, GgmlType::Q8_0);
  expect_tensor(f, "blk.4.ffn_gate_inp_shexp.weight", {E}, GgmlType::F32);
  auto model = strata::Model::load(path);
  EXPECT_EQ(model->config().n_layer, 4);
  EXPECT_EQ(model->config().n_mtp, 1);
  ASSERT_EQ(model->weights().mtp.size(), 1u);
  EXPECT_EQ(model->weights().mtp[0].layer.kind, strata::LayerKind::FullAttention);
  EXPECT_EQ(model->weights().mtp[0].eh_proj.n_cols, 2 * E);
  // The trunk is the model without the block: same logits.
  auto plain = strata::Model::load(synth("tiny-qwen35moe", "q8_0", "none", 7, 0, "t35plain.gguf"));
  EXPECT_EQ(plain->config().n_mtp, 0);
  EXPECT_TRUE(plain->weights().mtp.empty());
  strata::Session a(*model, 16), b(*plain, 16);
  const std::vector<int32_t> prompt = {1, 2, 3};
  EXPECT_EQ(strata::generate_greedy(a, prompt, 4), strata::generate_greedy(b, prompt, 4));
  EXPECT_THROW(synth("tiny-qwen3moe", "q8_0", "none", 7, 0, "bad.gguf", 0, 1), strata::Error);
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
  for (const char* q : {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"}) {
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
// top_share(path, frac): the share of picks on the most-picked frac of experts, averaged over layers
// (not normalised).
static double top_share(const std::string& path, double frac, bool normalise) {
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
    const int top = std::max(1, static_cast<int>(std::lround(frac * X)));
    long top_sum = 0, all = 0;
    for (int e = 0; e < X; ++e) {
      all += picks[static_cast<size_t>(e)];
      if (e < top) top_sum += picks[static_cast<size_t>(e)];
    }
    share += static_cast<double>(top_sum) / static_cast<double>(all) / L * (normalise ? frac * X / top : 1.0);
  }
  return share;  // normalised: a uniform router gives ~frac
}

static double top20_share(const std::string& path) { return top_share(path, 0.2, true); }

TEST(Synth, ZipfSkewConcentratesRouting) {
  const double flat = top20_share(synth("tiny-qwen35moe", "f32", "uniform", 11, 0, "flat.gguf"));
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
  EXPECT_DOUBLE_EQ(strata::convert::parse_skew("zipf:1.5").value(), 1.5);
  EXPECT_DOUBLE_EQ(strata::convert::parse_skew("none").value(), 0.0);
  EXPECT_DOUBLE_EQ(strata::convert::parse_skew("uniform").value(), 0.0);
  EXPECT_FALSE(strata::convert::parse_skew("realistic").has_value());
}

// The default (realistic) skew: on random hidden states the hottest 40% of experts take about 70% of
// the picks, as a real model's do statically; uniform routers stay near 40%, zipf:1 far above.
TEST(Synth, RealisticSkewIsTheDefaultAndLandsOnTheTarget) {
  EXPECT_EQ(strata::convert::SynthOptions{}.skew, "realistic");
  const double realistic = top_share(synth("tiny-qwen35moe", "f32", "realistic", 11, 0, "real.gguf"), 0.4, false);
  const double flat = top_share(synth("tiny-qwen35moe", "f32", "uniform", 11, 0, "flat40.gguf"), 0.4, false);
  EXPECT_NEAR(realistic, 0.70, 0.06);
  EXPECT_LT(flat, 0.52);
  const double e128 = strata::convert::realistic_skew_exponent(128, 8);
  const double e256 = strata::convert::realistic_skew_exponent(256, 8);
  EXPECT_GT(e128, 0.1);
  EXPECT_LT(e128, 0.5);
  EXPECT_LT(e256, e128);  // more experts: a gentler exponent reaches the same share
  EXPECT_EQ(strata::convert::realistic_skew_exponent(128, 8), e128);  // deterministic
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

// --layers N: the first N layers of the preset. The layer pattern is checked on the real 35B config
// (no file written): Qwen3.6 puts full attention on every 4th layer (layers 3, 7, ...; model-spec.md).
TEST(Synth, LayersKeepsThePresetsFirstLayers) {
  using strata::convert::find_synth_preset;
  using strata::convert::synth_config;
  const auto& big = find_synth_preset("qwen3.6-35b-a3b");
  const auto c8 = synth_config(big, 8);
  EXPECT_EQ(c8.n_layer, 8);
  EXPECT_EQ(c8.n_embd, big.config.n_embd);
  EXPECT_EQ(c8.n_expert, big.config.n_expert);
  EXPECT_EQ(c8.n_vocab, big.config.n_vocab);
  EXPECT_EQ(c8.is_full_attention, (std::vector<bool>{false, false, false, true, false, false, false, true}));
  EXPECT_EQ(synth_config(big, 0).n_layer, 40);
  EXPECT_EQ(synth_config(big, 40).n_layer, 40);

  auto msg = [](auto&& f) {
    try {
      f();
    } catch (const strata::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  for (int bad : {-1, 41}) EXPECT_NE(msg([&] { synth_config(big, bad); }).find("--layers"), std::string::npos) << bad;
  EXPECT_NE(msg([] { synth("tiny-qwen35moe", "q8_0", "none", 1, 0, "l5.gguf", 5); }).find("out of range"),
            std::string::npos);

  // A written 3-layer cut of the 4-layer tiny preset: layers 0-2 are DeltaNet, layer 3 is gone.
  const std::string path = synth("tiny-qwen35moe", "q4_k_m", "zipf:1", 7, 0, "l3.gguf", 3);
  {
    const auto f = strata::GgufFile::open(path);
    EXPECT_EQ(f.get_u32("qwen35moe.block_count"), 3u);
    EXPECT_EQ(f.get_u32("strata.synth.layers"), 3u);
    EXPECT_EQ(f.get_u32("strata.synth.preset_layers"), 4u);
    EXPECT_EQ(f.get_u32("qwen35moe.embedding_length"), 256u);
    EXPECT_NE(f.find_tensor("blk.2.attn_qkv.weight"), nullptr);
    EXPECT_NE(f.find_tensor("blk.2.ffn_gate_exps.weight"), nullptr);
    EXPECT_EQ(f.find_tensor("blk.3.attn_q.weight"), nullptr);
    EXPECT_EQ(f.find_tensor("blk.3.attn_norm.weight"), nullptr);
  }
  run_a_few_tokens(path);
  // The same seed gives the same weights for the kept tensors as the full preset does.
  const auto full = strata::GgufFile::open(synth("tiny-qwen35moe", "f32", "zipf:1", 7, 0, "l4.gguf"));
  const auto cut = strata::GgufFile::open(synth("tiny-qwen35moe", "f32", "zipf:1", 7, 0, "l1.gguf", 1));
  const float* a = f32_data(full, "blk.0.attn_qkv.weight");
  const float* b = f32_data(cut, "blk.0.attn_qkv.weight");
  EXPECT_TRUE(std::equal(a, a + 256 * 512, b));
}

TEST(Synth, CliLayersOptionAndSummary) {
  const std::string out = (temp_dir() / "cli_layers.txt").string();
  const std::string gguf = (temp_dir() / "cli_l1.gguf").string();
  ASSERT_EQ(std::system((std::string(STRATA_CLI) + " synth --preset tiny-qwen3moe --quant q8_0 --layers 1 -o " + gguf +
                         " > " + out + " 2>&1").c_str()),
            0);
  EXPECT_NE(slurp(out).find("1 of 4 layers"), std::string::npos) << slurp(out);
  EXPECT_EQ(strata::GgufFile::open(gguf).get_u32("qwen3moe.block_count"), 1u);
  for (const char* bad : {"0", "5"}) {
    const int rc = std::system((std::string(STRATA_CLI) + " synth --preset tiny-qwen3moe --layers " + bad + " -o " +
                                (temp_dir() / "bad.gguf").string() + " > " + out + " 2>&1").c_str());
    EXPECT_NE(rc, 0) << bad;
    EXPECT_NE(slurp(out).find("--layers"), std::string::npos) << slurp(out);
  }
}

// Quantised tensors are generated as blocks straight from the RNG (synth_blocks.h). Whatever the
// encoding, the decoded weights must look like the float init they stand for: uniform(-a, a) with
// std a / sqrt(3) = 1 / sqrt(row length) for matrices and 1 for the token embedding (synth_tensors.h),
// mean ~0. Measured here by decoding every row with dequantize_row and taking float64 moments; the
// kurtosis of a uniform distribution is 1.8 (a Gaussian's is 3), which also rules out a few large
// outliers carrying the variance.
TEST(Synth, DecodedQuantisedWeightsHaveTheIntendedStatistics) {
  for (const char* q : {"q4_k", "q5_k", "q6_k", "q8_0", "q4_0", "q4_k_m"}) {
    for (const char* preset : {"tiny-qwen35moe", "tiny-qwen3moe"}) {
      SCOPED_TRACE(std::string(q) + " " + preset);
      const auto f = strata::GgufFile::open(synth(preset, q, "zipf:1", 5, 0, std::string("st_") + q + preset + ".gguf", 1));
      int checked = 0;
      for (const auto& t : f.tensors()) {
        if (t.type == GgmlType::F32 || t.type == GgmlType::F16 || t.type == GgmlType::BF16) continue;
        const double want = t.name == "token_embd.weight" ? 1.0 : 1.0 / std::sqrt(static_cast<double>(t.ne[0]));
        std::vector<float> row(static_cast<size_t>(t.ne[0]));
        double s1 = 0, s2 = 0, s3 = 0, s4 = 0, amax = 0;  // raw moments (in units of `want`)
        for (int64_t r = 0; r < t.n_rows(); ++r) {
          strata::dequantize_row(t.type, t.data + static_cast<size_t>(r) * t.row_nbytes(), row.data(), t.ne[0]);
          for (float v : row) {
            const double x = v / want, x2 = x * x;
            s1 += x;
            s2 += x2;
            s3 += x2 * x;
            s4 += x2 * x2;
            amax = std::max(amax, std::fabs(x));
          }
        }
        const double n = static_cast<double>(t.n_elements());
        const double m1 = s1 / n, m2 = s2 / n, m3 = s3 / n, m4 = s4 / n;
        const double var = m2 - m1 * m1;
        const double mean = m1 * want, std = std::sqrt(var) * want;
        const double kurtosis = (m4 - 4 * m1 * m3 + 6 * m1 * m1 * m2 - 3 * m1 * m1 * m1 * m1) / (var * var);
        EXPECT_LT(std::fabs(mean), 0.02 * want) << t.name;
        EXPECT_NEAR(std / want, 1.0, 0.05) << t.name << " std " << std << " want " << want;
        EXPECT_NEAR(kurtosis, 1.8, 0.1) << t.name;
        EXPECT_LE(amax, std::sqrt(3.0) * 1.05) << t.name;  // inside the uniform's range
        ++checked;
      }
      EXPECT_GE(checked, 8);
    }
  }
}

// synth writes with GgufWriter::set_overlap_fill (fill of the next tensor while the previous one is
// written): the file must be byte-identical to the plain path, with filled and in-memory tensors
// interleaved, and read back with every tensor's bytes in place.
TEST(Synth, OverlappedWriterWritesTheSameBytes) {
  auto build = [](bool overlap) {
    strata::GgufWriter w;
    w.set_overlap_fill(overlap);
    w.set("general.architecture", strata::GgufValue::str("test"));
    for (int i = 0; i < 7; ++i) {
      const int64_t n = 64 * (i + 1) + (i % 2 ? 3 : 0);  // odd sizes exercise the padding
      std::string name = "t";  // (built by append: g++ 12 warns falsely on "t" + to_string)
      name += std::to_string(i);
      if (i % 3 == 1) {
        std::vector<float> v(static_cast<size_t>(n));
        for (int64_t k = 0; k < n; ++k) v[static_cast<size_t>(k)] = static_cast<float>(i * 1000 + k);
        w.add_tensor(name, GgmlType::F32, {n}, v.data(), v.size() * 4);
      } else {
        w.add_tensor(name, GgmlType::F32, {n}, [i, n](uint8_t* dst, size_t nbytes) {
          ASSERT_EQ(nbytes, static_cast<size_t>(n) * 4);
          for (int64_t k = 0; k < n; ++k) {
            const float x = static_cast<float>(i * 1000 + k);
            std::memcpy(dst + 4 * k, &x, 4);
          }
        });
      }
    }
    const std::string path = (temp_dir() / (overlap ? "ov1.gguf" : "ov0.gguf")).string();
    w.write(path);
    return path;
  };
  const std::string plain = build(false), overlapped = build(true);
  EXPECT_TRUE(slurp(plain) == slurp(overlapped));
  const auto f = strata::GgufFile::open(overlapped);
  for (int i = 0; i < 7; ++i) {
    std::string name = "t";
    name += std::to_string(i);
    const auto& t = f.tensor(name);
    const float* x = reinterpret_cast<const float*>(t.data);
    for (int64_t k = 0; k < t.ne[0]; ++k) ASSERT_EQ(x[k], static_cast<float>(i * 1000 + k)) << i << " " << k;
  }
}
