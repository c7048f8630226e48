// The gate and publish kernels of the decode lookahead and the gated graph (decode_lookahead.h).
#include "strata/cuda/decode_lookahead.h"

#include <cuda_runtime.h>

#include "strata/base/error.h"
#include "strata/cuda/cuda_check.h"
#include "strata/cuda/device_math.cuh"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace strata::cuda {
namespace {

// Waits for the host's command for the next gated launch and sets the IF node's condition from it; after
// kGateWaitNs without one it skips the body and says so in *gave_up. counts[0] numbers the gated
// launches on the device, so the kernel's parameters stay fixed in the graph.
__global__ void gate_kernel(const volatile unsigned long long* cmd, unsigned long long* counts,
                            volatile unsigned long long* gave_up, cudaGraphConditionalHandle cond) {
  const unsigned long long want = counts[0] + 1;
  const unsigned long long t0 = global_ns();
  unsigned int go = 0;
  for (;;) {  // a read over PCIe per turn (~1 us): no sleep needed
    const unsigned long long v = *cmd;
    if ((v >> 1) == want) {
      go = static_cast<unsigned int>(v & 1ull);
      break;
    }
    if (global_ns() - t0 > kGateWaitNs) {  // final: the command is not read again
      *gave_up = want;
      __threadfence_system();
      break;
    }
  }
  counts[0] = want;
  cudaGraphSetConditional(cond, go);
}

__global__ void publish_kernel(const int* pick, int* io, unsigned long long* counts, volatile unsigned long long* host) {
  const int id = *pick;
  io[0] = id;
  io[1] += 1;
  const unsigned long long n = counts[1] + 1;
  counts[1] = n;
  *host = (n << 32) | static_cast<unsigned int>(id);
  __threadfence_system();
}

}  // namespace

void LookaheadLink::allocate() {
  void* p = nullptr;
  check_cuda(cudaHostAlloc(&p, 3 * sizeof(unsigned long long), cudaHostAllocMapped), "cudaHostAlloc(lookahead)");
  host_cmd = static_cast<unsigned long long*>(p);
  host_pick = host_cmd + 1;
  host_gave_up = host_cmd + 2;
  *host_cmd = *host_pick = *host_gave_up = 0;
  void* d = nullptr;
  check_cuda(cudaHostGetDevicePointer(&d, p, 0), "cudaHostGetDevicePointer(lookahead)");
  dev_cmd = static_cast<unsigned long long*>(d);
  dev_pick = dev_cmd + 1;
  dev_gave_up = dev_cmd + 2;
  check_cuda(cudaMalloc(&p, 2 * sizeof(unsigned long long)), "cudaMalloc(lookahead)");
  dev_counts = static_cast<unsigned long long*>(p);
  check_cuda(cudaMemset(dev_counts, 0, 2 * sizeof(unsigned long long)), "cudaMemset(lookahead)");
  launched = published = 0;
}

void LookaheadLink::release() {
  if (host_cmd) cudaFreeHost(host_cmd);
  if (dev_counts) cudaFree(dev_counts);
  host_cmd = host_pick = host_gave_up = dev_cmd = dev_pick = dev_gave_up = dev_counts = nullptr;
}

void LookaheadLink::command(bool go) {
  // One aligned 64-bit store: the gate never sees half a command.
  *static_cast<volatile unsigned long long*>(host_cmd) = (launched << 1) | (go ? 1ull : 0ull);
}

bool LookaheadLink::wait(cudaStream_t s, unsigned long long publish, unsigned long long gate, int32_t* pick) const {
  const volatile unsigned long long* w = host_pick;
  const volatile unsigned long long* g = host_gave_up;
  const unsigned long long want = publish & 0xffffffffull;
  for (unsigned spin = 1;; ++spin) {
    const unsigned long long v = *w;
    if ((v >> 32) == want) {
      *pick = static_cast<int32_t>(static_cast<uint32_t>(v));
      return true;
    }
    if (gate != 0 && *g == gate) return false;
    if ((spin & 4095u) == 0) {  // a failed kernel never publishes: look at the stream now and then
      const cudaError_t st = cudaStreamQuery(s);
      if (st != cudaErrorNotReady) {
        check_cuda(st, "decode step (lookahead)");
        if ((*w >> 32) != want && !(gate != 0 && *g == gate))
          fail("CUDA backend: a decode step ended without publishing its pick (lookahead)");
      }
    }
#if defined(__x86_64__)
    _mm_pause();
#endif
  }
}

void publish_pick(const LookaheadLink& link, const int* pick, int* io, cudaStream_t s) {
  // A plain launch (no programmatic serialization): it starts after the arg-max has completed.
  publish_kernel<<<1, 1, 0, s>>>(pick, io, link.dev_counts, link.dev_pick);
  check_launch("publish_pick");
}

cudaGraphExec_t build_gated_graph(const LookaheadLink& link, cudaStream_t s, const std::function<void()>& enqueue_body) {
  cudaGraph_t parent = nullptr;
  check_cuda(cudaGraphCreate(&parent, 0), "cudaGraphCreate(gated step)");
  cudaGraphExec_t exec = nullptr;
  try {
    cudaGraphConditionalHandle cond{};
    // AssignDefault: every launch starts from "skip" until the gate sets the condition.
    check_cuda(cudaGraphConditionalHandleCreate(&cond, parent, 0, cudaGraphCondAssignDefault),
               "cudaGraphConditionalHandleCreate");
    const volatile unsigned long long* cmd = link.dev_cmd;
    unsigned long long* counts = link.dev_counts;
    volatile unsigned long long* gave_up = link.dev_gave_up;
    void* args[] = {&cmd, &counts, &gave_up, &cond};
    cudaKernelNodeParams kp{};
    kp.func = reinterpret_cast<void*>(gate_kernel);
    kp.gridDim = dim3(1);
    kp.blockDim = dim3(1);
    kp.kernelParams = args;
    cudaGraphNode_t gate = nullptr;
    check_cuda(cudaGraphAddKernelNode(&gate, parent, nullptr, 0, &kp), "cudaGraphAddKernelNode(gate)");
    cudaGraphNodeParams cp{};
    cp.type = cudaGraphNodeTypeConditional;
    cp.conditional.handle = cond;
    cp.conditional.type = cudaGraphCondTypeIf;
    cp.conditional.size = 1;
    cudaGraphNode_t node = nullptr;
    check_cuda(cudaGraphAddNode(&node, parent, &gate, nullptr, 1, &cp), "cudaGraphAddNode(conditional step)");
    cudaGraph_t body = cp.conditional.phGraph_out[0];
    check_cuda(cudaStreamBeginCaptureToGraph(s, body, nullptr, nullptr, 0, cudaStreamCaptureModeThreadLocal),
               "cudaStreamBeginCaptureToGraph(step body)");
    try {
      enqueue_body();
    } catch (...) {
      cudaGraph_t g = nullptr;
      cudaStreamEndCapture(s, &g);
      throw;
    }
    check_cuda(cudaStreamEndCapture(s, &body), "cudaStreamEndCapture(step body)");
    check_cuda(cudaGraphInstantiate(&exec, parent, 0), "cudaGraphInstantiate(gated step)");
  } catch (...) {
    cudaGraphDestroy(parent);
    throw;
  }
  cudaGraphDestroy(parent);
  return exec;
}

}  // namespace strata::cuda
