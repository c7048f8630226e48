#include "strata/base/progress.h"

#include <unistd.h>

#include <cstdio>
#include <utility>

#include "strata/base/error.h"

namespace strata {

std::string format_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

ProgressBar::ProgressBar(std::string label, uint64_t total, bool unit_bytes)
    : label_(std::move(label)),
      total_(total),
      unit_bytes_(unit_bytes),
      tty_(::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {
  draw(false);
}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(uint64_t done) {
  if (finished_) return;
  done_ = done < total_ ? done : total_;
  const auto now = std::chrono::steady_clock::now();
  if (tty_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  draw(false);
}

void ProgressBar::finish() {
  if (finished_) return;
  done_ = total_;
  draw(true);
  finished_ = true;
}

void ProgressBar::draw(bool final_draw) {
  const int percent = total_ == 0 ? 100 : static_cast<int>(done_ * 100 / total_);
  const std::string amount = unit_bytes_ ? cat(format_bytes(done_), " / ", format_bytes(total_))
                                         : cat(done_, " / ", total_);
  if (!tty_) {
    // Plain lines at 0%, 10%, ... 100%: readable in a log file.
    const int decile = percent / 10;
    if (decile == last_decile_) return;
    last_decile_ = decile;
    std::fprintf(stderr, "%s: %d%% (%s)\n", label_.c_str(), decile * 10, amount.c_str());
    std::fflush(stderr);
    return;
  }
  constexpr int kWidth = 30;
  const int filled = percent * kWidth / 100;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kWidth - filled), '.');
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  // \r back to the line start, \x1b[K clears what a longer previous draw left behind.
  std::fprintf(stderr, "\r%s [%s] %3d%% %s %.1fs\x1b[K%s", label_.c_str(), bar.c_str(), percent, amount.c_str(),
               secs, final_draw ? "\n" : "");
  std::fflush(stderr);
}

}  // namespace strata
