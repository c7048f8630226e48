// `strata serve --spec`: through the HTTP API of every shape, greedy answers with speculative decoding
// (n-gram lookup, a draft model) are those of a server without it; usage reports the drafted and
// accepted tokens consistently; a request's "speculative": false turns it off; bad values are 400s.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "serve_process.h"

namespace {

using nlohmann::json;

// A prompt that repeats itself, so lookup drafts get accepted; the chat shapes ask for something the
// bundled model answers at length (and repetitively).
const std::string kCode =
    "def area(width, height):\\n    return width * height\\n\\n\\ndef area(width, height):\\n    return width * height\\n\\n\\ndef";
const std::string kAsk = "Write a Python function that computes the area of a rectangle, twice.";

struct Answer {
  int status = 0;
  json body;
  std::string text;
  std::string raw;
};

// One request to `path` with `extra` fields (a JSON object's members, "" for none); the answer's text.
Answer ask(int port, const std::string& path, const std::string& extra = "") {
  std::string body;
  const std::string more = extra.empty() ? "" : "," + extra;
  if (path == "/v1/completions")
    body = "{\"prompt\":\"" + kCode + "\",\"max_tokens\":24,\"temperature\":0" + more + "}";
  else if (path == "/v1/chat/completions")
    body = "{\"messages\":[{\"role\":\"user\",\"content\":\"" + kAsk + "\"}],\"max_tokens\":24,\"temperature\":0" + more + "}";
  else if (path == "/v1/messages")
    body = "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"" + kAsk +
           "\"}],\"max_tokens\":24,\"temperature\":0" + more + "}";
  else
    body = "{\"input\":\"" + kAsk + "\",\"max_output_tokens\":24,\"temperature\":0" + more + "}";
  const HttpResult r = http(port, "POST", path, body);
  Answer a;
  a.status = r.status;
  a.raw = r.body;
  if (r.status != 200) return a;
  a.body = json::parse(r.body);
  if (path == "/v1/completions") a.text = a.body["choices"][0]["text"];
  else if (path == "/v1/chat/completions") a.text = a.body["choices"][0]["message"]["content"];
  else if (path == "/v1/messages") a.text = a.body["content"][0]["text"];
  else a.text = a.body["output"].back()["content"][0]["text"];
  return a;
}

const std::vector<std::string> kPaths = {"/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses"};

// The usage's speculative counts, checked for consistency; returns {drafted, accepted}.
std::pair<int, int> speculative_usage(const Answer& a, const std::string& path, const std::string& drafter) {
  const json& u = a.body["usage"];
  EXPECT_TRUE(u.contains("speculative")) << path << ": " << a.raw;
  if (!u.contains("speculative")) return {0, 0};
  const json& s = u["speculative"];
  EXPECT_EQ(s["drafter"], drafter) << path;
  const int drafted = s["drafted_tokens"], accepted = s["accepted_tokens"];
  EXPECT_GE(drafted, accepted) << path;
  EXPECT_GE(accepted, 0) << path;
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    const json& d = u["completion_tokens_details"];
    EXPECT_EQ(d["accepted_prediction_tokens"], accepted) << path;
    EXPECT_EQ(d["rejected_prediction_tokens"], drafted - accepted) << path;
  }
  return {drafted, accepted};
}

class ServeSpec : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    plain_ = new ServerProcess({"--slots", "1", "-t", "1"});
    ngram_ = new ServerProcess({"--slots", "2", "-t", "2", "--spec", "ngram", "--draft-max", "4"});
    // The bundled model as its own draft: every draft is accepted.
    draft_ = new ServerProcess({"--slots", "2", "-t", "2", "-md", kModel, "--draft-max", "3"});
    for (ServerProcess* s : {plain_, ngram_, draft_}) ASSERT_TRUE(s->wait_ready());
  }
  static void TearDownTestSuite() {
    for (ServerProcess* s : {plain_, ngram_, draft_}) delete s;
  }
  static ServerProcess* plain_;
  static ServerProcess* ngram_;
  static ServerProcess* draft_;
};
ServerProcess* ServeSpec::plain_ = nullptr;
ServerProcess* ServeSpec::ngram_ = nullptr;
ServerProcess* ServeSpec::draft_ = nullptr;

TEST_F(ServeSpec, GreedyAnswersAreThoseWithoutSpeculation) {
  int ngram_accepted = 0;
  for (const std::string& path : kPaths) {
    const Answer want = ask(plain_->port(), path);
    ASSERT_EQ(want.status, 200) << path << ": " << want.raw;
    EXPECT_FALSE(want.body["usage"].contains("speculative")) << path;
    EXPECT_GT(want.body["usage"].contains("completion_tokens") ? want.body["usage"]["completion_tokens"] : want.body["usage"]["output_tokens"], 8) << path;

    const Answer ng = ask(ngram_->port(), path);
    ASSERT_EQ(ng.status, 200) << path << ": " << ng.raw;
    EXPECT_EQ(ng.text, want.text) << path;
    ngram_accepted += speculative_usage(ng, path, "ngram").second;

    const Answer dm = ask(draft_->port(), path);
    ASSERT_EQ(dm.status, 200) << path << ": " << dm.raw;
    EXPECT_EQ(dm.text, want.text) << path;
    const auto [drafted, accepted] = speculative_usage(dm, path, "draft");
    EXPECT_GT(drafted, 0) << path;
    EXPECT_EQ(accepted, drafted) << path << ": the model drafting for itself";

    // The same request again: the slot's drafter state carries over without changing the answer.
    const Answer again = ask(draft_->port(), path);
    EXPECT_EQ(again.text, want.text) << path;
  }
  EXPECT_GT(ngram_accepted, 0) << "lookup on a repeating prompt";
}

TEST_F(ServeSpec, RequestTurnsSpeculationOff) {
  for (const std::string& path : kPaths) {
    const Answer want = ask(plain_->port(), path);
    const Answer off = ask(ngram_->port(), path, "\"speculative\":false");
    ASSERT_EQ(off.status, 200) << path << ": " << off.raw;
    EXPECT_EQ(off.text, want.text) << path;
    EXPECT_FALSE(off.body["usage"].contains("speculative")) << path;
    EXPECT_FALSE(off.body["usage"].contains("completion_tokens_details")) << path;
    const Answer on = ask(ngram_->port(), path, "\"speculative\":true");
    ASSERT_EQ(on.status, 200) << path << ": " << on.raw;
    speculative_usage(on, path, "ngram");
  }
}

TEST_F(ServeSpec, BadSwitchIsRefused) {
  for (const std::string& path : kPaths) {
    for (const char* bad : {"\"speculative\":\"no\"", "\"speculative\":0"}) {
      const Answer a = ask(ngram_->port(), path, bad);
      EXPECT_EQ(a.status, 400) << path << " " << bad << ": " << a.raw;
      EXPECT_NE(a.raw.find("speculative"), std::string::npos) << a.raw;
    }
    // Asking for speculation from a server without a drafter.
    const Answer a = ask(plain_->port(), path, "\"speculative\":true");
    EXPECT_EQ(a.status, 400) << path << ": " << a.raw;
    EXPECT_NE(a.raw.find("--spec"), std::string::npos) << a.raw;
  }
  EXPECT_EQ(http(ngram_->port(), "GET", "/health").status, 200) << "the server outlives bad requests";
}

TEST(ServeSpecCli, BadOptionsAreRefusedAtStart) {
  ASSERT_TRUE(file_exists(kModel));
  int code = 0;
  const std::string r = run_capture(std::string(STRATA_CLI) + " serve --port 0 --spec draft:", code);
  EXPECT_NE(code, 0);
  EXPECT_NE(r.find("--spec draft:FILE needs a file name"), std::string::npos) << r;
  const std::string m = run_capture(std::string(STRATA_CLI) + " serve --port 0 --spec ngram --draft-max 0", code);
  EXPECT_NE(code, 0);
  EXPECT_NE(m.find("--draft-max"), std::string::npos) << m;
}

}  // namespace
