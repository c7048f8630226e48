#include "strata/serve/requests.h"

#include <cmath>
#include <limits>
#include <set>

#include "strata/serve/api_error.h"
#include "strata/serve/request_fields.h"
#include "strata/serve/structured_output.h"

namespace strata::serve {
// Shared with the other APIs' parsers (request_fields.h).
namespace fields {

const char* type_name(const OrderedJson& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  return "object";
}

double get_number(const OrderedJson& v, const std::string& name, double lo, double hi) {
  if (!v.is_number()) bad_request(name, "'", name, "' must be a number, got ", type_name(v));
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) bad_request(name, "'", name, "' must be in [", lo, ", ", hi, "], got ", x);
  return x;
}

int64_t get_integer(const OrderedJson& v, const std::string& name, int64_t lo, int64_t hi) {
  if (v.is_number_integer()) {
    // Unsigned values above int64 range come back as huge; compare in the unsigned domain first.
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      bad_request(name, "'", name, "' must be in [", lo, ", ", hi, "], got ", v.get<uint64_t>());
    }
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) bad_request(name, "'", name, "' must be in [", lo, ", ", hi, "], got ", x);
    return x;
  }
  bad_request(name, "'", name, "' must be an integer, got ", type_name(v));
}

bool get_bool(const OrderedJson& v, const std::string& name) {
  if (!v.is_boolean()) bad_request(name, "'", name, "' must be a boolean, got ", type_name(v));
  return v.get<bool>();
}

const std::string& get_string(const OrderedJson& v, const std::string& name) {
  if (!v.is_string()) bad_request(name, "'", name, "' must be a string, got ", type_name(v));
  return v.get_ref<const std::string&>();
}

const OrderedJson& get_object(const OrderedJson& v, const std::string& name) {
  if (!v.is_object()) bad_request(name, "'", name, "' must be an object, got ", type_name(v));
  return v;
}

const OrderedJson& get_array(const OrderedJson& v, const std::string& name) {
  if (!v.is_array()) bad_request(name, "'", name, "' must be an array, got ", type_name(v));
  return v;
}

// Message content: a string, null, or an array of {"type": "text", "text": "..."} parts (an
// assistant's may hold {"type": "refusal", "refusal": "..."} parts too).
std::string get_content(const OrderedJson& v, const std::string& name, bool assistant = false) {
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) bad_request(name, "'", name, "' must be a string, null or an array of text parts, got ", type_name(v));
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string part_name = cat(name, "[", i, "]");
    const OrderedJson& part = get_object(v[i], part_name);
    if (!part.contains("type")) bad_request(part_name, "'", part_name, ".type' is required");
    const std::string& type = get_string(part["type"], part_name + ".type");
    const std::string key = assistant && type == "refusal" ? "refusal" : "text";
    if (type != key) bad_request(part_name, "content part type '", type, "' is not supported (only 'text')");
    if (!part.contains(key)) bad_request(part_name, "'", part_name, ".", key, "' is required");
    out += get_string(part[key], part_name + "." + key);
  }
  return out;
}

ToolCall parse_tool_call(const OrderedJson& v, const std::string& name) {
  get_object(v, name);
  ToolCall tc;
  for (const auto& [key, value] : v.items()) {
    if (key == "id") {
      tc.id = get_string(value, name + ".id");
    } else if (key == "type") {
      if (get_string(value, name + ".type") != "function") bad_request(name, "'", name, ".type' must be 'function'");
    } else if (key == "function") {
      const OrderedJson& f = get_object(value, name + ".function");
      if (!f.contains("name")) bad_request(name, "'", name, ".function.name' is required");
      tc.name = get_string(f["name"], name + ".function.name");
      if (f.contains("arguments")) {
        const OrderedJson& a = f["arguments"];
        // OpenAI sends arguments as a JSON text; accept an object too and serialize it.
        if (a.is_string()) tc.arguments = a.get<std::string>();
        else if (a.is_object()) tc.arguments = a.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
        else bad_request(name, "'", name, ".function.arguments' must be a string, got ", type_name(a));
      } else {
        tc.arguments = "{}";
      }
    } else if (key != "index") {
      bad_request(name, "unknown field '", name, ".", key, "'");
    }
  }
  if (tc.name.empty()) bad_request(name, "'", name, ".function' is required");
  return tc;
}

std::vector<ChatMessage> parse_messages(const OrderedJson& v) {
  std::vector<ChatMessage> out;
  for_each_message(v, [&](size_t, size_t, const std::string& name, const OrderedJson& m) {
    ChatMessage msg;
    if (!m.contains("role")) bad_request(name, "'", name, ".role' is required");
    msg.role = get_string(m["role"], name + ".role");
    if (msg.role == "developer") msg.role = "system";  // OpenAI's newer name for the system role
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool") {
      bad_request(name, "'", name, ".role' must be one of system, developer, user, assistant, tool; got '", msg.role, "'");
    }
    bool has_content = false;
    std::string refusal;
    for (const auto& [key, value] : m.items()) {
      if (key == "role") continue;
      if (key == "content") {
        msg.content = get_content(value, name + ".content", msg.role == "assistant");
        has_content = !value.is_null();
      } else if (key == "name") {
        if (!value.is_null()) msg.name = get_string(value, name + ".name");
      } else if (key == "tool_calls" && msg.role == "assistant") {
        if (value.is_null()) continue;
        const OrderedJson& calls = get_array(value, name + ".tool_calls");
        for (size_t t = 0; t < calls.size(); ++t) msg.tool_calls.push_back(parse_tool_call(calls[t], cat(name, ".tool_calls[", t, "]")));
      } else if (key == "tool_call_id" && msg.role == "tool") {
        msg.tool_call_id = get_string(value, name + ".tool_call_id");
      } else if (key == "reasoning_content" && msg.role == "assistant") {
        if (!value.is_null()) msg.reasoning_content = get_string(value, name + ".reasoning_content");
      } else if (key == "refusal" && msg.role == "assistant") {
        // OpenAI returns a refusal as {"content": null, "refusal": "..."}: sent back, it is what was said.
        if (!value.is_null()) refusal = get_string(value, name + ".refusal");
      } else if (value.is_null() && (key == "function_call" || key == "audio" || key == "annotations")) {
        // A returned message sent back whole carries these as null: nothing to render.
      } else {
        bad_request(name, "unknown field '", name, ".", key, "' for role ", msg.role);
      }
    }
    if (!has_content && !refusal.empty()) {
      msg.content = refusal;
      has_content = true;
    }
    if (!has_content && !(msg.role == "assistant" && !msg.tool_calls.empty())) {
      bad_request(name, "'", name, ".content' is required");
    }
    out.push_back(std::move(msg));
  });
  return out;
}

void check_tools(const OrderedJson& tools) {
  get_array(tools, "tools");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string name = cat("tools[", i, "]");
    const OrderedJson& t = get_object(tools[i], name);
    if (!t.contains("type") || !t["type"].is_string() || t["type"].get<std::string>() != "function") {
      bad_request(name, "'", name, ".type' must be 'function'");
    }
    if (!t.contains("function")) bad_request(name, "'", name, ".function' is required");
    const OrderedJson& f = get_object(t["function"], name + ".function");
    if (!f.contains("name")) bad_request(name, "'", name, ".function.name' is required");
    if (get_string(f["name"], name + ".function.name").empty()) bad_request(name, "'", name, ".function.name' is empty");
    if (f.contains("description") && !f["description"].is_null()) get_string(f["description"], name + ".function.description");
    if (f.contains("parameters") && !f["parameters"].is_null()) get_object(f["parameters"], name + ".function.parameters");
  }
}

std::vector<std::string> parse_stop(const OrderedJson& v) {
  std::vector<std::string> out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) out.push_back(get_string(v[i], cat("stop[", i, "]")));
  } else {
    bad_request("stop", "'stop' must be a string or an array of strings, got ", type_name(v));
  }
  if (out.size() > 4) bad_request("stop", "'stop' may hold at most 4 strings, got ", out.size());
  for (const std::string& s : out) {
    if (s.empty()) bad_request("stop", "'stop' strings must not be empty");
  }
  return out;
}

// Token ids as a JSON array of integers within [0, n_vocab).
std::vector<int32_t> parse_token_ids(const OrderedJson& v, const std::string& name, int64_t n_vocab) {
  get_array(v, name);
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    ids.push_back(static_cast<int32_t>(get_integer(v[i], cat(name, "[", i, "]"), 0, n_vocab - 1)));
  }
  return ids;
}

// A field every generating endpoint understands. Returns false when `key` is not one of them.
bool parse_generation_field(const std::string& key, const OrderedJson& value, RequestParams& gen, int64_t n_vocab,
                            std::optional<int>& max_tokens, std::optional<int>& max_completion_tokens) {
  SamplerParams& s = gen.sampler;
  if (key == "temperature") {
    s.temperature = static_cast<float>(get_number(value, key, 0.0, 2.0));
  } else if (key == "top_p") {
    s.top_p = static_cast<float>(get_number(value, key, 0.0, 1.0));
    // 0 keeps only the most likely token, the limit of the nucleus as top_p shrinks.
    if (!(s.top_p > 0)) s.top_p = std::numeric_limits<float>::min();
  } else if (key == "top_k") {
    const int64_t k = get_integer(value, key, -1, std::numeric_limits<int32_t>::max());
    s.top_k = k < 0 ? 0 : static_cast<int32_t>(k);  // -1 = off, as vLLM spells it
  } else if (key == "min_p") {
    s.min_p = static_cast<float>(get_number(value, key, 0.0, 1.0));
  } else if (key == "presence_penalty") {
    s.presence_penalty = static_cast<float>(get_number(value, key, -2.0, 2.0));
  } else if (key == "frequency_penalty") {
    s.frequency_penalty = static_cast<float>(get_number(value, key, -2.0, 2.0));
  } else if (key == "repetition_penalty") {
    s.repetition_penalty = static_cast<float>(get_number(value, key, 0.0, 10.0));
    if (!(s.repetition_penalty > 0)) bad_request(key, "'repetition_penalty' must be > 0");
  } else if (key == "seed") {
    s.seed = static_cast<uint64_t>(get_integer(value, key, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
  } else if (key == "logit_bias") {
    for (const auto& [id_text, bias] : get_object(value, key).items()) {
      char* end = nullptr;
      errno = 0;
      const long long id = std::strtoll(id_text.c_str(), &end, 10);
      if (id_text.empty() || *end != '\0' || errno != 0 || id < 0 || id >= n_vocab) {
        bad_request(key, "'logit_bias' key '", id_text, "' is not a token id in [0, ", n_vocab, ")");
      }
      s.logit_bias[static_cast<int32_t>(id)] = static_cast<float>(get_number(bias, cat("logit_bias.", id_text), -100.0, 100.0));
    }
  } else if (key == "max_tokens") {
    max_tokens = static_cast<int>(get_integer(value, key, 1, std::numeric_limits<int32_t>::max()));
  } else if (key == "max_completion_tokens") {
    max_completion_tokens = static_cast<int>(get_integer(value, key, 1, std::numeric_limits<int32_t>::max()));
  } else if (key == "stop") {
    gen.stop = parse_stop(value);
  } else if (key == "stream") {
    gen.stream = get_bool(value, key);
  } else if (key == "speculative") {
    gen.speculative = get_bool(value, key);
  } else if (key == "stream_options") {
    for (const auto& [k, v] : get_object(value, key).items()) {
      if (k == "include_usage") gen.include_usage = get_bool(v, "stream_options.include_usage");
      else if (k != "include_obfuscation") bad_request(key, "unknown field 'stream_options.", k, "'");
    }
  } else if (key == "n" || key == "best_of") {
    if (get_integer(value, key, 1, 1) != 1) bad_request(key, "only '", key, "' = 1 is supported");
  } else if (key == "logprobs") {
    // chat: boolean; completions: integer. Only "off" is supported.
    if ((value.is_boolean() && value.get<bool>()) || (value.is_number() && value.get<double>() != 0) ||
        (!value.is_boolean() && !value.is_number())) {
      bad_request(key, "'logprobs' is not supported");
    }
  } else if (key == "user" || key == "store" || key == "metadata" || key == "service_tier" ||
             key == "prompt_cache_key" || key == "safety_identifier") {
    // Bookkeeping fields OpenAI accepts; they do not change the generated text.
  } else {
    return false;
  }
  return true;
}

void finish_generation_params(RequestParams& gen, std::optional<int> max_tokens, std::optional<int> max_completion_tokens) {
  gen.max_tokens = max_completion_tokens ? max_completion_tokens : max_tokens;
  try {
    validate_sampler_params(gen.sampler);
  } catch (const Error& e) {
    bad_request("", e.what());
  }
}

[[noreturn]] void unknown_field(const std::string& key) {
  bad_request(key, "unrecognized request argument '", key, "'");
}

}  // namespace fields

using namespace fields;

OrderedJson parse_json_object(const std::string& body) {
  OrderedJson j;
  try {
    j = OrderedJson::parse(body);  // throws on bad syntax and on ill-formed UTF-8 inside strings
  } catch (const nlohmann::json::exception& e) {
    bad_request("", "the request body is not valid JSON: ", e.what());
  }
  if (!j.is_object()) bad_request("", "the request body must be a JSON object, got ", type_name(j));
  return j;
}

ChatRequest parse_chat_request(const std::string& body, int64_t n_vocab) {
  const OrderedJson j = parse_json_object(body);
  ChatRequest r;
  std::optional<int> max_tokens, max_completion_tokens;
  std::optional<bool> kwargs_thinking, effort_thinking;  // two spellings of one switch
  bool have_messages = false;
  OrderedJson tool_choice;
  for (const auto& [key, value] : j.items()) {
    if (value.is_null() && key != "messages") continue;  // null = not given, as OpenAI treats optional fields
    if (key == "model") {
      r.model = get_string(value, key);
    } else if (key == "messages") {
      r.messages = parse_messages(value);
      have_messages = true;
    } else if (key == "tools") {
      check_tools(value);
      if (!value.empty()) r.tools = value;
    } else if (key == "tool_choice") {
      tool_choice = value;
    } else if (key == "parallel_tool_calls") {
      get_bool(value, key);
    } else if (key == "chat_template_kwargs") {
      for (const auto& [k, v] : get_object(value, key).items()) {
        if (k == "enable_thinking") kwargs_thinking = get_bool(v, "chat_template_kwargs.enable_thinking");
        else bad_request(key, "unknown field 'chat_template_kwargs.", k, "' (supported: enable_thinking)");
      }
    } else if (key == "response_format") {
      r.gen.grammar = response_format_grammar(get_object(value, key));
    } else if (key == "reasoning_effort") {
      const std::string& e = get_string(value, key);
      if (e == "none" || e == "minimal")
        effort_thinking = false;
      else if (e == "low" || e == "medium" || e == "high" || e == "xhigh")
        effort_thinking = true;
      else
        bad_request(key, "'reasoning_effort' must be none, minimal, low, medium, high or xhigh, got '", e, "'");
    } else if (key == "top_logprobs") {
      bad_request(key, "'top_logprobs' is not supported");
    } else if (key == "modalities") {
      for (size_t i = 0; i < get_array(value, key).size(); ++i) {
        if (get_string(value[i], cat("modalities[", i, "]")) != "text") bad_request(key, "only the 'text' modality is supported");
      }
    } else if (!parse_generation_field(key, value, r.gen, n_vocab, max_tokens, max_completion_tokens)) {
      unknown_field(key);
    }
  }
  if (!have_messages) bad_request("messages", "'messages' is required");
  // Either spelling alone decides; both must agree (the fields' order in the JSON must not).
  if (kwargs_thinking && effort_thinking && *kwargs_thinking != *effort_thinking)
    bad_request("reasoning_effort", "'reasoning_effort' turns thinking ", *effort_thinking ? "on" : "off",
                " but 'chat_template_kwargs.enable_thinking' is ", *kwargs_thinking ? "true" : "false");
  if (kwargs_thinking) r.enable_thinking = *kwargs_thinking;
  if (effort_thinking) r.enable_thinking = *effort_thinking;
  finish_generation_params(r.gen, max_tokens, max_completion_tokens);

  if (!tool_choice.is_null()) {
    if (tool_choice.is_string()) {
      const std::string& c = tool_choice.get_ref<const std::string&>();
      if (c == "none") r.tool_choice = ToolChoice::None;
      else if (c == "auto") r.tool_choice = ToolChoice::Auto;
      else if (c == "required") r.tool_choice = ToolChoice::Required;
      else bad_request("tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or a function, got '", c, "'");
    } else if (tool_choice.is_object()) {
      if (!tool_choice.contains("function") || !tool_choice["function"].is_object() ||
          !tool_choice["function"].contains("name") || !tool_choice["function"]["name"].is_string()) {
        bad_request("tool_choice", "'tool_choice' object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
      }
      r.tool_choice = ToolChoice::Named;
      r.tool_choice_name = tool_choice["function"]["name"].get<std::string>();
    } else {
      bad_request("tool_choice", "'tool_choice' must be a string or an object, got ", type_name(tool_choice));
    }
    if (r.tool_choice == ToolChoice::Required || r.tool_choice == ToolChoice::Named) {
      if (r.tools.is_null()) bad_request("tool_choice", "'tool_choice' requires 'tools'");
    }
    if (r.tool_choice == ToolChoice::Named) {
      bool found = false;
      for (const auto& t : r.tools) found = found || t["function"]["name"].get<std::string>() == r.tool_choice_name;
      if (!found) bad_request("tool_choice", "'tool_choice' names function '", r.tool_choice_name, "', which is not in 'tools'");
    }
  }
  return r;
}

CompletionRequest parse_completion_request(const std::string& body, int64_t n_vocab) {
  const OrderedJson j = parse_json_object(body);
  CompletionRequest r;
  std::optional<int> max_tokens, max_completion_tokens;
  bool have_prompt = false;
  for (const auto& [key, value] : j.items()) {
    if (value.is_null() && key != "prompt") continue;
    if (key == "model") {
      r.model = get_string(value, key);
    } else if (key == "prompt") {
      have_prompt = true;
      // A string, [string], token ids, or [[token ids]]: one prompt only (n = 1, no batching).
      const OrderedJson* p = &value;
      if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
      if (p->is_array() && !p->empty() && ((*p)[0].is_string() || (*p)[0].is_array()))
        bad_request(key, "'prompt' holds ", p->size(), " prompts; this server takes one per request");
      if (p->is_string()) {
        r.prompt_text = p->get<std::string>();
      } else if (p->is_array()) {
        r.prompt_tokens = parse_token_ids(*p, "prompt", n_vocab);
      } else {
        bad_request(key, "'prompt' must be a string, an array of one string, or an array of token ids, got ", type_name(*p));
      }
    } else if (key == "echo") {
      if (get_bool(value, key)) bad_request(key, "'echo' is not supported");
    } else if (key == "suffix") {
      if (!get_string(value, key).empty()) bad_request(key, "'suffix' is not supported");
    } else if (!parse_generation_field(key, value, r.gen, n_vocab, max_tokens, max_completion_tokens)) {
      unknown_field(key);
    }
  }
  if (!have_prompt) bad_request("prompt", "'prompt' is required");
  if (!r.prompt_text && r.prompt_tokens.empty()) bad_request("prompt", "'prompt' must not be empty");
  // OpenAI's completions default: 16 tokens.
  if (!max_tokens && !max_completion_tokens) max_tokens = 16;
  finish_generation_params(r.gen, max_tokens, max_completion_tokens);
  return r;
}

TokenizeRequest parse_tokenize_request(const std::string& body) {
  const OrderedJson j = parse_json_object(body);
  TokenizeRequest r;
  for (const auto& [key, value] : j.items()) {
    if (key == "content" || key == "prompt") {
      r.content = get_string(value, key);
    } else if (key == "messages") {
      r.messages = parse_messages(value);
    } else if (key == "tools") {
      if (!value.is_null()) {
        check_tools(value);
        if (!value.empty()) r.tools = value;
      }
    } else if (key == "add_special") {
      r.add_special = get_bool(value, key);
    } else if (key != "model") {
      unknown_field(key);
    }
  }
  if (r.content.has_value() == !r.messages.empty()) bad_request("content", "give exactly one of 'content' or 'messages'");
  return r;
}

DetokenizeRequest parse_detokenize_request(const std::string& body, int64_t n_vocab) {
  const OrderedJson j = parse_json_object(body);
  DetokenizeRequest r;
  bool have = false;
  for (const auto& [key, value] : j.items()) {
    if (key == "tokens") {
      r.tokens = parse_token_ids(value, key, n_vocab);
      have = true;
    } else if (key != "model") {
      unknown_field(key);
    }
  }
  if (!have) bad_request("tokens", "'tokens' is required");
  return r;
}

}  // namespace strata::serve
