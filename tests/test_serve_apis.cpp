// The Anthropic Messages and OpenAI Responses shapes without HTTP: requests translated into the chat
// request the server renders, bad requests refused with a 400 naming the field (never another
// exception), and the streamed event sequences each API's clients expect.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "strata/serve/anthropic.h"
#include "strata/serve/api_error.h"
#include "strata/serve/openai_responses.h"

namespace {

using namespace strata::serve;
using strata::OrderedJson;
using strata::StopReason;

constexpr int64_t kVocab = 1000;

// Parses an SSE text into (event name, data) pairs.
std::vector<std::pair<std::string, OrderedJson>> parse_sse(const std::string& text) {
  std::vector<std::pair<std::string, OrderedJson>> out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event";
    if (end == std::string::npos) break;
    const std::string ev = text.substr(pos, end - pos);
    pos = end + 2;
    const size_t nl = ev.find('\n');
    EXPECT_EQ(ev.rfind("event: ", 0), 0u) << ev;
    EXPECT_EQ(ev.compare(nl + 1, 6, "data: "), 0) << ev;
    out.emplace_back(ev.substr(7, nl - 7), OrderedJson::parse(ev.substr(nl + 7)));
  }
  return out;
}

// The status and message of the ApiError `f` throws (0 when it throws none).
template <class F>
std::pair<int, std::string> error_of(F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    return {e.status, std::string(e.what()) + " [" + e.param + "]"};
  }
  return {0, ""};
}

// Random byte edits of a valid body: each one parses or is a 400, nothing else.
template <class Parse>
void expect_only_400s(const std::string& good, uint32_t seed, Parse parse) {
  std::mt19937 rng(seed);
  const std::string alphabet = "{}[]\":,0123456789-.aetnulrsxy ";
  for (int i = 0; i < 3000; ++i) {
    std::string body = good;
    for (int e = 0; e < 1 + static_cast<int>(rng() % 3); ++e) {
      const size_t at = rng() % body.size();
      if (rng() % 2) body[at] = alphabet[rng() % alphabet.size()];
      else body.erase(at, 1 + rng() % 6);
    }
    try {
      parse(body, i);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << body;
    } catch (const std::exception& e) {
      ADD_FAILURE() << body << " threw " << e.what();
    }
  }
}

JobOutcome finished(StopReason reason, int prompt, int completion) {
  JobOutcome o;
  o.stop_reason = reason;
  o.prompt_tokens = prompt;
  o.completion_tokens = completion;
  return o;
}

// ---- Anthropic ------------------------------------------------------------------------------

TEST(AnthropicRequest, TranslatesToTheChatRequest) {
  const ChatRequest r = parse_anthropic_request(R"({
    "model": "m", "max_tokens": 50, "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
    "stop_sequences": ["END"], "temperature": 0.5, "top_k": 5, "thinking": {"type": "disabled"},
    "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object", "properties": {"x": {"type": "integer"}}}}],
    "tool_choice": {"type": "any"},
    "messages": [
      {"role": "user", "content": "hi"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": ""},
                                         {"type": "text", "text": "calling"},
                                         {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"},
                                   {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true,
                                    "content": [{"type": "text", "text": "boom"}]},
                                   {"type": "text", "text": "thanks", "cache_control": {"type": "ephemeral"}}]}]})",
                                                kVocab, false);
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.messages.size(), 6u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content, "Be brief.");
  EXPECT_EQ(r.messages[1].role, "user");
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.messages[2].content, "calling");
  EXPECT_EQ(r.messages[2].reasoning_content.value_or(""), "hmm");
  ASSERT_EQ(r.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[2].tool_calls[0].name, "f");
  EXPECT_EQ(r.messages[2].tool_calls[0].arguments, R"({"x":1})");
  EXPECT_EQ(r.messages[3].role, "tool");
  EXPECT_EQ(r.messages[3].tool_call_id, "toolu_1");
  EXPECT_EQ(r.messages[3].content, "42");
  EXPECT_EQ(r.messages[4].content, "Error: boom");
  EXPECT_EQ(r.messages[5].role, "user");
  EXPECT_EQ(r.messages[5].content, "thanks");
  ASSERT_TRUE(r.tools.is_array());
  EXPECT_EQ(r.tools[0]["type"], "function");
  EXPECT_EQ(r.tools[0]["function"]["name"], "f");
  EXPECT_EQ(r.tools[0]["function"]["parameters"]["properties"]["x"]["type"], "integer");
  EXPECT_EQ(r.tool_choice, ToolChoice::Required);
  EXPECT_EQ(r.enable_thinking, std::optional<bool>(false));
  EXPECT_EQ(r.gen.max_tokens, std::optional<int>(50));
  EXPECT_EQ(r.gen.stop, std::vector<std::string>{"END"});
  EXPECT_FLOAT_EQ(r.gen.sampler.temperature, 0.5f);
  EXPECT_EQ(r.gen.sampler.top_k, 5);

  const ChatRequest named = parse_anthropic_request(
      R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f", "input_schema": {}}],
          "tool_choice": {"type": "tool", "name": "f"}, "thinking": {"type": "enabled", "budget_tokens": 2048}})",
      kVocab, false);
  EXPECT_EQ(named.tool_choice, ToolChoice::Named);
  EXPECT_EQ(named.tool_choice_name, "f");
  EXPECT_EQ(named.enable_thinking, std::optional<bool>(true));
}

TEST(AnthropicRequest, RefusesBadInputWithA400) {
  const std::string ok_msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "not valid JSON"},
      {"[1]", "JSON object"},
      {R"({"max_tokens": 5})", "'messages' is required"},
      {"{" + ok_msgs + "}", "'max_tokens' is required"},
      {R"({"max_tokens": null, )" + ok_msgs + "}", "max_tokens"},
      {R"({"max_tokens": -1, )" + ok_msgs + "}", "max_tokens"},
      {R"({"max_tokens": 5, "messages": []})", "must not be empty"},
      {R"({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})", "'user' or 'assistant'"},
      {R"({"max_tokens": 5, "messages": [{"role": "user"}]})", "content' is required"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": 5}]})", "must be an array"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})", "'image'"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]})", "must be a string"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}]})", "unknown field"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})", "prefill"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "x"}]}, {"role": "user", "content": "c"}]})", "input' must be an object"},
      {R"({"max_tokens": 5, "temperature": 1.5, )" + ok_msgs + "}", "temperature"},
      {R"({"max_tokens": 5, "stop_sequences": "x", )" + ok_msgs + "}", "stop_sequences"},
      {R"({"max_tokens": 5, "system": 3, )" + ok_msgs + "}", "system"},
      {R"({"max_tokens": 5, "tools": [{"name": "f"}], )" + ok_msgs + "}", "input_schema"},
      {R"({"max_tokens": 5, "tools": [{"type": "web_search_20250305", "name": "web_search"}], )" + ok_msgs + "}", "not supported"},
      {R"({"max_tokens": 5, "tool_choice": {"type": "any"}, )" + ok_msgs + "}", "requires 'tools'"},
      {R"({"max_tokens": 5, "tool_choice": {"type": "maybe"}, )" + ok_msgs + "}", "auto, any, tool or none"},
      {R"({"max_tokens": 5, "tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "tool", "name": "g"}, )" + ok_msgs + "}", "not in 'tools'"},
      {R"({"max_tokens": 5, "thinking": {"type": "enabled", "budget_tokens": 0}, )" + ok_msgs + "}", "budget_tokens"},
      {R"({"max_tokens": 5, "logit_bias": {}, )" + ok_msgs + "}", "unrecognized"},
  };
  for (const auto& [body, mention] : cases) {
    const auto [status, message] = error_of([&] { parse_anthropic_request(body, kVocab, false); });
    EXPECT_EQ(status, 400) << body;
    EXPECT_NE(message.find(mention), std::string::npos) << body << " -> " << message;
  }
  // count_tokens takes the prompt fields only.
  EXPECT_EQ(error_of([&] { parse_anthropic_request("{" + ok_msgs + "}", kVocab, true); }).first, 0);
  EXPECT_EQ(error_of([&] { parse_anthropic_request(R"({"max_tokens": 5, )" + ok_msgs + "}", kVocab, true); }).first, 400);
}

TEST(AnthropicRequest, MutatedBodiesNeverThrowAnythingElse) {
  const std::string good = R"({"model":"m","max_tokens":8,"system":"s","stop_sequences":["x"],"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"f"},"messages":[{"role":"user","content":[{"type":"text","text":"a"}]},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"r","is_error":false}]}]})";
  expect_only_400s(good, 7, [](const std::string& body, int i) { parse_anthropic_request(body, kVocab, i % 2 == 0); });
}

TEST(AnthropicResponse, StopReasonsUsageAndErrorShape) {
  EXPECT_STREQ(anthropic_stop_reason(StopReason::EndOfGeneration, false), "end_turn");
  EXPECT_STREQ(anthropic_stop_reason(StopReason::MaxTokens, false), "max_tokens");
  EXPECT_STREQ(anthropic_stop_reason(StopReason::ContextFull, false), "max_tokens");
  EXPECT_STREQ(anthropic_stop_reason(StopReason::StopString, false), "stop_sequence");
  EXPECT_STREQ(anthropic_stop_reason(StopReason::EndOfGeneration, true), "tool_use");

  strata::AssistantOutput a;
  a.reasoning_content = "think";
  a.content = "hello";
  a.tool_calls.push_back({"call_0", "f", R"({"x":1})"});
  JobOutcome o = finished(StopReason::EndOfGeneration, 30, 7);
  o.cached_tokens = 10;
  const OrderedJson j = anthropic_message_json({"msg_1", 0, "m"}, a, o);
  ASSERT_EQ(j["content"].size(), 3u);
  EXPECT_EQ(j["content"][0]["type"], "thinking");
  EXPECT_EQ(j["content"][0]["thinking"], "think");
  EXPECT_EQ(j["content"][1]["text"], "hello");
  EXPECT_EQ(j["content"][2]["type"], "tool_use");
  EXPECT_EQ(j["content"][2]["input"]["x"], 1);
  EXPECT_EQ(j["content"][2]["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(j["stop_reason"], "tool_use");
  EXPECT_TRUE(j["stop_sequence"].is_null());
  EXPECT_EQ(j["usage"]["input_tokens"], 20);
  EXPECT_EQ(j["usage"]["cache_read_input_tokens"], 10);
  EXPECT_EQ(j["usage"]["output_tokens"], 7);

  o = finished(StopReason::StopString, 5, 2);
  o.stop_string = "END";
  const OrderedJson s = anthropic_message_json({"msg_2", 0, "m"}, strata::AssistantOutput{"", "x", {}}, o);
  EXPECT_EQ(s["stop_reason"], "stop_sequence");
  EXPECT_EQ(s["stop_sequence"], "END");

  const OrderedJson err = OrderedJson::parse(anthropic_error_body(ApiError(404, "", "", "", "no such model")));
  EXPECT_EQ(err["type"], "error");
  EXPECT_EQ(err["error"]["type"], "not_found_error");
  EXPECT_EQ(err["error"]["message"], "no such model");
  EXPECT_EQ(OrderedJson::parse(anthropic_error_body(ApiError(503, "", "", "", "busy")))["error"]["type"], "overloaded_error");
  EXPECT_EQ(OrderedJson::parse(anthropic_error_body(ApiError(500, "", "", "", "x")))["error"]["type"], "api_error");
}

TEST(AnthropicStream, EventSequence) {
  auto w = anthropic_stream_writer({"msg_1", 0, "m"}, 12);
  std::string out;
  w->begin(out);
  w->delta({"th", ""}, out);
  w->delta({"ink", "Hel"}, out);
  w->delta({"", "lo"}, out);
  AssistantStreamSplitter::Final last;
  last.delta.content = "!";
  last.tool_calls.push_back({"call_0", "f", R"({"x":1})"});
  w->end(last, finished(StopReason::EndOfGeneration, 12, 9), out);
  const auto ev = parse_sse(out);
  std::vector<std::string> names;
  for (const auto& [name, data] : ev) {
    names.push_back(name);
    EXPECT_EQ(data["type"], name) << "the data's type repeats the event name";
  }
  const std::vector<std::string> want = {
      "message_start", "ping",
      "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",  // thinking
      "content_block_start", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_stop",  // text
      "content_block_start", "content_block_delta", "content_block_stop",  // tool_use
      "message_delta", "message_stop"};
  ASSERT_EQ(names, want);
  EXPECT_EQ(ev[0].second["message"]["usage"]["input_tokens"], 12);
  EXPECT_EQ(ev[2].second["content_block"]["type"], "thinking");
  EXPECT_EQ(ev[3].second["delta"]["type"], "thinking_delta");
  EXPECT_EQ(ev[4].second["delta"]["thinking"], "ink");
  EXPECT_EQ(ev[5].second["index"], 0);
  EXPECT_EQ(ev[6].second["index"], 1);
  EXPECT_EQ(ev[6].second["content_block"]["type"], "text");
  EXPECT_EQ(ev[9].second["delta"]["text"], "!");
  EXPECT_EQ(ev[11].second["index"], 2);
  EXPECT_EQ(ev[11].second["content_block"]["name"], "f");
  EXPECT_EQ(ev[12].second["delta"]["type"], "input_json_delta");
  EXPECT_EQ(ev[12].second["delta"]["partial_json"], R"({"x":1})");
  EXPECT_EQ(ev[14].second["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(ev[14].second["usage"]["output_tokens"], 9);

  // message_start's usage has every counter the final usage has, summing to the prompt.
  const OrderedJson& start_usage = ev[0].second["message"]["usage"];
  ASSERT_TRUE(start_usage.contains("cache_read_input_tokens")) << start_usage;
  ASSERT_TRUE(start_usage.contains("cache_creation_input_tokens")) << start_usage;
  EXPECT_EQ(start_usage["input_tokens"].get<int>() + start_usage["cache_read_input_tokens"].get<int>(), 12);

  // A failed generation ends the stream with an error event in Anthropic's shape.
  auto f = anthropic_stream_writer({"msg_2", 0, "m"}, 3);
  std::string fout;
  f->begin(fout);
  f->delta({"", "a"}, fout);
  f->fail(503, "shutting down", fout);
  const auto fev = parse_sse(fout);
  EXPECT_EQ(fev[fev.size() - 2].first, "content_block_stop");
  EXPECT_EQ(fev.back().first, "error");
  EXPECT_EQ(fev.back().second["error"]["type"], "overloaded_error");
}

// A tool call whose arguments the model wrote as a string that is not JSON: clients parse
// partial_json as JSON, so the stream must send valid JSON, and the same input the whole message has.
TEST(AnthropicStream, ToolInputIsValidJsonMatchingTheMessage) {
  const strata::ToolCall call{"call_0", "f", "city=Paris"};
  strata::AssistantOutput a;
  a.tool_calls.push_back(call);
  const JobOutcome o = finished(StopReason::EndOfGeneration, 4, 3);
  const OrderedJson whole = anthropic_message_json({"msg_1", 0, "m"}, a, o);
  ASSERT_EQ(whole["content"].size(), 1u);

  auto w = anthropic_stream_writer({"msg_1", 0, "m"}, 4);
  std::string out;
  w->begin(out);
  AssistantStreamSplitter::Final last;
  last.tool_calls.push_back(call);
  w->end(last, o, out);
  std::string partial;
  for (const auto& [name, data] : parse_sse(out))
    if (name == "content_block_delta" && data["delta"]["type"] == "input_json_delta")
      partial += data["delta"]["partial_json"].get<std::string>();
  const OrderedJson streamed = OrderedJson::parse(partial, nullptr, false);
  ASSERT_FALSE(streamed.is_discarded()) << partial;
  EXPECT_EQ(streamed, whole["content"][0]["input"]);
}

TEST(AnthropicRequest, AdaptiveThinkingAndDisplay) {
  const std::string msgs = R"("max_tokens": 5, "messages": [{"role": "user", "content": "x"}])";
  const ChatRequest adaptive =
      parse_anthropic_request(R"({"thinking": {"type": "adaptive"}, )" + msgs + "}", kVocab, false);
  EXPECT_EQ(adaptive.enable_thinking, std::optional<bool>(true));
  const ChatRequest shown = parse_anthropic_request(
      R"({"thinking": {"type": "enabled", "budget_tokens": 1024, "display": "summarized"}, )" + msgs + "}", kVocab,
      false);
  EXPECT_EQ(shown.enable_thinking, std::optional<bool>(true));
  EXPECT_EQ(error_of([&] {
              parse_anthropic_request(R"({"thinking": {"type": "adaptive", "display": "omitted"}, )" + msgs + "}",
                                      kVocab, false);
            }).first,
            0);
  const auto [status, message] = error_of([&] {
    parse_anthropic_request(R"({"thinking": {"type": "adaptive", "display": "loud"}, )" + msgs + "}", kVocab, false);
  });
  EXPECT_EQ(status, 400);
  EXPECT_NE(message.find("display"), std::string::npos) << message;
  EXPECT_EQ(error_of([&] {
              parse_anthropic_request(R"({"thinking": {"type": "disabled", "display": "summarized"}, )" + msgs + "}",
                                      kVocab, false);
            }).first,
            400);
}

// ---- OpenAI Responses -----------------------------------------------------------------------

TEST(ResponsesRequest, TranslatesItemsToTheChatRequest) {
  const ResponsesRequest r = parse_responses_request(R"({
    "model": "m", "instructions": "Be brief.", "max_output_tokens": 40, "temperature": 0.3, "store": true,
    "reasoning": {"effort": "minimal"},
    "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": true}],
    "tool_choice": {"type": "function", "name": "f"},
    "input": [
      {"role": "developer", "content": "sys2"},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "sum"}]},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "calling", "annotations": []}]},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\":1}"},
      {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c1", "output": "one"},
      {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]}]})",
                                                     kVocab);
  const ChatRequest& c = r.chat;
  ASSERT_EQ(c.messages.size(), 6u);
  EXPECT_EQ(c.messages[0].role, "system");
  EXPECT_EQ(c.messages[0].content, "Be brief.");
  EXPECT_EQ(c.messages[1].role, "system");
  EXPECT_EQ(c.messages[2].content, "ab");
  EXPECT_EQ(c.messages[3].role, "assistant");
  EXPECT_EQ(c.messages[3].content, "calling");
  EXPECT_EQ(c.messages[3].reasoning_content.value_or(""), "sum");
  ASSERT_EQ(c.messages[3].tool_calls.size(), 2u);
  EXPECT_EQ(c.messages[3].tool_calls[0].id, "c1");
  EXPECT_EQ(c.messages[3].tool_calls[0].arguments, "{\"x\":1}");
  EXPECT_EQ(c.messages[4].role, "tool");
  EXPECT_EQ(c.messages[4].content, "one");
  EXPECT_EQ(c.messages[5].content, "two");
  EXPECT_EQ(c.tools[0]["function"]["name"], "f");
  EXPECT_EQ(c.tool_choice, ToolChoice::Named);
  EXPECT_EQ(c.enable_thinking, std::optional<bool>(false));
  EXPECT_EQ(c.gen.max_tokens, std::optional<int>(40));
  EXPECT_EQ(r.echo["instructions"], "Be brief.");
  EXPECT_EQ(r.echo["max_output_tokens"], 40);
  EXPECT_EQ(r.echo["tools"][0]["name"], "f");

  const ResponsesRequest s = parse_responses_request(R"({"input": "hello"})", kVocab);
  ASSERT_EQ(s.chat.messages.size(), 1u);
  EXPECT_EQ(s.chat.messages[0].role, "user");
  EXPECT_FALSE(s.chat.gen.max_tokens.has_value());
}

// text.format becomes the grammar the answer decodes under, as the chat API's response_format.
TEST(ResponsesRequest, TextFormatSetsTheGrammar) {
  EXPECT_EQ(parse_responses_request(R"({"input": "x"})", kVocab).chat.gen.grammar, nullptr);
  EXPECT_EQ(parse_responses_request(R"({"input": "x", "text": {"format": {"type": "text"}}})", kVocab).chat.gen.grammar,
            nullptr);
  EXPECT_NE(parse_responses_request(R"({"input": "x", "text": {"format": {"type": "json_object"}}})", kVocab).chat.gen.grammar,
            nullptr);
  EXPECT_NE(parse_responses_request(
                R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "strict": true,
                    "schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}})",
                kVocab)
                .chat.gen.grammar,
            nullptr);
  const auto [status, message] = error_of([&] {
    parse_responses_request(R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "integer", "minimum": 1}}}})",
                            kVocab);
  });
  EXPECT_EQ(status, 400);
  EXPECT_NE(message.find("minimum"), std::string::npos) << message;
}

TEST(ResponsesRequest, RefusesBadInputWithA400) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{}", "'input' is required"},
      {R"({"input": null})", "input"},
      {R"({"input": []})", "must not be empty"},
      {R"({"input": [{"role": "tool", "content": "x"}]})", "role"},
      {R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})", "input_image"},
      {R"({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]})", "arguments"},
      {R"({"input": [{"type": "function_call_output", "output": "x"}]})", "call_id"},
      {R"({"input": [{"type": "reasoning", "summary": "x"}]})", "summary"},
      {R"({"input": [{"type": "reasoning", "summary": []}]})", "holds no message"},
      {R"({"input": "x", "previous_response_id": "resp_1"})", "stores no responses"},
      {R"({"input": "x", "conversation": "c"})", "stores no responses"},
      {R"({"input": "x", "tools": [{"type": "file_search"}]})", "file_search"},
      {R"({"input": "x", "tools": [{"type": "function", "function": {"name": "f"}}]})", "unknown field"},
      {R"({"input": "x", "tool_choice": "required"})", "requires 'tools'"},
      {R"({"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}})", "not in 'tools'"},
      {R"({"input": "x", "max_output_tokens": 0})", "max_output_tokens"},
      {R"({"input": "x", "reasoning": {"effort": "max"}})", "effort"},
      {R"({"input": "x", "text": {"format": {"type": "json_schema"}}})", "text.format"},
      {R"({"input": "x", "text": {"format": {"type": "yaml"}}})", "yaml"},
      {R"({"input": "x", "truncation": "auto"})", "truncation"},
      {R"({"input": "x", "top_logprobs": 2})", "unrecognized"},
  };
  for (const auto& [body, mention] : cases) {
    const auto [status, message] = error_of([&] { parse_responses_request(body, kVocab); });
    EXPECT_EQ(status, 400) << body;
    EXPECT_NE(message.find(mention), std::string::npos) << body << " -> " << message;
  }
}

TEST(ResponsesRequest, MutatedBodiesNeverThrowAnythingElse) {
  const std::string good = R"({"model":"m","instructions":"i","max_output_tokens":8,"tools":[{"type":"function","name":"f","parameters":{}}],"tool_choice":"auto","input":[{"role":"user","content":"a"},{"type":"reasoning","summary":[{"type":"summary_text","text":"s"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"r"}]})";
  expect_only_400s(good, 11, [](const std::string& body, int i) { parse_responses_request(body, kVocab); });
}

TEST(ResponsesOutput, ItemsStatusAndUsage) {
  const ResponsesRequest r = parse_responses_request(R"({"input": "x", "max_output_tokens": 5})", kVocab);
  strata::AssistantOutput a{"think", "hi", {{"call_0", "f", "{}"}}};
  const OrderedJson j = response_json(r, {"resp_1", 7, "m"}, a, finished(StopReason::EndOfGeneration, 10, 4));
  EXPECT_EQ(j["object"], "response");
  EXPECT_EQ(j["status"], "completed");
  ASSERT_EQ(j["output"].size(), 3u);
  EXPECT_EQ(j["output"][0]["type"], "reasoning");
  EXPECT_EQ(j["output"][0]["content"][0]["text"], "think");
  EXPECT_EQ(j["output"][1]["type"], "message");
  EXPECT_EQ(j["output"][1]["content"][0]["type"], "output_text");
  EXPECT_EQ(j["output"][1]["content"][0]["text"], "hi");
  EXPECT_EQ(j["output"][2]["type"], "function_call");
  EXPECT_EQ(j["output"][2]["call_id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(j["usage"]["input_tokens"], 10);
  EXPECT_EQ(j["usage"]["output_tokens"], 4);
  EXPECT_EQ(j["usage"]["total_tokens"], 14);
  EXPECT_EQ(j["max_output_tokens"], 5);

  const OrderedJson cut = response_json(r, {"resp_2", 7, "m"}, strata::AssistantOutput{"", "abc", {}}, finished(StopReason::MaxTokens, 10, 5));
  EXPECT_EQ(cut["status"], "incomplete");
  EXPECT_EQ(cut["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(cut["output"][0]["status"], "incomplete");
}

TEST(ResponsesOutput, UsageHasOutputTokensDetails) {
  const ResponsesRequest r = parse_responses_request(R"({"input": "x"})", kVocab);
  const TokenCounter words = [](const std::string& t) {
    return static_cast<int>(std::count(t.begin(), t.end(), ' ')) + 1;
  };
  const strata::AssistantOutput a{"one two three", "hi", {}};
  const OrderedJson j = response_json(r, {"resp_1", 7, "m"}, a, finished(StopReason::EndOfGeneration, 10, 8), words);
  EXPECT_EQ(j["usage"]["output_tokens_details"]["reasoning_tokens"], 3);
  EXPECT_EQ(j["usage"]["input_tokens_details"]["cached_tokens"], 0);
  // No reasoning, or no counter: 0, still present.
  const OrderedJson plain = response_json(r, {"resp_2", 7, "m"}, strata::AssistantOutput{"", "hi", {}},
                                          finished(StopReason::EndOfGeneration, 10, 2), words);
  EXPECT_EQ(plain["usage"]["output_tokens_details"]["reasoning_tokens"], 0);
  EXPECT_EQ(
      response_json(r, {"resp_3", 7, "m"}, a,
                    finished(StopReason::EndOfGeneration, 10, 8))["usage"]["output_tokens_details"]["reasoning_tokens"],
      0);

  auto w = responses_stream_writer(r, {"resp_4", 7, "m"}, words);
  std::string out;
  w->begin(out);
  w->delta({"one two", ""}, out);
  AssistantStreamSplitter::Final last;
  last.delta.reasoning = " three";
  last.delta.content = "hi";
  w->end(last, finished(StopReason::EndOfGeneration, 10, 8), out);
  const auto ev = parse_sse(out);
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back().first, "response.completed");
  EXPECT_EQ(ev.back().second["response"]["usage"]["output_tokens_details"]["reasoning_tokens"], 3);
}

TEST(ResponsesStream, EventSequence) {
  const ResponsesRequest r = parse_responses_request(R"({"input": "x"})", kVocab);
  auto w = responses_stream_writer(r, {"resp_1", 7, "m"});
  std::string out;
  w->begin(out);
  w->delta({"a", ""}, out);
  w->delta({"b", "Hel"}, out);
  AssistantStreamSplitter::Final last;
  last.delta.content = "lo";
  last.tool_calls.push_back({"call_0", "f", R"({"x":1})"});
  w->end(last, finished(StopReason::EndOfGeneration, 10, 6), out);
  const auto ev = parse_sse(out);
  std::vector<std::string> names;
  for (size_t i = 0; i < ev.size(); ++i) {
    names.push_back(ev[i].first);
    EXPECT_EQ(ev[i].second["type"], ev[i].first);
    EXPECT_EQ(ev[i].second["sequence_number"], i);
  }
  const std::vector<std::string> want = {
      "response.created", "response.in_progress",
      "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
      "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
      "response.output_text.done", "response.content_part.done", "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.done",
      "response.output_item.done", "response.completed"};
  ASSERT_EQ(names, want);
  EXPECT_EQ(ev[0].second["response"]["status"], "in_progress");
  EXPECT_EQ(ev[6].second["text"], "ab");
  EXPECT_EQ(ev[13].second["text"], "Hello");
  EXPECT_EQ(ev[13].second["output_index"], 1);
  EXPECT_EQ(ev[18].second["arguments"], R"({"x":1})");
  const OrderedJson& done = ev.back().second["response"];
  EXPECT_EQ(done["status"], "completed");
  ASSERT_EQ(done["output"].size(), 3u);
  EXPECT_EQ(done["output"][0], ev[8].second["item"]);
  EXPECT_EQ(done["output"][1], ev[15].second["item"]);
  EXPECT_EQ(done["output"][2], ev[19].second["item"]);
  EXPECT_EQ(done["output"][1]["content"][0]["text"], "Hello");
  EXPECT_EQ(done["usage"]["total_tokens"], 16);
}

}  // namespace
