// The engine's own decoder layer against the conformance layer vectors (ops/layer_kda.json,
// ops/layer_mla.json; conformance README §5.12). tests/cpu/conformance_test.cpp runs the same
// vectors through a composition written in the test (tests/cpu/compose.cpp); this file runs the
// code that decodes: the layer's tensors under their released names go through bind_layer
// (K3-MODEL §4), the MANIFEST config through parse_model_config, and the layer through
// Model::layer (AttnRes mixes, norms, the KDA or MLA block, shared and routed experts from an
// ExpertSource), on every kernel set this CPU runs.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cpu/thread_pool.h"
#include "format/config.h"
#include "format/checkpoint.h"
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

// The layer's tensors as f32 in memory, handed out under their released names.
class LayerTensors {
 public:
  LayerTensors(const Fixture& fx, int64_t layer) : fx_(fx), layer_(layer) {}
  model::TensorLookup lookup() {
    return [this](const std::string& name) -> Result<model::TensorView> {
      const std::string key = fixture_key(name, layer_);
      if (key.empty() || !fx_.has(key)) return Status::usage("the layer vectors lack " + name);
      const std::vector<float>& v = f32(key);
      return model::TensorView{DType::kF32, static_cast<int64_t>(v.size()), v.data(), ""};
    };
  }
  // The tensor `key` as f32, converted once and held (views into it stay valid).
  std::vector<float>& f32(const std::string& key) {
    std::vector<float>& v = held_[key];
    if (v.empty()) v = fx_.f32(key);
    return v;
  }

 private:
  const Fixture& fx_;
  int64_t layer_;
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
    const nlohmann::json cfg = Fixture::load_op("MANIFEST").json().at("config");
    auto parsed = format::parse_model_config(cfg, "MANIFEST.json config");
    ASSERT_TRUE(parsed.is_ok()) << parsed.status().message();
    const format::ModelConfig& c = parsed.value();
    const int64_t l = static_cast<int64_t>(fx.number("layer_idx"));
    ASSERT_EQ(c.is_mla(l), fx.json().at("is_mla").get<bool>());
    ASSERT_EQ(c.attn_res_block_size, static_cast<int64_t>(fx.number("attn_res_block_size")));
    ASSERT_FALSE(c.is_dense(l));

    LayerTensors tensors(fx, l);
    auto bound = model::bind_layer(c, l, tensors.lookup());
    ASSERT_TRUE(bound.is_ok()) << bound.status().message();
    const model::LayerWeights& lw = bound.value();
    FixtureExperts experts(tensors, c);
    ConfigOnlyTrunk trunk(c);
    cpu::ThreadPool pool(2);
    const cpu::Exec ex{&pool, GetParam()};  // outlives the backend
    auto be = backend::make_cpu_backend(ex);
    model::Model m(trunk, &experts, *be);

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

}  // namespace
}  // namespace ktier::test
