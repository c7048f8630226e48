// Model hyper-parameters read from a GGUF file's metadata, validated, as plain data that both the
// CPU and a CUDA backend read. Key names as llama.cpp's GGUF writer spells them, so each engine
// loads the other's files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/cpu/ops.h"  // RopeYarn

namespace strata {

class GgufFile;

enum class Arch { Qwen3Moe, Qwen35Moe, Laguna };

// Architecture names strata can run, as `general.architecture` spells them.
const std::vector<std::string>& supported_architectures();
// Parses an architecture name; throws "unsupported architecture 'X' (supported: qwen3moe, qwen35moe, laguna)".
Arch arch_from_name(const std::string& name);
const char* arch_name(Arch arch);

// The layer program: what each layer runs. Every layer is
//   x += mixer(rmsnorm(x, attn_norm));  x += ffn(rmsnorm(x, ffn_norm))
// The architecture files (arch_<name>.cpp) set it; the backends execute it.
// SlidingAttention is softmax attention restricted to the layer's last `window` positions (the token
// itself included); its KV cache has the full-attention layout.
enum class LayerKind { FullAttention, DeltaNet, SlidingAttention };  // the mixer
enum class FfnKind { Moe, Dense };                                   // the feed-forward
const char* layer_kind_name(LayerKind k);
const char* ffn_kind_name(FfnKind k);
inline bool is_attention(LayerKind k) { return k == LayerKind::FullAttention || k == LayerKind::SlidingAttention; }

struct LayerSpec {
  LayerKind mixer = LayerKind::FullAttention;
  FfnKind ffn = FfnKind::Moe;
  // Attention layers' own shape; 0 (unset by the architecture file) takes the model-wide value
  // (ModelConfig::n_head, n_head_kv, rope_dims, rope_freq_base) when the config is loaded.
  int n_head = 0;
  int n_head_kv = 0;
  int rope_dims = 0;
  float rope_freq_base = 0.0f;
  int window = 0;  // SlidingAttention: positions attended, the token itself included
  RopeYarn yarn{};  // rotary scaling of this layer (none by default)
};

// How the attention output is gated before attn_output, beyond qwen35moe's query-interleaved sigmoid
// gate (ModelConfig::attn_output_gate): a separate projection attn_gate of the layer's normed input,
// through softplus, one value per head (broadcast over head_dim) or one per output element.
enum class AttnGate { None, SoftplusPerHead, SoftplusPerElement };

// How router logits become expert weights. Softmax: softmax, top-k of the probabilities. Sigmoid:
// sigmoid of the (optionally soft-capped) logits; the top-k is chosen on sigmoid + the per-expert
// selection bias (exp_probs_b) when present, the weights are the sigmoids without the bias.
enum class RouterKind { Softmax, Sigmoid };

struct ModelConfig {
  Arch arch = Arch::Qwen3Moe;
  std::string arch_name;  // "qwen3moe", ...
  int n_layer = 0;
  int n_embd = 0;
  int64_t n_vocab = 0;  // rows of token_embd
  int n_ctx_train = 0;
  float rms_eps = 1e-6f;

  // Full attention.
  int n_head = 0;     // model-wide values; per layer: LayerSpec (uniform unless the file gives arrays)
  int n_head_kv = 0;
  int head_dim = 0;       // key/query length per head
  int head_dim_v = 0;     // value length per head
  int rope_dims = 0;      // rotary dims at the start of each head (partial rotary when < head_dim)
  float rope_freq_base = 10000.0f;
  bool attn_output_gate = false;  // qwen35moe: attn_q yields query and a sigmoid output gate per head
  AttnGate attn_gate = AttnGate::None;

  // Gated DeltaNet (qwen35moe).
  int ssm_conv_kernel = 0;
  int ssm_k_heads = 0;   // ssm.group_count
  int ssm_v_heads = 0;   // ssm.time_step_rank
  int ssm_head_k = 0;    // ssm.state_size
  int ssm_head_v = 0;    // ssm.inner_size / ssm_v_heads
  int ssm_conv_channels() const { return 2 * ssm_k_heads * ssm_head_k + ssm_v_heads * ssm_head_v; }

  // Mixture of experts.
  int n_expert = 0;
  int n_expert_used = 0;
  int n_ff_exp = 0;
  int n_ff_shexp = 0;      // 0: no shared expert
  bool shared_expert_gated = true;  // the shared expert's output times sigmoid(ffn_gate_inp_shexp . x)
  bool norm_topk = true;   // renormalise the chosen experts' weights to sum 1
  RouterKind router = RouterKind::Softmax;
  float router_softcap = 0.0f;      // > 0: logits -> softcap * tanh(logits / softcap) before the sigmoid
  float expert_weights_scale = 1.0f;  // the routed experts' sum is multiplied by it
  bool expert_selection_bias = false; // exp_probs_b.bias per MoE layer (Sigmoid router)

  // Dense feed-forward layers (FfnKind::Dense): a SwiGLU of this width.
  int n_ff = 0;

  std::vector<LayerSpec> layers;  // the layer program, one entry per layer

  // Multi-token prediction (nextn_predict_layers): blocks after the trunk, blk.n_layer .. n_layer +
  // n_mtp - 1, each [rmsnorm(embedding of the next token); rmsnorm(hidden)] projected to n_embd, then
  // one full-attention + MoE layer of spec mtp_layer and its own final norm; logits through the
  // model's output matrix. Not part of the layer program: only the MTP drafter runs them.
  int n_mtp = 0;
  LayerSpec mtp_layer;
  LayerKind mixer(int il) const { return layers[static_cast<size_t>(il)].mixer; }
  const LayerSpec& layer(int il) const { return layers[static_cast<size_t>(il)]; }

  int n_full_attention_layers() const;
  // The layers with routed experts (FfnKind::Moe), in model order: what routing traces record, their
  // layer j being model layer routed_layers()[j].
  std::vector<int> routed_layers() const;
  // [layer] -> its index in routed_layers() (a trace's layer), -1 for a layer that routes nothing.
  std::vector<int> routed_index() const;
  // The most query heads of any attention layer (layers may have their own, LayerSpec::n_head).
  int max_attention_heads() const;
  int n_attention_layers() const;  // full and sliding: the layers with a KV cache
  int n_deltanet_layers() const;
};

// Reads and validates every hyper-parameter; errors name the file and the key.
ModelConfig load_model_config(const GgufFile& file);

}  // namespace strata
