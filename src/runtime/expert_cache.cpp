#include "runtime/expert_cache.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <unordered_map>

#include <spdlog/spdlog.h>

#include "common/check.h"
#include "common/on_exception.h"
#include "common/progress.h"
#include "model/weights.h"

namespace ktier::runtime {

namespace {

constexpr uint64_t kPage = 4096;

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// Where each part of an expert goes in its slot: a contiguous expert keeps its file layout
// (one read); otherwise each part starts on a fresh page, congruent to its file offset modulo
// the page, or page-aligned when the offset does not suit the element type (then the I/O layer
// bounces the read).
struct Placement {
  std::array<uint64_t, 6> offset{};
  uint64_t end = 0;
};
Placement place(const format::ExpertLocation& loc) {
  Placement p;
  if (loc.contiguous) {
    const uint64_t base = loc.file_offset % kPage;
    for (uint32_t i = 0; i < loc.num_parts; ++i)
      p.offset[i] = base + (loc.parts[i].file_offset - loc.file_offset);
    p.end = base + loc.nbytes;
    return p;
  }
  uint64_t cursor = 0;
  for (uint32_t i = 0; i < loc.num_parts; ++i) {
    const uint64_t off = loc.parts[i].file_offset;
    const size_t elem = dtype_traits(loc.parts[i].dtype).size;
    const uint64_t start = (cursor + kPage - 1) / kPage * kPage;
    p.offset[i] = off % elem == 0 ? start + off % kPage : start;
    cursor = p.offset[i] + loc.parts[i].nbytes;
  }
  p.end = cursor;
  return p;
}

// Reads sorted by (shard, offset): the disk order a batch is submitted in.
bool by_disk_order(const io::ReadRequest& a, const io::ReadRequest& b) {
  return a.file->id() != b.file->id() ? a.file->id() < b.file->id() : a.offset < b.offset;
}

}  // namespace

uint64_t ExpertCache::slot_bytes(const format::Checkpoint& ckpt) {
  const format::ModelConfig& c = ckpt.config();
  uint64_t most = 0;
  for (int64_t l = c.first_k_dense_replace; l < c.num_hidden_layers; ++l)
    for (int64_t e = 0; e < c.num_experts; ++e)
      most = std::max(most, place(ckpt.expert(l, e)).end);
  return (most + kPage - 1) / kPage * kPage;
}

ExpertCache::~ExpertCache() {  // the queues wait for reads into the slots
  prefetch_cq_.reset();
  demand_cq_.reset();
  for (uint8_t* piece : registered_) engine_.unregister_buffer(piece);
}

Result<std::unique_ptr<ExpertCache>> ExpertCache::open(const format::Checkpoint& ckpt,
                                                       io::IoEngine& engine,
                                                       const std::vector<io::ReadFile>& files,
                                                       ExpertCacheOptions opts) {
  KTIER_CHECK(opts.policy_slots >= 0 && opts.batch_slots >= 1 && opts.prefetch_in_flight >= 1);
  KTIER_CHECK(opts.policy != strata::PolicyKind::kBelady);
  KTIER_CHECK(opts.policy != strata::PolicyKind::kStatic || !opts.static_ranking.empty());
  KTIER_CHECK(ckpt.expert_storage() != format::ExpertStorage::kNone);
  const format::ModelConfig& c = ckpt.config();
  std::unique_ptr<ExpertCache> x(new ExpertCache(ckpt, engine, files));
  x->demand_cq_ = std::make_unique<io::CompletionQueue>(engine);
  x->prefetch_cq_ = std::make_unique<io::CompletionQueue>(engine, io::ReadPriority::kReadAhead);
  const int64_t slots = opts.policy_slots + opts.batch_slots;
  x->stats_.slots = slots;
  x->stats_.policy_slots = opts.policy_slots;
  x->stats_.batch_slots = opts.batch_slots;
  // A fetch's bypasses (at most batch_slots) are recorded without an allocation, which could
  // throw with a slot keyed but not yet listed for release.
  x->bypass_.reserve(static_cast<size_t>(opts.batch_slots));
  x->stats_.slot_bytes = slot_bytes(ckpt);
  // The slots' bytes, and no more, are touched, registered and reported: huge pages round the
  // allocation up to 2 MiB, which only a large tier (K3's: GBs) may take as a hint; a small
  // one near the budget's minimum would pass the budget by up to that much.
  const size_t size = static_cast<size_t>(slots) * x->stats_.slot_bytes;
  const io::HugePages huge =
      size >= 64 * io::kHugePageBytes ? io::HugePages::kYes : io::HugePages::kNo;
  KTIER_ASSIGN_OR_RETURN(x->arena_,
                         io::AlignedBuffer::allocate(size, io::kDefaultAlignment, huge));
  x->stats_.bytes_allocated = size;
  // Fault the arena in now: otherwise every first read into a slot pays for page allocation and
  // zeroing inside decode (measured: a tier larger than the working set ran 3x slower per token
  // on the development VM until every slot had been used once).
  // A K3 tier of a few hundred GB takes a while: in steps of 256 MiB, one per pool thread at a
  // time (page faults and zeroing scale with cores), with progress on stderr at the info level.
  ProgressMeter meter("expert RAM tier", size, spdlog::should_log(spdlog::level::info));
  constexpr size_t kFaultStep = size_t{256} << 20;
  const int64_t steps = static_cast<int64_t>((size + kFaultStep - 1) / kFaultStep);
  const int64_t threads = opts.pool ? opts.pool->size() : 1;
  const auto fault = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const size_t at = static_cast<size_t>(i) * kFaultStep;
      std::memset(x->arena_.data() + at, 0, std::min(kFaultStep, size - at));
    }
  };
  for (int64_t s0 = 0; s0 < steps; s0 += threads) {
    const int64_t s1 = std::min(steps, s0 + threads);
    if (opts.pool)
      opts.pool->parallel_for(s1 - s0, 1, [&](int64_t b, int64_t e) { fault(s0 + b, s0 + e); });
    else
      fault(s0, s1);
    meter.update(std::min(size, static_cast<size_t>(s1) * kFaultStep));
  }
  meter.finish_if_shown(size);
  // Fixed buffers spare io_uring the per-read page pinning. Registering pins every page once
  // (measured ~2 GB/s on the development VM, huge pages or not: minutes for a K3 tier), so it
  // goes in pieces with progress; a piece the engine refuses (RLIMIT_MEMLOCK, its table) ends
  // it there: the pieces before stay registered, the rest is read unregistered.
  constexpr size_t kRegisterStep = size_t{4} << 30;
  ProgressMeter registering("expert RAM tier registered for io_uring", size,
                            spdlog::should_log(spdlog::level::info));
  size_t registered = 0;
  for (; registered < size; registered += kRegisterStep) {
    const size_t piece = std::min(kRegisterStep, size - registered);
    if (const Status reg = engine.register_buffer(x->arena_.data() + registered, piece);
        !reg.is_ok()) {
      spdlog::info("expert tier: {:.1f} of {:.1f} GiB registered for io_uring; the rest is read "
                   "unregistered (pinned per read): {}", registered / 1073741824.0,
                   size / 1073741824.0, reg.message());
      break;
    }
    x->registered_.push_back(x->arena_.data() + registered);
    registering.update(registered + piece);
  }
  registering.finish_if_shown(std::min(registered, size));
  x->slots_.resize(static_cast<size_t>(slots));
  for (size_t i = 0; i < x->slots_.size(); ++i) {
    x->slots_[i].base = x->arena_.data() + i * x->stats_.slot_bytes;
    x->free_.push_back(x->slots_.size() - 1 - i);  // pop_back hands out slot 0 first
  }
  const uint32_t num_keys = static_cast<uint32_t>(c.num_hidden_layers * c.num_experts);
  x->slot_of_key_.assign(num_keys, -1);
  x->queued_.assign(num_keys, 0);
  strata::PolicyInputs in;
  in.num_keys = num_keys;
  in.temperature = opts.temperature;
  if (!opts.temperature_seed.empty()) {
    KTIER_CHECK(opts.temperature_seed.size() == num_keys);
    in.temperature_seed = &opts.temperature_seed;
  }
  in.static_ranking = &opts.static_ranking;
  x->policy_ = strata::make_cache(opts.policy, static_cast<uint64_t>(opts.policy_slots), in);
  x->policy_->set_eviction_hook([p = x.get()](uint32_t key) { p->on_evicted(key); });
  x->policy_kind_ = opts.policy;
  x->prefetch_in_flight_ = opts.prefetch_in_flight;
  x->moe_layers_ = std::max<int64_t>(1, c.num_moe_layers());
  return x;
}

uint64_t ExpertCache::expert_bytes(uint32_t key) const {
  const int64_t Ne = ckpt_.config().num_experts;
  return ckpt_.expert(key / Ne, static_cast<int64_t>(key % Ne)).nbytes;
}

model::ExpertWeights ExpertCache::view(const Slot& s, int64_t layer, int32_t e) const {
  const format::ModelConfig& c = ckpt_.config();
  const int64_t I = c.moe_intermediate_size, lat = c.routed_expert_hidden_size;
  const uint8_t* base = s.base;
  model::ExpertWeights w;
  const int64_t shapes[3][2] = {{I, lat}, {lat, I}, {I, lat}};  // w1, w2, w3
  cpu::WeightMatrix* m[3] = {&w.w1, &w.w2, &w.w3};
  const bool packed = ckpt_.expert_storage() == format::ExpertStorage::kMxfp4;
  for (int i = 0; i < 3; ++i) {
    m[i]->rows = shapes[i][0];
    m[i]->cols = shapes[i][1];
    if (packed) {
      m[i]->type = cpu::WeightType::kMxfp4;
      m[i]->data = base + s.part_offset[2 * i];
      m[i]->scales = base + s.part_offset[2 * i + 1];
    } else {
      m[i]->type = model::weight_type_of(
          ckpt_.expert(layer, e).parts[static_cast<size_t>(i)].dtype);
      m[i]->data = base + s.part_offset[i];
    }
  }
  return w;
}

void ExpertCache::plan_reads(uint32_t key, size_t si, std::vector<io::ReadRequest>& out) {
  const int64_t Ne = ckpt_.config().num_experts;
  const format::ExpertLocation& loc = ckpt_.expert(key / Ne, static_cast<int64_t>(key % Ne));
  Slot& s = slots_[si];
  const Placement p = place(loc);
  s.part_offset = p.offset;
  if (loc.contiguous) {
    out.push_back({&files_[loc.shard], loc.file_offset, loc.nbytes, s.base + p.offset[0], si});
    return;
  }
  for (uint32_t k = 0; k < loc.num_parts; ++k)
    out.push_back({&files_[loc.parts[k].shard], loc.parts[k].file_offset, loc.parts[k].nbytes,
                   s.base + p.offset[k], si});
}

uint32_t ExpertCache::chunks_of(uint32_t key) const {
  const int64_t Ne = ckpt_.config().num_experts;
  const format::ExpertLocation& loc = ckpt_.expert(key / Ne, static_cast<int64_t>(key % Ne));
  uint64_t n = 0;
  if (loc.contiguous) {
    n = io::chunk_reads(engine_.options(), loc.nbytes);
  } else {
    for (uint32_t k = 0; k < loc.num_parts; ++k)
      n += io::chunk_reads(engine_.options(), loc.parts[k].nbytes);
  }
  return static_cast<uint32_t>(std::min<uint64_t>(n, UINT32_MAX));
}

void ExpertCache::on_evicted(uint32_t key) {
  const int32_t si = slot_of_key_[key];
  if (si < 0) return;  // admitted and dropped before it was ever fetched
  Slot& s = slots_[static_cast<size_t>(si)];
  slot_of_key_[key] = -1;
  s.key = -1;
  if (s.prefetched_unused) {
    s.prefetched_unused = false;
    count_wasted(s, expert_bytes(key));
  }
  if (s.state == SlotState::kReady) s.state = SlotState::kFree;  // kLoading: freed on completion
  free_.push_back(static_cast<size_t>(si));
}

void ExpertCache::release_bypass() {
  for (size_t si : bypass_) {
    Slot& s = slots_[si];
    if (s.key >= 0) slot_of_key_[static_cast<size_t>(s.key)] = -1;
    s.key = -1;
    s.state = SlotState::kFree;
    free_.push_back(si);
  }
  bypass_.clear();
}

void ExpertCache::reap_prefetches(bool block) {
  std::vector<io::Completion> done;
  const uint64_t t0 = block ? now_ns() : 0;
  prefetch_cq_->wait(block ? 1 : 0, done);
  if (block) stats_.io_wait_ns += now_ns() - t0;
  for (const io::Completion& c : done) {
    Slot& s = slots_[c.tag];
    KTIER_CHECK(s.state == SlotState::kLoading && s.reads_outstanding > 0);
    if (!c.status.is_ok()) s.read_failed = true;  // re-read on demand (a retry, then the error)
    if (--s.reads_outstanding == 0) {
      s.state = s.key >= 0 ? SlotState::kReady : SlotState::kFree;
      prefetch_chunks_outstanding_ -= s.prefetch_chunks;
      s.prefetch_chunks = 0;
    }
  }
}

void ExpertCache::settle_prefetch(Slot& s, int64_t layer, bool arrived_in_time) {
  s.prefetched_unused = false;
  if (s.prefetch_layer == layer && s.prefetch_pass == pass_ && !s.read_failed) {
    ++stats_.prefetch_useful;
    stats_.prefetch_timely += arrived_in_time;
    if (s.prefetch_carried) {
      ++stats_.carried_useful;
      stats_.carried_timely += arrived_in_time;
    }
  } else {
    count_wasted(s, expert_bytes(static_cast<uint32_t>(s.key)));
  }
}

void ExpertCache::count_wasted(const Slot& s, uint64_t bytes) {
  ++stats_.prefetch_wasted;
  stats_.prefetch_wasted_bytes += bytes;
  if (s.prefetch_carried) {
    ++stats_.carried_wasted;
    stats_.carried_wasted_bytes += bytes;
  }
}

void ExpertCache::begin_window() {
  for (Slot& s : slots_) s.prefetch_carried = s.prefetched_unused;
}

void ExpertCache::begin_pass() {
  ++pass_;
  // Left by a pass that ended early (a failed read, under serve): its queued predictions would
  // be read for this pass's layers, with their pins expired. A complete pass leaves neither
  // (its last layer settles them).
  cancel_pending(INT64_MAX);
  prefetched_for_.abandon(*policy_);
}

size_t ExpertCache::take_free_slot() {
  // Invariant: slots with a key are the policy's residents (<= policy_slots) and this fetch's
  // bypasses (< batch_slots), so free_ is never empty here; its entries may still be loading
  // (an evicted prefetch), and then a submitted read will free one.
  KTIER_CHECK(!free_.empty());
  for (;;) {
    for (size_t i = free_.size(); i-- > 0;) {
      const size_t si = free_[i];
      if (slots_[si].state != SlotState::kFree) continue;
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
      slots_[si].read_failed = false;
      // A device copy may still read the old contents.
      if (reuse_fence_) reuse_fence_(slots_[si].base, stats_.slot_bytes);
      return si;
    }
    KTIER_CHECK(prefetch_cq_->outstanding() > 0);  // every loading slot has reads submitted
    reap_prefetches(/*block=*/true);  // every free slot is an evicted prefetch still being read
  }
}

void ExpertCache::cancel_pending(int64_t through_layer) {
  // pending_ is sorted by target layer and holds a key once (on_prediction).
  while (!pending_.empty() && pending_.front().target_layer <= through_layer) {
    pop_pending();
    ++stats_.prefetch_cancelled;
  }
}

ExpertCache::PendingPrefetch ExpertCache::pop_pending() {
  const PendingPrefetch p = pending_.front();
  pending_.pop_front();
  queued_[p.key] = 0;
  return p;
}

void ExpertCache::begin_layer(int64_t layer, int64_t first_position, const int32_t* ids,
                              int64_t T, int k) {
  release_bypass();
  cancel_pending(layer);  // predictions for it or an earlier layer, never issued: stale now
  stats_.policy_hits += strata::access_routing(*policy_, layer, ckpt_.config().num_experts, ids,
                                               T, k, moe_layers_, step_, requests_);
  prefetched_for_.settle(*policy_, layer, ckpt_.config().num_experts, ids, T * k);
  stats_.policy_requests += static_cast<uint64_t>(T * k);
  // A prefetch that has landed is useful once its layer asks for it, whether fetch() then takes
  // it from here or a faster tier serves the copy it made from here (GPU mode; that tier never
  // asks this one). A prefetch still loading is left to fetch(), which waits for it (late).
  const int64_t Ne = ckpt_.config().num_experts;
  for (int64_t i = 0; i < T * k; ++i) {
    const int32_t si = slot_of_key_[static_cast<size_t>(layer * Ne + ids[i])];
    if (si < 0) continue;
    Slot& s = slots_[static_cast<size_t>(si)];
    if (s.prefetched_unused && s.state == SlotState::kReady) settle_prefetch(s, layer, true);
  }
  // A prefetch of this layer's that its routing did not ask for is wasted now, as the VRAM tier
  // counts its copies: left to an eviction or a later use, a wrong prediction in a tier that
  // seldom evicts would never be counted and the report's precision would read high. Its read
  // goes on if still loading (the policy keeps it as a resident).
  asked_.assign(Ne, ids, T * k);
  for (int64_t e = 0; e < Ne; ++e) {
    if (asked_.contains(e)) continue;
    const int32_t si = slot_of_key_[static_cast<size_t>(layer * Ne + e)];
    if (si < 0) continue;
    Slot& s = slots_[static_cast<size_t>(si)];
    if (!s.prefetched_unused) continue;
    s.prefetched_unused = false;
    count_wasted(s, expert_bytes(static_cast<uint32_t>(s.key)));
  }
  (void)first_position;
  pump_prefetches();  // predictions queued behind the in-flight cap
}

void ExpertCache::on_prediction(int64_t layer, int depth, int64_t first_position,
                                const int32_t* ids, const float* weights, int64_t T, int k) {
  (void)first_position;
  release_bypass();
  const int64_t Ne = ckpt_.config().num_experts;
  const int64_t target = layer + depth;
  const uint64_t pin_until = strata::prediction_pin_until(step_, T, layer, target,
                                                          ckpt_.config().first_k_dense_replace);
  std::vector<PendingPrefetch> add;
  std::unordered_map<uint32_t, size_t> added;  // key -> its entry in `add`
  for (int64_t t = 0; t < T; ++t)
    for (int i = 0; i < k; ++i) {
      const auto key = static_cast<uint32_t>(target * Ne + ids[t * k + i]);
      // A predicted expert the tier holds (or is reading) is protected now, not when the queue
      // reaches it behind the in-flight cap: until then a prefetch or a miss could evict it.
      if (slot_of_key_[key] >= 0) {
        policy_->protect(key, pin_until);
        continue;
      }
      // A key is queued once (predicted by several tokens of a chunk, or at two depths or by
      // the refresh): at its highest weight in this call, at its first call's across calls.
      if (queued_[key]) continue;
      const float weight = weights[t * k + i];
      const auto [at, fresh] = added.try_emplace(key, add.size());
      if (fresh)
        add.push_back({target, weight, key, pin_until});
      else
        add[at->second].weight = std::max(add[at->second].weight, weight);
    }
  // Nearest layer first, then highest weight.
  pending_.insert(pending_.end(), add.begin(), add.end());
  for (const PendingPrefetch& p : add) queued_[p.key] = 1;
  std::stable_sort(pending_.begin(), pending_.end(),
                   [](const PendingPrefetch& a, const PendingPrefetch& b) {
                     return a.target_layer != b.target_layer ? a.target_layer < b.target_layer
                                                             : a.weight > b.weight;
                   });
  pump_prefetches();
}

void ExpertCache::pump_prefetches() {
  reap_prefetches(/*block=*/false);
  std::vector<io::ReadRequest> reads;
  while (!pending_.empty() && prefetch_chunks_outstanding_ < prefetch_in_flight_) {
    const PendingPrefetch p = pending_.front();
    if (slot_of_key_[p.key] >= 0) {  // held or being read already: kept until its layer
      pop_pending();
      policy_->protect(p.key, p.pin_until_step);
      continue;
    }
    const int64_t Ne = ckpt_.config().num_experts;
    if (held_above_ && held_above_(p.key / Ne, static_cast<int32_t>(p.key % Ne))) {
      pop_pending();
      continue;  // the faster tier serves it: reading it here too would be wasted
    }
    // Within the budget, or alone: an expert larger than the budget still goes, by itself.
    const uint32_t need = chunks_of(p.key);
    if (prefetch_chunks_outstanding_ > 0 &&
        prefetch_chunks_outstanding_ + need > prefetch_in_flight_)
      break;
    pop_pending();
    const double clock = static_cast<double>(step_) / static_cast<double>(moe_layers_);
    // A resident without a slot (GPU mode: the policy saw the routing of an expert the VRAM
    // tier served, so only its name was admitted) is read into a slot as well: the policy
    // already counts it, so the slot invariant holds, and its prediction is not lost.
    if (policy_->contains(p.key)) {
      policy_->protect(p.key, p.pin_until_step);
    } else if (!policy_->prefetch(p.key, p.pin_until_step, clock)) {
      continue;
    }
    KTIER_CHECK(policy_->contains(p.key));  // the slot invariant counts it as a resident
    prefetched_for_.issued(p.key, p.target_layer);
    const size_t si = take_free_slot();
    Slot& s = slots_[si];
    s.key = p.key;
    s.prefetched_unused = false;  // a prefetch once its reads are queued (below)
    s.prefetch_carried = false;
    s.prefetch_layer = p.target_layer;
    s.prefetch_pass = pass_;
    // Until its reads are queued it is a failed prefetch (read on demand, which reports any
    // error), so that an exception below (std::bad_alloc) leaves no keyed slot served as held.
    s.state = SlotState::kReady;
    s.read_failed = true;
    slot_of_key_[p.key] = static_cast<int32_t>(si);
    reads.clear();
    plan_reads(p.key, si, reads);
    // Submitted at once (in priority order), so a loading slot always has reads outstanding.
    if (prefetch_cq_->submit(reads).is_ok()) {
      s.state = SlotState::kLoading;
      s.read_failed = false;
      s.reads_outstanding = static_cast<uint32_t>(reads.size());
      s.prefetch_chunks = need;
      prefetch_chunks_outstanding_ += need;
      s.prefetched_unused = true;
      ++stats_.prefetch_issued;
      stats_.prefetch_bytes += expert_bytes(p.key);
      stats_.read_bytes += expert_bytes(p.key);
    }  // else nothing was queued, nothing read: no prefetch, read on demand
  }
}

bool ExpertCache::peek(int64_t layer, int32_t id, model::ExpertWeights* out) {
  const uint32_t key = static_cast<uint32_t>(layer * ckpt_.config().num_experts + id);
  const int32_t si = slot_of_key_[key];
  if (si < 0) return false;
  const Slot& s = slots_[static_cast<size_t>(si)];
  if (s.state != SlotState::kReady || s.read_failed) return false;
  *out = view(s, layer, id);
  return true;
}

Status ExpertCache::fetch(int64_t layer, std::span<const int32_t> ids, model::ExpertWeights* out) {
  // Every view must stay valid until the next fetch: no place of the call may be given again.
  KTIER_CHECK(static_cast<int64_t>(ids.size()) <= stats_.batch_slots);
  return fetch_each(layer, ids, out, [](std::span<const size_t>) { return Status::ok(); });
}

Status ExpertCache::fetch_each(int64_t layer, std::span<const int32_t> ids,
                               model::ExpertWeights* out, const ReadyFn& ready) {
  release_bypass();
  reap_prefetches(/*block=*/false);
  const int64_t Ne = ckpt_.config().num_experts;
  std::vector<io::ReadRequest> reads;
  std::vector<size_t> slot_of(ids.size()), in_memory, loading;
  std::deque<size_t> waiting;  // misses without a slot yet, in the order asked
  struct Miss {
    size_t slot, index;
    uint32_t reads_left;
    bool windowed;  // holds one of the window's places (a slot taken for this call)
  };
  std::vector<Miss> misses;
  // An exception out of `ready` (std::bad_alloc in a kernel's buffer: serve answers that
  // request and goes on with this tier) must leave no read in flight into a slot a later fetch
  // may hand out or reuse: the misses still reading are marked for re-reading, and their reads
  // drained.
  const OnException unwind([&] {
    for (const Miss& m : misses)
      if (m.reads_left > 0) slots_[m.slot].read_failed = true;
    demand_cq_->discard_all();
  });
  misses.reserve(ids.size());  // each id is planned at most once
  // Misses given a slot by this call and not yet released: at most batch_slots, so that the
  // bypasses among them always find a free slot (take_free_slot's invariant). A miss handed over
  // is released (a bypass slot freed) only when a waiting miss needs its place, so a call of at
  // most batch_slots ids — every fetch() — keeps all its views until the next fetch.
  const size_t window_max = static_cast<size_t>(stats_.batch_slots);
  size_t window = 0;
  std::vector<size_t> handed;  // windowed misses handed over: their places can be released
  // A demand read of ids[i] into slot si (a new one, or a prefetch's that failed).
  const auto plan_miss = [&](size_t i, size_t si, bool windowed) {
    slots_[si].state = SlotState::kReady;
    slots_[si].read_failed = true;  // until its reads are planned (plan_reads may throw)
    slot_of[i] = si;
    const size_t before = reads.size();
    plan_reads(static_cast<uint32_t>(layer * Ne + ids[i]), si, reads);
    misses.push_back({si, i, static_cast<uint32_t>(reads.size() - before), windowed});
    slots_[si].read_failed = false;
  };
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t key = static_cast<uint32_t>(layer * Ne + ids[i]);
    const int32_t si = slot_of_key_[key];
    if (si < 0) {
      waiting.push_back(i);
      continue;
    }
    Slot& s = slots_[static_cast<size_t>(si)];
    slot_of[i] = static_cast<size_t>(si);
    if (s.state == SlotState::kLoading) {  // a late prefetch: handed over when it lands
      loading.push_back(i);
      continue;
    }
    if (s.prefetched_unused) settle_prefetch(s, layer, /*arrived_in_time=*/true);
    if (!s.read_failed) {
      in_memory.push_back(i);
      ++stats_.hits;
      stats_.hit_bytes += expert_bytes(key);
      continue;
    }
    s.read_failed = false;  // a failed prefetch: read again on demand, same slot
    plan_miss(i, static_cast<size_t>(si), /*windowed=*/false);
  }
  // The experts in memory go first, while late prefetches and the misses' reads run; each of
  // those is handed over when its reads land. No prefetch is issued here: the policy could
  // displace an expert this fetch hands out.
  Status first;
  size_t unsubmitted = 0;  // misses[unsubmitted..] have their reads in `reads`
  const auto submit = [&]() {
    if (reads.empty()) return;
    std::sort(reads.begin(), reads.end(), by_disk_order);
    if (Status st = demand_cq_->submit(reads); !st.is_ok()) {  // nothing of it was queued
      for (size_t k = unsubmitted; k < misses.size(); ++k) {
        slots_[misses[k].slot].read_failed = true;
        misses[k].reads_left = 0;
      }
      if (first.is_ok()) first = st;
    } else {  // counted once queued: a refused batch read nothing
      for (size_t k = unsubmitted; k < misses.size(); ++k) {
        const uint64_t bytes =
            expert_bytes(static_cast<uint32_t>(layer * Ne + ids[misses[k].index]));
        ++stats_.demand_reads;
        stats_.miss_bytes += bytes;
        stats_.read_bytes += bytes;
      }
    }
    unsubmitted = misses.size();
    reads.clear();
  };
  // Gives waiting misses slots and reads while the window has places, releasing handed-over
  // misses' places as needed; stops after an error.
  const auto top_up = [&]() {
    while (!waiting.empty() && first.is_ok()) {
      if (window == window_max) {
        if (handed.empty()) break;
        const size_t si = handed.back();
        handed.pop_back();
        --window;
        const auto it = std::find(bypass_.begin(), bypass_.end(), si);
        if (it != bypass_.end()) {  // a bypass: its slot goes back now (a kept expert stays)
          bypass_.erase(it);
          Slot& s = slots_[si];
          slot_of_key_[static_cast<size_t>(s.key)] = -1;
          s.key = -1;
          s.state = SlotState::kFree;
          free_.push_back(si);
        }
        continue;
      }
      const size_t i = waiting.front();
      waiting.pop_front();
      const uint32_t key = static_cast<uint32_t>(layer * Ne + ids[i]);
      const size_t si = take_free_slot();
      Slot& s = slots_[si];
      s.key = key;
      s.state = SlotState::kReady;  // read again by the next fetch, should anything below throw
      s.read_failed = true;
      slot_of_key_[key] = static_cast<int32_t>(si);
      if (!policy_->contains(key)) bypass_.push_back(si);  // capacity reserved: no throw
      ++window;
      plan_miss(i, si, /*windowed=*/true);
    }
    submit();
  };
  top_up();
  const auto hand_over = [&](std::span<const size_t> indices) {
    for (size_t i : indices) out[i] = view(slots_[slot_of[i]], layer, ids[i]);
    if (first.is_ok()) first = ready(indices);
  };
  if (!in_memory.empty()) hand_over(in_memory);
  // Late prefetches, in the order asked: one that has landed by the time the decode comes to it
  // (after computing with those above) was in time (a hit); the decode waits for the others
  // (late: misses). Each is handed over as it lands.
  for (const size_t i : loading) {
    Slot& s = slots_[slot_of[i]];
    reap_prefetches(/*block=*/false);
    const bool in_time = s.state != SlotState::kLoading;
    while (s.state == SlotState::kLoading) reap_prefetches(/*block=*/true);
    if (s.prefetched_unused) settle_prefetch(s, layer, in_time);
    if (s.read_failed) {  // re-read on demand (a retry, then the error), unless already failed
      if (!first.is_ok()) continue;  // left marked: a later fetch reads it
      s.read_failed = false;
      plan_miss(i, slot_of[i], /*windowed=*/false);
      submit();
      continue;
    }
    const uint64_t bytes = expert_bytes(static_cast<uint32_t>(layer * Ne + ids[i]));
    if (in_time) {
      ++stats_.hits;
      stats_.hit_bytes += bytes;
    } else {
      ++stats_.late;
      stats_.late_bytes += bytes;
      stats_.miss_bytes += bytes;
    }
    if (first.is_ok()) hand_over(std::span<const size_t>(&i, 1));
  }
  std::vector<io::Completion> done;
  std::vector<size_t> landed;
  while (demand_cq_->outstanding() > 0) {
    done.clear();
    landed.clear();
    const uint64_t t0 = now_ns();
    demand_cq_->wait(1, done);
    stats_.io_wait_ns += now_ns() - t0;
    for (const io::Completion& c : done) {
      // No partial expert may be used later: a slot with a failed read is marked for re-reading.
      Miss* m = nullptr;
      for (Miss& x : misses)
        if (x.slot == c.tag && x.reads_left > 0) m = &x;
      KTIER_CHECK(m != nullptr);
      if (!c.status.is_ok()) {
        slots_[m->slot].read_failed = true;
        if (first.is_ok()) first = c.status;
      }
      if (--m->reads_left == 0 && !slots_[m->slot].read_failed) {
        landed.push_back(m->index);
        if (m->windowed) handed.push_back(m->slot);
      }
    }
    if (!landed.empty() && first.is_ok()) hand_over(landed);
    top_up();  // the next misses' reads, before waiting again
  }
  return first;
}

}  // namespace ktier::runtime
