#include "strata/model/config.h"

#include <algorithm>

#include "strata/base/error.h"
#include "strata/gguf/gguf.h"
#include "strata/model/arch.h"

namespace strata {

const std::vector<const ArchDescription*>& architectures() {
  static const std::vector<const ArchDescription*> all = {&kQwen3Moe, &kQwen35Moe, &kLaguna};
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

namespace {

int count_layers(const std::vector<LayerSpec>& layers, bool (*pick)(const LayerSpec&)) {
  int n = 0;
  for (const LayerSpec& l : layers) n += pick(l);
  return n;
}

}  // namespace

const char* layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::FullAttention: return "full attention";
    case LayerKind::DeltaNet: return "gated DeltaNet";
    case LayerKind::SlidingAttention: return "sliding-window attention";
  }
  return "?";
}

const char* ffn_kind_name(FfnKind k) { return k == FfnKind::Moe ? "mixture of experts" : "dense SwiGLU"; }

std::vector<int> ModelConfig::routed_layers() const {
  std::vector<int> r;
  for (int il = 0; il < n_layer; ++il)
    if (layer(il).ffn == FfnKind::Moe) r.push_back(il);
  return r;
}

std::vector<int> ModelConfig::routed_index() const {
  std::vector<int> r(static_cast<size_t>(n_layer), -1);
  int j = 0;
  for (int il : routed_layers()) r[static_cast<size_t>(il)] = j++;
  return r;
}

int ModelConfig::max_attention_heads() const {
  int h = n_head;
  for (const LayerSpec& l : layers)
    if (is_attention(l.mixer)) h = std::max(h, l.n_head);
  return h;
}

int ModelConfig::n_full_attention_layers() const {
  return count_layers(layers, [](const LayerSpec& l) { return l.mixer == LayerKind::FullAttention; });
}

int ModelConfig::n_attention_layers() const {
  return count_layers(layers, [](const LayerSpec& l) { return is_attention(l.mixer); });
}

int ModelConfig::n_deltanet_layers() const {
  return count_layers(layers, [](const LayerSpec& l) { return l.mixer == LayerKind::DeltaNet; });
}

int gguf_positive(const GgufFile& f, const std::string& key) {
  const uint64_t v = f.get_u64(key);
  if (v == 0 || v > (1u << 30)) fail(f.path(), ": key ", key, " = ", v, " is out of range");
  return static_cast<int>(v);
}

int gguf_positive_or(const GgufFile& f, const std::string& key, int def) {
  return f.has(key) ? gguf_positive(f, key) : def;
}

std::vector<int> gguf_per_layer(const GgufFile& f, const std::string& key, int n_layer, int def) {
  const GgufValue* v = f.find(key);
  if (!v) return std::vector<int>(static_cast<size_t>(n_layer), def);
  if (v->type != GgufType::ARRAY) return std::vector<int>(static_cast<size_t>(n_layer), gguf_positive(f, key));
  const std::vector<int64_t> a = f.get_int_array(key);
  if (static_cast<int>(a.size()) < n_layer) fail(f.path(), ": key ", key, " has ", a.size(), " entries for ", n_layer, " layers");
  std::vector<int> out(static_cast<size_t>(n_layer));
  for (int i = 0; i < n_layer; ++i) {
    if (a[static_cast<size_t>(i)] <= 0 || a[static_cast<size_t>(i)] > (1 << 30))
      fail(f.path(), ": key ", key, "[", i, "] = ", a[static_cast<size_t>(i)], " is out of range");
    out[static_cast<size_t>(i)] = static_cast<int>(a[static_cast<size_t>(i)]);
  }
  return out;
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

  // Files with multi-token-prediction layers append them after the trunk (ModelConfig::n_mtp).
  const int n_block = gguf_positive(f, p + "block_count");
  const int n_nextn = static_cast<int>(f.get_u32_or(p + "nextn_predict_layers", 0));
  require_config(n_nextn < n_block, f, "nextn_predict_layers >= block_count");
  c.n_layer = n_block - n_nextn;
  c.n_mtp = n_nextn;
  c.n_embd = gguf_positive(f, p + "embedding_length");
  // The vocabulary size is the row count of the embedding table, whatever the tokenizer keys say.
  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (!embd) fail(f.path(), ": missing tensor 'token_embd.weight' (required by architecture ", c.arch_name, ")");
  c.n_vocab = embd->ne[1];
  c.n_ctx_train = gguf_positive_or(f, p + "context_length", 4096);
  c.rms_eps = f.get_f32(p + "attention.layer_norm_rms_epsilon");
  require_config(c.rms_eps > 0.0f && c.rms_eps < 1.0f, f, "attention.layer_norm_rms_epsilon must be in (0, 1)");

  // Head counts may be per-layer arrays (as llama.cpp allows for every architecture); the model-wide
  // value is then layer 0's and each layer gets its own in the program below.
  if (!f.has(p + "attention.head_count")) gguf_positive(f, p + "attention.head_count");  // fails naming the key
  const std::vector<int> heads = gguf_per_layer(f, p + "attention.head_count", c.n_layer, 0);
  const std::vector<int> heads_kv = gguf_per_layer(f, p + "attention.head_count_kv", c.n_layer, 0);
  c.n_head = heads[0];
  c.n_head_kv = heads_kv[0] > 0 ? heads_kv[0] : c.n_head;
  c.head_dim = gguf_positive_or(f, p + "attention.key_length", c.n_embd / c.n_head);
  c.head_dim_v = gguf_positive_or(f, p + "attention.value_length", c.head_dim);
  c.rope_dims = gguf_positive_or(f, p + "rope.dimension_count", c.head_dim);
  c.rope_freq_base = f.get_f32_or(p + "rope.freq_base", 10000.0f);
  require_config(c.head_dim_v == c.head_dim, f, "attention.value_length must equal attention.key_length");

  c.n_expert = gguf_positive(f, p + "expert_count");
  c.n_expert_used = gguf_positive(f, p + "expert_used_count");
  c.n_ff_exp = gguf_positive(f, p + "expert_feed_forward_length");
  require_config(c.n_expert_used <= c.n_expert, f, "expert_used_count > expert_count");

  desc.read_config(f, p, c);
  require_config(static_cast<int>(c.layers.size()) == c.n_layer, f, "the layer program does not cover every layer");
  // Attention shape per layer: the architecture's own values, else the file's per-layer head counts,
  // else the model-wide values; then every layer is checked.
  for (int il = 0; il < c.n_layer; ++il) {
    LayerSpec& l = c.layers[static_cast<size_t>(il)];
    if (l.n_head == 0) l.n_head = heads[static_cast<size_t>(il)];
    if (l.n_head_kv == 0) l.n_head_kv = heads_kv[static_cast<size_t>(il)] > 0 ? heads_kv[static_cast<size_t>(il)] : l.n_head;
    if (l.rope_dims == 0) l.rope_dims = c.rope_dims;
    if (l.rope_freq_base == 0.0f) l.rope_freq_base = c.rope_freq_base;
    if (!is_attention(l.mixer)) continue;
    const std::string at = cat("layer ", il, ": ");
    require_config(l.n_head > 0 && l.n_head_kv > 0 && l.n_head % l.n_head_kv == 0, f,
                   cat(at, "head_count ", l.n_head, " is not a positive multiple of head_count_kv ", l.n_head_kv));
    require_config(l.rope_dims <= c.head_dim && l.rope_dims % 2 == 0, f,
                   cat(at, "rotary dims ", l.rope_dims, " must be even and <= key_length ", c.head_dim));
    require_config(l.rope_freq_base > 0.0f, f, cat(at, "rope frequency base must be positive"));
    require_config((l.mixer == LayerKind::SlidingAttention) == (l.window > 0), f,
                   cat(at, "a sliding-window layer needs a positive window, other layers none"));
  }
  // The MTP layer is a full-attention MoE layer of the model-wide shape.
  c.mtp_layer = LayerSpec{LayerKind::FullAttention, FfnKind::Moe};
  c.mtp_layer.n_head = c.n_head, c.mtp_layer.n_head_kv = c.n_head_kv;
  c.mtp_layer.rope_dims = c.rope_dims, c.mtp_layer.rope_freq_base = c.rope_freq_base;
  for (int il = 0; il < c.n_layer; ++il)
    require_config(c.layer(il).ffn != FfnKind::Dense || c.n_ff > 0, f,
                   cat("layer ", il, " is dense but feed_forward_length is missing"));
  return c;
}

}  // namespace strata
