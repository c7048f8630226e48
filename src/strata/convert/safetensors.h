// Reading safetensors checkpoints: one file (memory-mapped, header validated before use) and a
// checkpoint directory (sharded through model.safetensors.index.json, or every *.safetensors in it).
// Format facts (public spec of the safetensors format): u64 little-endian header length N, N bytes of
// JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the data;
// offsets are relative to the first byte after the header, row-major (last dimension contiguous).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "strata/base/mapped_file.h"

namespace strata::convert {

// Element types strata can convert to float. Others (I64, U8, F8_*) are parsed so the header can be
// validated, but reading them as floats throws.
enum class StDtype { F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL, F8_E4M3, F8_E5M2 };

const char* st_dtype_name(StDtype t);
size_t st_dtype_size(StDtype t);

// One tensor inside a mapped safetensors file.
struct StTensor {
  std::string name;
  StDtype dtype = StDtype::F32;
  std::vector<int64_t> shape;  // HF order: shape.back() is the contiguous dimension
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  std::string file;  // for error messages

  int64_t numel() const;
  // Length of one row: the last dimension (1 for a scalar).
  int64_t row_length() const { return shape.empty() ? 1 : shape.back(); }
  int64_t n_rows() const { return numel() / (row_length() == 0 ? 1 : row_length()); }
  std::string shape_string() const;  // "(2048, 512)"

  // Converts elements [first, first+count) to float32. Throws for dtypes that are not F32/F16/BF16,
  // naming the tensor and file.
  void read_f32(int64_t first, int64_t count, float* dst) const;
};

class SafetensorsFile {
 public:
  // Maps and validates: header length within the file, JSON well formed, every dtype known, shape
  // and byte range consistent, ranges inside the data section. Errors name the file and tensor.
  static SafetensorsFile open(const std::string& path);

  const std::vector<StTensor>& tensors() const { return tensors_; }
  const std::string& path() const { return file_->path(); }

 private:
  std::shared_ptr<MappedFile> file_;
  std::vector<StTensor> tensors_;
};

// All tensors of a checkpoint directory, by name, with bookkeeping of which ones a conversion used.
class HfCheckpoint {
 public:
  // Uses model.safetensors.index.json when present (every shard it names must exist and hold exactly
  // the tensors the index assigns to it); otherwise every *.safetensors file in dir (sorted).
  static HfCheckpoint open(const std::string& dir);

  const StTensor* find(const std::string& name) const;
  // Throws "<dir>: tensor 'name' not found" when absent.
  const StTensor& get(const std::string& name) const;
  bool has(const std::string& name) const { return find(name) != nullptr; }
  std::vector<std::string> names() const;  // sorted
  const std::vector<std::string>& files() const { return files_; }
  const std::string& dir() const { return dir_; }

  // Marks a tensor as consumed by the conversion; used() tells leftovers apart.
  void mark_used(const std::string& name) const { used_.insert(name); }
  bool used(const std::string& name) const { return used_.count(name) != 0; }

 private:
  std::string dir_;
  std::vector<std::string> files_;
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, const StTensor*> by_name_;
  mutable std::set<std::string> used_;
};

}  // namespace strata::convert
