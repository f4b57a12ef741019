// MXFP4 against the real released bytes (../shared/conformance/mxfp4.json, README §6) and the
// packed linear kernels against plain double dot products over the decoded matrix.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "common/test_paths.h"
#include "cpu/kernels.h"
#include "test_support.h"
#include "tests/common/fresh_seed.h"

namespace ktier::cpu::test {
namespace {

struct RealRows {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> packed, scales;
  std::vector<float> expected;
  std::vector<float> swapped_first64;
};

const RealRows& real_rows() {
  static const RealRows rr = [] {
    const Fixture fx = Fixture::load_path(ktier::test::conformance_dir() / "mxfp4.json");
    RealRows r;
    r.rows = static_cast<int64_t>(fx.number("rows"));
    r.cols = static_cast<int64_t>(fx.number("logical_width"));
    for (double v : fx.tensor("packed").data) r.packed.push_back(static_cast<uint8_t>(v));
    for (double v : fx.tensor("scales").data) r.scales.push_back(static_cast<uint8_t>(v));
    r.expected = fx.tensor("expected").f32();  // exact binary fractions: lossless
    for (const auto& v : fx.json().at("expected_swapped_nibbles").at("first64"))
      r.swapped_first64.push_back(static_cast<float>(v.get<double>()));
    return r;
  }();
  return rr;
}

WeightMatrix view(const RealRows& r, int64_t row0 = 0, int64_t rows = -1) {
  return {WeightType::kMxfp4, r.packed.data() + row0 * (r.cols / 2),
          r.scales.data() + row0 * (r.cols / 32), rows < 0 ? r.rows : rows, r.cols};
}

TEST(Mxfp4, DecodeIsBitExactOnRealBytes) {
  const RealRows& r = real_rows();
  ASSERT_EQ(static_cast<int64_t>(r.expected.size()), r.rows * r.cols);
  std::vector<float> got(r.rows * r.cols);
  mxfp4_decode(r.packed.data(), r.scales.data(), r.rows, r.cols, got.data());
  int64_t neg_zero = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &r.expected[i], 4);
    ASSERT_EQ(a, b) << "element " << i << ": " << got[i] << " vs " << r.expected[i];
    neg_zero += b == 0x80000000u;
  }
  EXPECT_GT(neg_zero, 0) << "the real bytes contain -0 (nibble 8); the check must see some";
  ASSERT_EQ(r.swapped_first64.size(), 64u);
  EXPECT_NE(std::memcmp(got.data(), r.swapped_first64.data(), 64 * sizeof(float)), 0)
      << "row 0 decodes like the swapped-nibble order";
}

// The kernel tests below run once per kernel set (scalar, AVX2, AVX-512), skipped where
// unsupported.
class Mxfp4Kernels : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam())) GTEST_SKIP() << skip_reason(GetParam());
  }
};
INSTANTIATE_TEST_SUITE_P(Isas, Mxfp4Kernels, ::testing::ValuesIn(kAllIsas), IsaParamName());

// The packed linear on the real rows vs a long-double dot product over the decoded matrix: the
// kernel sums exactly-representable products in double and rounds once, so it must land within
// one f32 ulp of the exact value (the final rounding, half an ulp, with room for the double
// rounding) plus the double sum's own error, gamma(cols) * sum|products| (u = 2^-53; Higham §3.1).
TEST_P(Mxfp4Kernels, PackedLinearMatchesDecodedDotProduct) {
  const RealRows& r = real_rows();
  std::vector<float> dec(r.rows * r.cols);
  mxfp4_decode(r.packed.data(), r.scales.data(), r.rows, r.cols, dec.data());
  std::mt19937_64 rng(7);
  const int64_t T = 3;
  const std::vector<float> x = random_floats(rng, T * r.cols);
  const Isa isa = GetParam();
  std::vector<float> y(T * r.rows);
  linear(view(r), x.data(), T, y.data(), Exec{nullptr, isa});
  const long double u = std::ldexp(1.0L, -53), n = static_cast<long double>(r.cols);
  const long double double_sum_gamma = n * u / (1 - n * u);
  int64_t not_nearest = 0;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t row = 0; row < r.rows; ++row) {
      long double exact = 0.0L, mag = 0.0L;
      for (int64_t i = 0; i < r.cols; ++i) {
        const long double p = static_cast<long double>(dec[row * r.cols + i]) * x[t * r.cols + i];
        exact += p;
        mag += std::fabs(p);
      }
      const float got = y[t * r.rows + row];
      const double ulp = std::nextafter(std::fabs(static_cast<float>(exact)), INFINITY) -
                         std::fabs(static_cast<float>(exact));
      EXPECT_LE(std::fabs(static_cast<long double>(got) - exact), ulp + double_sum_gamma * mag)
          << isa_name(isa) << " token " << t << " row " << row;
      not_nearest += got != static_cast<float>(exact);
    }
  }
  std::printf("[mxfp4] %s: %lld of %lld outputs differ from round-to-nearest(exact)\n",
              isa_name(isa), static_cast<long long>(not_nearest),
              static_cast<long long>(T * r.rows));
}

// Several experts in one call on two threads (the MoE pattern) == one scalar call per expert and
// token on one thread, bit for bit: neither the kernel set, the batch nor the threads change a
// token's result. Outputs start poisoned, so an unwritten row cannot pass as equal.
TEST_P(Mxfp4Kernels, MultiExpertJobsEqualSeparateScalarCalls) {
  const RealRows& r = real_rows();
  std::mt19937_64 rng(
      ktier::test::fresh_seed("Mxfp4Kernels.MultiExpertJobsEqualSeparateScalarCalls"));
  constexpr int kExperts = 4;
  const int64_t rows = r.rows / kExperts;
  std::vector<std::vector<float>> xs, together(kExperts), alone(kExperts);
  std::vector<LinearJob> jobs;
  for (int e = 0; e < kExperts; ++e) {
    xs.push_back(random_floats(rng, 2 * r.cols));
    together[e].resize(2 * rows);
    alone[e].resize(2 * rows);
    poison(together[e].data(), 2 * rows);
    poison(alone[e].data(), 2 * rows);
  }
  for (int e = 0; e < kExperts; ++e)
    jobs.push_back({view(r, e * rows, rows), xs[e].data(), 2, together[e].data()});
  ThreadPool pool(2);
  linear(jobs.data(), kExperts, Exec{&pool, GetParam()});
  for (int e = 0; e < kExperts; ++e) {
    for (int64_t t = 0; t < 2; ++t)
      linear(view(r, e * rows, rows), xs[e].data() + t * r.cols, 1, alone[e].data() + t * rows,
             Exec{nullptr, Isa::kScalar});
    EXPECT_EQ(count_poison(together[e].data(), 2 * rows), 0) << "expert " << e;
    EXPECT_EQ(count_poison(alone[e].data(), 2 * rows), 0) << "expert " << e;
    EXPECT_EQ(compare_bits(together[e].data(), alone[e].data(), 2 * rows), "") << "expert " << e;
  }
}

// Scale 255 is a zero block (D12): the block contributes nothing, even where x is NaN; scale 0
// (a subnormal multiplier in f32) is exact: its block adds 8 to block 2's 48, so a kernel that
// drops it, or flushes 2^-127 to zero, gives 48.
TEST_P(Mxfp4Kernels, EdgeScales) {
  const int64_t cols = 96;
  std::vector<uint8_t> packed(cols / 2), scales = {255, 0, 127};
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<uint8_t>(0x7f - i);
  std::vector<float> x(cols, 1.0f);
  x[3] = NAN;  // inside the zero block
  for (int64_t i = 32; i < 64; ++i) x[i] = 0x1p124f;
  const WeightMatrix w{WeightType::kMxfp4, packed.data(), scales.data(), 1, cols};
  std::vector<float> dec(cols);
  mxfp4_decode(packed.data(), scales.data(), 1, cols, dec.data());
  long double exact = 0.0L, without_scale0 = 0.0L;
  for (int64_t i = 32; i < cols; ++i) exact += static_cast<long double>(dec[i]) * x[i];
  for (int64_t i = 64; i < cols; ++i) without_scale0 += static_cast<long double>(dec[i]) * x[i];
  ASSERT_NE(static_cast<float>(exact), static_cast<float>(without_scale0));
  for (int64_t i = 0; i < 32; ++i) EXPECT_EQ(dec[i], 0.0f);
  const Isa isa = GetParam();
  float y = NAN;
  linear(w, x.data(), 1, &y, Exec{nullptr, isa});
  EXPECT_EQ(y, static_cast<float>(exact)) << isa_name(isa);
}

}  // namespace
}  // namespace ktier::cpu::test
