// A small team of threads that copies one host buffer at a time at memory speed (the streaming prefill's
// staging copies, cuda/hybrid_stream.h): the caller and n_threads - 1 workers each copy one slice of every
// buffer, and copy() returns once all of them are done, so no thread can still be writing when the caller
// reuses the destination. Workers sleep between copies. One caller at a time.
#pragma once

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
  struct Piece {
    const uint8_t* src = nullptr;
    uint8_t* dst = nullptr;
    size_t n = 0;
  };
  void copy_slice(const Piece& p, int t) const;
  void worker(int t);

  int n_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_;  // a new piece (or quit) for the workers
  std::condition_variable done_;   // left_ reached 0
  uint64_t gen_ = 0;
  Piece piece_;
  int left_ = 0;  // workers still copying the current piece
  bool quit_ = false;
};

}  // namespace strata
