// GPU mode (issue 6): the trunk mirrored into device memory and the VRAM expert tier in front of
// the host tier. On the emulated device (the CPU kernels behind a memory wall that aborts on any
// host pointer) the output must be the CPU path's bytes at every VRAM budget, with and without
// the memory dial below; on a real GPU (skipped here without one) greedy ids must equal the
// CPU's, teacher-forced argmax must agree wherever the CPU's top-2 margin exceeds 1e-3, and the
// output must be byte-identical across VRAM budgets.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>

#include "backend/cuda_backend.h"
#include "common/size.h"
#include "engine_outputs.h"
#include "tests/common/same_bytes.h"

namespace ktier::runtime {
namespace {

using test::same_bytes;

// What an opened device engine's placement is made of, bytes.
struct DeviceSizes {
  uint64_t trunk_all = 0;  // the whole trunk mirrored
  uint64_t working = 0;    // the sequence's working set, set aside first
  uint64_t slot = 0;       // one VRAM expert slot
};

class DeviceModeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::filesystem::temp_directory_path() /
           ("ktier-device-mode-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    ASSERT_NO_FATAL_FAILURE(synth_tiny(dir_ / "m"));
    reference_ = logits_then_greedy_ids(cpu(), kDialTestPrompt);
    ASSERT_FALSE(reference_.empty());
    // The sizes the budgets below are made from, measured on a device run that holds it all.
    auto e = Engine::open(emulated(uint64_t{1} << 32));
    ASSERT_TRUE(e.is_ok()) << e.status().message();
    emulated_sizes_ = sizes_of(**e);
    top_k_ = (*e)->checkpoint().config().num_experts_per_token;
    layers_ = (*e)->checkpoint().config().num_hidden_layers;
    vocab_ = (*e)->checkpoint().config().vocab_size;
    experts_ = static_cast<uint64_t>((*e)->checkpoint().config().num_moe_layers() *
                                     (*e)->checkpoint().config().num_experts);
    tier_min_slots_ = static_cast<uint64_t>(
        VramExpertTier::minimum_slots((*e)->checkpoint().config(), kDefaultLookahead));
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }

  static EngineOptions cpu() {
    EngineOptions eo;
    eo.model_dir = dir_ / "m";
    eo.threads = 2;
    return eo;
  }
  // The emulated device holds no more than `vram` at once (an allocation past it fails the run
  // as a GPU's would), so every run below also checks that the working set set aside covers
  // what the sequence allocates: the prompt in chunks of 5 with every row's logits, then up to
  // 8 generated tokens.
  static EngineOptions emulated(uint64_t vram) {
    EngineOptions eo = cpu();
    eo.emulate_device = true;
    eo.vram_budget = vram;
    eo.workload = {static_cast<int64_t>(kDialTestPrompt.size()) + 8,
                   static_cast<int64_t>(kDialTestPrompt.size()), model::LogitRows::kAll};
    return eo;
  }
  // The same plan on the real GPU, whose working set may differ (with cuBLAS prefill, its
  // workspace): budgets for it are made from its own sizes (DeviceSizes), not the emulated
  // device's.
  static EngineOptions on_cuda(uint64_t vram) {
    EngineOptions eo = emulated(vram);
    eo.emulate_device = false;
    eo.device = backend::DeviceKind::kCuda;
    return eo;
  }
  using MakeOptions = EngineOptions (*)(uint64_t vram);
  static DeviceSizes sizes_of(const Engine& e) {
    return {e.device_trunk()->bytes(), e.device_working_bytes(), e.vram_tier()->stats().slot_bytes};
  }
  // Everything resident, every expert too; about half the trunk; the smallest budget that
  // opens (no layer resident, the VRAM tier at its minimum; automatic lookahead is off there:
  // 2 * top_k slots).
  static std::vector<uint64_t> budgets(const DeviceSizes& z = emulated_sizes_,
                                       MakeOptions make = emulated) {
    const uint64_t tier_min = tier_min_slots_ * z.slot;
    return {z.working + z.trunk_all + (experts_ + top_k_) * z.slot,
            z.working + z.trunk_all / 2 + tier_min, minimum(z, make)};
  }
  // The smallest --vram in (lo, hi] whose engine opens and satisfies `ok`, within `step`
  // (bisection; `hi` must satisfy it).
  static uint64_t smallest_vram(uint64_t lo, uint64_t hi, uint64_t step,
                                const std::function<bool(const Engine&)>& ok,
                                MakeOptions make = emulated) {
    while (hi - lo > step) {
      const uint64_t mid = (lo + hi) / 2;
      auto e = Engine::open(make(mid));
      (e.is_ok() && ok(**e) ? hi : lo) = mid;
    }
    return hi;
  }
  // GPU mode streaming on both links: the middle --vram budget (some layers on the device, the
  // rest copied from the host) and the dial's minimum --ram (the host streams some of those
  // from disk). Call under ASSERT_NO_FATAL_FAILURE; `out` is null on failure.
  static void open_streaming_both_ways(std::unique_ptr<Engine>& out) {
    const auto ck = format::Checkpoint::open(dir_ / "m", format::OpenMode::kPread);
    ASSERT_TRUE(ck.is_ok());
    EngineOptions eo = emulated(budgets()[1]);
    eo.ram_budget = dial_minimum(*ck, nullptr, 1, 2, false, nullptr).total();
    auto e = Engine::open(eo);
    ASSERT_TRUE(e.is_ok()) << e.status().message();
    ASSERT_LT((*e)->device_trunk()->resident_layers(), layers_) << "some layers must stream";
    ASSERT_GT((*e)->trunk_store()->stats().layers_streamed, 0) << "the host must stream some";
    out = std::move(*e);
  }
  // The refusal states the minimum; found by bisection.
  static uint64_t minimum(const DeviceSizes& z = emulated_sizes_, MakeOptions make = emulated) {
    return smallest_vram(0, z.working + z.trunk_all + 4 * top_k_ * z.slot, 4096,
                         [](const Engine&) { return true; }, make);
  }

  static inline std::filesystem::path dir_;
  static inline std::vector<float> reference_;
  static inline DeviceSizes emulated_sizes_;
  static inline uint64_t top_k_ = 0, experts_ = 0, tier_min_slots_ = 0;
  static inline int64_t layers_ = 0, vocab_ = 0;
};

TEST_F(DeviceModeTest, EmulatedDeviceGivesTheCpuBytesAtEveryVramBudget) {
  std::vector<int64_t> resident;
  for (uint64_t vram : budgets()) {
    SCOPED_TRACE("vram " + std::to_string(vram));
    EXPECT_TRUE(same_bytes(logits_then_greedy_ids(emulated(vram), kDialTestPrompt), reference_));
    auto e = Engine::open(emulated(vram));
    ASSERT_TRUE(e.is_ok());
    resident.push_back((*e)->device_trunk()->resident_layers());
  }
  // The three budgets really are different placements: all, some, and no layer resident.
  EXPECT_EQ(resident[0], layers_);
  EXPECT_GT(resident[1], 0);
  EXPECT_LT(resident[1], layers_);
  EXPECT_EQ(resident[2], 0);
}

// GPU mode's forward pass run out of memory at one host allocation after another (serve goes on
// with the same engine after a std::bad_alloc): the device trunk's streamed layers, the host's
// ring they stream from (RAM at the minimum), the VRAM tier and the RAM tier below it are left
// whole, and the next pass gives the bytes of a pass that never failed. Every 8th allocation
// of a 3-token pass, from a fresh offset.
TEST_F(DeviceModeTest, AForwardThatRunsOutOfMemoryLeavesTheDeviceEngineWhole) {
  std::unique_ptr<Engine> e;
  ASSERT_NO_FATAL_FAILURE(open_streaming_both_ways(e));
  expect_forward_out_of_memory_leaves_engine_whole(
      "DeviceModeTest.AForwardThatRunsOutOfMemoryLeavesTheDeviceEngineWhole", 8, *e,
      kDialTestPrompt);
}

// GPU mode's pass abandoned between two layers (Ctrl-C in a run that saves nothing), with
// copies and reads made for layers it never reached: the device trunk's streamed layers, the
// host's ring, the VRAM tier and the RAM tier below it serve the next pass the CPU's bytes.
// Every 5th boundary of 5 passes: each of the tiny model's 12 once.
TEST_F(DeviceModeTest, APassAbandonedBetweenLayersLeavesTheDeviceEngineWhole) {
  std::unique_ptr<Engine> e;
  ASSERT_NO_FATAL_FAILURE(open_streaming_both_ways(e));
  expect_abandoned_passes_leave_engine_whole(*e, kDialTestPrompt, reference_, 5);
}

// The copy ahead a pass's last layer makes (the next pass's first streamed layer, read by the
// host from the shards) is speculative, as the host's read ahead is: when that read fails for
// good, the next pass copies the layer again and gives the CPU's bytes (in serve, the failure
// is not charged to the next request).
TEST_F(DeviceModeTest, AFailedCopyAheadIsMadeAgainWhenTheLayerIsNeeded) {
  const auto ck = format::Checkpoint::open(dir_ / "m", format::OpenMode::kPread);
  ASSERT_TRUE(ck.is_ok());
  EngineOptions eo = emulated(budgets()[1]);
  eo.ram_budget = dial_minimum(*ck, nullptr, 1, 2, false, nullptr).total();
  eo.io.backend = io::IoBackend::kPread;
  eo.io.fault_plan = std::make_shared<io::FaultPlan>();
  auto e = Engine::open(eo);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  const int64_t first = (*e)->device_trunk()->resident_layers();
  ASSERT_LT(first, layers_);
  ASSERT_FALSE((*e)->trunk_store()->is_pinned(first)) << "the host must read it from the shards";
  const std::vector<int32_t> ids(kDialTestPrompt.begin(), kDialTestPrompt.begin() + 3);
  std::vector<float> out(ids.size() * static_cast<size_t>(vocab_));
  const std::vector<float> want(reference_.begin(),
                                reference_.begin() + static_cast<std::ptrdiff_t>(out.size()));
  const auto pass = [&] {
    poison_logits(out);
    return evaluate((*e)->model(), ids, 3, out.data());
  };
  // A pass with no fault first: its end copies `first` ahead, so the next pass reads no byte
  // of it until its own end.
  ASSERT_TRUE(pass().is_ok());
  const std::string name = TrunkStore::shard_layout(*ck)
                               .records[static_cast<size_t>(first)]
                               .tensors.front()
                               .name;
  const auto tensor = ck->find(name);
  ASSERT_TRUE(tensor.has_value()) << name;
  const size_t rule = eo.io.fault_plan->add(
      io::FaultRule::eio(tensor->info->file_offset, tensor->info->file_offset + 1)
          .in_path(ck->shard(tensor->shard).path().filename().string())
          .times(-1));
  const Status failing = pass();  // its end's copy ahead of `first` cannot read it
  EXPECT_GT(eo.io.fault_plan->fires(rule), 0u) << "the copy ahead read nothing of " << name;
  eo.io.fault_plan->clear();
  ASSERT_TRUE(failing.is_ok()) << failing.message();
  const Status next = pass();
  ASSERT_TRUE(next.is_ok()) << next.message();
  EXPECT_TRUE(same_bytes(out, want));
}

TEST_F(DeviceModeTest, EmulatedDeviceOverTheMemoryDialGivesTheCpuBytes) {
  EngineOptions eo = emulated(budgets()[1]);
  const int depth = eo.lookahead.value_or(kDefaultLookahead);
  ASSERT_GT(depth, 0);
  // GPU mode scores lookahead on the device trunk's routers: no host RouterBank, and the
  // dial's minimum is the CPU engine's less the routers.
  const auto ck = format::Checkpoint::open(dir_ / "m", format::OpenMode::kPread);
  const DialMinimum cpu = dial_minimum(*ck, nullptr, depth, eo.threads, true, nullptr);
  const DialMinimum gpu = dial_minimum(*ck, nullptr, depth, eo.threads, false, nullptr);
  ASSERT_GT(cpu.routers, 0u);
  EXPECT_EQ(gpu.routers, 0u);
  eo.ram_budget = gpu.total();
  EXPECT_TRUE(same_bytes(logits_then_greedy_ids(eo, kDialTestPrompt), reference_));
  auto e = Engine::open(eo);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  EXPECT_EQ((*e)->router_bank(), nullptr);
  // One byte below: automatic lookahead is off (fewer expert slots), a depth given is refused.
  eo.ram_budget = gpu.total() - 1;
  EXPECT_EQ(choose_lookahead(*ck, nullptr, eo, *eo.ram_budget, eo.threads).depth, 0);
  eo.lookahead = depth;
  EXPECT_EQ(Engine::open(eo).status().exit_code(), 4);
}

// Where --vram and the RAM budget are both short of lookahead's share, the note names both: more
// VRAM alone would not turn it on.
TEST_F(DeviceModeTest, LookaheadOffForBothBudgetsSaysSo) {
  EngineOptions eo = emulated(minimum());  // holds the device's minimum without lookahead only
  const auto ck = format::Checkpoint::open(dir_ / "m", format::OpenMode::kPread);
  ASSERT_TRUE(ck.is_ok());
  const uint64_t with = dial_minimum(*ck, nullptr, kDefaultLookahead, eo.threads, false, nullptr,
                                     layers_).total();
  eo.ram_budget = uint64_t{1} << 30;
  auto vram_only = plan_engine(*ck, nullptr, eo, eo.threads, nullptr);
  ASSERT_TRUE(vram_only.is_ok()) << vram_only.status().message();
  ASSERT_NE(vram_only->lookahead_lowered.find("lookahead off: --vram "), std::string::npos)
      << "the fixture's minimum --vram holds the device's minimum without lookahead only";
  for (const uint64_t ram : {with - 1, with}) {
    eo.ram_budget = ram;
    auto p = plan_engine(*ck, nullptr, eo, eo.threads, nullptr);
    ASSERT_TRUE(p.is_ok()) << p.status().message();
    EXPECT_EQ(p->lookahead, 0);
    EXPECT_NE(p->lookahead_lowered.find("lookahead off: --vram "), std::string::npos)
        << p->lookahead_lowered;
    EXPECT_EQ(p->lookahead_lowered.find("is below its minimum with lookahead too, " +
                                        format_size(with)) != std::string::npos,
              ram < with)
        << p->lookahead_lowered;
  }
}

// The host trunk (the memory dial's TrunkStore) complements the device's: it pins the last
// layers (the device holds the first ones), and its ring reads ahead only the layers the device
// streams and the host does not pin — after the last layer it wraps to the device's first
// streamed layer, not to its own first (which the device holds). So each decode step reads
// exactly those layers from disk, whatever the two budgets; the bytes are the CPU's.
TEST_F(DeviceModeTest, HostTrunkComplementsTheDeviceTrunk) {
  const auto ck = format::Checkpoint::open(dir_ / "m", format::OpenMode::kPread);
  ASSERT_TRUE(ck.is_ok());
  const pack::PackLayout plan = TrunkStore::shard_layout(*ck);  // the store reads the shards
  const auto payload = [&](int64_t record) {  // what reading it from the shards reads
    uint64_t n = 0;
    for (const pack::TensorEntry& t : plan.records[static_cast<size_t>(record)].tensors) n += t.nbytes;
    return n;
  };
  const uint64_t ram_min = dial_minimum(*ck, nullptr, 1, 2, false, nullptr).total();
  bool some_pinned = false;
  for (const uint64_t extra_ram : {uint64_t{0}, 3 * plan.records[static_cast<size_t>(layers_ - 1)].size}) {
    SCOPED_TRACE("RAM above the minimum: " + std::to_string(extra_ram));
    EngineOptions eo = emulated(budgets()[1]);
    eo.ram_budget = ram_min + extra_ram;
    auto e = Engine::open(eo);
    ASSERT_TRUE(e.is_ok()) << e.status().message();
    const int64_t resident = (*e)->device_trunk()->resident_layers();
    const TrunkStore* store = (*e)->trunk_store();
    const int64_t pinned = store->stats().layers_pinned;
    ASSERT_LT(resident, layers_);
    ASSERT_GT(resident, 2) << "layers the device holds are not read per token by the host";
    EXPECT_EQ(store->first_pinned(), layers_ - pinned) << "the host pins the last layers";
    // Both ring slots read ahead for the cycle (none is left holding a layer the device has).
    for (int64_t l : store->ring_layers()) EXPECT_TRUE(l == -1 || l >= resident) << l;
    // Opening read each layer the device needs once — the resident ones, and the streamed MoE
    // layers' routing weights (sized from shapes, not read for that) — plus the cycle's first
    // layers, read ahead for the first token.
    uint64_t open_reads = 0;
    for (int64_t l = 0; l < layers_; ++l)
      if (!store->is_pinned(l) && (l < resident || !ck->config().is_dense(l)))
        open_reads += payload(l);
    for (int64_t l : store->ring_layers())
      if (l >= 0) open_reads += payload(l);
    EXPECT_EQ(store->stats().streamed_bytes_read, open_reads);
    some_pinned = some_pinned || (pinned > 0 && pinned < layers_ - resident);
    uint64_t per_step = 0;
    for (int64_t l = resident; l < layers_ - pinned; ++l)
      per_step += payload(l);
    uint64_t before = 0;
    std::vector<int32_t> ids;
    GenerationOptions g;
    g.max_new_tokens = 8;
    g.reserve_positions = static_cast<int64_t>(kDialTestPrompt.size()) + 7;
    g.before_decode = [&] { before = store->stats().streamed_bytes_read; };
    auto st = generate((*e)->model(), (*e)->experts(), kDialTestPrompt, g, [&](int32_t id) {
      ids.push_back(id);
      return Status::ok();
    });
    ASSERT_TRUE(st.is_ok()) << st.status().message();
    EXPECT_EQ(store->stats().streamed_bytes_read - before,
              static_cast<uint64_t>(st->decode_steps) * per_step);
    for (int64_t l : store->ring_layers()) EXPECT_TRUE(l == -1 || l >= resident) << l;
    const size_t n_logits = kDialTestPrompt.size() * static_cast<size_t>(vocab_);
    ASSERT_GE(reference_.size(), n_logits + 6);
    ASSERT_GE(ids.size(), 6u);
    for (size_t i = 0; i < 6; ++i)
      EXPECT_EQ(static_cast<float>(ids[i]), reference_[n_logits + i]) << "greedy id " << i;
  }
  EXPECT_TRUE(some_pinned) << "one case pins some, not all, of the layers the device streams";
  // RAM for the whole trunk and more: the host pins only the layers the device streams, and the
  // rest of the budget goes to the expert RAM tier instead of to layers the device holds.
  EngineOptions eo = emulated(budgets()[1]);
  uint64_t trunk_records = 0;  // every layer and the head: the CPU path pins them all
  for (int64_t r = 0; r <= layers_; ++r) trunk_records += plan.records[static_cast<size_t>(r)].size;
  eo.ram_budget = ram_min + trunk_records;
  auto e = Engine::open(eo);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  const int64_t resident = (*e)->device_trunk()->resident_layers();
  ASSERT_GT(resident, 0);
  EXPECT_EQ((*e)->trunk_store()->stats().layers_pinned, layers_ - resident);
  EXPECT_EQ((*e)->trunk_store()->first_pinned(), resident);
  // One layer on the device, every other pinned by the host: opening reads that layer once
  // (no read ahead of another), and nothing streams from disk afterwards (the ring is freed).
  const uint64_t one_layer = smallest_vram(minimum(), budgets()[0], 4096, [](const Engine& en) {
    return en.device_trunk()->resident_layers() >= 1;
  });
  eo.vram_budget = one_layer;
  auto one = Engine::open(eo);
  ASSERT_TRUE(one.is_ok()) << one.status().message();
  ASSERT_EQ((*one)->device_trunk()->resident_layers(), 1);
  ASSERT_EQ((*one)->trunk_store()->stats().layers_pinned, layers_ - 1);
  EXPECT_EQ((*one)->trunk_store()->stats().streamed_bytes_read, payload(0));
  EXPECT_TRUE((*one)->trunk_store()->ring_layers().empty());
  EngineOptions on_cpu = eo;
  on_cpu.emulate_device = false;
  auto c = Engine::open(on_cpu);  // the CPU path pins every layer from the same budget
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  ASSERT_EQ((*c)->trunk_store()->stats().layers_pinned, layers_);
  EXPECT_GT((*e)->expert_cache()->stats().slots, (*c)->expert_cache()->stats().slots);
  // When the device holds or the host pins every layer, the host's ring served only the
  // mirror's pass: it is freed before the expert RAM tier opens, which gets every byte the
  // trunk holds no more (TrunkStoreTest checks what the release subtracts; a tier opened before
  // it would have two layers' bytes fewer; `e`'s tier holds every expert).
  for (Engine* both : {e->get(), one->get()}) {
    const TrunkStore& store = *both->trunk_store();
    EXPECT_TRUE(store.ring_layers().empty());
    const ExpertCacheStats& x = both->expert_cache()->stats();
    const uint64_t all = experts_ + static_cast<uint64_t>(top_k_);
    EXPECT_EQ(static_cast<uint64_t>(x.slots),
              std::min(all, (eo.ram_budget.value() - store.stats().bytes_allocated) / x.slot_bytes));
    if (both == one->get()) {
      EXPECT_LT(static_cast<uint64_t>(x.slots), all);
    }
    GenerationOptions g;
    g.max_new_tokens = 4;
    std::vector<int32_t> ids;
    auto st = generate(both->model(), both->experts(), kDialTestPrompt, g,
                       [&](int32_t id) {
                         ids.push_back(id);
                         return Status::ok();
                       });
    ASSERT_TRUE(st.is_ok()) << st.status().message();
    const size_t n_logits = kDialTestPrompt.size() * static_cast<size_t>(vocab_);
    for (size_t i = 0; i < ids.size(); ++i)
      EXPECT_EQ(static_cast<float>(ids[i]), reference_[n_logits + i]) << "greedy id " << i;
  }
}

TEST_F(DeviceModeTest, VramTierCountsHitsAndCopies) {
  for (uint64_t vram : {budgets()[0], budgets()[2]}) {
    auto e = Engine::open(emulated(vram));
    ASSERT_TRUE(e.is_ok());
    GenerationOptions g;
    g.max_new_tokens = 8;
    g.reserve_positions = static_cast<int64_t>(kDialTestPrompt.size()) + 7;
    ASSERT_TRUE(generate((*e)->model(), (*e)->experts(), kDialTestPrompt, g,
                         [](int32_t) { return Status::ok(); })
                    .is_ok());
    const VramTierStats& s = (*e)->vram_tier()->stats();
    EXPECT_GT(s.requests, 0u);
    EXPECT_LE(s.hits, s.requests);
    EXPECT_EQ(s.copied_bytes, s.miss_bytes + s.prefetch_bytes)
        << "every miss and every lookahead copy is one copy of the stored bytes";
    EXPECT_LE(s.prefetch_useful + s.prefetch_wasted, s.prefetch_issued);
    EXPECT_EQ((*e)->experts()->bytes_fetched(), s.hit_bytes + s.miss_bytes);
    // No --ram given: GPU mode still runs the memory dial, its RAM tier staging every expert
    // (io_uring reads into page-locked slots, then RAM -> VRAM copies); no mapped weights.
    ASSERT_NE((*e)->expert_cache(), nullptr);
    EXPECT_EQ((*e)->weights(), nullptr);
    EXPECT_GT((*e)->expert_cache()->stats().read_bytes, 0u);
    if (vram == budgets()[0]) {
      EXPECT_GT(s.hits, 0u) << "room for every expert: reuse";
      // Every layer resident, so lookahead scores every router; predicted experts the RAM tier
      // holds are copied ahead (peek), and some predictions are right.
      EXPECT_GT(s.prefetch_issued, 0u);
      EXPECT_GT(s.prefetch_useful, 0u);
    }
  }
}

TEST_F(DeviceModeTest, BudgetsTheDeviceCannotMeetAreRefused) {
  auto small = Engine::open(emulated(minimum() - 4096));
  ASSERT_FALSE(small.is_ok());
  EXPECT_EQ(small.status().exit_code(), 4);
  // The stated minimum is exact: it opens, one byte less does not.
  const std::string msg = small.status().message();
  const size_t at = msg.find("minimum is ");
  ASSERT_NE(at, std::string::npos) << msg;
  const uint64_t stated = std::stoull(msg.substr(at + 11));
  EXPECT_TRUE(Engine::open(emulated(stated)).is_ok()) << msg;
  EXPECT_EQ(Engine::open(emulated(stated - 1)).status().exit_code(), 4);
  EXPECT_NE(msg.find("--vram " + std::to_string(minimum() - 4096)), std::string::npos)
      << "the message names the --vram given: " << msg;
  EngineOptions no_vram = emulated(0);
  no_vram.vram_budget.reset();
  auto e = Engine::open(no_vram);
  ASSERT_FALSE(e.is_ok());
  EXPECT_EQ(e.status().exit_code(), 2) << e.status().message();
}

// Streamed layers are double-buffered: each is copied once per forward pass, the next one while
// the current one's ops run (after the last layer, the next token's first streamed layer), and
// one or two streamed layers stay in their slots, copied once. The bytes are the CPU's.
TEST_F(DeviceModeTest, StreamedLayersAreCopiedOnceAheadOfUse) {
  auto host = Engine::open(cpu());
  ASSERT_TRUE(host.is_ok());
  std::vector<uint64_t> layer_bytes;
  for (int64_t l = 0; l < layers_; ++l)
    layer_bytes.push_back(DeviceTrunk::layer_bytes((*host)->weights()->layer(l)));
  // The smallest budget with at least `resident` layers resident.
  auto budget_for = [&](int64_t resident) {
    return smallest_vram(minimum(), budgets()[0], 256, [&](const Engine& e) {
      return e.device_trunk()->resident_layers() >= resident;
    });
  };
  // The placements budgets can give, fewest streamed layers first (holding all but one or two
  // layers can cost more than holding all, when the two slots are larger than the last layers).
  std::vector<uint64_t> vrams;
  int64_t last = layers_;
  for (int64_t want = layers_ - 1; want >= 0; --want) {
    const uint64_t v = want == 0 ? minimum() : budget_for(want);
    auto e = Engine::open(emulated(v));
    ASSERT_TRUE(e.is_ok());
    const int64_t got = (*e)->device_trunk()->resident_layers();
    if (got < last) vrams.push_back(v), last = got;
  }
  ASSERT_GE(vrams.size(), 2u);
  // logits_then_greedy_ids runs 9 forward passes: the prompt in 3 chunks, then 1 + 5 tokens.
  constexpr uint64_t kForwards = 9;
  bool three_or_more = false;
  for (const uint64_t vram : {vrams.front(), vrams[vrams.size() / 2], vrams.back()}) {
    auto e = Engine::open(emulated(vram));
    ASSERT_TRUE(e.is_ok()) << e.status().message();
    const int64_t resident = (*e)->device_trunk()->resident_layers();
    const int64_t streamed = layers_ - resident;
    SCOPED_TRACE("streamed layers " + std::to_string(streamed));
    three_or_more = three_or_more || streamed >= 3;
    uint64_t per_pass = 0;
    for (int64_t l = resident; l < layers_; ++l) per_pass += layer_bytes[static_cast<size_t>(l)];
    Engine& run = **e;
    const int64_t V = vocab_;
    std::vector<float> out(kDialTestPrompt.size() * static_cast<size_t>(V));
    ASSERT_TRUE(evaluate(run.model(), kDialTestPrompt, 5, out.data()).is_ok());
    GenerationOptions g;
    g.max_new_tokens = 6;
    g.reserve_positions = static_cast<int64_t>(kDialTestPrompt.size()) + 5;
    ASSERT_TRUE(generate(run.model(), run.experts(), kDialTestPrompt, g, [&](int32_t id) {
                  out.push_back(static_cast<float>(id));
                  return Status::ok();
                }).is_ok());
    EXPECT_TRUE(same_bytes(out, reference_)) << "the CPU's bytes";
    // Every copy ahead — streamed layers (their vectors gathered into page-locked staging),
    // experts from the RAM tier's arena — reads page-locked memory.
    EXPECT_EQ(run.backend().pageable_copy_bytes(), 0u);
    const uint64_t copied = run.device_trunk()->streamed_bytes();
    if (streamed <= 2)
      EXPECT_EQ(copied, per_pass) << "the streamed layers stay in their two slots";
    else
      EXPECT_EQ(copied, kForwards * per_pass + layer_bytes[static_cast<size_t>(resident)])
          << "each pass copies each streamed layer once; the last copies the next pass's first";
  }
  EXPECT_TRUE(three_or_more);
  EXPECT_EQ(last, 0) << "the smallest budget streams every layer";
}

// model::working_set against what the sequence really allocates on the device (the emulated
// device counts its allocations as asked; the bound rounds each up to 256 bytes): never less,
// and little more.
TEST_F(DeviceModeTest, WorkingSetBoundsWhatASequenceAllocates) {
  for (const int lookahead : {0, 1})
    for (const int64_t T : {1, 5, 12})
      for (const model::LogitRows rows :
           {model::LogitRows::kNone, model::LogitRows::kLast, model::LogitRows::kAll}) {
        SCOPED_TRACE("lookahead " + std::to_string(lookahead) + ", T " + std::to_string(T) +
                     ", rows " + std::to_string(static_cast<int>(rows)));
        EngineOptions eo = emulated(uint64_t{1} << 32);
        eo.lookahead = lookahead;
        auto e = Engine::open(eo);
        ASSERT_TRUE(e.is_ok()) << e.status().message();
        model::Model& m = (*e)->model();
        const backend::Backend& be = (*e)->backend();
        const int64_t positions = T + 3;
        const model::WorkingSet ws = model::working_set(m.config(), T, positions, rows, lookahead > 0);
        const uint64_t live0 = be.memory_use().live;
        ASSERT_EQ(be.memory_use().peak, live0) << "opening only adds";
        auto seq = m.new_sequence(positions);
        ASSERT_TRUE(seq.is_ok());
        const uint64_t state = be.memory_use().live - live0;
        EXPECT_LE(state, ws.state_bytes);
        EXPECT_GE(state + 4 * 256 * static_cast<uint64_t>(m.config().num_hidden_layers), ws.state_bytes);
        std::vector<float> logits(static_cast<size_t>(T * vocab_));
        const std::vector<int32_t> ids(kDialTestPrompt.begin(), kDialTestPrompt.begin() + T);
        const uint64_t live1 = be.memory_use().live;
        ASSERT_TRUE(m.forward(ids, *seq, rows, logits.data()).is_ok());
        const int32_t next[1] = {3};  // a decode step after the chunk needs no more
        ASSERT_TRUE(m.forward(next, *seq, rows, logits.data()).is_ok());
        const uint64_t activations = be.memory_use().peak - live1;
        EXPECT_LE(activations, ws.activation_bytes);
        EXPECT_GE(activations, ws.activation_bytes / 10 * 9);
        EXPECT_EQ(be.memory_use().live, live1) << "a forward pass keeps nothing";
      }
}

// The real GPU: same model, same prompts. Skips (saying why) without one.
TEST_F(DeviceModeTest, CudaMatchesTheCpuAndIsBudgetInvariant) {
  const auto module = backend::probe_cuda_module();
  if (auto be = backend::make_cuda_backend(module); !be.is_ok())
    GTEST_SKIP() << "no CUDA device here: " << be.status().message();
  const int64_t V = vocab_;
  DeviceSizes gpu;
  {
    auto e = Engine::open(on_cuda(uint64_t{1} << 32));
    ASSERT_TRUE(e.is_ok()) << e.status().message();
    gpu = sizes_of(**e);
  }
  std::vector<std::vector<float>> outs;
  const std::vector<uint64_t> vrams = budgets(gpu, on_cuda);
  for (uint64_t vram : vrams) {
    SCOPED_TRACE("vram " + std::to_string(vram));
    outs.push_back(logits_then_greedy_ids(on_cuda(vram), kDialTestPrompt));
    ASSERT_EQ(outs.back().size(), reference_.size());
  }
  for (size_t i = 1; i < outs.size(); ++i)
    EXPECT_TRUE(test::same_bytes(outs[i], outs[0]))
        << "GPU output changed with the VRAM budget (" << i << ")";
  // The whole prompt in one pass and token by token: the same bytes as the chunks of 5 above
  // (the fused kernels sum each (row, token) alike for any chunk; K3-MODEL §9.2). With
  // --gpu-prefill cublas the one pass's matrix products go through cuBLAS (8 tokens or more):
  // compared by argmax below.
  const size_t n_logits = kDialTestPrompt.size() * V;
  const int64_t whole = static_cast<int64_t>(kDialTestPrompt.size());
  ASSERT_GE(whole, 8) << "one pass must reach cuBLAS's 8 tokens";
  // Poisoned before each pass, so that a pass writing nothing cannot pass on the bytes of the
  // one before; cuBLAS's logits are kept for the argmax below.
  std::vector<float> one_pass(n_logits), cublas_pass;
  for (const bool cublas : {false, true})
    for (const int64_t chunk : {whole, int64_t{1}}) {
      if (cublas && chunk == 1) continue;
      SCOPED_TRACE(std::string(cublas ? "cuBLAS" : "fused") + ", chunk " + std::to_string(chunk));
      // (The budgets above were sized without cuBLAS's workspace.)
      EngineOptions eo = on_cuda(cublas ? uint64_t{1} << 32 : vrams[0]);
      eo.cublas_prefill = cublas;
      auto e = Engine::open(eo);
      ASSERT_TRUE(e.is_ok()) << e.status().message();
      poison_logits(one_pass);
      ASSERT_TRUE(evaluate((*e)->model(), kDialTestPrompt, chunk, one_pass.data()).is_ok());
      EXPECT_EQ(unwritten_logits(one_pass), 0) << "logits evaluate() did not write";
      if (cublas) cublas_pass = one_pass;
      // (cuBLAS asked of a module without it: the fused kernels, so the same bytes too.)
      if (!cublas || !(*e)->backend().uses_blas()) {
        EXPECT_TRUE(test::same_bytes(one_pass, {outs[0].begin(), outs[0].begin() + n_logits}))
            << "GPU logits changed with the prefill chunk";
      }
      if (cublas && !(*e)->backend().uses_blas())
        std::printf("[ note ] no cuBLAS in the CUDA module: its prefill path is not tested\n");
    }
  // The greedy ids must match the CPU's up to the first step where the CPU's own top two
  // logits are within 1e-3 (its logits along its continuation, teacher-forced): the GPU sums
  // in f32 and may take the other one there, and every id after it may then differ.
  const std::vector<int32_t> cpu_ids(reference_.begin() + n_logits, reference_.end());
  std::vector<int32_t> forced = kDialTestPrompt;
  forced.insert(forced.end(), cpu_ids.begin(), cpu_ids.end() - 1);
  std::vector<float> along(forced.size() * static_cast<size_t>(V));
  {
    auto e = Engine::open(cpu());
    ASSERT_TRUE(e.is_ok()) << e.status().message();
    ASSERT_TRUE(evaluate((*e)->model(), forced, 5, along.data()).is_ok());
  }
  size_t robust = 0;
  for (; robust < cpu_ids.size(); ++robust) {
    const float* l = along.data() + (kDialTestPrompt.size() - 1 + robust) * V;
    std::vector<float> top(l, l + V);
    std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<>());
    ASSERT_EQ(std::max_element(l, l + V) - l, cpu_ids[robust]) << "the CPU is not its own greedy";
    if (top[0] - top[1] <= 1e-3f) break;
  }
  if (robust < cpu_ids.size())
    std::printf("[ note ] greedy ids compared up to step %zu of %zu (a near tie after it)\n",
                robust, cpu_ids.size());
  EXPECT_TRUE(std::equal(outs[0].begin() + n_logits, outs[0].begin() + n_logits + robust,
                         reference_.begin() + n_logits))
      << "greedy ids differ from the CPU's before any near tie";
  for (size_t t = 0; t < kDialTestPrompt.size(); ++t) {
    const float* want = reference_.data() + t * V;
    std::vector<float> sorted(want, want + V);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    if (sorted[0] - sorted[1] <= 1e-3f) continue;
    const int64_t cpu_argmax = std::max_element(want, want + V) - want;
    for (const float* got : {outs[0].data() + t * V, cublas_pass.data() + t * V})
      EXPECT_EQ(cpu_argmax, std::max_element(got, got + V) - got)
          << "teacher-forced argmax at position " << t
          << (got == cublas_pass.data() + t * V ? " (one pass, cuBLAS)" : " (chunks of 5)");
  }
}

}  // namespace
}  // namespace ktier::runtime
