// `strata calibrate` on the bundled model with small corpora written here: the profile it writes, the
// split, and the properties its report must have (not its exact numbers, which depend on the model).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "strata/engine/model.h"
#include "strata/moe/routing_generator.h"
#include "strata/moe/routing_profile.h"
#include "process_temp_dir.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing_cli::run_cli;

const fs::path kModel = fs::path(STRATA_SOURCE_DIR) / "models" / "strata-tiny.gguf";

fs::path work_dir() { return process_temp_dir("strata_calibrate_"); }

// Python-like text of a few hundred tokens; `variant` changes the identifiers so documents differ.
std::string python_doc(int variant, int functions) {
  std::string s = cat("import os\nimport sys\n\n\nclass Thing", variant, ":\n    \"\"\"A thing.\"\"\"\n\n");
  for (int i = 0; i < functions; ++i)
    s += cat("    def method_", variant, "_", i, "(self, value, *args, **kwargs):\n", "        if value is None:\n",
             "            return self.default_", i, "\n", "        result = [x * ", i + 1, " for x in range(value)]\n",
             "        return sum(result) + len(args)\n\n");
  return s;
}

std::string write(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

nlohmann::json run_json(const std::string& args) {
  const auto r = run_cli(cat("calibrate -m ", kModel.string(), " ", args, " --json"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

TEST(CliCalibrate, WritesAProfileAndReportsConsistentRates) {
  const fs::path dir = work_dir();
  std::string corpus;
  for (int d = 0; d < 4; ++d) corpus += " --corpus " + write(dir / cat("doc", d, ".py"), python_doc(d, 6));
  const fs::path profile = dir / "profile.json";
  const nlohmann::json j =
      run_json(cat(corpus, " --holdout 0.25 --ctx 128 --budget 25,50,75 -o ", profile.string()));

  // The split: three training files, the last one held out.
  ASSERT_EQ(j["train"]["docs"].size(), 3u);
  ASSERT_EQ(j["heldout"]["docs"].size(), 1u);
  EXPECT_EQ(j["heldout"]["docs"][0], "doc3.py");

  // The profile belongs to this model and counts every training token's top-k picks in every layer.
  auto model = Model::load(kModel.string());
  const RoutingProfile p = load_profile(profile.string(), *model);
  const uint64_t train_tokens = j["train"]["tokens"].get<uint64_t>();
  EXPECT_EQ(p.counts.n_tokens, train_tokens);
  for (int l = 0; l < p.counts.n_layer; ++l)
    EXPECT_EQ(p.counts.layer_total(l), train_tokens * model->config().n_expert_used) << "layer " << l;

  ASSERT_EQ(j["budgets"].size(), 3u);
  for (const char* method : {"profile", "uniform", "by-layer", "oracle"}) {
    double previous = 1.0;
    for (const auto& b : j["budgets"]) {
      const double held = b[method]["heldout_cold_hit_rate"].get<double>();
      const double train = b[method]["train_cold_hit_rate"].get<double>();
      EXPECT_GE(held, 0.0);
      EXPECT_LE(held, 1.0);
      EXPECT_GE(train, 0.0);
      EXPECT_LE(train, 1.0);
      // A larger budget keeps every expert the smaller one had (all experts are the same size here),
      // so the cold-hit rate can only fall.
      EXPECT_LE(held, previous + 1e-12) << method << " at " << b["percent"];
      previous = held;
      EXPECT_LE(b[method]["bytes_used"].get<uint64_t>(), b["bytes"].get<uint64_t>());
    }
  }
  // On the data it was computed from, the profile's placement is optimal: no other placement within
  // the same budget has fewer cold picks. Likewise the oracle on the held-out data.
  for (const auto& b : j["budgets"]) {
    const double oracle = b["oracle"]["heldout_cold_hit_rate"].get<double>();
    for (const char* method : {"profile", "uniform", "by-layer"})
      EXPECT_LE(oracle, b[method]["heldout_cold_hit_rate"].get<double>() + 1e-12) << method << " " << b["percent"];
    const double prof = b["profile"]["train_cold_hit_rate"].get<double>();
    EXPECT_LE(prof, b["uniform"]["train_cold_hit_rate"].get<double>() + 1e-12) << b["percent"];
    EXPECT_LE(prof, b["by-layer"]["train_cold_hit_rate"].get<double>() + 1e-12) << b["percent"];
  }
}

TEST(CliCalibrate, OneFileSplitsByTokens) {
  const fs::path dir = work_dir();
  const std::string file = write(dir / "single.py", python_doc(7, 8));
  const nlohmann::json all = run_json(cat("--corpus ", file, " --holdout 0 -o ", (dir / "all.json").string()));
  const uint64_t total = all["train"]["tokens"].get<uint64_t>();
  EXPECT_EQ(all["heldout"]["tokens"].get<uint64_t>(), 0u);
  EXPECT_TRUE(all["budgets"].empty()) << "nothing held out: nothing to report";

  const nlohmann::json split = run_json(cat("--corpus ", file, " --holdout 0.25 -o ", (dir / "split.json").string()));
  const uint64_t train = split["train"]["tokens"].get<uint64_t>();
  const uint64_t held = split["heldout"]["tokens"].get<uint64_t>();
  EXPECT_EQ(train + held, total);
  EXPECT_EQ(held, static_cast<uint64_t>(std::llround(0.25 * static_cast<double>(total))));
}

TEST(CliCalibrate, TextReportAndErrors) {
  const fs::path dir = work_dir();
  const std::string a = write(dir / "a.py", python_doc(1, 2)), b = write(dir / "b.py", python_doc(2, 2));
  const auto ok = run_cli(cat("calibrate -m ", kModel.string(), " --corpus ", a, " ", b, " -o ",
                              (dir / "text.json").string(), " --budget 50"));
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("cold-hit rate"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("50%"), std::string::npos) << ok.out;
  EXPECT_NE(ok.err.find("tok/s"), std::string::npos) << "progress on stderr: " << ok.err;

  const auto missing = run_cli(cat("calibrate -m ", kModel.string(), " --corpus ", (dir / "nope.py").string(), " -o ",
                                   (dir / "x.json").string()));
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("nope.py: cannot open"), std::string::npos) << missing.err;

  const auto bad_budget = run_cli(cat("calibrate -m ", kModel.string(), " --corpus ", a, " ", b, " --budget 25,120 -o ",
                                      (dir / "x.json").string()));
  EXPECT_EQ(bad_budget.exit_code, 1);
  EXPECT_NE(bad_budget.err.find("--budget"), std::string::npos) << bad_budget.err;

  const auto bad_holdout =
      run_cli(cat("calibrate -m ", kModel.string(), " --corpus ", a, " --holdout 1 -o ", (dir / "x.json").string()));
  EXPECT_EQ(bad_holdout.exit_code, 1);
  EXPECT_NE(bad_holdout.err.find("--holdout"), std::string::npos) << bad_holdout.err;
  EXPECT_FALSE(fs::exists(dir / "x.json")) << "nothing written when the command fails";

  // run's backend flags, checked by the same rules; -o is the profile, so no --profile.
  const auto gpu_only = run_cli(cat("calibrate -m ", kModel.string(), " --corpus ", a, " --expert-budget 50% -o ",
                                    (dir / "x.json").string()));
  EXPECT_EQ(gpu_only.exit_code, 1);
  EXPECT_NE(gpu_only.err.find("--expert-budget needs --gpu"), std::string::npos) << gpu_only.err;
  const auto profile = run_cli(cat("calibrate -m ", kModel.string(), " --corpus ", a, " --profile p.json -o ",
                                   (dir / "x.json").string()));
  EXPECT_NE(profile.exit_code, 0);
  EXPECT_FALSE(fs::exists(dir / "x.json"));
}

TEST(CliCalibrate, HeldOutCountsFromTheTinyModelsTrainingRun) {
  // models/routing_counts.json: the Hugging Face reference's picks on the tiny model's own held-out split.
  const fs::path dir = work_dir();
  const std::string a = write(dir / "h.py", python_doc(3, 4));
  const fs::path counts = fs::path(STRATA_SOURCE_DIR) / "models" / "routing_counts.json";
  const nlohmann::json j = run_json(cat("--corpus ", a, " --heldout-counts ", counts.string(), " --budget 50 -o ",
                                        (dir / "h.json").string()));
  const nlohmann::json ref = nlohmann::json::parse(std::ifstream(counts));
  EXPECT_EQ(j["heldout"]["tokens"], ref["tokens"]);
  EXPECT_EQ(j["heldout"]["docs"].size(), 0u);
  EXPECT_EQ(j["train"]["docs"].size(), 1u) << "with --heldout-counts every file trains";
  ASSERT_EQ(j["budgets"].size(), 1u);
  // Independent check of the oracle: at 50% of equal-size experts, the oracle keeps the globally hottest
  // half of the (layer, expert) pairs of the reference counts; its cold picks are the rest.
  std::vector<uint64_t> all;
  uint64_t total = 0;
  for (const auto& row : ref["counts"])
    for (const auto& c : row) {
      all.push_back(c.get<uint64_t>());
      total += c.get<uint64_t>();
    }
  std::sort(all.begin(), all.end());
  uint64_t cold = 0;
  for (size_t i = 0; i < all.size() / 2; ++i) cold += all[i];
  EXPECT_NEAR(j["budgets"][0]["oracle"]["heldout_cold_hit_rate"].get<double>(),
              static_cast<double>(cold) / static_cast<double>(total), 1e-12);

  // A file of another shape or kind is refused, naming it.
  const std::string bad =
      write(dir / "bad_counts.json", R"({"tokens": 10, "top_k": 4, "num_experts": 16, "counts": []})");
  const auto r = run_cli(cat("calibrate -m ", kModel.string(), " --corpus ", a, " --heldout-counts ", bad, " -o ",
                             (dir / "h2.json").string()));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("bad_counts.json"), std::string::npos) << r.err;
}

}  // namespace
// calibrate --routing: the profile counts exactly the source's picks (the model is not run), the report
// holds the tokens after them, and the flags that do not go with it are refused.
TEST(CliCalibrate, ProfileFromReplayedRouting) {
  const fs::path dir = work_dir();
  const std::string profile = (dir / "replayed.json").string();
  const nlohmann::json j = run_json(cat("--routing generate:qwen3-30b-a3b-like:3 --tokens 600 --holdout 0.25 -o ", profile));
  EXPECT_EQ(j["routing"], "generated qwen3-30b-a3b-like seed 3");
  EXPECT_EQ(j["train"]["tokens"], 450);
  EXPECT_EQ(j["heldout"]["tokens"], 150);
  ASSERT_EQ(j["budgets"].size(), 3u);
  for (const auto& b : j["budgets"])  // a profile of this routing beats the uniform placement on its next tokens
    EXPECT_LT(b["profile"]["heldout_cold_hit_rate"].get<double>(), b["uniform"]["heldout_cold_hit_rate"].get<double>());

  const auto model = Model::load(kModel.string());
  const RoutingProfile p = load_profile(profile, *model);
  EXPECT_EQ(p.counts.n_tokens, 450u);
  const auto& c = model->config();
  for (int l = 0; l < c.n_layer; ++l) EXPECT_EQ(p.counts.layer_total(l), 450u * c.n_expert_used) << l;
  // The same picks as the generator's first 450 tokens.
  const std::vector<int> routed = c.routed_layers();
  RoutingGenerator g(routing_setting("qwen3-30b-a3b-like"), static_cast<int>(routed.size()), c.n_expert,
                     c.n_expert_used, 3);
  std::vector<int> picks(450 * routed.size() * c.n_expert_used);
  g.next(450, picks.data());
  RoutingCounts want;
  want.reset(c.n_layer, c.n_expert);
  for (size_t i = 0; i < picks.size(); ++i)
    want.add(routed[(i / c.n_expert_used) % routed.size()], picks[i]);
  EXPECT_EQ(p.counts.counts, want.counts);

  const std::string corpus = write(dir / "doc.py", python_doc(1, 4));
  auto r = run_cli(cat("calibrate -m ", kModel.string(), " --routing generate:uniform --corpus ", corpus, " -o ", profile));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--routing replaces the corpus"), std::string::npos) << r.err;
  r = run_cli(cat("calibrate -m ", kModel.string(), " --corpus ", corpus, " --tokens 10 -o ", profile));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--tokens needs --routing"), std::string::npos) << r.err;
}

}  // namespace strata
