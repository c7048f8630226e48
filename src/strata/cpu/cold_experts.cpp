#include "strata/cpu/cold_experts.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>

#include "strata/base/error.h"
#include "strata/cpu/cpu_kernels.h"
#include "strata/cpu/ops.h"
#include "strata/cpu/tile_rows.h"

namespace strata {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// The task counter packs (generation, task count, next index) so a thread reads nothing of a job
// unless it has claimed one of that job's tasks (and then the job is alive until the task is done).
constexpr int kIdxBits = 20;
constexpr uint64_t kIdxMask = (uint64_t{1} << kIdxBits) - 1;
constexpr uint64_t kGenMask = (uint64_t{1} << (64 - 2 * kIdxBits)) - 1;
// Half the index range: claims past the end (at most one per thread and job) must not carry into the
// task count.
constexpr int64_t kMaxTasks = static_cast<int64_t>(kIdxMask / 2);

uint64_t pack(uint64_t gen, uint64_t total, uint64_t idx) {
  return ((gen & kGenMask) << (2 * kIdxBits)) | (total << kIdxBits) | idx;
}

// Tasks per pool thread in one decode job (run()).
constexpr int64_t kDecodeTasksPerThread = 12;

// How long an idle thread spins before it sleeps: decode sends one job per MoE layer, a few hundred
// microseconds apart, so a few milliseconds of spinning covers a whole token.
constexpr auto kSpinWindow = std::chrono::microseconds(3000);

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

bool uses_i8(const CpuKernels& k, const WeightMatrix& w, I8Format& fmt) {
  if (k.i8_format == nullptr || w.n_cols % 32 != 0) return false;
  fmt = k.i8_format(w.type);
  return fmt.supported;
}

}  // namespace

struct ColdExpertPool::Scratch {
  std::vector<uint8_t> codes, tile;  // tile: dot_tile_fused's panels
  std::vector<float> scales8, bias16, fbuf;
  // run(): pick h_pick's hidden activation of job h_job quantised for down (see do_task).
  std::vector<int8_t> hq;
  std::vector<float> hd, hs;
  uint64_t h_job = 0;
  int64_t h_pick = -1;
  void fit(int64_t n) {
    const size_t un = static_cast<size_t>(n);
    if (codes.size() >= kMaxDotRows * un) return;
    codes.resize(kMaxDotRows * un);
    scales8.resize(kMaxDotRows * un / 4 + 1);
    bias16.resize(kMaxDotRows * un / 16 + 1);
    fbuf.resize(kMaxDotRows * un);
    tile.resize(fused_tile_scratch_bytes(n / 256 * 256));
  }
};

struct ColdExpertPool::Job {
  const ExpertFfn* w = nullptr;
  const float* xn = nullptr;
  std::vector<ColdPick> picks;
  int64_t d = 0, ff = 0;
  I8Format fmt_gate, fmt_up, fmt_down;
  bool gate_i8 = false, up_i8 = false, down_i8 = false;
  std::vector<int8_t> xq;
  std::vector<float> xd, xs;
  std::vector<float> g, u, h;  // [pick][ff]
  uint64_t seq = 0;            // run() calls so far: tells a thread's quantised h (Scratch) apart per job
  int64_t a_rows = 0, b_rows = 0, a_blocks = 0, b_blocks = 0, n_a = 0, n_total = 0;
  std::unique_ptr<std::atomic<int64_t>[]> a_done;
  size_t a_done_cap = 0;
};

// out[t * 4 + i] = dot(w[i][0..n), x[t][0..n)): a float tile kernel of the batched path (below).
using FloatTileFn = void (*)(const float* const* w, const float* const* x, int64_t n, float* out);

// A batch (run_batch): picks sorted by (expert, token) and cut into one group per expert.
// Tasks, in claim order: phase 0 (quantise token inputs for the int8 path), phase A (gate/up row
// blocks of one group, SwiGLU, quantise the hidden slice), phase B (down row blocks of one group).
struct ColdExpertPool::BatchJob {
  struct Group {
    int expert = 0;
    int64_t first = 0, n = 0;  // sorted picks [first, first + n)
    int64_t a_rows = 0, a_blocks = 0, b_rows = 0, b_blocks = 0;
    bool tiles = false;     // float tiles (enough tokens to pay for decoding the rows to float)
    bool i8_tiles = false;  // the batched int8 kernel (fused formats, enough tokens)
  };
  struct Task {
    int phase = 0;  // 0, 1 (A), 2 (B)
    int64_t group = 0, r0 = 0, r1 = 0;
  };
  const ExpertFfn* w = nullptr;
  const float* X = nullptr;
  int64_t d = 0, ff = 0;
  I8Format fmt_gate, fmt_up, fmt_down;
  bool gate_i8 = false, up_i8 = false, down_i8 = false;
  std::vector<ColdTokenPick> picks;  // sorted
  std::vector<Group> groups;
  std::vector<Task> tasks;
  std::vector<int> qtokens;            // tokens whose inputs phase 0 quantises
  std::vector<int8_t> xq;              // [n_tok][d]
  std::vector<float> xd, xs;           // [n_tok][d/32], [n_tok][d/16]
  std::vector<float> g, u, h;          // [sorted pick][ff]
  std::vector<int8_t> hq;
  std::vector<float> hd, hs;
  // The batched int8 kernel's inputs (interleave_act_i8): tokens for gate/up, hidden rows for down.
  bool i8_tiles = false;  // gate, up and down all take it
  std::vector<int8_t> xi, hi;
  std::vector<float> xb, hb;
  int64_t n_phase0 = 0;
  std::atomic<int64_t> phase0_done{0};
  FloatTileFn tile = nullptr;  // SIMD levels with float tiles on: the float path for every matrix
  int tile_tokens = 1;
  std::unique_ptr<std::atomic<int64_t>[]> a_done;  // per group
  size_t a_done_cap = 0;
};

namespace {

// Rows [r0, r1) of w times the quantised activation, in the CPU engine's 4-row tiles (r0 is a multiple
// of kMaxDotRows, so the tiles are the ones matmul uses). Fused formats are dotted in place, as
// matvec does: one token reads each row once, so a copy would only add work.
template <class Scratch>
void rows_i8(const CpuKernels& k, I8Format fmt, const WeightMatrix& w, const I8Act& act, int64_t r0, int64_t r1,
             float* y, Scratch& s) {
  const int64_t n = w.n_cols;
  for (int64_t r = r0; r < r1; r += kMaxDotRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kMaxDotRows, r1 - r));
    float out[kMaxDotRows];
    if (fmt.fused) {
      const uint8_t* raw[kMaxDotRows];
      raw_tile_rows(w, r, nr, raw);
      k.dot_rows_fused(w.type, raw, nr, act, n, out);
    } else {
      I8Row rows[kMaxDotRows];
      i8_tile_rows(k, w, r, nr, s.codes.data(), s.scales8.data(), s.bias16.data(), rows);
      k.dot_rows_i8(rows, nr, act, n, fmt, out);
    }
    for (int i = 0; i < nr; ++i) y[r + i] = out[i];
  }
}

// Float path; Q8_0 dotted in place like matvec's decode (dot_rows_direct: the same numbers as
// decoding first).
template <class Scratch>
void rows_float(const CpuKernels& k, const WeightMatrix& w, const float* x, int64_t r0, int64_t r1, float* y,
                Scratch& s) {
  const int64_t n = w.n_cols;
  const bool direct = k.direct_float != nullptr && k.direct_float(w.type) && cpu_fused_path();
  for (int64_t r = r0; r < r1; r += kMaxDotRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kMaxDotRows, r1 - r));
    float out[kMaxDotRows];
    if (direct) {
      const uint8_t* raw[kMaxDotRows];
      raw_tile_rows(w, r, nr, raw);
      k.dot_rows_direct(w.type, raw, nr, x, n, out);
    } else {
      const float* rows[kMaxDotRows];
      float_tile_rows(k, w, r, nr, s.fbuf.data(), rows);
      k.dot_rows(rows, nr, x, n, out);
    }
    for (int i = 0; i < nr; ++i) y[r + i] = out[i];
  }
}

}  // namespace

int ColdExpertPool::default_threads() {
  const int hc = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, hc - 2);
}

ColdExpertPool::ColdExpertPool(int n_threads)
    : n_threads_(n_threads), job_(std::make_unique<Job>()), batch_(std::make_unique<BatchJob>()) {
  if (n_threads < 1) fail("cold-expert pool: needs at least 1 thread, got ", n_threads);
  for (int i = 0; i < n_threads; ++i) scratch_.push_back(std::make_unique<Scratch>());
  threads_.reserve(static_cast<size_t>(n_threads - 1));
  for (int i = 1; i < n_threads; ++i) threads_.emplace_back([this, i] { worker_main(i); });
}

ColdExpertPool::~ColdExpertPool() {
  stop_.store(true, std::memory_order_release);
  gen_.fetch_add(1, std::memory_order_acq_rel);
  gen_.notify_all();
  for (auto& t : threads_) t.join();
}

void ColdExpertPool::worker_main(int index) {
  uint64_t seen = 0;
  for (;;) {
    auto idle_since = std::chrono::steady_clock::now();
    for (int spins = 0;; ++spins) {
      if (gen_.load(std::memory_order_acquire) != seen) break;
      cpu_relax();
      if ((spins & 1023) == 1023 && std::chrono::steady_clock::now() - idle_since > kSpinWindow) {
        sleepers_.fetch_add(1, std::memory_order_acq_rel);
        gen_.wait(seen, std::memory_order_acquire);
        sleepers_.fetch_sub(1, std::memory_order_acq_rel);
        idle_since = std::chrono::steady_clock::now();
      }
    }
    seen = gen_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    work(index, static_cast<uint32_t>(seen & kGenMask));
  }
}

void ColdExpertPool::work(int index, uint32_t gen) {
  for (;;) {
    // Look first, so that a thread of a finished job never adds to the counter of another one.
    uint64_t v = next_.load(std::memory_order_acquire);
    if ((v >> (2 * kIdxBits)) != gen || (v & kIdxMask) >= ((v >> kIdxBits) & kIdxMask)) return;
    // One atomic add per claim (no compare-exchange retries among many threads). Should a new job
    // have been published since the look, the index claimed is one of its tasks: it is claimed all
    // the same and done (the add acquired the job), and this thread goes on with that job.
    v = next_.fetch_add(1, std::memory_order_acq_rel);
    const uint64_t idx = v & kIdxMask;
    if (idx >= ((v >> kIdxBits) & kIdxMask)) return;
    gen = static_cast<uint32_t>(v >> (2 * kIdxBits));
    if (batch_mode_)
      do_batch_task(index, static_cast<int64_t>(idx));
    else
      do_task(index, static_cast<int64_t>(idx));
    finished_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ColdExpertPool::do_task(int index, int64_t task) {
  Job& J = *job_;
  const CpuKernels& k = cpu_kernels();
  Scratch& s = *scratch_[static_cast<size_t>(index)];
  const ExpertFfn& w = *J.w;
  const size_t ff = static_cast<size_t>(J.ff);
  if (task < J.n_a) {
    const int64_t j = task / J.a_blocks;
    const int64_t r0 = (task % J.a_blocks) * J.a_rows;
    const int64_t r1 = std::min(J.ff, r0 + J.a_rows);
    const int e = J.picks[static_cast<size_t>(j)].expert;
    float* g = J.g.data() + static_cast<size_t>(j) * ff;
    float* u = J.u.data() + static_cast<size_t>(j) * ff;
    float* h = J.h.data() + static_cast<size_t>(j) * ff;
    const I8Act ax{J.xq.data(), J.xd.data(), J.xs.data()};
    if (J.gate_i8) {
      rows_i8(k, J.fmt_gate, w.gate.expert(e), ax, r0, r1, g, s);
    } else {
      rows_float(k, w.gate.expert(e), J.xn, r0, r1, g, s);
    }
    if (J.up_i8) {
      rows_i8(k, J.fmt_up, w.up.expert(e), ax, r0, r1, u, s);
    } else {
      rows_float(k, w.up.expert(e), J.xn, r0, r1, u, s);
    }
    swiglu(g + r0, u + r0, r1 - r0, h + r0);
    J.a_done[j].fetch_add(1, std::memory_order_acq_rel);
    return;
  }
  const int64_t t = task - J.n_a;
  const int64_t j = t / J.b_blocks;
  const int64_t r0 = (t % J.b_blocks) * J.b_rows;
  const int64_t r1 = std::min(J.d, r0 + J.b_rows);
  // Pick j's hidden activation is complete once all its phase-A blocks are: those were claimed before
  // any phase-B task, so they are running and this wait ends.
  while (J.a_done[j].load(std::memory_order_acquire) < J.a_blocks) cpu_relax();
  const ColdPick& p = J.picks[static_cast<size_t>(j)];
  const WeightMatrix down = w.down.expert(p.expert);
  if (J.down_i8) {
    // Each thread quantises the pick's hidden activation itself (a few hundred values, against the
    // down rows it then reads), so phase-A blocks need not be whole 32-value quantisation blocks and
    // the tasks can be small. The quantisation is per 32-value block, so every thread gets the same
    // numbers as quantising the vector once.
    if (s.h_job != J.seq || s.h_pick != j) {
      quantize_activations_i8(J.h.data() + static_cast<size_t>(j) * ff, J.ff, s.hq.data(), s.hd.data(), s.hs.data());
      s.h_job = J.seq;
      s.h_pick = j;
    }
    const I8Act ah{s.hq.data(), s.hd.data(), s.hs.data()};
    rows_i8(k, J.fmt_down, down, ah, r0, r1, p.out, s);
  } else {
    rows_float(k, down, J.h.data() + static_cast<size_t>(j) * ff, r0, r1, p.out, s);
  }
}

namespace {

// Tokens of one kernel call chunk: each unpacked 4-row tile is dotted with this many tokens at most, so
// the activations a thread re-reads stay in cache.
constexpr int64_t kBatchTokenChunk = 64;
// Tokens quantised per phase-0 task.
constexpr int64_t kQuantTokens = 16;

// Rows [r0, r1) of w for the picks [p0, p1) of a batch: each 4-row tile unpacked (int8 path) or decoded
// (float path) once and dotted with every pick's activation (act_of(p): int8 path, x_of(p): float
// path); pick p's output row is out_of(p).
template <class Scratch, class ActOf, class FloatOf, class OutOf>
void rows_batch(const CpuKernels& k, bool i8, I8Format fmt, const WeightMatrix& w, int64_t r0, int64_t r1,
                int64_t p0, int64_t p1, ActOf act_of, FloatOf x_of, OutOf out_of, Scratch& s) {
  const int64_t n = w.n_cols;
  for (int64_t r = r0; r < r1; r += kMaxDotRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kMaxDotRows, r1 - r));
    float out[kMaxDotRows];
    if (i8) {
      I8Row rows[kMaxDotRows];
      i8_tile_rows(k, w, r, nr, s.codes.data(), s.scales8.data(), s.bias16.data(), rows);
      for (int64_t p = p0; p < p1; ++p) {
        k.dot_rows_i8(rows, nr, act_of(p), n, fmt, out);
        float* y = out_of(p);
        for (int i = 0; i < nr; ++i) y[r + i] = out[i];
      }
    } else {
      const float* rows[kMaxDotRows];
      float_tile_rows(k, w, r, nr, s.fbuf.data(), rows);
      for (int64_t p = p0; p < p1; ++p) {
        k.dot_rows(rows, nr, x_of(p), n, out);
        float* y = out_of(p);
        for (int i = 0; i < nr; ++i) y[r + i] = out[i];
      }
    }
  }
}

// Rows [r0, r1) of w for the picks [p0, p1) (at most kBatchTokenChunk) through the batched int8
// kernel: each kMaxTileRows-row tile unpacked once and dotted with every pick's activation act_of(p)
// (interleaved); pick p's output row is out_of(p). Bitwise what rows_batch gives.
template <class Scratch, class ActOf, class OutOf>
void rows_batch_i8_tiles(const CpuKernels& k, const WeightMatrix& w, int64_t r0, int64_t r1, int64_t p0, int64_t p1,
                         ActOf act_of, OutOf out_of, Scratch& s) {
  I8TileAct acts[kBatchTokenChunk];
  float* outs[kBatchTokenChunk];
  const int nt = static_cast<int>(p1 - p0);
  for (int64_t p = p0; p < p1; ++p) acts[p - p0] = act_of(p);
  for (int64_t r = r0; r < r1; r += kMaxTileRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kMaxTileRows, r1 - r));
    const uint8_t* rows[kMaxTileRows];
    raw_tile_rows(w, r, nr, rows);
    for (int64_t p = p0; p < p1; ++p) outs[p - p0] = out_of(p) + r;
    k.dot_tile_fused(w.type, rows, nr, acts, nt, w.n_cols, s.tile.data(), outs);
  }
}

}  // namespace

namespace {

// ---- float tiles of the batched path ----------------------------------------------------------------
// At the SIMD levels the batch decodes each 4-row weight tile to float once per 64 tokens and multiplies
// it with the tokens' float inputs in register blocks (4 rows x 4 tokens with AVX-512, 4 x 2 with AVX2):
// many tokens share one read of the weights, and no per-token int8 re-decoding of the blocks happens
// (the decode path's int8 dots re-decode the quantised blocks for every token). The sums are float32
// in another order than the per-token path's, so results agree with run() to its int8 rounding and with
// a float64 reference to float rounding. The scalar level keeps run()'s row kernels (bitwise equal).
// Tile kernels: out[t * 4 + i] = dot(w[i][0..n), x[t][0..n)) for i < 4 and t < the block's tokens.
constexpr int kTileRows = 4;
// Groups of fewer tokens keep the int8 row kernels: decoding a tile's rows to float costs about as much
// as a few tokens' int8 dots.
constexpr int64_t kTileMinTokens = 8;
// Groups of this many tokens or more take the batched int8 kernel when the formats allow it.
constexpr int64_t kI8TileMinTokens = 3;

__attribute__((target("avx512f,fma"))) void float_tile_avx512(const float* const* w, const float* const* x, int64_t n,
                                                               float* out) {
  __m512 a[4][4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) a[i][t] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    __m512 wv[4], xv[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) wv[i] = _mm512_loadu_ps(w[i] + k);
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) xv[t] = _mm512_loadu_ps(x[t] + k);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) a[i][t] = _mm512_fmadd_ps(wv[i], xv[t], a[i][t]);
  }
  for (int i = 0; i < 4; ++i)
    for (int t = 0; t < 4; ++t) {
      // (Stored and summed here: GCC 12's _mm512_reduce_add_ps trips -Wuninitialized in its own header.)
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, a[i][t]);
      float v = 0.0f;
      for (int l = 0; l < 16; ++l) v += lanes[l];
      for (int64_t j = k; j < n; ++j) v += w[i][j] * x[t][j];
      out[t * 4 + i] = v;
    }
}

__attribute__((target("avx2,fma"))) inline float hsum256(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}

__attribute__((target("avx2,fma"))) void float_tile_avx2(const float* const* w, const float* const* x, int64_t n,
                                                         float* out) {
  __m256 a[4][2];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) a[i][0] = a[i][1] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256 x0 = _mm256_loadu_ps(x[0] + k), x1 = _mm256_loadu_ps(x[1] + k);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const __m256 wv = _mm256_loadu_ps(w[i] + k);
      a[i][0] = _mm256_fmadd_ps(wv, x0, a[i][0]);
      a[i][1] = _mm256_fmadd_ps(wv, x1, a[i][1]);
    }
  }
  for (int i = 0; i < 4; ++i)
    for (int t = 0; t < 2; ++t) {
      float v = hsum256(a[i][t]);
      for (int64_t j = k; j < n; ++j) v += w[i][j] * x[t][j];
      out[t * 4 + i] = v;
    }
}

// The tile kernel of the active level and its token block (nullptr at the scalar level).
FloatTileFn float_tile_for(CpuKernelLevel level, int& tokens) {
  if (level == CpuKernelLevel::Avx512) {
    tokens = 4;
    return float_tile_avx512;
  }
  if (level == CpuKernelLevel::Avx2) {
    tokens = 2;
    return float_tile_avx2;
  }
  tokens = 1;
  return nullptr;
}

// Rows [r0, r1) of w for the picks [p0, p1) through the float tiles: each 4-row tile decoded once (F32
// rows used in place when aligned) and multiplied with the picks' inputs x_of(p) in blocks of `tokens`;
// pick p's output row is out_of(p).
template <class Scratch, class FloatOf, class OutOf>
void rows_batch_tiles(const CpuKernels& k, FloatTileFn tile, int tokens, const WeightMatrix& w, int64_t r0, int64_t r1,
                      int64_t p0, int64_t p1, FloatOf x_of, OutOf out_of, Scratch& s) {
  const int64_t n = w.n_cols;
  for (int64_t r = r0; r < r1; r += kTileRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kTileRows, r1 - r));
    const float* rows[kTileRows];
    float_tile_rows(k, w, r, nr, s.fbuf.data(), rows);
    for (int i = nr; i < kTileRows; ++i) rows[i] = rows[0];  // padding rows: computed, not stored
    for (int64_t p = p0; p < p1; p += tokens) {
      const int nt = static_cast<int>(std::min<int64_t>(tokens, p1 - p));
      const float* xs[4];
      for (int t = 0; t < tokens; ++t) xs[t] = x_of(t < nt ? p + t : p);
      float out[16];
      tile(rows, xs, n, out);
      for (int t = 0; t < nt; ++t) {
        float* y = out_of(p + t);
        for (int i = 0; i < nr; ++i) y[r + i] = out[t * 4 + i];
      }
    }
  }
}

}  // namespace

void ColdExpertPool::do_batch_task(int index, int64_t task) {
  BatchJob& B = *batch_;
  const CpuKernels& k = cpu_kernels();
  Scratch& s = *scratch_[static_cast<size_t>(index)];
  const BatchJob::Task& T = B.tasks[static_cast<size_t>(task)];
  const size_t ud = static_cast<size_t>(B.d), uff = static_cast<size_t>(B.ff);
  if (T.phase == 0) {
    for (int64_t i = T.r0; i < T.r1; ++i) {
      const size_t t = static_cast<size_t>(B.qtokens[static_cast<size_t>(i)]);
      quantize_activations_i8(B.X + t * ud, B.d, B.xq.data() + t * ud, B.xd.data() + t * ud / 32,
                              B.xs.data() + t * ud / 16);
      if (B.i8_tiles)
        interleave_act_i8(B.w->gate.first.type, B.xq.data() + t * ud, B.xs.data() + t * ud / 16, 0, B.d / 32,
                          B.xi.data() + t * ud, B.xb.data() + t * ud / 32);
    }
    B.phase0_done.fetch_add(1, std::memory_order_acq_rel);
    return;
  }
  const BatchJob::Group& G = B.groups[static_cast<size_t>(T.group)];
  const ExpertFfn& w = *B.w;
  if (T.phase == 1) {
    // Phase 0's tasks were all claimed before this one: they are running and this wait ends.
    while (B.phase0_done.load(std::memory_order_acquire) < B.n_phase0) cpu_relax();
    const int e = G.expert;
    auto act_x = [&](int64_t p) {
      const size_t t = static_cast<size_t>(B.picks[static_cast<size_t>(p)].token);
      return I8Act{B.xq.data() + t * ud, B.xd.data() + t * ud / 32, B.xs.data() + t * ud / 16};
    };
    auto float_x = [&](int64_t p) { return B.X + static_cast<size_t>(B.picks[static_cast<size_t>(p)].token) * ud; };
    auto g_of = [&](int64_t p) { return B.g.data() + static_cast<size_t>(p) * uff; };
    auto u_of = [&](int64_t p) { return B.u.data() + static_cast<size_t>(p) * uff; };
    for (int64_t p0 = G.first; p0 < G.first + G.n; p0 += kBatchTokenChunk) {
      const int64_t p1 = std::min(G.first + G.n, p0 + kBatchTokenChunk);
      if (G.i8_tiles) {
        const auto tile_x = [&](int64_t p) {
          const size_t t = static_cast<size_t>(B.picks[static_cast<size_t>(p)].token);
          return I8TileAct{B.xi.data() + t * ud, B.xd.data() + t * ud / 32, B.xs.data() + t * ud / 16,
                           B.xb.data() + t * ud / 32};
        };
        rows_batch_i8_tiles(k, w.gate.expert(e), T.r0, T.r1, p0, p1, tile_x, g_of, s);
        rows_batch_i8_tiles(k, w.up.expert(e), T.r0, T.r1, p0, p1, tile_x, u_of, s);
      } else if (G.tiles) {
        rows_batch_tiles(k, B.tile, B.tile_tokens, w.gate.expert(e), T.r0, T.r1, p0, p1, float_x, g_of, s);
        rows_batch_tiles(k, B.tile, B.tile_tokens, w.up.expert(e), T.r0, T.r1, p0, p1, float_x, u_of, s);
      } else {
        rows_batch(k, B.gate_i8, B.fmt_gate, w.gate.expert(e), T.r0, T.r1, p0, p1, act_x, float_x, g_of, s);
        rows_batch(k, B.up_i8, B.fmt_up, w.up.expert(e), T.r0, T.r1, p0, p1, act_x, float_x, u_of, s);
      }
      for (int64_t p = p0; p < p1; ++p) {
        const size_t o = static_cast<size_t>(p) * uff;
        swiglu(B.g.data() + o + T.r0, B.u.data() + o + T.r0, T.r1 - T.r0, B.h.data() + o + T.r0);
        // r0 and r1 are multiples of 32 whenever down takes the int8 path (ff % 32 == 0 then).
        if (B.down_i8 && !G.tiles)
          quantize_activations_i8(B.h.data() + o + T.r0, T.r1 - T.r0, B.hq.data() + o + T.r0,
                                  B.hd.data() + (o + static_cast<size_t>(T.r0)) / 32,
                                  B.hs.data() + (o + static_cast<size_t>(T.r0)) / 16);
        // This task's 32-value blocks of the row, in the down kernel's layout (other tasks write the others).
        if (G.i8_tiles)
          interleave_act_i8(w.down.first.type, B.hq.data() + o, B.hs.data() + o / 16, T.r0 / 32, T.r1 / 32,
                            B.hi.data() + o, B.hb.data() + o / 32);
      }
    }
    B.a_done[T.group].fetch_add(1, std::memory_order_acq_rel);
    return;
  }
  // Phase B: the group's hidden activations are complete once all its phase-A blocks are (claimed
  // before any phase-B task, so running, and this wait ends).
  while (B.a_done[T.group].load(std::memory_order_acquire) < G.a_blocks) cpu_relax();
  auto act_h = [&](int64_t p) {
    const size_t o = static_cast<size_t>(p) * uff;
    return I8Act{B.hq.data() + o, B.hd.data() + o / 32, B.hs.data() + o / 16};
  };
  auto float_h = [&](int64_t p) -> const float* { return B.h.data() + static_cast<size_t>(p) * uff; };
  auto out_of = [&](int64_t p) { return B.picks[static_cast<size_t>(p)].out; };
  const WeightMatrix down = w.down.expert(G.expert);
  for (int64_t p0 = G.first; p0 < G.first + G.n; p0 += kBatchTokenChunk) {
    const int64_t p1 = std::min(G.first + G.n, p0 + kBatchTokenChunk);
    if (G.i8_tiles) {
      const auto tile_h = [&](int64_t p) {
        const size_t o = static_cast<size_t>(p) * uff;
        return I8TileAct{B.hi.data() + o, B.hd.data() + o / 32, B.hs.data() + o / 16, B.hb.data() + o / 32};
      };
      rows_batch_i8_tiles(k, down, T.r0, T.r1, p0, p1, tile_h, out_of, s);
    } else if (G.tiles)
      rows_batch_tiles(k, B.tile, B.tile_tokens, down, T.r0, T.r1, p0, p1, float_h, out_of, s);
    else
      rows_batch(k, B.down_i8, B.fmt_down, down, T.r0, T.r1, p0, p1, act_h, float_h, out_of, s);
  }
}

void ColdExpertPool::check_stacks(const ExpertFfn& w) const {
  const int n_exp = w.gate.n_expert;
  const int64_t d = w.gate.first.n_cols, ff = w.gate.first.n_rows;
  if (w.up.n_expert != n_exp || w.down.n_expert != n_exp || w.up.first.n_rows != ff || w.up.first.n_cols != d ||
      w.down.first.n_rows != d || w.down.first.n_cols != ff)
    fail("cold experts: gate/up/down stacks do not chain (gate ", ff, " x ", d, ", up ", w.up.first.n_rows, " x ",
         w.up.first.n_cols, ", down ", w.down.first.n_rows, " x ", w.down.first.n_cols, ")");
}

// Publishes a job of n_tasks tasks (job_ / batch_ already filled), works on it, waits for every task.
void ColdExpertPool::start_and_join(int64_t n_tasks) {
  if (n_tasks > kMaxTasks) fail("cold experts: ", n_tasks, " tasks exceed the pool's limit of ", kMaxTasks);
  finished_.store(0, std::memory_order_relaxed);
  const uint64_t gen = gen_.load(std::memory_order_relaxed) + 1;
  next_.store(pack(gen, static_cast<uint64_t>(n_tasks), 0), std::memory_order_release);
  gen_.store(gen, std::memory_order_release);
  if (sleepers_.load(std::memory_order_acquire) > 0) gen_.notify_all();
  work(0, static_cast<uint32_t>(gen & kGenMask));
  while (finished_.load(std::memory_order_acquire) < n_tasks) cpu_relax();
}

void ColdExpertPool::run(const ExpertFfn& w, const float* xn, const ColdPick* picks, int n_picks) {
  if (n_picks <= 0) return;
  check_stacks(w);
  const int n_exp = w.gate.n_expert;
  const int64_t d = w.gate.first.n_cols, ff = w.gate.first.n_rows;
  for (int i = 0; i < n_picks; ++i) {
    if (picks[i].expert < 0 || picks[i].expert >= n_exp)
      fail("cold experts: expert id ", picks[i].expert, " out of range (", n_exp, " experts)");
    if (picks[i].out == nullptr) fail("cold experts: pick ", i, " has no output row");
  }
  batch_mode_ = false;
  Job& J = *job_;
  const CpuKernels& k = cpu_kernels();
  J.w = &w;
  J.xn = xn;
  J.picks.assign(picks, picks + n_picks);
  J.d = d;
  J.ff = ff;
  J.gate_i8 = uses_i8(k, w.gate.first, J.fmt_gate);
  J.up_i8 = uses_i8(k, w.up.first, J.fmt_up);
  J.down_i8 = uses_i8(k, w.down.first, J.fmt_down);
  const size_t ud = static_cast<size_t>(d), uff = static_cast<size_t>(ff), np = static_cast<size_t>(n_picks);
  if (J.gate_i8 || J.up_i8) {
    J.xq.resize(ud);
    J.xd.resize(ud / 32 + 1);
    J.xs.resize(ud / 16 + 1);
    quantize_activations_i8(xn, d, J.xq.data(), J.xd.data(), J.xs.data());
  }
  J.g.resize(np * uff);
  J.u.resize(np * uff);
  J.h.resize(np * uff);
  ++J.seq;
  for (auto& sp : scratch_) {
    sp->fit(std::max(d, ff));
    if (J.down_i8 && sp->hq.size() < uff) {
      sp->hq.resize(uff);
      sp->hd.resize(uff / 32 + 1);
      sp->hs.resize(uff / 16 + 1);
    }
  }
  // Tasks of about equal bytes, kDecodeTasksPerThread per thread in all: small enough that the
  // threads finish close together (a decode job is tens of microseconds), large enough that claiming
  // one costs little beside it. Row blocks are whole 4-row tiles (the tiles matvec uses).
  const double a_row_bytes = static_cast<double>(w.gate.first.row_stride + w.up.first.row_stride);
  const double b_row_bytes = static_cast<double>(w.down.first.row_stride);
  const double job_bytes = static_cast<double>(n_picks) * (static_cast<double>(ff) * a_row_bytes +
                                                           static_cast<double>(d) * b_row_bytes);
  const double task_bytes = job_bytes / static_cast<double>(kDecodeTasksPerThread * n_threads_);
  const auto rows_for = [&](double row_bytes, int64_t n_rows) {
    const auto r = static_cast<int64_t>(task_bytes / std::max(row_bytes, 1.0));
    return std::clamp<int64_t>(round_up(std::max<int64_t>(r, 1), kMaxDotRows), kMaxDotRows,
                               round_up(n_rows, kMaxDotRows));
  };
  J.a_rows = rows_for(a_row_bytes, ff);
  J.b_rows = rows_for(b_row_bytes, d);
  J.a_blocks = (ff + J.a_rows - 1) / J.a_rows;
  J.b_blocks = (d + J.b_rows - 1) / J.b_rows;
  J.n_a = J.a_blocks * n_picks;
  J.n_total = J.n_a + J.b_blocks * n_picks;
  if (J.n_total > kMaxTasks) fail("cold experts: ", J.n_total, " tasks exceed the pool's limit of ", kMaxTasks);
  if (J.a_done_cap < np) {
    J.a_done = std::make_unique<std::atomic<int64_t>[]>(np);
    J.a_done_cap = np;
  }
  for (size_t i = 0; i < np; ++i) J.a_done[i].store(0, std::memory_order_relaxed);
  start_and_join(J.n_total);
}

void ColdExpertPool::run_batch(const ExpertFfn& w, const float* X, int n_tok, const ColdTokenPick* picks, int n_picks,
                               bool bitwise) {
  if (n_picks <= 0) return;
  check_stacks(w);
  const int n_exp = w.gate.n_expert;
  const int64_t d = w.gate.first.n_cols, ff = w.gate.first.n_rows;
  for (int i = 0; i < n_picks; ++i) {
    if (picks[i].expert < 0 || picks[i].expert >= n_exp)
      fail("cold experts: expert id ", picks[i].expert, " out of range (", n_exp, " experts)");
    if (picks[i].token < 0 || picks[i].token >= n_tok)
      fail("cold experts: pick ", i, " names token ", picks[i].token, " of a batch of ", n_tok);
    if (picks[i].out == nullptr) fail("cold experts: pick ", i, " has no output row");
  }
  batch_mode_ = true;
  BatchJob& B = *batch_;
  const CpuKernels& k = cpu_kernels();
  B.w = &w;
  B.X = X;
  B.d = d;
  B.ff = ff;
  B.tile_tokens = 1;
  B.tile = batch_float_tiles_ && !bitwise ? float_tile_for(k.level, B.tile_tokens) : nullptr;
  B.gate_i8 = uses_i8(k, w.gate.first, B.fmt_gate);
  B.up_i8 = uses_i8(k, w.up.first, B.fmt_up);
  B.down_i8 = uses_i8(k, w.down.first, B.fmt_down);
  B.picks.assign(picks, picks + n_picks);
  std::stable_sort(B.picks.begin(), B.picks.end(), [](const ColdTokenPick& a, const ColdTokenPick& b) {
    return a.expert != b.expert ? a.expert < b.expert : a.token < b.token;
  });
  B.groups.clear();
  for (int64_t i = 0; i < n_picks; ++i) {
    const int e = B.picks[static_cast<size_t>(i)].expert;
    if (B.groups.empty() || B.groups.back().expert != e) B.groups.push_back({e, i, 0, 0, 0, 0, 0, false});
    ++B.groups.back().n;
  }
  // The batched int8 kernel where all three matrices are fused formats it takes (gate and up sharing
  // one activation layout): bitwise run()'s results, so it goes before the float tiles.
  const auto tileable = [&](const WeightMatrix& m, bool i8, const I8Format& f) {
    return i8 && f.fused && k.dot_tile_fused != nullptr && cpu_tile_path() && tile_fused_type(m.type) && m.n_cols % 256 == 0;
  };
  B.i8_tiles = tileable(w.gate.first, B.gate_i8, B.fmt_gate) && tileable(w.up.first, B.up_i8, B.fmt_up) &&
               tileable(w.down.first, B.down_i8, B.fmt_down) &&
               (w.gate.first.type == GgmlType::Q6_K) == (w.up.first.type == GgmlType::Q6_K);
  for (BatchJob::Group& G : B.groups) {
    G.i8_tiles = B.i8_tiles && G.n >= kI8TileMinTokens;
    G.tiles = !G.i8_tiles && B.tile != nullptr && G.n >= kTileMinTokens;
  }
  const size_t ud = static_cast<size_t>(d), uff = static_cast<size_t>(ff), np = static_cast<size_t>(n_picks);
  B.tasks.clear();
  // Phase 0: the int8 inputs of every token some pick reads.
  B.qtokens.clear();
  if (B.gate_i8 || B.up_i8) {
    std::vector<char> used(static_cast<size_t>(n_tok), 0);
    for (const BatchJob::Group& G : B.groups)
      if (!G.tiles)
        for (int64_t i = G.first; i < G.first + G.n; ++i) used[static_cast<size_t>(B.picks[static_cast<size_t>(i)].token)] = 1;
    for (int t = 0; t < n_tok; ++t)
      if (used[static_cast<size_t>(t)]) B.qtokens.push_back(t);
    const size_t nt = static_cast<size_t>(n_tok);
    if (B.xq.size() < nt * ud) B.xq.resize(nt * ud);
    if (B.xd.size() < nt * ud / 32 + 1) B.xd.resize(nt * ud / 32 + 1);
    if (B.xs.size() < nt * ud / 16 + 1) B.xs.resize(nt * ud / 16 + 1);
    if (B.i8_tiles && B.xi.size() < nt * ud) {
      B.xi.resize(nt * ud);
      B.xb.resize(nt * ud / 32 + 1);
    }
    const int64_t nq = static_cast<int64_t>(B.qtokens.size());
    for (int64_t i = 0; i < nq; i += kQuantTokens) B.tasks.push_back({0, 0, i, std::min(nq, i + kQuantTokens)});
  }
  B.n_phase0 = static_cast<int64_t>(B.tasks.size());
  B.phase0_done.store(0, std::memory_order_relaxed);
  if (B.g.size() < np * uff) {
    B.g.resize(np * uff);
    B.u.resize(np * uff);
    B.h.resize(np * uff);
  }
  if (B.down_i8 && B.hq.size() < np * uff) {
    B.hq.resize(np * uff);
    B.hd.resize(np * uff / 32 + 1);
    B.hs.resize(np * uff / 16 + 1);
  }
  if (B.i8_tiles && B.hi.size() < np * uff) {
    B.hi.resize(np * uff);
    B.hb.resize(np * uff / 32 + 1);
  }
  for (auto& sp : scratch_) sp->fit(std::max(d, ff));
  // Row blocks sized so that every task does about the same work (rows x tokens of its group): about
  // four tasks per thread and phase, whole 32-row groups (activation blocks, tiles).
  const int64_t per_phase = 4 * static_cast<int64_t>(n_threads_);
  const int64_t work_a = (ff * n_picks + per_phase - 1) / per_phase, work_b = (d * n_picks + per_phase - 1) / per_phase;
  for (BatchJob::Group& G : B.groups) {
    G.a_rows = std::clamp<int64_t>(round_up((work_a + G.n - 1) / G.n, 32), 32, round_up(ff, 32));
    G.b_rows = std::clamp<int64_t>(round_up((work_b + G.n - 1) / G.n, 32), 32, round_up(d, 32));
    G.a_blocks = (ff + G.a_rows - 1) / G.a_rows;
    G.b_blocks = (d + G.b_rows - 1) / G.b_rows;
  }
  const int64_t n_groups = static_cast<int64_t>(B.groups.size());
  for (int64_t gi = 0; gi < n_groups; ++gi) {
    const BatchJob::Group& G = B.groups[static_cast<size_t>(gi)];
    for (int64_t r0 = 0; r0 < ff; r0 += G.a_rows) B.tasks.push_back({1, gi, r0, std::min(ff, r0 + G.a_rows)});
  }
  for (int64_t gi = 0; gi < n_groups; ++gi) {
    const BatchJob::Group& G = B.groups[static_cast<size_t>(gi)];
    for (int64_t r0 = 0; r0 < d; r0 += G.b_rows) B.tasks.push_back({2, gi, r0, std::min(d, r0 + G.b_rows)});
  }
  const size_t ng = static_cast<size_t>(n_groups);
  if (B.a_done_cap < ng) {
    B.a_done = std::make_unique<std::atomic<int64_t>[]>(ng);
    B.a_done_cap = ng;
  }
  for (size_t i = 0; i < ng; ++i) B.a_done[i].store(0, std::memory_order_relaxed);
  start_and_join(static_cast<int64_t>(B.tasks.size()));
}

}  // namespace strata
