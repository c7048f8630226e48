// `strata bench -m FILE [-p 512] [-n 128] [-r 5] [-t N] [--json]`: prefill and decode tok/s
// and time to first token (median and spread over repetitions), like llama-bench, with the memory
// bandwidth floor printed beside each figure. The timed sequence comes from the same SequenceFactory
// as run and serve, with the same backend flags (--gpu, --gpu-mem, --expert-budget, --profile, ...),
// so bench measures what run would plan. When the plan is hybrid (issue 8: some experts on the CPU),
// the report adds the cold-hit rate, CPU/wait time per token and the hybrid floor.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/backend_cli.h"
#include "cli/command.h"
#include "cli/generation_cli.h"
#include "cli/spec_cli.h"
#include "strata/base/error.h"
#include "strata/engine/bench_backend.h"
#include "strata/engine/bench_report.h"
#include "strata/engine/cli_support.h"
#include "strata/engine/thread_policy.h"
#include "strata/engine/model.h"
#include "strata/spec/spec_bench.h"
#ifdef STRATA_HAVE_CUDA
#include "strata/cuda/bench_gpu.h"
#include "strata/cuda/gpu_session.h"
#include "strata/cuda/hybrid_bench.h"
#endif

namespace {

struct BenchArgs {
  std::string model;
  strata::BenchParams params;
  strata::cli::ThreadOptions threads;
  bool json = false;
  size_t triad_mib = 256;
  strata::cli::BackendOptions backend;
  strata::SpecOptions spec;
  std::string spec_prompt_file;
  std::string verify_cost;
};

// Code to edit: most of the answer is already in the prompt, where prompt lookup pays off.
constexpr const char* kCopyHeavyPrompt =
    "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values)\n\n\n"
    "def variance(values):\n    m = mean(values)\n    total = 0\n    for v in values:\n        total += (v - m) ** 2\n"
    "    return total / len(values)\n\n\n# The same two functions, with `values` renamed to `xs`:\n\n"
    "def mean(xs):\n    total = 0\n";

// --profile in bench: the routing profile the expert placement is made from, read only (null without one).
std::unique_ptr<strata::ProfileStore> read_bench_profile(const strata::Model& model,
                                                         const strata::cli::BackendOptions& bo) {
  auto profile = strata::cli::open_profile(model, bo);
  if (profile && !profile->loaded_existing())
    strata::fail(bo.profile, ": no such routing profile (bench only reads one)");
  return profile;
}

// bench --verify-cost: verifications of drafts of the given shapes against one decode step.
void run_verify_cost_command(const BenchArgs& a, const std::vector<strata::VerifyShape>& shapes) {
  const auto model = strata::cli::load_model_for_cli(a.model);
  const int max_ctx = strata::verify_cost_context(a.params.n_prompt, shapes, a.params.reps);
  const auto profile = read_bench_profile(*model, a.backend);
  strata::cli::SequenceFactory factory(*model, max_ctx, 1, a.backend, profile.get());
  const auto replay = strata::cli::open_routing_replay(*model, a.backend);
  if (!a.json)
    std::fprintf(stderr, "verify cost: %zu draft shapes after %d prompt tokens, %d repetitions (+1 warm-up)...\n",
                 shapes.size(), a.params.n_prompt, a.params.reps);
  const auto rows = strata::run_verify_cost(
      [&] {
        std::unique_ptr<strata::Sequence> s = factory.make();
        s->set_routing_replay(replay.get());
        return s;
      },
      a.params.n_prompt, shapes, a.params.reps, a.params.seed);
  if (a.json) {
    nlohmann::json doc = {{"model", a.model}, {"backend", factory.backend_name()}, {"n_prompt", a.params.n_prompt}};
    if (replay) doc["routing"] = replay->label();
    for (const auto& r : rows)
      doc["shapes"].push_back({{"draft", r.shape.label()},
                               {"tokens_verified", r.shape.n + 1},
                               {"main_path", r.shape.depth()},
                               {"verify_ms", r.verify_ms},
                               {"step_ms", r.step_ms}});
    std::printf("%s\n", doc.dump(2).c_str());
  } else {
    std::printf("model: %s (%s)%s\n%s", a.model.c_str(), factory.backend_name(),
                replay ? (" routing: " + replay->label()).c_str() : "", strata::format_verify_cost(rows).c_str());
  }
}

// bench --spec: greedy generation of a text prompt with and without the drafter.
void run_spec_bench_command(const BenchArgs& a, const strata::SpecChoice& choice) {
  const auto model = strata::cli::load_model_for_cli(a.model);
  const auto tokenizer = strata::cli::load_tokenizer_for_cli(*model);
  const std::string text = a.spec_prompt_file.empty() ? std::string(kCopyHeavyPrompt)
                                                      : strata::cli::read_text_file(a.spec_prompt_file, "--spec-prompt");
  std::vector<int32_t> prompt;
  if (tokenizer->vocab().add_bos && tokenizer->bos_id() >= 0) prompt.push_back(tokenizer->bos_id());
  const std::vector<int32_t> body = tokenizer->encode(text);
  prompt.insert(prompt.end(), body.begin(), body.end());
  if (prompt.empty()) strata::fail("--spec-prompt: the prompt is empty");
  const int max_ctx = static_cast<int>(prompt.size()) + a.params.n_gen + choice.params.draft_max + 16;
  const auto profile = read_bench_profile(*model, a.backend);
  strata::cli::SequenceFactory factory(*model, max_ctx, 1, a.backend, profile.get());
  const int32_t n_text = static_cast<int32_t>(std::min<int64_t>(model->config().n_vocab, tokenizer->n_vocab()));
  strata::SamplerParams greedy;
  greedy.temperature = 0;
  const auto drafter = strata::cli::make_cli_drafter(choice, a.spec, *model, max_ctx, greedy, n_text, a.backend);
  if (!a.json)
    std::fprintf(stderr, "speculative bench: %zu prompt tokens, %d generated, %d repetitions (+1 warm-up)...\n",
                 prompt.size(), a.params.n_gen, a.params.reps);
  const strata::SpecBenchResult r = strata::run_spec_bench([&] { return factory.make(); }, *tokenizer, prompt,
                                                           a.params.n_gen, a.params.reps, *drafter, choice.params);
  if (a.json) {
    nlohmann::json doc = {{"model", a.model},
                          {"backend", factory.backend_name()},
                          {"drafter", r.drafter},
                          {"draft_max", choice.params.draft_max},
                          {"prompt_tokens", prompt.size()},
                          {"n_gen", a.params.n_gen},
                          {"decode_tps_without", r.plain_tps.median},
                          {"decode_tps_with", r.spec_tps.median},
                          {"drafted", r.drafted},
                          {"accepted", r.accepted},
                          {"verifications", r.verifies},
                          {"verify_tokens", r.verify_tokens},
                          {"verify_ms", r.verify_ms},
                          {"step_ms", r.step_ms},
                          {"token_identical", r.same_tokens}};
    std::printf("%s\n", doc.dump(2).c_str());
  } else {
    std::printf("model: %s (%s)\n%s", a.model.c_str(), factory.backend_name(), strata::format_spec_bench(r).c_str());
  }
}

void setup_bench(CLI::App& sub) {
  auto a = std::make_shared<BenchArgs>();
  sub.add_option("-m,--model", a->model, "GGUF model file (default: the bundled model)");
  sub.add_option("-p,--n-prompt", a->params.n_prompt, "prompt tokens (default 512)");
  sub.add_option("-n,--n-gen", a->params.n_gen, "generated tokens (default 128)");
  sub.add_option("-r,--repetitions", a->params.reps, "repetitions (default 5)");
  sub.add_option("--seed", a->params.seed, "seed of the random prompt tokens (default 1234)");
  strata::cli::add_thread_options(sub, a->threads);
  sub.get_option("--threads")->description("CPU threads (default: the usable cores; capped at the cores)");
  sub.add_option("--triad-mib", a->triad_mib, "MiB per array of the bandwidth triad (default 256)");
  sub.add_flag("--json", a->json, "print JSON instead of the table");
  strata::cli::add_backend_options(sub, a->backend);
  strata::cli::add_routing_replay_option(sub, a->backend);
  strata::cli::add_spec_options(sub, a->spec);
  sub.add_option("--spec-prompt", a->spec_prompt_file,
                 "with --spec: a text prompt file (default: a built-in copy-heavy code prompt)");
  sub.add_option("--verify-cost", a->verify_cost,
                 "time verifying drafts of these shapes against one decode step, e.g. chain:2,4,8,16,tree:8,16,22 "
                 "(tree:N = a main chain of N/2 with a second candidate beside each; random tokens)");
  // Random prompt tokens would skew a profile: bench only reads it.
  sub.get_option("--profile")
      ->description("with --gpu: routing profile (strata calibrate) the expert placement is made from (read only)");
  sub.callback([a] {
    const strata::cli::BackendOptions& bo = a->backend;
    strata::cli::check_backend_options(bo);
    const strata::SpecChoice spec = strata::check_spec_options(a->spec);
    if (!bo.profile.empty() && !bo.gpu) strata::fail("--profile needs --gpu in bench (it only guides the expert placement)");
    if (!a->spec_prompt_file.empty() && spec.kind == strata::SpecKind::None) strata::fail("--spec-prompt needs --spec");
    if (spec.kind != strata::SpecKind::None && !bo.routing.empty())
      strata::fail("--spec runs the model's own routing: drop --routing");
    strata::cli::require_gpu_if_asked(bo);
    a->model = strata::cli::resolve_model_path(a->model);
    strata::apply_thread_policy({a->threads.threads, a->threads.force, 1, 0});
    if (!a->verify_cost.empty()) {
      if (spec.kind != strata::SpecKind::None) strata::fail("--verify-cost times shapes without a drafter: drop --spec");
      const std::vector<strata::VerifyShape> shapes = strata::parse_verify_shapes(a->verify_cost);
      run_verify_cost_command(*a, shapes);
      return;
    }
    if (spec.kind != strata::SpecKind::None) {
      run_spec_bench_command(*a, spec);
      return;
    }
    strata::BenchReport r;
    r.command_line = strata::own_command_line();
    r.date = strata::local_iso_datetime();
    r.cpu_model = strata::cpu_model_name();
    r.threads = omp_get_max_threads();
    r.params = a->params;
    r.model_path = a->model;

    const auto model = strata::Model::load(a->model);
    const auto& file = model->file();
    r.model_name = file.get_string_or("general.name", std::filesystem::path(a->model).filename().string());
    r.arch = model->config().arch_name;
    for (const auto& t : file.tensors()) {
      r.model_bytes += static_cast<double>(t.row_nbytes()) * static_cast<double>(t.n_rows());
      r.n_params += static_cast<double>(t.n_elements());
    }
    r.active = strata::count_active_bytes(file, model->config());
    const int max_ctx = a->params.n_prompt + a->params.n_gen + 1;
    if (bo.gpu) {
#ifdef STRATA_HAVE_CUDA
      // Before the plan: the copy's buffers are freed again, and the plan then sees the memory it may use.
      if (!a->json) std::fprintf(stderr, "measuring GPU memory bandwidth (device copy)...\n");
      r.bandwidth = strata::cuda::measure_gpu_copy_bandwidth();
#endif
    } else {
      if (!a->json) std::fprintf(stderr, "measuring host DRAM bandwidth (triad)...\n");
      r.bandwidth = strata::measure_triad_bandwidth(a->triad_mib << 20, 5);
    }
    const auto profile = read_bench_profile(*model, bo);
    strata::cli::SequenceFactory factory(*model, max_ctx, 1, bo, profile.get());
    const bool hybrid = factory.plan().gpu && factory.plan().gpu_plan.hybrid;
    strata::BandwidthResult host_bw;
    if (hybrid) {
      if (!a->json) std::fprintf(stderr, "measuring host DRAM bandwidth (triad) for the cold experts...\n");
      host_bw = strata::measure_triad_bandwidth(a->triad_mib << 20, 5);
    }
    strata::VramTiers tiers;
#ifdef STRATA_HAVE_CUDA
    tiers = strata::cuda::gpu_vram_by_tier;
#endif
    const auto replay = strata::cli::open_routing_replay(*model, bo);
    std::unique_ptr<strata::Sequence> sequence = factory.make();
    sequence->set_routing_replay(replay.get());
    if (replay) r.routing = replay->label();
    strata::SequenceBenchBackend backend(std::move(sequence), factory.backend_name(), tiers);
    r.backend = backend.name();
    if (!a->json) std::fprintf(stderr, "running %d repetitions (+1 warm-up)...\n", a->params.reps);
    r.run = strata::run_bench(backend, a->params);
    r.vram_by_tier = backend.vram_by_tier();
    std::string hybrid_text;
    nlohmann::json hybrid_json;
#ifdef STRATA_HAVE_CUDA
    if (hybrid) {
      auto& gpu = dynamic_cast<strata::cuda::GpuSession&>(backend.sequence());
      const auto plan = strata::cuda::hybrid_bench_plan(factory.plan().gpu_plan, model->config().n_expert_used);
      const auto n = strata::cuda::hybrid_bench_numbers(gpu.hybrid_telemetry(), plan, r.active, r.bandwidth.triad_gbs,
                                                        host_bw.triad_gbs);
      hybrid_text = strata::cuda::format_hybrid_bench(plan, n);
      if (!a->json) std::fprintf(stderr, "timing plain decode steps for the hybrid breakdown...\n");
      const int n_steps = std::min(64, std::max(1, a->params.n_gen));
      const auto dec = strata::cuda::measure_hybrid_decode(gpu, std::min(16, a->params.n_prompt), n_steps,
                                                           a->params.seed + 7);
      hybrid_text += strata::cuda::format_hybrid_decode(dec);
      const auto& t = n.telemetry;
      hybrid_json = {{"expert_budget", plan.budget_text},
                     {"budget_bytes", plan.budget_bytes},
                     {"hot_bytes", plan.hot_bytes},
                     {"all_expert_bytes", plan.all_expert_bytes},
                     {"hot_experts", plan.hot_experts},
                     {"all_experts", plan.all_experts},
                     {"placement_from", plan.hotness_source},
                     {"expected_cold_hit_rate", plan.expected_cold_hit},
                     {"cpu_threads", t.cpu_threads},
                     {"tokens", t.tokens},
                     {"picks", t.picks},
                     {"cold_picks", t.cold_picks},
                     {"cold_hit_rate", t.cold_hit_rate()},
                     {"cold_picks_per_layer", t.cold_picks_per_layer},
                     {"cpu_jobs", t.cpu_jobs},
                     {"cpu_cold_ms_per_token", n.cpu_ms_per_token},
                     {"gpu_wait_ms_per_token", n.wait_ms_per_token},
                     {"gpu_bytes_per_token", n.gpu_bytes_per_token},
                     {"cold_bytes_per_token", n.cold_bytes_per_token},
                     {"gpu_gbs", n.gpu_gbs},
                     {"host_gbs", n.cpu_gbs},
                     {"floor_tps", n.floor_tps},
                     {"decode_breakdown",
                      {{"tokens", dec.tokens},
                       {"wall_ms_per_token", dec.wall_ms_per_token},
                       {"gpu_ms_per_token", dec.gpu_ms_per_token},
                       {"wait_ms_per_token", dec.wait_ms_per_token},
                       {"cpu_cold_ms_per_token", dec.cpu_ms_per_token},
                       {"answer_ms_per_token", dec.answer_ms_per_token},
                       {"cold_picks_per_token", dec.cold_picks_per_token},
                       {"cold_hit_rate", dec.cold_hit_rate},
                       {"cold_picks_per_layer", dec.cold_picks_per_layer}}}};
      hybrid_json["prefill_stream"] = {{"note", t.stream_note},
                                       {"chunks", t.stream_chunks},
                                       {"layers", t.stream_layers},
                                       {"experts", t.stream_experts},
                                       {"bytes", t.stream_bytes}};
      if (t.cache_slots > 0) {
        const double per_token = t.tokens ? 1.0 / static_cast<double>(t.tokens) : 0.0;
        hybrid_json["expert_cache"] = {{"policy", t.cache_policy},
                                       {"admit_margin", t.cache_admit_margin},
                                       {"slots", t.cache_slots},
                                       {"hits", t.cache_hits},
                                       {"misses", t.cold_picks},
                                       {"hit_rate", t.cache_hit_rate()},
                                       {"hits_per_layer", t.cache_hits_per_layer},
                                       {"copies", t.cache_copies},
                                       {"copy_bytes", t.cache_copy_bytes},
                                       {"copy_bytes_per_token", static_cast<double>(t.cache_copy_bytes) * per_token},
                                       {"evictions", t.cache_evictions}};
      }
    }
#endif

    if (a->json) {
      if (hybrid) {
        nlohmann::json doc = nlohmann::json::parse(strata::format_bench_json(r));
        doc["hybrid"] = hybrid_json;
        std::printf("%s\n", doc.dump(2).c_str());
      } else {
        std::printf("%s\n", strata::format_bench_json(r).c_str());
      }
    } else {
      std::printf("%s", strata::format_bench_table(r).c_str());
      std::printf("%s", hybrid_text.c_str());
      if (replay)
        std::printf("routing: %s drove every expert pick (not the router); weights: the router's probabilities of "
                    "the replayed experts\n",
                    r.routing.c_str());
      std::printf("device: %s, %d threads; date %s\ncommand: %s\n", r.cpu_model.c_str(), r.threads, r.date.c_str(),
                  r.command_line.c_str());
    }
    strata::cli::print_telemetry(backend.sequence(), bo, stderr);
  });
}

const bool registered = strata::cli::register_command("bench", "Measure prefill/decode speed (like llama-bench)", setup_bench);

}  // namespace
