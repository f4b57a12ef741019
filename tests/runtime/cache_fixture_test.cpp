// The conformance cache/ fixture (conformance README §8) through the expert tiers: 24 MXFP4
// experts of 1,632 bytes at 20,608 + 1,632 e, every tensor's bytes distinguishable. Its shapes
// are not an expert's geometry (its w2 has w1's shape), so the test serves the fixture's data
// section under a header declaring the latent geometry of the same byte counts (I = ell = 32:
// packed [32, 16] and scale [32, 1], 512 and 32 bytes as its [8, 64] and [8, 4]) padded to the
// fixture's header length, as layer 1 of a two-layer model: the bytes and their file offsets are
// the fixture's. README §8's checks: (1) the experts are found contiguous where the README puts
// them; (2) a RAM tier of 5 slots, requests cycling over all 24 and in random orders, serves the
// README's bytes every time; (3) batched fetches, streamed fetches and landed prefetches serve
// the same bytes; (4) hits and misses add up to the requests and equal an LRU model's on the
// same sequence; (5) the same through the VRAM tier (emulated device), with each I/O engine,
// direct and buffered.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "common/test_paths.h"
#include "format/checkpoint.h"
#include "format/st_builder.h"
#include "io/io_engine.h"
#include "io/read_file.h"
#include "runtime/engine_outputs.h"
#include "runtime/expert_cache.h"
#include "runtime/vram_expert_tier.h"

namespace ktier::runtime {
namespace {

namespace fs = std::filesystem;
using test::ojson;

constexpr int64_t kLayer = 1;  // the MoE layer the fixture's experts are (layer 0 is dense)
constexpr int32_t kExperts = 24;
constexpr uint64_t kFirstExpert = 20608, kExpertBytes = 1632, kPackedBytes = 512,
                   kScaleBytes = 32;
constexpr int64_t kSlots = 5;  // the RAM tier's policy: smaller than the working set

// README §8: byte k of a tensor of expert e is (k + base) mod 251, base = (977 e + 31 w + 7 for
// a scale) mod 256, w = 0, 1, 2 for w1, w2, w3.
uint8_t fixture_byte(int32_t e, int w, bool scale, uint64_t k) {
  const uint64_t base = (977 * static_cast<uint64_t>(e) + 31 * w + (scale ? 7 : 0)) % 256;
  return static_cast<uint8_t>((k + base) % 251);
}

// "" when `bytes` are tensor (e, w, scale)'s, else where they first differ.
std::string differs(const uint8_t* bytes, uint64_t n, int32_t e, int w, bool scale) {
  for (uint64_t k = 0; k < n; ++k)
    if (bytes[k] != fixture_byte(e, w, scale, k))
      return "expert " + std::to_string(e) + " w" + std::to_string(w + 1) +
             (scale ? " scale" : " packed") + " byte " + std::to_string(k);
  return "";
}

// "" when matrix w of expert e is a 32 x 32 MXFP4 view whose `packed` and `scales` bytes (in
// host memory) are the fixture's.
std::string matrix_differs(const cpu::WeightMatrix& m, const uint8_t* packed,
                           const uint8_t* scales, int32_t e, int w) {
  if (m.type != cpu::WeightType::kMxfp4 || m.rows != 32 || m.cols != 32)
    return "expert " + std::to_string(e) + ": not a 32 x 32 MXFP4 view";
  const std::string d = differs(packed, kPackedBytes, e, w, false);
  return d.empty() ? differs(scales, kScaleBytes, e, w, true) : d;
}

// Host views (the RAM tier's) of expert e hold the fixture's bytes, each matrix.
std::string host_view_differs(const model::ExpertWeights& v, int32_t e) {
  const cpu::WeightMatrix* m[] = {&v.w1, &v.w2, &v.w3};
  for (int w = 0; w < 3; ++w)
    if (std::string d = matrix_differs(*m[w], static_cast<const uint8_t*>(m[w]->data),
                                       m[w]->scales, e, w);
        !d.empty())
      return d;
  return "";
}

// The same for device views (the VRAM tier's), read back.
std::string device_view_differs(backend::Backend& be, const model::ExpertWeights& v, int32_t e) {
  const cpu::WeightMatrix* m[] = {&v.w1, &v.w2, &v.w3};
  std::vector<uint8_t> packed(kPackedBytes), scales(kScaleBytes);
  for (int w = 0; w < 3; ++w) {
    if (!be.download(packed.data(), m[w]->data, kPackedBytes).is_ok() ||
        !be.download(scales.data(), m[w]->scales, kScaleBytes).is_ok())
      return "expert " + std::to_string(e) + ": download failed";
    if (std::string d = matrix_differs(*m[w], packed.data(), scales.data(), e, w); !d.empty())
      return d;
  }
  return "";
}

// Hits of an LRU cache of `slots` experts over `requests` in order (the simple model of §8 (4)).
uint64_t lru_hits(const std::vector<int32_t>& requests, int64_t slots) {
  std::deque<int32_t> held;  // most recent last
  uint64_t hits = 0;
  for (const int32_t e : requests) {
    const auto at = std::find(held.begin(), held.end(), e);
    hits += at != held.end();
    if (at != held.end()) held.erase(at);
    else if (static_cast<int64_t>(held.size()) == slots) held.pop_front();
    held.push_back(e);
  }
  return hits;
}

using IoParam = std::tuple<io::IoBackend, io::DirectMode>;
std::string io_param_name(const ::testing::TestParamInfo<IoParam>& info) {
  const auto& [backend, direct] = info.param;
  return std::string(backend == io::IoBackend::kUring ? "uring" : "pread") +
         (direct == io::DirectMode::kDirect ? "_direct" : "_buffered");
}

class CacheFixtureTest : public ::testing::TestWithParam<IoParam> {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("ktier-cache-fixture-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ojson config = test::tiny_nested_config(/*mxfp4=*/true, /*num_layers=*/2);
    ojson& tc = config["text_config"];
    tc["num_experts"] = kExperts;
    tc["moe_intermediate_size"] = 32;
    tc["routed_expert_hidden_size"] = 32;
    test::SynthCheckpoint ck = test::make_checkpoint(config, /*mxfp4=*/true);
    ojson index = ck.make_index();  // before layer 1's synthetic experts are taken out

    const fs::path fixture = ktier::test::conformance_dir() / "cache" /
                             "model-00001-of-00001.safetensors";
    const std::vector<uint8_t> bytes = test::read_all(fixture);
    ASSERT_EQ(bytes.size(), kFirstExpert + kExperts * kExpertBytes) << fixture;
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    ASSERT_EQ(8 + n, kFirstExpert);
    const ojson header = ojson::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(n));
    ASSERT_EQ(header.size(), 6u * kExperts);
    ojson relabelled = ojson::object();
    const std::string file = "model-cache-fixture.safetensors";
    for (const auto& [name, info] : header.items()) {
      const std::string from = "language_model.model.layers.0.";
      ASSERT_EQ(name.rfind(from, 0), 0u) << name;
      const std::string layer1 = format::layer_prefix(kLayer) + name.substr(from.size());
      ASSERT_TRUE(ck.remove(layer1)) << layer1;
      ojson t = info;
      const bool scale = name.ends_with("weight_scale");
      t["shape"] = scale ? ojson::array({32, 1}) : ojson::array({32, 16});
      relabelled[layer1] = t;
      index["weight_map"][layer1] = file;
    }
    std::string text = relabelled.dump();
    ASSERT_LE(text.size(), n);
    text.append(n - text.size(), ' ');  // the fixture's header length: its data offsets
    std::vector<uint8_t> shard(bytes);
    std::memcpy(shard.data() + 8, text.data(), n);
    test::write_bytes(dir_ / file, shard);
    ck.index_override = index;
    ck.write(dir_);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  void SetUp() override {
    auto ckpt = format::Checkpoint::open(dir_);
    ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().message();
    ckpt_.emplace(std::move(*ckpt));
    io::IoOptions io;
    std::tie(io.backend, io.direct) = GetParam();
    auto engine = io::make_io_engine(io);
    if (!engine.is_ok() && io.backend == io::IoBackend::kUring)
      GTEST_SKIP() << "io_uring unavailable here: " << engine.status().message();
    ASSERT_TRUE(engine.is_ok()) << engine.status().message();
    shards_.engine = std::move(*engine);  // open_shard_files opens the shard with it
    if (io.direct == io::DirectMode::kDirect) {
      auto probe = io::ReadFile::open(dir_ / "model-cache-fixture.safetensors", io.direct);
      if (!probe.is_ok())
        GTEST_SKIP() << "O_DIRECT unavailable in " << dir_ << ": " << probe.status().message();
    }
    ASSERT_NO_FATAL_FAILURE(open_shard_files(*ckpt_, shards_));
    for (const io::ReadFile& f : shards_.files)
      ASSERT_EQ(f.direct(), io.direct == io::DirectMode::kDirect);
  }

  // The RAM tier over the fixture's shard: LRU, kSlots policy slots, `batch` for one fetch.
  std::unique_ptr<ExpertCache> ram_tier(int64_t batch) {
    ExpertCacheOptions xo;
    xo.policy = strata::PolicyKind::kLru;
    xo.policy_slots = kSlots;
    xo.batch_slots = batch;
    auto cache = ExpertCache::open(*ckpt_, *shards_.engine, shards_.files, std::move(xo));
    EXPECT_TRUE(cache.is_ok()) << cache.status().message();
    return cache.is_ok() ? std::move(*cache) : nullptr;
  }

  // One decode token per step of `steps` (each routed to a pair of experts) through `tier`, each
  // view checked by `check`; the experts asked for, in order, appended to `seen`.
  template <class Check>
  static void route(model::ExpertSource& tier, const std::vector<std::array<int32_t, 2>>& steps,
                    std::vector<int32_t>& seen, const Check& check) {
    int64_t position = 0;
    for (const auto& ids : steps) {
      tier.begin_pass();
      tier.begin_layer(kLayer, position++, ids.data(), 1, 2);
      model::ExpertWeights out[2];
      ASSERT_TRUE(tier.fetch(kLayer, ids, out).is_ok());
      for (int i = 0; i < 2; ++i) {
        ASSERT_EQ(check(out[i], ids[static_cast<size_t>(i)]), "");
        seen.push_back(ids[static_cast<size_t>(i)]);
      }
    }
  }

  // 3 cycles over the 24 experts in pairs, then 150 random pairs of distinct experts.
  static std::vector<std::array<int32_t, 2>> cycling_then_random() {
    constexpr size_t kCycling = 3 * kExperts / 2, kRandom = 150;
    std::vector<std::array<int32_t, 2>> steps;
    for (int cycle = 0; cycle < 3; ++cycle)
      for (int32_t e = 0; e < kExperts; e += 2) steps.push_back({e, e + 1});
    std::mt19937 rng(8);
    std::uniform_int_distribution<int32_t> pick(0, kExperts - 1);
    while (steps.size() < kCycling + kRandom) {
      const int32_t a = pick(rng), b = pick(rng);
      if (a != b) steps.push_back({a, b});
    }
    return steps;
  }

  static inline fs::path dir_;
  std::optional<format::Checkpoint> ckpt_;
  ShardFiles shards_;
};

// (1): the checkpoint reads the 24 experts as single runs at the README's offsets.
TEST_P(CacheFixtureTest, ExpertsAreContiguousRunsWhereTheReadmePutsThem) {
  for (int32_t e = 0; e < kExperts; ++e) {
    const format::ExpertLocation& loc = ckpt_->expert(kLayer, e);
    EXPECT_TRUE(loc.contiguous) << e;
    EXPECT_EQ(loc.file_offset, kFirstExpert + kExpertBytes * static_cast<uint64_t>(e)) << e;
    EXPECT_EQ(loc.nbytes, kExpertBytes) << e;
    EXPECT_EQ(ckpt_->shard(loc.shard).path().filename(), "model-cache-fixture.safetensors");
  }
}

// (2) and (4): every view holds the fixture's bytes; hits and misses add up and equal LRU's.
TEST_P(CacheFixtureTest, ARamTierSmallerThanTheWorkingSetServesTheBytesAndCountsAsLru) {
  auto ram = ram_tier(2);
  ASSERT_TRUE(ram);
  std::vector<int32_t> seen;
  ASSERT_NO_FATAL_FAILURE(route(*ram, cycling_then_random(), seen, host_view_differs));
  const ExpertCacheStats& s = ram->stats();
  EXPECT_EQ(s.hits + s.demand_reads + s.late, seen.size());
  EXPECT_EQ(s.policy_requests, seen.size());
  const uint64_t hits = lru_hits(seen, kSlots);
  EXPECT_EQ(s.hits, hits);
  EXPECT_EQ(s.policy_hits, hits);
  EXPECT_GT(hits, 0u);
  EXPECT_LT(hits, seen.size() / 2) << "5 slots for 24 experts: mostly misses";
  EXPECT_EQ(s.hit_bytes, hits * kExpertBytes);
  EXPECT_EQ(s.read_bytes, (seen.size() - hits) * kExpertBytes);
}

// (3): one batched fetch of 4, a streamed fetch of all 24 through 2 lent slots, and landed
// prefetches serve the same bytes as the single fetches above.
TEST_P(CacheFixtureTest, BatchedStreamedAndPrefetchedReadsServeTheSameBytes) {
  auto ram = ram_tier(4);
  ASSERT_TRUE(ram);
  const int32_t batch[] = {17, 3, 22, 8};
  ram->begin_pass();
  ram->begin_layer(kLayer, 0, batch, 2, 2);
  model::ExpertWeights out[kExperts];
  ASSERT_TRUE(ram->fetch(kLayer, batch, out).is_ok());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(host_view_differs(out[i], batch[i]), "");

  std::vector<int32_t> all(kExperts);
  for (int32_t e = 0; e < kExperts; ++e) all[static_cast<size_t>(e)] = kExperts - 1 - e;
  ram->begin_pass();
  ram->begin_layer(kLayer, 2, all.data(), kExperts / 2, 2);
  std::vector<int> handed(kExperts, 0);
  ASSERT_TRUE(ram->fetch_each(kLayer, all, out, [&](std::span<const size_t> ready) {
                 for (const size_t i : ready) {
                   ++handed[i];
                   EXPECT_EQ(host_view_differs(out[i], all[i]), "");
                 }
                 return Status::ok();
               }).is_ok());
  EXPECT_EQ(std::count(handed.begin(), handed.end(), 1), kExperts);

  // Predicted from layer 0 (dense: the lookahead scores layer 1's router there), read ahead:
  // landed (the views peek gives hold the bytes), then fetched as hits.
  const int32_t predicted[] = {11, 5};
  const float weights[] = {0.5f, 0.5f};
  ram->begin_pass();
  ram->on_prediction(kLayer - 1, 1, 0, predicted, weights, 1, 2);
  model::ExpertWeights landed[2];
  bool both = false;
  for (int i = 0; i < 500 && !both; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ram->on_prediction(kLayer - 1, 1, 0, nullptr, nullptr, 0, 2);  // takes completions
    both = ram->peek(kLayer, 11, &landed[0]) && ram->peek(kLayer, 5, &landed[1]);
  }
  ASSERT_TRUE(both) << "the prefetches did not land in 5 s";
  EXPECT_EQ(host_view_differs(landed[0], 11), "");
  EXPECT_EQ(host_view_differs(landed[1], 5), "");
  const ExpertCacheStats before = ram->stats();
  ram->begin_layer(kLayer, 0, predicted, 1, 2);
  ASSERT_TRUE(ram->fetch(kLayer, predicted, out).is_ok());
  EXPECT_EQ(host_view_differs(out[0], 11), "");
  EXPECT_EQ(host_view_differs(out[1], 5), "");
  EXPECT_EQ(ram->stats().prefetch_issued, 2u);
  EXPECT_EQ(ram->stats().prefetch_useful, 2u);
  EXPECT_EQ(ram->stats().prefetch_timely, 2u);
  EXPECT_EQ(ram->stats().hits, before.hits + 2);
  EXPECT_EQ(ram->stats().demand_reads, before.demand_reads);
}

// (5): the VRAM tier over the RAM tier (both smaller than the working set), on the emulated
// device: the views read back hold the fixture's bytes, and its counts add up as LRU's.
TEST_P(CacheFixtureTest, AVramTierOverTheRamTierServesTheBytesAndCountsAsLru) {
  auto ram = ram_tier(2);
  ASSERT_TRUE(ram);
  auto be = backend::make_emulated_device_backend(cpu::Exec{nullptr, cpu::Isa::kScalar});
  const int64_t vram_slots = VramExpertTier::minimum_slots(ckpt_->config()) + 2;
  auto vram =
      VramExpertTier::open(*ram, *be, ckpt_->config(), VramExpertTier::slot_bytes_for(*ckpt_),
                           vram_slots, strata::PolicyKind::kLru, strata::PolicyInputs{});
  ASSERT_TRUE(vram.is_ok()) << vram.status().message();
  VramExpertTier& vram_tier = **vram;
  std::vector<int32_t> seen;
  ASSERT_NO_FATAL_FAILURE(route(vram_tier, cycling_then_random(), seen,
                                [&](const model::ExpertWeights& w, int32_t e) {
                                  return device_view_differs(*be, w, e);
                                }));
  const VramTierStats& s = vram_tier.stats();
  // The VRAM policy keeps the slots less one fetch's bypass (VramExpertTier::minimum_slots).
  ASSERT_EQ(s.policy_slots, static_cast<uint64_t>(vram_slots - 2));
  const uint64_t hits = lru_hits(seen, vram_slots - 2);
  EXPECT_EQ(s.requests, seen.size());
  EXPECT_EQ(s.hits, hits);
  EXPECT_EQ(s.hit_bytes + s.miss_bytes, seen.size() * kExpertBytes);
  EXPECT_EQ(s.hit_bytes, hits * kExpertBytes);
  EXPECT_GT(hits, 0u);
  EXPECT_LT(hits, seen.size() / 2);
  // The RAM tier below saw every routed expert and was fetched from for every VRAM miss.
  const ExpertCacheStats& below = ram->stats();
  EXPECT_EQ(below.policy_requests, seen.size());
  EXPECT_EQ(below.hits + below.demand_reads + below.late, seen.size() - hits);
}

INSTANTIATE_TEST_SUITE_P(
    Io, CacheFixtureTest,
    ::testing::Combine(::testing::Values(io::IoBackend::kUring, io::IoBackend::kPread),
                       ::testing::Values(io::DirectMode::kDirect, io::DirectMode::kBuffered)),
    io_param_name);

}  // namespace
}  // namespace ktier::runtime
