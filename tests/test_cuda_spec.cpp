// Speculative decoding on the GPU: greedy generation with a drafter is token for token what the same GPU
// sessions give without one (tests/spec_lossless.h), all-GPU and hybrid (most experts cold), on the
// bundled model and the qwen3_5_moe (DeltaNet) and laguna_swa (sliding window) fixtures, with n-gram
// lookup, scripted drafts (rejections at every depth), draft models on the CPU and on the GPU, and the MTP head
// (on the GPU next to all-GPU targets, on the CPU next to hybrid ones; the bundled model has a trained one).
// Two ways to run the target: prompts and verifications token by token through the decode step (the
// state generation leaves gives logits within 1e-5 of the plain run's; they are not bit-equal on the
// GPU, unlike the CPU's); and prompts through the batched prefill in exact math, verifications through
// the multi-token decode step of all-GPU sessions (bitwise the decode steps':
// check_multi_token_step_bitwise) and the prefill's GEMMs in hybrid ones (within 1e-3). Keeping any prefix of a
// verified chain leaves the state a plain run of that prefix leaves (check_keep_every_prefix).
// Skips where CUDA is not built or no GPU exists.
#include <gtest/gtest.h>

#ifndef STRATA_HAVE_CUDA
TEST(CudaSpec, Skipped) { GTEST_SKIP() << "built without CUDA (STRATA_HAVE_CUDA undefined)"; }
#else

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "cuda_test_models.h"
#include "dflash_test_util.h"
#include "logits_compare.h"
#include "spec_lossless.h"
#include "strata/cpu/cpu_kernels.h"
#include "strata/cuda/gpu_model.h"
#include "strata/cuda/gpu_session.h"
#include "strata/engine/dflash.h"
#include "strata/engine/hidden_record.h"
#include "strata/engine/model.h"
#include "strata/engine/mtp.h"
#include "strata/engine/sequence_state.h"
#include "strata/engine/session.h"
#include "strata/spec/dflash_drafter.h"
#include "strata/spec/draft_model.h"
#include "strata/spec/mtp_drafter.h"
#include "strata/spec/ngram_drafter.h"
#include "strata/spec/spec_options.h"
#include "strata/text/tokenizer.h"
#include "strata/text/vocab.h"
#include "text_model_fixture.h"

namespace {

namespace fs = std::filesystem;
namespace sc = strata::cuda;
using namespace strata;
using spec_test::expect_accepts_and_rejects;
using spec_test::greedy_no_end;
using spec_test::load;
using spec_test::Loaded;
using SlotMap = std::vector<std::vector<int>>;

const std::string kTiny = (fs::path(STRATA_SOURCE_DIR) / "models" / "strata-tiny.gguf").string();

std::string tmp_path(const std::string& name) { return (cuda_test::tmp_dir() / (name + ".gguf")).string(); }

// A third of each MoE layer's experts hot (slots in ascending id), the rest cold; dense layers: empty rows.
SlotMap third_hot(const Model& m) {
  const auto& c = m.config();
  SlotMap s(static_cast<size_t>(c.n_layer), std::vector<int>(static_cast<size_t>(c.n_expert), -1));
  for (int l = 0; l < c.n_layer; ++l) {
    if (c.layer(l).ffn != FfnKind::Moe) {
      s[static_cast<size_t>(l)].clear();
      continue;
    }
    int next = 0;
    for (int e = 0; e < c.n_expert; ++e)
      if ((e + l) % 3 == 0) s[static_cast<size_t>(l)][static_cast<size_t>(e)] = next++;
  }
  return s;
}

// How the target runs: decode-step prompts and verifications (exact: bit-equal state) or the batched
// prefill in exact math; all experts on the GPU or a third of them.
struct Backend {
  std::string name;
  bool hybrid = false;
  bool batched_prefill = false;
};

std::shared_ptr<sc::GpuModel> gpu_model(const Model& m, const Backend& b) {
  sc::GpuSessionOptions o;
  o.batched_prefill = b.batched_prefill;
  o.prefill_math = sc::PrefillMath::Exact;
  if (b.hybrid) {
    o.expert_slots = third_hot(m);
    o.cpu_threads = 2;
  }
  return sc::make_gpu_model(m, o);
}

// Sessions over gm that run prompts and verifications as the backend says (a session's own options
// decide between the batched prefill and the decode step).
spec_test::MakeSequence gpu_sequences(const std::shared_ptr<sc::GpuModel>& gm, const Backend& b) {
  sc::GpuSessionOptions o;
  o.batched_prefill = b.batched_prefill;
  return [gm, o](int ctx) -> std::unique_ptr<Sequence> { return sc::make_gpu_session(gm, ctx, o); };
}

// A draft model drafting greedily (the target is greedy), on the CPU or in GPU sessions over `gm`.
spec_test::MakeDrafter cpu_draft(const Model& draft, int ctx, const SamplerParams& target) {
  return [&draft, ctx, target]() -> std::unique_ptr<Drafter> {
    return std::make_unique<DraftModelDrafter>(std::make_unique<Session>(draft, ctx), draft_sampling(target),
                                               static_cast<int32_t>(draft.config().n_vocab));
  };
}
spec_test::MakeDrafter gpu_draft(const std::shared_ptr<sc::GpuModel>& gm, const Model& draft, int ctx,
                                 const SamplerParams& target) {
  return [gm, &draft, ctx, target]() -> std::unique_ptr<Drafter> {
    return std::make_unique<DraftModelDrafter>(sc::make_gpu_session(gm, ctx), draft_sampling(target),
                                               static_cast<int32_t>(draft.config().n_vocab));
  };
}
// The target's own MTP layer: its head on the GPU next to an all-GPU target (GpuMtpHead), on the CPU
// over the hidden rows a hybrid one copies.
spec_test::MakeDrafter mtp(const Model& m, int ctx) {
  return [&m, ctx]() -> std::unique_ptr<Drafter> {
    return std::make_unique<MtpDrafter>(m, ctx, static_cast<int32_t>(m.config().n_vocab));
  };
}
spec_test::MakeDrafter ngram(int min_n, int max_n) {
  return [min_n, max_n]() -> std::unique_ptr<Drafter> { return std::make_unique<NgramDrafter>(NgramParams{min_n, max_n}); };
}

void add(GenerationStats& sum, const GenerationStats& s) {
  sum.spec_steps += s.spec_steps;
  sum.drafted_tokens += s.drafted_tokens;
  sum.accepted_tokens += s.accepted_tokens;
}

void print(const std::string& what, const GenerationStats& s) {
  std::printf("[cuda-spec] %s: %d/%d drafts accepted over %d verifications\n", what.c_str(), s.accepted_tokens,
              s.drafted_tokens, s.spec_steps);
}

// Every drafter against the target on each backend. `draft` is another model of the target's
// vocabulary (agreeing with it often, not always).
void check_model(const Loaded& target, const Loaded& draft, const spec_test::Case& c, const std::string& label) {
  const int32_t V = static_cast<int32_t>(target.model->config().n_vocab);
  const int ctx = static_cast<int>(c.prompt.size()) + c.n_new + 1;
  const auto draft_gm = sc::make_gpu_model(*draft.model);
  const auto self_gm = sc::make_gpu_model(*target.model);
  for (const Backend& b : {Backend{"all-GPU decode-step", false, false}, Backend{"all-GPU prefill", false, true},
                           Backend{"hybrid decode-step", true, false}, Backend{"hybrid prefill", true, true}}) {
    const std::string where = label + ", " + b.name;
    SCOPED_TRACE(where);
    const auto gm = gpu_model(*target.model, b);
    const auto make = gpu_sequences(gm, b);
    const double tol = b.batched_prefill ? 1e-3 : 1e-5;
    GenerationStats all;

    const GenerationStats ng = spec_test::expect_lossless(make, *target.tokenizer, c, ngram(1, 4), true, where + ", ngram", tol);
    print(where + ", ngram", ng);
    EXPECT_GT(ng.accepted_tokens, 0) << where << ": n-gram lookup on a repeating prompt";
    add(all, ng);

    for (const auto& [name, make_drafter] :
         {std::pair<std::string, spec_test::MakeDrafter>{"draft on the CPU", cpu_draft(*draft.model, ctx, c.sampling)},
          std::pair<std::string, spec_test::MakeDrafter>{"draft on the GPU", gpu_draft(draft_gm, *draft.model, ctx, c.sampling)},
          std::pair<std::string, spec_test::MakeDrafter>{"itself as draft on the GPU",
                                                          gpu_draft(self_gm, *target.model, ctx, c.sampling)}}) {
      const GenerationStats s = spec_test::expect_lossless(make, *target.tokenizer, c, make_drafter, true, where + ", " + name, tol);
      print(where + ", " + name, s);
      EXPECT_GT(s.spec_steps, 0) << where << ", " << name;
      add(all, s);
    }

    {  // A random DFlash drafter: the GPU session's layer taps feed it; its trees are rejected, not the output.
      dflash_test::Shape shape;
      shape.taps = {0, target.model->config().n_layer - 1};
      const std::shared_ptr<const DFlashModel> df =
          DFlashModel::load(dflash_test::write_drafter(*target.model, shape, "cuda_spec.gguf"), *target.model);
      const GenerationStats s = spec_test::expect_lossless(
          make, *target.tokenizer, c, [df, V, ctx] { return std::make_unique<DFlashDrafter>(df, V, 2, ctx); }, true,
          where + ", dflash", tol);
      print(where + ", dflash", s);
      EXPECT_GT(s.drafted_tokens, s.spec_steps) << where << ": DFlash drafts trees";
      add(all, s);
    }

    if (target.model->config().n_mtp > 0) {
      const GenerationStats s = spec_test::expect_lossless(make, *target.tokenizer, c, mtp(*target.model, ctx), true,
                                                           where + ", mtp", tol);
      print(where + ", mtp", s);
      EXPECT_GT(s.accepted_tokens, 0) << where << ": the bundled model's trained MTP head";
      add(all, s);
    }

    // Drafts right but for every k-th token: rejections at every depth of the chain.
    const spec_test::Outcome plain = spec_test::generate_case(make, *target.tokenizer, c, nullptr);
    for (int every : {2, 3, 5}) {
      const std::vector<int32_t> ref = plain.result.tokens;
      const size_t n_prompt = c.prompt.size();
      const GenerationStats s = spec_test::expect_lossless(
          make, *target.tokenizer, c,
          [ref, n_prompt, every, V] { return std::make_unique<spec_test::ScriptDrafter>(n_prompt, ref, every, V); },
          true, where + ", scripted", tol);
      expect_accepts_and_rejects(s, where + ", scripted every " + std::to_string(every));
      add(all, s);
    }
    // Token trees: the kept path among wrong siblings (each GPU path of the tree from the saved state).
    const GenerationStats tree = spec_test::expect_lossless(
        make, *target.tokenizer, c,
        [ref = plain.result.tokens, n_prompt = c.prompt.size(), V] {
          return std::make_unique<spec_test::TreeScriptDrafter>(n_prompt, ref, 3, 3, V);
        },
        true, where + ", tree", tol);
    expect_accepts_and_rejects(tree, where + ", tree");
    add(all, tree);
    expect_accepts_and_rejects(all, where + ", all drafters");
  }
}

TEST(CudaSpec, BundledModel) {
  REQUIRE_GPU();
  const Loaded tiny = load(kTiny);
  const Loaded other = load(spec_test::perturbed_copy(kTiny, tmp_path("cuda_spec_tiny_perturbed"), 0.08));
  spec_test::Case c;
  c.prompt = tiny.tokenizer->encode(
      "def area(width, height):\n    return width * height\n\n\ndef area(width, height):\n    return width * height\n\n\n"
      "def perimeter(width, height):\n    return 2 * (width + height)\n\n\ndef");
  c.n_new = 64;
  c.sampling = greedy_no_end(*tiny.tokenizer, static_cast<int32_t>(tiny.model->config().n_vocab));
  check_model(tiny, other, c, "strata-tiny");
}

void check_fixture(const std::string& name) {
  const Loaded target = load(cuda_test::convert_fixture(name, "f32", "cuda_spec_"));
  const Loaded other = load(spec_test::perturbed_copy(target.path, tmp_path("cuda_spec_" + name + "_perturbed"), 0.05));
  spec_test::Case c;
  c.prompt = spec_test::pattern_prompt();
  c.n_new = 48;
  c.sampling = greedy_no_end(*target.tokenizer, static_cast<int32_t>(target.model->config().n_vocab));
  check_model(target, other, c, name);
}

// Keeping m of n drafted chain tokens copies back the DeltaNet state recorded after token m - 1 (no
// second forward): for every m, forward_pending(n) + keep_first(m) leaves what a plain run of the m
// tokens leaves (DeltaNet state, n_past, routing counts, the pending rows of the kept tokens, the next
// token's logits), and so does a second verification on top of it. Drafts run through the decode step
// (the same steps as the plain run: within 1e-5) and the batched prefill in exact math (the n-token
// prefill against an m-token one or a decode step: within 1e-4).
void check_keep_every_prefix(const Model& model, const std::string& label) {
  using test_util::max_row_rel_err;
  const int32_t V = static_cast<int32_t>(model.config().n_vocab);
  auto ids = [V](int n, int salt) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<int32_t>((37 * i + 101 * salt + 11) % V);
    return v;
  };
  const std::vector<int32_t> prompt = ids(12, 1), drafts = ids(16, 2), more = ids(5, 3);
  const int32_t next = ids(1, 4)[0];
  const size_t vocab = static_cast<size_t>(V);
  // A state's error relative to the reference's largest entry (one row of the logits measure).
  auto state_err = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && !b.empty() ? max_row_rel_err(a, b, b.size()) : INFINITY;
  };
  for (const bool batched : {false, true}) {
    sc::GpuSessionOptions o;
    o.batched_prefill = batched;
    o.prefill_math = sc::PrefillMath::Exact;
    const auto gm = sc::make_gpu_model(model, o);
    const double tol = batched ? 1e-4 : 1e-5;
    for (const int n : {1, 2, 5, 16}) {
      for (int m = 0; m <= n; ++m) {
        const std::string where = label + (batched ? ", batched prefill" : ", decode steps") + ", keep " +
                                  std::to_string(m) + " of " + std::to_string(n);
        SCOPED_TRACE(where);
        auto a = sc::make_gpu_session(gm, 48, o), b = sc::make_gpu_session(gm, 48, o);
        std::vector<float> scratch(vocab);
        a->forward(prompt.data(), static_cast<int>(prompt.size()), scratch.data(), false);
        b->forward(prompt.data(), static_cast<int>(prompt.size()), scratch.data(), false);
        std::vector<float> pending(static_cast<size_t>(n) * vocab, NAN);
        a->forward_pending(drafts.data(), n, nullptr, pending.data());
        const std::vector<float> all_run = a->deltanet_state();
        a->keep_first(m);
        std::vector<float> rows(static_cast<size_t>(m) * vocab);
        if (m > 0) b->forward(drafts.data(), m, rows.data(), true);
        EXPECT_EQ(a->n_past(), static_cast<int>(prompt.size()) + m);
        EXPECT_EQ(a->n_past(), b->n_past());
        if (m > 0) {
          const std::vector<float> kept_rows(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(rows.size()));
          EXPECT_LE(max_row_rel_err(kept_rows, rows, vocab), tol) << "pending rows of the kept tokens";
        }
        const std::vector<float> kept = a->deltanet_state(), plain = b->deltanet_state();
        EXPECT_FALSE(plain.empty()) << "the model has DeltaNet layers";
        EXPECT_LE(state_err(kept, plain), tol);
        // The comparison tells states apart: keeping fewer than all moved the state off the n-token one.
        if (m < n) {
          EXPECT_GT(state_err(all_run, plain), 10 * tol);
        }
        EXPECT_EQ(a->routing_counts(), b->routing_counts()) << "only kept tokens count";
        std::vector<float> la(vocab), lb(vocab);
        a->forward(&next, 1, la.data(), false);
        b->forward(&next, 1, lb.data(), false);
        EXPECT_LE(max_row_rel_err(la, lb, vocab), tol) << "next logits";

        // A second verification on top, keeping 2 of 5 (the step records are reused).
        std::vector<float> pending2(more.size() * vocab);
        a->forward_pending(more.data(), static_cast<int>(more.size()), nullptr, pending2.data());
        a->keep_first(2);
        b->forward(more.data(), 2, scratch.data(), false);
        EXPECT_EQ(a->n_past(), b->n_past());
        EXPECT_LE(state_err(a->deltanet_state(), b->deltanet_state()), tol) << "second verification";
        EXPECT_EQ(a->routing_counts(), b->routing_counts()) << "second verification";
        a->forward(&next, 1, la.data(), false);
        b->forward(&next, 1, lb.data(), false);
        EXPECT_LE(max_row_rel_err(la, lb, vocab), tol) << "next logits after the second verification";
      }
    }
  }
}

// A GPU session's hidden record holds what the CPU session's does (the MTP drafter's input; with layers,
// the DFlash drafter's taps): the same tokens from the same position, rows within rounding, through a
// prompt, single steps, decode_and_pick, a verified chain kept in part and a tree kept along a second
// branch; a reset restarts it.
TEST(CudaSpec, HiddenRecordMatchesTheCpuSession) {
  REQUIRE_GPU();
  using test_util::max_row_rel_err;
  const Loaded tiny = load(kTiny);
  const Model& m = *tiny.model;
  const size_t V = static_cast<size_t>(m.config().n_vocab), d = static_cast<size_t>(m.config().n_embd);
  const std::vector<int32_t> prompt = tiny.tokenizer->encode("def area(width, height):\n    return width");
  const CpuKernelLevel saved = cpu_kernel_level();
  set_cpu_kernel_level(CpuKernelLevel::Scalar);  // float activations, as the GPU's Q8_0 dots
  for (const bool batched : {false, true})
  for (const std::vector<int>& layers : {std::vector<int>{}, std::vector<int>{1, 5, 7}}) {
    SCOPED_TRACE(batched ? "batched prefill" : "decode steps");
    SCOPED_TRACE(layers.empty() ? "final hidden states" : "layer taps");
    Session cpu(m, 128);
    sc::GpuSessionOptions o;
    o.batched_prefill = batched;
    o.prefill_math = sc::PrefillMath::Exact;
    auto gpu = sc::make_gpu_session(m, 128, o);
    auto rc = std::make_shared<HiddenRecord>(), rg = std::make_shared<HiddenRecord>();
    rc->layers = rg->layers = layers;
    cpu.set_hidden_record(rc);
    gpu->set_hidden_record(rg);
    std::vector<float> lc(8 * V), lg(8 * V);
    for (Sequence* s : {static_cast<Sequence*>(&cpu), static_cast<Sequence*>(gpu.get())}) {
      std::vector<float>& l = s == &cpu ? lc : lg;
      s->forward(prompt.data(), static_cast<int>(prompt.size()), l.data(), false);
      const int32_t one = 262;
      s->forward(&one, 1, l.data(), false);
      SamplerParams greedy;
      greedy.temperature = 0;
      Sampler sampler(greedy);
      std::vector<float> scratch;
      const int32_t picked = s->decode_and_pick(one, sampler, prompt, static_cast<int32_t>(V), scratch);
      const std::vector<int32_t> chain = {picked, 1181, 3669, 599};
      s->forward_pending(chain.data(), 4, nullptr, l.data());
      s->keep_first(2);
      // A root with two children, the second kept: its row comes from the path run first.
      const std::vector<int32_t> tree = {284, 649, 262};
      const std::vector<int> parents = {-1, 0, 0};
      s->forward_pending(tree.data(), 3, parents.data(), l.data());
      const int path[2] = {0, 2};
      s->keep(path, 2);
    }
    ASSERT_EQ(rg->begin, rc->begin);
    ASSERT_EQ(rg->tokens, rc->tokens);
    ASSERT_EQ(rc->size(), static_cast<int>(prompt.size()) + 1 + 1 + 2 + 2);
    const size_t width = d * std::max<size_t>(1, layers.size());
    ASSERT_EQ(rg->width, static_cast<int>(width));
    const double err = max_row_rel_err(rg->rows, rc->rows, width);
    std::printf("[cuda-spec] hidden record (%s), %s: %d rows, max row relative error %.3g\n",
                layers.empty() ? "final" : "taps", batched ? "batched prefill" : "decode steps", rg->size(), err);
    EXPECT_LE(err, 1e-3);
    // The next logits agree too (with final states, the record's rows are the lm_head's input).
    std::vector<float> lg_last(V), lc_last(V);
    const int32_t next = 7;
    cpu.forward(&next, 1, lc_last.data(), false);
    gpu->forward(&next, 1, lg_last.data(), false);
    EXPECT_EQ(rg->size(), rc->size());
    EXPECT_LE(max_row_rel_err(lg_last, lc_last, V), 1e-3);
    gpu->reset();
    EXPECT_TRUE(rg->restarted);
    EXPECT_EQ(rg->begin, 0);
    EXPECT_EQ(rg->size(), 0);
  }
  set_cpu_kernel_level(saved);
}

// The multi-token decode step (an all-GPU session's verification of up to 16 pending tokens): a
// chain's pending logits are bit for bit the logits single forward() calls give from the same state
// (T = 2, 5, 16 where the sliding-window rings allow), keeping m of them and going on gives what a
// session that only ever ran the m tokens gives (logits, DeltaNet state, routing counts), and a tree's
// rows are each its root path's single steps. Prompts run token by token, so every state compared was
// built by the decode step; the sessions keep the batched prefill on, the path verification took
// before the multi-token step (not bitwise the decode step's). prompt_len: longer than a sliding window
// where the model has one, so the rings have wrapped before the pending tokens.
// model_opt: how the model's weights are placed (hybrid: expert_slots); the multi-token step takes every
// placement, so a hybrid tree's step sends each MoE layer's cold picks to the CPU in one job.
void check_multi_token_step_bitwise(const Model& model, const std::string& label, int prompt_len,
                                    const sc::GpuSessionOptions& model_opt = {}) {
  const int32_t V = static_cast<int32_t>(model.config().n_vocab);
  const size_t vocab = static_cast<size_t>(V);
  auto ids = [V](int n, int salt) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<int32_t>((37 * i + 101 * salt + 11) % V);
    return v;
  };
  auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  const std::vector<int32_t> prompt = ids(prompt_len, 1), drafts = ids(32, 2);
  const int32_t next = ids(1, 4)[0];
  const auto gm = sc::make_gpu_model(model, model_opt);
  const bool hybrid = !model_opt.expert_slots.empty();
  int moe_layers = 0;
  for (int il = 0; il < model.config().n_layer; ++il) moe_layers += model.config().layer(il).ffn == FfnKind::Moe;
  const int ctx = prompt_len + 72;  // two chains of 32 (a hybrid job's most tokens) and a token between them
  const int limit = forward_token_limit(model.config(), ctx);
  auto session = [&] {
    auto s = sc::make_gpu_session(gm, ctx);
    std::vector<float> scratch(vocab);
    for (const int32_t tok : prompt) s->forward(&tok, 1, scratch.data(), false);
    return s;
  };
  // Single forward() calls of tokens from a fresh session's prompt state: their logits rows.
  auto single_steps = [&](const std::vector<int32_t>& tokens) {
    auto s = session();
    std::vector<float> rows(tokens.size() * vocab);
    for (size_t t = 0; t < tokens.size(); ++t) s->forward(&tokens[t], 1, rows.data() + t * vocab, false);
    return rows;
  };
  int checked = 0;
  for (const int T : {2, 5, 16, 32}) {
    if (T > limit) continue;
    ++checked;
    SCOPED_TRACE(label + ", chain of " + std::to_string(T));
    const std::vector<int32_t> chain(drafts.begin(), drafts.begin() + T);
    auto a = session();
    std::vector<float> pending(static_cast<size_t>(T) * vocab, NAN);
    a->forward_pending(chain.data(), T, nullptr, pending.data());
    const std::vector<float> want = single_steps(chain);
    for (int t = 0; t < T; ++t) {
      const std::vector<float> got(pending.begin() + static_cast<std::ptrdiff_t>(t * vocab),
                                   pending.begin() + static_cast<std::ptrdiff_t>((t + 1) * vocab));
      const std::vector<float> ref(want.begin() + static_cast<std::ptrdiff_t>(t * vocab),
                                   want.begin() + static_cast<std::ptrdiff_t>((t + 1) * vocab));
      EXPECT_TRUE(same_bits(got, ref)) << "token " << t << " of " << T;
    }
    // Keep m, then go on: as a session that only ran the m kept tokens.
    const int m = T / 2 + 1;
    a->keep_first(m);
    auto b = session();
    std::vector<float> scratch(vocab);
    for (int t = 0; t < m; ++t) b->forward(&chain[static_cast<size_t>(t)], 1, scratch.data(), false);
    EXPECT_EQ(a->n_past(), b->n_past());
    EXPECT_TRUE(same_bits(a->deltanet_state(), b->deltanet_state())) << "state after keeping " << m;
    EXPECT_EQ(a->routing_counts(), b->routing_counts()) << "only kept tokens count";
    std::vector<float> la(vocab), lb(vocab);
    a->forward(&next, 1, la.data(), false);
    b->forward(&next, 1, lb.data(), false);
    EXPECT_TRUE(same_bits(la, lb)) << "next logits after keeping " << m;
    // The chain picked on the device (forward_pending_picks): each row's arg-max over the allowed ids,
    // and keeping m leaves the state of the run with logits.
    for (const int32_t allowed : {V, V / 2 + 1}) {
      auto p = session();
      std::vector<int32_t> picks(static_cast<size_t>(T), -2);
      p->forward_pending_picks(chain.data(), T, nullptr, allowed, picks.data());
      for (int t = 0; t < T; ++t) {
        std::vector<float> ref(want.begin() + static_cast<std::ptrdiff_t>(t * vocab),
                               want.begin() + static_cast<std::ptrdiff_t>((t + 1) * vocab));
        ban_ids_from(ref.data(), allowed, V);
        EXPECT_EQ(picks[static_cast<size_t>(t)], argmax_logit(ref.data(), V)) << "token " << t << ", ids < " << allowed;
      }
      p->keep_first(m);
      std::vector<float> lp(vocab);
      p->forward(&next, 1, lp.data(), false);  // b has run the kept tokens and next
      EXPECT_TRUE(same_bits(lp, lb)) << "next logits after picks and keeping " << m;
      EXPECT_TRUE(same_bits(p->deltanet_state(), b->deltanet_state())) << "state after picks and keeping " << m;
      EXPECT_EQ(p->routing_counts(), b->routing_counts());
    }
    // A second chain on top (the graph of this token count replayed), kept whole.
    const std::vector<int32_t> more = ids(T, 5);
    std::vector<float> pending2(static_cast<size_t>(T) * vocab);
    a->forward_pending(more.data(), T, nullptr, pending2.data());
    a->keep_first(T);
    std::vector<float> rows2(static_cast<size_t>(T) * vocab);
    for (int t = 0; t < T; ++t) b->forward(&more[static_cast<size_t>(t)], 1, rows2.data() + static_cast<size_t>(t) * vocab, false);
    EXPECT_TRUE(same_bits(pending2, rows2)) << "second chain";
    EXPECT_TRUE(same_bits(a->deltanet_state(), b->deltanet_state())) << "state after the second chain";
  }
  EXPECT_GT(checked, 0) << "no chain length fits the sliding-window limit of " << limit;
  // A tree: root 0 with children 1 and 2, 3 below 1; each token's row is its root path's single steps.
  SCOPED_TRACE(label + ", tree");
  const std::vector<int32_t> tree(drafts.begin(), drafts.begin() + 4);
  const std::vector<int> parents = {-1, 0, 0, 1};
  auto a = session();
  std::vector<float> pending(4 * vocab, NAN);
  a->forward_pending(tree.data(), 4, parents.data(), pending.data());
  const std::vector<float> p013 = single_steps({tree[0], tree[1], tree[3]}), p02 = single_steps({tree[0], tree[2]});
  auto row = [vocab](const std::vector<float>& rows, size_t i) {
    return std::vector<float>(rows.begin() + static_cast<std::ptrdiff_t>(i * vocab),
                              rows.begin() + static_cast<std::ptrdiff_t>((i + 1) * vocab));
  };
  EXPECT_TRUE(same_bits(row(pending, 0), row(p013, 0))) << "root";
  EXPECT_TRUE(same_bits(row(pending, 1), row(p013, 1))) << "token 1";
  EXPECT_TRUE(same_bits(row(pending, 2), row(p02, 1))) << "token 2";
  EXPECT_TRUE(same_bits(row(pending, 3), row(p013, 2))) << "token 3";
  // Keeping the second branch (token 2 sits at row 2, position 1: its key/value rows move) is as single
  // steps of it.
  const int path[2] = {0, 2};
  a->keep(path, 2);
  auto b = session();
  std::vector<float> scratch(vocab);
  b->forward(&tree[0], 1, scratch.data(), false);
  b->forward(&tree[2], 1, scratch.data(), false);
  std::vector<float> la(vocab), lb(vocab);
  a->forward(&next, 1, la.data(), false);
  b->forward(&next, 1, lb.data(), false);
  EXPECT_TRUE(same_bits(la, lb)) << "next logits after keeping the second branch";
  // A deeper tree with branch points at depths 2 and 4 (one multi-token step: each token over its
  // ancestors' rows, from its parent's DeltaNet record): every token's row is its root path's single
  // steps, and keeping root paths whose tokens sit at rows other than their positions (so their key/value
  // rows move), a prefix of the main line, the main line or the root alone leaves what a session that
  // only ran the kept tokens leaves.
  const std::vector<int> parents2 = {-1, 0, 1, 2, 3, 2, 5, 6, 6};
  const int n2 = static_cast<int>(parents2.size());
  if (n2 > limit) return;
  SCOPED_TRACE(label + ", deeper tree");
  const std::vector<int32_t> tree2(drafts.begin(), drafts.begin() + n2);
  auto root_path = [&](int t) {
    std::vector<int> p;
    for (int i = t; i >= 0; i = parents2[static_cast<size_t>(i)]) p.insert(p.begin(), i);
    return p;
  };
  const std::vector<std::vector<int>> kept = {{0, 1, 2, 3}, {0, 1, 2, 5}, {0, 1, 2, 5, 6, 8}, {0, 1, 2, 3, 4}, {0}};
  for (size_t k = 0; k < kept.size(); ++k) {
    auto c = session();
    ASSERT_EQ(c->hybrid(), hybrid);
    const uint64_t jobs_before = hybrid ? c->hybrid_telemetry().cpu_jobs : 0;
    std::vector<float> rows2(static_cast<size_t>(n2) * vocab, NAN);
    c->forward_pending(tree2.data(), n2, parents2.data(), rows2.data());
    if (hybrid) {  // one step: a job per MoE layer at most (a run path by path would send one per token)
      const uint64_t jobs = c->hybrid_telemetry().cpu_jobs - jobs_before;
      EXPECT_LE(jobs, static_cast<uint64_t>(moe_layers));
      EXPECT_GE(jobs, 1u) << "no cold pick reached the CPU";
    }
    if (k == 0) {
      for (int t = 0; t < n2; ++t) {
        const std::vector<int> p = root_path(t);
        std::vector<int32_t> toks;
        for (int i : p) toks.push_back(tree2[static_cast<size_t>(i)]);
        EXPECT_TRUE(same_bits(row(rows2, static_cast<size_t>(t)), row(single_steps(toks), p.size() - 1)))
            << "token " << t;
      }
    }
    c->keep(kept[k].data(), static_cast<int>(kept[k].size()));
    auto d = session();
    for (int i : kept[k]) d->forward(&tree2[static_cast<size_t>(i)], 1, scratch.data(), false);
    std::vector<float> lc(vocab), ld(vocab);
    c->forward(&next, 1, lc.data(), false);
    d->forward(&next, 1, ld.data(), false);
    EXPECT_TRUE(same_bits(lc, ld)) << "next logits after keeping path " << k;
    EXPECT_TRUE(same_bits(c->deltanet_state(), d->deltanet_state())) << "state after keeping path " << k;
    EXPECT_EQ(c->routing_counts(), d->routing_counts()) << "routing counts after keeping path " << k;
    // The tree picked on the device: each row's arg-max over the allowed ids, and keeping the path leaves
    // the same state as the run with logits.
    const int32_t allowed = k % 2 == 0 ? V : V / 2 + 1;
    auto p = session();
    std::vector<int32_t> picks(static_cast<size_t>(n2), -2);
    p->forward_pending_picks(tree2.data(), n2, parents2.data(), allowed, picks.data());
    for (int t = 0; t < n2; ++t) {
      std::vector<float> ref = row(rows2, static_cast<size_t>(t));
      ban_ids_from(ref.data(), allowed, V);
      EXPECT_EQ(picks[static_cast<size_t>(t)], argmax_logit(ref.data(), V))
          << "tree token " << t << ", ids < " << allowed;
    }
    p->keep(kept[k].data(), static_cast<int>(kept[k].size()));
    std::vector<float> lp(vocab);
    p->forward(&next, 1, lp.data(), false);
    EXPECT_TRUE(same_bits(lp, ld)) << "next logits after tree picks and keeping path " << k;
    EXPECT_TRUE(same_bits(p->deltanet_state(), d->deltanet_state())) << "state after tree picks, path " << k;
    EXPECT_EQ(p->routing_counts(), d->routing_counts()) << "routing counts after tree picks, path " << k;
  }
  // Two roots (the second token a child of the kept tokens too: its DeltaNet state and conv window start
  // again from the state before the tree), verified after a chain in the same session (the chain's graph
  // of this token count replayed with a tree's rows and parents): every row is the single steps of its
  // root path after the kept part of the chain, and keeping the second root's path leaves what running
  // only the kept tokens leaves.
  const std::vector<int> parents3 = {-1, 0, -1, 2, 0};
  const int n3 = static_cast<int>(parents3.size());
  if (n3 > limit) return;
  SCOPED_TRACE(label + ", two roots after a chain");
  const std::vector<int32_t> chain3(drafts.begin() + 8, drafts.begin() + 8 + n3);
  const std::vector<int32_t> tree3(drafts.begin() + 3, drafts.begin() + 3 + n3);
  auto e = session();
  std::vector<float> rows3(static_cast<size_t>(n3) * vocab, NAN);
  e->forward_pending(chain3.data(), n3, nullptr, rows3.data());
  e->keep_first(2);
  e->forward_pending(tree3.data(), n3, parents3.data(), rows3.data());
  auto after_chain = [&](const std::vector<int32_t>& tokens) {
    std::vector<int32_t> all = {chain3[0], chain3[1]};
    all.insert(all.end(), tokens.begin(), tokens.end());
    const std::vector<float> r = single_steps(all);
    return std::vector<float>(r.begin() + static_cast<std::ptrdiff_t>(2 * vocab), r.end());
  };
  const std::vector<float> p01 = after_chain({tree3[0], tree3[1]}), p04 = after_chain({tree3[0], tree3[4]}),
                           p23 = after_chain({tree3[2], tree3[3]});
  EXPECT_TRUE(same_bits(row(rows3, 0), row(p01, 0))) << "first root";
  EXPECT_TRUE(same_bits(row(rows3, 1), row(p01, 1))) << "token 1";
  EXPECT_TRUE(same_bits(row(rows3, 2), row(p23, 0))) << "second root";
  EXPECT_TRUE(same_bits(row(rows3, 3), row(p23, 1))) << "token 3";
  EXPECT_TRUE(same_bits(row(rows3, 4), row(p04, 1))) << "token 4";
  const int second[2] = {2, 3};
  e->keep(second, 2);
  auto g = session();
  for (const int32_t tok : {chain3[0], chain3[1], tree3[2], tree3[3]}) g->forward(&tok, 1, scratch.data(), false);
  std::vector<float> le(vocab), lg(vocab);
  e->forward(&next, 1, le.data(), false);
  g->forward(&next, 1, lg.data(), false);
  EXPECT_TRUE(same_bits(le, lg)) << "next logits after keeping the second root's path";
  EXPECT_TRUE(same_bits(e->deltanet_state(), g->deltanet_state())) << "state after keeping the second root's path";
  EXPECT_EQ(e->routing_counts(), g->routing_counts());
}

// The largest sliding window of the model's layers (0: none).
int largest_window(const Model& m) {
  int w = 0;
  for (int il = 0; il < m.config().n_layer; ++il)
    if (m.config().layer(il).mixer == LayerKind::SlidingAttention) w = std::max(w, m.config().layer(il).window);
  return w;
}

// The GPU MTP head against mtp_forward on the CPU, row by row over real hidden rows (a CPU session's
// record of a prompt): logits within the int8 decode bound (a rare expert near-tie may move a row),
// the same arg-max where the CPU's is clear; chained rows fed the GPU's picks likewise; a truncated
// head run again gives its first run's logits, row by row or several rows per call; a hybrid session
// says why it has no GPU head.
TEST(CudaSpec, GpuMtpHeadMatchesTheCpuHead) {
  REQUIRE_GPU();
  using test_util::max_row_rel_err;
  using test_util::rows_against_bound;
  const Loaded tiny = load(kTiny);
  const Model& m = *tiny.model;
  ASSERT_GT(m.config().n_mtp, 0);
  const int32_t V = static_cast<int32_t>(m.config().n_vocab);
  const size_t vocab = static_cast<size_t>(V), d = static_cast<size_t>(m.config().n_embd);
  const std::vector<int32_t> prompt = tiny.tokenizer->encode(
      "def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n    return");
  const int n = static_cast<int>(prompt.size()) - 1;  // row t: hidden state at t, token t + 1
  ASSERT_GE(n, 8);
  Session cpu(m, 128);
  auto rec = std::make_shared<HiddenRecord>();
  cpu.set_hidden_record(rec);
  std::vector<float> scratch(vocab);
  cpu.forward(prompt.data(), n, scratch.data(), false);
  ASSERT_EQ(rec->size(), n);

  auto gpu = sc::make_gpu_session(m, 128);
  std::string why;
  std::unique_ptr<MtpHead> made = gpu->make_mtp_head(128, why);
  ASSERT_TRUE(made) << why;
  auto& head = dynamic_cast<sc::GpuMtpHead&>(*made);
  MtpState cs(m, 128);
  std::vector<float> lc_all, lg_all, out(d), logits(vocab);
  int clear = 0, same = 0;
  auto compare_argmax = [&](const std::vector<float>& lg, int32_t gpu_pick) {
    std::vector<float> sorted(logits);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    float scale = 0;
    for (float v : logits) scale = std::max(scale, std::fabs(v));
    EXPECT_EQ(gpu_pick, argmax(lg.data(), V)) << "the pick is the logits' arg-max";
    if (sorted[0] - sorted[1] > 0.05f * scale) {
      ++clear;
      same += gpu_pick == argmax(logits.data(), V) ? 1 : 0;
    }
  };
  std::vector<std::vector<float>> first_run;
  int32_t last_pick = -1;
  for (int t = 0; t < n; ++t) {
    const int32_t tok = prompt[static_cast<size_t>(t + 1)];
    mtp_forward(m, 0, cs, &tok, rec->row(t), 1, out.data(), logits.data());
    const int32_t pick = head.rows(&tok, rec->row(t), 1, V);
    last_pick = pick;
    const std::vector<float> lg = head.logits();
    compare_argmax(lg, pick);
    lc_all.insert(lc_all.end(), logits.begin(), logits.end());
    lg_all.insert(lg_all.end(), lg.begin(), lg.end());
    first_run.push_back(lg);
  }
  EXPECT_EQ(head.n_past(), n);
  // Chained rows: the GPU's pick and output fed back, the CPU fed the same pick and its own output.
  std::vector<int32_t> picks = {last_pick};
  std::vector<float> h(out), next(d);
  for (int i = 0; i < 4; ++i) {
    const int32_t fed = picks.back();
    head.chain(1, V, picks);
    mtp_forward(m, 0, cs, &fed, h.data(), 1, next.data(), logits.data());
    h.swap(next);
    const std::vector<float> lg = head.logits();
    compare_argmax(lg, picks.back());
    lc_all.insert(lc_all.end(), logits.begin(), logits.end());
    lg_all.insert(lg_all.end(), lg.begin(), lg.end());
  }
  EXPECT_EQ(head.n_past(), n + 4);
  const auto rows = rows_against_bound(lg_all, lc_all, vocab, 2e-2, "gpu mtp head");
  std::printf("[cuda-spec] GPU MTP head: %d rows, max row relative error %.3g within 2e-2, %d beyond; arg-max %d/%d "
              "where the CPU's is clear\n",
              n + 4, rows.within, rows.beyond, same, clear);
  EXPECT_LE(rows.beyond, 2);
  EXPECT_GT(clear, 0);
  EXPECT_GE(same, clear - rows.beyond);

  // Truncated, then the same rows again: the first run's logits (the same kernels on the same inputs).
  const int keep = n / 2;
  head.truncate(keep);
  EXPECT_EQ(head.n_past(), keep);
  for (int t = keep; t < n; ++t) {
    const int32_t tok = prompt[static_cast<size_t>(t + 1)];
    head.rows(&tok, rec->row(t), 1, V);
    EXPECT_LE(max_row_rel_err(head.logits(), first_run[static_cast<size_t>(t)], vocab), 1e-6) << "row " << t;
  }
  // Several rows in one call (one token-grid launch, the multi-token step's arithmetic: bitwise the
  // single rows') end where row-by-row calls end, and so do all rows from position 0 in one call.
  for (const int from : {keep, 0}) {
    head.truncate(from);
    std::vector<int32_t> toks(prompt.begin() + from + 1, prompt.begin() + n + 1);
    std::vector<float> hid(rec->row(from), rec->row(from) + static_cast<size_t>(n - from) * d);
    const int32_t pick = head.rows(toks.data(), hid.data(), n - from, V);
    const std::vector<float> lg = head.logits();
    EXPECT_LE(max_row_rel_err(lg, first_run.back(), vocab), 1e-5) << "rows in one call from " << from;
    EXPECT_EQ(pick, argmax(lg.data(), V));
    EXPECT_EQ(head.n_past(), n);
  }
  // draft() (one graph, one read back) picks what rows() then chain() pick.
  {
    head.truncate(keep);
    std::vector<int32_t> toks(prompt.begin() + keep + 1, prompt.begin() + n + 1);
    std::vector<float> hid(rec->row(keep), rec->row(keep) + static_cast<size_t>(n - keep) * d);
    std::vector<int32_t> drafted, stepped;
    head.draft(toks.data(), hid.data(), n - keep, 3, V, drafted);
    EXPECT_EQ(head.n_past(), n + 3);
    head.truncate(keep);
    stepped.push_back(head.rows(toks.data(), hid.data(), n - keep, V));
    head.chain(3, V, stepped);
    EXPECT_EQ(drafted, stepped);
    EXPECT_EQ(drafted.size(), 4u);
  }
  EXPECT_THROW(head.truncate(n + 4), Error);

  // Hybrid sessions keep the MTP layer off the GPU: no head, and why.
  sc::GpuSessionOptions ho;
  ho.expert_slots = third_hot(m);
  ho.cpu_threads = 2;
  auto hybrid = sc::make_gpu_session(m, 64, ho);
  std::string why_hybrid;
  EXPECT_FALSE(hybrid->make_mtp_head(64, why_hybrid));
  EXPECT_NE(why_hybrid.find("hybrid"), std::string::npos) << why_hybrid;
  EXPECT_THROW({ sc::GpuMtpHead no(*hybrid, 64); }, Error);
}

// The DFlash drafter's forward on the GPU (cuda/gpu_dflash.h) against the CPU's (engine/dflash.h) on the
// bundled model: the same block logits from the same taps (the drafter's F32 weights dotted in float on
// both; the shared output matrix is Q8_0, which the CPU dots with int8 activations, hence the bound), with
// the context added in pieces of 5, 35 (two token grids) and the rest, with and without a context window,
// and again after a restart at a later position; its device top-k per position equal to block_candidates
// on the logits it copies back. All-GPU and hybrid sessions make one.
TEST(CudaSpec, GpuDFlashHeadMatchesTheCpus) {
  REQUIRE_GPU();
  using test_util::max_row_rel_err;
  const Loaded tiny = load(kTiny);
  const Model& m = *tiny.model;
  const int32_t V = static_cast<int32_t>(m.config().n_vocab);
  const std::vector<int32_t> prompt = tiny.tokenizer->encode(
      "def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n    return 2 * "
      "(width + height)\n\n\nclass Rectangle:\n    def __init__(self, w, h):\n        self.w = w\n");
  const int n = static_cast<int>(prompt.size()) - 1;
  ASSERT_GE(n, 48);
  for (int context : {0, 12}) {
    SCOPED_TRACE(context);
    dflash_test::Shape shape;
    shape.block = 6;
    shape.context = context;
    const std::shared_ptr<const DFlashModel> df =
        DFlashModel::load(dflash_test::write_drafter(m, shape, "gpu_head_" + std::to_string(context) + ".gguf"), m);
    Session plain(m, n + 1);
    auto rec = std::make_shared<HiddenRecord>();
    rec->layers = df->config().target_layers;
    plain.set_hidden_record(rec);
    plain.forward(prompt.data(), n, nullptr, false);
    ASSERT_EQ(rec->size(), n);

    for (const Backend& b : {Backend{"all-GPU", false, false}, Backend{"hybrid", true, false}}) {
      SCOPED_TRACE(b.name);
      const auto gm = gpu_model(m, b);
      auto session = gpu_sequences(gm, b)(256);
      std::string why;
      std::unique_ptr<DFlashHead> gpu = session->make_dflash_head(*df, 256, why);
      ASSERT_TRUE(gpu) << why;
      CpuDFlashHead cpu(*df);
      const size_t rows = static_cast<size_t>(shape.block - 1), vocab = static_cast<size_t>(V);
      std::vector<float> lc(rows * vocab), lg(rows * vocab);
      const int32_t allowed = V - 7;
      auto compare = [&](int32_t anchor, const char* what, bool logits_first = false) {
        ASSERT_EQ(gpu->begin(), cpu.begin()) << what;
        ASSERT_EQ(gpu->end(), cpu.end()) << what;
        // First the draft as the drafter takes it (the context rows added since the last draft run with
        // it, one graph replay), then the logits of the same block, which the candidates must match; or
        // the logits first (the pending rows run by their direct launches).
        std::vector<PositionCandidates> drafted;
        if (!logits_first) {
          gpu->candidates(anchor, static_cast<int>(rows), 3, allowed, drafted);
          ASSERT_EQ(drafted.size(), rows);
        }
        cpu.logits(anchor, lc.data());
        gpu->logits(anchor, lg.data());
        const double worst = max_row_rel_err(lg, lc, vocab);  // the largest over the block's rows
        std::printf("[ gpu dflash ] %s, context %d, %s: worst row relative error %.3g\n", b.name.c_str(), context, what,
                    worst);
        EXPECT_LT(worst, 2e-2) << what;
        // The device's candidates are the host's selection on the device's logits.
        for (int k : {1, 3}) {
          std::vector<PositionCandidates> got;
          gpu->candidates(anchor, static_cast<int>(rows), k, allowed, got);
          ASSERT_EQ(got.size(), rows);
          for (size_t j = 0; j < rows; ++j) {
            std::vector<float> row(lg.begin() + static_cast<std::ptrdiff_t>(j * vocab),
                                   lg.begin() + static_cast<std::ptrdiff_t>((j + 1) * vocab));
            const PositionCandidates want = block_candidates(row.data(), allowed, k);
            EXPECT_EQ(got[j].tokens, want.tokens) << what << ", position " << j + 1 << ", k " << k;
            ASSERT_EQ(got[j].probs.size(), want.probs.size());
            for (size_t i = 0; i < want.probs.size(); ++i) EXPECT_NEAR(got[j].probs[i], want.probs[i], 1e-6f);
            if (k == 3 && !logits_first) {
              EXPECT_EQ(drafted[j].tokens, want.tokens) << what << ", position " << j + 1 << ", drafted first";
              EXPECT_EQ(drafted[j].probs, got[j].probs) << what << ", position " << j + 1 << ", drafted first";
            }
          }
        }
      };
      cpu.add_context(rec->row(0), n);
      gpu->add_context(rec->row(0), 5);
      gpu->add_context(rec->row(5), 35);
      gpu->add_context(rec->row(40), n - 40);
      compare(prompt[static_cast<size_t>(n)], "whole prompt");
      // A decode's pattern: a few rows, then a draft, the context moving past the window.
      for (int step = 0, at = 0; step < 8; ++step) {
        const int r = 1 + (step * 3) % 4;
        cpu.add_context(rec->row(at), r);
        gpu->add_context(rec->row(at), r);
        at += r;
        compare(prompt[static_cast<size_t>(step)], ("decode step " + std::to_string(step)).c_str(), step % 3 == 2);
      }
      cpu.add_context(rec->row(0), 3);  // rows pending on the GPU when the restart drops them
      gpu->add_context(rec->row(0), 3);
      cpu.restart(100);
      gpu->restart(100);
      cpu.add_context(rec->row(3), 9);
      gpu->add_context(rec->row(3), 9);
      compare(prompt[5], "after a restart at 100");
      // The session owns its head: asked again for the same drafter it gives the same context, and a
      // handle outliving the session fails instead of touching freed memory.
      std::unique_ptr<DFlashHead> again = session->make_dflash_head(*df, 256, why);
      ASSERT_TRUE(again) << why;
      EXPECT_EQ(again->begin(), 100);
      EXPECT_EQ(again->end(), 109);
      session.reset();
      EXPECT_THROW(gpu->end(), Error);
    }
  }
}

// --spec mtp next to all-GPU targets drafts with the GPU head: generation is token for token the plain
// one, through decode-step and multi-token-step verification, and the trained head's drafts are accepted.
TEST(CudaSpec, GpuMtpHeadDraftsLosslessly) {
  REQUIRE_GPU();
  const Loaded tiny = load(kTiny);
  spec_test::Case c;
  c.prompt = tiny.tokenizer->encode(
      "def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n    return 2 *");
  c.n_new = 48;
  c.sampling = greedy_no_end(*tiny.tokenizer, static_cast<int32_t>(tiny.model->config().n_vocab));
  const int ctx = static_cast<int>(c.prompt.size()) + c.n_new + 1;
  for (const Backend& b : {Backend{"all-GPU decode-step", false, false}, Backend{"all-GPU prefill", false, true}}) {
    SCOPED_TRACE(b.name);
    const auto gm = gpu_model(*tiny.model, b);
    const auto make = gpu_sequences(gm, b);
    {
      auto s = make(ctx);
      std::string why;
      EXPECT_TRUE(s->make_mtp_head(ctx, why)) << why;
    }
    const GenerationStats s = spec_test::expect_lossless(make, *tiny.tokenizer, c, mtp(*tiny.model, ctx), true,
                                                         b.name + ", gpu mtp", b.batched_prefill ? 1e-3 : 1e-5);
    print(b.name + ", gpu mtp", s);
    EXPECT_GT(s.accepted_tokens, 0);
  }
}

// The command line: run --spec mtp --gpu prints what run --gpu prints, with its head on the GPU (no
// note of a CPU head); bench --spec mtp --gpu finds its output token-identical; a hybrid target drafts
// on the CPU and says why, once.
TEST(CudaSpec, RunAndBenchMtpOnTheGpu) {
  REQUIRE_GPU();
  const std::string prompt = "\"def area(w, h):\\n    return w * h\\n\\n\\ndef perimeter(w, h):\\n    return\"";
  const auto spec = testing_cli::expect_spec_run_lossless(prompt + " --temp 0 -n 32 --gpu", "--spec mtp --draft-max 3");
  EXPECT_NE(spec.err.find("spec mtp:"), std::string::npos) << spec.err;
  EXPECT_EQ(spec.err.find("runs on the CPU"), std::string::npos) << spec.err;
  const auto bench = testing_cli::run_cli("bench --spec mtp -n 16 -r 1 --draft-max 3 --gpu");
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  EXPECT_NE(bench.out.find("token-identical"), std::string::npos) << bench.out;
  EXPECT_EQ(bench.err.find("runs on the CPU"), std::string::npos) << bench.err;
  const auto hybrid = testing_cli::expect_spec_run_lossless(prompt + " --temp 0 -n 32 --gpu --expert-budget 50%",
                                                            "--spec mtp --draft-max 3");
  const size_t note = hybrid.err.find("the MTP head runs on the CPU");
  EXPECT_NE(note, std::string::npos) << hybrid.err;
  EXPECT_EQ(hybrid.err.find("the MTP head runs on the CPU", note + 1), std::string::npos) << "said once";
}

// A draft model next to a GPU target runs on the GPU too (one line says so), and -ngld 0 keeps it on the
// CPU; generation is token for token the plain one either way.
TEST(CudaSpec, DraftModelRunsWhereTheTargetRuns) {
  REQUIRE_GPU();
  const std::string prompt = "\"def area(w, h):\\n    return w * h\\n\\n\\ndef perimeter(w, h):\\n    return\"";
  const std::string draft = std::string(STRATA_SOURCE_DIR) + "/models/strata-tiny.gguf";
  const auto gpu = testing_cli::expect_spec_run_lossless(prompt + " --temp 0 -n 24 --gpu", "-md " + draft + " --draft-max 4");
  EXPECT_NE(gpu.err.find("draft model: " + draft + " (cuda)"), std::string::npos) << gpu.err;
  EXPECT_NE(gpu.err.find("spec draft:"), std::string::npos) << gpu.err;
  const auto cpu =
      testing_cli::expect_spec_run_lossless(prompt + " --temp 0 -n 24 --gpu", "-md " + draft + " -ngld 0 --draft-max 4");
  EXPECT_NE(cpu.err.find("draft model: " + draft + " (cpu)"), std::string::npos) << cpu.err;
}

// A hybrid session's pending chain runs through the batched prefill: forward_pending_picks picks there on
// the device what the host picks from forward_pending's logits of the same run (a twin session), over all
// ids and a prefix, and keeping a prefix afterwards goes on as the twin does; a tree's picks (on the host,
// its paths run one by one) as well.
TEST(CudaSpec, HybridPendingPicksEqualTheHostsArgmax) {
  REQUIRE_GPU();
  const Loaded tiny = load(kTiny);
  const Model& m = *tiny.model;
  const int32_t V = static_cast<int32_t>(m.config().n_vocab);
  const size_t vocab = static_cast<size_t>(V);
  sc::GpuSessionOptions o;
  o.expert_slots = third_hot(m);
  o.cpu_threads = 2;
  const auto gm = sc::make_gpu_model(m, o);
  const std::vector<int32_t> prompt = tiny.tokenizer->encode("def add(a, b):\n    return a + b\n\n\ndef mul(a, b):");
  const std::vector<int32_t> chain = {11, 400, 7, 1234, 90, 3};
  const int T = static_cast<int>(chain.size());
  for (const int32_t allowed : {V, V / 3}) {
    auto a = sc::make_gpu_session(gm, 128, o), b = sc::make_gpu_session(gm, 128, o);
    ASSERT_TRUE(a->hybrid());
    std::vector<float> scratch(vocab);
    a->forward(prompt.data(), static_cast<int>(prompt.size()), scratch.data(), false);
    b->forward(prompt.data(), static_cast<int>(prompt.size()), scratch.data(), false);
    std::vector<int32_t> picks(static_cast<size_t>(T), -2);
    a->forward_pending_picks(chain.data(), T, nullptr, allowed, picks.data());
    std::vector<float> rows(static_cast<size_t>(T) * vocab);
    b->forward_pending(chain.data(), T, nullptr, rows.data());
    for (int t = 0; t < T; ++t) {
      float* row = rows.data() + static_cast<size_t>(t) * vocab;
      ban_ids_from(row, allowed, V);
      EXPECT_EQ(picks[static_cast<size_t>(t)], argmax_logit(row, V)) << "token " << t << ", ids < " << allowed;
    }
    a->keep_first(3);
    b->keep_first(3);
    const int32_t next = 42;
    std::vector<float> la(vocab), lb(vocab);
    a->forward(&next, 1, la.data(), false);
    b->forward(&next, 1, lb.data(), false);
    EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), vocab * sizeof(float))) << "after keeping 3, ids < " << allowed;
    // A tree (one multi-token step, its cold picks on the CPU in one job per layer): the same picks as the
    // twin's logits, and keeping the second branch goes on as the twin does.
    const std::vector<int> parents = {-1, 0, 0, 2};
    const std::vector<int32_t> tree = {5, 71, 300, 9};
    std::vector<int32_t> tpicks(4, -2);
    a->forward_pending_picks(tree.data(), 4, parents.data(), allowed, tpicks.data());
    std::vector<float> trows(4 * vocab);
    b->forward_pending(tree.data(), 4, parents.data(), trows.data());
    for (int t = 0; t < 4; ++t) {
      float* row = trows.data() + static_cast<size_t>(t) * vocab;
      ban_ids_from(row, allowed, V);
      EXPECT_EQ(tpicks[static_cast<size_t>(t)], argmax_logit(row, V)) << "tree token " << t << ", ids < " << allowed;
    }
    const int path[3] = {0, 2, 3};
    a->keep(path, 3);
    b->keep(path, 3);
    a->forward(&next, 1, la.data(), false);
    b->forward(&next, 1, lb.data(), false);
    EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), vocab * sizeof(float)))
        << "after keeping a branch, ids < " << allowed;
  }
}

TEST(CudaSpec, MultiTokenStepBitwiseBundledModel) {
  REQUIRE_GPU();
  const Loaded tiny = load(kTiny);
  check_multi_token_step_bitwise(*tiny.model, "strata-tiny", 12);
}

TEST(CudaSpec, MultiTokenStepBitwiseDeltaNetFixture) {
  REQUIRE_GPU();
  const Loaded target = load(cuda_test::convert_fixture("qwen3_5_moe", "f32", "cuda_spec_"));
  check_multi_token_step_bitwise(*target.model, "qwen3_5_moe", 12);
}

TEST(CudaSpec, MultiTokenStepBitwiseSlidingWindowFixture) {
  REQUIRE_GPU();
  const Loaded target = load(cuda_test::convert_fixture("laguna_swa", "f32", "cuda_spec_"));
  const int window = largest_window(*target.model);
  ASSERT_GT(window, 0) << "the fixture has sliding-window layers";
  check_multi_token_step_bitwise(*target.model, "laguna_swa", window + 7);
}

// Hybrid: the experts of slots resident, the rest computed on the CPU for all the step's tokens at once.
sc::GpuSessionOptions hybrid_placement(SlotMap slots) {
  sc::GpuSessionOptions o;
  o.expert_slots = std::move(slots);
  o.cpu_threads = 2;
  return o;
}

// One expert in eight of each MoE layer cold: many tokens of a step have no cold pick while others do, so
// a job mixes both.
SlotMap mostly_hot(const Model& m) {
  SlotMap s = third_hot(m);
  for (size_t l = 0; l < s.size(); ++l) {
    int next = 0;
    for (size_t e = 0; e < s[l].size(); ++e) s[l][e] = (e + l) % 8 == 0 ? -1 : next++;
  }
  return s;
}

TEST(CudaSpec, MultiTokenStepBitwiseHybridBundledModel) {
  REQUIRE_GPU();
  const Loaded tiny = load(kTiny);
  check_multi_token_step_bitwise(*tiny.model, "strata-tiny hybrid", 12, hybrid_placement(third_hot(*tiny.model)));
  check_multi_token_step_bitwise(*tiny.model, "strata-tiny hybrid, mostly hot", 12,
                                 hybrid_placement(mostly_hot(*tiny.model)));
}

TEST(CudaSpec, MultiTokenStepBitwiseHybridDeltaNetFixture) {
  REQUIRE_GPU();
  const Loaded target = load(cuda_test::convert_fixture("qwen3_5_moe", "f32", "cuda_spec_"));
  check_multi_token_step_bitwise(*target.model, "qwen3_5_moe hybrid", 12, hybrid_placement(third_hot(*target.model)));
}

TEST(CudaSpec, MultiTokenStepBitwiseHybridSlidingWindowFixture) {
  REQUIRE_GPU();
  const Loaded target = load(cuda_test::convert_fixture("laguna_swa", "f32", "cuda_spec_"));
  check_multi_token_step_bitwise(*target.model, "laguna_swa hybrid", largest_window(*target.model) + 7,
                                 hybrid_placement(third_hot(*target.model)));
}

TEST(CudaSpec, KeepEveryPrefixOfAChainBundledModel) {
  REQUIRE_GPU();
  const Loaded tiny = load(kTiny);
  check_keep_every_prefix(*tiny.model, "strata-tiny");
}

TEST(CudaSpec, KeepEveryPrefixOfAChainDeltaNetFixture) {
  REQUIRE_GPU();
  const Loaded target = load(cuda_test::convert_fixture("qwen3_5_moe", "f32", "cuda_spec_"));
  check_keep_every_prefix(*target.model, "qwen3_5_moe");
}

TEST(CudaSpec, Qwen35DeltaNetFixture) {
  REQUIRE_GPU();
  check_fixture("qwen3_5_moe");
}

TEST(CudaSpec, LagunaSlidingWindowFixture) {
  REQUIRE_GPU();
  check_fixture("laguna_swa");
}

}  // namespace

#endif  // STRATA_HAVE_CUDA
