#include "common/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace ktier {
namespace {

constexpr auto kTtyInterval = std::chrono::milliseconds(200);

std::string human_bytes(double b) {
  char buf[32];
  if (b >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else
    std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  return buf;
}

}  // namespace

ProgressMeter::ProgressMeter(std::string label, uint64_t total_bytes, bool enabled,
                             std::chrono::milliseconds log_interval, Unit unit)
    : label_(std::move(label)),
      total_(total_bytes),
      enabled_(enabled),
      tty_(::isatty(STDERR_FILENO) == 1),
      unit_(unit),
      log_interval_(log_interval),
      start_(std::chrono::steady_clock::now()),
      last_print_(start_) {}

std::string ProgressMeter::line(uint64_t done, double seconds) const {
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0.0;
  const double pct = total_ ? 100.0 * static_cast<double>(done) / static_cast<double>(total_) : 100.0;
  char buf[160];
  if (unit_ == Unit::kTokens) {
    const int printed =
        std::snprintf(buf, sizeof buf, "%s: %llu / %llu tokens (%.0f%%), %.1f tok/s",
                      label_.c_str(), static_cast<unsigned long long>(done),
                      static_cast<unsigned long long>(total_), pct, rate);
    // snprintf returns what it would have written: a long label leaves no room for the rest.
    const size_t n =
        printed < 0 ? 0 : std::min<size_t>(static_cast<size_t>(printed), sizeof buf - 1);
    if (done < total_ && rate > 0)
      std::snprintf(buf + n, sizeof buf - n, ", ETA %.0f s",
                    static_cast<double>(total_ - done) / rate);
    else
      std::snprintf(buf + n, sizeof buf - n, ", %.1f s", seconds);
    return buf;
  }
  if (done < total_ && rate > 0) {
    const double eta = static_cast<double>(total_ - done) / rate;
    std::snprintf(buf, sizeof buf, "%s: %s / %s (%.0f%%), %.0f MB/s, ETA %.0f s", label_.c_str(),
                  human_bytes(static_cast<double>(done)).c_str(),
                  human_bytes(static_cast<double>(total_)).c_str(), pct, rate / 1e6, eta);
  } else {
    std::snprintf(buf, sizeof buf, "%s: %s / %s (%.0f%%), %.0f MB/s, %.1f s", label_.c_str(),
                  human_bytes(static_cast<double>(done)).c_str(),
                  human_bytes(static_cast<double>(total_)).c_str(), pct, rate / 1e6, seconds);
  }
  return buf;
}

void ProgressMeter::update(uint64_t done_bytes) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  const std::chrono::milliseconds interval = tty_ ? kTtyInterval : log_interval_;
  if (now - last_print_ < interval) return;
  last_print_ = now;
  shown_ = true;
  const double s = std::chrono::duration<double>(now - start_).count();
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", line(done_bytes, s).c_str());
  } else {
    std::fprintf(stderr, "%s\n", line(done_bytes, s).c_str());
  }
  std::fflush(stderr);
}

void ProgressMeter::abandon() {
  if (!enabled_ || !shown_ || !tty_) return;
  std::fputc('\n', stderr);
  std::fflush(stderr);
}

void ProgressMeter::finish(uint64_t done_bytes) {
  if (!enabled_) return;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::fprintf(stderr, "%s%s\n", tty_ ? "\r\033[K" : "", line(done_bytes, s).c_str());
  std::fflush(stderr);
}

}  // namespace ktier
