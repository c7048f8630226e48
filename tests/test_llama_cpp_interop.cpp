// strata's synth files against llama.cpp (issue 7: "loadable by strata and by llama.cpp"). The
// independent implementation is the prebuilt CPU build of llama.cpp that the node-llama-cpp npm package
// ships (scripts/fetch-test-node-deps installs a pinned version into build-data/node;
// tests/interop/llama_cpp_greedy.mjs drives it). Each test writes a file with `strata synth`, lets
// both engines continue the same token-id prompt greedily, and compares.
// - F32 weights: both engines compute in float, so the continuations must be equal token for token.
//   That checks the qwen3moe, qwen35moe and laguna forward passes (attention, sliding-window attention,
//   gated DeltaNet, routing, norms)
//   and the file's names and metadata against an implementation we did not write.
// - Q4_K_M weights at real shapes: the engines quantise activations differently (llama.cpp to blocks
//   of 256, strata to blocks of 32), and a random-weight model's next-token distribution is flat, so a
//   near-tie may break either way after a few tokens. These files must load and generate in llama.cpp;
//   how many leading tokens agree is printed, not asserted.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.h"

namespace {

using strata::testing_cli::run_cli;
using strata::testing_cli::run_shell;

const std::string kSource = STRATA_SOURCE_DIR;
const std::string kNodeModules = kSource + "/build-data/node/node_modules";
// A prompt of token ids below 256 (inside every preset's vocabulary, tiny ones included).
const std::string kPrompt = "100,101,102,32,102,105,98,200,97,99,99,105,40,110,41,58";

std::vector<int> parse_ids(const std::string& text) {
  std::vector<int> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.find_first_not_of(" \n\r") == std::string::npos) continue;
    ids.push_back(std::stoi(item));
  }
  return ids;
}

// The last non-empty line of s.
std::string last_line(const std::string& s) {
  std::string line, last;
  std::stringstream ss(s);
  while (std::getline(ss, line))
    if (!line.empty()) last = line;
  return last;
}

std::string synth(const std::string& preset, const std::string& quant, const std::string& extra) {
  // The process id keeps test runs of several checkouts on one machine apart.
  const std::string path =
      ::testing::TempDir() + "/interop-" + std::to_string(::getpid()) + "-" + preset + "-" + quant + ".gguf";
  const auto r = run_cli("synth --preset " + preset + " --quant " + quant + " --skew zipf:1 " + extra + " -o '" + path + "'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return path;
}

std::vector<int> llama_cpp_greedy(const std::string& model, int n) {
  const auto r = run_shell("STRATA_NODE_MODULES='" + kNodeModules + "' node '" + kSource +
                           "/tests/interop/llama_cpp_greedy.mjs' '" + model + "' " + kPrompt + " " + std::to_string(n));
  EXPECT_EQ(r.exit_code, 0) << "llama.cpp could not run " << model << ":\n" << r.out << r.err;
  const std::string line = last_line(r.out);
  if (line.rfind("tokens: ", 0) != 0) {
    ADD_FAILURE() << "no tokens from llama.cpp:\n" << r.out << r.err;
    return {};
  }
  return parse_ids(line.substr(8));
}

std::vector<int> strata_greedy(const std::string& model, int n) {
  const auto r = run_cli("run -m '" + model + "' --prompt-tokens " + kPrompt + " -n " + std::to_string(n) +
                         " --temp 0 --print-token-ids --no-stats -ctk f32 -ctv f32");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return parse_ids(last_line(r.out));
}

class LlamaCppInterop : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(kNodeModules + "/node-llama-cpp/dist/index.js"))
        << "run scripts/fetch-test-node-deps";
  }
};

TEST_F(LlamaCppInterop, F32GreedyContinuationsEqualLlamaCpp) {
  // tiny-laguna: sliding-window layers (window 4, so the 48 positions slide), per-layer head counts, the
  // softplus gate, the sigmoid router and a dense first layer.
  // tiny-laguna-yarn: the same with YaRN rotary scaling on the full-attention layers.
  for (const char* preset : {"tiny-qwen3moe", "tiny-qwen35moe", "tiny-laguna", "tiny-laguna-yarn"}) {
    SCOPED_TRACE(preset);
    const std::string path = synth(preset, "f32", "");
    const int n = 32;
    const std::vector<int> ref = llama_cpp_greedy(path, n);
    const std::vector<int> got = strata_greedy(path, n);
    ASSERT_EQ(ref.size(), static_cast<size_t>(n));
    EXPECT_EQ(got, ref);
    std::remove(path.c_str());
  }
}

TEST_F(LlamaCppInterop, RealShapeQ4KMFilesLoadAndGenerateInLlamaCpp) {
  struct Case {
    const char* preset;
    int layers;  // enough to hold a full-attention layer (llama.cpp needs one for its KV cache)
  };
  for (const Case& c : {Case{"qwen3.6-35b-a3b", 4}, Case{"qwen3-30b-a3b", 2}, Case{"laguna-xs.2", 2}}) {
    SCOPED_TRACE(c.preset);
    const std::string path = synth(c.preset, "q4_k_m", "--layers " + std::to_string(c.layers));
    const int n = 4;
    const std::vector<int> ref = llama_cpp_greedy(path, n);
    const std::vector<int> got = strata_greedy(path, n);
    ASSERT_EQ(ref.size(), static_cast<size_t>(n));
    ASSERT_EQ(got.size(), static_cast<size_t>(n));
    size_t agree = 0;
    while (agree < ref.size() && ref[agree] == got[agree]) ++agree;
    std::printf("[interop] %s Q4_K_M, %d layers: the first %zu of %d greedy tokens agree with llama.cpp\n", c.preset,
                c.layers, agree, n);
    std::remove(path.c_str());
  }
}

}  // namespace
