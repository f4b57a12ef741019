// Router lookahead scores a later layer's router on the residual stream as the Model holds it at
// the moment of the prediction (docs/STRATA.md §4, §7). Two moments are exact enough to recompute
// here from the observed P with the same kernels:
//  * at the dense layer 0 the part of the FFN that needs no routing is the whole MLP, so the
//    depth-1 prediction for layer 1 is layer 1's router on AttnRes([embedding, P after layer 0]);
//    a predictor that left the MLP out would score [embedding, attention output] instead;
//  * the refresh (depth 0) for layer 2 comes after layer 1's FFN, so it is layer 2's router on
//    AttnRes([embedding, P after layer 1]) — the routed experts of layer 1 included.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "model/blocks.h"
#include "model/model.h"
#include "tests/model/model_fixture.h"

namespace ktier::test {
namespace {

class Recorder final : public model::LayerObserver, public model::LookaheadObserver {
 public:
  void after_layer(int64_t layer, const float* P, int64_t T, int64_t E) override {
    p_after[layer].assign(P, P + T * E);
  }
  void on_prediction(int64_t layer, int depth, int64_t, const int32_t* ids, const float*,
                     int64_t T, int k) override {
    predicted[{layer, depth}].assign(ids, ids + T * k);
  }
  std::map<int64_t, std::vector<float>> p_after;
  std::map<std::pair<int64_t, int>, std::vector<int32_t>> predicted;
};

// Layer `target`'s router on AttnRes([embedding, P]), top-k per token highest weight first
// (ties: lower id), as predictions are ordered.
std::vector<int32_t> expected_prediction(runtime::Engine& engine, model::ModelWeights& w,
                                         const std::vector<int32_t>& prompt, int64_t target,
                                         const std::vector<float>& P) {
  const format::ModelConfig& c = engine.checkpoint().config();
  const int64_t T = static_cast<int64_t>(prompt.size()), E = c.hidden_size, Ne = c.num_experts;
  const int k = static_cast<int>(c.num_experts_per_token);
  const model::LayerWeights& lw = w.layer(target);
  auto be = backend::make_cpu_backend(engine.exec());
  std::vector<float> emb(static_cast<size_t>(T * E)), mixed(emb.size()), x(emb.size());
  std::vector<float> routing_block(static_cast<size_t>(model::RoutingBuffers::floats(T, k, Ne)));
  const model::RoutingBuffers routing{routing_block.data(), T, k, Ne};
  EXPECT_TRUE(w.embed(prompt, emb.data()).is_ok());
  const float* sources[] = {emb.data(), P.data()};
  EXPECT_TRUE(be->attnres(sources, 2, E, T, E, lw.f_mlp.data(), c.rms_norm_eps, mixed.data()).is_ok());
  EXPECT_TRUE(be->rmsnorm(mixed.data(), lw.post_attention_norm.data(), T, E, c.rms_norm_eps, x.data()).is_ok());
  const cpu::LinearJob router{lw.moe.router, x.data(), T, routing.logits()};
  EXPECT_TRUE(be->linear(&router, 1).is_ok());
  std::vector<int32_t> out(static_cast<size_t>(T * k));
  model::Routing chosen;
  EXPECT_TRUE(model::select_experts(lw.moe, c, routing, chosen, *be).is_ok());
  const std::vector<int32_t>& ids = chosen.ids;
  const std::vector<float>& weights = chosen.weights;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int> order(static_cast<size_t>(k));
    std::iota(order.begin(), order.end(), 0);
    const int32_t* id = ids.data() + t * k;
    const float* wt = weights.data() + t * k;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return wt[a] != wt[b] ? wt[a] > wt[b] : id[a] < id[b];
    });
    for (int i = 0; i < k; ++i) out[static_cast<size_t>(t * k + i)] = id[order[static_cast<size_t>(i)]];
  }
  return out;
}

TEST(Lookahead, DenseLayerPredictionSeesItsMlpAndTheRefreshSeesTheRoutedExperts) {
  const Variant& v = variants()[0];
  auto engine = open_engine(v);
  ASSERT_TRUE(engine);
  const format::ModelConfig& c = engine->checkpoint().config();
  ASSERT_EQ(c.first_k_dense_replace, 1) << "the test needs layer 0 dense, layers 1, 2 MoE";
  ASSERT_GE(c.num_hidden_layers, 3);
  ASSERT_TRUE(c.is_boundary(0));
  ASSERT_FALSE(c.is_boundary(1) || c.is_boundary(2)) << "the bank must stay [embedding]";
  const std::vector<int32_t> prompt = golden_prompt(v);
  const int64_t T = static_cast<int64_t>(prompt.size()), E = c.hidden_size;
  const int k = static_cast<int>(c.num_experts_per_token);

  Recorder rec;
  engine->model().set_layer_observer(&rec);
  engine->model().add_lookahead_observer(&rec);
  (void)eval_logits(*engine, prompt, T);
  engine->model().set_layer_observer(nullptr);
  engine->model().remove_lookahead_observer(&rec);
  ASSERT_EQ(rec.p_after[0].size(), static_cast<size_t>(T * E));
  ASSERT_EQ(rec.p_after[1].size(), static_cast<size_t>(T * E));
  const std::vector<int32_t>& dense_prediction = rec.predicted[{0, 1}];
  const std::vector<int32_t>& refresh = rec.predicted[{2, 0}];
  ASSERT_EQ(dense_prediction.size(), static_cast<size_t>(T * k));
  ASSERT_EQ(refresh.size(), static_cast<size_t>(T * k)) << "no refresh for layer 2";
  EXPECT_EQ(rec.predicted.count({1, 0}), 1u) << "layer 1 (after the dense layer) is refreshed too";
  EXPECT_EQ(rec.predicted.count({0, 0}), 0u) << "nothing precedes layer 0";

  auto w = model::ModelWeights::load(engine->checkpoint());
  ASSERT_TRUE(w.is_ok()) << w.status().message();
  EXPECT_EQ(dense_prediction, expected_prediction(*engine, **w, prompt, 1, rec.p_after[0]));
  EXPECT_EQ(refresh, expected_prediction(*engine, **w, prompt, 2, rec.p_after[1]));
  // The refresh must differ from the depth-1 prediction somewhere, or it would not be tested
  // that it sees layer 1's routed experts.
  const std::vector<int32_t>& early = rec.predicted[{1, 1}];
  EXPECT_NE(refresh, early);
}

// The checkpoint's experts, recording the order of the calls a tier with prefetch depends on:
// 'p' begin_pass, 'l' begin_layer.
class CallRecorder final : public model::ExpertSource {
 public:
  explicit CallRecorder(const format::Checkpoint& ckpt) : inner_(ckpt) {}
  Status fetch(int64_t layer, std::span<const int32_t> ids, model::ExpertWeights* out) override {
    return inner_.fetch(layer, ids, out);
  }
  void begin_layer(int64_t, int64_t, const int32_t*, int64_t, int) override { calls += 'l'; }
  void begin_pass() override { calls += 'p'; }
  uint64_t bytes_fetched() const override { return inner_.bytes_fetched(); }
  std::string calls;

 private:
  model::CheckpointExpertSource inner_;
};

// Each forward() tells its ExpertSource a pass begins before any layer of it: the tiers leave
// what a pass that ended early (a failed read) queued or read ahead to no later pass.
TEST(Lookahead, EachForwardBeginsAPassBeforeItsLayers) {
  auto engine = open_engine(variants()[0]);
  ASSERT_TRUE(engine);
  const format::Checkpoint& ckpt = engine->checkpoint();
  const format::ModelConfig& c = ckpt.config();
  auto w = model::ModelWeights::load(ckpt);
  ASSERT_TRUE(w.is_ok()) << w.status().message();
  CallRecorder experts(ckpt);
  auto be = backend::make_cpu_backend(engine->exec());
  model::Model m(**w, &experts, *be);
  auto seq = m.new_sequence();
  ASSERT_TRUE(seq.is_ok()) << seq.status().message();
  const std::vector<int32_t> prompt = golden_prompt(variants()[0]);
  ASSERT_GE(prompt.size(), 2u);
  const std::span<const int32_t> ids(prompt);
  ASSERT_TRUE(m.forward(ids.first(1), *seq, model::LogitRows::kNone, nullptr).is_ok());
  ASSERT_TRUE(m.forward(ids.subspan(1), *seq, model::LogitRows::kNone, nullptr).is_ok());
  const std::string pass = "p" + std::string(static_cast<size_t>(c.num_moe_layers()), 'l');
  EXPECT_EQ(experts.calls, pass + pass);
}

}  // namespace
}  // namespace ktier::test
