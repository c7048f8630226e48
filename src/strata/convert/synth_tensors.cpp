#include "strata/convert/synth_tensors.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "strata/base/error.h"
#include "strata/convert/synth_random.h"

namespace strata::convert {

std::vector<float> zipf_expert_scales(int n_expert, double s, uint64_t seed, int layer) {
  std::vector<float> scale(static_cast<size_t>(n_expert), 1.0f);
  if (s == 0.0) return scale;
  std::vector<int> rank(static_cast<size_t>(n_expert));
  std::iota(rank.begin(), rank.end(), 1);
  // Fisher-Yates with the counter-based generator, so the permutation depends only on (seed, layer).
  RowRng rng(stream_key(seed, "zipf-ranks"), static_cast<uint64_t>(layer));
  for (int i = n_expert - 1; i > 0; --i) {
    const int j = static_cast<int>(rng.next() % static_cast<uint64_t>(i + 1));
    std::swap(rank[static_cast<size_t>(i)], rank[static_cast<size_t>(j)]);
  }
  for (int e = 0; e < n_expert; ++e) scale[static_cast<size_t>(e)] = static_cast<float>(std::pow(rank[e], -s));
  return scale;
}

namespace {

// Share of top-k picks on the most-picked 40% of experts when logit e is scale_e * N(0, 1).
double simulated_top40_share(int n_expert, int k, double s) {
  std::vector<double> scale(static_cast<size_t>(n_expert));
  for (int e = 0; e < n_expert; ++e) scale[static_cast<size_t>(e)] = std::pow(e + 1.0, -s);
  std::vector<uint64_t> count(static_cast<size_t>(n_expert), 0);
  std::vector<std::pair<double, int>> v(static_cast<size_t>(n_expert));
  RowRng rng(stream_key(1, "realistic-skew"), static_cast<uint64_t>(n_expert) * 1000 + static_cast<uint64_t>(k));
  const int tokens = 4000;
  for (int t = 0; t < tokens; ++t) {
    for (int e = 0; e < n_expert; ++e) {
      // Box-Muller from two uniform draws.
      const double u1 = (static_cast<double>(rng.next() >> 11) + 1.0) * 0x1.0p-53;
      const double u2 = static_cast<double>(rng.next() >> 11) * 0x1.0p-53;
      v[static_cast<size_t>(e)] = {scale[static_cast<size_t>(e)] * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2), e};
    }
    std::partial_sort(v.begin(), v.begin() + k, v.end(), std::greater<>());
    for (int j = 0; j < k; ++j) ++count[static_cast<size_t>(v[static_cast<size_t>(j)].second)];
  }
  std::sort(count.begin(), count.end(), std::greater<>());
  const int top = std::max(1, static_cast<int>(std::lround(0.4 * n_expert)));
  uint64_t hit = 0;
  for (int e = 0; e < top; ++e) hit += count[static_cast<size_t>(e)];
  return static_cast<double>(hit) / (static_cast<double>(tokens) * k);
}

struct Planner {
  const HfConfig& c;
  std::vector<SynthTensor> out;

  void add(std::string name, std::vector<int64_t> ne, TensorRole role, int layer, SynthInit init) {
    SynthTensor t;
    t.meta.name = std::move(name);
    t.meta.ne = std::move(ne);
    t.meta.role = role;
    t.meta.layer = layer;
    t.init = init;
    out.push_back(std::move(t));
  }
};

}  // namespace

double realistic_skew_exponent(int n_expert, int k) {
  if (n_expert < 1 || k < 1 || k > n_expert) fail("synth: invalid expert shape ", n_expert, " experts top-", k);
  const double target = 0.70;
  // Nothing to skew when top-k already takes the hot 40% (or more) every token.
  if (simulated_top40_share(n_expert, k, 0.0) >= target) return 0.0;
  double lo = 0.0, hi = 4.0;
  for (int i = 0; i < 14; ++i) {
    const double mid = 0.5 * (lo + hi);
    (simulated_top40_share(n_expert, k, mid) < target ? lo : hi) = mid;
  }
  return std::round(hi * 1000.0) / 1000.0;
}

std::vector<SynthTensor> plan_synth_tensors(const HfConfig& c, double skew, uint64_t seed) {
  const bool q35 = c.arch == HfArch::Qwen35Moe;
  const int64_t E = c.n_embd, V = c.n_vocab, X = c.n_expert, F = c.n_ff_exp, D = c.head_dim;
  Planner p{c, {}};
  p.add("token_embd.weight", {E, V}, TensorRole::TokenEmbd, -1, SynthInit::Embedding);
  p.add("output_norm.weight", {E}, TensorRole::Norm, -1, SynthInit::NormOne);
  if (!c.tie_embeddings) p.add("output.weight", {E, V}, TensorRole::Output, -1, SynthInit::Matrix);

  const int64_t Hk = c.lin_k_heads, Hv = c.lin_v_heads;
  const int64_t key_dim = Hk * c.lin_k_dim, value_dim = Hv * c.lin_v_dim;
  const int64_t conv_dim = 2 * key_dim + value_dim;
  const bool laguna = c.arch == HfArch::Laguna;
  // The trunk, then the MTP blocks (full attention + MoE, after their nextn.* tensors).
  for (int i = 0; i < c.n_layer + c.n_mtp; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    const bool mtp = i >= c.n_layer;
    if (mtp) {
      p.add(b + "nextn.eh_proj.weight", {2 * E, E}, TensorRole::MtpProj, i, SynthInit::Matrix);
      for (const char* norm : {"nextn.enorm.weight", "nextn.hnorm.weight", "nextn.shared_head_norm.weight"})
        p.add(b + norm, {E}, TensorRole::Norm, i, SynthInit::NormOne);
    }
    p.add(b + "attn_norm.weight", {E}, TensorRole::Norm, i, SynthInit::NormOne);
    const bool full = mtp || !q35 || c.is_full_attention.at(static_cast<size_t>(i));
    if (full) {
      const int64_t H = laguna ? c.heads_per_layer.at(static_cast<size_t>(i)) : c.n_head;
      // qwen35moe: attn_q yields query and output gate per head (2 * head_dim).
      p.add(b + "attn_q.weight", {E, (q35 ? 2 : 1) * H * D}, TensorRole::AttnQ, i, SynthInit::Matrix);
      p.add(b + "attn_k.weight", {E, c.n_head_kv * D}, TensorRole::AttnK, i, SynthInit::Matrix);
      p.add(b + "attn_v.weight", {E, c.n_head_kv * D}, TensorRole::AttnV, i, SynthInit::Matrix);
      p.add(b + "attn_output.weight", {H * D, E}, TensorRole::AttnOut, i, SynthInit::Matrix);
      p.add(b + "attn_q_norm.weight", {D}, TensorRole::Norm, i, SynthInit::NormOne);
      p.add(b + "attn_k_norm.weight", {D}, TensorRole::Norm, i, SynthInit::NormOne);
      if (laguna)
        p.add(b + "attn_gate.weight", {E, c.gate_per_head ? H : H * D}, TensorRole::AttnOutGate, i, SynthInit::Matrix);
    } else {
      p.add(b + "attn_qkv.weight", {E, conv_dim}, TensorRole::AttnQkv, i, SynthInit::Matrix);
      p.add(b + "attn_gate.weight", {E, value_dim}, TensorRole::AttnGate, i, SynthInit::Matrix);
      p.add(b + "ssm_beta.weight", {E, Hv}, TensorRole::SsmBeta, i, SynthInit::Matrix);
      p.add(b + "ssm_alpha.weight", {E, Hv}, TensorRole::SsmAlpha, i, SynthInit::Matrix);
      p.add(b + "ssm_conv1d.weight", {c.conv_kernel, conv_dim}, TensorRole::SsmConv, i, SynthInit::Matrix);
      p.add(b + "ssm_dt.bias", {Hv}, TensorRole::SsmDt, i, SynthInit::SsmDtBias);
      p.add(b + "ssm_a", {Hv}, TensorRole::SsmA, i, SynthInit::SsmA);
      p.add(b + "ssm_norm.weight", {c.lin_v_dim}, TensorRole::Norm, i, SynthInit::NormOne);
      p.add(b + "ssm_out.weight", {value_dim, E}, TensorRole::SsmOut, i, SynthInit::Matrix);
    }
    p.add(b + (q35 ? "post_attention_norm.weight" : "ffn_norm.weight"), {E}, TensorRole::Norm, i, SynthInit::NormOne);
    if (laguna && i < c.n_dense_lead) {
      const int64_t Fd = c.intermediate_size;
      p.add(b + "ffn_gate.weight", {E, Fd}, TensorRole::FfnGate, i, SynthInit::Matrix);
      p.add(b + "ffn_up.weight", {E, Fd}, TensorRole::FfnUp, i, SynthInit::Matrix);
      p.add(b + "ffn_down.weight", {Fd, E}, TensorRole::FfnDown, i, SynthInit::Matrix);
      continue;
    }
    p.add(b + "ffn_gate_inp.weight", {E, X}, TensorRole::Router, i, SynthInit::Router);
    p.out.back().row_scale = zipf_expert_scales(static_cast<int>(X), skew, seed, i);
    p.add(b + "ffn_gate_exps.weight", {E, F, X}, TensorRole::ExpertsGate, i, SynthInit::Matrix);
    p.add(b + "ffn_up_exps.weight", {E, F, X}, TensorRole::ExpertsUp, i, SynthInit::Matrix);
    p.add(b + "ffn_down_exps.weight", {F, E, X}, TensorRole::ExpertsDown, i, SynthInit::Matrix);
    if (laguna) p.add(b + "exp_probs_b.bias", {X}, TensorRole::ExpertBias, i, SynthInit::Matrix);
    if (q35 || laguna) {
      const int64_t S = c.n_ff_shexp;
      if (q35) p.add(b + "ffn_gate_inp_shexp.weight", {E}, TensorRole::SharedExpertGate, i, SynthInit::Matrix);
      p.add(b + "ffn_gate_shexp.weight", {E, S}, TensorRole::SharedGate, i, SynthInit::Matrix);
      p.add(b + "ffn_up_shexp.weight", {E, S}, TensorRole::SharedUp, i, SynthInit::Matrix);
      p.add(b + "ffn_down_shexp.weight", {S, E}, TensorRole::SharedDown, i, SynthInit::Matrix);
    }
  }
  return std::move(p.out);
}

void synth_row(const SynthTensor& t, uint64_t seed, int64_t row, float* dst) {
  const int64_t n = t.meta.ne[0];
  RowRng rng(stream_key(seed, t.meta.name), static_cast<uint64_t>(row));
  const float sqrt3 = 1.7320508f;  // uniform(-a, a) has std a / sqrt(3)
  switch (t.init) {
    case SynthInit::Matrix:
    case SynthInit::Router: {
      float a = sqrt3 / std::sqrt(static_cast<float>(n));
      if (t.init == SynthInit::Router && !t.row_scale.empty()) a *= t.row_scale.at(static_cast<size_t>(row));
      for (int64_t i = 0; i < n; ++i) dst[i] = rng.symmetric(a);
      return;
    }
    case SynthInit::Embedding:
      for (int64_t i = 0; i < n; ++i) dst[i] = rng.symmetric(sqrt3);
      return;
    case SynthInit::NormOne:
      for (int64_t i = 0; i < n; ++i) dst[i] = 1.0f + rng.symmetric(0.1f);
      return;
    case SynthInit::SsmA:
      for (int64_t i = 0; i < n; ++i) dst[i] = -(1.0f + 15.0f * rng.uniform());
      return;
    case SynthInit::SsmDtBias:
      for (int64_t i = 0; i < n; ++i) {
        const float dt = std::exp(std::log(1e-3f) + rng.uniform() * (std::log(1e-1f) - std::log(1e-3f)));
        dst[i] = std::log(std::expm1(dt));  // inverse of softplus
      }
      return;
  }
  fail("internal: synth_row: unknown init for ", t.meta.name);
}

}  // namespace strata::convert
