#pragma once
// The expert RAM tier of the memory dial (issue 4; DESIGN.md §4, §6): routed experts read from
// the shards into a fixed set of equal slots, kept and replaced least-recently-used (the strata
// scheduler brings the real policy, issue 5).
//
// A fetch reads the missing experts whole — one read for an expert whose parts are one
// contiguous run (§3.5), one read per part otherwise — all submitted together (so up to the I/O
// engine's queue depth are in flight), in disk order (shard, offset). Destinations are placed
// congruent to their file offsets modulo 4096, so O_DIRECT reads the aligned middle of every
// part straight into the slot. The slots share one io::AlignedBuffer on transparent huge pages
// (a fresh 4 KiB-page slot costs thousands of page faults on its first read), counted in
// bytes_allocated().
//
// Exactness: a slot holds the stored bytes; the views handed out are the same WeightMatrix the
// mapped source gives, so the output never depends on the tier's size or its hits.
//
// Threads: not thread-safe (one forward pass at a time). Views stay valid until the next fetch.

#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "format/checkpoint.h"
#include "io/aligned_buffer.h"
#include "io/io_engine.h"
#include "model/experts.h"

namespace ktier::runtime {

struct ExpertCacheStats {
  int64_t slots = 0;
  uint64_t slot_bytes = 0, bytes_allocated = 0;
  uint64_t hit_bytes = 0, miss_bytes = 0;  // expert bytes served from RAM / read from disk
  uint64_t io_wait_ns = 0;
  double hit_rate_bytes() const {
    const uint64_t total = hit_bytes + miss_bytes;
    return total ? static_cast<double>(hit_bytes) / static_cast<double>(total) : 0.0;
  }
};

class ExpertCache final : public model::ExpertSource {
 public:
  // Bytes one slot needs for the largest expert of `ckpt` (parts plus alignment slack).
  static uint64_t slot_bytes(const format::Checkpoint& ckpt);
  // `slots` >= 1. `ckpt`, `engine` and `files` (one ReadFile per shard, Checkpoint order) must
  // outlive the cache. Status::runtime when the slots cannot be allocated.
  static Result<std::unique_ptr<ExpertCache>> open(const format::Checkpoint& ckpt,
                                                   io::IoEngine& engine,
                                                   const std::vector<io::ReadFile>& files,
                                                   int64_t slots);
  ~ExpertCache() override;

  Status fetch(int64_t layer, std::span<const int32_t> ids, model::ExpertWeights* out) override;
  uint64_t bytes_fetched() const override { return stats_.hit_bytes + stats_.miss_bytes; }
  int64_t max_batch() const override { return stats_.slots; }
  const ExpertCacheStats& stats() const { return stats_; }

 private:
  struct Slot {
    uint8_t* base = nullptr;        // slot_bytes inside arena_
    int64_t key = -1;               // layer * N_e + expert, -1 empty
    std::array<uint64_t, 6> part_offset{};  // where each part starts in buf
    std::list<size_t>::iterator lru;
  };
  ExpertCache(const format::Checkpoint& ckpt, io::IoEngine& engine,
              const std::vector<io::ReadFile>& files)
      : ckpt_(ckpt), engine_(engine), files_(files) {}
  model::ExpertWeights view(const Slot& s, int64_t layer, int32_t e) const;

  const format::Checkpoint& ckpt_;
  io::IoEngine& engine_;
  const std::vector<io::ReadFile>& files_;
  std::unique_ptr<io::CompletionQueue> cq_;
  io::AlignedBuffer arena_;  // all slots, one huge-page allocation (few page faults per slot)
  std::vector<Slot> slots_;
  std::list<size_t> lru_;  // front = most recently used slot index
  std::unordered_map<int64_t, size_t> where_;  // key -> slot
  ExpertCacheStats stats_;
};

}  // namespace ktier::runtime
