#include "strata/engine/session.h"

#include "strata/base/error.h"
#include "strata/engine/forward.h"

namespace strata {

Session::Session(const Model& model, int max_ctx, KvCacheTypes kv_types, int sliding_forward)
    : model_(model), state_(model.config(), max_ctx, kv_types, sliding_forward) {}

namespace {

void check_tokens(const ModelConfig& c, const SequenceState& st, const int32_t* tokens, int n) {
  if (st.has_pending) fail("tokens are pending: keep() them (or none) before the next forward");
  if (n <= 0) fail("forward needs at least one token");
  if (st.n_past + n > st.max_ctx) fail("prompt of ", st.n_past + n, " tokens exceeds the context of ", st.max_ctx);
  for (int t = 0; t < n; ++t)
    if (tokens[t] < 0 || tokens[t] >= c.n_vocab)
      fail("token id ", tokens[t], " at index ", t, " is out of range (vocabulary of ", c.n_vocab, ")");
}

}  // namespace

void Session::check_forward(const int32_t* tokens, int n) const { check_tokens(model_.config(), state_, tokens, n); }

void forward_sessions(SessionStep* steps, int n_steps) {
  if (n_steps <= 0) fail("forward_sessions: no sessions");
  const Model& model = steps[0].session->model();
  std::vector<ForwardPart> parts(static_cast<size_t>(n_steps));
  for (int i = 0; i < n_steps; ++i) {
    const SessionStep& st = steps[i];
    if (&st.session->model() != &model) fail("forward_sessions: sessions of different models");
    st.session->check_forward(st.tokens, st.n);
    ForwardPart& p = parts[static_cast<size_t>(i)];
    p.state = &st.session->state(), p.tokens = st.tokens, p.n = st.n;
    p.logits = st.logits, p.all_positions = st.all_positions;
    st.session->attach_routing(p);
    st.session->attach_hidden(p, st.n);
  }
  forward_batch(model, parts.data(), n_steps);  // refuses a session given twice before it runs anything
  for (int i = 0; i < n_steps; ++i) {
    steps[i].session->record_kept(steps[i].tokens, steps[i].n);
    if (RoutingCounts* rc = steps[i].session->routing_counts()) rc->n_tokens += static_cast<uint64_t>(steps[i].n);
  }
}

void Session::attach_routing(ForwardPart& part) const {
  part.counts = routing_counts_;
  part.trace = trace_;
  part.trace_stream = trace_stream_;
  part.replay = replay_;
}

void Session::attach_hidden(ForwardPart& part, int n) {
  if (!hidden_) return;
  hidden_rows_.resize(static_cast<size_t>(n) * static_cast<size_t>(hidden_->width));
  part.hidden = hidden_rows_.data();
  if (!hidden_layers_.empty()) part.hidden_layers = &hidden_layers_;
}

void Session::record_kept(const int32_t* tokens, int n) {
  if (hidden_) hidden_->append(tokens, hidden_rows_.data(), n);
}

void Session::set_hidden_record(std::shared_ptr<HiddenRecord> record) {
  if (record && record != hidden_) {
    record->width = record->width_for(model_.config().n_layer, model_.config().n_embd);
    record->restart(state_.n_past);
  }
  // The layers as they were given: a later change to the record's list does not change this sequence's rows.
  if (record != hidden_) hidden_layers_ = record ? record->layers : std::vector<int>{};
  hidden_ = std::move(record);
}

void Session::forward(const int32_t* tokens, int n, float* logits_out, bool all_positions) {
  check_tokens(model_.config(), state_, tokens, n);
  ForwardPart part;
  part.state = &state_, part.tokens = tokens, part.n = n;
  part.logits = logits_out, part.all_positions = all_positions;
  attach_routing(part);
  attach_hidden(part, n);
  forward_part(model_, part);
  record_kept(tokens, n);
  if (routing_counts_) routing_counts_->n_tokens += static_cast<uint64_t>(n);
}

void Session::forward_pending(const int32_t* tokens, int n, const int* parents, float* logits_out) {
  check_tokens(model_.config(), state_, tokens, n);
  const TokenTree tree = TokenTree::from_parents(parents, n);
  ForwardPart part;
  part.state = &state_, part.tokens = tokens, part.n = n, part.pending = &tree;
  part.logits = logits_out, part.all_positions = true;
  attach_routing(part);
  attach_hidden(part, n);
  forward_part(model_, part);
  if (hidden_) pending_tokens_.assign(tokens, tokens + n);
}

void Session::keep(const int* path, int m) {
  keep_pending(model_, state_, path, m, routing_counts_, trace_, trace_stream_);
  if (!hidden_) return;
  const size_t d = static_cast<size_t>(hidden_->width);
  for (int j = 0; j < m; ++j) {
    const size_t t = static_cast<size_t>(path[j]);
    hidden_->append(&pending_tokens_[t], hidden_rows_.data() + t * d, 1);
  }
}

void Session::set_routing_trace(RoutingTraceWriter* trace, uint32_t stream) {
  if (trace) check_trace_fits(trace->header(), model_.config());
  trace_ = trace;
  trace_stream_ = stream;
}

void Session::set_routing_replay(RoutingSource* source) {
  const ModelConfig& c = model_.config();
  if (source) check_replay_shape(*source, static_cast<int>(c.routed_layers().size()), c.n_expert, c.n_expert_used);
  replay_ = source;
}

void Session::set_routing_counts(RoutingCounts* counts) {
  const ModelConfig& c = model_.config();
  if (counts && counts->empty() && counts->n_layer == 0) counts->reset(c.n_layer, c.n_expert);
  if (counts && (counts->n_layer != c.n_layer || counts->n_expert != c.n_expert))
    fail("routing counts of ", counts->n_layer, " layers x ", counts->n_expert, " experts do not fit the model (",
         c.n_layer, " x ", c.n_expert, ")");
  routing_counts_ = counts;
}

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

std::vector<int32_t> generate_greedy(Sequence& session, const std::vector<int32_t>& prompt, int n_new) {
  const int64_t vocab = session.model().config().n_vocab;
  std::vector<float> logits(static_cast<size_t>(vocab));
  std::vector<int32_t> out;
  if (n_new <= 0) return out;
  if (prompt.empty()) fail("greedy generation needs a prompt of at least one token");
  session.forward(prompt.data(), static_cast<int>(prompt.size()), logits.data(), false);
  for (int i = 0; i < n_new; ++i) {
    const int32_t next = argmax(logits.data(), vocab);
    out.push_back(next);
    if (i + 1 < n_new) session.forward(&next, 1, logits.data(), false);
  }
  return out;
}

}  // namespace strata
