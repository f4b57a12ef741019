// The perplexity meter's arithmetic (runtime/perplexity.h), against values worked out by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "runtime/perplexity.h"

namespace ktier::runtime {
namespace {

TEST(Perplexity, UniformLogitsGiveTheVocabularySize) {
  for (const float level : {0.0f, -3.5f, 80.0f, 3.0e38f}) {
    const std::vector<float> logits(321, level);
    EXPECT_NEAR(negative_log_likelihood(logits.data(), 321, 17), std::log(321.0), 1e-12)
        << level;
    PerplexityMeter m;
    ASSERT_TRUE(m.add(logits.data(), 321, 0, 1).is_ok());
    ASSERT_TRUE(m.add(logits.data(), 321, 320, 2).is_ok());
    EXPECT_NEAR(m.perplexity(), 321.0, 1e-9) << level;
    EXPECT_EQ(m.perplexity_error(), 0.0);  // no spread
  }
}

TEST(Perplexity, IsTheExponentialOfTheMeanNegativeLogSoftmax) {
  // softmax of (0, ln 2, ln 5) is (1, 2, 5) / 8.
  const float logits[] = {0.0f, static_cast<float>(std::log(2.0)),
                          static_cast<float>(std::log(5.0))};
  const double nll0 = std::log(8.0), nll2 = std::log(8.0 / 5.0);
  EXPECT_NEAR(negative_log_likelihood(logits, 3, 0), nll0, 1e-7);
  EXPECT_NEAR(negative_log_likelihood(logits, 3, 2), nll2, 1e-7);
  PerplexityMeter m;
  ASSERT_TRUE(m.add(logits, 3, 0, 1).is_ok());
  ASSERT_TRUE(m.add(logits, 3, 2, 2).is_ok());
  EXPECT_EQ(m.count(), 2);
  const double mean = (nll0 + nll2) / 2;
  EXPECT_NEAR(m.mean_nll(), mean, 1e-7);
  EXPECT_NEAR(m.perplexity(), std::exp(mean), 1e-6);
  // Two values: population variance ((a - b) / 2)^2, standard error sqrt(var / (n - 1)).
  EXPECT_NEAR(m.perplexity_error(), std::exp(mean) * (nll0 - nll2) / 2, 1e-6);
}

TEST(Perplexity, ImpossibleTargetsAreInfiniteAndBadLogitsAreRefused) {
  const float inf = std::numeric_limits<float>::infinity();
  const float some[] = {1.0f, -inf, 2.0f};
  EXPECT_EQ(negative_log_likelihood(some, 3, 1), std::numeric_limits<double>::infinity());
  const float none[] = {-inf, -inf};
  EXPECT_EQ(negative_log_likelihood(none, 2, 0), std::numeric_limits<double>::infinity());
  {  // but a row where no token is possible is not an answer (check_logits)
    PerplexityMeter m;
    const Status s = m.add(none, 2, 0, 3);
    EXPECT_EQ(s.code(), ExitCode::kCorrupt);
    EXPECT_NE(s.message().find("after 3 positions are all -Inf"), std::string::npos)
        << s.message();
  }
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), inf}) {
    const float logits[] = {0.5f, bad, 0.25f};
    PerplexityMeter m;
    const Status s = m.add(logits, 3, 0, 7);
    EXPECT_EQ(s.code(), ExitCode::kCorrupt);
    EXPECT_NE(s.message().find("after 7 positions"), std::string::npos) << s.message();
    EXPECT_EQ(m.count(), 0);
  }
}

TEST(Perplexity, MatchesADirectSumOnRandomLogits) {
  std::mt19937 rng(::testing::UnitTest::GetInstance()->random_seed());
  std::normal_distribution<float> normal(0.0f, 4.0f);
  const int64_t V = 1009;
  std::vector<float> logits(V);
  for (float& l : logits) l = normal(rng);
  long double z = 0;
  for (float l : logits) z += std::exp(static_cast<long double>(l));
  for (const int32_t t : {0, 500, 1008})
    EXPECT_NEAR(negative_log_likelihood(logits.data(), V, t),
                static_cast<double>(std::log(z) - logits[static_cast<size_t>(t)]), 1e-12);
}

}  // namespace
}  // namespace ktier::runtime
