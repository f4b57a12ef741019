// Every op of a decode step on every available backend against the CPU reference (the scalar
// kernels, one thread), on fresh random inputs of odd sizes, with outputs poisoned before each
// run. The CPU backend (best instruction set, several threads) must give the reference bytes;
// CUDA must agree within the bound derived for each op (cross_backend_support.h) and put NaN
// and Inf in the same places. Without a usable GPU the CUDA cases skip and say why.
//
// Seeds are fresh per run and printed on failure; KTIER_TEST_SEED=N replays one (debugging).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <thread>

#include "backend/cuda_backend.h"
#include "backend/cuda_module.h"
#include "cpu/thread_pool.h"
#include "cross_backend_support.h"
#include "op_bounds.h"
#include "tests/common/fresh_seed.h"

namespace ktier::backend::test {
namespace {

class CrossBackend : public ::testing::TestWithParam<DeviceKind> {
 protected:
  void SetUp() override {
    ref_ = make_cpu_backend(ref_exec_);
    if (GetParam() == DeviceKind::kCpu) {
      under_test_ = make_cpu_backend(fast_exec_);
    } else {
      auto module = probe_cuda_module();
      auto cuda = make_cuda_backend(module);
      if (!cuda.is_ok()) GTEST_SKIP() << "no CUDA backend here: " << cuda.status().message();
      under_test_ = std::move(*cuda);
    }
    seed_ = ktier::test::fresh_seed(under_test_->name().c_str());
    rng_.seed(seed_);
  }
  bool exact() const { return under_test_->kind() == DeviceKind::kCpu; }
  std::string where() const {
    return under_test_->name() + ", seed " + std::to_string(seed_) + " (KTIER_TEST_SEED)";
  }
  // Within tol (plus one ulp) on CUDA; the reference bytes on the CPU, or wherever `bitwise`.
  void expect_close(const char* what, const std::vector<float>& want,
                    const std::vector<float>& got, const std::vector<double>& tol,
                    bool bitwise = false) {
    ASSERT_EQ(want.size(), got.size());
    const std::string diff = compare(want, got, tol, bitwise || exact());
    EXPECT_TRUE(diff.empty()) << what << " on " << where() << "\n" << diff;
  }
  void expect_close(const char* what, const std::vector<float>& want,
                    const std::vector<float>& got, double tol_each, bool bitwise = false) {
    expect_close(what, want, got, std::vector<double>(want.size(), tol_each), bitwise);
  }

  cpu::Exec ref_exec_{nullptr, cpu::Isa::kScalar};
  cpu::ThreadPool pool_{3};
  cpu::Exec fast_exec_{&pool_, cpu::best_isa()};
  std::unique_ptr<Backend> ref_, under_test_;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

// ---- linear: F32, BF16, F16 and MXFP4 in one call, odd and 16-byte rows, decode (T = 1, 3) and
// prefill (T = 9) ----

TEST_P(CrossBackend, Linear) {
  for (int64_t T : {1, 3, 9}) {
    SCOPED_TRACE("n_tokens " + std::to_string(T));
    std::vector<HostWeight> weights;
    weights.push_back(HostWeight::random(rng_, cpu::WeightType::kF32, odd_between(rng_, 3, 41),
                                         odd_between(rng_, 101, 301)));
    weights.push_back(HostWeight::random(rng_, cpu::WeightType::kBF16, odd_between(rng_, 41, 99),
                                         odd_between(rng_, 301, 1201)));
    weights.push_back(HostWeight::random(rng_, cpu::WeightType::kF16, odd_between(rng_, 3, 41),
                                         odd_between(rng_, 101, 301)));
    weights.push_back(HostWeight::random(rng_, cpu::WeightType::kMxfp4,
                                         odd_between(rng_, 41, 99),
                                         32 * odd_between(rng_, 5, 41)));
    // Rows of a multiple of 16 bytes: CUDA's dense kernels load them 16 bytes at a time (the
    // trunk's matrices all take that path), the odd widths above one element at a time.
    weights.push_back(HostWeight::random(rng_, cpu::WeightType::kBF16, odd_between(rng_, 41, 99),
                                         8 * odd_between(rng_, 41, 151)));
    weights.push_back(HostWeight::random(rng_, cpu::WeightType::kF32, odd_between(rng_, 3, 41),
                                         4 * odd_between(rng_, 25, 75)));
    // NaN/Inf: an Inf in the BF16 job's last token, a NaN in an MXFP4 block every row skips.
    std::vector<std::vector<float>> xs;
    for (auto& w : weights) xs.push_back(random_floats(rng_, T * w.cols, -2.0f, 2.0f));
    xs[1][(T - 1) * weights[1].cols + 7] = std::numeric_limits<float>::infinity();
    weights[3].zero_block_column(2);
    xs[3][2 * 32 + 5] = std::numeric_limits<float>::quiet_NaN();

    // CUDA's fused kernels and its cuBLAS prefill path (below; T = 9, F32 and BF16) take x as it
    // is (cuBLAS gets BF16 jobs' x as three exact bf16 parts): one bound for both.
    const std::vector<std::vector<float>>& ref_xs = xs;
    std::vector<cpu::LinearJob> ref_jobs, dev_jobs;
    std::vector<std::vector<float>> want(weights.size());
    std::vector<Array<uint8_t>> dev_w, dev_s;
    std::vector<Array<float>> dev_x, dev_y;
    for (size_t j = 0; j < weights.size(); ++j) {
      want[j] = poisoned_host(T * weights[j].rows);
      ref_jobs.push_back({weights[j].view(), ref_xs[j].data(), T, want[j].data()});
      dev_w.emplace_back(*under_test_, weights[j].bytes);
      dev_s.emplace_back(*under_test_, weights[j].scales.empty() ? std::vector<uint8_t>(1)
                                                                 : weights[j].scales);
      dev_x.emplace_back(*under_test_, xs[j]);
      dev_y.push_back(Array<float>::poisoned(*under_test_, T * weights[j].rows));
      cpu::WeightMatrix w = weights[j].view();
      w.data = dev_w.back().data();
      w.scales = weights[j].scales.empty() ? nullptr : dev_s.back().data();
      dev_jobs.push_back({w, dev_x.back().data(), T, dev_y.back().data()});
    }
    ASSERT_TRUE(ref_->linear(ref_jobs.data(), static_cast<int>(ref_jobs.size())).is_ok());
    ASSERT_TRUE(under_test_->linear(dev_jobs.data(), static_cast<int>(dev_jobs.size())).is_ok());
    for (size_t j = 0; j < weights.size(); ++j) {
      SCOPED_TRACE(std::string("job ") + cpu::weight_type_name(weights[j].type));
      const auto tol = linear_bound(weights[j], ref_xs[j], T);
      expect_close("linear", want[j], dev_y[j].host(), tol);
    }
    // dev_jobs again, each writing into a fresh poisoned output of `ys`.
    auto into_poisoned = [&](std::vector<Array<float>>& ys) {
      std::vector<cpu::LinearJob> jobs = dev_jobs;
      for (size_t j = 0; j < weights.size(); ++j) {
        ys.push_back(Array<float>::poisoned(*under_test_, T * weights[j].rows));
        jobs[j].y = ys.back().data();
      }
      return jobs;
    };
    // serve calls the backend from its connection threads (one at a time): the same jobs from
    // another thread give the same bytes (CUDA: no abort, no error; on one GPU a new thread's
    // current device is already 0, so this does not tell whether ops() made it current).
    std::vector<Array<float>> again;
    const std::vector<cpu::LinearJob> again_jobs = into_poisoned(again);
    Status from_thread = Status::ok();
    std::thread([&] {
      from_thread = under_test_->linear(again_jobs.data(), static_cast<int>(again_jobs.size()));
      if (from_thread.is_ok()) from_thread = under_test_->synchronize();
    }).join();
    ASSERT_TRUE(from_thread.is_ok()) << from_thread.message();
    for (size_t j = 0; j < weights.size(); ++j) {
      SCOPED_TRACE(std::string("job ") + cpu::weight_type_name(weights[j].type));
      expect_close("linear from another thread", dev_y[j].host(), again[j].host(), 0.0, true);
    }
    // Chunk invariance (NUMERICS.md §13, K3-MODEL §9.2): each token on its own gives the bytes
    // it got among T (the CPU's and the fused kernels' promise; not cuBLAS prefill's).
    std::vector<Array<float>> alone;
    std::vector<cpu::LinearJob> alone_jobs;
    for (const cpu::LinearJob& job : into_poisoned(alone)) {
      for (int64_t t = 0; t < T; ++t) {
        cpu::LinearJob one = job;
        one.x += t * job.w.cols;
        one.n_tokens = 1;
        one.y += t * job.w.rows;
        alone_jobs.push_back(one);
      }
    }
    ASSERT_TRUE(
        under_test_->linear(alone_jobs.data(), static_cast<int>(alone_jobs.size())).is_ok());
    for (size_t j = 0; j < weights.size(); ++j) {
      SCOPED_TRACE(std::string("job ") + cpu::weight_type_name(weights[j].type));
      expect_close("linear token by token", dev_y[j].host(), alone[j].host(), 0.0, true);
    }
    // --gpu-prefill cublas (where the module has cuBLAS): T = 9's F32 and BF16 jobs through
    // cuBLAS, within its bound (tensor cores' truncating sums); from another thread (the cuBLAS
    // handle is the device's).
    if (exact()) continue;
    auto blas = make_cuda_backend(probe_cuda_module(), /*cublas_prefill=*/true);
    ASSERT_TRUE(blas.is_ok()) << blas.status().message();
    if (!(*blas)->uses_blas()) {
      std::printf("[ note ] no cuBLAS in the CUDA module: its prefill path is not tested\n");
      continue;
    }
    std::vector<Array<float>> via_blas;
    const std::vector<cpu::LinearJob> blas_jobs = into_poisoned(via_blas);
    ASSERT_TRUE(under_test_->synchronize().is_ok());  // the poison, written on its stream
    Status blas_status = Status::ok();
    std::thread([&] {
      blas_status = (*blas)->linear(blas_jobs.data(), static_cast<int>(blas_jobs.size()));
      if (blas_status.is_ok()) blas_status = (*blas)->synchronize();
    }).join();
    ASSERT_TRUE(blas_status.is_ok()) << blas_status.message();
    for (size_t j = 0; j < weights.size(); ++j) {
      SCOPED_TRACE(std::string("job ") + cpu::weight_type_name(weights[j].type) + ", cuBLAS");
      expect_close("linear", want[j], via_blas[j].host(),
                   cublas_linear_bound(weights[j], ref_xs[j], T));
    }
  }
}

// ---- norms ----

TEST_P(CrossBackend, RmsnormAndL2norm) {
  const int64_t rows = odd_between(rng_, 3, 9), n = odd_between(rng_, 101, 777);
  auto x = random_floats(rng_, rows * n, -3.0f, 3.0f);
  auto gain = random_floats(rng_, n, 0.5f, 1.5f);
  x[n + 3] = std::numeric_limits<float>::quiet_NaN();  // row 1 becomes NaN everywhere
  Array<float> dx(*under_test_, x), dg(*under_test_, gain);
  for (int variant = 0; variant < 3; ++variant) {
    std::vector<float> want = poisoned_host(x.size());
    auto got = Array<float>::poisoned(*under_test_, x.size());
    if (variant < 2) {
      const float* g = variant == 0 ? gain.data() : nullptr;
      ASSERT_TRUE(ref_->rmsnorm(x.data(), g, rows, n, 1e-5, want.data()).is_ok());
      ASSERT_TRUE(under_test_->rmsnorm(dx.data(), variant == 0 ? dg.data() : nullptr, rows, n,
                                       1e-5, got.data()).is_ok());
    } else {
      ASSERT_TRUE(ref_->l2norm(x.data(), rows, n, 1e-6, want.data()).is_ok());
      ASSERT_TRUE(under_test_->l2norm(dx.data(), rows, n, 1e-6, got.data()).is_ok());
    }
    expect_close(variant < 2 ? "rmsnorm" : "l2norm", want, got.host(), norm_bound(want, n));
  }
}

// ---- elementwise ----

TEST_P(CrossBackend, Elementwise) {
  const int64_t n = odd_between(rng_, 1001, 3001);
  auto a = random_floats(rng_, n, -30.0f, 30.0f), b = random_floats(rng_, n, -30.0f, 30.0f);
  const float inf = std::numeric_limits<float>::infinity();
  a[0] = inf, a[1] = -inf, a[2] = std::numeric_limits<float>::quiet_NaN(), b[3] = -inf;
  Array<float> da(*under_test_, a), db(*under_test_, b);
  const double beta1 = 2.5 + std::uniform_real_distribution<double>(0, 1)(rng_);
  for (int op = 0; op < 5; ++op) {
    std::vector<float> want = poisoned_host(n);
    auto got = Array<float>::poisoned(*under_test_, n);
    const char* name = "";
    switch (op) {
      case 0:
      case 1: {
        const std::optional<double> beta2 = op == 0 ? std::optional<double>(3.5) : std::nullopt;
        name = "situ_glu";
        ASSERT_TRUE(ref_->situ_glu(a.data(), b.data(), n, beta1, beta2, want.data()).is_ok());
        ASSERT_TRUE(
            under_test_->situ_glu(da.data(), db.data(), n, beta1, beta2, got.data()).is_ok());
        break;
      }
      case 2:
        name = "sigmoid";
        ASSERT_TRUE(ref_->sigmoid(a.data(), n, want.data()).is_ok());
        ASSERT_TRUE(under_test_->sigmoid(da.data(), n, got.data()).is_ok());
        break;
      case 3:
        name = "sigmoid_gate";
        ASSERT_TRUE(ref_->sigmoid_gate(a.data(), b.data(), n, want.data()).is_ok());
        ASSERT_TRUE(under_test_->sigmoid_gate(da.data(), db.data(), n, got.data()).is_ok());
        break;
      case 4:
        name = "add";  // the f32 sum: exact everywhere
        ASSERT_TRUE(ref_->add(a.data(), b.data(), n, want.data()).is_ok());
        ASSERT_TRUE(under_test_->add(da.data(), db.data(), n, got.data()).is_ok());
        break;
    }
    // Double formulas rounded once: one ulp (compare() adds it); add is the f32 sum, exact.
    expect_close(name, want, got.host(), 0.0, /*bitwise=*/op == 4);
  }
}

// The MoE combine over T tokens, rows picked by index (repeats allowed), an Inf in one row
// and a NaN in another where some token picks them.
TEST_P(CrossBackend, WeightedSum) {
  // 67 x 16 = 1,072 indices: more than one CUDA launch's 960.
  for (auto [T, k] : {std::pair<int64_t, int>{1, 1}, {3, 5}, {7, 16}, {67, 16}}) {
    const int64_t n = odd_between(rng_, 101, 999), n_rows = odd_between(rng_, 3, 41);
    auto rows = random_floats(rng_, n_rows * n, -4.0f, 4.0f);
    rows[1 * n + n / 2] = std::numeric_limits<float>::infinity();
    rows[2 * n + 7] = std::numeric_limits<float>::quiet_NaN();
    std::vector<int32_t> row_of(static_cast<size_t>(T * k));
    for (auto& r : row_of) r = static_cast<int32_t>(rng_() % static_cast<uint64_t>(n_rows));
    row_of[0] = 1;
    if (T > 1) row_of[static_cast<size_t>(k)] = 2;
    const auto w = random_floats(rng_, T * k, 0.0f, 1.0f);
    Array<float> drows(*under_test_, rows), dw(*under_test_, w);
    std::vector<float> want = poisoned_host(T * n);
    auto got = Array<float>::poisoned(*under_test_, T * n);
    ASSERT_TRUE(ref_->weighted_sum(rows.data(), row_of.data(), w.data(), T, k, n, want.data()).is_ok());
    ASSERT_TRUE(
        under_test_->weighted_sum(drows.data(), row_of.data(), dw.data(), T, k, n, got.data()).is_ok());
    std::vector<double> tol;
    for (int64_t t = 0; t < T; ++t) {  // each token's bound over the rows it picked
      std::vector<std::vector<float>> vec;
      for (int j = 0; j < k; ++j) {
        const float* r = rows.data() + row_of[static_cast<size_t>(t * k + j)] * n;
        vec.emplace_back(r, r + n);
      }
      const auto b = weighted_sum_bound(vec, std::vector<float>(w.begin() + t * k, w.begin() + (t + 1) * k));
      tol.insert(tol.end(), b.begin(), b.end());
    }
    expect_close("weighted_sum", want, got.host(), tol, /*bitwise=*/true);  // NUMERICS.md §13
  }
}

// A gather moves bytes: equal bits on every backend, NaN payloads and infinities included.
TEST_P(CrossBackend, GatherRows) {
  for (int64_t rows : {1, 9, 1001}) {  // 1001 > one CUDA launch's 960 indices
    const int64_t n = odd_between(rng_, 1, 301), n_src = odd_between(rng_, 3, 41);
    auto src = random_floats(rng_, n_src * n, -4.0f, 4.0f);
    src[0] = std::numeric_limits<float>::infinity();
    src[n_src * n - 1] = std::numeric_limits<float>::quiet_NaN();
    std::vector<int32_t> row_of(static_cast<size_t>(rows));
    for (auto& r : row_of) r = static_cast<int32_t>(rng_() % static_cast<uint64_t>(n_src));
    row_of[0] = 0;
    row_of.back() = static_cast<int32_t>(n_src - 1);
    std::vector<float> want = poisoned_host(rows * n);
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(src.data() + row_of[static_cast<size_t>(r)] * n, n, want.data() + r * n);
    Array<float> dsrc(*under_test_, src);
    auto got = Array<float>::poisoned(*under_test_, rows * n);
    ASSERT_TRUE(under_test_->gather_rows(dsrc.data(), row_of.data(), rows, n, got.data()).is_ok());
    expect_close("gather_rows", want, got.host(), 0.0, /*bitwise=*/true);
  }
}

// ---- KDA ----

TEST_P(CrossBackend, KdaShortConvAndDecayGate) {
  const int K = 4;
  for (int64_t T : {1, 2, 7}) {
    const int64_t C = odd_between(rng_, 33, 99);
    auto u = random_floats(rng_, T * C, -2.0f, 2.0f), w = random_floats(rng_, C * K, -1.0f, 1.0f);
    auto hist = random_floats(rng_, (K - 1) * C, -2.0f, 2.0f);
    if (T == 7) {  // NaN and infinities, in the input and in the history, reach the same outputs
      u[2 * C + 3] = std::numeric_limits<float>::quiet_NaN();
      u[4 * C + 5] = std::numeric_limits<float>::infinity();
      hist[C + 7] = -std::numeric_limits<float>::infinity();
    }
    Array<float> du(*under_test_, u), dw(*under_test_, w), dh(*under_test_, hist);
    std::vector<float> want = poisoned_host(T * C), want_hist = hist;
    auto got = Array<float>::poisoned(*under_test_, T * C);
    ASSERT_TRUE(ref_->kda_short_conv(u.data(), T, C, w.data(), K, want_hist.data(),
                                     want.data()).is_ok());
    ASSERT_TRUE(under_test_->kda_short_conv(du.data(), T, C, dw.data(), K, dh.data(),
                                            got.data()).is_ok());
    expect_close("kda_short_conv", want, got.host(), short_conv_bound(u, hist, w, T, C, K));
    expect_close("kda_short_conv history (a copy)", want_hist, dh.host(), 0.0, /*bitwise=*/true);
  }
  const int H = odd_between(rng_, 3, 7), D = odd_between(rng_, 9, 33);
  const int64_t T = 3, n = T * H * D;
  auto z = random_floats(rng_, n, -6.0f, 6.0f), A_log = random_floats(rng_, H, -1.0f, 1.0f);
  auto dt = random_floats(rng_, H * D, -1.0f, 1.0f);
  z[1] = std::numeric_limits<float>::quiet_NaN();
  z[2] = std::numeric_limits<float>::infinity();
  z[3] = -std::numeric_limits<float>::infinity();
  Array<float> dz(*under_test_, z), dA(*under_test_, A_log), ddt(*under_test_, dt);
  std::vector<float> g = poisoned_host(n), alpha = poisoned_host(n);
  auto dg = Array<float>::poisoned(*under_test_, n), dal = Array<float>::poisoned(*under_test_, n);
  ASSERT_TRUE(ref_->kda_decay_gate(z.data(), T, H, D, A_log.data(), dt.data(), -5.0, g.data(),
                                   alpha.data()).is_ok());
  ASSERT_TRUE(under_test_->kda_decay_gate(dz.data(), T, H, D, dA.data(), ddt.data(), -5.0,
                                          dg.data(), dal.data()).is_ok());
  expect_close("kda_decay_gate g", g, dg.host(), 0.0);
  expect_close("kda_decay_gate alpha", alpha, dal.host(), 0.0);
  // The model asks for alpha alone (g null): the same alpha.
  auto dal_only = Array<float>::poisoned(*under_test_, n);
  ASSERT_TRUE(under_test_->kda_decay_gate(dz.data(), T, H, D, dA.data(), ddt.data(), -5.0,
                                          nullptr, dal_only.data()).is_ok());
  expect_close("kda_decay_gate alpha (g null)", alpha, dal_only.host(), 0.0);
}

TEST_P(CrossBackend, KdaRecurrence) {
  const int H = odd_between(rng_, 1, 5), Dk = odd_between(rng_, 17, 41), Dv = odd_between(rng_, 17, 41);
  const int64_t T = odd_between(rng_, 1, 5);
  RecurrenceInputs in = RecurrenceInputs::random(rng_, T, H, Dk, Dv);
  // A NaN query (one token's head: its output only) and an infinite value (the state of its
  // head from then on, and the outputs read from it).
  in.q[3] = std::numeric_limits<float>::quiet_NaN();
  in.v[(T - 1) * H * Dv + 2] = std::numeric_limits<float>::infinity();
  Array<float> dq(*under_test_, in.q), dk(*under_test_, in.k), dv(*under_test_, in.v);
  Array<float> dal(*under_test_, in.alpha), db(*under_test_, in.beta), ds(*under_test_, in.state);
  std::vector<float> want = poisoned_host(T * H * Dv), want_state = in.state;
  auto got = Array<float>::poisoned(*under_test_, want.size());
  const double q_scale = 1.0 / std::sqrt(double(Dk));
  ASSERT_TRUE(ref_->kda_recurrence(in.q.data(), in.k.data(), in.v.data(), in.alpha.data(),
                                   in.beta.data(), T, H, Dk, Dv, q_scale, want_state.data(),
                                   want.data()).is_ok());
  ASSERT_TRUE(under_test_->kda_recurrence(dq.data(), dk.data(), dv.data(), dal.data(), db.data(),
                                          T, H, Dk, Dv, q_scale, ds.data(), got.data()).is_ok());
  const RecurrenceBound bound = recurrence_bound(in, T, H, Dk, Dv, q_scale);
  expect_close("kda_recurrence out", want, got.host(), bound.out);
  expect_close("kda_recurrence state", want_state, ds.host(), bound.state);
}

// ---- MLA attention and AttnRes ----

TEST_P(CrossBackend, MlaAttention) {
  const cpu::MlaDims d{odd_between(rng_, 1, 5), odd_between(rng_, 9, 33), odd_between(rng_, 3, 17),
                       odd_between(rng_, 9, 33), odd_between(rng_, 33, 99)};
  const int64_t T = odd_between(rng_, 1, 3), n_past = odd_between(rng_, 1, 41), N = n_past + T;
  const int64_t qd = d.qk_nope + d.qk_rope;
  auto q = random_floats(rng_, T * d.n_heads * qd, -1.0f, 1.0f);
  auto cache_c = random_floats(rng_, N * d.kv_lora, -1.0f, 1.0f);
  auto cache_r = random_floats(rng_, N * d.qk_rope, -1.0f, 1.0f);
  q.back() = std::numeric_limits<float>::quiet_NaN();  // the last (token, head): its output
  HostWeight kv_b = HostWeight::random(rng_, cpu::WeightType::kBF16,
                                       d.n_heads * (d.qk_nope + d.v_head), d.kv_lora);
  const double scale = 1.0 / std::sqrt(double(qd));
  std::vector<float> want = poisoned_host(T * d.n_heads * d.v_head);
  ASSERT_TRUE(ref_->mla_attention(d, q.data(), T, kv_b.view(), cache_c.data(), cache_r.data(),
                                  n_past, scale, want.data()).is_ok());
  Array<float> dq(*under_test_, q), dc(*under_test_, cache_c), dr(*under_test_, cache_r);
  Array<uint8_t> dw(*under_test_, kv_b.bytes);
  auto got = Array<float>::poisoned(*under_test_, want.size());
  cpu::WeightMatrix w = kv_b.view();
  w.data = dw.data();
  ASSERT_TRUE(under_test_->mla_attention(d, dq.data(), T, w, dc.data(), dr.data(), n_past, scale,
                                         got.data()).is_ok());
  expect_close("mla_attention", want, got.host(),
               mla_bound(d, q, T, kv_b, cache_c, cache_r, n_past, scale));
}

TEST_P(CrossBackend, AttnRes) {
  for (int m : {1, 2, 7}) {
    const int64_t T = odd_between(rng_, 1, 5), n = odd_between(rng_, 101, 401);
    const int64_t stride = n + 2;  // sources are rows of a wider buffer
    std::vector<std::vector<float>> src;
    std::vector<Array<float>> dsrc;
    std::vector<const float*> ref_ptrs, dev_ptrs;
    for (int i = 0; i < m; ++i) {
      src.push_back(random_floats(rng_, T * stride, -3.0f, 3.0f));
      if (i == 0) src.back()[5] = std::numeric_limits<float>::quiet_NaN();
      if (i == m - 1) src.back()[(T - 1) * stride + 9] = std::numeric_limits<float>::infinity();
      dsrc.emplace_back(*under_test_, src.back());
      ref_ptrs.push_back(src.back().data());
      dev_ptrs.push_back(dsrc.back().data());
    }
    const auto f = random_floats(rng_, n, -0.5f, 0.5f);
    Array<float> df(*under_test_, f);
    std::vector<float> want = poisoned_host(T * n);
    auto got = Array<float>::poisoned(*under_test_, want.size());
    ASSERT_TRUE(ref_->attnres(ref_ptrs.data(), m, stride, T, n, f.data(), 1e-6, want.data()).is_ok());
    ASSERT_TRUE(
        under_test_->attnres(dev_ptrs.data(), m, stride, T, n, df.data(), 1e-6, got.data()).is_ok());
    if (m == 1)  // a copy: exact on every backend
      expect_close("attnres (one source)", want, got.host(), 0.0, /*bitwise=*/true);
    else
      expect_close("attnres", want, got.host(), attnres_bound(src, stride, T, n, f, 1e-6));
  }
}

// ---- router and argmax: exact selections ----

TEST_P(CrossBackend, RouterTopk) {
  for (int k : {1, 8, 16}) {
    const int64_t T = odd_between(rng_, 1, 5);
    const int E = odd_between(rng_, 97, 901);
    auto logits = random_floats(rng_, T * E, -4.0f, 4.0f);
    auto bias = random_floats(rng_, E, -0.1f, 0.1f);
    logits[5] = std::numeric_limits<float>::quiet_NaN();  // ranks last
    logits[9] = logits[10];                                // a tie: the lower index first
    for (int renorm = 0; renorm < 2; ++renorm) {
      std::vector<int32_t> want_ids(T * k);
      std::vector<float> want_w = poisoned_host(T * k);
      ASSERT_TRUE(ref_->router_topk(logits.data(), bias.data(), T, E, k, renorm, 2.5,
                                    want_ids.data(), want_w.data()).is_ok());
      Array<float> dl(*under_test_, logits), db(*under_test_, bias);
      Array<int32_t> dids(*under_test_, std::vector<int32_t>(T * k, -1));
      auto dw = Array<float>::poisoned(*under_test_, T * k);
      ASSERT_TRUE(under_test_->router_topk(dl.data(), db.data(), T, E, k, renorm, 2.5,
                                           dids.data(), dw.data()).is_ok());
      EXPECT_EQ(want_ids, dids.host()) << "router ids on " << where();
      expect_close("router weights", want_w, dw.host(), 0.0);
    }
  }
}

TEST_P(CrossBackend, Argmax) {
  const int64_t n = odd_between(rng_, 10001, 200001);
  auto x = random_floats(rng_, n, -1.0f, 1.0f);
  const int64_t a = n / 3, b = n / 2;
  x[a] = x[b] = 5.0f;                               // tie: the lower index wins
  x[n - 1] = std::numeric_limits<float>::quiet_NaN();  // never wins
  Array<float> dx(*under_test_, x);
  auto got = under_test_->argmax(dx.data(), n);
  ASSERT_TRUE(got.is_ok()) << got.status().message();
  EXPECT_EQ(*got, a) << where();
  std::vector<float> nan(7, std::numeric_limits<float>::quiet_NaN());
  Array<float> dn(*under_test_, nan);
  auto none = under_test_->argmax(dn.data(), 7);
  ASSERT_TRUE(none.is_ok());
  EXPECT_EQ(*none, 0) << "all NaN on " << where();
}

// Fences (GPU mode's streamed trunk): copies waited for one at a time, on both copy queues, and
// a copy ordered after an op that wrote its destination. Large copies, so that on a GPU a
// missing wait would show.
TEST_P(CrossBackend, FencesOrderCopiesAndOps) {
  const int64_t n = odd_between(rng_, (1 << 20) + 1, (1 << 21) + 1);
  const auto a = random_floats(rng_, n, -1.0f, 1.0f), b = random_floats(rng_, n, -1.0f, 1.0f);
  auto c = random_floats(rng_, n, -1.0f, 1.0f);
  auto da = Array<float>::poisoned(*under_test_, n), db = Array<float>::poisoned(*under_test_, n);
  auto dc = Array<float>::poisoned(*under_test_, n), sum = Array<float>::poisoned(*under_test_, n);
  Backend& be = *under_test_;
  // The poison is written by ops (CUDA: the ops stream); the copies below are ordered after
  // nothing, so they must not overtake it.
  ASSERT_TRUE(be.synchronize().is_ok());
  using Q = Backend::CopyQueue;
  auto fa = be.create_fence(), fb = be.create_fence(), fo = be.create_fence();
  ASSERT_TRUE(fa.is_ok() && fb.is_ok() && fo.is_ok());
  // A fence never recorded, or one the host waited for, has passed (whether one not waited for
  // has is the device's timing: asked only of the emulated device, EmulatedDevice.*).
  auto passed = [&](Backend::Fence f) {
    const Result<bool> p = be.fence_passed(f);
    EXPECT_TRUE(p.is_ok()) << p.status().message();
    return p.is_ok() && *p;
  };
  EXPECT_TRUE(passed(*fo));
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  ASSERT_TRUE(be.copy_async(Q::kLayers, da.data(), a.data(), bytes).is_ok());
  ASSERT_TRUE(be.mark_copies(*fa, Q::kLayers).is_ok());
  ASSERT_TRUE(be.copy_async(Q::kExperts, db.data(), b.data(), bytes).is_ok());
  ASSERT_TRUE(be.mark_copies(*fb, Q::kExperts).is_ok());
  ASSERT_TRUE(be.ops_wait(*fa).is_ok());
  ASSERT_TRUE(be.add(da.data(), da.data(), n, sum.data()).is_ok());
  std::vector<float> twice_a(a.size());
  for (size_t i = 0; i < a.size(); ++i) twice_a[i] = a[i] + a[i];
  expect_close("a + a after its copy's fence", twice_a, sum.host(), 0.0, /*bitwise=*/true);
  ASSERT_TRUE(be.ops_wait(*fb).is_ok());
  ASSERT_TRUE(be.add(db.data(), da.data(), n, dc.data()).is_ok());  // dc: written by an op
  ASSERT_TRUE(be.mark_ops(*fo).is_ok());
  ASSERT_TRUE(be.copies_wait(*fo, Q::kLayers).is_ok());
  ASSERT_TRUE(be.copy_async(Q::kLayers, dc.data(), c.data(), bytes).is_ok());  // then overwritten by a copy
  ASSERT_TRUE(be.mark_copies(*fa, Q::kLayers).is_ok());  // a fence recorded again
  ASSERT_TRUE(be.host_wait(*fa).is_ok());
  EXPECT_TRUE(passed(*fa));
  const std::vector<float> copied_c = c;
  std::fill(c.begin(), c.end(), 0.0f);  // the host may reuse its bytes after host_wait
  expect_close("b copied", b, db.host(), 0.0, true);
  expect_close("the copy after the op that wrote the same bytes", copied_c, dc.host(), 0.0, true);
  // Two queues writing the same bytes (the VRAM tier's slot taken by a miss before an evicted
  // prefetch landed): the later copy waits for the earlier one's fence and lands last.
  ASSERT_TRUE(be.copy_async(Q::kExperts, dc.data(), a.data(), bytes).is_ok());
  ASSERT_TRUE(be.mark_copies(*fb, Q::kExperts).is_ok());
  ASSERT_TRUE(be.copies_wait(*fb, Q::kExpertMisses).is_ok());
  ASSERT_TRUE(be.copy_async(Q::kExpertMisses, dc.data(), b.data(), bytes).is_ok());
  ASSERT_TRUE(be.mark_copies(*fa, Q::kExpertMisses).is_ok());
  ASSERT_TRUE(be.ops_wait(*fa).is_ok());
  ASSERT_TRUE(be.add(dc.data(), dc.data(), n, sum.data()).is_ok());
  std::vector<float> twice_b(b.size());
  for (size_t i = 0; i < b.size(); ++i) twice_b[i] = b[i] + b[i];
  expect_close("b + b: the later queue's copy landed last", twice_b, sum.host(), 0.0, true);
  for (Q q : Backend::kCopyQueues) ASSERT_TRUE(be.sync_copies(q).is_ok());
  EXPECT_TRUE(passed(*fa));
  EXPECT_TRUE(passed(*fb));
  expect_close("still b after both queues finished", b, dc.host(), 0.0, true);
  for (auto f : {*fa, *fb, *fo}) be.destroy_fence(f);
}

INSTANTIATE_TEST_SUITE_P(Backends, CrossBackend, kBackendKinds, BackendKindName());

}  // namespace
}  // namespace ktier::backend::test

namespace ktier::backend::test {
namespace {

// The emulated device (GPU mode without a GPU) must catch what a GPU would fault on: a host
// pointer handed to a device op.
TEST(EmulatedDeviceDeathTest, HostPointerInAnOpAborts) {
  cpu::Exec ex{nullptr, cpu::Isa::kScalar};
  auto dev = make_emulated_device_backend(ex);
  auto buf = BackendBuffer::allocate(*dev, 64 * sizeof(float));
  ASSERT_TRUE(buf.is_ok());
  std::vector<float> host(64, 1.0f);
  EXPECT_TRUE(dev->sigmoid(buf->as<float>(), 64, buf->as<float>()).is_ok());
  EXPECT_DEATH((void)dev->sigmoid(host.data(), 64, buf->as<float>()), "not device memory");
  EXPECT_DEATH((void)dev->sigmoid(buf->as<float>(), 65, buf->as<float>()), "not device memory");
}

// A GPU may read a copy's host bytes until the host waits for it; the emulated device applies
// the copy earlier (at the ops' wait), so it checks at the host's wait that the bytes did not
// change in between: host memory reused too early aborts, as it would corrupt a GPU's copy.
TEST(EmulatedDeviceDeathTest, HostBytesReusedBeforeTheHostWaitAbort) {
  cpu::Exec ex{nullptr, cpu::Isa::kScalar};
  auto dev = make_emulated_device_backend(ex);
  auto buf = BackendBuffer::allocate(*dev, 64 * sizeof(float));
  ASSERT_TRUE(buf.is_ok());
  using Q = Backend::CopyQueue;
  std::vector<float> host(64, 1.0f);
  auto f = dev->create_fence();
  ASSERT_TRUE(f.is_ok());
  ASSERT_TRUE(dev->copy_async(Q::kExperts, buf->get(), host.data(), 256).is_ok());
  ASSERT_TRUE(dev->mark_copies(*f, Q::kExperts).is_ok());
  ASSERT_TRUE(dev->ops_wait(*f).is_ok());  // the ops may use it; the host may not reuse it yet
  ASSERT_TRUE(dev->host_wait(*f).is_ok());
  host[3] = 2.0f;  // after the wait: allowed
  ASSERT_TRUE(dev->copy_async(Q::kExperts, buf->get(), host.data(), 256).is_ok());
  ASSERT_TRUE(dev->ops_after_copies(Q::kExperts).is_ok());
  host[5] = 3.0f;  // before the host's wait: a GPU could still be reading it
  EXPECT_DEATH((void)dev->sync_copies(Q::kExperts), "reused before the host waited");
}

// A host wait on a copy that was ordered after another queue's (copies_wait) is a wait for that
// one too, as a GPU's chain of events makes it: the host may then reuse both sources.
TEST(EmulatedDevice, AHostWaitCoversTheCopiesItsQueueWaitedFor) {
  cpu::Exec ex{nullptr, cpu::Isa::kScalar};
  auto dev = make_emulated_device_backend(ex);
  auto buf = BackendBuffer::allocate(*dev, 64 * sizeof(float));
  ASSERT_TRUE(buf.is_ok());
  using Q = Backend::CopyQueue;
  std::vector<float> first(64, 1.0f), second(64, 2.0f);
  auto f = dev->create_fence(), g = dev->create_fence();
  ASSERT_TRUE(f.is_ok() && g.is_ok());
  ASSERT_TRUE(dev->copy_async(Q::kExperts, buf->get(), first.data(), 256).is_ok());
  ASSERT_TRUE(dev->mark_copies(*f, Q::kExperts).is_ok());
  ASSERT_TRUE(dev->copies_wait(*f, Q::kExpertMisses).is_ok());
  ASSERT_TRUE(dev->copy_async(Q::kExpertMisses, buf->get(), second.data(), 256).is_ok());
  ASSERT_TRUE(dev->mark_copies(*g, Q::kExpertMisses).is_ok());
  ASSERT_TRUE(dev->host_wait(*g).is_ok());
  first[0] = 3.0f;  // allowed: the copy that read it came before the one waited for
  for (Q q : Backend::kCopyQueues) ASSERT_TRUE(dev->sync_copies(q).is_ok());
  std::vector<float> back(64);
  ASSERT_TRUE(dev->download(back.data(), buf->get(), 256).is_ok());
  EXPECT_EQ(back, second);
}

// The emulated device applies a copy no earlier than a fence of its queue that covers it, so a
// test over it sees NaN wherever an op reads a copy it did not wait for; and it holds no more
// than its capacity.
TEST(EmulatedDevice, CopiesLandAtTheirFenceAndCapacityIsEnforced) {
  cpu::Exec ex{nullptr, cpu::Isa::kScalar};
  auto dev = make_emulated_device_backend(ex, 1024);
  auto a = BackendBuffer::allocate(*dev, 256), b = BackendBuffer::allocate(*dev, 256);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(dev->memory_use().live, 512u);
  const std::vector<float> ones(64, 1.0f), twos(64, 2.0f);
  using Q = Backend::CopyQueue;
  auto fa = dev->create_fence(), fb = dev->create_fence();
  ASSERT_TRUE(fa.is_ok() && fb.is_ok());
  ASSERT_TRUE(dev->copy_async(Q::kLayers, a->get(), ones.data(), 256).is_ok());
  ASSERT_TRUE(dev->mark_copies(*fa, Q::kLayers).is_ok());
  ASSERT_TRUE(dev->copy_async(Q::kLayers, b->get(), twos.data(), 256).is_ok());
  ASSERT_TRUE(dev->mark_copies(*fb, Q::kLayers).is_ok());
  std::vector<float> got(64);
  auto peek = [&](const BackendBuffer& buf) {  // raw bytes, without applying any copy
    std::memcpy(got.data(), buf.get(), 256);
    return got;
  };
  EXPECT_TRUE(std::isnan(peek(*a)[0]) && std::isnan(peek(*b)[0])) << "poisoned until a fence";
  // fence_passed says whether a fence's copies have landed, and lands nothing.
  auto passed = [&](Backend::Fence f) {
    const Result<bool> p = dev->fence_passed(f);
    EXPECT_TRUE(p.is_ok());
    return p.is_ok() && *p;
  };
  EXPECT_FALSE(passed(*fa));
  EXPECT_TRUE(std::isnan(peek(*a)[0]));
  ASSERT_TRUE(dev->ops_wait(*fa).is_ok());
  EXPECT_EQ(peek(*a), ones);
  EXPECT_TRUE(passed(*fa));
  EXPECT_FALSE(passed(*fb));
  EXPECT_TRUE(std::isnan(peek(*b)[0])) << "a later copy is not applied by an earlier fence";
  ASSERT_TRUE(dev->host_wait(*fb).is_ok());
  EXPECT_EQ(peek(*b), twos);
  EXPECT_TRUE(passed(*fb));
  // The two queues are independent: waiting for one never lands the other's copies.
  ASSERT_TRUE(dev->copy_async(Q::kLayers, a->get(), twos.data(), 256).is_ok());
  ASSERT_TRUE(dev->copy_async(Q::kExperts, b->get(), ones.data(), 256).is_ok());
  ASSERT_TRUE(dev->mark_copies(*fb, Q::kExperts).is_ok());
  ASSERT_TRUE(dev->host_wait(*fb).is_ok());
  EXPECT_EQ(peek(*b), ones);
  EXPECT_TRUE(std::isnan(peek(*a)[0])) << "the other queue's copy is still pending";
  ASSERT_TRUE(dev->ops_after_copies(Q::kExperts).is_ok());
  EXPECT_TRUE(std::isnan(peek(*a)[0]));
  ASSERT_TRUE(dev->sync_copies(Q::kLayers).is_ok());
  EXPECT_EQ(peek(*a), twos);
  auto c = BackendBuffer::allocate(*dev, 512);
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(dev->memory_use().peak, 1024u);
  auto d = BackendBuffer::allocate(*dev, 1);
  ASSERT_FALSE(d.is_ok());
  EXPECT_EQ(d.status().exit_code(), 1);
  EXPECT_NE(d.status().message().find("out of memory"), std::string::npos);
  EXPECT_TRUE(d.status().is_out_of_memory());
  ASSERT_TRUE(dev->free_memory().is_ok());
  EXPECT_EQ(*dev->free_memory(), 0u);
  c->reset();
  EXPECT_EQ(*dev->free_memory(), 512u);
  EXPECT_EQ(dev->memory_use().live, 512u);
}

}  // namespace
}  // namespace ktier::backend::test
