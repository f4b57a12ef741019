// Bitwise invariance of every cpu/ op (NUMERICS.md §1): scalar == AVX2 == AVX-512, and
// 1 == 2 == 3 threads, on fresh random inputs of odd sizes, with outputs poisoned before each run,
// and with NaN/Inf inputs propagating to the same positions; plus the linear op over every tile
// shape of the vector kernels.

#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "cpu/kernels.h"
#include "op_cases.h"
#include "test_support.h"

namespace ktier::cpu::test {
namespace {

void expect_identical(const OpCase& c, const Exec& a, const Exec& b, const std::string& label) {
  const auto out_a = run_poisoned(c, a);
  const auto out_b = run_poisoned(c, b);
  for (size_t i = 0; i < out_a.size(); ++i)
    EXPECT_EQ(compare_bits(out_a[i].data(), out_b[i].data(), c.out_sizes[i]), "")
        << c.name << " (" << label << "), output " << i;
}

// Every vector kernel set against the scalar one: param (isa, with NaN/Inf/subnormal inputs).
class IsaEquivalence : public ::testing::TestWithParam<std::tuple<Isa, bool>> {
 protected:
  void SetUp() override {
    if (!isa_supported(isa())) GTEST_SKIP() << skip_reason(isa());
  }
  Isa isa() const { return std::get<0>(GetParam()); }
  CaseOptions options(uint64_t seed_finite, uint64_t seed_specials) const {
    CaseOptions opt;
    opt.specials = std::get<1>(GetParam());
    opt.seed = opt.specials ? seed_specials : seed_finite;
    return opt;
  }
};

TEST_P(IsaEquivalence, EveryOpWritesTheScalarBytes) {
  const auto cases = make_op_cases(options(99, 1234));
  ASSERT_GT(cases.size(), 50u);
  const std::string label = std::string("scalar vs ") + isa_name(isa());
  for (const OpCase& c : cases)
    expect_identical(c, Exec{nullptr, Isa::kScalar}, Exec{nullptr, isa()}, label);
}

TEST_P(IsaEquivalence, LinearWritesTheScalarBytesForEveryTileShape) {
  const auto cases = make_linear_sweep_cases(options(5, 6));
  ASSERT_GT(cases.size(), 1000u);
  const std::string label = std::string("scalar vs ") + isa_name(isa());
  for (const OpCase& c : cases)
    expect_identical(c, Exec{nullptr, Isa::kScalar}, Exec{nullptr, isa()}, label);
}

INSTANTIATE_TEST_SUITE_P(
    Inputs, IsaEquivalence,
    ::testing::Combine(::testing::Values(Isa::kAvx2, Isa::kAvx512), ::testing::Bool()),
    [](const auto& info) {
      return std::string(isa_name(std::get<0>(info.param))) +
             (std::get<1>(info.param) ? "_WithNanInf" : "_Finite");
    });

class ThreadInvariance : public ::testing::TestWithParam<Isa> {};

TEST_P(ThreadInvariance, OneTwoThreeThreadsWriteIdenticalBytes) {
  const Isa isa = GetParam();
  if (!isa_supported(isa)) GTEST_SKIP() << skip_reason(isa);
  ThreadPool p1(1), p2(2), p3(3);
  CaseOptions opt;
  opt.seed = 77;
  opt.large = true;
  int threaded = 0;
  for (const OpCase& c : make_op_cases(opt)) {
    if (!c.threaded) continue;
    ++threaded;
    const auto base = run_poisoned(c, Exec{nullptr, isa});
    for (ThreadPool* pool : {&p1, &p2, &p3}) {
      const auto out = run_poisoned(c, Exec{pool, isa});
      for (size_t i = 0; i < out.size(); ++i)
        EXPECT_EQ(compare_bits(base[i].data(), out[i].data(), c.out_sizes[i]), "")
            << c.name << " with " << pool->size() << " threads, output " << i;
    }
  }
  EXPECT_GT(threaded, 20);
}
INSTANTIATE_TEST_SUITE_P(Isas, ThreadInvariance, ::testing::ValuesIn(kAllIsas), IsaParamName());

// The pool itself: every index covered exactly once, for odd sizes and grains, nested calls inline.
TEST(ThreadPool, CoversEachIndexOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 17, 1000}) {
      for (int64_t grain : {1, 3, 64, 5000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
          EXPECT_LE(e - b, grain);
          pool.parallel_for(e - b, 1, [&](int64_t bb, int64_t ee) {  // nested: runs inline
            for (int64_t i = b + bb; i < b + ee; ++i) hits[i].fetch_add(1);
          });
        });
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(hits[i].load(), 1) << n << "/" << grain << "/" << i;
      }
    }
  }
}

}  // namespace
}  // namespace ktier::cpu::test
