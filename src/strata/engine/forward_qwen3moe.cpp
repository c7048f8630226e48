// qwen3moe (Qwen3-30B-A3B family): every layer is
//   x += attention(rmsnorm(x, attn_norm));  x += moe(rmsnorm(x, ffn_norm))
// with per-head q/k RMSNorm and full NEOX rotary inside the attention.
#include <vector>

#include "strata/engine/blocks.h"
#include "strata/engine/forward.h"

namespace strata {

void forward_qwen3moe(const Model& model, SequenceState& state, const int32_t* tokens, int n, float* logits,
                      bool all_positions, RoutingCounts* counts) {
  const ModelConfig& c = model.config();
  const ModelWeights& w = model.weights();
  const size_t width = static_cast<size_t>(n) * c.n_embd;
  std::vector<float> x(width), xn(width), y(width);

  embed_tokens(w.token_embd, tokens, n, x.data());
  for (int il = 0; il < c.n_layer; ++il) {
    const LayerWeights& L = w.layers[il];
    rmsnorm_rows(x.data(), L.attn_norm.data(), c.rms_eps, n, c.n_embd, xn.data());
    attention_block(c, L.attn, state.layers[il], state.n_past, xn.data(), n, y.data());
    for (size_t i = 0; i < width; ++i) x[i] += y[i];

    rmsnorm_rows(x.data(), L.ffn_norm.data(), c.rms_eps, n, c.n_embd, xn.data());
    moe_block(c, L.moe, xn.data(), n, y.data(), counts, il);
    for (size_t i = 0; i < width; ++i) x[i] += y[i];
  }
  output_logits(c, w, x.data(), n, all_positions, logits);
  state.n_past += n;
}

}  // namespace strata
