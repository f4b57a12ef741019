#pragma once
// Expert cache policies as replay models: one tier's resident set of routed experts, counted in
// slots (one slot = one expert; slots = floor(capacity bytes / expert bytes)). docs/STRATA.md §3.
//
// Keys are dense: key = layer * experts_per_layer + expert. A replay drives a cache with
//   begin_step(s)         once per step (one token at one MoE layer), before its requests;
//   access(key, request)  for every expert the step needs, in the recorded order -> hit or miss;
//   prefetch(key, target) for a predicted expert before the step `target` that needs it;
//   protect(key, target)  for a predicted expert that is resident already;
//   prefetch_unused(key)  when step `target` of a prefetched key ended without requesting it.
//
// Pins (shared by every policy that evicts): a key requested in the step in progress, and a key
// prefetched or protected for a step that has not yet ended, is pinned. A demand miss never evicts a pinned
// key while an unpinned resident exists; if every resident is pinned (a cache smaller than one
// step's request set), it takes the policy's own victim among them — which makes LRU exactly
// the conformance model of README §10.3 at every size. A prefetch never evicts a pinned key.
//
// Not thread-safe; one instance per replay.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "common/status.h"

namespace ktier::strata {

enum class PolicyKind { kLru, kLfu, kTemperature, kStatic, kBelady };

inline constexpr PolicyKind kAllPolicies[] = {PolicyKind::kLru, PolicyKind::kLfu,
                                              PolicyKind::kTemperature, PolicyKind::kStatic,
                                              PolicyKind::kBelady};

std::string_view policy_name(PolicyKind kind);
// Parses one name (lru, lfu, temperature, static, belady); usage error otherwise.
Result<PolicyKind> parse_policy(std::string_view name);
// Parses a comma list of names ("lru,belady"; "all" means every policy).
Result<std::vector<PolicyKind>> parse_policy_list(std::string_view list);

inline constexpr uint32_t kNeverUsed = 0xFFFFFFFFu;  // next-use index of a key with no next use

// One demand request as the cache sees it.
struct Request {
  // Position in the whole request stream: 64 bits, since a live tier's count passes 2^32 keys
  // accessed within ~3 M K3 tokens of a long `serve` (replay's streams stay below 2^32).
  uint64_t index = 0;
  double clock_tokens = 0;         // token clock (docs/STRATA.md §3.1)
  uint32_t next_use = kNeverUsed;  // index of the next request for the same key (Belady only)
};

// Default temperature parameters; the evidence for them is in docs/STRATA.md §5.
// Half-life: long against the reuse distance of decode (one token) so counts accumulate, short
// against a conversation's topic shifts (hundreds of tokens).
inline constexpr double kDefaultHalfLifeTokens = 64.0;
// The shortest half-life `trace replay --half-life` takes: a token clock over far less is
// infinite at K3's token counts (NaN scores); less than a token decays everything anyway.
inline constexpr double kMinHalfLifeTokens = 1e-3;
// A key leaving the window enters the main segment only if its temperature is at least this
// multiple of the coldest unpinned main resident's (the hysteresis). 1.0 would swap two keys
// whose temperatures differ by rounding, and keys used alternately would keep displacing each
// other; at 4 a newcomer must have been used about four times as much recently as what it
// displaces. Idle residents halve every half-life, so a stale main segment still turns over.
inline constexpr double kDefaultAdmitRatio = 4.0;
// Initial share of the capacity given to the recency window; it adapts from there.
inline constexpr double kDefaultWindowFraction = 0.01;
// The window never has fewer slots than this (unless the whole cache is smaller): two steps of
// K3's top-16, so the step in progress and the one before it always fit.
inline constexpr uint64_t kMinWindowSlots = 32;

struct TemperatureParams {
  double half_life_tokens = kDefaultHalfLifeTokens;
  double admit_ratio = kDefaultAdmitRatio;
  double window_fraction = kDefaultWindowFraction;
  uint64_t min_window_slots = kMinWindowSlots;
  bool adapt_window = true;  // false: the window keeps its initial share (tests, comparisons)
};

// An intrusive doubly linked list over dense keys, front = most recently used. O(1) per call.
class RecencyList {
 public:
  static constexpr int32_t kNil = -1;
  explicit RecencyList(uint32_t num_keys)
      : prev_(num_keys, kNil), next_(num_keys, kNil), in_(num_keys, 0) {}
  bool linked(uint32_t key) const { return in_[key]; }
  uint64_t size() const { return size_; }
  void push_front(uint32_t key);  // REQUIRES: !linked(key)
  void unlink(uint32_t key);      // REQUIRES: linked(key)
  void push_back(uint32_t key);   // REQUIRES: !linked(key)
  void touch(uint32_t key) {
    unlink(key);
    push_front(key);
  }
  int32_t back() const { return tail_; }
  int32_t toward_front(int32_t key) const { return prev_[key]; }

 private:
  std::vector<int32_t> prev_, next_;
  std::vector<uint8_t> in_;
  int32_t head_ = kNil, tail_ = kNil;
  uint64_t size_ = 0;
};

class CacheModel {
 public:
  CacheModel(uint64_t capacity_slots, uint32_t num_keys);
  virtual ~CacheModel() = default;
  CacheModel(const CacheModel&) = delete;
  CacheModel& operator=(const CacheModel&) = delete;

  virtual bool contains(uint32_t key) const = 0;
  // A demand request. Returns true on a hit (the key was resident before the call).
  virtual bool access(uint32_t key, const Request& request) = 0;
  // Inserts a predicted key for step `target_step`; returns true if it was read into the cache
  // (false when resident already, when the policy does not prefetch, or when every resident is
  // pinned). Default: the policy does not prefetch.
  virtual bool prefetch(uint32_t key, uint64_t target_step, double clock_tokens) { return false; }
  virtual uint64_t resident_count() const = 0;
  // A predicted key that is resident already: pinned until `target_step`, so that the misses and
  // prefetches before its step cannot displace it. No effect on a key not resident.
  void protect(uint32_t key, uint64_t target_step) {
    if (contains(key)) pin_until(key, target_step);
  }
  // The step a prefetch of `key` was for has ended without requesting it (a wrong prediction).
  // Default: nothing (the key keeps the place its prefetch gave it).
  virtual void prefetch_unused(uint32_t key) {}

  // Steps are 64-bit: a live tier counts one per (token, MoE layer) for as long as it runs.
  void begin_step(uint64_t step) { step_ = static_cast<int64_t>(step); }
  uint64_t capacity() const { return capacity_; }
  // Called with every key that stops being resident (evicted, or leaving the window without
  // being admitted), during the access() or prefetch() that displaced it. A live tier uses it to
  // free the key's memory (runtime/expert_cache.h); replay leaves it unset.
  using EvictionHook = std::function<void(uint32_t key)>;
  void set_eviction_hook(EvictionHook hook) { eviction_hook_ = std::move(hook); }

 protected:
  bool pinned(uint32_t key) const { return pin_until_step_[key] >= step_; }
  // Pinned for a step after the current one (prefetched or protected for it).
  bool pinned_for_later(uint32_t key) const { return pin_until_step_[key] > step_; }
  void pin_for_current_step(uint32_t key) {
    if (pin_until_step_[key] < step_) pin_until_step_[key] = step_;
  }
  void pin_until(uint32_t key, uint64_t step) {
    if (pin_until_step_[key] < static_cast<int64_t>(step)) pin_until_step_[key] = step;
  }
  int64_t current_step() const { return step_; }
  void evicted(uint32_t key) {
    if (eviction_hook_) eviction_hook_(key);
  }

 private:
  uint64_t capacity_;
  int64_t step_ = -1;
  std::vector<int64_t> pin_until_step_;  // per key; pinned while >= the current step
  EvictionHook eviction_hook_;
};

// LRU, global over (layer, expert) keys — the README §10.3 model.
//   Admission: every missed key is admitted.
//   Promotion: a hit or an insert makes the key most recently used.
//   Eviction:  the least recently used unpinned key (see pins above).
//   Discarded: recency of evicted keys; nothing is remembered about a key once it leaves.
//   Prefetch:  the predicted key is inserted as most recently used and pinned until its step.
class LruCache final : public CacheModel {
 public:
  LruCache(uint64_t capacity_slots, uint32_t num_keys);
  bool contains(uint32_t key) const override { return list_.linked(key); }
  bool access(uint32_t key, const Request& request) override;
  bool prefetch(uint32_t key, uint64_t target_step, double clock_tokens) override;
  uint64_t resident_count() const override { return list_.size(); }

 private:
  // The key to evict: from the LRU end, the first unpinned one, else the LRU key itself.
  // With `allow_pinned` false, returns RecencyList::kNil when all are pinned.
  int32_t victim(bool allow_pinned) const;
  void evict(uint32_t key);

  RecencyList list_;
};

// LFU with counts that survive eviction ("perfect" LFU).
//   Counts:    every demand request adds 1 to its key's count, resident or not; prefetch adds 0.
//   Admission: every missed key is admitted.
//   Promotion: none besides the count (and recency, used only for ties).
//   Eviction:  the unpinned resident with the lowest count; ties go to the least recently used
//              (oldest last request), then to the lower key.
//   Discarded: nothing about counts; an evicted key keeps its count for when it returns.
//   Prefetch:  inserted with its count unchanged, pinned until its step.
class LfuCache final : public CacheModel {
 public:
  LfuCache(uint64_t capacity_slots, uint32_t num_keys);
  bool contains(uint32_t key) const override { return resident_[key]; }
  bool access(uint32_t key, const Request& request) override;
  bool prefetch(uint32_t key, uint64_t target_step, double clock_tokens) override;
  uint64_t resident_count() const override { return order_.size(); }
  uint64_t count(uint32_t key) const { return count_[key]; }

 private:
  using Entry = std::tuple<uint64_t, int64_t, uint32_t>;  // count, last request, key
  Entry entry(uint32_t key) const { return {count_[key], last_use_[key], key}; }
  bool make_room(bool allow_pinned);

  std::vector<uint64_t> count_;
  std::vector<int64_t> last_use_;  // -1: never
  std::vector<uint8_t> resident_;
  std::set<Entry> order_;  // residents, coldest first
};

// Temperature: an exponentially decayed use count per key with half-life H tokens,
//   T_k(now) = sum over past demand requests u of k: 2^(-(now - t_u) / H),
// on the token clock (docs/STRATA.md §3.1), tracked for every key, resident or not. The
// capacity is split into a recency window and a main segment that keeps the hottest keys; the
// split adapts to the trace the way ARC balances recency and frequency.
//   Admission: every missed key enters the window (most recent end). A key pushed out of the
//              window's least recent end enters main while main is below its share; when main
//              is full, with v its coldest unpinned resident, the key enters (v leaves) iff
//              T_key >= admit_ratio * T_v, else the key is discarded. This is the hysteresis:
//              a newcomer must be clearly hotter than what it displaces.
//   Promotion: a window hit moves the key to the window's recent end; a main hit only raises
//              its temperature. Keys never move from main back to the window.
//   Eviction:  window: least recent unpinned; main: coldest unpinned (ties: least recently
//              used, then lower key).
//   Split:     the window's target starts at window_fraction of the capacity (at least
//              min_window_slots). Keys that leave are remembered (no data) in two ghost lists
//              of up to `capacity` keys each: discarded from the window, evicted from main. A
//              miss on a window ghost grows the window target by max(1, |main ghosts| /
//              |window ghosts|) slots; a miss on a main ghost shrinks it by max(1, |window
//              ghosts| / |main ghosts|), never below min_window_slots; the target may reach the
//              whole capacity (then the policy is LRU). A segment over its share gives up keys
//              on the next insert; main gives up only unpinned keys then (the window makes room
//              for pinned ones), and a key leaving the window never displaces a pinned main key.
//              On a demand miss, when every window key is pinned, the least recent pinned for
//              this step only is offered to main (it was read for the step): main takes it by
//              its usual rule, else it is discarded after its use (a bypass, though main may
//              hold unpinned keys); keys pinned for a later step stay, the window over its
//              share, and main gives up its coldest unpinned key. A key pinned for a later step
//              is discarded only when no resident is unpinned (a cache smaller than the pinned
//              set). With adapt_window false the target never moves.
//   Discarded: nothing about temperature: evicted and bypassed keys keep decaying and counting.
//   Prefetch:  inserted into the window without the admission test, pinned until its step; a
//              prefetch of a ghost adapts the split as a miss on it would. A prefetch never
//              displaces a pinned key (this step's included): when the window holds only pinned
//              keys it grows past its share and main gives up its coldest unpinned key; it is
//              refused only when every resident is pinned. A prefetch whose step ended unused
//              moves to the window's least recent end: nothing says it will be used, so it
//              leaves first.
// Main ordering uses s_k = log2 T_k(now) + now / H, which does not change while a key is unused,
// so residents sit in one ordered set and comparisons are exact over time.
class TemperatureCache final : public CacheModel {
 public:
  TemperatureCache(uint64_t capacity_slots, uint32_t num_keys, const TemperatureParams& params);
  // Seeds temperatures at clock 0 (e.g. from a recorded profile). The cache still starts empty;
  // the seed only informs admission and eviction. REQUIRES: called before the first access;
  // seed.size() == num_keys.
  void seed(const std::vector<double>& temperature_at_zero);

  bool contains(uint32_t key) const override { return in_main_[key] || window_.linked(key); }
  bool access(uint32_t key, const Request& request) override;
  bool prefetch(uint32_t key, uint64_t target_step, double clock_tokens) override;
  void prefetch_unused(uint32_t key) override;
  uint64_t resident_count() const override { return order_.size() + window_.size(); }
  bool in_window(uint32_t key) const { return window_.linked(key); }
  uint64_t window_target() const;
  // T_k(now). Exposed for tests.
  double temperature(uint32_t key, double clock_tokens) const;

 private:
  using Entry = std::tuple<double, int64_t, uint32_t>;  // score, last request, key
  Entry entry(uint32_t key) const { return {score_[key], last_use_[key], key}; }
  // Puts `key` at the window's recent end, then brings both segments back within their shares
  // (`prefetching`: without displacing any pinned key).
  void insert_into_window(uint32_t key, bool prefetching);
  // Offers a key leaving the window to the main segment (the admission rule above).
  void offer_to_main(uint32_t key, uint64_t main_share);
  // Evicts main's coldest unpinned key; false when every main key is pinned.
  bool evict_coldest_unpinned_from_main();
  // A key about to be read (a miss or a prefetch) that is a ghost moves the split (ARC's rule).
  void adapt_on_ghost(uint32_t key);
  void remember(RecencyList& ghosts, uint32_t key);

  TemperatureParams params_;
  double window_target_ = 0;  // slots; adapted by ghost hits
  double min_window_ = 0;
  std::vector<double> score_;      // log2 T + clock / H; -inf for a key never used
  std::vector<int64_t> last_use_;  // -1: never
  std::vector<uint8_t> in_main_;
  RecencyList window_;
  RecencyList window_ghosts_, main_ghosts_;  // keys only, most recent first
  std::set<Entry> order_;                    // main residents, coldest first
};

// Static: a fixed set of allowed keys, the first `capacity` keys of a ranking (most used first).
// Ranked from a recorded profile it is a deployable baseline; ranked from the replayed trace
// itself it knows the future's frequencies, so it is an oracle-ish baseline, not a policy an
// engine could run. Like every policy here it starts cold (docs/STRATA.md §3.2): an allowed key
// is read on its first request (a miss, as the engine's preload of it would be) and then stays.
//   Admission: only allowed keys, on first request. Promotion: none. Eviction: none.
//   Discarded: every miss of a key outside the set is read for its step and discarded.
//   Prefetch:  ignored.
class StaticCache final : public CacheModel {
 public:
  StaticCache(uint64_t capacity_slots, uint32_t num_keys, const std::vector<uint32_t>& ranking);
  bool contains(uint32_t key) const override { return resident_[key]; }
  bool access(uint32_t key, const Request& request) override;
  uint64_t resident_count() const override { return size_; }

 private:
  std::vector<uint8_t> allowed_;
  std::vector<uint8_t> resident_;
  uint64_t size_ = 0;
};

// Belady's optimum with optional admission (the README §10.3 variant), the upper bound for any
// demand policy on this trace at this size. Needs each request's next use (Request::next_use).
//   Admission: a missed key is admitted while a slot is free (unless never used again). When
//              full, it is declined (read for its step, discarded) if its next use is later than
//              every resident's next use; otherwise the resident used furthest in the future is
//              evicted and the key admitted.
//   Promotion: a hit updates the key's next use. Eviction: furthest next use.
//   Discarded: bypassed keys. Pins are ignored: as an upper bound it must not be constrained by
//              them.
//   Prefetch:  only when given `upcoming` (per key, the index of its next request, kept current
//              by the caller): a predicted key is admitted by the same rule, with that next use,
//              so a wrong prediction (used late or never) is declined — the bound for a cache fed
//              the same predictions (docs/STRATA.md §4). Without it, prefetch is ignored and a
//              policy with prefetch can exceed this demand-only bound.
class BeladyCache final : public CacheModel {
 public:
  BeladyCache(uint64_t capacity_slots, uint32_t num_keys,
              const std::vector<uint32_t>* upcoming = nullptr);
  bool contains(uint32_t key) const override { return next_use_[key] != kAbsent; }
  bool access(uint32_t key, const Request& request) override;
  bool prefetch(uint32_t key, uint64_t target_step, double clock_tokens) override;
  uint64_t resident_count() const override { return order_.size(); }

 private:
  static constexpr uint64_t kAbsent = ~0ull;
  // Admits `key` with next use `next` unless it is used later than every resident.
  bool admit(uint32_t key, uint64_t next);
  const std::vector<uint32_t>* upcoming_;
  std::vector<uint64_t> next_use_;                 // per resident key; kAbsent when not resident
  std::set<std::pair<uint64_t, uint32_t>> order_;  // (next use, key), furthest last
};

// What a policy needs beyond its capacity.
struct PolicyInputs {
  uint32_t num_keys = 0;
  TemperatureParams temperature;
  const std::vector<double>* temperature_seed = nullptr;  // per key, or null
  const std::vector<uint32_t>* static_ranking = nullptr;  // required for kStatic
  // kBelady with prefetch: per key, its next request index (kNeverUsed: none), kept current by
  // the caller. Null: Belady ignores prefetch.
  const std::vector<uint32_t>* belady_upcoming = nullptr;
};

std::unique_ptr<CacheModel> make_cache(PolicyKind kind, uint64_t capacity_slots,
                                       const PolicyInputs& inputs);

// A live tier's routing of one chunk (docs/STRATA.md §7): per token a policy step at token clock
// step / moe_layers, then its k keys (layer * num_experts + id) accessed in selection order.
// ids [T, k]. Advances `step` (one per token) and `request` (one per key); returns the hits.
uint64_t access_routing(CacheModel& policy, int64_t layer, int64_t num_experts,
                        const int32_t* ids, int64_t T, int k, int64_t moe_layers, uint64_t& step,
                        uint64_t& request);

// The last policy step a live tier's prediction pins its key through: the target layer's steps
// of a chunk of T tokens. `step` is the next step to begin; a prediction made at layer `layer`
// (before its routing) for `target` waits for the T steps of each MoE layer in [layer, target]
// — MoE layers are those from `first_moe_layer` on — so a dense layer adds none.
inline uint64_t prediction_pin_until(uint64_t step, int64_t T, int64_t layer, int64_t target,
                                     int64_t first_moe_layer) {
  const int64_t moe_layers = target - std::max(layer, first_moe_layer) + 1;
  return step + static_cast<uint64_t>(T * moe_layers) - 1;
}

// The experts one layer's chunk requested, as a mask over [0, num_experts): a prefill chunk
// requests T x k ids (K3: 4,096 at T = 256), too many to search once per expert or pending
// prefetch. Ids outside [0, num_experts) are ignored. Not thread-safe.
class RequestedExperts {
 public:
  // ids [n]; replaces the previous call's set.
  void assign(int64_t num_experts, const int32_t* ids, int64_t n);
  bool contains(int64_t id) const {
    return id >= 0 && id < static_cast<int64_t>(mask_.size()) && mask_[static_cast<size_t>(id)];
  }

 private:
  std::vector<uint8_t> mask_;
};

// A live tier's prefetches awaiting the layer they were predicted for. Replay tells the policy
// when a prefetch's step ends unused (CacheModel::prefetch_unused); a live tier does it per
// layer of a chunk: after the routing of layer L, every key prefetched for L (or for an earlier
// layer, left by a pass that ended early) that L's chunk did not request. In decode (one token
// per pass) this is replay's rule exactly. Not thread-safe.
class PrefetchLedger {
 public:
  void issued(uint32_t key, int64_t target_layer) { pending_.push_back({target_layer, key}); }
  // ids [n]: layer `layer`'s requested experts (key = layer * num_experts + id).
  void settle(CacheModel& policy, int64_t layer, int64_t num_experts, const int32_t* ids,
              int64_t n);
  // A pass ended before their layers: every pending prefetch is unused.
  void abandon(CacheModel& policy);

 private:
  std::vector<std::pair<int64_t, uint32_t>> pending_;  // (target layer, key), in issue order
  RequestedExperts requested_;  // settle()'s scratch
};

}  // namespace ktier::strata
