#include "strata/serve/request_fields.h"

#include "strata/serve/api_error.h"

namespace strata::serve::fields {

const OrderedJson& required(const OrderedJson& obj, const char* key, const std::string& name) {
  if (!obj.contains(key)) bad_request(name, "'", name, ".", key, "' is required");
  return obj[key];
}

void for_each_message(const OrderedJson& v,
                      const std::function<void(size_t, size_t, const std::string&, const OrderedJson&)>& fn) {
  const OrderedJson& arr = get_array(v, "messages");
  if (arr.empty()) bad_request("messages", "'messages' must not be empty");
  for (size_t i = 0; i < arr.size(); ++i) {
    const std::string name = cat("messages[", i, "]");
    fn(i, arr.size(), name, get_object(arr[i], name));
  }
}

void check_keys(const OrderedJson& obj, const std::string& name, const std::vector<std::string>& allowed) {
  for (const auto& [key, value] : obj.items()) {
    bool ok = false;
    for (const std::string& a : allowed) ok = ok || key == a;
    if (!ok) bad_request(name, "unknown field '", name, ".", key, "'");
  }
}

OrderedJson function_tools(const OrderedJson& tools, const char* schema_key, bool schema_required,
                           const std::function<void(const OrderedJson&, const std::string&)>& check) {
  get_array(tools, "tools");
  OrderedJson out = OrderedJson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string name = cat("tools[", i, "]");
    const OrderedJson& t = get_object(tools[i], name);
    check(t, name);
    OrderedJson f;
    f["name"] = get_string(required(t, "name", name), name + ".name");
    if (f["name"].get_ref<const std::string&>().empty()) bad_request(name, "'", name, ".name' is empty");
    if (t.contains("description") && !t["description"].is_null()) f["description"] = get_string(t["description"], name + ".description");
    if (schema_required || (t.contains(schema_key) && !t[schema_key].is_null()))
      f["parameters"] = get_object(required(t, schema_key, name), cat(name, ".", schema_key));
    out.push_back({{"type", "function"}, {"function", std::move(f)}});
  }
  check_tools(out);
  return out.empty() ? OrderedJson() : out;
}

void check_tool_choice(const ChatRequest& r) {
  if ((r.tool_choice == ToolChoice::Required || r.tool_choice == ToolChoice::Named) && r.tools.is_null())
    bad_request("tool_choice", "'tool_choice' requires 'tools'");
  if (r.tool_choice != ToolChoice::Named) return;
  for (const auto& t : r.tools)
    if (t["function"]["name"].get<std::string>() == r.tool_choice_name) return;
  bad_request("tool_choice", "'tool_choice' names '", r.tool_choice_name, "', which is not in 'tools'");
}

std::string part_text(const OrderedJson& part, const std::string& name, const std::vector<TextPart>& kinds) {
  get_object(part, name);
  const std::string& type = get_string(required(part, "type", name), name + ".type");
  std::string known;
  for (const TextPart& k : kinds) {
    if (type == k.type) {
      std::vector<std::string> keys = k.other_keys;
      keys.push_back("type");
      keys.push_back(k.text_key);
      check_keys(part, name, keys);
      return get_string(required(part, k.text_key.c_str(), name), name + "." + k.text_key);
    }
    known += (known.empty() ? "" : ", ") + k.type;
  }
  bad_request(name, "content type '", type, "' is not supported here (", known, ")");
}

std::string text_of(const OrderedJson& v, const std::string& name, const std::vector<TextPart>& kinds) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) bad_request(name, "'", name, "' must be a string or an array of content parts, got ", type_name(v));
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += part_text(v[i], cat(name, "[", i, "]"), kinds);
  return out;
}

}  // namespace strata::serve::fields
