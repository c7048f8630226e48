#include "strata/engine/forward.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "strata/base/error.h"
#include "strata/engine/blocks.h"

namespace strata {
namespace {

// One pick per entry of [first, last) into layer il's row.
void count_picks(RoutingCounts& counts, int il, const int* first, const int* last) {
  for (const int* e = first; e != last; ++e) counts.add(il, *e, 1);
}

// STRATA_CPU_PROFILE=1: wall time per operation of every forward, summed over the process and printed
// on stderr at exit (debug output only).
enum ProfOp { kAttention, kDeltaNet, kMoe, kDenseFfn, kNormsResidual, kLmHead, kProfOps };
struct OpProfile {
  bool on = std::getenv("STRATA_CPU_PROFILE") != nullptr && std::getenv("STRATA_CPU_PROFILE")[0] == '1';
  std::array<double, kProfOps> seconds{};
  std::array<long, kProfOps> calls{};
  long forwards = 0, rows = 0;
  ~OpProfile() {
    if (!on || forwards == 0) return;
    static const char* names[kProfOps] = {"attention", "deltanet", "moe", "dense ffn", "norms+residual", "lm_head"};
    double total = 0;
    for (double t : seconds) total += t;
    std::fprintf(stderr, "strata cpu profile: %ld forwards, %ld rows, %.3f s in the ops below\n", forwards, rows, total);
    for (int i = 0; i < kProfOps; ++i)
      if (calls[static_cast<size_t>(i)] > 0)
        std::fprintf(stderr, "  %-15s %9.3f ms/forward  %5.1f%%  (%ld calls)\n", names[i],
                     1e3 * seconds[static_cast<size_t>(i)] / static_cast<double>(forwards),
                     100.0 * seconds[static_cast<size_t>(i)] / total, calls[static_cast<size_t>(i)]);
  }
};
OpProfile g_profile;

// Times one operation when profiling is on.
class ProfScope {
 public:
  explicit ProfScope(ProfOp op) : op_(op), on_(g_profile.on) {
    if (on_) t0_ = std::chrono::steady_clock::now();
  }
  ~ProfScope() {
    if (!on_) return;
    g_profile.seconds[static_cast<size_t>(op_)] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    ++g_profile.calls[static_cast<size_t>(op_)];
  }
  ProfScope(const ProfScope&) = delete;
  ProfScope& operator=(const ProfScope&) = delete;

 private:
  ProfOp op_;
  bool on_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

void forward_batch(const Model& model, ForwardPart* parts, int n_parts) {
  const ModelConfig& c = model.config();
  const ModelWeights& w = model.weights();
  int n = 0;
  std::vector<int> first(static_cast<size_t>(n_parts));  // each part's first row
  std::vector<int32_t> tokens;
  for (int p = 0; p < n_parts; ++p) {
    const ForwardPart& part = parts[p];
    if (part.n <= 0) fail("forward: a part of ", part.n, " tokens");
    if (part.pending && part.pending->size() != part.n)
      fail("forward: a tree of ", part.pending->size(), " tokens for ", part.n, " tokens");
    if (part.n > part.state->forward_limit)
      fail("forward: ", part.n, " tokens at once; this sequence's sliding-window caches take at most ",
           part.state->forward_limit, " per forward");
    for (int q = 0; q < p; ++q)
      if (parts[q].state == part.state) fail("forward: one sequence appears twice in a batch");
    first[static_cast<size_t>(p)] = n;
    tokens.insert(tokens.end(), part.tokens, part.tokens + part.n);
    n += part.n;
  }
  const size_t d = static_cast<size_t>(c.n_embd);
  const size_t width = static_cast<size_t>(n) * d;
  std::vector<float> x(width), xn(width), y(width);
  std::vector<int> picks;
  const size_t k = static_cast<size_t>(c.n_expert_used);
  // Traces and replays hold the routed layers only (ModelConfig::routed_layers): layer il is their
  // layer trace_layer[il] (-1 for a dense layer).
  const std::vector<int> trace_layer = c.routed_index();
  const size_t token_stride = c.routed_layers().size() * k;

  // Replayed picks, [row x layer x k], -1 for rows the router picks for; asked for before anything
  // changes so a failing source leaves the states as they were.
  std::vector<int> replayed, forced;
  for (int p = 0; p < n_parts; ++p) {
    ForwardPart& part = parts[p];
    if (!part.replay) continue;
    if (replayed.empty()) replayed.assign(static_cast<size_t>(n) * token_stride, -1);
    part.replay->next(part.n, replayed.data() + static_cast<size_t>(first[static_cast<size_t>(p)]) * token_stride);
  }
  // Each traced chain's picks, [token x layer x k], appended once the forward is done.
  std::vector<std::vector<int>> traced(static_cast<size_t>(n_parts));
  for (int p = 0; p < n_parts; ++p)
    if (parts[p].trace && !parts[p].pending) traced[static_cast<size_t>(p)].resize(static_cast<size_t>(parts[p].n) * token_stride);

  if (g_profile.on) ++g_profile.forwards, g_profile.rows += n;
  embed_tokens(w.token_embd, tokens.data(), n, x.data());
  for (int il = 0; il < c.n_layer; ++il) {
    const LayerWeights& L = w.layers[il];
    const LayerSpec& spec = c.layers[static_cast<size_t>(il)];
    {
      ProfScope prof(kNormsResidual);
      rmsnorm_rows(x.data(), L.attn_norm.data(), c.rms_eps, n, c.n_embd, xn.data());
    }
    for (int p = 0; p < n_parts; ++p) {  // mixers: per sequence, on its rows
      ProfScope prof(spec.mixer == LayerKind::DeltaNet ? kDeltaNet : kAttention);
      ForwardPart& part = parts[p];
      const size_t at = static_cast<size_t>(first[static_cast<size_t>(p)]) * d;
      LayerState& ls = part.state->layers[static_cast<size_t>(il)];
      switch (spec.mixer) {
        case LayerKind::FullAttention:
        case LayerKind::SlidingAttention:
          attention_block(c, spec, L.attn, ls, part.state->n_past, part.pending, xn.data() + at, part.n, y.data() + at);
          break;
        case LayerKind::DeltaNet: deltanet_block(c, L.deltanet, ls, part.pending, xn.data() + at, part.n, y.data() + at); break;
      }
    }
    {
      ProfScope prof(kNormsResidual);
      for (size_t i = 0; i < width; ++i) x[i] += y[i];
      rmsnorm_rows(x.data(), L.ffn_norm.data(), c.rms_eps, n, c.n_embd, xn.data());
    }
    ProfScope prof_ffn(spec.ffn == FfnKind::Moe ? kMoe : kDenseFfn);
    switch (spec.ffn) {
      case FfnKind::Moe:
        if (!replayed.empty()) {
          forced.resize(static_cast<size_t>(n) * k);
          for (size_t t = 0; t < static_cast<size_t>(n); ++t)
            std::copy_n(replayed.data() + t * token_stride + static_cast<size_t>(trace_layer[il]) * k, k,
                        forced.data() + t * k);
        }
        moe_block(c, L.moe, xn.data(), n, y.data(), &picks, replayed.empty() ? nullptr : forced.data());
        break;
      case FfnKind::Dense: dense_ffn_block(L.dense, xn.data(), n, y.data()); break;
    }
    // Each part's picks: kept for keep_pending, or counted (and traced) now. A dense layer routes nothing.
    const size_t kl = spec.ffn == FfnKind::Moe ? k : 0;
    for (int p = 0; p < n_parts; ++p) {
      ForwardPart& part = parts[p];
      const auto from = picks.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(first[static_cast<size_t>(p)]) * kl);
      const auto to = from + static_cast<std::ptrdiff_t>(static_cast<size_t>(part.n) * kl);
      if (part.pending) {
        part.state->pending_picks.resize(static_cast<size_t>(c.n_layer));
        part.state->pending_picks[static_cast<size_t>(il)].assign(from, to);
      } else if (kl > 0) {
        if (part.counts) count_picks(*part.counts, il, &*from, &*from + (to - from));
        std::vector<int>& tr = traced[static_cast<size_t>(p)];
        for (size_t t = 0; t < tr.size() / token_stride; ++t)
          std::copy_n(from + static_cast<std::ptrdiff_t>(t * k), k,
                      tr.data() + t * token_stride + static_cast<size_t>(trace_layer[il]) * k);
      }
    }
    for (size_t i = 0; i < width; ++i) x[i] += y[i];
    for (int p = 0; p < n_parts; ++p) {  // taps: this layer's output rows where a part asks for them
      const ForwardPart& part = parts[p];
      if (!part.hidden || !part.hidden_layers) continue;
      const std::vector<int>& tl = *part.hidden_layers;
      const size_t n_tap = tl.size();
      for (size_t j = 0; j < n_tap; ++j) {
        if (tl[j] != il) continue;
        for (size_t t = 0; t < static_cast<size_t>(part.n); ++t)
          std::copy_n(x.data() + (static_cast<size_t>(first[static_cast<size_t>(p)]) + t) * d, d,
                      part.hidden + (t * n_tap + j) * d);
      }
    }
  }
  for (int p = 0; p < n_parts; ++p) {
    ForwardPart& part = parts[p];
    ProfScope prof(kLmHead);
    if (part.hidden && !part.hidden_layers)
      rmsnorm_rows(x.data() + static_cast<size_t>(first[static_cast<size_t>(p)]) * d, w.output_norm.data(), c.rms_eps,
                   part.n, c.n_embd, part.hidden);
    if (part.logits)  // null: a piece of a longer forward whose logits nobody reads
      output_logits(c, w, x.data() + static_cast<size_t>(first[static_cast<size_t>(p)]) * d, part.n, part.all_positions,
                    part.logits);
    if (part.pending) {
      part.state->pending = *part.pending;
      part.state->has_pending = true;
    } else {
      part.state->n_past += part.n;
      if (part.trace) part.trace->append(part.trace_stream, traced[static_cast<size_t>(p)].data(), part.n);
    }
  }
}

void forward_part(const Model& model, ForwardPart part) {
  // Plain tokens beyond what one forward may add (sliding-window rings) run in pieces; pending ones
  // cannot be split (keep() chooses among them) and forward_batch refuses too many.
  const int n = part.n;
  const int piece = part.pending ? n : std::max(1, part.state->forward_limit);
  const size_t vocab = static_cast<size_t>(model.config().n_vocab);
  for (int at = 0; at < n; at += piece) {
    const int len = std::min(piece, n - at);
    ForwardPart p = part;
    p.tokens = part.tokens + at, p.n = len;
    p.logits = part.all_positions ? (part.logits ? part.logits + static_cast<size_t>(at) * vocab : nullptr)
                                  : (at + len == n ? part.logits : nullptr);
    const size_t width = static_cast<size_t>(model.config().n_embd) * (part.hidden_layers ? part.hidden_layers->size() : 1);
    if (part.hidden) p.hidden = part.hidden + static_cast<size_t>(at) * width;
    forward_batch(model, &p, 1);
  }
}

void forward_model(const Model& model, SequenceState& state, const int32_t* tokens, int n, const TokenTree* pending,
                   float* logits, bool all_positions, RoutingCounts* counts) {
  ForwardPart part;
  part.state = &state, part.tokens = tokens, part.n = n, part.pending = pending;
  part.logits = logits, part.all_positions = all_positions, part.counts = counts;
  forward_part(model, part);
}

void keep_pending(const Model& model, SequenceState& state, const int* path, int m, RoutingCounts* counts,
                  RoutingTraceWriter* trace, uint32_t stream) {
  if (!state.has_pending) fail("keep: no tokens are pending (run forward_pending first)");
  state.pending.check_path(path, m);
  const ModelConfig& c = model.config();
  if (trace && m > 0) {
    const size_t k = static_cast<size_t>(c.n_expert_used);
    const std::vector<int> routed = c.routed_layers();  // the trace's layers
    const size_t stride = routed.size() * k;
    std::vector<int> kept(static_cast<size_t>(m) * stride);
    for (size_t r = 0; r < routed.size(); ++r)
      for (int j = 0; j < m; ++j)
        std::copy_n(state.pending_picks[static_cast<size_t>(routed[r])].data() + static_cast<size_t>(path[j]) * k, k,
                    kept.data() + static_cast<size_t>(j) * stride + r * k);
    trace->append(stream, kept.data(), m);
  }
  if (counts) {
    const size_t k = static_cast<size_t>(c.n_expert_used);
    for (size_t il = 0; il < state.pending_picks.size(); ++il)
      for (int j = 0; j < m && !state.pending_picks[il].empty(); ++j) {
        const int* token_picks = state.pending_picks[il].data() + static_cast<size_t>(path[j]) * k;
        count_picks(*counts, static_cast<int>(il), token_picks, token_picks + k);
      }
    counts->n_tokens += static_cast<uint64_t>(m);
  }
  for (int il = 0; il < c.n_layer; ++il) {
    switch (c.mixer(il)) {
      case LayerKind::FullAttention:
      case LayerKind::SlidingAttention: attention_keep(c, state.layers[il], state.n_past, path, m); break;
      case LayerKind::DeltaNet:
        deltanet_keep(c, model.weights().layers[il].deltanet, state.layers[il], path, m);
        break;
    }
  }
  state.n_past += m;
  state.has_pending = false;
}

}  // namespace strata
