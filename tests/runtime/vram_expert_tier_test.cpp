// The VRAM tier's lookahead against a host tier whose reads land later: a predicted expert the
// host does not hold yet waits, and is copied ahead once the host holds it — before its own
// layer is routed; after that, fetch() copies it on demand. A fake host stands in for the RAM
// tier so that "in memory now" is decided by the test, not by I/O timing. Emulated device.
#include "runtime/vram_expert_tier.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <set>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "cpu/exec.h"
#include "runtime/device_placement.h"

namespace ktier::runtime {
namespace {

constexpr int64_t kLayers = 4, kExperts = 8, kTopK = 2, kRows = 4, kCols = 4;

// Every expert: three 4 x 4 F32 matrices in one host array, each element a distinct value (its
// index), so bytes copied from the wrong expert, matrix or slot are seen. peek() succeeds only
// for the experts marked ready. With `one_buffer`, fetch() serves one expert at a time from one
// buffer that each fetch overwrites, as a source reading into a read buffer does
// (CheckpointExpertSource in pread mode: views valid until its next fetch).
class FakeHost final : public model::ExpertSource {
 public:
  explicit FakeHost(bool one_buffer = false)
      : one_buffer_(one_buffer), data_(static_cast<size_t>(kLayers * kExperts * 3 * kRows * kCols)),
        buffer_(static_cast<size_t>(3 * kRows * kCols)) {
    for (size_t i = 0; i < data_.size(); ++i) data_[i] = static_cast<float>(i);
  }
  Status fetch(int64_t layer, std::span<const int32_t> ids, model::ExpertWeights* out) override {
    if (on_fetch) on_fetch();
    if (fail_fetches > 0 && --fail_fetches == 0) return Status::runtime("fake host: read failed");
    if (one_buffer_) {
      EXPECT_EQ(ids.size(), 1u);
      const float* src = data_.data() + (layer * kExperts + ids[0]) * 3 * kRows * kCols;
      std::copy(src, src + buffer_.size(), buffer_.begin());
      out[0] = views_of(buffer_.data());
      return Status::ok();
    }
    for (size_t i = 0; i < ids.size(); ++i) out[i] = view(layer, ids[i]);
    return Status::ok();
  }
  uint64_t bytes_fetched() const override { return 0; }
  int64_t max_batch() const override { return one_buffer_ ? 1 : kTopK; }
  bool peek(int64_t layer, int32_t id, model::ExpertWeights* out) override {
    if (!ready.count(layer * kExperts + id)) return false;
    *out = view(layer, id);
    return true;
  }
  void set_held_above(std::function<bool(int64_t, int32_t)> held) override {
    held_above = std::move(held);
  }
  void set_reuse_fence(ReuseFence fence) override { reuse_fence = std::move(fence); }
  void begin_pass() override { ++passes; }
  // Rewrites expert `id` of `layer` as a RAM tier reusing its slot would: after the fence.
  void reuse(int64_t layer, int32_t id, float delta) {
    const float* p = data_.data() + (layer * kExperts + id) * 3 * kRows * kCols;
    if (reuse_fence) reuse_fence(p, 3 * kRows * kCols * sizeof(float));
    change(layer, id, delta);
  }
  ReuseFence reuse_fence;  // the tier's, while it lives
  int fail_fetches = 0;     // > 0: the fetch that brings it to 0 fails (1: the next one)
  int passes = 0;           // begin_pass calls
  std::function<void()> on_fetch;  // called as each fetch starts
  std::set<int64_t> ready;  // layer * kExperts + id
  std::function<bool(int64_t, int32_t)> held_above;  // the tier's hook, while it lives

  // The host's matrix `m` (0 = w1, 1 = w2, 2 = w3) of expert `id` of `layer`, for comparing.
  std::vector<float> matrix(int64_t layer, int32_t id, int m) const {
    const float* p = data_.data() + ((layer * kExperts + id) * 3 + m) * kRows * kCols;
    return std::vector<float>(p, p + kRows * kCols);
  }
  // Adds `delta` to every element of expert `id` of `layer` (new bytes, still distinct).
  void change(int64_t layer, int32_t id, float delta) {
    float* p = data_.data() + (layer * kExperts + id) * 3 * kRows * kCols;
    for (int64_t i = 0; i < 3 * kRows * kCols; ++i) p[i] += delta;
  }

 private:
  model::ExpertWeights view(int64_t layer, int32_t id) const {
    return views_of(data_.data() + (layer * kExperts + id) * 3 * kRows * kCols);
  }
  static model::ExpertWeights views_of(const float* base) {
    model::ExpertWeights w;
    for (int m = 0; m < 3; ++m) {
      cpu::WeightMatrix& x = m == 0 ? w.w1 : m == 1 ? w.w2 : w.w3;
      x = {cpu::WeightType::kF32, base + m * kRows * kCols, nullptr, kRows, kCols};
    }
    return w;
  }
  bool one_buffer_;
  std::vector<float> data_;
  std::vector<float> buffer_;  // one_buffer: what fetch() last read
};

// The device bytes of views `out` against the host's experts `ids` of `layer`, each matrix.
void expect_views_hold(backend::Backend& be, const FakeHost& host, int64_t layer,
                       std::span<const int32_t> ids, const std::vector<model::ExpertWeights>& out) {
  ASSERT_TRUE(be.synchronize().is_ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int m = 0; m < 3; ++m) {
      const cpu::WeightMatrix& x = m == 0 ? out[i].w1 : m == 1 ? out[i].w2 : out[i].w3;
      std::vector<float> back(static_cast<size_t>(kRows * kCols), -1.0f);
      ASSERT_TRUE(be.download(back.data(), x.data, back.size() * sizeof(float)).is_ok());
      EXPECT_EQ(back, host.matrix(layer, ids[i], m))
          << "layer " << layer << " expert " << ids[i] << " matrix " << m;
    }
  }
}

format::ModelConfig tiny_config() {
  format::ModelConfig c;
  c.num_hidden_layers = kLayers;
  c.first_k_dense_replace = 1;
  c.num_experts = kExperts;
  c.num_experts_per_token = kTopK;
  return c;
}

TEST(VramExpertTier, PredictionsTheHostIsStillReadingAreCopiedOnceReady) {
  const format::ModelConfig c = tiny_config();
  auto be = backend::make_emulated_device_backend(cpu::Exec{nullptr, cpu::Isa::kScalar});
  FakeHost host;
  const cpu::WeightMatrix m{cpu::WeightType::kF32, nullptr, nullptr, kRows, kCols};
  const uint64_t slot_bytes = 3 * DevicePlacer::bytes(m);
  strata::PolicyInputs in;
  auto tier = VramExpertTier::open(host, *be, c, slot_bytes, 6 * kTopK, strata::PolicyKind::kLru,
                                   in);
  ASSERT_TRUE(tier.is_ok()) << tier.status().message();
  VramExpertTier& t = **tier;

  // Layer 1 (decode, one token): routed to {0, 1}; the prediction for layer 2 is {3, 5}, which
  // the host does not hold yet.
  const int32_t predicted[] = {3, 5};
  const float w[] = {0.5f, 0.5f};
  t.on_prediction(1, 1, 0, predicted, w, 1, kTopK);
  EXPECT_EQ(t.stats().prefetch_issued, 0u);
  const int32_t routed1[] = {0, 1};
  t.begin_layer(1, 0, routed1, 1, kTopK);
  std::vector<model::ExpertWeights> out(kTopK);
  ASSERT_TRUE(t.fetch(1, routed1, out.data()).is_ok());
  // Expert 3's read lands during layer 1; 5's does not. At layer 2's prediction (after its
  // attention, before its routing) the tier copies 3.
  host.ready.insert(2 * kExperts + 3);
  const int32_t predicted3[] = {6, 7};
  t.on_prediction(2, 1, 0, predicted3, w, 1, kTopK);
  EXPECT_EQ(t.stats().prefetch_issued, 1u);
  // The host learns what the tier keeps, so its own lookahead need not read it again.
  ASSERT_TRUE(host.held_above);
  EXPECT_TRUE(host.held_above(2, 3));
  EXPECT_FALSE(host.held_above(2, 5));
  // Layer 2 routes {3, 5}: 3 is a VRAM hit (the lookahead copy), 5 a miss copied on demand;
  // 5's wait ends with its layer even if its read lands now.
  const int32_t routed2[] = {3, 5};
  t.begin_layer(2, 0, routed2, 1, kTopK);
  host.ready.insert(2 * kExperts + 5);
  ASSERT_TRUE(t.fetch(2, routed2, out.data()).is_ok());
  EXPECT_EQ(t.stats().hits, 1u);
  EXPECT_EQ(t.stats().prefetch_useful, 1u);
  EXPECT_EQ(t.stats().prefetch_issued, 1u);
  // The views are device memory holding the host's bytes of the routed experts, in order: the
  // prefetched 3 and the on-demand 5, each of the three matrices.
  expect_views_hold(*be, host, 2, routed2, out);
  tier->reset();
  EXPECT_FALSE(host.held_above) << "the hook must not outlive the tier";
}

struct TierUnderTest {
  std::unique_ptr<backend::Backend> be =
      backend::make_emulated_device_backend(cpu::Exec{nullptr, cpu::Isa::kScalar});
  FakeHost host;
  std::unique_ptr<VramExpertTier> tier;
  explicit TierUnderTest(int64_t slots, bool one_buffer = false) : host(one_buffer) {
    const cpu::WeightMatrix m{cpu::WeightType::kF32, nullptr, nullptr, kRows, kCols};
    auto t = VramExpertTier::open(host, *be, tiny_config(), 3 * DevicePlacer::bytes(m), slots,
                                  strata::PolicyKind::kLru, strata::PolicyInputs{});
    EXPECT_TRUE(t.is_ok()) << t.status().message();
    if (t.is_ok()) tier = std::move(*t);
  }
  // Router lookahead from layer `l` at `depth` for one token: the top_k experts `ids` of layer
  // l + depth, which the host holds (ready to copy).
  void predict(int64_t l, int depth, std::span<const int32_t> ids) {
    ASSERT_EQ(ids.size(), static_cast<size_t>(kTopK));
    for (int32_t id : ids) host.ready.insert((l + depth) * kExperts + id);
    const float w[] = {0.5f, 0.5f};
    tier->on_prediction(l, depth, 0, ids.data(), w, 1, kTopK);
  }
  // One decode token's MoE layer: routed to `ids`, fetched into `out`.
  void layer(int64_t l, std::span<const int32_t> ids, std::vector<model::ExpertWeights>& out) {
    out.resize(ids.size());
    tier->begin_layer(l, 0, ids.data(), 1, kTopK);
    ASSERT_TRUE(tier->fetch(l, ids, out.data()).is_ok());
  }
};

// The emulated device reads a copy's host bytes only when the ops (or the host) first wait for
// it. So host bytes changed after layer 2's fetch that show in layer 3's views prove that layer
// 2's ops did not wait for the lookahead copies of layer 3's experts: on a GPU, a layer's
// experts (hits and misses) are not held up behind copies for later layers.
TEST(VramExpertTier, OpsWaitOnlyForTheCopiesOfTheirOwnExperts) {
  TierUnderTest x(6 * kTopK);
  ASSERT_TRUE(x.tier);
  const int32_t for2[] = {3, 5}, for3[] = {6, 7};
  x.predict(1, 1, for2);
  x.predict(1, 2, for3);
  EXPECT_EQ(x.tier->stats().prefetch_issued, 4u);
  std::vector<model::ExpertWeights> out;
  const int32_t routed1[] = {0, 1}, routed2[] = {3, 4};
  x.layer(1, routed1, out);  // misses
  expect_views_hold(*x.be, x.host, 1, routed1, out);
  x.layer(2, routed2, out);  // a lookahead hit and a miss
  expect_views_hold(*x.be, x.host, 2, routed2, out);
  x.host.change(3, 6, 1000.0f);
  x.layer(3, for3, out);  // lookahead hits
  EXPECT_EQ(x.tier->stats().prefetch_useful, 3u);
  expect_views_hold(*x.be, x.host, 3, for3, out);
}

// A report window counts the lookahead copies made before it apart (carried) when they are used
// in it: the window's own figures hold only its own copies.
TEST(VramExpertTier, CopiesMadeBeforeAWindowCountAsCarried) {
  TierUnderTest x(6 * kTopK);
  ASSERT_TRUE(x.tier);
  for (int32_t id : {3, 5}) x.host.ready.insert(2 * kExperts + id);
  for (int32_t id : {0, 6, 7}) x.host.ready.insert(3 * kExperts + id);
  const float w[] = {0.5f, 0.5f};
  const int32_t for2[] = {3, 5}, for3[] = {6, 7};
  x.tier->on_prediction(1, 1, 0, for2, w, 1, kTopK);
  x.tier->on_prediction(1, 2, 0, for3, w, 1, kTopK);
  x.tier->begin_window();
  std::vector<model::ExpertWeights> out;
  const int32_t routed2[] = {3, 4}, again3[] = {6, 0};
  x.layer(2, routed2, out);  // 3: a copy from before the window
  x.tier->on_prediction(2, 1, 0, again3, w, 1, kTopK);  // 0: the window's own copy
  x.layer(3, again3, out);
  const VramTierStats& s = x.tier->stats();
  EXPECT_EQ(s.prefetch_issued, 5u);
  EXPECT_EQ(s.prefetch_useful, 3u);
  EXPECT_EQ(s.carried_useful, 2u);
  EXPECT_EQ(s.carried_wasted, 2u);  // 5 and 7: their layers, routed in the window, did not ask
  EXPECT_EQ(s.prefetch_wasted, 2u);
}

// A host whose fetch reuses its buffer: a fetch's misses come in batches of one, and each batch's
// copy must have read the buffer before the next batch's host fetch rewrites it (otherwise the
// first expert's slot receives the second's bytes, or the emulated device sees the host bytes
// change before the host waited).
TEST(VramExpertTier, AHostsReadBufferIsRewrittenOnlyAfterTheCopiesThatReadIt) {
  TierUnderTest x(6 * kTopK, /*one_buffer=*/true);
  ASSERT_TRUE(x.tier);
  std::vector<model::ExpertWeights> out;
  const int32_t routed1[] = {2, 6}, routed2[] = {1, 4};
  x.layer(1, routed1, out);
  expect_views_hold(*x.be, x.host, 1, routed1, out);
  x.layer(2, routed2, out);
  for (auto q : backend::Backend::kCopyQueues) ASSERT_TRUE(x.be->sync_copies(q).is_ok());
  expect_views_hold(*x.be, x.host, 2, routed2, out);
}

// The host's reuse fence waits for the copies that read the memory about to be rewritten, and
// not for the others (on a GPU the host would otherwise stall for every lookahead copy in flight
// each time its RAM tier reads an expert). Rewritten after the fence, expert 3's old bytes are
// what landed; expert 5's copy, not waited for, reads its bytes later (the emulated device reads
// host bytes at the first wait that covers a copy), so 5's view shows the new bytes.
TEST(VramExpertTier, TheReuseFenceWaitsOnlyForCopiesOfThatMemory) {
  TierUnderTest x(6 * kTopK);
  ASSERT_TRUE(x.tier);
  ASSERT_TRUE(x.host.reuse_fence);
  for (int32_t id : {3, 5}) x.host.ready.insert(2 * kExperts + id);
  const float w[] = {0.5f, 0.5f};
  const int32_t for2[] = {3, 5};
  x.tier->on_prediction(1, 1, 0, for2, w, 1, kTopK);
  ASSERT_EQ(x.tier->stats().prefetch_issued, 2u);
  const std::vector<float> old3 = x.host.matrix(2, 3, 0);
  x.host.reuse(2, 3, 1000.0f);   // fenced
  x.host.change(2, 5, 2000.0f);  // a probe: no fence, so the copy of 5 has not read it yet
  std::vector<model::ExpertWeights> out;
  const int32_t routed1[] = {0, 1};
  x.layer(1, routed1, out);
  x.layer(2, for2, out);
  ASSERT_TRUE(x.be->synchronize().is_ok());
  std::vector<float> back(static_cast<size_t>(kRows * kCols));
  ASSERT_TRUE(x.be->download(back.data(), out[0].w1.data, back.size() * 4).is_ok());
  EXPECT_EQ(back, old3) << "expert 3's copy read its bytes before they were rewritten";
  ASSERT_TRUE(x.be->download(back.data(), out[1].w1.data, back.size() * 4).is_ok());
  EXPECT_EQ(back, x.host.matrix(2, 5, 0)) << "the fence waited for expert 5's copy too";
}

// The same for a miss's copy: the RAM tier refills a slot it handed to a fetch (a bypass slot)
// before the next fetch's wait; the fence must cover copies on the misses' queue too.
TEST(VramExpertTier, TheReuseFenceCoversMissCopies) {
  TierUnderTest x(6 * kTopK);
  ASSERT_TRUE(x.tier);
  std::vector<model::ExpertWeights> out;
  const int32_t routed1[] = {0, 1};
  x.layer(1, routed1, out);
  const std::vector<float> old0 = x.host.matrix(1, 0, 0);
  x.host.reuse(1, 0, 1000.0f);
  for (auto q : backend::Backend::kCopyQueues) ASSERT_TRUE(x.be->sync_copies(q).is_ok());
  std::vector<float> back(static_cast<size_t>(kRows * kCols));
  ASSERT_TRUE(x.be->download(back.data(), out[0].w1.data, back.size() * 4).is_ok());
  EXPECT_EQ(back, old0);
}

// A prefetch evicted before its copy landed frees its slot to a miss, whose copy goes on the
// other queue: it must land after the stale one, whenever that queue's copies are applied.
TEST(VramExpertTier, ASlotReusedBeforeItsPrefetchLandedKeepsTheNewExpert) {
  TierUnderTest x(VramExpertTier::minimum_slots(tiny_config()));  // two policy slots
  ASSERT_TRUE(x.tier);
  for (int32_t id : {3, 5}) x.host.ready.insert(2 * kExperts + id);
  const float w[] = {0.5f, 0.5f};
  const int32_t for2[] = {3, 5};
  x.tier->on_prediction(1, 1, 0, for2, w, 1, kTopK);  // both policy slots, pinned through 2
  EXPECT_EQ(x.tier->stats().prefetch_issued, 2u);
  std::vector<model::ExpertWeights> out;
  const int32_t routed1[] = {0, 1}, routed2[] = {6, 7}, routed3[] = {0, 1};
  x.layer(1, routed1, out);
  x.layer(2, routed2, out);  // the prediction was wrong: bypass slots, nothing waits for it
  x.layer(3, routed3, out);  // pins over: 3 and 5 evicted, their slots take layer 3's 0 and 1
  ASSERT_TRUE(x.host.held_above);
  EXPECT_TRUE(x.host.held_above(3, 0) && x.host.held_above(3, 1));
  EXPECT_FALSE(x.host.held_above(2, 3) || x.host.held_above(2, 5));
  EXPECT_EQ(x.tier->stats().prefetch_wasted, 2u);
  for (auto q : backend::Backend::kCopyQueues) ASSERT_TRUE(x.be->sync_copies(q).is_ok());
  expect_views_hold(*x.be, x.host, 3, routed3, out);
}

// A lookahead copy is timely when it has landed by its layer's fetch (the ops then do not wait
// for it). The emulated device lands a copy only when something waits for it: layer 2's copies
// are waited for at once, layer 3's not before their fetch. Layer 2's are made before a report
// window, so its timely copy counts as carried too.
TEST(VramExpertTier, ACopyIsTimelyOnlyWhenItLandedBeforeItsLayersFetch) {
  TierUnderTest x(8 * kTopK);
  ASSERT_TRUE(x.tier);
  const int32_t for2[] = {3, 5}, for3[] = {6, 7};
  x.predict(1, 1, for2);
  ASSERT_TRUE(x.be->sync_copies(backend::Backend::CopyQueue::kExperts).is_ok());
  x.tier->begin_window();
  x.predict(1, 2, for3);
  ASSERT_EQ(x.tier->stats().prefetch_issued, 4u);
  std::vector<model::ExpertWeights> out;
  const int32_t routed1[] = {0, 1}, routed2[] = {3, 4};
  x.layer(1, routed1, out);
  x.layer(2, routed2, out);  // 3: landed
  EXPECT_EQ(x.tier->stats().prefetch_useful, 1u);
  EXPECT_EQ(x.tier->stats().prefetch_timely, 1u);
  EXPECT_EQ(x.tier->stats().carried_timely, 1u);
  x.layer(3, for3, out);  // 6 and 7: still in flight, the ops wait for them
  EXPECT_EQ(x.tier->stats().prefetch_useful, 3u);
  EXPECT_EQ(x.tier->stats().prefetch_timely, 1u);
  EXPECT_EQ(x.tier->stats().carried_timely, 1u);
  expect_views_hold(*x.be, x.host, 3, for3, out);
}

// Timeliness is judged as the fetch starts: a copy that lands only because the fetch's own
// miss made the host wait for it (the RAM tier reusing the memory it reads) was not timely.
TEST(VramExpertTier, ACopyLandedByTheFetchsOwnMissIsNotTimely) {
  TierUnderTest x(8 * kTopK);
  ASSERT_TRUE(x.tier);
  const int32_t for2[] = {3, 5}, routed1[] = {0, 1}, routed2[] = {3, 4};
  std::vector<model::ExpertWeights> out;
  x.layer(1, routed1, out);
  x.predict(1, 1, for2);
  x.host.on_fetch = [&] { x.host.reuse(2, 3, 0.0f); };  // the miss 4's read reuses 3's memory
  x.layer(2, routed2, out);
  EXPECT_EQ(x.tier->stats().prefetch_useful, 1u);
  EXPECT_EQ(x.tier->stats().prefetch_timely, 0u);
}

// A fetch that fails part-way (the host's second batch) or throws leaves no slot claiming an
// expert it did not copy: the same fetch again copies what it lacks, and every view holds its
// expert.
TEST(VramExpertTier, AFailedOrThrowingFetchLeavesNoSlotWithoutItsCopy) {
  TierUnderTest x(6 * kTopK, /*one_buffer=*/true);  // the host serves one expert per fetch
  ASSERT_TRUE(x.tier);
  const int32_t routed[] = {2, 6};
  std::vector<model::ExpertWeights> out(2);
  x.tier->begin_layer(1, 0, routed, 1, kTopK);
  x.host.fail_fetches = 2;
  const Status failed = x.tier->fetch(1, routed, out.data());
  EXPECT_FALSE(failed.is_ok());
  EXPECT_NE(failed.message().find("fake host: read failed"), std::string::npos)
      << failed.message();
  const uint64_t hits = x.tier->stats().hits;
  ASSERT_TRUE(x.tier->fetch(1, routed, out.data()).is_ok());
  EXPECT_EQ(x.tier->stats().hits, hits) << "nothing of the failed fetch is served as held";
  for (auto q : backend::Backend::kCopyQueues) ASSERT_TRUE(x.be->sync_copies(q).is_ok());
  expect_views_hold(*x.be, x.host, 1, routed, out);
  // So does an exception out of the host's fetch (std::bad_alloc: serve answers that request
  // and goes on with this tier): after the first expert's copy, the second's slot is assigned.
  const int32_t next[] = {3, 7};
  x.tier->begin_layer(1, 1, next, 1, kTopK);
  int fetches = 0;
  x.host.on_fetch = [&] {
    if (++fetches == 2) throw std::bad_alloc();
  };
  EXPECT_THROW((void)x.tier->fetch(1, next, out.data()), std::bad_alloc);
  x.host.on_fetch = nullptr;
  const uint64_t hits_after = x.tier->stats().hits;
  ASSERT_TRUE(x.tier->fetch(1, next, out.data()).is_ok());
  EXPECT_EQ(x.tier->stats().hits, hits_after) << "nothing of the thrown fetch is held";
  for (auto q : backend::Backend::kCopyQueues) ASSERT_TRUE(x.be->sync_copies(q).is_ok());
  expect_views_hold(*x.be, x.host, 1, next, out);
}

// A lookahead copy is useful only to the layer it was made for: one that layer does not ask
// for is wasted when the layer is routed, even while the tier keeps it, and a later pass's hit
// on it is a plain hit (the RAM tier's rule; before, it was counted useful then).
TEST(VramExpertTier, ACopyItsLayerDidNotAskForIsWastedThenAndNeverUseful) {
  TierUnderTest x(8 * kTopK);  // room to keep every copy
  ASSERT_TRUE(x.tier);
  for (int32_t id : {3, 5}) x.host.ready.insert(2 * kExperts + id);
  const float w[] = {0.5f, 0.5f};
  const int32_t for2[] = {3, 5};
  x.tier->on_prediction(1, 1, 0, for2, w, 1, kTopK);
  ASSERT_EQ(x.tier->stats().prefetch_issued, 2u);
  std::vector<model::ExpertWeights> out;
  const int32_t routed1[] = {0, 1}, routed2[] = {3, 6}, again2[] = {5, 7};
  x.layer(1, routed1, out);
  x.layer(2, routed2, out);  // 3 was right, 5 wrong
  EXPECT_EQ(x.tier->stats().prefetch_useful, 1u);
  EXPECT_EQ(x.tier->stats().prefetch_wasted, 1u);
  const uint64_t hits = x.tier->stats().hits;
  x.layer(1, routed1, out);  // the next token
  x.layer(2, again2, out);   // 5 is still in VRAM: a hit, not a useful copy
  EXPECT_EQ(x.tier->stats().hits, hits + 2 + 1);
  EXPECT_EQ(x.tier->stats().prefetch_useful, 1u);
  EXPECT_EQ(x.tier->stats().prefetch_wasted, 1u);
}

// A pass that ends before the layer its copies were made for (a failed read, under serve) leaves
// them to no later pass: they are wasted when the next pass begins, and a later hit on one is a
// plain hit. The host (the RAM tier) is told of each pass too.
TEST(VramExpertTier, CopiesOfAPassThatEndedEarlyAreWastedWhenTheNextBegins) {
  TierUnderTest x(8 * kTopK);  // room to keep every copy
  ASSERT_TRUE(x.tier);
  for (int32_t id : {3, 5}) x.host.ready.insert(2 * kExperts + id);
  const float w[] = {0.5f, 0.5f};
  const int32_t for2[] = {3, 5}, other[] = {0, 1};
  std::vector<model::ExpertWeights> out;
  x.tier->begin_pass();
  x.layer(1, other, out);
  x.tier->on_prediction(1, 1, 0, for2, w, 1, kTopK);  // the pass ends here, layer 2 never runs
  ASSERT_EQ(x.tier->stats().prefetch_issued, 2u);
  EXPECT_EQ(x.tier->stats().prefetch_wasted, 0u);
  x.tier->begin_pass();
  EXPECT_EQ(x.tier->stats().prefetch_wasted, 2u);
  EXPECT_EQ(x.host.passes, 2);
  x.tier->on_prediction(1, 1, 1, other, w, 1, kTopK);
  const uint64_t hits = x.tier->stats().hits;
  x.layer(1, other, out);
  x.layer(2, for2, out);  // both still in VRAM: hits, not useful copies
  EXPECT_EQ(x.tier->stats().hits, hits + 2 + 2);
  EXPECT_EQ(x.tier->stats().prefetch_useful, 0u);
  EXPECT_EQ(x.tier->stats().prefetch_useful + x.tier->stats().prefetch_wasted,
            x.tier->stats().prefetch_issued);
}

// The minimum leaves lookahead room: after layer 1 is routed its experts stay pinned while
// layer 2 is predicted, so 2 x top_k slots (top_k of them the policy's) copied nothing ahead.
TEST(VramExpertTier, TheMinimumWithLookaheadHasRoomForItsCopies) {
  const format::ModelConfig c = tiny_config();
  EXPECT_EQ(VramExpertTier::minimum_slots(c), 2 * kTopK);
  EXPECT_EQ(VramExpertTier::minimum_slots(c, 2), 4 * kTopK);
  // Every expert plus the bypass:
  EXPECT_EQ(VramExpertTier::minimum_slots(c, 40), (kLayers - 1) * kExperts + kTopK);
  for (const int lookahead : {0, 1}) {
    TierUnderTest x(VramExpertTier::minimum_slots(c, lookahead));
    ASSERT_TRUE(x.tier);
    for (int32_t id : {3, 5}) x.host.ready.insert(2 * kExperts + id);
    std::vector<model::ExpertWeights> out;
    const int32_t routed1[] = {0, 1}, for2[] = {3, 5};
    const float w[] = {0.5f, 0.5f};
    x.layer(1, routed1, out);
    x.tier->on_prediction(1, 1, 0, for2, w, 1, kTopK);
    EXPECT_EQ(x.tier->stats().prefetch_issued, lookahead ? 2u : 0u) << "lookahead " << lookahead;
  }
}

// The same copies made before a report window and evicted unused in it are its carried waste.
TEST(VramExpertTier, CopiesMadeBeforeAWindowAndEvictedInItAreCarriedWaste) {
  TierUnderTest x(VramExpertTier::minimum_slots(tiny_config()));
  ASSERT_TRUE(x.tier);
  for (int32_t id : {3, 5}) x.host.ready.insert(2 * kExperts + id);
  const float w[] = {0.5f, 0.5f};
  const int32_t for2[] = {3, 5};
  x.tier->on_prediction(1, 1, 0, for2, w, 1, kTopK);
  x.tier->begin_window();
  std::vector<model::ExpertWeights> out;
  const int32_t routed1[] = {0, 1}, routed2[] = {6, 7}, routed3[] = {0, 1};
  x.layer(1, routed1, out);
  x.layer(2, routed2, out);
  x.layer(3, routed3, out);
  EXPECT_EQ(x.tier->stats().prefetch_wasted, 2u);
  EXPECT_EQ(x.tier->stats().carried_wasted, 2u);
  EXPECT_EQ(x.tier->stats().carried_useful, 0u);
}

}  // namespace
}  // namespace ktier::runtime
