#include "strata/model/config.h"

#include "strata/base/error.h"
#include "strata/gguf/gguf.h"

namespace strata {

const std::vector<std::string>& supported_architectures() {
  static const std::vector<std::string> names = {"qwen3moe", "qwen35moe"};
  return names;
}

Arch arch_from_name(const std::string& name) {
  if (name == "qwen3moe") return Arch::Qwen3Moe;
  if (name == "qwen35moe") return Arch::Qwen35Moe;
  std::string list;
  for (const auto& n : supported_architectures()) list += (list.empty() ? "" : ", ") + n;
  fail("unsupported architecture '", name, "' (supported: ", list, ")");
}

const char* arch_name(Arch arch) {
  switch (arch) {
    case Arch::Qwen3Moe: return "qwen3moe";
    case Arch::Qwen35Moe: return "qwen35moe";
  }
  return "?";
}

int ModelConfig::n_full_attention_layers() const {
  int n = 0;
  for (LayerKind k : layer_kinds) n += k == LayerKind::FullAttention;
  return n;
}

int ModelConfig::n_deltanet_layers() const { return n_layer - n_full_attention_layers(); }

namespace {

// Reads `{arch}.key` as a positive int that fits, naming the file and key otherwise.
int positive(const GgufFile& f, const std::string& key) {
  const uint64_t v = f.get_u64(key);
  if (v == 0 || v > (1u << 30)) fail(f.path(), ": key ", key, " = ", v, " is out of range");
  return static_cast<int>(v);
}

int positive_or(const GgufFile& f, const std::string& key, int def) {
  return f.has(key) ? positive(f, key) : def;
}

void require(bool ok, const GgufFile& f, const std::string& what) {
  if (!ok) fail(f.path(), ": inconsistent hyper-parameters: ", what);
}

// Reads an array of bool or integer flags.
std::vector<bool> recurrent_flags(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  const auto* arr = std::get_if<std::shared_ptr<GgufArray>>(&v->v);
  if (v->type != GgufType::ARRAY || !arr || !*arr) fail(f.path(), ": key ", key, " must be an array of bool or integers");
  if ((*arr)->elem_type != GgufType::BOOL) {
    std::vector<bool> out;
    for (int64_t x : f.get_int_array(key)) out.push_back(x != 0);
    return out;
  }
  std::vector<bool> out;
  for (const GgufValue& item : (*arr)->items) out.push_back(std::get<bool>(item.v));
  return out;
}

}  // namespace

ModelConfig load_model_config(const GgufFile& f) {
  ModelConfig c;
  c.arch_name = f.get_string("general.architecture");
  c.arch = arch_from_name(c.arch_name);
  const std::string p = c.arch_name + ".";

  // Files with multi-token-prediction layers append them after the trunk; they are not run here.
  const int n_block = positive(f, p + "block_count");
  const int n_nextn = static_cast<int>(f.get_u32_or(p + "nextn_predict_layers", 0));
  require(n_nextn < n_block, f, "nextn_predict_layers >= block_count");
  c.n_layer = n_block - n_nextn;
  c.n_embd = positive(f, p + "embedding_length");
  // The vocabulary size is the row count of the embedding table, whatever the tokenizer keys say.
  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (!embd) fail(f.path(), ": missing tensor 'token_embd.weight' (required by architecture ", c.arch_name, ")");
  c.n_vocab = embd->ne[1];
  c.n_ctx_train = positive_or(f, p + "context_length", 4096);
  c.rms_eps = f.get_f32(p + "attention.layer_norm_rms_epsilon");
  require(c.rms_eps > 0.0f && c.rms_eps < 1.0f, f, "attention.layer_norm_rms_epsilon must be in (0, 1)");

  c.n_head = positive(f, p + "attention.head_count");
  c.n_head_kv = positive_or(f, p + "attention.head_count_kv", c.n_head);
  c.head_dim = positive_or(f, p + "attention.key_length", c.n_embd / c.n_head);
  c.head_dim_v = positive_or(f, p + "attention.value_length", c.head_dim);
  c.rope_dims = positive_or(f, p + "rope.dimension_count", c.head_dim);
  c.rope_freq_base = f.get_f32_or(p + "rope.freq_base", 10000.0f);
  require(c.n_head % c.n_head_kv == 0, f, cat("head_count ", c.n_head, " is not a multiple of head_count_kv ", c.n_head_kv));
  require(c.rope_dims <= c.head_dim && c.rope_dims % 2 == 0, f,
          cat("rope.dimension_count ", c.rope_dims, " must be even and <= key_length ", c.head_dim));
  require(c.head_dim_v == c.head_dim, f, "attention.value_length must equal attention.key_length");

  c.n_expert = positive(f, p + "expert_count");
  c.n_expert_used = positive(f, p + "expert_used_count");
  c.n_ff_exp = positive(f, p + "expert_feed_forward_length");
  require(c.n_expert_used <= c.n_expert, f, "expert_used_count > expert_count");

  c.layer_kinds.assign(static_cast<size_t>(c.n_layer), LayerKind::FullAttention);
  if (c.arch == Arch::Qwen3Moe) {
    c.norm_topk = f.get_bool_or(p + "expert_weights_norm", true);
  } else {
    // Qwen3.5 MoE: the router always renormalises its top-k weights (HF Qwen3_5MoeTopKRouter).
    c.norm_topk = true;
    c.attn_output_gate = true;
    c.n_ff_shexp = positive(f, p + "expert_shared_feed_forward_length");
    c.ssm_conv_kernel = positive(f, p + "ssm.conv_kernel");
    c.ssm_head_k = positive(f, p + "ssm.state_size");
    c.ssm_k_heads = positive(f, p + "ssm.group_count");
    c.ssm_v_heads = positive(f, p + "ssm.time_step_rank");
    const int inner = positive(f, p + "ssm.inner_size");
    require(inner % c.ssm_v_heads == 0, f, "ssm.inner_size is not a multiple of ssm.time_step_rank");
    c.ssm_head_v = inner / c.ssm_v_heads;
    require(c.ssm_v_heads % c.ssm_k_heads == 0, f, "ssm.time_step_rank is not a multiple of ssm.group_count");
    if (f.has(p + "attention.recurrent_layers")) {
      // Explicit per-layer flags (non-zero = recurrent / DeltaNet) take precedence over the interval.
      const std::vector<bool> flags = recurrent_flags(f, p + "attention.recurrent_layers");
      require(static_cast<int>(flags.size()) >= c.n_layer, f, "attention.recurrent_layers has fewer entries than layers");
      for (int i = 0; i < c.n_layer; ++i) c.layer_kinds[i] = flags[i] ? LayerKind::DeltaNet : LayerKind::FullAttention;
    } else {
      const int interval = positive_or(f, p + "full_attention_interval", 4);
      for (int i = 0; i < c.n_layer; ++i)
        c.layer_kinds[i] = (i + 1) % interval == 0 ? LayerKind::FullAttention : LayerKind::DeltaNet;
    }
  }
  return c;
}

}  // namespace strata
