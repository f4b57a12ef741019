// Cache policies on tiny hand-made sequences: each rule of each policy (cache_policy.h), and
// Belady's optimum against every other policy on random sequences.
#include "strata/cache_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "strata/budget.h"
#include "strata/replay.h"
#include "tests/common/failing_new.h"

namespace ktier::strata {
namespace {

constexpr uint32_t kKeys = 64;

// Drives a cache with one request per step; returns the hit pattern as a string of H/m.
std::string run(CacheModel& cache, const std::vector<uint32_t>& keys, double tokens_per_step = 1) {
  std::vector<uint32_t> next(keys.size(), kNeverUsed);
  for (size_t i = keys.size(); i-- > 0;) {
    for (size_t j = i + 1; j < keys.size(); ++j) {
      if (keys[j] == keys[i]) {
        next[i] = static_cast<uint32_t>(j);
        break;
      }
    }
  }
  std::string pattern;
  for (uint32_t i = 0; i < keys.size(); ++i) {
    cache.begin_step(i);
    pattern += cache.access(keys[i], Request{i, i * tokens_per_step, next[i]}) ? 'H' : 'm';
  }
  return pattern;
}

enum : uint32_t { A = 1, B, C, D, E };

// Temperature without its window: the main segment's rules in isolation.
TemperatureParams main_only(double half_life, double admit_ratio) {
  TemperatureParams p;
  p.half_life_tokens = half_life;
  p.admit_ratio = admit_ratio;
  p.window_fraction = 0;
  p.min_window_slots = 0;
  p.adapt_window = false;
  return p;
}

// A policy that runs out of memory inside a call (`serve` survives std::bad_alloc) keeps its
// books straight: every key it holds counts in resident_count() (and so can be evicted), and
// the eviction hook has been told of every key it dropped. An LFU hit that erased its key and
// then failed to insert it again held that key uncounted for good; the RAM tier then kept an
// expert more than its slots and a later fetch ended the process on a CHECK.
TEST(CachePolicies, ARefusedAllocationLeavesTheBooksStraight) {
  constexpr uint64_t kSlots = 8;
  std::vector<std::unique_ptr<CacheModel>> policies;
  policies.push_back(std::make_unique<LruCache>(kSlots, kKeys));
  policies.push_back(std::make_unique<LfuCache>(kSlots, kKeys));
  TemperatureParams small_window;
  small_window.min_window_slots = 2;
  policies.push_back(std::make_unique<TemperatureCache>(kSlots, kKeys, small_window));
  int refused = 0;  // LRU allocates nothing; LFU and temperature do (their ordered sets)
  for (const auto& policy : policies) {
    std::vector<uint8_t> held(kKeys, 0);  // admitted, and not yet given to the eviction hook
    policy->set_eviction_hook([&held](uint32_t key) { held[key] = 0; });
    std::mt19937 rng(7);
    for (uint32_t i = 0; i < 3000; ++i) {
      SCOPED_TRACE("request " + std::to_string(i));
      const uint32_t key = rng() % 24;  // some hits, some misses
      policy->begin_step(i);
      test::fail_allocation_after(rng() % 2 == 0 ? static_cast<long>(rng() % 3) : -1);
      try {
        if (rng() % 4 == 0)
          (void)policy->prefetch(key, i + 1, i);
        else
          (void)policy->access(key, Request{i, static_cast<double>(i), kNeverUsed});
      } catch (const std::bad_alloc&) {
        ++refused;
      }
      test::fail_allocation_after(-1);
      if (policy->contains(key)) held[key] = 1;
      uint64_t contained = 0;
      for (uint32_t k = 0; k < kKeys; ++k) {
        contained += policy->contains(k);
        ASSERT_EQ(held[k], policy->contains(k) ? 1 : 0) << "key " << k;
      }
      ASSERT_EQ(contained, policy->resident_count());
      ASSERT_LE(contained, kSlots);
    }
  }
  EXPECT_GT(refused, 200);  // the allocations refused did fall inside the calls
}

TEST(LruCache, EvictsLeastRecentlyUsed) {
  LruCache lru(2, kKeys);
  EXPECT_EQ(run(lru, {A, B, A, C, B, A, C}), "mmHmmmm");
  // After the run: C (most recent), A.
  EXPECT_TRUE(lru.contains(C));
  EXPECT_TRUE(lru.contains(A));
  EXPECT_FALSE(lru.contains(B));
  EXPECT_EQ(lru.resident_count(), 2u);
}

TEST(LruCache, ZeroCapacityNeverHits) {
  LruCache lru(0, kKeys);
  EXPECT_EQ(run(lru, {A, A, A}), "mmm");
}

TEST(LruCache, CurrentStepIsPinnedOnlyWhileUnpinnedResidentsExist) {
  // Capacity 2, one step requesting A, B, C: all residents pinned, so C evicts the LRU (A),
  // exactly the conformance model.
  LruCache lru(2, kKeys);
  lru.begin_step(0);
  EXPECT_FALSE(lru.access(A, Request{0, 0}));
  EXPECT_FALSE(lru.access(B, Request{1, 0}));
  EXPECT_FALSE(lru.access(C, Request{2, 0}));
  EXPECT_FALSE(lru.contains(A));
  EXPECT_TRUE(lru.contains(B));
  EXPECT_TRUE(lru.contains(C));
}

TEST(LruCache, PrefetchNeverEvictsPinnedKeys) {
  LruCache lru(2, kKeys);
  lru.begin_step(0);
  (void)lru.access(A, Request{0, 0});
  (void)lru.access(B, Request{1, 0});
  EXPECT_FALSE(lru.prefetch(C, 1, 0));  // A and B are in use by step 0
  lru.begin_step(1);
  EXPECT_TRUE(lru.prefetch(C, 3, 1));  // evicts A (LRU), C pinned until step 3
  EXPECT_FALSE(lru.contains(A));
  EXPECT_FALSE(lru.prefetch(C, 3, 1));  // already resident
  lru.begin_step(2);
  EXPECT_TRUE(lru.prefetch(D, 3, 2));  // evicts B, not the pinned C
  EXPECT_TRUE(lru.contains(C));
  EXPECT_TRUE(lru.contains(D));
  EXPECT_FALSE(lru.prefetch(E, 3, 2));  // C and D both pinned until step 3
}

TEST(LfuCache, EvictsLowestCountTiesToLeastRecent) {
  LfuCache lfu(2, kKeys);
  // A A B: counts A2 B1. C evicts B (lowest count). B returns with count 2 (counts survive
  // eviction); residents A2 C1 -> C evicted. D: A2 B2 -> tie, B more recent, so A is evicted.
  EXPECT_EQ(run(lfu, {A, A, B, C, B, D}), "mHmmmm");
  EXPECT_EQ(lfu.count(B), 2u);
  EXPECT_TRUE(lfu.contains(B));
  EXPECT_TRUE(lfu.contains(D));
  EXPECT_FALSE(lfu.contains(A));
  EXPECT_FALSE(lfu.contains(C));
}

// A live tier counts its requests in 64 bits: past 2^32 keys accessed (~3 M K3 tokens of a long
// serve) recency still breaks LFU's ties, the newest key kept (a 32-bit count wrapped to 0 and
// made the newest look oldest).
TEST(LfuCache, TiesStayRecentPastTwoToTheThirtyTwoRequests) {
  LfuCache lfu(2, kKeys);
  uint64_t step = 0, request = (uint64_t{1} << 32) - 1;
  for (const uint32_t key : {A, B, C}) {  // counts A1 B1: C evicts the older, A
    const int32_t id = static_cast<int32_t>(key);
    (void)access_routing(lfu, 0, kKeys, &id, 1, 1, 1, step, request);
  }
  EXPECT_EQ(request, (uint64_t{1} << 32) + 2);
  EXPECT_FALSE(lfu.contains(A));
  EXPECT_TRUE(lfu.contains(B));
  EXPECT_TRUE(lfu.contains(C));
}

TEST(LfuCache, AllCountsEqualBehavesLikeLru) {
  LfuCache lfu(2, kKeys);
  EXPECT_EQ(run(lfu, {A, B, C, A}), "mmmm");  // C evicts A (older), then A evicts B
  EXPECT_TRUE(lfu.contains(A));
  EXPECT_TRUE(lfu.contains(C));
}

TEST(TemperatureCache, DecayArithmetic) {
  TemperatureParams p;
  p.half_life_tokens = 2.0;
  TemperatureCache t(4, kKeys, p);
  t.begin_step(0);
  (void)t.access(A, Request{0, 0.0});
  EXPECT_DOUBLE_EQ(t.temperature(A, 0.0), 1.0);
  EXPECT_NEAR(t.temperature(A, 2.0), 0.5, 1e-12);   // one half-life
  EXPECT_NEAR(t.temperature(A, 4.0), 0.25, 1e-12);  // two
  EXPECT_NEAR(t.temperature(A, 1.0), std::exp2(-0.5), 1e-12);
  t.begin_step(1);
  (void)t.access(A, Request{1, 2.0});  // 0.5 + 1
  EXPECT_NEAR(t.temperature(A, 2.0), 1.5, 1e-12);
  EXPECT_NEAR(t.temperature(A, 6.0), 0.375, 1e-12);
  EXPECT_EQ(t.temperature(B, 3.0), 0.0);  // never used
}

TEST(TemperatureCache, AdmissionHysteresis) {
  TemperatureCache t(1, kKeys, main_only(/*half_life=*/1000.0, /*admit_ratio=*/1.25));
  // A fills the free slot. B (T=1) is not >= 1.25 * T_A (=1): bypassed. B again (T~2): admitted.
  EXPECT_EQ(run(t, {A, B, B, A, A, A}, 0.001), "mmmmmH");
  // A came back with T~2 vs B's ~2: not clearly hotter, bypassed; then T_A~3 >= 1.25*2: admitted.
  EXPECT_TRUE(t.contains(A));
  EXPECT_FALSE(t.contains(B));
}

TEST(TemperatureCache, EvictsColdestAndDecayFavoursRecent) {
  TemperatureCache t(2, kKeys, main_only(/*half_life=*/1.0, /*admit_ratio=*/1.0));
  // A and E are each used three times, A earlier. At B (clock 6) A has decayed to 0.11, E to
  // 0.88: B displaces A. At C (clock 7) E is at 0.44 and B at 0.5: C displaces E.
  EXPECT_EQ(run(t, {A, A, A, E, E, E, B, C}), "mHHmHHmm");
  EXPECT_TRUE(t.contains(B));
  EXPECT_TRUE(t.contains(C));
}

TEST(TemperatureCache, SeedInformsAdmissionButStartsCold) {
  TemperatureCache t(1, kKeys, main_only(/*half_life=*/1000.0, /*admit_ratio=*/1.25));
  std::vector<double> seed(kKeys, 0.0);
  seed[A] = 10.0;
  t.seed(seed);
  EXPECT_EQ(t.resident_count(), 0u);
  // A misses once (cold), then B (T=1) cannot displace the seeded A.
  EXPECT_EQ(run(t, {A, B, B, A}, 0.001), "mmmH");
}

TEST(TemperatureCache, WindowGrowsWhenDiscardedKeysReturn) {
  // 40 slots: window 32 (the minimum), main 8. Eight keys are made hot (main), then a loop over
  // 36 other keys runs. The loop fits 40 slots, so LRU hits every request after its first round.
  // Temperature first discards loop keys (not admit_ratio times as hot as main's); their
  // return grows the window (ARC-like) until the loop fits in it.
  constexpr uint32_t kManyKeys = 256;
  TemperatureCache t(40, kManyKeys, TemperatureParams{});
  EXPECT_EQ(t.window_target(), 32u);
  std::vector<uint32_t> keys;
  for (int use = 0; use < 3; ++use) {
    for (uint32_t k = 100; k < 108; ++k) keys.push_back(k);
  }
  const size_t loop_start = keys.size();
  for (int round = 0; round < 12; ++round) {
    for (uint32_t k = 0; k < 36; ++k) keys.push_back(k);
  }
  const std::string pattern = run(t, keys, 1.0 / 92);
  EXPECT_GE(t.window_target(), 36u);
  EXPECT_EQ(pattern.substr(pattern.size() - 36), std::string(36, 'H'));
  EXPECT_GE(t.resident_count(), 36u);
  EXPECT_LE(t.resident_count(), 40u);
  LruCache lru(40, kManyKeys);
  const std::string lru_pattern = run(lru, keys);
  EXPECT_EQ(lru_pattern.substr(loop_start + 36), std::string(keys.size() - loop_start - 36, 'H'));
}

TEST(TemperatureCache, MainKeepsHotKeysThatLruWouldLose) {
  // 34 slots: window 32, main 2. A and B are used every round; between their uses 40 one-off
  // keys pass. LRU loses A and B every time; temperature keeps them in main.
  constexpr uint32_t kManyKeys = 1024;
  TemperatureCache t(34, kManyKeys, TemperatureParams{});
  LruCache lru(34, kManyKeys);
  std::vector<uint32_t> keys;
  uint32_t one_off = 10;
  for (int round = 0; round < 20; ++round) {
    keys.push_back(A);
    keys.push_back(B);
    for (int i = 0; i < 40; ++i) keys.push_back(one_off++);
  }
  const auto hits = [](const std::string& p) { return std::count(p.begin(), p.end(), 'H'); };
  EXPECT_EQ(hits(run(t, keys, 1.0 / 92)), 38);  // A and B in every round but the first
  EXPECT_EQ(hits(run(lru, keys, 1.0 / 92)), 0);
}

TEST(TemperatureCache, PrefetchEntersTheWindowPinned) {
  TemperatureCache t(40, kKeys, TemperatureParams{});
  t.begin_step(0);
  EXPECT_TRUE(t.prefetch(A, 2, 0));
  EXPECT_TRUE(t.contains(A));
  EXPECT_TRUE(t.in_window(A));
  EXPECT_FALSE(t.prefetch(A, 2, 0));
  EXPECT_EQ(t.temperature(A, 0), 0.0);  // a prediction is not a use
  // 50 one-off misses before its step, more than the cache holds: the pin keeps A.
  t.begin_step(1);
  for (uint32_t k = 10; k < 60; ++k) EXPECT_FALSE(t.access(k, Request{1, 0.01})) << k;
  EXPECT_TRUE(t.contains(A));
  t.begin_step(2);
  EXPECT_TRUE(t.access(A, Request{2, 0.02}));
}

TEST(TemperatureCache, UnusedPrefetchLeavesTheWindowFirst) {
  // 34 slots, default split: window 32, main 2. Keys 100..133 fill both (100 and 101 in main);
  // E is prefetched for step 40 (102 leaves the window); at step 41 its step has passed unused.
  TemperatureCache t(34, 256, TemperatureParams{});
  std::vector<uint32_t> keys;
  for (uint32_t k = 100; k < 134; ++k) keys.push_back(k);
  (void)run(t, keys, 1.0 / 92);
  t.begin_step(34);
  ASSERT_TRUE(t.prefetch(E, 40, 0.4));
  EXPECT_FALSE(t.contains(102));
  t.begin_step(41);
  t.prefetch_unused(E);
  // The next miss pushes one key out of the full window: E, not the least recent key 103
  // (main does not take E: a prediction is not a use, its temperature is 0).
  EXPECT_FALSE(t.access(200, Request{41, 0.45}));
  EXPECT_FALSE(t.contains(E));
  EXPECT_TRUE(t.contains(103));
  t.prefetch_unused(A);  // not resident: nothing happens
  EXPECT_FALSE(t.contains(A));
}

TEST(TemperatureCache, PrefetchesWaitingBeyondTheWindowTakeMainSlots) {
  // 40 slots, window fixed at 32, main 8. 8 keys become hot (main); then 38 prefetches for a
  // later step arrive. The window holds them all past its share, taking main's slots, until
  // every resident is pinned: then a prefetch is refused.
  TemperatureParams p;
  p.adapt_window = false;
  TemperatureCache t(40, 256, p);
  std::vector<uint32_t> keys;
  for (int use = 0; use < 3; ++use)
    for (uint32_t k = 100; k < 108; ++k) keys.push_back(k);
  (void)run(t, keys, 1.0 / 92);
  t.begin_step(30);
  for (uint32_t k = 0; k < 40; ++k) EXPECT_TRUE(t.prefetch(k, 50, 0.5)) << k;
  EXPECT_EQ(t.resident_count(), 40u);
  for (uint32_t k = 0; k < 40; ++k) EXPECT_TRUE(t.contains(k)) << k;
  EXPECT_FALSE(t.prefetch(41, 50, 0.5));  // all 40 pinned
  // Their step: every one is a hit.
  t.begin_step(50);
  for (uint32_t k = 0; k < 40; ++k) EXPECT_TRUE(t.access(k, Request{50 + k, 0.6})) << k;
}

TEST(TemperatureCache, PrefetchNeverDisplacesThisStepsKeys) {
  // 34 slots: window 32, main 2. A and B are hot (main); step 40 then requests 32 new keys,
  // which fill the window, all pinned for the step. A prefetch for step 41 must take main's
  // coldest slot, not push one of this step's keys out (the live tier is about to compute them).
  TemperatureCache t(34, 512, TemperatureParams{});
  std::vector<uint32_t> keys = {A, B, A, B, A, B};
  for (uint32_t k = 100; k < 132; ++k) keys.push_back(k);
  (void)run(t, keys, 1.0 / 92);
  ASSERT_TRUE(t.contains(A) && !t.in_window(A));
  t.begin_step(40);
  for (uint32_t k = 200; k < 232; ++k) EXPECT_FALSE(t.access(k, Request{40 + k, 0.5}));
  ASSERT_TRUE(t.prefetch(300, 41, 0.5));
  for (uint32_t k = 200; k < 232; ++k) EXPECT_TRUE(t.contains(k)) << k;
  EXPECT_TRUE(t.contains(300));
  EXPECT_EQ(t.contains(A) + t.contains(B), 1);
  EXPECT_EQ(t.resident_count(), 34u);
}

TEST(Policies, ProtectKeepsAPredictedResidentUntilItsStep) {
  for (PolicyKind kind : {PolicyKind::kLru, PolicyKind::kLfu, PolicyKind::kTemperature}) {
    SCOPED_TRACE(std::string(policy_name(kind)));
    PolicyInputs in;
    in.num_keys = kKeys;
    in.temperature.min_window_slots = 0;
    in.temperature.window_fraction = 1;  // temperature as LRU: the rule under test is the pin
    auto cache = make_cache(kind, 2, in);
    (void)run(*cache, {A, B});  // steps 0, 1; A is least recently used
    cache->protect(A, 3);
    cache->protect(C, 3);  // not resident: no effect
    cache->begin_step(2);
    EXPECT_FALSE(cache->access(C, Request{2, 2}));
    EXPECT_TRUE(cache->contains(A));
    EXPECT_FALSE(cache->contains(B));
    EXPECT_FALSE(cache->contains(D));
  }
}

// Records what a live tier's ledger reports.
class UnusedRecorder final : public CacheModel {
 public:
  UnusedRecorder() : CacheModel(8, kKeys) {}
  bool contains(uint32_t) const override { return false; }
  bool access(uint32_t, const Request&) override { return false; }
  uint64_t resident_count() const override { return 0; }
  void prefetch_unused(uint32_t key) override { unused.push_back(key); }
  std::vector<uint32_t> unused;
};

TEST(PrefetchLedger, ReportsKeysTheirLayerDidNotRequest) {
  constexpr int64_t kExperts = 8;
  UnusedRecorder policy;
  PrefetchLedger ledger;
  ledger.issued(2 * kExperts + 1, 2);
  ledger.issued(2 * kExperts + 5, 2);
  ledger.issued(3 * kExperts + 1, 3);
  ledger.issued(3 * kExperts + 5, 3);  // 5 was layer 2's request, not layer 3's
  ledger.issued(1 * kExperts + 7, 1);  // an earlier layer: left by a pass that ended early
  const int32_t layer2[] = {5, 3};
  ledger.settle(policy, 2, kExperts, layer2, 2);
  EXPECT_EQ(policy.unused, (std::vector<uint32_t>{2 * kExperts + 1, 1 * kExperts + 7}));
  policy.unused.clear();
  const int32_t layer3[] = {0, 2};
  ledger.settle(policy, 3, kExperts, layer3, 2);
  EXPECT_EQ(policy.unused, (std::vector<uint32_t>{3 * kExperts + 1, 3 * kExperts + 5}));
  policy.unused.clear();
  ledger.settle(policy, 4, kExperts, layer3, 2);  // nothing left
  EXPECT_TRUE(policy.unused.empty());
}

TEST(BeladyCache, PrefetchAdmitsByNextUseOnlyWhenTheFutureIsGiven) {
  std::vector<uint32_t> upcoming(kKeys, kNeverUsed);
  BeladyCache b(2, kKeys, &upcoming);
  b.begin_step(0);
  (void)b.access(A, Request{0, 0, 10});
  (void)b.access(B, Request{1, 0, 20});
  upcoming[C] = 30;  // used after every resident: declined
  EXPECT_FALSE(b.prefetch(C, 5, 0));
  upcoming[D] = 5;  // before B's next use: B (furthest) leaves
  EXPECT_TRUE(b.prefetch(D, 5, 0));
  EXPECT_TRUE(b.contains(D));
  EXPECT_FALSE(b.contains(B));
  EXPECT_FALSE(b.prefetch(E, 5, 0));  // never used again
  BeladyCache demand_only(2, kKeys);
  EXPECT_FALSE(demand_only.prefetch(A, 5, 0));
  EXPECT_FALSE(demand_only.contains(A));
}

TEST(StaticCache, AdmitsOnlyTheRankedSetOnFirstUse) {
  StaticCache s(2, kKeys, {C, A, B});
  EXPECT_EQ(s.resident_count(), 0u);
  EXPECT_EQ(run(s, {B, A, B, C, A, C, B}), "mmmmHHm");
  EXPECT_EQ(s.resident_count(), 2u);
  EXPECT_FALSE(s.prefetch(B, 9, 0));
}

TEST(BeladyCache, DeclinesKeysUsedLaterThanEveryResident) {
  BeladyCache b(2, kKeys);
  // C's next use is never: declined, so A and B both hit. LRU gets none of these.
  EXPECT_EQ(run(b, {A, B, C, A, B}), "mmmHH");
  LruCache lru(2, kKeys);
  EXPECT_EQ(run(lru, {A, B, C, A, B}), "mmmmm");
  // Evicts the key used furthest in the future: at D, A is next at 5, B at 4 -> A goes
  // (then A misses at 5, while B hits at 4).
  BeladyCache b2(2, kKeys);
  EXPECT_EQ(run(b2, {A, B, D, D, B, A}), "mmmHHm");
}

TEST(Policies, BeladyIsAnUpperBoundOnRandomSequences) {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<uint32_t> keys;
    const uint32_t alphabet = 4 + trial % 20;
    std::geometric_distribution<uint32_t> skew(0.15);
    for (int i = 0; i < 400; ++i) keys.push_back(std::min(skew(rng), alphabet) % kKeys);
    for (uint64_t cap : {1u, 2u, 3u, 5u, 8u, 13u}) {
      const auto count_hits = [](const std::string& p) {
        return std::count(p.begin(), p.end(), 'H');
      };
      BeladyCache belady(cap, kKeys);
      const auto best = count_hits(run(belady, keys));
      std::vector<uint64_t> counts(kKeys, 0);
      for (uint32_t k : keys) ++counts[k];
      LruCache lru(cap, kKeys);
      LfuCache lfu(cap, kKeys);
      TemperatureCache temp(cap, kKeys, TemperatureParams{});
      StaticCache stat(cap, kKeys, rank_keys_by_use(counts));
      for (CacheModel* c : std::vector<CacheModel*>{&lru, &lfu, &temp, &stat}) {
        EXPECT_LE(count_hits(run(*c, keys, 0.1)), best) << "trial " << trial << " cap " << cap;
      }
    }
  }
}

TEST(Policies, NamesParse) {
  Result<std::vector<PolicyKind>> all = parse_policy_list("all");
  ASSERT_TRUE(all.is_ok());
  EXPECT_EQ(all->size(), 5u);
  Result<std::vector<PolicyKind>> two = parse_policy_list("belady,lru,belady");
  ASSERT_TRUE(two.is_ok());
  EXPECT_EQ(*two, (std::vector<PolicyKind>{PolicyKind::kBelady, PolicyKind::kLru}));
  EXPECT_EQ(parse_policy_list("lru,arc").status().exit_code(), 2);
  EXPECT_EQ(parse_policy_list("").status().exit_code(), 2);
}

TEST(Budget, ParsesUnitsAndSlots) {
  const uint64_t eb = 17547264;
  Result<std::vector<Budget>> b = parse_budget_list("8GB,16GB,32GB,64GB,128GB", eb, "--ram");
  ASSERT_TRUE(b.is_ok());
  std::vector<uint64_t> slots;
  for (const Budget& x : *b) slots.push_back(x.slots);
  EXPECT_EQ(slots, (std::vector<uint64_t>{455, 911, 1823, 3647, 7294}));  // README §10.3
  EXPECT_EQ((*b)[0].bytes, 8000000000u);
  Result<Budget> x = parse_budget("16x", eb, "--ram");
  ASSERT_TRUE(x.is_ok());
  EXPECT_EQ(x->slots, 16u);
  EXPECT_EQ(x->bytes, 16 * eb);
  EXPECT_EQ(parse_budget("1GiB", 1024, "--ram")->slots, 1048576u);
  EXPECT_EQ(parse_budget("8e9", eb, "--ram")->slots, 455u);
  EXPECT_EQ(parse_budget("1.5kb", 1, "--ram")->bytes, 1500u);
  EXPECT_EQ(parse_budget("8XB", eb, "--ram").status().exit_code(), 2);
  EXPECT_EQ(parse_budget("", eb, "--ram").status().exit_code(), 2);
  EXPECT_EQ(parse_budget("-1GB", eb, "--ram").status().exit_code(), 2);
  EXPECT_EQ(parse_budget("2.5x", eb, "--ram").status().exit_code(), 2);
  EXPECT_EQ(parse_budget_list("8GB,,16GB", eb, "--ram").status().exit_code(), 2);
  EXPECT_EQ(format_count(100096), "100,096");
  EXPECT_EQ(format_bytes(8000000000u), "8.00 GB");
}

// --slots items are counts of experts; an error quotes the item as given (no internal suffix).
TEST(Budget, SlotListsQuoteTheBadItem) {
  const uint64_t eb = 17547264;
  Result<std::vector<Budget>> b = parse_slot_list("455, 911x ,0", eb, "--slots");
  ASSERT_TRUE(b.is_ok()) << b.status().message();
  ASSERT_EQ(b->size(), 3u);
  EXPECT_EQ((*b)[0].label, "455x");
  EXPECT_EQ((*b)[0].bytes, 455 * eb);
  EXPECT_EQ((*b)[1].slots, 911u);
  EXPECT_EQ((*b)[2].slots, 0u);
  const auto message = [&](const char* list) {
    const Result<std::vector<Budget>> r = parse_slot_list(list, eb, "--slots");
    EXPECT_EQ(r.status().exit_code(), 2) << list;
    return r.status().message();
  };
  EXPECT_EQ(message(",1"), "--slots: '' is not a whole number of experts (e.g. --slots 455,911)");
  EXPECT_EQ(message("4,abc").rfind("--slots: 'abc' is not a whole number", 0), 0u);
  EXPECT_EQ(message("-1").rfind("--slots: '-1' is not", 0), 0u);
  EXPECT_EQ(message("1.5").rfind("--slots: '1.5' is not", 0), 0u);
  EXPECT_EQ(message("99999999999999999999").rfind("--slots: '99999999999999999999' is too many", 0),
            0u);
  EXPECT_EQ(message("999999999999999").rfind("--slots: '999999999999999' is more experts", 0), 0u);
  EXPECT_EQ(parse_slot_list("4", 0, "--slots").status().exit_code(), 2);  // no expert size
}

}  // namespace
}  // namespace ktier::strata
