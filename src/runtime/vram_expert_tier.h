#pragma once
// The VRAM expert tier (GPU mode, issue 6; docs/STRATA.md): an ExpertSource whose views are
// device memory, in front of the host tier (the RAM ExpertCache, or the checkpoint itself).
//
//   * The policy is a strata::CacheModel (the same classes as the RAM tier and replay), driven
//     one step per token by begin_layer(); its evictions free slots.
//   * fetch() serves experts resident in a slot (a VRAM hit) and copies the others from the host
//     tier's views into slots (RAM -> VRAM link): into a policy slot when the policy admitted
//     the expert, else into one of top_k bypass slots, which only last until the next fetch.
//   * Exactness: a slot holds the stored bytes and the views are the same matrices, so where an
//     expert came from never changes an output byte.
//
// Not thread-safe: one forward pass at a time.

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/experts.h"
#include "strata/cache_policy.h"

namespace ktier::runtime {

struct VramTierStats {
  uint64_t slots = 0, policy_slots = 0, slot_bytes = 0;
  uint64_t requests = 0, hits = 0;                  // experts asked of fetch()
  uint64_t hit_bytes = 0, miss_bytes = 0;           // stored bytes of those experts
  uint64_t copied_bytes = 0;                        // RAM -> VRAM
  double hit_rate_bytes() const {
    const uint64_t total = hit_bytes + miss_bytes;
    return total ? static_cast<double>(hit_bytes) / static_cast<double>(total) : 0.0;
  }
};

class VramExpertTier final : public model::ExpertSource {
 public:
  // `host` and `be` must outlive the tier. slot_bytes: room for one expert's three matrices as
  // placed here (each part 256-byte aligned); slots: total slots, at least 2 * top_k (top_k for
  // the policy, top_k bypass). Errors: the backend's (allocation); Status::budget when slots is
  // too small.
  static Result<std::unique_ptr<VramExpertTier>> open(model::ExpertSource& host,
                                                      backend::Backend& be,
                                                      const format::ModelConfig& c,
                                                      uint64_t slot_bytes, int64_t slots,
                                                      strata::PolicyKind policy,
                                                      const strata::PolicyInputs& inputs);
  // Bytes one expert takes in a slot, from the checkpoint's expert tensors.
  static uint64_t slot_bytes_for(const format::Checkpoint& ckpt);

  Status fetch(int64_t layer, std::span<const int32_t> ids, model::ExpertWeights* out) override;
  void begin_layer(int64_t layer, int64_t first_position, const int32_t* ids, int64_t T,
                   int k) override;
  uint64_t bytes_fetched() const override { return stats_.hit_bytes + stats_.miss_bytes; }
  int64_t max_batch() const override { return bypass_; }
  const VramTierStats& stats() const { return stats_; }

 private:
  VramExpertTier(model::ExpertSource& host, backend::Backend& be) : host_(host), be_(be) {}
  void on_evicted(uint32_t key);
  // Copies the host views of one expert into `slot` and returns the device views.
  Result<model::ExpertWeights> copy_in(const model::ExpertWeights& host, int64_t slot);

  model::ExpertSource& host_;
  backend::Backend& be_;
  int64_t num_experts_ = 0, moe_layers_ = 1, bypass_ = 0;
  backend::BackendBuffer arena_;
  std::vector<int64_t> slot_of_key_;             // -1: not in a slot
  std::vector<model::ExpertWeights> slot_views_;  // device views of each slot's expert
  std::vector<int64_t> free_;                     // free policy slots
  std::unique_ptr<strata::CacheModel> policy_;
  uint64_t step_ = 0, requests_ = 0;
  VramTierStats stats_;
};

}  // namespace ktier::runtime
