#pragma once
// Progress of a long write, load or prefill on stderr: bytes (or tokens) done / total, the rate
// and ETA.
// On a terminal one line is redrawn in place at most every 200 ms; otherwise (a log file, a
// pipe) a plain line is printed every 10 s, so logs stay short. finish() prints the final line
// in both cases; finish_if_shown() only after a progress line was printed (loads that are over
// before the first one say nothing). Not thread-safe: one thread reports.

#include <chrono>
#include <cstdint>
#include <string>

namespace ktier {

class ProgressMeter {
 public:
  enum class Unit { kBytes, kTokens };
  // `label` starts each line ("synth"). Disabled meters print nothing. `log_interval`: between
  // lines when stderr is not a terminal. Counts are bytes, or tokens with Unit::kTokens.
  ProgressMeter(std::string label, uint64_t total_bytes, bool enabled,
                std::chrono::milliseconds log_interval = std::chrono::seconds(10),
                Unit unit = Unit::kBytes);
  void update(uint64_t done_bytes);
  void finish(uint64_t done_bytes);
  void finish_if_shown(uint64_t done_bytes) {
    if (shown_) finish(done_bytes);
  }
  // The work stopped early (an error follows): ends a progress line redrawn in place, so the
  // next message starts on its own line.
  void abandon();

 private:
  std::string line(uint64_t done, double seconds) const;

  std::string label_;
  uint64_t total_;
  bool enabled_;
  bool tty_;
  Unit unit_;
  std::chrono::milliseconds log_interval_;
  bool shown_ = false;  // a progress line was printed
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_print_;
};

}  // namespace ktier
