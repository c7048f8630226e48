// Writing GGUF v3 files: metadata of every type, tensors aligned to general.alignment.
// Tensor bytes come either from memory or from a callback that fills them in place, so writers of
// multi-gigabyte files (synth, convert) never hold the whole file in memory.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "strata/gguf/gguf.h"

namespace strata {

class GgufWriter {
 public:
  // Fills exactly `nbytes` bytes at dst for one tensor.
  using Fill = std::function<void(uint8_t* dst, size_t nbytes)>;

  explicit GgufWriter(uint32_t alignment = 32);

  // Sets (or replaces, keeping its position) a metadata key.
  void set(const std::string& key, GgufValue value);
  // Adds a tensor whose bytes are copied now. nbytes must equal the size implied by type and shape.
  void add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne,
                  const void* data, size_t nbytes);
  // Adds a tensor whose bytes are produced by `fill` while the file is written.
  void add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne, Fill fill);

  // Opt-in (default off): fill the next tensor while the previous one's bytes are written on a
  // helper thread. Fill callbacks then run concurrently with file writes (never with each other);
  // memory use is two buffers of the largest filled tensor. Same bytes either way.
  void set_overlap_fill(bool on) { overlap_fill_ = on; }

  // Writes the file (to a temporary name, then renamed, so a failed write leaves no partial file).
  void write(const std::string& path) const;

 private:
  struct Pending {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    size_t nbytes;
    std::vector<uint8_t> bytes;  // empty when `fill` is used
    Fill fill;
  };
  uint32_t alignment_;
  bool overlap_fill_ = false;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<Pending> tensors_;
};

}  // namespace strata
