// The conformance vectors (../shared/conformance) through the Backend interface, on every
// backend: the CPU, and CUDA where a GPU is (its kernels run by the host emulation in every
// build, tests/CMakeLists.txt). Conformance README §2: "the CUDA path uses the same rules":
// each op case must pass the README's tolerance rule (worst ratio <= 1; the router's sets
// exactly, the decay gate within 1e-5), and the packed product of the real released MXFP4
// bytes (README §6) must agree with the CPU reference within its derived bound.
// tests/cpu/conformance_test.cpp also pins the CPU kernels' margins near the README's; the
// blocks and layers go through tests/model. Outputs start poisoned: one never written fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "backend/cuda_module.h"
#include "common/test_paths.h"
#include "cpu/thread_pool.h"
#include "cross_backend_support.h"
#include "op_bounds.h"
#include "tests/common/fresh_seed.h"
#include "tests/cpu/test_support.h"

namespace ktier::backend::test {
namespace {

using cpu::test::Fixture;
using cpu::test::glu_halves;
using cpu::test::GluHalves;
using cpu::test::Tensor;

class BackendConformance : public ::testing::TestWithParam<DeviceKind> {
 protected:
  void SetUp() override {
    if (GetParam() == DeviceKind::kCpu) {
      be_ = make_cpu_backend(exec_);
      return;
    }
    auto cuda = make_cuda_backend(probe_cuda_module());
    if (!cuda.is_ok()) GTEST_SKIP() << "no CUDA backend here: " << cuda.status().message();
    be_ = std::move(*cuda);
  }
  // README §2's rule for `got` (this backend's output) against the vector's `want`; the ratio
  // is printed beside the README's measured margins.
  void expect_rule(const std::string& what, const std::vector<float>& got,
                   const std::vector<double>& want, const std::string& readme) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_FALSE(is_poison(got[i])) << what << ": element " << i << " never written";
    const auto r = cpu::test::check_tolerance(got, want);
    cpu::test::report_ratio(what + " (" + be_->name() + ")", r, readme);
    EXPECT_LE(r.worst_ratio, 1.0) << what << " on " << be_->name();  // NaN fails too
  }
  Array<float> zeros(size_t n) { return Array<float>(*be_, std::vector<float>(n, 0.0f)); }

  cpu::ThreadPool pool_{2};
  cpu::Exec exec_{&pool_, cpu::best_isa()};
  std::unique_ptr<Backend> be_;
};

TEST_P(BackendConformance, RmsNorm) {
  const Fixture fx = Fixture::load_op("rmsnorm");
  const Tensor in = fx.tensor("in");
  const Array<float> x(*be_, in.f32()), w(*be_, fx.f32("weight"));
  auto out = Array<float>::poisoned(*be_, in.data.size());
  ASSERT_TRUE(
      be_->rmsnorm(x.data(), w.data(), in.shape[0], in.shape[1], fx.number("eps"), out.data())
          .is_ok());
  expect_rule("rmsnorm", out.host(), fx.tensor("out").data, "0.006 / 0.006");
}

TEST_P(BackendConformance, SituGlu) {
  const Fixture fx = Fixture::load_op("situ_glu");
  const GluHalves in = glu_halves(fx.tensor("in"));
  const Array<float> da(*be_, in.a), db(*be_, in.b);
  auto out = Array<float>::poisoned(*be_, in.a.size());
  ASSERT_TRUE(be_->situ_glu(da.data(), db.data(), in.rows * in.half, fx.number("beta"),
                            fx.number("linear_beta"), out.data())
                  .is_ok());
  const std::vector<float> got = out.host();
  expect_rule("situ_glu", got, fx.tensor("out").data, "0.003 / 0.003");
  for (float v : got)
    EXPECT_LE(std::fabs(v), fx.number("max_abs") * (1.0 + 1e-6)) << "SiTU's bound beta1*beta2";
}

// The causal conv over a prompt, its history (the last K-1 inputs, exactly) and one more token.
TEST_P(BackendConformance, ShortConvWithHistoryContinuation) {
  const Fixture fx = Fixture::load_op("shortconv");
  const int K = static_cast<int>(fx.number("kernel"));
  const int64_t C = static_cast<int64_t>(fx.number("channels"));
  const Tensor in = fx.tensor("in");  // [1, T, C]
  const int64_t T = in.shape[1];
  const Array<float> u(*be_, in.f32()), w(*be_, fx.f32("weight")), next(*be_, fx.f32("in_next"));
  Array<float> hist = zeros((K - 1) * C);
  auto out = Array<float>::poisoned(*be_, T * C);
  ASSERT_TRUE(be_->kda_short_conv(u.data(), T, C, w.data(), K, hist.data(), out.data()).is_ok());
  expect_rule("shortconv", out.host(), fx.tensor("out").data, "0.006 / 0.006");
  const std::vector<float> got_hist = hist.host(), want_hist = fx.f32("state_after");  // [C, K-1]
  for (int64_t c = 0; c < C; ++c)
    for (int q = 0; q < K - 1; ++q)
      ASSERT_EQ(got_hist[q * C + c], want_hist[c * (K - 1) + q])
          << "channel " << c << " slot " << q;
  auto out_next = Array<float>::poisoned(*be_, C);
  ASSERT_TRUE(
      be_->kda_short_conv(next.data(), 1, C, w.data(), K, hist.data(), out_next.data()).is_ok());
  expect_rule("shortconv continuation", out_next.host(), fx.tensor("out_next").data,
              "0.005 / 0.004");
}

TEST_P(BackendConformance, KdaDecayGate) {
  const Fixture fx = Fixture::load_op("kda_decay");
  const Tensor z = fx.tensor("z");  // [1, T, H*D]
  const std::vector<float> A_log = fx.f32("A_log");
  const int H = static_cast<int>(A_log.size());
  const int64_t T = z.shape[1];
  const int D = static_cast<int>(z.shape[2] / H);
  const Array<float> dz(*be_, z.f32()), da(*be_, A_log), dt(*be_, fx.f32("dt_bias"));
  auto g = Array<float>::poisoned(*be_, z.data.size());
  auto alpha = Array<float>::poisoned(*be_, z.data.size());
  ASSERT_TRUE(be_->kda_decay_gate(dz.data(), T, H, D, da.data(), dt.data(),
                                  fx.number("lower_bound"), g.data(), alpha.data())
                  .is_ok());
  // README §5: max |d| <= 1e-5 (NaN, or the poison, compares false).
  const double dg = cpu::test::max_abs_diff(g.host(), fx.tensor("g").data);
  const double dalpha = cpu::test::max_abs_diff(alpha.host(), fx.tensor("alpha").data);
  std::printf("[conformance] kda_decay (%s): max |dg| %.3g, max |dalpha| %.3g (rule 1e-5)\n",
              be_->name().c_str(), dg, dalpha);
  EXPECT_LE(dg, 1e-5);
  EXPECT_LE(dalpha, 1e-5);
}

TEST_P(BackendConformance, KdaRecurrenceOutputAndState) {
  for (const char* name : {"kda_recur1", "kda_recur8"}) {
    SCOPED_TRACE(name);
    const Fixture fx = Fixture::load_op(name);
    const Tensor q = fx.tensor("q");  // [T, H, Dk]
    const int64_t T = q.shape[0];
    const int H = static_cast<int>(q.shape[1]), Dk = static_cast<int>(q.shape[2]);
    const int Dv = static_cast<int>(fx.tensor("v").shape[2]);
    const Array<float> dq(*be_, q.f32()), dk(*be_, fx.f32("k")), dv(*be_, fx.f32("v")),
        dal(*be_, fx.f32("alpha")), dbeta(*be_, fx.f32("beta"));
    Array<float> state = zeros(static_cast<size_t>(H) * Dk * Dv);
    auto out = Array<float>::poisoned(*be_, T * H * Dv);
    ASSERT_TRUE(be_->kda_recurrence(dq.data(), dk.data(), dv.data(), dal.data(), dbeta.data(), T,
                                    H, Dk, Dv, fx.number("q_scale"), state.data(), out.data())
                    .is_ok());
    expect_rule(std::string(name) + " out", out.host(), fx.tensor("out").data,
                "0.006 / 0.005 (recur1), 0.047 / 0.061 (recur8)");
    expect_rule(std::string(name) + " state_out", state.host(), fx.tensor("state_out").data,
                "- (float64 oracle 0.0048 / 0.044)");
  }
}

// The gate's product, then the selection: the README's sets, the weights compared by expert id.
TEST_P(BackendConformance, RouterSetsAndWeightsById) {
  const Fixture fx = Fixture::load_op("router");
  const int k = static_cast<int>(fx.number("top_k"));
  const int n_exp = static_cast<int>(fx.number("n_experts"));
  const Tensor in = fx.tensor("in");
  const int64_t T = in.shape[0], E = in.shape[1];
  const Array<float> x(*be_, in.f32()), gate(*be_, fx.f32("gate_weight")),
      bias(*be_, fx.f32("bias"));
  auto logits = Array<float>::poisoned(*be_, T * n_exp);
  const cpu::LinearJob job{{cpu::WeightType::kF32, reinterpret_cast<const uint8_t*>(gate.data()),
                            nullptr, n_exp, E},
                           x.data(), T, logits.data()};
  ASSERT_TRUE(be_->linear(&job, 1).is_ok());
  auto weights = Array<float>::poisoned(*be_, T * k);
  Array<int32_t> ids(*be_, std::vector<int32_t>(T * k, -1));
  ASSERT_TRUE(be_->router_topk(logits.data(), bias.data(), T, n_exp, k, true, 1.0, ids.data(),
                               weights.data())
                  .is_ok());
  std::vector<float> got_by_id;
  std::vector<double> want_by_id;
  ASSERT_EQ(cpu::test::router_weights_by_id(fx, ids.host(), weights.host(), k, got_by_id,
                                            want_by_id),
            "");
  expect_rule("router weights (by id)", got_by_id, want_by_id, "0.002 / 0.003");
}

TEST_P(BackendConformance, AttnRes) {
  const Fixture fx = Fixture::load_op("attnres");
  const Tensor bank = fx.tensor("block_residual");  // [T, nb, E]
  const int64_t T = bank.shape[0], nb = bank.shape[1], E = bank.shape[2];
  const std::vector<float> bank_f = bank.f32(), norm = fx.f32("norm_weight"),
                           proj = fx.f32("proj_weight");
  std::vector<float> f(norm.size());  // the folded query (K3-MODEL's AttnRes: norm * proj)
  for (size_t i = 0; i < f.size(); ++i) f[i] = norm[i] * proj[i];
  std::vector<Array<float>> src;
  for (int64_t i = 0; i < nb; ++i) {
    std::vector<float> entry(static_cast<size_t>(T * E));
    for (int64_t t = 0; t < T; ++t)
      std::copy_n(bank_f.begin() + (t * nb + i) * E, E, entry.begin() + t * E);
    src.emplace_back(*be_, entry);
  }
  src.emplace_back(*be_, fx.f32("prefix_sum"));  // P last
  std::vector<const float*> ptrs;
  for (const Array<float>& s : src) ptrs.push_back(s.data());
  const Array<float> df(*be_, f);
  auto out = Array<float>::poisoned(*be_, T * E);
  ASSERT_TRUE(be_->attnres(ptrs.data(), static_cast<int>(ptrs.size()), E, T, E, df.data(),
                           fx.number("eps"), out.data())
                  .is_ok());
  expect_rule("attnres", out.host(), fx.tensor("out").data, "0.025 / 0.006-0.036");
}

// The real released bytes (mxfp4.json, README §6 check 4): the packed product on this backend
// against the CPU reference (scalar kernels) within the linear op's bound — the CPU's own bytes
// exactly — on fresh random inputs, poisoned outputs.
TEST_P(BackendConformance, PackedProductOfTheRealMxfp4Bytes) {
  const Fixture fx = Fixture::load_path(ktier::test::conformance_dir() / "mxfp4.json");
  HostWeight w;
  w.type = cpu::WeightType::kMxfp4;
  w.rows = static_cast<int64_t>(fx.number("rows"));
  w.cols = static_cast<int64_t>(fx.number("logical_width"));
  for (double v : fx.tensor("packed").data) w.bytes.push_back(static_cast<uint8_t>(v));
  for (double v : fx.tensor("scales").data) w.scales.push_back(static_cast<uint8_t>(v));
  ASSERT_EQ(static_cast<int64_t>(w.bytes.size()), w.rows * w.cols / 2);
  const uint64_t seed = ktier::test::fresh_seed("BackendConformance.PackedProduct");
  std::mt19937_64 rng(seed);
  for (int64_t T : {1, 3}) {
    SCOPED_TRACE("n_tokens " + std::to_string(T) + ", seed " + std::to_string(seed));
    const std::vector<float> x = random_floats(rng, T * w.cols, -2.0f, 2.0f);
    std::vector<float> want = poisoned_host(T * w.rows);
    cpu::Exec scalar{nullptr, cpu::Isa::kScalar};
    const auto ref = make_cpu_backend(scalar);
    const cpu::LinearJob ref_job{w.view(), x.data(), T, want.data()};
    ASSERT_TRUE(ref->linear(&ref_job, 1).is_ok());
    const Array<uint8_t> dw(*be_, w.bytes), ds(*be_, w.scales);
    const Array<float> dx(*be_, x);
    auto y = Array<float>::poisoned(*be_, T * w.rows);
    cpu::WeightMatrix view = w.view();
    view.data = dw.data();
    view.scales = ds.data();
    const cpu::LinearJob job{view, dx.data(), T, y.data()};
    ASSERT_TRUE(be_->linear(&job, 1).is_ok());
    const bool exact = be_->kind() == DeviceKind::kCpu;
    const std::string diff = compare(want, y.host(), linear_bound(w, x, T), exact);
    EXPECT_TRUE(diff.empty()) << be_->name() << "\n" << diff;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendConformance, kBackendKinds, BackendKindName());

}  // namespace
}  // namespace ktier::backend::test
