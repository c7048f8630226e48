// GGUF value constructors, typed metadata accessors and tensor lookup. Parsing lives in parser.cpp.
#include "strata/gguf/gguf.h"

#include <cmath>
#include <limits>

#include "strata/base/error.h"

namespace strata {

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::U8: return "u8";
    case GgufType::I8: return "i8";
    case GgufType::U16: return "u16";
    case GgufType::I16: return "i16";
    case GgufType::U32: return "u32";
    case GgufType::I32: return "i32";
    case GgufType::F32: return "f32";
    case GgufType::BOOL: return "bool";
    case GgufType::STRING: return "string";
    case GgufType::ARRAY: return "array";
    case GgufType::U64: return "u64";
    case GgufType::I64: return "i64";
    case GgufType::F64: return "f64";
  }
  return "unknown";
}

namespace {

GgufValue make(GgufType t, decltype(GgufValue::v) v) {
  GgufValue out;
  out.type = t;
  out.v = std::move(v);
  return out;
}

bool is_unsigned_type(GgufType t) {
  return t == GgufType::U8 || t == GgufType::U16 || t == GgufType::U32 || t == GgufType::U64;
}
bool is_signed_type(GgufType t) {
  return t == GgufType::I8 || t == GgufType::I16 || t == GgufType::I32 || t == GgufType::I64;
}

// Describes a value's type for error messages: "u32", "array of string", "array of array".
std::string describe(const GgufValue& v) {
  if (v.type == GgufType::ARRAY) {
    if (const auto* a = std::get_if<std::shared_ptr<GgufArray>>(&v.v); a != nullptr && *a)
      return cat("array of ", gguf_type_name((*a)->elem_type));
  }
  return gguf_type_name(v.type);
}

// An integer metadata value: negative values keep their sign, others live in `u`.
struct IntValue {
  bool negative = false;
  int64_t s = 0;   // valid when negative
  uint64_t u = 0;  // valid when !negative
  std::string str() const { return negative ? std::to_string(s) : std::to_string(u); }
  template <class T>
  bool fits() const {
    if (negative) return std::numeric_limits<T>::is_signed && s >= static_cast<int64_t>(std::numeric_limits<T>::min());
    return u <= static_cast<uint64_t>(std::numeric_limits<T>::max());
  }
  template <class T>
  T as() const {
    return negative ? static_cast<T>(s) : static_cast<T>(u);
  }
};

// Returns false when the value is not an integer.
bool integer_value(const GgufValue& v, IntValue& out) {
  out = IntValue{};
  if (is_unsigned_type(v.type)) {
    if (const auto* p = std::get_if<uint64_t>(&v.v)) {
      out.u = *p;
      return true;
    }
  } else if (is_signed_type(v.type)) {
    if (const auto* p = std::get_if<int64_t>(&v.v)) {
      if (*p < 0) {
        out.negative = true;
        out.s = *p;
      } else {
        out.u = static_cast<uint64_t>(*p);
      }
      return true;
    }
  }
  return false;
}

}  // namespace

GgufValue GgufValue::u8(uint8_t x) { return make(GgufType::U8, uint64_t{x}); }
GgufValue GgufValue::i8(int8_t x) { return make(GgufType::I8, int64_t{x}); }
GgufValue GgufValue::u16(uint16_t x) { return make(GgufType::U16, uint64_t{x}); }
GgufValue GgufValue::i16(int16_t x) { return make(GgufType::I16, int64_t{x}); }
GgufValue GgufValue::u32(uint32_t x) { return make(GgufType::U32, uint64_t{x}); }
GgufValue GgufValue::i32(int32_t x) { return make(GgufType::I32, int64_t{x}); }
GgufValue GgufValue::u64(uint64_t x) { return make(GgufType::U64, x); }
GgufValue GgufValue::i64(int64_t x) { return make(GgufType::I64, x); }
GgufValue GgufValue::f32(float x) { return make(GgufType::F32, static_cast<double>(x)); }
GgufValue GgufValue::f64(double x) { return make(GgufType::F64, x); }
GgufValue GgufValue::boolean(bool x) { return make(GgufType::BOOL, x); }
GgufValue GgufValue::str(std::string x) { return make(GgufType::STRING, std::move(x)); }

GgufValue GgufValue::array(GgufType elem_type, std::vector<GgufValue> items) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].type != elem_type)
      fail("GGUF array of ", gguf_type_name(elem_type), ": item ", i, " has type ", gguf_type_name(items[i].type));
  }
  auto arr = std::make_shared<GgufArray>();
  arr->elem_type = elem_type;
  arr->items = std::move(items);
  return make(GgufType::ARRAY, std::move(arr));
}

GgufValue GgufValue::string_array(const std::vector<std::string>& items) {
  std::vector<GgufValue> vals;
  vals.reserve(items.size());
  for (const auto& s : items) vals.push_back(str(s));
  return array(GgufType::STRING, std::move(vals));
}

GgufValue GgufValue::f32_array(const std::vector<float>& items) {
  std::vector<GgufValue> vals;
  vals.reserve(items.size());
  for (float x : items) vals.push_back(f32(x));
  return array(GgufType::F32, std::move(vals));
}

GgufValue GgufValue::i32_array(const std::vector<int32_t>& items) {
  std::vector<GgufValue> vals;
  vals.reserve(items.size());
  for (int32_t x : items) vals.push_back(i32(x));
  return array(GgufType::I32, std::move(vals));
}

std::string GgufTensorInfo::shape_string() const {
  std::string s = "[";
  for (uint32_t i = 0; i < n_dims; ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(ne[i]);
  }
  return s + "]";
}

// --- lookup ---------------------------------------------------------------------------------------

const GgufValue* GgufFile::find(std::string_view key) const {
  for (const auto& [k, v] : metadata_) {
    if (k == key) return &v;
  }
  return nullptr;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufFile::tensor(std::string_view name) const {
  const GgufTensorInfo* t = find_tensor(name);
  if (t == nullptr) fail(path(), ": no tensor named '", name, "'");
  return *t;
}

// --- typed accessors ------------------------------------------------------------------------------

namespace {

const GgufValue& require(const GgufFile& f, std::string_view key) {
  const GgufValue* v = f.find(key);
  if (v == nullptr) fail(f.path(), ": missing metadata key '", key, "'");
  return *v;
}

[[noreturn]] void wrong_type(const GgufFile& f, std::string_view key, const char* expected, const GgufValue& v) {
  fail(f.path(), ": metadata key '", key, "': expected ", expected, ", found ", describe(v));
}

template <class T>
T integer_as(const GgufFile& f, std::string_view key, const GgufValue& v, const char* expected) {
  IntValue x;
  if (!integer_value(v, x)) wrong_type(f, key, expected, v);
  if (!x.fits<T>())
    fail(f.path(), ": metadata key '", key, "': value ", x.str(), " (", gguf_type_name(v.type), ") does not fit in ", expected);
  return x.as<T>();
}

// Narrows to float; a finite f64 beyond float's range is an error (the conversion would be undefined).
float narrow_to_float(const GgufFile& f, std::string_view key, double d) {
  if (std::isfinite(d) && std::fabs(d) > static_cast<double>(std::numeric_limits<float>::max()))
    fail(f.path(), ": metadata key '", key, "': value ", d, " does not fit in f32");
  return static_cast<float>(d);
}

float float_as(const GgufFile& f, std::string_view key, const GgufValue& v) {
  if (v.type != GgufType::F32 && v.type != GgufType::F64) wrong_type(f, key, "f32 or f64", v);
  return narrow_to_float(f, key, std::get<double>(v.v));
}

const GgufArray& array_of(const GgufFile& f, std::string_view key, const GgufValue& v, const char* expected) {
  if (v.type != GgufType::ARRAY) wrong_type(f, key, expected, v);
  const auto& arr = std::get<std::shared_ptr<GgufArray>>(v.v);
  if (!arr) wrong_type(f, key, expected, v);
  return *arr;
}

}  // namespace

uint64_t GgufFile::get_u64(std::string_view key) const {
  return integer_as<uint64_t>(*this, key, require(*this, key), "u64");
}
int64_t GgufFile::get_i64(std::string_view key) const {
  return integer_as<int64_t>(*this, key, require(*this, key), "i64");
}
uint32_t GgufFile::get_u32(std::string_view key) const {
  return integer_as<uint32_t>(*this, key, require(*this, key), "u32");
}
float GgufFile::get_f32(std::string_view key) const { return float_as(*this, key, require(*this, key)); }

bool GgufFile::get_bool(std::string_view key) const {
  const GgufValue& v = require(*this, key);
  if (v.type != GgufType::BOOL) wrong_type(*this, key, "bool", v);
  return std::get<bool>(v.v);
}

std::string GgufFile::get_string(std::string_view key) const {
  const GgufValue& v = require(*this, key);
  if (v.type != GgufType::STRING) wrong_type(*this, key, "string", v);
  return std::get<std::string>(v.v);
}

std::vector<std::string> GgufFile::get_string_array(std::string_view key) const {
  const GgufArray& a = array_of(*this, key, require(*this, key), "array of string");
  if (a.elem_type != GgufType::STRING) wrong_type(*this, key, "array of string", *find(key));
  std::vector<std::string> out;
  out.reserve(a.items.size());
  for (const auto& it : a.items) out.push_back(std::get<std::string>(it.v));
  return out;
}

std::vector<int64_t> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue& v = require(*this, key);
  const GgufArray& a = array_of(*this, key, v, "array of integers");
  if (!is_unsigned_type(a.elem_type) && !is_signed_type(a.elem_type)) wrong_type(*this, key, "array of integers", v);
  std::vector<int64_t> out;
  out.reserve(a.items.size());
  for (size_t i = 0; i < a.items.size(); ++i) {
    IntValue x;
    integer_value(a.items[i], x);
    if (!x.fits<int64_t>()) fail(path(), ": metadata key '", key, "': item ", i, " (", x.str(), ") does not fit in i64");
    out.push_back(x.as<int64_t>());
  }
  return out;
}

std::vector<float> GgufFile::get_f32_array(std::string_view key) const {
  const GgufValue& v = require(*this, key);
  const GgufArray& a = array_of(*this, key, v, "array of f32");
  if (a.elem_type != GgufType::F32 && a.elem_type != GgufType::F64) wrong_type(*this, key, "array of f32", v);
  std::vector<float> out;
  out.reserve(a.items.size());
  for (const auto& it : a.items) out.push_back(narrow_to_float(*this, key, std::get<double>(it.v)));
  return out;
}

uint32_t GgufFile::get_u32_or(std::string_view key, uint32_t def) const {
  return has(key) ? get_u32(key) : def;
}
float GgufFile::get_f32_or(std::string_view key, float def) const { return has(key) ? get_f32(key) : def; }
bool GgufFile::get_bool_or(std::string_view key, bool def) const { return has(key) ? get_bool(key) : def; }
std::string GgufFile::get_string_or(std::string_view key, std::string def) const {
  return has(key) ? get_string(key) : def;
}

}  // namespace strata
