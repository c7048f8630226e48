// The VRAM budget receipt (moe/vram_budget.h): size parsing, the budget arithmetic, the refusal when
// the core does not fit, and the model footprint checked against the engine's own buffers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>

#include "strata/base/error.h"
#include "strata/convert/synth.h"
#include "strata/engine/model.h"
#include "strata/engine/session.h"
#include "strata/moe/placement.h"
#include "strata/moe/vram_budget.h"

namespace strata {
namespace {

constexpr uint64_t KiB = 1024, MiB = KiB * 1024, GiB = MiB * 1024;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ParseSize, BinaryUnitsWithOrWithoutB) {
  EXPECT_EQ(parse_size("24G"), 24 * GiB);
  EXPECT_EQ(parse_size("24GiB"), 24 * GiB);
  EXPECT_EQ(parse_size("24gb"), 24 * GiB);
  EXPECT_EQ(parse_size("512M"), 512 * MiB);
  EXPECT_EQ(parse_size("512 MiB"), 512 * MiB);
  EXPECT_EQ(parse_size("1.5GB"), 3 * GiB / 2);
  EXPECT_EQ(parse_size("2T"), 2048 * GiB);
  EXPECT_EQ(parse_size("4k"), 4 * KiB);
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("4096B"), 4096u);
  EXPECT_EQ(parse_size(".5K"), 512u);
  for (const char* bad : {"", "G", "-1G", "1.2.3G", "12X", "1e9", "1.5", "24 GiBs", "abc", "99999999999T"}) {
    const std::string msg = error_of([&] { parse_size(bad, "--gpu-mem"); });
    EXPECT_NE(msg.find("--gpu-mem"), std::string::npos) << "'" << bad << "' -> " << msg;
  }
}

TEST(ParseExpertBudget, PercentOrSize) {
  ExpertBudgetSpec s = parse_expert_budget("60%");
  EXPECT_TRUE(s.is_percent);
  EXPECT_DOUBLE_EQ(s.percent, 60.0);
  s = parse_expert_budget("12.5 %");
  EXPECT_DOUBLE_EQ(s.percent, 12.5);
  s = parse_expert_budget("10G");
  EXPECT_FALSE(s.is_percent);
  EXPECT_EQ(s.bytes, 10 * GiB);
  EXPECT_THROW(parse_expert_budget("101%"), Error);
  EXPECT_THROW(parse_expert_budget("-5%"), Error);
  EXPECT_THROW(parse_expert_budget("%"), Error);
}

VramInputs example_inputs() {
  VramInputs in;
  in.gpu_total = 80 * GiB;
  in.gpu_free = 79 * GiB;
  in.model.core_weight_bytes = 3 * GiB;
  in.model.kv_cache_bytes = 1 * GiB;
  in.model.recurrent_state_bytes = 64 * MiB;
  in.model.ctx = 4096;
  in.model.slots = 1;
  for (int l = 0; l < 4; ++l) in.model.expert_bytes.emplace_back(8, 256 * MiB);
  in.model.all_expert_bytes = 4 * 8 * 256 * MiB;  // 8 GiB
  in.workspace_bytes = 100 * MiB;
  return in;
}

TEST(VramReceipt, ArithmeticOfEveryLine) {
  VramInputs in = example_inputs();
  in.gpu_mem = 10 * GiB;
  const VramReceipt r = compute_vram_receipt(in);
  EXPECT_EQ(r.limit, 10 * GiB);
  EXPECT_EQ(r.reserve, 512 * MiB) << "2% of 10 GiB is below the 512 MiB floor";
  const uint64_t core = 512 * MiB + 3 * GiB + 1 * GiB + 64 * MiB + 100 * MiB;
  EXPECT_EQ(r.core_total, core);
  EXPECT_EQ(r.available_for_experts, static_cast<int64_t>(10 * GiB - core));
  EXPECT_TRUE(r.core_fits);
  EXPECT_EQ(r.expert_budget, 10 * GiB - core) << "no --expert-budget: what is left";
  EXPECT_NO_THROW(require_core_fits(r));

  // A large card: the reserve is 2% of the limit.
  VramInputs big = example_inputs();
  const VramReceipt rb = compute_vram_receipt(big);
  EXPECT_EQ(rb.reserve, 79 * GiB / 50);
  EXPECT_EQ(rb.expert_budget, 8 * GiB) << "never more than all experts";
}

// The prefill's fp16 cache, when the plan keeps it, is one more line taken before the experts.
TEST(VramReceipt, PrefillCacheIsALineOfTheReceipt) {
  VramInputs in = example_inputs();
  in.gpu_mem = 10 * GiB;
  const VramReceipt without = compute_vram_receipt(in);
  EXPECT_EQ(format_receipt(without, nullptr).find("prefill fp16 cache"), std::string::npos);
  in.prefill_cache_bytes = 1 * GiB;
  in.prefill_cache_note = "kept";
  const VramReceipt r = compute_vram_receipt(in);
  EXPECT_EQ(r.prefill_cache, 1 * GiB);
  EXPECT_EQ(r.core_total, without.core_total + 1 * GiB);
  EXPECT_EQ(r.available_for_experts, without.available_for_experts - static_cast<int64_t>(1 * GiB));
  const std::string text = format_receipt(r, nullptr);
  EXPECT_NE(text.find("- prefill fp16 cache"), std::string::npos) << text;
  EXPECT_NE(text.find("1.00 GiB  kept"), std::string::npos) << text;
  // Dropped: a 0 B line with the reason.
  in.prefill_cache_bytes = 0;
  in.prefill_cache_note = "dropped: no room";
  EXPECT_NE(format_receipt(compute_vram_receipt(in), nullptr).find("0 B  dropped: no room"), std::string::npos);
}

TEST(VramReceipt, ExplicitExpertBudget) {
  VramInputs in = example_inputs();
  in.expert_budget = parse_expert_budget("25%");
  VramReceipt r = compute_vram_receipt(in);
  EXPECT_EQ(r.expert_budget, 2 * GiB);
  EXPECT_TRUE(r.budget_fits);
  in.expert_budget = parse_expert_budget("3G");
  r = compute_vram_receipt(in);
  EXPECT_EQ(r.expert_budget, 3 * GiB);

  in.gpu_mem = 6 * GiB;  // about 1.3 GiB left for experts
  r = compute_vram_receipt(in);
  EXPECT_TRUE(r.core_fits);
  EXPECT_FALSE(r.budget_fits);
  const std::string msg = error_of([&] { require_core_fits(r); });
  EXPECT_NE(msg.find("--expert-budget 3G"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hint: lower --expert-budget"), std::string::npos) << msg;
}

TEST(VramReceipt, CoreThatDoesNotFitFailsWithReceiptAndHint) {
  VramInputs in = example_inputs();
  in.gpu_mem = 4 * GiB;
  const VramReceipt r = compute_vram_receipt(in);
  EXPECT_FALSE(r.core_fits);
  EXPECT_EQ(r.expert_budget, 0u);
  EXPECT_LT(r.available_for_experts, 0);
  const std::string msg = error_of([&] { require_core_fits(r); });
  EXPECT_NE(msg.find("does not fit"), std::string::npos) << msg;
  EXPECT_NE(msg.find("core weights"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3.00 GiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lower --ctx / use a smaller quant / raise --gpu-mem"), std::string::npos) << msg;

  in.gpu_mem = 79 * GiB + 1;  // more than is free
  EXPECT_THROW(require_core_fits(compute_vram_receipt(in)), Error);
  in.gpu_mem = 81 * GiB;  // more than the card has
  EXPECT_THROW(compute_vram_receipt(in), Error);
}

TEST(VramReceipt, FormatShowsHotColdPerLayerCompactly) {
  VramInputs in = example_inputs();
  in.expert_budget = parse_expert_budget("50%");
  const VramReceipt r = compute_vram_receipt(in);
  PlacementInput p{in.model.expert_bytes, uniform_hotness(in.model.expert_bytes, 2), r.expert_budget};
  const ExpertPlan plan = uniform_placement(p);
  const std::string text = format_receipt(r, &plan);
  EXPECT_NE(text.find("hot experts: 16 of 32 (4.00 GiB in VRAM), cold: 16 (4.00 GiB"), std::string::npos) << text;
  EXPECT_NE(text.find("0-3"), std::string::npos) << "identical layers share a row:\n" << text;
  EXPECT_NE(text.find("4/8"), std::string::npos) << text;
  EXPECT_NE(text.find("50.0% of 8.00 GiB"), std::string::npos) << text;
}

TEST(ModelFootprint, MatchesTheEngineBuffersAndTheFile) {
  const auto path = std::filesystem::path(STRATA_SOURCE_DIR) / "models" / "strata-tiny.gguf";
  auto model = Model::load(path.string());
  const ModelConfig& c = model->config();
  const int ctx = 96;
  const ModelFootprint f = model_footprint(*model, ctx, 2);

  // Independent: the CPU engine's own sequence state for the same context, twice (two slots).
  Session s(*model, ctx);
  uint64_t kv = 0, rec = 0;
  for (const LayerState& l : s.state().layers) {
    kv += l.k.size() + l.v.size();
    rec += (l.conv.size() + l.ssm.size()) * sizeof(float);
  }
  EXPECT_EQ(f.kv_cache_bytes, 2 * kv);
  EXPECT_EQ(f.kv_bytes_per_token * ctx * 2, f.kv_cache_bytes);

  // The cache types set the bytes: an f16 / q8_0 session's buffers, and the receipt names them per token.
  const KvCacheTypes reduced{KvType::F16, KvType::Q8_0};
  Session r(*model, ctx, reduced);
  uint64_t kv_reduced = 0;
  for (const LayerState& l : r.state().layers) kv_reduced += l.k.size() + l.v.size();
  const ModelFootprint fr = model_footprint(*model, ctx, 2, reduced);
  EXPECT_EQ(fr.kv_cache_bytes, 2 * kv_reduced);
  EXPECT_LT(fr.kv_cache_bytes, f.kv_cache_bytes);
  VramInputs in;
  in.gpu_total = in.gpu_free = 80ull << 30;
  in.model = fr;
  const std::string text = format_receipt(compute_vram_receipt(in), nullptr);
  EXPECT_NE(text.find(cat("K f16 + V q8_0, ", fr.kv_bytes_per_token, " bytes/token")), std::string::npos) << text;
  EXPECT_EQ(f.recurrent_state_bytes, 2 * rec);

  // Independent: routed-expert tensors by name; everything else is core. The MTP block (blk.N with
  // N >= n_layer) runs on the CPU only, so no GPU footprint counts it.
  const auto in_trunk = [&](const std::string& name) {
    int layer = -1;
    return std::sscanf(name.c_str(), "blk.%d.", &layer) != 1 || layer < c.n_layer;
  };
  uint64_t experts = 0, other = 0, expert0 = 0;
  for (const auto& t : model->file().tensors()) {
    if (!in_trunk(t.name)) continue;
    (t.name.find("_exps") != std::string::npos ? experts : other) += t.nbytes;
    if (t.name.rfind("blk.0.", 0) == 0 && t.name.find("_exps") != std::string::npos) expert0 += t.nbytes;
  }
  EXPECT_GT(c.n_mtp, 0);  // the bundled model carries an MTP block, which the counts above leave out
  EXPECT_EQ(f.all_expert_bytes, experts);
  EXPECT_EQ(f.core_weight_bytes, other);
  ASSERT_EQ(static_cast<int>(f.expert_bytes.size()), c.n_layer);
  EXPECT_EQ(total_expert_bytes(f.expert_bytes), experts);
  // One expert: gate + up ([n_embd x n_ff]) + down ([n_ff x n_embd]), a 1/n_expert share of layer 0's.
  for (const auto& row : f.expert_bytes) {
    ASSERT_EQ(static_cast<int>(row.size()), c.n_expert);
    EXPECT_EQ(row[0], expert0 / static_cast<uint64_t>(c.n_expert));
  }
  EXPECT_EQ(expert0 % static_cast<uint64_t>(c.n_expert), 0u);
  EXPECT_THROW(model_footprint(*model, 0, 1), Error);

  // Independent: the dense projections the GPU prefill keeps in fp16, by tensor name (2 bytes each).
  uint64_t halves = 0;
  for (const auto& t : model->file().tensors()) {
    if (!in_trunk(t.name)) continue;
    for (const char* n : {".attn_q.", ".attn_k.", ".attn_v.", ".attn_output.", ".attn_qkv.", ".attn_gate.",
                          ".ssm_beta.", ".ssm_alpha.", ".ssm_out.", ".ffn_gate_shexp.", ".ffn_up_shexp.",
                          ".ffn_down_shexp."})
      if (t.name.find(n) != std::string::npos) halves += 2 * static_cast<uint64_t>(t.n_elements());
  }
  EXPECT_GT(halves, 0u);
  EXPECT_EQ(f.prefill_f16_cache_bytes, halves);

  // The placement problem built from it: uniform without counts, counts / tokens with them.
  PlacementInput u = placement_input(f, nullptr, c.n_expert_used, 1000);
  EXPECT_EQ(u.budget_bytes, 1000u);
  EXPECT_DOUBLE_EQ(u.hotness[2][5], static_cast<double>(c.n_expert_used) / c.n_expert);
  RoutingCounts counts;
  counts.reset(c.n_layer, c.n_expert);
  counts.add(2, 5, 30);
  counts.n_tokens = 10;
  PlacementInput h = placement_input(f, &counts, c.n_expert_used, 1000);
  EXPECT_DOUBLE_EQ(h.hotness[2][5], 3.0);
  EXPECT_DOUBLE_EQ(h.hotness[2][4], 0.0);
  counts.reset(c.n_layer + 1, c.n_expert);
  counts.n_tokens = 1;
  EXPECT_THROW(placement_input(f, &counts, c.n_expert_used, 1000), Error);
}

// A model mixing sliding-window and full-attention layers (synth tiny-laguna, window 4): the KV budget
// counts ctx rows per full layer and the ring (window plus one forward's tokens, at most ctx) per
// sliding layer, as the engine's caches hold them; below the ring size both kinds cost ctx rows.
TEST(ModelFootprint, SlidingWindowLayersCostTheirRingNotTheContext) {
  convert::SynthOptions o;
  o.preset = "tiny-laguna";
  o.quant = "f32";
  o.threads = 2;
  o.out_path = (std::filesystem::path(testing::TempDir()) / "vram_tiny_laguna.gguf").string();
  convert::synth_model(o);
  auto model = Model::load(o.out_path);
  const ModelConfig& c = model->config();
  int n_full = 0, n_sliding = 0;
  for (int il = 0; il < c.n_layer; ++il) {
    if (c.mixer(il) == LayerKind::FullAttention) ++n_full;
    if (c.mixer(il) == LayerKind::SlidingAttention) {
      ++n_sliding;
      ASSERT_EQ(c.layer(il).window, 4);
    }
  }
  ASSERT_GT(n_full, 0);
  ASSERT_GT(n_sliding, 0);
  // K and V rows in f32: kv heads x head_dim floats each.
  const uint64_t row = 2ull * static_cast<uint64_t>(c.n_head_kv) * c.head_dim * sizeof(float);
  const uint64_t ring = 4 + 512 - 1;  // the window plus one forward's tokens (kSlidingForwardTokens), less one
  for (const int ctx : {96, 2000}) {
    const uint64_t sliding_rows = std::min<uint64_t>(static_cast<uint64_t>(ctx), ring);
    const uint64_t expected =
        row * (static_cast<uint64_t>(n_full) * ctx + static_cast<uint64_t>(n_sliding) * sliding_rows);
    const ModelFootprint f = model_footprint(*model, ctx, 2);
    EXPECT_EQ(f.kv_cache_bytes, 2 * expected) << "ctx " << ctx;
    EXPECT_EQ(f.kv_bytes_per_token, row * static_cast<uint64_t>(n_full));
    // The engine's own buffers for the same context.
    Session s(*model, ctx);
    uint64_t kv = 0;
    for (const LayerState& l : s.state().layers) kv += l.k.size() + l.v.size();
    EXPECT_EQ(f.kv_cache_bytes, 2 * kv) << "ctx " << ctx;
    // Nothing recurrent in a model without DeltaNet layers.
    EXPECT_EQ(f.recurrent_state_bytes, 0u);
    VramInputs in;
    in.gpu_total = in.gpu_free = 80ull << 30;
    in.model = f;
    const std::string text = format_receipt(compute_vram_receipt(in), nullptr);
    const uint64_t rings = 2 * row * static_cast<uint64_t>(n_sliding) * sliding_rows;
    EXPECT_NE(
        text.find(cat(f.kv_bytes_per_token, " bytes/token + ", format_binary_size(rings), " sliding-window rings")),
        std::string::npos)
        << text;
  }
}

}  // namespace
}  // namespace strata
