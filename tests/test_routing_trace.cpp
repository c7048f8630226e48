// Routing traces: the file format (round trip, and a clear failure on every kind of damage), recording
// from the CPU engine (every kept token, pending tokens only once kept, equal to the routing counts),
// replay (the replayed picks are the ones the experts run), and the command line around them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "strata/base/error.h"
#include "strata/convert/synth.h"
#include "strata/engine/model.h"
#include "strata/engine/routing_trace.h"
#include "strata/engine/session.h"
#include "strata/moe/backend_plan.h"
#include "strata/moe/routing_generator.h"
#include "process_temp_dir.h"

namespace fs = std::filesystem;
using strata::testing_cli::run_cli;

namespace {

fs::path temp_dir() { return process_temp_dir("strata_test_trace_"); }

std::string tiny_model() {
  static std::string cached;
  if (!cached.empty()) return cached;
  strata::convert::SynthOptions o;
  o.preset = "tiny-qwen35moe";
  o.quant = "q8_0";
  o.out_path = (temp_dir() / "tiny.gguf").string();
  strata::convert::synth_model(o);
  return cached = o.out_path;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const strata::Error& e) {
    return e.what();
  }
  return "no error";
}

strata::RoutingTrace small_trace() {
  strata::RoutingTrace t;
  t.header.n_layer = 2, t.header.n_expert = 6, t.header.k = 2;
  t.header.fingerprint = "0123456789abcdef";
  t.header.source = "test";
  t.streams.push_back({7, {0, 1, 2, 3, /**/ 4, 5, 0, 5}});
  t.streams.push_back({3, {1, 0, 3, 2}});
  return t;
}

}  // namespace

TEST(RoutingTrace, RoundTripKeepsEverything) {
  const strata::RoutingTrace t = small_trace();
  const strata::RoutingTrace r = strata::parse_routing_trace(strata::serialize_routing_trace(t), "mem");
  EXPECT_EQ(r.header.n_layer, 2);
  EXPECT_EQ(r.header.n_expert, 6);
  EXPECT_EQ(r.header.k, 2);
  EXPECT_EQ(r.header.fingerprint, "0123456789abcdef");
  EXPECT_EQ(r.header.source, "test");
  ASSERT_EQ(r.streams.size(), 2u);
  EXPECT_EQ(r.streams[0].id, 7u);
  EXPECT_EQ(r.streams[0].picks, t.streams[0].picks);
  EXPECT_EQ(r.streams[1].id, 3u);
  EXPECT_EQ(r.streams[1].picks, t.streams[1].picks);
  EXPECT_EQ(r.n_tokens(), 3u);
}

TEST(RoutingTrace, WideIdsAboveTwoHundredFiftySixExperts) {
  strata::RoutingTrace t;
  t.header.n_layer = 1, t.header.n_expert = 512, t.header.k = 2;
  t.streams.push_back({0, {511, 300, 0, 256}});
  const std::string bytes = strata::serialize_routing_trace(t);
  EXPECT_EQ(strata::parse_routing_trace(bytes, "mem").streams[0].picks, t.streams[0].picks);
}

TEST(RoutingTrace, DamagedFilesFailClearly) {
  const std::string good = strata::serialize_routing_trace(small_trace());
  auto parse = [](const std::string& b) { return error_of([&] { strata::parse_routing_trace(b, "t.trace"); }); };
  EXPECT_NE(parse("").find("no STRATRT1 magic"), std::string::npos);
  EXPECT_NE(parse("GGUF" + good.substr(4)).find("no STRATRT1 magic"), std::string::npos);
  std::string v = good;
  v[8] = 9;  // version
  EXPECT_NE(parse(v).find("version 9 is not supported"), std::string::npos);
  std::string shape = good;
  shape[20] = 7;  // k = 7 > n_expert = 6
  EXPECT_NE(parse(shape).find("corrupt: shape"), std::string::npos);
  // Every cut past the magic is reported as truncated, never read as a shorter trace.
  for (size_t cut = 8; cut < good.size(); ++cut) {  // shorter than the magic: not a trace at all
    const std::string e = parse(good.substr(0, cut));
    // The end of the header (a trace without records) and the end of the first record are valid files.
    if (cut == 56 || cut == 72) continue;
    EXPECT_NE(e.find("truncated"), std::string::npos) << "cut at " << cut << ": " << e;
    EXPECT_NE(e.find("t.trace: offset"), std::string::npos) << e;
  }
  std::string bad_id = good;
  bad_id[bad_id.size() - 1] = 6;  // expert 6 of 6
  EXPECT_NE(parse(bad_id).find("expert id 6 outside 0..5"), std::string::npos);
  std::string twice = good;
  twice[twice.size() - 1] = twice[twice.size() - 2];
  EXPECT_NE(parse(twice).find("picked twice"), std::string::npos);
  EXPECT_NE(error_of([] { strata::read_routing_trace("/nonexistent/x.trace"); }).find("cannot open"), std::string::npos);
}

TEST(RoutingTrace, ShapeMismatchIsRefused) {
  const strata::RoutingTrace t = small_trace();
  EXPECT_NO_THROW(strata::check_trace_shape(t.header, 2, 6, 2, "x"));
  EXPECT_NE(error_of([&] { strata::check_trace_shape(t.header, 3, 6, 2, "--routing f"); })
                .find("--routing f: a trace of 2 layers x 6 experts top-2 does not fit the model (3 layers"),
            std::string::npos);
}

TEST(RoutingTrace, WriterAppendsReadableRecordsAndRejectsBadPicks) {
  const std::string path = (temp_dir() / "w.trace").string();
  strata::RoutingTraceHeader h;
  h.n_layer = 2, h.n_expert = 6, h.k = 2;
  {
    strata::RoutingTraceWriter w(path, h);
    const int a[] = {0, 1, 2, 3};
    const int b[] = {5, 4, 3, 2, 1, 0, 2, 4};
    w.append(1, a, 1);
    w.append(2, b, 2);
    w.append(1, a, 1);
    const int dup[] = {1, 1, 2, 3};
    EXPECT_NE(error_of([&] { w.append(1, dup, 1); }).find("picked twice"), std::string::npos);
    EXPECT_EQ(w.tokens_written(), 4u);
  }
  const strata::RoutingTrace r = strata::read_routing_trace(path);
  ASSERT_EQ(r.streams.size(), 2u);
  EXPECT_EQ(r.streams[0].picks, (std::vector<uint16_t>{0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(r.streams[1].picks, (std::vector<uint16_t>{5, 4, 3, 2, 1, 0, 2, 4}));
}

// A backend's picks by model layer become the trace's routed layers: a dense layer's rows are skipped.
TEST(RoutingTrace, LayerPicksKeepTheRoutedLayers) {
  strata::ModelConfig c;
  c.n_layer = 3, c.n_expert = 6, c.n_expert_used = 2;
  c.layers.resize(3);
  c.layers[1].ffn = strata::FfnKind::Dense;
  strata::RoutingTraceHeader h;
  h.n_layer = 2, h.n_expert = 6, h.k = 2;
  EXPECT_NO_THROW(strata::check_trace_fits(h, c));
  h.n_layer = 3;
  EXPECT_NE(error_of([&] { strata::check_trace_fits(h, c); }).find("does not fit the model"), std::string::npos);
  h.n_layer = 2;
  const std::string path = (temp_dir() / "layers.trace").string();
  {
    strata::RoutingTraceWriter w(path, h);
    // Two tokens x 3 layers x k: the dense layer's rows hold junk that must not reach the file.
    const std::vector<int> picks = {0, 1, 99, 99, 2, 3, /* token 1 */ 4, 5, -7, 99, 1, 0};
    strata::append_layer_picks(w, 4, c, picks.data(), 2);
  }
  const auto t = strata::read_routing_trace(path);
  ASSERT_EQ(t.streams.size(), 1u);
  EXPECT_EQ(t.streams[0].id, 4u);
  EXPECT_EQ(std::vector<int>(t.streams[0].picks.begin(), t.streams[0].picks.end()),
            (std::vector<int>{0, 1, 2, 3, 4, 5, 1, 0}));
}

TEST(RoutingTrace, ReplayWrapsAroundInStreamOrder) {
  strata::TraceReplay replay(small_trace(), "replayed t");
  std::vector<int> picks(4 * 4);
  replay.next(4, picks.data());
  EXPECT_EQ(picks, (std::vector<int>{0, 1, 2, 3, 4, 5, 0, 5, 1, 0, 3, 2, 0, 1, 2, 3}));
  EXPECT_TRUE(replay.wrapped());
}

// The CPU engine records every kept token: a chain as it runs, pending tokens only once kept (in
// kept order); the trace's picks add up to the routing counts of the same tokens.
TEST(RoutingTrace, SessionRecordsKeptTokensLikeTheCounts) {
  const auto model = strata::Model::load(tiny_model());
  const strata::ModelConfig& c = model->config();
  const std::string path = (temp_dir() / "s.trace").string();
  strata::RoutingTraceHeader h;
  h.n_layer = c.n_layer, h.n_expert = c.n_expert, h.k = c.n_expert_used;
  strata::RoutingCounts counts;
  {
    strata::RoutingTraceWriter w(path, h);
    strata::Session s(*model, 64);
    s.set_routing_trace(&w, 5);
    s.set_routing_counts(&counts);
    std::vector<float> logits(static_cast<size_t>(c.n_vocab) * 4);
    const int32_t prompt[] = {1, 2, 3, 4, 5};
    s.forward(prompt, 5, logits.data(), false);
    const int32_t draft[] = {6, 7, 8, 9};
    const int parents[] = {-1, 0, 0, 2};  // a tree: keep 0 -> 2 -> 3
    s.forward_pending(draft, 4, parents, logits.data());
    EXPECT_EQ(w.tokens_written(), 5u);  // nothing pending is written
    const int path_kept[] = {0, 2, 3};
    s.keep(path_kept, 3);
    s.set_routing_trace(&w, 6);
    const int32_t next = 10;
    s.forward(&next, 1, logits.data(), false);
    EXPECT_EQ(w.tokens_written(), 9u);
  }
  const strata::RoutingTrace r = strata::read_routing_trace(path);
  ASSERT_EQ(r.streams.size(), 2u);
  EXPECT_EQ(r.streams[0].id, 5u);
  EXPECT_EQ(r.streams[0].picks.size(), 8 * r.token_stride());
  EXPECT_EQ(r.streams[1].picks.size(), 1 * r.token_stride());
  strata::RoutingCounts from_trace;
  from_trace.reset(c.n_layer, c.n_expert);
  for (const auto& st : r.streams)
    for (size_t i = 0; i < st.picks.size(); ++i)
      from_trace.add(static_cast<int>((i / c.n_expert_used) % c.n_layer), st.picks[i]);
  EXPECT_EQ(from_trace.counts, counts.counts);

  // The kept pending tokens are recorded as if they had run as a chain.
  strata::Session chain(*model, 64);
  const std::string chain_path = (temp_dir() / "c.trace").string();
  {
    strata::RoutingTraceWriter w(chain_path, h);
    chain.set_routing_trace(&w, 5);
    std::vector<float> logits(static_cast<size_t>(c.n_vocab));
    const int32_t tokens[] = {1, 2, 3, 4, 5, 6, 8, 9};
    chain.forward(tokens, 8, logits.data(), false);
  }
  EXPECT_EQ(strata::read_routing_trace(chain_path).streams[0].picks, r.streams[0].picks);
}

TEST(RoutingTrace, ReplayedPicksDriveTheExperts) {
  const auto model = strata::Model::load(tiny_model());
  const strata::ModelConfig& c = model->config();
  strata::RoutingGenerator gen(strata::routing_setting("qwen3-30b-a3b-like"), c.n_layer, c.n_expert, c.n_expert_used, 3);
  strata::RoutingGenerator same(strata::routing_setting("qwen3-30b-a3b-like"), c.n_layer, c.n_expert, c.n_expert_used, 3);
  const std::string path = (temp_dir() / "r.trace").string();
  strata::RoutingTraceHeader h;
  h.n_layer = c.n_layer, h.n_expert = c.n_expert, h.k = c.n_expert_used;
  std::vector<float> routed(static_cast<size_t>(c.n_vocab)), replayed(routed.size());
  const int32_t tokens[] = {3, 1, 4, 1, 5, 9};
  {
    strata::Session plain(*model, 16);
    plain.forward(tokens, 6, routed.data(), false);
    strata::RoutingTraceWriter w(path, h);
    strata::Session s(*model, 16);
    s.set_routing_replay(&gen);
    s.set_routing_trace(&w, 0);
    s.forward(tokens, 6, replayed.data(), false);
  }
  std::vector<int> expected(6 * static_cast<size_t>(c.n_layer * c.n_expert_used));
  same.next(6, expected.data());
  const auto r = strata::read_routing_trace(path);
  EXPECT_EQ(std::vector<int>(r.streams[0].picks.begin(), r.streams[0].picks.end()), expected);
  EXPECT_NE(routed, replayed);  // other experts ran

  strata::RoutingGenerator wrong(strata::routing_setting("uniform"), c.n_layer + 1, c.n_expert, c.n_expert_used, 1);
  strata::Session s(*model, 16);
  EXPECT_NE(error_of([&] { s.set_routing_replay(&wrong); }).find("does not fit the model"), std::string::npos);
}

TEST(RoutingTrace, OptionsAreCheckedInOnePlace) {
  strata::BackendOptions o;
  o.gpu = true;
  o.collect_routing = "x.trace";
  EXPECT_NO_THROW(strata::check_backend_options(o));  // the GPU sessions record too
  o.routing = "generate:qwen3-30b-a3b-like";
  EXPECT_NE(error_of([&] { strata::check_backend_options(o); }).find("cannot be combined with --routing"),
            std::string::npos);
  o.collect_routing.clear();
  EXPECT_NO_THROW(strata::check_backend_options(o));  // the GPU sessions replay too
  o.gpu = false;
  EXPECT_NO_THROW(strata::check_backend_options(o));
  o.routing = "generate:nope";
  EXPECT_NE(error_of([&] { strata::check_backend_options(o); }).find("routing setting 'nope' is not known"), std::string::npos);
  o.routing = "generate:uniform:x";
  EXPECT_NE(error_of([&] { strata::check_backend_options(o); }).find("non-negative integer"), std::string::npos);
  EXPECT_EQ(strata::parse_routing_replay("generate:uniform:17").seed, 17u);
  EXPECT_EQ(strata::parse_routing_replay("some/file.trace").path, "some/file.trace");
}

// End to end: run records, routing-stats reads it, bench replays it and says so on every speed line.
TEST(RoutingTrace, CommandLine) {
  const std::string model = tiny_model();
  const std::string trace = (temp_dir() / "run.trace").string();
  auto r = run_cli("run -m " + model + " --prompt-tokens 1,2,3,4 -n 6 --print-token-ids --collect-routing " + trace);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto t = strata::read_routing_trace(trace);
  EXPECT_EQ(t.n_tokens(), 4u + 5u);  // the prompt and the generated tokens fed back (the last is not)
  EXPECT_EQ(t.header.fingerprint.size(), 16u);

  r = run_cli("routing-stats " + trace);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("static coverage"), std::string::npos);
  EXPECT_NE(r.out.find("9 tokens in 1 stream(s)"), std::string::npos) << r.out;
  r = run_cli("routing-stats --json " + trace);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"lru_slots\""), std::string::npos);

  r = run_cli("bench -m " + model + " -p 8 -n 4 -r 1 --triad-mib 8 --routing " + trace);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("pp8 (routing: replayed " + trace + ")"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tg4 (routing: replayed " + trace + ")"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ttft ms (p8) (routing: replayed"), std::string::npos) << r.out;
  r = run_cli("bench -m " + model + " -p 8 -n 4 -r 1 --triad-mib 8 --json --routing generate:qwen3-30b-a3b-like:5");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"routing\": \"generated qwen3-30b-a3b-like seed 5\""), std::string::npos) << r.out;

  r = run_cli("routing-stats " + model);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no STRATRT1 magic"), std::string::npos) << r.err;
  r = run_cli("routing-stats --seed 3 " + trace);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--seed needs --generate"), std::string::npos) << r.err;

  // The expert cache simulated on generated routing at a model's shape: a line per residency.
  r = run_cli("routing-stats --generate qwen3-30b-a3b-like --layers 3 --experts 64 --tokens 600 --cache-sim");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("shape: 3 layers x 64 experts, top-8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("expert cache, simulated"), std::string::npos) << r.out;
  for (const char* line : {"residency 25%: no cache", "residency 50%: no cache", "residency 75%: no cache"})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  EXPECT_NE(r.out.find("lfu 32:"), std::string::npos) << r.out;
  r = run_cli("routing-stats --generate uniform --cache-copy-experts 4");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--cache-copy-experts needs --cache-sim"), std::string::npos) << r.err;
  // The LFU knobs: taken with --cache-sim, refused without it, a half-life of 0 refused by the policy.
  r = run_cli(
      "routing-stats --generate laguna-xs2-like --layers 3 --experts 64 --tokens 600 --cache-sim "
      "--cache-admit-margin 1e9 --cache-half-life 32");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("lfu 32:"), std::string::npos) << r.out;
  r = run_cli("routing-stats --generate uniform --cache-admit-margin 3");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--cache-admit-margin needs --cache-sim"), std::string::npos) << r.err;
  r = run_cli("routing-stats --generate uniform --tokens 200 --cache-sim --cache-half-life 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("half-life must be > 0"), std::string::npos) << r.err;
  r = run_cli("routing-stats " + trace + " --experts 16");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--experts needs --generate"), std::string::npos) << r.err;
}
