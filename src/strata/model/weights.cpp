#include "strata/model/weights.h"

#include <initializer_list>

#include "strata/base/error.h"
#include "strata/gguf/gguf.h"
#include "strata/model/arch.h"
#include "strata/quant/quantize.h"

namespace strata {
namespace {

class Binder {
 public:
  Binder(const GgufFile& f, const ModelConfig& c) : f_(f), c_(c) {}

  bool has(const std::string& name) const { return f_.find_tensor(name) != nullptr; }

  const GgufTensorInfo& need(const std::string& name) const {
    const GgufTensorInfo* t = f_.find_tensor(name);
    if (!t) fail(f_.path(), ": missing tensor '", name, "' (required by architecture ", c_.arch_name, ")");
    return *t;
  }

  // Checks the tensor's shape equals `want` (trailing dims of 1 may be omitted on either side).
  void check_shape(const GgufTensorInfo& t, std::initializer_list<int64_t> want) const {
    int64_t w[4] = {1, 1, 1, 1};
    int i = 0;
    for (int64_t d : want) w[i++] = d;
    for (int d = 0; d < 4; ++d) {
      if (t.ne[d] != w[d]) {
        std::string ws = "[";
        for (int j = 0; j < i; ++j) ws += cat(j ? ", " : "", w[j]);
        fail(f_.path(), ": tensor '", t.name, "' has shape ", t.shape_string(), ", expected ", ws, "]");
      }
    }
  }

  // A [cols x rows] matrix: `rows` rows of `cols` elements.
  WeightMatrix matrix(const std::string& name, int64_t cols, int64_t rows) const {
    const GgufTensorInfo& t = need(name);
    check_shape(t, {cols, rows});
    return view(t, cols, rows);
  }

  ExpertStack experts(const std::string& name, int64_t cols, int64_t rows, int n_expert) const {
    const GgufTensorInfo& t = need(name);
    check_shape(t, {cols, rows, n_expert});
    ExpertStack s;
    s.first = view(t, cols, rows);
    s.expert_stride = s.first.row_stride * static_cast<size_t>(rows);
    s.n_expert = n_expert;
    return s;
  }

  // A vector of n values (stored [n] or [n, 1]), decoded to float32.
  std::vector<float> vec(const std::string& name, int64_t n) const {
    const GgufTensorInfo& t = need(name);
    check_shape(t, {n});
    return decode(t);
  }

  // Any tensor decoded to float32, row by row (its shape checked by the caller).
  std::vector<float> decode(const GgufTensorInfo& t) const {
    std::vector<float> out(static_cast<size_t>(t.n_elements()));
    const size_t stride = t.row_nbytes();
    for (int64_t r = 0; r < t.n_rows(); ++r)
      dequantize_row(t.type, t.data + static_cast<size_t>(r) * stride, out.data() + r * t.ne[0], t.ne[0]);
    return out;
  }

 private:
  WeightMatrix view(const GgufTensorInfo& t, int64_t cols, int64_t rows) const {
    WeightMatrix w;
    w.type = t.type;
    w.data = t.data;
    w.n_cols = cols;
    w.n_rows = rows;
    w.row_stride = row_bytes(t.type, cols);  // throws naming the type when cols is not whole blocks
    return w;
  }

  const GgufFile& f_;
  const ModelConfig& c_;
};

void bind_attention(const Binder& b, const ModelConfig& c, const LayerSpec& l, const std::string& p,
                    AttentionWeights& a) {
  const int q_rows = l.n_head * c.head_dim * (c.attn_output_gate ? 2 : 1);
  a.q = b.matrix(p + "attn_q.weight", c.n_embd, q_rows);
  a.k = b.matrix(p + "attn_k.weight", c.n_embd, l.n_head_kv * c.head_dim);
  a.v = b.matrix(p + "attn_v.weight", c.n_embd, l.n_head_kv * c.head_dim_v);
  a.o = b.matrix(p + "attn_output.weight", l.n_head * c.head_dim_v, c.n_embd);
  if (c.attn_gate != AttnGate::None) {
    const int gate_rows = c.attn_gate == AttnGate::SoftplusPerHead ? l.n_head : l.n_head * c.head_dim;
    a.gate = b.matrix(p + "attn_gate.weight", c.n_embd, gate_rows);
  }
  a.q_norm = b.vec(p + "attn_q_norm.weight", c.head_dim);
  a.k_norm = b.vec(p + "attn_k_norm.weight", c.head_dim);
}

void bind_deltanet(const Binder& b, const ModelConfig& c, const std::string& p, DeltaNetWeights& d) {
  const int64_t channels = c.ssm_conv_channels();
  const int64_t v_dim = static_cast<int64_t>(c.ssm_v_heads) * c.ssm_head_v;
  d.qkv = b.matrix(p + "attn_qkv.weight", c.n_embd, channels);
  d.gate = b.matrix(p + "attn_gate.weight", c.n_embd, v_dim);
  d.beta = b.matrix(p + "ssm_beta.weight", c.n_embd, c.ssm_v_heads);
  d.alpha = b.matrix(p + "ssm_alpha.weight", c.n_embd, c.ssm_v_heads);
  d.out = b.matrix(p + "ssm_out.weight", v_dim, c.n_embd);
  const GgufTensorInfo& conv = b.need(p + "ssm_conv1d.weight");
  b.check_shape(conv, {c.ssm_conv_kernel, channels});
  d.conv = b.decode(conv);
  d.a = b.vec(p + "ssm_a", c.ssm_v_heads);
  d.dt_bias = b.vec(p + "ssm_dt.bias", c.ssm_v_heads);
  d.norm = b.vec(p + "ssm_norm.weight", c.ssm_head_v);
}

void bind_moe(const Binder& b, const ModelConfig& c, const std::string& p, MoeWeights& m) {
  m.router = b.matrix(p + "ffn_gate_inp.weight", c.n_embd, c.n_expert);
  if (!b.has(p + "ffn_gate_exps.weight") && b.has(p + "ffn_gate_up_exps.weight")) {
    // Fused form: each expert holds its n_ff gate rows, then its n_ff up rows.
    const ExpertStack both = b.experts(p + "ffn_gate_up_exps.weight", c.n_embd, 2 * c.n_ff_exp, c.n_expert);
    m.gate = both;
    m.gate.first.n_rows = c.n_ff_exp;
    m.up = m.gate;
    m.up.first.data += static_cast<size_t>(c.n_ff_exp) * both.first.row_stride;
  } else {
    m.gate = b.experts(p + "ffn_gate_exps.weight", c.n_embd, c.n_ff_exp, c.n_expert);
    m.up = b.experts(p + "ffn_up_exps.weight", c.n_embd, c.n_ff_exp, c.n_expert);
  }
  m.down = b.experts(p + "ffn_down_exps.weight", c.n_ff_exp, c.n_embd, c.n_expert);
  if (c.expert_selection_bias) m.selection_bias = b.vec(p + "exp_probs_b.bias", c.n_expert);
  m.has_shared = c.n_ff_shexp > 0;
  m.shared_gated = m.has_shared && c.shared_expert_gated;
  if (m.has_shared) {
    if (m.shared_gated) m.shared_gate_inp = b.matrix(p + "ffn_gate_inp_shexp.weight", c.n_embd, 1);
    m.shared_gate = b.matrix(p + "ffn_gate_shexp.weight", c.n_embd, c.n_ff_shexp);
    m.shared_up = b.matrix(p + "ffn_up_shexp.weight", c.n_embd, c.n_ff_shexp);
    m.shared_down = b.matrix(p + "ffn_down_shexp.weight", c.n_ff_shexp, c.n_embd);
  }
}

void bind_layer(const Binder& b, const ModelConfig& c, const LayerSpec& spec, const std::string& p, LayerWeights& L) {
  L.kind = spec.mixer;
  L.attn_norm = b.vec(p + "attn_norm.weight", c.n_embd);
  L.ffn_norm = b.vec(p + arch_description(c.arch).ffn_norm_tensor, c.n_embd);
  if (is_attention(L.kind)) {
    bind_attention(b, c, spec, p, L.attn);
  } else {
    bind_deltanet(b, c, p, L.deltanet);
  }
  if (spec.ffn == FfnKind::Moe) {
    bind_moe(b, c, p, L.moe);
  } else {
    L.dense.gate = b.matrix(p + "ffn_gate.weight", c.n_embd, c.n_ff);
    L.dense.up = b.matrix(p + "ffn_up.weight", c.n_embd, c.n_ff);
    L.dense.down = b.matrix(p + "ffn_down.weight", c.n_ff, c.n_embd);
  }
}

}  // namespace

ModelWeights bind_model_weights(const GgufFile& f, const ModelConfig& c) {
  Binder b(f, c);
  ModelWeights w;
  const GgufTensorInfo& embd = b.need("token_embd.weight");
  if (embd.ne[0] != c.n_embd || embd.n_dims > 2)
    fail(f.path(), ": tensor 'token_embd.weight' has shape ", embd.shape_string(), ", expected [", c.n_embd, ", n_vocab]");
  w.token_embd = b.matrix("token_embd.weight", c.n_embd, embd.ne[1]);
  if (f.find_tensor("output.weight")) {
    w.output = b.matrix("output.weight", c.n_embd, embd.ne[1]);
  } else {
    w.output = w.token_embd;  // tied embeddings
    w.tied_output = true;
  }
  w.output_norm = b.vec("output_norm.weight", c.n_embd);

  w.layers.resize(static_cast<size_t>(c.n_layer));
  for (int il = 0; il < c.n_layer; ++il) bind_layer(b, c, c.layer(il), cat("blk.", il, "."), w.layers[il]);
  w.mtp.resize(static_cast<size_t>(c.n_mtp));
  for (int j = 0; j < c.n_mtp; ++j) {
    const std::string p = cat("blk.", c.n_layer + j, ".");
    MtpWeights& m = w.mtp[static_cast<size_t>(j)];
    m.eh_proj = b.matrix(p + "nextn.eh_proj.weight", 2 * static_cast<int64_t>(c.n_embd), c.n_embd);
    m.enorm = b.vec(p + "nextn.enorm.weight", c.n_embd);
    m.hnorm = b.vec(p + "nextn.hnorm.weight", c.n_embd);
    m.shared_head_norm = b.vec(p + "nextn.shared_head_norm.weight", c.n_embd);
    const int64_t V = w.token_embd.n_rows;
    m.embed_tokens = b.has(p + "nextn.embed_tokens.weight") ? b.matrix(p + "nextn.embed_tokens.weight", c.n_embd, V)
                                                             : w.token_embd;
    m.head = b.has(p + "nextn.shared_head_head.weight") ? b.matrix(p + "nextn.shared_head_head.weight", c.n_embd, V)
                                                         : w.output;
    bind_layer(b, c, c.mtp_layer, p, m.layer);
  }
  return w;
}

size_t weight_bytes(const GgufFile& f) {
  size_t n = 0;
  for (const auto& t : f.tensors()) n += t.nbytes;
  return n;
}

}  // namespace strata
