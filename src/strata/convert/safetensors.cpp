#include "strata/convert/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "strata/base/error.h"
#include "strata/quant/fp16.h"

namespace strata::convert {

namespace {

struct DtypeInfo {
  StDtype type;
  const char* name;
  size_t size;
};

constexpr DtypeInfo kDtypes[] = {
    {StDtype::F32, "F32", 4},   {StDtype::F16, "F16", 2},         {StDtype::BF16, "BF16", 2},
    {StDtype::F64, "F64", 8},   {StDtype::I64, "I64", 8},         {StDtype::I32, "I32", 4},
    {StDtype::I16, "I16", 2},   {StDtype::I8, "I8", 1},           {StDtype::U8, "U8", 1},
    {StDtype::BOOL, "BOOL", 1}, {StDtype::F8_E4M3, "F8_E4M3", 1}, {StDtype::F8_E5M2, "F8_E5M2", 1},
};

const DtypeInfo* dtype_by_name(const std::string& s) {
  for (const auto& d : kDtypes) {
    if (s == d.name) return &d;
  }
  return nullptr;
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

const char* st_dtype_name(StDtype t) {
  for (const auto& d : kDtypes) {
    if (d.type == t) return d.name;
  }
  return "?";
}

size_t st_dtype_size(StDtype t) {
  for (const auto& d : kDtypes) {
    if (d.type == t) return d.size;
  }
  return 0;
}

int64_t StTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string StTensor::shape_string() const {
  std::ostringstream s;
  s << "(";
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << ")";
  return s.str();
}

void StTensor::read_f32(int64_t first, int64_t count, float* dst) const {
  if (first < 0 || count < 0 || first + count > numel())
    fail(file, ": tensor '", name, "': read of elements [", first, ", ", first + count, ") outside ", numel());
  switch (dtype) {
    case StDtype::F32:
      std::memcpy(dst, data + first * 4, static_cast<size_t>(count) * 4);
      return;
    case StDtype::F16: {
      const uint8_t* p = data + first * 2;
      for (int64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = fp16_to_fp32(h);
      }
      return;
    }
    case StDtype::BF16: {
      const uint8_t* p = data + first * 2;
      for (int64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = bf16_to_fp32(h);
      }
      return;
    }
    default:
      fail(file, ": tensor '", name, "': dtype ", st_dtype_name(dtype),
           " is not supported for conversion (supported: F32, F16, BF16)");
  }
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile sf;
  sf.file_ = std::make_shared<MappedFile>(MappedFile::open(path));
  const uint8_t* base = sf.file_->data();
  const size_t size = sf.file_->size();
  if (size < 8) fail(path, ": offset 0: file of ", size, " bytes is too short for a safetensors header");
  const uint64_t header_len = read_u64_le(base);
  if (header_len > size - 8)
    fail(path, ": offset 0: header length ", header_len, " exceeds the file (", size, " bytes): truncated file?");
  const size_t data_start = 8 + static_cast<size_t>(header_len);
  const size_t data_size = size - data_start;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(base + 8, base + data_start);
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": offset 8: header is not valid JSON: ", e.what());
  }
  if (!header.is_object()) fail(path, ": offset 8: header is not a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string& name = it.key();
    const auto& e = it.value();
    auto bad = [&](const std::string& what) { fail(path, ": tensor '", name, "': ", what); };
    if (!e.is_object()) bad("entry is not an object");
    if (!e.contains("dtype") || !e["dtype"].is_string()) bad("missing string 'dtype'");
    if (!e.contains("shape") || !e["shape"].is_array()) bad("missing array 'shape'");
    if (!e.contains("data_offsets") || !e["data_offsets"].is_array() || e["data_offsets"].size() != 2)
      bad("missing 'data_offsets' [begin, end]");
    const DtypeInfo* dt = dtype_by_name(e["dtype"].get<std::string>());
    if (dt == nullptr) bad("unknown dtype '" + e["dtype"].get<std::string>() + "'");

    StTensor t;
    t.name = name;
    t.dtype = dt->type;
    t.file = path;
    uint64_t numel = 1;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned()) bad("shape entries must be non-negative integers");
      const uint64_t v = d.get<uint64_t>();
      if (v != 0 && numel > std::numeric_limits<uint64_t>::max() / 4 / v) bad("shape too large");
      numel *= v;
      t.shape.push_back(static_cast<int64_t>(v));
    }
    const auto& off = e["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) bad("data_offsets must be non-negative integers");
    const uint64_t begin = off[0].get<uint64_t>();
    const uint64_t end = off[1].get<uint64_t>();
    if (end < begin) bad(cat("data_offsets [", begin, ", ", end, "] end before begin"));
    if (end > data_size)
      bad(cat("data_offsets [", begin, ", ", end, "] reach past the end of the data section (", data_size,
              " bytes): truncated file?"));
    if (end - begin != numel * dt->size)
      bad(cat("holds ", end - begin, " bytes but shape ", t.shape_string(), " of ", dt->name, " needs ",
              numel * dt->size));
    t.data = base + data_start + begin;
    t.nbytes = static_cast<size_t>(end - begin);
    sf.tensors_.push_back(std::move(t));
  }
  return sf;
}

HfCheckpoint HfCheckpoint::open(const std::string& dir) {
  namespace fs = std::filesystem;
  HfCheckpoint ck;
  ck.dir_ = dir;
  if (!fs::is_directory(dir)) fail(dir, ": not a directory");

  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  if (fs::exists(index_path)) {
    std::ifstream in(index_path);
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      fail(index_path.string(), ": not valid JSON: ", e.what());
    }
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      fail(index_path.string(), ": missing object 'weight_map'");
    std::set<std::string> shard_names;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string()) fail(index_path.string(), ": weight_map['", it.key(), "'] is not a string");
      weight_map[it.key()] = it.value().get<std::string>();
      shard_names.insert(it.value().get<std::string>());
    }
    for (const auto& s : shard_names) {
      const fs::path p = fs::path(dir) / s;
      if (!fs::exists(p)) fail(index_path.string(), ": names shard '", s, "', which is missing from ", dir);
      ck.files_.push_back(p.string());
    }
  } else {
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.is_regular_file() && entry.path().extension() == ".safetensors") ck.files_.push_back(entry.path().string());
    }
    std::sort(ck.files_.begin(), ck.files_.end());
  }
  if (ck.files_.empty()) fail(dir, ": no *.safetensors files (and no model.safetensors.index.json)");

  for (const auto& f : ck.files_) ck.shards_.push_back(SafetensorsFile::open(f));
  for (const auto& shard : ck.shards_) {
    for (const auto& t : shard.tensors()) {
      auto [pos, inserted] = ck.by_name_.emplace(t.name, &t);
      if (!inserted) fail(dir, ": tensor '", t.name, "' appears in both ", pos->second->file, " and ", t.file);
    }
  }
  if (!weight_map.empty()) {
    for (const auto& [name, shard] : weight_map) {
      const StTensor* t = ck.find(name);
      if (t == nullptr) fail(index_path.string(), ": tensor '", name, "' is listed for shard '", shard, "' but not found in it");
      if (fs::path(t->file).filename() != shard)
        fail(index_path.string(), ": tensor '", name, "' is listed for shard '", shard, "' but found in ", t->file);
    }
    for (const auto& [name, t] : ck.by_name_) {
      if (!weight_map.count(name)) fail(index_path.string(), ": tensor '", name, "' in ", t->file, " is not in the index");
    }
  }
  return ck;
}

const StTensor* HfCheckpoint::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const StTensor& HfCheckpoint::get(const std::string& name) const {
  const StTensor* t = find(name);
  if (t == nullptr) fail(dir_, ": tensor '", name, "' not found in the checkpoint");
  return *t;
}

std::vector<std::string> HfCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [n, t] : by_name_) out.push_back(n);
  return out;
}

}  // namespace strata::convert
