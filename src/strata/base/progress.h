// A progress indicator on stderr for slow steps a person waits on (loading a large model).
// On a terminal it redraws one bar in place; when stderr is a file or pipe it writes a plain line
// at every 10% so logs stay readable and free of control characters.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace strata {

class ProgressBar {
 public:
  // `total` units of work (bytes, tensors, ...); `unit_bytes` = true shows done/total as sizes.
  ProgressBar(std::string label, uint64_t total, bool unit_bytes = true);
  ~ProgressBar();  // finishes the bar when the caller did not
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Sets the amount done (clamped to total). Cheap: redraws at most ~10 times a second.
  void update(uint64_t done);
  // Draws 100% and ends the line. Idempotent.
  void finish();

 private:
  void draw(bool final_draw);

  std::string label_;
  uint64_t total_;
  uint64_t done_ = 0;
  bool unit_bytes_;
  bool tty_;
  bool finished_ = false;
  int last_decile_ = -1;  // plain mode: the last 10% step written
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// "1.2 GB", "44.0 MB", "512 B".
std::string format_bytes(uint64_t bytes);

}  // namespace strata
