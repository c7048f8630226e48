// The batched matvec launch (matvec_kernels.h): one kernel covers up to kMaxGemvJobs jobs, with an
// optional epilogue run by the last block to finish. The block-level work is in matvec_block.cuh. L2
// prefetches (of a block's first tile before the programmatic-dependent-launch wait, of routed rows
// before staging, of the next tile) all measured slower on the H100 (docs/PERF.md).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "strata/base/error.h"
#include "strata/cuda/cuda_check.h"
#include "strata/cuda/decode_pdl.cuh"
#include "strata/cuda/matvec_block.cuh"
#include "strata/cuda/matvec_kernels.h"
#include "strata/moe/gpu_support.h"

namespace strata::cuda {
namespace mv {
namespace {

struct DBatch {
  DJob j[kMaxGemvJobs];
  int n_jobs;
  int n_tiles;
  GemvNorm norm;        // norm.counter == nullptr: none
  GemvRoute route;      // route.counter == nullptr: none
  GemvCombine combine;  // combine.counter == nullptr: none
  GemvRoute route_in;   // route_in.logits == nullptr: none (see gemv_batch)
  bool i8;              // GemvMath::Int8: K-quant jobs read the int8 form of x
  // The token-shared launch (gemv_tokens_kernel): the tokens, tokens per block, and where the tokens'
  // staged inputs start in shared memory (after the scratch xs of the widest row).
  int n_tokens;
  int per;
  int tok_base;
};

// Tokens: the token-grid instantiation (gridDim.y tokens); false compiles to the single-token kernel.
template <bool Tokens>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) gemv_kernel(const __grid_constant__ DBatch b) {
  // The next kernel may start now (it waits for this one's completion before touching its outputs).
  pdl_launch_dependents();
  pdl_wait();
  extern __shared__ float smem[];
  __shared__ float red[kWarps], red2[kWarps];
  __shared__ int route_ids[64];
  BlockStage st;
  const BlockScratch S{smem, red, red2, route_ids};
  run_tiles<Tokens>(b.j, b.n_jobs, b.n_tiles, b.route_in, b.i8, st, S);
  if constexpr (!Tokens) {  // a token grid takes no epilogue (gemv_batch refuses one)
    if (b.norm.counter) norm_epilogue(b.norm);
    if (b.route.counter) route_epilogue(b.route);
    if (b.combine.counter) combine_epilogue(b.combine);
  }
}

// The token-shared launch of a token grid (gemv_batch): up to NT tokens per block, each weight unit read once
// for all of them. Two resident blocks' registers: NT partial sums (two per token for a gate/up pair).
constexpr int kSharedTokens = kGemvSharedTokens;
template <int NT>
__global__ void __launch_bounds__(kThreads, 2) gemv_tokens_kernel(const __grid_constant__ DBatch b) {
  pdl_launch_dependents();
  pdl_wait();
  extern __shared__ float smem[];
  __shared__ float red[kWarps], red2[kWarps];
  BlockStage st;
  const BlockScratch S{smem, red, red2, nullptr};
  run_tiles_tokens<NT>(b.j, b.n_jobs, b.n_tiles, b.n_tokens, b.per, b.tok_base, st, S);
}

// conv_silu_tokens: a thread per channel walks the tokens, each step's window read from the record
// the previous step wrote (the live state for token 0).
__global__ void conv_tokens_kernel(const float* x, int n_tokens, DJob J, float* state, float* records, float* out,
                                   const int* parents) {
  pdl_launch_dependents();
  pdl_wait();
  const int c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  const int ch = J.conv_channels;
  if (c >= ch) return;
  const int64_t win = static_cast<int64_t>(J.conv_k - 1) * ch;
  for (int t = 0; t < n_tokens; ++t) {
    const int pa = parents ? parents[t] : t - 1;
    J.conv_state = pa < 0 ? state : records + pa * win;
    J.conv_out = records + t * win;
    out[t * static_cast<int64_t>(ch) + c] = conv_silu_channel(J, c, x[t * static_cast<int64_t>(ch) + c]);
  }
  for (int j = 0; j + 1 < J.conv_k; ++j)
    state[static_cast<int64_t>(j) * ch + c] = records[(n_tokens - 1) * win + static_cast<int64_t>(j) * ch + c];
}

int pow2_ceil(int v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

int log2_of(int p) {
  int l = 0;
  while ((1 << l) < p) ++l;
  return l;
}

// Resident gemv_kernel blocks per SM at the common 2048..4096-column size; larger inputs simply run
// fewer blocks per SM.
int gemv_blocks_per_sm() {
  static const int n = [] {
    allow_dynamic_smem(gemv_kernel<false>, stage_layout(kMaxCols).total * sizeof(float), "cudaFuncSetAttribute(gemv)");
    allow_dynamic_smem(gemv_kernel<true>, stage_layout(kMaxCols).total * sizeof(float), "cudaFuncSetAttribute(gemv)");
    const int smem_typ = stage_layout(4096).total * static_cast<int>(sizeof(float));
    int b = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, gemv_kernel<false>, kThreads, smem_typ),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    return std::max(1, b);
  }();
  return n;
}

// Process-wide arithmetic (set_gemv_math); Int8 unless a caller chose otherwise.
GemvMath g_math = GemvMath::Int8;

// Units of a row per lane (launches that fit one wave of resident blocks take fewer, gemv_batch): at 8
// the DeltaNet input projection's tiles fill about one wave and the lm_head's tiles grow to 64 rows
// (docs/PERF.md compares 4, 8 and 16).
constexpr int kUnitsPerThread = 8;

bool int8_math() { return g_math == GemvMath::Int8; }

// The device form of one job, checked (its tiling is set by tile_jobs).
DJob describe_job(const GemvJob& in) {
  const DevMatrix& w = *in.w;
  if (!supported_type(w.type)) fail_unsupported_type("gemv_batch", w.type);
  if (w.n_cols > kMaxCols || w.n_cols < 1)
    fail("CUDA backend: gemv_batch: a row of ", w.n_cols, " columns is outside 1..", kMaxCols);
  if (w.n_cols % type_traits(w.type).block_elems != 0)
    fail("CUDA backend: gemv_batch: ", w.n_cols, " columns is not a whole number of ", type_traits(w.type).name,
         " blocks");
  DJob d{};
  d.w = w.data;
  d.row_bytes = w.row_bytes;
  d.expert_stride = w.expert_stride;
  d.type = w.type;
  d.type2 = w.type;
  if (in.mode == GemvMode::SwigluPair) {
    check_arg(in.w2 != nullptr, "gemv_batch: SwigluPair needs w2");
    const DevMatrix& u = *in.w2;
    if (!supported_type(u.type)) fail_unsupported_type("gemv_batch", u.type);
    check_arg(u.n_rows == w.n_rows && u.n_cols == w.n_cols, "gemv_batch: gate/up shapes differ");
    d.w2 = u.data;
    d.row_bytes2 = u.row_bytes;
    d.expert_stride2 = u.expert_stride;
    d.type2 = u.type;
  }
  d.x = in.x;
  d.y = in.y;
  d.ids = in.ids;
  d.slot = in.slot;
  d.slot_of_expert = in.slot_of_expert;
  d.n_rows = static_cast<int>(w.n_rows);
  d.n_cols = static_cast<int>(w.n_cols);
  d.mode = in.mode;
  d.norm_w = in.norm_w;
  d.norm_eps = in.norm_eps;
  d.conv_w = in.conv_w;
  d.conv_state = in.conv_state;
  d.conv_out = in.conv_state_out ? in.conv_state_out : in.conv_state;
  d.conv_k = in.conv_k;
  d.conv_channels = in.conv_channels;
  d.x_ts = in.x_token_stride;
  d.y_ts = in.y_token_stride;
  d.ids_ts = in.ids_token_stride;
  if (in.conv_w)
    check_arg(in.mode == GemvMode::Store && in.conv_state && in.conv_k >= 1 && in.conv_channels >= w.n_rows,
              "gemv_batch: a conv job needs Store mode, a state and K >= 1 with channels >= rows");
  return d;
}

// Cuts the jobs' rows into tiles for per_thread units per lane; returns the launch's tile count. Threads
// per row: enough that each lane takes about per_thread units of the row (two loop steps' worth at most):
// many short rows per tile keep every resident warp busy.
int tile_jobs(DJob* jobs, int n_jobs, int per_thread) {
  int tiles = 0;
  for (int i = 0; i < n_jobs; ++i) {
    DJob& d = jobs[i];
    const int U = rows::units_per_row(d.type, d.n_cols);
    const int G = std::min(kThreads, pow2_ceil(std::max(1, (U + per_thread - 1) / per_thread)));
    d.g_log2 = log2_of(G);
    d.tile_rows = kThreads / G;
    d.tile_begin = tiles;
    tiles += (d.n_rows + d.tile_rows - 1) / d.tile_rows;
  }
  return tiles;
}

void check_route(const GemvRoute& r, bool needs_counter, const char* what) {
  check_arg(r.logits && r.ids && r.weights && (!needs_counter || r.counter), what);
  check_arg(r.n_expert <= 1024 && r.k <= 64 && r.k <= r.n_expert && r.k >= 1,
            "gemv_batch: routing needs n_expert <= 1024 and 1 <= k <= 64");
}

void check_combine(const GemvCombine& c, bool needs_counter) {
  check_arg((!needs_counter || c.counter) && c.x && c.ye && c.ids && c.weights && c.k >= 1 && c.k <= 64 && c.d > 0 &&
                (!c.norm_w || c.xn),
            "gemv_batch: incomplete GemvCombine (k must be 1..64)");
}

// Where a token-shared block's staged tokens start in shared memory (after the scratch xs of rows up to
// max_cols wide, 16-byte aligned), and the shared memory it needs for per tokens of such rows.
int tokens_base(int max_cols) { return (rows::xpad_size(max_cols) + 3) & ~3; }
size_t tokens_smem(int max_cols, int per) {
  return static_cast<size_t>(tokens_base(max_cols) + per * rows::token_floats(max_cols)) * sizeof(float);
}

// The dynamic shared memory a token-shared block may take: 160 KiB, or less where the device's opt-in
// limit per block (less the kernel's static shared memory) is lower. The kernel is allowed that much once.
size_t tokens_smem_limit() {
  static const size_t limit = [] {
    int dev = 0, optin = 0;
    check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "cudaDeviceGetAttribute");
    cudaFuncAttributes a{};
    check_cuda(cudaFuncGetAttributes(&a, gemv_tokens_kernel<kSharedTokens>), "cudaFuncGetAttributes(gemv tokens)");
    const size_t opt = static_cast<size_t>(optin);
    const size_t room = opt > a.sharedSizeBytes ? opt - a.sharedSizeBytes : 0;
    const size_t l = std::min(size_t{160} << 10, room);
    allow_dynamic_smem(gemv_tokens_kernel<kSharedTokens>, l, "cudaFuncSetAttribute(gemv tokens)");
    return l;
  }();
  return limit;
}

// The weight bytes below which a launch keeps the token grid (set_gemv_tokens_min_bytes).
size_t g_tokens_min_bytes = kGemvTokensMinBytes;

// Tokens per block of the token-shared launch for n_tokens tokens of jobs (described), or 0 when the
// launch takes the token grid: some job is routed, reads float-path weights or has no int8 form of x,
// the launch reads fewer than g_tokens_min_bytes of weights, or two tokens of its widest row do not fit
// the shared-memory limit. The tokens are spread evenly over the fewest blocks of at most kSharedTokens.
int tokens_per_block(const DJob* jobs, int n_jobs, int n_tokens, bool i8, int max_cols) {
  if (n_tokens < 2 || !i8) return 0;
  size_t bytes = 0;
  for (int i = 0; i < n_jobs; ++i) {
    const DJob& d = jobs[i];
    if (d.ids || !rows::int8_path_type(d.type) || (d.w2 && !rows::int8_path_type(d.type2))) return 0;
    bytes += static_cast<size_t>(d.n_rows) * (d.row_bytes + (d.w2 ? d.row_bytes2 : 0));
  }
  if (bytes < g_tokens_min_bytes) return 0;
  for (int chunks = (n_tokens + kSharedTokens - 1) / kSharedTokens; chunks < n_tokens; ++chunks) {
    const int per = (n_tokens + chunks - 1) / chunks;
    if (tokens_smem(max_cols, per) <= tokens_smem_limit()) return per;
  }
  return 0;
}

}  // namespace
}  // namespace mv

int sm_count() {
  static const int n = [] {
    int dev = 0, sms = 0;
    check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
    return sms;
  }();
  return n;
}

int resident_blocks(const void* kernel, int threads, size_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, size_t>, int> known;
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(kernel, threads, smem);
  const auto it = known.find(key);
  if (it != known.end()) return it->second;
  int b = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, threads, smem),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  known.emplace(key, b);
  return b;
}

int token_grid_blocks(int blocks, int resident, int n_tokens) {
  if (n_tokens <= 1) return blocks;
  // Rounded down: a few blocks past the wave would cost a whole extra round of tiles.
  return std::max(1, std::min(blocks, resident / n_tokens));
}

int64_t max_gemv_cols() { return mv::kMaxCols; }
static_assert(mv::kMaxCols == kGpuMaxMatvecCols, "gpu_unsupported_feature checks the matvec's width");

size_t gemv_local_bytes() {
  cudaFuncAttributes a{}, t{}, s{};
  check_cuda(cudaFuncGetAttributes(&a, mv::gemv_kernel<false>), "cudaFuncGetAttributes(gemv)");
  check_cuda(cudaFuncGetAttributes(&t, mv::gemv_kernel<true>), "cudaFuncGetAttributes(gemv)");
  check_cuda(cudaFuncGetAttributes(&s, mv::gemv_tokens_kernel<mv::kSharedTokens>), "cudaFuncGetAttributes(gemv)");
  return std::max({a.localSizeBytes, t.localSizeBytes, s.localSizeBytes});
}

int gemv_tokens_per_block(const GemvJob* jobs, int n_jobs, int n_tokens, bool route_in) {
  using namespace mv;
  check_arg(n_jobs >= 1 && n_jobs <= kMaxGemvJobs, "gemv_tokens_per_block: 1..kMaxGemvJobs jobs");
  if (route_in) return 0;
  DJob d[kMaxGemvJobs];
  int max_cols = 0;
  for (int i = 0; i < n_jobs; ++i) {
    d[i] = describe_job(jobs[i]);
    max_cols = std::max(max_cols, d[i].n_cols);
  }
  return tokens_per_block(d, n_jobs, n_tokens, int8_math(), max_cols);
}

void set_gemv_math(GemvMath m) { mv::g_math = m; }
void set_gemv_tokens_min_bytes(size_t bytes) { mv::g_tokens_min_bytes = bytes; }
GemvMath gemv_math() { return mv::g_math; }

void conv_silu_tokens(const float* x, int n_tokens, const float* conv_w, int K, int channels, float* state,
                      float* records, float* out, cudaStream_t s, const int* parents) {
  using namespace mv;
  check_arg(n_tokens >= 1 && K >= 1 && channels >= 1 && x && conv_w && state && records && out,
            "conv_silu_tokens: incomplete arguments");
  DJob J{};
  J.conv_w = conv_w;
  J.conv_k = K;
  J.conv_channels = channels;
  constexpr int kBlock = 128;
  launch_pdl("conv_silu_tokens", conv_tokens_kernel, dim3((channels + kBlock - 1) / kBlock), dim3(kBlock), 0, s, x,
             n_tokens, J, state, records, out, parents);
}

void gemv_batch(const GemvJob* jobs, int n_jobs, cudaStream_t s, const GemvNorm* norm, const GemvRoute* route,
                const GemvCombine* combine, const GemvRoute* route_in, int n_tokens, int spare_blocks) {
  using namespace mv;
  check_arg(n_jobs >= 1 && n_jobs <= kMaxGemvJobs, "gemv_batch: 1..kMaxGemvJobs jobs");
  check_arg(n_tokens >= 1 && n_tokens <= kMaxGemvTokens, "gemv_batch: 1..kMaxGemvTokens tokens");
  check_arg(spare_blocks >= 0, "gemv_batch: spare_blocks >= 0");
  const bool tokens = n_tokens > 1;
  // The epilogues' last-block counters and the conv state are one per launch; replayed picks go by their stride.
  check_arg(!tokens || (!norm && !route && !combine &&
                        (!route_in || !route_in->rule.replay || route_in->rule.replay_stride > 0)),
            "gemv_batch: a token grid takes no epilogue, and replayed picks of route_in with their token stride");
  if (tokens)
    for (int i = 0; i < n_jobs; ++i)
      check_arg(!jobs[i].conv_w, "gemv_batch: a token grid takes no conv job (the conv is sequential in the tokens)");
  DBatch b{};
  b.n_jobs = n_jobs;
  b.i8 = int8_math();
  int max_cols = 0;
  for (int i = 0; i < n_jobs; ++i) {
    if (route_in && jobs[i].ids)
      check_arg(jobs[i].ids == route_in->ids && jobs[i].slot >= 0 && jobs[i].slot < route_in->k,
                "gemv_batch: with route_in, routed jobs must read route_in->ids at a slot below its k");
    b.j[i] = describe_job(jobs[i]);
    max_cols = std::max(max_cols, b.j[i].n_cols);
  }
  // Units per lane: kUnitsPerThread, halved while the launch still fits one wave of resident blocks: a
  // launch of few tiles otherwise leaves SMs with one block or none.
  const int capacity = sm_count() * gemv_blocks_per_sm();
  int per_thread = kUnitsPerThread;
  while (per_thread > 1 && tile_jobs(b.j, n_jobs, per_thread / 2) <= capacity) per_thread /= 2;
  const int tiles = tile_jobs(b.j, n_jobs, per_thread);
  b.n_tiles = tiles;
  if (norm) {
    check_arg(norm->counter && norm->x && norm->w && norm->out && norm->n > 0, "gemv_batch: incomplete GemvNorm");
    b.norm = *norm;
  }
  if (route) {
    check_arg(!norm, "gemv_batch: one epilogue at most");
    check_route(*route, true, "gemv_batch: incomplete GemvRoute");
    b.route = *route;
  }
  if (combine) {
    check_arg(!norm && !route, "gemv_batch: one epilogue at most");
    check_combine(*combine, true);
    b.combine = *combine;
  }
  if (route_in) {
    check_route(*route_in, false, "gemv_batch: incomplete route_in");
    b.route_in = *route_in;
  }
  const int per = route_in ? 0 : tokens_per_block(b.j, n_jobs, n_tokens, b.i8, max_cols);
  if (per > 0) {
    const int chunks = (n_tokens + per - 1) / per;
    const size_t smem = tokens_smem(max_cols, per);
    const int resident =
        resident_blocks(reinterpret_cast<const void*>(gemv_tokens_kernel<kSharedTokens>), kThreads, smem);
    if (resident > 0) {  // else the token grid below (same results)
      b.n_tokens = n_tokens;
      b.per = per;
      b.tok_base = tokens_base(max_cols);
      const int grid = std::max(1, std::min(tiles, (sm_count() * resident + chunks - 1) / chunks));
      launch_pdl("gemv_batch", gemv_tokens_kernel<kSharedTokens>, dim3(grid, chunks), dim3(kThreads), smem, s, b);
      return;
    }
  }
  const int room = std::max(1, capacity - spare_blocks);  // the tiling above stays the full wave's
  const int grid = std::max(1, std::min(tiles, room));
  const size_t smem = static_cast<size_t>(stage_layout(max_cols).total) * sizeof(float);
  // The tiling above does not depend on n_tokens: each token's blocks run the single-token launch's tiles.
  if (tokens)
    launch_pdl("gemv_batch", gemv_kernel<true>, dim3(token_grid_blocks(grid, room, n_tokens), n_tokens), dim3(kThreads),
               smem, s, b);
  else
    launch_pdl("gemv_batch", gemv_kernel<false>, dim3(grid), dim3(kThreads), smem, s, b);
}

}  // namespace strata::cuda
