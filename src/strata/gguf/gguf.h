// GGUF files: reading (memory-mapped, validated before use) and the value model shared with the writer.
// Format facts: the public GGUF specification.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "strata/base/mapped_file.h"
#include "strata/quant/types.h"

namespace strata {

enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* gguf_type_name(GgufType t);

struct GgufArray;

// One metadata value. Scalars keep their exact GGUF type so a file round-trips through the writer.
struct GgufValue {
  GgufType type = GgufType::U32;
  // Integers of every width live in i64/u64, floats in double; `type` says what the file holds.
  std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<GgufArray>> v;

  static GgufValue u8(uint8_t x);
  static GgufValue i8(int8_t x);
  static GgufValue u16(uint16_t x);
  static GgufValue i16(int16_t x);
  static GgufValue u32(uint32_t x);
  static GgufValue i32(int32_t x);
  static GgufValue u64(uint64_t x);
  static GgufValue i64(int64_t x);
  static GgufValue f32(float x);
  static GgufValue f64(double x);
  static GgufValue boolean(bool x);
  static GgufValue str(std::string x);
  static GgufValue array(GgufType elem_type, std::vector<GgufValue> items);
  static GgufValue string_array(const std::vector<std::string>& items);
  static GgufValue f32_array(const std::vector<float>& items);
  static GgufValue i32_array(const std::vector<int32_t>& items);
};

struct GgufArray {
  GgufType elem_type = GgufType::U8;
  std::vector<GgufValue> items;
};

struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::F32;
  uint32_t n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};  // ne[0] is the contiguous (row) dimension
  uint64_t offset = 0;           // relative to the data section
  const uint8_t* data = nullptr; // points into the mapping
  size_t nbytes = 0;

  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  size_t row_nbytes() const { return row_bytes(type, ne[0]); }
  std::string shape_string() const;  // "[2048, 512, 256]"
};

class GgufFile {
 public:
  // Maps and validates the whole file. Any problem throws strata::Error of the form
  // "<path>: offset <n>: <problem>"; nothing is read outside the mapping.
  static GgufFile open(const std::string& path);

  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  const std::string& path() const { return file_.path(); }
  size_t file_size() const { return file_.size(); }

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed accessors. Missing key or incompatible type throws strata::Error naming file, key,
  // expected and actual type. Integer getters accept any integer type whose value fits.
  uint64_t get_u64(std::string_view key) const;
  int64_t get_i64(std::string_view key) const;
  uint32_t get_u32(std::string_view key) const;
  float get_f32(std::string_view key) const;   // accepts F32 and F64
  bool get_bool(std::string_view key) const;
  std::string get_string(std::string_view key) const;
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;
  std::vector<float> get_f32_array(std::string_view key) const;
  // Same, with a default when the key is absent (a present key of the wrong type still throws).
  uint32_t get_u32_or(std::string_view key, uint32_t def) const;
  float get_f32_or(std::string_view key, float def) const;
  bool get_bool_or(std::string_view key, bool def) const;
  std::string get_string_or(std::string_view key, std::string def) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  const GgufTensorInfo& tensor(std::string_view name) const;  // throws when absent

 private:
  MappedFile file_;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;  // name -> index in tensors_
  friend class GgufParser;
};

}  // namespace strata
