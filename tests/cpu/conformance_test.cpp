// The cpu/ kernels against ../shared/conformance/ops (README §2 tolerance rules, §5 cases).
// Every case runs with each kernel set (scalar, AVX2, AVX-512; unsupported ones skip) on 2
// threads; the ISA and thread invariance of the same kernels is pinned separately
// (invariance_test.cpp: IsaEquivalence, ThreadInvariance). Each case prints
// its worst ratio next to the README's measured margin (float64 / naive f32).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "compose.h"
#include "cpu/kernels.h"
#include "test_support.h"

namespace ktier::cpu::test {
namespace {

struct Env {
  ThreadPool pool{2};
  Exec ex{&pool, best_isa()};  // ex.isa: set by the fixture to the test's kernel set
};
Env& env() {
  static Env e;
  return e;
}

// Every case runs once per kernel set (scalar, AVX2, AVX-512), skipped where unsupported.
class Conformance : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam())) GTEST_SKIP() << skip_reason(GetParam());
    env().ex.isa = GetParam();
  }
};
INSTANTIATE_TEST_SUITE_P(Isas, Conformance, ::testing::ValuesIn(kAllIsas), IsaParamName());

// README §5: "a margin far above these means a bug even if it is still under 1". So each case
// must pass its tolerance and also stay within kMarginSlack times the README's larger measured
// margin (float64 / naive f32), which leaves room for a different but sound rounding order (the
// kernels land at 0.9-1.07 of it). At 3 the cap was above 1 for kda_layer8 and layer_kda, so
// only the tolerance held them. Where the README gives no margin (KDA states, the MLA cache) the
// cap is of the float64 oracle's (tools/reference, whose other margins are the README's).
constexpr double kMarginSlack = 1.5;

void expect_case(const std::string& what, const ToleranceResult& r, double readme_max,
                 const std::string& readme_text) {
  report_ratio(what, r, readme_text);
  EXPECT_LE(r.worst_ratio, 1.0) << what;
  if (readme_max > 0) {
    EXPECT_LE(r.worst_ratio, kMarginSlack * readme_max)
        << what << ": far above the README's measured margin " << readme_text;
  }
}

TEST_P(Conformance, RmsNorm) {
  const Fixture fx = Fixture::load_op("rmsnorm");
  const Tensor in = fx.tensor("in");
  const std::vector<float> x = in.f32(), w = fx.f32("weight");
  std::vector<float> out = poisoned(static_cast<int64_t>(x.size()));
  rmsnorm(x.data(), w.data(), in.shape[0], in.shape[1], fx.number("eps"), out.data(), env().ex);
  const auto r = check_tolerance(out, fx.tensor("out").data);
  expect_case("rmsnorm", r, 0.006, "0.006 / 0.006");
}

TEST_P(Conformance, SituGlu) {
  const Fixture fx = Fixture::load_op("situ_glu");
  const GluHalves in = glu_halves(fx.tensor("in"));  // [6, 16]: a = cols 0..7, b = cols 8..15
  std::vector<float> out = poisoned(in.rows * in.half);
  situ_glu(in.a.data(), in.b.data(), in.rows * in.half, fx.number("beta"), fx.number("linear_beta"),
           out.data(), env().ex);
  const auto r = check_tolerance(out, fx.tensor("out").data);
  expect_case("situ_glu", r, 0.003, "0.003 / 0.003");
  float max_abs = 0.0f;
  for (float v : out) max_abs = std::max(max_abs, std::fabs(v));
  EXPECT_LE(max_abs, fx.number("max_abs") * (1.0 + 1e-6)) << "SiTU bound beta1*beta2 violated";
}

TEST_P(Conformance, ShortConvWithHistoryContinuation) {
  const Fixture fx = Fixture::load_op("shortconv");
  const int K = static_cast<int>(fx.number("kernel"));
  const int64_t C = static_cast<int64_t>(fx.number("channels"));
  const Tensor in = fx.tensor("in");  // [1, T, C]
  const int64_t T = in.shape[1];
  const std::vector<float> u = in.f32(), w = fx.f32("weight");
  std::vector<float> hist((K - 1) * C, 0.0f), out = poisoned(T * C);
  kda_short_conv(u.data(), T, C, w.data(), K, hist.data(), out.data(), env().ex);
  const auto r = check_tolerance(out, fx.tensor("out").data);
  expect_case("shortconv", r, 0.006, "0.006 / 0.006");
  // state_after [1, C, K-1] must equal the last K-1 pre-conv inputs exactly (ours is [K-1, C]).
  const std::vector<float> want_state = fx.f32("state_after");
  for (int64_t c = 0; c < C; ++c)
    for (int q = 0; q < K - 1; ++q)
      ASSERT_EQ(hist[q * C + c], want_state[c * (K - 1) + q]) << "channel " << c << " slot " << q;
  const std::vector<float> u_next = fx.f32("in_next");
  std::vector<float> out_next = poisoned(C);
  kda_short_conv(u_next.data(), 1, C, w.data(), K, hist.data(), out_next.data(), env().ex);
  const auto rn = check_tolerance(out_next, fx.tensor("out_next").data);
  expect_case("shortconv continuation", rn, 0.005, "0.005 / 0.004");
}

TEST_P(Conformance, KdaDecayGate) {
  const Fixture fx = Fixture::load_op("kda_decay");
  const Tensor z = fx.tensor("z");  // [1, T, H*D]
  const std::vector<float> A_log = fx.f32("A_log"), dt = fx.f32("dt_bias"), zf = z.f32();
  const int H = static_cast<int>(A_log.size());
  const int64_t T = z.shape[1];
  const int D = static_cast<int>(z.shape[2] / H);
  const int64_t n = static_cast<int64_t>(zf.size());
  std::vector<float> g = poisoned(n), alpha = poisoned(n);
  kda_decay_gate(zf.data(), T, H, D, A_log.data(), dt.data(), fx.number("lower_bound"), g.data(),
                 alpha.data(), env().ex);
  const double dg = max_abs_diff(g, fx.tensor("g").data);
  const double da = max_abs_diff(alpha, fx.tensor("alpha").data);
  std::printf(
      "[conformance] kda_decay                          max |dg| %.3g, max |dalpha| %.3g "
      "(rule 1e-5); README measured 5.3e-7 / 1.1e-7\n",
      dg, da);
  EXPECT_LE(dg, 1e-5);
  EXPECT_LE(da, 1e-5);
  // And within kMarginSlack of what the README measured (the rule alone leaves 19x / 90x: a
  // decay rounded through f32 where §7 keeps double would pass it).
  EXPECT_LE(dg, kMarginSlack * 5.3e-7) << "far above the README's measured |dg|";
  EXPECT_LE(da, kMarginSlack * 1.1e-7) << "far above the README's measured |dalpha|";
  EXPECT_GT(*std::min_element(alpha.begin(), alpha.end()), 0.0f);
  // The fixture's own summary: the range reached and how many decays saturate at 1.
  EXPECT_NEAR(*std::min_element(alpha.begin(), alpha.end()), fx.number("alpha_min"), 1e-6);
  EXPECT_NEAR(*std::max_element(alpha.begin(), alpha.end()), fx.number("alpha_max"), 1e-6);
  // None saturates (README: "no element is exactly 1"): every g is below 0. Some alphas still
  // round to 1.0f in f32 (exp(g) within 2^-25 of 1), which the float64 count does not see.
  ASSERT_EQ(fx.number("n_alpha_saturated_at_1"), 0.0);
  EXPECT_LT(*std::max_element(g.begin(), g.end()), 0.0f);
  EXPECT_EQ(static_cast<double>(alpha.size()), fx.number("n_alpha_total"));
}

// `state_f64`: the float64 oracle's margin for state_out (the README gives none).
void run_recurrence_case(const char* name, double readme_max, const char* readme,
                         double state_f64) {
  const Fixture fx = Fixture::load_op(name);
  const Tensor q = fx.tensor("q");  // [T, H, Dk]
  const int64_t T = q.shape[0];
  const int H = static_cast<int>(q.shape[1]), Dk = static_cast<int>(q.shape[2]);
  const int Dv = static_cast<int>(fx.tensor("v").shape[2]);
  const std::vector<float> qf = q.f32(), k = fx.f32("k"), v = fx.f32("v"), al = fx.f32("alpha"),
                           beta = fx.f32("beta");
  std::vector<float> S(static_cast<size_t>(H) * Dk * Dv, 0.0f), out = poisoned(T * H * Dv);
  kda_recurrence(qf.data(), k.data(), v.data(), al.data(), beta.data(), T, H, Dk, Dv,
                 fx.number("q_scale"), S.data(), out.data(), env().ex);
  const auto r = check_tolerance(out, fx.tensor("out").data);
  const auto rs = check_tolerance(S, fx.tensor("state_out").data);
  expect_case(std::string(name) + " out", r, readme_max, readme);
  expect_case(std::string(name) + " state_out", rs, state_f64,
              "- (float64 oracle " + std::to_string(state_f64) + ")");
}
TEST_P(Conformance, KdaRecurrence1) {
  run_recurrence_case("kda_recur1", 0.006, "0.006 / 0.005", 0.0048);
}
TEST_P(Conformance, KdaRecurrence8) {
  run_recurrence_case("kda_recur8", 0.061, "0.047 / 0.061", 0.044);
}

// `state_f64`: as run_recurrence_case's.
void run_kda_layer_case(const char* name, double readme_max, const char* readme,
                        double state_f64) {
  const Fixture fx = Fixture::load_op(name);
  const int H = static_cast<int>(fx.number("H")), D = static_cast<int>(fx.number("d_k"));
  const KdaWeights w = load_kda(fx, false, H, D, fx.number("lower_bound"), fx.number("rms_eps"));
  const Tensor in = fx.tensor("in");  // [1, T, E]
  const int64_t T = in.shape[1], E = in.shape[2];
  const std::vector<float> x = in.f32();
  KdaState st = KdaState::zeros(w);
  std::vector<float> out = poisoned(T * E);
  kda_block(w, x.data(), T, st, out.data(), env().ex);
  const auto r = check_tolerance(out, fx.tensor("out").data);
  const auto rs = check_tolerance(st.S, fx.tensor("state_out").data);
  expect_case(std::string(name) + " out", r, readme_max, readme);
  expect_case(std::string(name) + " state_out", rs, state_f64,
              "- (float64 oracle " + std::to_string(state_f64) + ")");
  // One token at a time, carrying S and the conv histories: bit-identical to the batched run.
  KdaState st1 = KdaState::zeros(w);
  std::vector<float> out1(T * E);
  for (int64_t t = 0; t < T; ++t)
    kda_block(w, x.data() + t * E, 1, st1, out1.data() + t * E, env().ex);
  EXPECT_EQ(compare_bits(out.data(), out1.data(), T * E), "");
  EXPECT_EQ(compare_bits(st.S.data(), st1.S.data(), static_cast<int64_t>(st.S.size())), "");
  EXPECT_EQ(
      compare_bits(st.hist_v.data(), st1.hist_v.data(), static_cast<int64_t>(st.hist_v.size())),
      "");
}
TEST_P(Conformance, KdaLayer1) {
  run_kda_layer_case("kda_layer1", 0.034, "0.016 / 0.034", 0.0055);
}
TEST_P(Conformance, KdaLayer8) { run_kda_layer_case("kda_layer8", 0.50, "0.50 / 0.36", 0.017); }

TEST_P(Conformance, RouterSetsAndWeightsById) {
  const Fixture fx = Fixture::load_op("router");
  const int k = static_cast<int>(fx.number("top_k")),
            n_exp = static_cast<int>(fx.number("n_experts"));
  const OwnedMatrix gate = load_matrix(fx, "gate_weight");
  const Tensor in = fx.tensor("in");
  const int64_t T = in.shape[0];
  const std::vector<float> x = in.f32(), bias = fx.f32("bias");
  std::vector<float> logits = poisoned(T * n_exp), wts = poisoned(T * k);
  std::vector<int32_t> ids(T * k, -1);
  linear(gate.view(), x.data(), T, logits.data(), env().ex);
  router_topk(logits.data(), bias.data(), T, n_exp, k, true, 1.0, ids.data(), wts.data(), env().ex);
  std::vector<float> got_by_id;
  std::vector<double> want_by_id;
  ASSERT_EQ(router_weights_by_id(fx, ids, wts, k, got_by_id, want_by_id), "");
  for (int64_t t = 0; t < T; ++t) {
    auto biased = [&](int e) {  // ktier order (D5): decreasing sigmoid(logit) + bias
      return 1.0 / (1.0 + std::exp(-static_cast<double>(logits[t * n_exp + e]))) + bias[e];
    };
    for (int j = 1; j < k; ++j)
      EXPECT_GE(biased(ids[t * k + j - 1]), biased(ids[t * k + j])) << "row " << t;
  }
  const auto r = check_tolerance(got_by_id, want_by_id);
  expect_case("router weights (by id)", r, 0.003, "0.002 / 0.003");
  // The bias matters: without it the selected set differs in as many rows as the fixture says.
  const std::vector<float> no_bias(static_cast<size_t>(n_exp), 0.0f);
  std::vector<int32_t> ids_nb(T * k, -1);
  std::vector<float> wts_nb = poisoned(T * k);
  router_topk(logits.data(), no_bias.data(), T, n_exp, k, true, 1.0, ids_nb.data(), wts_nb.data(),
              env().ex);
  int changed = 0;
  for (int64_t t = 0; t < T; ++t)
    changed += std::set<int>(ids.begin() + t * k, ids.begin() + (t + 1) * k) !=
               std::set<int>(ids_nb.begin() + t * k, ids_nb.begin() + (t + 1) * k);
  EXPECT_EQ(changed, static_cast<int>(fx.number("rows_where_bias_changed_selection")));
}

TEST_P(Conformance, AttnRes) {
  const Fixture fx = Fixture::load_op("attnres");
  const Tensor bank = fx.tensor("block_residual");  // [rows, 8, E]
  const int64_t T = bank.shape[0], nb = bank.shape[1], E = bank.shape[2];
  const std::vector<float> P = fx.f32("prefix_sum"), bankf = bank.f32();
  const std::vector<float> f = fold_attnres(fx.f32("norm_weight"), fx.f32("proj_weight"));
  std::vector<std::vector<float>> src(nb + 1, std::vector<float>(T * E));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < nb; ++i)
      std::copy(bankf.begin() + (t * nb + i) * E, bankf.begin() + (t * nb + i + 1) * E,
                src[i].begin() + t * E);
  src[nb] = P;
  std::vector<const float*> ptrs;
  for (const auto& s : src) ptrs.push_back(s.data());
  std::vector<float> out = poisoned(T * E);
  attnres(ptrs.data(), static_cast<int>(ptrs.size()), E, T, E, f.data(), fx.number("eps"),
          out.data(), env().ex);
  const auto r = check_tolerance(out, fx.tensor("out").data);
  expect_case("attnres", r, 0.036, "0.025 / 0.006-0.036");
}

TEST_P(Conformance, MlaAbsorbedAndPrefillThenDecode) {
  const Fixture fx = Fixture::load_op("mla");
  MlaDims d;
  d.n_heads = static_cast<int>(fx.number("n_heads"));
  d.qk_nope = static_cast<int>(fx.number("qk_nope"));
  d.qk_rope = static_cast<int>(fx.number("qk_rope"));
  d.v_head = static_cast<int>(fx.number("v_head"));
  d.kv_lora = static_cast<int>(fx.number("kv_lora"));
  const MlaWeights w = load_mla(fx, "", d, static_cast<int>(fx.number("q_lora")));
  const Tensor in = fx.tensor("in");
  const int64_t T = in.shape[1], E = in.shape[2];
  const std::vector<float> x = in.f32();
  MlaCache cache;
  std::vector<float> out = poisoned(T * E);
  mla_block(w, x.data(), T, cache, out.data(), env().ex);
  const auto r = check_tolerance(out, fx.tensor("out").data);
  const auto rc = check_tolerance(cache.c, fx.tensor("kv_latent").data);
  const auto rr = check_tolerance(cache.r, fx.tensor("k_rope").data);
  expect_case("mla out (eps_lr 1e-6, absorbed)", r, 0.13, "0.09 / 0.13 (0.12 with 1e-6)");
  expect_case("mla kv_latent", rc, 0.019, "- (float64 oracle 0.019)");
  expect_case("mla k_rope", rr, 0.028, "- (float64 oracle 0.028)");
  // Prefill 3, then 3 single decode steps through the cache: bit-identical to prefill 6.
  MlaCache c2;
  std::vector<float> out2(T * E);
  mla_block(w, x.data(), 3, c2, out2.data(), env().ex);
  for (int64_t t = 3; t < T; ++t)
    mla_block(w, x.data() + t * E, 1, c2, out2.data() + t * E, env().ex);
  EXPECT_EQ(compare_bits(out.data(), out2.data(), T * E), "");
  EXPECT_EQ(compare_bits(cache.c.data(), c2.c.data(), static_cast<int64_t>(cache.c.size())), "");
}

// README §5.11: scaled absolute term; the strict manifest ratio is printed as a known deviation.
ToleranceResult check_moe_scaled(const std::vector<float>& got, const std::vector<double>& want) {
  double max_want = 0.0;
  for (double v : want) max_want = std::max(max_want, std::fabs(v));
  return check_tolerance(got, want, 1e-5 * std::max(1.0, max_want), 1e-4);
}

TEST_P(Conformance, LatentMoe) {
  const Fixture fx = Fixture::load_op("moe");
  MoeWeights w = load_moe(fx, "", static_cast<int>(fx.number("n_experts")),
                          static_cast<int>(fx.number("top_k")));
  w.renormalize = fx.number("renorm") != 0;
  w.latent_norm = fx.number("latent_norm") != 0;
  w.scaling = fx.number("routed_scale");
  w.eps = fx.number("rms_eps");
  w.beta1 = fx.number("situ_b1");
  w.beta2 = fx.number("situ_b2");
  const Tensor in = fx.tensor("in");
  const int64_t T = in.shape[1], E = in.shape[2];
  const std::vector<float> x = in.f32();
  std::vector<float> out = poisoned(T * E);
  moe_block(w, x.data(), T, out.data(), env().ex);
  const std::vector<double> want = fx.tensor("out").data;
  const auto r = check_moe_scaled(out, want);
  const auto strict = check_tolerance(out, want);
  expect_case("moe (scaled rule, README 5.11)", r, 0.018, "0.016 / 0.018");
  report_ratio("moe strict manifest rule [known deviation]", strict,
               "1.15 / 2.49 (C99 engine 0.53)");
  // Per-token runs equal the grouped (prefill) run bit for bit.
  std::vector<float> out1(T * E);
  for (int64_t t = 0; t < T; ++t) moe_block(w, x.data() + t * E, 1, out1.data() + t * E, env().ex);
  EXPECT_EQ(compare_bits(out.data(), out1.data(), T * E), "");
}

// ---- full decoder layers (README §5.12) ----------------------------------------------------

LayerWeights load_layer(const Fixture& fx, const nlohmann::json& cfg) {
  LayerWeights w;
  w.is_mla = fx.json().at("is_mla").get<bool>();
  const double eps = fx.number("rms_eps");
  if (w.is_mla) {
    MlaDims d;
    d.n_heads = cfg.at("num_attention_heads").get<int>();
    d.qk_nope = cfg.at("qk_nope_head_dim").get<int>();
    d.qk_rope = cfg.at("qk_rope_head_dim").get<int>();
    d.v_head = cfg.at("v_head_dim").get<int>();
    d.kv_lora = cfg.at("kv_lora_rank").get<int>();
    w.mla = load_mla(fx, "self_attn_", d, cfg.at("q_lora_rank").get<int>());
  } else {
    w.kda =
        load_kda(fx, true, cfg.at("kda_num_heads").get<int>(), cfg.at("kda_head_dim").get<int>(),
                 cfg.at("gate_lower_bound").get<double>(), eps);
  }
  w.moe = load_moe(fx, "mlp_", cfg.at("num_experts").get<int>(),
                   cfg.at("num_experts_per_token").get<int>());
  w.moe.renormalize = cfg.at("moe_renormalize").get<bool>();
  w.moe.latent_norm = cfg.at("latent_moe_use_norm").get<bool>();
  w.moe.scaling = cfg.at("routed_scaling_factor").get<double>();
  w.moe.eps = eps;
  w.moe.beta1 = cfg.at("situ_beta").get<double>();
  w.moe.beta2 = cfg.at("situ_linear_beta").get<double>();
  w.input_ln = fx.f32("input_layernorm_weight");
  w.post_ln = fx.f32("post_attention_layernorm_weight");
  w.f_attn = fold_attnres(fx.f32("self_attention_res_norm_weight"),
                          fx.f32("self_attention_res_proj_weight"));
  w.f_mlp = fold_attnres(fx.f32("mlp_res_norm_weight"), fx.f32("mlp_res_proj_weight"));
  return w;
}

void run_layer_case(const char* name, double readme_max, const char* readme) {
  const Fixture fx = Fixture::load_op(name);
  const nlohmann::json cfg = Fixture::load_op("MANIFEST").json().at("config");
  const LayerWeights w = load_layer(fx, cfg);
  const int layer_idx = static_cast<int>(fx.number("layer_idx"));
  const int S = static_cast<int>(fx.number("attn_res_block_size"));
  const double eps = fx.number("rms_eps");
  const Tensor in = fx.tensor("in"), bank_in = fx.tensor("block_residual_in");  // [T, m, E]
  const int64_t T = in.shape[1], E = in.shape[2], m = bank_in.shape[1];
  const std::vector<float> bank_f = bank_in.f32();
  auto fresh_bank = [&] {
    std::vector<std::vector<float>> bank(m, std::vector<float>(T * E));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < m; ++i)
        std::copy(bank_f.begin() + (t * m + i) * E, bank_f.begin() + (t * m + i + 1) * E,
                  bank[i].begin() + t * E);
    return bank;
  };
  auto fresh_state = [&] {
    LayerState st;
    if (!w.is_mla) st.kda = KdaState::zeros(w.kda);
    return st;
  };
  std::vector<float> P = in.f32();
  std::vector<std::vector<float>> bank = fresh_bank();
  LayerState st = fresh_state();
  decoder_layer(w, layer_idx, S, eps, T, E, P, bank, st, env().ex);
  const auto r = check_tolerance(P, fx.tensor("out").data);
  expect_case(std::string(name) + " out", r, readme_max, readme);
  // The bank after the layer, exactly (boundary: the incoming P is appended; else unchanged).
  const Tensor want_bank = fx.tensor("block_residual_out");  // [T, m', E]
  const int64_t m_out = want_bank.shape[1];
  ASSERT_EQ(static_cast<int64_t>(bank.size()), m_out);
  const std::vector<float> want_bank_f = want_bank.f32();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < m_out; ++i)
      ASSERT_EQ(compare_bits(bank[i].data() + t * E, want_bank_f.data() + (t * m_out + i) * E, E),
                "")
          << "bank entry " << i << " token " << t;
  // One token at a time (decode through the state): bit-identical to the 4-token prefill.
  std::vector<float> P_all(T * E);
  LayerState st1 = fresh_state();
  const std::vector<float> in_f = in.f32();
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> Pt(in_f.begin() + t * E, in_f.begin() + (t + 1) * E);
    std::vector<std::vector<float>> bt;
    for (const auto& b : fresh_bank()) bt.emplace_back(b.begin() + t * E, b.begin() + (t + 1) * E);
    decoder_layer(w, layer_idx, S, eps, 1, E, Pt, bt, st1, env().ex);
    std::copy(Pt.begin(), Pt.end(), P_all.begin() + t * E);
  }
  EXPECT_EQ(compare_bits(P.data(), P_all.data(), T * E), "");
}
TEST_P(Conformance, LayerKda) { run_layer_case("layer_kda", 0.63, "0.46 / 0.63"); }
TEST_P(Conformance, LayerMla) {
  run_layer_case("layer_mla", 0.24, "0.24 / 0.24 (0.21 with eps_lr 1e-6)");
}

}  // namespace
}  // namespace ktier::cpu::test
