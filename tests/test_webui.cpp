// The web page of `strata serve` (issue 26): its files and routes, the experts endpoint against
// /metrics, --no-webui, the page behind --api-key, the page itself driven in headless Chromium
// (tests/webui/drive.mjs), and the routing heatmap SVG of calibrate/routing-stats --plot.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>

#include "serve_process.h"
#include "strata/base/error.h"
#include "strata/moe/routing_heatmap.h"
#include "strata/serve/expert_stats.h"
#include "strata/serve/responses.h"
#include "strata/serve/webui.h"

namespace {

namespace fs = std::filesystem;
const std::string kKeyHeader = "Authorization: Bearer webui-key\r\n";

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A metric's value from /metrics text; -1 when the line is missing.
double metric_value(const std::string& metrics, const std::string& name) {
  std::istringstream in(metrics);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  return -1;
}

std::string temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("strata-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

TEST(WebUiAssets, SmallEmbeddedAndNothingFromOtherHosts) {
  size_t total = 0;
  for (const char* name : {"index.html", "app.css", "app.js"}) {
    const std::string source = read_file(fs::path(kSource) / "webui" / name);
    const strata::serve::WebAsset* a = strata::serve::find_webui_asset(name);
    ASSERT_NE(a, nullptr) << name;
    EXPECT_EQ(a->body, source) << name << " is not embedded as it is in webui/";
    total += a->body.size();
    // Every URL the page uses is relative: no CDN, no font or script from elsewhere.
    EXPECT_EQ(source.find("http://"), std::string::npos) << name;
    EXPECT_EQ(source.find("https://"), std::string::npos) << name;
    EXPECT_EQ(source.find("//cdn"), std::string::npos) << name;
  }
  EXPECT_EQ(strata::serve::webui_assets().size(), 3u);
  EXPECT_LT(total, 200u * 1024u) << "the page's files must add less than 200 KB to the binary";
  EXPECT_EQ(strata::serve::find_webui_asset("nope.js"), nullptr);
  EXPECT_STREQ(strata::serve::webui_content_type("app.js"), "text/javascript; charset=utf-8");
}

TEST(ExpertStatsTest, CountsPlacementColdHitsAndMetricsAgree) {
  using strata::serve::ExpertHome;
  strata::serve::ExpertStats s;
  s.reset(2, 4, 2);
  strata::RoutingCounts c;
  c.reset(2, 4);
  c.add(0, 0, 3), c.add(0, 1, 1), c.add(1, 2, 2), c.add(1, 3, 2);
  c.n_tokens = 2;
  s.add(c);
  strata::RoutingCounts odd;
  odd.reset(3, 4);
  s.add(odd);  // another shape is ignored, not fatal
  nlohmann::json j = nlohmann::json::parse(strata::serve::dump_json(s.json("cpu")));
  EXPECT_EQ(j["tokens"], 2);
  EXPECT_EQ(j["counts"][0][0], 3);
  EXPECT_TRUE(j["placement"].is_null());
  EXPECT_TRUE(j["cold_hit_rate"].is_null());
  EXPECT_EQ(s.metrics().find("strata_experts_placed{"), std::string::npos) << "no placement, no samples";

  strata::serve::ExpertPlacement p;
  p.home = {{ExpertHome::Gpu, ExpertHome::Gpu, ExpertHome::Cpu, ExpertHome::Cpu},
            {ExpertHome::Gpu, ExpertHome::Cache, ExpertHome::Cpu, ExpertHome::Gpu}};
  p.receipt = "receipt text";
  s.set_placement(p);
  j = nlohmann::json::parse(strata::serve::dump_json(s.json("gpu")));
  EXPECT_EQ(j["placement"][0][2], "cpu");
  EXPECT_EQ(j["placed"]["gpu"], 4);
  EXPECT_EQ(j["placed"]["cache"], 1);
  EXPECT_EQ(j["placed"]["cpu"], 3);
  EXPECT_EQ(j["receipt"], "receipt text");
  // Cold picks: layer 1 expert 2 (2 of 8 picks).
  EXPECT_DOUBLE_EQ(j["cold_hit_rate"].get<double>(), 0.25);
  const std::string m = s.metrics();
  EXPECT_EQ(metric_value(m, "strata_experts_placed{where=\"gpu\"}"), 4);
  EXPECT_EQ(metric_value(m, "strata_experts_placed{where=\"cache\"}"), 1);
  EXPECT_EQ(metric_value(m, "strata_experts_placed{where=\"cpu\"}"), 3);
  EXPECT_EQ(metric_value(m, "strata_expert_picks_total"), 8);
  EXPECT_DOUBLE_EQ(metric_value(m, "strata_expert_cold_hit_rate"), 0.25);
  const auto& tps = j["history"]["tokens_per_second"];
  ASSERT_EQ(tps.size(), static_cast<size_t>(strata::serve::ExpertStats::kWindowSeconds / strata::serve::ExpertStats::kBucketSeconds));
  EXPECT_GT(tps.back().get<double>(), 0) << "the latest bucket holds the tokens just added";

  p.home.pop_back();
  EXPECT_THROW(s.set_placement(p), strata::Error);
}

TEST(WebUiServe, PageWithoutKeyApiWithKeyAndExpertsMatchMetrics) {
  ASSERT_TRUE(file_exists(kModel)) << "missing " << kModel;
  ServerProcess server({"--api-key", "webui-key"});
  ASSERT_TRUE(server.wait_ready());
  const int port = server.port();
  const HttpResult page = http(port, "GET", "/");
  ASSERT_EQ(page.status, 200);
  EXPECT_NE(page.head.find("text/html"), std::string::npos);
  EXPECT_NE(page.head.find("Content-Security-Policy: default-src 'none'"), std::string::npos) << page.head;
  EXPECT_NE(page.body.find("webui/app.js"), std::string::npos);
  EXPECT_EQ(http(port, "GET", "/webui/app.js").status, 200);
  EXPECT_EQ(http(port, "GET", "/webui/app.css").status, 200);
  EXPECT_EQ(http(port, "GET", "/webui/missing.js").status, 404);
  EXPECT_NE(http(port, "GET", "/webui/../server").status, 200);
  // The data behind the page needs the key.
  EXPECT_EQ(http(port, "GET", "/v1/strata/experts").status, 401);
  EXPECT_EQ(http(port, "POST", "/webui/app.js", "{}").status, 401);

  const std::string chat = R"({"messages":[{"role":"user","content":"Hello there"}],"max_tokens":8})";
  ASSERT_EQ(http(port, "POST", "/v1/chat/completions", chat, kKeyHeader).status, 200);
  const HttpResult e = http(port, "GET", "/v1/strata/experts", "", kKeyHeader);
  ASSERT_EQ(e.status, 200) << e.body;
  const nlohmann::json j = nlohmann::json::parse(e.body);
  const int n_layer = j["n_layer"], n_expert = j["n_expert"], k = j["n_expert_used"];
  ASSERT_GT(n_layer, 0);
  ASSERT_GT(n_expert, 0);
  EXPECT_EQ(j["backend"], "cpu");
  EXPECT_TRUE(j["counting"].get<bool>());
  EXPECT_TRUE(j["placement"].is_null()) << "the CPU backend shows routing only";
  ASSERT_EQ(j["counts"].size(), static_cast<size_t>(n_layer));
  const uint64_t tokens = j["tokens"];
  EXPECT_GT(tokens, 0u);
  uint64_t picks = 0;
  for (const auto& row : j["counts"]) {
    ASSERT_EQ(row.size(), static_cast<size_t>(n_expert));
    uint64_t layer = 0;
    for (const auto& v : row) layer += v.get<uint64_t>();
    // Every token picks k experts in a layer with routed experts.
    if (layer > 0) {
      EXPECT_EQ(layer, tokens * static_cast<uint64_t>(k));
    }
    picks += layer;
  }
  const HttpResult m = http(port, "GET", "/metrics", "", kKeyHeader);
  EXPECT_EQ(metric_value(m.body, "strata_expert_picks_total"), static_cast<double>(picks));
  EXPECT_EQ(metric_value(m.body, "strata_expert_cold_hit_rate"), 0);
  EXPECT_EQ(m.body.find("strata_experts_placed{"), std::string::npos);
  EXPECT_NE(m.body.find("strata_http_requests_total{route=\"/v1/strata/experts\",code=\"200\"}"), std::string::npos);
  EXPECT_EQ(server.terminate(), 0);
}

TEST(WebUiServe, NoWebuiTurnsThePageOff) {
  ASSERT_TRUE(file_exists(kModel)) << "missing " << kModel;
  ServerProcess server({"--no-webui"});
  ASSERT_TRUE(server.wait_ready());
  const HttpResult page = http(server.port(), "GET", "/");
  EXPECT_EQ(page.status, 404);
  EXPECT_NE(page.body.find("unknown route"), std::string::npos) << page.body;
  EXPECT_EQ(http(server.port(), "GET", "/webui/app.js").status, 404);
  EXPECT_EQ(http(server.port(), "GET", "/v1/strata/experts").status, 200) << "the API stays";
  EXPECT_EQ(server.terminate(), 0);
}

std::string find_chromium() {
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser"})
    if (fs::exists(p)) return p;
  return "";
}

TEST(WebUiBrowser, ChatStreamsAndExpertsViewMatchesMetricsInHeadlessChromium) {
  const std::string chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "chromium is not installed (scripts/deps.sh installs Debian's chromium)";
  ASSERT_TRUE(file_exists(kModel)) << "missing " << kModel;
  ServerProcess server({"--api-key", "webui-key", "--ctx", "1024"});
  ASSERT_TRUE(server.wait_ready());
  // Screenshots of both views are kept with the build as the test's artifacts.
  const std::string artifacts = std::string(STRATA_BINARY_DIR) + "/test-artifacts";
  int code = 0;
  const std::string out = run_capture("node '" + kSource + "/tests/webui/drive.mjs' " + server.base_url() +
                                          " webui-key '" + artifacts + "' " + chromium,
                                      code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("\"ok\":true"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(artifacts + "/webui-chat.png"));
  EXPECT_TRUE(fs::exists(artifacts + "/webui-experts.png"));
  EXPECT_TRUE(server.alive());
}

TEST(RoutingHeatmap, SvgHasOneRowPerLayerOneCellPerExpertAndTheScale) {
  strata::RoutingCounts c;
  c.reset(3, 5);
  c.add(0, 1, 10), c.add(0, 2, 5), c.add(2, 4, 7);
  c.n_tokens = 11;
  const std::string svg = strata::routing_heatmap_svg(c, "a <test>");
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("<title>a &lt;test&gt;</title>"), std::string::npos);
  EXPECT_EQ(count_of(svg, "<g class=\"layer\""), 3u);
  EXPECT_EQ(count_of(svg, "<rect class=\"cell\""), 15u);
  EXPECT_EQ(count_of(svg, "<stop "), 4u);
  EXPECT_NE(svg.find("<g class=\"scale\">"), std::string::npos);
  // The hottest expert of a layer takes the top of the scale; an unpicked one its bottom.
  EXPECT_EQ(strata::heat_colour(1), "#facc15");
  EXPECT_EQ(strata::heat_colour(0), "#0d1b2a");
  EXPECT_EQ(strata::heat_colour(7.0), "#facc15");
  EXPECT_NE(svg.find("data-expert=\"1\" x=\"" + std::to_string(44 + 1 * (16 + 1)) + "\""), std::string::npos);
  EXPECT_NE(svg.find("fill=\"#facc15\"><title>layer 0, expert 1: 10 picks"), std::string::npos);
  EXPECT_NE(svg.find("fill=\"#0d1b2a\"><title>layer 1, expert 0: 0 picks"), std::string::npos);
  EXPECT_THROW(strata::routing_heatmap_svg(strata::RoutingCounts{}, "x"), strata::Error);
  EXPECT_THROW(strata::write_routing_heatmap("/tmp/heat.json", c, "x"), strata::Error);
}

TEST(RoutingHeatmap, CalibratePlotWritesTheProfileAsSvg) {
  ASSERT_TRUE(file_exists(kModel)) << "missing " << kModel;
  const std::string dir = temp_dir("plot");
  {
    std::ofstream doc(dir + "/doc.txt");
    for (int i = 0; i < 40; ++i) doc << "def add(a, b):\n    return a + b  # line " << i << "\n";
  }
  int code = 0;
  const std::string cmd = std::string(STRATA_CLI) + " calibrate -m " + kModel + " --corpus " + dir + "/doc.txt --holdout 0 -o " +
                          dir + "/p.json --plot " + dir + "/p.svg";
  const std::string out = run_capture(cmd, code);
  ASSERT_EQ(code, 0) << out;
  const std::string svg = read_file(dir + "/p.svg");
  const std::string meta = read_file(dir + "/p.json");
  const nlohmann::json profile = nlohmann::json::parse(meta);
  std::smatch shape;
  ASSERT_TRUE(std::regex_search(svg, shape, std::regex("(\\d+) layers x (\\d+) experts"))) << svg.substr(0, 400);
  const size_t n_layer = std::stoul(shape[1]), n_expert = std::stoul(shape[2]);
  EXPECT_GT(n_layer, 0u);
  EXPECT_EQ(count_of(svg, "<g class=\"layer\""), n_layer);
  EXPECT_EQ(count_of(svg, "<rect class=\"cell\""), n_layer * n_expert);
  EXPECT_EQ(count_of(svg, "<stop "), 4u);
  EXPECT_NE(svg.find("#facc15"), std::string::npos) << "some expert is the hottest of its layer";
  EXPECT_FALSE(profile.is_null());

  const std::string bad = run_capture(std::string(STRATA_CLI) + " calibrate -m " + kModel + " --corpus " + dir +
                                          "/doc.txt --holdout 0 -o " + dir + "/q.json --plot " + dir + "/q.png",
                                      code);
  EXPECT_NE(code, 0);
  EXPECT_NE(bad.find("name ending in .svg"), std::string::npos) << bad;
  EXPECT_FALSE(fs::exists(dir + "/q.json")) << "refused before any work";
  fs::remove_all(dir);
}

}  // namespace
