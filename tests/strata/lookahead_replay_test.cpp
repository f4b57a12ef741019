// Replay with recorded lookahead predictions on synthetic decode-like traces: predictor quality
// (recall, precision per depth) and prefetch metrics (precision, recall, wasted bytes) against
// hand-derived values for perfect and for wrong predictions.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "common/run_process.h"
#include "common/test_paths.h"
#include "strata/replay.h"
#include "strata/trace_format.h"
#include "strata/trace_summary.h"
#include "tests/strata/read_csv.h"

namespace ktier::strata {
namespace {

constexpr uint32_t kLayers = 5;  // layer 0 dense, 1..4 MoE
constexpr uint32_t kExperts = 32;
constexpr uint32_t kTopK = 2;
constexpr uint32_t kTokens = 50;

uint16_t chosen_expert(uint32_t token, uint32_t layer, uint32_t j) {
  return static_cast<uint16_t>((token * 7 + layer * 13 + j * 5 + (token * layer) % 3) % kExperts);
}

enum class Predictor { kPerfect, kWrong };


// kLayers layers, MoE from 1, top-kTopK, 1000-byte experts, weights recorded.
TraceHeader test_header(uint32_t experts_per_layer, uint32_t lookahead_depth) {
  TraceHeader h;
  h.num_layers = kLayers;
  h.first_moe_layer = 1;
  h.experts_per_layer = experts_per_layer;
  h.top_k = kTopK;
  h.lookahead_depth = lookahead_depth;
  h.expert_bytes = 1000;
  h.flags = kTraceFlagWeights;
  return h;
}

// One pass per token (decode). Each step predicts layer + 1 and layer + 2 of the same token.
Trace make_decode_trace(Predictor predictor) {
  Trace t;
  t.header = test_header(kExperts, 2);
  for (uint32_t tok = 0; tok < kTokens; ++tok) {
    for (uint32_t layer = 1; layer < kLayers; ++layer) {
      TraceStep s;
      s.pass = tok;
      s.position = tok;
      s.layer = static_cast<uint16_t>(layer);
      for (uint32_t j = 0; j < kTopK; ++j) s.chosen.push_back({chosen_expert(tok, layer, j), 0.5f});
      for (uint32_t d = 1; d <= 2; ++d) {
        std::vector<ExpertWeight> pred;
        for (uint32_t j = 0; j < kTopK; ++j) {
          const uint16_t right = chosen_expert(tok, layer + d, j);
          // Wrong: an expert the target step does not choose (right + 16 never collides, since
          // the two chosen ids of a step differ by 5 mod 32).
          pred.push_back({predictor == Predictor::kPerfect
                              ? right
                              : static_cast<uint16_t>((right + 16) % kExperts),
                          0.5f});
        }
        s.predicted.push_back(pred);
      }
      t.steps.push_back(s);
    }
  }
  return t;
}

// One pass over kTokens positions (a prefill): every layer's steps for all positions, then the
// next layer's. 256 experts a layer, each position its own two, so a layer requests 100 distinct
// keys. Each step predicts its position's next layer exactly, so up to 100 prefetches wait for
// their steps at once — more than a temperature window of 32 holds.
Trace make_prefill_trace() {
  constexpr uint32_t kWideExperts = 256;
  Trace t;
  t.header = test_header(kWideExperts, 1);
  const auto expert = [](uint32_t tok, uint32_t layer, uint32_t j) {
    return static_cast<uint16_t>((tok * kTopK + j + layer * 37) % kWideExperts);
  };
  for (uint32_t layer = 1; layer < kLayers; ++layer) {
    for (uint32_t tok = 0; tok < kTokens; ++tok) {
      TraceStep s;
      s.pass = 0;
      s.position = tok;
      s.layer = static_cast<uint16_t>(layer);
      std::vector<ExpertWeight> next;
      for (uint32_t j = 0; j < kTopK; ++j) {
        s.chosen.push_back({expert(tok, layer, j), 0.5f});
        next.push_back({expert(tok, layer + 1, j), 0.5f});
      }
      s.predicted.push_back(next);
      t.steps.push_back(s);
    }
  }
  return t;
}

ReplayResult replay_policy(PolicyKind policy, const RequestStream& stream, uint64_t slots,
                           uint32_t depth, bool adapt_window = true) {
  ReplaySpec spec;
  spec.policy = policy;
  spec.tiers.push_back({"ram", slots * stream.expert_bytes, slots});
  ReplayParams params;
  params.lookahead_depth = depth;
  params.temperature.adapt_window = adapt_window;
  return replay(stream, spec, params, ReplayInputs::from(stream));
}

ReplayResult replay_lru(const RequestStream& stream, uint64_t slots, uint32_t depth) {
  ReplaySpec spec;
  spec.policy = PolicyKind::kLru;
  spec.tiers.push_back({"ram", slots * stream.expert_bytes, slots});
  ReplayParams params;
  params.lookahead_depth = depth;
  return replay(stream, spec, params, ReplayInputs::from(stream));
}

TEST(LookaheadReplay, PredictorQualityPerDepth) {
  const Trace perfect = make_decode_trace(Predictor::kPerfect);
  const RequestStream s = build_request_stream(perfect).value();
  // Steps at layers 3 and 4 predict past the last layer: no target.
  EXPECT_EQ(s.predictions_without_target, kTokens * (kTopK + 2 * kTopK));
  const std::vector<PredictionQuality> q = prediction_quality(s);
  ASSERT_EQ(q.size(), 2u);
  // Depth 1 covers layers 2..4 of every token (3 of 4 request sets), depth 2 layers 3..4.
  EXPECT_DOUBLE_EQ(q[0].recall, 0.75);
  EXPECT_DOUBLE_EQ(q[0].precision, 1.0);
  EXPECT_DOUBLE_EQ(q[1].recall, 0.5);
  EXPECT_DOUBLE_EQ(q[1].precision, 1.0);
  // Per target layer: layer 1 is never predicted, layers 2..4 always at depth 1.
  ASSERT_EQ(q[0].by_layer.size(), kLayers);
  EXPECT_EQ(q[0].by_layer[0].requested, 0u);
  EXPECT_EQ(q[0].by_layer[1].requested, kTokens * kTopK);
  EXPECT_EQ(q[0].by_layer[1].correct, 0u);
  for (uint32_t l = 2; l < kLayers; ++l) {
    EXPECT_EQ(q[0].by_layer[l].requested, kTokens * kTopK);
    EXPECT_EQ(q[0].by_layer[l].correct, kTokens * kTopK);
    EXPECT_EQ(q[0].by_layer[l].predicted, kTokens * kTopK);
  }
  EXPECT_EQ(q[1].by_layer[2].correct, 0u);
  EXPECT_EQ(q[1].by_layer[3].correct, kTokens * kTopK);

  const RequestStream w = build_request_stream(make_decode_trace(Predictor::kWrong)).value();
  const std::vector<PredictionQuality> qw = prediction_quality(w);
  EXPECT_DOUBLE_EQ(qw[0].recall, 0.0);
  EXPECT_DOUBLE_EQ(qw[0].precision, 0.0);
}

// A prediction's target step is found by every bit of its pass and position: tokens whose
// passes (or positions) differ only above bit 24 are not the same token.
TEST(LookaheadReplay, FarApartPassesAndPositionsAreDistinctTokens) {
  const Trace base = make_decode_trace(Predictor::kPerfect);
  const std::vector<PredictionQuality> want =
      prediction_quality(build_request_stream(base).value());
  for (const bool by_pass : {true, false}) {
    SCOPED_TRACE(by_pass ? "passes 2^24 apart" : "positions 2^24 apart");
    Trace t = base;
    for (TraceStep& s : t.steps) {
      const uint32_t tok = s.pass;  // < 256
      s.pass = by_pass ? tok << 24 : 0;
      s.position = by_pass ? 0 : tok << 24;
    }
    const RequestStream stream = build_request_stream(t).value();
    EXPECT_EQ(stream.tokens, kTokens);
    const std::vector<PredictionQuality> q = prediction_quality(stream);
    ASSERT_EQ(q.size(), want.size());
    for (size_t d = 0; d < q.size(); ++d) {
      EXPECT_DOUBLE_EQ(q[d].recall, want[d].recall);
      EXPECT_DOUBLE_EQ(q[d].precision, want[d].precision);
    }
  }
}

TEST(LookaheadReplay, PerfectPredictionsTurnMissesIntoHits) {
  const RequestStream s = build_request_stream(make_decode_trace(Predictor::kPerfect)).value();
  // 4 slots = two steps: without lookahead almost nothing is reused across tokens.
  const ReplayResult demand = replay_lru(s, 4, 0);
  const ReplayResult ahead = replay_lru(s, 4, 1);
  EXPECT_EQ(demand.prefetch.issued, 0u);
  // Each token's steps at layers 1..3 prefetch the next layer's two experts (layer 4's
  // predictions have no layer to serve), none resident already (4 slots hold the two steps
  // before), and every one is used by its step: a hit. Layer 1's requests miss.
  const uint64_t prefetched = kTokens * 3 * kTopK;
  ASSERT_EQ(s.requests(), kTokens * 4 * kTopK);
  EXPECT_EQ(ahead.prefetch.issued, prefetched);
  EXPECT_EQ(ahead.prefetch.useful, prefetched);
  EXPECT_EQ(ahead.prefetch.wasted, 0u);
  EXPECT_EQ(ahead.hits, prefetched);
  EXPECT_GT(ahead.hits, demand.hits);
  EXPECT_DOUBLE_EQ(ahead.prefetch.precision, 1.0);
  // Recall: prefetch-served over (prefetch-served + remaining tier-0 misses).
  EXPECT_DOUBLE_EQ(ahead.prefetch.recall,
                   static_cast<double>(ahead.prefetch.useful) /
                       (ahead.prefetch.useful + (s.requests() - ahead.tiers[0].hits)));
  // Bytes read from storage: layer 1's misses and the prefetches.
  EXPECT_EQ(ahead.bytes_read, (kTokens * kTopK + prefetched) * s.expert_bytes);
}

// make_decode_trace(kWrong) with a perfect refresh: every step but the first carries its own
// experts as its refresh list (issued at the end of the step before it).
Trace make_refresh_trace() {
  Trace t = make_decode_trace(Predictor::kWrong);
  t.header.flags |= kTraceFlagRefresh;
  for (TraceStep& s : t.steps) s.refreshed = s.chosen;
  return t;
}

TEST(LookaheadReplay, RefreshPredictionsAreDepthZeroAndServeTheirOwnStep) {
  const Trace wrong = make_decode_trace(Predictor::kWrong);
  const RequestStream plain = build_request_stream(wrong).value();
  const RequestStream s = build_request_stream(make_refresh_trace()).value();
  EXPECT_TRUE(s.refresh);
  EXPECT_FALSE(plain.refresh);
  // The first step's refresh has no step before it to be issued at.
  EXPECT_EQ(s.predictions_without_target, plain.predictions_without_target + kTopK);
  const std::vector<PredictionQuality> q = prediction_quality(s);
  ASSERT_EQ(q.size(), 3u);
  EXPECT_EQ(q[0].depth, 0u);
  EXPECT_EQ(q[0].correct, s.requests() - kTopK);
  EXPECT_DOUBLE_EQ(q[0].precision, 1.0);
  EXPECT_EQ(q[1].depth, 1u);
  EXPECT_DOUBLE_EQ(q[1].recall, 0.0);  // the wrong depth-1 predictions are unchanged

  // 8 slots hold one step's keys, the wrong prediction for the next and the refresh.
  for (PolicyKind p : {PolicyKind::kLru, PolicyKind::kLfu, PolicyKind::kTemperature,
                       PolicyKind::kBelady}) {
    SCOPED_TRACE(std::string(policy_name(p)));
    const ReplayResult with = replay_policy(p, s, 8, 1);
    EXPECT_EQ(with.hits, s.requests() - kTopK);  // all but the first step's two
    // Without the refresh, exactly the replay of the trace that never recorded one.
    ReplaySpec spec;
    spec.policy = p;
    spec.tiers.push_back({"ram", 8 * s.expert_bytes, 8});
    ReplayParams params;
    params.lookahead_depth = 1;
    params.refresh = false;
    const ReplayResult without = replay(s, spec, params, ReplayInputs::from(s));
    const ReplayResult never = replay_policy(p, plain, 8, 1);
    EXPECT_EQ(without.hits, never.hits);
    EXPECT_EQ(without.prefetch.issued, never.prefetch.issued);
    EXPECT_LT(without.hits, with.hits);
    // Depth 0 alone is not lookahead: with --lookahead 0 nothing is prefetched.
    EXPECT_EQ(replay_policy(p, s, 8, 0).prefetch.issued, 0u);
  }
}

// Each tier takes the prefetches its policy admits, as the live tiers do on their own links: a
// VRAM tier of no slots leaves every one to the RAM tier, so VRAM 0 + RAM 8 replays as RAM 8
// alone, prefetches and their metrics included (before, a prefetch tier 0 declined was read
// into no tier at all).
TEST(LookaheadReplay, ASlowerTierPrefetchesWhatTheFasterOneDeclines) {
  const RequestStream s = build_request_stream(make_decode_trace(Predictor::kPerfect)).value();
  for (PolicyKind p : {PolicyKind::kLru, PolicyKind::kLfu, PolicyKind::kTemperature}) {
    SCOPED_TRACE(std::string(policy_name(p)));
    const ReplayResult one = replay_policy(p, s, 8, 1);
    ReplaySpec spec;
    spec.policy = p;
    spec.tiers.push_back({"vram", 0, 0});
    spec.tiers.push_back({"ram", 8 * s.expert_bytes, 8});
    ReplayParams params;
    params.lookahead_depth = 1;
    const ReplayResult two = replay(s, spec, params, ReplayInputs::from(s));
    ASSERT_EQ(two.tiers.size(), 3u);
    EXPECT_EQ(two.tiers[0].hits, 0u);
    EXPECT_EQ(two.tiers[1].hits, one.tiers[0].hits);
    EXPECT_EQ(two.hits, one.hits);
    EXPECT_GT(two.prefetch.issued, 0u);
    EXPECT_EQ(two.prefetch.issued, one.prefetch.issued);
    EXPECT_EQ(two.prefetch.useful, one.prefetch.useful);
    // Recall is tier 0's: every request missed it, and the useful prefetches (all in RAM)
    // covered their share.
    EXPECT_DOUBLE_EQ(two.prefetch.recall,
                     static_cast<double>(two.prefetch.useful) / static_cast<double>(s.requests()));
    EXPECT_EQ(two.bytes_read, one.bytes_read);
  }
}

TEST(LookaheadReplay, WrongPredictionsAreWasted) {
  const RequestStream s = build_request_stream(make_decode_trace(Predictor::kWrong)).value();
  const ReplayResult ahead = replay_lru(s, 64, 2);
  EXPECT_GT(ahead.prefetch.issued, 0u);
  EXPECT_EQ(ahead.prefetch.useful, 0u);
  EXPECT_EQ(ahead.prefetch.wasted, ahead.prefetch.issued);
  EXPECT_EQ(ahead.prefetch.bytes_wasted, ahead.prefetch.issued * s.expert_bytes);
  EXPECT_DOUBLE_EQ(ahead.prefetch.precision, 0.0);
}

TEST(LookaheadReplay, CliReplaysRecordedPredictions) {
  const std::filesystem::path p = std::filesystem::temp_directory_path() /
                                  ("ktier_lookahead_" + std::to_string(::getpid()) + ".ktrace");
  const std::filesystem::path csv = p.string() + ".csv";
  ASSERT_TRUE(write_trace(p, make_decode_trace(Predictor::kPerfect)).is_ok());
  const test::ProcessResult r = test::run_process(
      test::ktier_bin().string() + " trace replay '" + p.string() +
      "' --policy lru,temperature --slots 4,8 --lookahead 1 --csv '" + csv.string() + "'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("pf precision"), std::string::npos) << r.out;
  // The CLI's lru row at 4 slots is the library's replay with the recorded predictions.
  const RequestStream s = build_request_stream(make_decode_trace(Predictor::kPerfect)).value();
  const ReplayResult want = replay_lru(s, 4, 1);
  ASSERT_GT(want.prefetch.issued, 0u);
  const std::vector<std::map<std::string, std::string>> rows = test::read_csv(csv);
  std::filesystem::remove(csv);
  const auto row = std::find_if(rows.begin(), rows.end(), [](const auto& r) {
    return r.at("policy") == "lru" && r.at("total_slots") == "4";
  });
  ASSERT_NE(row, rows.end()) << "no lru row at 4 slots";
  EXPECT_EQ(row->at("hits"), std::to_string(want.hits));
  EXPECT_EQ(row->at("prefetch_issued"), std::to_string(want.prefetch.issued));
  EXPECT_EQ(row->at("prefetch_useful"), std::to_string(want.prefetch.useful));
  const test::ProcessResult info =
      test::run_process(test::ktier_bin().string() + " trace info '" + p.string() + "'");
  EXPECT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("lookahead d=1:    recall 75.00%, precision 100.00%"), std::string::npos)
      << info.out;
  std::filesystem::remove(p);
}

}  // namespace
}  // namespace ktier::strata

namespace ktier::strata {
namespace {

TEST(LookaheadReplay, PrefillPredictionsAreAllKeptByEveryPolicy) {
  const RequestStream s = build_request_stream(make_prefill_trace()).value();
  // About 100 keys are pinned at once (this layer's remaining steps, the next layer's
  // predictions), within 128 slots: a prefetch always finds an unpinned resident to displace.
  // Temperature's window (32 slots, fixed here) is smaller than the pinned set.
  for (PolicyKind p : {PolicyKind::kLru, PolicyKind::kLfu, PolicyKind::kTemperature}) {
    SCOPED_TRACE(std::string(policy_name(p)));
    const ReplayResult r = replay_policy(p, s, 128, 1, /*adapt_window=*/false);
    EXPECT_EQ(r.prefetch.wasted, 0u);
    // Layers 2..4 were predicted exactly: every one of their requests is a hit.
    EXPECT_GE(r.hits, s.requests() * 3 / 4);
  }
}

TEST(LookaheadReplay, BeladyWithPredictionsBoundsThePolicies) {
  for (Predictor pr : {Predictor::kPerfect, Predictor::kWrong}) {
    const RequestStream s = build_request_stream(make_decode_trace(pr)).value();
    for (uint64_t slots : {4, 8, 16}) {
      SCOPED_TRACE(std::to_string(slots) + " slots");
      const ReplayResult belady = replay_policy(PolicyKind::kBelady, s, slots, 2);
      const ReplayResult demand = replay_policy(PolicyKind::kBelady, s, slots, 0);
      EXPECT_GE(belady.hits, demand.hits);
      for (PolicyKind p : {PolicyKind::kLru, PolicyKind::kLfu, PolicyKind::kTemperature})
        EXPECT_GE(belady.hits, replay_policy(p, s, slots, 2).hits) << policy_name(p);
      // Right predictions are read ahead and used at their target step. (A wrong one never is,
      // by the trace's construction; Belady admits one only for a later real use, so reading
      // it never costs a hit: belady >= demand above.)
      if (pr == Predictor::kPerfect) {
        EXPECT_GT(belady.prefetch.useful, 0u);
      }
    }
  }
}

// Replay indexes steps, requests and predictions in 32 bits (kNeverUsed is the sentinel):
// a trace with more of any is refused naming the counts, never replayed with wrapped indices.
TEST(LookaheadReplay, TracesTooLongToIndexAreRefused) {
  const uint64_t last = kNeverUsed - 1;
  EXPECT_TRUE(replay_fits_in_32_bits(last, last, last).is_ok());
  for (const auto& [steps, requests, predictions] :
       {std::tuple{uint64_t{kNeverUsed}, uint64_t{0}, uint64_t{0}},
        std::tuple{uint64_t{1}, uint64_t{kNeverUsed}, uint64_t{0}},
        std::tuple{uint64_t{1}, uint64_t{2}, uint64_t{1} << 40}}) {
    const Status s = replay_fits_in_32_bits(steps, requests, predictions);
    EXPECT_EQ(s.exit_code(), 2);
    EXPECT_NE(s.message().find(std::to_string(requests) + " requests"), std::string::npos)
        << s.message();
  }
}

}  // namespace
}  // namespace ktier::strata
