#include "strata/engine/mtp.h"

#include "strata/base/error.h"
#include "strata/engine/blocks.h"
#include "strata/engine/sequence.h"
#include "strata/engine/session.h"

namespace strata {

ModelConfig mtp_cache_config(const Model& model) {
  const ModelConfig& c = model.config();
  if (c.n_mtp == 0)
    fail(model.file().path(), ": the model has no multi-token-prediction layer (", c.arch_name,
         ".nextn_predict_layers is absent or 0)");
  ModelConfig one = c;
  one.n_layer = 1;
  one.layers = {c.mtp_layer};
  return one;
}

MtpState::MtpState(const Model& model, int max_ctx) : state_(mtp_cache_config(model), max_ctx) {}

void MtpState::truncate(int pos) {
  if (pos < 0 || pos > state_.n_past) fail("MTP cache: truncate to ", pos, " of ", state_.n_past, " positions");
  state_.n_past = pos;
}

void mtp_forward(const Model& model, int j, MtpState& s, const int32_t* tokens, const float* hidden, int n, float* out,
                 float* logits) {
  const ModelConfig& c = model.config();
  if (j < 0 || j >= c.n_mtp) fail("MTP block ", j, " of ", c.n_mtp);
  SequenceState& st = s.state();
  if (n <= 0) fail("MTP forward needs at least one row");
  if (st.n_past + n > st.max_ctx) fail("MTP forward: ", st.n_past + n, " positions exceed the context of ", st.max_ctx);
  const MtpWeights& w = model.weights().mtp[static_cast<size_t>(j)];
  const size_t d = static_cast<size_t>(c.n_embd);
  const size_t width = static_cast<size_t>(n) * d;
  std::vector<float> e(width), both(2 * width), x(width), xn(width), y(width);
  embed_tokens(w.embed_tokens, tokens, n, e.data());
  // [enorm(e); hnorm(h)] per row: the embedding half first, as eh_proj's columns are ordered.
  for (int t = 0; t < n; ++t) {
    float* row = both.data() + 2 * d * static_cast<size_t>(t);
    rmsnorm_rows(e.data() + d * static_cast<size_t>(t), w.enorm.data(), c.rms_eps, 1, c.n_embd, row);
    rmsnorm_rows(hidden + d * static_cast<size_t>(t), w.hnorm.data(), c.rms_eps, 1, c.n_embd, row + d);
  }
  project(w.eh_proj, both.data(), n, x.data());

  const LayerWeights& L = w.layer;
  rmsnorm_rows(x.data(), L.attn_norm.data(), c.rms_eps, n, c.n_embd, xn.data());
  attention_block(c, c.mtp_layer, L.attn, st.layers[0], st.n_past, nullptr, xn.data(), n, y.data());
  for (size_t i = 0; i < width; ++i) x[i] += y[i];
  rmsnorm_rows(x.data(), L.ffn_norm.data(), c.rms_eps, n, c.n_embd, xn.data());
  moe_block(c, L.moe, xn.data(), n, y.data());
  for (size_t i = 0; i < width; ++i) x[i] += y[i];

  rmsnorm_rows(x.data(), w.shared_head_norm.data(), c.rms_eps, n, c.n_embd, out);
  if (logits) project(w.head, out + d * static_cast<size_t>(n - 1), 1, logits);
  st.n_past += n;
}

std::unique_ptr<MtpHead> Sequence::make_mtp_head(int, std::string&) { return nullptr; }

CpuMtpHead::CpuMtpHead(const Model& model, int max_ctx) : model_(model), state_(model, max_ctx) {}

void CpuMtpHead::restart(int pos) {
  state_.state().reset();
  state_.state().n_past = pos;
}

void CpuMtpHead::draft(const int32_t* tokens, const float* hidden, int n, int count, int32_t n_allowed,
                       std::vector<int32_t>& picks) {
  const size_t d = static_cast<size_t>(model_.config().n_embd);
  out_.resize(static_cast<size_t>(n) * d);
  next_.resize(d);
  logits_.resize(static_cast<size_t>(model_.config().n_vocab));
  mtp_forward(model_, 0, state_, tokens, hidden, n, out_.data(), logits_.data());
  picks.push_back(argmax(logits_.data(), n_allowed));
  // Each chained row takes the previous row's output (out_'s last row, then next_).
  std::vector<float> h(out_.end() - static_cast<std::ptrdiff_t>(d), out_.end());
  for (int i = 0; i < count; ++i) {
    mtp_forward(model_, 0, state_, &picks.back(), h.data(), 1, next_.data(), logits_.data());
    picks.push_back(argmax(logits_.data(), n_allowed));
    h.swap(next_);
  }
}

}  // namespace strata
