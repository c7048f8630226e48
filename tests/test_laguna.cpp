// laguna on the CPU without Hugging Face fixtures: sliding-window attention with the softplus output gate
// against a float64 reference written here (a plain loop over the window), the sigmoid router, a tiny
// synth laguna model (layer program read back, prefill == token-by-token decode bit for bit), and the
// GPU backend refusing what it does not implement. Pending trees on laguna: test_engine (Pending.*).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "strata/base/error.h"
#include "strata/convert/synth.h"
#include "strata/cpu/ops.h"
#include "strata/engine/blocks.h"
#include "strata/engine/model.h"
#include "strata/engine/routing_counts.h"
#include "strata/engine/routing_trace.h"
#include "strata/engine/session.h"
#include "strata/moe/gpu_support.h"

namespace fs = std::filesystem;
using namespace strata;

namespace {

struct Matrix {  // float32 rows owned here, viewed as a WeightMatrix
  std::vector<float> v;
  int64_t rows = 0, cols = 0;
  WeightMatrix view() const {
    WeightMatrix w;
    w.type = GgmlType::F32;
    w.data = reinterpret_cast<const uint8_t*>(v.data());
    w.n_rows = rows;
    w.n_cols = cols;
    w.row_stride = static_cast<size_t>(cols) * sizeof(float);
    return w;
  }
};

Matrix random_matrix(int64_t rows, int64_t cols, std::mt19937& rng, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  Matrix m{std::vector<float>(static_cast<size_t>(rows * cols)), rows, cols};
  for (float& x : m.v) x = d(rng);
  return m;
}

// y = W x in double.
std::vector<double> matvec_ref(const Matrix& w, const std::vector<double>& x) {
  std::vector<double> y(static_cast<size_t>(w.rows), 0.0);
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t c = 0; c < w.cols; ++c) y[static_cast<size_t>(r)] += double(w.v[static_cast<size_t>(r * w.cols + c)]) * x[static_cast<size_t>(c)];
  return y;
}

// RMSNorm then NEOX rotary on the first `rot` dims of one head, in double.
void norm_rope(double* x, const std::vector<float>& w, int hd, int rot, double base, int pos, double eps) {
  double ss = 0;
  for (int i = 0; i < hd; ++i) ss += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(ss / hd + eps);
  for (int i = 0; i < hd; ++i) x[i] = x[i] * inv * w[static_cast<size_t>(i)];
  for (int i = 0; i < rot / 2; ++i) {
    const double angle = pos * std::pow(base, -2.0 * i / rot);
    const double a = x[i], b = x[i + rot / 2];
    x[i] = a * std::cos(angle) - b * std::sin(angle);
    x[i + rot / 2] = b * std::cos(angle) + a * std::sin(angle);
  }
}

struct AttnCase {
  ModelConfig c;
  Matrix q, k, v, o, gate;
  std::vector<float> q_norm, k_norm;
  AttentionWeights weights() const {
    AttentionWeights w;
    w.q = q.view(), w.k = k.view(), w.v = v.view(), w.o = o.view(), w.gate = gate.view();
    w.q_norm = q_norm, w.k_norm = k_norm;
    return w;
  }
};

AttnCase attn_case(LayerKind kind, int window, AttnGate gate, uint32_t seed) {
  std::mt19937 rng(seed);
  AttnCase a;
  ModelConfig& c = a.c;
  c.arch = Arch::Laguna;
  c.n_layer = 1;
  c.n_embd = 32;
  c.head_dim = 16;
  c.head_dim_v = 16;
  c.rms_eps = 1e-6f;
  c.attn_gate = gate;
  LayerSpec l;
  l.mixer = kind;
  l.ffn = FfnKind::Dense;
  l.n_head = 4;
  l.n_head_kv = 2;
  l.rope_dims = 8;
  l.rope_freq_base = 10000.0f;
  l.window = window;
  c.layers = {l};
  c.n_head = l.n_head, c.n_head_kv = l.n_head_kv, c.rope_dims = l.rope_dims, c.rope_freq_base = l.rope_freq_base;
  a.q = random_matrix(l.n_head * c.head_dim, c.n_embd, rng, 0.4f);
  a.k = random_matrix(l.n_head_kv * c.head_dim, c.n_embd, rng, 0.4f);
  a.v = random_matrix(l.n_head_kv * c.head_dim, c.n_embd, rng, 0.4f);
  a.o = random_matrix(c.n_embd, l.n_head * c.head_dim, rng, 0.2f);
  a.gate = random_matrix(gate == AttnGate::SoftplusPerHead ? l.n_head : l.n_head * c.head_dim, c.n_embd, rng, 0.5f);
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  for (int i = 0; i < c.head_dim; ++i) a.q_norm.push_back(u(rng)), a.k_norm.push_back(u(rng));
  return a;
}

// The float64 reference: token t at position t attends to positions max(0, t - window + 1) .. t.
std::vector<double> reference_attention(const AttnCase& a, const std::vector<float>& X, int n) {
  const ModelConfig& c = a.c;
  const LayerSpec& l = c.layers[0];
  const int hd = c.head_dim, E = c.n_embd;
  std::vector<std::vector<double>> Q(n), K(n), V(n), G(n);
  for (int t = 0; t < n; ++t) {
    const std::vector<double> x(X.begin() + t * E, X.begin() + (t + 1) * E);
    Q[t] = matvec_ref(a.q, x), K[t] = matvec_ref(a.k, x), V[t] = matvec_ref(a.v, x), G[t] = matvec_ref(a.gate, x);
    for (int h = 0; h < l.n_head; ++h) norm_rope(&Q[t][h * hd], a.q_norm, hd, l.rope_dims, l.rope_freq_base, t, c.rms_eps);
    for (int g = 0; g < l.n_head_kv; ++g) norm_rope(&K[t][g * hd], a.k_norm, hd, l.rope_dims, l.rope_freq_base, t, c.rms_eps);
  }
  std::vector<double> out;
  for (int t = 0; t < n; ++t) {
    std::vector<double> o(static_cast<size_t>(l.n_head * hd), 0.0);
    const int from = l.window > 0 ? std::max(0, t - l.window + 1) : 0;
    for (int h = 0; h < l.n_head; ++h) {
      const int g = h / (l.n_head / l.n_head_kv);
      std::vector<double> s;
      double mx = -1e300, sum = 0;
      for (int p = from; p <= t; ++p) {
        double dot = 0;
        for (int i = 0; i < hd; ++i) dot += Q[t][h * hd + i] * K[p][g * hd + i];
        s.push_back(dot / std::sqrt(double(hd)));
        mx = std::max(mx, s.back());
      }
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int p = from; p <= t; ++p)
        for (int i = 0; i < hd; ++i) o[h * hd + i] += s[p - from] / sum * V[p][g * hd + i];
      for (int i = 0; i < hd; ++i) {
        const double gv = G[t][c.attn_gate == AttnGate::SoftplusPerHead ? h : h * hd + i];
        o[h * hd + i] *= std::log1p(std::exp(gv));
      }
    }
    const std::vector<double> y = matvec_ref(a.o, o);
    out.insert(out.end(), y.begin(), y.end());
  }
  return out;
}

// The block over n tokens in forwards of `piece` tokens, the sequence's rings sized for that piece (a
// sliding layer then keeps window + piece - 1 rows and wraps around them).
std::vector<float> run_attention(const AttnCase& a, const std::vector<float>& X, int n, int piece) {
  SequenceState st(a.c, 64, {}, piece);
  const AttentionWeights w = a.weights();
  std::vector<float> out(static_cast<size_t>(n) * a.c.n_embd);
  for (int t = 0; t < n; t += piece) {
    const int len = std::min(piece, n - t);
    attention_block(a.c, a.c.layers[0], w, st.layers[0], t, nullptr, X.data() + t * a.c.n_embd, len,
                    out.data() + t * a.c.n_embd);
  }
  return out;
}

void expect_matches_reference(LayerKind kind, int window, AttnGate gate, uint32_t seed) {
  const AttnCase a = attn_case(kind, window, gate, seed);
  const int n = 12;
  std::mt19937 rng(seed + 1);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> X(static_cast<size_t>(n) * a.c.n_embd);
  for (float& x : X) x = d(rng);
  const std::vector<double> want = reference_attention(a, X, n);
  const std::vector<float> got = run_attention(a, X, n, n);
  double max_ref = 0, max_err = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(want[i]));
    max_err = std::max(max_err, std::fabs(got[i] - want[i]));
  }
  EXPECT_LE(max_err, 1e-5 * max_ref) << "window " << window;
  // Decode one token at a time does the same arithmetic per row as the prefill, and so do pieces of 3
  // tokens and single tokens in the smallest rings (window + piece - 1 rows, wrapping several times).
  EXPECT_EQ(run_attention(a, X, n, 1), got) << "window " << window;
  EXPECT_EQ(run_attention(a, X, n, 3), got) << "window " << window;
  if (kind == LayerKind::SlidingAttention) {
    const SequenceState ring(a.c, 64, {}, 3);
    EXPECT_EQ(ring.layers[0].rows, std::min<int64_t>(64, window + 2)) << "window " << window;
  }
}

std::string synth_tiny_laguna(const std::string& name) {
  convert::SynthOptions o;
  o.preset = "tiny-laguna";
  o.quant = "f32";
  o.seed = 7;
  o.threads = 2;
  o.out_path = (fs::path(testing::TempDir()) / name).string();
  convert::synth_model(o);
  return o.out_path;
}

}  // namespace

TEST(LagunaAttention, SlidingWindowMatchesFloat64Reference) {
  for (int window : {1, 3, 4, 11, 12, 40}) expect_matches_reference(LayerKind::SlidingAttention, window, AttnGate::SoftplusPerHead, 11);
  expect_matches_reference(LayerKind::SlidingAttention, 4, AttnGate::SoftplusPerElement, 12);
  expect_matches_reference(LayerKind::FullAttention, 0, AttnGate::SoftplusPerHead, 13);
}

TEST(LagunaAttention, WindowCoveringEverythingEqualsFullAttention) {
  const AttnCase full = attn_case(LayerKind::FullAttention, 0, AttnGate::SoftplusPerHead, 21);
  AttnCase wide = attn_case(LayerKind::SlidingAttention, 12, AttnGate::SoftplusPerHead, 21);
  std::vector<float> X(static_cast<size_t>(12) * full.c.n_embd, 0.25f);
  for (size_t i = 0; i < X.size(); ++i) X[i] = std::sin(0.37f * static_cast<float>(i));
  EXPECT_EQ(run_attention(full, X, 12, 12), run_attention(wide, X, 12, 12));
}

TEST(LagunaRouter, SigmoidSoftcapBiasChoosesButDoesNotWeigh) {
  // Logits chosen so the bias moves expert 3 into the top 2 while the weights stay the plain sigmoids.
  std::vector<float> logits = {2.0f, 1.0f, -1.0f, 0.5f};
  const float bias[] = {0.0f, 0.0f, 0.0f, 1.0f};
  int ids[2];
  float w[2];
  route_token_sigmoid(logits.data(), bias, 4, 2, 3.0f, true, ids, w);
  auto score = [](double l) { return 1.0 / (1.0 + std::exp(-3.0 * std::tanh(l / 3.0))); };
  EXPECT_EQ(ids[0], 3);  // sigmoid(capped 0.5) + 1 beats sigmoid(capped 2)
  EXPECT_EQ(ids[1], 0);
  const double s3 = score(0.5), s0 = score(2.0);
  EXPECT_NEAR(w[0], s3 / (s3 + s0), 1e-6);
  EXPECT_NEAR(w[1], s0 / (s3 + s0), 1e-6);
  std::vector<float> plain = {2.0f, 1.0f, -1.0f, 0.5f};
  route_token_sigmoid(plain.data(), nullptr, 4, 2, 0.0f, false, ids, w);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 1);
  EXPECT_NEAR(w[0], 1.0 / (1.0 + std::exp(-2.0)), 1e-6);
}

TEST(LagunaModel, SynthProgramAndPrefillEqualsDecode) {
  auto model = Model::load(synth_tiny_laguna("tiny_laguna.gguf"));
  const ModelConfig& c = model->config();
  ASSERT_EQ(c.n_layer, 4);
  for (int il = 0; il < 4; ++il) {
    EXPECT_EQ(c.mixer(il), il % 2 == 0 ? LayerKind::FullAttention : LayerKind::SlidingAttention) << il;
    EXPECT_EQ(c.layer(il).n_head, il % 2 == 0 ? 2 : 4) << il;
    EXPECT_EQ(c.layer(il).ffn, il == 0 ? FfnKind::Dense : FfnKind::Moe) << il;
  }
  EXPECT_EQ(c.layer(1).window, 4);
  EXPECT_EQ(c.layer(0).rope_dims, 32);
  EXPECT_EQ(c.layer(1).rope_dims, 64);
  EXPECT_EQ(c.router_softcap, 8.0f);
  EXPECT_EQ(c.expert_weights_scale, 2.5f);

  const int64_t V = c.n_vocab;
  const std::vector<int32_t> ids = {3, 17, 250, 9, 44, 101, 7, 300, 12, 5, 411, 66};
  const int n = static_cast<int>(ids.size());
  Session a(*model, 32), b(*model, 32);
  std::vector<float> all(static_cast<size_t>(n * V)), one(static_cast<size_t>(V));
  a.forward(ids.data(), n, all.data(), true);
  for (int t = 0; t < n; ++t) {
    b.forward(&ids[static_cast<size_t>(t)], 1, one.data(), false);
    EXPECT_TRUE(std::equal(one.begin(), one.end(), all.begin() + t * V)) << "position " << t;
  }
  for (float x : all) ASSERT_TRUE(std::isfinite(x));
}

// The sliding layers' ring caches (window + 15 rows when forwards add at most 16 tokens) give the logits
// of whole-context caches, bit for bit: a prompt run in pieces of 16 and the same tokens decoded one by
// one against one forward over caches of the whole context.
TEST(LagunaModel, RingCachesEqualWholeContextCaches) {
  auto model = Model::load(synth_tiny_laguna("tiny_laguna_ring.gguf"));
  const int64_t V = model->config().n_vocab;
  const int n = 90, ctx = 96;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int t = 0; t < n; ++t) ids[static_cast<size_t>(t)] = static_cast<int32_t>((t * 7919 + 3) % V);
  Session whole(*model, ctx), pieces(*model, ctx, {}, 16), steps(*model, ctx, {}, 16);
  EXPECT_EQ(whole.state().layers[1].rows, ctx);
  EXPECT_EQ(pieces.state().layers[1].rows, 4 + 15);
  EXPECT_EQ(pieces.state().layers[0].rows, ctx);  // full attention keeps every position
  EXPECT_EQ(pieces.state().forward_limit, 16);
  std::vector<float> want(static_cast<size_t>(n * V)), got(want.size()), one(static_cast<size_t>(V));
  whole.forward(ids.data(), n, want.data(), true);
  pieces.forward(ids.data(), n, got.data(), true);
  EXPECT_EQ(got, want);
  for (int t = 0; t < n; ++t) {
    steps.forward(&ids[static_cast<size_t>(t)], 1, one.data(), false);
    ASSERT_TRUE(std::equal(one.begin(), one.end(), want.begin() + t * V)) << "position " << t;
  }
  // More pending tokens than a ring takes are refused, nothing changed.
  std::vector<int32_t> drafts(17, 5);
  std::vector<float> rows(drafts.size() * static_cast<size_t>(V));
  Session short_ring(*model, ctx, {}, 16);
  EXPECT_THROW(short_ring.forward_pending(drafts.data(), 17, nullptr, rows.data()), Error);
  EXPECT_EQ(short_ring.n_past(), 0);
  EXPECT_FALSE(short_ring.has_pending());
}

TEST(LagunaModel, GpuBackendRefusesWhatItDoesNotImplement) {
  auto model = Model::load(synth_tiny_laguna("tiny_laguna_gpu.gguf"));
  // The decode step and the batched prefill run every layer kind (prompts are not sent token by token);
  // per-layer key/value head counts are refused by name.
  EXPECT_EQ(gpu_unsupported_feature(model->config()), "");
  EXPECT_EQ(gpu_prefill_unsupported_feature(model->config()), "");
  ModelConfig c = model->config();
  c.layers[0].yarn.factor = 4.0f;
  EXPECT_EQ(gpu_unsupported_feature(c), "");
  EXPECT_EQ(gpu_prefill_unsupported_feature(c), "");
  c.layers[1].n_head_kv = c.n_head_kv + 1;
  EXPECT_EQ(gpu_unsupported_feature(c), "layer 1 has its own key/value head count");
  try {
    require_gpu_support(c);
    ADD_FAILURE() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the GPU backend does not implement"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("laguna"), std::string::npos) << e.what();
  }
  // Heads longer than the prefill's tiled attention takes run their prompts through the decode step.
  c = model->config();
  c.head_dim = kGpuPrefillMaxHeadDim + 4;
  EXPECT_EQ(gpu_prefill_unsupported_feature(c), "attention heads of 260 dims (the tiled prefill attention takes "
                                                "multiples of 4 up to 256)");
  c.head_dim = 30;
  EXPECT_NE(gpu_prefill_unsupported_feature(c), "");
  // Inputs wider than the decode matvec stages are refused when the model loads, naming the projection
  // (128 heads of 192 values feed a 24,576-column output projection); so are heads longer than a block.
  c = model->config();
  for (LayerSpec& l : c.layers) l.n_head = 128;
  c.head_dim = c.head_dim_v = 192;
  EXPECT_EQ(gpu_unsupported_feature(c),
            "layer 0's attention output projection of 24576 columns (the decode step's "
            "matvec takes inputs up to 16384 wide)");
  c = model->config();
  c.n_ff = kGpuMaxMatvecCols + 256;
  ASSERT_EQ(c.layers[0].ffn, FfnKind::Dense);  // laguna's first layer
  EXPECT_EQ(gpu_unsupported_feature(c),
            "layer 0's dense down projection of 16640 columns (the decode step's matvec "
            "takes inputs up to 16384 wide)");
  c = model->config();
  c.head_dim = kGpuMaxHeadDim + 4;
  EXPECT_NE(gpu_unsupported_feature(c).find("attention heads of 1028 dims"), std::string::npos);
  // Expert rows the prefill's grouped products cannot take send prompts through the decode step.
  c = model->config();
  c.n_ff_exp = 48;
  EXPECT_NE(gpu_prefill_unsupported_feature(c).find("multiples of 32"), std::string::npos);
  EXPECT_EQ(gpu_unsupported_feature(c), "");
}

// Routing traces record the routed layers only: laguna's dense first layer routes nothing. A trace's
// picks add up to the routing counts of those layers, and replaying the recorded trace reproduces the
// run exactly (replayed picks keep the router's own weights).
TEST(LagunaModel, RoutingTracesHoldTheRoutedLayers) {
  auto model = Model::load(synth_tiny_laguna("tiny_laguna_trace.gguf"));
  const ModelConfig& c = model->config();
  const std::vector<int> routed = c.routed_layers();
  ASSERT_EQ(routed.size(), static_cast<size_t>(c.n_layer - 1));
  ASSERT_EQ(routed.front(), 1);
  const std::string path = (fs::path(testing::TempDir()) / "tiny_laguna.trace").string();
  RoutingTraceHeader h;
  h.n_layer = static_cast<int>(routed.size()), h.n_expert = c.n_expert, h.k = c.n_expert_used;
  const int32_t tokens[] = {3, 1, 4, 1, 5, 9, 2, 6};
  std::vector<float> plain(static_cast<size_t>(c.n_vocab) * 8), again(plain.size());
  RoutingCounts counts;
  {
    RoutingTraceWriter w(path, h);
    Session s(*model, 32);
    s.set_routing_trace(&w, 0);
    s.set_routing_counts(&counts);
    s.forward(tokens, 8, plain.data(), true);
  }
  const RoutingTrace r = read_routing_trace(path);
  ASSERT_EQ(r.streams.size(), 1u);
  ASSERT_EQ(r.streams[0].picks.size(), 8 * r.token_stride());
  RoutingCounts from_trace;
  from_trace.reset(c.n_layer, c.n_expert);
  for (size_t i = 0; i < r.streams[0].picks.size(); ++i)
    from_trace.add(routed[(i / static_cast<size_t>(c.n_expert_used)) % routed.size()], r.streams[0].picks[i]);
  EXPECT_EQ(from_trace.counts, counts.counts);

  TraceReplay replay(read_routing_trace(path), "recorded");
  Session s(*model, 32);
  s.set_routing_replay(&replay);
  s.forward(tokens, 8, again.data(), true);
  EXPECT_EQ(again, plain);

  // A trace of every layer does not fit: the shape names the routed layers.
  RoutingTraceHeader all = h;
  all.n_layer = c.n_layer;
  RoutingTraceWriter w(path + ".all", all);
  Session t(*model, 32);
  try {
    t.set_routing_trace(&w, 0);
    ADD_FAILURE() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--collect-routing"), std::string::npos) << e.what();
  }
}
