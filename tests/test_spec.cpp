// Speculative decoding (engine/drafter.h, spec/, sample/speculative.h): the acceptance rule reproduces
// the target's distribution exactly; greedy generation with every drafter is token for token what
// plain generation gives, on the bundled model and on HF fixtures with DeltaNet layers and sliding
// windows (tests/spec_lossless.h); sampled generation keeps its distribution; the loop's limits (token
// count, end token, stop strings, context, cancellation) cut a verified step exactly where plain
// decoding would stop.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "spec_lossless.h"
#include "strata/base/error.h"
#include "strata/convert/converter.h"
#include "strata/cpu/ops.h"
#include "strata/engine/blocks.h"
#include "strata/engine/generate.h"
#include "strata/engine/model.h"
#include "strata/engine/mtp.h"
#include "strata/engine/session.h"
#include "strata/gguf/gguf.h"
#include "strata/gguf/writer.h"
#include "strata/quant/fp16.h"
#include "strata/sample/speculative.h"
#include "strata/spec/draft_model.h"
#include "strata/spec/mtp_drafter.h"
#include "strata/spec/ngram_drafter.h"
#include "strata/spec/spec_bench.h"
#include "strata/spec/spec_options.h"
#include "strata/text/tokenizer.h"
#include "strata/text/vocab.h"
#include "text_model_fixture.h"

using namespace strata;

namespace {

namespace fs = std::filesystem;

// Models this small run on one thread (the thread policy's choice under 256 MiB); OpenMP teams only
// slow them down.
const bool one_thread = [] {
  omp_set_num_threads(1);
  return true;
}();

using spec_test::expect_accepts_and_rejects;
using spec_test::greedy_no_end;
using spec_test::load;
using spec_test::Loaded;
using spec_test::kBan;
using spec_test::pattern_prompt;
using spec_test::ScriptDrafter;

fs::path tmp_file(const std::string& name) {
  const fs::path dir = fs::path(STRATA_BINARY_DIR) / "test_tmp";
  fs::create_directories(dir);
  return dir / (name + "-" + std::to_string(::getpid()) + ".gguf");
}

// An HF fixture as an F32 GGUF without a tokenizer.
std::string convert_fixture(const std::string& name) {
  const std::string out = tmp_file("spec_" + name).string();
  convert::ConvertOptions opt;
  opt.hf_dir = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/hf/" + name;
  opt.out_path = out;
  opt.type = "f32";
  convert::convert_hf_to_gguf(opt);
  return out;
}

spec_test::MakeSequence cpu_sequences(const Model& m) {
  return [&m](int ctx) -> std::unique_ptr<Sequence> { return std::make_unique<Session>(m, ctx); };
}

// A draft model drafting as make_drafter sets it up for a target sampling with `target`.
spec_test::MakeDrafter draft_model(const Model& draft, int ctx, const SamplerParams& target, float p_min = 0.0f) {
  return [&draft, ctx, target, p_min]() -> std::unique_ptr<Drafter> {
    return std::make_unique<DraftModelDrafter>(std::make_unique<Session>(draft, ctx), draft_sampling(target),
                                               static_cast<int32_t>(draft.config().n_vocab), nullptr, p_min);
  };
}

spec_test::MakeDrafter ngram(int min_n = 2, int max_n = 4) {
  return [min_n, max_n]() -> std::unique_ptr<Drafter> { return std::make_unique<NgramDrafter>(NgramParams{min_n, max_n}); };
}

// ---- the acceptance rule ----------------------------------------------------------------------

TokenDistribution dist(std::map<int32_t, double> w) {
  TokenDistribution d;
  for (const auto& [id, x] : w) {
    d.ids.push_back(id);
    d.weights.push_back(x);
    d.total += x;
  }
  return d;
}

// P(out = t) of one verification: x ~ q accepted with min(1, p/q), else a draw from the residual.
std::map<int32_t, double> exact_output(const TokenDistribution& p, const TokenDistribution* q, int32_t fixed_x) {
  std::map<int32_t, double> out;
  TokenDistribution r;
  auto add_draft = [&](int32_t x, double qx_weight, double qx) {
    const double accept = std::min(1.0, p.prob(x) / qx);
    out[x] += qx_weight * accept;
    residual_distribution(p, x, q, r);
    for (size_t i = 0; i < r.ids.size(); ++i) out[r.ids[i]] += qx_weight * (1 - accept) * r.weights[i] / r.total;
  };
  if (q) {
    for (size_t i = 0; i < q->ids.size(); ++i) add_draft(q->ids[i], q->prob(q->ids[i]), q->prob(q->ids[i]));
  } else {
    add_draft(fixed_x, 1.0, 1.0);
  }
  return out;
}

TEST(SpecVerify, OutputDistributionIsTheTargetsExactly) {
  const TokenDistribution p = dist({{1, 0.5}, {2, 0.3}, {4, 0.15}, {7, 0.05}});
  const std::vector<TokenDistribution> qs = {dist({{1, 0.2}, {2, 0.2}, {3, 0.4}, {4, 0.2}}),
                                             dist({{7, 1.0}, {9, 3.0}}), dist({{1, 5.0}, {2, 3.0}, {4, 1.5}, {7, 0.5}})};
  for (const TokenDistribution& q : qs) {
    const auto got = exact_output(p, &q, -1);
    for (const auto& [id, prob] : got) EXPECT_NEAR(prob, p.prob(id), 1e-12) << "token " << id;
  }
  for (int32_t x : {1, 3, 7}) {  // a deterministic drafter: x, in p's support or not
    const auto got = exact_output(p, nullptr, x);
    for (const auto& [id, prob] : got) EXPECT_NEAR(prob, p.prob(id), 1e-12) << "draft " << x << ", token " << id;
  }
}

TEST(SpecVerify, SampledVerdictsFollowTheTarget) {
  const TokenDistribution p = dist({{1, 0.5}, {2, 0.3}, {4, 0.15}, {7, 0.05}});
  const TokenDistribution q = dist({{1, 0.1}, {2, 0.5}, {3, 0.3}, {7, 0.1}});
  SamplerParams sp;
  sp.seed = 11;
  Sampler sampler(sp);
  std::mt19937_64 rng(3);
  TokenDistribution scratch;
  std::map<int32_t, int> counts;
  const int n = 200000;
  int accepted = 0;
  for (int i = 0; i < n; ++i) {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    int32_t x = q.ids.back();
    double acc = 0;
    for (size_t k = 0; k < q.ids.size(); ++k)
      if (u < (acc += q.weights[k] / q.total)) {
        x = q.ids[k];
        break;
      }
    const DraftVerdict v = verify_draft(sampler, p, x, &q, scratch);
    accepted += v.accepted;
    ++counts[v.token];
  }
  double tv = 0;
  for (int32_t id : {1, 2, 3, 4, 7}) tv += std::abs(counts[id] / static_cast<double>(n) - p.prob(id));
  EXPECT_LT(tv / 2, 0.006);
  EXPECT_EQ(counts[3], 0);  // outside p's support
  // Acceptance probability: sum_x min(p(x), q(x)) = 0.1 + 0.3 + 0 + 0.05.
  EXPECT_NEAR(accepted / static_cast<double>(n), 0.45, 0.006);
}

TEST(SpecVerify, GreedyKeepsExactlyTheArgmax) {
  SamplerParams sp;
  sp.temperature = 0;
  Sampler sampler(sp);
  std::vector<float> logits = {0.1f, 2.0f, 2.0f, -1.0f};
  TokenDistribution p, scratch;
  sampler.distribution(logits.data(), 4, {}, p);
  ASSERT_EQ(p.ids, std::vector<int32_t>{1});  // lowest id among equals, as sample() picks
  EXPECT_TRUE(verify_draft(sampler, p, 1, nullptr, scratch).accepted);
  const DraftVerdict v = verify_draft(sampler, p, 2, nullptr, scratch);
  EXPECT_FALSE(v.accepted);
  EXPECT_EQ(v.token, 1);
  // A drafter reporting q must give its own token probability.
  EXPECT_THROW(verify_draft(sampler, p, 2, &p, scratch), Error);
}

TEST(SpecVerify, DistributionIsWhatSampleDrawsFrom) {
  // Same seed: drawing from distribution() walks the same sums as sample() does.
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0, 2);
  for (int n : {50, 6000}) {
    std::vector<float> logits(static_cast<size_t>(n));
    for (float& x : logits) x = d(rng);
    SamplerParams sp;
    sp.temperature = 0.8f;
    sp.top_p = 0.9f;
    sp.presence_penalty = 0.5f;
    sp.seed = 99;
    Sampler a(sp), b(sp);
    const std::vector<int32_t> history = {1, 2, 3, 3};
    for (int i = 0; i < 50; ++i) {
      std::vector<float> la = logits, lb = logits;
      TokenDistribution p;
      b.distribution(lb.data(), n, history, p);
      EXPECT_EQ(a.sample(la.data(), n, history), b.draw(p)) << "vocab " << n << ", draw " << i;
    }
  }
}

// ---- drafters ---------------------------------------------------------------------------------

TEST(NgramDrafter, ProposesWhatFollowedTheLongestRecentMatch) {
  NgramDrafter d(NgramParams{1, 3});
  Draft out;
  // "5 6 7" occurred, followed by 8 9; the later "6 7 1" match is shorter.
  d.propose({5, 6, 7, 8, 9, 6, 7, 1, 2, 5, 6, 7}, 4, out);
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{8, 9, 6, 7}));
  EXPECT_TRUE(out.q.empty());
  // The most recent occurrence wins; running into the end continues with the proposal itself.
  d.propose({1, 2, 3, 1, 2, 4, 1, 2}, 5, out);
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{4, 1, 2, 4, 1}));
  d.propose({1, 2, 3}, 4, out);
  EXPECT_TRUE(out.tokens.empty());
  NgramDrafter two(NgramParams{2, 2});
  two.propose({1, 2, 9, 2}, 4, out);  // a single-token match does not count
  EXPECT_TRUE(out.tokens.empty());
  EXPECT_THROW(NgramDrafter(NgramParams{0, 2}), Error);
  EXPECT_THROW(NgramDrafter(NgramParams{3, 2}), Error);
}

TEST(NgramDrafter, BranchesMergeSeveralOccurrencesIntoATree) {
  NgramDrafter d(NgramParams{2, 2, 3});
  Draft out;
  // "1 2" was followed by 3 4, by 5 6 and by 3 7 (most recent last): the tree shares the 3.
  d.propose({1, 2, 3, 4, 0, 1, 2, 5, 6, 0, 1, 2, 3, 7, 0, 1, 2}, 6, out);
  ASSERT_EQ(out.tokens.size(), out.parents.size());
  // The most recent continuation first: 3 7 0 ...; then 5 6 and 4 under the shared 3.
  ASSERT_GE(out.tokens.size(), 4u);
  EXPECT_EQ(out.tokens[0], 3);
  EXPECT_EQ(out.parents[0], -1);
  EXPECT_EQ(out.tokens[1], 7);
  EXPECT_EQ(out.parents[1], 0);
  EXPECT_LE(out.tokens.size(), 6u);
  std::vector<std::pair<int, int32_t>> nodes;  // (parent token or -1, token)
  for (size_t t = 0; t < out.tokens.size(); ++t)
    nodes.push_back({out.parents[t] < 0 ? -1 : out.tokens[static_cast<size_t>(out.parents[t])], out.tokens[t]});
  auto has = [&](int parent_token, int32_t token) {
    return std::find(nodes.begin(), nodes.end(), std::make_pair(parent_token, token)) != nodes.end();
  };
  EXPECT_TRUE(has(-1, 5)) << "the 5 6 continuation branches at the root";
  EXPECT_TRUE(has(3, 4)) << "the 3 4 continuation branches under the shared 3";
  for (size_t t = 0; t < out.tokens.size(); ++t) EXPECT_LT(out.parents[t], static_cast<int>(t));
  // One occurrence only: the chain, as with one branch.
  NgramDrafter one(NgramParams{2, 2, 1});
  Draft chain;
  d.propose({1, 2, 3, 4, 1, 2}, 4, out);
  one.propose({1, 2, 3, 4, 1, 2}, 4, chain);
  EXPECT_EQ(out.tokens, chain.tokens);
  EXPECT_TRUE(out.parents.empty());
  EXPECT_THROW(NgramDrafter(NgramParams{2, 2, 0}), Error);
  EXPECT_THROW(NgramDrafter(NgramParams{2, 2, NgramParams::kMaxBranches + 1}), Error);
}

TEST(VerifyCost, ShapesParseAndTreesHaveAMainPath) {
  const std::vector<VerifyShape> v = parse_verify_shapes("chain:2,4,tree:5,8");
  ASSERT_EQ(v.size(), 4u);
  EXPECT_FALSE(v[1].tree);
  EXPECT_EQ(v[1].n, 4);
  EXPECT_TRUE(v[2].tree);
  EXPECT_EQ(v[3].label(), "tree:8");
  EXPECT_TRUE(v[0].parents().empty());
  // tree:5: main nodes 0, 2, 4 (depth 3), alternatives 1 and 3 beside the first two.
  EXPECT_EQ(v[2].parents(), (std::vector<int>{-1, -1, 0, 0, 2}));
  EXPECT_EQ(v[2].depth(), 3);
  EXPECT_EQ(v[3].parents().size(), 8u);
  for (const char* bad : {"", "4", "chain:", "chain:0", "tree:65", "chain:2,x", "chain:2,,4", "dag:3"})
    EXPECT_THROW(parse_verify_shapes(bad), Error) << bad;
}

TEST(VerifyCost, TimesEveryShapeOnOneSequence) {
  const Loaded tiny = load(std::string(STRATA_SOURCE_DIR) + "/models/strata-tiny.gguf");
  const std::vector<VerifyShape> shapes = parse_verify_shapes("chain:1,3,tree:4");
  const int ctx = verify_cost_context(8, shapes, 2);
  const auto rows = run_verify_cost([&] { return std::make_unique<Session>(*tiny.model, ctx); }, 8, shapes, 2, 1);
  ASSERT_EQ(rows.size(), 3u);
  for (const auto& r : rows) {
    EXPECT_GT(r.verify_ms, 0.0) << r.shape.label();
    EXPECT_GT(r.step_ms, 0.0) << r.shape.label();
  }
  const std::string table = format_verify_cost(rows);
  EXPECT_NE(table.find("| tree:4 | 5 | 2 |"), std::string::npos) << table;
  EXPECT_THROW(run_verify_cost([&] { return std::make_unique<Session>(*tiny.model, ctx - 1); }, 8, shapes, 2, 1), Error);
}

TEST(SpecOptions, CheckedInOnePlace) {
  SpecOptions o;
  EXPECT_EQ(check_spec_options(o).kind, SpecKind::None);
  o.draft_model = "d.gguf";
  SpecChoice c = check_spec_options(o);
  EXPECT_EQ(c.kind, SpecKind::DraftModel);
  EXPECT_EQ(c.draft_path, "d.gguf");
  o.spec = "ngram";
  EXPECT_THROW(check_spec_options(o), Error);
  o.spec = "draft:e.gguf";
  EXPECT_THROW(check_spec_options(o), Error);  // two draft models
  o.draft_model.clear();
  EXPECT_EQ(check_spec_options(o).draft_path, "e.gguf");
  o.spec = "draft";  // no file: the model's own (draft_path_for), found when the drafter is made
  EXPECT_EQ(check_spec_options(o).kind, SpecKind::DraftModel);
  EXPECT_EQ(check_spec_options(o).draft_path, "");
  EXPECT_EQ(check_spec_options(o).draft_p_min, kDraftPMinDefault);
  o.draft_p_min = 0.5f;
  EXPECT_EQ(check_spec_options(o).draft_p_min, 0.5f);
  for (const float bad : {1.5f, -0.3f, std::nanf("")}) {
    o.draft_p_min = bad;
    EXPECT_THROW(check_spec_options(o), Error) << bad;
  }
  o.draft_p_min = 0.5f;
  o.spec = "mtp";  // --draft-p-min stops a draft model only
  EXPECT_THROW(check_spec_options(o), Error);
  o.draft_p_min = SpecOptions::kDraftPMinUnset;
  o.spec = "draft:";
  EXPECT_THROW(check_spec_options(o), Error);  // no file name
  EXPECT_EQ(draft_path_for("m/x.gguf"), "m/x.draft.gguf");
  EXPECT_EQ(dflash_path_for("m/x.gguf"), "m/x.dflash.gguf");
  o.spec = "ngram";
  EXPECT_EQ(check_spec_options(o).params.draft_max, 16);  // not given: the drafter's default
  o.spec = "mtp";
  EXPECT_EQ(check_spec_options(o).params.draft_max, 3);
  o.draft_max = 7;
  EXPECT_EQ(check_spec_options(o).params.draft_max, 7);
  o.spec = "ngram";
  o.n_gpu_layers_draft = 1;  // -ngld places a draft model only
  EXPECT_THROW(check_spec_options(o), Error);
  o.spec = "draft:e.gguf";
  EXPECT_NO_THROW(check_spec_options(o));
  o.n_gpu_layers_draft = -2;
  EXPECT_THROW(check_spec_options(o), Error);
  o.n_gpu_layers_draft = -1;
  o.spec = "ngram";
  o.draft_max = 0;
  EXPECT_THROW(check_spec_options(o), Error);
  o.draft_max = 4;
  o.draft_min = 5;
  EXPECT_THROW(check_spec_options(o), Error);
  o.draft_min = 0;
  o.ngram.max_n = 1;
  EXPECT_THROW(check_spec_options(o), Error);
  o.ngram = {};
  o.spec = "bogus";
  try {
    check_spec_options(o);
    ADD_FAILURE() << "an unknown drafter was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ngram"), std::string::npos) << e.what();
  }
}

// `--spec draft` without a file drafts with the model's own draft model next to it (MODEL.draft.gguf);
// a model without one is refused naming the file looked for.
TEST(DraftModel, TheModelsOwnIsFoundNextToIt) {
  SpecOptions o;
  o.spec = "draft";
  const SpecChoice c = check_spec_options(o);
  const std::string target_path = tmp_file("spec_own_target.gguf").string();
  fs::copy_file(convert_fixture("qwen3_5_moe"), target_path, fs::copy_options::overwrite_existing);
  spec_test::perturbed_copy(target_path, draft_path_for(target_path), 0.05);
  const Loaded target = load(target_path);
  const DrafterFactory f(c, o, *target.model);
  ASSERT_NE(f.draft_model(), nullptr);
  EXPECT_EQ(f.draft_model()->file().path(), draft_path_for(target_path));
  EXPECT_EQ(drafter_file(c, *target.model), draft_path_for(target_path));
  // --draft-min positions are drafted whatever --draft-p-min says (a proposal's length must not depend
  // on sampled draws, and a shorter one would be dropped): at a minimum of 1, only those.
  SpecOptions sure = o;
  sure.draft_p_min = 1.0f;
  sure.draft_max = 3;
  const std::vector<int32_t> history = pattern_prompt();
  for (const int min_tokens : {0, 2}) {
    sure.draft_min = min_tokens;
    for (const float temp : {0.0f, 1.0f}) {
      SamplerParams sp;
      sp.temperature = temp;
      sp.seed = 5;
      const std::unique_ptr<Drafter> d = DrafterFactory(check_spec_options(sure), sure, *target.model)
                                             .make(64, sp, static_cast<int32_t>(target.model->config().n_vocab));
      Draft out;
      d->propose(history, 3, out);
      EXPECT_EQ(out.tokens.size(), static_cast<size_t>(min_tokens)) << "temperature " << temp;
      EXPECT_EQ(out.q.size(), temp > 0 ? static_cast<size_t>(min_tokens) : 0u);
    }
  }
  const Loaded qwen = load(convert_fixture("qwen3_5_moe"));
  try {
    const DrafterFactory g(c, o, *qwen.model);
    ADD_FAILURE() << "a model without a draft model next to it drafted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(draft_path_for(qwen.path)), std::string::npos) << e.what();
  }
}

TEST(DraftModel, RefusesAnotherVocabulary) {
  const Loaded qwen = load(convert_fixture("qwen3_5_moe"));  // 512 ids, no tokenizer
  const Loaded laguna = load(convert_fixture("laguna"));     // 384 ids, no tokenizer
  EXPECT_THROW(check_draft_vocabulary(*qwen.model, *laguna.model), Error);
  EXPECT_NO_THROW(check_draft_vocabulary(*qwen.model, *qwen.model));
  const Loaded tiny = load(std::string(STRATA_SOURCE_DIR) + "/models/strata-tiny.gguf");
  EXPECT_THROW(check_draft_vocabulary(*tiny.model, *qwen.model), Error);  // one tokenizer, one none
  const Loaded text = load(testing_fixture::make_text_model("test_spec_vocab"));
  try {
    check_draft_vocabulary(*tiny.model, *text.model);
    ADD_FAILURE() << "different tokenizers were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("draft model"), std::string::npos) << e.what();
  }
  // Through the options: the draft file is loaded and checked.
  SpecOptions o;
  o.spec = "draft:" + laguna.path;
  EXPECT_THROW(make_drafter(check_spec_options(o), o, *qwen.model, 64, {}, 512), Error);
}

// ---- lossless greedy generation ---------------------------------------------------------------

TEST(SpecLossless, BundledModel) {
  const Loaded tiny = load(std::string(STRATA_SOURCE_DIR) + "/models/strata-tiny.gguf");
  const Loaded other = load(spec_test::perturbed_copy(tiny.path, tmp_file("spec_tiny_perturbed").string(), 0.08));
  const int32_t V = static_cast<int32_t>(tiny.model->config().n_vocab);
  spec_test::Case c;
  // Drafts must be both accepted and rejected: a prompt whose continuation partly repeats what the
  // prompt holds (n-gram drafts taken from it hold) and partly departs from it (they fail). A prompt
  // that a model merely copies would reject nothing.
  c.prompt = tiny.tokenizer->encode(
      "import os\nimport sys\n\n\ndef main():\n    path = sys.argv[1]\n    with open(path) as f:\n        for line in f:\n"
      "            print(line)\n\n\nif __name__ == \"__main__\":\n    main()\n\n\ndef");
  c.n_new = 64;
  c.sampling = greedy_no_end(*tiny.tokenizer, V);
  const auto make = cpu_sequences(*tiny.model);
  const int ctx = static_cast<int>(c.prompt.size()) + c.n_new + 1;
  expect_accepts_and_rejects(spec_test::expect_lossless(make, *tiny.tokenizer, c, ngram(), true, "tiny, ngram"), "tiny, ngram");
  const GenerationStats self = spec_test::expect_lossless(make, *tiny.tokenizer, c, draft_model(*tiny.model, ctx, c.sampling), true, "tiny, self draft");
  EXPECT_EQ(self.accepted_tokens, self.drafted_tokens) << "the model as its own draft agrees with itself";
  EXPECT_GT(self.tokens_per_spec_step(), 4.0);
  const GenerationStats all = spec_test::expect_lossless(
      make, *tiny.tokenizer, c, draft_model(*other.model, ctx, c.sampling), true, "tiny, perturbed draft");
  expect_accepts_and_rejects(all, "tiny, perturbed draft");
  // --draft-p-min: lossless, and drafting only where the draft is sure (fewer drafts, more of them
  // accepted).
  const GenerationStats sure =
      spec_test::expect_lossless(make, *tiny.tokenizer, c, draft_model(*other.model, ctx, c.sampling, 0.75f), true,
                                 "tiny, perturbed draft, p-min");
  EXPECT_LT(sure.drafted_tokens, all.drafted_tokens);
  EXPECT_GT(sure.accepted_tokens * all.drafted_tokens, all.accepted_tokens * sure.drafted_tokens)
      << "a larger share of the surer drafts is accepted";
  // Penalties depend on the history: each verified position must see the accepted drafts before it.
  c.sampling.frequency_penalty = 0.4f;
  c.sampling.repetition_penalty = 1.1f;
  spec_test::expect_lossless(make, *tiny.tokenizer, c, ngram(1, 3), true, "tiny, ngram, penalties");
  spec_test::expect_lossless(make, *tiny.tokenizer, c, draft_model(*other.model, ctx, c.sampling), true, "tiny, draft, penalties");
}

// Plain greedy sampling (no bias, no penalty) verifies by picks (Sequence::forward_pending_picks, the
// arg-max of every pending row) and walks chains and trees alike: scripted chains and trees rejected at
// every depth, the kept path found among siblings, give what generation without a drafter gives.
TEST(SpecLossless, PlainGreedyVerifiesByPicks) {
  const Loaded tiny = load(std::string(STRATA_SOURCE_DIR) + "/models/strata-tiny.gguf");
  const int32_t V = static_cast<int32_t>(tiny.model->config().n_vocab);
  spec_test::Case c;
  c.prompt = tiny.tokenizer->encode("def fibonacci(n):\n    if n < 2:\n        return n\n    return");
  c.n_new = 48;
  c.sampling.temperature = 0;
  ASSERT_TRUE(Sampler(c.sampling).plain_greedy());
  const auto make = cpu_sequences(*tiny.model);
  const spec_test::Outcome plain = spec_test::generate_case(make, *tiny.tokenizer, c, nullptr);
  ASSERT_GE(plain.result.tokens.size(), 16u) << "the reference run stopped too early to verify anything";
  const std::vector<int32_t> ref = plain.result.tokens;
  const size_t n_prompt = c.prompt.size();
  for (int every : {2, 3}) {
    const std::string what = "chain, wrong every " + std::to_string(every);
    expect_accepts_and_rejects(
        spec_test::expect_lossless(
            make, *tiny.tokenizer, c,
            [&] { return std::make_unique<spec_test::ScriptDrafter>(n_prompt, ref, every, V); }, true, what),
        what);
  }
  for (int every : {3, 4}) {
    const std::string what = "tree, no right token every " + std::to_string(every);
    expect_accepts_and_rejects(
        spec_test::expect_lossless(
            make, *tiny.tokenizer, c,
            [&] { return std::make_unique<spec_test::TreeScriptDrafter>(n_prompt, ref, 3, every, V); }, true, what),
        what);
  }
}

void check_fixture(const std::string& name, const std::string& other_name) {
  const Loaded target = load(convert_fixture(name));
  const Loaded other = load(convert_fixture(other_name));
  const int32_t V = static_cast<int32_t>(target.model->config().n_vocab);
  spec_test::Case c;
  c.prompt = pattern_prompt();
  c.n_new = 48;
  c.sampling = greedy_no_end(*target.tokenizer, V);
  const auto make = cpu_sequences(*target.model);
  const int ctx = static_cast<int>(c.prompt.size()) + c.n_new + 1;
  expect_accepts_and_rejects(spec_test::expect_lossless(make, *target.tokenizer, c, ngram(1, 4), true, name + ", ngram"),
                             name + ", ngram");
  const GenerationStats self =
      spec_test::expect_lossless(make, *target.tokenizer, c, draft_model(*target.model, ctx, c.sampling), true, name + ", self draft");
  EXPECT_EQ(self.accepted_tokens, self.drafted_tokens) << name;
  spec_test::expect_lossless(make, *target.tokenizer, c, draft_model(*other.model, ctx, c.sampling), true, name + ", " + other_name);
  // Drafts that are right except every third token: rejections at every depth of the chain.
  const spec_test::Outcome plain = spec_test::generate_case(make, *target.tokenizer, c, nullptr);
  for (int every : {2, 3, 5}) {
    const GenerationStats s = spec_test::expect_lossless(
        make, *target.tokenizer, c,
        [&] { return std::make_unique<ScriptDrafter>(c.prompt.size(), plain.result.tokens, every, V); }, true,
        name + ", scripted");
    expect_accepts_and_rejects(s, name + ", scripted");
  }
  // Token trees: the kept path among siblings, the state (KV rows, DeltaNet state, sliding rings) of
  // that path only.
  for (int every : {3, 4}) {
    const GenerationStats s = spec_test::expect_lossless(
        make, *target.tokenizer, c,
        [&] { return std::make_unique<spec_test::TreeScriptDrafter>(c.prompt.size(), plain.result.tokens, 3, every, V); }, true,
        name + ", tree");
    expect_accepts_and_rejects(s, name + ", tree");
  }
  NgramParams branched{1, 4, 4};
  expect_accepts_and_rejects(
      spec_test::expect_lossless(make, *target.tokenizer, c,
                                 [branched] { return std::make_unique<NgramDrafter>(branched); }, true,
                                 name + ", ngram tree"),
      name + ", ngram tree");
}

TEST(SpecLossless, Qwen35DeltaNetFixture) { check_fixture("qwen3_5_moe", "qwen3_5_moe_interval2"); }
TEST(SpecLossless, LagunaSlidingWindowFixture) { check_fixture("laguna_swa", "laguna"); }

// ---- MTP: the model's own multi-token-prediction layer drafts ------------------------------------

// How with_mtp fills the added block.
enum class MtpHead {
  Random,  // a trunk full-attention layer's weights, random eh_proj: drafts mostly rejected
  // A bigram lookup: the layer adds nothing (zero output projections), eh_proj passes the next token's
  // normed embedding through and nextn.shared_head_head maps it to the token that followed it in
  // `follows`, so the head drafts what the target did wherever the target repeats itself.
  Bigram,
};

// A copy of an F32 qwen35moe GGUF with one MTP block appended (blk.<n_layer>.nextn.* and the block's
// layer) as llama.cpp lays it out: block_count + 1, nextn_predict_layers 1.
std::string with_mtp(const std::string& src, const std::string& out, MtpHead mode, const std::vector<int32_t>& follows = {}) {
  const GgufFile in = GgufFile::open(src);
  const std::unique_ptr<Model> m = Model::load(src);
  const ModelConfig& c = m->config();
  int full = -1;
  for (int il = 0; il < c.n_layer; ++il)
    if (c.mixer(il) == LayerKind::FullAttention) full = il;
  EXPECT_GE(full, 0);
  const int64_t E = c.n_embd, V = c.n_vocab;
  GgufWriter w;
  for (const auto& [key, value] : in.metadata())
    if (key != "general.alignment") w.set(key, value);
  w.set("qwen35moe.block_count", GgufValue::u32(static_cast<uint32_t>(c.n_layer + 1)));
  w.set("qwen35moe.nextn_predict_layers", GgufValue::u32(1));
  std::vector<std::vector<float>> keep;
  auto add = [&](const std::string& name, std::vector<int64_t> ne, std::vector<float> v) {
    keep.push_back(std::move(v));
    w.add_tensor(name, GgmlType::F32, ne, keep.back().data(), keep.back().size() * sizeof(float));
  };
  const std::string from = "blk." + std::to_string(full) + ".", to = "blk." + std::to_string(c.n_layer) + ".";
  for (const GgufTensorInfo& t : in.tensors()) {
    w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data, t.nbytes);
    if (t.name.rfind(from, 0) != 0) continue;
    const std::string stem = t.name.substr(from.size());
    std::vector<float> v(static_cast<size_t>(t.n_elements()));
    std::memcpy(v.data(), t.data, v.size() * sizeof(float));
    const bool output = stem == "attn_output.weight" || stem == "ffn_down_exps.weight" || stem == "ffn_down_shexp.weight";
    if (mode == MtpHead::Bigram && output) std::fill(v.begin(), v.end(), 0.0f);
    add(to + stem, std::vector<int64_t>(t.ne, t.ne + t.n_dims), std::move(v));
  }
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(2 * E)));
  std::vector<float> eh(static_cast<size_t>(2 * E * E));
  for (int64_t r = 0; r < E; ++r)
    for (int64_t col = 0; col < 2 * E; ++col)
      eh[static_cast<size_t>(r * 2 * E + col)] = mode == MtpHead::Random ? normal(rng) : (col == r ? 1.0f : 0.0f);
  add(to + "nextn.eh_proj.weight", {2 * E, E}, std::move(eh));
  for (const char* norm : {"nextn.enorm.weight", "nextn.hnorm.weight", "nextn.shared_head_norm.weight"})
    add(to + norm, {E}, std::vector<float>(static_cast<size_t>(E), 1.0f));
  if (mode == MtpHead::Bigram) {
    // Row v: the sum of the normed embeddings of the tokens v followed (random directions, nearly
    // orthogonal, so each such token scores its follower highest).
    std::vector<float> head(static_cast<size_t>(V * E), 0.0f), e(static_cast<size_t>(E));
    for (size_t i = 0; i + 1 < follows.size(); ++i) {
      embed_tokens(m->weights().token_embd, &follows[i], 1, e.data());
      double ss = 0;
      for (float x : e) ss += static_cast<double>(x) * x;
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(E) + 1e-6));
      float* row = head.data() + static_cast<size_t>(follows[i + 1]) * static_cast<size_t>(E);
      for (int64_t k = 0; k < E; ++k) row[k] += e[static_cast<size_t>(k)] * inv;
    }
    add(to + "nextn.shared_head_head.weight", {E, V}, std::move(head));
  }
  w.write(out);
  return out;
}

spec_test::MakeDrafter mtp(const Model& m, int ctx) {
  return [&m, ctx]() -> std::unique_ptr<Drafter> {
    return std::make_unique<MtpDrafter>(m, ctx, static_cast<int32_t>(m.config().n_vocab));
  };
}

TEST(Mtp, RefusedWithoutAnMtpLayer) {
  const Loaded plain = load(convert_fixture("qwen3_5_moe"));
  SpecOptions o;
  o.spec = "mtp";
  EXPECT_EQ(check_spec_options(o).kind, SpecKind::Mtp);
  try {
    make_drafter(check_spec_options(o), o, *plain.model, 64, {}, 512);
    ADD_FAILURE() << "--spec mtp was accepted for a model without an MTP layer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(plain.path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nextn_predict_layers"), std::string::npos) << e.what();
  }
  o.draft_model = "d.gguf";
  EXPECT_THROW(check_spec_options(o), Error);  // mtp drafts without a draft model
}

// A session given a hidden record appends each kept token's final hidden state (the output matrix
// times it gives the token's logits) with its token; pending tokens count once kept, along the kept
// path; a reset restarts the record.
TEST(Mtp, SessionRecordsKeptHiddenStates) {
  const Loaded plain = load(convert_fixture("qwen3_5_moe"));
  const Model& m = *plain.model;
  const size_t V = static_cast<size_t>(m.config().n_vocab);
  Session s(m, 32);
  auto rec = std::make_shared<HiddenRecord>();
  s.set_hidden_record(rec);
  auto expect_logits = [&](int pos, const float* want) {
    std::vector<float> l(V);
    project(m.weights().output, rec->row(pos), 1, l.data());
    for (size_t i = 0; i < V; ++i) ASSERT_NEAR(l[i], want[i], 1e-4f * (1.0f + std::fabs(want[i]))) << pos << " " << i;
  };
  const std::vector<int32_t> prompt = {5, 6, 7, 8};
  std::vector<float> logits(4 * V);
  s.forward(prompt.data(), 4, logits.data(), true);
  ASSERT_EQ(rec->begin, 0);
  ASSERT_EQ(rec->tokens, prompt);
  for (int p = 0; p < 4; ++p) expect_logits(p, logits.data() + static_cast<size_t>(p) * V);
  const std::vector<int32_t> pending = {9, 10, 11};
  std::vector<float> pl(3 * V);
  s.forward_pending(pending.data(), 3, nullptr, pl.data());
  EXPECT_EQ(rec->size(), 4);
  s.keep_first(2);
  ASSERT_EQ(rec->tokens, (std::vector<int32_t>{5, 6, 7, 8, 9, 10}));
  expect_logits(4, pl.data());
  expect_logits(5, pl.data() + V);
  rec->drop_before(5);
  EXPECT_EQ(rec->begin, 5);
  EXPECT_EQ(rec->size(), 1);
  rec->restarted = false;
  s.reset();
  EXPECT_TRUE(rec->restarted);
  EXPECT_EQ(rec->begin, 0);
  EXPECT_EQ(rec->size(), 0);
}

// A record of chosen layers holds each kept token's residual stream after those layers, side by side:
// the last layer's tap, normed, is the final hidden state; a prompt's taps in one forward are its taps
// token by token; pending tokens count once kept, along the kept path; a layer the model lacks fails.
TEST(Mtp, SessionRecordsLayerTaps) {
  const Loaded plain = load(convert_fixture("qwen3_5_moe"));
  const Model& m = *plain.model;
  const ModelConfig& c = m.config();
  const size_t d = static_cast<size_t>(c.n_embd);
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9};
  Session a(m, 32), b(m, 32), f(m, 32);
  auto taps = std::make_shared<HiddenRecord>(), single = std::make_shared<HiddenRecord>();
  auto final_rows = std::make_shared<HiddenRecord>();
  taps->layers = {1, c.n_layer - 1};
  single->layers = taps->layers;
  a.set_hidden_record(taps);
  b.set_hidden_record(single);
  f.set_hidden_record(final_rows);
  EXPECT_EQ(taps->width, static_cast<int>(2 * d));
  a.forward(prompt.data(), 5, nullptr, false);
  for (int32_t t : prompt) b.forward(&t, 1, nullptr, false);
  f.forward(prompt.data(), 5, nullptr, false);
  ASSERT_EQ(taps->tokens, prompt);
  ASSERT_EQ(single->size(), 5);
  std::vector<float> normed(d);
  for (int p = 0; p < 5; ++p) {
    for (size_t i = 0; i < 2 * d; ++i)
      ASSERT_NEAR(taps->row(p)[i], single->row(p)[i], 1e-4f * (1.0f + std::fabs(single->row(p)[i]))) << p << " " << i;
    rmsnorm(taps->row(p) + d, m.weights().output_norm.data(), c.rms_eps, c.n_embd, normed.data());
    for (size_t i = 0; i < d; ++i) ASSERT_EQ(normed[i], final_rows->row(p)[i]) << p << " " << i;
  }
  const std::vector<int32_t> pending = {10, 11, 12};
  a.forward_pending(pending.data(), 3, nullptr, nullptr);
  b.forward(pending.data(), 2, nullptr, false);
  a.keep_first(2);
  ASSERT_EQ(taps->size(), 7);
  for (int p = 5; p < 7; ++p)
    for (size_t i = 0; i < 2 * d; ++i)
      ASSERT_NEAR(taps->row(p)[i], single->row(p)[i], 1e-4f * (1.0f + std::fabs(single->row(p)[i]))) << p << " " << i;
  auto bad = std::make_shared<HiddenRecord>();
  bad->layers = {c.n_layer};
  Session s(m, 8);
  EXPECT_THROW(s.set_hidden_record(bad), Error);
  bad->layers = {1, 1};
  EXPECT_THROW(s.set_hidden_record(bad), Error);
}

// A prompt longer than one forward of a sliding-window model runs in pieces: each piece's taps land in
// its own rows (as token by token).
TEST(Mtp, LayerTapsOfAPromptInPieces) {
  const Loaded sw = load(convert_fixture("laguna_swa"));
  const Model& m = *sw.model;
  const int n_layer = m.config().n_layer;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 11; ++i) prompt.push_back(static_cast<int32_t>((i * 37 + 5) % 300));
  Session pieces(m, 32, {}, 4), single(m, 32, {}, 4);  // at most 4 tokens per forward
  auto a = std::make_shared<HiddenRecord>(), b = std::make_shared<HiddenRecord>();
  a->layers = b->layers = {0, n_layer - 1};
  pieces.set_hidden_record(a);
  single.set_hidden_record(b);
  pieces.forward(prompt.data(), 11, nullptr, false);
  for (int32_t t : prompt) single.forward(&t, 1, nullptr, false);
  ASSERT_EQ(a->size(), 11);
  for (size_t i = 0; i < a->rows.size(); ++i)
    ASSERT_NEAR(a->rows[i], b->rows[i], 1e-4f * (1.0f + std::fabs(b->rows[i]))) << i;
}

// One batch of rows and the same rows one by one leave the same outputs and cache: the drafter's
// catch-up (a batch) and its chain (single rows) are the same head.
TEST(Mtp, BatchEqualsRowByRow) {
  const Loaded plain = load(convert_fixture("qwen3_5_moe"));
  const Loaded t = load(with_mtp(plain.path, tmp_file("mtp_rows").string(), MtpHead::Random));
  const Model& m = *t.model;
  const size_t d = static_cast<size_t>(m.config().n_embd);
  const int n = 5;
  std::vector<int32_t> tokens = {3, 99, 41, 7, 300};
  std::vector<float> hidden(n * d), a(n * d), b(n * d), la(static_cast<size_t>(m.config().n_vocab)), lb(la.size());
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (float& x : hidden) x = normal(rng);
  MtpState sa(m, 16), sb(m, 16);
  mtp_forward(m, 0, sa, tokens.data(), hidden.data(), n, a.data(), la.data());
  for (int i = 0; i < n; ++i)
    mtp_forward(m, 0, sb, &tokens[static_cast<size_t>(i)], hidden.data() + i * d, 1, b.data() + i * d, lb.data());
  EXPECT_EQ(sa.n_past(), n);
  EXPECT_EQ(sb.n_past(), n);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4f * (1.0f + std::fabs(b[i]))) << i;
  for (size_t i = 0; i < la.size(); ++i) ASSERT_NEAR(la[i], lb[i], 1e-3f * (1.0f + std::fabs(lb[i]))) << i;
}

// Greedy output with --spec mtp is the target's token for token, with a random head (drafts rejected)
// and with a head that drafts the target's own bigrams (drafts accepted and rejected); the same through
// make_drafter.
TEST(SpecLossless, MtpHeadOnTheQwen35Fixture) {
  const Loaded plain = load(convert_fixture("qwen3_5_moe"));
  const int32_t V = static_cast<int32_t>(plain.model->config().n_vocab);
  spec_test::Case c;
  c.prompt = pattern_prompt();
  c.n_new = 48;
  c.sampling = greedy_no_end(*plain.tokenizer, V);
  const int ctx = static_cast<int>(c.prompt.size()) + c.n_new + 1;

  const Loaded random = load(with_mtp(plain.path, tmp_file("mtp_random").string(), MtpHead::Random));
  const auto make_random = cpu_sequences(*random.model);
  const GenerationStats r =
      spec_test::expect_lossless(make_random, *random.tokenizer, c, mtp(*random.model, ctx), true, "random MTP head");
  EXPECT_GT(r.spec_steps, 0);
  EXPECT_LT(r.accepted_tokens, r.drafted_tokens);
  // The trunk is the plain model's: the MTP block changes nothing it computes.
  const spec_test::Outcome a = spec_test::generate_case(cpu_sequences(*plain.model), *plain.tokenizer, c, nullptr);
  const spec_test::Outcome b = spec_test::generate_case(make_random, *random.tokenizer, c, nullptr);
  EXPECT_EQ(a.result.tokens, b.result.tokens);

  // The bigram head, built from the plain run (prompt and output).
  std::vector<int32_t> text = c.prompt;
  text.insert(text.end(), a.result.tokens.begin(), a.result.tokens.end());
  const Loaded bigram = load(with_mtp(plain.path, tmp_file("mtp_bigram").string(), MtpHead::Bigram, text));
  const auto make_bigram = cpu_sequences(*bigram.model);
  const GenerationStats s =
      spec_test::expect_lossless(make_bigram, *bigram.tokenizer, c, mtp(*bigram.model, ctx), true, "bigram MTP head");
  expect_accepts_and_rejects(s, "bigram MTP head");
  for (int draft_max : {1, 3}) {
    c.draft_max = draft_max;
    const GenerationStats k = spec_test::expect_lossless(make_bigram, *bigram.tokenizer, c, mtp(*bigram.model, ctx), true,
                                                         "bigram MTP head, draft-max " + std::to_string(draft_max));
    EXPECT_GT(k.accepted_tokens, 0) << draft_max;
  }
  SpecOptions o;
  o.spec = "mtp";
  const auto via_options = [&]() -> std::unique_ptr<Drafter> {
    return make_drafter(check_spec_options(o), o, *bigram.model, ctx, c.sampling, V);
  };
  c.draft_max = 4;
  EXPECT_GT(spec_test::expect_lossless(make_bigram, *bigram.tokenizer, c, via_options, true, "--spec mtp").accepted_tokens, 0);
}

// A drafter kept across generations on one sequence (a chat's turns): the head's cache follows the
// sequence, and a reset starts it over; output stays the target's.
TEST(Mtp, FollowsTheSequenceAcrossGenerations) {
  const Loaded plain = load(convert_fixture("qwen3_5_moe"));
  const int32_t V = static_cast<int32_t>(plain.model->config().n_vocab);
  std::vector<int32_t> text = pattern_prompt();
  const spec_test::Outcome ref = spec_test::generate_case(
      cpu_sequences(*plain.model), *plain.tokenizer, spec_test::Case{pattern_prompt(), 48, 0, 8, greedy_no_end(*plain.tokenizer, V), {}}, nullptr);
  text.insert(text.end(), ref.result.tokens.begin(), ref.result.tokens.end());
  const Loaded bigram = load(with_mtp(plain.path, tmp_file("mtp_turns").string(), MtpHead::Bigram, text));
  const Model& m = *bigram.model;
  auto run_turns = [&](Drafter* drafter) {
    Session s(m, 256);
    std::vector<int32_t> out, held;
    for (int turn = 0; turn < 3; ++turn) {
      if (turn == 2) s.reset(), held.clear();
      Sampler sampler(greedy_no_end(*bigram.tokenizer, V));
      GenerationParams params;
      params.max_new_tokens = 16;
      params.spec.drafter = drafter;
      params.spec.draft_max = 4;
      params.spec.preceding = &held;
      const std::vector<int32_t> prompt = {300, 41, 302, static_cast<int32_t>(77 + turn)};
      const GenerationResult r = generate(s, *bigram.tokenizer, sampler, prompt, params, {});
      held.insert(held.end(), prompt.begin(), prompt.end());
      held.insert(held.end(), r.tokens.begin(), r.tokens.begin() + r.tokens_in_session);
      out.insert(out.end(), r.tokens.begin(), r.tokens.end());
    }
    return out;
  };
  MtpDrafter drafter(m, 256, V);
  EXPECT_EQ(run_turns(&drafter), run_turns(nullptr));
}

// ---- sampled generation keeps its distribution -------------------------------------------------

// The chi-square statistic's bound at significance 1e-4 for `df` degrees of freedom (Wilson-Hilferty).
double chi2_bound(int df) {
  const double z = 3.719, k = df;
  const double t = 1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k));
  return k * t * t * t;
}

TEST(SpecSampled, FirstTokensKeepTheirDistribution) {
  const Loaded target = load(convert_fixture("qwen3_5_moe"));
  const Loaded other = load(spec_test::perturbed_copy(target.path, tmp_file("spec_qwen35_perturbed").string(), 0.3));
  const int32_t V = static_cast<int32_t>(target.model->config().n_vocab);
  SamplerParams sp = greedy_no_end(*target.tokenizer, V);
  sp.temperature = 1.0f;
  sp.top_k = 2;
  sp.presence_penalty = 0.7f;  // each position's distribution depends on the tokens before it
  const std::vector<int32_t> prompt = pattern_prompt();
  constexpr int K = 4;
  const int ctx = static_cast<int>(prompt.size()) + K + 1;

  // The exact distribution of the first K tokens, enumerated over the top-2 tree.
  std::map<std::vector<int32_t>, double> exact;
  std::function<void(std::vector<int32_t>, double)> walk = [&](std::vector<int32_t> prefix, double prob) {
    if (static_cast<int>(prefix.size()) == K) {
      exact[prefix] = prob;
      return;
    }
    Session s(*target.model, ctx);
    std::vector<int32_t> seen = prompt;
    seen.insert(seen.end(), prefix.begin(), prefix.end());
    std::vector<float> logits(static_cast<size_t>(V));
    s.forward(seen.data(), static_cast<int>(seen.size()), logits.data(), false);
    Sampler sampler(sp);
    TokenDistribution p;
    sampler.distribution(logits.data(), V, seen, p);
    for (size_t i = 0; i < p.ids.size(); ++i) {
      std::vector<int32_t> next = prefix;
      next.push_back(p.ids[i]);
      walk(next, prob * p.weights[i] / p.total);
    }
  };
  walk({}, 1.0);
  ASSERT_EQ(exact.size(), 16u);

  const int runs = 1500;
  auto histogram = [&](Drafter* drafter, GenerationStats* sum) {
    std::map<std::vector<int32_t>, int> counts;
    for (int seed = 0; seed < runs; ++seed) {
      Session s(*target.model, ctx);
      SamplerParams p = sp;
      p.seed = static_cast<uint64_t>(seed);
      Sampler sampler(p);
      GenerationParams gp;
      gp.max_new_tokens = K;
      gp.spec.drafter = drafter;
      gp.spec.draft_max = 3;
      const GenerationResult r = generate(s, *target.tokenizer, sampler, prompt, gp, {});
      ++counts[r.tokens];
      if (sum) {
        sum->spec_steps += r.stats.spec_steps;
        sum->drafted_tokens += r.stats.drafted_tokens;
        sum->accepted_tokens += r.stats.accepted_tokens;
      }
    }
    return counts;
  };
  auto chi2 = [&](const std::map<std::vector<int32_t>, int>& counts, const std::string& what) {
    double x2 = 0;
    int total = 0;
    for (const auto& [seq, n] : counts) {
      EXPECT_TRUE(exact.count(seq)) << what << ": a sequence outside the top-2 tree";
      total += n;
    }
    for (const auto& [seq, prob] : exact) {
      const double e = prob * runs;
      const auto it = counts.find(seq);
      const double o = it == counts.end() ? 0.0 : it->second;
      x2 += (o - e) * (o - e) / e;
    }
    EXPECT_EQ(total, runs);
    EXPECT_LT(x2, chi2_bound(static_cast<int>(exact.size()) - 1)) << what;
  };
  chi2(histogram(nullptr, nullptr), "plain sampling");

  GenerationStats other_stats, fixed_stats;
  DraftModelDrafter sampled_draft(std::make_unique<Session>(*other.model, ctx), draft_sampling(sp), V);
  chi2(histogram(&sampled_draft, &other_stats), "a perturbed model's sampled drafts");
  expect_accepts_and_rejects(other_stats, "sampled drafts");
  // --draft-p-min ends proposals by the draft's confidence, decided before each draw: still exact.
  GenerationStats sure_stats;
  DraftModelDrafter sure_draft(std::make_unique<Session>(*other.model, ctx), draft_sampling(sp), V, nullptr, 0.7f);
  chi2(histogram(&sure_draft, &sure_stats), "sampled drafts with a minimum probability");
  expect_accepts_and_rejects(sure_stats, "sampled drafts with a minimum probability");
  EXPECT_LT(sure_stats.drafted_tokens, other_stats.drafted_tokens) << "the minimum shortens some proposals";
  // Deterministic drafts: the most likely sequence, accepted with probability p at each position.
  std::vector<int32_t> likely;
  double best = 0;
  for (const auto& [seq, prob] : exact)
    if (prob > best) best = prob, likely = seq;
  ScriptDrafter fixed(prompt.size(), likely);
  chi2(histogram(&fixed, &fixed_stats), "deterministic drafts");
  expect_accepts_and_rejects(fixed_stats, "deterministic drafts");
  // A token tree: both likely tokens at each node (the less likely one first), a node's children before
  // their subtrees, up to the draft budget; each node's outcome must still be distributed as p.
  class BothChildren final : public Drafter {
   public:
    BothChildren(size_t n_prompt, const std::map<std::vector<int32_t>, double>& seqs) : n_prompt_(n_prompt), seqs_(seqs) {}
    std::string name() const override { return "both"; }
    void propose(const std::vector<int32_t>& history, int max_tokens, Draft& out) override {
      out.clear();
      const std::vector<int32_t> prefix(history.begin() + static_cast<std::ptrdiff_t>(n_prompt_), history.end());
      add(prefix, -1, max_tokens, out);
    }

   private:
    void add(const std::vector<int32_t>& prefix, int parent, int max_tokens, Draft& out) const {
      std::map<int32_t, double> next;  // next token -> probability mass of the sequences through it
      for (const auto& [seq, prob] : seqs_)
        if (seq.size() > prefix.size() && std::equal(prefix.begin(), prefix.end(), seq.begin()))
          next[seq[prefix.size()]] += prob;
      std::vector<std::pair<double, int32_t>> order;
      for (const auto& [t, m] : next) order.push_back({m, t});
      std::sort(order.begin(), order.end());  // least likely first
      std::vector<int> at;
      for (const auto& [m, t] : order) {  // a node's children first, then their subtrees
        if (static_cast<int>(out.tokens.size()) >= max_tokens) break;
        out.tokens.push_back(t);
        out.parents.push_back(parent);
        at.push_back(static_cast<int>(out.tokens.size()) - 1);
      }
      for (const int a : at) {
        std::vector<int32_t> deeper = prefix;
        deeper.push_back(out.tokens[static_cast<size_t>(a)]);
        add(deeper, a, max_tokens, out);
      }
    }
    size_t n_prompt_;
    const std::map<std::vector<int32_t>, double>& seqs_;
  };
  GenerationStats tree_stats;
  BothChildren both(prompt.size(), exact);
  chi2(histogram(&both, &tree_stats), "token-tree drafts");
  expect_accepts_and_rejects(tree_stats, "token-tree drafts");
}

// With sampling, --draft-p-min looks at the distribution a draft is drawn from, never at the token
// drawn: whether a position is drafted cannot depend on the draw (else the drafted tokens would not be
// distributed as q, and verification against q would not be exact). Between a top-2 distribution's two
// probabilities, every seed drafts, and both tokens turn up.
TEST(DraftModel, MinimumProbabilityIsDecidedBeforeTheDraw) {
  const Loaded target = load(convert_fixture("qwen3_5_moe"));
  const int32_t V = static_cast<int32_t>(target.model->config().n_vocab);
  SamplerParams sp = greedy_no_end(*target.tokenizer, V);
  sp.temperature = 1.0f;
  sp.top_k = 2;
  const std::vector<int32_t> prompt = pattern_prompt();
  const int ctx = static_cast<int>(prompt.size()) + 4;
  Session s(*target.model, ctx);
  std::vector<float> logits(static_cast<size_t>(V));
  s.forward(prompt.data(), static_cast<int>(prompt.size()), logits.data(), false);
  Sampler sampler(draft_sampling(sp));
  TokenDistribution q;
  sampler.distribution(logits.data(), V, {}, q);
  ASSERT_EQ(q.ids.size(), 2u);
  const double lo = std::min(q.weights[0], q.weights[1]) / q.total, hi = std::max(q.weights[0], q.weights[1]) / q.total;
  ASSERT_GT(lo, 0.02) << "the test needs both tokens drawn now and then";
  const float p_min = static_cast<float>((lo + hi) / 2);
  std::set<int32_t> drawn;
  for (int seed = 0; seed < 200; ++seed) {
    SamplerParams d = sp;
    d.seed = static_cast<uint64_t>(seed);
    DraftModelDrafter drafter(std::make_unique<Session>(*target.model, ctx), draft_sampling(d), V, nullptr, p_min);
    Draft out;
    drafter.propose(prompt, 1, out);
    ASSERT_EQ(out.tokens.size(), 1u) << "seed " << seed;
    drawn.insert(out.tokens[0]);
  }
  EXPECT_EQ(drawn.size(), 2u);
}

// ---- a verified step stops where plain decoding stops ------------------------------------------

class SpecLimits : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { text_ = new Loaded(load(testing_fixture::make_text_model("test_spec_limits"))); }
  static void TearDownTestSuite() { delete text_; }

  static int32_t n_vocab() { return static_cast<int32_t>(text_->model->config().n_vocab); }
  // The plain greedy continuation of the prompt, ends banned: what the scripted drafter proposes.
  static std::vector<int32_t> reference(const std::vector<int32_t>& prompt, int n) {
    spec_test::Case c;
    c.prompt = prompt;
    c.n_new = n;
    c.sampling = greedy_no_end(*text_->tokenizer, n_vocab());
    return spec_test::generate_case(cpu_sequences(*text_->model), *text_->tokenizer, c, nullptr).result.tokens;
  }
  static spec_test::MakeDrafter script(const std::vector<int32_t>& prompt, int n) {
    const std::vector<int32_t> ref = reference(prompt, n);
    return [prompt, ref] { return std::make_unique<ScriptDrafter>(prompt.size(), ref); };
  }
  std::vector<int32_t> prompt() const { return text_->tokenizer->encode("def fibonacci(n):"); }

  static Loaded* text_;
};
Loaded* SpecLimits::text_ = nullptr;

TEST_F(SpecLimits, TokenLimitInsideAcceptedDrafts) {
  for (int n : {1, 2, 5, 9}) {
    spec_test::Case c;
    c.prompt = prompt();
    c.n_new = n;
    c.draft_max = 16;
    c.sampling = greedy_no_end(*text_->tokenizer, n_vocab());
    const GenerationStats s =
        spec_test::expect_lossless(cpu_sequences(*text_->model), *text_->tokenizer, c, script(c.prompt, 40), true, "n " + std::to_string(n));
    EXPECT_EQ(s.generated_tokens, n);
    if (n > 1) {
      EXPECT_EQ(s.accepted_tokens, n - 2) << "one verification: drafts clamped to the tokens left";
    }
  }
}

TEST_F(SpecLimits, EndTokenInsideAcceptedDrafts) {
  const std::vector<int32_t> p = prompt();
  const std::vector<int32_t> ref = reference(p, 24);
  // A tokenizer whose end token is the reference's sixth token: plain decoding stops there.
  Vocab v = testing_fixture::byte_vocab(n_vocab());
  v.tokens[256] = "<|end_not_here|>";
  v.eos_id = ref[5];
  const Tokenizer tok(v);
  spec_test::Case c;
  c.prompt = p;
  c.n_new = 24;
  c.draft_max = 16;
  c.sampling.temperature = 0;
  const GenerationStats s = spec_test::expect_lossless(
      cpu_sequences(*text_->model), tok, c, [&] { return std::make_unique<ScriptDrafter>(p.size(), ref); });
  const spec_test::Outcome plain = spec_test::generate_case(cpu_sequences(*text_->model), tok, c, nullptr);
  EXPECT_EQ(plain.result.stop_reason, StopReason::EndOfGeneration);
  EXPECT_LT(s.generated_tokens, 24);
  EXPECT_GT(s.accepted_tokens, s.generated_tokens - 1) << "the end token came inside a verified step";
}

TEST_F(SpecLimits, StopStringInsideAcceptedDrafts) {
  spec_test::Case c;
  c.prompt = prompt();
  c.n_new = 24;
  c.draft_max = 16;
  c.sampling = greedy_no_end(*text_->tokenizer, n_vocab());
  const spec_test::Outcome plain = spec_test::generate_case(cpu_sequences(*text_->model), *text_->tokenizer, c, nullptr);
  const std::string text = plain.result.text;
  ASSERT_GT(text.size(), 12u);
  c.stop_strings = {text.substr(text.size() / 2, 3)};
  const GenerationStats s =
      spec_test::expect_lossless(cpu_sequences(*text_->model), *text_->tokenizer, c, script(c.prompt, 24));
  const spec_test::Outcome stopped = spec_test::generate_case(cpu_sequences(*text_->model), *text_->tokenizer, c, nullptr);
  EXPECT_EQ(stopped.result.stop_reason, StopReason::StopString);
  EXPECT_GT(s.accepted_tokens, s.generated_tokens - 1) << "the stop string came inside a verified step";
}

TEST_F(SpecLimits, ContextNearlyFull) {
  for (int room : {1, 2, 3, 6}) {
    spec_test::Case c;
    c.prompt = prompt();
    c.n_new = 24;
    c.draft_max = 16;
    c.max_ctx = static_cast<int>(c.prompt.size()) + room;
    c.sampling = greedy_no_end(*text_->tokenizer, n_vocab());
    spec_test::expect_lossless(cpu_sequences(*text_->model), *text_->tokenizer, c, script(c.prompt, 24), true,
                               "room " + std::to_string(room));
    const spec_test::Outcome r = spec_test::generate_case(cpu_sequences(*text_->model), *text_->tokenizer, c, nullptr);
    EXPECT_EQ(r.result.stop_reason, StopReason::ContextFull);
  }
}

TEST_F(SpecLimits, CallbackStopInsideAcceptedDrafts) {
  const std::vector<int32_t> p = prompt();
  auto run = [&](Drafter* d) {
    Session s(*text_->model, 64);
    Sampler sampler(greedy_no_end(*text_->tokenizer, n_vocab()));
    GenerationParams gp;
    gp.max_new_tokens = 20;
    gp.spec.drafter = d;
    int pieces = 0;
    GenerationResult r = generate(s, *text_->tokenizer, sampler, p, gp, [&](std::string_view) { return ++pieces < 4; });
    return std::make_pair(r, s.n_past());
  };
  const auto plain = run(nullptr);
  auto drafter = script(p, 20)();
  const auto spec = run(drafter.get());
  EXPECT_EQ(spec.first.stop_reason, StopReason::Cancelled);
  EXPECT_EQ(spec.first.tokens, plain.first.tokens);
  EXPECT_EQ(spec.first.text, plain.first.text);
  EXPECT_EQ(spec.first.tokens_in_session, plain.first.tokens_in_session);
  EXPECT_EQ(spec.second, plain.second);
  EXPECT_GT(spec.first.stats.accepted_tokens, 0);
}

TEST_F(SpecLimits, MalformedTreesAreRefused) {
  class Bad final : public Drafter {
   public:
    explicit Bad(int kind) : kind_(kind) {}
    std::string name() const override { return "bad"; }
    void propose(const std::vector<int32_t>&, int, Draft& out) override {
      out.clear();
      out.tokens = {5, 6};
      if (kind_ == 0) out.parents = {-1, 1};  // a parent that does not come first
      if (kind_ == 1) out.parents = {-1, -1}, out.tokens = {5, 5};  // one token twice under one parent
      if (kind_ == 2) out.parents = {-1};  // parents of another length
      if (kind_ == 3) out.parents = {-1, 0}, out.q.resize(2);  // a sampled tree
    }

   private:
    int kind_;
  };
  for (int kind = 0; kind < 4; ++kind) {
    Session s(*text_->model, 64);
    Sampler sampler(greedy_no_end(*text_->tokenizer, n_vocab()));
    Bad bad(kind);
    GenerationParams gp;
    gp.max_new_tokens = 8;
    gp.spec.drafter = &bad;
    EXPECT_THROW(generate(s, *text_->tokenizer, sampler, prompt(), gp, {}), Error) << "kind " << kind;
    EXPECT_FALSE(s.has_pending()) << "kind " << kind;
  }
}

// Bans every odd id: verification would have to advance the constraint per drafted position, so
// speculation is off and says so.
class EvenOnly final : public TokenConstraint {
 public:
  void mask(float* logits, int32_t n_vocab) override {
    for (int32_t id = 1; id < n_vocab; id += 2) logits[id] = kBan;
  }
  void accept(int32_t) override { ++accepted; }
  int accepted = 0;
};

TEST_F(SpecLimits, ConstraintTurnsSpeculationOff) {
  const std::vector<int32_t> p = prompt();
  auto run = [&](Drafter* d) {
    Session s(*text_->model, 64);
    Sampler sampler(greedy_no_end(*text_->tokenizer, n_vocab()));
    EvenOnly even;
    sampler.set_constraint(&even);
    GenerationParams gp;
    gp.max_new_tokens = 12;
    gp.spec.drafter = d;
    return generate(s, *text_->tokenizer, sampler, p, gp, {});
  };
  const GenerationResult plain = run(nullptr);
  NgramDrafter lookup(NgramParams{1, 4});
  const GenerationResult spec = run(&lookup);
  EXPECT_EQ(spec.tokens, plain.tokens);
  for (int32_t id : spec.tokens) EXPECT_EQ(id % 2, 0);
  EXPECT_FALSE(spec.stats.spec_off.empty());
  EXPECT_TRUE(spec.stats.drafter.empty());
  EXPECT_EQ(spec.stats.spec_steps, 0);
}

}  // namespace

// ---- the command line -------------------------------------------------------------------------

TEST(SpecCli, RunAndBenchSpeculateWithoutChangingTheOutput) {
  const std::string prompt = "\"def area(w, h):\\n    return w * h\\n\\n\\ndef area(w, h):\\n    return\"";
  const auto spec =
      testing_cli::expect_spec_run_lossless(prompt + " --temp 0 -n 24 -t 1", "--spec ngram --draft-max 4");
  EXPECT_NE(spec.err.find("spec ngram:"), std::string::npos) << spec.err;
  const auto bad = testing_cli::run_cli("run x --spec draft:");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--spec draft:FILE needs a file name"), std::string::npos) << bad.err;
  // Without -md, the model's own draft model next to it: the bundled model has none.
  const auto own = testing_cli::run_cli("run x --spec draft");
  EXPECT_NE(own.exit_code, 0);
  EXPECT_NE(own.err.find("no draft model next to the model"), std::string::npos) << own.err;
  EXPECT_NE(own.err.find("strata-tiny.draft.gguf"), std::string::npos) << own.err;
  const auto bench = testing_cli::run_cli("bench --spec ngram -n 8 -r 1 -t 1 --draft-max 3");
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  EXPECT_NE(bench.out.find("token-identical"), std::string::npos) << bench.out;
  EXPECT_NE(bench.out.find("verify cost"), std::string::npos) << bench.out;
}
