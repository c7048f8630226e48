// The field checkers behind requests.h, shared by the parsers of the other API shapes (Anthropic
// messages, OpenAI responses) so every API checks a field the same way and names it the same way in
// its 400. Each throws ApiError (400 invalid_request_error naming `name`) on a wrong type or range.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "strata/serve/requests.h"

namespace strata::serve::fields {

const char* type_name(const OrderedJson& v);  // "null", "boolean", "integer", "number", ...
double get_number(const OrderedJson& v, const std::string& name, double lo, double hi);
int64_t get_integer(const OrderedJson& v, const std::string& name, int64_t lo, int64_t hi);
bool get_bool(const OrderedJson& v, const std::string& name);
const std::string& get_string(const OrderedJson& v, const std::string& name);
const OrderedJson& get_object(const OrderedJson& v, const std::string& name);
const OrderedJson& get_array(const OrderedJson& v, const std::string& name);

// Tools in the chat-completions shape: [{"type": "function", "function": {"name": ..., ...}}].
void check_tools(const OrderedJson& tools);

// A sampling or generation field the chat and completion endpoints share (temperature, top_p, top_k,
// max_tokens, stream, metadata, ...). Returns false when `key` is not one of them.
bool parse_generation_field(const std::string& key, const OrderedJson& value, RequestParams& gen, int64_t n_vocab,
                            std::optional<int>& max_tokens, std::optional<int>& max_completion_tokens);
// Settles max_tokens and checks the sampler parameters together.
void finish_generation_params(RequestParams& gen, std::optional<int> max_tokens, std::optional<int> max_completion_tokens);

[[noreturn]] void unknown_field(const std::string& key);

// obj[key]; 400 "'<name>.<key>' is required" when it is missing.
const OrderedJson& required(const OrderedJson& obj, const char* key, const std::string& name);
// 400 naming the first key of `obj` not in `allowed`.
void check_keys(const OrderedJson& obj, const std::string& name, const std::vector<std::string>& allowed);
// The request's 'messages': a non-empty array of objects; fn(i, count, "messages[i]", message) for each.
void for_each_message(const OrderedJson& v,
                      const std::function<void(size_t, size_t, const std::string&, const OrderedJson&)>& fn);

// Flat tool declarations ({name, description, <schema_key>}, as Anthropic and the Responses API send
// them) in the chat-completions shape the template renders. `check(tool, name)` refuses what its
// API does not take (other tool types, unknown keys). Null when there are none.
OrderedJson function_tools(const OrderedJson& tools, const char* schema_key, bool schema_required,
                           const std::function<void(const OrderedJson&, const std::string&)>& check);
// tool_choice required or named needs tools, and a named tool must be one of them.
void check_tool_choice(const ChatRequest& r);

// One kind of text part in a content array: {"type": type, text_key: "...", other keys...}.
struct TextPart {
  std::string type;
  std::string text_key;
  std::vector<std::string> other_keys;  // accepted and ignored (annotations, cache_control, ...)
};
// The text of a content part of one of `kinds`; 400 for any other part.
std::string part_text(const OrderedJson& part, const std::string& name, const std::vector<TextPart>& kinds);
// A string, or an array of such parts, concatenated.
std::string text_of(const OrderedJson& v, const std::string& name, const std::vector<TextPart>& kinds);

}  // namespace strata::serve::fields
