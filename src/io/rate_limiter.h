#pragma once
// RateLimiter: caps the read rate of an engine (IoOptions::rate_limit_bytes_per_s) so a user can
// emulate a 1, 3 or 7 GB/s disk on a faster machine (issue 7's compressed-vs-plain table).
//
// A token bucket whose depth is one read: reserve(n) returns the moment a read of n bytes may
// start, and moves the "next free" moment n / rate later. Idle time does not accumulate credit,
// so the long-run rate never exceeds the cap, and a steady stream of reads is paced evenly.
// Granularity is the engine's chunk size (IoOptions::max_chunk_bytes). The engine cuts a chunk
// only once next_free() has come (queued_engine.cpp), so that which read goes next is the
// queues' order (demand first), not the order slots were reserved in.
//
// Thread-safety: reserve() and give_back() may be called from any number of threads.

#include <chrono>
#include <cstdint>
#include <mutex>

namespace ktier::io {

class RateLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  // 0 = unlimited: reserve() always returns `now`.
  explicit RateLimiter(uint64_t bytes_per_s) : bytes_per_s_(bytes_per_s) {}
  bool unlimited() const { return bytes_per_s_ == 0; }
  uint64_t bytes_per_s() const { return bytes_per_s_; }

  // Start time for a read of `bytes` issued no earlier than `now`.
  Clock::time_point reserve(uint64_t bytes, Clock::time_point now);
  // The moment from which a read reserved now would start at once (the past when idle).
  Clock::time_point next_free();
  // For a read that will not be made (cancelled before it started): gives back the part of the
  // slot reserve(bytes, ...) gave it, from `slot_start`, that has not elapsed by `now`, and later
  // reads move up by that much. Reads reserved after it keep their times, so for a moment two
  // may start together; the long-run rate stays under the cap, and time already passed is not
  // given back (no credit from idleness).
  void give_back(uint64_t bytes, Clock::time_point slot_start, Clock::time_point now);

 private:
  std::chrono::nanoseconds cost(uint64_t bytes) const;

  const uint64_t bytes_per_s_;
  std::mutex mu_;
  Clock::time_point next_free_{};  // guarded by mu_
};

}  // namespace ktier::io
