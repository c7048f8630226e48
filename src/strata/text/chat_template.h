// Chat formatting for the Qwen family (ChatML): rendering a conversation into the prompt text the
// model was trained on, exactly as Qwen3's tokenizer_config.json chat template renders it, and parsing
// the model's answer back into reasoning, content and tool calls.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata {

// Insertion-ordered JSON: the template serializes tools with their keys in the order the client sent
// them (Jinja's tojson keeps dict order), so parse requests into this type, not nlohmann::json.
using OrderedJson = nlohmann::ordered_json;

struct ToolCall {
  std::string id;         // client-visible id (not rendered by the Qwen template)
  std::string name;
  std::string arguments;  // a JSON text, as OpenAI sends and expects it; rendered verbatim
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
  std::vector<ToolCall> tool_calls;              // assistant
  std::string tool_call_id;                      // tool
  std::string name;                              // tool (function name), informational
  std::optional<std::string> reasoning_content;  // assistant; when absent, taken from <think> in content
};

struct ChatOptions {
  bool add_generation_prompt = true;
  // nullopt = the template's "undefined" (thinking on, no empty think block); false = adds an empty
  // <think></think> block after the generation prompt so the model answers directly.
  std::optional<bool> enable_thinking;
};

enum class ChatFamily { ChatML };

// ChatML when the template uses <|im_start|> (the Qwen family); otherwise throws strata::Error saying
// the template is not supported, unless force_chatml is set.
ChatFamily detect_chat_family(std::string_view chat_template, bool force_chatml = false);

class Tokenizer;

// A rendered conversation and where in it the template wrote control tokens (offset, length): only
// those are control tokens; the same text inside a message is the user's text.
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> special_spans;
};

// Renders the conversation as the Qwen3 chat template does. `tools`: a JSON array of tool
// declarations as OpenAI sends them ({"type": "function", "function": {...}}); null or empty = none.
// Throws strata::Error on an unknown role.
std::string render_chat(const std::vector<ChatMessage>& messages, const OrderedJson& tools,
                        const ChatOptions& options);
// The same rendering with the template's control tokens marked.
RenderedChat render_chat_marked(const std::vector<ChatMessage>& messages, const OrderedJson& tools,
                                const ChatOptions& options);

// Token ids of a rendered conversation: control tokens only where the template wrote them, every other
// byte (message content, tool arguments, names) as plain text, so a message cannot forge a turn.
// parse_special = true reads control-token text anywhere (serve --parse-special).
std::vector<int32_t> encode_rendered_chat(const Tokenizer& tokenizer, const RenderedChat& chat, bool parse_special);

// Jinja `tojson` as Hugging Face templates apply it (Python json.dumps, ensure_ascii=False):
// separators ", " and ": ", keys in insertion order.
std::string python_json_dumps(const OrderedJson& value);

struct AssistantOutput {
  std::string reasoning_content;  // text inside <think>...</think> (trimmed of newlines)
  std::string content;            // the answer without think block and without parsed tool calls
  std::vector<ToolCall> tool_calls;  // ids are "call_<index>"; arguments as compact JSON text
};

// Splits a generated assistant turn (the text after "<|im_start|>assistant\n", without <|im_end|>).
// <think> may be missing when the prompt already opened it (only "</think>" present). A <tool_call>
// block whose body is not a JSON object with a string "name" is left in the content, never thrown.
AssistantOutput parse_assistant_output(std::string_view text);

}  // namespace strata
