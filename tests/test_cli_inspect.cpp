// `strata inspect` end to end: a small MoE-shaped GGUF shows its expert/non-expert byte split (in
// text and JSON), and a truncated copy fails with one line on stderr and a non-zero exit.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "gguf_test_util.h"
#include "strata/base/error.h"
#include "strata/gguf/writer.h"

using namespace strata;
using strata::testing_cli::RunResult;
using strata::testing_cli::run_cli;

namespace {

// Byte sizes from the block geometry of the public spec, computed here rather than by strata:
// q8_0 blocks are 34 bytes per 32 weights, q4_0 18 bytes per 32, f32 4 bytes per weight.
constexpr uint64_t kNEmbd = 64, kNFf = 32, kNExpert = 4, kVocab = 10;
constexpr uint64_t kGateUpBytes = (kNEmbd / 32) * 34 * kNFf * kNExpert;  // q8_0 [64, 32, 4]
constexpr uint64_t kDownBytes = (kNFf / 32) * 18 * kNEmbd * kNExpert;    // q4_0 [32, 64, 4]
constexpr uint64_t kExpertPerLayer = 2 * kGateUpBytes + kDownBytes;
constexpr uint64_t kAttnBytes = kNEmbd * kNEmbd * 4;                    // f32 [64, 64]
constexpr uint64_t kNormBytes = kNEmbd * 4;
constexpr uint64_t kEmbdBytes = kNEmbd * kVocab * 4;

std::string write_model(const std::string& name) {
  GgufWriter w;
  w.set("general.architecture", GgufValue::str("qwen3moe"));
  w.set("general.name", GgufValue::str("inspect-test"));
  w.set("qwen3moe.block_count", GgufValue::u32(2));
  w.set("qwen3moe.expert_count", GgufValue::u32(kNExpert));
  w.set("qwen3moe.expert_used_count", GgufValue::u32(2));
  w.set("qwen3moe.rope.freq_base", GgufValue::f32(1000000.0f));
  w.set("tokenizer.ggml.model", GgufValue::str("gpt2"));
  w.set("tokenizer.ggml.pre", GgufValue::str("qwen2"));
  std::vector<std::string> tokens;
  for (uint64_t i = 0; i < kVocab; ++i) tokens.push_back(cat("t", i));
  w.set("tokenizer.ggml.tokens", GgufValue::string_array(tokens));
  w.set("tokenizer.ggml.merges", GgufValue::string_array({"t 0", "t 1", "t 2"}));
  w.set("tokenizer.ggml.token_type", GgufValue::i32_array(std::vector<int32_t>(kVocab, 1)));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(1));
  w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(2));
  w.set("tokenizer.chat_template", GgufValue::str("{% for m in messages %}{{ m.content }}{% endfor %}"));
  auto zeros = [](uint8_t* p, size_t n) { std::fill(p, p + n, uint8_t{0}); };
  const int64_t e = kNEmbd, f = kNFf, x = kNExpert;
  w.add_tensor("token_embd.weight", GgmlType::F32, {e, static_cast<int64_t>(kVocab)}, zeros);
  for (int l = 0; l < 2; ++l) {
    const std::string p = cat("blk.", l, ".");
    w.add_tensor(p + "attn_norm.weight", GgmlType::F32, {e}, zeros);
    w.add_tensor(p + "attn_q.weight", GgmlType::F32, {e, e}, zeros);
    w.add_tensor(p + "ffn_gate_exps.weight", GgmlType::Q8_0, {e, f, x}, zeros);
    w.add_tensor(p + "ffn_up_exps.weight", GgmlType::Q8_0, {e, f, x}, zeros);
    w.add_tensor(p + "ffn_down_exps.weight", GgmlType::Q4_0, {f, e, x}, zeros);
  }
  w.add_tensor("output_norm.weight", GgmlType::F32, {e}, zeros);
  const std::string path = cat(testing::TempDir(), "/strata_inspect_", ::getpid(), "_", name);
  w.write(path);
  return path;
}

}  // namespace

TEST(CliInspect, ShowsTablesAndTheExpertSplit) {
  const std::string path = write_model("ok.gguf");
  const RunResult r = run_cli("inspect " + path);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const std::string& o = r.out;
  for (const std::string& s : {std::string("qwen3moe"), std::string("qwen3moe.expert_count"),
                               std::string("gpt2"), std::string("qwen2"), std::string("general.name"),
                               std::string("blk.1.ffn_down_exps.weight"), std::string("q8_0"),
                               std::string("[64, 32, 4]"), std::string("routed experts"),
                               std::string("everything else"), std::to_string(kExpertPerLayer),
                               std::to_string(2 * kExpertPerLayer), std::to_string(kExpertPerLayer / kNExpert)}) {
    EXPECT_NE(o.find(s), std::string::npos) << "inspect output lacks '" << s << "':\n" << o;
  }
  // Huge arrays are summarised, never dumped: a token string must not appear.
  EXPECT_EQ(o.find("\"t7\""), std::string::npos);
  std::remove(path.c_str());
}

TEST(CliInspect, JsonHasTheSameFacts) {
  const std::string path = write_model("json.gguf");
  const RunResult r = run_cli("inspect --json " + path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["architecture"], "qwen3moe");
  EXPECT_EQ(j["version"], 3);
  EXPECT_EQ(j["hyperparameters"]["qwen3moe.expert_count"], kNExpert);
  EXPECT_EQ(j["tokenizer"]["vocab_size"], kVocab);
  EXPECT_EQ(j["tokenizer"]["merges"], 3);
  EXPECT_EQ(j["tokenizer"]["bos_token_id"], 1);
  EXPECT_EQ(j["tokenizer"]["eos_token_id"], 2);
  EXPECT_EQ(j["tokenizer"]["has_chat_template"], true);
  ASSERT_EQ(j["tensors"].size(), 12u);
  ASSERT_EQ(j["layers"].size(), 2u);
  for (int l = 0; l < 2; ++l) {
    EXPECT_EQ(j["layers"][l]["layer"], l);
    EXPECT_EQ(j["layers"][l]["expert_bytes"], kExpertPerLayer);
    EXPECT_EQ(j["layers"][l]["other_bytes"], kAttnBytes + kNormBytes);
    EXPECT_EQ(j["layers"][l]["n_expert"], kNExpert);
    EXPECT_EQ(j["layers"][l]["bytes_per_expert"], kExpertPerLayer / kNExpert);
  }
  EXPECT_EQ(j["totals"]["expert_bytes"], 2 * kExpertPerLayer);
  EXPECT_EQ(j["totals"]["non_layer_bytes"], kEmbdBytes + kNormBytes);
  EXPECT_EQ(j["totals"]["other_bytes"], 2 * (kAttnBytes + kNormBytes) + kEmbdBytes + kNormBytes);
  std::remove(path.c_str());
}

TEST(CliInspect, TruncatedFileGivesOneLineErrorAndNonZeroExit) {
  const std::string path = write_model("full.gguf");
  auto bytes = strata_test::read_file(path);
  const std::string cut = path + ".truncated";
  bytes.resize(bytes.size() / 2);
  strata_test::write_file(cut, bytes);
  for (const std::string& args : {"inspect " + cut, "inspect --json " + cut}) {
    const RunResult r = run_cli(args);
    EXPECT_NE(r.exit_code, 0);
    ASSERT_FALSE(r.err.empty());
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "expected exactly one line:\n" << r.err;
    EXPECT_EQ(r.err.rfind("strata: error: " + cut + ": offset ", 0), 0u) << r.err;
    EXPECT_EQ(r.out, "");
  }
  std::remove(path.c_str());
  std::remove(cut.c_str());
}
