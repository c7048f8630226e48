// Routing profiles (moe/routing_profile.h) and the model fingerprint: roundtrip, refusal of another
// model's profile and of corrupt files, atomic replacement; and routing counting in the CPU engine.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <random>
#include <sstream>

#include "strata/base/error.h"
#include "strata/engine/model.h"
#include "strata/engine/session.h"
#include "strata/gguf/gguf.h"
#include "strata/moe/model_fingerprint.h"
#include "strata/moe/profile_store.h"
#include "strata/moe/routing_profile.h"
#include "process_temp_dir.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

const fs::path kModel = fs::path(STRATA_SOURCE_DIR) / "models" / "strata-tiny.gguf";

fs::path temp_dir() { return process_temp_dir("strata_profile_"); }

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

ModelIdentity identity(int layers = 3, int experts = 5, int used = 2) {
  ModelIdentity id;
  id.fingerprint = "0123456789abcdef";
  id.name = "test \"model\"";  // a quote: the writer must escape it
  id.arch = "qwen35moe";
  id.file = "/tmp/test.gguf";
  id.n_layer = layers;
  id.n_expert = experts;
  id.n_expert_used = used;
  return id;
}

RoutingCounts random_counts(int layers, int experts, int used, uint64_t tokens) {
  std::mt19937_64 rng(3);
  RoutingCounts c;
  c.reset(layers, experts);
  c.n_tokens = tokens;
  for (int l = 0; l < layers; ++l)
    for (uint64_t t = 0; t < tokens * static_cast<uint64_t>(used); ++t) c.add(l, static_cast<int>(rng() % experts));
  return c;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RoutingProfile, RoundtripKeepsEveryCount) {
  const fs::path p = temp_dir() / "roundtrip.json";
  const ModelIdentity id = identity();
  const RoutingCounts c = random_counts(3, 5, 2, 1000);
  save_profile_atomic(p.string(), id, c);
  const RoutingProfile back = load_profile(p.string(), id);
  EXPECT_EQ(back.counts.counts, c.counts);
  EXPECT_EQ(back.counts.n_tokens, 1000u);
  EXPECT_EQ(back.model.fingerprint, id.fingerprint);
  EXPECT_EQ(back.model.name, id.name);
  EXPECT_EQ(back.model.n_expert_used, 2);
  // Overwriting replaces the file and leaves no temporary file behind.
  RoutingCounts more = c;
  more.add(1, 4, 7);
  more.n_tokens += 4;
  save_profile_atomic(p.string(), id, more);
  EXPECT_EQ(load_profile(p.string(), id).counts.at(1, 4), c.at(1, 4) + 7);
  for (const auto& entry : fs::directory_iterator(p.parent_path()))
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
}

TEST(RoutingProfile, RefusesAnotherModel) {
  const fs::path p = temp_dir() / "other.json";
  save_profile_atomic(p.string(), identity(), random_counts(3, 5, 2, 10));
  ModelIdentity other = identity();
  other.fingerprint = "fedcba9876543210";
  other.name = "other-model";
  const std::string msg = error_of([&] { load_profile(p.string(), other); });
  EXPECT_NE(msg.find("another model"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0123456789abcdef"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fedcba9876543210"), std::string::npos) << msg;
  EXPECT_NE(msg.find("other-model"), std::string::npos) << msg;
  EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
  // Same fingerprint but another shape (a hand-edited identity) is refused too.
  EXPECT_THROW(load_profile(p.string(), identity(3, 6, 2)), Error);
}

TEST(RoutingProfile, RefusesCorruptFiles) {
  const fs::path dir = temp_dir();
  const fs::path good = dir / "good.json";
  save_profile_atomic(good.string(), identity(), random_counts(3, 5, 2, 10));
  const std::string text = read_text(good);
  struct Case {
    const char* name;
    std::string text;
    const char* expect;
  };
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string s = text;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  const std::vector<Case> cases = {
      {"truncated", text.substr(0, text.size() / 2), "not valid JSON"},
      {"empty", "", "not valid JSON"},
      {"format", replace("strata-routing-profile", "something-else"), "not a strata routing profile"},
      {"version", replace("\"version\": 1", "\"version\": 2"), "version"},
      {"tokens", replace("\"n_tokens\": 10", "\"n_tokens\": -1"), "n_tokens"},
      {"too many picks", replace("\"n_tokens\": 10", "\"n_tokens\": 1"), "counts"},
      {"rows", replace("\"n_layer\": 3", "\"n_layer\": 4"), "counts"},
      {"float", replace("\"counts\": [\n    [", "\"counts\": [\n    [0.5,"), "counts"},
  };
  for (const Case& c : cases) {
    const fs::path p = dir / cat("corrupt_", c.name, ".json");
    write_text(p, c.text);
    const std::string msg = error_of([&] { load_profile(p.string(), identity()); });
    EXPECT_NE(msg.find(p.string()), std::string::npos) << c.name << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
  }
  const std::string missing = error_of([&] { read_profile((dir / "nope.json").string()); });
  EXPECT_NE(missing.find("nope.json: cannot open"), std::string::npos) << missing;
}

TEST(RoutingProfile, FailedSaveLeavesTheOldFileAndNoTemporary) {
  const fs::path dir = temp_dir() / "failsave";
  fs::create_directories(dir);
  const fs::path p = dir / "profile.json";
  save_profile_atomic(p.string(), identity(), random_counts(3, 5, 2, 10));
  const std::string before = read_text(p);
  // Counts of the wrong shape are refused before anything is written.
  EXPECT_THROW(save_profile_atomic(p.string(), identity(), random_counts(2, 5, 2, 10)), Error);
  EXPECT_EQ(read_text(p), before);
  // A target that is a directory: the rename fails; the temporary file must be cleaned up.
  const fs::path target_dir = dir / "is_a_dir";
  fs::create_directories(target_dir / "x");
  EXPECT_THROW(save_profile_atomic(target_dir.string(), identity(), random_counts(3, 5, 2, 10)), Error);
  int n_files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    ++n_files;
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
  }
  EXPECT_EQ(n_files, 2);
}

TEST(ModelFingerprint, StableAndSensitiveToRouterWeights) {
  auto model = Model::load(kModel.string());
  const ModelIdentity a = model_identity(*model);
  EXPECT_EQ(a.fingerprint.size(), 16u);
  EXPECT_EQ(a.fingerprint, model_fingerprint(GgufFile::open(kModel.string())));
  EXPECT_EQ(a.n_layer, model->config().n_layer);
  EXPECT_EQ(a.n_expert, model->config().n_expert);

  // A copy with one router weight byte changed: same layout, different model.
  const fs::path copy = temp_dir() / "tiny_changed.gguf";
  fs::copy_file(kModel, copy, fs::copy_options::overwrite_existing);
  const GgufTensorInfo& router = model->file().tensor("blk.3.ffn_gate_inp.weight");
  const uint64_t at = model->file().data_offset() + router.offset + 100;
  {
    std::fstream f(copy, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char byte = 0;
    f.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x01);
    f.seekp(static_cast<std::streamoff>(at));
    f.write(&byte, 1);
  }
  auto changed = Model::load(copy.string());
  const ModelIdentity b = model_identity(*changed);
  EXPECT_NE(a.fingerprint, b.fingerprint);

  const fs::path p = temp_dir() / "tiny_profile.json";
  RoutingCounts c;
  c.reset(a.n_layer, a.n_expert);
  save_profile_atomic(p.string(), *model, c);
  EXPECT_NO_THROW(load_profile(p.string(), *model));
  const std::string msg = error_of([&] { load_profile(p.string(), *changed); });
  EXPECT_NE(msg.find("another model"), std::string::npos) << msg;
  EXPECT_NE(msg.find(copy.string()), std::string::npos) << msg;
  fs::remove(copy);
}

TEST(ProfileStore, StartsEmptyAccumulatesAndReloads) {
  auto model = Model::load(kModel.string());
  const ModelConfig& c = model->config();
  const fs::path p = temp_dir() / "store.json";
  fs::remove(p);
  RoutingCounts req;
  req.reset(c.n_layer, c.n_expert);
  req.add(0, 1, 4);
  req.n_tokens = 1;
  {
    ProfileStore store(p.string(), *model);
    EXPECT_FALSE(store.loaded_existing());
    EXPECT_FALSE(fs::exists(p)) << "nothing written before save()";
    store.add_and_save(req);
    store.add_and_save(req);
  }
  ProfileStore again(p.string(), *model);
  EXPECT_TRUE(again.loaded_existing());
  EXPECT_EQ(again.snapshot().at(0, 1), 8u);
  EXPECT_EQ(again.snapshot().n_tokens, 2u);
  RoutingCounts wrong;
  wrong.reset(c.n_layer, c.n_expert + 1);
  EXPECT_THROW(again.add(wrong), Error);
  write_text(p, "{ broken");
  EXPECT_THROW(ProfileStore(p.string(), *model), Error) << "a corrupt file is refused, not overwritten";
}

TEST(EngineRoutingCounts, CountsTopKPicksPerTokenAndCostsNothingWhenOff) {
  auto model = Model::load(kModel.string());
  const ModelConfig& c = model->config();
  const std::vector<int32_t> tokens = {10, 200, 3000, 42, 7, 8191, 1, 500};
  std::vector<float> logits_a(c.n_vocab), logits_b(c.n_vocab), logits_c(c.n_vocab);

  Session off(*model, 64);
  off.forward(tokens.data(), static_cast<int>(tokens.size()), logits_a.data(), false);

  RoutingCounts counts;  // empty: sized to the model when attached
  Session prefill(*model, 64);
  prefill.set_routing_counts(&counts);
  prefill.forward(tokens.data(), static_cast<int>(tokens.size()), logits_b.data(), false);
  EXPECT_EQ(logits_a, logits_b) << "counting must not change the arithmetic";
  ASSERT_EQ(counts.n_layer, c.n_layer);
  ASSERT_EQ(counts.n_expert, c.n_expert);
  EXPECT_EQ(counts.n_tokens, tokens.size());
  for (int l = 0; l < c.n_layer; ++l) EXPECT_EQ(counts.layer_total(l), tokens.size() * c.n_expert_used) << l;

  // Decode token by token counts the same picks as one prefill batch.
  RoutingCounts step_counts;
  Session decode(*model, 64);
  decode.set_routing_counts(&step_counts);
  for (int32_t t : tokens) decode.forward(&t, 1, logits_c.data(), false);
  EXPECT_EQ(step_counts.n_tokens, counts.n_tokens);
  EXPECT_EQ(step_counts.counts, counts.counts);

  decode.set_routing_counts(nullptr);
  decode.forward(tokens.data(), 1, logits_c.data(), false);
  EXPECT_EQ(step_counts.n_tokens, counts.n_tokens) << "detached: nothing counted";

  RoutingCounts wrong;
  wrong.reset(c.n_layer + 1, c.n_expert);
  EXPECT_THROW(decode.set_routing_counts(&wrong), Error);
}

}  // namespace
}  // namespace strata
