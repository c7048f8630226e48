// `strata routing-stats FILE [--json] [--plot FILE.svg]`: what a routing trace (--collect-routing, or -o of a generated
// one) says about caching experts: static coverage, reuse distance, LRU hit rates, distinct experts
// per window (moe/routing_stats.h).
// `strata routing-stats --generate NAME [--seed S] [--tokens N] [-o FILE]`: the same report on the
// generator's routing (moe/routing_generator.h) at the shape the setting names, optionally saved.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "strata/base/error.h"
#include "strata/engine/routing_trace.h"
#include "strata/moe/routing_generator.h"
#include "strata/moe/routing_heatmap.h"
#include "strata/moe/routing_stats.h"

namespace {

struct StatsArgs {
  std::string file;
  std::string generate;
  uint64_t seed = 1;
  int tokens = 4096;
  std::string output;
  std::string plot;  // --plot FILE.svg
  bool json = false;
};

void setup_routing_stats(CLI::App& sub) {
  auto a = std::make_shared<StatsArgs>();
  sub.add_option("trace", a->file, "routing trace FILE (strata run/serve/calibrate --collect-routing)");
  sub.add_option("--generate", a->generate,
                 "report on generated routing instead: " + strata::routing_setting_names());
  auto* seed = sub.add_option("--seed", a->seed, "with --generate: the generator's seed (default 1)");
  auto* tokens = sub.add_option("--tokens", a->tokens, "with --generate: tokens to generate (default 4096)");
  auto* output = sub.add_option("-o,--output", a->output, "with --generate: also write the trace to FILE");
  sub.add_option("--plot", a->plot,
                 "also draw the trace's picks as a heatmap (one row per layer, one cell per expert) to FILE.svg");
  sub.add_flag("--json", a->json, "print the report as JSON");
  sub.callback([a, seed, tokens, output] {
    if (a->generate.empty()) {
      if (a->file.empty()) strata::fail("routing-stats: give a trace FILE or --generate NAME");
      for (const auto* opt : {seed, tokens, output})
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
      trace = strata::generate_routing_trace(s, s.n_layer, s.n_expert, s.k, a->seed, a->tokens);
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
  });
}

const bool registered = strata::cli::register_command("routing-stats", "Report how cacheable a routing trace is",
                                                      setup_routing_stats);

}  // namespace
