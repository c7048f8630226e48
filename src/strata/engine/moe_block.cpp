// Mixture-of-experts FFN (HF Qwen3MoeSparseMoeBlock / Qwen3_5MoeSparseMoeBlock / LagunaSparseMoeBlock):
//   p = softmax(W_router x), or sigmoid(softcap(W_router x)) with the top-k chosen on p + bias;
//   pick the top-k experts; renormalise their p to sum 1 (norm_topk);
//   y = scale * sum_e p_e * down_e(silu(gate_e x) * up_e x)  [+ (sigmoid(w_sh . x)) * shared(x)]
// The scale multiplies the finished sum, as HF applies routed_scaling_factor.
// Tokens are grouped by expert so each chosen expert's matrices are read once per batch. Per token the
// expert contributions are summed in ascending expert order, the same for prefill and decode.
// One token (decode) runs as one parallel region (moe_decode) rather than one per product.
#include <omp.h>

#include <algorithm>
#include <exception>
#include <vector>

#include "strata/cpu/ops.h"
#include "strata/engine/blocks.h"

namespace strata {
namespace {

// Experts with at least this many tokens split their rows over the threads; fewer, one expert a thread.
constexpr size_t kRowSplitTokens = 16;

// Runs one SwiGLU FFN (gate, up, down) on m rows of X; Y is [m x d_model].
void swiglu_ffn(const WeightMatrix& gate, const WeightMatrix& up, const WeightMatrix& down, const float* X, int m,
                float* Y) {
  const int64_t ff = gate.n_rows;
  std::vector<float> G(static_cast<size_t>(m * ff)), U(static_cast<size_t>(m * ff));
  project(gate, X, m, G.data());
  project(up, X, m, U.data());
  swiglu(G.data(), U.data(), m * ff, G.data());
  project(down, G.data(), m, Y);
}

// Each token's top-k of its router scores (probs, [n x n_expert], made probabilities in place), or its
// replayed picks (forced; -1 first: routed) with the router's probabilities for them.
void route_rows(const ModelConfig& c, const MoeWeights& w, std::vector<float>& probs, int n, const int* forced,
                std::vector<int>& chosen, std::vector<float>& weight) {
  const int k = c.n_expert_used;
  chosen.resize(static_cast<size_t>(n) * k);
  weight.resize(static_cast<size_t>(n) * k);
  for (int t = 0; t < n; ++t) {
    float* p = probs.data() + static_cast<int64_t>(t) * c.n_expert;
    int* ids = chosen.data() + static_cast<int64_t>(t) * k;
    float* wt = weight.data() + static_cast<int64_t>(t) * k;
    const int* f = forced ? forced + static_cast<int64_t>(t) * k : nullptr;
    if (!f || f[0] < 0) {
      if (c.router == RouterKind::Softmax)
        route_token(p, c.n_expert, k, c.norm_topk, ids, wt);
      else
        route_token_sigmoid(p, w.selection_bias.empty() ? nullptr : w.selection_bias.data(), c.n_expert, k,
                            c.router_softcap, c.norm_topk, ids, wt);
      continue;
    }
    // Replayed ids keep the router's own probabilities for them (softmax, or the soft-capped sigmoid),
    // so the combine's magnitudes stay those of a routed token.
    if (c.router == RouterKind::Softmax)
      softmax_inplace(p, c.n_expert);
    else
      sigmoid_scores_inplace(p, c.n_expert, c.router_softcap);
    double sum = 0.0;
    for (int j = 0; j < k; ++j) sum += p[f[j]];
    for (int j = 0; j < k; ++j) {
      ids[j] = f[j];
      wt[j] = c.norm_topk && sum > 0.0 ? static_cast<float>(p[f[j]] / sum) : p[f[j]];
    }
  }
}

// Weight bytes of one task of the decode step's expert lists.
constexpr size_t kExpertTaskBytes = 16 << 10;

// One token (decode) in one parallel region: the router and the shared expert's input products, the
// routing (one thread), then the picked experts' gate/up rows and their down rows as task lists (the
// input and each hidden vector quantised once), instead of a region per product. Every row is
// computed by matvec's kernels in its tiles and the combine keeps the batch path's order, so the
// result equals moe_block's for n = 1 bitwise.
void moe_decode(const ModelConfig& c, const MoeWeights& w, const float* xn, float* out, std::vector<int>* picks,
                const int* forced) {
  const int d = c.n_embd;
  const int k = c.n_expert_used;
  const int64_t ff = w.gate.first.n_rows;
  const int64_t sff = w.has_shared ? w.shared_gate.n_rows : 0;
  const int n_slots = k + (w.has_shared ? 1 : 0);
  const int64_t hmax = std::max(ff, sff);
  std::vector<float> probs(static_cast<size_t>(c.n_expert));
  float sgate = 0.0f;
  std::vector<float> sg(static_cast<size_t>(sff)), su(static_cast<size_t>(sff));
  std::vector<float> G(static_cast<size_t>(k * ff)), U(static_cast<size_t>(k * ff));
  std::vector<float> H(static_cast<size_t>(n_slots * hmax)), Y(static_cast<size_t>(n_slots) * d);
  PreparedVec xv;
  prepare_vec(xn, d, xv);
  MatvecTasks inputs;
  inputs.add(w.router, &xv, probs.data());
  if (w.has_shared) {
    if (w.shared_gated) inputs.add(w.shared_gate_inp, &xv, &sgate);
    inputs.add(w.shared_gate, &xv, sg.data());
    inputs.add(w.shared_up, &xv, su.data());
  }
  std::vector<int> chosen;
  std::vector<float> weight;
  // Slots 0..k-1: the picks in ascending expert order (the combine's), slot k: the shared expert.
  std::vector<std::pair<int, float>> order;
  std::vector<PreparedVec> hv(static_cast<size_t>(n_slots));
  MatvecTasks gate_up, down;
  std::exception_ptr failed;  // an exception may not leave the region: the lists stay empty, it is rethrown after
#pragma omp parallel
  {
    MatvecScratch s;
    inputs.run(s);
#pragma omp single
    try {
      route_rows(c, w, probs, 1, forced, chosen, weight);
      for (int j = 0; j < k; ++j) order.push_back({chosen[static_cast<size_t>(j)], weight[static_cast<size_t>(j)]});
      std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      if (w.has_shared) swiglu(sg.data(), su.data(), sff, H.data() + static_cast<size_t>(k * hmax));
      // In memory order (expert, gate then up), so the contiguous runs of tasks a thread takes stream
      // each matrix's rows in order. The down rows read hidden vectors prepared below.
      for (int j = 0; j < k; ++j) {
        const int e = order[static_cast<size_t>(j)].first;
        gate_up.add(w.gate.expert(e), &xv, G.data() + static_cast<size_t>(j * ff), kExpertTaskBytes);
        gate_up.add(w.up.expert(e), &xv, U.data() + static_cast<size_t>(j * ff), kExpertTaskBytes);
        down.add(w.down.expert(e), &hv[static_cast<size_t>(j)], Y.data() + static_cast<size_t>(j) * d,
                 kExpertTaskBytes);
      }
      if (w.has_shared)
        down.add(w.shared_down, &hv[static_cast<size_t>(k)], Y.data() + static_cast<size_t>(k) * d, kExpertTaskBytes);
    } catch (...) {
      failed = std::current_exception();
      gate_up = MatvecTasks();
      down = MatvecTasks();
    }
    gate_up.run(s);
#pragma omp for schedule(static)
    for (int j = 0; j < (failed ? 0 : n_slots); ++j) {
      float* h = H.data() + static_cast<size_t>(j * hmax);
      if (j < k) swiglu(G.data() + static_cast<size_t>(j * ff), U.data() + static_cast<size_t>(j * ff), ff, h);
      prepare_vec(h, j < k ? ff : sff, hv[static_cast<size_t>(j)]);
    }
    down.run(s);
  }
  if (failed) std::rethrow_exception(failed);
  if (picks) *picks = chosen;

  std::fill(out, out + d, 0.0f);
  for (int j = 0; j < k; ++j) {
    const float a = order[static_cast<size_t>(j)].second;
    const float* y = Y.data() + static_cast<size_t>(j) * d;
    for (int i = 0; i < d; ++i) out[i] += a * y[i];
  }
  if (c.expert_weights_scale != 1.0f)
    for (int i = 0; i < d; ++i) out[i] *= c.expert_weights_scale;
  if (w.has_shared) {
    const float a = w.shared_gated ? sigmoidf(sgate) : 1.0f;
    const float* y = Y.data() + static_cast<size_t>(k) * d;
    for (int i = 0; i < d; ++i) out[i] += a * y[i];
  }
}

}  // namespace

void moe_block(const ModelConfig& c, const MoeWeights& w, const float* xn, int n, float* out,
               std::vector<int>* picks, const int* forced) {
  if (n == 1) {
    moe_decode(c, w, xn, out, picks, forced);
    return;
  }
  const int d = c.n_embd;
  const int k = c.n_expert_used;

  // Routing.
  std::vector<float> probs(static_cast<size_t>(n) * c.n_expert);
  project(w.router, xn, n, probs.data());
  std::vector<int> chosen;
  std::vector<float> weight;
  route_rows(c, w, probs, n, forced, chosen, weight);

  if (picks) *picks = chosen;

  // Group (token, weight) pairs by expert.
  std::vector<std::vector<std::pair<int, float>>> users(static_cast<size_t>(c.n_expert));
  for (int t = 0; t < n; ++t)
    for (int j = 0; j < k; ++j)
      users[chosen[static_cast<size_t>(t) * k + j]].push_back({t, weight[static_cast<size_t>(t) * k + j]});

  // Expert outputs first, then the combine in ascending expert order. Experts with many tokens split
  // their rows over the threads (matmul's own parallel loop); the many experts with a few tokens each
  // (a prefill spreads its picks over most experts) run side by side, one expert per thread, so
  // their small products do not each pay a fork and join. Every row is computed by the same kernels
  // either way, so the results do not depend on the split.
  std::vector<int> used;
  std::vector<size_t> at(static_cast<size_t>(c.n_expert), 0);  // offset of expert e's rows in Y
  size_t total = 0;
  for (int e = 0; e < c.n_expert; ++e) {
    if (users[e].empty()) continue;
    used.push_back(e);
    at[static_cast<size_t>(e)] = total;
    total += users[e].size() * static_cast<size_t>(d);
  }
  std::vector<float> Y(total);
  const auto run_expert = [&](int e) {
    const auto& u = users[e];
    const int m = static_cast<int>(u.size());
    std::vector<float> Xe(static_cast<size_t>(m) * d);
    for (int i = 0; i < m; ++i)
      std::copy_n(xn + static_cast<int64_t>(u[i].first) * d, d, Xe.data() + static_cast<int64_t>(i) * d);
    swiglu_ffn(w.gate.expert(e), w.up.expert(e), w.down.expert(e), Xe.data(), m, Y.data() + at[static_cast<size_t>(e)]);
  };
  std::vector<int> small;
  for (int e : used) {
    if (users[e].size() >= kRowSplitTokens)
      run_expert(e);
    else
      small.push_back(e);
  }
  // Side by side only when they fill the threads: a decode step's few experts would leave most threads
  // idle and each expert's bytes to one thread's share of the memory bandwidth.
  if (small.size() >= static_cast<size_t>(omp_get_max_threads())) {
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < small.size(); ++i) run_expert(small[i]);
  } else {
    for (int e : small) run_expert(e);
  }

  std::fill(out, out + static_cast<int64_t>(n) * d, 0.0f);
  for (int e : used) {
    const auto& u = users[e];
    for (size_t i = 0; i < u.size(); ++i) {
      float* o = out + static_cast<int64_t>(u[i].first) * d;
      const float* y = Y.data() + at[static_cast<size_t>(e)] + i * static_cast<size_t>(d);
      const float a = u[i].second;
      for (int j = 0; j < d; ++j) o[j] += a * y[j];
    }
  }

  if (c.expert_weights_scale != 1.0f)
    for (int64_t i = 0; i < static_cast<int64_t>(n) * d; ++i) out[i] *= c.expert_weights_scale;

  if (w.has_shared) {
    std::vector<float> gate(static_cast<size_t>(n), 0.0f);
    std::vector<float> Ys(static_cast<size_t>(n) * d);
    if (w.shared_gated) project(w.shared_gate_inp, xn, n, gate.data());
    swiglu_ffn(w.shared_gate, w.shared_up, w.shared_down, xn, n, Ys.data());
    for (int t = 0; t < n; ++t) {
      const float a = w.shared_gated ? sigmoidf(gate[t]) : 1.0f;
      float* o = out + static_cast<int64_t>(t) * d;
      const float* y = Ys.data() + static_cast<int64_t>(t) * d;
      for (int j = 0; j < d; ++j) o[j] += a * y[j];
    }
  }
}

void dense_ffn_block(const DenseFfnWeights& w, const float* xn, int n, float* out) {
  swiglu_ffn(w.gate, w.up, w.down, xn, n, out);
}

}  // namespace strata
