// The VRAM tier's lookahead against a host tier whose reads land later: a predicted expert the
// host does not hold yet waits, and is copied ahead once the host holds it — before its own
// layer is routed; after that, fetch() copies it on demand. A fake host stands in for the RAM
// tier so that "in memory now" is decided by the test, not by I/O timing. Emulated device.
#include "runtime/vram_expert_tier.h"

#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <vector>

#include "backend/backend.h"
#include "cpu/exec.h"
#include "runtime/device_placement.h"

namespace ktier::runtime {
namespace {

constexpr int64_t kLayers = 4, kExperts = 8, kTopK = 2, kRows = 4, kCols = 4;

// Every expert: three 4 x 4 F32 matrices in one host array, each element a distinct value (its
// index), so bytes copied from the wrong expert, matrix or slot are seen. peek() succeeds only
// for the experts marked ready.
class FakeHost final : public model::ExpertSource {
 public:
  FakeHost() : data_(static_cast<size_t>(kLayers * kExperts * 3 * kRows * kCols)) {
    for (size_t i = 0; i < data_.size(); ++i) data_[i] = static_cast<float>(i);
  }
  Status fetch(int64_t layer, std::span<const int32_t> ids, model::ExpertWeights* out) override {
    for (size_t i = 0; i < ids.size(); ++i) out[i] = view(layer, ids[i]);
    return Status::ok();
  }
  uint64_t bytes_fetched() const override { return 0; }
  int64_t max_batch() const override { return kTopK; }
  bool peek(int64_t layer, int32_t id, model::ExpertWeights* out) override {
    if (!ready.count(layer * kExperts + id)) return false;
    *out = view(layer, id);
    return true;
  }
  void set_held_above(std::function<bool(int64_t, int32_t)> held) override {
    held_above = std::move(held);
  }
  std::set<int64_t> ready;  // layer * kExperts + id
  std::function<bool(int64_t, int32_t)> held_above;  // the tier's hook, while it lives

  // The host's matrix `m` (0 = w1, 1 = w2, 2 = w3) of expert `id` of `layer`, for comparing.
  std::vector<float> matrix(int64_t layer, int32_t id, int m) const {
    const float* p = data_.data() + ((layer * kExperts + id) * 3 + m) * kRows * kCols;
    return std::vector<float>(p, p + kRows * kCols);
  }

 private:
  model::ExpertWeights view(int64_t layer, int32_t id) const {
    const float* base = data_.data() + (layer * kExperts + id) * 3 * kRows * kCols;
    model::ExpertWeights w;
    for (int m = 0; m < 3; ++m) {
      cpu::WeightMatrix& x = m == 0 ? w.w1 : m == 1 ? w.w2 : w.w3;
      x = {cpu::WeightType::kF32, base + m * kRows * kCols, nullptr, kRows, kCols};
    }
    return w;
  }
  std::vector<float> data_;
};

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
  ASSERT_TRUE(be->synchronize().is_ok());
  for (int i = 0; i < kTopK; ++i) {
    for (int m = 0; m < 3; ++m) {
      const cpu::WeightMatrix& x = m == 0 ? out[i].w1 : m == 1 ? out[i].w2 : out[i].w3;
      std::vector<float> back(static_cast<size_t>(kRows * kCols), -1.0f);
      ASSERT_TRUE(be->download(back.data(), x.data, back.size() * sizeof(float)).is_ok());
      EXPECT_EQ(back, host.matrix(2, routed2[i], m)) << "expert " << routed2[i] << " matrix " << m;
    }
  }
  tier->reset();
  EXPECT_FALSE(host.held_above) << "the hook must not outlive the tier";
}

}  // namespace
}  // namespace ktier::runtime
