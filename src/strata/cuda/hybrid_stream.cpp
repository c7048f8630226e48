#include "strata/cuda/hybrid_stream.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "strata/base/error.h"
#include "strata/cpu/copy_team.h"
#include "strata/cuda/cuda_check.h"
#include "strata/cuda/device_memory.h"

namespace strata::cuda {

namespace {

// The three stacks of a layer's routed experts, in the order the buffers hold them.
const ExpertStack& host_stack(const MoeWeights& w, int i) { return i == 0 ? w.gate : i == 1 ? w.up : w.down; }
const DevMatrix& dev_stack(const DevMoe& w, int i) { return i == 0 ? w.gate : i == 1 ? w.up : w.down; }

// Bytes of one expert of stack i as the buffers hold it (rows packed).
size_t expert_bytes(const ExpertStack& s) {
  return static_cast<size_t>(s.first.n_rows) * static_cast<size_t>(s.first.row_stride);
}

std::vector<int> cold_experts(const std::vector<int>& slots) {
  std::vector<int> cold;
  for (size_t e = 0; e < slots.size(); ++e)
    if (slots[e] < 0) cold.push_back(static_cast<int>(e));
  return cold;
}

}  // namespace

// The staging side: a thread that takes layer jobs in order and, piece by piece, copies the layer's cold experts into a
// ring of pinned pieces (with a CopyTeam) and enqueues each piece's transfer into the layer's device buffer on its own
// copy stream.
struct ExpertStreamer::Stager {
  static constexpr size_t kPiece = 16u << 20;  // bytes per pinned piece
  static constexpr int kPieces = 4;            // pieces in the ring

  struct Run {
    const uint8_t* src;
    uint8_t* dst;
    size_t n;
  };
  struct Job {
    uint64_t id;
    int buffer;
    std::vector<Run> runs;
  };

  int device = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t copied[kBuffers] = {};
  cudaEvent_t piece_done[kPieces] = {};
  uint8_t* pieces[kPieces] = {};
  int next_piece = 0;
  cudaEvent_t* free_events = nullptr;  // the streamer's free_

  std::unique_ptr<CopyTeam> team;  // host copies into the pinned pieces

  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;  // jobs in, progress out
  std::deque<Job> jobs;
  uint64_t done = 0;  // jobs whose transfers are all enqueued (ids are 1, 2, ...)
  std::string error;  // a failure on the staging thread, reported by wait()
  bool stop = false;

  Stager(int n_threads, cudaEvent_t* free_ev) : free_events(free_ev) {
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    try {
      check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "prefill streaming: stream");
      for (cudaEvent_t& e : copied)
        check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "prefill streaming: event");
      for (int i = 0; i < kPieces; ++i) {
        check_cuda(cudaEventCreateWithFlags(&piece_done[i], cudaEventDisableTiming), "prefill streaming: event");
        void* p = nullptr;
        check_cuda(cudaMallocHost(&p, kPiece), "prefill streaming: pinned staging (cudaMallocHost)");
        pieces[i] = static_cast<uint8_t*>(p);
      }
      team = std::make_unique<CopyTeam>(n_threads);
      thread = std::thread([this] { loop(); });
    } catch (...) {
      shutdown();
      throw;
    }
  }
  ~Stager() { shutdown(); }

  void shutdown() {
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
    }
    cv.notify_all();
    if (thread.joinable()) thread.join();
    team.reset();
    if (stream) cudaStreamSynchronize(stream);
    for (int i = 0; i < kPieces; ++i) {
      if (pieces[i]) cudaFreeHost(pieces[i]);
      if (piece_done[i]) cudaEventDestroy(piece_done[i]);
      pieces[i] = nullptr;
      piece_done[i] = nullptr;
    }
    for (cudaEvent_t& e : copied) {
      if (e) cudaEventDestroy(e);
      e = nullptr;
    }
    if (stream) cudaStreamDestroy(stream);
    stream = nullptr;
  }

  void push(Job job) {
    {
      std::lock_guard<std::mutex> lk(mu);
      jobs.push_back(std::move(job));
    }
    cv.notify_all();
  }

  // Blocks until job `id` has enqueued all its transfers (its copied event is then recorded).
  void wait(uint64_t id) {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return done >= id || !error.empty(); });
    if (!error.empty()) fail(error);
  }

  void loop() {
    cudaSetDevice(device);
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return stop || !jobs.empty(); });
        if (stop) return;
        job = std::move(jobs.front());
        jobs.pop_front();
      }
      try {
        run(job);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lk(mu);
        error = e.what();
      }
      {
        std::lock_guard<std::mutex> lk(mu);
        done = job.id;
      }
      cv.notify_all();
    }
  }

  void run(const Job& job) {
    // The layer that last used the buffer has been read by the GPU.
    check_cuda(cudaEventSynchronize(free_events[job.buffer]), "prefill streaming: wait for a buffer");
    for (const Run& r : job.runs) {
      for (size_t off = 0; off < r.n; off += kPiece) {
        const size_t n = std::min(kPiece, r.n - off);
        const int k = next_piece;
        next_piece = (next_piece + 1) % kPieces;
        check_cuda(cudaEventSynchronize(piece_done[k]), "prefill streaming: wait for a piece");
        team->copy(pieces[k], r.src + off, n);
        check_cuda(cudaMemcpyAsync(r.dst + off, pieces[k], n, cudaMemcpyHostToDevice, stream),
                   "prefill streaming: copy experts");
        check_cuda(cudaEventRecord(piece_done[k], stream), "prefill streaming: record a piece");
      }
    }
    check_cuda(cudaEventRecord(copied[job.buffer], stream), "prefill streaming: record copies");
  }

};

ExpertStreamer::ExpertStreamer(const Model& model, const DeviceModel& dm,
                               const std::vector<std::vector<int>>& placement)
    : c_(model.config()) {
  const ModelWeights& W = model.weights();
  layer_index_.assign(static_cast<size_t>(c_.n_layer), -1);
  try {
    for (size_t l = 0; l < placement.size() && l < W.layers.size(); ++l) {
      if (c_.layer(static_cast<int>(l)).ffn != FfnKind::Moe) continue;
      Layer L;
      L.cold = cold_experts(placement[l]);
      if (L.cold.empty()) continue;
      for (int i = 0; i < 3; ++i) {
        const ExpertStack& hs = host_stack(W.layers[l].moe, i);
        L.dev[i] = dev_stack(dm.layers[l].moe, i);
        if (hs.first.row_stride != L.dev[i].row_bytes || hs.expert_stride != expert_bytes(hs))
          fail("prefill streaming: layer ", l, "'s experts are not stored packed (row stride ", hs.first.row_stride,
               ", row ", L.dev[i].row_bytes, " bytes)");
        L.src[i] = hs.first.data;
        L.stride[i] = hs.expert_stride;
      }
      std::vector<int> rank(static_cast<size_t>(c_.n_expert), -1);
      for (size_t r = 0; r < L.cold.size(); ++r) rank[static_cast<size_t>(L.cold[r])] = static_cast<int>(r);
      L.rank_d = static_cast<int*>(device_alloc(rank.size() * sizeof(int), "prefill streaming: expert ranks"));
      layers_.push_back(L);
      check_cuda(cudaMemcpy(L.rank_d, rank.data(), rank.size() * sizeof(int), cudaMemcpyHostToDevice),
                 "prefill streaming: ranks");
      layer_index_[l] = static_cast<int>(layers_.size() - 1);
    }
    job_of_.assign(layers_.size(), 0);
    for (const Layer& L : layers_)
      buffer_bytes_ = std::max<uint64_t>(buffer_bytes_, L.cold.size() * (L.stride[0] + L.stride[1] + L.stride[2]));
    for (int b = 0; b < kBuffers; ++b) {
      buffers_[b] =
          static_cast<uint8_t*>(device_alloc(std::max<uint64_t>(buffer_bytes_, 1), "prefill streaming buffers"));
      check_cuda(cudaEventCreateWithFlags(&free_[b], cudaEventDisableTiming), "prefill streaming: event");
    }
    const int hw = static_cast<int>(std::thread::hardware_concurrency());
    stager_ = std::make_unique<Stager>(std::clamp(hw / 2, 1, kMaxStagingThreads), free_);
  } catch (...) {
    release_all();
    throw;
  }
}

int ExpertStreamer::staging_threads() const { return stager_ ? stager_->team->n_threads() : 0; }

ExpertStreamer::~ExpertStreamer() { release_all(); }

void ExpertStreamer::release_all() {
  stager_.reset();  // joins the staging thread after its transfers
  for (int b = 0; b < kBuffers; ++b) {
    device_free(buffers_[b]);
    buffers_[b] = nullptr;
    if (free_[b]) cudaEventDestroy(free_[b]);
    free_[b] = nullptr;
  }
  for (Layer& L : layers_) device_free(L.rank_d);
  layers_.clear();
}

void ExpertStreamer::begin_chunk(int m) {
  const double per_expert = static_cast<double>(m) * c_.n_expert_used / std::max(c_.n_expert, 1);
  chunk_streams_ = per_expert >= kMinTokensPerExpert && failure_.empty() && !layers_.empty();
  next_pos_ = 0;
  first_buffer_ = next_buffer_;
  if (!chunk_streams_) return;
  next_buffer_ = static_cast<int>((static_cast<size_t>(first_buffer_) + layers_.size()) % kBuffers);
  ++stats_.chunks;
  for (int b = 0; b < kBuffers && next_pos_ < layers_.size(); ++b) enqueue(next_pos_++);
}

void ExpertStreamer::enqueue(size_t pos) {
  const Layer& L = layers_[pos];
  const int b = static_cast<int>((static_cast<size_t>(first_buffer_) + pos) % kBuffers);
  const size_t n = L.cold.size();
  Stager::Job job;
  job.id = ++jobs_;
  job.buffer = b;
  uint8_t* dst = buffers_[b];
  StreamedLayer& v = views_[b];
  v.rank = L.rank_d;
  v.n = static_cast<int>(n);
  for (int i = 0; i < 3; ++i) {
    DevMatrix& m = i == 0 ? v.gate : i == 1 ? v.up : v.down;
    m = L.dev[i];
    m.data = dst;
    m.expert_stride = L.stride[i];
    m.n_expert = static_cast<int>(n);
    // Runs of consecutive cold ids are contiguous in the file and in the buffer: one run each.
    for (size_t r = 0; r < n;) {
      size_t e = r + 1;
      while (e < n && L.cold[e] == L.cold[e - 1] + 1) ++e;
      job.runs.push_back(
          {L.src[i] + static_cast<size_t>(L.cold[r]) * L.stride[i], dst + r * L.stride[i], (e - r) * L.stride[i]});
      r = e;
    }
    dst += n * L.stride[i];
    stats_.bytes += n * L.stride[i];
  }
  stats_.experts += n;
  ++stats_.layers;
  job_of_[pos] = job.id;
  stager_->push(std::move(job));
}

StreamedLayer ExpertStreamer::acquire(int il, cudaStream_t s) {
  if (!streams(il)) return StreamedLayer{};
  const size_t pos = static_cast<size_t>(layer_index_[static_cast<size_t>(il)]);
  if (pos >= next_pos_) fail("prefill streaming: layer ", il, " acquired before the layers ahead of it were released");
  const int b = static_cast<int>((static_cast<size_t>(first_buffer_) + pos) % kBuffers);
  try {
    stager_->wait(job_of_[pos]);
  } catch (const Error& e) {
    failure_ = e.what();  // this prompt fails with the error; the later ones compute cold experts on the CPU
    throw;
  }
  check_cuda(cudaStreamWaitEvent(s, stager_->copied[b], 0), "prefill streaming: wait for copies");
  return views_[b];
}

void ExpertStreamer::release(int il, cudaStream_t s) {
  const size_t pos = static_cast<size_t>(layer_index_[static_cast<size_t>(il)]);
  const int b = static_cast<int>((static_cast<size_t>(first_buffer_) + pos) % kBuffers);
  check_cuda(cudaEventRecord(free_[b], s), "prefill streaming: record buffer use");
  if (next_pos_ < layers_.size()) enqueue(next_pos_++);
}

bool ExpertStreamer::streams(int il) const {
  return chunk_streams_ && il >= 0 && il < c_.n_layer && layer_index_[static_cast<size_t>(il)] >= 0;
}

}  // namespace strata::cuda
