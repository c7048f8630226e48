#include "strata/engine/bench_report.h"

#include <cstdio>
#include <ctime>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

namespace strata {

double BenchReport::decode_floor_tps() const {
  return bandwidth.triad_gbs * 1e9 / active.decode_per_token();
}
double BenchReport::prefill_floor_tps() const {
  return params.n_prompt / (active.prefill(params.n_prompt) / (bandwidth.triad_gbs * 1e9));
}
double BenchReport::ttft_floor_ms() const { return 1e3 * active.prefill(params.n_prompt) / (bandwidth.triad_gbs * 1e9); }

namespace {

std::string fmt(const char* f, double a, double b = 0) {
  char buf[128];
  std::snprintf(buf, sizeof buf, f, a, b);
  return buf;
}

std::string human_bytes(double b) {
  return b >= 1073741824.0 ? fmt("%.2f GiB", b / 1073741824.0) : fmt("%.2f MiB", b / 1048576.0);
}

std::string human_params(double n) {
  return n >= 1e9 ? fmt("%.2f B", n / 1e9) : fmt("%.2f M", n / 1e6);
}

nlohmann::json stats_json(const Stats& s, const char* unit, double floor) {
  return {{"unit", unit}, {"median", s.median}, {"mean", s.mean}, {"stddev", s.stddev}, {"min", s.min},
          {"max", s.max}, {"samples", s.values}, {"floor", floor}};
}

}  // namespace

std::string format_bench_table(const BenchReport& r) {
  std::string out;
  out += "| model | size | params | backend | threads | test | t/s (median +- sd) | min..max | floor t/s |\n";
  out += "| --- | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: |\n";
  const std::string head = "| " + r.model_name + " | " + human_bytes(r.model_bytes) + " | " + human_params(r.n_params) +
                           " | " + r.backend + " | " + std::to_string(r.threads) + " | ";
  const std::string routed = r.routing.empty() ? "" : " (routing: " + r.routing + ")";
  auto row = [&](const std::string& test, const Stats& s, double floor, const char* unitfmt) {
    out += head + test + routed + " | " + fmt(unitfmt, s.median, s.stddev) + " | " + fmt("%.2f..%.2f", s.min, s.max) + " | " +
           fmt("%.2f", floor) + " |\n";
  };
  row("pp" + std::to_string(r.params.n_prompt), summarize(r.run.prefill_tps), r.prefill_floor_tps(), "%.2f +- %.2f");
  if (!r.run.decode_tps.empty())
    row("tg" + std::to_string(r.params.n_gen), summarize(r.run.decode_tps), r.decode_floor_tps(), "%.2f +- %.2f");
  const Stats t = summarize(r.run.ttft_ms);
  out += head + "ttft ms (p" + std::to_string(r.params.n_prompt) + ")" + routed + " | " + fmt("%.2f +- %.2f", t.median, t.stddev) +
         " | " + fmt("%.2f..%.2f", t.min, t.max) + " | " + fmt("%.2f", r.ttft_floor_ms()) + " |\n";
  out += "\n";
  out += "floors: " + r.bandwidth.source + fmt(" %.1f GB/s", r.bandwidth.triad_gbs) + " (" + std::to_string(r.bandwidth.threads) +
         " threads, 3 x " + human_bytes(static_cast<double>(r.bandwidth.array_bytes)) + " arrays, best of " +
         std::to_string(r.bandwidth.passes) + ")\n";
  out += "  decode reads " + human_bytes(r.active.decode_per_token()) + " per token (dense " + human_bytes(r.active.dense) +
         " + lm_head " + human_bytes(r.active.output) + " + experts " +
         human_bytes(r.active.experts_all * r.active.expert_fraction) + " = " +
         fmt("%.4f", r.active.expert_fraction) + " of " + human_bytes(r.active.experts_all) + "; KV/state traffic not counted)\n";
  out += std::string("  decode: greedy steps, the arg-max picked ") +
         (r.run.greedy_on_device ? "on the device (only the token id is copied back, as llama-bench tg)\n"
                                 : "on the host from the copied logits\n");
  out += "  prefill/ttft floor: weights read once per prompt (" + human_bytes(r.active.prefill(r.params.n_prompt)) +
         "), compute not counted\n";
  out += "VRAM by tier: ";
  if (r.vram_by_tier.empty()) {
    out += r.backend + " backend: none\n";
  } else {
    for (const auto& [tier, bytes] : r.vram_by_tier) out += tier + " " + human_bytes(static_cast<double>(bytes)) + "  ";
    out += "\n";
  }
  return out;
}

std::string format_bench_json(const BenchReport& r) {
  nlohmann::json j;
  j["command_line"] = r.command_line;
  j["date"] = r.date;
  j["cpu_model"] = r.cpu_model;
  j["threads"] = r.threads;
  j["backend"] = r.backend;
  j["model"] = {{"path", r.model_path}, {"name", r.model_name}, {"arch", r.arch}, {"tensor_bytes", r.model_bytes},
                {"params", r.n_params}};
  j["params"] = {{"n_prompt", r.params.n_prompt}, {"n_gen", r.params.n_gen}, {"reps", r.params.reps},
                 {"seed", r.params.seed}, {"warmup", r.params.warmup}};
  j["bandwidth"] = {{"triad_gbs", r.bandwidth.triad_gbs}, {"array_bytes", r.bandwidth.array_bytes},
                    {"threads", r.bandwidth.threads}, {"passes", r.bandwidth.passes}, {"source", r.bandwidth.source}};
  j["active_bytes"] = {{"dense", r.active.dense}, {"embd_row", r.active.embd_row}, {"output", r.active.output},
                       {"experts_all", r.active.experts_all}, {"expert_fraction", r.active.expert_fraction},
                       {"decode_per_token", r.active.decode_per_token()},
                       {"prefill", r.active.prefill(r.params.n_prompt)}};
  j["results"]["prefill"] = stats_json(summarize(r.run.prefill_tps), "tok/s", r.prefill_floor_tps());
  j["results"]["ttft"] = stats_json(summarize(r.run.ttft_ms), "ms", r.ttft_floor_ms());
  if (!r.run.decode_tps.empty())
    j["results"]["decode"] = stats_json(summarize(r.run.decode_tps), "tok/s", r.decode_floor_tps());
  else
    j["results"]["decode"] = nullptr;
  j["routing"] = r.routing.empty() ? "router" : r.routing;
  if (!r.routing.empty())
    for (const char* key : {"prefill", "ttft", "decode"})
      if (!j["results"][key].is_null()) j["results"][key]["routing"] = r.routing;
  if (r.vram_by_tier.empty()) {
    j["vram_by_tier"] = nullptr;
    j["vram_note"] = r.backend + " backend: none";
  } else {
    nlohmann::json v = nlohmann::json::object();
    for (const auto& [tier, bytes] : r.vram_by_tier) v[tier] = bytes;
    j["vram_by_tier"] = v;
  }
  return j.dump(2);
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "unknown";
}

std::string own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string out;
  std::string arg;
  for (char c : raw) {
    if (c != '\0') {
      arg += c;
      continue;
    }
    if (!out.empty()) out += ' ';
    const bool quote = arg.find(' ') != std::string::npos;
    if (quote) out += '\'';
    out += arg;
    if (quote) out += '\'';
    arg.clear();
  }
  return out;
}

std::string local_iso_datetime() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S%z", &tm);
  return buf;
}

}  // namespace strata
