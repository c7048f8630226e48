#include "strata/cpu/copy_team.h"

#include <algorithm>
#include <cstring>

namespace strata {

CopyTeam::CopyTeam(int n_threads) : n_threads_(std::max(1, n_threads)) {
  try {
    for (int t = 1; t < n_threads_; ++t) workers_.emplace_back([this] { worker(); });
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
  if (n == 0) return;
  const Piece p{static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), n};
  if (workers_.empty() || n <= kBlock) {
    std::memcpy(p.dst, p.src, n);
    return;
  }
  uint32_t gen = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    piece_ = p;
    gen = ++gen_;
    copied_.store(0);
    claim_.store(uint64_t{gen} << 32);
  }
  start_.notify_all();
  copy_blocks(p, gen);
  // The other threads hold at most one block each by now.
  const size_t blocks = (n + kBlock - 1) / kBlock;
  while (copied_.load() < blocks) std::this_thread::yield();
}

void CopyTeam::copy_blocks(const Piece& p, uint32_t gen) {
  const size_t blocks = (p.n + kBlock - 1) / kBlock;
  for (;;) {
    uint64_t c = claim_.load();
    do {
      if (static_cast<uint32_t>(c >> 32) != gen || (c & 0xffffffffu) >= blocks) return;
    } while (!claim_.compare_exchange_weak(c, c + 1));
    const size_t off = static_cast<size_t>(c & 0xffffffffu) * kBlock;
    std::memcpy(p.dst + off, p.src + off, std::min(kBlock, p.n - off));
    copied_.fetch_add(1);
  }
}

void CopyTeam::worker() {
  uint32_t seen = 0;
  for (;;) {
    Piece p;
    {
      std::unique_lock<std::mutex> lk(mu_);
      start_.wait(lk, [&] { return quit_ || gen_ != seen; });
      if (quit_) return;
      seen = gen_;
      p = piece_;
    }
    copy_blocks(p, seen);
  }
}

}  // namespace strata
