// laguna (Poolside Laguna, e.g. Laguna-XS.2). Every layer:
//   x += attention(rmsnorm(x, attn_norm));  x += ffn(rmsnorm(x, ffn_norm))
// Attention: full or sliding-window per layer, each kind with its own rotary base and rotary dims
// (NEOX, partial when dims < head_dim) and per-layer query head counts (KV heads may differ too);
// per-head q/k RMSNorm; the output is multiplied by softplus(attn_gate . x) (x = the normed layer
// input) per head or per element before attn_output. FFN: the first leading_dense_block_count layers
// a dense SwiGLU, the rest MoE with a sigmoid router (logits optionally soft-capped:
// c * tanh(l / c)), top-k chosen on sigmoid + exp_probs_b, weights = the chosen sigmoids renormalised,
// their sum times expert_weights_scale, plus an ungated shared expert.
// GGUF keys and tensor names as llama.cpp's converter writes them for `laguna`; the sliding layout is
// a period with full attention first (sliding_window_pattern, 4 when absent) or a per-layer array.
#include <cmath>
#include <memory>
#include <variant>

#include "strata/base/error.h"
#include "strata/gguf/gguf.h"
#include "strata/model/arch.h"

namespace strata {
namespace {

// Which layers use sliding-window attention: sliding_window_pattern as a period P (layer il is full
// when il % P == 0, as llama.cpp reads it for laguna) or as one flag per layer (true = sliding).
std::vector<bool> sliding_layers(const GgufFile& f, const std::string& key, int n_layer) {
  std::vector<bool> sliding(static_cast<size_t>(n_layer));
  const GgufValue* v = f.find(key);
  if (v && v->type == GgufType::ARRAY) {
    const auto* arr = std::get_if<std::shared_ptr<GgufArray>>(&v->v);
    if (!arr || !*arr) fail(f.path(), ": key ", key, " must be a period or an array of per-layer flags");
    std::vector<bool> flags;
    if ((*arr)->elem_type == GgufType::BOOL) {
      for (const GgufValue& item : (*arr)->items) flags.push_back(std::get<bool>(item.v));
    } else {
      for (int64_t x : f.get_int_array(key)) flags.push_back(x != 0);
    }
    if (static_cast<int>(flags.size()) < n_layer) fail(f.path(), ": key ", key, " has fewer entries than layers");
    for (int i = 0; i < n_layer; ++i) sliding[static_cast<size_t>(i)] = flags[static_cast<size_t>(i)];
    return sliding;
  }
  const int period = gguf_positive_or(f, key, 4);
  for (int i = 0; i < n_layer; ++i) sliding[static_cast<size_t>(i)] = i % period != 0;
  return sliding;
}

// The full-attention layers' rotary scaling (rope.scaling.*, llama.cpp's keys): none or YaRN. The
// sliding layers keep plain rotary (their own base and dims).
RopeYarn read_yarn(const GgufFile& f, const std::string& p) {
  RopeYarn y;
  if (!f.has(p + "rope.scaling.type")) return y;
  const std::string t = f.get_string(p + "rope.scaling.type");
  if (t == "none") return y;
  if (t != "yarn") fail(f.path(), ": key ", p, "rope.scaling.type = '", t, "': only yarn (or none) is implemented");
  y.factor = f.get_f32_or(p + "rope.scaling.factor", 1.0f);
  y.orig_ctx = static_cast<int>(f.get_u32_or(p + "rope.scaling.original_context_length", 0));
  y.beta_fast = f.get_f32_or(p + "rope.scaling.yarn_beta_fast", 32.0f);
  y.beta_slow = f.get_f32_or(p + "rope.scaling.yarn_beta_slow", 1.0f);
  require_config(y.factor >= 1.0f && y.orig_ctx > 0 && y.beta_fast > 0.0f && y.beta_slow > 0.0f, f,
                 "yarn needs rope.scaling.factor >= 1, original_context_length > 0 and positive betas");
  // llama.cpp's convention: the stored attention factor times YaRN's own 0.1 * ln(factor) + 1.
  y.mscale = f.get_f32_or(p + "rope.scaling.attn_factor", 1.0f) * (0.1f * std::log(y.factor) + 1.0f);
  return y;
}

void read_laguna(const GgufFile& f, const std::string& p, ModelConfig& c) {
  const RopeYarn yarn = read_yarn(f, p);
  c.n_ff_shexp = gguf_positive(f, p + "expert_shared_feed_forward_length");
  require_config(f.get_u32_or(p + "expert_shared_count", 1) == 1, f, "expert_shared_count must be 1");
  c.shared_expert_gated = false;
  c.n_ff = gguf_positive_or(f, p + "feed_forward_length", 0);
  const uint32_t gating = f.get_u32_or(p + "expert_gating_func", 2);  // llama.cpp: 1 softmax, 2 sigmoid
  require_config(gating == 1 || gating == 2, f, cat("expert_gating_func ", gating, " (supported: 1 softmax, 2 sigmoid)"));
  c.router = gating == 2 ? RouterKind::Sigmoid : RouterKind::Softmax;
  c.norm_topk = f.get_bool_or(p + "expert_weights_norm", true);
  c.expert_weights_scale = f.get_f32_or(p + "expert_weights_scale", 1.0f);
  c.router_softcap = f.get_f32_or(p + "router_logit_softcapping", 0.0f);
  require_config(c.expert_weights_scale > 0.0f, f, "expert_weights_scale must be positive");
  require_config(c.router_softcap >= 0.0f, f, "router_logit_softcapping must be >= 0");

  const int n_dense = static_cast<int>(f.get_u32_or(p + "leading_dense_block_count", 0));
  require_config(n_dense <= c.n_layer, f, "leading_dense_block_count > block_count");
  const int window = static_cast<int>(f.get_u32_or(p + "attention.sliding_window", 0));
  const std::vector<bool> sliding =
      window > 0 ? sliding_layers(f, p + "attention.sliding_window_pattern", c.n_layer) : std::vector<bool>(c.n_layer);
  const float base_swa = f.get_f32_or(p + "rope.freq_base_swa", c.rope_freq_base);
  const int dims_swa = gguf_positive_or(f, p + "rope.dimension_count_swa", c.rope_dims);

  c.layers.resize(static_cast<size_t>(c.n_layer));
  int first_moe = -1;
  for (int i = 0; i < c.n_layer; ++i) {
    LayerSpec& l = c.layers[static_cast<size_t>(i)];
    l.ffn = i < n_dense ? FfnKind::Dense : FfnKind::Moe;
    if (l.ffn == FfnKind::Moe && first_moe < 0) first_moe = i;
    if (!sliding[static_cast<size_t>(i)]) l.yarn = yarn;
    if (sliding[static_cast<size_t>(i)]) {
      l.mixer = LayerKind::SlidingAttention;
      l.window = window;
      l.rope_dims = dims_swa;
      l.rope_freq_base = base_swa;
    }
  }
  // The gate's width tells per-head from per-element (llama.cpp reads it from the tensor too).
  const GgufTensorInfo* gate = f.find_tensor("blk.0.attn_gate.weight");
  if (!gate) fail(f.path(), ": missing tensor 'blk.0.attn_gate.weight' (required by architecture laguna)");
  const int64_t heads0 = c.n_head;  // layer 0's (per-layer arrays give layer 0 first)
  if (gate->ne[1] == heads0) c.attn_gate = AttnGate::SoftplusPerHead;
  else if (gate->ne[1] == heads0 * c.head_dim) c.attn_gate = AttnGate::SoftplusPerElement;
  else fail(f.path(), ": tensor 'blk.0.attn_gate.weight' has ", gate->ne[1], " rows, expected ", heads0,
            " (per head) or ", heads0 * c.head_dim, " (per element)");
  c.expert_selection_bias = first_moe >= 0 && f.find_tensor(cat("blk.", first_moe, ".exp_probs_b.bias")) != nullptr;
}

}  // namespace

const ArchDescription kLaguna = {Arch::Laguna, "laguna", &read_laguna, "ffn_norm.weight"};

}  // namespace strata
