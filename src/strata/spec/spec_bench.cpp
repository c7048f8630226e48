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
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
    std::unique_ptr<Sequence> a = make();
    const GenerationResult p = greedy_run(*a, tokenizer, prompt, n_gen, {});
    a.reset();
    std::unique_ptr<Sequence> b = make();
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
