// The numerics contract of docs/NUMERICS.md, re-implemented here from the document's words and
// compared bit for bit with both kernel sets, so the kernels follow the written contract and not
// only each other. Plus denormals, tie rules and batch invariance.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <optional>

#include "cpu/float_bits.h"
#include "cpu/kernels.h"
#include "test_support.h"
#include "tests/common/fresh_seed.h"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace ktier::cpu::test {
namespace {

// Each contract test runs once per kernel set (scalar, AVX2, AVX-512), skipped where unsupported.
class Contract : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam())) GTEST_SKIP() << skip_reason(GetParam());
  }
};
INSTANTIATE_TEST_SUITE_P(Isas, Contract, ::testing::ValuesIn(kAllIsas), IsaParamName());

float bf16(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// §3 with `lanes` lanes: lanes (i % lanes), each from +0.0 in increasing i, exact products; a
// halving tree (l, l + lanes/2) ... (0, 1); one rounding to f32. The contract is 16 lanes; other
// counts show that a test tells them apart.
float lane_dot(const std::vector<double>& w, const float* x, int lanes) {
  double lane[32] = {};
  for (size_t i = 0; i < w.size(); ++i) lane[i % lanes] += w[i] * static_cast<double>(x[i]);
  for (int s = lanes / 2; s >= 1; s /= 2)
    for (int l = 0; l < s; ++l) lane[l] = lane[l] + lane[l + s];
  return static_cast<float>(lane[0]);
}
float contract_dot16(const std::vector<double>& w, const float* x) { return lane_dot(w, x, 16); }

// Token counts 1, 2 and 5 and 9 rows: every tile shape of the vector kernels (decode: 4, 2 and
// 1 rows; batches: 4, 2 and 1 tokens), and a width with a tail past the last 16. Weights of
// magnitude 2^-7 to 2^2 (exponent field 120-128, as trained weights are), so that no single
// term outweighs the rest and the order of the sums shows in the result: 1, 8 and 32 lanes
// must each disagree with the contract somewhere, or the test could not tell them apart.
TEST_P(Contract, Bf16LinearIsTheDocumentedDot16) {
  std::mt19937_64 rng(5);
  const int64_t rows = 9, cols = 97;
  std::vector<uint16_t> w(rows * cols);
  for (auto& h : w) {
    const uint64_t sign = rng() & 1, exponent = 120 + rng() % 9, mantissa = rng() & 0x7f;
    h = static_cast<uint16_t>((sign << 15) | (exponent << 7) | mantissa);
  }
  for (int64_t r = 0; r < rows; ++r) w[r * cols + 94] = w[r * cols + 3];  // cancelling pair:
  const Isa isa = GetParam();
  for (int64_t T : {1, 2, 5}) {
    std::vector<float> x(T * cols);  // well-scaled, so the planted pair's rounding stays visible
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    for (auto& v : x) v = unit(rng);
    for (int64_t t = 0; t < T; ++t) x[t * cols + 94] = -(x[t * cols + 3] = 0x1p48f);  // op_cases
    std::vector<float> y(T * rows);
    linear({WeightType::kBF16, w.data(), nullptr, rows, cols}, x.data(), T, y.data(),
           Exec{nullptr, isa});
    constexpr int kOtherLanes[3] = {1, 8, 32};
    int other_orders_differ[3] = {};
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<double> wr(cols);
        for (int64_t i = 0; i < cols; ++i) wr[i] = bf16(w[r * cols + i]);
        const float want = contract_dot16(wr, &x[t * cols]);
        EXPECT_EQ(compare_bits(&y[t * rows + r], &want, 1), "")
            << isa_name(isa) << " T " << T << " token " << t << " row " << r;
        for (int k = 0; k < 3; ++k) {
          const float other = lane_dot(wr, &x[t * cols], kOtherLanes[k]);
          other_orders_differ[k] += compare_bits(&other, &want, 1) != "";
        }
      }
    for (int k = 0; k < 3; ++k)
      EXPECT_GT(other_orders_differ[k], 0) << "T " << T << ": " << kOtherLanes[k]
                                           << " lanes agree with the contract on every output";
  }
}

// §4: per 32-block, 8 lanes (k % 8) of 2*E2M1 x products from +0.0; each lane times 2^(s-128)
// added into 8 row lanes in block order (scale 255 skipped); tree (l,l+4), (l,l+2), (0,1).
// 9 rows with a zero block only in row 0, and 1 and 5 tokens: the vector kernels' decode tiles
// with and without a zero block, their single rows, and their 4- and 1-token batch tiles.
TEST_P(Contract, Mxfp4LinearIsTheDocumentedBlockSum) {
  static const int twice[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  std::mt19937_64 rng(6);
  const int64_t rows = 9, cols = 160;
  std::vector<uint8_t> packed(rows * cols / 2), scales(rows * cols / 32);
  for (auto& b : packed) b = static_cast<uint8_t>(rng());
  for (auto& s : scales) s = static_cast<uint8_t>(118 + rng() % 7);  // real K3 scales are ~120
  scales[3] = 255;
  for (int64_t r = 0; r < rows; ++r) {  // cancelling pair in block 1: elements 33 and 62 = 6.0
    uint8_t* row = packed.data() + r * cols / 2;
    row[16] = static_cast<uint8_t>((row[16] & 0x0f) | 0x70);  // element 33: high nibble
    row[31] = static_cast<uint8_t>((row[31] & 0xf0) | 0x07);  // element 62: low nibble
  }
  const Isa isa = GetParam();
  for (int64_t T : {1, 5}) {
    std::vector<float> x(T * cols);  // well-scaled, so the planted pair's rounding stays visible
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    for (auto& v : x) v = unit(rng);
    for (int64_t t = 0; t < T; ++t) x[t * cols + 62] = -(x[t * cols + 33] = 0x1p48f);
    std::vector<float> y(T * rows);
    linear({WeightType::kMxfp4, packed.data(), scales.data(), rows, cols}, x.data(), T, y.data(),
           Exec{nullptr, isa});
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < rows; ++r) {
        double row[8] = {};
        for (int64_t g = 0; g < cols / 32; ++g) {
          const int s = scales[r * cols / 32 + g];
          if (s == 255) continue;
          double lane[8] = {};
          for (int k = 0; k < 32; ++k) {
            const int i = static_cast<int>(32 * g + k);
            const uint8_t byte = packed[r * cols / 2 + i / 2];
            lane[k % 8] +=
                twice[(i % 2) ? byte >> 4 : byte & 15] * static_cast<double>(x[t * cols + i]);
          }
          for (int l = 0; l < 8; ++l) row[l] += lane[l] * std::ldexp(1.0, s - 128);
        }
        for (int s = 4; s >= 1; s /= 2)
          for (int l = 0; l < s; ++l) row[l] = row[l] + row[l + s];
        const float want = static_cast<float>(row[0]);
        EXPECT_EQ(compare_bits(&y[t * rows + r], &want, 1), "")
            << isa_name(isa) << " T " << T << " token " << t << " row " << r;
      }
  }
}

// §3's dot16 of x with itself, written out: 16 lanes by index mod 16, then the halving tree.
double dot16_of_squares(const std::vector<double>& xd) {
  double lane[16] = {};
  for (size_t i = 0; i < xd.size(); ++i) lane[i % 16] += xd[i] * xd[i];
  for (int s = 8; s >= 1; s /= 2)
    for (int l = 0; l < s; ++l) lane[l] = lane[l] + lane[l + s];
  return lane[0];
}

// §5: sum of squares by dot16, inv = 1 / sqrt(ss / n + eps) in double, out = F((x * inv) * gain),
// or F(x * inv) without a gain; L2Norm: inv = 1 / sqrt(ss + eps). Odd widths, fresh inputs.
// This pins the formula (a float accumulator, or eps added elsewhere, differs), not the order
// of the sum of squares: its terms are positive, so a sequential double sum rounds to the same
// f32 outputs on these inputs too.
TEST_P(Contract, NormsAreTheDocumentedFormulas) {
  std::mt19937_64 rng(ktier::test::fresh_seed("Contract.NormsAreTheDocumentedFormulas"));
  const Isa isa = GetParam();
  for (const int64_t n : {1, 17, 54, 97}) {
    const std::vector<float> x = random_floats(rng, n), gain = random_floats(rng, n);
    const std::vector<double> xd(x.begin(), x.end());
    const double ss = dot16_of_squares(xd);
    const double eps = 1e-5;
    const double rms_inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
    const double l2_inv = 1.0 / std::sqrt(ss + eps);
    std::vector<float> with_gain(n), plain(n), l2(n);
    rmsnorm(x.data(), gain.data(), 1, n, eps, with_gain.data(), Exec{nullptr, isa});
    rmsnorm(x.data(), nullptr, 1, n, eps, plain.data(), Exec{nullptr, isa});
    l2norm(x.data(), 1, n, eps, l2.data(), Exec{nullptr, isa});
    for (int64_t i = 0; i < n; ++i) {
      const float want_gain = static_cast<float>((xd[i] * rms_inv) * static_cast<double>(gain[i]));
      const float want_plain = static_cast<float>(xd[i] * rms_inv);
      const float want_l2 = static_cast<float>(xd[i] * l2_inv);
      EXPECT_EQ(compare_bits(&with_gain[i], &want_gain, 1), "") << "rmsnorm n " << n << " " << i;
      EXPECT_EQ(compare_bits(&plain[i], &want_plain, 1), "") << "rmsnorm, no gain, n " << n
                                                              << " " << i;
      EXPECT_EQ(compare_bits(&l2[i], &want_l2, 1), "") << "l2norm n " << n << " " << i;
    }
  }
}

// §1: an F16 weight widens exactly, each kernel set by its own conversion (the vector kernels'
// vcvtph2ps, not the scalar widening): all 65536 patterns, one a row at column r % 16 among
// +0.0 weights, times x = 1, so each row's sum is its one pattern (a -0.0 becomes +0.0, as
// lanes start from +0.0; NaN stays NaN). f16_to_f32 itself is checked against the definition
// in tests/common/dtype_test.cpp.
TEST_P(Contract, F16WeightsWidenExactlyForEveryPattern) {
  const int64_t rows = 65536, cols = 16;
  std::vector<uint16_t> w(rows * cols, 0);
  for (int64_t r = 0; r < rows; ++r) w[r * cols + r % cols] = static_cast<uint16_t>(r);
  const std::vector<float> x(cols, 1.0f);
  std::vector<float> y = poisoned(rows);
  linear({WeightType::kF16, w.data(), nullptr, rows, cols}, x.data(), 1, y.data(),
         Exec{nullptr, GetParam()});
  // (compare_bits takes any NaN for any NaN, so a NaN row left holding the poison would pass.)
  EXPECT_EQ(count_poison(y.data(), rows), 0);
  for (int64_t r = 0; r < rows; ++r) {
    const float want = float_bits::f16_to_f32(static_cast<uint16_t>(r)) + 0.0f;
    EXPECT_EQ(compare_bits(&y[r], &want, 1), "") << "F16 pattern " << r;
  }
}

// §1: subnormals are neither flushed on input nor on output.
TEST_P(Contract, DenormalsAreKept) {
#if defined(__x86_64__)
  EXPECT_EQ(_mm_getcsr() & 0x8040u, 0u) << "FTZ or DAZ is set in MXCSR";
#endif
  const uint16_t w_bf16 = 0x0001;                     // 2^-133, a bf16 subnormal
  const uint8_t packed[16] = {0x01}, scale[1] = {0};  // 0.5 * 2^-127 = 2^-128
  std::vector<float> x(32, 0.0f);
  x[0] = 1.0f;
  const Isa isa = GetParam();
  float y = 0.0f;
  linear({WeightType::kBF16, &w_bf16, nullptr, 1, 1}, x.data(), 1, &y, Exec{nullptr, isa});
  EXPECT_EQ(y, std::ldexp(1.0f, -133)) << isa_name(isa);
  linear({WeightType::kMxfp4, packed, scale, 1, 32}, x.data(), 1, &y, Exec{nullptr, isa});
  EXPECT_EQ(y, std::ldexp(1.0f, -128)) << isa_name(isa);
}

// §10: ties go to the lower index, for the router (equal biased scores) and argmax.
TEST_P(Contract, TiesGoToTheLowerIndex) {
  const std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f, 2.0f, NAN};
  const Isa isa = GetParam();
  int32_t ids[3];
  float w[3];
  router_topk(logits.data(), nullptr, 1, 6, 3, false, 1.0, ids, w, Exec{nullptr, isa});
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
  EXPECT_EQ(ids[2], 4);
  EXPECT_EQ(argmax(logits.data(), 6, Exec{nullptr, isa}), 1);
  std::vector<float> big(1000, -1.0f);
  big[517] = big[901] = 3.0f;
  big[3] = NAN;
  EXPECT_EQ(argmax(big.data(), 1000, Exec{nullptr, isa}), 517);
}

// The ops the model runs in place (out == x, as kernels.h allows: the KDA q/k norms, the
// gates, the residual sums) write the bytes they write out of place, on every kernel set; the
// invariance tests hold the out-of-place results to the scalar kernels'. Widths with vector
// tails, several rows.
TEST_P(Contract, InPlaceOpsEqualOutOfPlace) {
  std::mt19937_64 rng(ktier::test::fresh_seed("Contract.InPlaceOpsEqualOutOfPlace"));
  const Exec ex{nullptr, GetParam()};
  const int64_t rows = 3, n = 101;
  const std::vector<float> x = random_floats(rng, rows * n), y = random_floats(rng, rows * n),
                           gain = random_floats(rng, n);
  // Runs `op(in, out)` out of place into a poisoned buffer, then in place on a copy of `in`
  // (for two-input ops, the one named by `in`).
  const auto same = [&](const char* what, const std::vector<float>& in,
                        const std::function<void(const float*, float*)>& op) {
    std::vector<float> out(in.size()), inplace = in;
    poison(out.data(), static_cast<int64_t>(out.size()));
    op(in.data(), out.data());
    op(inplace.data(), inplace.data());
    EXPECT_EQ(count_poison(out.data(), static_cast<int64_t>(out.size())), 0) << what;
    EXPECT_EQ(compare_bits(out.data(), inplace.data(), static_cast<int64_t>(out.size())), "")
        << what << " on " << isa_name(ex.isa);
  };
  same("rmsnorm", x,
       [&](const float* a, float* o) { rmsnorm(a, gain.data(), rows, n, 1e-6, o, ex); });
  same("rmsnorm without a gain", x,
       [&](const float* a, float* o) { rmsnorm(a, nullptr, rows, n, 1e-6, o, ex); });
  same("l2norm", x, [&](const float* a, float* o) { l2norm(a, rows, n, 1e-6, o, ex); });
  same("sigmoid", x, [&](const float* a, float* o) { sigmoid(a, rows * n, o, ex); });
  same("sigmoid_gate", x,
       [&](const float* a, float* o) { sigmoid_gate(a, y.data(), rows * n, o, ex); });
  same("add (a)", x, [&](const float* a, float* o) { add(a, y.data(), rows * n, o, ex); });
  same("add (b)", y, [&](const float* b, float* o) { add(x.data(), b, rows * n, o, ex); });
  for (const std::optional<double> beta2 : {std::optional<double>(3.0), std::optional<double>()}) {
    same("situ_glu (a)", x,
         [&](const float* a, float* o) { situ_glu(a, y.data(), rows * n, 4.0, beta2, o, ex); });
    same("situ_glu (b)", y,
         [&](const float* b, float* o) { situ_glu(x.data(), b, rows * n, 4.0, beta2, o, ex); });
  }
}

// A token's linear result never depends on the batch it is in, nor on the kernel set: a batch
// of T equals T one-token scalar calls, bit for bit. Float widths with a tail past 16, MXFP4
// with random scales, zero blocks (scale 255) among them; outputs start poisoned.
TEST_P(Contract, LinearBatchInvariance) {
  std::mt19937_64 rng(ktier::test::fresh_seed("Contract.LinearBatchInvariance"));
  for (WeightType type : {WeightType::kF32, WeightType::kMxfp4}) {
    const int64_t rows = 7, cols = type == WeightType::kF32 ? 97 : 96, T = 5;
    std::vector<float> wf = random_floats(rng, rows * cols);
    std::vector<uint8_t> packed(rows * cols / 2), scales(rows * cols / 32);
    for (auto& b : packed) b = static_cast<uint8_t>(rng());
    for (auto& s : scales) s = rng() % 4 == 0 ? 255 : static_cast<uint8_t>(110 + rng() % 20);
    const WeightMatrix w = type == WeightType::kF32
                               ? WeightMatrix{type, wf.data(), nullptr, rows, cols}
                               : WeightMatrix{type, packed.data(), scales.data(), rows, cols};
    const std::vector<float> x = random_floats(rng, T * cols);
    const Isa isa = GetParam();
    std::vector<float> all(T * rows), one(T * rows);
    poison(all.data(), T * rows);
    poison(one.data(), T * rows);
    linear(w, x.data(), T, all.data(), Exec{nullptr, isa});
    for (int64_t t = 0; t < T; ++t)
      linear(w, x.data() + t * cols, 1, one.data() + t * rows, Exec{nullptr, Isa::kScalar});
    EXPECT_EQ(count_poison(all.data(), T * rows), 0) << isa_name(isa);
    EXPECT_EQ(count_poison(one.data(), T * rows), 0);
    EXPECT_EQ(compare_bits(all.data(), one.data(), T * rows), "") << isa_name(isa);
  }
}

}  // namespace
}  // namespace ktier::cpu::test
