// Chat template tests: rendering against Hugging Face transformers' apply_chat_template with the real
// Qwen3 template (tests/fixtures/chat/expected.json, written by tools/make_chat_expected.py), family
// detection, and parsing of generated assistant turns.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "strata/base/error.h"
#include "strata/text/chat_template.h"

using namespace strata;

namespace {

const std::string kFixtures = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/chat";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// OpenAI-style message JSON -> ChatMessage.
ChatMessage to_message(const OrderedJson& j) {
  ChatMessage m;
  m.role = j.at("role").get<std::string>();
  if (j.contains("content") && j["content"].is_string()) m.content = j["content"].get<std::string>();
  if (j.contains("reasoning_content")) m.reasoning_content = j["reasoning_content"].get<std::string>();
  if (j.contains("tool_call_id")) m.tool_call_id = j["tool_call_id"].get<std::string>();
  if (j.contains("tool_calls")) {
    for (const auto& tc : j["tool_calls"]) {
      m.tool_calls.push_back({tc.value("id", ""), tc.at("function").at("name").get<std::string>(),
                              tc.at("function").at("arguments").get<std::string>()});
    }
  }
  return m;
}

}  // namespace

TEST(ChatTemplate, MatchesTransformersOnFixtures) {
  const auto cases = OrderedJson::parse(read_file(kFixtures + "/cases.json"));
  const auto expected = OrderedJson::parse(read_file(kFixtures + "/expected.json"));
  ASSERT_GE(cases.size(), 5u);
  for (const auto& c : cases) {
    const std::string name = c.at("name").get<std::string>();
    ASSERT_TRUE(expected.contains(name)) << name << " missing in expected.json: run tools/make_chat_expected.py";
    std::vector<ChatMessage> messages;
    for (const auto& m : c.at("messages")) messages.push_back(to_message(m));
    ChatOptions opt;
    opt.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    if (c.contains("enable_thinking")) opt.enable_thinking = c["enable_thinking"].get<bool>();
    const OrderedJson tools = c.contains("tools") ? c["tools"] : OrderedJson();
    EXPECT_EQ(render_chat(messages, tools, opt), expected.at(name).get<std::string>()) << "case " << name;
  }
}

TEST(ChatTemplate, PythonJsonDumpsFormatting) {
  const auto j = OrderedJson::parse(R"({"b": 1, "a": [true, null, 2.5, "x\"\n\u00e9"], "c": {}})");
  EXPECT_EQ(python_json_dumps(j), "{\"b\": 1, \"a\": [true, null, 2.5, \"x\\\"\\n\xc3\xa9\"], \"c\": {}}");
}

TEST(ChatTemplate, DetectsFamily) {
  const std::string qwen = read_file(std::string(STRATA_SOURCE_DIR) + "/build-data/qwen3-tokenizer/tokenizer_config.json");
  ASSERT_FALSE(qwen.empty()) << "run scripts/fetch-test-data";
  const auto cfg = OrderedJson::parse(qwen);
  EXPECT_EQ(detect_chat_family(cfg.at("chat_template").get<std::string>()), ChatFamily::ChatML);
  const std::string llama = "{{ bos_token }}{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}";
  EXPECT_THROW(detect_chat_family(llama), Error);
  EXPECT_THROW(detect_chat_family(""), Error);
  EXPECT_EQ(detect_chat_family(llama, /*force_chatml=*/true), ChatFamily::ChatML);
}

TEST(ChatTemplate, RejectsUnknownRoles) {
  std::vector<ChatMessage> msgs(1);
  msgs[0].role = "developer";
  EXPECT_THROW(render_chat(msgs, OrderedJson(), ChatOptions{}), Error);
  EXPECT_THROW(render_chat({}, OrderedJson(), ChatOptions{}), Error);
}

TEST(AssistantOutput, SplitsThinkingAndContent) {
  const auto r = parse_assistant_output("<think>\nLet me add.\n2+2=4\n</think>\n\nThe answer is 4.");
  EXPECT_EQ(r.reasoning_content, "Let me add.\n2+2=4");
  EXPECT_EQ(r.content, "The answer is 4.");
  EXPECT_TRUE(r.tool_calls.empty());

  // The prompt opened <think> already: only the closing tag is generated.
  const auto r2 = parse_assistant_output("reasoning here\n</think>\n\nanswer");
  EXPECT_EQ(r2.reasoning_content, "reasoning here");
  EXPECT_EQ(r2.content, "answer");

  // Cut off while thinking.
  const auto r3 = parse_assistant_output("<think>\nstill going");
  EXPECT_EQ(r3.reasoning_content, "still going");
  EXPECT_EQ(r3.content, "");

  const auto r4 = parse_assistant_output("plain answer, no tags");
  EXPECT_EQ(r4.reasoning_content, "");
  EXPECT_EQ(r4.content, "plain answer, no tags");
}

TEST(AssistantOutput, ParsesToolCalls) {
  const auto r = parse_assistant_output(
      "<think>\nneed weather\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Z\xc3\xbcrich\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": "
      "{\"q\": \"cats\"}}\n</tool_call>");
  EXPECT_EQ(r.reasoning_content, "need weather");
  EXPECT_EQ(r.content, "Checking.");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(OrderedJson::parse(r.tool_calls[0].arguments), OrderedJson::parse("{\"city\": \"Z\xc3\xbcrich\", \"days\": 2}"));
  EXPECT_EQ(r.tool_calls[1].name, "search");
  EXPECT_EQ(OrderedJson::parse(r.tool_calls[1].arguments), OrderedJson::parse(R"({"q": "cats"})"));
  EXPECT_NE(r.tool_calls[0].id, r.tool_calls[1].id);
}

TEST(AssistantOutput, MalformedToolCallsStayContent) {
  const std::string bad = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": }\n</tool_call>";
  const auto r = parse_assistant_output("Before " + bad);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, "Before " + bad);

  const auto r2 = parse_assistant_output("<tool_call>\n[1, 2]\n</tool_call>");  // not an object
  EXPECT_TRUE(r2.tool_calls.empty());
  EXPECT_EQ(r2.content, "<tool_call>\n[1, 2]\n</tool_call>");

  const auto r3 = parse_assistant_output("<tool_call>\n{\"name\": \"f\", \"arguments\": {}");  // unterminated
  EXPECT_TRUE(r3.tool_calls.empty());
  EXPECT_EQ(r3.content, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}");

  // A bad block next to a good one: the good one is parsed, the bad one stays.
  const auto r4 = parse_assistant_output(bad + "\n<tool_call>\n{\"name\": \"g\"}\n</tool_call>");
  ASSERT_EQ(r4.tool_calls.size(), 1u);
  EXPECT_EQ(r4.tool_calls[0].name, "g");
  EXPECT_EQ(r4.tool_calls[0].arguments, "{}");
  EXPECT_EQ(r4.content, bad);
}

TEST(AssistantOutput, RenderedToolCallsParseBack) {
  ChatMessage user{"user", "go", {}, "", "", std::nullopt};
  ChatMessage asst{"assistant", "Sure.", {{"c1", "f", R"({"a": [1, 2], "b": "\u00fc"})"}, {"c2", "g", "{}"}}, "", "",
                   std::string("why")};
  const std::string prompt = render_chat({user}, OrderedJson(), ChatOptions{});
  const std::string full = render_chat({user, asst}, OrderedJson(), ChatOptions{false, std::nullopt});
  ASSERT_EQ(full.substr(0, prompt.size()), prompt);
  std::string generated = full.substr(prompt.size());
  ASSERT_EQ(generated.substr(generated.size() - 11), "<|im_end|>\n");
  generated.resize(generated.size() - 11);
  const auto r = parse_assistant_output(generated);
  EXPECT_EQ(r.reasoning_content, "why");
  EXPECT_EQ(r.content, "Sure.");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "f");
  EXPECT_EQ(OrderedJson::parse(r.tool_calls[0].arguments), OrderedJson::parse(asst.tool_calls[0].arguments));
  EXPECT_EQ(r.tool_calls[1].name, "g");
}
