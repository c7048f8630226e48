#include "strata/serve/openai_responses.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "strata/serve/api_error.h"
#include "strata/serve/request_fields.h"
#include "strata/serve/structured_output.h"

namespace strata::serve {
namespace {

using namespace fields;

// Message content and function outputs: a string or text parts (an assistant's refusal is text too).
const std::vector<TextPart> kTextParts = {
    {"input_text", "text", {}}, {"output_text", "text", {"annotations", "logprobs"}}, {"refusal", "refusal", {}}};
const std::vector<TextPart> kReasoningParts = {{"summary_text", "text", {}}, {"reasoning_text", "text", {}}};

// The assistant message an output item belongs to: the last message when it is the assistant's
// (a message and the function calls after it are one turn), else a new one.
ChatMessage& assistant_turn(std::vector<ChatMessage>& out, std::optional<std::string>& reasoning) {
  if (out.empty() || out.back().role != "assistant" || reasoning) out.push_back({"assistant", "", {}, "", "", std::nullopt});
  if (reasoning) out.back().reasoning_content = std::move(*reasoning);
  reasoning.reset();
  return out.back();
}

std::vector<ChatMessage> parse_input(const OrderedJson& v) {
  std::vector<ChatMessage> out;
  if (v.is_string()) {
    out.push_back({"user", v.get<std::string>(), {}, "", "", std::nullopt});
    return out;
  }
  const OrderedJson& items = get_array(v, "input");
  if (items.empty()) bad_request("input", "'input' must not be empty");
  std::optional<std::string> reasoning;  // a reasoning item waits for the assistant output it preceded
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string name = cat("input[", i, "]");
    const OrderedJson& item = get_object(items[i], name);
    const std::string type = item.contains("type") ? get_string(item["type"], name + ".type") : "message";
    if (type == "message") {
      check_keys(item, name, {"type", "role", "content", "id", "status"});
      std::string role = get_string(required(item, "role", name), name + ".role");
      if (role == "developer") role = "system";
      const std::string text = text_of(required(item, "content", name), name + ".content", kTextParts);
      if (role == "assistant") {
        assistant_turn(out, reasoning).content += text;
      } else if (role == "user" || role == "system") {
        reasoning.reset();
        out.push_back({role, text, {}, "", "", std::nullopt});
      } else {
        bad_request(name, "'", name, ".role' must be user, assistant, system or developer, got '", role, "'");
      }
    } else if (type == "function_call") {
      check_keys(item, name, {"type", "call_id", "name", "arguments", "id", "status"});
      ToolCall tc;
      tc.id = get_string(required(item, "call_id", name), name + ".call_id");
      tc.name = get_string(required(item, "name", name), name + ".name");
      tc.arguments = get_string(required(item, "arguments", name), name + ".arguments");
      assistant_turn(out, reasoning).tool_calls.push_back(std::move(tc));
    } else if (type == "function_call_output") {
      check_keys(item, name, {"type", "call_id", "output", "id", "status"});
      reasoning.reset();
      ChatMessage m{"tool", "", {}, "", "", std::nullopt};
      m.tool_call_id = get_string(required(item, "call_id", name), name + ".call_id");
      m.content = text_of(required(item, "output", name), name + ".output", kTextParts);
      out.push_back(std::move(m));
    } else if (type == "reasoning") {
      check_keys(item, name, {"type", "id", "summary", "content", "encrypted_content", "status"});
      // The model's own reasoning text when the client kept it, else its summary.
      std::string text;
      for (const char* key : {"content", "summary"}) {
        if (!item.contains(key) || item[key].is_null()) continue;
        const OrderedJson& parts = get_array(item[key], cat(name, ".", key));
        for (size_t p = 0; p < parts.size(); ++p) text += part_text(parts[p], cat(name, ".", key, "[", p, "]"), kReasoningParts);
        if (!text.empty()) break;
      }
      reasoning = reasoning.value_or("") + text;
    } else {
      bad_request(name, "input item type '", type, "' is not supported (message, function_call, function_call_output, reasoning)");
    }
  }
  if (out.empty()) bad_request("input", "'input' holds no message");
  return out;
}

// Function tools in the Responses shape ({type, name, description, parameters, strict}) in the
// chat-completions shape the template renders.
OrderedJson translate_tools(const OrderedJson& v) {
  return function_tools(v, "parameters", false, [](const OrderedJson& t, const std::string& name) {
    const std::string& type = get_string(required(t, "type", name), name + ".type");
    if (type != "function") bad_request(name, "tool type '", type, "' is not supported (only 'function')");
    check_keys(t, name, {"type", "name", "description", "parameters", "strict"});
    if (t.contains("strict") && !t["strict"].is_null()) get_bool(t["strict"], name + ".strict");
  });
}

// The Responses API's text.format ({"type": "text" | "json_object"} or {"type": "json_schema", "name",
// "schema", "strict", "description"} flat) as the chat API's response_format, so both decode under the
// same grammar.
std::shared_ptr<const grammar::Grammar> text_format_grammar(const OrderedJson& f) {
  if (!f.contains("type") || !f["type"].is_string()) bad_request("text.format.type", "'text.format.type' must be a string");
  const std::string type = f["type"].get<std::string>();
  OrderedJson rf;
  rf["type"] = type;
  if (type == "json_schema") {
    if (!f.contains("schema")) bad_request("text.format.schema", "'text.format.schema' is required with type 'json_schema'");
    OrderedJson js = OrderedJson::object();
    for (const auto& [key, v] : f.items()) {
      if (key == "type") continue;
      if (key != "name" && key != "schema" && key != "strict" && key != "description")
        bad_request("text.format." + key, "unknown field 'text.format.", key, "'");
      js[key] = v;
    }
    rf["json_schema"] = js;
  } else {
    check_keys(f, "text.format", {"type"});
  }
  return response_format_grammar(rf);
}

void apply_tool_choice(const OrderedJson& c, ChatRequest& r) {
  if (c.is_string()) {
    const std::string& s = c.get_ref<const std::string&>();
    if (s == "none") r.tool_choice = ToolChoice::None;
    else if (s == "auto") r.tool_choice = ToolChoice::Auto;
    else if (s == "required") r.tool_choice = ToolChoice::Required;
    else bad_request("tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}, got '", s, "'");
  } else {
    get_object(c, "tool_choice");
    check_keys(c, "tool_choice", {"type", "name"});
    if (get_string(required(c, "type", "tool_choice"), "tool_choice.type") != "function")
      bad_request("tool_choice", "'tool_choice.type' must be 'function'");
    r.tool_choice = ToolChoice::Named;
    r.tool_choice_name = get_string(required(c, "name", "tool_choice"), "tool_choice.name");
  }
}

void apply_reasoning(const OrderedJson& v, ChatRequest& r) {
  check_keys(get_object(v, "reasoning"), "reasoning", {"effort", "summary", "generate_summary"});
  if (v.contains("effort") && !v["effort"].is_null()) {
    const std::string& e = get_string(v["effort"], "reasoning.effort");
    if (e == "none" || e == "minimal") r.enable_thinking = false;
    else if (e == "low" || e == "medium" || e == "high" || e == "xhigh") r.enable_thinking = true;
    else bad_request("reasoning", "'reasoning.effort' must be none, minimal, low, medium, high or xhigh, got '", e, "'");
  }
  for (const char* key : {"summary", "generate_summary"})
    if (v.contains(key) && !v[key].is_null()) get_string(v[key], cat("reasoning.", key));
}

OrderedJson text_part(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", OrderedJson::array()}, {"logprobs", OrderedJson::array()}};
}
OrderedJson reasoning_part(const std::string& text) { return {{"type", "reasoning_text"}, {"text", text}}; }

OrderedJson reasoning_item(const std::string& id, const std::string& text) {
  OrderedJson content = OrderedJson::array();
  if (!text.empty()) content.push_back(reasoning_part(text));
  return {{"id", id}, {"type", "reasoning"}, {"summary", OrderedJson::array()}, {"content", std::move(content)}};
}

OrderedJson message_item(const std::string& id, const char* status, const OrderedJson* part) {
  OrderedJson content = OrderedJson::array();
  if (part) content.push_back(*part);
  return {{"id", id}, {"type", "message"}, {"status", status}, {"role", "assistant"}, {"content", std::move(content)}};
}

OrderedJson function_call_item(const std::string& id, const std::string& call_id, const ToolCall& call, const char* status,
                               const std::string& arguments) {
  return {{"id", id}, {"type", "function_call"}, {"status", status}, {"arguments", arguments}, {"call_id", call_id}, {"name", call.name}};
}

bool incomplete(const JobOutcome& o, bool has_tool_calls) {
  return !has_tool_calls && (o.stop_reason == StopReason::MaxTokens || o.stop_reason == StopReason::ContextFull);
}

OrderedJson usage(const JobOutcome& o, const std::string& reasoning, const TokenCounter& count) {
  const int reasoning_tokens = reasoning.empty() || !count ? 0 : std::min(count(reasoning), o.completion_tokens);
  OrderedJson u;
  u["input_tokens"] = o.prompt_tokens;
  u["input_tokens_details"] = {{"cached_tokens", o.cached_tokens}};
  u["output_tokens"] = o.completion_tokens;
  u["output_tokens_details"] = {{"reasoning_tokens", reasoning_tokens}};
  u["total_tokens"] = o.prompt_tokens + o.completion_tokens;
  add_speculative_usage(u, o);
  return u;
}

// The response object around `output`; outcome == nullptr while it is still being generated.
OrderedJson response_object(const ResponsesRequest& r, const ResponseMeta& meta, const char* status, OrderedJson output,
                            const JobOutcome* outcome, const std::string& reasoning = "",
                            const TokenCounter& count = {}) {
  OrderedJson j;
  j["id"] = meta.id;
  j["object"] = "response";
  j["created_at"] = meta.created;
  j["status"] = status;
  j["error"] = nullptr;
  j["incomplete_details"] = nullptr;
  if (std::string(status) == "incomplete") j["incomplete_details"] = {{"reason", "max_output_tokens"}};
  j["model"] = meta.model;
  j["output"] = std::move(output);
  for (const auto& [key, value] : r.echo.items()) j[key] = value;
  j["usage"] = outcome ? usage(*outcome, reasoning, count) : OrderedJson(nullptr);
  return j;
}

class ResponsesWriter final : public ChatEventWriter {
 public:
  ResponsesWriter(const ResponsesRequest& r, ResponseMeta meta, TokenCounter count)
      : request_(r), meta_(std::move(meta)), count_(std::move(count)) {}

  void begin(std::string& out) override {
    const OrderedJson snapshot = response_object(request_, meta_, "in_progress", OrderedJson::array(), nullptr);
    send("response.created", {{"response", snapshot}}, out);
    send("response.in_progress", {{"response", snapshot}}, out);
  }

  void delta(const AssistantDelta& d, std::string& out) override {
    if (!d.reasoning.empty()) {
      open(Item::Reasoning, out);
      text_ += d.reasoning;
      reasoning_ += d.reasoning;
      send("response.reasoning_text.delta", {{"item_id", item_id_}, {"output_index", output_.size()}, {"content_index", 0}, {"delta", d.reasoning}}, out);
    }
    if (!d.content.empty()) {
      open(Item::Message, out);
      text_ += d.content;
      send("response.output_text.delta",
           {{"item_id", item_id_}, {"output_index", output_.size()}, {"content_index", 0}, {"delta", d.content}, {"logprobs", OrderedJson::array()}},
           out);
    }
  }

  void end(const AssistantStreamSplitter::Final& last, const JobOutcome& o, std::string& out) override {
    delta(last.delta, out);
    const bool calls = !last.tool_calls.empty();
    close(incomplete(o, calls) ? "incomplete" : "completed", out);
    for (const ToolCall& call : last.tool_calls) {
      const std::string id = make_response_id("fc_"), call_id = make_response_id("call_");
      const size_t index = output_.size();
      send("response.output_item.added", {{"output_index", index}, {"item", function_call_item(id, call_id, call, "in_progress", "")}}, out);
      send("response.function_call_arguments.delta", {{"item_id", id}, {"output_index", index}, {"delta", call.arguments}}, out);
      send("response.function_call_arguments.done",
           {{"item_id", id}, {"output_index", index}, {"name", call.name}, {"arguments", call.arguments}}, out);
      output_.push_back(function_call_item(id, call_id, call, "completed", call.arguments));
      send("response.output_item.done", {{"output_index", index}, {"item", output_.back()}}, out);
    }
    const char* status = incomplete(o, calls) ? "incomplete" : "completed";
    send(cat("response.", status),
         {{"response", response_object(request_, meta_, status, output_, &o, reasoning_, count_)}}, out);
  }

  void fail(int status, const std::string& message, std::string& out) override {
    close("incomplete", out);
    OrderedJson resp = response_object(request_, meta_, "failed", output_, nullptr);
    resp["error"] = {{"code", status == 503 ? "server_overloaded" : "server_error"}, {"message", message}};
    send("response.failed", {{"response", std::move(resp)}}, out);
  }

 private:
  enum class Item { None, Reasoning, Message };

  void send(const std::string& type, OrderedJson fields, std::string& out) {
    OrderedJson e;
    e["type"] = type;
    e["sequence_number"] = sequence_++;
    for (auto& [key, value] : fields.items()) e[key] = std::move(value);
    out += sse_event(type, e);
  }

  void open(Item kind, std::string& out) {
    if (open_ == kind) return;
    close("completed", out);
    open_ = kind;
    text_.clear();
    const size_t index = output_.size();
    const bool reasoning = kind == Item::Reasoning;
    item_id_ = make_response_id(reasoning ? "rs_" : "msg_");
    send("response.output_item.added",
         {{"output_index", index}, {"item", reasoning ? reasoning_item(item_id_, "") : message_item(item_id_, "in_progress", nullptr)}}, out);
    send("response.content_part.added",
         {{"item_id", item_id_}, {"output_index", index}, {"content_index", 0}, {"part", reasoning ? reasoning_part("") : text_part("")}}, out);
  }

  void close(const char* status, std::string& out) {
    if (open_ == Item::None) return;
    const size_t index = output_.size();
    const bool reasoning = open_ == Item::Reasoning;
    const OrderedJson part = reasoning ? reasoning_part(text_) : text_part(text_);
    if (reasoning) {
      send("response.reasoning_text.done", {{"item_id", item_id_}, {"output_index", index}, {"content_index", 0}, {"text", text_}}, out);
    } else {
      send("response.output_text.done",
           {{"item_id", item_id_}, {"output_index", index}, {"content_index", 0}, {"text", text_}, {"logprobs", OrderedJson::array()}}, out);
    }
    send("response.content_part.done", {{"item_id", item_id_}, {"output_index", index}, {"content_index", 0}, {"part", part}}, out);
    output_.push_back(reasoning ? reasoning_item(item_id_, text_) : message_item(item_id_, status, &part));
    send("response.output_item.done", {{"output_index", index}, {"item", output_.back()}}, out);
    open_ = Item::None;
  }

  const ResponsesRequest request_;
  ResponseMeta meta_;
  TokenCounter count_;
  std::string reasoning_;  // all reasoning text so far, for usage
  OrderedJson output_ = OrderedJson::array();
  Item open_ = Item::None;
  std::string item_id_;
  std::string text_;
  int64_t sequence_ = 0;
};

}  // namespace

ResponsesRequest parse_responses_request(const std::string& body, int64_t n_vocab) {
  const OrderedJson j = parse_json_object(body);
  ResponsesRequest out;
  ChatRequest& r = out.chat;
  std::optional<int> max_tokens, unused;
  bool have_input = false;
  OrderedJson tool_choice;
  std::optional<std::string> instructions;
  for (const auto& [key, value] : j.items()) {
    if (value.is_null() && key != "input") continue;
    if (key == "model") {
      r.model = get_string(value, key);
    } else if (key == "input") {
      r.messages = parse_input(value);
      have_input = true;
    } else if (key == "instructions") {
      instructions = get_string(value, key);
    } else if (key == "tools") {
      r.tools = translate_tools(value);
    } else if (key == "tool_choice") {
      tool_choice = value;
    } else if (key == "max_output_tokens") {
      max_tokens = static_cast<int>(get_integer(value, key, 1, std::numeric_limits<int32_t>::max()));
    } else if (key == "reasoning") {
      apply_reasoning(value, r);
    } else if (key == "parallel_tool_calls" || key == "background") {
      if (get_bool(value, key) && key == "background") bad_request(key, "'background' responses are not supported (nothing is stored)");
    } else if (key == "previous_response_id" || key == "conversation") {
      bad_request(key, "'", key, "' is not supported: this server stores no responses; send the whole conversation in 'input'");
    } else if (key == "text") {
      check_keys(get_object(value, key), key, {"format", "verbosity"});
      if (value.contains("format")) r.gen.grammar = text_format_grammar(get_object(value["format"], "text.format"));
    } else if (key == "truncation") {
      if (get_string(value, key) != "disabled") bad_request(key, "only 'truncation': 'disabled' is supported");
    } else if (key == "include") {
      for (size_t i = 0; i < get_array(value, key).size(); ++i) get_string(value[i], cat("include[", i, "]"));
    } else if (key == "prompt_cache_key" || key == "safety_identifier") {
      get_string(value, key);
    } else if (key == "store") {
      get_bool(value, key);  // accepted; nothing is stored either way
    } else if (key == "temperature" || key == "top_p" || key == "stream" || key == "metadata" || key == "user" ||
               key == "service_tier" || key == "stream_options" || key == "speculative") {
      parse_generation_field(key, value, r.gen, n_vocab, unused, unused);
    } else {
      unknown_field(key);
    }
  }
  if (!have_input) bad_request("input", "'input' is required");
  if (instructions) r.messages.insert(r.messages.begin(), {"system", *instructions, {}, "", "", std::nullopt});
  if (!tool_choice.is_null()) apply_tool_choice(tool_choice, r);
  check_tool_choice(r);
  finish_generation_params(r.gen, max_tokens, std::nullopt);

  OrderedJson& e = out.echo;
  e["instructions"] = instructions ? OrderedJson(*instructions) : OrderedJson(nullptr);
  e["max_output_tokens"] = max_tokens ? OrderedJson(*max_tokens) : OrderedJson(nullptr);
  e["parallel_tool_calls"] = j.contains("parallel_tool_calls") && j["parallel_tool_calls"].is_boolean() ? j["parallel_tool_calls"] : OrderedJson(true);
  e["previous_response_id"] = nullptr;
  e["reasoning"] = {{"effort", nullptr}, {"summary", nullptr}};
  if (j.contains("reasoning") && j["reasoning"].is_object())
    for (const char* k : {"effort", "summary"})
      if (j["reasoning"].contains(k)) e["reasoning"][k] = j["reasoning"][k];
  e["store"] = false;
  e["temperature"] = r.gen.sampler.temperature;
  e["text"] = {{"format", {{"type", "text"}}}};
  if (j.contains("text") && j["text"].contains("format")) e["text"]["format"] = j["text"]["format"];
  e["tool_choice"] = tool_choice.is_null() ? OrderedJson("auto") : tool_choice;
  e["tools"] = j.contains("tools") && j["tools"].is_array() ? j["tools"] : OrderedJson::array();
  e["top_p"] = j.contains("top_p") && j["top_p"].is_number() ? j["top_p"] : OrderedJson(r.gen.sampler.top_p);
  e["truncation"] = "disabled";
  e["metadata"] = j.contains("metadata") && j["metadata"].is_object() ? j["metadata"] : OrderedJson::object();
  return out;
}

OrderedJson response_json(const ResponsesRequest& request, const ResponseMeta& meta, const AssistantOutput& answer,
                          const JobOutcome& outcome, const TokenCounter& count) {
  const bool calls = !answer.tool_calls.empty();
  const char* status = incomplete(outcome, calls) ? "incomplete" : "completed";
  OrderedJson output = OrderedJson::array();
  if (!answer.reasoning_content.empty()) output.push_back(reasoning_item(make_response_id("rs_"), answer.reasoning_content));
  if (!answer.content.empty() || (!calls && output.empty())) {
    const OrderedJson part = text_part(answer.content);
    output.push_back(message_item(make_response_id("msg_"), status, &part));
  }
  for (const ToolCall& call : answer.tool_calls)
    output.push_back(function_call_item(make_response_id("fc_"), make_response_id("call_"), call, "completed", call.arguments));
  return response_object(request, meta, status, std::move(output), &outcome, answer.reasoning_content, count);
}

std::unique_ptr<ChatEventWriter> responses_stream_writer(const ResponsesRequest& request, const ResponseMeta& meta,
                                                         TokenCounter count) {
  return std::make_unique<ResponsesWriter>(request, meta, std::move(count));
}

}  // namespace strata::serve
