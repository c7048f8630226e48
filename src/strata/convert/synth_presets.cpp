// The preset table. Sources: the Hugging Face config.json of each checkpoint:
//   qwen3-30b-a3b     Qwen/Qwen3-30B-A3B/config.json: 48 layers, hidden 2048, intermediate 6144,
//                     32 q / 4 kv heads of 128, 128 experts (8 used) of 768, vocab 151936,
//                     max_position_embeddings 40960, rope_theta 1e6, rms_norm_eps 1e-6, untied.
//   qwen3-235b-a22b   Qwen/Qwen3-235B-A22B/config.json: 94 layers, hidden 4096, intermediate 12288,
//                     64 q / 4 kv heads of 128, 128 experts (8 used) of 1536, vocab 151936,
//                     max_position_embeddings 40960, rope_theta 1e6, rms_norm_eps 1e-6, untied.
//   qwen3.5-35b-a3b,  Qwen/Qwen3.5-35B-A3B and Qwen/Qwen3.6-35B-A3B config.json text_config (same
//   qwen3.6-35b-a3b   architecture): 40 layers, full_attention_interval 4 (30 DeltaNet + 10 full),
//                     hidden 2048, 16 q / 2 kv heads of 256, partial_rotary_factor 0.25 (64 rope dims),
//                     mrope_section [11, 11, 10], rope_theta 1e7, 256 experts (8 used) of 512, shared
//                     expert 512, DeltaNet 16 k heads / 32 v heads of 128, conv kernel 4, vocab 248320,
//                     max_position_embeddings 262144, rms_norm_eps 1e-6, untied.
//   laguna-xs.2       https://huggingface.co/poolside/Laguna-XS.2 (config.json): 40 layers, full
//                     attention at every 4th layer from layer 0 and sliding-window (512) attention
//                     elsewhere, hidden 2048, 48 (full) / 64 (sliding) q heads and 8 kv heads of 128,
//                     rotary: full layers theta 5e5 on half the head (64 dims), sliding layers theta
//                     1e4 on all 128 dims, per-head softplus output gate, layer 0 dense (intermediate
//                     8192), 256 experts (8 used) of 512 with a sigmoid router and a 512 shared expert,
//                     routed scaling 2.5, vocab 100352, rms_norm_eps 1e-6, untied. The checkpoint's
//                     full layers use YaRN rotary scaling; the synth writes plain rotary (same shapes
//                     and cost, not the same numerics).
//   tiny-*            test presets: every row length a multiple of 256 so every quant type applies
//                     without fallback; a few layers so tests run in seconds.
#include "strata/convert/synth_presets.h"

#include "strata/base/error.h"

namespace strata::convert {

namespace {

HfConfig qwen3moe(int n_layer, int n_embd, int n_ff, int n_head, int n_head_kv, int head_dim, int n_expert,
                  int n_used, int n_ff_exp, int n_vocab, int n_ctx, float theta) {
  HfConfig c;
  c.model_type = "qwen3_moe";
  c.arch = HfArch::Qwen3Moe;
  c.n_layer = n_layer;
  c.n_embd = n_embd;
  c.intermediate_size = n_ff;
  c.n_head = n_head;
  c.n_head_kv = n_head_kv;
  c.head_dim = head_dim;
  c.n_expert = n_expert;
  c.n_expert_used = n_used;
  c.n_ff_exp = n_ff_exp;
  c.n_vocab = n_vocab;
  c.n_ctx = n_ctx;
  c.rope_theta = theta;
  c.rms_eps = 1e-6f;
  c.tie_embeddings = false;
  c.norm_topk_prob = true;
  return c;
}

struct DeltaNetShape {
  int k_heads, v_heads, k_dim, v_dim, conv_kernel;
};

HfConfig qwen35moe(int n_layer, int n_embd, int n_head, int n_head_kv, int head_dim, int n_expert, int n_used,
                   int n_ff_exp, int n_ff_shexp, DeltaNetShape dn, int n_vocab, int n_ctx, float theta,
                   std::vector<int> mrope) {
  HfConfig c;
  c.model_type = "qwen3_5_moe_text";
  c.arch = HfArch::Qwen35Moe;
  c.n_layer = n_layer;
  c.n_embd = n_embd;
  c.n_head = n_head;
  c.n_head_kv = n_head_kv;
  c.head_dim = head_dim;
  c.n_expert = n_expert;
  c.n_expert_used = n_used;
  c.n_ff_exp = n_ff_exp;
  c.n_ff_shexp = n_ff_shexp;
  c.n_vocab = n_vocab;
  c.n_ctx = n_ctx;
  c.rope_theta = theta;
  c.rms_eps = 1e-6f;
  c.conv_kernel = dn.conv_kernel;
  c.lin_k_heads = dn.k_heads;
  c.lin_v_heads = dn.v_heads;
  c.lin_k_dim = dn.k_dim;
  c.lin_v_dim = dn.v_dim;
  c.full_attention_interval = 4;
  for (int i = 0; i < n_layer; ++i) c.is_full_attention.push_back((i + 1) % c.full_attention_interval == 0);
  c.partial_rotary_factor = 0.25f;
  c.rope_dims = static_cast<int>(head_dim * c.partial_rotary_factor);
  mrope.resize(4, 0);
  c.mrope_sections = mrope;
  return c;
}

struct LagunaShape {
  int n_layer, n_embd, n_ff, head_dim, heads_full, heads_sliding, n_head_kv, period, window;
  int n_expert, n_used, n_ff_exp, n_ff_shexp, n_dense, n_vocab, n_ctx;
  float scale, softcap;
};

HfConfig with_yarn(HfConfig c, float factor, int orig_ctx) {
  c.yarn_factor = factor;
  c.yarn_orig_ctx = orig_ctx;
  return c;
}

// Full attention at layers 0, period, 2 * period, ...; sliding-window attention elsewhere.
HfConfig laguna(const LagunaShape& s) {
  HfConfig c;
  c.model_type = "laguna";
  c.arch = HfArch::Laguna;
  c.n_layer = s.n_layer;
  c.n_embd = s.n_embd;
  c.intermediate_size = s.n_ff;
  c.n_head = s.heads_full;
  c.n_head_kv = s.n_head_kv;
  c.head_dim = s.head_dim;
  c.n_expert = s.n_expert;
  c.n_expert_used = s.n_used;
  c.n_ff_exp = s.n_ff_exp;
  c.n_ff_shexp = s.n_ff_shexp;
  c.n_vocab = s.n_vocab;
  c.n_ctx = s.n_ctx;
  c.rms_eps = 1e-6f;
  c.norm_topk_prob = true;
  c.rope_theta = 5.0e5f;
  c.rope_dims = s.head_dim / 2;
  c.rope_theta_swa = 1.0e4f;
  c.rope_dims_swa = s.head_dim;
  c.sliding_window = s.window;
  c.n_dense_lead = s.n_dense;
  c.gate_per_head = true;
  c.routed_scale = s.scale;
  c.router_softcap = s.softcap;
  for (int i = 0; i < s.n_layer; ++i) {
    const bool sliding = i % s.period != 0;
    c.is_sliding.push_back(sliding);
    c.heads_per_layer.push_back(sliding ? s.heads_sliding : s.heads_full);
  }
  return c;
}

std::vector<SynthPreset> build() {
  const HfConfig q36 = qwen35moe(40, 2048, 16, 2, 256, 256, 8, 512, 512, {16, 32, 128, 128, 4}, 248320, 262144,
                                 1.0e7f, {11, 11, 10});
  return {
      {"qwen3.6-35b-a3b", "Qwen/Qwen3.6-35B-A3B", q36},
      {"qwen3.5-35b-a3b", "Qwen/Qwen3.5-35B-A3B", q36},
      {"qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B",
       qwen3moe(48, 2048, 6144, 32, 4, 128, 128, 8, 768, 151936, 40960, 1.0e6f)},
      {"qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B",
       qwen3moe(94, 4096, 12288, 64, 4, 128, 128, 8, 1536, 151936, 40960, 1.0e6f)},
      {"laguna-xs.2", "poolside/Laguna-XS.2",
       laguna({40, 2048, 8192, 128, 48, 64, 8, 4, 512, 256, 8, 512, 512, 1, 100352, 131072, 2.5f, 0.0f})},
      // Every laguna feature at test size: sliding window 4, 2 / 4 q heads, soft-capping on.
      {"tiny-laguna", "test preset",
       laguna({4, 256, 512, 64, 2, 4, 2, 2, 4, 16, 4, 256, 256, 1, 512, 4096, 2.5f, 8.0f})},
      // tiny-laguna with YaRN on its full-attention layers (factor 4 over an original context of 32).
      {"tiny-laguna-yarn", "test preset",
       with_yarn(laguna({4, 256, 512, 64, 2, 4, 2, 2, 4, 16, 4, 256, 256, 1, 512, 4096, 2.5f, 8.0f}), 4.0f, 32)},
      {"tiny-qwen3moe", "test preset", qwen3moe(4, 256, 768, 4, 2, 64, 16, 4, 256, 512, 4096, 1.0e6f)},
      {"tiny-qwen35moe", "test preset",
       qwen35moe(4, 256, 4, 2, 64, 16, 4, 256, 256, {2, 4, 64, 64, 4}, 512, 4096, 1.0e7f, {4, 2, 2})},
  };
}

}  // namespace

const std::vector<SynthPreset>& synth_presets() {
  static const std::vector<SynthPreset> presets = build();
  return presets;
}

std::string synth_preset_names() {
  std::string s;
  for (const auto& p : synth_presets()) s += (s.empty() ? "" : ", ") + p.name;
  return s;
}

const SynthPreset& find_synth_preset(const std::string& name) {
  for (const auto& p : synth_presets()) {
    if (p.name == name) return p;
  }
  fail("synth: unknown preset '", name, "' (known: ", synth_preset_names(), ")");
}

}  // namespace strata::convert
