#pragma once
// The expert RAM tier (DESIGN.md §4-§6, docs/STRATA.md §6): routed experts read from the shards
// into a fixed set of equal slots, placed by a strata cache policy (temperature by default, LRU
// selectable) and fetched ahead of need by router lookahead.
//
// Two layers of state:
//   * The policy (strata::CacheModel, the same class replay runs) decides which experts are
//     resident. It sees one step per (token, MoE layer), the token's experts in selection order
//     (begin_layer), and the lookahead predictions (on_prediction -> prefetch). Its capacity is
//     `policy_slots`; it reports every key it drops through its eviction hook.
//   * The slots hold bytes. A resident expert has a slot once it has been fetched or prefetched;
//     an expert the policy does not keep (a bypass: declined, or displaced by a later token of
//     the same chunk) borrows one of `batch_slots` extra slots for the one fetch that needs it.
//     So slots = policy_slots + batch_slots, and a fetch never waits for a slot to be freed.
//
// Reads: a fetch reads its missing experts whole — one read for an expert whose parts are one
// contiguous run (§3.5), one read per part otherwise — all submitted together, in disk order
// (shard, offset), and waits for them (fetch_each instead streams its misses through the
// batch slots, handing each over as it lands: see there). Prefetches are queued nearest target
// layer first, then highest predicted weight, and submitted one expert at a time while fewer
// than `prefetch_in_flight` prefetch chunk reads are outstanding (half the I/O queue in the
// engine, which counts chunks of IoOptions::max_chunk_bytes: a K3 expert of 17.5 MB is 5 of
// 4 MiB, so counting reads would let 16 prefetched experts fill the 32-deep queue 2.5 times over
// and a layer's demand reads wait behind them; one expert larger than the budget still goes
// alone); a queued prediction whose layer has been routed is dropped (cancelled). A prefetch is
// useful when its expert is fetched by the layer it was predicted for, in the same forward
// pass; one still being read then is waited for and counted late (a miss for the hit rate,
// useful but not timely). A prefetch evicted, failed, or first fetched by another pass or layer
// is wasted. Destinations are placed congruent to their file offsets modulo 4096, so O_DIRECT
// reads the aligned middle of every part straight into the slot. The slots share one
// io::AlignedBuffer on transparent huge pages, faulted in at open.
//
// Exactness: a slot holds the stored bytes; the views handed out are the same WeightMatrix the
// mapped source gives, so the output never depends on the policy, the tier's size, prefetch or
// hits.
//
// Threads: not thread-safe (one forward pass at a time; the I/O engine's threads only write
// slots with reads outstanding). Views stay valid until the next fetch, begin_layer or
// on_prediction — those of a fetch_each of more than batch_slots ids only until the `ready`
// call that handed them over returns.

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "common/status.h"
#include "cpu/thread_pool.h"
#include "format/checkpoint.h"
#include "io/aligned_buffer.h"
#include "io/io_engine.h"
#include "model/blocks.h"
#include "model/experts.h"
#include "strata/cache_policy.h"

namespace ktier::runtime {

struct ExpertCacheOptions {
  strata::PolicyKind policy = strata::PolicyKind::kTemperature;  // not kBelady (needs the future)
  strata::TemperatureParams temperature;
  std::vector<double> temperature_seed;  // per key (layer * N_e + e) at clock 0; empty: none
  std::vector<uint32_t> static_ranking;  // keys, most used first; required for kStatic
  int64_t policy_slots = 0;              // the policy's capacity, >= 0
  int64_t batch_slots = 1;  // experts one fetch() may ask for; fetch_each() misses at once; >= 1
  // Prefetch chunk reads (IoOptions::max_chunk_bytes each; not experts) outstanding at most,
  // >= 1; one expert is always let through, however many chunks it takes.
  uint32_t prefetch_in_flight = 16;
  // Faults the slot arena in at open on these threads (the engine's kernel pool; must outlive
  // open()); null: on the calling thread.
  cpu::ThreadPool* pool = nullptr;
};

struct ExpertCacheStats {
  int64_t slots = 0, policy_slots = 0, batch_slots = 0;
  uint64_t slot_bytes = 0, bytes_allocated = 0;
  // Fetched experts: served from RAM without waiting (hits), or not (misses: read on demand, or
  // prefetched but still in flight = late). Bytes are the experts' stored bytes.
  uint64_t hits = 0, demand_reads = 0, late = 0;
  uint64_t hit_bytes = 0, miss_bytes = 0, late_bytes = 0;
  uint64_t read_bytes = 0;  // shards -> RAM, demand and prefetch (the NVMe -> RAM link)
  // Prefetch (experts): issued = reads started for predicted experts; useful = fetched by their
  // target layer in the same pass; timely = useful and complete by then; wasted = not asked
  // for by that layer's routing, evicted, or failed (issued - useful - wasted are still
  // pending); cancelled = predicted experts dropped before issue (each once per target layer).
  uint64_t prefetch_issued = 0, prefetch_useful = 0, prefetch_timely = 0, prefetch_wasted = 0;
  uint64_t prefetch_cancelled = 0;
  uint64_t prefetch_bytes = 0, prefetch_wasted_bytes = 0;
  // Of useful, timely, wasted and wasted_bytes: the prefetches issued before the last
  // begin_window() (a report over the window leaves them out of its precision).
  uint64_t carried_useful = 0, carried_timely = 0, carried_wasted = 0, carried_wasted_bytes = 0;
  uint64_t io_wait_ns = 0;  // time blocked on expert reads (demand, late prefetch, a busy slot)
  // The policy's own decisions, one per (token, layer, expert): what replay of the same trace
  // at policy_slots reports.
  uint64_t policy_requests = 0, policy_hits = 0;

  double hit_rate_bytes() const {
    const uint64_t total = hit_bytes + miss_bytes;
    return total ? static_cast<double>(hit_bytes) / static_cast<double>(total) : 0.0;
  }
};

class ExpertCache final : public model::ExpertSource, public model::LookaheadObserver {
 public:
  // Bytes one slot needs for the largest expert of `ckpt` (parts plus alignment slack).
  static uint64_t slot_bytes(const format::Checkpoint& ckpt);
  // `ckpt`, `engine` and `files` (one ReadFile per shard, Checkpoint order) must outlive the
  // cache. Status::runtime when the slots cannot be allocated.
  static Result<std::unique_ptr<ExpertCache>> open(const format::Checkpoint& ckpt,
                                                   io::IoEngine& engine,
                                                   const std::vector<io::ReadFile>& files,
                                                   ExpertCacheOptions opts);
  ~ExpertCache() override;

  void begin_layer(int64_t layer, int64_t first_position, const int32_t* ids, int64_t T,
                   int k) override;
  void begin_pass() override;
  Status fetch(int64_t layer, std::span<const int32_t> ids, model::ExpertWeights* out) override;
  // Experts in memory (hits, landed prefetches) are handed over first, while the misses' reads
  // run; each miss when its reads land. Any number of ids: at most batch_slots misses hold a
  // slot lent for this call at once, the next one's reads starting as soon as an earlier one
  // has been handed over (a prefill chunk's experts stream through the slots, reads overlapping
  // the compute).
  Status fetch_each(int64_t layer, std::span<const int32_t> ids, model::ExpertWeights* out,
                    const ReadyFn& ready) override;
  // A ready slot's views (no read, no wait; not counted as a use). See ExpertSource::peek.
  bool peek(int64_t layer, int32_t id, model::ExpertWeights* out) override;
  void set_reuse_fence(ReuseFence fence) override { reuse_fence_ = std::move(fence); }
  void set_held_above(std::function<bool(int64_t layer, int32_t id)> held) override {
    held_above_ = std::move(held);
  }
  // The slots' memory (GPU mode pins it so RAM -> VRAM copies run at link speed).
  uint8_t* arena() { return arena_.data(); }
  size_t arena_bytes() const { return stats_.bytes_allocated; }  // the slots' bytes
  uint64_t bytes_fetched() const override { return stats_.hit_bytes + stats_.miss_bytes; }
  int64_t max_batch() const override { return stats_.batch_slots; }
  int64_t max_each() const override { return INT64_MAX; }
  void on_prediction(int64_t layer, int depth, int64_t first_position, const int32_t* ids,
                     const float* weights, int64_t T, int k) override;

  const ExpertCacheStats& stats() const { return stats_; }
  strata::PolicyKind policy() const { return policy_kind_; }
  // Starts a report window: the prefetches issued so far and not yet used or lost count as
  // carried when they settle (ExpertCacheStats::carried_*).
  void begin_window();

 private:
  enum class SlotState { kFree, kLoading, kReady };
  struct Slot {
    uint8_t* base = nullptr;  // slot_bytes inside arena_
    int64_t key = -1;         // layer * N_e + expert, -1 when free
    SlotState state = SlotState::kFree;
    uint32_t reads_outstanding = 0;  // prefetch reads not yet completed
    uint32_t prefetch_chunks = 0;    // their chunk reads, released when the last one lands
    bool read_failed = false;        // a prefetch read failed: re-read on demand
    bool prefetched_unused = false;  // prefetched and not yet fetched
    bool prefetch_carried = false;   // ... and issued before the current report window
    int64_t prefetch_layer = -1;     // the layer it was predicted for ...
    uint64_t prefetch_pass = 0;      // ... in this forward pass
    std::array<uint64_t, 6> part_offset{};
  };
  struct PendingPrefetch {
    int64_t target_layer;
    float weight;
    uint32_t key;
    uint64_t pin_until_step;
  };
  ExpertCache(const format::Checkpoint& ckpt, io::IoEngine& engine,
              const std::vector<io::ReadFile>& files)
      : ckpt_(ckpt), engine_(engine), files_(files) {}
  model::ExpertWeights view(const Slot& s, int64_t layer, int32_t e) const;
  uint64_t expert_bytes(uint32_t key) const;
  // The engine's chunk reads for expert `key`'s requests (what the prefetch budget counts; a
  // bounced O_DIRECT head or tail may add one or two).
  uint32_t chunks_of(uint32_t key) const;
  // Read requests for expert `key` into slot `si` (sets its part offsets); tag = si.
  void plan_reads(uint32_t key, size_t si, std::vector<io::ReadRequest>& out);
  void on_evicted(uint32_t key);
  // Counts a prefetched slot's first use (or loss): useful when `layer` is its target in this
  // pass and its bytes are good, wasted otherwise.
  void settle_prefetch(Slot& s, int64_t layer, bool arrived_in_time);
  // A prefetch of `bytes` lost before use: counted wasted (and carried-wasted when it was in
  // flight when the report window began).
  void count_wasted(const Slot& s, uint64_t bytes);
  // Drops the queued predictions for layers up to `through_layer`, counted as cancelled.
  void cancel_pending(int64_t through_layer);
  PendingPrefetch pop_pending();  // pending_'s front, removed
  void release_bypass();
  // A free slot whose reads are complete, waiting for an evicted prefetch's reads if need be.
  size_t take_free_slot();
  // Moves completed prefetch reads into their slots; blocks for one when `block`.
  void reap_prefetches(bool block);
  void pump_prefetches();

  const format::Checkpoint& ckpt_;
  io::IoEngine& engine_;
  const std::vector<io::ReadFile>& files_;
  std::unique_ptr<io::CompletionQueue> demand_cq_, prefetch_cq_;
  // All slots, one allocation (huge pages when large: then rounded up past the slots' bytes,
  // stats_.bytes_allocated, which is all that is touched).
  io::AlignedBuffer arena_;
  ReuseFence reuse_fence_;  // called with a slot's memory before it is handed out for a new read
  std::function<bool(int64_t, int32_t)> held_above_;  // experts a faster tier keeps for use
  std::vector<uint8_t*> registered_;  // arena pieces registered with the I/O engine
  std::vector<Slot> slots_;
  std::vector<int32_t> slot_of_key_;  // per key, -1 when the key has no slot
  std::vector<size_t> free_;          // slots with key -1 (some may still be loading)
  std::vector<size_t> bypass_;        // slots lent to the last fetch for non-resident experts
  std::unique_ptr<strata::CacheModel> policy_;
  strata::PrefetchLedger prefetched_for_;  // issued prefetches awaiting their layer
  strata::PolicyKind policy_kind_ = strata::PolicyKind::kTemperature;
  std::deque<PendingPrefetch> pending_;  // predictions not yet issued, a key at most once
  std::vector<uint8_t> queued_;          // per key, 1 while it is in pending_
  strata::RequestedExperts asked_;  // begin_layer's scratch: the layer's routed experts
  uint32_t prefetch_chunks_outstanding_ = 0, prefetch_in_flight_ = 32;
  uint64_t step_ = 0;  // policy steps begun (the next is step_)
  // Policy requests made (strata::Request::index: 64-bit, as 2^32 come within ~2.9 M K3
  // tokens); only the policies' tie-breaks between equally hot keys read it.
  uint64_t requests_ = 0;
  int64_t moe_layers_ = 1;
  uint64_t pass_ = 0;  // forward passes begun
  ExpertCacheStats stats_;
};

}  // namespace ktier::runtime
