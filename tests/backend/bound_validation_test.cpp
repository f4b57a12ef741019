// Checks the error bounds of the cross-backend test themselves (op_bounds.h), without a GPU.
//
// 1. Not too tight: for each bounded op, a deliberately different honest implementation in
//    plain f32 arithmetic (f32 products and sums in another order than the CPU's, expf, f32
//    softmax, an f32 recurrence state; for T = 9 linear with BF16 weights, x split into three
//    bf16 parts as CUDA feeds cuBLAS) agrees with the CPU reference within the op's bound; and
//    for T = 9 with F32 and BF16 weights, sums taken as tensor cores may take them (truncating
//    alignment and accumulation) agree within cublas_linear_bound. (F32 goes through sgemm
//    without TF32, not tensor cores: the model is a stricter stand-in there.)
// 2. Not vacuous: the same result with one element moved by 8x its allowance (tol + ulp) is
//    caught; for linear and rmsnorm, so is one element wrong by 1e-3 relative at an output of
//    median magnitude. The median of (tol + ulp) / |value| is printed per op.
// 3. compare()'s NaN / Inf / poison rules.
//
// Seeds: 1, 2, 3 and a fresh one per op (printed; KTIER_TEST_SEED=N replays it).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>

#include "cross_backend_support.h"
#include "op_bounds.h"
#include "tests/common/fresh_seed.h"

namespace ktier::backend::test {
namespace {

const cpu::Exec kRef{nullptr, cpu::Isa::kScalar};

std::vector<uint64_t> seeds() {
  return {1, 2, 3, ktier::test::fresh_seed(
                       ::testing::UnitTest::GetInstance()->current_test_info()->name())};
}

// ---- f32 building blocks -------------------------------------------------------------------

enum class Order { kForward, kReverse, kStrided32 };

// sum_i term(i) in f32 (term returns an f32 product): in order, from the end, or as 32 strided
// partial sums combined by a tree (a warp).
float sum_f32(int64_t n, Order order, const std::function<float(int64_t)>& term) {
  if (order == Order::kStrided32) {
    float p[32] = {};
    for (int64_t i = 0; i < n; ++i) p[i % 32] += term(i);
    for (int w = 16; w >= 1; w /= 2)
      for (int l = 0; l < w; ++l) p[l] += p[l + w];
    return p[0];
  }
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += term(order == Order::kReverse ? n - 1 - i : i);
  return s;
}

// f32 rounded toward zero (a truncating accumulator).
float truncate_to_f32(double s) {
  float f = static_cast<float>(s);
  if (std::fabs(static_cast<double>(f)) > std::fabs(s)) f = std::nextafter(f, 0.0f);
  return f;
}

// sum_i term(i) as tensor cores may take it (Fasi et al. 2021; op_bounds.h): the running sum and
// the next 4 products (each rounded to f32 by `term`) aligned to the largest of them, each
// truncated at f32's last significand bit there, added exactly, and the sum truncated to f32.
// A model of the worst they do, for cublas_linear_bound to cover. Finite terms only (the
// test's inputs are): a term that is not gives NaN, which the bound check then reports.
float sum_like_tensor_cores(int64_t n, const std::function<float(int64_t)>& term) {
  float acc = 0.0f;
  for (int64_t g = 0; g < n; g += 4) {
    double t[5] = {acc};
    int k = 1;
    for (int64_t i = g; i < std::min(n, g + 4); ++i) t[k++] = term(i);
    for (int j = 0; j < k; ++j)
      if (!std::isfinite(t[j])) return std::numeric_limits<float>::quiet_NaN();
    int emax = std::numeric_limits<int>::min();
    for (int j = 0; j < k; ++j)
      if (t[j] != 0.0) emax = std::max(emax, std::ilogb(t[j]));
    if (emax == std::numeric_limits<int>::min()) continue;  // all zero: acc stays
    const double quantum = std::ldexp(1.0, emax - 23);
    double s = 0.0;  // exact: at most 5 x 2^24 quanta
    for (int j = 0; j < k; ++j) s += std::trunc(t[j] / quantum) * quantum;
    acc = truncate_to_f32(s);
  }
  return acc;
}

void softmax_f32(std::vector<float>& s) {
  const float mx = *std::max_element(s.begin(), s.end());
  for (float& v : s) v = std::exp(v - mx);  // expf
  const float z = sum_f32(static_cast<int64_t>(s.size()), Order::kReverse,
                          [&](int64_t i) { return s[i]; });
  for (float& v : s) v = v / z;
}

// A weight widened to f32 (exact), row-major.
std::vector<float> widen(const HostWeight& w) {
  std::vector<float> out(w.rows * w.cols);
  if (w.type == cpu::WeightType::kMxfp4)
    cpu::mxfp4_decode(w.bytes.data(), w.scales.data(), w.rows, w.cols, out.data());
  else
    cpu::widen_to_f32(w.type, w.bytes.data(), w.rows * w.cols, out.data());
  return out;
}

// ---- checks --------------------------------------------------------------------------------

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// The finite, non-zero element of median |want| (-1 if none).
int64_t median_element(const std::vector<float>& want) {
  std::vector<std::pair<float, int64_t>> m;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::isfinite(want[i]) && want[i] != 0.0f) m.push_back({std::fabs(want[i]), i});
  if (m.empty()) return -1;
  std::nth_element(m.begin(), m.begin() + m.size() / 2, m.end());
  return m[m.size() / 2].second;
}

// Per op, over all seeds: (tol + ulp) / |value|, and the largest share of its allowance the
// honest f32 result used; printed by the test that collected them.
struct Tightness {
  std::map<std::string, std::vector<double>> ratios;
  std::map<std::string, double> used;
  ~Tightness() {
    for (const auto& [op, r] : ratios)
      std::printf("[bounds] %-30s median (tol+ulp)/|value| %.3g, f32 uses <= %.3g of it (%zu)\n",
                  op.c_str(), median(r), used[op], r.size());
  }
};

// Parts 1 and 2 for one op output: the honest result passes; moving one element (first,
// median-magnitude, last finite) by 8x its allowance is caught, as exactly one mismatch.
void check(Tightness& tight, const std::string& op, uint64_t seed, const std::vector<float>& want,
           const std::vector<float>& honest, const std::vector<double>& tol) {
  SCOPED_TRACE(op + ", seed " + std::to_string(seed));
  ASSERT_EQ(want.size(), honest.size());
  ASSERT_EQ(want.size(), tol.size());
  EXPECT_EQ(compare(want, honest, tol, /*exact=*/false), "") << "honest f32 exceeds the bound";
  std::vector<int64_t> finite;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::isfinite(want[i])) finite.push_back(static_cast<int64_t>(i));
  ASSERT_FALSE(finite.empty());
  for (int64_t i : {finite.front(), median_element(want), finite.back()}) {
    if (i < 0) continue;
    std::vector<float> bad = honest;
    const double allowed = tol[i] + ulp(want[i]);
    const double dir = honest[i] >= want[i] ? 1.0 : -1.0;
    bad[i] = static_cast<float>(honest[i] + dir * 8 * allowed);
    EXPECT_EQ(compare(want, bad, tol, false).rfind("1 of ", 0), 0u)
        << "element " << i << " moved by 8x its allowance " << allowed << " passes";
  }
  auto& r = tight.ratios[op];
  double& used = tight.used[op];
  for (int64_t i : finite) {
    if (want[i] != 0.0f) r.push_back((tol[i] + ulp(want[i])) / std::fabs(want[i]));
    used = std::max(used, std::fabs(double{honest[i]} - want[i]) / (tol[i] + ulp(want[i])));
  }
}

// One element of median magnitude wrong by `rel` (relative) is caught.
void expect_catches_relative(const std::string& op, const std::vector<float>& want,
                             const std::vector<float>& honest, const std::vector<double>& tol,
                             double rel) {
  const int64_t i = median_element(want);
  ASSERT_GE(i, 0);
  std::vector<float> bad = honest;
  bad[i] = static_cast<float>(honest[i] + rel * want[i]);
  EXPECT_NE(compare(want, bad, tol, false), "")
      << op << ": an error of " << rel << " x |" << want[i] << "| at element " << i
      << " passes (its tol is " << tol[i] / std::fabs(want[i]) << " relative)";
}

// ---- 1, 2: each bounded op -----------------------------------------------------------------

TEST(BoundValidation, Linear) {
  Tightness tight;
  for (uint64_t seed : seeds()) {
    std::printf("[bounds] Linear seed %llu\n", static_cast<unsigned long long>(seed));
    std::mt19937_64 rng(seed);
    for (int64_t T : {1, 9}) {
      const std::pair<cpu::WeightType, int64_t> jobs[] = {
          {cpu::WeightType::kF32, odd_between(rng, 101, 301)},
          {cpu::WeightType::kBF16, odd_between(rng, 301, 1201)},
          {cpu::WeightType::kF16, odd_between(rng, 101, 301)},
          {cpu::WeightType::kMxfp4, 32 * odd_between(rng, 5, 41)}};
      for (const auto& [type, cols] : jobs) {
        const HostWeight w = HostWeight::random(rng, type, odd_between(rng, 41, 99), cols);
        const auto x = random_floats(rng, T * cols, -2.0f, 2.0f);
        std::vector<float> want(T * w.rows), got(T * w.rows);
        cpu::linear(w.view(), x.data(), T, want.data(), kRef);
        // T = 9 with BF16 weights: cuBLAS's three products on the split x, added smallest
        // first; otherwise one f32 sum of the products.
        const bool split = T >= 8 && type == cpu::WeightType::kBF16;
        const SplitX parts = split_x_like_cuda(x);
        const auto wf = widen(w);
        // Every output, each dot product summed by `sum` (on the split x: three, smallest first).
        const auto linear_by = [&](const auto& sum, std::vector<float>& y) {
          for (int64_t t = 0; t < T; ++t)
            for (int64_t r = 0; r < w.rows; ++r) {
              const auto dot = [&](const std::vector<float>& v) {
                return sum([&](int64_t c) { return wf[r * cols + c] * v[t * cols + c]; });
              };
              y[t * w.rows + r] =
                  split ? (dot(parts.lo) + dot(parts.mid)) + dot(parts.hi) : dot(x);
            }
        };
        linear_by(
            [&](const auto& term) {
              return sum_f32(cols, T == 1 ? Order::kStrided32 : Order::kReverse, term);
            },
            got);
        const std::vector<double> tol = linear_bound(w, x, T);
        const std::string op = std::string("linear ") + cpu::weight_type_name(type) +
                               (T == 1 ? " T=1" : split ? " T=9 (split x)" : " T=9");
        check(tight, op, seed, want, got, tol);
        // What one wrong element of median magnitude must be to be caught. The bound is
        // 2 gamma(cols + 2) |W||x|, and |W||x| / |y| grows like sqrt(cols): ~1e-3 of a typical
        // output at the BF16 / MXFP4 sizes (cols up to ~1300), ~2e-4 at F32 / F16's 101..301.
        const bool wide = type == cpu::WeightType::kBF16 || type == cpu::WeightType::kMxfp4;
        expect_catches_relative(op, want, got, tol, wide ? 1e-2 : 1e-3);
        // cuBLAS's prefill takes F32 and BF16 weights at T >= 8 (BF16 on the split x).
        if (T < 8 || (type != cpu::WeightType::kF32 && type != cpu::WeightType::kBF16)) continue;
        std::vector<float> like_blas(T * w.rows);
        linear_by([&](const auto& term) { return sum_like_tensor_cores(cols, term); }, like_blas);
        const std::vector<double> blas_tol = cublas_linear_bound(w, x, T);
        const std::string blas_op = op + ", cuBLAS-like";
        check(tight, blas_op, seed, want, like_blas, blas_tol);
        expect_catches_relative(blas_op, want, like_blas, blas_tol, wide ? 1e-2 : 1e-3);
      }
    }
  }
}

TEST(BoundValidation, RmsnormAndL2norm) {
  Tightness tight;
  for (uint64_t seed : seeds()) {
    std::printf("[bounds] Norms seed %llu\n", static_cast<unsigned long long>(seed));
    std::mt19937_64 rng(seed);
    const int64_t rows = odd_between(rng, 3, 9), n = odd_between(rng, 101, 777);
    auto x = random_floats(rng, rows * n, -3.0f, 3.0f);
    const auto gain = random_floats(rng, n, 0.5f, 1.5f);
    x[n + 3] = std::numeric_limits<float>::quiet_NaN();  // row 1 is NaN on both sides
    for (int variant = 0; variant < 3; ++variant) {
      const float* g = variant == 0 ? gain.data() : nullptr;
      const double eps = variant < 2 ? 1e-5 : 1e-6;
      std::vector<float> want(x.size()), got(x.size());
      if (variant < 2)
        cpu::rmsnorm(x.data(), g, rows, n, eps, want.data(), kRef);
      else
        cpu::l2norm(x.data(), rows, n, eps, want.data(), kRef);
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = &x[r * n];
        float ss = sum_f32(n, Order::kStrided32, [&](int64_t i) { return xr[i] * xr[i]; });
        if (variant < 2) ss = ss / static_cast<float>(n);
        const float inv = 1.0f / std::sqrt(ss + static_cast<float>(eps));
        for (int64_t i = 0; i < n; ++i) got[r * n + i] = g ? xr[i] * inv * g[i] : xr[i] * inv;
      }
      const std::string op = variant == 0 ? "rmsnorm (gain)" : variant == 1 ? "rmsnorm" : "l2norm";
      const auto tol = norm_bound(want, n);
      check(tight, op, seed, want, got, tol);
      if (variant < 2) expect_catches_relative(op, want, got, tol, 1e-3);
    }
  }
}

TEST(BoundValidation, WeightedSum) {
  Tightness tight;
  for (uint64_t seed : seeds()) {
    std::printf("[bounds] WeightedSum seed %llu\n", static_cast<unsigned long long>(seed));
    std::mt19937_64 rng(seed);
    for (int k : {1, 5, 16}) {
      const int64_t n = odd_between(rng, 101, 999);
      std::vector<std::vector<float>> vec;
      std::vector<const float*> ptrs;
      for (int j = 0; j < k; ++j) vec.push_back(random_floats(rng, n, -4.0f, 4.0f));
      for (const auto& v : vec) ptrs.push_back(v.data());
      const auto w = random_floats(rng, k, 0.0f, 1.0f);
      std::vector<float> want(n), got(n);
      cpu::weighted_sum(ptrs.data(), w.data(), k, n, want.data(), kRef);
      for (int64_t i = 0; i < n; ++i)
        got[i] = sum_f32(k, Order::kReverse, [&](int64_t j) { return w[j] * vec[j][i]; });
      check(tight, "weighted_sum k=" + std::to_string(k), seed, want, got, weighted_sum_bound(vec, w));
    }
  }
}

TEST(BoundValidation, KdaShortConv) {
  Tightness tight;
  const int K = 4;
  for (uint64_t seed : seeds()) {
    std::printf("[bounds] KdaShortConv seed %llu\n", static_cast<unsigned long long>(seed));
    std::mt19937_64 rng(seed);
    for (int64_t T : {1, 2, 7}) {
      const int64_t C = odd_between(rng, 33, 99);
      const auto u = random_floats(rng, T * C, -2.0f, 2.0f), w = random_floats(rng, C * K, -1.0f, 1.0f);
      const auto hist = random_floats(rng, (K - 1) * C, -2.0f, 2.0f);
      std::vector<float> want(T * C), got(T * C), h = hist;
      cpu::kda_short_conv(u.data(), T, C, w.data(), K, h.data(), want.data(), kRef);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < C; ++c) {
          const float y = sum_f32(K, Order::kReverse, [&](int64_t j) {
            const int64_t s = t - (K - 1) + j;
            return w[c * K + j] * (s >= 0 ? u[s * C + c] : hist[(K - 1 + s) * C + c]);
          });
          got[t * C + c] = y / (1.0f + std::exp(-y));  // SiLU with expf
        }
      check(tight, "kda_short_conv", seed, want, got, short_conv_bound(u, hist, w, T, C, K));
    }
  }
}

TEST(BoundValidation, KdaRecurrence) {
  Tightness tight;
  for (uint64_t seed : seeds()) {
    std::printf("[bounds] KdaRecurrence seed %llu\n", static_cast<unsigned long long>(seed));
    std::mt19937_64 rng(seed);
    const int H = odd_between(rng, 1, 5), Dk = odd_between(rng, 17, 129), Dv = odd_between(rng, 17, 129);
    const int64_t T = odd_between(rng, 1, 9);
    const RecurrenceInputs in = RecurrenceInputs::random(rng, T, H, Dk, Dv);
    const double q_scale = 1.0 / std::sqrt(double(Dk));
    std::vector<float> want(T * H * Dv), want_state = in.state, got(want.size()), S = in.state;
    cpu::kda_recurrence(in.q.data(), in.k.data(), in.v.data(), in.alpha.data(), in.beta.data(), T,
                        H, Dk, Dv, q_scale, want_state.data(), want.data(), kRef);
    // Everything in f32: the state, u = S^T k (from the end), d, the delta write, o (strided).
    const float qs = static_cast<float>(q_scale);
    for (int64_t t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        const int64_t th = t * H + h;
        const float *q = &in.q[th * Dk], *k = &in.k[th * Dk], *al = &in.alpha[th * Dk];
        float* Sh = &S[static_cast<int64_t>(h) * Dk * Dv];
        for (int j = 0; j < Dv; ++j) {
          for (int i = 0; i < Dk; ++i) Sh[i * Dv + j] = al[i] * Sh[i * Dv + j];
          const float uj = sum_f32(Dk, Order::kReverse, [&](int64_t i) { return k[i] * Sh[i * Dv + j]; });
          const float d = in.beta[th] * (in.v[th * Dv + j] - uj);
          for (int i = 0; i < Dk; ++i) Sh[i * Dv + j] = Sh[i * Dv + j] + k[i] * d;
          const float o = sum_f32(Dk, Order::kStrided32, [&](int64_t i) { return q[i] * Sh[i * Dv + j]; });
          got[th * Dv + j] = qs * o;
        }
      }
    const RecurrenceBound b = recurrence_bound(in, T, H, Dk, Dv, q_scale);
    check(tight, "kda_recurrence out", seed, want, got, b.out);
    check(tight, "kda_recurrence state", seed, want_state, S, b.state);
  }
}

TEST(BoundValidation, MlaAttention) {
  Tightness tight;
  for (uint64_t seed : seeds()) {
    std::printf("[bounds] MlaAttention seed %llu\n", static_cast<unsigned long long>(seed));
    std::mt19937_64 rng(seed);
    const cpu::MlaDims d{odd_between(rng, 1, 5), odd_between(rng, 9, 33), odd_between(rng, 3, 17),
                         odd_between(rng, 9, 33), odd_between(rng, 33, 99)};
    const int64_t T = odd_between(rng, 1, 3), n_past = odd_between(rng, 1, 41), N = n_past + T;
    const int64_t H = d.n_heads, dn = d.qk_nope, dr = d.qk_rope, dv = d.v_head, L = d.kv_lora;
    const auto q = random_floats(rng, T * H * (dn + dr), -1.0f, 1.0f);
    const auto cc = random_floats(rng, N * L, -1.0f, 1.0f), cr = random_floats(rng, N * dr, -1.0f, 1.0f);
    const auto type = seed % 2 ? cpu::WeightType::kBF16 : cpu::WeightType::kF32;
    const HostWeight kv_b = HostWeight::random(rng, type, H * (dn + dv), L);
    const double scale = 1.0 / std::sqrt(double(dn + dr));
    std::vector<float> want(T * H * dv), got(want.size());
    cpu::mla_attention(d, q.data(), T, kv_b.view(), cc.data(), cr.data(), n_past, scale,
                       want.data(), kRef);
    const auto wf = widen(kv_b);
    const float sc = static_cast<float>(scale);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const float* qn = &q[(t * H + h) * (dn + dr)];
        const float* qr = qn + dn;
        const int64_t uk0 = h * (dn + dv), uv0 = uk0 + dn, np = n_past + t + 1;
        std::vector<float> q_lat(L), c_hat(L), s(np);
        for (int64_t c = 0; c < L; ++c)
          q_lat[c] = sum_f32(dn, Order::kReverse, [&](int64_t i) { return wf[(uk0 + i) * L + c] * qn[i]; });
        for (int64_t p = 0; p < np; ++p)
          s[p] = sc * (sum_f32(L, Order::kStrided32, [&](int64_t c) { return q_lat[c] * cc[p * L + c]; }) +
                       sum_f32(dr, Order::kForward, [&](int64_t i) { return qr[i] * cr[p * dr + i]; }));
        softmax_f32(s);
        for (int64_t c = 0; c < L; ++c)
          c_hat[c] = sum_f32(np, Order::kStrided32, [&](int64_t p) { return s[p] * cc[p * L + c]; });
        for (int64_t r = 0; r < dv; ++r)
          got[(t * H + h) * dv + r] =
              sum_f32(L, Order::kReverse, [&](int64_t c) { return wf[(uv0 + r) * L + c] * c_hat[c]; });
      }
    check(tight, std::string("mla_attention ") + cpu::weight_type_name(type), seed, want, got,
          mla_bound(d, q, T, kv_b, cc, cr, n_past, scale));
  }
}

TEST(BoundValidation, AttnRes) {
  Tightness tight;
  for (uint64_t seed : seeds()) {
    std::printf("[bounds] AttnRes seed %llu\n", static_cast<unsigned long long>(seed));
    std::mt19937_64 rng(seed);
    for (int m : {2, 7}) {
      const int64_t T = odd_between(rng, 1, 5), n = odd_between(rng, 101, 401), stride = n + 2;
      std::vector<std::vector<float>> src;
      std::vector<const float*> ptrs;
      for (int i = 0; i < m; ++i) src.push_back(random_floats(rng, T * stride, -3.0f, 3.0f));
      for (const auto& v : src) ptrs.push_back(v.data());
      const auto f = random_floats(rng, n, -0.5f, 0.5f);
      const double eps = 1e-6;
      std::vector<float> want(T * n), got(T * n);
      cpu::attnres(ptrs.data(), m, stride, T, n, f.data(), eps, want.data(), kRef);
      for (int64_t t = 0; t < T; ++t) {
        std::vector<float> s(m);
        for (int i = 0; i < m; ++i) {
          const float* v = &src[i][t * stride];
          const float ss = sum_f32(n, Order::kStrided32, [&](int64_t j) { return v[j] * v[j]; });
          const float vf = sum_f32(n, Order::kReverse, [&](int64_t j) { return v[j] * f[j]; });
          s[i] = vf / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(eps));
        }
        softmax_f32(s);
        for (int64_t j = 0; j < n; ++j)
          got[t * n + j] = sum_f32(m, Order::kReverse, [&](int64_t i) { return s[i] * src[i][t * stride + j]; });
      }
      check(tight, "attnres m=" + std::to_string(m), seed, want, got,
            attnres_bound(src, stride, T, n, f, eps));
    }
  }
}

// ---- 3: compare()'s NaN / Inf / poison rules -----------------------------------------------

TEST(BoundValidation, CompareNanInfRules) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> want = {1.0f, -2.5f, inf, -inf, nan, 0.0f, 3.0f};
  const std::vector<double> huge(want.size(), 1e30);  // any finite difference would pass
  auto with = [&](size_t i, float v) {
    auto g = want;
    g[i] = v;
    return g;
  };
  EXPECT_EQ(compare(want, want, huge, false), "");  // NaN where want is NaN, same infinities
  EXPECT_EQ(compare(want, want, huge, true), "");
  for (size_t i : {0, 5, 6}) {  // NaN (either sign) or an infinity where want is finite
    EXPECT_NE(compare(want, with(i, nan), huge, false), "") << i;
    EXPECT_NE(compare(want, with(i, -nan), huge, false), "") << i;
    EXPECT_NE(compare(want, with(i, inf), huge, false), "") << i;
    EXPECT_NE(compare(want, with(i, -inf), huge, false), "") << i;
  }
  EXPECT_NE(compare(want, with(2, -inf), huge, false), "");  // wrong-signed infinity
  EXPECT_NE(compare(want, with(3, inf), huge, false), "");
  EXPECT_NE(compare(want, with(2, 3e38f), huge, false), "");  // finite where want is Inf
  EXPECT_NE(compare(want, with(2, nan), huge, false), "");
  EXPECT_NE(compare(want, with(4, 1.0f), huge, false), "");  // a number where want is NaN
  // A poisoned output (0xFF bytes, as Array::poisoned fills it) fails everywhere, where want
  // is NaN too (a kernel that skips a NaN row), and a poisoned reference fails as well.
  auto cpu = make_cpu_backend(kRef);
  const auto poisoned = Array<float>::poisoned(*cpu, want.size()).host();
  ASSERT_TRUE(std::isnan(poisoned[0]));
  EXPECT_EQ(compare(want, poisoned, huge, false).rfind("7 of 7 differ", 0), 0u);
  EXPECT_EQ(compare(want, poisoned, huge, true).rfind("7 of 7 differ", 0), 0u);
  EXPECT_EQ(compare(poisoned, want, huge, false).rfind("7 of 7 differ", 0), 0u);
  EXPECT_NE(compare(want, poisoned, huge, false).find("got never written"), std::string::npos);
  EXPECT_EQ(compare(want, with(4, -nan), huge, true), "");  // any other NaN is a NaN
  // Within tol + one ulp passes, beyond fails (the boundary compare() documents).
  const std::vector<float> one = {1.0f};
  const std::vector<double> tol = {1e-3};
  EXPECT_EQ(compare(one, {static_cast<float>(1.0 + 1e-3)}, tol, false), "");
  EXPECT_NE(compare(one, {static_cast<float>(1.0 + 1e-3 + 4 * ulp(1.0f))}, tol, false), "");
}

}  // namespace
}  // namespace ktier::backend::test
