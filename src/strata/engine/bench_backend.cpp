#include "strata/engine/bench_backend.h"

#include "strata/engine/sequence.h"
#include "strata/engine/session.h"

namespace strata {

namespace {
SamplerParams greedy_params() {
  SamplerParams p;
  p.temperature = 0.0f;
  p.seed = 1;  // greedy draws nothing; a fixed seed spares the random device
  return p;
}
}  // namespace

SequenceBenchBackend::SequenceBenchBackend(std::unique_ptr<Sequence> sequence, std::string name, VramTiers tiers)
    : sequence_(std::move(sequence)), name_(std::move(name)), tiers_(std::move(tiers)), greedy_(greedy_params()) {}

SequenceBenchBackend::~SequenceBenchBackend() = default;

int64_t SequenceBenchBackend::n_vocab() const { return sequence_->model().config().n_vocab; }

void SequenceBenchBackend::reset() { sequence_->reset(); }

void SequenceBenchBackend::forward(const int32_t* tokens, int n, float* logits, bool all_positions) {
  sequence_->forward(tokens, n, logits, all_positions);
}

int32_t SequenceBenchBackend::decode_greedy(int32_t token, float*) {
  const int32_t id =
      sequence_->decode_and_pick(token, greedy_, no_history_, static_cast<int32_t>(n_vocab()), scratch_);
  // A backend that picks on its device leaves the scratch empty (Sequence::decode_and_pick).
  if (!probed_) on_device_ = scratch_.empty(), probed_ = true;
  return id;
}

std::vector<std::pair<std::string, size_t>> SequenceBenchBackend::vram_by_tier() const {
  return tiers_ ? tiers_(*sequence_) : std::vector<std::pair<std::string, size_t>>{};
}

std::unique_ptr<BenchBackend> make_cpu_bench_backend(const Model& model, int max_ctx) {
  return std::make_unique<SequenceBenchBackend>(std::make_unique<Session>(model, max_ctx), "cpu");
}

}  // namespace strata
