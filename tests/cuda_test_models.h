// What the GPU test files share: the skip when no GPU is present, device buffers, model files made from the HF
// fixtures (converted, or re-encoded in K-quants), and the logits comparison they all use.
// Include only where STRATA_HAVE_CUDA is defined.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "logits_compare.h"
#include "strata/convert/converter.h"
#include "strata/cuda/gpu_session.h"
#include "strata/gguf/gguf.h"
#include "strata/gguf/writer.h"
#include "strata/quant/quantize.h"

#define REQUIRE_GPU()                                                                            \
  do {                                                                                           \
    if (!strata::cuda::device_available())                                                       \
      GTEST_SKIP() << "no CUDA device: " << strata::cuda::device_description();                  \
  } while (0)

namespace strata::cuda_test {

// A device buffer holding a copy of a host vector, poisoned (all bits set: NaN for floats) when made
// empty (a buffer that must start at zero is made from a vector of zeros).
template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0xff, n * sizeof(T)), cudaSuccess);
  }
  explicit Dev(const std::vector<T>& v) : Dev(v.size()) {
    EXPECT_EQ(cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  std::vector<T> get() const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};


inline std::filesystem::path tmp_dir() {
  const std::filesystem::path d = std::filesystem::path(STRATA_BINARY_DIR) / "test_tmp";
  std::filesystem::create_directories(d);
  return d;
}

// tests/fixtures/hf/<name> converted to `type`, written as test_tmp/<prefix><name>_<type>.gguf (each test
// program passes its own prefix: ctest runs them in parallel).
inline std::string convert_fixture(const std::string& name, const std::string& type, const std::string& prefix) {
  convert::ConvertOptions opt;
  opt.hf_dir = (std::filesystem::path(STRATA_SOURCE_DIR) / "tests" / "fixtures" / "hf" / name).string();
  opt.out_path = (tmp_dir() / (prefix + name + "_" + type + ".gguf")).string();
  opt.type = type;
  convert::convert_hf_to_gguf(opt);
  return opt.out_path;
}

// A copy of a GGUF file whose 2-D+ tensors with rows of a multiple of 256 are re-encoded in K-quants
// (Q4_K, Q5_K, Q6_K in turn), the others kept as they are; written as test_tmp/<stem><suffix>.gguf.
inline std::string kquant_copy(const std::string& path, const std::string& suffix) {
  const GgufFile f = GgufFile::open(path);
  GgufWriter w;
  for (const auto& [key, value] : f.metadata()) w.set(key, value);
  const GgmlType cycle[] = {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};
  int i = 0;
  for (const auto& t : f.tensors()) {
    std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
    const bool requant = t.n_dims >= 2 && t.ne[0] % 256 == 0 && t.type != GgmlType::F32;
    if (!requant) {
      w.add_tensor(t.name, t.type, ne, t.data, t.row_nbytes() * static_cast<size_t>(t.n_rows()));
      continue;
    }
    const GgmlType type = cycle[i++ % 3];
    const size_t rb = row_bytes(type, t.ne[0]);
    std::vector<uint8_t> out(rb * static_cast<size_t>(t.n_rows()));
    std::vector<float> row(static_cast<size_t>(t.ne[0]));
    for (int64_t r = 0; r < t.n_rows(); ++r) {
      dequantize_row(t.type, t.data + static_cast<size_t>(r) * t.row_nbytes(), row.data(), t.ne[0]);
      quantize_row(type, row.data(), out.data() + static_cast<size_t>(r) * rb, t.ne[0]);
    }
    w.add_tensor(t.name, type, ne, out.data(), out.size());
  }
  const std::string out = (tmp_dir() / (std::filesystem::path(path).stem().string() + suffix + ".gguf")).string();
  w.write(out);
  return out;
}

using test_util::max_row_rel_err;

}  // namespace strata::cuda_test
