#include "strata/spec/spec_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "strata/base/error.h"

namespace strata {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

GenerationResult greedy_run(Sequence& s, const Tokenizer& tokenizer, const std::vector<int32_t>& prompt, int n_gen,
                            const SpeculativeParams& spec) {
  SamplerParams sp;
  sp.temperature = 0;
  Sampler sampler(sp);
  GenerationParams gp;
  gp.max_new_tokens = n_gen;
  gp.spec = spec;
  return generate(s, tokenizer, sampler, prompt, gp, {});
}

}  // namespace

SpecBenchResult run_spec_bench(const std::function<std::unique_ptr<Sequence>()>& make, const Tokenizer& tokenizer,
                               const std::vector<int32_t>& prompt, int n_gen, int reps, Drafter& drafter,
                               const SpeculativeParams& spec) {
  if (reps < 1) fail("bench: -r must be >= 1");
  if (n_gen < 2) fail("bench --spec: -n must be >= 2 (speculation starts after the first token)");
  validate_speculative_params(spec);
  SpecBenchResult out;
  out.drafter = drafter.name();
  SpeculativeParams with = spec;
  with.drafter = &drafter;
  std::vector<double> plain, fast;
  std::unique_ptr<Sequence> a = make(), b = make();
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
    a->reset();
    const GenerationResult p = greedy_run(*a, tokenizer, prompt, n_gen, {});
    b->reset();
    const GenerationResult s = greedy_run(*b, tokenizer, prompt, n_gen, with);
    if (rep == 0) continue;
    out.same_tokens = out.same_tokens && p.tokens == s.tokens;
    plain.push_back(p.stats.decode_tokens_per_second());
    fast.push_back(s.stats.decode_tokens_per_second());
    out.drafted += s.stats.drafted_tokens;
    out.accepted += s.stats.accepted_tokens;
    out.verifies += s.stats.spec_steps;
  }
  out.plain_tps = summarize(plain);
  out.spec_tps = summarize(fast);
  a.reset();
  b.reset();

  // One verification of draft_max drafts against one decode step, after the prompt.
  std::unique_ptr<Sequence> s = make();
  const int64_t V = s->model().config().n_vocab;
  std::vector<float> logits(static_cast<size_t>(V) * static_cast<size_t>(spec.draft_max + 1));
  s->forward(prompt.data(), static_cast<int>(prompt.size()), logits.data(), false);
  std::mt19937 rng(1);
  std::vector<int32_t> tokens(static_cast<size_t>(spec.draft_max + 1));
  std::vector<double> verify, step;
  const int steps = std::min(9, std::max(1, s->max_ctx() - s->n_past() - spec.draft_max - 1));
  for (int i = 0; i < steps; ++i) {
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(V));
    auto t0 = Clock::now();
    s->forward_pending(tokens.data(), static_cast<int>(tokens.size()), nullptr, logits.data());
    verify.push_back(ms_since(t0));
    s->keep(nullptr, 0);
    t0 = Clock::now();
    s->forward(tokens.data(), 1, logits.data(), false);
    step.push_back(ms_since(t0));
  }
  out.verify_tokens = spec.draft_max + 1;
  out.verify_ms = summarize(verify).median;
  out.step_ms = summarize(step).median;
  return out;
}

std::string VerifyShape::label() const { return (tree ? "tree:" : "chain:") + std::to_string(n); }

std::vector<int> VerifyShape::parents() const {
  std::vector<int> p;
  if (!tree) return p;
  // Main path nodes first at each depth, the alternative beside it: depth d's main node's parent is
  // depth d-1's main node (-1 at the first depth).
  int main_prev = -1;
  while (static_cast<int>(p.size()) < n) {
    p.push_back(main_prev);
    const int main_here = static_cast<int>(p.size()) - 1;
    if (static_cast<int>(p.size()) < n) p.push_back(main_prev);  // the alternative candidate
    main_prev = main_here;
  }
  return p;
}

std::vector<VerifyShape> parse_verify_shapes(const std::string& text) {
  std::vector<VerifyShape> out;
  bool tree = false, kind_given = false;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t end = std::min(text.find(',', at), text.size());
    std::string item = text.substr(at, end - at);
    if (item.rfind("chain:", 0) == 0) tree = false, kind_given = true, item = item.substr(6);
    else if (item.rfind("tree:", 0) == 0) tree = true, kind_given = true, item = item.substr(5);
    int n = 0;
    size_t used = 0;
    try {
      n = std::stoi(item, &used);
    } catch (...) {
      used = 0;
    }
    if (!kind_given || item.empty() || used != item.size() || n < 1 || n > 64)
      fail("--verify-cost '", text, "': expected sizes 1..64 after chain: or tree:, e.g. chain:2,4,8,16,tree:8,16,22");
    out.push_back({tree, n});
    at = end + 1;
  }
  return out;
}

int verify_cost_context(int n_prompt, const std::vector<VerifyShape>& shapes, int reps) {
  int deepest = 0;
  for (const VerifyShape& s : shapes) deepest = std::max(deepest, s.depth());
  return n_prompt + static_cast<int>(shapes.size()) * (reps + 1) * (deepest + 2) + 1;  // + the warm-up
}

std::vector<VerifyCostRow> run_verify_cost(const std::function<std::unique_ptr<Sequence>()>& make, int n_prompt,
                                           const std::vector<VerifyShape>& shapes, int reps, uint64_t seed) {
  if (reps < 1) fail("bench: -r must be >= 1");
  if (n_prompt < 1) fail("bench --verify-cost: -p must be >= 1");
  std::unique_ptr<Sequence> s = make();
  const int64_t V = s->model().config().n_vocab;
  if (s->max_ctx() < verify_cost_context(n_prompt, shapes, reps))
    fail("bench --verify-cost: the sequence holds ", s->max_ctx(), " tokens, ", verify_cost_context(n_prompt, shapes, reps),
         " are needed");
  std::mt19937_64 rng(seed);
  auto random_token = [&] { return static_cast<int32_t>(rng() % static_cast<uint64_t>(V)); };
  std::vector<int32_t> prompt(static_cast<size_t>(n_prompt));
  for (int32_t& t : prompt) t = random_token();
  std::vector<float> logits(static_cast<size_t>(V));
  s->forward(prompt.data(), n_prompt, logits.data(), false);
  std::vector<VerifyCostRow> rows;
  for (const VerifyShape& shape : shapes) {
    const std::vector<int> draft_parents = shape.parents();
    std::vector<int> parents(1, -1);  // batch order: the last token, then the drafts
    for (const int p : draft_parents) parents.push_back(p + 1);
    // The main path in batch indices: the last token, then the first child at each depth (a chain: all).
    std::vector<int> path(1, 0);
    for (int t = 0; t < shape.n; ++t)
      if (!shape.tree || draft_parents[static_cast<size_t>(t)] + 1 == path.back()) path.push_back(t + 1);
    std::vector<int32_t> batch(static_cast<size_t>(shape.n + 1));
    std::vector<float> all(static_cast<size_t>(V) * batch.size());
    std::vector<double> verify, step;
    for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up (a first call may build graphs or buffers)
      for (int32_t& t : batch) t = random_token();
      auto t0 = Clock::now();
      s->forward_pending(batch.data(), static_cast<int>(batch.size()), shape.tree ? parents.data() : nullptr, all.data());
      s->keep(path.data(), static_cast<int>(path.size()));
      const double v = ms_since(t0);
      const int32_t next = random_token();
      t0 = Clock::now();
      s->forward(&next, 1, logits.data(), false);
      const double one = ms_since(t0);
      if (rep == 0) continue;
      verify.push_back(v);
      step.push_back(one);
    }
    rows.push_back({shape, summarize(verify).median, summarize(step).median});
  }
  return rows;
}

std::string format_verify_cost(const std::vector<VerifyCostRow>& rows) {
  std::string out = "| draft | tokens verified | main path | verify ms | one step ms | verify / step | speed-up at L = 2 | 3 | 4 |\n"
                    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  char buf[256];
  for (const VerifyCostRow& r : rows) {
    const double ratio = r.step_ms > 0 ? r.verify_ms / r.step_ms : 0.0;
    std::snprintf(buf, sizeof buf, "| %s | %d | %d | %.3f | %.3f | %.2f |", r.shape.label().c_str(), r.shape.n + 1,
                  r.shape.depth(), r.verify_ms, r.step_ms, ratio);
    out += buf;
    for (int L = 2; L <= 4; ++L) {
      if (L > r.shape.depth() + 1 || ratio <= 0) {
        out += " - |";
      } else {
        std::snprintf(buf, sizeof buf, " %.2fx |", L / ratio);
        out += buf;
      }
    }
    out += "\n";
  }
  return out;
}

std::string format_spec_bench(const SpecBenchResult& r) {
  char buf[768];
  const double rate = r.drafted > 0 ? static_cast<double>(r.accepted) / r.drafted : 0.0;
  const double per_verify = r.verifies > 0 ? static_cast<double>(r.accepted + r.verifies) / r.verifies : 0.0;
  std::snprintf(buf, sizeof buf,
                "speculative decoding (%s), greedy:\n"
                "  decode without: %.1f tok/s (median; min %.1f, max %.1f)\n"
                "  decode with:    %.1f tok/s (median; min %.1f, max %.1f): %.2fx\n"
                "  acceptance: %d/%d drafts (%.0f%%), %.2f tokens per verification over %d verifications\n"
                "  verify cost: %.2f ms for %d tokens = %.2fx one decode step (%.2f ms)\n"
                "  output: %s\n",
                r.drafter.c_str(), r.plain_tps.median, r.plain_tps.min, r.plain_tps.max, r.spec_tps.median,
                r.spec_tps.min, r.spec_tps.max, r.plain_tps.median > 0 ? r.spec_tps.median / r.plain_tps.median : 0.0,
                r.accepted, r.drafted, 100.0 * rate, per_verify, r.verifies, r.verify_ms, r.verify_tokens,
                r.step_ms > 0 ? r.verify_ms / r.step_ms : 0.0, r.step_ms,
                r.same_tokens ? "token-identical to decoding without speculation"
                              : "DIFFERS from decoding without speculation");
  return buf;
}

}  // namespace strata
