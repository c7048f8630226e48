// The engine against Hugging Face transformers: fixtures made by tools/make_fixtures.py on the GPU
// machine (tiny random-weight qwen3_moe / qwen3_5_moe checkpoints in float32, the HF logits of a
// prompt and HF's 16-token greedy continuation). Each checkpoint is converted with our converter,
// then run by our engine.
//
// Relative error of a logits row: max_i |ours_i - hf_i| / max_i |hf_i|; the tests bound its maximum
// over all prompt positions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "strata/base/error.h"
#include "strata/convert/converter.h"
#include "strata/engine/cli_support.h"
#include "strata/engine/model.h"
#include "strata/engine/session.h"
#include "strata/gguf/gguf.h"
#include "strata/gguf/writer.h"
#include "strata/quant/quantize.h"

namespace {

namespace fs = std::filesystem;

struct Fixture {
  fs::path dir;
  std::vector<int32_t> prompt;
  std::vector<int32_t> greedy;
  std::vector<float> logits;  // [n_prompt x vocab]
};

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw strata::Error("cannot read " + p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

std::vector<float> read_floats(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw strata::Error("cannot read " + p.string());
  const auto n = fs::file_size(p) / sizeof(float);
  std::vector<float> v(n);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(float)));
  return v;
}

fs::path fixture_path(const std::string& name) {
  // STRATA_HF_FIXTURES overrides the fixture root (to try fixtures before they are committed).
  const char* root = std::getenv("STRATA_HF_FIXTURES");
  return (root ? fs::path(root) : fs::path(STRATA_SOURCE_DIR) / "tests" / "fixtures" / "hf") / name;
}

// Fixtures the GPU machine has not produced yet (laguna, the qwen3_5 interval-2 variant) are skipped,
// naming the command that makes them; once the directory exists a missing file is a failure.
#define SKIP_UNTIL_GENERATED(name)                                                                   \
  if (!fs::exists(fixture_path(name)))                                                               \
  GTEST_SKIP() << "HF fixture " << fixture_path(name).string() << " not generated yet (run "         \
               << "tools/make_fixtures.py --out tests/fixtures/hf --only " << (name) << " on the GPU machine)"

// Loads a fixture; a missing fixture is a failure (not a skip) so the gap is visible.
bool load_fixture(const std::string& name, Fixture& fx) {
  fx.dir = fixture_path(name);
  for (const char* f : {"config.json", "model.safetensors", "tokens.txt", "logits.bin", "greedy.txt"}) {
    if (!fs::exists(fx.dir / f)) {
      ADD_FAILURE() << "HF fixture file missing: " << (fx.dir / f).string()
                    << " (generate it with tools/make_fixtures.py on the GPU machine)";
      return false;
    }
  }
  fx.prompt = strata::parse_token_list(read_text(fx.dir / "tokens.txt"), "tokens.txt");
  fx.greedy = strata::parse_token_list(read_text(fx.dir / "greedy.txt"), "greedy.txt");
  fx.logits = read_floats(fx.dir / "logits.bin");
  return true;
}

std::string convert(const Fixture& fx, const std::string& name, const std::string& type) {
  const fs::path out_dir = fs::path(STRATA_BINARY_DIR) / "test_tmp";
  fs::create_directories(out_dir);
  const std::string out = (out_dir / (name + "_" + type + ".gguf")).string();
  strata::convert::ConvertOptions opt;
  opt.hf_dir = fx.dir.string();
  opt.out_path = out;
  opt.type = type;
  strata::convert::convert_hf_to_gguf(opt);
  return out;
}

struct Comparison {
  double max_rel_err = 0;       // max over positions of max|a-b| / max|b| (strict, used for f32)
  double frob_rel_err = 0;      // ||a-b|| / ||b|| over the whole [n_tok x vocab] matrix
  double top1_agreement = 0;    // over every position
  double top1_decisive = 0;     // over positions where HF's top-1 leads top-2 by >= 1% of max|logit|
  size_t n_decisive = 0;
};

Comparison compare_logits(const std::vector<float>& ours, const std::vector<float>& ref, size_t n_tok, size_t vocab) {
  Comparison c;
  size_t agree = 0, agree_decisive = 0;
  double diff2 = 0, ref2 = 0;
  for (size_t t = 0; t < n_tok; ++t) {
    const float* a = ours.data() + t * vocab;
    const float* b = ref.data() + t * vocab;
    double num = 0, den = 0;
    for (size_t i = 0; i < vocab; ++i) {
      num = std::max(num, double(std::fabs(a[i] - b[i])));
      den = std::max(den, double(std::fabs(b[i])));
      diff2 += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
      ref2 += double(b[i]) * b[i];
    }
    c.max_rel_err = std::max(c.max_rel_err, num / den);
    const int64_t best = strata::argmax(b, static_cast<int64_t>(vocab));
    double second = -1e300;
    for (size_t i = 0; i < vocab; ++i)
      if (static_cast<int64_t>(i) != best) second = std::max(second, double(b[i]));
    const bool same = strata::argmax(a, static_cast<int64_t>(vocab)) == best;
    agree += same;
    // A random-weight fixture has positions whose two best logits nearly tie; there any weight
    // error flips the pick, so the top-1 statistic is taken where the reference is decisive.
    if (double(b[best]) - second >= 0.01 * den) {
      ++c.n_decisive;
      agree_decisive += same;
    }
  }
  c.frob_rel_err = std::sqrt(diff2 / ref2);
  c.top1_agreement = double(agree) / double(n_tok);
  c.top1_decisive = c.n_decisive ? double(agree_decisive) / double(c.n_decisive) : 0.0;
  return c;
}

std::vector<float> engine_logits(const std::string& gguf, const std::vector<int32_t>& prompt, int64_t& vocab) {
  auto model = strata::Model::load(gguf);
  vocab = model->config().n_vocab;
  strata::Session s(*model, static_cast<int>(prompt.size()));
  std::vector<float> logits(prompt.size() * static_cast<size_t>(vocab));
  s.forward(prompt.data(), static_cast<int>(prompt.size()), logits.data(), true);
  return logits;
}

std::string run_command(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw strata::Error("cannot run " + cmd);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  if (rc != 0) throw strata::Error("command failed (" + std::to_string(rc) + "): " + cmd + "\n" + out);
  return out;
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::ostringstream s;
  for (size_t i = 0; i < ids.size(); ++i) s << (i ? "," : "") << ids[i];
  return s.str();
}

void check_f32(const std::string& name) {
  Fixture fx;
  if (!load_fixture(name, fx)) return;
  const std::string gguf = convert(fx, name, "f32");
  int64_t vocab = 0;
  const std::vector<float> ours = engine_logits(gguf, fx.prompt, vocab);
  ASSERT_EQ(fx.logits.size(), fx.prompt.size() * static_cast<size_t>(vocab)) << "logits.bin size vs vocab";
  const Comparison c = compare_logits(ours, fx.logits, fx.prompt.size(), static_cast<size_t>(vocab));
  std::printf("%s f32: max relative error %.3g, top-1 agreement %.3f\n", name.c_str(), c.max_rel_err, c.top1_agreement);
  EXPECT_LE(c.max_rel_err, 1e-4);

  // Greedy continuation through the library...
  auto model = strata::Model::load(gguf);
  strata::Session s(*model, static_cast<int>(fx.prompt.size() + fx.greedy.size()));
  EXPECT_EQ(strata::generate_greedy(s, fx.prompt, static_cast<int>(fx.greedy.size())), fx.greedy);

  // ...and through the two CLI commands other tests rely on.
  const std::string run_out = run_command(std::string(STRATA_CLI) + " run -m " + gguf + " -ctk f32 -ctv f32 --prompt-tokens " +
                                          join_ids(fx.prompt) + " -n " + std::to_string(fx.greedy.size()) +
                                          " --temp 0 --print-token-ids");
  EXPECT_EQ(run_out, join_ids(fx.greedy) + "\n");
  const std::string bin = (fs::path(STRATA_BINARY_DIR) / "test_tmp" / (name + "_cli_logits.bin")).string();
  run_command(std::string(STRATA_CLI) + " logits -m " + gguf + " -ctk f32 -ctv f32 --tokens " + join_ids(fx.prompt) + " --out " + bin);
  const std::vector<float> cli = read_floats(bin);
  ASSERT_EQ(cli.size(), fx.logits.size());
  EXPECT_LE(compare_logits(cli, fx.logits, fx.prompt.size(), static_cast<size_t>(vocab)).max_rel_err, 1e-4);
}

// Writes a copy of a GGUF file with every tensor decoded to F32 (metadata kept).
std::string dequantized_copy(const std::string& path) {
  const strata::GgufFile f = strata::GgufFile::open(path);
  strata::GgufWriter w;
  for (const auto& [key, value] : f.metadata()) w.set(key, value);
  std::vector<std::vector<float>> keep;
  for (const auto& t : f.tensors()) {
    std::vector<float> v(static_cast<size_t>(t.n_elements()));
    for (int64_t r = 0; r < t.n_rows(); ++r)
      strata::dequantize_row(t.type, t.data + static_cast<size_t>(r) * t.row_nbytes(), v.data() + r * t.ne[0], t.ne[0]);
    std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
    w.add_tensor(t.name, strata::GgmlType::F32, ne, v.data(), v.size() * sizeof(float));
  }
  const std::string out = path + ".dequantized.gguf";
  w.write(out);
  return out;
}

void check_q8_0(const std::string& name) {
  Fixture fx;
  if (!load_fixture(name, fx)) return;
  const std::string gguf = convert(fx, name, "q8_0");
  int64_t vocab = 0;
  const std::vector<float> ours = engine_logits(gguf, fx.prompt, vocab);
  ASSERT_EQ(fx.logits.size(), fx.prompt.size() * static_cast<size_t>(vocab));
  const Comparison c = compare_logits(ours, fx.logits, fx.prompt.size(), static_cast<size_t>(vocab));
  std::printf(
      "%s q8_0: relative error %.3g (whole matrix; worst row %.3g), top-1 agreement %.3f "
      "(%.3f over %zu of %zu positions where HF is decisive)\n",
      name.c_str(), c.frob_rel_err, c.max_rel_err, c.top1_agreement, c.top1_decisive, c.n_decisive, fx.prompt.size());
  // Issue 3's bounds: top-1 agreement >= 98% and relative error <= 3e-2.
  EXPECT_GE(c.n_decisive * 4, fx.prompt.size() * 3) << "fixture too indecisive to judge top-1 agreement";
  EXPECT_GE(c.top1_decisive, 0.98);
  EXPECT_LE(c.frob_rel_err, 3e-2);

  // The quantised path computes exactly what the float path computes on the dequantised weights:
  // rewrite every tensor as F32 and compare (isolates engine/kernel bugs from quantisation error).
  const std::string deq = dequantized_copy(gguf);
  int64_t vocab2 = 0;
  const std::vector<float> ref = engine_logits(deq, fx.prompt, vocab2);
  const Comparison d = compare_logits(ours, ref, fx.prompt.size(), static_cast<size_t>(vocab));
  std::printf("%s q8_0 vs its dequantised f32 copy: max relative error %.3g\n", name.c_str(), d.max_rel_err);
  // Fast kernels that quantise activations may add error of order 1e-3; anything larger is a bug.
  EXPECT_LE(d.max_rel_err, 1e-2);
}

TEST(EngineVsHf, Qwen3MoeF32) { check_f32("qwen3_moe"); }
TEST(EngineVsHf, Qwen35MoeF32) { check_f32("qwen3_5_moe"); }
TEST(EngineVsHf, Qwen3MoeQ8_0) { check_q8_0("qwen3_moe"); }
TEST(EngineVsHf, Qwen35MoeQ8_0) { check_q8_0("qwen3_5_moe"); }

// laguna: a plain shape (full attention, per-element gate) and one with sliding-window layers (window
// 4 < the prompt), per-layer head counts, soft-capping, routed scaling 2.5, a dense first layer and
// the shared expert; qwen3_5 with full attention every 2nd layer given only as layer_types.
TEST(EngineVsHf, LagunaF32) {
  SKIP_UNTIL_GENERATED("laguna");
  check_f32("laguna");
}
TEST(EngineVsHf, LagunaSlidingWindowF32) {
  SKIP_UNTIL_GENERATED("laguna_swa");
  check_f32("laguna_swa");
}
TEST(EngineVsHf, LagunaSlidingWindowQ8_0) {
  SKIP_UNTIL_GENERATED("laguna_swa");
  check_q8_0("laguna_swa");
}
TEST(EngineVsHf, Qwen35MoeInterval2FromLayerTypesF32) {
  SKIP_UNTIL_GENERATED("qwen3_5_moe_interval2");
  check_f32("qwen3_5_moe_interval2");
}

}  // namespace
