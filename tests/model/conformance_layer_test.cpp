// The engine's own decoder layer against the conformance layer vectors (ops/layer_kda.json,
// ops/layer_mla.json; conformance README §5.12). tests/cpu/conformance_test.cpp runs the same
// vectors through a composition written in the test (tests/cpu/compose.cpp); this file runs the
// code that decodes: the layer's tensors under their released names go through bind_layer
// (K3-MODEL §4), the MANIFEST config through parse_model_config, and the layer through
// Model::layer (AttnRes mixes, norms, the KDA or MLA block, shared and routed experts from an
// ExpertSource), on every kernel set this CPU runs. The MLA, MoE and KDA op vectors
// (ops/mla.json, ops/moe.json, ops/kda_layer*.json) go through the engine's blocks the same way.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cpu/thread_pool.h"
#include "format/config.h"
#include "format/checkpoint.h"
#include "model/blocks.h"
#include "model/model.h"
#include "model/weights.h"
#include "tests/cpu/test_support.h"

namespace ktier::test {
namespace {

using cpu::test::Fixture;
using cpu::test::Tensor;

// README §5 margins are for float64 vs a naive f32 run; a sound f32 order lands near them.
constexpr double kMarginSlack = 1.5;

// The fixture's flat key of a released tensor name of layer l ("language_model.model.layers.1.
// self_attn.q_proj.weight" -> "self_attn_q_proj_weight"; the MoE's names as the fixture spells
// them). Empty for a name the layer vectors do not hold.
std::string fixture_key(const std::string& name, int64_t l) {
  const std::string prefix = format::layer_prefix(l);
  if (name.rfind(prefix, 0) != 0) return "";
  std::string rest = name.substr(prefix.size());
  static const std::map<std::string, std::string> moe = {
      {"block_sparse_moe.gate.weight", "mlp_gate_weight"},
      {"block_sparse_moe.gate.e_score_correction_bias", "mlp_e_score_correction_bias"},
      {"block_sparse_moe.routed_expert_down_proj.weight", "mlp_down_weight"},
      {"block_sparse_moe.routed_expert_up_proj.weight", "mlp_up_weight"},
      {"block_sparse_moe.routed_expert_norm.weight", "mlp_norm_weight"},
      {"block_sparse_moe.shared_experts.gate_proj.weight", "mlp_shared_w1_weight"},
      {"block_sparse_moe.shared_experts.up_proj.weight", "mlp_shared_w3_weight"},
      {"block_sparse_moe.shared_experts.down_proj.weight", "mlp_shared_w2_weight"}};
  if (auto it = moe.find(rest); it != moe.end()) return it->second;
  if (rest.rfind("block_sparse_moe.", 0) == 0) return "";
  for (char& ch : rest)
    if (ch == '.') ch = '_';
  return rest;
}

// The layer's tensors as f32 in memory, handed out under their released names: from a layer
// vector, or from op vectors of one block each (ops/mla.json, ops/moe.json, whose keys lack the
// "self_attn_" / "mlp_" of the layer vectors), where a tensor no op vector holds (the norms and
// AttnRes vectors, [E] each, which the blocks do not read) is E ones.
class LayerTensors {
 public:
  LayerTensors(const Fixture& fx, int64_t layer) : fixtures_{&fx}, layer_(layer) {}
  LayerTensors(std::vector<const Fixture*> ops, int64_t layer, int64_t E)
      : fixtures_(std::move(ops)), layer_(layer), ones_(static_cast<size_t>(E), 1.0f) {}
  model::TensorLookup lookup() {
    return [this](const std::string& name) -> Result<model::TensorView> {
      const std::string key = fixture_key(name, layer_);
      if (key.empty() || (!held(key) && !(!ones_.empty() && read_by_no_block(key))))
        return Status::usage("the layer vectors lack " + name);
      const std::vector<float>& v = held(key) ? f32(key) : ones_;
      return model::TensorView{DType::kF32, static_cast<int64_t>(v.size()), v.data(), ""};
    };
  }
  // The tensor `key` (a layer vector's key) as f32, converted once and held (views into it stay
  // valid).
  std::vector<float>& f32(const std::string& key) {
    std::vector<float>& v = held_[key];
    if (v.empty()) {
      const Fixture* fx = holder(key);
      EXPECT_NE(fx, nullptr) << key;
      if (fx != nullptr) v = fx->f32(field(*fx, key));
    }
    return v;
  }

 private:
  bool held(const std::string& key) const { return holder(key) != nullptr; }
  // The layer's norms and AttnRes vectors: what an op vector lacks and its block does not read.
  static bool read_by_no_block(const std::string& key) {
    const auto ends_with = [&](const std::string& tail) {
      return key.size() >= tail.size() &&
             key.compare(key.size() - tail.size(), tail.size(), tail) == 0;
    };
    return key == "input_layernorm_weight" || key == "post_attention_layernorm_weight" ||
           ends_with("_res_norm_weight") || ends_with("_res_proj_weight");
  }
  std::string op_key(const std::string& key) const {
    if (ones_.empty()) return key;
    for (const char* prefix : {"self_attn_", "mlp_"})
      if (key.rfind(prefix, 0) == 0) return key.substr(std::string(prefix).size());
    return key;
  }
  // The field of `fx` holding `key`: its op key, or the short name the KDA op vectors
  // (ops/kda_layer*.json) give it ("q_proj" for "q_proj_weight"); "" for none.
  std::string field(const Fixture& fx, const std::string& key) const {
    const std::string k = op_key(key);
    if (fx.has(k)) return k;
    static const std::map<std::string, std::string> kda_short = {
        {"q_proj_weight", "q_proj"},     {"k_proj_weight", "k_proj"},
        {"v_proj_weight", "v_proj"},     {"g_proj_weight", "g_proj"},
        {"o_proj_weight", "o_proj"},     {"b_proj_weight", "b_proj"},
        {"f_a_proj_weight", "f_a"},      {"f_b_proj_weight", "f_b"},
        {"q_conv1d_weight", "q_conv"},   {"k_conv1d_weight", "k_conv"},
        {"v_conv1d_weight", "v_conv"},   {"o_norm_weight", "o_norm"}};
    const auto it = kda_short.find(k);
    return !ones_.empty() && it != kda_short.end() && fx.has(it->second) ? it->second : "";
  }
  const Fixture* holder(const std::string& key) const {
    for (const Fixture* fx : fixtures_)
      if (!field(*fx, key).empty()) return fx;
    return nullptr;
  }

  std::vector<const Fixture*> fixtures_;
  int64_t layer_;
  std::vector<float> ones_;  // empty for a layer vector
  std::map<std::string, std::vector<float>> held_;
};

// The fixture's plain-f32 routed experts (mlp_experts_<e>_w{1,2,3}_weight).
class FixtureExperts final : public model::ExpertSource {
 public:
  FixtureExperts(LayerTensors& t, const format::ModelConfig& c) : t_(t), c_(c) {}
  Status fetch(int64_t, std::span<const int32_t> ids, model::ExpertWeights* out) override {
    const int64_t I = c_.moe_intermediate_size, lat = c_.routed_expert_hidden_size;
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::string p = "mlp_experts_" + std::to_string(ids[i]) + "_";
      out[i].w1 = {cpu::WeightType::kF32, t_.f32(p + "w1_weight").data(), nullptr, I, lat};
      out[i].w3 = {cpu::WeightType::kF32, t_.f32(p + "w3_weight").data(), nullptr, I, lat};
      out[i].w2 = {cpu::WeightType::kF32, t_.f32(p + "w2_weight").data(), nullptr, lat, I};
      fetched_ += 3 * static_cast<uint64_t>(I * lat) * sizeof(float);
    }
    return Status::ok();
  }
  uint64_t bytes_fetched() const override { return fetched_; }

 private:
  LayerTensors& t_;
  const format::ModelConfig& c_;
  uint64_t fetched_ = 0;
};

// Model::layer reads only the config through its TrunkSource.
class ConfigOnlyTrunk final : public model::TrunkSource {
 public:
  explicit ConfigOnlyTrunk(const format::ModelConfig& c) : c_(c) {}
  const format::ModelConfig& config() const override { return c_; }
  Result<const model::LayerWeights*> acquire_layer(int64_t) override {
    return Status::runtime("not used by these tests");
  }
  void release_layer(int64_t) override {}
  const model::HeadWeights& head() const override { return head_; }
  Status embed(std::span<const int32_t>, float*) override {
    return Status::runtime("not used by these tests");
  }

 private:
  const format::ModelConfig& c_;
  model::HeadWeights head_;
};

// A Model over the fixture's experts on one kernel set, for running a bound layer or its blocks.
struct Harness {
  Harness(LayerTensors& t, const format::ModelConfig& c, cpu::Isa isa)
      : experts(t, c), trunk(c), pool(2), ex{&pool, isa}, be(backend::make_cpu_backend(ex)),
        model(trunk, &experts, *be) {}
  FixtureExperts experts;
  ConfigOnlyTrunk trunk;
  cpu::ThreadPool pool;
  cpu::Exec ex;  // outlives the backend
  std::unique_ptr<backend::Backend> be;
  model::Model model;
};

// The MANIFEST's config: the shapes the layer and op vectors share.
Result<format::ModelConfig> manifest_config() {
  return format::parse_model_config(Fixture::load_op("MANIFEST").json().at("config"),
                                    "MANIFEST.json config");
}

// Layer `l` of `c` bound by bind_layer from `tensors`, with a harness that runs it on `isa`.
// REQUIRES weights.is_ok() before harness is used (ASSERTed by each test).
struct BoundLayer {
  BoundLayer(LayerTensors t, const format::ModelConfig& c, int64_t l, cpu::Isa isa)
      : tensors(std::move(t)), weights(model::bind_layer(c, l, tensors.lookup())),
        harness(tensors, c, isa) {}
  LayerTensors tensors;
  Result<model::LayerWeights> weights;
  Harness harness;
};

class ConformanceLayer : public ::testing::TestWithParam<cpu::Isa> {
 protected:
  void SetUp() override {
    if (!cpu::isa_supported(GetParam())) GTEST_SKIP() << cpu::test::skip_reason(GetParam());
  }

  // Runs tokens [t0, t1) of the fixture through layer `l` from the fixture's bank and a fresh
  // state carried in `seq`: P after the layer [t1 - t0, E], the bank as it leaves the layer.
  struct Out {
    std::vector<float> P;
    std::vector<std::vector<float>> bank;
  };
  static Out run(model::Model& m, const model::LayerWeights& lw, int64_t l,
                 model::SequenceState& seq, const Fixture& fx, int64_t t0, int64_t t1) {
    const Tensor in = fx.tensor("in"), bank_in = fx.tensor("block_residual_in");  // [T, m, E]
    const int64_t E = in.shape[2], nb = bank_in.shape[1], T = t1 - t0;
    const std::vector<float> in_f = in.f32(), bank_f = bank_in.f32();
    backend::Backend& be = m.backend();
    auto stream = m.new_stream(T);
    EXPECT_TRUE(stream.is_ok());
    model::ResidualStream s = std::move(stream).value();
    EXPECT_TRUE(be.upload(s.P.get(), in_f.data() + t0 * E, T * E * sizeof(float)).is_ok());
    for (int64_t i = 0; i < nb; ++i) {
      std::vector<float> entry(static_cast<size_t>(T * E));
      for (int64_t t = t0; t < t1; ++t)
        std::copy_n(bank_f.begin() + (t * nb + i) * E, E, entry.begin() + (t - t0) * E);
      auto buf = backend::BackendBuffer::allocate(be, entry.size() * sizeof(float));
      EXPECT_TRUE(buf.is_ok());
      s.bank.push_back(std::move(buf).value());
      EXPECT_TRUE(be.upload(s.bank.back().get(), entry.data(), entry.size() * sizeof(float)).is_ok());
    }
    const Status st = m.layer(l, lw, seq.layers[static_cast<size_t>(l)], seq.n_tokens, s);
    EXPECT_TRUE(st.is_ok()) << st.message();
    seq.n_tokens += T;
    Out o;
    o.P.resize(static_cast<size_t>(T * E));
    EXPECT_TRUE(be.download(o.P.data(), s.P.get(), o.P.size() * sizeof(float)).is_ok());
    for (const auto& b : s.bank) {
      o.bank.emplace_back(static_cast<size_t>(T * E));
      EXPECT_TRUE(be.download(o.bank.back().data(), b.get(), T * E * sizeof(float)).is_ok());
    }
    return o;
  }

  void run_case(const char* name, double readme_max, const char* readme) {
    const Fixture fx = Fixture::load_op(name);
    auto parsed = manifest_config();
    ASSERT_TRUE(parsed.is_ok()) << parsed.status().message();
    const format::ModelConfig& c = parsed.value();
    const int64_t l = static_cast<int64_t>(fx.number("layer_idx"));
    ASSERT_EQ(c.is_mla(l), fx.json().at("is_mla").get<bool>());
    ASSERT_EQ(c.attn_res_block_size, static_cast<int64_t>(fx.number("attn_res_block_size")));
    ASSERT_FALSE(c.is_dense(l));

    BoundLayer layer(LayerTensors(fx, l), c, l, GetParam());
    ASSERT_TRUE(layer.weights.is_ok()) << layer.weights.status().message();
    const model::LayerWeights& lw = layer.weights.value();
    model::Model& m = layer.harness.model;

    const int64_t T = fx.tensor("in").shape[1], E = c.hidden_size;
    auto seq = m.new_sequence(T);
    ASSERT_TRUE(seq.is_ok());
    const Out all = run(m, lw, l, seq.value(), fx, 0, T);
    const auto r = cpu::test::check_tolerance(all.P, fx.tensor("out").data);
    cpu::test::report_ratio(std::string(name) + " through Model::layer", r, readme);
    EXPECT_LE(r.worst_ratio, 1.0);
    EXPECT_LE(r.worst_ratio, kMarginSlack * readme_max) << "far above the README's " << readme;

    // The bank as it leaves the layer, bit for bit (a boundary layer appends the incoming P).
    const Tensor want_bank = fx.tensor("block_residual_out");  // [T, m', E]
    const int64_t m_out = want_bank.shape[1];
    ASSERT_EQ(static_cast<int64_t>(all.bank.size()), m_out);
    const std::vector<float> want_f = want_bank.f32();
    for (int64_t i = 0; i < m_out; ++i)
      for (int64_t t = 0; t < T; ++t)
        ASSERT_EQ(cpu::test::compare_bits(all.bank[static_cast<size_t>(i)].data() + t * E,
                                          want_f.data() + (t * m_out + i) * E, E),
                  "")
            << "bank entry " << i << ", token " << t;

    // One token at a time through the state: the same bytes as the chunk.
    auto seq1 = m.new_sequence(T);
    ASSERT_TRUE(seq1.is_ok());
    for (int64_t t = 0; t < T; ++t) {
      const Out one = run(m, lw, l, seq1.value(), fx, t, t + 1);
      EXPECT_EQ(cpu::test::compare_bits(one.P.data(), all.P.data() + t * E, E), "")
          << "token " << t;
    }
  }
};
INSTANTIATE_TEST_SUITE_P(Isas, ConformanceLayer, ::testing::ValuesIn(cpu::test::kAllIsas),
                         cpu::test::IsaParamName());

TEST_P(ConformanceLayer, KdaLayer) { run_case("layer_kda", 0.63, "0.46 / 0.63"); }
TEST_P(ConformanceLayer, MlaLayer) { run_case("layer_mla", 0.24, "0.24 / 0.24"); }

// The engine's own MLA and MoE blocks (model::mla_block, moe_block) on the op vectors
// ops/mla.json (README §5.9: absorbed form, prefill 3 then 3 decode steps) and ops/moe.json
// (§5.11: outputs up to |177|, the scaled rule), bound by bind_layer as the MANIFEST config's
// first MLA layer, whose shapes they share. tests/cpu/conformance_test.cpp runs the same vectors
// through the test's own composition (tests/cpu/compose.cpp).
TEST_P(ConformanceLayer, MlaAndMoeBlocksOnTheOpVectors) {
  const Fixture mla = Fixture::load_op("mla"), moe = Fixture::load_op("moe");
  auto parsed = manifest_config();
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().message();
  const format::ModelConfig& c = parsed.value();
  int64_t l = 0;
  while (l < c.num_hidden_layers && !c.is_mla(l)) ++l;
  ASSERT_LT(l, c.num_hidden_layers);
  ASSERT_FALSE(c.is_dense(l));
  ASSERT_EQ(static_cast<int64_t>(mla.number("n_heads")), c.num_attention_heads);
  ASSERT_EQ(static_cast<int64_t>(moe.number("n_experts")), c.num_experts);
  ASSERT_EQ(static_cast<int64_t>(moe.number("top_k")), c.num_experts_per_token);
  ASSERT_EQ(moe.number("routed_scale"), c.routed_scaling_factor);
  ASSERT_EQ(moe.number("rms_eps"), c.rms_norm_eps);

  BoundLayer layer(LayerTensors({&mla, &moe}, l, c.hidden_size), c, l, GetParam());
  ASSERT_TRUE(layer.weights.is_ok()) << layer.weights.status().message();
  const model::LayerWeights& lw = layer.weights.value();
  Harness& h = layer.harness;
  model::Model& m = h.model;
  const int64_t E = c.hidden_size;

  {  // MLA: the whole prompt, then prefill 3 and decode steps through the cache
    const std::vector<float> x = mla.tensor("in").f32();
    const int64_t T = static_cast<int64_t>(x.size()) / E;
    auto all = m.new_sequence(T), split = m.new_sequence(T);
    ASSERT_TRUE(all.is_ok() && split.is_ok());
    model::MlaCache& cache = all->layers[static_cast<size_t>(l)].mla;
    std::vector<float> out = cpu::test::poisoned(T * E), out2 = cpu::test::poisoned(T * E);
    ASSERT_TRUE(model::mla_block(lw.mla, c, x.data(), T, cache, out.data(), *h.be).is_ok());
    const auto r = cpu::test::check_tolerance(out, mla.tensor("out").data);
    cpu::test::report_ratio("mla through model::mla_block", r, "0.09 / 0.13 (0.12 with 1e-6)");
    EXPECT_LE(r.worst_ratio, 1.0);
    EXPECT_LE(r.worst_ratio, kMarginSlack * 0.13) << "far above the README's 0.13";
    const std::vector<float> latent(cache.c.data(), cache.c.data() + cache.c.size());
    // Caps of the float64 oracle's margins (the README gives none), as the kernels' test.
    EXPECT_LE(cpu::test::check_tolerance(latent, mla.tensor("kv_latent").data).worst_ratio,
              kMarginSlack * 0.019);
    const std::vector<float> rope(cache.r.data(), cache.r.data() + cache.r.size());
    EXPECT_LE(cpu::test::check_tolerance(rope, mla.tensor("k_rope").data).worst_ratio,
              kMarginSlack * 0.028);
    model::MlaCache& cache2 = split->layers[static_cast<size_t>(l)].mla;
    ASSERT_TRUE(model::mla_block(lw.mla, c, x.data(), 3, cache2, out2.data(), *h.be).is_ok());
    for (int64_t t = 3; t < T; ++t)
      ASSERT_TRUE(model::mla_block(lw.mla, c, x.data() + t * E, 1, cache2, out2.data() + t * E,
                                   *h.be).is_ok());
    EXPECT_EQ(cpu::test::compare_bits(out.data(), out2.data(), T * E), "");
    ASSERT_EQ(cache2.c.size(), cache.c.size());
    EXPECT_EQ(cpu::test::compare_bits(cache.c.data(), cache2.c.data(), cache.c.size()), "");
  }
  {  // MoE with the shared expert: the whole prompt, then one token at a time
    const std::vector<float> x = moe.tensor("in").f32();
    const int64_t T = static_cast<int64_t>(x.size()) / E;
    std::vector<float> shared = cpu::test::poisoned(T * E), out = cpu::test::poisoned(T * E);
    std::vector<float> out1 = cpu::test::poisoned(T * E);
    ASSERT_TRUE(lw.moe.has_shared);
    ASSERT_TRUE(model::glu_mlp(lw.moe.shared, c, x.data(), T, shared.data(), *h.be).is_ok());
    ASSERT_TRUE(model::moe_block(lw.moe, c, l, 0, h.experts, nullptr, x.data(), shared.data(), T,
                                 out.data(), *h.be).is_ok());
    const std::vector<double> want = moe.tensor("out").data;
    double max_want = 0.0;
    for (const double v : want) max_want = std::max(max_want, std::fabs(v));
    const auto r = cpu::test::check_tolerance(out, want, 1e-5 * std::max(1.0, max_want), 1e-4);
    cpu::test::report_ratio("moe through model::moe_block (scaled rule)", r, "0.016 / 0.018");
    EXPECT_LE(r.worst_ratio, 1.0);
    EXPECT_LE(r.worst_ratio, kMarginSlack * 0.018) << "far above the README's 0.018";
    std::vector<float> shared1 = cpu::test::poisoned(T * E);
    for (int64_t t = 0; t < T; ++t) {
      ASSERT_TRUE(model::glu_mlp(lw.moe.shared, c, x.data() + t * E, 1, shared1.data() + t * E,
                                 *h.be).is_ok());
      ASSERT_TRUE(model::moe_block(lw.moe, c, l, t, h.experts, nullptr, x.data() + t * E,
                                   shared1.data() + t * E, 1, out1.data() + t * E, *h.be).is_ok());
    }
    EXPECT_EQ(cpu::test::compare_bits(out.data(), out1.data(), T * E), "");
  }
}

// The engine's own KDA block (model::kda_block) on the KDA op vectors ops/kda_layer1.json and
// ops/kda_layer8.json (README §5.6: one token; 8 tokens, the margin 0.5), bound by bind_layer as
// the MANIFEST config's first KDA layer with a MoE (ops/moe.json's tensors, not run): the
// output and state within the rule and near the README's margins, one token at a time the same
// bytes. tests/cpu runs them through the test's own composition.
TEST_P(ConformanceLayer, KdaBlockOnTheOpVectors) {
  const Fixture moe = Fixture::load_op("moe");
  auto parsed = manifest_config();
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().message();
  const format::ModelConfig& c = parsed.value();
  int64_t l = 0;
  while (l < c.num_hidden_layers && (c.is_mla(l) || c.is_dense(l))) ++l;
  ASSERT_LT(l, c.num_hidden_layers);
  struct Case {
    const char* name;
    double readme_max, state_f64;  // README's larger margin; the float64 oracle's for the state
    const char* readme;
  };
  for (const Case& k : {Case{"kda_layer1", 0.034, 0.0055, "0.016 / 0.034"},
                        Case{"kda_layer8", 0.50, 0.017, "0.50 / 0.36"}}) {
    SCOPED_TRACE(k.name);
    const Fixture kda = Fixture::load_op(k.name);
    ASSERT_EQ(static_cast<int64_t>(kda.number("H")), c.kda_num_heads);
    ASSERT_EQ(static_cast<int64_t>(kda.number("d_k")), c.kda_head_dim);
    ASSERT_EQ(kda.number("rms_eps"), c.rms_norm_eps);
    ASSERT_EQ(kda.number("lower_bound"), c.gate_lower_bound);
    BoundLayer layer(LayerTensors({&kda, &moe}, l, c.hidden_size), c, l, GetParam());
    ASSERT_TRUE(layer.weights.is_ok()) << layer.weights.status().message();
    const model::LayerWeights& lw = layer.weights.value();
    Harness& h = layer.harness;
    const int64_t E = c.hidden_size;
    const std::vector<float> x = kda.tensor("in").f32();
    const int64_t T = static_cast<int64_t>(x.size()) / E;
    auto all = h.model.new_sequence(T), one = h.model.new_sequence(T);
    ASSERT_TRUE(all.is_ok() && one.is_ok());
    model::KdaState& st = all->layers[static_cast<size_t>(l)].kda;
    std::vector<float> out = cpu::test::poisoned(T * E), out1 = cpu::test::poisoned(T * E);
    ASSERT_TRUE(model::kda_block(lw.kda, c, x.data(), T, st, out.data(), *h.be).is_ok());
    const auto r = cpu::test::check_tolerance(out, kda.tensor("out").data);
    cpu::test::report_ratio(std::string(k.name) + " through model::kda_block", r, k.readme);
    EXPECT_LE(r.worst_ratio, 1.0);
    EXPECT_LE(r.worst_ratio, kMarginSlack * k.readme_max);
    const std::vector<float> S(st.S.data(), st.S.data() + st.S.size());
    EXPECT_LE(cpu::test::check_tolerance(S, kda.tensor("state_out").data).worst_ratio,
              kMarginSlack * k.state_f64);
    model::KdaState& st1 = one->layers[static_cast<size_t>(l)].kda;
    for (int64_t t = 0; t < T; ++t)
      ASSERT_TRUE(model::kda_block(lw.kda, c, x.data() + t * E, 1, st1, out1.data() + t * E,
                                   *h.be).is_ok());
    EXPECT_EQ(cpu::test::compare_bits(out.data(), out1.data(), T * E), "");
    EXPECT_EQ(cpu::test::compare_bits(st.S.data(), st1.S.data(), st.S.size()), "");
  }
}

}  // namespace
}  // namespace ktier::test
