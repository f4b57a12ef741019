// Log-probabilities (runtime/logprobs.h): log softmax in double against a long-double sum on
// fresh random rows of odd sizes, the most likely tokens in their documented order, and the
// edges (-Inf logits, logits near the float range, all impossible).
#include "runtime/logprobs.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "runtime/perplexity.h"
#include "tests/common/fresh_seed.h"

namespace ktier::runtime {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// log softmax(l)[i] with long-double sums (a reference, not the code's order).
long double reference(const std::vector<float>& l, size_t i) {
  long double max = -INFINITY;
  for (const float x : l) max = std::max<long double>(max, x);
  long double sum = 0;
  for (const float x : l) sum += std::exp(static_cast<long double>(x) - max);
  return (static_cast<long double>(l[i]) - max) - std::log(sum);
}

TEST(Logprobs, EveryTokensIsLogSoftmaxOfTheLogits) {
  const uint64_t seed = ktier::test::fresh_seed("Logprobs.EveryTokensIsLogSoftmaxOfTheLogits");
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (const int64_t V : {1, 7, 333, 4099}) {
    SCOPED_TRACE("V " + std::to_string(V));
    std::normal_distribution<float> normal(0.f, 6.f);
    std::vector<float> l(static_cast<size_t>(V));
    for (float& x : l) x = normal(rng);
    // Double sums of V terms each within 1 ulp: the log of the sum is off by at most ~V ulp of
    // it relative, the difference l - max is exact in double.
    const double tolerance = 4.0 * static_cast<double>(V) * std::numeric_limits<double>::epsilon();
    double total = 0;
    for (int64_t i = 0; i < V; ++i) {
      const TokenLogprobs t = token_logprobs(l.data(), V, static_cast<int32_t>(i), 0);
      EXPECT_EQ(t.chosen.id, i);
      EXPECT_NEAR(t.chosen.logprob, static_cast<double>(reference(l, i)), tolerance);
      EXPECT_TRUE(t.top.empty());
      // The perplexity's NLL is the same number, to the bit.
      EXPECT_EQ(negative_log_likelihood(l.data(), V, static_cast<int32_t>(i)), -t.chosen.logprob);
      total += std::exp(t.chosen.logprob);
    }
    EXPECT_NEAR(total, 1.0, tolerance);
  }
}

TEST(Logprobs, TheMostLikelyComeFirstLowerIdFirstAmongEquals) {
  const std::vector<float> l = {1.f, 3.f, -kInf, 3.f, 2.f, -kInf, 0.5f};
  const int64_t V = static_cast<int64_t>(l.size());
  TokenLogprobs t = token_logprobs(l.data(), V, 6, 4);
  ASSERT_EQ(t.top.size(), 4u);
  const int32_t order[] = {1, 3, 4, 0};
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(t.top[k].id, order[k]);
    EXPECT_EQ(t.top[k].logprob, token_logprobs(l.data(), V, order[k], 0).chosen.logprob);
  }
  EXPECT_EQ(t.top[0].logprob, t.top[1].logprob);
  // More than V: all of them, the impossible last (by id), at -Inf.
  t = token_logprobs(l.data(), V, 2, 100);
  ASSERT_EQ(t.top.size(), l.size());
  EXPECT_EQ(t.top[5].id, 2);
  EXPECT_EQ(t.top[6].id, 5);
  EXPECT_EQ(t.top[6].logprob, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(t.chosen.logprob, -std::numeric_limits<double>::infinity());
  // Random rows: the top k are the k largest, in order, each its own log softmax.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> coarse(-20, 20);  // many equal logits
  std::vector<float> r(1001);
  for (float& x : r) x = static_cast<float>(coarse(rng)) * 0.25f;
  t = token_logprobs(r.data(), 1001, 500, 20);
  ASSERT_EQ(t.top.size(), 20u);
  for (size_t k = 1; k < t.top.size(); ++k) {
    const float a = r[t.top[k - 1].id], b = r[t.top[k].id];
    EXPECT_TRUE(a > b || (a == b && t.top[k - 1].id < t.top[k].id)) << k;
  }
  int above = 0;  // tokens strictly more likely than the 20th: all among the 20
  for (const float x : r) above += x > r[t.top.back().id];
  EXPECT_LT(above, 20);
}

TEST(Logprobs, LogitsNearTheFloatRangeAndImpossibleRows) {
  // The difference first: max + log(sum) would lose log 2 against 3e38.
  const std::vector<float> big = {3e38f, 3e38f, -3e38f};
  const TokenLogprobs t = token_logprobs(big.data(), 3, 0, 0);
  EXPECT_DOUBLE_EQ(t.chosen.logprob, -std::log(2.0));
  const std::vector<float> none = {-kInf, -kInf};
  EXPECT_EQ(token_logprobs(none.data(), 2, 1, 1).chosen.logprob,
            -std::numeric_limits<double>::infinity());
}

}  // namespace
}  // namespace ktier::runtime
