// The DFlash block drafter's forward (engine/dflash.h) against a float64 reference written here from the
// header's equations, on a random drafter for the bundled model; context added in pieces or after a
// truncation equals context added at once; files that do not fit the target fail clearly.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "dflash_test_util.h"
#include "process_temp_dir.h"
#include "spec_lossless.h"
#include "strata/base/error.h"
#include "strata/engine/dflash.h"
#include "strata/engine/model.h"
#include "strata/engine/session.h"
#include "strata/gguf/writer.h"
#include "strata/quant/quantize.h"
#include "strata/spec/dflash_drafter.h"
#include "strata/spec/spec_options.h"

namespace {

using strata::DFlashModel;
using strata::DFlashState;
using strata::GgmlType;
using strata::GgufValue;
using strata::dflash_test::Shape;
using strata::dflash_test::write_drafter;

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/models/strata-tiny.gguf";

// ---- float64 reference ------------------------------------------------------------------------------

using Vec = std::vector<double>;

struct RefTensors {
  const strata::GgufFile& f;
  Vec get(const std::string& n) const {
    const auto& t = f.tensor(n);
    std::vector<float> v(static_cast<size_t>(t.n_elements()));
    strata::dequantize_row(t.type, t.data, v.data(), t.n_elements());
    return Vec(v.begin(), v.end());
  }
};

// y = W x for W stored as rows of `cols` values.
Vec mul(const Vec& w, const Vec& x) {
  const size_t cols = x.size(), rows = w.size() / cols;
  Vec y(rows, 0.0);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) y[r] += w[r * cols + c] * x[c];
  return y;
}

Vec rms(const Vec& x, const Vec& w, size_t off, size_t n) {
  double ss = 0;
  for (size_t i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + 1e-6);
  Vec y(n);
  for (size_t i = 0; i < n; ++i) y[i] = x[off + i] * inv * w[i];
  return y;
}

// Each head of width hd: rms with w, then NEOX rotary on `rot` dims at pos.
void heads_norm_rope(Vec& x, int hd, const Vec& w, int rot, int64_t pos) {
  for (size_t h = 0; h < x.size() / static_cast<size_t>(hd); ++h) {
    const Vec n = rms(x, w, h * hd, static_cast<size_t>(hd));
    for (int i = 0; i < hd; ++i) x[h * hd + i] = n[static_cast<size_t>(i)];
    for (int i = 0; i < rot / 2; ++i) {
      const double th = static_cast<double>(pos) * std::pow(10000.0, -2.0 * i / rot);
      const double a = x[h * hd + i], b = x[h * hd + i + rot / 2];
      x[h * hd + i] = a * std::cos(th) - b * std::sin(th);
      x[h * hd + i + rot / 2] = a * std::sin(th) + b * std::cos(th);
    }
  }
}

// Logits of block rows 1..B-1 for taps [n x L x d] and the anchor.
std::vector<Vec> reference(const strata::Model& target, const std::string& path, const Shape& s,
                           const std::vector<float>& taps, int n, int32_t anchor) {
  const strata::GgufFile f = strata::GgufFile::open(path);
  const RefTensors T{f};
  const size_t d = static_cast<size_t>(target.config().n_embd), L = s.taps.size();
  const int hd = s.head_dim, B = s.block;
  const Vec fc = T.get("fc.weight"), hn = T.get("hidden_norm.weight");
  std::vector<std::vector<Vec>> K(static_cast<size_t>(s.layers)), V(static_cast<size_t>(s.layers));
  for (int p = 0; p < n; ++p) {
    const Vec tap(taps.begin() + static_cast<std::ptrdiff_t>(p * L * d),
                  taps.begin() + static_cast<std::ptrdiff_t>((p + 1) * L * d));
    const Vec feat = rms(mul(fc, tap), hn, 0, d);
    for (int l = 0; l < s.layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      Vec k = mul(T.get(b + "attn_k.weight"), feat);
      heads_norm_rope(k, hd, T.get(b + "attn_k_norm.weight"), s.rope, p);
      K[static_cast<size_t>(l)].push_back(k);
      V[static_cast<size_t>(l)].push_back(mul(T.get(b + "attn_v.weight"), feat));
    }
  }
  const auto& tw = target.weights();
  std::vector<float> row(d);
  strata::dequantize_row(tw.token_embd.type,
                         tw.token_embd.data + static_cast<size_t>(anchor) * tw.token_embd.row_stride, row.data(),
                         static_cast<int64_t>(d));
  std::vector<Vec> x(static_cast<size_t>(B));
  x[0] = Vec(row.begin(), row.end());
  for (int j = 1; j < B; ++j) x[static_cast<size_t>(j)] = T.get("mask_embd.weight");
  for (int l = 0; l < s.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    std::vector<Vec> q(static_cast<size_t>(B)), k = K[static_cast<size_t>(l)], v = V[static_cast<size_t>(l)];
    for (int j = 0; j < B; ++j) {
      const Vec h = rms(x[static_cast<size_t>(j)], T.get(b + "attn_norm.weight"), 0, d);
      q[static_cast<size_t>(j)] = mul(T.get(b + "attn_q.weight"), h);
      heads_norm_rope(q[static_cast<size_t>(j)], hd, T.get(b + "attn_q_norm.weight"), s.rope, n + j);
      Vec kb = mul(T.get(b + "attn_k.weight"), h);
      heads_norm_rope(kb, hd, T.get(b + "attn_k_norm.weight"), s.rope, n + j);
      k.push_back(kb);
      v.push_back(mul(T.get(b + "attn_v.weight"), h));
    }
    for (int j = 0; j < B; ++j) {
      Vec o(static_cast<size_t>(s.heads * hd), 0.0);
      for (int hh = 0; hh < s.heads; ++hh) {
        const int g = hh / (s.heads / s.kv_heads);
        Vec sc(k.size());
        double mx = -1e300;
        for (size_t p = 0; p < k.size(); ++p) {
          double dot = 0;
          for (int i = 0; i < hd; ++i)
            dot += q[static_cast<size_t>(j)][static_cast<size_t>(hh * hd + i)] * k[p][static_cast<size_t>(g * hd + i)];
          sc[p] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, sc[p]);
        }
        double z = 0;
        for (double& e : sc) z += (e = std::exp(e - mx));
        for (size_t p = 0; p < k.size(); ++p)
          for (int i = 0; i < hd; ++i)
            o[static_cast<size_t>(hh * hd + i)] += sc[p] / z * v[p][static_cast<size_t>(g * hd + i)];
      }
      const Vec a = mul(T.get(b + "attn_output.weight"), o);
      for (size_t i = 0; i < d; ++i) x[static_cast<size_t>(j)][i] += a[i];
    }
    for (int j = 0; j < B; ++j) {
      const Vec h = rms(x[static_cast<size_t>(j)], T.get(b + "ffn_norm.weight"), 0, d);
      const Vec g = mul(T.get(b + "ffn_gate.weight"), h), u = mul(T.get(b + "ffn_up.weight"), h);
      Vec act(g.size());
      for (size_t i = 0; i < g.size(); ++i) act[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      const Vec y = mul(T.get(b + "ffn_down.weight"), act);
      for (size_t i = 0; i < d; ++i) x[static_cast<size_t>(j)][i] += y[i];
    }
  }
  std::vector<Vec> out;
  const int64_t vocab = target.config().n_vocab;
  for (int j = 1; j < B; ++j) {
    const Vec h = rms(x[static_cast<size_t>(j)], T.get("output_norm.weight"), 0, d);
    Vec lg(static_cast<size_t>(vocab));
    for (int64_t r = 0; r < vocab; ++r) {
      strata::dequantize_row(tw.output.type, tw.output.data + static_cast<size_t>(r) * tw.output.row_stride, row.data(),
                             static_cast<int64_t>(d));
      double acc = 0;
      for (size_t i = 0; i < d; ++i) acc += row[i] * h[i];
      lg[static_cast<size_t>(r)] = acc;
    }
    out.push_back(lg);
  }
  return out;
}

std::vector<float> random_taps(int n, size_t width, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> t(static_cast<size_t>(n) * width);
  for (float& x : t) x = nd(rng);
  return t;
}

TEST(DFlash, ForwardMatchesTheFloat64Reference) {
  auto target = strata::Model::load(kModel);
  const Shape s;
  const std::string path = write_drafter(*target, s, "d.gguf");
  const auto m = DFlashModel::load(path, *target);
  EXPECT_EQ(m->config().block, s.block);
  const size_t width = s.taps.size() * static_cast<size_t>(target->config().n_embd);
  const int n = 7;
  const std::vector<float> taps = random_taps(n, width, 5);
  DFlashState st(*m);
  st.add_context(taps.data(), n);
  const size_t V = static_cast<size_t>(target->config().n_vocab);
  std::vector<float> got(static_cast<size_t>(s.block - 1) * V);
  st.draft(42, got.data());
  const auto want = reference(*target, path, s, taps, n, 42);
  for (int j = 0; j < s.block - 1; ++j) {
    double scale = 0, err = 0;
    for (size_t i = 0; i < V; ++i) {
      scale = std::max(scale, std::fabs(want[static_cast<size_t>(j)][i]));
      err = std::max(err, std::fabs(got[static_cast<size_t>(j) * V + i] - want[static_cast<size_t>(j)][i]));
    }
    EXPECT_LT(err, 1e-4 * scale) << "block row " << j + 1 << ": max error " << err << " of " << scale;
  }
}

TEST(DFlash, ContextInPiecesAndAfterATruncation) {
  auto target = strata::Model::load(kModel);
  const Shape s;
  const auto m = DFlashModel::load(write_drafter(*target, s, "p.gguf"), *target);
  const size_t width = s.taps.size() * static_cast<size_t>(target->config().n_embd);
  const size_t V = static_cast<size_t>(target->config().n_vocab), rows = static_cast<size_t>(s.block - 1) * V;
  const std::vector<float> taps = random_taps(9, width, 11), other = random_taps(3, width, 12);
  DFlashState whole(*m), pieces(*m);
  whole.add_context(taps.data(), 9);
  pieces.add_context(taps.data(), 4);
  pieces.add_context(other.data(), 3);  // rows 4..6 replaced below
  pieces.truncate(4);
  pieces.add_context(taps.data() + 4 * width, 5);
  ASSERT_EQ(pieces.n_ctx(), 9);
  std::vector<float> a(rows), b(rows);
  whole.draft(7, a.data());
  pieces.draft(7, b.data());
  for (size_t i = 0; i < rows; ++i) ASSERT_NEAR(a[i], b[i], 1e-4f * (1.0f + std::fabs(a[i]))) << i;
  EXPECT_THROW(pieces.truncate(10), strata::Error);
  EXPECT_THROW(pieces.draft(static_cast<int32_t>(V), a.data()), strata::Error);
}

// With a context window W the block sees the last W context rows only: what a state holding just those
// rows, at the same positions, drafts.
TEST(DFlash, ContextWindowSeesTheLastRows) {
  auto target = strata::Model::load(kModel);
  Shape s;
  s.context = 5;
  const auto m = DFlashModel::load(write_drafter(*target, s, "w.gguf"), *target);
  EXPECT_EQ(m->config().context, 5);
  const size_t width = s.taps.size() * static_cast<size_t>(target->config().n_embd);
  const size_t V = static_cast<size_t>(target->config().n_vocab), rows = static_cast<size_t>(s.block - 1) * V;
  const std::vector<float> taps = random_taps(12, width, 21);
  DFlashState all(*m), last(*m);
  all.add_context(taps.data(), 12);
  last.restart(7);
  last.add_context(taps.data() + 7 * width, 5);
  ASSERT_EQ(last.end(), all.end());
  std::vector<float> a(rows), b(rows);
  all.draft(9, a.data());
  last.draft(9, b.data());
  for (size_t i = 0; i < rows; ++i) ASSERT_NEAR(a[i], b[i], 1e-4f * (1.0f + std::fabs(a[i]))) << i;
  // And differs from a drafter that sees everything (the window matters).
  s.context = 0;
  const auto full = DFlashModel::load(write_drafter(*target, s, "w0.gguf"), *target);
  DFlashState f(*full);
  f.add_context(taps.data(), 12);
  f.draft(9, b.data());
  double diff = 0;
  for (size_t i = 0; i < rows; ++i) diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
  EXPECT_GT(diff, 1e-3);
}

TEST(DFlash, FilesThatDoNotFitTheTargetFail) {
  auto target = strata::Model::load(kModel);
  Shape s;
  auto message = [&](const std::string& path) {
    try {
      DFlashModel::load(path, *target);
    } catch (const strata::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(write_drafter(*target, s, "v.gguf", 100)).find("vocabulary 100"), std::string::npos);
  s.taps = {1, target->config().n_layer};
  EXPECT_NE(message(write_drafter(*target, s, "t.gguf")).find("target layer"), std::string::npos);
  s = Shape();
  s.block = 1;
  EXPECT_NE(message(write_drafter(*target, s, "b.gguf")).find("block size 1"), std::string::npos);
  EXPECT_NE(message(kModel).find("is not a DFlash drafter"), std::string::npos);
}

// Greedy, every end-of-generation token banned, so runs have their full length.
strata::spec_test::Case greedy_case(const strata::spec_test::Loaded& t, const std::string& prompt, int n_new,
                                    int draft_max) {
  strata::spec_test::Case c;
  c.prompt = t.tokenizer->encode(prompt);
  c.n_new = n_new;
  c.draft_max = draft_max;
  c.sampling = strata::spec_test::greedy_no_end(*t.tokenizer, static_cast<int32_t>(t.model->config().n_vocab));
  return c;
}

strata::spec_test::MakeSequence cpu_sequences(const strata::Model& m) {
  return [&m](int ctx) -> std::unique_ptr<strata::Sequence> { return std::make_unique<strata::Session>(m, ctx); };
}

// Greedy generation with the drafter gives what generation without it gives on the bundled model (the
// drafter's weights are random: verification rejects most of its tree and keeps the target's token each
// step). Its drafts are deterministic trees, which the generation loop verifies for sampling as for any
// drafter's trees.
TEST(DFlash, DrafterIsLossless) {
  const strata::spec_test::Loaded t = strata::spec_test::load(kModel);
  const auto model =
      std::shared_ptr<const DFlashModel>(DFlashModel::load(write_drafter(*t.model, Shape(), "l.gguf"), *t.model));
  const int32_t V = static_cast<int32_t>(t.model->config().n_vocab);
  const strata::spec_test::Case c = greedy_case(t, "def fibonacci(n):\n    if n < 2:\n        return n\n", 24, 10);
  const strata::spec_test::MakeSequence make = cpu_sequences(*t.model);
  // k 1: trees of one candidate per position, which verification takes as chains.
  for (int k : {3, 1}) {
    SCOPED_TRACE(k);
    const auto drafter = [&]() -> std::unique_ptr<strata::Drafter> {
      return std::make_unique<strata::DFlashDrafter>(model, V, k, 4096);
    };
    const strata::GenerationStats g =
        strata::spec_test::expect_lossless(make, *t.tokenizer, c, drafter, true, "greedy, k " + std::to_string(k));
    EXPECT_GT(g.spec_steps, 0);
    EXPECT_GT(g.drafted_tokens, g.spec_steps);  // several tokens a step
  }
}

// The bundled drafter (models/strata-tiny.dflash.gguf, trained on the model's own picks) under plain
// greedy sampling: its trees are verified by picks and largely accepted, and the output is the plain run's.
TEST(DFlash, TrainedDrafterTreesAreLossless) {
  const strata::spec_test::Loaded t = strata::spec_test::load(kModel);
  const auto model = std::shared_ptr<const DFlashModel>(DFlashModel::load(strata::dflash_path_for(kModel), *t.model));
  const int32_t V = static_cast<int32_t>(t.model->config().n_vocab);
  strata::spec_test::Case c;
  c.prompt = t.tokenizer->encode("def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n");
  c.n_new = 40;
  c.sampling.temperature = 0;
  c.draft_max = 3;
  for (int k : {4, 2}) {
    SCOPED_TRACE(k);
    const strata::GenerationStats g = strata::spec_test::expect_lossless(
        cpu_sequences(*t.model), *t.tokenizer, c,
        [&]() -> std::unique_ptr<strata::Drafter> { return std::make_unique<strata::DFlashDrafter>(model, V, k, 4096); },
        true, "trained drafter, k " + std::to_string(k));
    EXPECT_GT(g.accepted_tokens * 4, g.drafted_tokens) << "a trained drafter's trees are mostly accepted at depth 1";
  }
}

// The drafter's context after a generation (taps added step by step as tokens are kept) drafts what a
// context built at once from a plain run's taps drafts.
TEST(DFlash, ContextFollowsTheKeptTokens) {
  const strata::spec_test::Loaded t = strata::spec_test::load(kModel);
  const Shape s;
  const auto model =
      std::shared_ptr<const DFlashModel>(DFlashModel::load(write_drafter(*t.model, s, "c.gguf"), *t.model));
  const int32_t V = static_cast<int32_t>(t.model->config().n_vocab);
  const strata::spec_test::Case c = greedy_case(t, "import os\nimport sys\n", 16, 6);
  strata::DFlashDrafter drafter(model, V, 2, 4096);
  const strata::spec_test::Outcome o =
      strata::spec_test::generate_case(cpu_sequences(*t.model), *t.tokenizer, c, &drafter);
  const int n_ctx = drafter.head().end();
  ASSERT_GT(n_ctx, static_cast<int>(c.prompt.size()));
  // The same tokens through a plain session recording the same taps.
  std::vector<int32_t> all = c.prompt;
  all.insert(all.end(), o.result.tokens.begin(), o.result.tokens.end());
  ASSERT_GE(static_cast<int>(all.size()), n_ctx + 1);
  strata::Session plain(*t.model, n_ctx + 1);
  auto rec = std::make_shared<strata::HiddenRecord>();
  rec->layers = model->config().target_layers;
  plain.set_hidden_record(rec);
  plain.forward(all.data(), n_ctx, nullptr, false);
  DFlashState fresh(*model);
  fresh.add_context(rec->row(0), n_ctx);
  const size_t rows = static_cast<size_t>(s.block - 1) * static_cast<size_t>(V);
  std::vector<float> a(rows), b(rows);
  drafter.head().logits(all[static_cast<size_t>(n_ctx)], a.data());
  fresh.draft(all[static_cast<size_t>(n_ctx)], b.data());
  for (size_t i = 0; i < rows; ++i) ASSERT_NEAR(a[i], b[i], 1e-3f * (1.0f + std::fabs(b[i]))) << i;
}

TEST(DFlash, CommandLine) {
  auto target = strata::Model::load(kModel);
  const std::string path = write_drafter(*target, Shape(), "cli.gguf");
  const auto spec = strata::testing_cli::expect_spec_run_lossless(
      "\"def add(a, b):\" --temp 0 -n 16 -t 1", "--spec dflash:" + path + " --draft-max 8 --spec-tree-k 2");
  EXPECT_NE(spec.err.find("spec dflash:"), std::string::npos) << spec.err;
  // --spec dflash alone: the model's own drafter, FILE.dflash.gguf next to FILE.gguf.
  EXPECT_EQ(strata::dflash_path_for("/m/strata-tiny.gguf"), "/m/strata-tiny.dflash.gguf");
  EXPECT_EQ(strata::dflash_path_for("model"), "model.dflash.gguf");
  const std::string dir = std::filesystem::path(path).parent_path().string();
  std::filesystem::copy_file(kModel, dir + "/own.gguf", std::filesystem::copy_options::overwrite_existing);
  auto r = strata::testing_cli::run_cli("run -m " + dir + "/own.gguf x -n 2 --spec dflash");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no drafter next to the model (" + dir + "/own.dflash.gguf)"), std::string::npos) << r.err;
  std::filesystem::copy_file(path, dir + "/own.dflash.gguf", std::filesystem::copy_options::overwrite_existing);
  r = strata::testing_cli::run_cli("run -m " + dir + "/own.gguf \"def f(x):\" --temp 0 -n 8 --spec dflash");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("spec dflash:"), std::string::npos) << r.err;
  r = strata::testing_cli::run_cli("run x --spec dflash:");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--spec dflash:FILE needs a file name"), std::string::npos) << r.err;
  r = strata::testing_cli::run_cli("run x --spec dflash:" + path + " --spec-tree-k 0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--spec-tree-k must be >= 1"), std::string::npos) << r.err;
  r = strata::testing_cli::run_cli("run x --spec dflash:" + kModel);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("is not a DFlash drafter"), std::string::npos) << r.err;
}

}  // namespace
