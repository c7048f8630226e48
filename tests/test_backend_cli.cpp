// The backend choices of run/chat/serve (cli/backend_cli.h, moe/gpu_expert_plan.h) on the CPU:
// the GPU plan from a fake GPU's total/free (all-GPU vs hybrid, the core that does not fit), flag
// checks without --gpu, and --profile recording routing counts for run and serve.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>

#include <filesystem>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_runner.h"
#include "strata/base/error.h"
#include "strata/engine/model.h"
#include "strata/engine/routing_trace.h"
#include "strata/engine/session.h"
#include "strata/model/config.h"
#include "strata/moe/backend_plan.h"
#include "strata/moe/gpu_expert_plan.h"
#include "strata/moe/routing_profile.h"

#ifdef STRATA_HAVE_CUDA
#include "strata/cuda/gpu_session.h"
#endif

namespace {

using strata::testing_cli::run_cli;
constexpr uint64_t MiB = 1ull << 20, GiB = 1ull << 30;
const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/models/strata-tiny.gguf";

// 4 MoE layers x 8 experts of 256 MiB (8 GiB of experts) and 2 GiB of core, no KV cache.
strata::ModelFootprint fake_footprint() {
  strata::ModelFootprint fp;
  fp.core_weight_bytes = 2 * GiB;
  for (int l = 0; l < 4; ++l) fp.expert_bytes.emplace_back(8, 256 * MiB);
  fp.all_expert_bytes = 4 * 8 * 256 * MiB;
  fp.ctx = 1024, fp.slots = 1;
  return fp;
}

TEST(GpuExpertPlan, EverythingFitsIsAllGpu) {
  strata::GpuPlanRequest req;
  req.gpu_total = 80 * GiB, req.gpu_free = 79 * GiB;
  const strata::GpuExpertPlan p = strata::plan_gpu_experts(fake_footprint(), 2, req);
  EXPECT_FALSE(p.hybrid);
  EXPECT_TRUE(p.expert_slots.empty());
  EXPECT_EQ(p.plan.n_hot_total(), 32);
  EXPECT_NE(p.text.find("all-GPU"), std::string::npos) << p.text;
}

TEST(GpuExpertPlan, SmallGpuGoesHybridWithinTheBudget) {
  strata::GpuPlanRequest req;
  // 8 GiB free: minus the 512 MiB reserve, 2 GiB core and 100 MiB workspaces leaves room for 21
  // experts of 256 MiB ((8192 - 512 - 2048 - 100) / 256 = 21.6).
  req.gpu_total = 8 * GiB, req.gpu_free = 8 * GiB;
  req.workspace_bytes = 100 * MiB;
  const strata::GpuExpertPlan p = strata::plan_gpu_experts(fake_footprint(), 2, req);
  ASSERT_TRUE(p.hybrid) << p.text;
  ASSERT_EQ(p.expert_slots.size(), 4u);
  int hot = 0;
  for (const auto& row : p.expert_slots)
    for (int s : row) hot += s >= 0 ? 1 : 0;
  EXPECT_EQ(hot, 21);
  EXPECT_LE(static_cast<uint64_t>(hot) * 256 * MiB, p.receipt.expert_budget);
  EXPECT_NE(p.text.find("hybrid"), std::string::npos) << p.text;
  EXPECT_NE(p.text.find("uniform"), std::string::npos) << p.text;
}

// The streaming prefill's buffers: kStreamBuffers x the largest layer's cold experts, on the receipt.
// With the budget left implicit they are set aside before placement (so the experts fill what is left
// after them); with --expert-budget they fit after the budget or are dropped; --no-op-offload (the
// request's prefill_stream false) keeps none, and an all-GPU plan needs none.
uint64_t largest_cold_layer(const strata::GpuExpertPlan& p) {
  uint64_t most = 0;
  for (const auto& row : p.expert_slots) {
    uint64_t n = 0;
    for (int s : row) n += s < 0 ? 1 : 0;
    most = std::max(most, n * 256 * MiB);
  }
  return most;
}

TEST(GpuExpertPlan, PrefillStreamBuffers) {
  strata::GpuPlanRequest req;
  req.gpu_total = 8 * GiB, req.gpu_free = 8 * GiB;
  req.workspace_bytes = 100 * MiB;
  req.prefill_stream = true;
  // Implicit budget: (8192 - 512 - 2048 - 100) MiB = 5532 MiB; the first pass sets 2 x 8 experts aside
  // (4 GiB) and places 5 experts, the second sets aside 2 x the largest cold layer of that plan.
  strata::GpuExpertPlan p = strata::plan_gpu_experts(fake_footprint(), 2, req);
  ASSERT_TRUE(p.hybrid) << p.text;
  EXPECT_EQ(p.prefill_stream_bytes, strata::kStreamBuffers * largest_cold_layer(p)) << p.text;
  EXPECT_EQ(p.receipt.prefill_stream, p.prefill_stream_bytes);
  EXPECT_EQ(p.prefill_stream_bytes,
            strata::stream_buffer_bytes(fake_footprint().expert_bytes, p.expert_slots));
  int hot = 0;
  for (const auto& row : p.expert_slots)
    for (int sl : row) hot += sl >= 0 ? 1 : 0;
  EXPECT_LE(static_cast<uint64_t>(hot) * 256 * MiB + p.prefill_stream_bytes, 5532 * MiB) << p.text;
  EXPECT_GT(hot, 0) << p.text;
  EXPECT_NE(p.text.find("prefill streaming"), std::string::npos) << p.text;

  // An expert cache that fits the budget only without the buffers: the cache stays, streaming is dropped.
  req.expert_cache_slots = 4;  // 4 GiB of the 5532 MiB
  p = strata::plan_gpu_experts(fake_footprint(), 2, req);
  ASSERT_TRUE(p.hybrid) << p.text;
  EXPECT_FALSE(p.cache_slots.empty()) << p.text;
  EXPECT_EQ(p.prefill_stream_bytes, 0u) << p.text;
  EXPECT_NE(p.text.find("dropped: no room"), std::string::npos) << p.text;
  req.expert_cache_slots = 0;

  // An explicit budget: the buffers fit after it on a large GPU...
  req.gpu_total = 80 * GiB, req.gpu_free = 79 * GiB;
  req.expert_budget = strata::parse_expert_budget("50%");
  p = strata::plan_gpu_experts(fake_footprint(), 2, req);
  ASSERT_TRUE(p.hybrid);
  EXPECT_EQ(p.prefill_stream_bytes, strata::kStreamBuffers * largest_cold_layer(p)) << p.text;
  EXPECT_GT(p.prefill_stream_bytes, 0u);
  // ... and are dropped, with a note, when the budget leaves no room for them.
  req.gpu_total = 8 * GiB, req.gpu_free = 8 * GiB;
  req.expert_budget = strata::parse_expert_budget("5G");
  p = strata::plan_gpu_experts(fake_footprint(), 2, req);
  ASSERT_TRUE(p.hybrid);
  EXPECT_EQ(p.prefill_stream_bytes, 0u);
  EXPECT_NE(p.text.find("dropped"), std::string::npos) << p.text;
  // --no-op-offload.
  req.gpu_total = 80 * GiB, req.gpu_free = 79 * GiB;
  req.expert_budget = strata::parse_expert_budget("50%");
  req.prefill_stream = false;
  p = strata::plan_gpu_experts(fake_footprint(), 2, req);
  EXPECT_EQ(p.prefill_stream_bytes, 0u);
  EXPECT_NE(p.text.find("off"), std::string::npos) << p.text;
  // All-GPU.
  req.prefill_stream = true;
  req.expert_budget.reset();
  p = strata::plan_gpu_experts(fake_footprint(), 2, req);
  EXPECT_FALSE(p.hybrid);
  EXPECT_EQ(p.prefill_stream_bytes, 0u);
}

TEST(GpuExpertPlan, ExplicitPercentBudgetKeepsTheHottestExperts) {
  strata::GpuPlanRequest req;
  req.gpu_total = 80 * GiB, req.gpu_free = 79 * GiB;
  req.expert_budget = strata::parse_expert_budget("25%");  // 8 of 32 experts
  strata::RoutingCounts counts;
  counts.reset(4, 8);
  counts.n_tokens = 100;
  for (int l = 0; l < 4; ++l) {  // experts 5 and 6 take every pick (k = 2)
    counts.add(l, 5, 100);
    counts.add(l, 6, 100);
  }
  req.hotness = &counts;
  req.hotness_source = "profile test (100 tokens)";
  const strata::GpuExpertPlan p = strata::plan_gpu_experts(fake_footprint(), 2, req);
  ASSERT_TRUE(p.hybrid);
  for (int l = 0; l < 4; ++l) {
    EXPECT_GE(p.expert_slots[l][5], 0) << "layer " << l;
    EXPECT_GE(p.expert_slots[l][6], 0) << "layer " << l;
    int hot = 0;
    for (int s : p.expert_slots[l]) hot += s >= 0 ? 1 : 0;
    EXPECT_EQ(hot, 2) << "layer " << l;
  }
  EXPECT_NE(p.text.find("profile test"), std::string::npos);
}

// --expert-cache N: N slots per layer of the layer's largest expert, carved out of the expert budget
// (the pinned experts get the rest); too many slots for the budget fail naming the flag; an all-GPU plan
// has nothing to cache.
TEST(GpuExpertPlan, ExpertCacheIsCarvedOutOfTheBudget) {
  strata::GpuPlanRequest req;
  req.gpu_total = 80 * GiB, req.gpu_free = 79 * GiB;
  req.expert_budget = strata::parse_expert_budget("50%");  // 16 of 32 experts
  const strata::GpuExpertPlan plain = strata::plan_gpu_experts(fake_footprint(), 2, req);
  req.expert_cache_slots = 1;
  req.expert_cache_policy = "lfu";
  const strata::GpuExpertPlan p = strata::plan_gpu_experts(fake_footprint(), 2, req);
  ASSERT_TRUE(p.hybrid) << p.text;
  // Uniform hotness fills layer 0 first: it has no cold expert and needs no slot, so 4 GiB less three
  // 256 MiB slots pins 13 experts.
  EXPECT_EQ(p.plan.n_hot_total(), 13) << p.text;
  EXPECT_EQ(p.cache_slots, (std::vector<int>{0, 1, 1, 1}));
  EXPECT_EQ(p.expert_cache_request, 1);
  EXPECT_EQ(p.receipt.cache_slots, 3 * 256 * MiB);
  EXPECT_LE(p.plan.bytes_used + p.receipt.cache_slots, p.receipt.expert_budget);
  EXPECT_EQ(p.receipt.expert_budget, plain.receipt.expert_budget);
  EXPECT_EQ(p.receipt.core_total, plain.receipt.core_total);  // the cache is expert budget, not core
  EXPECT_NE(p.text.find("- expert cache"), std::string::npos) << p.text;
  EXPECT_NE(p.text.find("lfu"), std::string::npos) << p.text;
  EXPECT_TRUE(plain.cache_slots.empty());
  EXPECT_EQ(plain.text.find("expert cache"), std::string::npos) << plain.text;

  req.expert_cache_slots = 5;  // 5 GiB of slots in a 4 GiB budget
  try {
    strata::plan_gpu_experts(fake_footprint(), 2, req);
    FAIL() << "expected a failure";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--expert-cache 5 needs"), std::string::npos) << e.what();
  }

  req.expert_cache_slots = 2;
  req.expert_budget.reset();  // every expert fits: all-GPU, no cache
  const strata::GpuExpertPlan all = strata::plan_gpu_experts(fake_footprint(), 2, req);
  EXPECT_FALSE(all.hybrid);
  EXPECT_TRUE(all.cache_slots.empty());
  EXPECT_EQ(all.receipt.cache_slots, 0u);
  EXPECT_NE(all.text.find("expert cache: none"), std::string::npos) << all.text;
}

TEST(BackendCli, ExpertCacheFlagsAreChecked) {
  strata::BackendOptions o;
  o.gpu = true;
  o.expert_cache = 4;
  EXPECT_NO_THROW(strata::check_backend_options(o));
  o.expert_cache_policy = "lfu";
  EXPECT_NO_THROW(strata::check_backend_options(o));
  o.expert_cache_policy = "fifo";
  EXPECT_THROW(strata::check_backend_options(o), strata::Error);
  o.expert_cache_policy = "lru";
  o.expert_cache = 0;  // a policy without a cache
  EXPECT_THROW(strata::check_backend_options(o), strata::Error);
  o.expert_cache_policy.clear();
  o.expert_cache = -1;
  EXPECT_THROW(strata::check_backend_options(o), strata::Error);

  o.expert_cache = 4;
  o.expert_cache_admit = 2.5;
  EXPECT_NO_THROW(strata::check_backend_options(o));
  o.expert_cache_policy = "lfu";
  EXPECT_NO_THROW(strata::check_backend_options(o));
  o.expert_cache_admit = 0.0;
  EXPECT_NO_THROW(strata::check_backend_options(o));
  o.expert_cache_policy = "lru";  // lru has no margin
  EXPECT_THROW(strata::check_backend_options(o), strata::Error);
  o.expert_cache_policy.clear();
  for (double bad : {-0.5, -1.0, -2.0, std::nan(""), HUGE_VAL}) {
    o.expert_cache_admit = bad;
    EXPECT_THROW(strata::check_backend_options(o), strata::Error) << bad;
  }
  o.expert_cache_admit = 2.0;
  o.expert_cache = 0;  // a margin without a cache
  EXPECT_THROW(strata::check_backend_options(o), strata::Error);
}

TEST(GpuExpertPlan, CoreThatDoesNotFitFails) {
  strata::GpuPlanRequest req;
  req.gpu_total = 2 * GiB, req.gpu_free = 2 * GiB;  // the 2 GiB core plus the reserve cannot fit
  try {
    strata::plan_gpu_experts(fake_footprint(), 2, req);
    FAIL() << "expected a failure";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit"), std::string::npos) << e.what();
  }
}

// The prefill's fp16 weight cache comes after every expert: kept when all-GPU with room left under
// the limit, dropped (and said so on the receipt) when --gpu-mem leaves no room or the plan is hybrid.
TEST(GpuExpertPlan, PrefillCacheKeptOnlyWhenItFitsAfterEveryExpert) {
  strata::ModelFootprint fp = fake_footprint();
  fp.prefill_f16_cache_bytes = 1 * GiB;
  strata::GpuPlanRequest req;
  req.gpu_total = 80 * GiB, req.gpu_free = 79 * GiB;
  req.gpu_mem = 20 * GiB;  // reserve 512 MiB + core 2 GiB + experts 8 GiB leave ~9.5 GiB
  req.prefill_f16_cache = true;
  strata::GpuExpertPlan p = strata::plan_gpu_experts(fp, 2, req);
  EXPECT_FALSE(p.hybrid);
  EXPECT_TRUE(p.prefill_f16_cache);
  EXPECT_EQ(p.receipt.prefill_cache, 1 * GiB);
  EXPECT_EQ(p.receipt.expert_budget, 8 * GiB) << "every expert stays resident";
  EXPECT_EQ(p.receipt.available_for_experts, static_cast<int64_t>(20 * GiB - 512 * MiB - 2 * GiB - 1 * GiB));
  EXPECT_NE(p.text.find("prefill fp16 cache"), std::string::npos) << p.text;
  EXPECT_NE(p.text.find("1.00 GiB  fp16 dense weights"), std::string::npos) << p.text;

  // 11 GiB: every expert fits (10.5 GiB with the reserve and core) but not the cache as well.
  req.gpu_mem = 11 * GiB;
  p = strata::plan_gpu_experts(fp, 2, req);
  EXPECT_FALSE(p.hybrid) << p.text;
  EXPECT_FALSE(p.prefill_f16_cache);
  EXPECT_EQ(p.receipt.prefill_cache, 0u);
  EXPECT_EQ(p.receipt.expert_budget, 8 * GiB);
  EXPECT_NE(p.text.find("dropped: no room after every expert"), std::string::npos) << p.text;

  // Hybrid: the experts get the room.
  req.gpu_mem = 20 * GiB;
  req.expert_budget = strata::parse_expert_budget("50%");
  p = strata::plan_gpu_experts(fp, 2, req);
  EXPECT_TRUE(p.hybrid);
  EXPECT_FALSE(p.prefill_f16_cache);
  EXPECT_NE(p.text.find("dropped: experts need the room"), std::string::npos) << p.text;

  // Not wanted (exact numerics): no line at all.
  req.expert_budget.reset();
  req.prefill_f16_cache = false;
  p = strata::plan_gpu_experts(fp, 2, req);
  EXPECT_FALSE(p.prefill_f16_cache);
  EXPECT_EQ(p.text.find("prefill fp16 cache"), std::string::npos) << p.text;
}

// The whole plan for the real model on a made-up GPU: run's flags decide the cache by the limit.
// -ub sets the prefill pass (capped at the context); without it a hybrid plan that streams cold experts
// takes kStreamUbatch-token passes, an all-GPU one or a hybrid one without streaming kDefaultUbatch.
TEST(BackendPlan, UbatchDefaultsByPlan) {
  auto model = strata::Model::load(kModel);
  const strata::GpuMemory gpu{80 * GiB, 79 * GiB};
  strata::BackendOptions o;
  o.gpu = true;
  strata::BackendPlan p = strata::plan_backend(*model, 4096, 1, o, nullptr, gpu);
  EXPECT_FALSE(p.gpu_plan.hybrid);
  EXPECT_EQ(p.prefill_chunk, strata::kDefaultUbatch);
  o.expert_budget = "50%";
  p = strata::plan_backend(*model, 4096, 1, o, nullptr, gpu);
  ASSERT_TRUE(p.gpu_plan.hybrid) << p.gpu_plan.text;
  EXPECT_GT(p.gpu_plan.prefill_stream_bytes, 0u) << p.gpu_plan.text;
  EXPECT_EQ(p.prefill_chunk, strata::kStreamUbatch);
  EXPECT_GE(p.gpu_plan.receipt.workspaces,
            strata::estimate_gpu_workspace_bytes(model->config(), 4096, strata::kStreamUbatch, 1));
  EXPECT_EQ(strata::plan_backend(*model, 1000, 1, o, nullptr, gpu).prefill_chunk, 1000);  // at most the context
  o.ubatch = 256;
  EXPECT_EQ(strata::plan_backend(*model, 4096, 1, o, nullptr, gpu).prefill_chunk, 256);
  o.ubatch = 0;
  o.no_op_offload = true;
  p = strata::plan_backend(*model, 4096, 1, o, nullptr, gpu);
  EXPECT_EQ(p.gpu_plan.prefill_stream_bytes, 0u);
  EXPECT_EQ(p.prefill_chunk, strata::kDefaultUbatch);
}

TEST(BackendPlan, GpuMemBoundsThePrefillCache) {
  auto model = strata::Model::load(kModel);
  const int ctx = 256;
  strata::BackendOptions o;
  o.gpu = true;
  const strata::ModelFootprint fp = strata::model_footprint(*model, ctx, 1, strata::kv_cache_types(o));
  ASSERT_GT(fp.prefill_f16_cache_bytes, 0u);
  const strata::GpuMemory gpu{80 * GiB, 79 * GiB};
  strata::BackendPlan p = strata::plan_backend(*model, ctx, 1, o, nullptr, gpu);
  EXPECT_TRUE(p.gpu);
  EXPECT_FALSE(p.gpu_plan.hybrid);
  EXPECT_TRUE(p.gpu_plan.prefill_f16_cache);
  EXPECT_EQ(p.gpu_plan.receipt.prefill_cache, fp.prefill_f16_cache_bytes);

  // A limit that holds the reserve, the core and every expert, but not the cache: dropped.
  const uint64_t ws = strata::estimate_gpu_workspace_bytes(model->config(), ctx, p.prefill_chunk, 1);
  const uint64_t tight = 512 * MiB + fp.core_weight_bytes + fp.kv_cache_bytes + fp.recurrent_state_bytes + ws +
                         fp.all_expert_bytes + fp.prefill_f16_cache_bytes / 2;
  o.gpu_mem = std::to_string(tight);
  p = strata::plan_backend(*model, ctx, 1, o, nullptr, gpu);
  EXPECT_FALSE(p.gpu_plan.hybrid) << p.gpu_plan.text;
  EXPECT_FALSE(p.gpu_plan.prefill_f16_cache) << p.gpu_plan.text;
  EXPECT_NE(p.gpu_plan.text.find("dropped"), std::string::npos) << p.gpu_plan.text;
  o.gpu_mem = std::to_string(tight + fp.prefill_f16_cache_bytes);
  EXPECT_TRUE(strata::plan_backend(*model, ctx, 1, o, nullptr, gpu).gpu_plan.prefill_f16_cache);

  // Exact numerics use no half copies; the CPU plan has no GPU part.
  o.numerics = "exact";
  p = strata::plan_backend(*model, ctx, 1, o, nullptr, gpu);
  EXPECT_TRUE(p.exact_numerics);
  EXPECT_FALSE(p.gpu_plan.prefill_f16_cache);
  EXPECT_EQ(p.gpu_plan.receipt.prefill_cache, 0u);
  const strata::BackendPlan cpu = strata::plan_backend(*model, ctx, 2, strata::BackendOptions{}, nullptr, gpu);
  EXPECT_FALSE(cpu.gpu);
  EXPECT_EQ(cpu.slots, 2);
  EXPECT_TRUE(cpu.gpu_plan.text.empty());
}

TEST(GpuExpertPlan, WorkspaceEstimateGrowsWithContextAndChunk) {
  auto model = strata::Model::load(kModel);
  const strata::ModelConfig& c = model->config();
  const uint64_t small = strata::estimate_gpu_workspace_bytes(c, 256, 64);
  EXPECT_GT(small, 64 * MiB);
  EXPECT_GT(strata::estimate_gpu_workspace_bytes(c, 4096, 64), small);
  // One more prefill token holds at least its logits row.
  EXPECT_GE(strata::estimate_gpu_workspace_bytes(c, 256, 65) - small, static_cast<uint64_t>(c.n_vocab) * 4);
  // The decode lookahead's second DeltaNet state: at one position and a one-token chunk (activations far
  // smaller than the state), the estimate still holds the CPU engine's recurrent state for the model (an
  // independent count) on top of the fixed 64 MiB.
  strata::Session s(*model, 8);
  uint64_t rec = 0;
  for (const strata::LayerState& l : s.state().layers) rec += (l.conv.size() + l.ssm.size()) * sizeof(float);
  ASSERT_GT(rec, 0u) << "the test model has DeltaNet layers";
  EXPECT_GE(strata::estimate_gpu_workspace_bytes(c, 1, 1), 64 * MiB + rec);
}

TEST(BackendCli, GpuOnlyFlagsWithoutGpuFail) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--expert-budget 50%", "--expert-budget needs --gpu"},
      {"--gpu-mem 8G", "--gpu-mem needs --gpu"},
      {"--telemetry", "--telemetry needs --gpu"},
      {"--numerics exact", "--numerics needs --gpu"},
      {"--no-lookahead", "--no-lookahead needs --gpu"},
      {"--no-op-offload", "--no-op-offload needs --gpu"},
      {"--no-warmup", "--no-warmup needs --gpu"},
      {"-ub 1024", "--ubatch-size needs --gpu"},
      {"--cpu-threads 4", "--cpu-threads needs --gpu"},
      {"--expert-cache 2", "--expert-cache needs --gpu"},
      {"--expert-cache-policy lfu", "--expert-cache-policy needs --gpu"},
      {"--expert-cache-admit 2", "--expert-cache-admit needs --gpu"},
      {"--expert-cache-admit -1", "--expert-cache-admit needs --gpu"},
  };
  for (const auto& [flags, message] : cases) {
    const auto r = run_cli("run -m " + kModel + " --prompt-tokens 1,2 -n 1 --print-token-ids " + flags);
    EXPECT_NE(r.exit_code, 0) << flags;
    EXPECT_NE(r.err.find(message), std::string::npos) << flags << ": " << r.err;
  }
}

// A malformed --numerics is refused before any GPU or model work (and on machines without a GPU).
TEST(BackendCli, UnknownNumericsModeFails) {
  const auto r = run_cli("run -m " + kModel + " --prompt-tokens 1,2 -n 1 --print-token-ids --gpu --numerics fp8");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--numerics 'fp8': expected fast or exact"), std::string::npos) << r.err;
}

TEST(BackendCli, UbatchOutOfRangeFails) {
  for (const char* v : {"5000", "-3"}) {
    const auto r = run_cli("run -m " + kModel + " --prompt-tokens 1,2 -n 1 --print-token-ids --gpu -ub " + v);
    EXPECT_NE(r.exit_code, 0) << v;
    EXPECT_NE(r.err.find("--ubatch-size must be within 1..4096"), std::string::npos) << r.err;
  }
}

// KV cache types: llama.cpp's spellings (-ctk/-ctv, --cache-type-k/-v, with "=" too) on the CPU engine;
// bad names and q8_0 with --gpu are refused before any model or GPU work.
// The cache types reach the sequences the CLI makes (logits, like run/chat/serve/bench/calibrate, makes
// them through the one factory) and change the logits: f16 and q8_0 round what f32 keeps.
TEST(BackendCli, CacheTypesReachTheSequences) {
  const auto dir = std::filesystem::path(STRATA_BINARY_DIR) / "test_tmp";
  std::filesystem::create_directories(dir);
  std::vector<std::string> bytes;
  for (const char* t : {"f32", "f16", "q8_0"}) {
    const std::string out = (dir / (std::string("kv_logits_") + t + ".bin")).string();
    const auto r = run_cli("logits -m " + kModel + " --tokens 1,17,300,42,7,1000,5,99 --out " + out + " -ctk " + t +
                           " -ctv " + t);
    ASSERT_EQ(r.exit_code, 0) << t << ": " << r.err;
    std::ifstream in(out, std::ios::binary);
    bytes.emplace_back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_GT(bytes.back().size(), 0u) << t;
  }
  EXPECT_NE(bytes[0], bytes[1]) << "f16 keys/values gave the f32 logits: the flag did not reach the cache";
  EXPECT_NE(bytes[0], bytes[2]) << "q8_0 keys/values gave the f32 logits: the flag did not reach the cache";
}

TEST(BackendCli, CacheTypeFlags) {
  const std::string run = "run -m " + kModel + " --prompt-tokens 1,2,3 -n 4 --print-token-ids ";
  for (const std::string flags : {"", "-ctk f32 -ctv f32", "--cache-type-k q8_0 --cache-type-v=q8_0", "-ctk=f16 -ctv q8_0"}) {
    const auto r = run_cli(run + flags);
    EXPECT_EQ(r.exit_code, 0) << flags << ": " << r.err;
  }
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"-ctk q4_0", "--cache-type-k 'q4_0': expected f32, f16 or q8_0"},
      {"--cache-type-v bf16", "--cache-type-v 'bf16': expected f32, f16 or q8_0"},
      // Refused while the flags are checked, before any GPU is looked for (so in CPU-only builds too).
      {"--gpu -ctk q8_0", "KV cache type q8_0 is not supported on the GPU (f32 or f16"},
  };
  for (const auto& [flags, message] : bad) {
    const auto r = run_cli(run + flags);
    EXPECT_EQ(r.exit_code, 1) << flags;
    EXPECT_NE(r.err.find(message), std::string::npos) << flags << ": " << r.err;
  }
  const auto h = run_cli("serve --help");
  EXPECT_NE(h.out.find("--cache-type-k"), std::string::npos) << h.out;
}

TEST(BackendCli, LogitsRefusesProfile) {
  const std::string path = ::testing::TempDir() + "/wire_logits_profile.json";
  const auto r = run_cli("logits -m " + kModel + " --tokens 1,2 --out " + path + ".bin --profile " + path);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("does not record routing profiles"), std::string::npos) << r.err;
}

// Each row of the counts must hold k picks per counted token (every token picks k experts per layer).
void expect_consistent(const strata::RoutingProfile& p) {
  for (int l = 0; l < p.counts.n_layer; ++l)
    EXPECT_EQ(p.counts.layer_total(l), p.counts.n_tokens * static_cast<uint64_t>(p.model.n_expert_used)) << "layer " << l;
}

TEST(BackendCli, RunRecordsAndAccumulatesAProfile) {
  const std::string path = ::testing::TempDir() + "/wire_run_profile.json";
  std::remove(path.c_str());
  const std::string args = "run -m " + kModel + " --prompt-tokens 1,2,3,4,5 -n 4 --print-token-ids";
  const auto plain = run_cli(args);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const auto first = run_cli(args + " --profile " + path);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_EQ(first.out, plain.out) << "counting routes must not change the output";
  // 5 prompt tokens and 3 of the 4 new ones go through the model (the last pick is never fed back).
  const strata::RoutingProfile p1 = strata::read_profile(path);
  EXPECT_EQ(p1.counts.n_tokens, 8u);
  expect_consistent(p1);
  const auto second = run_cli(args + " --profile " + path);
  ASSERT_EQ(second.exit_code, 0) << second.err;
  const strata::RoutingProfile p2 = strata::read_profile(path);
  EXPECT_EQ(p2.counts.n_tokens, 16u);
  for (size_t i = 0; i < p2.counts.counts.size(); ++i) EXPECT_EQ(p2.counts.counts[i], 2 * p1.counts.counts[i]);
  std::remove(path.c_str());
}

// A profile file that claims another model's fingerprint.
std::string foreign_profile(const std::string& from, const std::string& to) {
  std::ifstream in(from);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  const size_t at = text.find("\"fingerprint\"");
  const size_t q = text.find('"', text.find(':', at) + 1);
  text.replace(q + 1, 16, "0123456789abcdef");
  std::ofstream(to) << text;
  return to;
}

TEST(BackendCli, RunRefusesAnotherModelsProfile) {
  const std::string path = ::testing::TempDir() + "/wire_run_profile2.json";
  std::remove(path.c_str());
  const std::string args = "run -m " + kModel + " --prompt-tokens 1,2,3 -n 2 --print-token-ids";
  ASSERT_EQ(run_cli(args + " --profile " + path).exit_code, 0);
  const std::string other = foreign_profile(path, ::testing::TempDir() + "/wire_run_foreign.json");
  const auto r = run_cli(args + " --profile " + other);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("0123456789abcdef"), std::string::npos) << r.err;
  std::remove(path.c_str());
  std::remove(other.c_str());
}

// --- Sequence::set_routing_counts ------------------------------------------------------------------

// A backend that does not implement counting must refuse it rather than leave the table empty.
class NonCountingSequence : public strata::Sequence {
 public:
  explicit NonCountingSequence(const strata::Model& m) : model_(m) {}
  void forward(const int32_t*, int, float*, bool) override {}
  void reset() override {}
  int n_past() const override { return 0; }
  int max_ctx() const override { return 1; }
  const strata::Model& model() const override { return model_; }

 private:
  const strata::Model& model_;
};

TEST(SequenceRoutingCounts, ABackendWithoutCountingRefuses) {
  auto model = strata::Model::load(kModel);
  NonCountingSequence seq(*model);
  strata::RoutingCounts counts;
  try {
    seq.set_routing_counts(&counts);
    FAIL() << "expected a failure";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not count routes"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(seq.set_routing_counts(nullptr));
}

#ifdef STRATA_HAVE_CUDA

// On the GPU machine: bench reads --profile for the expert placement in every mode, --verify-cost and
// --spec too (a missing file is refused as such, not as a flag the mode ignores).
TEST(BackendCli, BenchReadsAProfileInEveryMode) {
  if (!strata::cuda::device_available()) GTEST_SKIP() << "no CUDA device: " << strata::cuda::device_description();
  const std::string missing = ::testing::TempDir() + "/no_such_profile.json";
  for (const std::string mode : {"--verify-cost chain:2 -p 4", "--spec ngram -n 4"}) {
    const auto r = run_cli("bench -m " + kModel + " -r 1 --gpu --profile " + missing + " " + mode);
    EXPECT_EQ(r.exit_code, 1) << mode;
    EXPECT_NE(r.err.find("no such routing profile"), std::string::npos) << mode << ": " << r.err;
  }
}

// Counts of a run, one token per forward (every backend counts decode steps).
strata::RoutingCounts count_tokens(strata::Sequence& seq, const std::vector<int32_t>& ids, bool one_by_one) {
  strata::RoutingCounts counts;
  seq.set_routing_counts(&counts);
  std::vector<float> logits(static_cast<size_t>(seq.model().config().n_vocab));
  if (one_by_one) {
    for (int32_t id : ids) seq.forward(&id, 1, logits.data(), false);
  } else {
    seq.forward(ids.data(), static_cast<int>(ids.size()), logits.data(), false);
  }
  seq.set_routing_counts(nullptr);
  return counts;
}

// Picks that differ between two tables (sum of |a - b| / 2).
uint64_t differing_picks(const strata::RoutingCounts& a, const strata::RoutingCounts& b) {
  uint64_t d = 0;
  for (size_t i = 0; i < a.counts.size(); ++i) d += a.counts[i] > b.counts[i] ? a.counts[i] - b.counts[i] : b.counts[i] - a.counts[i];
  return d / 2;
}

// On the GPU machine: the GPU sessions' counts against the CPU engine's (routing is computed in
// float on both sides, so a near-tie may flip a pick: allow 2% of the picks to differ).
TEST(SequenceRoutingCounts, GpuSessionsCountLikeTheCpuEngine) {
  if (!strata::cuda::device_available()) GTEST_SKIP() << "no CUDA device: " << strata::cuda::device_description();
  auto model = strata::Model::load(kModel);
  const strata::ModelConfig& c = model->config();
  const std::vector<int32_t> ids = {1, 17, 300, 42, 7, 1000, 5, 99};
  const int ctx = static_cast<int>(ids.size()) + 1;
  strata::Session cpu(*model, ctx);
  const strata::RoutingCounts ref = count_tokens(cpu, ids, true);
  ASSERT_EQ(ref.n_tokens, ids.size());
  const uint64_t picks = ids.size() * static_cast<uint64_t>(c.n_expert_used) * static_cast<uint64_t>(c.n_layer);

  strata::cuda::GpuSession all_gpu(*model, ctx);
  const strata::RoutingCounts g = count_tokens(all_gpu, ids, true);
  EXPECT_EQ(g.n_tokens, ids.size());
  EXPECT_LE(differing_picks(g, ref), picks / 50) << "all-GPU";

  // Half of every layer's experts cold; the prompt in one forward (the hybrid MoE counts prefill too).
  strata::cuda::GpuSessionOptions o;
  o.expert_slots.assign(static_cast<size_t>(c.n_layer), std::vector<int>(static_cast<size_t>(c.n_expert), -1));
  for (auto& row : o.expert_slots)
    for (int e = 0; e < c.n_expert / 2; ++e) row[static_cast<size_t>(e)] = e;
  o.cpu_threads = 2;
  strata::cuda::GpuSession hybrid(*model, ctx, o);
  const strata::RoutingCounts h = count_tokens(hybrid, ids, false);
  EXPECT_EQ(h.n_tokens, ids.size());
  for (int l = 0; l < c.n_layer; ++l) EXPECT_EQ(h.layer_total(l), ids.size() * static_cast<uint64_t>(c.n_expert_used));
  EXPECT_LE(differing_picks(h, ref), picks / 50) << "hybrid";
}

// The command line end to end on the GPU machine: a hybrid run streams its prompt's cold experts by
// default (the receipt lists the buffers, the telemetry the streamed passes) and picks the token the
// all-GPU run picks (its prompt logits are the all-GPU ones, bitwise), with or without the warm-up at
// load, whose pass the telemetry does not count; --no-op-offload keeps them on the CPU and says so.
TEST(BackendCli, HybridRunStreamsThePrompt) {
  if (!strata::cuda::device_available()) GTEST_SKIP() << "no CUDA device: " << strata::cuda::device_description();
  auto model = strata::Model::load(kModel);
  const strata::ModelConfig& c = model->config();
  std::string prompt;
  const int n = 8 * c.n_expert / c.n_expert_used;  // 8 expected tokens per expert: the pass streams
  for (int i = 0; i < n; ++i) {
    if (i > 0) prompt += ',';
    prompt += std::to_string((i * 7919 + 13) % c.n_vocab);
  }
  const std::string base = "run -m " + kModel + " --prompt-tokens " + prompt + " -n 1 --print-token-ids --gpu -ctk f32 -ctv f32";
  const auto all_gpu = run_cli(base);
  ASSERT_EQ(all_gpu.exit_code, 0) << all_gpu.err;
  const auto hybrid = run_cli(base + " --expert-budget 50% --telemetry");
  ASSERT_EQ(hybrid.exit_code, 0) << hybrid.err;
  EXPECT_NE(hybrid.err.find("- prefill streaming"), std::string::npos) << hybrid.err;
  EXPECT_NE(hybrid.err.find("telemetry: prefill streaming on"), std::string::npos) << hybrid.err;
  // One pass of the prompt: the warm-up's pass at load is not counted.
  EXPECT_NE(hybrid.err.find("; 1 prompt chunks streamed"), std::string::npos) << hybrid.err;
  EXPECT_EQ(hybrid.out, all_gpu.out);
  const auto cold = run_cli(base + " --expert-budget 50% --telemetry --no-warmup");
  ASSERT_EQ(cold.exit_code, 0) << cold.err;
  EXPECT_NE(cold.err.find("; 1 prompt chunks streamed"), std::string::npos) << cold.err;
  EXPECT_EQ(cold.out, all_gpu.out) << "--no-warmup";
  const auto off = run_cli(base + " --expert-budget 50% --telemetry --no-op-offload");
  ASSERT_EQ(off.exit_code, 0) << off.err;
  EXPECT_NE(off.err.find("off: prompts compute cold experts on the CPU"), std::string::npos) << off.err;
  EXPECT_EQ(off.err.find("telemetry: prefill streaming"), std::string::npos) << off.err;
}

// Expert picks of two traces that agree, (token, layer) by (token, layer) as sets.
double agreeing_picks(const strata::RoutingTrace& a, const strata::RoutingTrace& b) {
  if (a.streams.size() != 1 || b.streams.size() != 1 || a.streams[0].picks.size() != b.streams[0].picks.size()) return 0;
  const size_t k = static_cast<size_t>(a.header.k);
  std::vector<int> x(a.streams[0].picks.begin(), a.streams[0].picks.end());
  std::vector<int> y(b.streams[0].picks.begin(), b.streams[0].picks.end());
  size_t same = 0;
  for (size_t g = 0; g < x.size(); g += k) {
    std::sort(x.begin() + static_cast<std::ptrdiff_t>(g), x.begin() + static_cast<std::ptrdiff_t>(g + k));
    std::sort(y.begin() + static_cast<std::ptrdiff_t>(g), y.begin() + static_cast<std::ptrdiff_t>(g + k));
    for (size_t i = g, j = g; i < g + k && j < g + k;) {
      if (x[i] == y[j]) ++same, ++i, ++j;
      else if (x[i] < y[j]) ++i;
      else ++j;
    }
  }
  return x.empty() ? 0 : static_cast<double>(same) / static_cast<double>(x.size());
}

// --collect-routing on the GPU machine: all-GPU and hybrid runs record every kept token (the prompt in
// one batched pass, then decode steps), picking what the CPU engine picks up to near-ties of the float
// routing (the counts test's 2%); a speculative run keeps exactly the trace of the plain one (its
// verification steps are bitwise the decode steps).
TEST(BackendCli, GpuRunsRecordRoutingTraces) {
  if (!strata::cuda::device_available()) GTEST_SKIP() << "no CUDA device: " << strata::cuda::device_description();
  const std::string dir = (std::filesystem::temp_directory_path() / "strata_gpu_trace").string();
  std::filesystem::create_directories(dir);
  const std::string base = "run -m " + kModel + " --prompt-tokens 1,17,300,42,7,1000,5,99,8,12 -n 12 --print-token-ids";
  const int n_tokens = 10 + 12 - 1;  // the prompt and the generated tokens fed back (the last is not)
  std::vector<strata::RoutingTrace> traces;
  std::string cpu_out;
  for (const std::string flags : {"", "--gpu", "--gpu --expert-budget 50%"}) {
    const std::string path = dir + "/run" + std::to_string(traces.size()) + ".trace";
    const auto r = run_cli(base + " " + flags + " --collect-routing " + path);
    ASSERT_EQ(r.exit_code, 0) << flags << "\n" << r.err;
    if (flags.empty()) cpu_out = r.out;
    EXPECT_EQ(r.out, cpu_out) << flags;
    traces.push_back(strata::read_routing_trace(path));
    EXPECT_EQ(traces.back().n_tokens(), static_cast<uint64_t>(n_tokens)) << flags;
  }
  EXPECT_GE(agreeing_picks(traces[1], traces[0]), 0.98) << "all-GPU against the CPU engine";
  EXPECT_GE(agreeing_picks(traces[2], traces[0]), 0.98) << "hybrid against the CPU engine";

  const std::string text = "run -m " + kModel +
                           " \"def area(w, h):\\n    return w * h\\n\\n\\ndef area(w, h):\\n    return\" --temp 0 -n 24 --gpu";
  const auto plain = run_cli(text + " --collect-routing " + dir + "/plain.trace");
  const auto spec = run_cli(text + " --spec ngram --draft-max 4 --collect-routing " + dir + "/spec.trace");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(spec.exit_code, 0) << spec.err;
  EXPECT_EQ(spec.out, plain.out);
  EXPECT_NE(spec.err.find("spec ngram:"), std::string::npos) << spec.err;
  const auto a = strata::read_routing_trace(dir + "/plain.trace");
  const auto b = strata::read_routing_trace(dir + "/spec.trace");
  ASSERT_EQ(a.streams.size(), 1u);
  ASSERT_EQ(b.streams.size(), 1u);
  EXPECT_GT(a.n_tokens(), 24u);
  EXPECT_TRUE(a.streams[0].picks == b.streams[0].picks) << "the speculative run's trace differs";
}
#endif

// --- serve --profile over HTTP --------------------------------------------------------------------

int free_port() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  close(s);
  return ntohs(a.sin_port);
}

// One request on its own connection; returns the status code (0: no answer) and the body.
std::pair<int, std::string> http_post(int port, const std::string& path, const std::string& body) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(s);
    return {0, ""};
  }
  const std::string req = (body.empty() ? "GET " : "POST ") + path +
                          " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n"
                          "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  send(s, req.data(), req.size(), MSG_NOSIGNAL);
  std::string raw;
  char buf[8192];
  for (;;) {
    pollfd p{s, POLLIN, 0};
    if (poll(&p, 1, 60000) <= 0) break;
    const ssize_t n = recv(s, buf, sizeof buf, 0);
    if (n <= 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  close(s);
  const int status = raw.rfind("HTTP/1.1 ", 0) == 0 ? std::atoi(raw.c_str() + 9) : 0;
  const size_t end = raw.find("\r\n\r\n");
  return {status, end == std::string::npos ? "" : raw.substr(end + 4)};
}

// `strata serve` as a child process; killed when it goes out of scope.
class Server {
 public:
  explicit Server(const std::vector<std::string>& extra) : port_(free_port()) {
    std::vector<std::string> args = {STRATA_CLI, "serve", "-m", kModel, "--port", std::to_string(port_)};
    args.insert(args.end(), extra.begin(), extra.end());
    err_path_ = ::testing::TempDir() + "/wire_serve_" + std::to_string(port_) + ".err";
    pid_ = fork();
    if (pid_ == 0) {
      if (FILE* f = std::freopen(err_path_.c_str(), "w", stderr); f == nullptr) _exit(126);
      std::vector<char*> argv;
      for (auto& s : args) argv.push_back(const_cast<char*>(s.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~Server() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::remove(err_path_.c_str());
  }
  // True once /health answers 200; false when the process exits first (exit_code() then says how).
  bool wait_ready() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      if (http_post(port_, "/health", "").first == 200) return true;
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        exit_code_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  int port() const { return port_; }
  int exit_code() const { return exit_code_; }
  std::string stderr_text() const {
    std::ifstream in(err_path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  int port_;
  pid_t pid_ = -1;
  int exit_code_ = -1;
  std::string err_path_;
};

int completion_tokens(const std::string& body) {
  const size_t at = body.find("\"completion_tokens\":");
  return at == std::string::npos ? -1 : std::atoi(body.c_str() + at + 20);
}
int prompt_tokens(const std::string& body) {
  const size_t at = body.find("\"prompt_tokens\":");
  return at == std::string::npos ? -1 : std::atoi(body.c_str() + at + 16);
}
// Prompt tokens restored from the prompt cache or a slot (usage.prompt_tokens_details): not run again.
int cached_tokens(const std::string& body) {
  const size_t at = body.find("\"cached_tokens\":");
  return at == std::string::npos ? 0 : std::atoi(body.c_str() + at + 16);
}

TEST(ServeProfile, TwoRequestsOnTwoSlotsUpdateTheProfile) {
  const std::string path = ::testing::TempDir() + "/wire_serve_profile.json";
  std::remove(path.c_str());
  uint64_t tokens_run = 0;
  {
    Server server({"--slots", "2", "--ctx", "512", "--profile", path});
    ASSERT_TRUE(server.wait_ready()) << server.stderr_text();
    std::vector<std::pair<int, std::string>> answers(2);
    std::vector<std::thread> clients;
    for (int i = 0; i < 2; ++i)
      clients.emplace_back([&, i] {
        answers[i] = http_post(server.port(), "/v1/completions",
                               R"({"prompt":"Once upon a time )" + std::to_string(i) + R"(","max_tokens":5,"temperature":0})");
      });
    for (auto& t : clients) t.join();
    for (const auto& [status, body] : answers) {
      ASSERT_EQ(status, 200) << body;
      // The prompt (less what the prompt cache restored: the two prompts share a start), then every
      // generated token but the last goes through the model.
      tokens_run += static_cast<uint64_t>(prompt_tokens(body) - cached_tokens(body) + completion_tokens(body) - 1);
    }
    // Saved before each answer ends, so the file is complete now.
    const strata::RoutingProfile p = strata::read_profile(path);
    EXPECT_GE(p.counts.n_tokens, tokens_run);
    expect_consistent(p);
  }
  ASSERT_GT(tokens_run, 2u);
  // The profile is refused for another model: the server does not start.
  const std::string other = foreign_profile(path, ::testing::TempDir() + "/wire_serve_foreign.json");
  Server refused({"--profile", other});
  EXPECT_FALSE(refused.wait_ready());
  EXPECT_NE(refused.exit_code(), 0);
  EXPECT_NE(refused.stderr_text().find("0123456789abcdef"), std::string::npos) << refused.stderr_text();
  std::remove(path.c_str());
  std::remove(other.c_str());
}

}  // namespace
