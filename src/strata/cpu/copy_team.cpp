#include "strata/cpu/copy_team.h"

#include <algorithm>
#include <cstring>

namespace strata {

CopyTeam::CopyTeam(int n_threads) : n_threads_(std::max(1, n_threads)) {
  try {
    for (int t = 1; t < n_threads_; ++t) workers_.emplace_back([this, t] { worker(t); });
  } catch (...) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      quit_ = true;
    }
    start_.notify_all();
    for (std::thread& w : workers_) w.join();
    throw;
  }
}

CopyTeam::~CopyTeam() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    quit_ = true;
  }
  start_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void CopyTeam::copy(void* dst, const void* src, size_t n) {
  const Piece p{static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), n};
  if (workers_.empty()) {
    copy_slice(p, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    piece_ = p;
    left_ = static_cast<int>(workers_.size());
    ++gen_;
  }
  start_.notify_all();
  copy_slice(p, 0);
  std::unique_lock<std::mutex> lk(mu_);
  done_.wait(lk, [&] { return left_ == 0; });
}

void CopyTeam::copy_slice(const Piece& p, int t) const {
  const size_t per = (p.n + static_cast<size_t>(n_threads_) - 1) / static_cast<size_t>(n_threads_);
  const size_t slice = (per + 63) / 64 * 64;  // n_threads_ slices cover n, each starting on a cache line
  const size_t off = slice * static_cast<size_t>(t);
  if (off < p.n) std::memcpy(p.dst + off, p.src + off, std::min(slice, p.n - off));
}

void CopyTeam::worker(int t) {
  uint64_t seen = 0;
  for (;;) {
    Piece p;
    {
      std::unique_lock<std::mutex> lk(mu_);
      start_.wait(lk, [&] { return quit_ || gen_ != seen; });
      if (quit_) return;
      seen = gen_;
      p = piece_;
    }
    copy_slice(p, t);
    std::lock_guard<std::mutex> lk(mu_);
    if (--left_ == 0) done_.notify_one();
  }
}

}  // namespace strata
