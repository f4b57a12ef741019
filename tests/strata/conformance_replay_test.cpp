// The conformance routing trace (../shared/conformance/expert_trace.bin, README §10) through the
// converter and the replay simulator: every number of the README's LRU oracle table, the
// distinct-key ceiling, Belady at 455 slots, the determinism oracle, and the ordering of
// policies. A missing conformance folder fails; it never skips.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <utility>
#include <vector>

#include "common/test_paths.h"
#include "strata/conformance_trace.h"
#include "strata/replay.h"
#include "strata/trace_format.h"
#include "strata/trace_summary.h"

namespace ktier::strata {
namespace {

constexpr uint64_t kRequests = 100096;
constexpr uint64_t kDistinctKeys = 10010;
constexpr uint64_t kCeiling = kRequests - kDistinctKeys;  // 90,086

// README §10.3, both halves of the table, plus "10,001 and more -> 90,086".
const std::vector<std::pair<uint64_t, uint64_t>> kLruOracle = {
    {1, 25},        {2, 89},        {4, 376},       {8, 1910},      {15, 12815},    {16, 17832},
    {17, 20618},    {18, 22437},    {20, 25008},    {24, 28579},    {32, 32721},    {48, 34912},
    {64, 35639},    {100, 36178},   {128, 36260},   {256, 36272},   {455, 36272},   {911, 36272},
    {1472, 36272},  {1823, 36272},  {3647, 36272},  {6000, 38459},  {7000, 46998},  {7294, 49238},
    {8000, 56481},  {9000, 73853},  {9999, 90000},  {10000, 90000}, {10001, 90086}, {10010, 90086},
    {12000, 90086}, {20000, 90086}, {100000, 90086}};

class ConformanceTrace : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::filesystem::path path = test::conformance_dir() / "expert_trace.bin";
    Result<Trace> t = read_conformance_trace(path);
    load_status_ = t.status();
    if (!t.is_ok()) return;
    trace_ = new Trace(std::move(t).value());
    stream_ = new RequestStream(build_request_stream(*trace_).value());
  }
  static void TearDownTestSuite() {
    delete stream_;
    delete trace_;
  }
  void SetUp() override {
    // The conformance data is part of the test contract: missing means failed, not skipped.
    ASSERT_TRUE(load_status_.is_ok())
        << "conformance trace unavailable: " << load_status_.message()
        << " (set KTIER_CONFORMANCE_DIR or -DKTIER_CONFORMANCE_DIR to ../shared/conformance)";
  }

  static ReplayResult run(PolicyKind policy, uint64_t slots, ReplayParams params = {}) {
    ReplaySpec spec;
    spec.policy = policy;
    spec.tiers.push_back({"ram", slots * stream_->expert_bytes, slots});
    static const ReplayInputs inputs = ReplayInputs::from(*stream_);
    return replay(*stream_, spec, params, inputs);
  }

  static inline Status load_status_;
  static inline Trace* trace_ = nullptr;
  static inline RequestStream* stream_ = nullptr;
};

TEST_F(ConformanceTrace, StructureAndCeiling) {
  EXPECT_EQ(stream_->requests(), kRequests);
  EXPECT_EQ(trace_->steps.size(), kRequests / 16);  // 6,256 (token, layer) request sets
  EXPECT_EQ(stream_->passes, 8u);
  EXPECT_EQ(stream_->tokens, 68u);  // sum of T = 5..12
  EXPECT_EQ(stream_->moe_layers, 92u);
  EXPECT_EQ(trace_->header.num_layers, 93u);
  EXPECT_EQ(trace_->header.first_moe_layer, 1u);
  EXPECT_EQ(trace_->header.expert_bytes, 17547264u);
  const TraceSummary s = summarize_trace(*trace_, *stream_);
  EXPECT_EQ(s.distinct_keys, kDistinctKeys);
  EXPECT_EQ(s.hit_ceiling, kCeiling);
  // Determinism oracle (README §10.2).
  EXPECT_EQ(s.repeated_groups, 5152u);
  EXPECT_EQ(s.mismatched_groups, 0u);
  // Pass p has T = 5 + p positions.
  for (const TraceStep& step : trace_->steps) ASSERT_LT(step.position, 5 + step.pass);
}

TEST_F(ConformanceTrace, GlobalLruReproducesTheReadmeTableExactly) {
  for (const auto& [slots, hits] : kLruOracle) {
    EXPECT_EQ(run(PolicyKind::kLru, slots).hits, hits) << slots << " slots";
  }
}

TEST_F(ConformanceTrace, BeladyAt455SlotsIs39457) {
  const ReplayResult r = run(PolicyKind::kBelady, 455);
  EXPECT_EQ(r.hits, 39457u);
  EXPECT_NEAR(r.hit_rate, 0.3942, 5e-5);  // README: 39.42%
}

TEST_F(ConformanceTrace, BeladyBoundsEveryPolicyAndCeilingBoundsBelady) {
  std::vector<ReplaySpec> specs;
  for (PolicyKind p : kAllPolicies) {
    for (const auto& [slots, hits] : kLruOracle) {
      ReplaySpec spec;
      spec.policy = p;
      spec.tiers.push_back({"ram", slots * stream_->expert_bytes, slots});
      specs.push_back(spec);
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<ReplayResult> results =
      replay_sweep(*stream_, specs, ReplayParams{}, ReplayInputs::from(*stream_));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ timing ] %zu replays of %llu requests: %.2f s\n", results.size(),
              static_cast<unsigned long long>(kRequests), seconds);
  // Printed, not asserted: speed is bench's to measure (bench/), a unit test's is correctness.
  const size_t sizes = kLruOracle.size();
  const size_t belady = 4;  // kAllPolicies order: lru, lfu, temperature, static, belady
  for (size_t i = 0; i < sizes; ++i) {
    const uint64_t best = results[belady * sizes + i].hits;
    EXPECT_LE(best, kCeiling);
    for (size_t p = 0; p < 5; ++p) {
      const ReplayResult& r = results[p * sizes + i];
      EXPECT_LE(r.hits, best) << policy_name(r.policy) << " at " << kLruOracle[i].first;
      EXPECT_LE(r.hits, kCeiling);
      EXPECT_EQ(r.requests, kRequests);
    }
  }
  // Above the distinct-key count every policy that admits everything reaches the ceiling.
  for (size_t p = 0; p < 5; ++p) EXPECT_EQ(results[p * sizes + sizes - 1].hits, kCeiling);
}

TEST_F(ConformanceTrace, TwoTiersMatchTheLruStack) {
  // LRU is a stack algorithm: with VRAM 455 slots and RAM 1,368 more, VRAM serves exactly the
  // hits of a 455-slot cache and VRAM + RAM those of a 1,823-slot cache.
  ReplaySpec spec;
  spec.policy = PolicyKind::kLru;
  spec.tiers = {{"vram", 455 * stream_->expert_bytes, 455},
                {"ram", 1368 * stream_->expert_bytes, 1368}};
  const ReplayResult r = replay(*stream_, spec, ReplayParams{}, ReplayInputs::from(*stream_));
  ASSERT_EQ(r.tiers.size(), 3u);
  EXPECT_EQ(r.tiers[0].hits, run(PolicyKind::kLru, 455).hits);
  EXPECT_EQ(r.tiers[0].hits + r.tiers[1].hits, run(PolicyKind::kLru, 1823).hits);
  EXPECT_EQ(r.tiers[0].hits + r.tiers[1].hits + r.tiers[2].hits, kRequests);
  EXPECT_EQ(r.tiers[2].name, "nvme");
  // Bytes: RAM->VRAM carries everything not served by VRAM; NVMe->RAM what only NVMe had.
  const uint64_t eb = stream_->expert_bytes;
  EXPECT_EQ(r.link_bytes[0], (kRequests - r.tiers[0].hits) * eb);
  EXPECT_EQ(r.link_bytes[1], r.tiers[2].hits * eb);
  EXPECT_EQ(r.bytes_read, r.tiers[2].hits * eb);
  EXPECT_DOUBLE_EQ(r.tiers[0].hit_rate_bytes, static_cast<double>(r.tiers[0].hits) / kRequests);
}

TEST_F(ConformanceTrace, ConvertedFileReplaysIdentically) {
  const std::filesystem::path p = std::filesystem::temp_directory_path() /
                                  ("ktier_conf_" + std::to_string(::getpid()) + ".ktrace");
  ASSERT_TRUE(write_trace(p, *trace_).is_ok());
  Result<Trace> back = read_trace(p);
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  const RequestStream s = build_request_stream(*back).value();
  EXPECT_EQ(s.keys, stream_->keys);
  EXPECT_EQ(s.step_begin, stream_->step_begin);
  std::filesystem::remove(p);
}

}  // namespace
}  // namespace ktier::strata
