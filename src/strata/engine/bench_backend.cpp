#include "strata/engine/bench_backend.h"

#include "strata/engine/session.h"

namespace strata {

namespace {

class CpuBenchBackend final : public BenchBackend {
 public:
  CpuBenchBackend(const Model& model, int max_ctx) : session_(model, max_ctx) {}
  std::string name() const override { return "cpu"; }
  int64_t n_vocab() const override { return session_.model().config().n_vocab; }
  void reset() override { session_.reset(); }
  void forward(const int32_t* tokens, int n, float* logits, bool all_positions) override {
    session_.forward(tokens, n, logits, all_positions);
  }

 private:
  Session session_;
};

}  // namespace

std::unique_ptr<BenchBackend> make_cpu_bench_backend(const Model& model, int max_ctx) {
  return std::make_unique<CpuBenchBackend>(model, max_ctx);
}

}  // namespace strata
