// Engine tests on tiny random-weight models written with GgufWriter (both architectures):
// prefill (one batch) vs token-by-token decode vs chunked prefill agree; loading errors are clear.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "strata/base/error.h"
#include "strata/convert/synth.h"
#include "strata/engine/model.h"
#include "strata/engine/session.h"
#include "strata/gguf/writer.h"
#include "strata/model/kv_type.h"
#include "strata/quant/quantize.h"
#include "pending_property.h"

namespace {

struct TinySpec {
  std::string arch = "qwen3moe";
  int n_layer = 2, n_embd = 64, n_head = 4, n_head_kv = 2, head_dim = 16, rope_dims = 16;
  int n_expert = 8, n_used = 3, n_ff = 32, n_ff_shexp = 0, vocab = 96;
  int ssm_k_heads = 2, ssm_v_heads = 4, ssm_dk = 16, ssm_dv = 8, conv_k = 4, interval = 2;
  bool tied = false;
  strata::GgmlType matrix_type = strata::GgmlType::F32;
  bool skip_tensor_q_norm = false;  // to test the missing-tensor error
};

class TinyModelWriter {
 public:
  TinyModelWriter(const TinySpec& s, uint32_t seed) : s_(s), rng_(seed) {}

  std::string write(const std::string& name) {
    namespace fs = std::filesystem;
    const fs::path dir = fs::path(STRATA_BINARY_DIR) / "test_tmp";
    fs::create_directories(dir);
    const std::string path = (dir / name).string();
    strata::GgufWriter w;
    const std::string a = s_.arch + ".";
    w.set("general.architecture", strata::GgufValue::str(s_.arch));
    w.set(a + "block_count", strata::GgufValue::u32(s_.n_layer));
    w.set(a + "context_length", strata::GgufValue::u32(256));
    w.set(a + "embedding_length", strata::GgufValue::u32(s_.n_embd));
    w.set(a + "attention.head_count", strata::GgufValue::u32(s_.n_head));
    w.set(a + "attention.head_count_kv", strata::GgufValue::u32(s_.n_head_kv));
    w.set(a + "attention.key_length", strata::GgufValue::u32(s_.head_dim));
    w.set(a + "attention.value_length", strata::GgufValue::u32(s_.head_dim));
    w.set(a + "attention.layer_norm_rms_epsilon", strata::GgufValue::f32(1e-6f));
    w.set(a + "rope.freq_base", strata::GgufValue::f32(10000.0f));
    w.set(a + "expert_count", strata::GgufValue::u32(s_.n_expert));
    w.set(a + "expert_used_count", strata::GgufValue::u32(s_.n_used));
    w.set(a + "expert_feed_forward_length", strata::GgufValue::u32(s_.n_ff));
    const bool q35 = s_.arch == "qwen35moe";
    if (q35) {
      w.set(a + "rope.dimension_count", strata::GgufValue::u32(s_.rope_dims));
      w.set(a + "expert_shared_feed_forward_length", strata::GgufValue::u32(s_.n_ff_shexp));
      w.set(a + "ssm.conv_kernel", strata::GgufValue::u32(s_.conv_k));
      w.set(a + "ssm.state_size", strata::GgufValue::u32(s_.ssm_dk));
      w.set(a + "ssm.group_count", strata::GgufValue::u32(s_.ssm_k_heads));
      w.set(a + "ssm.time_step_rank", strata::GgufValue::u32(s_.ssm_v_heads));
      w.set(a + "ssm.inner_size", strata::GgufValue::u32(s_.ssm_v_heads * s_.ssm_dv));
      w.set(a + "full_attention_interval", strata::GgufValue::u32(s_.interval));
    }
    const int E = s_.n_embd;
    matrix(w, "token_embd.weight", E, s_.vocab, 1.0f);
    if (!s_.tied) matrix(w, "output.weight", E, s_.vocab, 0.3f);
    norm(w, "output_norm.weight", E);
    for (int il = 0; il < s_.n_layer; ++il) {
      const std::string p = "blk." + std::to_string(il) + ".";
      norm(w, p + "attn_norm.weight", E);
      norm(w, p + (q35 ? "post_attention_norm.weight" : "ffn_norm.weight"), E);
      const bool full = !q35 || (il + 1) % s_.interval == 0;
      if (full) {
        const int hd = s_.head_dim;
        matrix(w, p + "attn_q.weight", E, s_.n_head * hd * (q35 ? 2 : 1), 0.3f);
        matrix(w, p + "attn_k.weight", E, s_.n_head_kv * hd, 0.3f);
        matrix(w, p + "attn_v.weight", E, s_.n_head_kv * hd, 0.3f);
        matrix(w, p + "attn_output.weight", s_.n_head * hd, E, 0.3f);
        if (!s_.skip_tensor_q_norm) norm(w, p + "attn_q_norm.weight", hd);
        norm(w, p + "attn_k_norm.weight", hd);
      } else {
        const int key_dim = s_.ssm_k_heads * s_.ssm_dk, v_dim = s_.ssm_v_heads * s_.ssm_dv;
        const int channels = 2 * key_dim + v_dim;
        matrix(w, p + "attn_qkv.weight", E, channels, 0.3f);
        matrix(w, p + "attn_gate.weight", E, v_dim, 0.3f);
        matrix(w, p + "ssm_beta.weight", E, s_.ssm_v_heads, 0.3f, strata::GgmlType::F32);
        matrix(w, p + "ssm_alpha.weight", E, s_.ssm_v_heads, 0.3f, strata::GgmlType::F32);
        matrix(w, p + "ssm_out.weight", v_dim, E, 0.3f);
        f32(w, p + "ssm_conv1d.weight", {s_.conv_k, channels}, uniform(static_cast<size_t>(s_.conv_k) * channels, -0.5f, 0.5f));
        std::vector<float> A = uniform(s_.ssm_v_heads, 0.0f, 1.5f);
        for (float& x : A) x = -std::exp(x);
        f32(w, p + "ssm_a", {s_.ssm_v_heads}, A);
        f32(w, p + "ssm_dt.bias", {s_.ssm_v_heads}, uniform(s_.ssm_v_heads, -1.0f, 1.0f));
        norm(w, p + "ssm_norm.weight", s_.ssm_dv);
      }
      matrix(w, p + "ffn_gate_inp.weight", E, s_.n_expert, 1.0f, strata::GgmlType::F32);
      experts(w, p + "ffn_gate_exps.weight", E, s_.n_ff);
      experts(w, p + "ffn_up_exps.weight", E, s_.n_ff);
      experts(w, p + "ffn_down_exps.weight", s_.n_ff, E);
      if (q35) {
        f32(w, p + "ffn_gate_inp_shexp.weight", {E}, uniform(E, -0.3f, 0.3f));
        matrix(w, p + "ffn_gate_shexp.weight", E, s_.n_ff_shexp, 0.3f);
        matrix(w, p + "ffn_up_shexp.weight", E, s_.n_ff_shexp, 0.3f);
        matrix(w, p + "ffn_down_shexp.weight", s_.n_ff_shexp, E, 0.3f);
      }
    }
    w.write(path);
    return path;
  }

 private:
  std::vector<float> uniform(size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng_);
    return v;
  }
  void f32(strata::GgufWriter& w, const std::string& name, std::vector<int64_t> ne, const std::vector<float>& v) {
    w.add_tensor(name, strata::GgmlType::F32, ne, v.data(), v.size() * sizeof(float));
  }
  void norm(strata::GgufWriter& w, const std::string& name, int n) { f32(w, name, {n}, uniform(n, 0.7f, 1.3f)); }
  void store(strata::GgufWriter& w, const std::string& name, std::vector<int64_t> ne, const std::vector<float>& v,
             strata::GgmlType type) {
    if (type == strata::GgmlType::F32) return f32(w, name, ne, v);
    const size_t rb = strata::row_bytes(type, ne[0]);
    const size_t rows = v.size() / static_cast<size_t>(ne[0]);
    std::vector<uint8_t> bytes(rb * rows);
    for (size_t r = 0; r < rows; ++r) strata::quantize_row(type, v.data() + r * ne[0], bytes.data() + r * rb, ne[0]);
    w.add_tensor(name, type, ne, bytes.data(), bytes.size());
  }
  // Scaled so activations stay O(1): entries uniform in +-scale*sqrt(3/cols).
  void matrix(strata::GgufWriter& w, const std::string& name, int cols, int rows, float scale) {
    matrix(w, name, cols, rows, scale, s_.matrix_type);
  }
  void matrix(strata::GgufWriter& w, const std::string& name, int cols, int rows, float scale, strata::GgmlType type) {
    const float a = scale * std::sqrt(3.0f / cols);
    store(w, name, {cols, rows}, uniform(static_cast<size_t>(cols) * rows, -a, a), type);
  }
  void experts(strata::GgufWriter& w, const std::string& name, int cols, int rows) {
    const float a = 0.5f * std::sqrt(3.0f / cols);
    store(w, name, {cols, rows, s_.n_expert}, uniform(static_cast<size_t>(cols) * rows * s_.n_expert, -a, a),
          s_.matrix_type);
  }

  TinySpec s_;
  std::mt19937 rng_;
};

TinySpec qwen35_spec() {
  TinySpec s;
  s.arch = "qwen35moe";
  s.n_layer = 4;  // layers 1 and 3 full attention (interval 2), 0 and 2 DeltaNet
  s.rope_dims = 4;  // partial rotary
  s.n_ff_shexp = 32;
  return s;
}

// Relative error of a row: max|a-b| / max|b|.
double row_rel_err(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num = std::max(num, double(std::fabs(a[i] - b[i])));
    den = std::max(den, double(std::fabs(b[i])));
  }
  return num / den;
}

const std::vector<int32_t> kPrompt = {5, 17, 3, 90, 42, 42, 7, 61, 0, 95, 33};

void expect_prefill_matches_decode(const std::string& path, double tol) {
  auto model = strata::Model::load(path);
  const int64_t V = model->config().n_vocab;
  const int n = static_cast<int>(kPrompt.size());

  strata::Session prefill(*model, 32);
  std::vector<float> all(static_cast<size_t>(n * V));
  prefill.forward(kPrompt.data(), n, all.data(), true);
  EXPECT_EQ(prefill.n_past(), n);

  strata::Session decode(*model, 32);
  std::vector<float> one(static_cast<size_t>(V));
  for (int t = 0; t < n; ++t) {
    decode.forward(&kPrompt[t], 1, one.data(), false);
    EXPECT_LT(row_rel_err(one.data(), all.data() + t * V, V), tol) << "position " << t;
  }

  // Chunked prefill (4 + 1 + 6 tokens) lands on the same last-token logits.
  strata::Session chunked(*model, 32);
  chunked.forward(kPrompt.data(), 4, one.data(), false);
  chunked.forward(kPrompt.data() + 4, 1, one.data(), false);
  chunked.forward(kPrompt.data() + 5, n - 5, one.data(), false);
  EXPECT_LT(row_rel_err(one.data(), all.data() + (n - 1) * V, V), tol);

  // After reset, the same prompt gives the same logits again (state fully cleared).
  prefill.reset();
  std::vector<float> again(static_cast<size_t>(n * V));
  prefill.forward(kPrompt.data(), n, again.data(), true);
  EXPECT_EQ(again, all);

  // The logits are not degenerate: they differ between positions.
  EXPECT_GT(row_rel_err(all.data(), all.data() + V, V), 1e-3);
}

TEST(Engine, Qwen3MoePrefillMatchesDecode) {
  expect_prefill_matches_decode(TinyModelWriter(TinySpec{}, 11).write("tiny_qwen3moe.gguf"), 1e-5);
}

TEST(Engine, Qwen35MoePrefillMatchesDecode) {
  expect_prefill_matches_decode(TinyModelWriter(qwen35_spec(), 12).write("tiny_qwen35moe.gguf"), 1e-5);
}

TEST(Engine, Qwen35MoeQ8_0PrefillMatchesDecode) {
  TinySpec s = qwen35_spec();
  s.matrix_type = strata::GgmlType::Q8_0;
  s.tied = true;
  expect_prefill_matches_decode(TinyModelWriter(s, 13).write("tiny_qwen35moe_q8.gguf"), 1e-4);
}

TEST(Engine, ConfigDescribesLayers) {
  auto model = strata::Model::load(TinyModelWriter(qwen35_spec(), 14).write("tiny_qwen35moe_cfg.gguf"));
  const auto& c = model->config();
  EXPECT_EQ(c.n_vocab, 96);
  ASSERT_EQ(c.layers.size(), 4u);
  EXPECT_EQ(c.mixer(0), strata::LayerKind::DeltaNet);
  EXPECT_EQ(c.mixer(1), strata::LayerKind::FullAttention);
  EXPECT_EQ(c.mixer(3), strata::LayerKind::FullAttention);
  EXPECT_EQ(c.rope_dims, 4);
  EXPECT_EQ(c.ssm_head_v, 8);
  EXPECT_TRUE(c.attn_output_gate);
}

TEST(Engine, TiedOutputUsesTokenEmbedding) {
  TinySpec s;
  s.tied = true;
  auto model = strata::Model::load(TinyModelWriter(s, 15).write("tiny_tied.gguf"));
  EXPECT_TRUE(model->weights().tied_output);
  EXPECT_EQ(model->weights().output.data, model->weights().token_embd.data);
}

std::string load_error(const std::string& path) {
  try {
    strata::Model::load(path);
  } catch (const strata::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Engine, UnsupportedArchitectureFailsWithList) {
  TinySpec s;
  s.arch = "llama";
  const std::string msg = load_error(TinyModelWriter(s, 16).write("tiny_llama.gguf"));
  EXPECT_NE(msg.find("unsupported architecture 'llama' (supported: qwen3moe, qwen35moe, laguna)"), std::string::npos) << msg;
}

TEST(Engine, MissingTensorIsNamed) {
  TinySpec s;
  s.skip_tensor_q_norm = true;
  const std::string msg = load_error(TinyModelWriter(s, 17).write("tiny_missing.gguf"));
  EXPECT_NE(msg.find("missing tensor 'blk.0.attn_q_norm.weight'"), std::string::npos) << msg;
}

TEST(Engine, ContextOverflowAndBadTokenFail) {
  auto model = strata::Model::load(TinyModelWriter(TinySpec{}, 18).write("tiny_ctx.gguf"));
  strata::Session session(*model, 4);
  std::vector<float> logits(static_cast<size_t>(model->config().n_vocab));
  const std::vector<int32_t> five = {1, 2, 3, 4, 5};
  try {
    session.forward(five.data(), 5, logits.data(), false);
    FAIL() << "no error";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find("prompt of 5 tokens exceeds the context of 4"), std::string::npos) << e.what();
  }
  EXPECT_EQ(session.n_past(), 0);
  const int32_t bad = 96;
  EXPECT_THROW(session.forward(&bad, 1, logits.data(), false), strata::Error);
}

TEST(Engine, GreedyMatchesArgmaxOfFullRecompute) {
  // Each generated token must be the arg-max of a fresh prefill over prompt + tokens so far.
  auto model = strata::Model::load(TinyModelWriter(qwen35_spec(), 19).write("tiny_greedy.gguf"));
  const int64_t V = model->config().n_vocab;
  strata::Session s(*model, 32);
  const std::vector<int32_t> prompt = {4, 8, 15, 16};
  const std::vector<int32_t> gen = strata::generate_greedy(s, prompt, 6);
  ASSERT_EQ(gen.size(), 6u);
  std::vector<int32_t> seq = prompt;
  for (int32_t id : gen) {
    strata::Session fresh(*model, 32);
    std::vector<float> logits(static_cast<size_t>(V));
    fresh.forward(seq.data(), static_cast<int>(seq.size()), logits.data(), false);
    EXPECT_EQ(strata::argmax(logits.data(), V), id);
    seq.push_back(id);
  }
}

// Run n drafted tokens pending, keep a root path of m, continue == run the m tokens, continue: logits
// and state bit for bit, for chains and random trees, on both architectures and a quantised file.
// sliding_forward: the sliding layers' ring size (SequenceState); small, the rings wrap within a trial.
void expect_pending_property(const std::string& path, uint32_t seed, strata::KvCacheTypes kv = {},
                             int sliding_forward = strata::kSlidingForwardTokens) {
  auto model = strata::Model::load(path);
  const strata::Model& m = *model;
  auto make = [&m, kv, sliding_forward]() -> std::unique_ptr<strata::Sequence> {
    return std::make_unique<strata::Session>(m, 48, kv, sliding_forward);
  };
  auto same_state = [&m](strata::Sequence& a, strata::Sequence& b, const std::string& what) {
    auto& sa = dynamic_cast<strata::Session&>(a).state();
    auto& sb = dynamic_cast<strata::Session&>(b).state();
    ASSERT_EQ(sa.n_past, sb.n_past) << what;
    for (size_t il = 0; il < sa.layers.size(); ++il) {
      const auto& la = sa.layers[il];
      const auto& lb = sb.layers[il];
      // The rows later tokens can read: every position of a full layer, a sliding layer's window.
      const int window = m.config().layer(static_cast<int>(il)).window;
      for (int64_t p = window > 0 ? std::max<int64_t>(0, sa.n_past - window) : 0; !la.k.empty() && p < sa.n_past; ++p) {
        const auto row = static_cast<std::ptrdiff_t>(p % la.rows);
        EXPECT_TRUE(std::equal(la.k.begin() + row * static_cast<std::ptrdiff_t>(la.k_row),
                               la.k.begin() + (row + 1) * static_cast<std::ptrdiff_t>(la.k_row),
                               lb.k.begin() + row * static_cast<std::ptrdiff_t>(lb.k_row)))
            << what << " layer " << il << " position " << p;
        EXPECT_TRUE(std::equal(la.v.begin() + row * static_cast<std::ptrdiff_t>(la.v_row),
                               la.v.begin() + (row + 1) * static_cast<std::ptrdiff_t>(la.v_row),
                               lb.v.begin() + row * static_cast<std::ptrdiff_t>(lb.v_row)))
            << what << " layer " << il << " position " << p;
      }
      EXPECT_EQ(la.conv, lb.conv) << what << " layer " << il;
      EXPECT_EQ(la.ssm, lb.ssm) << what << " layer " << il;
    }
  };
  strata::pending_test::check_pending_property(make, seed, 24, 9, 12, true, same_state);
}

TEST(Pending, Qwen3MoeKeepEqualsRun) {
  expect_pending_property(TinyModelWriter(TinySpec{}, 31).write("tiny_pending_q3.gguf"), 301);
}

TEST(Pending, Qwen35MoeKeepEqualsRun) {
  expect_pending_property(TinyModelWriter(qwen35_spec(), 32).write("tiny_pending_q35.gguf"), 302);
}

// laguna: sliding-window layers (window 4, shorter than prompt + drafts), a dense first layer, the
// sigmoid router; kept rows of a sliding layer move like full attention's.
TEST(Pending, LagunaKeepEqualsRun) {
  strata::convert::SynthOptions o;
  o.preset = "tiny-laguna";
  o.quant = "f32";
  o.threads = 2;
  o.out_path = (std::filesystem::path(testing::TempDir()) / "tiny_pending_laguna.gguf").string();
  strata::convert::synth_model(o);
  expect_pending_property(o.out_path, 304);
  // Rings of window + 11 rows (forwards of at most 12 tokens): prompt, drafts and the tokens after them
  // wrap around the sliding layers' caches.
  expect_pending_property(o.out_path, 307, {}, 12);
}

TEST(Pending, Qwen35MoeQ8_0KeepEqualsRun) {
  TinySpec s = qwen35_spec();
  s.matrix_type = strata::GgmlType::Q8_0;
  expect_pending_property(TinyModelWriter(s, 33).write("tiny_pending_q35_q8.gguf"), 303);
}

// The same property with every cache type: both sides store the same rows, so keep() (which moves
// stored rows) and a plain run agree bit for bit. Heads of 32 values so q8_0 blocks fit a head.
TinySpec qwen35_head32_spec() {
  TinySpec s = qwen35_spec();
  s.head_dim = 32;
  return s;
}

TEST(Pending, F16CacheKeepEqualsRun) {
  expect_pending_property(TinyModelWriter(qwen35_spec(), 35).write("tiny_pending_f16.gguf"), 305,
                          {strata::KvType::F16, strata::KvType::F16});
}

TEST(Pending, Q8_0CacheKeepEqualsRun) {
  expect_pending_property(TinyModelWriter(qwen35_head32_spec(), 36).write("tiny_pending_kvq8.gguf"), 306,
                          {strata::KvType::Q8_0, strata::KvType::F16});
}

// Logits of a prompt (and one decode step) with f16 / q8_0 caches against the f32 cache, per row as
// max|a-b| / max|ref|. f16: every row within the bound. q8_0 rounds enough to flip an expert choice now
// and then, which moves that row far (a discontinuity of top-k routing, not of the cache), so up to two
// rows may exceed its bound. Bounds: the measured worst with margin.
TEST(KvCache, ReducedTypesStayCloseToF32) {
  for (const TinySpec& spec : {qwen35_head32_spec(), [] {
                                 TinySpec s;
                                 s.head_dim = 32;
                                 s.rope_dims = 32;
                                 return s;
                               }()}) {
    auto model = strata::Model::load(TinyModelWriter(spec, 37).write("tiny_kv_" + spec.arch + ".gguf"));
    const int64_t V = model->config().n_vocab;
    std::vector<int32_t> prompt;
    for (int i = 0; i < 40; ++i) prompt.push_back((i * 37 + 11) % static_cast<int>(V));
    const int n = static_cast<int>(prompt.size());
    auto logits = [&](strata::KvCacheTypes kv) {
      strata::Session s(*model, 64, kv);
      std::vector<float> l(static_cast<size_t>(n) * V);
      s.forward(prompt.data(), n, l.data(), true);
      // Then a decode step: reads every stored row once more.
      std::vector<float> last(static_cast<size_t>(V));
      const int32_t id = 5;
      s.forward(&id, 1, last.data(), false);
      l.insert(l.end(), last.begin(), last.end());
      return l;
    };
    const std::vector<float> ref = logits({});
    struct Case {
      strata::KvCacheTypes kv;
      double bound;
      int outliers;
    };
    for (const Case& c : {Case{{strata::KvType::F16, strata::KvType::F16}, 1e-3, 0},
                          Case{{strata::KvType::Q8_0, strata::KvType::Q8_0}, 4e-2, 2},
                          Case{{strata::KvType::F16, strata::KvType::Q8_0}, 4e-2, 2}}) {
      const std::vector<float> got = logits(c.kv);
      std::vector<double> errs;
      for (int t = 0; t <= n; ++t) errs.push_back(row_rel_err(got.data() + t * V, ref.data() + t * V, V));
      const int over = static_cast<int>(std::count_if(errs.begin(), errs.end(), [&c](double e) { return e >= c.bound; }));
      std::sort(errs.begin(), errs.end());
      std::printf("[kv] %s K %s V %s: row rel err median %.3g, max %.3g, %d row(s) over %.3g\n", spec.arch.c_str(),
                  strata::kv_type_name(c.kv.k), strata::kv_type_name(c.kv.v), errs[errs.size() / 2], errs.back(), over,
                  c.bound);
      const std::string what = spec.arch + " " + strata::kv_type_name(c.kv.k) + "/" + strata::kv_type_name(c.kv.v);
      EXPECT_LE(over, c.outliers) << what;
      EXPECT_GT(errs.back(), 0.0) << what << ": a reduced cache type should round something";
    }
  }
}

TEST(KvCache, TypesParseAndRefuseWhatDoesNotFit) {
  EXPECT_EQ(strata::parse_kv_type("f16", "x"), strata::KvType::F16);
  EXPECT_EQ(strata::parse_kv_type("q8_0", "x"), strata::KvType::Q8_0);
  EXPECT_EQ(strata::parse_kv_type("f32", "x"), strata::KvType::F32);
  try {
    strata::parse_kv_type("q4_0", "--cache-type-k");
    FAIL() << "q4_0 accepted";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--cache-type-k 'q4_0': expected f32, f16 or q8_0"), std::string::npos) << e.what();
  }
  // Heads of 16 values cannot hold a q8_0 block of 32.
  auto model = strata::Model::load(TinyModelWriter(qwen35_spec(), 38).write("tiny_kv_hd16.gguf"));
  EXPECT_THROW(strata::Session(*model, 16, {strata::KvType::Q8_0, strata::KvType::F16}), strata::Error);
  EXPECT_NO_THROW(strata::Session(*model, 16, {strata::KvType::F16, strata::KvType::F16}));
  // Bytes per token: 2 full-attention layers x (K + V) x 2 KV heads x 16 values.
  EXPECT_EQ(strata::kv_bytes_per_token(model->config(), {}), 2u * 2u * 2u * 16u * 4u);
  EXPECT_EQ(strata::kv_bytes_per_token(model->config(), {strata::KvType::F16, strata::KvType::F16}), 2u * 2u * 2u * 16u * 2u);
  strata::Session f16(*model, 16, {strata::KvType::F16, strata::KvType::F32});
  EXPECT_EQ(f16.state().layers[1].k.size(), 16u * 2u * 16u * 2u);
  EXPECT_EQ(f16.state().layers[1].v.size(), 16u * 2u * 16u * 4u);
}

TEST(Pending, TreeLogitsEqualEachRootPathRunAlone) {
  // Every node of a tree sees exactly its root path: its logits equal a chain run of that path.
  auto model = strata::Model::load(TinyModelWriter(qwen35_spec(), 34).write("tiny_pending_tree.gguf"));
  const int64_t V = model->config().n_vocab;
  const std::vector<int32_t> prompt = {3, 9, 27};
  const std::vector<int32_t> drafts = {5, 6, 7, 8, 9, 10, 11};
  const std::vector<int> parents = {-1, 0, 0, -1, 2, 1, 5};
  strata::Session s(*model, 32);
  std::vector<float> scratch(static_cast<size_t>(V) * prompt.size());
  s.forward(prompt.data(), 3, scratch.data(), false);
  std::vector<float> tree(static_cast<size_t>(V) * drafts.size());
  s.forward_pending(drafts.data(), 7, parents.data(), tree.data());
  const strata::TokenTree tt = strata::TokenTree::from_parents(parents.data(), 7);
  for (int node = 0; node < 7; ++node) {
    std::vector<int32_t> path = prompt;
    for (int i : tt.path_to(node)) path.push_back(drafts[static_cast<size_t>(i)]);
    strata::Session alone(*model, 32);
    std::vector<float> l(static_cast<size_t>(V));
    alone.forward(path.data(), static_cast<int>(path.size()), l.data(), false);
    EXPECT_TRUE(std::equal(l.begin(), l.end(), tree.begin() + node * V)) << "node " << node;
  }
  // Siblings differ (they see different ancestors), so the comparison above is not vacuous.
  EXPECT_FALSE(std::equal(tree.begin() + 1 * V, tree.begin() + 2 * V, tree.begin() + 2 * V));
}

TEST(Pending, BadTreesPathsAndCallsFailAndKeepTheState) {
  auto model = strata::Model::load(TinyModelWriter(qwen35_spec(), 35).write("tiny_pending_err.gguf"));
  const int64_t V = model->config().n_vocab;
  strata::Session s(*model, 8);
  std::vector<float> l(static_cast<size_t>(V) * 8);
  const std::vector<int32_t> two = {1, 2};
  s.forward(two.data(), 2, l.data(), false);
  const std::vector<int32_t> drafts = {4, 5, 6};
  const std::vector<int> bad = {-1, 1, 0};  // token 1 is its own parent
  EXPECT_THROW(s.forward_pending(drafts.data(), 3, bad.data(), l.data()), strata::Error);
  EXPECT_FALSE(s.has_pending());
  EXPECT_EQ(s.n_past(), 2);
  const std::vector<int32_t> too_many = {1, 2, 3, 4, 5, 6, 7};
  EXPECT_THROW(s.forward_pending(too_many.data(), 7, nullptr, l.data()), strata::Error);
  EXPECT_THROW(s.keep_first(1), strata::Error);  // nothing pending

  const std::vector<int> parents = {-1, 0, -1};
  s.forward_pending(drafts.data(), 3, parents.data(), l.data());
  EXPECT_THROW(s.forward(two.data(), 1, l.data(), false), strata::Error);  // pending first
  const std::vector<int> not_root = {1};
  EXPECT_THROW(s.keep(not_root.data(), 1), strata::Error);
  const std::vector<int> broken = {2, 1};  // 1 is not a child of 2
  EXPECT_THROW(s.keep(broken.data(), 2), strata::Error);
  EXPECT_TRUE(s.has_pending());
  const std::vector<int> path = {2};
  s.keep(path.data(), 1);
  EXPECT_EQ(s.n_past(), 3);
  // reset drops anything pending.
  s.forward_pending(drafts.data(), 2, nullptr, l.data());
  s.reset();
  EXPECT_FALSE(s.has_pending());
  EXPECT_EQ(s.n_past(), 0);
}

// Several sessions in one batched forward end exactly as their own forwards leave them: logits, state
// and routing counts bit for bit; a bad step anywhere changes no session.
void expect_batched_sessions_equal_alone(const std::string& path) {
  auto model = strata::Model::load(path);
  const int64_t V = model->config().n_vocab;
  const std::vector<std::vector<int32_t>> history = {{1, 2, 3}, {40, 41}, {7, 8, 9, 10, 11}};
  const std::vector<std::vector<int32_t>> next = {{5}, {60, 61, 62}, {9}};
  std::vector<std::unique_ptr<strata::Session>> together, alone;
  std::vector<strata::RoutingCounts> rc_together(3), rc_alone(3);
  std::vector<float> scratch(static_cast<size_t>(V) * 8);
  for (size_t i = 0; i < 3; ++i) {
    together.push_back(std::make_unique<strata::Session>(*model, 16));
    alone.push_back(std::make_unique<strata::Session>(*model, 16));
    for (auto* s : {together.back().get(), alone.back().get()})
      s->forward(history[i].data(), static_cast<int>(history[i].size()), scratch.data(), false);
    together[i]->set_routing_counts(&rc_together[i]);
    alone[i]->set_routing_counts(&rc_alone[i]);
  }
  std::vector<std::vector<float>> got(3), want(3);
  std::vector<strata::SessionStep> steps(3);
  for (size_t i = 0; i < 3; ++i) {
    got[i].resize(next[i].size() * static_cast<size_t>(V));
    want[i].resize(got[i].size());
    steps[i].session = together[i].get(), steps[i].tokens = next[i].data(), steps[i].n = static_cast<int>(next[i].size());
    steps[i].logits = got[i].data(), steps[i].all_positions = true;
    alone[i]->forward(next[i].data(), static_cast<int>(next[i].size()), want[i].data(), true);
  }
  strata::forward_sessions(steps.data(), 3);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i], want[i]) << "session " << i;
    EXPECT_EQ(together[i]->n_past(), alone[i]->n_past());
    EXPECT_EQ(rc_together[i].counts, rc_alone[i].counts) << "session " << i;
    EXPECT_EQ(rc_together[i].n_tokens, rc_alone[i].n_tokens) << "session " << i;
    const auto& a = together[i]->state().layers;
    const auto& b = alone[i]->state().layers;
    for (size_t l = 0; l < a.size(); ++l) {
      EXPECT_EQ(a[l].k, b[l].k) << "session " << i << " layer " << l;  // rows past n_past were never written
      EXPECT_EQ(a[l].conv, b[l].conv) << "session " << i << " layer " << l;
      EXPECT_EQ(a[l].ssm, b[l].ssm) << "session " << i << " layer " << l;
    }
  }
  // A bad id in the last step: nothing runs, no session moves.
  const int32_t bad = static_cast<int32_t>(V);
  steps[2].tokens = &bad, steps[2].n = 1;
  EXPECT_THROW(strata::forward_sessions(steps.data(), 3), strata::Error);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(together[i]->n_past(), alone[i]->n_past());
  steps[1].session = together[0].get();
  steps[2].tokens = next[2].data();
  EXPECT_THROW(strata::forward_sessions(steps.data(), 3), strata::Error);  // one session twice
}

TEST(Batched, Qwen3MoeSessionsTogetherEqualAlone) {
  expect_batched_sessions_equal_alone(TinyModelWriter(TinySpec{}, 41).write("tiny_batch_q3.gguf"));
}

TEST(Batched, Qwen35MoeQ8_0SessionsTogetherEqualAlone) {
  TinySpec s = qwen35_spec();
  s.matrix_type = strata::GgmlType::Q8_0;
  expect_batched_sessions_equal_alone(TinyModelWriter(s, 42).write("tiny_batch_q35.gguf"));
}

}  // namespace
