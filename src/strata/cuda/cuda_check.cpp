#include "strata/cuda/cuda_check.h"

#include "strata/base/error.h"
#include "strata/cuda/kernels.h"

namespace strata::cuda {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail("CUDA error in ", what, ": ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
}

void check_launch(const char* what) { check_cuda(cudaGetLastError(), what); }

void check_arg(bool ok, const char* what) {
  if (!ok) fail("CUDA backend: ", what);
}

void fail_unsupported_type(const char* what, GgmlType type) {
  fail("CUDA backend: ", what, " does not support weight type ", type_traits(type).name, " (supported: ",
       supported_type_names(), ")");
}

}  // namespace strata::cuda
