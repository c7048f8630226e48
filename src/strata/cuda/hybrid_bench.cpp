#include "strata/cuda/hybrid_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "strata/engine/bench_runner.h"
#include "strata/engine/model.h"
#include "strata/moe/vram_budget.h"

namespace strata::cuda {

HybridBenchPlan hybrid_bench_plan(const GpuExpertPlan& g, int n_expert_used) {
  const VramReceipt& r = g.receipt;
  HybridBenchPlan p;
  p.budget_text = r.budget_source;
  p.hotness_source = g.hotness_source;
  p.budget_bytes = r.expert_budget;
  p.all_expert_bytes = r.all_expert_bytes;
  p.hot_bytes = g.plan.bytes_used;
  p.hot_experts = g.plan.n_hot_total();
  p.all_experts = g.plan.n_expert_total();
  int moe_layers = 0;
  for (const auto& row : r.expert_bytes) moe_layers += row.empty() ? 0 : 1;
  const double picks = static_cast<double>(moe_layers) * n_expert_used;
  p.expected_cold_hit = picks > 0 ? g.plan.expected_cold_picks_per_token / picks : 0.0;
  p.bytes_per_expert = p.all_experts > 0 ? static_cast<double>(r.all_expert_bytes) / p.all_experts : 0.0;
  return p;
}

HybridBenchNumbers hybrid_bench_numbers(const HybridTelemetry& t, const HybridBenchPlan& plan, const ActiveBytes& active,
                                        double gpu_gbs, double cpu_gbs) {
  HybridBenchNumbers n;
  n.telemetry = t;
  n.tokens = static_cast<double>(t.tokens);
  n.gpu_gbs = gpu_gbs;
  n.cpu_gbs = cpu_gbs;
  if (t.tokens == 0) return n;
  n.cold_picks_per_token = static_cast<double>(t.cold_picks) / n.tokens;
  n.hot_picks_per_token = static_cast<double>(t.picks - t.cold_picks) / n.tokens;
  n.cpu_ms_per_token = t.cpu_cold_ms / n.tokens;
  n.wait_ms_per_token = t.gpu_wait_ms / n.tokens;
  n.gpu_bytes_per_token = active.dense + active.embd_row + active.output + n.hot_picks_per_token * plan.bytes_per_expert;
  n.cold_bytes_per_token = n.cold_picks_per_token * plan.bytes_per_expert;
  const double t_gpu = gpu_gbs > 0 ? n.gpu_bytes_per_token / (gpu_gbs * 1e9) : 0.0;
  const double t_cpu = cpu_gbs > 0 ? n.cold_bytes_per_token / (cpu_gbs * 1e9) : 0.0;
  const double t_floor = std::max(t_gpu, t_cpu);
  n.floor_tps = t_floor > 0 ? 1.0 / t_floor : 0.0;
  return n;
}

std::string format_hybrid_bench(const HybridBenchPlan& p, const HybridBenchNumbers& n) {
  const HybridTelemetry& t = n.telemetry;
  char buf[512];
  std::string out;
  std::snprintf(buf, sizeof buf,
                "hybrid experts: budget %s = %s of %s; %d of %d experts hot (%s); placement from %s; "
                "expected cold-hit %.3f\n",
                p.budget_text.c_str(), format_binary_size(p.budget_bytes).c_str(),
                format_binary_size(p.all_expert_bytes).c_str(), p.hot_experts, p.all_experts,
                format_binary_size(p.hot_bytes).c_str(), p.hotness_source.c_str(), p.expected_cold_hit);
  out += buf;
  std::snprintf(buf, sizeof buf,
                "hybrid run (%d CPU threads, %llu tokens through the MoE): cold-hit %.3f, %.2f cold picks/token "
                "on %.2f layers/token with CPU jobs; CPU %.3f ms/token, GPU wait %.3f ms/token\n",
                t.cpu_threads, static_cast<unsigned long long>(t.tokens), t.cold_hit_rate(),
                n.cold_picks_per_token, n.tokens > 0 ? static_cast<double>(t.cpu_jobs) / n.tokens : 0.0,
                n.cpu_ms_per_token, n.wait_ms_per_token);
  out += buf;
  std::snprintf(buf, sizeof buf,
                "hybrid floor: max(GPU %.1f MB/token / %.0f GB/s, cold %.1f MB/token / %.1f GB/s host) = %.1f tok/s\n",
                n.gpu_bytes_per_token / 1e6, n.gpu_gbs, n.cold_bytes_per_token / 1e6, n.cpu_gbs, n.floor_tps);
  out += buf;
  out += "cold picks per layer:";
  for (size_t l = 0; l < t.cold_picks_per_layer.size(); ++l) {
    std::snprintf(buf, sizeof buf, " %.2f", n.tokens > 0 ? static_cast<double>(t.cold_picks_per_layer[l]) / n.tokens : 0.0);
    out += buf;
  }
  out += " (per token)\n";
  return out;
}

HybridDecodeBreakdown measure_hybrid_decode(GpuSession& session, int n_prompt, int n_tokens, uint64_t seed) {
  HybridDecodeBreakdown b;
  const int64_t n_vocab = session.model().config().n_vocab;
  const std::vector<int32_t> ids = bench_prompt(n_prompt + n_tokens, n_vocab, seed, 0);
  std::vector<float> logits(static_cast<size_t>(n_vocab));
  session.reset();
  session.forward(ids.data(), n_prompt, logits.data(), false);
  session.reset_hybrid_telemetry();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n_tokens; ++i) session.forward(ids.data() + n_prompt + i, 1, logits.data(), false);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const HybridTelemetry t = session.hybrid_telemetry();
  const double n = n_tokens > 0 ? n_tokens : 1;
  b.tokens = n_tokens;
  b.wall_ms_per_token = ms / n;
  b.wait_ms_per_token = t.gpu_wait_ms / n;
  b.gpu_ms_per_token = b.wall_ms_per_token - b.wait_ms_per_token;
  b.cpu_ms_per_token = t.cpu_cold_ms / n;
  b.answer_ms_per_token = t.answer_ms / n;
  b.cold_picks_per_token = static_cast<double>(t.cold_picks) / n;
  b.cold_hit_rate = t.cold_hit_rate();
  for (uint64_t v : t.cold_picks_per_layer) b.cold_picks_per_layer.push_back(static_cast<double>(v) / n);
  return b;
}

std::string format_hybrid_decode(const HybridDecodeBreakdown& b) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "hybrid decode breakdown (%d single-token steps): %.3f ms/token = GPU %.3f + wait for CPU %.3f; "
                "CPU cold work %.3f ms/token (overlapped), doorbell to answer %.3f; %.2f cold picks/token, "
                "cold-hit %.3f\n",
                b.tokens, b.wall_ms_per_token, b.gpu_ms_per_token, b.wait_ms_per_token, b.cpu_ms_per_token,
                b.answer_ms_per_token, b.cold_picks_per_token, b.cold_hit_rate);
  return buf;
}

}  // namespace strata::cuda
