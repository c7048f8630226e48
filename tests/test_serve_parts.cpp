// The server's pure parts, without HTTP: the streamed reasoning/content/tool-call splitter against
// parse_assistant_output on the whole text, and the request parser's checks.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

#include "strata/serve/api_error.h"
#include "strata/serve/assistant_stream.h"
#include "strata/serve/requests.h"
#include "strata/serve/responses.h"
#include "strata/text/chat_template.h"

namespace {

using strata::serve::AssistantStreamSplitter;

// Feeds `text` in random pieces; returns the concatenated deltas and the tool calls.
struct Streamed {
  std::string reasoning, content;
  std::vector<strata::ToolCall> calls;
};
Streamed stream_in_pieces(const std::string& text, bool tools, uint32_t seed) {
  std::mt19937 rng(seed);
  AssistantStreamSplitter s(tools);
  Streamed out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t n = std::min<size_t>(text.size() - pos, 1 + rng() % 5);
    const auto d = s.push(std::string_view(text).substr(pos, n));
    out.reasoning += d.reasoning;
    out.content += d.content;
    pos += n;
  }
  auto f = s.finish();
  out.reasoning += f.delta.reasoning;
  out.content += f.delta.content;
  out.calls = f.tool_calls;
  return out;
}

TEST(AssistantStream, MatchesWholeTextParse) {
  const std::vector<std::string> texts = {
      "<think>\nI should greet.\n</think>\n\nHello there!",
      "Just an answer, no thinking.",
      "<think>\nstill thinking when it stopped",
      "<think>\n\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
      "<think>\nplan\n</think>\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>",
      "<tool_call>\nnot json\n</tool_call>",
      "text with a < sign and <thin partial tags",
  };
  for (const std::string& t : texts) {
    const strata::AssistantOutput ref = strata::parse_assistant_output(t);
    for (uint32_t seed = 1; seed <= 20; ++seed) {
      const Streamed s = stream_in_pieces(t, true, seed);
      EXPECT_EQ(s.reasoning, ref.reasoning_content) << t;
      EXPECT_EQ(s.content, ref.content) << t;
      ASSERT_EQ(s.calls.size(), ref.tool_calls.size()) << t;
      for (size_t i = 0; i < s.calls.size(); ++i) {
        EXPECT_EQ(s.calls[i].name, ref.tool_calls[i].name);
        EXPECT_EQ(s.calls[i].arguments, ref.tool_calls[i].arguments);
      }
    }
  }
}

TEST(AssistantStream, WithoutToolsToolCallTextStaysContent) {
  const std::string t = "<tool_call>\n{\"name\": \"a\"}\n</tool_call>";
  const Streamed s = stream_in_pieces(t, false, 3);
  EXPECT_EQ(s.content, t);
  EXPECT_TRUE(s.calls.empty());
}

int status_of(const std::string& body) {
  try {
    strata::serve::parse_chat_request(body, 1000);
  } catch (const strata::serve::ApiError& e) {
    return e.status;
  }
  return 200;
}

TEST(Requests, ChatFieldsAreParsedAndChecked) {
  const auto r = strata::serve::parse_chat_request(
      R"({"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
          "temperature":0.5,"top_p":0.9,"top_k":40,"min_p":0.05,"max_completion_tokens":7,"stop":"X","seed":-3,
          "presence_penalty":0.5,"frequency_penalty":-0.5,"logit_bias":{"12":-100},"stream":true,"stream_options":{"include_usage":true}})",
      1000);
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_FLOAT_EQ(r.gen.sampler.temperature, 0.5f);
  EXPECT_EQ(r.gen.sampler.top_k, 40);
  EXPECT_EQ(*r.gen.max_tokens, 7);
  EXPECT_EQ(r.gen.stop, std::vector<std::string>{"X"});
  EXPECT_EQ(*r.gen.sampler.seed, static_cast<uint64_t>(int64_t{-3}));
  EXPECT_FLOAT_EQ(r.gen.sampler.logit_bias.at(12), -100.0f);
  EXPECT_TRUE(r.gen.stream);
  EXPECT_TRUE(r.gen.include_usage);

  const std::string ok = R"({"messages":[{"role":"user","content":"x"}])";
  EXPECT_EQ(status_of(ok + "}"), 200);
  EXPECT_EQ(status_of(ok + R"(,"max_tokens":-1})"), 400);
  EXPECT_EQ(status_of(ok + R"(,"max_tokens":1.5})"), 400);
  EXPECT_EQ(status_of(ok + R"(,"max_tokens":99999999999})"), 400);
  EXPECT_EQ(status_of(ok + R"(,"temperature":"hot"})"), 400);
  EXPECT_EQ(status_of(ok + R"(,"logit_bias":{"1000":1}})"), 400);
  EXPECT_EQ(status_of(ok + R"(,"logit_bias":{"5":101}})"), 400);
  EXPECT_EQ(status_of(ok + R"(,"stop":["a","b","c","d","e"]})"), 400);
  EXPECT_EQ(status_of(ok + R"(,"tool_choice":"required"})"), 400);  // no tools
  EXPECT_EQ(status_of(ok + R"(,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}})"), 400);
  EXPECT_EQ(status_of(ok + R"(,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f"}}})"), 200);
  EXPECT_EQ(status_of(ok + R"(,"temperature":null})"), 200);  // null = not given
  EXPECT_EQ(status_of("{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\x28\"}]}"), 400);  // ill-formed UTF-8
}

// What the SDKs and LangChain send that OpenAI accepts.
TEST(Requests, FieldsClientsSendAreAccepted) {
  // A returned assistant message sent back whole (model_dump) carries null fields.
  const auto r = strata::serve::parse_chat_request(
      R"({"messages":[{"role":"user","content":"x"},
          {"role":"assistant","content":"hi","refusal":null,"function_call":null,"audio":null,"annotations":null,"tool_calls":null},
          {"role":"assistant","content":[{"type":"text","text":"a"},{"type":"refusal","refusal":"no"}]},
          {"role":"user","content":"y"}],"reasoning_effort":"low","prompt_cache_key":"k","safety_identifier":"s","top_p":0})",
      1000);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[1].content, "hi");
  EXPECT_EQ(r.messages[2].content, "ano");
  ASSERT_TRUE(r.enable_thinking.has_value());
  EXPECT_TRUE(*r.enable_thinking);
  // top_p 0: only the most likely token stays.
  EXPECT_GT(r.gen.sampler.top_p, 0.0f);
  EXPECT_LT(r.gen.sampler.top_p, 1e-6f);
  const std::string ok = R"({"messages":[{"role":"user","content":"x"}])";
  const auto off = strata::serve::parse_chat_request(ok + R"(,"reasoning_effort":"minimal"})", 1000);
  ASSERT_TRUE(off.enable_thinking.has_value());
  EXPECT_FALSE(*off.enable_thinking);
  EXPECT_EQ(status_of(ok + R"(,"reasoning_effort":"extreme"})"), 400);
  // The two spellings of the thinking switch: agreeing is fine in either order, disagreeing is a 400.
  const std::string kw_off = R"("chat_template_kwargs":{"enable_thinking":false})";
  EXPECT_FALSE(*strata::serve::parse_chat_request(ok + "," + kw_off + R"(,"reasoning_effort":"none"})", 1000).enable_thinking);
  EXPECT_EQ(status_of(ok + "," + kw_off + R"(,"reasoning_effort":"high"})"), 400);
  EXPECT_EQ(status_of(ok + R"(,"reasoning_effort":"high",)" + kw_off + "}"), 400);
  // A refusal as OpenAI returns it (content null, the text in "refusal"), sent back: the refusal is what was said.
  const auto refused = strata::serve::parse_chat_request(
      R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"refusal":"I can't"},
          {"role":"user","content":"y"}]})",
      1000);
  ASSERT_EQ(refused.messages.size(), 3u);
  EXPECT_EQ(refused.messages[1].content, "I can't");
  EXPECT_EQ(status_of(R"({"messages":[{"role":"assistant","content":null,"refusal":null}]})"), 400);
  // Still refused: a non-null unknown message field, a refusal part from the user.
  EXPECT_EQ(status_of(R"({"messages":[{"role":"assistant","content":"x","function_call":{"name":"f"}}]})"), 400);
  EXPECT_EQ(status_of(R"({"messages":[{"role":"user","content":[{"type":"refusal","refusal":"no"}]}]})"), 400);
}

TEST(Requests, CompletionPromptBatchIsRefusedByName) {
  try {
    strata::serve::parse_completion_request(R"({"prompt":["a","b"]})", 1000);
    ADD_FAILURE() << "two prompts were accepted";
  } catch (const strata::serve::ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("one per request"), std::string::npos) << e.what();
  }
  EXPECT_EQ(strata::serve::parse_completion_request(R"({"prompt":["a"]})", 1000).prompt_text, "a");
}

TEST(ChatCompletion, ToolCallIdsAreUniqueAcrossAnswers) {
  // The parser numbers each answer's calls from call_0.
  const strata::AssistantOutput a = strata::parse_assistant_output(
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": "
      "{}}\n</tool_call>");
  ASSERT_EQ(a.tool_calls.size(), 2u);
  strata::serve::JobOutcome o;
  o.stop_reason = strata::StopReason::EndOfGeneration;
  std::set<std::string> ids;
  for (int i = 0; i < 2; ++i) {
    const auto j = strata::serve::chat_completion_json({"chatcmpl-1", 1, "m"}, a, "tool_calls", o);
    for (const auto& c : j["choices"][0]["message"]["tool_calls"]) ids.insert(c["id"].get<std::string>());
    for (const auto& c : strata::serve::tool_calls_json(a.tool_calls, true)) {
      EXPECT_EQ(c["index"].get<size_t>() < 2, true);
      ids.insert(c["id"].get<std::string>());
    }
  }
  EXPECT_EQ(ids.size(), 8u);
  for (const std::string& id : ids) EXPECT_EQ(id.rfind("call_", 0), 0u) << id;
}

TEST(Requests, ToolsKeepTheirKeyOrder) {
  const auto r = strata::serve::parse_chat_request(
      R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"z":1,"a":2}}}]})", 10);
  EXPECT_EQ(r.tools[0]["function"]["parameters"].dump(), R"({"z":1,"a":2})");
}

}  // namespace
