// Cache policy models. The rules of each policy are written above its class in cache_policy.h.
#include "strata/cache_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/check.h"

namespace ktier::strata {

std::string_view policy_name(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kLru:
      return "lru";
    case PolicyKind::kLfu:
      return "lfu";
    case PolicyKind::kTemperature:
      return "temperature";
    case PolicyKind::kStatic:
      return "static";
    case PolicyKind::kBelady:
      return "belady";
  }
  return "?";
}

Result<PolicyKind> parse_policy(std::string_view name) {
  for (PolicyKind k : kAllPolicies) {
    if (policy_name(k) == name) return k;
  }
  return Status::usage("unknown policy '" + std::string(name) +
                       "' (choose from lru, lfu, temperature, static, belady, or all)");
}

Result<std::vector<PolicyKind>> parse_policy_list(std::string_view list) {
  std::vector<PolicyKind> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string_view item = list.substr(start, comma - start);
    if (item == "all") {
      out.assign(std::begin(kAllPolicies), std::end(kAllPolicies));
    } else {
      KTIER_ASSIGN_OR_RETURN(const PolicyKind k, parse_policy(item));
      bool seen = false;
      for (PolicyKind o : out) seen = seen || o == k;
      if (!seen) out.push_back(k);
    }
    start = comma + 1;
  }
  return out;
}

CacheModel::CacheModel(uint64_t capacity_slots, uint32_t num_keys)
    : capacity_(capacity_slots), pin_until_step_(num_keys, std::numeric_limits<int64_t>::min()) {}

// ------------------------------------------------------------------------------------- LRU

void RecencyList::push_front(uint32_t key) {
  const int32_t k = static_cast<int32_t>(key);
  prev_[key] = kNil;
  next_[key] = head_;
  if (head_ != kNil)
    prev_[head_] = k;
  else
    tail_ = k;
  head_ = k;
  in_[key] = 1;
  ++size_;
}

void RecencyList::push_back(uint32_t key) {
  const int32_t k = static_cast<int32_t>(key);
  next_[key] = kNil;
  prev_[key] = tail_;
  if (tail_ != kNil)
    next_[tail_] = k;
  else
    head_ = k;
  tail_ = k;
  in_[key] = 1;
  ++size_;
}

void RecencyList::unlink(uint32_t key) {
  const int32_t p = prev_[key], n = next_[key];
  if (p != kNil)
    next_[p] = n;
  else
    head_ = n;
  if (n != kNil)
    prev_[n] = p;
  else
    tail_ = p;
  prev_[key] = next_[key] = kNil;
  in_[key] = 0;
  --size_;
}

LruCache::LruCache(uint64_t capacity_slots, uint32_t num_keys)
    : CacheModel(capacity_slots, num_keys), list_(num_keys) {}

int32_t LruCache::victim(bool allow_pinned) const {
  for (int32_t k = list_.back(); k != RecencyList::kNil; k = list_.toward_front(k)) {
    if (!pinned(static_cast<uint32_t>(k))) return k;
  }
  return allow_pinned ? list_.back() : RecencyList::kNil;
}

void LruCache::evict(uint32_t key) {
  list_.unlink(key);
  evicted(key);
}

bool LruCache::access(uint32_t key, const Request& request) {
  pin_for_current_step(key);
  if (list_.linked(key)) {
    list_.touch(key);
    return true;
  }
  if (capacity() == 0) return false;
  if (list_.size() == capacity()) evict(static_cast<uint32_t>(victim(/*allow_pinned=*/true)));
  list_.push_front(key);
  return false;
}

bool LruCache::prefetch(uint32_t key, uint64_t target_step, double clock_tokens) {
  if (list_.linked(key) || capacity() == 0) return false;
  if (list_.size() == capacity()) {
    const int32_t v = victim(/*allow_pinned=*/false);
    if (v == RecencyList::kNil) return false;
    evict(static_cast<uint32_t>(v));
  }
  list_.push_front(key);
  pin_until(key, target_step);
  return true;
}

// ------------------------------------------------------------------------------------- LFU

LfuCache::LfuCache(uint64_t capacity_slots, uint32_t num_keys)
    : CacheModel(capacity_slots, num_keys),
      count_(num_keys, 0),
      last_use_(num_keys, -1),
      resident_(num_keys, 0) {}

bool LfuCache::make_room(bool allow_pinned) {
  if (order_.size() < capacity()) return true;
  auto it = order_.begin();
  while (it != order_.end() && pinned(std::get<2>(*it))) ++it;
  if (it == order_.end()) {
    if (!allow_pinned || order_.empty()) return false;
    it = order_.begin();
  }
  const uint32_t key = std::get<2>(*it);
  resident_[key] = 0;
  order_.erase(it);
  evicted(key);
  return true;
}

// Exception safety (a serve request survives std::bad_alloc): a resident key moves within
// order_ as its node (no allocation), and a new key is marked resident only once its node is in:
// a resident key missing from order_ could never be evicted, and the tier would hold one more
// expert than its slots (a CHECK in ExpertCache later).
bool LfuCache::access(uint32_t key, const Request& request) {
  pin_for_current_step(key);
  if (resident_[key]) {
    auto node = order_.extract(entry(key));
    ++count_[key];
    last_use_[key] = request.index;
    node.value() = entry(key);
    order_.insert(std::move(node));
    return true;
  }
  ++count_[key];
  last_use_[key] = request.index;
  if (capacity() == 0) return false;
  KTIER_CHECK(make_room(/*allow_pinned=*/true));
  order_.insert(entry(key));
  resident_[key] = 1;
  return false;
}

bool LfuCache::prefetch(uint32_t key, uint64_t target_step, double clock_tokens) {
  if (resident_[key] || capacity() == 0 || !make_room(/*allow_pinned=*/false)) return false;
  order_.insert(entry(key));
  resident_[key] = 1;
  pin_until(key, target_step);
  return true;
}

// ----------------------------------------------------------------------------- temperature

TemperatureCache::TemperatureCache(uint64_t capacity_slots, uint32_t num_keys,
                                   const TemperatureParams& params)
    : CacheModel(capacity_slots, num_keys),
      params_(params),
      score_(num_keys, -std::numeric_limits<double>::infinity()),
      last_use_(num_keys, -1),
      in_main_(num_keys, 0),
      window_(num_keys),
      window_ghosts_(num_keys),
      main_ghosts_(num_keys) {
  KTIER_CHECK(params.half_life_tokens > 0 && params.admit_ratio > 0);
  KTIER_CHECK(params.window_fraction >= 0 && params.window_fraction <= 1);
  const double cap = static_cast<double>(capacity_slots);
  min_window_ = std::min(cap, static_cast<double>(params.min_window_slots));
  window_target_ = std::clamp(std::ceil(params.window_fraction * cap), min_window_, cap);
}

void TemperatureCache::seed(const std::vector<double>& temperature_at_zero) {
  KTIER_CHECK(temperature_at_zero.size() == score_.size() && resident_count() == 0);
  for (uint32_t k = 0; k < score_.size(); ++k) {
    if (temperature_at_zero[k] > 0) score_[k] = std::log2(temperature_at_zero[k]);  // s at clock 0
  }
}

double TemperatureCache::temperature(uint32_t key, double clock_tokens) const {
  return std::exp2(score_[key] - clock_tokens / params_.half_life_tokens);
}

uint64_t TemperatureCache::window_target() const {
  return static_cast<uint64_t>(std::llround(window_target_));
}

void TemperatureCache::remember(RecencyList& ghosts, uint32_t key) {
  if (ghosts.linked(key)) ghosts.unlink(key);
  ghosts.push_front(key);
  if (ghosts.size() > capacity()) ghosts.unlink(static_cast<uint32_t>(ghosts.back()));
}

bool TemperatureCache::evict_coldest_unpinned_from_main() {
  auto victim = order_.begin();
  while (victim != order_.end() && pinned(std::get<2>(*victim))) ++victim;
  if (victim == order_.end()) return false;
  const uint32_t key = std::get<2>(*victim);
  in_main_[key] = 0;
  order_.erase(victim);
  remember(main_ghosts_, key);
  evicted(key);
  return true;
}

void TemperatureCache::offer_to_main(uint32_t key, uint64_t main_share) {
  if (main_share == 0) {
    remember(window_ghosts_, key);
    evicted(key);
    return;
  }
  if (order_.size() >= main_share) {
    auto victim = order_.begin();
    while (victim != order_.end() && pinned(std::get<2>(*victim))) ++victim;
    // T_key >= ratio * T_v  <=>  s_key >= s_v + log2(ratio) (both read at the same clock). A main
    // segment of pinned keys only (the step in progress) takes no newcomer.
    if (victim == order_.end() ||
        score_[key] < std::get<0>(*victim) + std::log2(params_.admit_ratio)) {
      remember(window_ghosts_, key);
      evicted(key);
      return;
    }
    evict_coldest_unpinned_from_main();
  }
  try {
    order_.insert(entry(key));
  } catch (...) {  // in neither segment now: the tier frees its slot
    evicted(key);
    throw;
  }
  in_main_[key] = 1;
}

void TemperatureCache::insert_into_window(uint32_t key, bool prefetching) {
  window_.push_front(key);
  const uint64_t window_share = window_target();
  const uint64_t main_share = capacity() - window_share;
  // Main gives up unpinned keys beyond its share (a grown window target shrinks it); pinned ones
  // stay until their step ends, and the window makes room for them instead.
  while (order_.size() > main_share && evict_coldest_unpinned_from_main()) {
  }
  while (window_.size() > window_share || window_.size() + order_.size() > capacity()) {
    // The least recent unpinned window key leaves; else, for a demand miss, the least recent
    // pinned for this step only (it has been read for the step; main's admission rule decides
    // whether it stays). A prefetch never displaces a pinned key: main gives up a slot instead.
    int32_t out = RecencyList::kNil, current = RecencyList::kNil;
    for (int32_t k = window_.back(); k != RecencyList::kNil; k = window_.toward_front(k)) {
      if (!pinned(static_cast<uint32_t>(k))) {
        out = k;
        break;
      }
      if (current == RecencyList::kNil && !pinned_for_later(static_cast<uint32_t>(k))) current = k;
    }
    if (out == RecencyList::kNil && !prefetching) out = current;
    if (out == RecencyList::kNil) {
      // Every window key is pinned (prefetches waiting for a later step, e.g. a prefill's next
      // layer, or this step's keys when prefetching): the window exceeds its share until they
      // are used, taking main's coldest unpinned slots; only a cache smaller than the pinned set
      // gives up a pinned key (never on a prefetch: prefetch() refuses first).
      if (window_.size() + order_.size() <= capacity() || evict_coldest_unpinned_from_main())
        break;
      out = window_.back();
    }
    window_.unlink(static_cast<uint32_t>(out));
    offer_to_main(static_cast<uint32_t>(out), main_share);
  }
}

bool TemperatureCache::access(uint32_t key, const Request& request) {
  pin_for_current_step(key);
  // A main resident moves within order_ as its node (no allocation: see LfuCache::access).
  std::set<Entry>::node_type node;
  if (in_main_[key]) node = order_.extract(entry(key));
  // T_new = T(now) + 1, stored as s = log2 T_new + now / H.
  const double now_over_h = request.clock_tokens / params_.half_life_tokens;
  score_[key] = std::log2(std::exp2(score_[key] - now_over_h) + 1.0) + now_over_h;
  last_use_[key] = request.index;
  if (in_main_[key]) {
    node.value() = entry(key);
    order_.insert(std::move(node));
    return true;
  }
  if (window_.linked(key)) {
    window_.touch(key);
    return true;
  }
  if (capacity() == 0) return false;
  adapt_on_ghost(key);
  insert_into_window(key, /*prefetching=*/false);
  return false;
}

void TemperatureCache::adapt_on_ghost(uint32_t key) {
  const double cap = static_cast<double>(capacity());
  const double w = static_cast<double>(window_ghosts_.size());
  const double m = static_cast<double>(main_ghosts_.size());
  if (window_ghosts_.linked(key)) {
    if (params_.adapt_window) window_target_ = std::min(cap, window_target_ + std::max(1.0, m / w));
    window_ghosts_.unlink(key);
  } else if (main_ghosts_.linked(key)) {
    if (params_.adapt_window)
      window_target_ = std::max(min_window_, window_target_ - std::max(1.0, w / m));
    main_ghosts_.unlink(key);
  }
}

bool TemperatureCache::prefetch(uint32_t key, uint64_t target_step, double clock_tokens) {
  if (contains(key) || capacity() == 0) return false;
  if (resident_count() >= capacity()) {  // refused only when no resident could make room
    bool any_unpinned = false;
    for (int32_t k = window_.back(); k != RecencyList::kNil && !any_unpinned;
         k = window_.toward_front(k)) {
      any_unpinned = !pinned(static_cast<uint32_t>(k));
    }
    for (auto it = order_.begin(); it != order_.end() && !any_unpinned; ++it)
      any_unpinned = !pinned(std::get<2>(*it));
    if (!any_unpinned) return false;
  }
  pin_until(key, target_step);
  adapt_on_ghost(key);
  insert_into_window(key, /*prefetching=*/true);
  return true;
}

void TemperatureCache::prefetch_unused(uint32_t key) {
  if (!window_.linked(key)) return;
  window_.unlink(key);
  window_.push_back(key);
}

// ---------------------------------------------------------------------------------- static

StaticCache::StaticCache(uint64_t capacity_slots, uint32_t num_keys,
                         const std::vector<uint32_t>& ranking)
    : CacheModel(capacity_slots, num_keys), allowed_(num_keys, 0), resident_(num_keys, 0) {
  uint64_t allowed = 0;
  for (uint32_t key : ranking) {
    if (allowed == capacity_slots) break;
    if (key < num_keys && !allowed_[key]) {
      allowed_[key] = 1;
      ++allowed;
    }
  }
}

bool StaticCache::access(uint32_t key, const Request& request) {
  if (resident_[key]) return true;
  if (allowed_[key]) {
    resident_[key] = 1;
    ++size_;
  }
  return false;
}

// ---------------------------------------------------------------------------------- Belady

BeladyCache::BeladyCache(uint64_t capacity_slots, uint32_t num_keys,
                         const std::vector<uint32_t>* upcoming)
    : CacheModel(capacity_slots, num_keys), upcoming_(upcoming), next_use_(num_keys, kAbsent) {
  KTIER_CHECK(upcoming == nullptr || upcoming->size() == num_keys);
}

bool BeladyCache::access(uint32_t key, const Request& request) {
  const uint64_t next = request.next_use;
  if (next_use_[key] != kAbsent) {  // moved as its node (see LfuCache::access)
    auto node = order_.extract({next_use_[key], key});
    next_use_[key] = next;
    node.value() = {next, key};
    order_.insert(std::move(node));
    return true;
  }
  (void)admit(key, next);
  return false;
}

bool BeladyCache::prefetch(uint32_t key, uint64_t target_step, double clock_tokens) {
  if (upcoming_ == nullptr || contains(key)) return false;
  return admit(key, (*upcoming_)[key]);
}

bool BeladyCache::admit(uint32_t key, uint64_t next) {
  if (capacity() == 0 || next == kNeverUsed) return false;
  if (order_.size() == capacity()) {
    const auto furthest = std::prev(order_.end());
    if (next >= furthest->first) return false;  // declined: used later than every resident
    const uint32_t out = furthest->second;
    next_use_[out] = kAbsent;
    order_.erase(furthest);
    evicted(out);
  }
  order_.insert({next, key});
  next_use_[key] = next;
  return true;
}

// --------------------------------------------------------------------------------- factory

uint64_t access_routing(CacheModel& policy, int64_t layer, int64_t num_experts,
                        const int32_t* ids, int64_t T, int k, int64_t moe_layers, uint64_t& step,
                        uint64_t& request) {
  uint64_t hits = 0;
  for (int64_t t = 0; t < T; ++t) {
    policy.begin_step(step);
    const double clock = static_cast<double>(step) / static_cast<double>(moe_layers);
    ++step;
    for (int i = 0; i < k; ++i) {
      const uint32_t key = static_cast<uint32_t>(layer * num_experts + ids[t * k + i]);
      hits += policy.access(key, Request{request++, clock, kNeverUsed});
    }
  }
  return hits;
}

void PrefetchLedger::settle(CacheModel& policy, int64_t layer, int64_t num_experts,
                            const int32_t* ids, int64_t n) {
  if (pending_.empty()) return;
  requested_.assign(num_experts, ids, n);
  size_t kept = 0;
  for (const auto& [target, key] : pending_) {
    if (target > layer) {
      pending_[kept++] = {target, key};
      continue;
    }
    const int64_t id = static_cast<int64_t>(key) - layer * num_experts;
    if (target != layer || !requested_.contains(id)) policy.prefetch_unused(key);
  }
  pending_.resize(kept);
}

void RequestedExperts::assign(int64_t num_experts, const int32_t* ids, int64_t n) {
  mask_.assign(static_cast<size_t>(std::max<int64_t>(num_experts, 0)), 0);
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] >= 0 && ids[i] < num_experts) mask_[static_cast<size_t>(ids[i])] = 1;
}

void PrefetchLedger::abandon(CacheModel& policy) {
  for (const auto& entry : pending_) policy.prefetch_unused(entry.second);
  pending_.clear();
}

std::unique_ptr<CacheModel> make_cache(PolicyKind kind, uint64_t capacity_slots,
                                       const PolicyInputs& inputs) {
  switch (kind) {
    case PolicyKind::kLru:
      return std::make_unique<LruCache>(capacity_slots, inputs.num_keys);
    case PolicyKind::kLfu:
      return std::make_unique<LfuCache>(capacity_slots, inputs.num_keys);
    case PolicyKind::kTemperature: {
      auto cache =
          std::make_unique<TemperatureCache>(capacity_slots, inputs.num_keys, inputs.temperature);
      if (inputs.temperature_seed) cache->seed(*inputs.temperature_seed);
      return cache;
    }
    case PolicyKind::kStatic:
      KTIER_CHECK(inputs.static_ranking != nullptr);
      return std::make_unique<StaticCache>(capacity_slots, inputs.num_keys, *inputs.static_ranking);
    case PolicyKind::kBelady:
      return std::make_unique<BeladyCache>(capacity_slots, inputs.num_keys, inputs.belady_upcoming);
  }
  return nullptr;
}

}  // namespace ktier::strata
