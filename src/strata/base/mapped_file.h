// A read-only memory mapping of a whole file. Model weights are used straight from the mapping
// (zero-copy); the mapping lives as long as the MappedFile object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace strata {

class MappedFile {
 public:
  // Maps `path` read-only. Throws strata::Error naming the file when it cannot be opened or mapped.
  // An empty file maps to size() == 0 and data() == nullptr.
  static MappedFile open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release();
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace strata
