#include "strata/convert/tensor_plan.h"

#include <cmath>
#include <cstring>
#include <sstream>
#include <utility>

#include "strata/base/error.h"
#include "strata/convert/head_order.h"

namespace strata::convert {

int64_t PlannedTensor::n_rows() const {
  int64_t n = 1;
  for (size_t d = 1; d < ne.size(); ++d) n *= ne[d];
  return n;
}

void PlannedTensor::read_row(int64_t row, float* dst, std::vector<float>& scratch) const {
  const RowRef ref = row_source(row);
  const int64_t len = ref.src->row_length();
  if (col_perm.empty()) {
    ref.src->read_f32(ref.row * len, len, dst);
  } else {
    scratch.resize(static_cast<size_t>(len));
    ref.src->read_f32(ref.row * len, len, scratch.data());
    for (int64_t c = 0; c < ne[0]; ++c) dst[c] = scratch[static_cast<size_t>(col_perm[c])];
  }
  switch (op) {
    case ValueOp::None: break;
    case ValueOp::PlusOne:
      for (int64_t c = 0; c < ne[0]; ++c) dst[c] += 1.0f;
      break;
    case ValueOp::NegExp:
      for (int64_t c = 0; c < ne[0]; ++c) dst[c] = -std::exp(dst[c]);
      break;
  }
}

namespace {

std::string dims_string(const std::vector<int64_t>& d) {
  std::ostringstream s;
  s << "(";
  for (size_t i = 0; i < d.size(); ++i) s << (i ? ", " : "") << d[i];
  s << ")";
  return s.str();
}

// What marks `t` as part of a quantized checkpoint ("" when nothing does): fp8 storage, or a tensor
// that packed-integer and fp8 formats keep beside or instead of a float weight.
std::string quantized_sign(const StTensor& t) {
  if (t.dtype == StDtype::F8_E4M3 || t.dtype == StDtype::F8_E5M2) return cat("dtype ", st_dtype_name(t.dtype));
  static const std::pair<const char*, const char*> kCompanions[] = {
      {".qweight", "GPTQ/AWQ"},
      {".qzeros", "GPTQ/AWQ"},
      {".scales", "GPTQ/AWQ/MLX"},
      {".biases", "MLX"},
      {".g_idx", "GPTQ"},
      {".weight_scale", "fp8"},
      {".weight_scale_inv", "fp8"},
      {".input_scale", "fp8"},
      {".weight_packed", "compressed-tensors"},
      {".weight_zero_point", "compressed-tensors"},
      {".weight_global_scale", "compressed-tensors"},
      {".absmax", "bitsandbytes"},
      {".nested_absmax", "bitsandbytes"},
      {".quant_map", "bitsandbytes"},
      {".SCB", "bitsandbytes"},
  };
  const std::string& n = t.name;
  for (const auto& [suffix, format] : kCompanions) {
    const size_t len = std::strlen(suffix);
    if (n.size() > len && n.compare(n.size() - len, len, suffix) == 0) return cat(format, "-style '", suffix + 1, "'");
  }
  if (n.find(".quant_state.") != std::string::npos) return "bitsandbytes-style 'quant_state'";
  return "";
}

// Refuses a checkpoint whose tensors are quantized (a config without quantization_config can still
// hold them), naming one such tensor.
void refuse_quantized_tensors(const HfCheckpoint& ck) {
  size_t count = 0;
  std::string first, sign;
  for (const auto& name : ck.names()) {
    const std::string s = quantized_sign(ck.get(name));
    if (s.empty()) continue;
    if (count++ == 0) {
      first = name;
      sign = s;
    }
  }
  if (count > 0)
    fail(ck.dir(), ": the checkpoint holds quantized weights (", count, " tensor(s), e.g. '", first, "': ", sign, "); ",
         kNeedUnquantized);
}

// Builds the plan for one checkpoint; `ck` lookups also mark tensors used.
class Planner {
 public:
  Planner(const HfConfig& cfg, const HfCheckpoint& ck) : cfg_(cfg), ck_(ck) {
    // Multimodal Qwen3.5 checkpoints keep the language model under model.language_model.
    prefix_ = ck.has("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
  }

  ConversionPlan run();

 private:
  // Fetches an HF tensor, checks its HF shape, marks it used.
  const StTensor& take(const std::string& name, const std::vector<int64_t>& hf_shape) {
    const StTensor* t = ck_.find(name);
    if (t == nullptr && name.rfind("mtp.", 0) == 0)
      fail(ck_.dir(), ": tensor '", name, "' of the MTP head is missing while other mtp.* tensors are present ",
           "(config.json declares mtp_num_hidden_layers = ", cfg_.n_mtp, "); a partial MTP head is refused ",
           "(a checkpoint with no mtp.* tensors converts without MTP)");
    if (t == nullptr) fail(ck_.dir(), ": tensor '", name, "' is missing (needed for ", gguf_arch_name(cfg_.arch), ")");
    if (t->shape != hf_shape)
      fail(t->file, ": tensor '", name, "' has shape ", t->shape_string(), ", expected ", dims_string(hf_shape),
           " from config.json");
    ck_.mark_used(name);
    return *t;
  }

  // A tensor whose GGUF rows are the HF rows in order.
  PlannedTensor& direct(const std::string& gguf, const std::string& hf, std::vector<int64_t> hf_shape,
                        std::vector<int64_t> ne, TensorRole role, int layer, ValueOp op = ValueOp::None) {
    const StTensor* t = &take(hf, hf_shape);
    PlannedTensor p;
    p.name = gguf;
    p.ne = std::move(ne);
    p.role = role;
    p.layer = layer;
    p.op = op;
    p.row_source = [t](int64_t r) { return RowRef{t, r}; };
    plan_.tensors.push_back(std::move(p));
    return plan_.tensors.back();
  }

  std::string blk(int il, const char* what) const { return cat("blk.", il, ".", what); }
  // Layers from n_layer on are the MTP layers, kept at the top level by HF (mtp.layers.J).
  std::string hf(int il, const char* what) const {
    if (il >= cfg_.n_layer) return cat("mtp.layers.", il - cfg_.n_layer, ".", what);
    return cat(prefix_, "layers.", il, ".", what);
  }

  void add_globals();
  void add_full_attention(int il, bool gated_q, ValueOp qk_norm_op, int64_t n_head);
  void add_laguna_layer(int il);
  void add_deltanet(int il);
  void add_experts(int il);
  void add_shared_expert(int il, bool gated, const char* hf_name);
  void add_qwen35_layer(int il, bool full);
  void add_mtp(int il);
  void check_leftovers();

  const HfConfig& cfg_;
  const HfCheckpoint& ck_;
  std::string prefix_;
  ConversionPlan plan_;
};

void Planner::add_globals() {
  const int64_t E = cfg_.n_embd, V = cfg_.n_vocab;
  const ValueOp norm_op = cfg_.arch == HfArch::Qwen35Moe ? ValueOp::PlusOne : ValueOp::None;
  direct("token_embd.weight", prefix_ + "embed_tokens.weight", {V, E}, {E, V}, TensorRole::TokenEmbd, -1);
  direct("output_norm.weight", prefix_ + "norm.weight", {E}, {E}, TensorRole::Norm, -1, norm_op);
  if (ck_.has("lm_head.weight") && !cfg_.tie_embeddings) {
    direct("output.weight", "lm_head.weight", {V, E}, {E, V}, TensorRole::Output, -1);
  } else if (ck_.has("lm_head.weight")) {
    ck_.mark_used("lm_head.weight");
    plan_.ignored.push_back("lm_head.weight: tie_word_embeddings is true, the engine uses token_embd");
  } else if (!cfg_.tie_embeddings) {
    fail(ck_.dir(), ": tensor 'lm_head.weight' is missing and tie_word_embeddings is false");
  }
}

void Planner::add_full_attention(int il, bool gated_q, ValueOp qk_norm_op, int64_t H) {
  const int64_t E = cfg_.n_embd, D = cfg_.head_dim, Hkv = cfg_.n_head_kv;
  // Qwen3.5 q_proj yields per head [query(D), gate(D)]: HF's own layout, kept as is.
  const int64_t q_rows = (gated_q ? 2 : 1) * H * D;
  direct(blk(il, "attn_q.weight"), hf(il, "self_attn.q_proj.weight"), {q_rows, E}, {E, q_rows}, TensorRole::AttnQ, il);
  direct(blk(il, "attn_k.weight"), hf(il, "self_attn.k_proj.weight"), {Hkv * D, E}, {E, Hkv * D}, TensorRole::AttnK, il);
  direct(blk(il, "attn_v.weight"), hf(il, "self_attn.v_proj.weight"), {Hkv * D, E}, {E, Hkv * D}, TensorRole::AttnV, il);
  direct(blk(il, "attn_output.weight"), hf(il, "self_attn.o_proj.weight"), {E, H * D}, {H * D, E}, TensorRole::AttnOut, il);
  direct(blk(il, "attn_q_norm.weight"), hf(il, "self_attn.q_norm.weight"), {D}, {D}, TensorRole::Norm, il, qk_norm_op);
  direct(blk(il, "attn_k_norm.weight"), hf(il, "self_attn.k_norm.weight"), {D}, {D}, TensorRole::Norm, il, qk_norm_op);
}

void Planner::add_deltanet(int il) {
  const int64_t E = cfg_.n_embd, Hk = cfg_.lin_k_heads, Hv = cfg_.lin_v_heads, dk = cfg_.lin_k_dim,
                dv = cfg_.lin_v_dim, K = cfg_.conv_kernel;
  const int64_t key_dim = Hk * dk, value_dim = Hv * dv, conv_dim = 2 * key_dim + value_dim;

  // Row r of a tensor whose rows are [q|k (untouched) | v heads]: source row after the head reorder.
  auto v_part_row = [=](int64_t r, int64_t untouched, int64_t head_len) {
    if (r < untouched) return r;
    return untouched + hf_index_for_gguf_index(r - untouched, head_len, Hk, Hv);
  };

  {
    PlannedTensor& p = direct(blk(il, "attn_qkv.weight"), hf(il, "linear_attn.in_proj_qkv.weight"), {conv_dim, E},
                              {E, conv_dim}, TensorRole::AttnQkv, il);
    const StTensor* t = p.row_source(0).src;
    p.row_source = [=](int64_t r) { return RowRef{t, v_part_row(r, 2 * key_dim, dv)}; };
  }
  {
    PlannedTensor& p = direct(blk(il, "attn_gate.weight"), hf(il, "linear_attn.in_proj_z.weight"), {value_dim, E},
                              {E, value_dim}, TensorRole::AttnGate, il);
    const StTensor* t = p.row_source(0).src;
    p.row_source = [=](int64_t r) { return RowRef{t, v_part_row(r, 0, dv)}; };
  }
  for (const auto& [gguf, hfname, role] :
       {std::tuple{"ssm_beta.weight", "linear_attn.in_proj_b.weight", TensorRole::SsmBeta},
        std::tuple{"ssm_alpha.weight", "linear_attn.in_proj_a.weight", TensorRole::SsmAlpha}}) {
    PlannedTensor& p = direct(blk(il, gguf), hf(il, hfname), {Hv, E}, {E, Hv}, role, il);
    const StTensor* t = p.row_source(0).src;
    p.row_source = [=](int64_t r) { return RowRef{t, v_part_row(r, 0, 1)}; };
  }
  {
    // HF conv1d weight (channels, 1, kernel) is stored squeezed as ne [kernel, channels].
    PlannedTensor& p = direct(blk(il, "ssm_conv1d.weight"), hf(il, "linear_attn.conv1d.weight"), {conv_dim, 1, K},
                              {K, conv_dim}, TensorRole::SsmConv, il);
    const StTensor* t = p.row_source(0).src;
    p.row_source = [=](int64_t r) { return RowRef{t, v_part_row(r, 2 * key_dim, dv)}; };
  }
  // One-row tensors: the head reorder permutes columns.
  std::vector<int64_t> head_perm(static_cast<size_t>(Hv));
  for (int64_t p = 0; p < Hv; ++p) head_perm[p] = hf_head_for_gguf_position(p, Hk, Hv);
  direct(blk(il, "ssm_dt.bias"), hf(il, "linear_attn.dt_bias"), {Hv}, {Hv}, TensorRole::SsmDt, il).col_perm = head_perm;
  direct(blk(il, "ssm_a"), hf(il, "linear_attn.A_log"), {Hv}, {Hv}, TensorRole::SsmA, il, ValueOp::NegExp).col_perm =
      head_perm;
  // The gated output norm is a plain multiplier in HF already (not zero-centred): no +1.
  direct(blk(il, "ssm_norm.weight"), hf(il, "linear_attn.norm.weight"), {dv}, {dv}, TensorRole::Norm, il);
  {
    PlannedTensor& p = direct(blk(il, "ssm_out.weight"), hf(il, "linear_attn.out_proj.weight"), {E, value_dim},
                              {value_dim, E}, TensorRole::SsmOut, il);
    p.col_perm.resize(static_cast<size_t>(value_dim));
    for (int64_t c = 0; c < value_dim; ++c) p.col_perm[c] = hf_index_for_gguf_index(c, dv, Hk, Hv);
  }
}

void Planner::add_experts(int il) {
  const int64_t E = cfg_.n_embd, X = cfg_.n_expert, F = cfg_.n_ff_exp;
  direct(blk(il, "ffn_gate_inp.weight"), hf(il, "mlp.gate.weight"), {X, E}, {E, X}, TensorRole::Router, il);

  auto add = [&](const char* gguf, std::vector<int64_t> ne, TensorRole role, std::function<RowRef(int64_t)> src) {
    PlannedTensor p;
    p.name = blk(il, gguf);
    p.ne = std::move(ne);
    p.role = role;
    p.layer = il;
    p.row_source = std::move(src);
    plan_.tensors.push_back(std::move(p));
  };

  // Fused (transformers 5 layout): gate_up_proj (X, 2F, E) with gate rows first, down_proj (X, E, F).
  std::string fused_gu = hf(il, "mlp.experts.gate_up_proj");
  std::string fused_d = hf(il, "mlp.experts.down_proj");
  if (!ck_.has(fused_gu) && ck_.has(fused_gu + ".weight")) {
    fused_gu += ".weight";
    fused_d += ".weight";
  }
  if (ck_.has(fused_gu)) {
    const StTensor* gu = &take(fused_gu, {X, 2 * F, E});
    const StTensor* dn = &take(fused_d, {X, E, F});
    add("ffn_gate_exps.weight", {E, F, X}, TensorRole::ExpertsGate,
        [=](int64_t r) { return RowRef{gu, (r / F) * 2 * F + r % F}; });
    add("ffn_up_exps.weight", {E, F, X}, TensorRole::ExpertsUp,
        [=](int64_t r) { return RowRef{gu, (r / F) * 2 * F + F + r % F}; });
    add("ffn_down_exps.weight", {F, E, X}, TensorRole::ExpertsDown, [=](int64_t r) { return RowRef{dn, r}; });
    return;
  }
  // Per expert: experts.{e}.{gate,up,down}_proj.weight, stacked with expert e at ne[2] index e.
  std::vector<const StTensor*> gate(X), up(X), down(X);
  for (int64_t e = 0; e < X; ++e) {
    gate[e] = &take(hf(il, cat("mlp.experts.", e, ".gate_proj.weight").c_str()), {F, E});
    up[e] = &take(hf(il, cat("mlp.experts.", e, ".up_proj.weight").c_str()), {F, E});
    down[e] = &take(hf(il, cat("mlp.experts.", e, ".down_proj.weight").c_str()), {E, F});
  }
  add("ffn_gate_exps.weight", {E, F, X}, TensorRole::ExpertsGate, [=](int64_t r) { return RowRef{gate[r / F], r % F}; });
  add("ffn_up_exps.weight", {E, F, X}, TensorRole::ExpertsUp, [=](int64_t r) { return RowRef{up[r / F], r % F}; });
  add("ffn_down_exps.weight", {F, E, X}, TensorRole::ExpertsDown, [=](int64_t r) { return RowRef{down[r / E], r % E}; });
}

void Planner::add_shared_expert(int il, bool gated, const char* hf_name) {
  const int64_t E = cfg_.n_embd, S = cfg_.n_ff_shexp;
  // HF Linear(E, 1): shape (1, E); written 1-D [E] as the llama.cpp loader declares it.
  if (gated)
    direct(blk(il, "ffn_gate_inp_shexp.weight"), hf(il, "mlp.shared_expert_gate.weight"), {1, E}, {E},
           TensorRole::SharedExpertGate, il);
  const std::string m = cat("mlp.", hf_name, ".");
  direct(blk(il, "ffn_gate_shexp.weight"), hf(il, (m + "gate_proj.weight").c_str()), {S, E}, {E, S},
         TensorRole::SharedGate, il);
  direct(blk(il, "ffn_up_shexp.weight"), hf(il, (m + "up_proj.weight").c_str()), {S, E}, {E, S}, TensorRole::SharedUp,
         il);
  direct(blk(il, "ffn_down_shexp.weight"), hf(il, (m + "down_proj.weight").c_str()), {E, S}, {S, E},
         TensorRole::SharedDown, il);
}

// A laguna layer (HF LagunaDecoderLayer): attention with its own head count and the softplus gate
// projection g_proj, then a dense MLP (the leading layers) or the MoE with its selection bias and an
// ungated shared expert. RMSNorm weights are plain multipliers (no zero-centring).
void Planner::add_laguna_layer(int il) {
  const int64_t E = cfg_.n_embd, H = cfg_.heads_per_layer.at(static_cast<size_t>(il)), D = cfg_.head_dim;
  direct(blk(il, "attn_norm.weight"), hf(il, "input_layernorm.weight"), {E}, {E}, TensorRole::Norm, il);
  add_full_attention(il, /*gated_q=*/false, ValueOp::None, H);
  const int64_t G = cfg_.gate_per_head ? H : H * D;
  direct(blk(il, "attn_gate.weight"), hf(il, "self_attn.g_proj.weight"), {G, E}, {E, G}, TensorRole::AttnOutGate, il);
  direct(blk(il, "ffn_norm.weight"), hf(il, "post_attention_layernorm.weight"), {E}, {E}, TensorRole::Norm, il);
  if (il < cfg_.n_dense_lead) {
    const int64_t F = cfg_.intermediate_size;
    direct(blk(il, "ffn_gate.weight"), hf(il, "mlp.gate_proj.weight"), {F, E}, {E, F}, TensorRole::FfnGate, il);
    direct(blk(il, "ffn_up.weight"), hf(il, "mlp.up_proj.weight"), {F, E}, {E, F}, TensorRole::FfnUp, il);
    direct(blk(il, "ffn_down.weight"), hf(il, "mlp.down_proj.weight"), {E, F}, {F, E}, TensorRole::FfnDown, il);
    return;
  }
  add_experts(il);
  // The selection bias lives on the router in transformers' modules and beside the experts in the
  // released checkpoints; either name is accepted.
  std::string bias = hf(il, "mlp.gate.e_score_correction_bias");
  if (!ck_.has(bias)) bias = hf(il, "mlp.experts.e_score_correction_bias");
  const int64_t X = cfg_.n_expert;
  direct(blk(il, "exp_probs_b.bias"), bias, {X}, {X}, TensorRole::ExpertBias, il);
  // transformers' module is `shared_expert`; `shared_experts` is accepted too.
  add_shared_expert(il, /*gated=*/false,
                    ck_.has(hf(il, "mlp.shared_experts.gate_proj.weight")) ? "shared_experts" : "shared_expert");
}

void Planner::add_qwen35_layer(int il, bool full) {
  direct(blk(il, "attn_norm.weight"), hf(il, "input_layernorm.weight"), {cfg_.n_embd}, {cfg_.n_embd},
         TensorRole::Norm, il, ValueOp::PlusOne);
  if (full) add_full_attention(il, /*gated_q=*/true, ValueOp::PlusOne, cfg_.n_head);
  else add_deltanet(il);
  direct(blk(il, "post_attention_norm.weight"), hf(il, "post_attention_layernorm.weight"), {cfg_.n_embd},
         {cfg_.n_embd}, TensorRole::Norm, il, ValueOp::PlusOne);
  add_experts(il);
  add_shared_expert(il, /*gated=*/true, "shared_expert");
}

// An MTP block (transformers' Qwen3.5 MTP: fc over [pre_fc_norm_embedding(e); pre_fc_norm_hidden(h)],
// one full-attention layer, norm) under llama.cpp's nextn names. Its norms are zero-centred like the
// trunk's; fc's columns keep HF's order (embedding half first).
void Planner::add_mtp(int il) {
  const int64_t E = cfg_.n_embd;
  direct(blk(il, "nextn.eh_proj.weight"), "mtp.fc.weight", {E, 2 * E}, {2 * E, E}, TensorRole::MtpProj, il);
  direct(blk(il, "nextn.enorm.weight"), "mtp.pre_fc_norm_embedding.weight", {E}, {E}, TensorRole::Norm, il,
         ValueOp::PlusOne);
  direct(blk(il, "nextn.hnorm.weight"), "mtp.pre_fc_norm_hidden.weight", {E}, {E}, TensorRole::Norm, il,
         ValueOp::PlusOne);
  direct(blk(il, "nextn.shared_head_norm.weight"), "mtp.norm.weight", {E}, {E}, TensorRole::Norm, il,
         ValueOp::PlusOne);
  add_qwen35_layer(il, /*full=*/true);
}

void Planner::check_leftovers() {
  std::vector<std::string> left;
  for (const auto& name : ck_.names()) {
    if (ck_.used(name)) continue;
    // Deliberately not converted: the vision tower of the multimodal wrapper and the MTP head.
    if (name.rfind("model.visual.", 0) == 0 || name.rfind("visual.", 0) == 0) {
      ck_.mark_used(name);
      plan_.ignored.push_back(name + ": vision tower (text-only conversion)");
      continue;
    }
    if (name.rfind("mtp.", 0) == 0 && cfg_.n_mtp == 0) {
      ck_.mark_used(name);
      plan_.ignored.push_back(name + ": MTP head (config.json has no mtp_num_hidden_layers)");
      continue;
    }
    left.push_back(name);
  }
  if (!left.empty()) {
    std::ostringstream s;
    for (size_t i = 0; i < left.size() && i < 10; ++i) s << (i ? ", " : "") << left[i];
    if (left.size() > 10) s << ", ... (" << left.size() << " in all)";
    fail(ck_.dir(), ": ", left.size(), " checkpoint tensor(s) are not used by the ", gguf_arch_name(cfg_.arch),
         " mapping (refusing to drop weights silently): ", s.str());
  }
}

ConversionPlan Planner::run() {
  refuse_quantized_tensors(ck_);
  add_globals();
  for (int il = 0; il < cfg_.n_layer; ++il) {
    if (cfg_.arch == HfArch::Laguna) {
      add_laguna_layer(il);
    } else if (cfg_.arch == HfArch::Qwen3Moe) {
      direct(blk(il, "attn_norm.weight"), hf(il, "input_layernorm.weight"), {cfg_.n_embd}, {cfg_.n_embd},
             TensorRole::Norm, il);
      add_full_attention(il, /*gated_q=*/false, ValueOp::None, cfg_.n_head);
      direct(blk(il, "ffn_norm.weight"), hf(il, "post_attention_layernorm.weight"), {cfg_.n_embd}, {cfg_.n_embd},
             TensorRole::Norm, il);
      add_experts(il);
    } else {
      add_qwen35_layer(il, cfg_.is_full_attention[il]);
    }
  }
  for (int j = 0; j < cfg_.n_mtp; ++j) add_mtp(cfg_.n_layer + j);
  check_leftovers();
  return std::move(plan_);
}

}  // namespace

ConversionPlan plan_conversion(const HfConfig& cfg, const HfCheckpoint& ck) { return Planner(cfg, ck).run(); }

}  // namespace strata::convert
