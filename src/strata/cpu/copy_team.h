// A small team of threads that copies one host buffer at a time at memory speed (the streaming prefill's
// staging copies, cuda/hybrid_stream.h): the caller and n_threads - 1 workers claim blocks of the buffer
// until none are left, so a thread slowed by the scheduler costs its share, not the whole copy. copy()
// returns once every block is copied; a claim carries the copy's generation, so a late worker can never
// claim a block of the next copy and nothing writes after copy() returns. Workers sleep between copies.
// One caller at a time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace strata {

class CopyTeam {
 public:
  explicit CopyTeam(int n_threads);  // n_threads >= 1 in all, the caller of copy() included
  ~CopyTeam();
  CopyTeam(const CopyTeam&) = delete;
  CopyTeam& operator=(const CopyTeam&) = delete;

  int n_threads() const { return n_threads_; }
  // dst[0, n) = src[0, n); the ranges must not overlap. Blocking.
  void copy(void* dst, const void* src, size_t n);

 private:
  static constexpr size_t kBlock = size_t{256} << 10;
  struct Piece {
    const uint8_t* src = nullptr;
    uint8_t* dst = nullptr;
    size_t n = 0;
  };
  void copy_blocks(const Piece& p, uint32_t gen);
  void worker();

  int n_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_;  // a new piece (or quit) for the workers
  uint32_t gen_ = 0;  // the current copy's generation
  Piece piece_;
  bool quit_ = false;
  std::atomic<uint64_t> claim_{0};  // gen_ << 32 | next block to claim
  std::atomic<size_t> copied_{0};   // blocks of the current copy finished
};

}  // namespace strata
