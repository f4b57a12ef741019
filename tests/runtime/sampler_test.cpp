// The sampler's contract (runtime/sampler.h): greedy = argmax with the lowest-index tie rule;
// seeded sampling reproducible and distributed as the kept, renormalised softmax.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "runtime/sampler.h"

namespace ktier::runtime {
namespace {

TEST(Sampler, GreedyTakesTheLowestIndexOfTiedMaxima) {
  const std::vector<float> l = {0.5f, 2.0f, NAN, 2.0f, -1.0f};
  Sampler s({});
  EXPECT_EQ(s.next(l.data(), 5, {}), 1);
}

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
  std::vector<float> l(50);
  for (size_t i = 0; i < l.size(); ++i) l[i] = std::sin(0.7f * i);
  auto draw = [&](uint64_t seed) {
    Sampler s({1.0, 0, 1.0, seed});
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.next(l.data(), 50, {}));
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

// A sampler that skips the draws another made goes on as that one (a resumed conversation);
// greedy and all-NaN rows draw nothing.
TEST(Sampler, SkippingTheDrawsMadeGoesOnAsTheSameSampler) {
  std::vector<float> l(50);
  for (size_t i = 0; i < l.size(); ++i) l[i] = std::sin(0.7f * i);
  Sampler first({0.8, 10, 0.95, 3});
  for (int i = 0; i < 17; ++i) first.next(l.data(), 50, {});
  EXPECT_EQ(first.draws(), 17u);
  Sampler resumed({0.8, 10, 0.95, 3});
  resumed.skip_draws(first.draws());
  EXPECT_EQ(resumed.draws(), 17u);
  for (int i = 0; i < 20; ++i)
    EXPECT_EQ(resumed.next(l.data(), 50, {}), first.next(l.data(), 50, {}));
  Sampler greedy({});
  greedy.next(l.data(), 50, {});
  const std::vector<float> nan(5, NAN);
  first.next(nan.data(), 5, {});
  EXPECT_EQ(greedy.draws(), 0u);
  EXPECT_EQ(first.draws(), 37u);
}

TEST(Sampler, TopKOneAndTinyOrZeroTopPAreGreedy) {
  const std::vector<float> l = {0.1f, 0.3f, 0.9f, 0.9f, -2.0f};
  for (const SamplingParams& p :
       {SamplingParams{1.5, 1, 1.0, 3}, SamplingParams{1.5, 0, 1e-9, 3},
        SamplingParams{1.5, 0, 0.0, 3}}) {
    Sampler s(p);
    for (int i = 0; i < 20; ++i) EXPECT_EQ(s.next(l.data(), 5, {}), 2);
  }
}

TEST(Sampler, FrequenciesFollowTheKeptRenormalisedSoftmax) {
  // logits ln(4), ln(3), ln(2), ln(1), -inf at T = 1: p = .4 .3 .2 .1 0. top_k 3 keeps
  // 4/9, 3/9, 2/9; then top_p 0.7 keeps the first two (4/9 + 3/9 >= 0.7): 4/7, 3/7.
  const std::vector<float> l = {std::log(3.f), std::log(4.f), std::log(1.f), -INFINITY,
                                std::log(2.f)};
  const int n = 40000;
  std::map<int32_t, int> count;
  Sampler s({1.0, 3, 0.7, 42});
  for (int i = 0; i < n; ++i) ++count[s.next(l.data(), 5, {})];
  ASSERT_EQ(count.size(), 2u);
  // 5 standard deviations of a binomial with p = 4/7 over n draws.
  const double p = 4.0 / 7.0, sd = std::sqrt(n * p * (1 - p));
  EXPECT_NEAR(count[1], n * p, 5 * sd);
  EXPECT_NEAR(count[0], n * (1 - p), 5 * sd);
}

TEST(Sampler, MinPKeepsTokensAtLeastThatFractionOfTheLikeliest) {
  // logits ln(8), ln(4), ln(2), ln(1) at T = 1: relative p 1, .5, .25, .125. min_p 0.2 keeps
  // the first three: 8/14, 4/14, 2/14; at T = 2 the relative p are 1, .71, .5, .35: all kept
  // at min_p 0.3, the last cut at 0.4 (the cut follows the temperature, as HF's).
  const std::vector<float> l = {std::log(2.f), std::log(8.f), std::log(1.f), std::log(4.f)};
  const int n = 40000;
  std::map<int32_t, int> count;
  Sampler s({1.0, 0, 1.0, 9, 0.2});
  for (int i = 0; i < n; ++i) ++count[s.next(l.data(), 4, {})];
  ASSERT_EQ(count.size(), 3u);
  EXPECT_EQ(count.count(2), 0u);
  for (const auto& [id, want] : std::map<int32_t, double>{{1, 8.0 / 14}, {3, 4.0 / 14},
                                                          {0, 2.0 / 14}}) {
    const double sd = std::sqrt(n * want * (1 - want));
    EXPECT_NEAR(count[id], n * want, 5 * sd) << id;
  }
  const auto kept = [&](double temperature, double min_p) {
    std::map<int32_t, int> seen;
    Sampler t({temperature, 0, 1.0, 4, min_p});
    for (int i = 0; i < 4000; ++i) ++seen[t.next(l.data(), 4, {})];
    return seen.size();
  };
  EXPECT_EQ(kept(2.0, 0.3), 4u);
  EXPECT_EQ(kept(2.0, 0.4), 3u);
  EXPECT_EQ(kept(1.0, 1.0), 1u);  // only the likeliest (no tie)
}

// llama.cpp's order (temperature_last): min-p and top-p cut on the p of temperature 1, and the
// draw is at the temperature over what they kept.
TEST(Sampler, TemperatureLastCutsAtTemperatureOneAndDrawsAtTheTemperature) {
  // logits ln(8), ln(4), ln(2), ln(1), at T = 2. min_p 0.4: relative p at T = 1 are 1, .5,
  // .25, .125, so two are kept (three by the T = 2 cut); drawn at T = 2 they are
  // sqrt(8) : sqrt(4), i.e. 0.586 : 0.414 (0.667 : 0.333 at T = 1).
  const std::vector<float> l = {std::log(2.f), std::log(8.f), std::log(1.f), std::log(4.f)};
  SamplingParams p;
  p.temperature = 2.0;
  p.min_p = 0.4;
  p.seed = 11;
  p.temperature_last = true;
  const int n = 40000;
  std::map<int32_t, int> count;
  Sampler s(p);
  for (int i = 0; i < n; ++i) ++count[s.next(l.data(), 4, {})];
  ASSERT_EQ(count.size(), 2u);
  const double want = std::sqrt(8.0) / (std::sqrt(8.0) + 2.0);
  const double sd = std::sqrt(n * want * (1 - want));
  EXPECT_NEAR(count[1], n * want, 5 * sd);
  EXPECT_NEAR(count[3], n * (1 - want), 5 * sd);
  // top_p 0.7 over p .4 .3 .2 .1 at T = 1 keeps two; at T = 2 (.33 .28 .23 .16) it keeps three.
  const std::vector<float> q = {std::log(4.f), std::log(3.f), std::log(2.f), std::log(1.f)};
  const auto kept = [&](bool temperature_last) {
    SamplingParams t;
    t.temperature = 2.0;
    t.top_p = 0.7;
    t.seed = 5;
    t.temperature_last = temperature_last;
    Sampler sampler(t);
    std::map<int32_t, int> seen;
    for (int i = 0; i < 4000; ++i) ++seen[sampler.next(q.data(), 4, {})];
    return seen.size();
  };
  EXPECT_EQ(kept(true), 2u);
  EXPECT_EQ(kept(false), 3u);
}

// Penalties (llama.cpp's rule): a positive logit divided by repeat_penalty, a negative one
// multiplied, then less count * frequency_penalty + presence_penalty; only ids among the last
// repeat_last_n; greedy included.
TEST(Sampler, PenaltiesLowerTheLogitsOfIdsAlreadyInTheSequence) {
  const auto greedy = [](SamplingParams p, const std::vector<float>& l,
                         const std::vector<int32_t>& sequence) {
    Sampler s(p);
    return s.next(l.data(), static_cast<int64_t>(l.size()), sequence);
  };
  const std::vector<float> positive = {2.0f, 1.9f, -1.0f};
  EXPECT_EQ(greedy({}, positive, {0, 0}), 0);  // no penalty by default
  EXPECT_EQ(greedy({.repeat_penalty = 1.1}, positive, {0}), 1);   // 2.0 / 1.1 < 1.9
  EXPECT_EQ(greedy({.repeat_penalty = 1.05}, positive, {0}), 0);  // 2.0 / 1.05 > 1.9
  EXPECT_EQ(greedy({.repeat_penalty = 1.1, .repeat_last_n = 0}, positive, {0}), 0);
  EXPECT_EQ(greedy({.repeat_penalty = 1.1, .repeat_last_n = 1}, positive, {0, 2}), 0);
  EXPECT_EQ(greedy({.repeat_penalty = 1.1, .repeat_last_n = 2}, positive, {0, 2}), 1);
  std::vector<int32_t> long_ago(70, 2);  // 0, then 69 others: past the default 64
  long_ago[0] = 0;
  EXPECT_EQ(greedy({.repeat_penalty = 1.1}, positive, long_ago), 0);
  EXPECT_EQ(greedy({.repeat_penalty = 1.1, .repeat_last_n = -1}, positive, long_ago), 1);
  // A negative logit is multiplied: -1.0 * 2 = -2.0 < -1.5.
  EXPECT_EQ(greedy({.repeat_penalty = 2.0}, {-1.0f, -1.5f}, {0}), 1);
  EXPECT_EQ(greedy({.repeat_penalty = 1.2}, {-1.0f, -1.5f}, {0}), 0);  // -1.2 > -1.5
  // Frequency: 3.0 less 0.4 per occurrence; presence: once, whatever the count.
  const std::vector<float> three = {3.0f, 1.9f, 2.1f};
  EXPECT_EQ(greedy({.frequency_penalty = 0.4}, three, {0, 0, 1, 0}), 2);  // 1.8 < 2.1
  EXPECT_EQ(greedy({.frequency_penalty = 0.4}, three, {0, 0, 1}), 0);         // 2.2 > 2.1
  EXPECT_EQ(greedy({.presence_penalty = 0.95}, three, {0, 0, 0, 0, 0}), 2);   // 2.05 < 2.1
  EXPECT_EQ(greedy({.presence_penalty = 0.85}, three, {0, 0, 0, 0, 0}), 0);   // 2.15 > 2.1
  // Penalties add up: 3.0 / 1.25 = 2.4, less 0.1 * 2 + 0.15 = 2.05 < 2.1.
  EXPECT_EQ(greedy({.repeat_penalty = 1.25, .presence_penalty = 0.15, .frequency_penalty = 0.1},
                   three, {0, 0}),
            2);
  // A finite logit stays finite (clamped to the float range); -Inf stays -Inf.
  const float big = 3e38f, inf = INFINITY;
  EXPECT_EQ(greedy({.repeat_penalty = 1e-3}, {big, big, -inf}, {0, 2}), 0);
  Sampler sampled({.temperature = 1.0, .repeat_penalty = 1e-3});
  const std::vector<float> l = {big, -big, -inf};
  const std::vector<int32_t> sequence = {0, 2};
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sampled.next(l.data(), 3, sequence), 0);
}

TEST(Sampler, PresencePenaltyOfLn2HalvesTheOddsOfASeenToken) {
  const std::vector<float> l = {0.5f, 0.5f};
  const std::vector<int32_t> sequence = {1};
  const int n = 30000;
  int seen = 0;
  Sampler s({.temperature = 1.0, .seed = 5, .presence_penalty = std::log(2.0)});
  for (int i = 0; i < n; ++i) seen += s.next(l.data(), 2, sequence) == 1;
  const double p = 1.0 / 3, sd = std::sqrt(n * p * (1 - p));
  EXPECT_NEAR(seen, n * p, 5 * sd);
}

TEST(Sampler, RejectsOutOfRangeParameters) {
  EXPECT_EQ(validate({-0.1, 0, 1.0, 0}).exit_code(), 2);
  EXPECT_EQ(validate({NAN, 0, 1.0, 0}).exit_code(), 2);
  EXPECT_EQ(validate({1.0, -1, 1.0, 0}).exit_code(), 2);
  EXPECT_EQ(validate({1.0, 0, -0.01, 0}).exit_code(), 2);
  EXPECT_EQ(validate({1.0, 0, NAN, 0}).exit_code(), 2);
  EXPECT_EQ(validate({1.0, 0, 1.5, 0}).exit_code(), 2);
  EXPECT_TRUE(validate({1.0, 0, 0.0, 0}).is_ok());  // top_p 0: the most likely token only
  EXPECT_EQ(validate({1.0, 0, 1.0, 0, -0.1}).exit_code(), 2);
  EXPECT_EQ(validate({1.0, 0, 1.0, 0, 1.1}).exit_code(), 2);
  EXPECT_EQ(validate({1.0, 0, 1.0, 0, NAN}).exit_code(), 2);
  EXPECT_EQ(validate({.repeat_penalty = 0}).exit_code(), 2);
  EXPECT_EQ(validate({.repeat_penalty = -1}).exit_code(), 2);
  EXPECT_EQ(validate({.repeat_penalty = INFINITY}).exit_code(), 2);
  EXPECT_EQ(validate({.repeat_last_n = -2}).exit_code(), 2);
  EXPECT_EQ(validate({.presence_penalty = NAN}).exit_code(), 2);
  EXPECT_EQ(validate({.frequency_penalty = -INFINITY}).exit_code(), 2);
  EXPECT_TRUE(validate({0.8, 40, 0.95, 1}).is_ok());
  EXPECT_TRUE(validate({.repeat_penalty = 0.5, .repeat_last_n = -1, .presence_penalty = -2,
                        .frequency_penalty = 2})
                  .is_ok());
  EXPECT_FALSE(penalizes({}));
  EXPECT_FALSE(penalizes({.repeat_penalty = 1.3, .repeat_last_n = 0}));
  EXPECT_TRUE(penalizes({.frequency_penalty = -0.5}));
}

// logit_bias (serve's): added to the logit before the penalties (llama.cpp's order), greedy and
// sampled alike; -Inf is never drawn; a bias that is NaN or +Inf is refused.
TEST(Sampler, LogitBiasComesBeforeThePenaltiesAndMinusInfinityIsNeverDrawn) {
  const std::vector<float> l = {1.0f, -1.75f, -3.0f};
  const std::vector<int32_t> seen = {0};
  // Bias first: (1 - 2) * 2 = -2 < -1.75. Penalty first: 1 / 2 - 2 = -1.5 > -1.75.
  Sampler both({.repeat_penalty = 2, .logit_bias = {{0, -2.0f}}});
  EXPECT_EQ(both.next(l.data(), 3, seen), 1);
  Sampler penalty_only({.repeat_penalty = 2});
  EXPECT_EQ(penalty_only.next(l.data(), 3, seen), 0);
  Sampler raised({.logit_bias = {{2, 4.5f}}});
  EXPECT_EQ(raised.next(l.data(), 3, {}), 2);
  const float banned = -INFINITY;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    Sampler hot({.temperature = 5.0, .seed = seed, .logit_bias = {{0, banned}, {1, banned}}});
    EXPECT_EQ(hot.next(l.data(), 3, {}), 2) << seed;
  }
  EXPECT_EQ(validate({.logit_bias = {{0, NAN}}}).exit_code(), 2);
  EXPECT_EQ(validate({.logit_bias = {{0, INFINITY}}}).exit_code(), 2);
  EXPECT_EQ(validate({.logit_bias = {{-1, 1.0f}}}).exit_code(), 2);
  EXPECT_TRUE(validate({.logit_bias = {{0, banned}, {7, -100.0f}}}).is_ok());
}

// Every id of the vocabulary with a -Inf bias (repeats and finite biases beside them counted
// once): what callers refuse, since greedy's rule for a row of -Inf would draw banned id 0.
TEST(Sampler, BansEveryTokenOnlyWhenEachIdHasAMinusInfinityBias) {
  const float banned = -std::numeric_limits<float>::infinity();
  EXPECT_FALSE(bans_every_token({}, 3));
  EXPECT_FALSE(bans_every_token({.logit_bias = {{0, banned}, {1, banned}, {1, banned}}}, 3));
  EXPECT_FALSE(bans_every_token({.logit_bias = {{0, banned}, {1, banned}, {2, -1e30f}}}, 3));
  EXPECT_TRUE(bans_every_token({.logit_bias = {{2, banned}, {0, banned}, {1, 5.0f}, {1, banned}}},
                               3));
  EXPECT_FALSE(bans_every_token({.logit_bias = {{2, banned}, {0, banned}, {1, banned}}}, 4));
}

}  // namespace
}  // namespace ktier::runtime
