#pragma once
// Progress of a long write on stderr: bytes done / total, MB/s and ETA.
// On a terminal one line is redrawn in place at most every 200 ms; otherwise (a log file, a
// pipe) a plain line is printed every 10 s, so logs stay short. finish() prints the final line
// in both cases. Not thread-safe: one thread reports.

#include <chrono>
#include <cstdint>
#include <string>

namespace ktier::synth {

class ProgressMeter {
 public:
  // `label` starts each line ("synth"). Disabled meters print nothing.
  ProgressMeter(std::string label, uint64_t total_bytes, bool enabled);
  void update(uint64_t done_bytes);
  void finish(uint64_t done_bytes);

 private:
  std::string line(uint64_t done, double seconds) const;

  std::string label_;
  uint64_t total_;
  bool enabled_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_print_;
};

}  // namespace ktier::synth
