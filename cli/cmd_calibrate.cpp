// `strata calibrate -m MODEL --corpus FILE... [--holdout FRAC] [--budget PCT,...] [--ctx N] -o PROFILE`:
// runs text through the model counting which experts the router picks, writes the routing profile,
// then reports, for each expert budget, the cold-hit rate (the fraction of expert picks that would be
// served by the CPU) on the held-out part for three placements: from the profile, uniform (the same
// experts 0..c-1 in every layer) and by layer (whole layers on the CPU, as llama.cpp's --n-cpu-moe
// does). Lower is better. The text runs on the backend the run flags choose (the CPU engine, or --gpu
// through the same SequenceFactory as run: every backend routes with fp32 routers and counts the same
// way), so a large model is calibrated at GPU speed.
// `strata calibrate -m MODEL --routing TRACE|generate:NAME[:SEED] [--tokens N] -o PROFILE`: the same
// profile and report from replayed routing instead of text: the counts are the source's picks (the
// model is not run; it gives the shape, the fingerprint and the expert bytes), the held-out part the
// source's next tokens. For benchmarks under replayed routing, whose static profile must come from the
// same routing.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/backend_cli.h"
#include "cli/command.h"
#include "cli/generation_cli.h"
#include "strata/base/error.h"
#include "strata/engine/model.h"
#include "strata/engine/sequence.h"
#include "strata/moe/calibration.h"
#include "strata/moe/routing_generator.h"
#include "strata/moe/routing_heatmap.h"
#include "strata/moe/routing_profile.h"
#include "strata/moe/vram_budget.h"

namespace {

struct CalibrateOptions {
  std::string model;
  std::vector<std::string> corpus;
  double holdout = 0.1;
  std::string budgets = "25,50,75";
  int ctx = 512;
  std::string output;
  std::string heldout_counts;
  std::string plot;  // --plot FILE.svg: the training counts as a heatmap
  bool json = false;
  bool holdout_given = false;
  int tokens = 4096;  // with --routing
  bool tokens_given = false;
  strata::cli::ThreadOptions threads;
  strata::cli::BackendOptions backend;
};

std::string base_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// "calibrate: training 12345/67890 tokens (18%), 1234 tok/s" at most every second; on a terminal it
// redraws one line, otherwise it writes a line every 10 seconds so logs stay short.
class TokenProgress {
 public:
  TokenProgress(const char* label, uint64_t total)
      : label_(label), total_(total), tty_(::isatty(2) != 0), start_(std::chrono::steady_clock::now()), last_(start_) {}
  void update(uint64_t done, bool final_line = false) {
    const auto now = std::chrono::steady_clock::now();
    const double since = std::chrono::duration<double>(now - last_).count();
    if (!final_line && since < (tty_ ? 1.0 : 10.0)) return;
    last_ = now;
    const double secs = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "%scalibrate: %s %llu/%llu tokens (%.0f%%), %.0f tok/s%s", tty_ ? "\r" : "", label_,
                 static_cast<unsigned long long>(done), static_cast<unsigned long long>(total_),
                 total_ ? 100.0 * static_cast<double>(done) / static_cast<double>(total_) : 100.0,
                 secs > 0 ? static_cast<double>(done) / secs : 0.0, tty_ && !final_line ? "" : "\n");
  }

 private:
  const char* label_;
  uint64_t total_;
  bool tty_;
  std::chrono::steady_clock::time_point start_, last_;
};

void count_part(strata::Sequence& session, const strata::CorpusPart& part, int ctx, strata::RoutingCounts& counts,
                const char* label, strata::ChunkTrace& trace) {
  TokenProgress progress(label, part.n_tokens());
  strata::count_routes(session, part, ctx, counts, [&](uint64_t done) { progress.update(done); }, &trace);
  progress.update(part.n_tokens(), true);
}

std::string percent(double rate) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * rate);
  return buf;
}

// The training / held-out parts as the report names them: documents of a corpus, or a routing source.
struct ReportParts {
  std::vector<std::string> train_names, heldout_names;
  size_t train_docs = 0, heldout_docs = 0;
  uint64_t train_tokens = 0;
  std::string routing;  // the replayed source, or "" for text
};

ReportParts parts_of(const strata::CorpusSplit& split) {
  return {split.train.names, split.heldout.names, split.train.docs.size(), split.heldout.docs.size(),
          split.train.n_tokens(), ""};
}

void print_text_report(const strata::ModelIdentity& id, const ReportParts& split, const std::string& output,
                       const std::string& heldout_counts, uint64_t heldout_tokens,
                       const std::vector<strata::BudgetComparison>& results) {
  std::printf("model: %s (%s, fingerprint %s), %d layers x %d experts, top-%d\n", id.name.c_str(), id.arch.c_str(),
              id.fingerprint.c_str(), id.n_layer, id.n_expert, id.n_expert_used);
  const auto train_tokens = static_cast<unsigned long long>(split.train_tokens);
  const auto held_tokens = static_cast<unsigned long long>(heldout_tokens);
  if (!split.routing.empty()) {
    std::printf("routing: %s drove the counts (the model was not run): training %llu tokens; held-out the next "
                "%llu\n",
                split.routing.c_str(), train_tokens, held_tokens);
  } else if (heldout_counts.empty()) {
    std::printf("training: %zu doc(s), %llu tokens; held-out: %zu doc(s), %llu tokens\n", split.train_docs,
                train_tokens, split.heldout_docs, held_tokens);
  } else {
    std::printf("training: %zu doc(s), %llu tokens; held-out: counts from %s, %llu tokens\n", split.train_docs,
                train_tokens, heldout_counts.c_str(), held_tokens);
  }
  std::printf("profile written: %s\n", output.c_str());
  if (results.empty()) return;
  std::printf("\ncold-hit rate (fraction of expert picks served by the CPU; lower is better)\n");
  std::printf("%-18s | %-35s | %s\n", "", "held-out", "training (the profile's own data)");
  std::printf("%-7s %-10s | %8s %8s %8s %8s | %8s %8s %8s\n", "budget", "bytes", "profile", "uniform", "by-layer",
              "oracle", "profile", "uniform", "by-layer");
  for (const auto& b : results) {
    std::printf("%-7s %-10s | %8s %8s %8s %8s | %8s %8s %8s\n", (strata::cat(b.percent) + "%").c_str(),
                strata::format_binary_size(b.budget_bytes).c_str(), percent(b.methods[0].heldout_rate).c_str(),
                percent(b.methods[1].heldout_rate).c_str(), percent(b.methods[2].heldout_rate).c_str(),
                percent(b.methods[3].heldout_rate).c_str(), percent(b.methods[0].train_rate).c_str(),
                percent(b.methods[1].train_rate).c_str(), percent(b.methods[2].train_rate).c_str());
  }
  std::printf("(oracle: placed from the held-out counts themselves, the best any placement can do on them)\n");
  std::printf("\nper layer, held-out cold-hit %% (layers 0..%d; by-layer keeps the last layers on the GPU)\n",
              id.n_layer - 1);
  for (const auto& b : results) {
    for (const auto& m : b.methods) {
      std::string row;
      for (double r : m.heldout_per_layer) row += strata::cat(" ", static_cast<int>(std::lround(100.0 * r)));
      std::printf("%5s%% %-9s:%s\n", strata::cat(b.percent).c_str(), m.name.c_str(), row.c_str());
    }
  }
}

void print_json_report(const strata::ModelIdentity& id, const ReportParts& split, const std::string& output,
                       const std::string& heldout_counts, uint64_t heldout_tokens,
                       const std::vector<strata::BudgetComparison>& results) {
  nlohmann::json j;
  j["model"] = {{"name", id.name},         {"arch", id.arch},         {"fingerprint", id.fingerprint},
                {"n_layer", id.n_layer},   {"n_expert", id.n_expert}, {"n_expert_used", id.n_expert_used}};
  j["profile"] = output;
  j["train"] = {{"docs", split.train_names}, {"tokens", split.train_tokens}};
  j["heldout"] = {{"docs", split.heldout_names}, {"tokens", heldout_tokens}};
  if (!split.routing.empty()) j["routing"] = split.routing;
  if (!heldout_counts.empty()) j["heldout"]["counts_file"] = heldout_counts;
  j["budgets"] = nlohmann::json::array();
  for (const auto& b : results) {
    nlohmann::json jb = {{"percent", b.percent}, {"bytes", b.budget_bytes}};
    for (const auto& m : b.methods)
      jb[m.name] = {{"heldout_cold_hit_rate", m.heldout_rate},
                    {"train_cold_hit_rate", m.train_rate},
                    {"heldout_per_layer", m.heldout_per_layer},
                    {"hot_per_layer", m.plan.n_hot},
                    {"bytes_used", m.plan.bytes_used}};
    j["budgets"].push_back(jb);
  }
  std::printf("%s\n", j.dump(1).c_str());
}

// Counts n tokens of the source's picks into c (the model's layer numbering: traces hold routed layers).
void count_replayed(strata::RoutingSource& src, const std::vector<int>& routed, int n, strata::RoutingCounts& c) {
  const size_t stride = routed.size() * static_cast<size_t>(src.k());
  std::vector<int> picks(stride);
  for (int t = 0; t < n; ++t) {
    src.next(1, picks.data());
    for (size_t j = 0; j < routed.size(); ++j)
      for (int q = 0; q < src.k(); ++q) c.add(routed[j], picks[j * static_cast<size_t>(src.k()) + static_cast<size_t>(q)]);
    ++c.n_tokens;
  }
}

// calibrate --routing: the profile and the report from the source's picks (see the top of this file).
void run_calibrate_replayed(const CalibrateOptions& o, const std::vector<double>& percents) {
  if (!o.corpus.empty()) strata::fail("calibrate: --routing replaces the corpus; give one or the other");
  if (!o.heldout_counts.empty()) strata::fail("calibrate: --heldout-counts needs a corpus run, not --routing");
  if (o.backend.gpu) strata::fail("calibrate --routing runs no model: leave out --gpu");
  if (o.tokens < 1) strata::fail("--tokens must be >= 1, got ", o.tokens);
  if (!(o.holdout >= 0.0 && o.holdout < 1.0)) strata::fail("--holdout must be in [0, 1), got ", o.holdout);
  auto model = strata::cli::load_model_for_cli(strata::cli::resolve_model_path(o.model));
  const strata::ModelIdentity id = strata::model_identity(*model);
  const auto source = strata::cli::open_routing_replay(*model, o.backend);
  const std::vector<int> routed = model->config().routed_layers();
  const int n_heldout = static_cast<int>(std::lround(o.holdout * o.tokens));
  strata::RoutingCounts train, heldout;
  train.reset(id.n_layer, id.n_expert);
  heldout.reset(id.n_layer, id.n_expert);
  count_replayed(*source, routed, o.tokens - n_heldout, train);
  strata::save_profile_atomic(o.output, id, train);
  if (!o.plot.empty()) {
    strata::write_routing_heatmap(o.plot, train, "routing of " + id.name + " (" + source->label() + ")");
    std::fprintf(stderr, "calibrate: heatmap written: %s\n", o.plot.c_str());
  }
  count_replayed(*source, routed, n_heldout, heldout);
  std::vector<strata::BudgetComparison> results;
  if (heldout.n_tokens > 0) {
    const strata::ModelFootprint fp = strata::model_footprint(*model, o.ctx, 1);
    results = strata::compare_placements(fp.expert_bytes, train, heldout, id.n_expert_used, percents);
  }
  ReportParts parts;
  parts.routing = source->label();
  parts.train_tokens = train.n_tokens;
  if (o.json) {
    print_json_report(id, parts, o.output, "", heldout.n_tokens, results);
  } else {
    print_text_report(id, parts, o.output, "", heldout.n_tokens, results);
  }
}

void run_calibrate(const CalibrateOptions& o) {
  if (!o.backend.routing.empty()) {
    if (o.output.empty()) strata::fail("calibrate: give the profile to write with -o PROFILE");
    strata::cli::check_backend_options(o.backend);
    run_calibrate_replayed(o, strata::parse_percent_list(o.budgets, "--budget"));
    return;
  }
  if (o.tokens_given) strata::fail("--tokens needs --routing");
  if (o.corpus.empty()) strata::fail("calibrate: give at least one --corpus FILE");
  if (o.output.empty()) strata::fail("calibrate: give the profile to write with -o PROFILE");
  if (o.ctx <= 0) strata::fail("--ctx must be > 0, got ", o.ctx);
  if (!o.plot.empty() && (o.plot.size() < 5 || o.plot.compare(o.plot.size() - 4, 4, ".svg") != 0))
    strata::fail("--plot: the heatmap is an SVG file; give a name ending in .svg, got '", o.plot, "'");
  strata::cli::check_backend_options(o.backend);
  const std::vector<double> percents = strata::parse_percent_list(o.budgets, "--budget");

  auto model = strata::cli::load_model_for_cli(strata::cli::resolve_model_path(o.model));
  strata::cli::set_threads_for_model(o.threads, *model);
  auto tokenizer = strata::cli::load_tokenizer_for_cli(*model);
  const strata::ModelIdentity id = strata::model_identity(*model);

  // Tokenize each file as a document (special-token text in the corpus stays plain text).
  std::vector<std::vector<int32_t>> docs;
  std::vector<std::string> names;
  for (const std::string& path : o.corpus) {
    std::vector<int32_t> ids;
    if (tokenizer->vocab().add_bos && tokenizer->bos_id() >= 0) ids.push_back(tokenizer->bos_id());
    const std::vector<int32_t> body = tokenizer->encode(strata::cli::read_text_file(path, "corpus file"), false);
    ids.insert(ids.end(), body.begin(), body.end());
    docs.push_back(std::move(ids));
    names.push_back(base_name(path));
  }
  if (!o.heldout_counts.empty() && o.holdout_given && o.holdout > 0)
    strata::fail("give either --holdout or --heldout-counts, not both");
  const double holdout = o.heldout_counts.empty() ? o.holdout : 0.0;
  const strata::CorpusSplit split = strata::split_corpus(docs, names, holdout);

  // --collect-routing: each chunk (run from an empty state) one stream, training chunks first.
  const auto trace_file = strata::cli::open_routing_trace(*model, o.backend);
  strata::ChunkTrace trace{trace_file.get(), 0};
  strata::cli::SequenceFactory backend(*model, o.ctx, 1, o.backend, nullptr);
  const auto sequence = backend.make();
  strata::Sequence& session = *sequence;
  strata::RoutingCounts train, heldout;
  count_part(session, split.train, o.ctx, train, "training", trace);
  strata::save_profile_atomic(o.output, id, train);
  if (!o.plot.empty()) {
    strata::write_routing_heatmap(o.plot, train, "routing of " + id.name + " (calibrate, training part)");
    std::fprintf(stderr, "calibrate: heatmap written: %s\n", o.plot.c_str());
  }
  if (!o.heldout_counts.empty()) {
    heldout = strata::read_heldout_counts(o.heldout_counts, id);
  } else if (!split.heldout.docs.empty()) {
    count_part(session, split.heldout, o.ctx, heldout, "held-out", trace);
  }

  strata::cli::print_telemetry(session, o.backend, stderr);
  std::vector<strata::BudgetComparison> results;
  if (heldout.n_tokens > 0) {
    const strata::ModelFootprint fp = strata::model_footprint(*model, o.ctx, 1);
    results = strata::compare_placements(fp.expert_bytes, train, heldout, id.n_expert_used, percents);
  }
  if (o.json) {
    print_json_report(id, parts_of(split), o.output, o.heldout_counts, heldout.n_tokens, results);
  } else {
    print_text_report(id, parts_of(split), o.output, o.heldout_counts, heldout.n_tokens, results);
  }
}

void setup_calibrate(CLI::App& sub) {
  auto o = std::make_shared<CalibrateOptions>();
  sub.add_option("-m,--model", o->model, "GGUF model file (default: the bundled model)");
  sub.add_option("--corpus", o->corpus, "text files to run through the model (each file is one document)")
      ->expected(1, -1);
  sub.add_option("--holdout", o->holdout,
                 "fraction held out for the report: the last files in the order given, or with one file its last "
                 "tokens (default 0.1; 0: no report)");
  sub.add_option("--budget", o->budgets, "expert budgets to report, percent of all expert bytes (default 25,50,75)");
  sub.add_option("--ctx", o->ctx, "tokens per forward chunk, each from an empty context (default 512)");
  sub.add_option("-o,--output", o->output, "routing profile to write (JSON)");
  sub.add_option("--heldout-counts", o->heldout_counts,
                 "report on these counts instead of held-out text: a routing profile of this model, or a "
                 "train_tiny routing_counts.json (e.g. models/routing_counts.json)");
  sub.add_option("--plot", o->plot,
                 "also draw the training counts as a heatmap (one row per layer, one cell per expert) to FILE.svg");
  sub.add_flag("--json", o->json, "print the report as JSON");
  strata::cli::add_thread_options(sub, o->threads);
  strata::cli::add_backend_options(sub, o->backend);
  strata::cli::add_collect_routing_option(sub, o->backend);
  sub.add_option("--routing", o->backend.routing,
                 "count a routing trace FILE or generate:NAME[:SEED] (" + strata::routing_setting_names() +
                     ") instead of running text through the model; the profile then describes that routing "
                     "(for bench --routing)");
  sub.add_option("--tokens", o->tokens, "with --routing: tokens of routing to count, held-out part included (default 4096)");
  // The profile calibrate writes is -o; the placement it would guide does not change the counts.
  sub.remove_option(sub.get_option("--profile"));
  sub.callback([o, &sub] {
    o->holdout_given = sub.get_option("--holdout")->count() > 0;
    o->tokens_given = sub.get_option("--tokens")->count() > 0;
    run_calibrate(*o);
  });
}

const bool registered = strata::cli::register_command(
    "calibrate", "Count expert routing over a corpus, write a routing profile, report placement quality",
    setup_calibrate);

}  // namespace
