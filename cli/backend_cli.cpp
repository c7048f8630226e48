#include "cli/backend_cli.h"

#include "strata/base/error.h"
#include "strata/engine/session.h"

#ifdef STRATA_HAVE_CUDA
#include "strata/cuda/gpu_session.h"
#endif

namespace strata::cli {

void add_backend_options(CLI::App& sub, BackendOptions& o) {
  sub.add_flag("--gpu", o.gpu, "run the whole model on the GPU (CUDA build)");
}

std::unique_ptr<Sequence> make_sequence(const Model& model, int max_ctx, const BackendOptions& o) {
  if (!o.gpu) return std::make_unique<Session>(model, max_ctx);
#ifdef STRATA_HAVE_CUDA
  if (!cuda::device_available()) fail("--gpu: ", cuda::device_description());
  return cuda::make_gpu_session(model, max_ctx);
#else
  fail("--gpu: this strata was built without CUDA (configure with nvcc present or -DSTRATA_CUDA=ON)");
#endif
}

}  // namespace strata::cli
