#include "strata/engine/dflash.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "strata/base/error.h"
#include "strata/cpu/ops.h"
#include "strata/engine/blocks.h"
#include "strata/engine/sequence.h"
#include "strata/quant/quantize.h"

namespace strata {
namespace {

WeightMatrix matrix(const GgufFile& f, const std::string& name, int64_t cols, int64_t rows) {
  const GgufTensorInfo& t = f.tensor(name);
  if (t.n_dims != 2 || t.ne[0] != cols || t.ne[1] != rows)
    fail(f.path(), ": ", name, " is ", t.shape_string(), ", expected [", cols, ", ", rows, "]");
  WeightMatrix w;
  w.type = t.type, w.data = t.data, w.n_rows = rows, w.n_cols = cols, w.row_stride = t.row_nbytes();
  return w;
}

std::vector<float> vec(const GgufFile& f, const std::string& name, int64_t n) {
  const GgufTensorInfo& t = f.tensor(name);
  if (t.n_elements() != n) fail(f.path(), ": ", name, " is ", t.shape_string(), ", expected ", n, " values");
  std::vector<float> out(static_cast<size_t>(n));
  dequantize_row(t.type, t.data, out.data(), n);
  return out;
}

// Per head of `heads` heads of width hd: rmsnorm(x_h) * w, then rotary at pos (NEOX pairs, rot dims).
void norm_rope_heads(float* x, int heads, int hd, const std::vector<float>& w, float eps, int rot, int64_t pos,
                     float base) {
  for (int h = 0; h < heads; ++h) {
    float* xh = x + static_cast<size_t>(h) * static_cast<size_t>(hd);
    rmsnorm(xh, w.data(), eps, hd, xh);
    rope_neox_inplace(xh, rot, pos, base);
  }
}

}  // namespace

std::unique_ptr<DFlashModel> DFlashModel::load(const std::string& path, const Model& target) {
  GgufFile f = GgufFile::open(path);
  const std::string arch = f.get_string("general.architecture");
  if (arch != "dflash") fail(path, ": architecture '", arch, "' is not a DFlash drafter ('dflash')");
  std::unique_ptr<DFlashModel> m(new DFlashModel(std::move(f), target));
  const GgufFile& g = m->file_;
  DFlashConfig& c = m->c_;
  c.n_embd = static_cast<int>(g.get_u32("dflash.embedding_length"));
  c.n_layer = static_cast<int>(g.get_u32("dflash.block_count"));
  c.n_head = static_cast<int>(g.get_u32("dflash.attention.head_count"));
  c.n_head_kv = static_cast<int>(g.get_u32("dflash.attention.head_count_kv"));
  c.head_dim = static_cast<int>(g.get_u32("dflash.attention.key_length"));
  c.n_ff = static_cast<int>(g.get_u32("dflash.feed_forward_length"));
  c.block = static_cast<int>(g.get_u32("dflash.block_size"));
  c.rope_dims = static_cast<int>(g.get_u32_or("dflash.rope.dimension_count", static_cast<uint32_t>(c.head_dim)));
  c.rope_freq_base = g.get_f32_or("dflash.rope.freq_base", 10000.0f);
  c.rms_eps = g.get_f32_or("dflash.attention.layer_norm_rms_epsilon", 1e-6f);
  c.n_vocab = static_cast<int64_t>(g.get_u64("dflash.vocab_size"));
  c.context = static_cast<int>(g.get_u32_or("dflash.context_length", 0));
  for (int64_t l : g.get_int_array("dflash.target_layers")) c.target_layers.push_back(static_cast<int>(l));

  const ModelConfig& t = target.config();
  if (c.n_embd != t.n_embd) fail(path, ": drafter width ", c.n_embd, " but the target's is ", t.n_embd);
  if (c.n_vocab != t.n_vocab) fail(path, ": drafter vocabulary ", c.n_vocab, " but the target's is ", t.n_vocab);
  if (c.n_layer < 1 || c.n_head < 1 || c.n_head_kv < 1 || c.n_head % c.n_head_kv != 0 || c.head_dim < 2 ||
      c.rope_dims < 0 || c.rope_dims > c.head_dim || c.rope_dims % 2 != 0 || c.n_ff < 1)
    fail(path, ": bad drafter shape (", c.n_layer, " layers, ", c.n_head, "/", c.n_head_kv, " heads of ", c.head_dim,
         ", rotary ", c.rope_dims, ", ffn ", c.n_ff, ")");
  if (c.block < 2) fail(path, ": block size ", c.block, " (at least 2: the anchor and one draft)");
  if (c.target_layers.empty()) fail(path, ": no target layers to take the context from");
  for (size_t j = 0; j < c.target_layers.size(); ++j) {
    const int l = c.target_layers[j];
    if (l < 0 || l >= t.n_layer) fail(path, ": target layer ", l, " but the target has ", t.n_layer);
    for (size_t i = 0; i < j; ++i)
      if (c.target_layers[i] == l) fail(path, ": target layer ", l, " is listed twice");
  }

  const int64_t d = c.n_embd, q = static_cast<int64_t>(c.n_head) * c.head_dim;
  const int64_t kv = static_cast<int64_t>(c.n_head_kv) * c.head_dim;
  m->fc = matrix(g, "fc.weight", d * static_cast<int64_t>(c.target_layers.size()), d);
  m->hidden_norm = vec(g, "hidden_norm.weight", d);
  m->mask = vec(g, "mask_embd.weight", d);
  m->output_norm = vec(g, "output_norm.weight", d);
  for (int i = 0; i < c.n_layer; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    DFlashLayer L;
    L.attn_norm = vec(g, b + "attn_norm.weight", d);
    L.q_norm = vec(g, b + "attn_q_norm.weight", c.head_dim);
    L.k_norm = vec(g, b + "attn_k_norm.weight", c.head_dim);
    L.ffn_norm = vec(g, b + "ffn_norm.weight", d);
    L.wq = matrix(g, b + "attn_q.weight", d, q);
    L.wk = matrix(g, b + "attn_k.weight", d, kv);
    L.wv = matrix(g, b + "attn_v.weight", d, kv);
    L.wo = matrix(g, b + "attn_output.weight", q, d);
    L.gate = matrix(g, b + "ffn_gate.weight", d, c.n_ff);
    L.up = matrix(g, b + "ffn_up.weight", d, c.n_ff);
    L.down = matrix(g, b + "ffn_down.weight", c.n_ff, d);
    m->layers.push_back(std::move(L));
  }
  return m;
}

DFlashState::DFlashState(const DFlashModel& m) : m_(m), k_(m.layers.size()), v_(m.layers.size()) {}

void DFlashState::restart(int pos) {
  if (pos < 0) fail("dflash: restart at position ", pos);
  truncate(0);
  pos0_ = pos;
}

void DFlashState::truncate(int n) {
  if (n < 0 || n > n_ctx_) fail("dflash: truncate to ", n, " of ", n_ctx_, " context rows");
  const size_t row = static_cast<size_t>(m_.config().n_head_kv) * static_cast<size_t>(m_.config().head_dim);
  for (size_t l = 0; l < k_.size(); ++l) {
    k_[l].resize(static_cast<size_t>(n) * row);
    v_[l].resize(static_cast<size_t>(n) * row);
  }
  n_ctx_ = n;
}

void DFlashState::add_context(const float* taps, int n) {
  if (n <= 0) return;
  const DFlashConfig& c = m_.config();
  const size_t d = static_cast<size_t>(c.n_embd), row = static_cast<size_t>(c.n_head_kv) * c.head_dim;
  std::vector<float> feat(static_cast<size_t>(n) * d), kk(static_cast<size_t>(n) * row), vv(kk.size());
  matmul(m_.fc, taps, n, feat.data());
  rmsnorm_rows(feat.data(), m_.hidden_norm.data(), c.rms_eps, n, c.n_embd, feat.data());
  for (size_t l = 0; l < m_.layers.size(); ++l) {
    const DFlashLayer& L = m_.layers[l];
    matmul(L.wk, feat.data(), n, kk.data());
    matmul(L.wv, feat.data(), n, vv.data());
    for (int t = 0; t < n; ++t)
      norm_rope_heads(kk.data() + static_cast<size_t>(t) * row, c.n_head_kv, c.head_dim, L.k_norm, c.rms_eps,
                      c.rope_dims, end() + t, c.rope_freq_base);
    k_[l].insert(k_[l].end(), kk.begin(), kk.end());
    v_[l].insert(v_[l].end(), vv.begin(), vv.end());
  }
  n_ctx_ += n;
}

void DFlashState::draft(int32_t anchor, float* logits) const {
  const DFlashConfig& c = m_.config();
  if (anchor < 0 || anchor >= c.n_vocab) fail("dflash: anchor token ", anchor, " is out of range");
  const int B = c.block, hd = c.head_dim, per_kv = c.n_head / c.n_head_kv;
  const size_t d = static_cast<size_t>(c.n_embd), qw = static_cast<size_t>(c.n_head) * hd;
  // The context rows the block sees: the last c.context of them, or all.
  const size_t seen = static_cast<size_t>(c.seen(n_ctx_));
  const size_t first = static_cast<size_t>(n_ctx_) - seen;
  const size_t row = static_cast<size_t>(c.n_head_kv) * hd, n_keys = seen + B;
  std::vector<float> x(B * d), h(B * d), q(B * qw), o(B * qw), y(B * d);
  std::vector<float> g(static_cast<size_t>(B) * c.n_ff), u(g.size()), scores(n_keys);
  // Every block row attends to every context row it sees and every block row: per layer, those keys
  // and values side by side, the context's first, the block's after them at `blk`.
  std::vector<float> keys(n_keys * row), vals(n_keys * row);
  const size_t blk = seen * row;
  embed_tokens(m_.target().weights().token_embd, &anchor, 1, x.data());
  for (int j = 1; j < B; ++j) std::copy(m_.mask.begin(), m_.mask.end(), x.begin() + static_cast<std::ptrdiff_t>(j * d));
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (size_t l = 0; l < m_.layers.size(); ++l) {
    const DFlashLayer& L = m_.layers[l];
    rmsnorm_rows(x.data(), L.attn_norm.data(), c.rms_eps, B, c.n_embd, h.data());
    matmul(L.wq, h.data(), B, q.data());
    matmul(L.wk, h.data(), B, keys.data() + blk);
    matmul(L.wv, h.data(), B, vals.data() + blk);
    for (int j = 0; j < B; ++j) {
      norm_rope_heads(q.data() + j * qw, c.n_head, hd, L.q_norm, c.rms_eps, c.rope_dims, end() + j, c.rope_freq_base);
      norm_rope_heads(keys.data() + blk + j * row, c.n_head_kv, hd, L.k_norm, c.rms_eps, c.rope_dims, end() + j,
                      c.rope_freq_base);
    }
    std::copy_n(k_[l].data() + first * row, blk, keys.data());
    std::copy_n(v_[l].data() + first * row, blk, vals.data());
    for (int j = 0; j < B; ++j)
      for (int hh = 0; hh < c.n_head; ++hh) {
        const size_t kv_off = static_cast<size_t>(hh / per_kv) * hd;
        attend_one_head(q.data() + j * qw + static_cast<size_t>(hh) * hd,
                        f32_kv_head(keys.data() + kv_off, static_cast<int64_t>(row)),
                        f32_kv_head(vals.data() + kv_off, static_cast<int64_t>(row)), static_cast<int64_t>(n_keys), hd,
                        scale, scores.data(), o.data() + j * qw + static_cast<size_t>(hh) * hd);
      }
    matmul(L.wo, o.data(), B, y.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
    rmsnorm_rows(x.data(), L.ffn_norm.data(), c.rms_eps, B, c.n_embd, h.data());
    matmul(L.gate, h.data(), B, g.data());
    matmul(L.up, h.data(), B, u.data());
    swiglu(g.data(), u.data(), static_cast<int64_t>(g.size()), g.data());
    matmul(L.down, g.data(), B, y.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
  }
  rmsnorm_rows(x.data() + d, m_.output_norm.data(), c.rms_eps, B - 1, c.n_embd, h.data());
  matmul(m_.target().weights().output, h.data(), B - 1, logits);
}

void DFlashConfig::check_candidates(int depth, int32_t n_allowed) const {
  if (depth < 0 || depth > block - 1) fail("dflash: depth ", depth, " of a block of ", block);
  if (n_allowed <= 0 || n_allowed > n_vocab) fail("dflash: ", n_allowed, " allowed ids of ", n_vocab);
}

void fail_no_finite_logit() { fail("--spec dflash: the drafter gave no finite logit"); }

PositionCandidates block_candidates(float* logits, int32_t n, int k) {
  float mx = -INFINITY;
  for (int32_t i = 0; i < n; ++i) {
    if (std::isnan(logits[i])) logits[i] = -INFINITY;
    mx = std::max(mx, logits[i]);
  }
  if (!std::isfinite(mx)) fail_no_finite_logit();
  double z = 0;
  for (int32_t i = 0; i < n; ++i) z += std::exp(static_cast<double>(logits[i]) - mx);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  const int take = std::min<int>(k, n);
  std::partial_sort(ids.begin(), ids.begin() + take, ids.end(), [logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  PositionCandidates p;
  for (int i = 0; i < take; ++i) {
    const int32_t id = ids[static_cast<size_t>(i)];
    if (!std::isfinite(logits[id])) break;
    p.tokens.push_back(id);
    p.probs.push_back(static_cast<float>(std::exp(static_cast<double>(logits[id]) - mx) / z));
  }
  for (size_t i = 1; i < p.probs.size(); ++i) p.probs[i] = std::min(p.probs[i], p.probs[i - 1]);
  return p;
}

void candidates_from_logits(const DFlashConfig& c, float* logits, int depth, int k, int32_t n_allowed,
                            std::vector<PositionCandidates>& out) {
  c.check_candidates(depth, n_allowed);
  out.clear();
  for (int j = 0; j < depth; ++j)
    out.push_back(block_candidates(logits + static_cast<size_t>(j) * static_cast<size_t>(c.n_vocab), n_allowed, k));
}

void CpuDFlashHead::candidates(int32_t anchor, int depth, int k, int32_t n_allowed,
                               std::vector<PositionCandidates>& out) {
  const DFlashConfig& c = state_.model().config();
  c.check_candidates(depth, n_allowed);  // before the forward
  logits_.resize(static_cast<size_t>(c.block - 1) * static_cast<size_t>(c.n_vocab));
  state_.draft(anchor, logits_.data());
  candidates_from_logits(c, logits_.data(), depth, k, n_allowed, out);
}

std::unique_ptr<DFlashHead> Sequence::make_dflash_head(const DFlashModel&, int, std::string&) { return nullptr; }

}  // namespace strata
