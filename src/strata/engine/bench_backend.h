// What `strata bench` times: anything that runs a sequence forward and can start over. Every real
// backend is a Sequence (the CPU Session, a GPU session from the same factory run and serve use), timed
// through SequenceBenchBackend; tests plug in fakes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "strata/sample/sampler.h"

namespace strata {

class Model;
class Sequence;

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
  // Whether decode_greedy picked on the device (the bench report says so); read after decoding.
  virtual bool greedy_on_device() const { return false; }
  // Device memory in use by tier ("weights", "kv", "scratch", ...) in bytes; empty for the CPU.
  virtual std::vector<std::pair<std::string, size_t>> vram_by_tier() const { return {}; }
};

using VramTiers = std::function<std::vector<std::pair<std::string, size_t>>(const Sequence&)>;

// Times a Sequence: greedy steps go through Sequence::decode_and_pick with a greedy sampler, so a
// backend that picks on its device (the GPU session) copies back only the token id. `tiers` (optional)
// reports the sequence's device memory.
class SequenceBenchBackend final : public BenchBackend {
 public:
  SequenceBenchBackend(std::unique_ptr<Sequence> sequence, std::string name, VramTiers tiers = {});
  ~SequenceBenchBackend() override;
  std::string name() const override { return name_; }
  int64_t n_vocab() const override;
  void reset() override;
  void forward(const int32_t* tokens, int n, float* logits, bool all_positions) override;
  int32_t decode_greedy(int32_t token, float* logits) override;
  bool greedy_on_device() const override { return on_device_; }
  std::vector<std::pair<std::string, size_t>> vram_by_tier() const override;
  Sequence& sequence() { return *sequence_; }

 private:
  std::unique_ptr<Sequence> sequence_;
  std::string name_;
  VramTiers tiers_;
  Sampler greedy_;
  std::vector<float> scratch_;
  std::vector<int32_t> no_history_;
  bool on_device_ = false;
  bool probed_ = false;
};

// The CPU engine (Session) on `model`, holding at most max_ctx tokens. The model must outlive it.
std::unique_ptr<BenchBackend> make_cpu_bench_backend(const Model& model, int max_ctx);

}  // namespace strata
