// The live expert RAM tier (runtime/expert_cache.h) on the tiny checkpoint: its policy makes
// exactly the decisions replay makes on the trace of the same run; output bytes never depend on
// the policy, the lookahead depth or the tier's size; the prefetch counters add up; the trace
// records the lookahead predictions.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <thread>
#include <utility>

#include "backend/backend.h"
#include "common/size.h"
#include "io/fault_plan.h"
#include "runtime/engine.h"
#include "runtime/engine_outputs.h"
#include "runtime/generator.h"
#include "strata/replay.h"
#include "strata/trace_format.h"
#include "strata/trace_recorder.h"
#include "synth/synth.h"
#include "tests/common/same_bytes.h"

namespace ktier::runtime {
namespace {

using test::same_bytes;

namespace fs = std::filesystem;
using strata::PolicyKind;

class ExpertCacheTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("ktier-expert-cache-" + std::to_string(::getpid()));
    ASSERT_NO_FATAL_FAILURE(synth_tiny(root_ / "ckpt"));
    prompt_ = kDialTestPrompt;
    auto ckpt = format::Checkpoint::open(root_ / "ckpt");
    ASSERT_TRUE(ckpt.is_ok());
    slot_ = ExpertCache::slot_bytes(ckpt.value());
    const auto& c = ckpt.value().config();
    keys_ = static_cast<uint64_t>(c.num_moe_layers() * c.num_experts);
    top_k_ = static_cast<uint64_t>(c.num_experts_per_token);
    // What a budget must hold before the tier gets anything: the whole trunk pinned (the dial
    // gives the trunk the budget first). With every layer pinned the lookahead routers are read
    // from the trunk: no bank.
    EngineOptions eo;
    eo.model_dir = root_ / "ckpt";
    eo.ram_budget = uint64_t{1} << 30;
    eo.lookahead = 3;
    auto e = Engine::open(eo);
    ASSERT_TRUE(e.is_ok()) << e.status().message();
    ASSERT_EQ(e.value()->trunk_store()->stats().layers_streamed, 0);
    trunk_ = e.value()->trunk_store()->stats().bytes_allocated;
    EXPECT_EQ(e.value()->router_bank(), nullptr) << "every layer pinned: no router held twice";
    bank_ = RouterBank::bytes_needed(ckpt.value());
    reference_ = run({}, nullptr);
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // The budget leaving `policy_slots` for the policy: the sequence's working set (the default
  // workload; its activations include the lookahead copy when lookahead > 0), the whole trunk,
  // one fetch's top-k slots and the policy's. With lookahead the dial's minimum is
  // top_k × (2 + lookahead) slots: below it (policy_slots < top_k × (1 + lookahead)) the trunk streams
  // a layer or more to make room, and the routers of those layers are held apart (RouterBank).
  static uint64_t budget_for(uint64_t policy_slots, int lookahead = kDefaultLookahead) {
    const auto ckpt = format::Checkpoint::open(root_ / "ckpt", format::OpenMode::kPread);
    const EngineOptions::Workload sequence;
    const uint64_t seq =
        dial_minimum(ckpt.value(), nullptr, lookahead, 1, true, &sequence).sequence;
    return seq + trunk_ + (top_k_ + policy_slots) * slot_;
  }

  // Every expert kept (no lookahead), read with pread: the fetch_each tests' engine.
  static EngineOptions all_kept_options() {
    EngineOptions eo;
    eo.model_dir = root_ / "ckpt";
    eo.threads = 2;
    eo.ram_budget = budget_for(keys_, 0);
    eo.lookahead = 0;
    eo.io.backend = io::IoBackend::kPread;
    return eo;
  }

  // Prefill in chunks of `chunk` then 20 greedy tokens; returns the ids. `eo` without a budget
  // runs resident. Records a trace when `trace` is set.
  static std::vector<int32_t> run(const EngineOptions& eo_in, std::unique_ptr<Engine>* keep,
                                  const fs::path& trace = {}, int64_t chunk = 1,
                                  model::LookaheadObserver* observer = nullptr) {
    EngineOptions eo = eo_in;
    eo.model_dir = root_ / "ckpt";
    eo.threads = 2;
    auto e = Engine::open(eo);
    EXPECT_TRUE(e.is_ok()) << e.status().message();
    if (!e.is_ok()) return {};
    Engine& engine = *e.value();
    std::unique_ptr<strata::TraceRecorder> rec;
    if (!trace.empty()) {
      const int depth = eo.lookahead.value_or(kDefaultLookahead);
      auto r = strata::TraceRecorder::create(trace, engine.checkpoint(), depth,
                                             depth > 0 && eo.lookahead_refresh);
      EXPECT_TRUE(r.is_ok()) << r.status().message();
      rec = std::move(r.value());
      engine.model().set_routing_observer(rec.get());
      engine.model().add_lookahead_observer(rec.get());
    }
    if (observer) engine.model().add_lookahead_observer(observer);
    GenerationOptions g;
    g.max_new_tokens = 20;
    g.prefill_chunk = chunk;
    std::vector<int32_t> ids;
    auto st = generate(engine.model(), engine.experts(), prompt_, g,
                       [&](int32_t id) {
                         ids.push_back(id);
                         return Status::ok();
                       });
    EXPECT_TRUE(st.is_ok()) << st.status().message();
    if (observer) engine.model().remove_lookahead_observer(observer);
    if (rec) {
      engine.model().set_routing_observer(nullptr);
      engine.model().remove_lookahead_observer(rec.get());
      EXPECT_TRUE(rec->close().is_ok());
    }
    if (keep) *keep = std::move(e.value());
    return ids;
  }

  // Pumps the tier (an empty prediction issues what is queued and takes completions) until
  // expert `id` of `layer` has landed; false after 5 s.
  static bool pump_until_landed(ExpertCache& x, int64_t layer, int32_t id) {
    model::ExpertWeights view;
    for (int i = 0; i < 500 && !x.peek(layer, id, &view); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      x.on_prediction(layer - 1, 1, 0, nullptr, nullptr, 0, 2);
    }
    return x.peek(layer, id, &view);
  }
  // `layer` - 1 predicts the two experts `ids` of `layer` (token `position`, equal weights), and
  // both land. False if one never does.
  static bool predict_and_land(ExpertCache& x, int64_t layer, int64_t position,
                               const int32_t (&ids)[2]) {
    const float weights[] = {0.5f, 0.5f};
    x.on_prediction(layer - 1, 1, position, ids, weights, 1, 2);
    return pump_until_landed(x, layer, ids[0]) && pump_until_landed(x, layer, ids[1]);
  }
  // The tiny checkpoint's expert tier on its own, LRU, for tests that drive it by hand.
  struct TierAlone {
    std::optional<format::Checkpoint> ckpt;
    int64_t layer = 0;  // a MoE layer predicted from a MoE layer (layer - 1 is MoE too)
    int64_t experts = 0;
    ShardFiles shards;
    std::unique_ptr<ExpertCache> cache;
  };
  // Opens the checkpoint and picks `layer` (a test that needs the checkpoint to set up its I/O
  // calls this before open_tier_alone, which calls it otherwise).
  static void open_checkpoint_alone(TierAlone& out) {
    auto ckpt = format::Checkpoint::open(root_ / "ckpt");
    ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().message();
    out.ckpt.emplace(std::move(*ckpt));
    const format::ModelConfig& c = out.ckpt->config();
    out.layer = c.first_k_dense_replace + 1;
    out.experts = c.num_experts;
    ASSERT_LT(out.layer, c.num_hidden_layers);
    ASSERT_GE(out.experts, 6);
  }
  // `io` as the engine reads; at most `prefetch_in_flight` prefetch chunk reads outstanding.
  static void open_tier_alone(int64_t policy_slots, int64_t batch_slots, TierAlone& out,
                              const io::IoOptions& io = {}, uint32_t prefetch_in_flight = 16) {
    if (!out.ckpt) {
      ASSERT_NO_FATAL_FAILURE(open_checkpoint_alone(out));
    }
    ASSERT_NO_FATAL_FAILURE(open_shard_files(*out.ckpt, out.shards, io));
    ExpertCacheOptions xo;
    xo.policy = PolicyKind::kLru;
    xo.policy_slots = policy_slots;
    xo.batch_slots = batch_slots;
    xo.prefetch_in_flight = prefetch_in_flight;
    auto cache = ExpertCache::open(*out.ckpt, *out.shards.engine, out.shards.files, std::move(xo));
    ASSERT_TRUE(cache.is_ok()) << cache.status().message();
    out.cache = std::move(*cache);
  }
  // The tier alone with 4 KiB chunk reads, each delayed 100 ms, and a prefetch budget of 3
  // chunk reads: expert 0 or 1 of `layer` (2 chunks each) is one prefetch in flight, the other
  // waits behind it.
  static void open_tier_with_slow_reads(TierAlone& t) {
    ASSERT_NO_FATAL_FAILURE(open_checkpoint_alone(t));
    const format::ExpertLocation& loc = t.ckpt->expert(t.layer, 0);
    ASSERT_TRUE(loc.contiguous) << "one request per expert, or requests alone fill the budget";
    io::IoOptions opt;
    opt.max_chunk_bytes = 4096;
    ASSERT_EQ(io::chunk_reads(opt, loc.nbytes), 2u);
    ASSERT_EQ(io::chunk_reads(opt, t.ckpt->expert(t.layer, 1).nbytes), 2u);
    opt.fault_plan = std::make_shared<io::FaultPlan>();
    opt.fault_plan->add(
        io::FaultRule::delay_by(std::chrono::microseconds(100'000)).in_path("model-"));
    ASSERT_NO_FATAL_FAILURE(open_tier_alone(8, static_cast<int64_t>(top_k_), t, opt, 3));
  }
  // `layer` - 1 predicts experts 0 and 1 of `layer` for token `position`, 0 the higher weight.
  static void predict_0_then_1(ExpertCache& x, int64_t layer, int64_t position) {
    const int32_t predicted[] = {0, 1};
    const float weights[] = {0.6f, 0.4f};
    x.on_prediction(layer - 1, 1, position, predicted, weights, 1, 2);
  }
  static inline fs::path root_;
  static inline std::vector<int32_t> prompt_;
  static inline std::vector<int32_t> reference_;
  static inline uint64_t slot_ = 0, trunk_ = 0, bank_ = 0, keys_ = 0, top_k_ = 0;
};

// The live policy is the replay model: with one token per forward pass (chunk 1) and no
// lookahead, its hits on the run's own trace equal replay's at its capacity, and the slots agree
// with the policy (a hit in the policy is a hit in RAM).
TEST_F(ExpertCacheTest, LivePolicyMakesTheDecisionsReplayMakes) {
  for (const PolicyKind policy : {PolicyKind::kLru, PolicyKind::kLfu, PolicyKind::kTemperature}) {
    for (const uint64_t policy_slots : {uint64_t{30}, uint64_t{50}, uint64_t{80}}) {
      EngineOptions eo;
      eo.ram_budget = budget_for(policy_slots, 0);
      eo.policy = policy;
      eo.lookahead = 0;
      const fs::path trace = root_ / "live.trace";
      std::unique_ptr<Engine> e;
      EXPECT_EQ(run(eo, &e, trace), reference_);
      ASSERT_TRUE(e && e->expert_cache());
      const ExpertCacheStats& x = e->expert_cache()->stats();
      ASSERT_EQ(x.policy_slots, static_cast<int64_t>(policy_slots));
      ASSERT_LT(static_cast<uint64_t>(x.policy_slots), keys_) << "the tier must be too small";

      auto tr = strata::read_trace(trace);
      ASSERT_TRUE(tr.is_ok()) << tr.status().message();
      const strata::RequestStream stream = strata::build_request_stream(tr.value()).value();
      strata::ReplaySpec spec{policy, {{"ram", 0, static_cast<uint64_t>(x.policy_slots)}}, "live"};
      const strata::ReplayResult r =
          strata::replay(stream, spec, strata::ReplayParams{}, strata::ReplayInputs::from(stream));
      const std::string what = std::string(strata::policy_name(policy)) + " at " +
                               std::to_string(x.policy_slots) + " slots";
      EXPECT_EQ(x.policy_requests, r.requests) << what;
      EXPECT_EQ(x.policy_hits, r.hits) << what;
      EXPECT_EQ(x.hits, x.policy_hits) << what;
      EXPECT_EQ(x.hits + x.demand_reads + x.late, x.policy_requests) << what;
      EXPECT_GT(x.hits, 0u) << what;
      EXPECT_GT(x.demand_reads, 0u) << what;
    }
  }
}

TEST_F(ExpertCacheTest, OutputIsIdenticalAcrossPoliciesLookaheadBudgetsAndChunks) {
  // A profile for `static` and for seeding temperatures: the trace of a resident run.
  const fs::path profile = root_ / "profile.trace";
  EngineOptions rec;
  rec.lookahead = 2;
  EXPECT_EQ(run(rec, nullptr, profile, 5), reference_);
  auto tr = strata::read_trace(profile);
  ASSERT_TRUE(tr.is_ok());
  const strata::RequestStream stream = strata::build_request_stream(tr.value()).value();
  for (const PolicyKind policy :
       {PolicyKind::kTemperature, PolicyKind::kLru, PolicyKind::kLfu, PolicyKind::kStatic}) {
    for (const int lookahead : {0, 1, 3}) {
      for (const uint64_t policy_slots : {uint64_t{0}, uint64_t{9}, keys_}) {
        EngineOptions eo;
        eo.ram_budget = budget_for(policy_slots, policy == PolicyKind::kStatic ? 0 : lookahead);
        eo.policy = policy;
        eo.lookahead = lookahead;
        eo.lookahead_refresh = lookahead != 3;  // depth 1 with the refresh, depth 3 without
        eo.static_ranking = strata::rank_keys_by_use(strata::key_use_counts(stream));
        if (policy == PolicyKind::kTemperature && policy_slots == 9)
          eo.temperature_seed = strata::profile_temperatures(stream, 64.0);
        EXPECT_EQ(run(eo, nullptr, {}, lookahead == 1 ? 5 : 1), reference_)
            << strata::policy_name(policy) << " lookahead " << lookahead
            << (eo.lookahead_refresh ? " + refresh" : "") << " slots "
            << policy_slots;
      }
    }
  }
}

// The ids above would not see a damaged slot that moves no argmax: the logits of every position
// (teacher-forced in chunks of 5, then 6 greedy tokens) are compared bytewise too, for a tier
// far smaller than the experts and one that holds them all, with and without lookahead.
TEST_F(ExpertCacheTest, LogitsDoNotDependOnPolicyLookaheadOrTierSize) {
  EngineOptions resident;
  resident.model_dir = root_ / "ckpt";
  const std::vector<float> reference = logits_then_greedy_ids(resident, prompt_);
  ASSERT_FALSE(reference.empty());
  for (const PolicyKind policy : {PolicyKind::kTemperature, PolicyKind::kLru}) {
    for (const int lookahead : {0, 2}) {
      for (const uint64_t policy_slots : {uint64_t{3}, keys_}) {
        EngineOptions eo;
        eo.model_dir = root_ / "ckpt";
        eo.ram_budget = budget_for(policy_slots, lookahead);
        eo.policy = policy;
        eo.lookahead = lookahead;
        eo.threads = 2;
        EXPECT_TRUE(same_bytes(logits_then_greedy_ids(eo, prompt_), reference))
            << strata::policy_name(policy) << " lookahead " << lookahead << " slots "
            << policy_slots;
      }
    }
  }
}

TEST_F(ExpertCacheTest, PrefetchCountersAddUpAndPrefetchReplacesDemandReads) {
  uint64_t demand[2] = {0, 0};
  for (const int lookahead : {0, 2}) {
    EngineOptions eo;
    eo.ram_budget = budget_for(12, lookahead);
    eo.lookahead = lookahead;
    std::unique_ptr<Engine> e;
    EXPECT_EQ(run(eo, &e), reference_);
    ASSERT_NE(e, nullptr);
    const ExpertCacheStats& x = e->expert_cache()->stats();
    demand[lookahead ? 1 : 0] = x.demand_reads;
    EXPECT_EQ(x.hits + x.demand_reads + x.late, x.policy_requests);
    EXPECT_LE(x.prefetch_useful + x.prefetch_wasted, x.prefetch_issued);
    EXPECT_LE(x.prefetch_timely, x.prefetch_useful);
    EXPECT_LE(x.prefetch_wasted_bytes, x.prefetch_bytes);
    EXPECT_GE(x.late, x.prefetch_useful - x.prefetch_timely);
    if (lookahead == 0) {
      EXPECT_EQ(x.prefetch_issued, 0u);
      EXPECT_EQ(x.read_bytes, x.miss_bytes);
    } else {
      EXPECT_GT(x.prefetch_useful, 0u);
      EXPECT_GT(x.prefetch_issued, x.prefetch_useful) << "some predictions must miss";
      // Every pass ran to its last layer: each prefetch was settled by its layer's routing.
      EXPECT_EQ(x.prefetch_useful + x.prefetch_wasted, x.prefetch_issued);
    }
  }
  EXPECT_LT(demand[1], demand[0]) << "lookahead must turn some demand reads into prefetches";
}

// A wrong prediction is wasted when its layer is routed elsewhere, not when (or if) it is
// evicted: in a tier with room to spare it never would be, the report's precision would read
// high and its bytes, read for nothing, would go uncounted (as the VRAM tier counts its copies).
TEST_F(ExpertCacheTest, AWrongPredictionIsWastedWhenItsLayerIsRoutedElsewhere) {
  TierAlone t;
  ASSERT_NO_FATAL_FAILURE(open_tier_alone(16, 2, t));
  ExpertCache& x = *t.cache;
  const int64_t layer = t.layer;
  const int32_t predicted[] = {0, 2}, routed[] = {0, 3};
  ASSERT_TRUE(predict_and_land(x, layer, 0, predicted));
  x.begin_layer(layer, 0, routed, 1, 2);
  const ExpertCacheStats& s = x.stats();
  EXPECT_EQ(s.prefetch_issued, 2u);
  EXPECT_EQ(s.prefetch_useful, 1u);
  EXPECT_EQ(s.prefetch_wasted, 1u) << "2 was not routed: wasted now, though still held";
  EXPECT_EQ(2 * s.prefetch_wasted_bytes, s.prefetch_bytes);  // experts of equal size
  model::ExpertWeights view;
  EXPECT_TRUE(x.peek(layer, 2, &view)) << "the tier keeps it: room to spare";
  // Routed in a later pass, it is a hit, not counted again.
  x.begin_pass();
  x.begin_layer(layer, 1, predicted, 1, 2);
  EXPECT_EQ(s.prefetch_useful, 1u);
  EXPECT_EQ(s.prefetch_wasted, 1u);
}

// Every layer a lookahead can predict (each MoE layer with a layer before it — the first MoE
// layer too, predicted from the dense layer 0) has its router in memory exactly once: pinned in
// the trunk store, or, for a streamed layer, in the bank; the bank's bytes are those layers'.
TEST_F(ExpertCacheTest, RouterBankHoldsExactlyTheStreamedPredictableLayers) {
  EngineOptions eo;
  eo.model_dir = root_ / "ckpt";
  eo.ram_budget = budget_for(12) - trunk_ / 2;  // about half the trunk streams
  auto e = Engine::open(eo);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  const format::ModelConfig& c = (*e)->checkpoint().config();
  ASSERT_GE(c.first_k_dense_replace, 1);
  const TrunkStore& store = *(*e)->trunk_store();
  const int64_t pinned = store.stats().layers_pinned;
  ASSERT_GT(pinned, 1) << "the test needs a pinned MoE layer";
  ASSERT_GT(store.stats().layers_streamed, 0);
  const RouterBank* bank = (*e)->router_bank();
  ASSERT_NE(bank, nullptr);
  auto ckpt = format::Checkpoint::open(root_ / "ckpt");
  ASSERT_TRUE(ckpt.is_ok());
  EXPECT_EQ(bank->bytes_allocated(), RouterBank::bytes_needed(*ckpt, pinned));
  EXPECT_LT(bank->bytes_allocated(), bank_);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const bool predictable = l >= 1 && !c.is_dense(l);
    EXPECT_EQ(bank->routing(l) != nullptr, predictable && l >= pinned) << "layer " << l;
    EXPECT_EQ(store.pinned_layer(l) != nullptr, l < pinned) << "layer " << l;
  }
  // The lookahead still predicts every MoE layer after the first — pinned or streamed — at depth
  // 1 and by the refresh, and the ids are the reference's.
  struct Seen final : model::LookaheadObserver {
    std::set<std::pair<int64_t, int>> targets;  // (target layer, depth)
    void on_prediction(int64_t layer, int depth, int64_t, const int32_t*, const float*, int64_t T,
                       int) override {
      if (T > 0) targets.insert({layer + depth, depth});
    }
  } seen;
  EXPECT_EQ(run(eo, nullptr, {}, 1, &seen), reference_);
  for (int64_t l = 1; l < c.num_hidden_layers; ++l) {
    if (c.is_dense(l)) continue;
    EXPECT_TRUE(seen.targets.count({l, 1})) << "layer " << l << " not predicted at depth 1";
    EXPECT_TRUE(seen.targets.count({l, 0})) << "layer " << l << " not refreshed";
  }
}

// A step the trace cannot hold (a lookahead weight that is not finite, as activations that are
// not give) ends the recording with an error, and the file gets no footer: readers refuse it
// rather than take the steps recorded before it for the whole run.
TEST_F(ExpertCacheTest, ARefusedTraceStepLeavesTheTraceWithoutItsFooter) {
  const fs::path trace = root_ / "refused.trace";
  auto ckpt = format::Checkpoint::open(root_ / "ckpt");
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().message();
  const int64_t layer = ckpt->config().first_k_dense_replace;  // the first MoE layer
  ASSERT_LT(layer + 2, ckpt->config().num_hidden_layers);
  {
    auto rec = strata::TraceRecorder::create(trace, *ckpt, 1, false);
    ASSERT_TRUE(rec.is_ok()) << rec.status().message();
    const int32_t ids[] = {0, 1};
    const float good[] = {0.75f, 0.25f}, bad[] = {std::nanf(""), 0.25f};
    // As the model calls them: a layer's predictions (for the next), then its routing.
    (*rec)->on_prediction(layer, 1, 0, ids, good, 1, 2);
    (*rec)->on_routing(layer, 0, ids, good, 1, 2);  // a whole step
    (*rec)->on_prediction(layer + 1, 1, 0, ids, bad, 1, 2);
    (*rec)->on_routing(layer + 1, 0, ids, good, 1, 2);  // refused
    const Status closed = (*rec)->close();
    EXPECT_FALSE(closed.is_ok());
    EXPECT_NE(closed.message().find("finite"), std::string::npos) << closed.message();
  }
  auto read = strata::read_trace(trace);
  ASSERT_FALSE(read.is_ok()) << "a trace cut short reads as whole";
  EXPECT_EQ(read.status().code(), ExitCode::kCorrupt) << read.status().message();
}

TEST_F(ExpertCacheTest, TraceRecordsLookaheadPredictionsHighestWeightFirst) {
  const fs::path trace = root_ / "predictions.trace";
  EngineOptions eo;
  eo.lookahead = 2;
  EXPECT_EQ(run(eo, nullptr, trace, 4), reference_);
  auto tr = strata::read_trace(trace);
  ASSERT_TRUE(tr.is_ok()) << tr.status().message();
  const strata::Trace& t = tr.value();
  EXPECT_EQ(t.header.lookahead_depth, 2u);
  EXPECT_TRUE(t.header.flags & strata::kTraceFlagRefresh);
  const uint32_t L = t.header.num_layers, k = t.header.top_k;
  uint64_t with_predictions = 0, dense_steps = 0;
  for (const strata::TraceStep& s : t.steps) {
    // Depths reach the last layer at most: L-1 has none, L-2 one.
    const size_t depths = std::min<size_t>(2, L - 1 - s.layer);
    ASSERT_EQ(s.predicted.size(), depths) << "layer " << s.layer;
    // A dense layer's predictions come in steps of their own, with nothing chosen.
    ASSERT_EQ(s.chosen.empty(), s.layer < t.header.first_moe_layer) << "layer " << s.layer;
    dense_steps += s.chosen.empty();
    // Every MoE layer is refreshed after the layer before it (the first from the dense layer).
    ASSERT_EQ(s.refreshed.size(), s.chosen.empty() ? 0u : k) << "layer " << s.layer;
    for (size_t i = 1; i < s.refreshed.size(); ++i)
      EXPECT_GE(s.refreshed[i - 1].weight, s.refreshed[i].weight);
    for (const auto& p : s.predicted) {
      ASSERT_EQ(p.size(), k);
      for (size_t i = 1; i < p.size(); ++i) EXPECT_GE(p[i - 1].weight, p[i].weight);
    }
    with_predictions += !s.predicted.empty();
  }
  EXPECT_GT(with_predictions, 0u);
  ASSERT_GT(t.header.first_moe_layer, 0u);
  EXPECT_GT(dense_steps, 0u);
  // The predictor is better than chance (k of N_e) one layer ahead, the first MoE layer too
  // (predicted from the dense layer before it).
  // q[0] is the refresh, q[1] depth 1.
  const auto q = strata::prediction_quality(strata::build_request_stream(t).value());
  ASSERT_EQ(q.size(), 3u);
  ASSERT_EQ(q[0].depth, 0u);
  EXPECT_GT(q[0].precision, static_cast<double>(k) / t.header.experts_per_layer);
  EXPECT_GT(q[1].precision, static_cast<double>(k) / t.header.experts_per_layer);
  EXPECT_EQ(q[0].predicted, q[0].requested) << "every MoE step carries its refresh";
  const auto& first = q[1].by_layer[t.header.first_moe_layer];
  EXPECT_EQ(first.predicted, first.requested);
  EXPECT_GT(first.correct, first.requested * k / t.header.experts_per_layer);
}

// GPU mode's bookkeeping, on the tier alone: a prediction the tier above keeps is not read
// here, and a prefetch that has landed counts as useful once its layer is routed to it, even
// though nothing fetches it from this tier (the VRAM tier serves the copy it made).
TEST_F(ExpertCacheTest, HeldAbovePredictionsAreNotReadAndLandedPrefetchesCountWhenRouted) {
  TierAlone t;
  ASSERT_NO_FATAL_FAILURE(open_tier_alone(8, static_cast<int64_t>(top_k_), t));
  ExpertCache& x = *t.cache;
  const int64_t layer = t.layer;
  ASSERT_GE(t.experts, static_cast<int64_t>(top_k_) + 2);
  x.set_held_above([](int64_t, int32_t id) { return id == 1; });
  const int32_t predicted[] = {0, 1};
  const float weights[] = {0.6f, 0.4f};
  x.on_prediction(layer - 1, 1, 0, predicted, weights, 1, 2);
  EXPECT_EQ(x.stats().prefetch_issued, 1u) << "expert 1 is kept by the tier above";
  ASSERT_TRUE(pump_until_landed(x, layer, 0));
  std::vector<int32_t> routed(top_k_);
  for (size_t j = 0; j < routed.size(); ++j) routed[j] = j == 0 ? 0 : static_cast<int32_t>(j + 1);
  x.begin_layer(layer, 0, routed.data(), 1, static_cast<int>(top_k_));
  EXPECT_EQ(x.stats().prefetch_useful, 1u);
  EXPECT_EQ(x.stats().prefetch_timely, 1u);
  EXPECT_EQ(x.stats().prefetch_wasted, 0u);
  x.set_held_above(nullptr);
}

// A predicted expert the tier holds is protected when it is predicted, not when the prefetch
// queue reaches it: here that queue waits behind a prefetch that fills the in-flight budget
// (2 chunk reads of 4 KiB, its reads held 2 s), while the layer before routes an expert of its
// own on demand. The LRU policy, full (3 experts: 0 and 1 used, 2 being prefetched), drops
// expert 1 for it; the predicted expert 0, used as long ago, stays (it used to be dropped; were
// the machine 2 s slow here, the queue would reach it before and this could not tell).
TEST_F(ExpertCacheTest, APredictedResidentIsProtectedBeforeThePrefetchQueueReachesIt) {
  TierAlone t;
  ASSERT_NO_FATAL_FAILURE(open_checkpoint_alone(t));
  const int64_t layer = t.layer;
  const format::ExpertLocation& slow = t.ckpt->expert(layer, 2);
  ASSERT_TRUE(slow.contiguous);
  io::IoOptions io;
  io.max_chunk_bytes = 4096;
  ASSERT_EQ(io::chunk_reads(io, slow.nbytes), 2u);
  io.fault_plan = std::make_shared<io::FaultPlan>();
  io.fault_plan->add(io::FaultRule::delay_by(std::chrono::seconds(2), slow.file_offset,
                                             slow.file_offset + slow.nbytes)
                         .in_path(t.ckpt->shard(slow.shard).path().filename().string()));
  ASSERT_NO_FATAL_FAILURE(open_tier_alone(3, 2, t, io, 2));
  ExpertCache& x = *t.cache;
  model::ExpertWeights views[2], view;
  const int32_t first[] = {0, 1}, predicted[] = {2, 0}, before[] = {3};
  const float weights[] = {0.6f, 0.4f};
  x.begin_layer(layer, 0, first, 1, 2);
  ASSERT_TRUE(x.fetch(layer, first, views).is_ok());
  x.on_prediction(layer - 1, 1, 1, predicted, weights, 1, 2);
  EXPECT_EQ(x.stats().prefetch_issued, 1u) << "expert 2 fills the budget";
  x.begin_pass();  // the next token's pass, as Model::forward begins it
  x.begin_layer(layer - 1, 1, before, 1, 1);
  ASSERT_TRUE(x.fetch(layer - 1, before, views).is_ok());
  EXPECT_TRUE(x.peek(layer, 0, &view)) << "the predicted expert 0 was dropped";
  EXPECT_FALSE(x.peek(layer, 1, &view)) << "expert 1, used as long ago, should have gone";
}

// In GPU mode the policy admits the name of an expert the VRAM tier served (no slot, no read);
// predicted once the VRAM tier no longer holds it, it is read into a slot like any prefetch
// (its prediction was dropped: the policy already held the name).
TEST_F(ExpertCacheTest, AResidentWithoutASlotIsReadWhenPredicted) {
  TierAlone t;
  ASSERT_NO_FATAL_FAILURE(open_tier_alone(8, 2, t));
  ExpertCache& x = *t.cache;
  const int64_t layer = t.layer;
  model::ExpertWeights views[1], view;
  const int32_t routed[] = {0, 1}, from_ram[] = {1}, predicted[] = {0, 1};
  const float weights[] = {0.6f, 0.4f};
  x.set_held_above([](int64_t, int32_t id) { return id == 0; });
  x.begin_layer(layer, 0, routed, 1, 2);
  ASSERT_TRUE(x.fetch(layer, from_ram, views).is_ok());
  EXPECT_FALSE(x.peek(layer, 0, &view)) << "served by the tier above: never read";
  x.set_held_above(nullptr);
  x.on_prediction(layer - 1, 1, 1, predicted, weights, 1, 2);
  EXPECT_EQ(x.stats().prefetch_issued, 1u) << "expert 0 only: 1 is in RAM";
  EXPECT_TRUE(pump_until_landed(x, layer, 0));
}

// A report window (the decode after a prefill) counts the prefetches issued before it apart:
// those settle in it as carried, so the window's own figures only hold its own prefetches.
TEST_F(ExpertCacheTest, PrefetchesIssuedBeforeAWindowSettleAsCarried) {
  TierAlone t;
  ASSERT_NO_FATAL_FAILURE(open_tier_alone(8, 2, t));
  ExpertCache& x = *t.cache;
  const int64_t layer = t.layer;
  const float weights[] = {0.5f, 0.5f};
  // Before the window: 0 and 2 predicted for `layer`, both landed.
  const int32_t before[] = {0, 2};
  ASSERT_TRUE(predict_and_land(x, layer, 0, before));
  x.begin_window();
  // In it: `layer` routes 0 (useful, carried) and not 2 (wasted, carried); the next pass
  // predicts 4 and 5 and routes 2 (a hit, no longer a prefetch) and 4 (useful, the window's
  // own), not 5 (wasted, the window's own).
  const int32_t routed1[] = {0, 3};
  x.begin_layer(layer, 0, routed1, 1, 2);
  x.begin_pass();
  const int32_t in_window[] = {4, 5};
  x.on_prediction(layer - 1, 1, 1, in_window, weights, 1, 2);
  ASSERT_TRUE(pump_until_landed(x, layer, 4));
  const int32_t routed2[] = {2, 4};
  x.begin_layer(layer, 1, routed2, 1, 2);
  const ExpertCacheStats& s = x.stats();
  EXPECT_EQ(s.prefetch_issued, 4u);
  EXPECT_EQ(s.prefetch_useful, 2u);
  EXPECT_EQ(s.carried_useful, 1u);
  EXPECT_EQ(s.prefetch_timely, 2u);
  EXPECT_EQ(s.carried_timely, 1u);
  EXPECT_EQ(s.prefetch_wasted, 2u);
  EXPECT_EQ(s.carried_wasted, 1u);
  EXPECT_EQ(2 * s.carried_wasted_bytes, s.prefetch_wasted_bytes);  // experts of equal size
  EXPECT_GT(s.carried_wasted_bytes, 0u);
}

// A carried prefetch its layer did not use is carried waste, once (not again when evicted), and
// the slot it leaves, taken by a prefetch issued in the window, holds the window's own prefetch.
TEST_F(ExpertCacheTest, CarriedPrefetchesEvictedInTheWindowFreeSlotsForItsOwn) {
  TierAlone t;
  ASSERT_NO_FATAL_FAILURE(open_tier_alone(4, 2, t));
  ExpertCache& x = *t.cache;
  const int64_t layer = t.layer;
  // One token's passes, the LRU policy holding 4 experts, each layer predicted before its
  // routing as in the model. Pass 0: layer - 1 predicts 0 and 2 for `layer` (read before the
  // window) and routes two of its own; `layer` routes 1 and 3: 0 and 2 are carried waste.
  const int32_t before[] = {0, 2}, routed[] = {1, 3}, earlier[] = {0, 1}, own[] = {4, 5};
  ASSERT_TRUE(predict_and_land(x, layer, 0, before));
  x.begin_layer(layer - 1, 0, earlier, 1, 2);
  x.begin_window();
  x.begin_layer(layer, 0, routed, 1, 2);
  EXPECT_EQ(x.stats().carried_wasted, 2u);
  // Pass 1: layer - 1's routing displaces the least recent, 0 and 2 (counted already); its
  // predictions 4 and 5 take the slots they left, and `layer` uses both.
  x.begin_pass();
  x.begin_layer(layer - 1, 1, earlier, 1, 2);
  EXPECT_EQ(x.stats().carried_wasted, 2u);
  ASSERT_TRUE(predict_and_land(x, layer, 1, own));
  x.begin_layer(layer, 1, own, 1, 2);
  const ExpertCacheStats& s = x.stats();
  EXPECT_EQ(s.prefetch_issued, 4u);
  EXPECT_EQ(s.prefetch_wasted, 2u);
  EXPECT_EQ(s.carried_wasted, 2u);
  EXPECT_EQ(s.prefetch_useful, 2u);
  EXPECT_EQ(s.carried_useful, 0u) << "4 and 5 were issued in the window";
}

// The prefetch budget counts the engine's chunk reads, not requests, and admits an expert only
// when all its chunks fit: with 4 KiB chunks a tiny expert (one contiguous read of 2 chunks)
// leaves a budget of 3 too small for the next one, so the second prediction waits until the
// first has landed (reads delayed 100 ms, so both would otherwise be in flight together).
TEST_F(ExpertCacheTest, PrefetchBudgetCountsChunkReadsNotRequests) {
  TierAlone t;
  ASSERT_NO_FATAL_FAILURE(open_tier_with_slow_reads(t));
  const int64_t layer = t.layer;
  ExpertCache& x = *t.cache;
  predict_0_then_1(x, layer, 0);
  EXPECT_EQ(x.stats().prefetch_issued, 1u) << "2 + 2 chunks would pass the budget of 3";
  ASSERT_TRUE(pump_until_landed(x, layer, 0));
  x.on_prediction(layer - 1, 1, 0, nullptr, nullptr, 0, 2);
  EXPECT_EQ(x.stats().prefetch_issued, 2u) << "then expert 1";
}

// A pass that ends before the layer it predicted for (a failed read, under serve) leaves its
// queue and its prefetches to no later pass: the queued prediction is cancelled when the next
// pass begins, and the landed prefetch, routed in that pass, is wasted, not useful.
TEST_F(ExpertCacheTest, APassThatEndedEarlyLeavesItsQueueAndPrefetchesToNoLaterPass) {
  TierAlone t;
  ASSERT_NO_FATAL_FAILURE(open_tier_with_slow_reads(t));
  const int64_t layer = t.layer;
  ExpertCache& x = *t.cache;
  x.begin_pass();
  predict_0_then_1(x, layer, 0);
  ASSERT_EQ(x.stats().prefetch_issued, 1u) << "expert 1 waits behind expert 0";
  x.begin_pass();  // the pass ended before `layer`
  EXPECT_EQ(x.stats().prefetch_cancelled, 1u);
  ASSERT_TRUE(pump_until_landed(x, layer, 0));
  x.on_prediction(layer - 1, 1, 1, nullptr, nullptr, 0, 2);
  EXPECT_EQ(x.stats().prefetch_issued, 1u) << "expert 1's prediction belonged to the old pass";
  const int32_t routed[] = {0, 1};
  x.begin_layer(layer, 1, routed, 1, 2);
  EXPECT_EQ(x.stats().prefetch_useful, 0u);
  EXPECT_EQ(x.stats().prefetch_wasted, 1u) << "read for a layer its pass never reached";
}

// Slow prefetch reads (each delayed 30 ms) arrive after their layer needs them: waited for,
// counted late (a miss), the bytes unchanged.
TEST_F(ExpertCacheTest, LatePrefetchesAreWaitedForAndCountedAsMisses) {
  EngineOptions eo;
  eo.ram_budget = budget_for(12, 2);
  eo.lookahead = 2;
  eo.io.fault_plan = std::make_shared<io::FaultPlan>();
  eo.io.fault_plan->add(
      io::FaultRule::delay_by(std::chrono::microseconds(30'000)).in_path("model-"));
  std::unique_ptr<Engine> e;
  EXPECT_EQ(run(eo, &e), reference_);
  ASSERT_NE(e, nullptr);
  const ExpertCacheStats& x = e->expert_cache()->stats();
  EXPECT_GT(x.late, 0u);
  EXPECT_LT(x.prefetch_timely, x.prefetch_useful);
  EXPECT_EQ(x.hits + x.demand_reads + x.late, x.policy_requests);
  EXPECT_GE(x.miss_bytes, x.late_bytes);
}

// Expert reads that fail (prefetch and demand alike) fail the forward pass with exit 1 naming the
// shard; once the disk heals, the same engine gives the reference ids (no failed slot is used).
TEST_F(ExpertCacheTest, FailedReadsFailThePassAndTheTierRecovers) {
  EngineOptions eo;
  eo.model_dir = root_ / "ckpt";
  eo.threads = 2;
  eo.ram_budget = budget_for(12, 2);
  eo.lookahead = 2;
  eo.io.backend = io::IoBackend::kPread;
  eo.io.fault_plan = std::make_shared<io::FaultPlan>();
  auto e = Engine::open(eo);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  Engine& engine = *e.value();
  // Shard 6 holds decoder layer 5 and its experts (one shard per layer).
  eo.io.fault_plan->add(io::FaultRule::eio().in_path("model-00006-of").times(-1));
  GenerationOptions g;
  g.max_new_tokens = 20;
  const auto keep = [](int32_t) { return Status::ok(); };
  const auto failed = generate(engine.model(), engine.experts(), prompt_, g, keep);
  ASSERT_FALSE(failed.is_ok());
  EXPECT_EQ(failed.status().exit_code(), 1);
  EXPECT_NE(failed.status().message().find("model-00006-of"), std::string::npos);
  eo.io.fault_plan->clear();
  std::vector<int32_t> ids;
  const auto again = generate(engine.model(), engine.experts(), prompt_, g,
                              [&](int32_t id) {
                                ids.push_back(id);
                                return Status::ok();
                              });
  ASSERT_TRUE(again.is_ok()) << again.status().message();
  EXPECT_EQ(ids, reference_);
}

// fetch_each hands the experts already in memory over at once, while the misses' reads run,
// and each miss when its reads land: with every read delayed 1 s the first group is the hits
// (handed over while no read has landed: the engine's count), the misses come after, every
// index exactly once, and the views are the ones a later fetch() hands out. A failing callback
// stops the hand-over; its error is returned once the reads issued have landed, and those
// experts are then in memory.
TEST_F(ExpertCacheTest, FetchEachHandsOverExpertsInMemoryWhileMissesLoad) {
  EngineOptions eo = all_kept_options();
  eo.io.fault_plan = std::make_shared<io::FaultPlan>();
  auto e = Engine::open(eo);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  ASSERT_NE((*e)->experts(), nullptr);
  model::ExpertSource& x = *(*e)->experts();
  const format::ModelConfig& c = (*e)->checkpoint().config();
  ASSERT_GE(c.num_experts, 8);
  ASSERT_GE(top_k_, 2u);  // a fetch takes up to top_k experts
  const int64_t layer = c.first_k_dense_replace;  // the first MoE layer
  std::vector<model::ExpertWeights> out(2), again(2);
  const std::vector<int32_t> warm = {0, 1};
  x.begin_layer(layer, 0, warm.data(), 1, 2);
  ASSERT_TRUE(x.fetch(layer, warm, out.data()).is_ok());

  eo.io.fault_plan->add(io::FaultRule::delay_by(std::chrono::milliseconds(1000)).times(-1));
  const std::vector<int32_t> ids = {5, 0};  // a miss, then a hit
  x.begin_layer(layer, 1, ids.data(), 1, 2);
  std::vector<std::vector<size_t>> groups;
  std::vector<double> at;
  std::vector<uint64_t> reads_landed;
  const io::IoEngine& io = *(*e)->io_engine();
  const uint64_t landed_before = io.counters().requests_completed;
  const auto t0 = std::chrono::steady_clock::now();
  const Status st = x.fetch_each(layer, ids, out.data(), [&](std::span<const size_t> g) {
    groups.emplace_back(g.begin(), g.end());
    at.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    reads_landed.push_back(io.counters().requests_completed - landed_before);
    return Status::ok();
  });
  ASSERT_TRUE(st.is_ok()) << st.message();
  ASSERT_GE(groups.size(), 2u);
  EXPECT_EQ(groups[0], (std::vector<size_t>{1}));  // the hit, before the miss asked first
  EXPECT_EQ(reads_landed[0], 0u) << "the hit waited for the miss's reads";
  std::vector<size_t> later;
  for (size_t i = 1; i < groups.size(); ++i) {
    EXPECT_GE(at[i], 0.99);
    EXPECT_GT(reads_landed[i], 0u);
    later.insert(later.end(), groups[i].begin(), groups[i].end());
  }
  std::sort(later.begin(), later.end());
  EXPECT_EQ(later, (std::vector<size_t>{0}));
  const uint64_t reads = (*e)->expert_cache()->stats().demand_reads;
  x.begin_layer(layer, 2, ids.data(), 1, 2);
  ASSERT_TRUE(x.fetch(layer, ids, again.data()).is_ok());
  EXPECT_EQ((*e)->expert_cache()->stats().demand_reads, reads);  // both in memory now
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(again[i].w1.data, out[i].w1.data) << i;

  const std::vector<int32_t> more = {1, 4};
  x.begin_layer(layer, 3, more.data(), 1, 2);
  int calls = 0;
  const Status stopped = x.fetch_each(layer, more, out.data(), [&](std::span<const size_t>) {
    ++calls;
    return Status::runtime("the caller failed");
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(stopped.message(), "the caller failed");
  const uint64_t reads_before = (*e)->expert_cache()->stats().demand_reads;
  x.begin_layer(layer, 4, more.data(), 1, 2);
  ASSERT_TRUE(x.fetch(layer, more, again.data()).is_ok());
  EXPECT_EQ((*e)->expert_cache()->stats().demand_reads, reads_before);  // 4 landed whole
}

// An exception out of fetch_each's callback (std::bad_alloc in a kernel: serve answers that
// request and goes on with this tier) while a miss's read is in flight leaves no read behind:
// the next fetch reads that expert again (before: it handed the slot out as in memory, bytes
// not landed, and aborted when the stale read completed), and its bytes are a fresh engine's.
TEST_F(ExpertCacheTest, AnExceptionFromTheCallerLeavesNoReadInFlight) {
  const EngineOptions eo = all_kept_options();
  EngineOptions faulty = eo;
  faulty.io.fault_plan = std::make_shared<io::FaultPlan>();
  auto e = Engine::open(faulty), fresh = Engine::open(eo);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  ASSERT_TRUE(fresh.is_ok()) << fresh.status().message();
  model::ExpertSource& x = *(*e)->experts();
  const int64_t layer = (*e)->checkpoint().config().first_k_dense_replace;
  std::vector<model::ExpertWeights> out(2), again(2), want(2);
  const std::vector<int32_t> warm = {0, 1}, ids = {5, 0};  // then a miss and a hit
  x.begin_layer(layer, 0, warm.data(), 1, 2);
  ASSERT_TRUE(x.fetch(layer, warm, out.data()).is_ok());
  faulty.io.fault_plan->add(io::FaultRule::delay_by(std::chrono::milliseconds(300)).times(-1));
  x.begin_layer(layer, 1, ids.data(), 1, 2);
  EXPECT_THROW(x.fetch_each(layer, ids, out.data(),
                            [](std::span<const size_t>) -> Status { throw std::bad_alloc(); }),
               std::bad_alloc);
  faulty.io.fault_plan->clear();
  const uint64_t reads = (*e)->expert_cache()->stats().demand_reads;
  x.begin_layer(layer, 2, ids.data(), 1, 2);
  ASSERT_TRUE(x.fetch(layer, ids, again.data()).is_ok());
  EXPECT_EQ((*e)->expert_cache()->stats().demand_reads, reads + 1);  // expert 5 read again
  model::ExpertSource& y = *(*fresh)->experts();
  y.begin_layer(layer, 0, ids.data(), 1, 2);
  ASSERT_TRUE(y.fetch(layer, ids, want.data()).is_ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint64_t bytes = backend::weight_data_bytes(want[i].w1);
    ASSERT_EQ(backend::weight_data_bytes(again[i].w1), bytes);
    EXPECT_EQ(std::memcmp(again[i].w1.data, want[i].w1.data, bytes), 0) << "expert " << ids[i];
  }
}

// fetch_each takes more experts than the tier lends slots for (a prefill chunk's layer): with no
// policy slots every miss borrows one of the top_k lent slots, which are given to the next miss
// once the earlier one has been handed over. Every index comes exactly once, each view holds
// the checkpoint's bytes of its expert when handed over, and a failing callback stops the
// stream with its error, after which the tier still serves fetches.
TEST_F(ExpertCacheTest, FetchEachStreamsMoreExpertsThanItsSlots) {
  EngineOptions eo;
  eo.model_dir = root_ / "ckpt";
  eo.threads = 2;
  eo.ram_budget = budget_for(0, 0);
  eo.lookahead = 0;
  auto e = Engine::open(eo);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  const ExpertCache* cache = (*e)->expert_cache();
  ASSERT_NE(cache, nullptr);
  model::ExpertSource& x = *(*e)->experts();
  ASSERT_EQ(cache->stats().policy_slots, 0);
  EngineOptions mapped_opts;
  mapped_opts.model_dir = root_ / "ckpt";
  auto mapped = Engine::open(mapped_opts);  // the checkpoint's bytes, mapped
  ASSERT_TRUE(mapped.is_ok()) << mapped.status().message();
  const format::ModelConfig& c = (*e)->checkpoint().config();
  const auto batch = static_cast<size_t>(x.max_batch());
  ASSERT_GT(static_cast<size_t>(c.num_experts), 2 * batch);
  EXPECT_EQ(x.max_each(), INT64_MAX);
  const int64_t layer = c.first_k_dense_replace;
  std::vector<int32_t> ids;
  for (int32_t id = static_cast<int32_t>(c.num_experts) - 1; id >= 0; id -= 1) ids.push_back(id);
  std::vector<model::ExpertWeights> out(ids.size()), truth(ids.size());
  ASSERT_TRUE((*mapped)->experts()->fetch(layer, ids, truth.data()).is_ok());
  const auto same_bytes = [](const cpu::WeightMatrix& a, const cpu::WeightMatrix& b) {
    if (a.type != b.type || a.rows != b.rows || a.cols != b.cols) return false;
    if (a.type != cpu::WeightType::kMxfp4)
      return std::memcmp(a.data, b.data, model::matrix_bytes(a)) == 0;
    const size_t packed = static_cast<size_t>(a.rows * a.cols / 2);
    return std::memcmp(a.data, b.data, packed) == 0 &&
           std::memcmp(a.scales, b.scales, static_cast<size_t>(a.rows * a.cols / 32)) == 0;
  };
  x.begin_layer(layer, 0, ids.data(), 1, static_cast<int>(ids.size()));
  std::vector<int> seen(ids.size(), 0);
  const Status st = x.fetch_each(layer, ids, out.data(), [&](std::span<const size_t> g) {
    for (size_t i : g) {
      ++seen[i];
      EXPECT_TRUE(same_bytes(out[i].w1, truth[i].w1) && same_bytes(out[i].w2, truth[i].w2) &&
                  same_bytes(out[i].w3, truth[i].w3))
          << "expert " << ids[i];
    }
    return Status::ok();
  });
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(seen, std::vector<int>(ids.size(), 1));
  EXPECT_EQ(cache->stats().slots, static_cast<int64_t>(batch));

  x.begin_layer(layer, 1, ids.data(), 1, static_cast<int>(ids.size()));
  int calls = 0;
  const Status stopped = x.fetch_each(layer, ids, out.data(), [&](std::span<const size_t>) {
    return ++calls == 2 ? Status::runtime("the caller failed") : Status::ok();
  });
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(stopped.message(), "the caller failed");
  const std::vector<int32_t> two = {ids[0], ids[1]};
  x.begin_layer(layer, 2, two.data(), 1, 2);
  ASSERT_TRUE(x.fetch(layer, two, out.data()).is_ok());
  for (size_t i = 0; i < two.size(); ++i) EXPECT_TRUE(same_bytes(out[i].w2, truth[i].w2)) << i;
}

TEST_F(ExpertCacheTest, PoliciesThatCannotRunLiveAreUsageErrors) {
  EngineOptions eo;
  eo.model_dir = root_ / "ckpt";
  eo.ram_budget = budget_for(8);
  eo.policy = PolicyKind::kBelady;
  EXPECT_EQ(Engine::open(eo).status().exit_code(), 2);
  eo.policy = PolicyKind::kStatic;  // without a ranking
  EXPECT_EQ(Engine::open(eo).status().exit_code(), 2);
  eo.policy = PolicyKind::kLru;
  eo.lookahead = -1;
  EXPECT_EQ(Engine::open(eo).status().exit_code(), 2);
}

// A lookahead deeper than the layers after the first predicts nothing more, and is sized as
// that depth: the minimum budget of L - 1 opens it.
TEST_F(ExpertCacheTest, LookaheadDeeperThanTheModelIsSizedAsItsLayers) {
  auto ckpt = format::Checkpoint::open(root_ / "ckpt", format::OpenMode::kPread);
  ASSERT_TRUE(ckpt.is_ok());
  const int deepest = static_cast<int>(ckpt->config().num_hidden_layers - 1);
  EngineOptions eo;
  eo.model_dir = root_ / "ckpt";
  eo.lookahead = 1000;
  eo.threads = 1;
  eo.ram_budget = dial_minimum(*ckpt, nullptr, deepest, 1, true, &eo.workload).total();
  auto e = Engine::open(eo);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  eo.ram_budget = *eo.ram_budget - 1;
  EXPECT_EQ(Engine::open(eo).status().exit_code(), 4);
}

// Automatic lookahead (no --lookahead) turns itself off where the budget holds everything but
// lookahead's routers and prefetch slots: the same bytes come out, the log says why, and a depth
// given is kept and refused. Below the minimum without lookahead too, the refusal states that
// minimum (the least an automatic run needs).
TEST_F(ExpertCacheTest, AutomaticLookaheadIsOffOnlyWhereTheBudgetHasNoRoomForIt) {
  auto ckpt = format::Checkpoint::open(root_ / "ckpt", format::OpenMode::kPread);
  ASSERT_TRUE(ckpt.is_ok());
  EngineOptions eo;
  eo.model_dir = root_ / "ckpt";
  eo.threads = 2;
  const uint64_t with = dial_minimum(*ckpt, nullptr, kDefaultLookahead, 2, true, &eo.workload)
                            .total();
  const uint64_t without = dial_minimum(*ckpt, nullptr, 0, 2, true, &eo.workload).total();
  ASSERT_LT(without, with);
  const auto choose = [&](uint64_t budget) {
    return choose_lookahead(*ckpt, nullptr, eo, budget, 2);
  };
  EXPECT_EQ(choose(with).depth, kDefaultLookahead);
  EXPECT_TRUE(choose(with).lowered.empty());
  EXPECT_EQ(choose(with - 1).depth, 0);
  EXPECT_NE(choose(with - 1).lowered.find("a budget of " + format_size(with)), std::string::npos)
      << choose(with - 1).lowered;
  EXPECT_EQ(choose(without).depth, 0);
  EXPECT_EQ(choose(without - 1).depth, 0);
  EXPECT_TRUE(choose(without - 1).lowered.empty()) << "refused: nothing to say it is off";

  eo.ram_budget = without;
  std::unique_ptr<Engine> e;
  EXPECT_EQ(run(eo, &e), reference_);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->model().lookahead_depth(), 0);
  EXPECT_EQ(e->router_bank(), nullptr);
  eo.ram_budget = with;
  EXPECT_EQ(run(eo, &e), reference_);
  EXPECT_EQ(e->model().lookahead_depth(), kDefaultLookahead);
  EXPECT_NE(e->router_bank(), nullptr) << "at its minimum every layer streams: the bank scores";
  eo.ram_budget = without - 1;
  const auto refused = Engine::open(eo);
  ASSERT_EQ(refused.status().exit_code(), 4);
  EXPECT_NE(refused.status().message().find("the minimum is " + format_size(without)),
            std::string::npos)
      << refused.status().message();
  // Given, a depth is kept: refused below its minimum, and never lowered by the budget.
  eo.lookahead = kDefaultLookahead;
  EXPECT_EQ(choose(with - 1).depth, kDefaultLookahead);
  eo.ram_budget = with - 1;
  EXPECT_EQ(Engine::open(eo).status().exit_code(), 4);
  // The static policy never prefetches: no lookahead to lower.
  eo.lookahead.reset();
  eo.policy = PolicyKind::kStatic;
  EXPECT_EQ(choose(with - 1).depth, 0);
  EXPECT_TRUE(choose(with - 1).lowered.empty());
}

}  // namespace
}  // namespace ktier::runtime
