// The whole model on the GPU against the CPU engine: logits of every prompt position and greedy
// continuations, on the HF fixtures converted to several types and on the bundled strata-tiny model
// (Q8_0, plus a copy whose matrices with rows of a multiple of 256 are re-encoded in K-quants; the HF
// fixtures converted to q4_k_m cover K-quant routed experts).
// The CPU engine runs at its scalar kernel level there (float activations). The GPU decode dots K-quant
// weights with int8 activations as the fast CPU levels do (matvec_kernels.h), and the batched prefill
// uses fp16 tensor cores: both differ from the scalar path by ~1e-3 by design, inside the bounds below.
// Skips where CUDA is not built or no GPU exists.
#include <gtest/gtest.h>

#ifndef STRATA_HAVE_CUDA
TEST(CudaModel, Skipped) { GTEST_SKIP() << "built without CUDA (STRATA_HAVE_CUDA undefined)"; }
#else

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "strata/base/error.h"
#include "strata/convert/converter.h"
#include "strata/convert/synth.h"
#include "strata/cpu/cpu_kernels.h"
#include "strata/cuda/device_memory.h"
#include "strata/cuda/gpu_model.h"
#include "strata/cuda/gpu_session.h"
#include "strata/engine/model.h"
#include "strata/engine/session.h"
#include "cuda_test_models.h"
#include "pending_property.h"
#include "strata/engine/token_tree.h"
#include "strata/gguf/gguf.h"
#include "strata/gguf/writer.h"
#include "strata/quant/quantize.h"
#include "strata/sample/sampler.h"

namespace {

namespace fs = std::filesystem;
namespace sc = strata::cuda;

using strata::cuda_test::max_row_rel_err;
using strata::cuda_test::tmp_dir;

std::string convert_fixture(const std::string& name, const std::string& type) {
  return strata::cuda_test::convert_fixture(name, type, "cuda_");
}
std::string kquant_copy(const std::string& path) { return strata::cuda_test::kquant_copy(path, "_kquant"); }

std::vector<int32_t> some_prompt(int64_t vocab, int n) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 7919 + 13) % vocab));
  return p;
}

// Logits of every prompt position and a greedy continuation, GPU vs CPU (scalar float path).
void compare_with_cpu(const std::string& gguf, const std::string& label, int n_prompt, int n_new,
                      strata::KvCacheTypes kv = {}, double bound = 1e-3,
                      sc::PrefillMath prefill = sc::PrefillMath::Fast) {
  strata::set_cpu_kernel_level(strata::CpuKernelLevel::Scalar);
  auto model = strata::Model::load(gguf);
  const int64_t vocab = model->config().n_vocab;
  const std::vector<int32_t> prompt = some_prompt(vocab, n_prompt);
  const int ctx = n_prompt + n_new + 1;

  strata::Session cpu(*model, ctx, kv);
  std::vector<float> want(prompt.size() * static_cast<size_t>(vocab));
  cpu.forward(prompt.data(), n_prompt, want.data(), true);
  sc::GpuSessionOptions options;
  options.kv_types = kv;
  options.prefill_math = prefill;
  sc::GpuSession gpu(*model, ctx, options);
  std::vector<float> got(want.size(), NAN);
  gpu.forward(prompt.data(), n_prompt, got.data(), true);
  const double e = max_row_rel_err(got, want, static_cast<size_t>(vocab));
  std::printf("[cuda-model] %s: prompt logits max row relative error %.3g (GPU weights %.1f MiB)\n", label.c_str(), e,
              gpu.weight_bytes() / 1048576.0);
  EXPECT_LE(e, bound) << label;
  EXPECT_EQ(gpu.n_past(), n_prompt);
  if (kv.k != strata::KvType::F32 || kv.v != strata::KvType::F32) {
    // The cache type reached the GPU: its logits are not those of an f32 cache, and its state is smaller.
    sc::GpuSession f32(*model, ctx);
    std::vector<float> plain(want.size());
    f32.forward(prompt.data(), n_prompt, plain.data(), true);
    EXPECT_NE(got, plain) << label;
    EXPECT_LT(gpu.state_bytes(), f32.state_bytes()) << label;
  }

  cpu.reset();
  gpu.reset();
  const std::vector<int32_t> cpu_ids = strata::generate_greedy(cpu, prompt, n_new);
  const std::vector<int32_t> gpu_ids = sc::generate_greedy(gpu, prompt, n_new);
  EXPECT_EQ(gpu_ids, cpu_ids) << label;
  std::printf("[cuda-model] %s: greedy %d tokens %s\n", label.c_str(), n_new, gpu_ids == cpu_ids ? "equal" : "DIFFER");
}

TEST(CudaModel, Qwen3MoeFixtureMatchesCpu) {
  REQUIRE_GPU();
  for (const char* type : {"f32", "bf16", "q8_0", "q4_k_m"})
    compare_with_cpu(convert_fixture("qwen3_moe", type), std::string("qwen3_moe ") + type, 12, 16);
}

TEST(CudaModel, Qwen35MoeFixtureMatchesCpu) {
  REQUIRE_GPU();
  for (const char* type : {"f32", "bf16", "q8_0", "q4_k_m"})
    compare_with_cpu(convert_fixture("qwen3_5_moe", type), std::string("qwen3_5_moe ") + type, 12, 16);
}

// laguna's full-attention fixture: dense first layer, per-element softplus output gate, sigmoid router
// with its selection bias, ungated shared expert, partial rotary. Prompts run through the batched
// prefill (its own laguna tests: test_cuda_prefill.cpp), continuations through the decode step.
TEST(CudaModel, LagunaFixtureMatchesCpu) {
  REQUIRE_GPU();
  for (const char* type : {"f32", "bf16", "q8_0"})
    compare_with_cpu(convert_fixture("laguna", type), std::string("laguna ") + type, 12, 16);
}

// laguna with sliding-window layers (window 4), per-layer query heads (4 and 8), a per-head gate, router
// soft-capping and expert_weights_scale; the second prompt outgrows the sliding layers' rings (window +
// 511 rows), so positions wrap around them.
TEST(CudaModel, LagunaSlidingWindowFixtureMatchesCpu) {
  REQUIRE_GPU();
  for (const char* type : {"f32", "q8_0"})
    compare_with_cpu(convert_fixture("laguna_swa", type), std::string("laguna_swa ") + type, 12, 16);
  compare_with_cpu(convert_fixture("laguna_swa", "f32"), "laguna_swa f32, ring wraps", 540, 8);
}

// YaRN on laguna's full-attention layers (no transformers fixture has it: the synth preset, f32).
TEST(CudaModel, LagunaYarnMatchesCpu) {
  REQUIRE_GPU();
  strata::convert::SynthOptions o;
  o.preset = "tiny-laguna-yarn";
  o.quant = "f32";
  o.seed = 11;
  o.threads = 2;
  o.out_path = (fs::path(testing::TempDir()) / "cuda_tiny_laguna_yarn.gguf").string();
  strata::convert::synth_model(o);
  auto model = strata::Model::load(o.out_path);
  ASSERT_TRUE(model->config().layer(0).yarn.on());
  // Exact prefill: this random preset holds a routing near-tie at its first token that half-precision
  // products flip (test_cuda_prefill's LagunaSynthPresetLogits covers the fast prefill on it).
  compare_with_cpu(o.out_path, "tiny-laguna-yarn f32", 40, 16, {}, 1e-3, sc::PrefillMath::Exact);
}

const std::string kTiny = (fs::path(STRATA_SOURCE_DIR) / "models" / "strata-tiny.gguf").string();

TEST(CudaModel, TinyModelMatchesCpu) {
  REQUIRE_GPU();
  compare_with_cpu(kTiny, "strata-tiny", 24, 32);
}

TEST(CudaModel, TinyModelKQuantCopyMatchesCpu) {
  REQUIRE_GPU();
  compare_with_cpu(kquant_copy(kTiny), "strata-tiny k-quant copy", 16, 24);
}

// f16 KV caches on both backends: the GPU rounds its keys and values as the CPU does, so the two stay as
// close as with f32 caches (a key that rounds to the other neighbour costs a half ulp; hence the
// looser bound).
TEST(CudaModel, F16CacheMatchesCpuF16Cache) {
  REQUIRE_GPU();
  const strata::KvCacheTypes f16{strata::KvType::F16, strata::KvType::F16};
  compare_with_cpu(convert_fixture("qwen3_moe", "f32"), "qwen3_moe f32, f16 cache", 12, 16, f16, 2e-3);
  compare_with_cpu(convert_fixture("qwen3_5_moe", "f32"), "qwen3_5_moe f32, f16 cache", 12, 16, f16, 2e-3);
  compare_with_cpu(kTiny, "strata-tiny, f16 cache", 24, 32, f16, 2e-3);
}

// With an f16 cache the batched prefill (tiled attention over half rows, values rounded after the
// projection) and token-by-token decode steps (attn_prep + split attention) give the same logits.
TEST(CudaModel, F16CachePrefillAgreesWithDecodeSteps) {
  REQUIRE_GPU();
  auto model = strata::Model::load(kTiny);
  const int64_t vocab = model->config().n_vocab;
  const int n = 40;
  const std::vector<int32_t> prompt = some_prompt(vocab, n);
  sc::GpuSessionOptions batched, steps;
  batched.kv_types = steps.kv_types = {strata::KvType::F16, strata::KvType::F16};
  batched.prefill_math = sc::PrefillMath::Exact;
  steps.batched_prefill = false;
  sc::GpuSession a(*model, 64, batched), b(*model, 64, steps);
  std::vector<float> la(static_cast<size_t>(n) * vocab), lb(la.size());
  a.forward(prompt.data(), n, la.data(), true);
  b.forward(prompt.data(), n, lb.data(), true);
  const double e = max_row_rel_err(la, lb, static_cast<size_t>(vocab));
  std::printf("[cuda-model] f16 cache: batched prefill vs decode steps max row relative error %.3g\n", e);
  EXPECT_LE(e, 2e-3);
  // And decoding on from either state agrees.
  const int32_t next = 3;
  std::vector<float> da(static_cast<size_t>(vocab)), db(da.size());
  a.forward(&next, 1, da.data(), false);
  b.forward(&next, 1, db.data(), false);
  EXPECT_LE(max_row_rel_err(da, db, static_cast<size_t>(vocab)), 2e-3);
}

TEST(CudaModel, Q8_0CacheIsRefusedOnTheGpu) {
  REQUIRE_GPU();
  auto model = strata::Model::load(kTiny);
  sc::GpuSessionOptions o;
  o.kv_types = {strata::KvType::Q8_0, strata::KvType::F16};
  try {
    sc::GpuSession s(*model, 16, o);
    FAIL() << "q8_0 accepted";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find("q8_0 is not supported on the GPU (f32 or f16"), std::string::npos) << e.what();
  }
}

TEST(CudaModel, GraphReplayEqualsDirectLaunchesAndResetRestarts) {
  REQUIRE_GPU();
  auto model = strata::Model::load(kTiny);
  const int64_t vocab = model->config().n_vocab;
  const std::vector<int32_t> prompt = some_prompt(vocab, 10);
  // Prompts run token by token here (batched_prefill off): this test is about the decode graph.
  sc::GpuSessionOptions graph, direct;
  graph.batched_prefill = false;
  direct.batched_prefill = false;
  direct.use_graph = false;
  sc::GpuSession a(*model, 16, graph), b(*model, 16, direct);
  std::vector<float> la(prompt.size() * vocab), lb(la.size()), lc(la.size());
  a.forward(prompt.data(), 10, la.data(), true);
  b.forward(prompt.data(), 10, lb.data(), true);
  EXPECT_EQ(la, lb) << "graph replay must compute exactly what direct launches compute";
  a.reset();
  a.forward(prompt.data(), 4, lc.data(), true);
  a.forward(prompt.data() + 4, 6, lc.data() + 4 * vocab, true);
  EXPECT_EQ(la, lc) << "after reset, a prompt split in two calls must give the same logits";
}

// The decode lookahead (decode_lookahead.h) launches the next greedy step before the pick is read and
// runs it only when the caller feeds that pick back. Whatever the caller does instead (another token, a
// forward with logits, a prefix-limited pick, a reset, the end of the context), the session must compute
// exactly what a session without lookahead computes: same picks, same logits bit for bit, same routing
// counts (a skipped step counts nothing), same n_past.
TEST(CudaModel, LookaheadComputesExactlyWhatPlainStepsCompute) {
  REQUIRE_GPU();
  auto model = strata::Model::load(kTiny);
  const int32_t vocab = static_cast<int32_t>(model->config().n_vocab);
  const std::vector<int32_t> prompt = some_prompt(vocab, 6);
  sc::GpuSessionOptions with, without;
  with.batched_prefill = without.batched_prefill = false;  // every position through the decode graph
  without.lookahead = false;
  const int ctx = 26;
  sc::GpuSession a(*model, ctx, with), b(*model, ctx, without);
  std::vector<float> la(static_cast<size_t>(vocab)), lb(la.size()), scratch;
  for (int round = 0; round < 2; ++round) {
    a.forward(prompt.data(), 6, la.data(), false);
    b.forward(prompt.data(), 6, lb.data(), false);
    ASSERT_EQ(la, lb) << "round " << round;
    int32_t t = prompt.back();
    for (int i = 0; i < 6; ++i) {  // fed back: the launched step runs
      const int32_t pa = a.decode_argmax(t), pb = b.decode_argmax(t);
      ASSERT_EQ(pa, pb) << "round " << round << " step " << i;
      t = pa;
    }
    const int32_t other = (t + 1) % vocab;  // not the pick: the launched step must be skipped
    ASSERT_EQ(a.decode_argmax(other), b.decode_argmax(other)) << "round " << round;
    const int32_t y = (other * 31 + 7) % vocab;  // a forward after a greedy step
    a.forward(&y, 1, la.data(), false);
    b.forward(&y, 1, lb.data(), false);
    ASSERT_EQ(la, lb) << "round " << round << ": logits after a skipped lookahead step";
    strata::SamplerParams greedy;
    greedy.temperature = 0.0f;
    strata::Sampler sampler(greedy);
    std::vector<int32_t> history = prompt;
    t = y;
    for (int i = 0; i < 3; ++i) {  // a prefix of the vocabulary: the graphs are captured again
      const int32_t pa = a.decode_and_pick(t, sampler, history, vocab - 1, scratch);
      const int32_t pb = b.decode_and_pick(t, sampler, history, vocab - 1, scratch);
      ASSERT_EQ(pa, pb) << "round " << round << " prefix step " << i;
      ASSERT_LT(pa, vocab - 1);
      t = pa;
    }
    EXPECT_EQ(a.routing_counts(), b.routing_counts()) << "round " << round;
    while (a.n_past() < ctx) {  // to the end of the context: no step is launched past it
      const int32_t pa = a.decode_argmax(t), pb = b.decode_argmax(t);
      ASSERT_EQ(pa, pb) << "round " << round << " at " << a.n_past();
      t = pa;
    }
    EXPECT_EQ(a.n_past(), b.n_past());
    EXPECT_THROW(a.decode_argmax(t), strata::Error);
    EXPECT_EQ(a.n_past(), ctx);
    EXPECT_EQ(a.routing_counts(), b.routing_counts()) << "round " << round;
    a.reset();
    b.reset();
  }
}

// decode_and_pick's greedy arg-max on the device (the generation loop's decode step) equals the arg-max
// of the logits forward() copies to the host, over the whole vocabulary and over a prefix of it that
// leaves the best token out (ids >= n_allowed never win).
TEST(CudaModel, DecodeAndPickGreedyOnTheDeviceEqualsTheHostArgmax) {
  REQUIRE_GPU();
  auto model = strata::Model::load(kTiny);
  const int32_t vocab = static_cast<int32_t>(model->config().n_vocab);
  const std::vector<int32_t> prompt = some_prompt(vocab, 8);
  sc::GpuSession a(*model, 32), b(*model, 32), c(*model, 32);
  std::vector<float> logits(static_cast<size_t>(prompt.size()) * vocab), scratch;
  for (sc::GpuSession* s : {&a, &b, &c}) s->forward(prompt.data(), 8, logits.data(), false);
  strata::SamplerParams greedy;
  greedy.temperature = 0.0f;
  strata::Sampler sampler(greedy);
  int32_t tok = prompt.back();
  std::vector<int32_t> history = prompt;
  int excluded = 0;
  for (int i = 0; i < 12; ++i) {
    const int32_t device_full = a.decode_and_pick(tok, sampler, history, vocab, scratch);
    std::vector<float> host(static_cast<size_t>(vocab));
    b.forward(&tok, 1, host.data(), false);
    const int32_t best = strata::argmax_logit(host.data(), vocab);
    EXPECT_EQ(device_full, best) << "step " << i;
    const int32_t limit = best > 0 ? best : vocab;  // the prefix below the best token
    excluded += limit == best;
    const int32_t device_prefix = c.decode_and_pick(tok, sampler, history, limit, scratch);
    EXPECT_EQ(device_prefix, strata::argmax_logit(host.data(), limit)) << "step " << i << " limit " << limit;
    EXPECT_LT(device_prefix, limit);
    tok = device_full;
    history.push_back(tok);
  }
  EXPECT_GT(excluded, 0) << "no step left its best token out of the prefix";
}

// Not a benchmark (see docs/PERF.md for those): a rough decode rate of the tiny model, graph vs direct
// launches, printed for the gpu-check table.
TEST(CudaModel, TinyDecodeRate) {
  REQUIRE_GPU();
  auto model = strata::Model::load(kTiny);
  for (bool graph : {true, false}) {
    sc::GpuSessionOptions o;
    o.use_graph = graph;
    sc::GpuSession s(*model, 300, o);
    int32_t t = 1;
    for (int i = 0; i < 8; ++i) t = s.decode_argmax(t);  // warm-up (and graph capture)
    const int n = 256;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) t = s.decode_argmax(t);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[cuda-perf] strata-tiny decode, %s: %.1f tok/s (%.3f ms/token over %d tokens)\n",
                graph ? "CUDA graph" : "direct launches", n / sec, 1e3 * sec / n, n);
    EXPECT_EQ(s.n_past(), 8 + n);
  }
}

TEST(CudaModel, RoutingCountsCountEveryDecodePick) {
  REQUIRE_GPU();
  auto model = strata::Model::load(kTiny);
  const strata::ModelConfig& c = model->config();
  sc::GpuSession s(*model, 32);
  int32_t t = 1;
  const int n = 7;
  for (int i = 0; i < n; ++i) t = s.decode_argmax(t);
  const std::vector<uint64_t> counts = s.routing_counts();
  ASSERT_EQ(counts.size(), static_cast<size_t>(c.n_layer) * c.n_expert);
  for (int il = 0; il < c.n_layer; ++il) {
    uint64_t sum = 0;
    for (int e = 0; e < c.n_expert; ++e) sum += counts[static_cast<size_t>(il) * c.n_expert + e];
    EXPECT_EQ(sum, static_cast<uint64_t>(n) * c.n_expert_used) << "layer " << il;
  }
  s.reset_routing_counts();
  for (uint64_t v : s.routing_counts()) EXPECT_EQ(v, 0u);
}

TEST(CudaModel, RejectsBadInputsWithoutChangingState) {
  REQUIRE_GPU();
  auto model = strata::Model::load(kTiny);
  sc::GpuSession s(*model, 4);
  std::vector<float> logits(static_cast<size_t>(model->config().n_vocab));
  const int32_t bad = static_cast<int32_t>(model->config().n_vocab);
  EXPECT_THROW(s.forward(&bad, 1, logits.data(), false), strata::Error);
  const std::vector<int32_t> five = {1, 2, 3, 4, 5};
  EXPECT_THROW(s.forward(five.data(), 5, logits.data(), false), strata::Error);
  EXPECT_EQ(s.n_past(), 0);
}

// Pending tokens on the GPU (chains and trees): run n, keep a root path, continue == run the path,
// continue, with every sequence made over one shared GpuModel. Drafts run token by token through the
// decode step (the kept state is the recorded state of the same steps a plain run takes: within 1e-5)
// and through the batched prefill in exact math (1-token paths take the step; the kept state comes from
// the n-token prefill, the reference's from an m-token one or decode steps: within 1e-4).
void expect_gpu_pending_property(const std::string& gguf, uint32_t seed, strata::KvCacheTypes kv = {}) {
  auto model = strata::Model::load(gguf);
  for (const bool batched : {false, true}) {
    SCOPED_TRACE(batched ? "batched prefill (exact math)" : "decode steps");
    sc::GpuSessionOptions o;
    o.kv_types = kv;
    o.batched_prefill = batched;
    o.prefill_math = sc::PrefillMath::Exact;
    const auto gm = sc::make_gpu_model(*model, o);
    auto make = [&gm, o]() -> std::unique_ptr<strata::Sequence> { return sc::make_gpu_session(gm, 40, o); };
    strata::pending_test::check_pending_property(make, seed, 16, 9, 10, false, {}, batched ? 1e-4 : 1e-5);
  }
}

TEST(CudaModel, PendingKeepEqualsRunQwen3MoeFixture) {
  REQUIRE_GPU();
  expect_gpu_pending_property(convert_fixture("qwen3_moe", "f32"), 401);
}

TEST(CudaModel, PendingKeepEqualsRunQwen35MoeFixture) {
  REQUIRE_GPU();
  expect_gpu_pending_property(convert_fixture("qwen3_5_moe", "f32"), 402);
}

TEST(CudaModel, PendingKeepEqualsRunLagunaFixture) {
  REQUIRE_GPU();
  expect_gpu_pending_property(convert_fixture("laguna", "f32"), 405);
  expect_gpu_pending_property(convert_fixture("laguna_swa", "f32"), 406);
}

TEST(CudaModel, PendingKeepEqualsRunTinyModel) {
  REQUIRE_GPU();
  expect_gpu_pending_property(kTiny, 403);
}

// A tree on the GPU: every node's logits are those of a chain run of its root path (a node inside a
// longer path comes from that path's prefill, whose GEMM shapes differ: close, not bit-equal); greedy
// steps with the lookahead in flight around the pending tokens give what a plain run gives.
TEST(CudaModel, PendingTreeLogitsAndLookahead) {
  REQUIRE_GPU();
  auto model = strata::Model::load(kTiny);
  const int64_t vocab = model->config().n_vocab;
  const auto gm = sc::make_gpu_model(*model);
  const std::vector<int32_t> prompt = some_prompt(vocab, 6);
  std::vector<int32_t> drafts = some_prompt(vocab, 7);
  for (int32_t& id : drafts) id = static_cast<int32_t>((id + 11) % vocab);
  const std::vector<int> parents = {-1, 0, 0, -1, 2, 1, 5};
  const strata::TokenTree tree = strata::TokenTree::from_parents(parents.data(), 7);
  std::vector<float> scratch(static_cast<size_t>(vocab));
  // prompt[0..5) prefilled, prompt[5] and its pick p1 fed by greedy steps: the step for p1's pick is in
  // flight (lookahead) when the pending tokens arrive, and must be dropped.
  auto start = [&](sc::GpuSession& s) {
    s.forward(prompt.data(), 5, scratch.data(), false);
    const int32_t p1 = s.decode_argmax(prompt[5]);
    s.decode_argmax(p1);
    return p1;
  };

  auto a = sc::make_gpu_session(gm, 64);
  const int32_t p1 = start(*a);
  std::vector<float> logits(drafts.size() * static_cast<size_t>(vocab), NAN);
  a->forward_pending(drafts.data(), 7, parents.data(), logits.data());
  double worst = 0;
  for (int node = 0; node < 7; ++node) {
    std::vector<int32_t> path;
    for (int i : tree.path_to(node)) path.push_back(drafts[static_cast<size_t>(i)]);
    auto b = sc::make_gpu_session(gm, 64);
    b->forward(prompt.data(), 6, scratch.data(), false);
    b->forward(&p1, 1, scratch.data(), false);
    std::vector<float> rows(path.size() * static_cast<size_t>(vocab));
    b->forward(path.data(), static_cast<int>(path.size()), rows.data(), true);
    const std::vector<float> last(rows.end() - vocab, rows.end());
    const std::vector<float> got(logits.begin() + node * vocab, logits.begin() + (node + 1) * vocab);
    worst = std::max(worst, max_row_rel_err(got, last, static_cast<size_t>(vocab)));
  }
  std::printf("[cuda-model] pending tree logits vs chain runs of each root path: max row relative error %.3g\n", worst);
  EXPECT_LE(worst, 5e-3);

  // Keep the path to node 6 (0 -> 1 -> 5 -> 6), then greedy steps from its pick: what a plain run of the
  // same tokens gives.
  const std::vector<int> keep = tree.path_to(6);
  a->keep(keep.data(), static_cast<int>(keep.size()));
  std::vector<int32_t> got_ids, want_ids;
  int32_t next = strata::argmax(logits.data() + 6 * vocab, vocab);
  for (int i = 0; i < 12; ++i) got_ids.push_back(next = a->decode_argmax(next));

  auto b = sc::make_gpu_session(gm, 64);
  EXPECT_EQ(start(*b), p1);
  std::vector<int32_t> kept;
  for (int i : keep) kept.push_back(drafts[static_cast<size_t>(i)]);
  b->forward(kept.data(), static_cast<int>(kept.size()), scratch.data(), false);
  next = strata::argmax(scratch.data(), vocab);
  for (int i = 0; i < 12; ++i) want_ids.push_back(next = b->decode_argmax(next));
  EXPECT_EQ(got_ids, want_ids);
  EXPECT_EQ(a->n_past(), b->n_past());
}

TEST(CudaModel, PendingKeepEqualsRunF16Cache) {
  REQUIRE_GPU();
  expect_gpu_pending_property(convert_fixture("qwen3_5_moe", "f32"), 404, {strata::KvType::F16, strata::KvType::F16});
}

// Sequences over one GpuModel own their state: interleaved steps, and greedy runs on threads at once,
// give what each gives alone; the weights are uploaded once.
TEST(CudaModel, SequencesShareOneModel) {
  REQUIRE_GPU();
  auto model = strata::Model::load(kTiny);
  const int64_t vocab = model->config().n_vocab;
  const auto gm = sc::make_gpu_model(*model);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p = some_prompt(vocab, 5 + 3 * i);
    for (int32_t& id : p) id = static_cast<int32_t>((id + 101 * i) % vocab);
    prompts.push_back(p);
  }
  std::vector<std::vector<int32_t>> alone;
  for (const auto& p : prompts) {
    sc::GpuSession s(*model, 64);
    alone.push_back(sc::generate_greedy(s, p, 24));
  }
  // Interleaved on one thread.
  std::vector<std::unique_ptr<sc::GpuSession>> seqs;
  for (size_t i = 0; i < prompts.size(); ++i) seqs.push_back(sc::make_gpu_session(gm, 64));
  EXPECT_EQ(seqs[0]->weight_bytes(), seqs[3]->weight_bytes());
  EXPECT_EQ(seqs[0]->gpu_model().get(), seqs[3]->gpu_model().get());
  std::vector<std::vector<int32_t>> got(prompts.size());
  std::vector<int32_t> next(prompts.size());
  std::vector<float> scratch(static_cast<size_t>(vocab));
  for (size_t i = 0; i < prompts.size(); ++i) {
    seqs[i]->forward(prompts[i].data(), static_cast<int>(prompts[i].size()) - 1, scratch.data(), false);
    next[i] = seqs[i]->decode_argmax(prompts[i].back());
  }
  for (int t = 0; t < 24; ++t)
    for (size_t i = 0; i < prompts.size(); ++i) {
      got[i].push_back(next[i]);
      next[i] = seqs[i]->decode_argmax(next[i]);
    }
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], alone[i]) << "interleaved sequence " << i;
  // Concurrently, one thread per sequence.
  std::vector<std::vector<int32_t>> threaded(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    seqs[i]->reset();
    threads.emplace_back([&, i] { threaded[i] = sc::generate_greedy(*seqs[i], prompts[i], 24); });
  }
  for (std::thread& th : threads) th.join();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(threaded[i], alone[i]) << "threaded sequence " << i;
}

// Every device allocation goes through one account: a session's weights and state show in it while it
// lives and leave it when it goes; a limit below what a session needs fails naming what asked, and the
// failed construction leaves nothing behind.
TEST(CudaModel, OneAccountForDeviceMemory) {
  REQUIRE_GPU();
  auto model = strata::Model::load(kTiny);
  const uint64_t before = sc::device_memory_in_use();
  {
    sc::GpuSession s(*model, 64);
    EXPECT_GE(sc::device_memory_in_use(), before + s.weight_bytes() + s.state_bytes());
  }
  EXPECT_EQ(sc::device_memory_in_use(), before);
  sc::set_device_memory_limit(before + (8u << 20));  // far less than the 42 MiB of weights
  try {
    sc::GpuSession s(*model, 64);
    ADD_FAILURE() << "a session over the limit was made";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find("GPU memory: the weights"), std::string::npos) << e.what();
  }
  EXPECT_EQ(sc::device_memory_in_use(), before);
  sc::set_device_memory_limit(0);
  {
    sc::GpuSession s(*model, 64);
    EXPECT_THROW(sc::set_device_memory_limit(sc::device_memory_in_use() - 1), strata::Error) << "below what is held";
  }
  EXPECT_EQ(sc::device_memory_limit(), 0u);
}

}  // namespace

#endif  // STRATA_HAVE_CUDA
