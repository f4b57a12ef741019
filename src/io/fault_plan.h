#pragma once
// FaultPlan: the fault-injection seam of the I/O layer (STYLE-ANCHORS.md practice 24). Always
// compiled in, inert unless a plan is attached to an engine (IoOptions::fault_plan) and holds
// rules. Tests use it to prove that retries, short-read continuation and checksums upstream work;
// nothing in a normal run creates one.
//
// Where faults act: the engines split every request into chunk reads and each chunk into one or
// more attempts (a retry after an error and a continuation after a short read are new attempts).
//   kEio       the attempt fails with EIO without reaching the disk (the engine retries once);
//   kShortRead the attempt delivers only half of what the kernel returned (the engine continues);
//   kDelay     the attempt starts `delay` later (holds its in-flight slot meanwhile);
//   kCorrupt   when a chunk completes, the payload bytes inside [begin, end) are XORed with
//              `corrupt_xor` in the caller's buffer: delivered corrupted, reported as success.
// A rule matches a read of a file whose path contains `path_contains` ("" = any file) and whose
// byte range overlaps [begin, end). Of the matching events it fires on every `every_nth`-th one
// (1 = every one), at most `max_fires` times (-1 = unlimited).
//
// Thread-safety: all methods may be called from any thread at any time, including while an
// engine is using the plan (rules added later apply to later attempts).

#include <chrono>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace ktier::io {

enum class FaultKind { kEio, kShortRead, kDelay, kCorrupt };

struct FaultRule {
  static constexpr uint64_t kToEnd = std::numeric_limits<uint64_t>::max();
  // Builders for the common cases; refine with the chainable setters below.
  static FaultRule eio(uint64_t begin = 0, uint64_t end = kToEnd) {
    return make(FaultKind::kEio, begin, end);
  }
  static FaultRule short_read(uint64_t begin = 0, uint64_t end = kToEnd) {
    return make(FaultKind::kShortRead, begin, end);
  }
  static FaultRule delay_by(std::chrono::microseconds d, uint64_t begin = 0, uint64_t end = kToEnd) {
    FaultRule r = make(FaultKind::kDelay, begin, end);
    r.delay = d;
    return r;
  }
  static FaultRule corrupt(uint64_t begin, uint64_t end, uint8_t xor_mask = 0x01) {
    FaultRule r = make(FaultKind::kCorrupt, begin, end);
    r.corrupt_xor = xor_mask;
    return r;
  }
  FaultRule& in_path(std::string substring) {
    path_contains = std::move(substring);
    return *this;
  }
  FaultRule& every(uint32_t n) {
    every_nth = n;
    return *this;
  }
  FaultRule& times(int32_t n) {
    max_fires = n;
    return *this;
  }

  FaultKind kind = FaultKind::kEio;
  std::string path_contains;  // substring of ReadFile::path(); "" matches every file
  uint64_t begin = 0;         // file byte range [begin, end) a read must overlap
  uint64_t end = kToEnd;
  uint32_t every_nth = 1;  // fire on the Nth, 2Nth, ... matching event
  int32_t max_fires = 1;   // -1 = no limit
  std::chrono::microseconds delay{0};  // kDelay only
  uint8_t corrupt_xor = 0x01;          // kCorrupt only; nonzero

 private:
  static FaultRule make(FaultKind kind, uint64_t begin, uint64_t end) {
    FaultRule r;
    r.kind = kind;
    r.begin = begin;
    r.end = end;
    return r;
  }
};

// What the plan decided for one read attempt.
struct AttemptFaults {
  bool eio = false;
  bool short_read = false;
  std::chrono::microseconds delay{0};
};

// One range of delivered bytes to corrupt, in file offsets.
struct CorruptSpan {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint8_t xor_mask = 0;
};

class FaultPlan {
 public:
  // Returns the rule's index, for fires().
  size_t add(FaultRule rule);
  void clear();
  // How often rule `index` has fired so far.
  uint64_t fires(size_t index) const;
  // Fires of all rules together.
  uint64_t total_fires() const;

  // Engine side. Consulted once per read attempt of [offset, offset + length).
  AttemptFaults on_attempt(const std::string& path, uint64_t offset, uint64_t length);
  // Consulted once per completed chunk with payload [offset, offset + length); appends the spans
  // to corrupt (clipped to the payload) to `out`.
  void on_chunk_done(const std::string& path, uint64_t offset, uint64_t length,
                     std::vector<CorruptSpan>& out);

 private:
  struct Entry {
    FaultRule rule;
    uint64_t matches = 0;
    uint64_t fires = 0;
  };
  // Counts a match of `e`; true when it fires.
  static bool count_and_fire(Entry& e);
  static bool matches(const FaultRule& r, const std::string& path, uint64_t offset,
                      uint64_t length);

  mutable std::mutex mu_;
  std::vector<Entry> entries_;  // guarded by mu_
};

}  // namespace ktier::io
