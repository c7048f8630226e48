// Test helpers for GGUF: a byte-level file builder written independently of strata's writer (so the
// reader is checked against bytes laid out by hand from the spec), and small file utilities.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace strata_test {

// Appends little-endian fields one byte at a time; offsets of interesting fields are read from size().
struct Bytes {
  std::vector<uint8_t> b;

  size_t size() const { return b.size(); }
  Bytes& raw(const std::string& s) {
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& le(uint64_t x, int nbytes) {
    for (int i = 0; i < nbytes; ++i) b.push_back(static_cast<uint8_t>(x >> (8 * i)));
    return *this;
  }
  Bytes& u8(uint8_t x) { return le(x, 1); }
  Bytes& u32(uint32_t x) { return le(x, 4); }
  Bytes& u64(uint64_t x) { return le(x, 8); }
  Bytes& str(const std::string& s) { return u64(s.size()).raw(s); }
  Bytes& header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    return raw("GGUF").u32(version).u64(n_tensors).u64(n_kv);
  }
  Bytes& kv_u32(const std::string& key, uint32_t v) { return str(key).u32(4).u32(v); }
  Bytes& kv_str(const std::string& key, const std::string& v) { return str(key).u32(8).str(v); }
  // Tensor info with n dims; returns *this. Type ids: 0 f32, 2 q4_0, ...
  Bytes& tensor(const std::string& name, const std::vector<uint64_t>& dims, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) u64(d);
    return u32(type).u64(offset);
  }
  Bytes& pad(size_t alignment) {
    while (b.size() % alignment != 0) b.push_back(0);
    return *this;
  }
  Bytes& zeros(size_t n) {
    b.insert(b.end(), n, 0);
    return *this;
  }
};

inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace strata_test
