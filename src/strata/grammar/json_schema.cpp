#include "strata/grammar/json_schema.h"

#include <map>
#include <optional>
#include <set>
#include <string_view>

namespace strata::grammar {

namespace {

// Longest digit runs a number may have: enough for any int64 or double, few enough that a model
// cannot write digits forever.
constexpr uint32_t kMaxIntDigits = 19;
constexpr uint32_t kMaxFracDigits = 17;
constexpr uint32_t kMaxExpDigits = 2;  // and a double never overflows
constexpr int kMaxSchemaDepth = 64;
// Longest name of a property the schema does not declare (a model must not spell one forever).
constexpr uint32_t kMaxExtraKeyChars = 64;

const std::set<std::string, std::less<>> kIgnored = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "format", "$defs", "definitions", "contentMediaType", "contentEncoding", "strict"};

ByteSet range_set(uint8_t lo, uint8_t hi) {
  ByteSet s;
  s.add_range(lo, hi);
  return s;
}

std::string type_of(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
  if (v.is_number_float()) {
    const double d = v.get<double>();
    return d == static_cast<double>(static_cast<int64_t>(d)) ? "integer" : "number";
  }
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  return "object";
}

}  // namespace

struct JsonRules::Impl {
  Grammar& g;
  JsonGrammarOptions opt;
  const Json* root = nullptr;                 // the schema $refs resolve in
  std::map<std::string, uint32_t> refs;       // "#/$defs/x" -> its rule
  std::map<std::string, uint32_t> cache;      // shared rules by name
  std::optional<uint32_t> ws_char_rule;

  Impl(Grammar& grammar, JsonGrammarOptions o) : g(grammar), opt(o) {}

  [[noreturn]] static void refuse(const std::string& path, const std::string& what) {
    throw SchemaError(cat("json schema at ", path, ": ", what));
  }

  template <class F>
  uint32_t shared(const std::string& name, F build) {
    auto it = cache.find(name);
    if (it != cache.end()) return it->second;
    const uint32_t id = build();
    cache[name] = id;
    return id;
  }

  void ws(Sequence& seq) {
    if (opt.max_ws == 0) return;
    if (!ws_char_rule) {
      ByteSet s;
      for (uint8_t c : {' ', '\t', '\n', '\r'}) s.add(c);
      ws_char_rule = g.rule("ws-char", {{g.bytes(s)}});
    }
    seq.push_back(Grammar::repeat(*ws_char_rule, 0, opt.max_ws));
  }

  Sequence lit(std::string_view text) {
    Sequence s;
    g.append_literal(s, text);
    return s;
  }

  // ---- strings ----

  // One character of a JSON string: unescaped ASCII, an escape (\u escapes of surrogates are left out,
  // so every character is one code point), or a whole UTF-8 sequence.
  uint32_t string_char() {
    return shared("string-char", [&] {
      ByteSet plain = range_set(0x20, 0x7f);
      plain.bits['"' >> 6] &= ~(uint64_t{1} << ('"' & 63));
      plain.bits['\\' >> 6] &= ~(uint64_t{1} << ('\\' & 63));
      std::vector<Sequence> alts;
      alts.push_back({g.bytes(plain)});
      ByteSet simple;
      for (uint8_t c : {'"', '\\', '/', 'b', 'f', 'n', 'r', 't'}) simple.add(c);
      alts.push_back({g.byte('\\'), g.bytes(simple)});
      ByteSet hex, hex_not_d, hex_0_7;
      hex.add_range('0', '9'), hex.add_range('a', 'f'), hex.add_range('A', 'F');
      hex_not_d = hex;
      hex_not_d.bits['d' >> 6] &= ~(uint64_t{1} << ('d' & 63));
      hex_not_d.bits['D' >> 6] &= ~(uint64_t{1} << ('D' & 63));
      hex_0_7.add_range('0', '7');
      const Element h = g.bytes(hex);
      alts.push_back({g.byte('\\'), g.byte('u'), g.bytes(hex_not_d), h, h, h});
      ByteSet d;
      d.add('d'), d.add('D');
      alts.push_back({g.byte('\\'), g.byte('u'), g.bytes(d), g.bytes(hex_0_7), h, h});
      for (Sequence& s : utf8_multi()) alts.push_back(std::move(s));
      return g.rule("string-char", std::move(alts));
    });
  }

  // The well-formed multi-byte UTF-8 sequences (RFC 3629), one alternative per lead-byte class.
  std::vector<Sequence> utf8_multi() {
    const Element cont = g.bytes(range_set(0x80, 0xbf));
    return {
        {g.bytes(range_set(0xc2, 0xdf)), cont},
        {g.byte(0xe0), g.bytes(range_set(0xa0, 0xbf)), cont},
        {g.bytes(range_set(0xe1, 0xec)), cont, cont},
        {g.byte(0xed), g.bytes(range_set(0x80, 0x9f)), cont},
        {g.bytes(range_set(0xee, 0xef)), cont, cont},
        {g.byte(0xf0), g.bytes(range_set(0x90, 0xbf)), cont, cont},
        {g.bytes(range_set(0xf1, 0xf3)), cont, cont, cont},
        {g.byte(0xf4), g.bytes(range_set(0x80, 0x8f)), cont, cont},
    };
  }

  uint32_t string_rule(uint32_t min_len, uint32_t max_len) {
    return shared(cat("string{", min_len, ",", max_len, "}"), [&] {
      Sequence s{g.byte('"')};
      if (max_len > 0) s.push_back(Grammar::repeat(string_char(), min_len, max_len));
      s.push_back(g.byte('"'));
      return g.rule("string", {s});
    });
  }

  // A property name outside `names` (written without escapes, so no escape can spell a declared name).
  uint32_t key_excluding(const std::vector<std::string>& names) {
    std::string id = "key-excluding";
    for (const std::string& n : names) id += cat(":", n.size(), ":", n);
    return shared(id, [&] {
      ByteSet plain = range_set(0x20, 0x7f);
      plain.bits['"' >> 6] &= ~(uint64_t{1} << ('"' & 63));
      plain.bits['\\' >> 6] &= ~(uint64_t{1} << ('\\' & 63));
      std::vector<Sequence> free_alts = {{g.bytes(plain)}};
      for (Sequence& s : utf8_multi()) free_alts.push_back(std::move(s));
      const uint32_t free_char = g.rule("key-char", free_alts);
      const uint32_t free_rest = g.rule("key-rest", {{Grammar::repeat(free_char, 0, kMaxExtraKeyChars), g.byte('"')}});
      // A trie of the names: at a character boundary the key may leave the trie by a byte no name
      // continues with, and is then free; inside a multi-byte character it follows the trie only.
      struct Node {
        std::map<uint8_t, size_t> next;
        bool terminal = false;
        int pending = 0;  // continuation bytes still due in the current character
      };
      std::vector<Node> nodes(1);
      for (const std::string& n : names) {
        bool plain_only = true;
        for (unsigned char c : n) plain_only = plain_only && c >= 0x20 && c != '"' && c != '\\';
        if (!plain_only) continue;  // a key without escapes can never equal it
        size_t at = 0;
        for (unsigned char c : n) {
          auto it = nodes[at].next.find(c);
          if (it == nodes[at].next.end()) {
            const int pending = nodes[at].pending > 0 ? nodes[at].pending - 1 : c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
            nodes.push_back(Node{{}, false, pending});
            it = nodes[at].next.emplace(c, nodes.size() - 1).first;
          }
          at = it->second;
        }
        nodes[at].terminal = true;
      }
      std::vector<uint32_t> ids(nodes.size());
      for (size_t i = 0; i < nodes.size(); ++i) ids[i] = g.add_rule("key-trie");
      for (size_t i = 0; i < nodes.size(); ++i) {
        const Node& nd = nodes[i];
        for (const auto& [b, child] : nd.next) g.add_alt(ids[i], {g.byte(b), Grammar::call(ids[child])});
        if (nd.pending > 0) continue;
        if (!nd.terminal) g.add_alt(ids[i], {g.byte('"')});
        for (const Sequence& alt : free_alts) {
          ByteSet lead = g.set(alt[0].index);
          for (const auto& [b, child] : nd.next) lead.bits[b >> 6] &= ~(uint64_t{1} << (b & 63));
          if (lead == ByteSet{}) continue;
          Sequence s = alt;
          s[0] = g.bytes(lead);
          s.push_back(Grammar::call(free_rest));
          g.add_alt(ids[i], std::move(s));
        }
      }
      return g.rule("key", {{g.byte('"'), Grammar::call(ids[0])}});
    });
  }

  // ---- numbers and literals ----

  uint32_t digit_rule() {
    return shared("digit", [&] { return g.rule("digit", {{g.bytes(range_set('0', '9'))}}); });
  }

  uint32_t integer_rule() {
    return shared("integer", [&] {
      const uint32_t digit = digit_rule();
      const uint32_t minus = g.rule("minus", {{g.byte('-')}});
      const uint32_t natural = g.rule("natural", {{g.byte('0')}, {g.bytes(range_set('1', '9')), Grammar::repeat(digit, 0, kMaxIntDigits - 1)}});
      return g.rule("integer", {{Grammar::repeat(minus, 0, 1), Grammar::call(natural)}});
    });
  }

  uint32_t number_rule() {
    return shared("number", [&] {
      const uint32_t integer = integer_rule();
      const uint32_t digit = digit_rule();
      const uint32_t frac = g.rule("fraction", {{g.byte('.'), Grammar::repeat(digit, 1, kMaxFracDigits)}});
      ByteSet e, sign;
      e.add('e'), e.add('E'), sign.add('+'), sign.add('-');
      const uint32_t sign_rule = g.rule("exp-sign", {{g.bytes(sign)}});
      const uint32_t exp = g.rule("exponent", {{g.bytes(e), Grammar::repeat(sign_rule, 0, 1), Grammar::repeat(digit, 1, kMaxExpDigits)}});
      return g.rule("number", {{Grammar::call(integer), Grammar::repeat(frac, 0, 1), Grammar::repeat(exp, 0, 1)}});
    });
  }

  uint32_t literal_rule(const std::string& text) {
    return shared("literal:" + text, [&] { return g.rule(text, {lit(text)}); });
  }

  // Exactly one of the texts (a trie, so values sharing a start do not multiply the matcher's stacks).
  uint32_t one_of_texts(const std::vector<std::string>& texts) {
    struct Node {
      std::map<uint8_t, size_t> next;
      bool terminal = false;
    };
    std::vector<Node> nodes(1);
    for (const std::string& t : texts) {
      size_t at = 0;
      for (unsigned char c : t) {
        auto it = nodes[at].next.find(c);
        if (it == nodes[at].next.end()) {
          nodes.push_back(Node{});
          it = nodes[at].next.emplace(c, nodes.size() - 1).first;
        }
        at = it->second;
      }
      nodes[at].terminal = true;
    }
    std::vector<uint32_t> ids(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) ids[i] = g.add_rule("enum");
    for (size_t i = 0; i < nodes.size(); ++i) {
      // Follow a chain of single-child nodes as one literal run, so long values make few rules.
      for (const auto& [b, child0] : nodes[i].next) {
        Sequence s{g.byte(b)};
        size_t c = child0;
        while (!nodes[c].terminal && nodes[c].next.size() == 1) {
          s.push_back(g.byte(nodes[c].next.begin()->first));
          c = nodes[c].next.begin()->second;
        }
        s.push_back(Grammar::call(ids[c]));
        g.add_alt(ids[i], std::move(s));
      }
      if (nodes[i].terminal) g.add_alt(ids[i], {});
    }
    return ids[0];
  }

  // ---- any value ----

  uint32_t any_value() {
    auto it = cache.find("any");
    if (it != cache.end()) return it->second;
    const uint32_t any = g.add_rule("any");
    cache["any"] = any;
    const uint32_t obj = any_object_with(any);
    Sequence arr_empty = lit("[");
    ws(arr_empty);
    arr_empty.push_back(g.byte(']'));
    Sequence sep;
    ws(sep);
    sep.push_back(g.byte(','));
    ws(sep);
    sep.push_back(Grammar::call(any));
    const uint32_t more = g.rule("array-more", {sep});
    Sequence arr_full = lit("[");
    ws(arr_full);
    arr_full.push_back(Grammar::call(any));
    arr_full.push_back(Grammar::repeat(more, 0, kUnbounded));
    ws(arr_full);
    arr_full.push_back(g.byte(']'));
    const uint32_t arr = g.rule("any-array", {arr_empty, arr_full});
    for (uint32_t r : {obj, arr, string_rule(0, kUnbounded), number_rule(), literal_rule("true"), literal_rule("false"), literal_rule("null")})
      g.add_alt(any, {Grammar::call(r)});
    return any;
  }

  uint32_t any_object_with(uint32_t value) {
    return shared(cat("any-object:", value), [&] {
      Sequence kv{Grammar::call(string_rule(0, kMaxExtraKeyChars))};
      ws(kv);
      kv.push_back(g.byte(':'));
      ws(kv);
      kv.push_back(Grammar::call(value));
      const uint32_t kv_rule = g.rule("member", {kv});
      return object_from({}, kv_rule, true, "object");
    });
  }

  // ---- objects ----

  struct Prop {
    uint32_t member;  // "name": value
    bool required;
  };

  // '{' members '}': the declared members in order (required ones always, optional ones maybe), then,
  // when `extra` is set, any number of extra members.
  uint32_t object_from(const std::vector<Prop>& props, std::optional<uint32_t> extra, bool empty_ok, const std::string& name) {
    const size_t n = props.size();
    auto sep_then = [&](uint32_t member) {
      Sequence s;
      ws(s);
      s.push_back(g.byte(','));
      ws(s);
      s.push_back(Grammar::call(member));
      return s;
    };
    // tail[i]: members i.. after at least one was written; start[i]: none written yet (absent when
    // nothing may be written from i on).
    std::vector<uint32_t> tail(n + 1);
    std::vector<std::optional<uint32_t>> start(n + 1);
    if (extra) {
      const uint32_t more = g.rule("extra-member", {sep_then(*extra)});
      tail[n] = g.rule("members-tail", {{Grammar::repeat(more, 0, kUnbounded)}});
      start[n] = g.rule("members", {{Grammar::call(*extra), Grammar::call(tail[n])}});
    } else {
      tail[n] = g.rule("members-tail", {{}});
    }
    for (size_t i = n; i-- > 0;) {
      Sequence with = sep_then(props[i].member);
      with.push_back(Grammar::call(tail[i + 1]));
      std::vector<Sequence> t{with};
      if (!props[i].required) t.push_back({Grammar::call(tail[i + 1])});
      tail[i] = g.rule("members-tail", t);
      std::vector<Sequence> s{{Grammar::call(props[i].member), Grammar::call(tail[i + 1])}};
      if (!props[i].required && start[i + 1]) s.push_back({Grammar::call(*start[i + 1])});
      start[i] = g.rule("members", s);
    }
    std::vector<Sequence> alts;
    if (empty_ok) {
      Sequence e = lit("{");
      ws(e);
      e.push_back(g.byte('}'));
      alts.push_back(e);
    }
    if (start[0]) {
      Sequence f = lit("{");
      ws(f);
      f.push_back(Grammar::call(*start[0]));
      ws(f);
      f.push_back(g.byte('}'));
      alts.push_back(f);
    }
    return g.rule(name, alts);
  }

  uint32_t object_schema(const Json& s, const std::string& path, int depth) {
    std::vector<std::string> names;
    std::vector<Prop> props;
    std::set<std::string> required;
    if (s.contains("required")) {
      const Json& r = s["required"];
      if (!r.is_array()) refuse(path + "/required", "'required' must be an array of strings");
      for (const Json& n : r) {
        if (!n.is_string()) refuse(path + "/required", "'required' must be an array of strings");
        required.insert(n.get<std::string>());
      }
    }
    const bool has_props = s.contains("properties");
    std::optional<uint32_t> extra_value;  // the additionalProperties schema's rule, when others are allowed
    if (s.contains("additionalProperties")) {
      const Json& ap = s["additionalProperties"];
      if (!(ap.is_boolean() && !ap.get<bool>())) extra_value = value(ap, path + "/additionalProperties", depth + 1);
    } else if (!has_props) {
      extra_value = any_value();
    }
    auto member = [&](const std::string& name, uint32_t v) {
      Sequence m = lit(Json(name).dump());
      ws(m);
      m.push_back(g.byte(':'));
      ws(m);
      m.push_back(Grammar::call(v));
      return g.rule("member " + name, {m});
    };
    if (has_props) {
      const Json& p = s["properties"];
      if (!p.is_object()) refuse(path + "/properties", "'properties' must be an object");
      for (const auto& [name, sub] : p.items()) {
        names.push_back(name);
        props.push_back({member(name, value(sub, path + "/properties/" + name, depth + 1)), required.count(name) > 0});
      }
    }
    for (const std::string& r : required) {
      if (std::find(names.begin(), names.end(), r) != names.end()) continue;
      if (!extra_value) refuse(path + "/required", cat("required property '", r, "' is not in 'properties' and additionalProperties is false"));
      names.push_back(r);
      props.push_back({member(r, *extra_value), true});
    }
    std::optional<uint32_t> extra;
    if (extra_value) {
      Sequence kv{Grammar::call(names.empty() ? string_rule(0, kMaxExtraKeyChars) : key_excluding(names))};
      ws(kv);
      kv.push_back(g.byte(':'));
      ws(kv);
      kv.push_back(Grammar::call(*extra_value));
      extra = g.rule("extra-member", {kv});
    }
    return object_from(props, extra, required.empty(), "object");
  }

  // ---- arrays ----

  uint32_t array_schema(const Json& s, const std::string& path, int depth) {
    std::vector<uint32_t> prefix;
    if (s.contains("prefixItems")) {
      const Json& p = s["prefixItems"];
      if (!p.is_array()) refuse(path + "/prefixItems", "'prefixItems' must be an array of schemas");
      for (size_t i = 0; i < p.size(); ++i) prefix.push_back(value(p[i], cat(path, "/prefixItems/", i), depth + 1));
    }
    std::optional<uint32_t> items;  // absent: no items past the prefix
    if (!s.contains("items")) items = any_value();
    else if (!(s["items"].is_boolean() && !s["items"].get<bool>())) {
      if (s["items"].is_array()) refuse(path + "/items", "'items' as an array (draft 4-2019) is not supported; use prefixItems");
      items = value(s["items"], path + "/items", depth + 1);
    }
    const uint32_t min_items = count(s, "minItems", path, 0);
    uint32_t max_items = count(s, "maxItems", path, kUnbounded);
    const uint32_t k = static_cast<uint32_t>(prefix.size());
    if (!items) max_items = std::min(max_items, k);
    if (min_items > max_items) refuse(path, cat("no array can have between ", min_items, " and ", max_items, " items here"));
    auto elem = [&](uint32_t i) { return i < k ? prefix[i] : *items; };
    auto sep_then = [&](uint32_t rule) {
      Sequence q;
      ws(q);
      q.push_back(g.byte(','));
      ws(q);
      q.push_back(Grammar::call(rule));
      return q;
    };
    // The items from index i >= 1 on (each after a comma), i items being written already.
    auto rest_from = [&](auto&& self, uint32_t i) -> Sequence {
      Sequence out;
      if (i >= max_items) return out;
      if (i >= k) {
        if (!items) return out;
        const uint32_t more = g.rule("array-more", {sep_then(*items)});
        const uint32_t lo = min_items > i ? min_items - i : 0;
        out.push_back(Grammar::repeat(more, lo, max_items == kUnbounded ? kUnbounded : max_items - i));
        return out;
      }
      out = sep_then(elem(i));
      for (Element e : self(self, i + 1)) out.push_back(e);
      if (i >= min_items) return {Grammar::call(g.rule("array-opt", {out, {}}))};
      return out;
    };
    std::vector<Sequence> alts;
    if (min_items == 0) {
      Sequence e = lit("[");
      ws(e);
      e.push_back(g.byte(']'));
      alts.push_back(e);
    }
    if (max_items > 0) {
      Sequence f = lit("[");
      ws(f);
      f.push_back(Grammar::call(elem(0)));
      for (Element e : rest_from(rest_from, 1)) f.push_back(e);
      ws(f);
      f.push_back(g.byte(']'));
      alts.push_back(f);
    }
    return g.rule("array", alts);
  }

  static uint32_t count(const Json& s, const char* key, const std::string& path, uint32_t fallback) {
    if (!s.contains(key)) return fallback;
    const Json& v = s[key];
    if (!(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0)) || v.get<uint64_t>() > 0x7fffffffu)
      refuse(path + "/" + key, cat("'", key, "' must be a non-negative integer below 2^31"));
    return static_cast<uint32_t>(v.get<uint64_t>());
  }

  // ---- dispatch ----

  uint32_t ref(const std::string& target, const std::string& path, int depth) {
    auto it = refs.find(target);
    if (it != refs.end()) return it->second;
    if (target.empty() || target[0] != '#') refuse(path, cat("$ref '", target, "' is not supported: only references inside the schema ('#...') are"));
    const Json* at = nullptr;
    try {
      const Json::json_pointer ptr(target.substr(1));
      if (root->contains(ptr)) at = &root->at(ptr);
    } catch (const std::exception&) {
      refuse(path, cat("$ref '", target, "' is not a valid JSON pointer"));
    }
    if (!at) refuse(path, cat("$ref '", target, "' points at nothing in the schema"));
    // The rule exists before its body is compiled, so the target may refer back to itself.
    const uint32_t id = g.add_rule("ref " + target);
    refs[target] = id;
    g.add_alt(id, {Grammar::call(value(*at, target, depth + 1))});
    return id;
  }

  uint32_t value(const Json& s, const std::string& path, int depth) {
    if (depth > kMaxSchemaDepth) refuse(path, cat("the schema nests deeper than ", kMaxSchemaDepth, " levels"));
    if (s.is_boolean()) {
      if (!s.get<bool>()) refuse(path, "the schema 'false' admits no value");
      return any_value();
    }
    if (!s.is_object()) refuse(path, cat("a schema must be an object or a boolean, got ", s.dump()));
    static const std::set<std::string, std::less<>> kTypeKeys = {
        "type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
        "maxItems", "minLength", "maxLength", "anyOf", "oneOf", "allOf", "$ref", "nullable"};
    std::vector<std::string> assertions;  // keywords that constrain the value
    for (const auto& [key, v] : s.items()) {
      if (kIgnored.count(key)) continue;
      if (!kTypeKeys.count(key)) {
        refuse(path, cat("keyword '", key, "' is not supported (supported: type, enum, const, properties, required, "
                         "additionalProperties, items, prefixItems, minItems, maxItems, minLength, maxLength, anyOf, "
                         "oneOf, allOf of one schema, $ref, nullable; ignored: format and annotations)"));
      }
      if (key != "nullable") assertions.push_back(key);
    }
    if (s.contains("nullable")) {
      if (!s["nullable"].is_boolean()) refuse(path + "/nullable", "'nullable' must be a boolean");
      if (s["nullable"].get<bool>()) {
        Json rest = s;
        rest.erase("nullable");
        const uint32_t inner = value(rest, path, depth + 1);
        return g.rule("nullable", {{Grammar::call(inner)}, {Grammar::call(literal_rule("null"))}});
      }
    }
    auto alone = [&](const char* key, std::initializer_list<const char*> allowed) {
      for (const std::string& a : assertions) {
        if (a == key) continue;
        bool ok = false;
        for (const char* x : allowed) ok = ok || a == x;
        if (!ok) refuse(path, cat("'", key, "' together with '", a, "' is not supported"));
      }
    };
    if (s.contains("$ref")) {
      alone("$ref", {});
      if (!s["$ref"].is_string()) refuse(path + "/$ref", "'$ref' must be a string");
      return ref(s["$ref"].get<std::string>(), path, depth);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      alone(key, {});
      const Json& list = s[key];
      if (!list.is_array() || list.empty()) refuse(path + "/" + key, cat("'", key, "' must be a non-empty array of schemas"));
      std::vector<Sequence> alts;
      for (size_t i = 0; i < list.size(); ++i) alts.push_back({Grammar::call(value(list[i], cat(path, "/", key, "/", i), depth + 1))});
      return g.rule(key, alts);
    }
    if (s.contains("allOf")) {
      alone("allOf", {});
      const Json& list = s["allOf"];
      if (!list.is_array() || list.size() != 1) refuse(path + "/allOf", "'allOf' is supported with exactly one schema");
      return value(list[0], path + "/allOf/0", depth + 1);
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) types.push_back(t.get<std::string>());
      else if (t.is_array() && !t.empty()) {
        for (const Json& x : t) {
          if (!x.is_string()) refuse(path + "/type", "'type' must be a string or an array of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        refuse(path + "/type", "'type' must be a string or a non-empty array of strings");
      }
      static const std::set<std::string, std::less<>> kTypes = {"object", "array", "string", "number", "integer", "boolean", "null"};
      for (const std::string& x : types)
        if (!kTypes.count(x)) refuse(path + "/type", cat("unknown type '", x, "'"));
    }
    if (s.contains("enum") || s.contains("const")) {
      std::vector<Json> values;
      if (s.contains("const")) {
        alone("const", {"type"});
        values.push_back(s["const"]);
      } else {
        alone("enum", {"type"});
        if (!s["enum"].is_array() || s["enum"].empty()) refuse(path + "/enum", "'enum' must be a non-empty array");
        for (const Json& v : s["enum"]) values.push_back(v);
      }
      std::vector<std::string> texts;
      for (const Json& v : values) {
        const std::string t = type_of(v);
        bool ok = types.empty();
        for (const std::string& x : types) ok = ok || x == t || (x == "number" && t == "integer");
        if (ok) texts.push_back(v.dump());
      }
      if (texts.empty()) refuse(path, "no value of 'enum' / 'const' has an allowed 'type'");
      return one_of_texts(texts);
    }
    if (types.empty()) {
      // No type: read it from the keywords (any value when there are none). Generating only that type
      // is a subset of what the schema admits.
      bool obj = false, arr = false, str = false;
      for (const std::string& a : assertions) {
        obj = obj || a == "properties" || a == "required" || a == "additionalProperties";
        arr = arr || a == "items" || a == "prefixItems" || a == "minItems" || a == "maxItems";
        str = str || a == "minLength" || a == "maxLength";
      }
      if (obj + arr + str > 1) refuse(path, "keywords of several types without 'type' are not supported; give 'type'");
      if (obj) types = {"object"};
      else if (arr) types = {"array"};
      else if (str) types = {"string"};
      else return any_value();
    }
    std::vector<Sequence> alts;
    for (const std::string& t : types) alts.push_back({Grammar::call(typed(s, t, path, depth))});
    if (alts.size() == 1) return alts[0][0].index;
    return g.rule("types", alts);
  }

  uint32_t typed(const Json& s, const std::string& t, const std::string& path, int depth) {
    if (t == "object") return object_schema(s, path, depth);
    if (t == "array") return array_schema(s, path, depth);
    if (t == "string") {
      const uint32_t lo = count(s, "minLength", path, 0);
      const uint32_t hi = count(s, "maxLength", path, kUnbounded);
      if (lo > hi) refuse(path, cat("minLength ", lo, " is above maxLength ", hi));
      return string_rule(lo, hi);
    }
    if (t == "number") return number_rule();
    if (t == "integer") return integer_rule();
    if (t == "boolean") return shared("boolean", [&] { return g.rule("boolean", {lit("true"), lit("false")}); });
    return literal_rule("null");
  }
};

JsonRules::JsonRules(Grammar& g, JsonGrammarOptions options) : impl_(new Impl(g, options)) {}
JsonRules::~JsonRules() { delete impl_; }

uint32_t JsonRules::schema(const Json& schema) {
  impl_->root = &schema;
  impl_->refs.clear();  // $refs are relative to this schema
  const uint32_t r = impl_->value(schema, "#", 0);
  impl_->root = nullptr;
  return r;
}

uint32_t JsonRules::any_value() { return impl_->any_value(); }
uint32_t JsonRules::any_object() { return impl_->any_object_with(impl_->any_value()); }
void JsonRules::append_ws(Sequence& seq) { impl_->ws(seq); }

Grammar json_schema_grammar(const Json& schema, JsonGrammarOptions options) {
  Grammar g;
  JsonRules rules(g, options);
  g.set_root(rules.schema(schema));
  try {
    g.finish();
  } catch (const SchemaError&) {
    throw;
  } catch (const Error& e) {
    // A grammar that cannot be matched comes from a schema like {"$ref": "#"}: say it is the schema's.
    throw SchemaError(cat("json schema: ", e.what()));
  }
  return g;
}

Grammar json_object_grammar(JsonGrammarOptions options) {
  Grammar g;
  JsonRules rules(g, options);
  g.set_root(rules.any_object());
  g.finish();
  return g;
}

}  // namespace strata::grammar
