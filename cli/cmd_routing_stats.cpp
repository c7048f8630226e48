// `strata routing-stats FILE [--json] [--plot FILE.svg]`: what a routing trace (--collect-routing, or -o of a generated
// one) says about caching experts: static coverage, reuse distance, LRU hit rates, distinct experts
// per window (moe/routing_stats.h).
// `strata routing-stats --generate NAME [--seed S] [--tokens N] [-o FILE]`: the same report on the
// generator's routing (moe/routing_generator.h) at the shape the setting names, optionally saved.
// --cache-sim adds what the VRAM expert cache would catch on it (moe/expert_cache_sim.h).
#include <cstdio>
#include <memory>
#include <string>

#include "cli/backend_cli.h"
#include "cli/command.h"
#include "strata/base/error.h"
#include "strata/engine/routing_trace.h"
#include "strata/moe/expert_cache_sim.h"
#include "strata/moe/routing_generator.h"
#include "strata/moe/routing_heatmap.h"
#include "strata/moe/routing_stats.h"

namespace {

struct StatsArgs {
  std::string file;
  std::string generate;
  uint64_t seed = 1;
  int tokens = 4096;
  int layers = 0, experts = 0;  // 0: the setting's
  std::string output;
  std::string plot;  // --plot FILE.svg
  bool json = false;
  bool cache_sim = false;
  strata::CacheSimConfig sim;
};

void setup_routing_stats(CLI::App& sub) {
  auto a = std::make_shared<StatsArgs>();
  sub.add_option("trace", a->file, "routing trace FILE (strata run/serve/calibrate --collect-routing)");
  sub.add_option("--generate", a->generate,
                 "report on generated routing instead: " + strata::routing_setting_names());
  auto* seed = sub.add_option("--seed", a->seed, "with --generate: the generator's seed (default 1)");
  auto* tokens = sub.add_option("--tokens", a->tokens, "with --generate: tokens to generate (default 4096)");
  auto* output = sub.add_option("-o,--output", a->output, "with --generate: also write the trace to FILE");
  auto* layers = sub.add_option("--layers", a->layers, "with --generate: routed layers (default: the setting's)");
  auto* experts = sub.add_option("--experts", a->experts,
                                 "with --generate: experts per layer, as a model of that shape would route them "
                                 "(default: the setting's)");
  sub.add_option("--plot", a->plot,
                 "also draw the trace's picks as a heatmap (one row per layer, one cell per expert) to FILE.svg");
  sub.add_flag("--json", a->json, "print the report as JSON");
  sub.add_flag("--cache-sim", a->cache_sim,
               "also simulate the hybrid VRAM expert cache on the trace: residency 25/50/75% x cache slots "
               "0/8/16/32 per layer x lru/lfu (pinned experts chosen on the first half, measured on the rest)");
  auto* copy = sub.add_option("--cache-copy-experts", a->sim.copy_experts,
                              "with --cache-sim: expert copies that may start per step (default 8)");
  auto* observe = sub.add_option("--cache-observe-delay", a->sim.observe_delay,
                                 "with --cache-sim: steps until the policy sees a step's picks (default 2, as the "
                                 "GPU session with its lookahead)");
  auto* map = sub.add_option("--cache-copy-delay", a->sim.copy_delay,
                             "with --cache-sim: steps from a copy's start to its mapping (default 1)");
  auto* margin = sub.add_option("--cache-admit-margin", a->sim.admit_margin,
                                "with --cache-sim: aged picks by which an LFU newcomer must beat its victim "
                                "(default: the session's, " +
                                    strata::cli::short_number(a->sim.admit_margin) + ")");
  auto* half_life = sub.add_option("--cache-half-life", a->sim.lfu_half_life,
                                   "with --cache-sim: steps over which an LFU count halves (default: the session's, " +
                                       strata::cli::short_number(a->sim.lfu_half_life) + ")");
  sub.callback([a, seed, tokens, output, layers, experts, copy, observe, map, margin, half_life] {
    for (const auto* opt : {copy, observe, map, margin, half_life})
      if (opt->count() > 0 && !a->cache_sim) strata::fail(opt->get_name(), " needs --cache-sim");
    if (a->cache_sim && a->json) strata::fail("--cache-sim prints text; leave out --json");
    if (a->generate.empty()) {
      if (a->file.empty()) strata::fail("routing-stats: give a trace FILE or --generate NAME");
      for (const auto* opt : {seed, tokens, output, layers, experts})
        if (opt->count() > 0) strata::fail(opt->get_name(), " needs --generate");
    } else if (!a->file.empty()) {
      strata::fail("routing-stats: give either a trace FILE or --generate NAME, not both");
    }
    strata::RoutingTrace trace;
    if (a->generate.empty()) {
      trace = strata::read_routing_trace(a->file);
    } else {
      if (a->tokens < 1) strata::fail("--tokens must be >= 1, got ", a->tokens);
      const strata::RoutingSetting& s = strata::routing_setting(a->generate);
      if (a->layers < 0 || a->experts < 0) strata::fail("--layers and --experts must be >= 1");
      const int n_layer = a->layers > 0 ? a->layers : s.n_layer, n_expert = a->experts > 0 ? a->experts : s.n_expert;
      if (n_expert < s.k)
        strata::fail("--experts ", n_expert, " is fewer than the setting's ", s.k, " picks per token");
      trace = strata::generate_routing_trace(s, n_layer, n_expert, s.k, a->seed, a->tokens);
      if (!a->output.empty()) strata::write_routing_trace(a->output, trace);
    }
    if (!a->plot.empty())
      strata::write_routing_heatmap(a->plot, strata::routing_trace_counts(trace),
                                    "routing of " + (trace.header.source.empty() ? std::string("a trace") : trace.header.source));
    const strata::RoutingStats stats = strata::routing_stats(trace);
    if (a->json)
      std::printf("%s\n", strata::routing_stats_json(stats).c_str());
    else
      std::printf("%s", strata::format_routing_stats(stats).c_str());
    if (a->cache_sim) std::printf("%s", strata::format_cache_sim_grid(trace, a->sim).c_str());
  });
}

const bool registered = strata::cli::register_command("routing-stats", "Report how cacheable a routing trace is",
                                                      setup_routing_stats);

}  // namespace
