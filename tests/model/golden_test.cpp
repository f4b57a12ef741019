// The CPU engine end to end against the float64 PyTorch reference (tools/reference): the
// committed goldens of the tiny checkpoint, MXFP4 and float-expert variants.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/model_fixture.h"
#include "runtime/generator.h"

namespace ktier::test {
namespace {

// K3-MODEL.md / issue 3: max |logit - reference| / max |reference| <= 1e-4.
constexpr double kLogitRelTol = 1e-4;
// What the engine measures on these fixtures (both variants; the CPU's bytes do not depend on
// the ISA or threads), and the room left for a sound change of rounding order: the rule alone
// is 22x above it, so an error that grew 20-fold (a double step done in f32, say) would pass.
// Regenerating the fixtures (tools/) means measuring this again.
constexpr double kMeasuredRelError = 4.61e-6;
constexpr double kMarginSlack = 2.0;

class GoldenTest : public ::testing::TestWithParam<Variant> {};

TEST_P(GoldenTest, TeacherForcedArgmaxAndLogitsMatchReference) {
  const Variant& v = GetParam();
  auto engine = open_engine(v);
  ASSERT_TRUE(engine);
  const auto prompt = golden_prompt(v);
  const int64_t V = engine->checkpoint().config().vocab_size;
  const std::vector<float> logits = eval_logits(*engine, prompt, static_cast<int64_t>(prompt.size()));
  const auto& tf = golden(v).at("teacher_forced");
  ASSERT_EQ(tf.size(), prompt.size());
  const double ref_max = golden(v).at("logits_max_abs").get<double>();
  double worst = 0;
  for (size_t t = 0; t < prompt.size(); ++t) {
    const auto ref = tf[t].at("logits").get<std::vector<double>>();
    ASSERT_EQ(static_cast<int64_t>(ref.size()), V);
    const float* row = logits.data() + t * V;
    for (int64_t i = 0; i < V; ++i) {
      ASSERT_TRUE(std::isfinite(row[i])) << "position " << t << " logit " << i;
      worst = std::max(worst, std::abs(static_cast<double>(row[i]) - ref[i]));
    }
    const int64_t argmax = std::max_element(row, row + V) - row;  // first maximum
    EXPECT_EQ(argmax, tf[t].at("argmax").get<int64_t>()) << "position " << t;
  }
  RecordProperty("max_rel_logit_error", std::to_string(worst / ref_max));
  std::printf("[ %s ] max |logit - ref| / max |ref| = %.3g (tolerance %.0e)\n", v.name.c_str(),
              worst / ref_max, kLogitRelTol);
  EXPECT_LE(worst / ref_max, kLogitRelTol);
  EXPECT_LE(worst / ref_max, kMarginSlack * kMeasuredRelError)
      << "far above the error measured on these fixtures";
}

// P after every layer: its sum and sum of |.| per position agree with the reference's (a
// localising check: when the logits drift, this names the first layer that does).
class Checksums final : public model::LayerObserver {
 public:
  void after_layer(int64_t layer, const float* P, int64_t T, int64_t E) override {
    for (int64_t t = 0; t < T; ++t) {
      double s = 0, a = 0;
      for (int64_t i = 0; i < E; ++i) s += P[t * E + i], a += std::abs(P[t * E + i]);
      sum[t][layer] = s;
      abs_sum[t][layer] = a;
    }
  }
  std::vector<std::vector<double>> sum, abs_sum;
};

TEST_P(GoldenTest, PerLayerChecksumsMatchReference) {
  const Variant& v = GetParam();
  auto engine = open_engine(v);
  ASSERT_TRUE(engine);
  const auto prompt = golden_prompt(v);
  const auto& ref = golden(v).at("layer_checksums");
  const auto L = engine->checkpoint().config().num_hidden_layers;
  Checksums c;
  c.sum.assign(prompt.size(), std::vector<double>(L, NAN));
  c.abs_sum = c.sum;
  engine->model().set_layer_observer(&c);
  eval_logits(*engine, prompt, static_cast<int64_t>(prompt.size()));
  engine->model().set_layer_observer(nullptr);
  const auto rs = ref.at("sum").get<std::vector<std::vector<double>>>();
  const auto ra = ref.at("abs_sum").get<std::vector<std::vector<double>>>();
  for (size_t t = 0; t < prompt.size(); ++t)
    for (int64_t l = 0; l < L; ++l) {
      EXPECT_NEAR(c.sum[t][l], rs[t][l], kLogitRelTol * ra[t][l]) << "position " << t << " layer " << l;
      EXPECT_NEAR(c.abs_sum[t][l], ra[t][l], kLogitRelTol * ra[t][l]) << "position " << t << " layer " << l;
    }
}

TEST_P(GoldenTest, GreedyContinuationMatchesReference) {
  const Variant& v = GetParam();
  auto engine = open_engine(v);
  ASSERT_TRUE(engine);
  const auto want = golden(v).at("greedy").get<std::vector<int32_t>>();
  runtime::GenerationOptions o;
  o.max_new_tokens = static_cast<int64_t>(want.size());
  o.prefill_chunk = 5;  // not a divisor of the 12-token prompt
  std::vector<std::pair<int64_t, int64_t>> progress;  // (done, total) after each prefill layer
  o.prefill_progress = [&](int64_t done, int64_t total) { progress.emplace_back(done, total); };
  std::vector<int32_t> got;
  auto stats = runtime::generate(engine->model(), engine->experts(), golden_prompt(v), o, [&](int32_t id) {
                                   got.push_back(id);
                                   return Status::ok();
                                 });
  ASSERT_TRUE(stats.is_ok()) << stats.status().message();
  EXPECT_EQ(got, want);
  EXPECT_EQ(stats.value().generated_tokens, static_cast<int64_t>(want.size()));
  EXPECT_EQ(stats.value().decode_steps, static_cast<int64_t>(want.size()) - 1);
  // Prefill progress: a start (0), then once per layer of each of the 3 chunks (none in decode),
  // never backwards, ending at the prompt's length.
  const int64_t prompt = static_cast<int64_t>(golden_prompt(v).size());
  ASSERT_EQ(progress.size(),
            static_cast<size_t>(1 + 3 * engine->model().config().num_hidden_layers));
  EXPECT_EQ(progress.front().first, 0);
  for (size_t i = 0; i < progress.size(); ++i) {
    EXPECT_EQ(progress[i].second, prompt);
    EXPECT_LE(progress[i].first, prompt);
    if (i > 0) {
      EXPECT_GE(progress[i].first, progress[i - 1].first) << i;
    }
  }
  EXPECT_EQ(progress.back().first, prompt);
  EXPECT_EQ(progress[engine->model().config().num_hidden_layers].first, 5);  // chunk 1 done
}

// A teacher-forced pass reports progress the same way (eval's, perplexity's meters): a start,
// once per layer of each chunk, ending at the length; the logits are those without it.
TEST_P(GoldenTest, EvaluateReportsProgressLayerByLayer) {
  const Variant& v = GetParam();
  auto engine = open_engine(v);
  ASSERT_TRUE(engine);
  const auto prompt = golden_prompt(v);
  const int64_t T = static_cast<int64_t>(prompt.size());
  const int64_t L = engine->model().config().num_hidden_layers;
  const int64_t V = engine->model().config().vocab_size;
  std::vector<std::pair<int64_t, int64_t>> progress;
  std::vector<float> logits(static_cast<size_t>(T * V));
  ASSERT_TRUE(runtime::evaluate_chunks(
                  engine->model(), prompt, 5, 0,
                  [&](int64_t first, int64_t n, const float* rows) {
                    std::copy(rows, rows + n * V, logits.begin() + first * V);
                    return Status::ok();
                  },
                  [&](int64_t done, int64_t total) { progress.emplace_back(done, total); })
                  .is_ok());
  EXPECT_TRUE(same_bytes(logits, eval_logits(*engine, prompt, 5)));
  ASSERT_EQ(progress.size(), static_cast<size_t>(1 + 3 * L));  // chunks of 5, 5, 2
  EXPECT_EQ(progress.front(), std::make_pair(int64_t{0}, T));
  EXPECT_EQ(progress[static_cast<size_t>(L)].first, 5);
  EXPECT_EQ(progress.back(), std::make_pair(T, T));
  for (size_t i = 1; i < progress.size(); ++i) EXPECT_GE(progress[i].first, progress[i - 1].first);
  // The hook is gone with the pass: a later forward reports nothing.
  const size_t calls = progress.size();
  eval_logits(*engine, prompt, 5);
  EXPECT_EQ(progress.size(), calls);
}

// stop_requested (Ctrl-C in `ktier run`) ends a turn at a whole token: after a sampled token
// went to the sink, or after a prompt chunk, never inside a forward pass.
TEST_P(GoldenTest, StopRequestEndsTheTurnAtAWholeToken) {
  const Variant& v = GetParam();
  auto engine = open_engine(v);
  ASSERT_TRUE(engine);
  const auto want = golden(v).at("greedy").get<std::vector<int32_t>>();
  ASSERT_GE(want.size(), 4u);
  const auto prompt = golden_prompt(v);
  runtime::GenerationOptions o;
  o.max_new_tokens = static_cast<int64_t>(want.size());
  o.prefill_chunk = 5;
  std::vector<int32_t> got;
  int asked = 0;
  o.stop_requested = [&] {
    ++asked;
    return got.size() == 3;
  };
  auto session = runtime::GenerationSession::open(engine->model(), engine->experts(), o);
  ASSERT_TRUE(session.is_ok());
  auto stats = (*session)->turn(prompt, [&](int32_t id) {
    got.push_back(id);
    return Status::ok();
  });
  ASSERT_TRUE(stats.is_ok()) << stats.status().message();
  EXPECT_TRUE(stats->interrupted);
  EXPECT_FALSE(stats->stopped_at_stop_id);
  EXPECT_EQ(got, std::vector<int32_t>(want.begin(), want.begin() + 3));
  EXPECT_EQ(stats->prompt_tokens, static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(stats->generated_tokens, 3);
  EXPECT_EQ(stats->decode_steps, 2);
  EXPECT_EQ(asked, 2 + 3);  // after prompt chunks 1 and 2 (not the last), after each token
  // The sequence holds whole tokens: the last one sampled is not run, as after -n.
  EXPECT_EQ((*session)->positions(), static_cast<int64_t>(prompt.size()) + 2);

  // Inside the prompt: after its first chunk, nothing sampled.
  got.clear();
  o.stop_requested = [] { return true; };
  auto stopped = runtime::generate(engine->model(), engine->experts(), prompt, o,
                                   [&](int32_t id) {
                                     got.push_back(id);
                                     return Status::ok();
                                   });
  ASSERT_TRUE(stopped.is_ok()) << stopped.status().message();
  EXPECT_TRUE(stopped->interrupted);
  EXPECT_EQ(stopped->prompt_tokens, 5);
  EXPECT_EQ(stopped->generated_tokens, 0);
  EXPECT_TRUE(got.empty());

  // Asked but never stopping: the whole continuation, not marked interrupted.
  got.clear();
  o.stop_requested = [] { return false; };
  auto whole = runtime::generate(engine->model(), engine->experts(), prompt, o, [&](int32_t id) {
    got.push_back(id);
    return Status::ok();
  });
  ASSERT_TRUE(whole.is_ok());
  EXPECT_FALSE(whole->interrupted);
  EXPECT_EQ(got, want);
}

// abandon_requested (Ctrl-C in a run that saves nothing) is asked between the layers of every
// pass and ends the turn inside one: in the prompt, none of the chunk counts; in the decode, the
// tokens sampled before the pass are the greedy ones. The session is then abandoned(); asked
// and never stopping, the turn is whole.
TEST_P(GoldenTest, AbandonRequestEndsTheTurnBetweenLayers) {
  const Variant& v = GetParam();
  auto engine = open_engine(v);
  ASSERT_TRUE(engine);
  const auto want = golden(v).at("greedy").get<std::vector<int32_t>>();
  ASSERT_GE(want.size(), 4u);
  const auto prompt = golden_prompt(v);
  ASSERT_EQ(prompt.size(), 12u);
  const int64_t L = engine->model().config().num_hidden_layers;
  ASSERT_GE(L, 3);  // a pass has two layer boundaries or more
  runtime::GenerationOptions o;
  o.max_new_tokens = static_cast<int64_t>(want.size());
  o.prefill_chunk = 5;
  o.stop_requested = [] { return false; };
  std::vector<int32_t> got;
  const auto sink = [&](int32_t id) {
    got.push_back(id);
    return Status::ok();
  };
  int64_t asked = 0;

  // Inside the second chunk, after its second layer (the first chunk's L - 1 boundaries, then
  // two of the second's).
  o.abandon_requested = [&] { return ++asked == L + 1; };
  auto in_prompt = runtime::GenerationSession::open(engine->model(), engine->experts(), o);
  ASSERT_TRUE(in_prompt.is_ok());
  auto stats = (*in_prompt)->turn(prompt, sink);
  ASSERT_TRUE(stats.is_ok()) << stats.status().message();
  EXPECT_TRUE(stats->interrupted);
  EXPECT_EQ(stats->prompt_tokens, 5);
  EXPECT_EQ(stats->generated_tokens, 0);
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(asked, L + 1);
  EXPECT_TRUE((*in_prompt)->abandoned());
  EXPECT_EQ((*in_prompt)->positions(), 5);  // the whole chunks; some layers hold more
  EXPECT_FALSE((*in_prompt)->holds_logits());

  // Inside the pass after the second sampled token: its first boundary.
  asked = 0;
  o.abandon_requested = [&] {
    ++asked;
    return got.size() == 2;
  };
  auto in_decode = runtime::GenerationSession::open(engine->model(), engine->experts(), o);
  ASSERT_TRUE(in_decode.is_ok());
  stats = (*in_decode)->turn(prompt, sink);
  ASSERT_TRUE(stats.is_ok()) << stats.status().message();
  EXPECT_TRUE(stats->interrupted);
  EXPECT_EQ(got, std::vector<int32_t>(want.begin(), want.begin() + 2));
  EXPECT_EQ(stats->prompt_tokens, 12);
  EXPECT_EQ(stats->generated_tokens, 2);
  EXPECT_EQ(stats->decode_steps, 1);
  EXPECT_EQ(asked, 4 * (L - 1) + 1);  // 3 chunks, 1 token, then the one that stopped
  EXPECT_TRUE((*in_decode)->abandoned());
  EXPECT_EQ((*in_decode)->positions(), 13);

  // Asked, never stopping: the whole continuation; the hook is gone with the turn.
  got.clear();
  asked = 0;
  o.abandon_requested = [&] {
    ++asked;
    return false;
  };
  auto whole = runtime::generate(engine->model(), engine->experts(), prompt, o, sink);
  ASSERT_TRUE(whole.is_ok()) << whole.status().message();
  EXPECT_FALSE(whole->interrupted);
  EXPECT_EQ(got, want);
  const int64_t passes = 3 + static_cast<int64_t>(want.size()) - 1;
  EXPECT_EQ(asked, passes * (L - 1));
  eval_logits(*engine, prompt, 5);
  EXPECT_EQ(asked, passes * (L - 1));
}

// prompt_logits: every prompt row's logits, each chunk's as it runs, are those of a
// teacher-forced pass to the bit, in two turns of one session; the tokens generated do not
// change; an error from it ends the turn.
TEST_P(GoldenTest, PromptLogitsAreEveryRowsOfTheTeacherForcedPass) {
  const Variant& v = GetParam();
  auto engine = open_engine(v);
  ASSERT_TRUE(engine);
  const auto want = golden(v).at("greedy").get<std::vector<int32_t>>();
  const auto prompt = golden_prompt(v);
  const int64_t V = engine->checkpoint().config().vocab_size;
  const size_t half = prompt.size() / 2;
  std::vector<int32_t> second(prompt.begin() + static_cast<std::ptrdiff_t>(half), prompt.end());
  second.push_back(want[0]);  // the second turn goes on through the first token sampled
  std::vector<int32_t> all(prompt.begin(), prompt.end());
  all.push_back(want[0]);
  const std::vector<float> reference = eval_logits(*engine, all, 3);
  runtime::GenerationOptions o;
  o.max_new_tokens = 1;
  o.prefill_chunk = 4;
  std::vector<int64_t> rows;  // the positions handed over, in order
  o.prompt_logits = [&](int64_t first, int64_t n, const float* logits) {
    for (int64_t r = 0; r < n; ++r) {
      rows.push_back(first + r);
      EXPECT_EQ(std::memcmp(logits + r * V, reference.data() + (first + r) * V, V * sizeof(float)),
                0)
          << "position " << first + r;
    }
    return Status::ok();
  };
  auto session = runtime::GenerationSession::open(engine->model(), engine->experts(), o);
  ASSERT_TRUE(session.is_ok());
  std::vector<int32_t> got;
  const auto sink = [&](int32_t id) {
    got.push_back(id);
    return Status::ok();
  };
  ASSERT_TRUE((*session)->turn(std::span<const int32_t>(prompt).first(half), sink).is_ok());
  ASSERT_TRUE((*session)->turn(second, sink).is_ok());
  std::vector<int64_t> every(all.size());
  for (size_t i = 0; i < every.size(); ++i) every[i] = static_cast<int64_t>(i);
  EXPECT_EQ(rows, every);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1], want[1]);  // the first turn's token is the greedy one after half a prompt

  o.prompt_logits = [](int64_t, int64_t, const float*) { return Status::runtime("sink failed"); };
  auto failing = runtime::GenerationSession::open(engine->model(), engine->experts(), o);
  ASSERT_TRUE(failing.is_ok());
  auto r = (*failing)->turn(prompt, sink);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "sink failed");
}

INSTANTIATE_TEST_SUITE_P(Tiny, GoldenTest, ::testing::ValuesIn(variants()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace ktier::test
