#pragma once
// The VRAM expert tier (GPU mode, issue 6; docs/STRATA.md): an ExpertSource whose views are
// device memory, in front of the host tier (the RAM ExpertCache, or the checkpoint itself).
//
//   * The policy is a strata::CacheModel (the same classes as the RAM tier and replay), driven
//     one step per token by begin_layer(); its evictions free slots.
//   * fetch() serves experts resident in a slot (a VRAM hit) and copies the others from the host
//     tier's views into slots (RAM -> VRAM link): into a policy slot when the policy admitted
//     the expert, else into one of top_k bypass slots, which only last until the next fetch.
//   * Router lookahead (on_prediction) copies predicted experts that the host tier holds in
//     memory (ExpertSource::peek) into policy slots ahead of need, on the lookahead copy queue
//     (kExperts), overlapping the ops already issued. A predicted expert the host is still
//     reading (its RAM prefetch) waits, and is copied at the next layer's prediction or routing
//     that finds it in memory, until its own layer is routed. fetch() copies its misses on a
//     queue of their own (kExpertMisses), so they never wait behind lookahead copies for later
//     layers.
//   * Ordering: every slot has a fence marked after its latest copy. fetch() makes the ops wait
//     for the fences of the slots it hands out (per queue the latest, which covers the queue's
//     earlier copies), so a layer's ops do not wait for copies issued after their own experts'
//     (those of experts predicted for later layers). Every slot write is a copy issued after
//     `copies_after_ops`, so no slot is overwritten while an op still reads it, and after the
//     slot's previous copy when that was on the other queue (a prefetch evicted before it
//     landed). The host tier calls the reuse fence with the memory it is about to overwrite,
//     and the host waits for the copies that read it, not for the rest; fetch() waits for its
//     own earlier misses' copies before it asks the host for more (the host's fetch views last
//     only until its next fetch).
//   * Exactness: a slot holds the stored bytes and the views are the same matrices, so where an
//     expert came from never changes an output byte.
//
// Not thread-safe: one forward pass at a time.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/blocks.h"
#include "model/experts.h"
#include "strata/cache_policy.h"

namespace ktier::runtime {

struct VramTierStats {
  uint64_t slots = 0, policy_slots = 0, slot_bytes = 0;
  uint64_t requests = 0, hits = 0;                  // experts asked of fetch()
  uint64_t hit_bytes = 0, miss_bytes = 0;           // stored bytes of those experts
  uint64_t copied_bytes = 0;                        // RAM -> VRAM, demand and prefetch
  // Lookahead copies: issued; useful = fetched by their target layer (counted as hits: their
  // bytes crossed the link ahead); timely = useful and landed when fetched (a copy still in
  // flight makes the layer's ops wait for it); wasted = not asked for by their layer.
  uint64_t prefetch_issued = 0, prefetch_useful = 0, prefetch_timely = 0, prefetch_wasted = 0;
  uint64_t prefetch_bytes = 0;
  // Of useful, timely and wasted: the prefetches issued before the last begin_window().
  uint64_t carried_useful = 0, carried_timely = 0, carried_wasted = 0;
  double hit_rate_bytes() const {
    const uint64_t total = hit_bytes + miss_bytes;
    return total ? static_cast<double>(hit_bytes) / static_cast<double>(total) : 0.0;
  }
};

class VramExpertTier final : public model::ExpertSource, public model::LookaheadObserver {
 public:
  // `host` and `be` must outlive the tier. slot_bytes: room for one expert's three matrices as
  // placed here (each part 256-byte aligned); slots: total slots, at least minimum_slots().
  // Errors: the backend's (allocation); Status::budget when slots is too small.
  static Result<std::unique_ptr<VramExpertTier>> open(model::ExpertSource& host,
                                                      backend::Backend& be,
                                                      const format::ModelConfig& c,
                                                      uint64_t slot_bytes, int64_t slots,
                                                      strata::PolicyKind policy,
                                                      const strata::PolicyInputs& inputs);
  ~VramExpertTier() override;
  // The fewest slots the tier opens with: top_k for the policy and top_k bypass for one fetch.
  // With router lookahead `lookahead` > 0, also top_k per depth: the policy keeps the last
  // routed layer's top_k pinned while the next layers are predicted, so at 2 x top_k no
  // lookahead copy was ever made (tiny: 0 issued). Never more than every expert plus the bypass.
  // open() refuses fewer than minimum_slots(c); the engine plans for the lookahead it runs.
  static int64_t minimum_slots(const format::ModelConfig& c, int lookahead = 0);
  // Bytes one expert takes in a slot, from the checkpoint's expert tensors (float experts are
  // sized as F32, the widest: they occur only in test checkpoints).
  static uint64_t slot_bytes_for(const format::Checkpoint& ckpt);

  Status fetch(int64_t layer, std::span<const int32_t> ids, model::ExpertWeights* out) override;
  void begin_layer(int64_t layer, int64_t first_position, const int32_t* ids, int64_t T,
                   int k) override;
  // Also the host's begin_pass (the RAM tier below).
  void begin_pass() override;
  uint64_t bytes_fetched() const override { return stats_.hit_bytes + stats_.miss_bytes; }
  int64_t max_batch() const override { return bypass_; }
  void on_prediction(int64_t layer, int depth, int64_t first_position, const int32_t* ids,
                     const float* weights, int64_t T, int k) override;
  const VramTierStats& stats() const { return stats_; }
  // Starts a report window: the prefetches not yet used or lost count as carried when they
  // settle (VramTierStats::carried_*).
  void begin_window();

 private:
  VramExpertTier(model::ExpertSource& host, backend::Backend& be) : host_(host), be_(be) {}
  void on_evicted(uint32_t key);
  // The tier's two copy queues, as indices of its per-queue state.
  enum Link : int { kAhead = 0, kMisses = 1, kLinks = 2 };
  static backend::Backend::CopyQueue queue_of(Link l) {
    return l == kAhead ? backend::Backend::CopyQueue::kExperts
                       : backend::Backend::CopyQueue::kExpertMisses;
  }
  // Issues copies of one expert's host views into `slot` on link `l` (after begin_copies(l))
  // and marks the slot's fence; returns the device views (usable by ops after ops_need()).
  Result<model::ExpertWeights> copy_in(const model::ExpertWeights& host, int64_t slot, Link l);
  // Before the first slot write of a batch on link l: its queue waits for the ops issued so far.
  Status begin_copies(Link l);
  // Later ops wait for the copies into `slots` (each slot's latest), and for no later copy.
  Status ops_need(std::span<const int64_t> slots);
  // The host waits for link l's copies issued since its last wait (they may read host memory
  // about to be overwritten); a failure is kept in deferred_.
  void host_waits_for(Link l);
  // The host tier's reuse fence: the host waits for the copies that read [begin, begin + bytes)
  // (host_reads_), not for the others; a failure is kept in deferred_.
  void fence_host_range(const void* begin, size_t bytes);
  // Whether a policy slot holds expert `id` of `layer` (the host's set_held_above hook).
  bool holds(int64_t layer, int32_t id) const;

  // A predicted expert for layer `target`, pinned (once copied) through step `pin_until`.
  struct Prediction {
    uint32_t key;
    int64_t target;
    int32_t id;
    uint64_t pin_until;
  };
  // Copies one predicted expert ahead when the host holds it; false when the host does not hold
  // it yet (worth another try before its layer). A copy failure is kept in deferred_.
  bool prefetch_one(const Prediction& p);
  // Tries the waiting predictions again; forgets those for layers up to `done_through`.
  void retry_waiting(int64_t done_through);
  // Layer `layer` is routed (ids [n]): its lookahead copies that no token asks for were wrong
  // predictions, counted wasted now as the RAM tier counts its own (a later hit on the slot,
  // in another pass, is a plain hit, not a useful copy).
  void settle_copies(int64_t layer, const int32_t* ids, int64_t n);
  // The slot's lookahead copy, if it holds one not used yet, is counted wasted and forgotten.
  void waste_copy(size_t slot);

  model::ExpertSource& host_;
  backend::Backend& be_;
  int64_t num_experts_ = 0, moe_layers_ = 1, bypass_ = 0, first_moe_layer_ = 0;
  backend::BackendBuffer arena_;
  std::vector<int64_t> slot_of_key_;             // -1: not in a slot
  std::vector<model::ExpertWeights> slot_views_;  // device views of each slot's expert
  std::vector<int64_t> free_;                     // free policy slots
  // Per slot, filled by lookahead and not used yet: kFresh, or kCarried when issued before the
  // current report window; 0 otherwise.
  enum : uint8_t { kFresh = 1, kCarried = 2 };
  std::vector<uint8_t> prefetched_;
  strata::RequestedExperts asked_;  // settle_copies' scratch
  // Per slot: a fence marked after its latest copy, and that copy's link and number on it.
  struct SlotCopy {
    int8_t link = -1;     // -1: never copied into
    uint64_t number = 0;  // 1 = the link's first slot copy
  };
  std::vector<backend::Backend::Fence> slot_fence_;
  std::vector<SlotCopy> slot_copy_;
  // Per link: slot copies issued, the latest the ops were made to wait for, begin_copies() done
  // for the current batch, and copies issued that the host has not waited for.
  uint64_t issued_[kLinks] = {}, ops_waited_[kLinks] = {};
  bool copies_open_[kLinks] = {}, copies_unsynced_[kLinks] = {};
  // The host memory each slot copy reads ([lo, hi) over its parts) and a fence marked after
  // it, until the host has waited for it; at most one per fence of read_fences_ (when none is
  // free, the host waits for all copies and the list empties).
  struct HostRead {
    uintptr_t lo = 0, hi = 0;
    int8_t link = 0;
    uint64_t number = 0;  // the copy's number on its link
    backend::Backend::Fence fence = 0;
  };
  std::vector<HostRead> host_reads_;
  std::vector<backend::Backend::Fence> read_fences_, free_read_fences_;
  // Drops the entries `done` says the host has waited for; their fences are free again.
  template <class Pred>
  void forget_reads(Pred done);
  std::unique_ptr<strata::CacheModel> policy_;
  strata::PrefetchLedger prefetched_for_;  // issued prefetches awaiting their layer
  std::vector<Prediction> waiting_;        // predicted, not yet in host memory
  uint64_t step_ = 0;     // policy steps begun (one per token and MoE layer)
  uint64_t requests_ = 0;  // keys accessed (strata::Request::index)
  Status deferred_ = Status::ok();  // a copy failure in on_prediction, reported by fetch()
  VramTierStats stats_;
};

}  // namespace ktier::runtime
