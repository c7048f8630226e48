#include "strata/moe/vram_budget.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "strata/base/error.h"
#include "strata/engine/model.h"
#include "strata/engine/sequence_state.h"
#include "strata/gguf/model_summary.h"
#include "strata/moe/placement.h"

namespace strata {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

// Parses a non-negative decimal number ("12", "1.5", ".5"); returns false on anything else.
bool parse_number(const std::string& s, double& out) {
  if (s.empty()) return false;
  size_t digits = 0, dots = 0;
  for (char c : s) {
    if (c >= '0' && c <= '9') {
      ++digits;
    } else if (c == '.') {
      ++dots;
    } else {
      return false;
    }
  }
  if (digits == 0 || dots > 1) return false;
  out = std::strtod(s.c_str(), nullptr);
  return std::isfinite(out);
}

std::string line(const char* label, const std::string& value, const std::string& note = "") {
  char buf[256];
  std::snprintf(buf, sizeof buf, "  %-28s %12s%s%s\n", label, value.c_str(), note.empty() ? "" : "  ",
                note.c_str());
  return buf;
}

}  // namespace

std::string format_binary_size(uint64_t b) {
  char buf[64];
  const double x = static_cast<double>(b);
  if (b >= (uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", x / (1u << 30));
  } else if (b >= kMiB) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", x / kMiB);
  } else if (b >= 1024) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", x / 1024);
  } else {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  }
  return buf;
}

uint64_t parse_size(const std::string& text, const char* what) {
  const std::string s = trim(text);
  size_t i = 0;
  while (i < s.size() && ((s[i] >= '0' && s[i] <= '9') || s[i] == '.')) ++i;
  const std::string number = s.substr(0, i);
  const std::string suffix = lower(trim(s.substr(i)));
  double x = 0.0;
  int shift = -1;
  if (suffix.empty() || suffix == "b") shift = 0;
  for (const auto& [letter, sh] : {std::pair<char, int>{'k', 10}, {'m', 20}, {'g', 30}, {'t', 40}}) {
    const std::string l(1, letter);
    if (suffix == l || suffix == l + "b" || suffix == l + "ib") shift = sh;
  }
  if (!parse_number(number, x) || shift < 0)
    fail(what, ": invalid size '", text, "': expected a number with an optional K/M/G/T suffix (binary units, ",
         "e.g. 24G, 24GiB, 512M, 1.5GB or a byte count)");
  const double bytes = std::floor(x * std::ldexp(1.0, shift));
  if (bytes >= 18446744073709551615.0) fail(what, ": size '", text, "' is too large");
  if (shift == 0 && bytes != x) fail(what, ": invalid size '", text, "': a byte count must be a whole number");
  return static_cast<uint64_t>(bytes);
}

ExpertBudgetSpec parse_expert_budget(const std::string& text) {
  ExpertBudgetSpec spec;
  spec.text = trim(text);
  if (!spec.text.empty() && spec.text.back() == '%') {
    double p = 0.0;
    if (!parse_number(trim(spec.text.substr(0, spec.text.size() - 1)), p) || p > 100.0)
      fail("--expert-budget: invalid percentage '", text, "': expected 0% .. 100% of all routed-expert bytes");
    spec.is_percent = true;
    spec.percent = p;
    return spec;
  }
  spec.bytes = parse_size(spec.text, "--expert-budget");
  return spec;
}

ModelFootprint model_footprint(const Model& model, int ctx, int slots, KvCacheTypes kv_types) {
  const ModelConfig& c = model.config();
  if (ctx <= 0) fail("model footprint: context must be positive, got ", ctx);
  if (slots <= 0) fail("model footprint: sequence slots must be positive, got ", slots);
  check_kv_types(c, kv_types);
  const ModelBytes mb = summarize_bytes(model.file().tensors());
  ModelFootprint f;
  f.ctx = ctx;
  f.slots = slots;
  f.core_weight_bytes = mb.other_bytes;
  f.all_expert_bytes = mb.expert_bytes;
  f.expert_bytes.resize(static_cast<size_t>(c.n_layer));
  for (const LayerBytes& l : mb.layers) {
    if (l.layer >= c.n_layer && l.layer < c.n_layer + c.n_mtp) {
      // MTP blocks: only the MTP drafter runs them; the GPU head uploads them on first use, outside
      // the plan (one layer of an all-GPU model).
      f.core_weight_bytes -= l.other_bytes;
      f.all_expert_bytes -= l.expert_bytes;
      continue;
    }
    if (l.n_expert == 0) continue;
    if (l.layer >= c.n_layer)
      fail(model.file().path(), ": expert tensors of layer ", l.layer, " beyond the model's ", c.n_layer, " layers");
    if (l.n_expert != c.n_expert)
      fail(model.file().path(), ": layer ", l.layer, " has ", l.n_expert, " experts, the model config says ",
           c.n_expert);
    f.expert_bytes[l.layer].assign(static_cast<size_t>(l.n_expert), l.bytes_per_expert);
  }
  // The matrices the GPU prefill multiplies through cuBLAS on half copies (router, shared-expert gate
  // and output stay float32 there).
  const auto halves = [](const WeightMatrix& w) { return static_cast<uint64_t>(w.n_rows * w.n_cols) * 2u; };
  for (const LayerWeights& L : model.weights().layers) {
    if (L.kind == LayerKind::FullAttention) {
      for (const WeightMatrix* m : {&L.attn.q, &L.attn.k, &L.attn.v, &L.attn.o}) f.prefill_f16_cache_bytes += halves(*m);
    } else {
      for (const WeightMatrix* m : {&L.deltanet.qkv, &L.deltanet.gate, &L.deltanet.beta, &L.deltanet.alpha,
                                    &L.deltanet.out})
        f.prefill_f16_cache_bytes += halves(*m);
    }
    if (L.moe.has_shared)
      for (const WeightMatrix* m : {&L.moe.shared_gate, &L.moe.shared_up, &L.moe.shared_down})
        f.prefill_f16_cache_bytes += halves(*m);
  }
  f.kv_types = kv_types;
  f.kv_bytes_per_token = kv_bytes_per_token(c, kv_types);
  f.kv_cache_bytes = kv_cache_bytes(c, kv_types, ctx) * static_cast<uint64_t>(slots);
  for (int il = 0; il < c.n_layer; ++il) {
    if (c.mixer(il) == LayerKind::DeltaNet) {
      const uint64_t floats = static_cast<uint64_t>(c.ssm_conv_kernel - 1) * c.ssm_conv_channels() +
                              static_cast<uint64_t>(c.ssm_v_heads) * c.ssm_head_k * c.ssm_head_v;
      f.recurrent_state_bytes += floats * sizeof(float) * static_cast<uint64_t>(slots);
    }
  }
  return f;
}

PlacementInput placement_input(const ModelFootprint& f, const RoutingCounts* counts, int n_expert_used,
                               uint64_t budget_bytes) {
  PlacementInput in;
  in.expert_bytes = f.expert_bytes;
  in.budget_bytes = budget_bytes;
  if (counts == nullptr || counts->n_tokens == 0) {
    in.hotness = uniform_hotness(f.expert_bytes, n_expert_used);
    return in;
  }
  if (counts->n_layer != static_cast<int>(f.expert_bytes.size()))
    fail("placement: routing counts have ", counts->n_layer, " layers, the model ", f.expert_bytes.size());
  in.hotness = hotness_from_counts(*counts, n_expert_used);
  for (size_t l = 0; l < f.expert_bytes.size(); ++l)
    if (!f.expert_bytes[l].empty() && static_cast<int>(f.expert_bytes[l].size()) != counts->n_expert)
      fail("placement: routing counts have ", counts->n_expert, " experts, layer ", l, " of the model ",
           f.expert_bytes[l].size());
  return in;
}

uint64_t default_safety_reserve(uint64_t limit) {
  return std::min(limit, std::max<uint64_t>(512 * kMiB, limit / 50));
}

VramReceipt compute_vram_receipt(const VramInputs& in) {
  if (in.gpu_free > in.gpu_total)
    fail("VRAM budget: free GPU memory (", in.gpu_free, " bytes) exceeds the total (", in.gpu_total, ")");
  VramReceipt r;
  r.gpu_total = in.gpu_total;
  r.gpu_free = in.gpu_free;
  if (in.gpu_mem) {
    if (*in.gpu_mem > in.gpu_total)
      fail("--gpu-mem ", format_binary_size(*in.gpu_mem), " is more than the GPU has (",
           format_binary_size(in.gpu_total), ")");
    r.limit = *in.gpu_mem;
    r.limit_source = cat("--gpu-mem ", format_binary_size(*in.gpu_mem));
    r.limit_available = *in.gpu_mem <= in.gpu_free;
  } else {
    r.limit = in.gpu_free;
    r.limit_source = "GPU free memory";
  }
  r.reserve = in.reserve ? *in.reserve : default_safety_reserve(r.limit);
  r.reserve_source = in.reserve ? "given" : "max(512 MiB, 2%)";
  r.core_weights = in.model.core_weight_bytes;
  r.kv_cache = in.model.kv_cache_bytes;
  r.kv_bytes_per_token = in.model.kv_bytes_per_token;
  r.kv_types = in.model.kv_types;
  r.recurrent_state = in.model.recurrent_state_bytes;
  r.workspaces = in.workspace_bytes;
  r.cache_slots = in.cache_slot_bytes;
  r.cache_note = in.cache_note;
  r.prefill_cache = in.prefill_cache_bytes;
  r.prefill_cache_note = in.prefill_cache_note;
  r.prefill_stream = in.prefill_stream_bytes;
  r.prefill_stream_note = in.prefill_stream_note;
  r.ctx = in.model.ctx;
  r.slots = in.model.slots;
  r.core_total =
      r.reserve + r.core_weights + r.kv_cache + r.recurrent_state + r.workspaces + r.prefill_cache + r.prefill_stream;
  r.available_for_experts = static_cast<int64_t>(r.limit) - static_cast<int64_t>(r.core_total);
  r.all_expert_bytes = in.model.all_expert_bytes;
  r.expert_bytes = in.model.expert_bytes;
  r.core_fits = r.available_for_experts >= 0;
  const uint64_t available = r.core_fits ? static_cast<uint64_t>(r.available_for_experts) : 0;

  if (in.expert_budget) {
    const ExpertBudgetSpec& b = *in.expert_budget;
    if (b.is_percent && !(b.percent >= 0.0 && b.percent <= 100.0))
      fail("--expert-budget ", b.percent, "%: a percentage must be within 0..100");
    const uint64_t want =
        b.is_percent ? static_cast<uint64_t>(std::floor(static_cast<double>(r.all_expert_bytes) * b.percent / 100.0))
                     : b.bytes;
    r.budget_source = cat("--expert-budget ", b.text.empty() ? format_binary_size(want) : b.text);
    r.expert_budget = std::min(want, r.all_expert_bytes);  // more than every expert buys nothing
    r.budget_fits = r.expert_budget <= available;
  } else {
    r.budget_source = "what is left";
    r.expert_budget = std::min(available, r.all_expert_bytes);
  }
  if (!r.core_fits) r.expert_budget = 0;
  return r;
}

std::string format_receipt(const VramReceipt& r, const ExpertPlan* plan) {
  std::string s = cat("VRAM budget (GPU: ", format_binary_size(r.gpu_total), " total, ",
                      format_binary_size(r.gpu_free), " free)\n");
  s += line("limit", format_binary_size(r.limit), r.limit_source + (r.limit_available ? "" : " (MORE THAN IS FREE)"));
  s += line("- safety reserve", format_binary_size(r.reserve), r.reserve_source);
  s += line("- core weights", format_binary_size(r.core_weights), "non-expert tensors");
  // The cache beyond the full-attention layers' bytes per token is the sliding-window layers' rings.
  const uint64_t full = r.kv_bytes_per_token * static_cast<uint64_t>(r.ctx) * static_cast<uint64_t>(r.slots);
  const std::string rings =
      r.kv_cache > full ? cat(" + ", format_binary_size(r.kv_cache - full), " sliding-window rings") : std::string();
  s += line("- KV cache", format_binary_size(r.kv_cache),
            cat("ctx ", r.ctx, " x ", r.slots, " slot(s), K ", kv_type_name(r.kv_types.k), " + V ",
                kv_type_name(r.kv_types.v), ", ", r.kv_bytes_per_token, " bytes/token", rings));
  s += line("- recurrent state", format_binary_size(r.recurrent_state), "DeltaNet conv + state");
  s += line("- workspaces", format_binary_size(r.workspaces));
  if (r.prefill_cache > 0 || !r.prefill_cache_note.empty())
    s += line("- prefill fp16 cache", format_binary_size(r.prefill_cache), r.prefill_cache_note);
  if (r.prefill_stream > 0 || !r.prefill_stream_note.empty())
    s += line("- prefill streaming", format_binary_size(r.prefill_stream), r.prefill_stream_note);
  if (r.core_fits) {
    s += line("= available for experts", format_binary_size(static_cast<uint64_t>(r.available_for_experts)));
  } else {
    s += line("= available for experts", "-" + format_binary_size(static_cast<uint64_t>(-r.available_for_experts)),
              "THE CORE DOES NOT FIT");
  }
  const double pct = r.all_expert_bytes ? 100.0 * static_cast<double>(r.expert_budget) / r.all_expert_bytes : 0.0;
  char pbuf[64];
  std::snprintf(pbuf, sizeof pbuf, "%.1f%% of %s", pct, format_binary_size(r.all_expert_bytes).c_str());
  s += line("expert budget", format_binary_size(r.expert_budget),
            cat(r.budget_source, ", ", pbuf, r.budget_fits ? "" : " (MORE THAN IS AVAILABLE)"));
  if (r.cache_slots > 0) s += line("- expert cache", format_binary_size(r.cache_slots), r.cache_note);
  if (!plan) return s;

  // Per layer: hot/cold counts and bytes; consecutive identical layers share one row.
  struct Row {
    int first, last, hot, total;
    uint64_t hot_bytes, cold_bytes;
  };
  std::vector<Row> rows;
  uint64_t hot_sum = 0, cold_sum = 0;
  int hot_n = 0, all_n = 0;
  for (int l = 0; l < plan->n_layer; ++l) {
    Row row{l, l, 0, static_cast<int>(plan->slot_of[l].size()), 0, 0};
    for (size_t e = 0; e < plan->slot_of[l].size(); ++e) {
      const bool known = l < static_cast<int>(r.expert_bytes.size()) && e < r.expert_bytes[l].size();
      const uint64_t b = known ? r.expert_bytes[l][e] : 0;
      if (plan->slot_of[l][e] >= 0) {
        ++row.hot;
        row.hot_bytes += b;
      } else {
        row.cold_bytes += b;
      }
    }
    hot_sum += row.hot_bytes;
    cold_sum += row.cold_bytes;
    hot_n += row.hot;
    all_n += row.total;
    if (!rows.empty() && rows.back().hot == row.hot && rows.back().total == row.total &&
        rows.back().hot_bytes == row.hot_bytes && rows.back().cold_bytes == row.cold_bytes) {
      rows.back().last = l;
    } else {
      rows.push_back(row);
    }
  }
  s += cat("  hot experts: ", hot_n, " of ", all_n, " (", format_binary_size(hot_sum), " in VRAM), cold: ",
           all_n - hot_n,
           " (", format_binary_size(cold_sum), " read from the mapped GGUF)\n");
  char buf[256];
  std::snprintf(buf, sizeof buf, "  %-9s %9s %12s %12s\n", "layers", "hot/all", "hot bytes", "cold bytes");
  s += buf;
  for (const Row& row : rows) {
    const std::string layers = row.first == row.last ? cat(row.first) : cat(row.first, "-", row.last);
    const std::string counts = cat(row.hot, "/", row.total);
    std::snprintf(buf, sizeof buf, "  %-9s %9s %12s %12s\n", layers.c_str(), counts.c_str(),
                  format_binary_size(row.hot_bytes).c_str(), format_binary_size(row.cold_bytes).c_str());
    s += buf;
  }
  return s;
}

void require_core_fits(const VramReceipt& r) {
  if (!r.limit_available)
    fail(r.limit_source, " is more than the GPU has free (", format_binary_size(r.gpu_free),
         "; other processes use the rest)\n",
         format_receipt(r, nullptr), "hint: lower --gpu-mem or free GPU memory");
  if (!r.core_fits)
    fail("the model's core does not fit in GPU memory\n", format_receipt(r, nullptr),
         "hint: lower --ctx / use a smaller quant / raise --gpu-mem");
  if (!r.budget_fits)
    fail(r.budget_source, " does not fit: only ", format_binary_size(static_cast<uint64_t>(r.available_for_experts)),
         " are available for experts\n", format_receipt(r, nullptr), "hint: lower --expert-budget or raise --gpu-mem");
}

}  // namespace strata
