#include "io/rate_limiter.h"

#include <algorithm>

namespace ktier::io {

std::chrono::nanoseconds RateLimiter::cost(uint64_t bytes) const {
  // Nanoseconds for `bytes` at the cap; long double keeps 64 GiB / 1 B/s in range.
  return std::chrono::nanoseconds(
      static_cast<int64_t>(static_cast<long double>(bytes) * 1e9L / bytes_per_s_));
}

RateLimiter::Clock::time_point RateLimiter::reserve(uint64_t bytes, Clock::time_point now) {
  if (bytes_per_s_ == 0) return now;
  const auto n = cost(bytes);
  std::lock_guard lock(mu_);
  const Clock::time_point start = next_free_ > now ? next_free_ : now;
  next_free_ = start + n;
  return start;
}

RateLimiter::Clock::time_point RateLimiter::next_free() {
  std::lock_guard lock(mu_);
  return next_free_;
}

void RateLimiter::give_back(uint64_t bytes, Clock::time_point slot_start, Clock::time_point now) {
  if (bytes_per_s_ == 0) return;
  const Clock::time_point slot_end = slot_start + cost(bytes);
  const Clock::time_point from = std::max(now, slot_start);
  if (from >= slot_end) return;
  std::lock_guard lock(mu_);
  next_free_ -= slot_end - from;
}

}  // namespace ktier::io
