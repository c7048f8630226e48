#include "strata/engine/forward.h"

#include <vector>

#include "strata/base/error.h"
#include "strata/engine/blocks.h"

namespace strata {

void forward_model(const Model& model, SequenceState& state, const int32_t* tokens, int n, const TokenTree* pending,
                   float* logits, bool all_positions, RoutingCounts* counts) {
  const ModelConfig& c = model.config();
  const ModelWeights& w = model.weights();
  if (pending && pending->size() != n) fail("forward: a tree of ", pending->size(), " tokens for ", n, " tokens");
  const size_t width = static_cast<size_t>(n) * c.n_embd;
  std::vector<float> x(width), xn(width), y(width);

  embed_tokens(w.token_embd, tokens, n, x.data());
  for (int il = 0; il < c.n_layer; ++il) {
    const LayerWeights& L = w.layers[il];
    const LayerSpec& spec = c.layers[static_cast<size_t>(il)];
    rmsnorm_rows(x.data(), L.attn_norm.data(), c.rms_eps, n, c.n_embd, xn.data());
    switch (spec.mixer) {
      case LayerKind::FullAttention:
        attention_block(c, L.attn, state.layers[il], state.n_past, pending, xn.data(), n, y.data());
        break;
      case LayerKind::DeltaNet: deltanet_block(c, L.deltanet, state.layers[il], pending, xn.data(), n, y.data()); break;
    }
    for (size_t i = 0; i < width; ++i) x[i] += y[i];

    rmsnorm_rows(x.data(), L.ffn_norm.data(), c.rms_eps, n, c.n_embd, xn.data());
    switch (spec.ffn) {
      case FfnKind::Moe:
        if (pending) {
          state.pending_picks.resize(static_cast<size_t>(c.n_layer));
          moe_block(c, L.moe, xn.data(), n, y.data(), nullptr, il, &state.pending_picks[static_cast<size_t>(il)]);
        } else {
          moe_block(c, L.moe, xn.data(), n, y.data(), counts, il);
        }
        break;
    }
    for (size_t i = 0; i < width; ++i) x[i] += y[i];
  }
  output_logits(c, w, x.data(), n, all_positions, logits);
  if (pending) {
    state.pending = *pending;
    state.has_pending = true;
  } else {
    state.n_past += n;
  }
}

void keep_pending(const Model& model, SequenceState& state, const int* path, int m, RoutingCounts* counts) {
  if (!state.has_pending) fail("keep: no tokens are pending (run forward_pending first)");
  state.pending.check_path(path, m);
  const ModelConfig& c = model.config();
  if (counts) {
    const size_t k = static_cast<size_t>(c.n_expert_used);
    for (size_t il = 0; il < state.pending_picks.size(); ++il)
      for (int j = 0; j < m; ++j)
        for (size_t p = 0; p < k; ++p)
          counts->add(static_cast<int>(il), state.pending_picks[il][static_cast<size_t>(path[j]) * k + p], 1);
    counts->n_tokens += static_cast<uint64_t>(m);
  }
  for (int il = 0; il < c.n_layer; ++il) {
    switch (c.mixer(il)) {
      case LayerKind::FullAttention: attention_keep(c, state.layers[il], state.n_past, path, m); break;
      case LayerKind::DeltaNet:
        deltanet_keep(c, model.weights().layers[il].deltanet, state.layers[il], path, m);
        break;
    }
  }
  state.n_past += m;
  state.has_pending = false;
}

}  // namespace strata
