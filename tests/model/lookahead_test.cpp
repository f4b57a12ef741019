// Router lookahead scores the next layer on the residual stream as it stands once the part of
// the FFN that needs no routing has been added (docs/STRATA.md §7). At the dense layer 0 that
// part is the whole MLP, so the prediction for layer 1 must be exactly layer 1's router applied
// to AttnRes([embedding, P after layer 0]) — recomputed here from the observed P with the same
// kernels. A predictor that left the MLP out would score [embedding, attention output] instead.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "model/blocks.h"
#include "model/model.h"
#include "tests/model/model_fixture.h"

namespace ktier::test {
namespace {

class FirstLayerRecorder final : public model::LayerObserver, public model::LookaheadObserver {
 public:
  void after_layer(int64_t layer, const float* P, int64_t T, int64_t E) override {
    if (layer == 0) p_after_0.assign(P, P + T * E);
  }
  void on_prediction(int64_t layer, int depth, int64_t, const int32_t* ids, const float*,
                     int64_t T, int k) override {
    if (layer == 0 && depth == 1) predicted.assign(ids, ids + T * k);
  }
  std::vector<float> p_after_0;
  std::vector<int32_t> predicted;
};

TEST(Lookahead, DenseLayerPredictionSeesItsMlp) {
  const Variant& v = variants()[0];
  auto engine = open_engine(v);
  ASSERT_TRUE(engine);
  const format::ModelConfig& c = engine->checkpoint().config();
  ASSERT_EQ(c.first_k_dense_replace, 1) << "the test needs layer 0 dense, layer 1 MoE";
  ASSERT_TRUE(c.is_boundary(0));
  const std::vector<int32_t> prompt = golden_prompt(v);
  const int64_t T = static_cast<int64_t>(prompt.size()), E = c.hidden_size, Ne = c.num_experts;
  const int k = static_cast<int>(c.num_experts_per_token);

  FirstLayerRecorder rec;
  engine->model().set_layer_observer(&rec);
  engine->model().add_lookahead_observer(&rec);
  (void)eval_logits(*engine, prompt, T);
  engine->model().set_layer_observer(nullptr);
  engine->model().remove_lookahead_observer(&rec);
  ASSERT_EQ(rec.p_after_0.size(), static_cast<size_t>(T * E));
  ASSERT_EQ(rec.predicted.size(), static_cast<size_t>(T * k));

  // Layer 0 is a boundary: the bank is [embedding], P = attention + MLP.
  auto w = model::ModelWeights::load(engine->checkpoint());
  ASSERT_TRUE(w.is_ok()) << w.status().message();
  const model::LayerWeights& l1 = (*w)->layer(1);
  auto be = backend::make_cpu_backend(engine->exec());
  std::vector<float> emb(static_cast<size_t>(T * E)), mixed(emb.size()), x(emb.size());
  std::vector<float> logits(static_cast<size_t>(T * Ne));
  std::vector<float> ids_dev(static_cast<size_t>(T * k)), weights_dev(ids_dev.size());
  ASSERT_TRUE((*w)->embed(prompt, emb.data()).is_ok());
  const float* sources[] = {emb.data(), rec.p_after_0.data()};
  ASSERT_TRUE(be->attnres(sources, 2, E, T, E, l1.f_mlp.data(), c.rms_norm_eps, mixed.data()).is_ok());
  ASSERT_TRUE(be->rmsnorm(mixed.data(), l1.post_attention_norm.data(), T, E, c.rms_norm_eps, x.data()).is_ok());
  const cpu::LinearJob router{l1.moe.router, x.data(), T, logits.data()};
  ASSERT_TRUE(be->linear(&router, 1).is_ok());
  std::vector<int32_t> ids;
  std::vector<float> weights;
  ASSERT_TRUE(model::select_experts(l1.moe, c, logits.data(), T, ids_dev.data(), weights_dev.data(),
                                    ids, weights, *be)
                  .is_ok());
  for (int64_t t = 0; t < T; ++t) {  // predictions come highest weight first (ties: lower id)
    std::vector<int> order(static_cast<size_t>(k));
    std::iota(order.begin(), order.end(), 0);
    const int32_t* id = ids.data() + t * k;
    const float* wt = weights.data() + t * k;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return wt[a] != wt[b] ? wt[a] > wt[b] : id[a] < id[b];
    });
    for (int i = 0; i < k; ++i)
      EXPECT_EQ(rec.predicted[static_cast<size_t>(t * k + i)], id[order[static_cast<size_t>(i)]])
          << "token " << t << " rank " << i;
  }
}

}  // namespace
}  // namespace ktier::test
