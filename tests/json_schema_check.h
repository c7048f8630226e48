// For the structured-output tests: an independent JSON schema validator (written from the JSON Schema
// spec for the keywords grammar/json_schema.h supports, sharing no code with it) and a seeded
// generator of random schemas over those keywords.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

namespace strata::schema_check {

using Json = nlohmann::ordered_json;

inline size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

inline bool is_integer(const Json& v) {
  if (v.is_number_integer() || v.is_number_unsigned()) return true;
  if (!v.is_number_float()) return false;
  const double d = v.get<double>();
  return std::isfinite(d) && d == std::floor(d);
}

// True when `v` is valid against `s` (refs resolve in `root`).
inline bool valid(const Json& v, const Json& s, const Json& root, int depth = 0) {
  if (depth > 200) return false;
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("nullable") && s["nullable"].get<bool>() && v.is_null()) return true;
  if (s.contains("$ref")) {
    const std::string r = s["$ref"].get<std::string>();
    if (!valid(v, root.at(Json::json_pointer(r.substr(1))), root, depth + 1)) return false;
  }
  if (s.contains("anyOf")) {
    bool any = false;
    for (const Json& b : s["anyOf"]) any = any || valid(v, b, root, depth + 1);
    if (!any) return false;
  }
  if (s.contains("oneOf")) {
    int n = 0;
    for (const Json& b : s["oneOf"]) n += valid(v, b, root, depth + 1);
    if (n != 1) return false;
  }
  if (s.contains("allOf"))
    for (const Json& b : s["allOf"])
      if (!valid(v, b, root, depth + 1)) return false;
  if (s.contains("const") && !(v == s["const"])) return false;
  if (s.contains("enum")) {
    bool found = false;
    for (const Json& e : s["enum"]) found = found || v == e;
    if (!found) return false;
  }
  if (s.contains("type")) {
    std::vector<std::string> types;
    if (s["type"].is_string()) types.push_back(s["type"].get<std::string>());
    else for (const Json& t : s["type"]) types.push_back(t.get<std::string>());
    bool ok = false;
    for (const std::string& t : types) {
      ok = ok || (t == "null" && v.is_null()) || (t == "boolean" && v.is_boolean()) || (t == "string" && v.is_string()) ||
           (t == "number" && v.is_number()) || (t == "integer" && is_integer(v)) || (t == "array" && v.is_array()) ||
           (t == "object" && v.is_object());
    }
    if (!ok) return false;
  }
  if (v.is_string()) {
    const size_t n = code_points(v.get<std::string>());
    if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return false;
    if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return false;
  }
  if (v.is_array()) {
    const size_t n = v.size();
    if (s.contains("minItems") && n < s["minItems"].get<size_t>()) return false;
    if (s.contains("maxItems") && n > s["maxItems"].get<size_t>()) return false;
    size_t k = 0;
    if (s.contains("prefixItems")) {
      k = s["prefixItems"].size();
      for (size_t i = 0; i < std::min(k, n); ++i)
        if (!valid(v[i], s["prefixItems"][i], root, depth + 1)) return false;
    }
    if (s.contains("items"))
      for (size_t i = k; i < n; ++i)
        if (!valid(v[i], s["items"], root, depth + 1)) return false;
  }
  if (v.is_object()) {
    if (s.contains("required"))
      for (const Json& r : s["required"])
        if (!v.contains(r.get<std::string>())) return false;
    for (const auto& [key, val] : v.items()) {
      if (s.contains("properties") && s["properties"].contains(key)) {
        if (!valid(val, s["properties"][key], root, depth + 1)) return false;
      } else if (s.contains("additionalProperties")) {
        if (!valid(val, s["additionalProperties"], root, depth + 1)) return false;
      }
    }
  }
  return true;
}

// Random schemas over the supported keywords. oneOf branches get distinct types, so "exactly one"
// holds for any value the grammar admits.
class SchemaGen {
 public:
  explicit SchemaGen(uint64_t seed) : rng_(seed) {}

  Json schema() {
    defs_ = Json::object();
    Json s = node(0, true);
    if (!defs_.empty()) {
      // One named definition and a recursive one (a tree whose children are optional).
      s = Json{{"type", "object"}, {"properties", {{"value", s}, {"ref", {{"$ref", "#/$defs/item"}}}}}, {"required", {"value"}}};
      if (coin()) {
        s["properties"]["tree"] = {{"$ref", "#/$defs/tree"}};
        defs_["tree"] = {{"type", "object"},
                         {"properties", {{"name", {{"type", "string"}, {"maxLength", 8}}},
                                         {"children", {{"type", "array"}, {"maxItems", 2}, {"items", {{"$ref", "#/$defs/tree"}}}}}}},
                         {"required", {"name"}}};
      }
      s["$defs"] = defs_;
    }
    return s;
  }

 private:
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  bool coin() { return pick(2) == 0; }
  std::string word() {
    static const char* words[] = {"id", "name", "age", "tags", "score", "ok", "city", "email", "x", "list", "na\"me", "caf\xc3\xa9"};
    return words[pick(12)];
  }

  Json scalar_value() {
    switch (pick(5)) {
      case 0: return word();
      case 1: return pick(100) - 50;
      case 2: return 1.5 * pick(10);
      case 3: return coin();
      default: return nullptr;
    }
  }

  // The top level is an object or an array, as response formats are.
  Json node(int depth, bool top = false) {
    const int kind = top ? pick(4) / 3 : depth >= 3 ? 2 + pick(7) : pick(11);
    switch (kind) {
      case 0: {  // object
        Json s = {{"type", "object"}, {"properties", Json::object()}};
        const int n = pick(4);
        Json req = Json::array();
        for (int i = 0; i < n; ++i) {
          const std::string k = word();
          if (s["properties"].contains(k)) continue;
          s["properties"][k] = node(depth + 1);
          if (coin()) req.push_back(k);
        }
        if (!req.empty()) s["required"] = req;
        switch (pick(4)) {
          case 0: s["additionalProperties"] = false; break;
          case 1: s["additionalProperties"] = true; break;
          case 2: s["additionalProperties"] = node(depth + 1); break;
          default: break;
        }
        return s;
      }
      case 1: {  // array
        Json s = {{"type", "array"}};
        if (coin()) s["items"] = node(depth + 1);
        if (pick(3) == 0) s["prefixItems"] = Json::array({node(depth + 1), node(depth + 1)});
        if (coin()) s["minItems"] = pick(3);
        if (coin()) s["maxItems"] = (s.contains("minItems") ? s["minItems"].get<int>() : 0) + pick(3);
        if (s.contains("prefixItems") && pick(3) == 0) s["items"] = false;
        return s;
      }
      case 2: {
        Json s = {{"type", "string"}};
        if (coin()) s["minLength"] = pick(4);
        if (coin()) s["maxLength"] = (s.contains("minLength") ? s["minLength"].get<int>() : 0) + pick(12);
        if (pick(4) == 0) s["format"] = "date";  // ignored by design
        return s;
      }
      case 3: return {{"type", coin() ? "number" : "integer"}};
      case 4: return {{"type", "boolean"}, {"description", "a flag"}};
      case 5: {
        Json e = Json::array();
        for (int i = 0, n = 1 + pick(4); i < n; ++i) e.push_back(scalar_value());
        return {{"enum", e}};
      }
      case 6: return {{"const", scalar_value()}};
      case 7: return {{"type", Json::array({"string", "null"})}, {"maxLength", 5}};
      case 8: {
        if (depth >= 3) return {{"type", "integer"}, {"nullable", true}};
        if (coin()) return {{"anyOf", Json::array({node(depth + 1), node(depth + 1)})}};
        return {{"oneOf", Json::array({{{"type", "integer"}}, {{"type", "string"}, {"maxLength", 3}}, {{"type", "null"}}})}};
      }
      case 9: {
        const std::string name = "item";
        if (!defs_.contains(name)) defs_[name] = {{"type", "object"}, {"properties", {{"id", {{"type", "integer"}}}}}, {"required", {"id"}}};
        return {{"$ref", "#/$defs/item"}};
      }
      default: return {{"type", "null"}};
    }
  }

  std::mt19937_64 rng_;
  Json defs_;
};

}  // namespace strata::schema_check
