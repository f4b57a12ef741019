#include "runtime/vram_expert_tier.h"

#include <algorithm>

#include "common/check.h"
#include "common/on_exception.h"
#include "model/weights.h"
#include "runtime/device_placement.h"

namespace ktier::runtime {

uint64_t VramExpertTier::slot_bytes_for(const format::Checkpoint& ckpt) {
  const format::ModelConfig& c = ckpt.config();
  const int64_t I = c.moe_intermediate_size, lat = c.routed_expert_hidden_size;
  const bool packed = ckpt.expert_storage() == format::ExpertStorage::kMxfp4;
  const cpu::WeightType t = packed ? cpu::WeightType::kMxfp4 : cpu::WeightType::kF32;
  // Float experts: at most 4 bytes an element (F32); BF16/F16 take less.
  const cpu::WeightMatrix w1{t, nullptr, nullptr, I, lat}, w2{t, nullptr, nullptr, lat, I};
  return 2 * DevicePlacer::bytes(w1) + DevicePlacer::bytes(w2);
}

int64_t VramExpertTier::minimum_slots(const format::ModelConfig& c, int lookahead) {
  const int64_t k = c.num_experts_per_token;
  const int64_t keys = std::max<int64_t>(1, c.num_moe_layers()) * c.num_experts;
  return std::min(keys + k, k * (2 + std::max(lookahead, 0)));
}

Result<std::unique_ptr<VramExpertTier>> VramExpertTier::open(
    model::ExpertSource& host, backend::Backend& be, const format::ModelConfig& c,
    uint64_t slot_bytes, int64_t slots, strata::PolicyKind policy,
    const strata::PolicyInputs& inputs) {
  const int64_t k = c.num_experts_per_token, min_slots = minimum_slots(c);
  if (slots < min_slots)
    return Status::budget("--vram: room for " + std::to_string(slots) + " experts; the VRAM " +
                          "tier needs at least " + std::to_string(min_slots) + " (" +
                          std::to_string(min_slots * slot_bytes) + " bytes): top_k for the " +
                          "policy and top_k for one fetch");
  std::unique_ptr<VramExpertTier> x(new VramExpertTier(host, be));
  x->num_experts_ = c.num_experts;
  x->moe_layers_ = std::max<int64_t>(1, c.num_moe_layers());
  x->first_moe_layer_ = c.first_k_dense_replace;
  x->bypass_ = k;
  x->stats_.slots = static_cast<uint64_t>(slots);
  x->stats_.policy_slots = static_cast<uint64_t>(slots - k);
  x->stats_.slot_bytes = slot_bytes;
  KTIER_ASSIGN_OR_RETURN(x->arena_, backend::BackendBuffer::allocate(
                                        be, static_cast<size_t>(slot_bytes * slots)));
  x->slot_views_.resize(static_cast<size_t>(slots));
  x->prefetched_.assign(static_cast<size_t>(slots), 0);
  x->slot_copy_.assign(static_cast<size_t>(slots), {});
  // Scanned at every reuse fence: a few per layer, so a list of a few thousand costs little.
  // One fence per entry, made once.
  const size_t max_reads = static_cast<size_t>(2 * slots + 64);
  x->read_fences_.reserve(max_reads);
  for (size_t i = 0; i < max_reads; ++i) {
    KTIER_ASSIGN_OR_RETURN(backend::Backend::Fence f, be.create_fence());
    x->read_fences_.push_back(f);
  }
  x->free_read_fences_ = x->read_fences_;
  x->slot_fence_.reserve(static_cast<size_t>(slots));
  for (int64_t s = 0; s < slots; ++s) {
    KTIER_ASSIGN_OR_RETURN(backend::Backend::Fence f, be.create_fence());
    x->slot_fence_.push_back(f);
  }
  // The host tier waits for copies still reading its memory before it overwrites it.
  host.set_reuse_fence(
      [p = x.get()](const void* begin, size_t bytes) { p->fence_host_range(begin, bytes); });
  host.set_held_above([p = x.get()](int64_t layer, int32_t id) { return p->holds(layer, id); });
  for (int64_t s = slots - k - 1; s >= 0; --s) x->free_.push_back(s);  // slot 0 first
  const uint32_t num_keys = static_cast<uint32_t>(c.num_hidden_layers * c.num_experts);
  x->slot_of_key_.assign(num_keys, -1);
  strata::PolicyInputs in = inputs;
  in.num_keys = num_keys;
  x->policy_ = strata::make_cache(policy, x->stats_.policy_slots, in);
  x->policy_->set_eviction_hook([p = x.get()](uint32_t key) { p->on_evicted(key); });
  return x;
}

VramExpertTier::~VramExpertTier() {
  host_.set_reuse_fence(nullptr);
  host_.set_held_above(nullptr);
  for (backend::Backend::Fence f : slot_fence_) be_.destroy_fence(f);
  for (backend::Backend::Fence f : read_fences_) be_.destroy_fence(f);
}

bool VramExpertTier::holds(int64_t layer, int32_t id) const {
  const uint32_t key = static_cast<uint32_t>(layer * num_experts_ + id);
  return slot_of_key_[key] >= 0 && policy_->contains(key);
}

void VramExpertTier::host_waits_for(Link l) {
  if (!copies_unsynced_[l]) return;  // nothing issued since the last wait reads host memory
  // A failed wait leaves the copies' state unknown: the next fetch reports it.
  if (Status s = be_.sync_copies(queue_of(l)); !s.is_ok() && deferred_.is_ok()) deferred_ = s;
  copies_unsynced_[l] = false;
  forget_reads([l](const HostRead& r) { return r.link == l; });
}

void VramExpertTier::fence_host_range(const void* begin, size_t bytes) {
  const auto lo = reinterpret_cast<uintptr_t>(begin), hi = lo + bytes;
  // Per link, the latest copy that reads the range: its own fence covers it and the link's
  // earlier copies (issue order), whose entries go too; later copies are not waited for.
  const HostRead* latest[kLinks] = {nullptr, nullptr};
  for (const HostRead& r : host_reads_)
    if (r.lo < hi && r.hi > lo && (!latest[r.link] || r.number > latest[r.link]->number))
      latest[r.link] = &r;
  uint64_t waited[kLinks] = {0, 0};
  for (int l = 0; l < kLinks; ++l) {
    if (!latest[l]) continue;
    if (Status s = be_.host_wait(latest[l]->fence); !s.is_ok()) {
      if (deferred_.is_ok()) deferred_ = s;  // the copies' state is unknown: fetch reports it
      return;
    }
    waited[l] = latest[l]->number;
  }
  if (waited[kAhead] || waited[kMisses])
    forget_reads([&](const HostRead& r) { return r.number <= waited[r.link]; });
}

template <class Pred>
void VramExpertTier::forget_reads(Pred done) {
  size_t kept = 0;
  for (const HostRead& r : host_reads_) {
    if (done(r)) {
      free_read_fences_.push_back(r.fence);
    } else {
      host_reads_[kept++] = r;
    }
  }
  host_reads_.resize(kept);
}

void VramExpertTier::begin_window() {
  for (uint8_t& p : prefetched_) p = p ? kCarried : 0;
}

void VramExpertTier::on_evicted(uint32_t key) {
  const int64_t slot = slot_of_key_[key];
  if (slot < 0) return;  // admitted but never copied in
  slot_of_key_[key] = -1;
  waste_copy(static_cast<size_t>(slot));
  free_.push_back(slot);
}

Status VramExpertTier::begin_copies(Link l) {
  if (copies_open_[l]) return Status::ok();
  copies_open_[l] = true;
  return be_.copies_after_ops(queue_of(l));
}

Status VramExpertTier::ops_need(std::span<const int64_t> slots) {
  // Each link's copies land in issue order: waiting for the latest one needed covers the rest.
  int64_t latest[kLinks] = {-1, -1};
  for (int64_t slot : slots) {
    const SlotCopy& c = slot_copy_[static_cast<size_t>(slot)];
    if (c.link < 0 || c.number <= ops_waited_[c.link]) continue;
    int64_t& l = latest[c.link];
    if (l < 0 || c.number > slot_copy_[static_cast<size_t>(l)].number) l = slot;
  }
  for (int l = 0; l < kLinks; ++l) {
    if (latest[l] < 0) continue;
    KTIER_RETURN_IF_ERROR(be_.ops_wait(slot_fence_[static_cast<size_t>(latest[l])]));
    ops_waited_[l] = slot_copy_[static_cast<size_t>(latest[l])].number;
  }
  return Status::ok();
}

bool VramExpertTier::prefetch_one(const Prediction& p) {
  if (slot_of_key_[p.key] >= 0) {  // in VRAM already (or copied by this call): kept until used
    policy_->protect(p.key, p.pin_until);
    return true;
  }
  model::ExpertWeights host;
  if (!host_.peek(p.target, p.id, &host)) return false;  // not in RAM yet
  const double clock = static_cast<double>(step_) / static_cast<double>(moe_layers_);
  if (!policy_->prefetch(p.key, p.pin_until, clock) || free_.empty()) return true;
  const int64_t slot = free_.back();
  free_.pop_back();
  Status s = begin_copies(kAhead);
  auto dev = s.is_ok() ? copy_in(host, slot, kAhead) : Result<model::ExpertWeights>(s);
  if (!dev.is_ok()) {  // reported by the next fetch; the slot holds nothing in use
    deferred_ = dev.status();
    free_.push_back(slot);
    return true;
  }
  slot_of_key_[p.key] = slot;
  slot_views_[static_cast<size_t>(slot)] = *dev;
  prefetched_[static_cast<size_t>(slot)] = kFresh;
  prefetched_for_.issued(p.key, p.target);
  ++stats_.prefetch_issued;
  stats_.prefetch_bytes += model::expert_bytes(*dev);
  return true;
}

void VramExpertTier::retry_waiting(int64_t done_through) {
  copies_open_[kAhead] = false;
  size_t kept = 0;
  for (const Prediction& p : waiting_) {
    if (p.target <= done_through || !deferred_.is_ok()) continue;
    if (!prefetch_one(p)) waiting_[kept++] = p;
  }
  waiting_.resize(kept);
}

void VramExpertTier::on_prediction(int64_t layer, int depth, int64_t first_position,
                                   const int32_t* ids, const float* weights, int64_t T, int k) {
  (void)first_position, (void)weights;  // ids arrive highest weight first per token
  if (!deferred_.is_ok()) return;
  if (depth == 1) retry_waiting(layer - 1);  // earlier predictions whose RAM reads have landed
  const int64_t target = layer + depth;
  const uint64_t pin_until =
      strata::prediction_pin_until(step_, T, layer, target, first_moe_layer_);
  copies_open_[kAhead] = false;
  // Predictions it holds are pinned first, so that admitting another one cannot evict them (the
  // host skips those it holds: set_held_above).
  for (int64_t i = 0; i < T * k; ++i) {
    const uint32_t key = static_cast<uint32_t>(target * num_experts_ + ids[i]);
    if (slot_of_key_[key] >= 0) policy_->protect(key, pin_until);
  }
  for (int64_t i = 0; i < T * k && deferred_.is_ok(); ++i) {
    const Prediction p{static_cast<uint32_t>(target * num_experts_ + ids[i]), target, ids[i],
                       pin_until};
    if (!prefetch_one(p)) waiting_.push_back(p);
  }
}

void VramExpertTier::begin_pass() {
  // Only a pass that ended early leaves any: its copies' layers never came, so they are wasted
  // (a later pass's use of one is a plain hit), as the RAM tier counts its own.
  waiting_.clear();
  prefetched_for_.abandon(*policy_);
  for (size_t slot = 0; slot < prefetched_.size(); ++slot) waste_copy(slot);
  host_.begin_pass();
}

void VramExpertTier::begin_layer(int64_t layer, int64_t first_position, const int32_t* ids,
                                 int64_t T, int k) {
  strata::access_routing(*policy_, layer, num_experts_, ids, T, k, moe_layers_, step_, requests_);
  prefetched_for_.settle(*policy_, layer, num_experts_, ids, T * k);
  settle_copies(layer, ids, T * k);
  host_.begin_layer(layer, first_position, ids, T, k);  // the RAM tier's policy and prefetch
  if (deferred_.is_ok()) retry_waiting(layer);  // this layer's own misses are fetch()'s
}

void VramExpertTier::settle_copies(int64_t layer, const int32_t* ids, int64_t n) {
  asked_.assign(num_experts_, ids, n);
  for (int64_t e = 0; e < num_experts_; ++e) {
    const int64_t slot = slot_of_key_[static_cast<size_t>(layer * num_experts_ + e)];
    if (slot >= 0 && !asked_.contains(e)) waste_copy(static_cast<size_t>(slot));
  }
}

void VramExpertTier::waste_copy(size_t slot) {
  if (const uint8_t was = prefetched_[slot]) {
    prefetched_[slot] = 0;
    ++stats_.prefetch_wasted;
    stats_.carried_wasted += was == kCarried;
  }
}

Result<model::ExpertWeights> VramExpertTier::copy_in(const model::ExpertWeights& host,
                                                     int64_t slot, Link l) {
  const size_t si = static_cast<size_t>(slot);
  const backend::Backend::Fence fence = slot_fence_[si];
  SlotCopy& last = slot_copy_[si];
  // A copy of the other link into this slot (an evicted prefetch, say) may not have landed:
  // this one must land after it.
  if (last.link >= 0 && last.link != l) KTIER_RETURN_IF_ERROR(be_.copies_wait(fence, queue_of(l)));
  DevicePlacer placer(be_, arena_.as<uint8_t>() + static_cast<uint64_t>(slot) * stats_.slot_bytes,
                      stats_.slot_bytes, queue_of(l));
  model::ExpertWeights dev = host;
  if (free_read_fences_.empty()) {  // rare: the host waits once for all
    host_waits_for(kAhead);
    host_waits_for(kMisses);
    KTIER_RETURN_IF_ERROR(deferred_);
  }
  copies_unsynced_[l] = true;  // from here until a wait, the copies may read the host's memory
  KTIER_CHECK(!free_read_fences_.empty());  // every entry's fence came back with the waits
  HostRead read{UINTPTR_MAX, 0, static_cast<int8_t>(l), issued_[l] + 1, free_read_fences_.back()};
  free_read_fences_.pop_back();
  for (const cpu::WeightMatrix* m : {&host.w1, &host.w2, &host.w3}) {
    const auto data = reinterpret_cast<uintptr_t>(m->data);
    read.lo = std::min(read.lo, data);
    read.hi = std::max(read.hi, data + backend::weight_data_bytes(*m));
    if (const uint64_t scales = backend::weight_scale_bytes(*m); scales > 0) {
      const auto s = reinterpret_cast<uintptr_t>(m->scales);
      read.lo = std::min(read.lo, s);
      read.hi = std::max(read.hi, s + scales);
    }
  }
  host_reads_.push_back(read);
  Status placed = Status::ok();
  for (cpu::WeightMatrix* m : {&dev.w1, &dev.w2, &dev.w3})
    if (placed = placer.place(*m); !placed.is_ok()) break;
  // Marked after a failed copy too: the slot is reused, and its next writer must come after
  // whatever this one issued. A failed mark leaves that unknown: the tier stops (deferred_).
  Status marked = be_.mark_copies(fence, queue_of(l));
  if (marked.is_ok()) marked = be_.mark_copies(read.fence, queue_of(l));
  if (!marked.is_ok()) {
    if (deferred_.is_ok()) deferred_ = marked;
    return marked;
  }
  last = {static_cast<int8_t>(l), ++issued_[l]};
  KTIER_RETURN_IF_ERROR(placed);
  stats_.copied_bytes += model::expert_bytes(dev);
  return dev;
}

Status VramExpertTier::fetch(int64_t layer, std::span<const int32_t> ids,
                             model::ExpertWeights* out) {
  KTIER_RETURN_IF_ERROR(deferred_);
  // Misses go to a policy slot when the policy holds the key, else to a bypass slot (the
  // last top_k slots), in the order asked.
  const int64_t first_bypass = static_cast<int64_t>(stats_.policy_slots);
  std::vector<int32_t> miss_ids;
  std::vector<size_t> miss_at;
  std::vector<int64_t> miss_slot, used_slots;
  // A lookahead copy is timely when it has landed as its layer's fetch starts (the host has
  // waited for the router's ids, so the ops stream is idle up to the experts' ops); one that
  // has not makes them wait. Asked first: the misses below may make the host wait for copies
  // (the RAM tier's reuse fence), and a failed query then leaves nothing half done.
  std::vector<uint8_t> landed(ids.size(), 0);  // per id: a lookahead copy that has landed
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t slot = slot_of_key_[static_cast<size_t>(layer * num_experts_ + ids[i])];
    if (slot < 0 || !prefetched_[static_cast<size_t>(slot)]) continue;
    KTIER_ASSIGN_OR_RETURN(const bool passed,
                           be_.fence_passed(slot_fence_[static_cast<size_t>(slot)]));
    landed[i] = passed;
  }
  // No half-copied slot may be served later, whether this fetch fails or an exception leaves it
  // (std::bad_alloc: serve answers that request and goes on with this tier): every slot it
  // assigned is forgotten.
  miss_ids.reserve(ids.size());  // each miss recorded without an allocation that may throw
  miss_at.reserve(ids.size());
  miss_slot.reserve(ids.size());
  const auto forget_assigned = [&] {
    for (size_t j = 0; j < miss_ids.size(); ++j) {
      const uint32_t key = static_cast<uint32_t>(layer * num_experts_ + miss_ids[j]);
      if (slot_of_key_[key] == miss_slot[j]) {
        slot_of_key_[key] = -1;
        free_.push_back(miss_slot[j]);
      }
    }
  };
  const OnException on_unwind(forget_assigned);
  int64_t next_bypass = first_bypass;
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t key = static_cast<uint32_t>(layer * num_experts_ + ids[i]);
    ++stats_.requests;
    const int64_t slot = slot_of_key_[key];
    if (slot >= 0) {
      ++stats_.hits;
      if (const uint8_t was = prefetched_[static_cast<size_t>(slot)]) {
        prefetched_[static_cast<size_t>(slot)] = 0;
        ++stats_.prefetch_useful;
        stats_.carried_useful += was == kCarried;
        if (landed[i]) {
          ++stats_.prefetch_timely;
          stats_.carried_timely += was == kCarried;
        }
      }
      out[i] = slot_views_[static_cast<size_t>(slot)];
      stats_.hit_bytes += model::expert_bytes(out[i]);
      used_slots.push_back(slot);
      continue;
    }
    const bool kept = policy_->contains(key) && !free_.empty();
    KTIER_CHECK(kept || next_bypass < first_bypass + bypass_);  // max_batch() bounds a fetch
    const int64_t target = kept ? free_.back() : next_bypass++;
    if (kept) free_.pop_back();
    miss_at.push_back(i);
    miss_ids.push_back(ids[i]);
    miss_slot.push_back(target);
    if (kept) slot_of_key_[key] = target;
  }
  // From the host tier in batches it can hold at once. The host's fetch views last until its
  // next fetch: the copies that read the previous ones finish first. (Lookahead copies read
  // peek() views, which the host fences itself before reusing.)
  const size_t batch = static_cast<size_t>(std::max<int64_t>(1, host_.max_batch()));
  std::vector<model::ExpertWeights> views(std::min(batch, miss_ids.size()));
  for (size_t b0 = 0; b0 < miss_ids.size(); b0 += batch) {
    const size_t b1 = std::min(miss_ids.size(), b0 + batch);
    host_waits_for(kMisses);
    copies_open_[kMisses] = false;
    // A failed wait: this fetch's slots are forgotten below, as after a failed copy (defensive:
    // deferred_ stays set, and every later fetch returns it before serving anything).
    Status s = deferred_;
    if (s.is_ok())
      s = host_.fetch(layer, std::span<const int32_t>(miss_ids.data() + b0, b1 - b0),
                      views.data());
    if (s.is_ok()) s = begin_copies(kMisses);
    for (size_t j = b0; s.is_ok() && j < b1; ++j) {
      auto dev = copy_in(views[j - b0], miss_slot[j], kMisses);
      if (!dev.is_ok()) {
        s = dev.status();
        break;
      }
      slot_views_[static_cast<size_t>(miss_slot[j])] = *dev;
      prefetched_[static_cast<size_t>(miss_slot[j])] = 0;
      out[miss_at[j]] = *dev;
      stats_.miss_bytes += model::expert_bytes(*dev);
    }
    if (!s.is_ok()) {
      forget_assigned();
      return s;
    }
  }
  // The ops that use these experts wait for their slots' copies, not for lookahead copies
  // issued for later layers.
  used_slots.insert(used_slots.end(), miss_slot.begin(), miss_slot.end());
  return ops_need(used_slots);
}

}  // namespace ktier::runtime
