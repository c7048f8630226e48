#include "strata/model/config.h"

#include "strata/base/error.h"
#include "strata/gguf/gguf.h"
#include "strata/model/arch.h"

namespace strata {

const std::vector<const ArchDescription*>& architectures() {
  static const std::vector<const ArchDescription*> all = {&kQwen3Moe, &kQwen35Moe};
  return all;
}

const ArchDescription& arch_description(Arch arch) {
  for (const ArchDescription* a : architectures())
    if (a->arch == arch) return *a;
  fail("architecture ", static_cast<int>(arch), " has no description");
}

const std::vector<std::string>& supported_architectures() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const ArchDescription* a : architectures()) v.emplace_back(a->name);
    return v;
  }();
  return names;
}

Arch arch_from_name(const std::string& name) {
  for (const ArchDescription* a : architectures())
    if (name == a->name) return a->arch;
  std::string list;
  for (const auto& n : supported_architectures()) list += (list.empty() ? "" : ", ") + n;
  fail("unsupported architecture '", name, "' (supported: ", list, ")");
}

const char* arch_name(Arch arch) { return arch_description(arch).name; }

int ModelConfig::n_full_attention_layers() const {
  int n = 0;
  for (const LayerSpec& l : layers) n += l.mixer == LayerKind::FullAttention;
  return n;
}

int ModelConfig::n_deltanet_layers() const { return n_layer - n_full_attention_layers(); }

int gguf_positive(const GgufFile& f, const std::string& key) {
  const uint64_t v = f.get_u64(key);
  if (v == 0 || v > (1u << 30)) fail(f.path(), ": key ", key, " = ", v, " is out of range");
  return static_cast<int>(v);
}

int gguf_positive_or(const GgufFile& f, const std::string& key, int def) {
  return f.has(key) ? gguf_positive(f, key) : def;
}

void require_config(bool ok, const GgufFile& f, const std::string& what) {
  if (!ok) fail(f.path(), ": inconsistent hyper-parameters: ", what);
}

ModelConfig load_model_config(const GgufFile& f) {
  ModelConfig c;
  c.arch_name = f.get_string("general.architecture");
  c.arch = arch_from_name(c.arch_name);
  const ArchDescription& desc = arch_description(c.arch);
  const std::string p = c.arch_name + ".";

  // Files with multi-token-prediction layers append them after the trunk; they are not run here.
  const int n_block = gguf_positive(f, p + "block_count");
  const int n_nextn = static_cast<int>(f.get_u32_or(p + "nextn_predict_layers", 0));
  require_config(n_nextn < n_block, f, "nextn_predict_layers >= block_count");
  c.n_layer = n_block - n_nextn;
  c.n_embd = gguf_positive(f, p + "embedding_length");
  // The vocabulary size is the row count of the embedding table, whatever the tokenizer keys say.
  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (!embd) fail(f.path(), ": missing tensor 'token_embd.weight' (required by architecture ", c.arch_name, ")");
  c.n_vocab = embd->ne[1];
  c.n_ctx_train = gguf_positive_or(f, p + "context_length", 4096);
  c.rms_eps = f.get_f32(p + "attention.layer_norm_rms_epsilon");
  require_config(c.rms_eps > 0.0f && c.rms_eps < 1.0f, f, "attention.layer_norm_rms_epsilon must be in (0, 1)");

  c.n_head = gguf_positive(f, p + "attention.head_count");
  c.n_head_kv = gguf_positive_or(f, p + "attention.head_count_kv", c.n_head);
  c.head_dim = gguf_positive_or(f, p + "attention.key_length", c.n_embd / c.n_head);
  c.head_dim_v = gguf_positive_or(f, p + "attention.value_length", c.head_dim);
  c.rope_dims = gguf_positive_or(f, p + "rope.dimension_count", c.head_dim);
  c.rope_freq_base = f.get_f32_or(p + "rope.freq_base", 10000.0f);
  require_config(c.n_head % c.n_head_kv == 0, f,
                 cat("head_count ", c.n_head, " is not a multiple of head_count_kv ", c.n_head_kv));
  require_config(c.rope_dims <= c.head_dim && c.rope_dims % 2 == 0, f,
                 cat("rope.dimension_count ", c.rope_dims, " must be even and <= key_length ", c.head_dim));
  require_config(c.head_dim_v == c.head_dim, f, "attention.value_length must equal attention.key_length");

  c.n_expert = gguf_positive(f, p + "expert_count");
  c.n_expert_used = gguf_positive(f, p + "expert_used_count");
  c.n_ff_exp = gguf_positive(f, p + "expert_feed_forward_length");
  require_config(c.n_expert_used <= c.n_expert, f, "expert_used_count > expert_count");

  desc.read_config(f, p, c);
  require_config(static_cast<int>(c.layers.size()) == c.n_layer, f, "the layer program does not cover every layer");
  return c;
}

}  // namespace strata
