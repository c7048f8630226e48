// What `strata bench` times: anything that runs a sequence forward and can start over. The CPU
// Session is one; a GPU session can plug in the same way (implement BenchBackend).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace strata {

class Model;

class BenchBackend {
 public:
  virtual ~BenchBackend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda", ... (the table's backend column)
  virtual int64_t n_vocab() const = 0;
  // Starts a fresh sequence (empty KV cache / DeltaNet state).
  virtual void reset() = 0;
  // Runs n tokens after those already seen; logits as Session::forward.
  virtual void forward(const int32_t* tokens, int n, float* logits, bool all_positions) = 0;
  // One greedy decode step: runs `token` and returns the arg-max (lowest index among equals) of its
  // logits. The default runs forward into `logits` (n_vocab floats) and picks on the host; a GPU
  // backend picks on the device and copies back only the token id (as llama-bench's tg measures).
  virtual int32_t decode_greedy(int32_t token, float* logits);
  // Whether decode_greedy picks on the device (the bench report says so).
  virtual bool greedy_on_device() const { return false; }
  // Device memory in use by tier ("weights", "kv", "scratch", ...) in bytes; empty for the CPU.
  virtual std::vector<std::pair<std::string, size_t>> vram_by_tier() const { return {}; }
};

// The CPU engine (Session) on `model`, holding at most max_ctx tokens. The model must outlive it.
std::unique_ptr<BenchBackend> make_cpu_bench_backend(const Model& model, int max_ctx);

}  // namespace strata
