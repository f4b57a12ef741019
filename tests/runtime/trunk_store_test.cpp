// The memory dial's trunk (runtime/trunk_store.h) on the tiny checkpoint: output bytes identical
// to the resident run across budgets from the minimum to everything pinned, pack or shards,
// io_uring or pread, 1 or 2 threads; the documented errors for a budget below the minimum, a
// corrupt pack record and a failing read.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/safetensors.h"
#include "format/safetensors_writer.h"
#include "io/fault_plan.h"
#include "io/read_file.h"
#include "pack/pack_writer.h"
#include "pack/trunk_pack.h"
#include "runtime/engine.h"
#include "runtime/engine_outputs.h"
#include "runtime/generator.h"
#include "synth/synth.h"
#include "tests/common/same_bytes.h"

namespace ktier::runtime {
namespace {

using test::same_bytes;

namespace fs = std::filesystem;

class TrunkStoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("ktier-trunk-store-" + std::to_string(::getpid()));
    ASSERT_NO_FATAL_FAILURE(synth_tiny(root_ / "ckpt"));
    auto ckpt = format::Checkpoint::open(root_ / "ckpt");
    ASSERT_TRUE(ckpt.is_ok());
    pack::PackOptions po;
    po.out_dir = root_ / "pack";
    ASSERT_TRUE(pack::write_trunk_pack(ckpt.value(), po).is_ok());
    prompt_ = kDialTestPrompt;
    vocab_ = static_cast<size_t>(ckpt.value().config().vocab_size);
    reference_ = logits({});
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static EngineOptions options() {
    EngineOptions eo;
    eo.model_dir = root_ / "ckpt";
    eo.threads = 2;
    return eo;
  }
  static Result<std::unique_ptr<Engine>> open(const EngineOptions& eo) { return Engine::open(eo); }
  // Teacher-forced logits over the prompt in chunks of 5 (so every layer is acquired 3 times),
  // then 6 greedy tokens, all logits concatenated.
  static std::vector<float> logits(const EngineOptions& eo_in, int threads = 2) {
    EngineOptions eo = eo_in;
    eo.model_dir = root_ / "ckpt";
    eo.threads = threads;
    return logits_then_greedy_ids(eo, prompt_);
  }
  // The smallest whole budget: the trunk's minimum, top-k expert slots, the lookahead routers.
  // With the pack (whose minimum adds the embedding rows' checksums), so that it serves runs
  // from either source.
  static uint64_t minimum() {
    auto ckpt = format::Checkpoint::open(root_ / "ckpt");
    EXPECT_TRUE(ckpt.is_ok());
    auto tp = pack::TrunkPack::open(root_ / "pack", ckpt.value());
    EXPECT_TRUE(tp.is_ok());
    const uint64_t with_pack =
        minimum_budget_bytes(ckpt.value(), &tp.value(), kDefaultLookahead);
    EXPECT_GE(with_pack, minimum_budget_bytes(ckpt.value(), nullptr, kDefaultLookahead));
    return with_pack;
  }

  // A copy of the pack named `name` with one byte of `record` (offset `at` inside it) xored with
  // `mask`: bytes a checksum must catch.
  static fs::path damaged_pack(const std::string& name, const pack::Record& (*pick)(const pack::TrunkPack&),
                               uint64_t at, char mask) {
    const fs::path bad = root_ / name;
    fs::remove_all(bad);
    fs::copy(root_ / "pack", bad);
    auto ckpt = format::Checkpoint::open(root_ / "ckpt");
    EXPECT_TRUE(ckpt.is_ok());
    auto tp = pack::TrunkPack::open(bad, ckpt.value());
    EXPECT_TRUE(tp.is_ok());
    flip_byte(bad / "trunk.pack", pick(tp.value()).offset + at, mask);
    return bad;
  }
  static void flip_byte(const fs::path& file, uint64_t pos, char mask) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(pos));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ mask);
    f.seekp(static_cast<std::streamoff>(pos));
    f.write(&c, 1);
    ASSERT_TRUE(f.good()) << file;
  }

  // The checkpoint and its shards, for a test that opens TrunkStores of its own.
  void open_inputs() {
    auto ckpt = format::Checkpoint::open(root_ / "ckpt");
    ASSERT_TRUE(ckpt.is_ok());
    ckpt_.emplace(std::move(*ckpt));
    ASSERT_NO_FATAL_FAILURE(open_shard_files(*ckpt_, shards_));
  }
  std::optional<format::Checkpoint> ckpt_;
  ShardFiles shards_;

  static inline fs::path root_;
  static inline std::vector<int32_t> prompt_;
  static inline std::vector<float> reference_;
  // The pack streamed at the minimum budget through the pread engine, with a fault plan to add
  // rules to.
  static EngineOptions faulty_streamed_pack() {
    EngineOptions eo = options();
    eo.pack_dir = root_ / "pack";
    eo.ram_budget = minimum();
    eo.io.backend = io::IoBackend::kPread;
    eo.io.fault_plan = std::make_shared<io::FaultPlan>();
    return eo;
  }
  // The teacher-forced logits at the front of reference_ (evaluate()'s output).
  static std::vector<float> reference_prefix(size_t n) {
    EXPECT_LE(n, reference_.size());
    return {reference_.begin(), reference_.begin() + static_cast<std::ptrdiff_t>(n)};
  }
  static inline size_t vocab_ = 0;
};

TEST_F(TrunkStoreTest, OutputIsIdenticalAcrossBudgetsSourcesEnginesAndThreads) {
  const uint64_t min = minimum();
  int streamed_runs = 0, small_tiers = 0;
  IoEngineTally engines;
  for (const uint64_t budget : {min, min + 150'000, min + 600'000, min + 1'500'000, uint64_t{1} << 30}) {
    for (const bool use_pack : {false, true}) {
      for (const io::IoBackend backend : {io::IoBackend::kAuto, io::IoBackend::kPread}) {
        EngineOptions eo = options();
        eo.ram_budget = budget;
        if (use_pack) eo.pack_dir = root_ / "pack";
        eo.io.backend = backend;
        auto e = open(eo);
        ASSERT_TRUE(e.is_ok()) << e.status().message();
        streamed_runs += e.value()->trunk_store()->stats().layers_streamed > 0;
        small_tiers += e.value()->expert_cache()->stats().slots < 8;  // < one layer's experts
        engines.count(backend, **e);
        EXPECT_TRUE(same_bytes(logits(eo, budget == min ? 1 : 2), reference_))
            << "budget " << budget << (use_pack ? " pack" : " shards")
            << (backend == io::IoBackend::kPread ? " pread" : " auto");
      }
    }
  }
  EXPECT_GE(streamed_runs, 12) << "the budgets must force streaming";
  EXPECT_GE(small_tiers, 4) << "the smallest budgets must force expert evictions";
  engines.check(options().io);
}

// How the bytes are read never changes them: O_DIRECT or buffered, one read in flight or
// many, requests split into small chunks (8 KiB: every record and expert in pieces, bounced
// where unaligned) or not, for the pack and the shards at the minimum budget, where every layer
// and most experts stream.
TEST_F(TrunkStoreTest, OutputIsIdenticalAcrossDirectIoQueueDepthsAndChunkSizes) {
  int direct_runs = 0;
  for (const io::DirectMode direct : {io::DirectMode::kDirect, io::DirectMode::kBuffered}) {
    for (const uint32_t depth : {1u, 3u, 32u}) {
      for (const uint64_t chunk : {uint64_t{8} << 10, uint64_t{4} << 20}) {
        for (const bool use_pack : {false, true}) {
          EngineOptions eo = options();
          eo.ram_budget = minimum();
          if (use_pack) eo.pack_dir = root_ / "pack";
          eo.io.direct = direct;
          eo.io.queue_depth = depth;
          eo.io.max_chunk_bytes = chunk;
          auto e = open(eo);
          if (!e.is_ok() && direct == io::DirectMode::kDirect) {  // a filesystem without it
            std::printf("[ note ] O_DIRECT refused here: %s\n", e.status().message().c_str());
            continue;
          }
          ASSERT_TRUE(e.is_ok()) << e.status().message();
          direct_runs += direct == io::DirectMode::kDirect;
          EXPECT_TRUE(same_bytes(logits(eo), reference_))
              << (direct == io::DirectMode::kDirect ? "direct" : "buffered") << ", depth "
              << depth << ", chunks of " << chunk << (use_pack ? ", pack" : ", shards");
        }
      }
    }
  }
  std::printf("[ note ] %d of 12 O_DIRECT runs compared\n", direct_runs);
  // Where the test's folder takes O_DIRECT (a probe of the pack file), every direct run ran:
  // a skip is only for a filesystem without it.
  if (io::ReadFile::open(root_ / "pack" / pack::kPackFileName, io::DirectMode::kDirect).is_ok()) {
    EXPECT_EQ(direct_runs, 12);
  }
}

// `streamed_extra` (what the caller must hold for the layers that stream: the dial's router
// bank) is counted while choosing how many layers to pin: the pinned records plus the extra for
// the rest fit the budget, and pinning one more would not.
TEST_F(TrunkStoreTest, StreamedExtraLeavesRoomForWhatTheStreamedLayersNeed) {
  ASSERT_NO_FATAL_FAILURE(open_inputs());
  const format::Checkpoint& ckpt = *ckpt_;
  ShardFiles& shards = shards_;
  const int64_t L = ckpt.config().num_hidden_layers;
  auto open_with = [&](uint64_t budget, uint64_t per_streamed) {
    TrunkStoreOptions so;
    so.budget_bytes = budget;
    if (per_streamed)
      so.streamed_extra = [=](int64_t first) { return static_cast<uint64_t>(L - first) * per_streamed; };
    return TrunkStore::open(ckpt, nullptr, *shards.engine, shards.files, so);
  };
  auto all = open_with(UINT64_MAX, 0);
  ASSERT_TRUE(all.is_ok()) << all.status().message();
  ASSERT_EQ((*all)->stats().layers_pinned, L);
  const uint64_t everything = (*all)->stats().bytes_allocated;
  // A budget that pins all but about two layers without the extra.
  auto some = open_with(everything - everything / L, 0);
  ASSERT_TRUE(some.is_ok()) << some.status().message();
  const int64_t plain = (*some)->stats().layers_pinned;
  ASSERT_GT(plain, 1);
  ASSERT_LT(plain, L);
  const uint64_t budget = everything - everything / L;
  const uint64_t per = everything / L / 2;  // half an average layer per streamed layer
  auto with = open_with(budget, per);
  ASSERT_TRUE(with.is_ok()) << with.status().message();
  const int64_t pinned = (*with)->stats().layers_pinned;
  EXPECT_LE(pinned, plain);
  EXPECT_LE((*with)->stats().bytes_allocated + static_cast<uint64_t>(L - pinned) * per, budget);
  EXPECT_LT(pinned, plain) << "the extra must cost at least one pinned layer here";
  // Everything pinned needs no extra: a budget of exactly the whole trunk pins it all.
  auto exact = open_with(everything, per);
  ASSERT_TRUE(exact.is_ok());
  EXPECT_EQ((*exact)->stats().layers_pinned, L);
}

// max_pinned (GPU mode: only the layers the device streams): a budget that holds every layer
// without a ring pins at most that many, and the ring the others then need fits the budget too.
TEST_F(TrunkStoreTest, MaxPinnedKeepsTheRingWithinTheBudget) {
  ASSERT_NO_FATAL_FAILURE(open_inputs());
  const format::Checkpoint& ckpt = *ckpt_;
  ShardFiles& shards = shards_;
  const int64_t L = ckpt.config().num_hidden_layers;
  TrunkStoreOptions so;
  auto all = TrunkStore::open(ckpt, nullptr, *shards.engine, shards.files, so);
  ASSERT_TRUE(all.is_ok());
  const uint64_t everything = (*all)->stats().bytes_allocated;
  so.pin_last = true;
  for (const int64_t cap : {int64_t{0}, L - 3, L - 1, L}) {
    so.budget_bytes = everything;
    so.max_pinned = cap;
    auto s = TrunkStore::open(ckpt, nullptr, *shards.engine, shards.files, so);
    ASSERT_TRUE(s.is_ok()) << s.status().message();
    EXPECT_LE((*s)->stats().layers_pinned, cap);
    EXPECT_LE((*s)->stats().bytes_allocated, everything) << "max_pinned " << cap;
    EXPECT_EQ((*s)->first_pinned(), L - (*s)->stats().layers_pinned);
  }
  so.max_pinned = L - 1;  // the ring costs two layers: the budget then pins fewer than L - 1
  auto capped = TrunkStore::open(ckpt, nullptr, *shards.engine, shards.files, so);
  ASSERT_TRUE(capped.is_ok());
  EXPECT_LT((*capped)->stats().layers_pinned, L - 1);
}

// release_ring (GPU mode, after the device's mirror): the ring is freed only when the store pins
// every layer from the given one on, after its read-ahead lands; bytes_allocated shrinks by
// exactly the ring (and a compressed pack's staging), and the pinned layers still bind the same
// bytes without a read. release_head frees the head record, as planned, once.
TEST_F(TrunkStoreTest, ReleaseRingFreesItOnlyWhenNothingStreamsFromThere) {
  ASSERT_NO_FATAL_FAILURE(open_inputs());
  const format::Checkpoint& ckpt = *ckpt_;
  ShardFiles& shards = shards_;
  const int64_t L = ckpt.config().num_hidden_layers;
  pack::PackOptions po;
  po.out_dir = root_ / "release-z";
  po.block_size = 8192;
  ASSERT_TRUE(pack::write_trunk_pack(ckpt, po).is_ok());
  auto plain = pack::TrunkPack::open(root_ / "pack", ckpt);
  auto packed_z = pack::TrunkPack::open(root_ / "release-z", ckpt);
  ASSERT_TRUE(plain.is_ok() && packed_z.is_ok());
  ASSERT_TRUE(packed_z->compressed());
  for (const pack::TrunkPack* source : {static_cast<const pack::TrunkPack*>(nullptr),
                                        static_cast<const pack::TrunkPack*>(&*plain),
                                        static_cast<const pack::TrunkPack*>(&*packed_z)}) {
    SCOPED_TRACE(!source ? "shards" : source->compressed() ? "compressed pack" : "pack");
    TrunkStoreOptions so;
    so.pin_last = true;
    so.max_pinned = L - 3;
    auto store = TrunkStore::open(ckpt, source, *shards.engine, shards.files, so);
    ASSERT_TRUE(store.is_ok()) << store.status().message();
    TrunkStore& st = **store;
    const int64_t first = st.first_pinned();
    ASSERT_EQ(first, 3);
    // Layer 0 acquired and given back: the read-ahead of the next layers is under way.
    auto w0 = st.acquire_layer(0);
    ASSERT_TRUE(w0.is_ok()) << w0.status().message();
    st.release_layer(0);
    const TrunkStoreStats before = st.stats();
    EXPECT_EQ(st.release_ring(first - 1), 0u) << "layer " << first - 1 << " streams";
    EXPECT_EQ(st.ring_layers().size(), 2u);
    uint64_t ring = 0;
    for (const std::span<uint8_t> b : st.layer_buffers(L)) ring += b.size();
    ring += before.staging_bytes;
    EXPECT_EQ(st.release_ring(first), ring);
    EXPECT_TRUE(st.ring_layers().empty());
    EXPECT_EQ(st.stats().bytes_allocated, before.bytes_allocated - ring);
    EXPECT_EQ(st.stats().staging_bytes, 0u);
    EXPECT_EQ(st.release_ring(first), 0u) << "nothing left to free";
    auto planned = TrunkStore::plan(ckpt, source, so, 1);
    ASSERT_TRUE(planned.is_ok());
    ASSERT_GT(planned->head_bytes, 0u);
    const uint64_t held = st.stats().bytes_allocated;
    EXPECT_EQ(st.release_head(), planned->head_bytes);
    EXPECT_EQ(st.stats().bytes_allocated, held - planned->head_bytes);
    EXPECT_EQ(st.release_head(), 0u) << "released before";
    const uint64_t read = st.stats().streamed_bytes_read;
    for (int64_t l = first; l < L; ++l) {
      auto w = st.acquire_layer(l);
      ASSERT_TRUE(w.is_ok()) << w.status().message();
      EXPECT_EQ(*w, st.pinned_layer(l));
      st.release_layer(l);
    }
    EXPECT_EQ(st.stats().streamed_bytes_read, read);
  }
}

// Records read from the shards sit congruent to the shards' file offsets (shard_layout), so
// that under O_DIRECT only each tensor's unaligned head and tail block go through a bounce
// buffer and the rest lands in place (the pack's 64-byte placement bounced every byte): with
// every layer pinned, open() reads each record once, and the bytes bounced are exactly those.
TEST_F(TrunkStoreTest, ShardRecordsBounceOnlyTheUnalignedEndsOfTensors) {
  ASSERT_NO_FATAL_FAILURE(open_inputs());
  const format::Checkpoint& ckpt = *ckpt_;
  ShardFiles& shards = shards_;
  if (!shards.files.at(0).direct()) GTEST_SKIP() << "no O_DIRECT on this filesystem: nothing bounces";
  const uint64_t align = shards.files.at(0).alignment();
  const pack::PackLayout layout = TrunkStore::shard_layout(ckpt);
  const int64_t L = ckpt.config().num_hidden_layers;
  uint64_t ends = 0, payload = 0;  // over the layer records and the head
  for (int64_t r = 0; r <= L; ++r)
    for (const format::TensorRef& t : layout.sources[static_cast<size_t>(r)]) {
      uint64_t at = t.info->file_offset;
      const uint64_t end = at + t.info->nbytes;
      if (at % align != 0) {  // the head block, up to the next boundary
        const uint64_t head = std::min(end, at - at % align + align) - at;
        ends += head;
        at += head;
      }
      ends += (end - at) % align;  // the tail after the aligned middle
      payload += t.info->nbytes;
    }
  TrunkStoreOptions so;  // every layer pinned: each record read once, at open
  auto store = TrunkStore::open(ckpt, nullptr, *shards.engine, shards.files, so);
  ASSERT_TRUE(store.is_ok()) << store.status().message();
  ASSERT_EQ((*store)->stats().layers_pinned, L);
  const io::IoCounters k = shards.engine->counters();
  EXPECT_EQ(k.bytes_delivered, payload);
  EXPECT_EQ(k.bounced_bytes, ends);
  EXPECT_LT(ends, payload);
}

// GPU mode places the trunk from the checkpoint's shapes (model::shapes_in, read before any
// layer) and then mirrors the layers a host source binds: every tensor a host binds, from shards
// or from a pack, has the type and shape the checkpoint's shapes give it, and binding from
// shapes reads nothing (null matrix data, zero vectors).
TEST_F(TrunkStoreTest, CheckpointShapesDescribeWhatEveryHostSourceBinds) {
  ASSERT_NO_FATAL_FAILURE(open_inputs());
  const format::Checkpoint& ckpt = *ckpt_;
  ShardFiles& shards = shards_;
  auto pack = pack::TrunkPack::open(root_ / "pack", ckpt);
  ASSERT_TRUE(pack.is_ok()) << pack.status().message();
  auto resident = model::ModelWeights::load(ckpt);
  ASSERT_TRUE(resident.is_ok());
  struct Tensor {
    cpu::WeightType type;
    int64_t rows, cols;
    bool operator==(const Tensor&) const = default;
  };
  // (type, rows, cols) of every matrix, then (f32, size, 1) of every vector, in visiting order;
  // `bytes` says whether the data is there (shapes: null matrices, zero vectors).
  auto describe = [](model::LayerWeights w, bool bytes) {
    std::vector<Tensor> out;
    model::for_each_tensor(
        w,
        [&](cpu::WeightMatrix& m) {
          EXPECT_EQ(m.data != nullptr, bytes);
          out.push_back({m.type, m.rows, m.cols});
        },
        [&](model::F32Vec& v) {
          if (!bytes) {
            EXPECT_TRUE(std::all_of(v.data(), v.data() + v.size(), [](float x) { return x == 0; }));
          }
          out.push_back({cpu::WeightType::kF32, static_cast<int64_t>(v.size()), 1});
        });
    return out;
  };
  const format::ModelConfig& c = ckpt.config();
  const model::TensorLookup shapes = model::shapes_in(ckpt);
  auto bound_by = [&](model::TrunkSource& host, int64_t l) {
    auto w = host.acquire_layer(l);
    EXPECT_TRUE(w.is_ok());
    std::vector<Tensor> out = w.is_ok() ? describe(**w, true) : std::vector<Tensor>{};
    if (w.is_ok()) host.release_layer(l);
    return out;
  };
  for (const pack::TrunkPack* source : {static_cast<const pack::TrunkPack*>(nullptr),
                                        static_cast<const pack::TrunkPack*>(&*pack)}) {
    SCOPED_TRACE(source ? "pack" : "shards");
    TrunkStoreOptions so;
    so.budget_bytes = TrunkStore::minimum_bytes(ckpt, source);
    auto store = TrunkStore::open(ckpt, source, *shards.engine, shards.files, so);
    ASSERT_TRUE(store.is_ok()) << store.status().message();
    ASSERT_EQ((*store)->stats().layers_pinned, 0);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      auto planned = model::bind_layer(c, l, shapes);
      ASSERT_TRUE(planned.is_ok());
      const std::vector<Tensor> want = describe(*planned, false);
      EXPECT_GT(want.size(), 5u);
      EXPECT_TRUE(bound_by(**store, l) == want) << "layer " << l;
      EXPECT_TRUE(bound_by(**resident, l) == want) << "layer " << l;
    }
  }
}

TEST_F(TrunkStoreTest, BudgetBelowTheMinimumIsRefusedWithExitFour) {
  EngineOptions eo = options();
  eo.pack_dir = root_ / "pack";
  eo.lookahead = kDefaultLookahead;  // as given: automatic lookahead would turn itself off
  eo.ram_budget = minimum() - 1;
  auto e = open(eo);
  ASSERT_EQ(e.status().exit_code(), 4);
  EXPECT_NE(e.status().message().find("minimum"), std::string::npos) << e.status().message();
}

TEST_F(TrunkStoreTest, CorruptStreamedRecordFailsTheForwardWithExitThree) {
  const fs::path bad = damaged_pack(
      "pack-bad", [](const pack::TrunkPack& p) -> const pack::Record& { return p.layer_record(7); },
      100, 0x10);
  EngineOptions eo = options();
  eo.pack_dir = bad;
  eo.ram_budget = minimum();  // every layer streams: layer 7 is read during the forward
  auto e = open(eo);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  std::vector<float> out(prompt_.size() * vocab_);
  const Status s = evaluate(e.value()->model(), prompt_, 12, out.data());
  EXPECT_EQ(s.exit_code(), 3) << s.message();
  EXPECT_NE(s.message().find("layer.7"), std::string::npos) << s.message();
  // Pinned: the same record fails at open.
  eo.ram_budget.reset();
  const Status at_open = open(eo).status();
  EXPECT_EQ(at_open.exit_code(), 3);
  EXPECT_NE(at_open.message().find("layer.7"), std::string::npos) << at_open.message();
}

// Embedding rows are read one at a time; the embed record is verified whole at open instead.
TEST_F(TrunkStoreTest, CorruptEmbedRecordIsRefusedAtOpen) {
  const fs::path bad = damaged_pack(
      "pack-bad-embed", [](const pack::TrunkPack& p) -> const pack::Record& { return p.embed_record(); },
      12345, 0x01);
  EngineOptions eo = options();
  eo.pack_dir = bad;
  eo.ram_budget = minimum();
  const auto e = open(eo);
  ASSERT_EQ(e.status().exit_code(), 3);
  EXPECT_NE(e.status().message().find("'embed'"), std::string::npos) << e.status().message();
}

// A pack changed after open: each row read is checked against its checksum, taken at open from
// the bytes the record's checksum passed, so a changed row is refused, not computed from.
TEST_F(TrunkStoreTest, EmbedRowChangedAfterOpenFailsTheForwardWithExitThree) {
  const fs::path copy = damaged_pack(
      "pack-embed-later", [](const pack::TrunkPack& p) -> const pack::Record& { return p.embed_record(); },
      0, 0);  // an intact copy
  EngineOptions eo = options();
  eo.pack_dir = copy;
  eo.ram_budget = minimum();
  auto e = open(eo);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  std::vector<float> out(prompt_.size() * vocab_);
  ASSERT_TRUE(evaluate(e.value()->model(), prompt_, 12, out.data()).is_ok());
  auto tp = pack::TrunkPack::open(copy, e.value()->checkpoint());
  ASSERT_TRUE(tp.is_ok());
  const pack::Record& r = tp.value().embed_record();
  const uint64_t row_bytes = r.tensors.at(0).nbytes / vocab_;
  const int32_t id = prompt_.at(3);
  ASSERT_NO_FATAL_FAILURE(flip_byte(copy / "trunk.pack",
                                    r.offset + r.tensors.at(0).offset + id * row_bytes + 7, 0x04));
  const Status s = evaluate(e.value()->model(), prompt_, 12, out.data());
  EXPECT_EQ(s.exit_code(), 3) << s.message();
  EXPECT_NE(s.message().find("'embed' row " + std::to_string(id) + " no longer matches"),
            std::string::npos)
      << s.message();
}

// A streamed layer's read that fails for good (the I/O engine's own retry fails too: two
// failed attempts) is read once more when the layer is needed: the forward pass goes on with
// the same bytes.
TEST_F(TrunkStoreTest, OneFailedLayerReadIsReadAgain) {
  EngineOptions eo = faulty_streamed_pack();
  auto e = open(eo);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  ASSERT_GT(e.value()->trunk_store()->stats().layers_streamed, 0);
  auto ckpt = format::Checkpoint::open(root_ / "ckpt");
  ASSERT_TRUE(ckpt.is_ok());
  auto tp = pack::TrunkPack::open(root_ / "pack", ckpt.value());
  ASSERT_TRUE(tp.is_ok());
  const pack::Record& r = tp.value().layer_record(7);  // streamed: read during the forward
  const size_t rule = eo.io.fault_plan->add(
      io::FaultRule::eio(r.offset, r.offset + r.size).in_path("trunk.pack").times(2));
  std::vector<float> out(prompt_.size() * vocab_);
  const Status s = evaluate(e.value()->model(), prompt_, 12, out.data());
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_EQ(eo.io.fault_plan->fires(rule), 2u);
  EXPECT_TRUE(same_bytes(out, reference_prefix(out.size())));
}

// A forward pass over the streamed pack and the expert tier that runs out of memory
// (std::bad_alloc at one allocation on the calling thread, as `serve` catches it and goes on
// with the same engine) leaves the engine whole: the next pass gives the reference's bytes.
// Every 8th allocation of a 3-token pass from a fresh offset (each run tries others; all of
// them take ~40 s): a lease released while the exception unwinds once ended the process, its
// read ahead throwing inside a destructor.
TEST_F(TrunkStoreTest, AForwardThatRunsOutOfMemoryLeavesTheEngineWhole) {
  EngineOptions eo = faulty_streamed_pack();
  auto e = open(eo);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  ASSERT_GT(e.value()->trunk_store()->stats().layers_streamed, 0);
  expect_forward_out_of_memory_leaves_engine_whole(
      "TrunkStoreTest.AForwardThatRunsOutOfMemoryLeavesTheEngineWhole", 8, *e.value(), prompt_,
      &reference_);
}

// A pass abandoned between two layers (Ctrl-C in a run that saves nothing) over the streamed
// pack and the expert tier leaves the engine sound, whichever layer of which chunk or token it
// stopped after: every 5th boundary of 5 passes, each of the tiny model's 12 once.
TEST_F(TrunkStoreTest, APassAbandonedBetweenLayersLeavesTheEngineWhole) {
  auto e = open(faulty_streamed_pack());
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  ASSERT_GT(e.value()->trunk_store()->stats().layers_streamed, 0);
  expect_abandoned_passes_leave_engine_whole(*e.value(), prompt_, reference_, 5);
}

// After a pass that stopped partway (abandoned, or failed), the ring reads ahead again from the
// next pass's first layer: while each streamed layer computes, the next one is in a slot (read
// or being read). Before, the slots left holding the stopped pass's next layers were skipped by
// the read-ahead until the forward reached those layers, so the ring read one layer ahead, each
// read waited for the layer before it to be released, and no read overlapped compute.
TEST_F(TrunkStoreTest, AStoppedPassLeavesTheRingReadingAhead) {
  auto e = open(faulty_streamed_pack());
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  const TrunkStore& store = *e.value()->trunk_store();
  const int64_t L = e.value()->checkpoint().config().num_hidden_layers;
  ASSERT_GE(store.ring_layers().size(), 2u);
  ASSERT_GE(store.stats().layers_streamed, 4);
  struct RingProbe final : model::LayerObserver {
    const TrunkStore& store;
    int64_t layers;
    std::vector<int64_t> without_read_ahead;  // streamed layers whose successor was in no slot
    RingProbe(const TrunkStore& s, int64_t l) : store(s), layers(l) {}
    void after_layer(int64_t layer, const float*, int64_t, int64_t) override {
      if (store.is_pinned(layer)) return;
      int64_t next = layer + 1;
      while (next < layers && store.is_pinned(next)) ++next;
      if (next == layers) return;  // the pass's last streamed layer
      const std::vector<int64_t> ring = store.ring_layers();
      if (std::find(ring.begin(), ring.end(), next) == ring.end())
        without_read_ahead.push_back(layer);
    }
  } probe(store, L);
  const int64_t boundaries = L - 1;
  for (const int64_t stop_after : {int64_t{1}, boundaries / 2, boundaries}) {
    SCOPED_TRACE("a pass stopped after boundary " + std::to_string(stop_after));
    GenerationOptions g;
    g.prefill_chunk = 12;
    g.max_new_tokens = 1;
    g.reserve_positions = static_cast<int64_t>(prompt_.size());
    int64_t asked = 0;
    g.abandon_requested = [&] { return ++asked == stop_after; };
    auto session = GenerationSession::open(e.value()->model(), e.value()->experts(), g);
    ASSERT_TRUE(session.is_ok()) << session.status().message();
    auto turn = (*session)->turn(prompt_, [](int32_t) { return Status::ok(); });
    ASSERT_TRUE(turn.is_ok()) << turn.status().message();
    ASSERT_TRUE((*session)->abandoned());
    session->reset();
    probe.without_read_ahead.clear();
    e.value()->model().set_layer_observer(&probe);
    std::vector<float> out(prompt_.size() * vocab_);
    const Status st = evaluate(e.value()->model(), prompt_, 12, out.data());
    e.value()->model().set_layer_observer(nullptr);
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_TRUE(same_bytes(out, reference_prefix(out.size())));
    EXPECT_TRUE(probe.without_read_ahead.empty())
        << probe.without_read_ahead.size() << " layers computed with no read ahead, the first "
        << probe.without_read_ahead.front();
  }
}

TEST_F(TrunkStoreTest, FailingReadsFailWithExitOneNamingTheFile) {
  EngineOptions eo = faulty_streamed_pack();
  auto e = open(eo);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  eo.io.fault_plan->add(io::FaultRule::eio().in_path("trunk.pack").times(-1));  // every read
  std::vector<float> out(prompt_.size() * vocab_);
  const Status s = evaluate(e.value()->model(), prompt_, 12, out.data());
  EXPECT_EQ(s.exit_code(), 1) << s.message();
  EXPECT_NE(s.message().find("trunk.pack"), std::string::npos) << s.message();
  // The disk heals: the store recovers, a new sequence on the same engine gives the reference
  // bytes (reads ahead that failed meanwhile are read again when their layer is needed).
  eo.io.fault_plan->clear();
  const Status again = evaluate(e.value()->model(), prompt_, 12, out.data());
  ASSERT_TRUE(again.is_ok()) << again.message();
  EXPECT_TRUE(same_bytes(out, reference_prefix(out.size())));
}

TEST_F(TrunkStoreTest, FailingExpertReadFailsTheForwardWithExitOne) {
  EngineOptions eo = options();
  eo.pack_dir = root_ / "pack";  // the trunk comes from the pack: shard reads are expert reads
  eo.ram_budget = minimum();
  eo.io.backend = io::IoBackend::kPread;
  eo.io.fault_plan = std::make_shared<io::FaultPlan>();
  auto e = open(eo);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  // Shard 6 holds decoder layer 5 and its experts (one shard per layer).
  eo.io.fault_plan->add(io::FaultRule::eio().in_path("model-00006-of").times(-1));
  std::vector<float> out(prompt_.size() * vocab_);
  const Status s = evaluate(e.value()->model(), prompt_, 12, out.data());
  EXPECT_EQ(s.exit_code(), 1) << s.message();
  EXPECT_NE(s.message().find("model-00006-of"), std::string::npos) << s.message();
}

// A tiny synth checkpoint changed by `adjust`, in a fresh temporary folder named after `what`.
fs::path synth_tiny_variant(const std::string& what,
                            const std::function<void(synth::SynthOptions&)>& adjust) {
  const fs::path dir =
      fs::temp_directory_path() / ("ktier-trunk-" + what + "-" + std::to_string(::getpid()));
  synth::SynthOptions o;
  o.out_dir = dir;
  o.threads = 1;
  o.force = true;
  adjust(o);
  EXPECT_TRUE(synth::run_synth(o).is_ok());
  return dir;
}

// A two-layer model, synthesized once for the suite: the ring (two slots of the larger layer)
// outweighs both layers pinned.
class TrunkPlan : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = synth_tiny_variant("two-layers",
                              [](synth::SynthOptions& o) { o.overrides.layers = 2; });
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  void SetUp() override {
    auto opened = format::Checkpoint::open(dir_, format::OpenMode::kPread);
    ASSERT_TRUE(opened.is_ok()) << opened.status().message();
    ckpt.emplace(std::move(*opened));
  }
  static inline fs::path dir_;
  std::optional<format::Checkpoint> ckpt;
};

// Whatever the budget and however many layers the store may pin (GPU mode: those the device
// streams), a plan that opens holds at most its budget. On two layers, which together are
// smaller than two ring slots of the larger: a store that may not pin both still needs the ring,
// and its minimum says so (it once said the two layers' size, and then held the ring beyond it);
// the refusal names the parts of the minimum it states (once it always named the ring).
TEST_F(TrunkPlan, HoldsAtMostItsBudgetWhateverMaxPinned) {
  const uint64_t least = TrunkStore::minimum_bytes(*ckpt, nullptr);
  auto all = TrunkStore::plan(*ckpt, nullptr, {}, 1);
  ASSERT_TRUE(all.is_ok());
  const std::vector<uint64_t>& layers = all->layer_read_bytes;
  ASSERT_EQ(layers.size(), 2u);
  int opened = 0, refused = 0;
  for (const int64_t max_pinned : {-1, 0, 1, 2}) {
    for (uint64_t budget = least - 4096; budget < all->bytes_held + (256u << 10);
         budget += 4096) {
      TrunkStoreOptions so;
      so.budget_bytes = budget;
      so.max_pinned = max_pinned;
      so.pin_last = max_pinned >= 0;
      const auto p = TrunkStore::plan(*ckpt, nullptr, so, 1);
      SCOPED_TRACE("max_pinned " + std::to_string(max_pinned) + ", budget " +
                   std::to_string(budget));
      if (!p.is_ok()) {
        EXPECT_EQ(p.status().exit_code(), 4) << p.status().message();
        const bool every_layer = max_pinned < 0 || max_pinned == 2;
        EXPECT_NE(p.status().message().find(every_layer ? "all 2 layers pinned" : "2 ring slots"),
                  std::string::npos)
            << p.status().message();
        ++refused;
        continue;
      }
      ++opened;
      EXPECT_LE(p->bytes_held, budget);
      EXPECT_LE(p->minimum_bytes, budget);
      if (max_pinned >= 0 && max_pinned < 2) {
        EXPECT_EQ(p->ring_slots, 2);
      }
    }
  }
  EXPECT_GT(opened, 0);
  EXPECT_GT(refused, 0);
}

// GPU mode's host pins at most the layers the device streams, and with fewer than all of them it
// needs the ring: the dial's stated minimum is the trunk store's with that limit, so the minimum
// plans and one byte less is refused by the dial (naming its parts), not by the store.
TEST_F(TrunkPlan, DialMinimumIsExactWhenTheDeviceHoldsALayer) {
  EngineOptions eo;
  eo.model_dir = dir_;
  eo.emulate_device = true;
  eo.lookahead = 0;
  DevicePlan device;  // plan_dial reads the layers it holds
  device.trunk.resident_layers = 1;
  const auto at = [&](uint64_t budget) {
    return plan_dial(*ckpt, nullptr, eo, budget, 1, &device);
  };
  auto all = at(UINT64_MAX);
  ASSERT_TRUE(all.is_ok()) << all.status().message();
  const uint64_t min = all->minimum.total();
  // The case studied: every layer pinned would take less than the ring.
  ASSERT_GT(min, dial_minimum(*ckpt, nullptr, 0, 1, false, nullptr).total());
  auto least = at(min);
  ASSERT_TRUE(least.is_ok()) << least.status().message();
  EXPECT_LE(least->held(), min);
  EXPECT_EQ(least->trunk.ring_slots, 2);
  auto below = at(min - 1);
  ASSERT_FALSE(below.is_ok());
  EXPECT_EQ(below.status().exit_code(), 4);
  EXPECT_NE(below.status().message().find(std::to_string(min) + " bytes (trunk "),
            std::string::npos)
      << below.status().message();
  EXPECT_EQ(below.status().message().find("trunk budget"), std::string::npos)
      << below.status().message();
}

// The same edge through plan_engine with automatic lookahead: the budget is weighed against the
// host's minimum with the layers the device leaves it (here none: the device holds both), so one
// byte below the minimum with lookahead it is turned off (and the device planned again without
// it), not refused.
TEST_F(TrunkPlan, AutomaticLookaheadWeighsTheLayersTheDeviceLeavesTheHost) {
  const int64_t L = ckpt->config().num_hidden_layers;
  EngineOptions eo;
  eo.model_dir = dir_;
  eo.emulate_device = true;
  eo.vram_budget = uint64_t{64} << 20;
  auto all = plan_engine(*ckpt, nullptr, eo, 1, nullptr);
  ASSERT_TRUE(all.is_ok()) << all.status().message();
  ASSERT_EQ(all->device->trunk.resident_layers, L);
  const auto minimum = [&](int depth, int64_t max_pinned) {
    return dial_minimum(*ckpt, nullptr, depth, 1, false, nullptr, max_pinned).total();
  };
  const uint64_t with = minimum(kDefaultLookahead, 0);
  ASSERT_GT(with, minimum(kDefaultLookahead, -1)) << "the ring outweighs both layers";
  ASSERT_LT(minimum(0, 0), with);
  for (const uint64_t budget : {with - 1, with}) {
    eo.ram_budget = budget;
    auto p = plan_engine(*ckpt, nullptr, eo, 1, nullptr);
    ASSERT_TRUE(p.is_ok()) << budget << ": " << p.status().message();
    const bool on = budget >= with;
    EXPECT_EQ(p->lookahead, on ? kDefaultLookahead : 0) << budget;
    EXPECT_EQ(p->lookahead_lowered.empty(), on) << p->lookahead_lowered;
    ASSERT_TRUE(p->device && p->dial);
    EXPECT_EQ(p->device->tier_min_slots,
              VramExpertTier::minimum_slots(ckpt->config(), p->lookahead));
    EXPECT_LE(p->dial->held(), budget);
  }
}

// Automatic lookahead in GPU mode against the depths a user could give, over --vram from below
// the device's minimum (which holds both layers here) to well above it and the RAM budgets at
// (and one byte below) each host minimum: where --lookahead 1 plans, the automatic run gets
// depth 1; else where --lookahead 0 plans, depth 0; else it is refused too. So the budget
// automatic lookahead weighs is the one plan_dial applies with the device's layers.
TEST_F(TrunkPlan, AutomaticLookaheadPlansWhereverAGivenDepthDoes) {
  ASSERT_EQ(kDefaultLookahead, 1);
  std::vector<uint64_t> budgets;
  for (const int depth : {0, 1})
    for (const int64_t max_pinned : {-1, 0, 1, 2}) {
      const uint64_t m = dial_minimum(*ckpt, nullptr, depth, 1, false, nullptr, max_pinned).total();
      budgets.insert(budgets.end(), {m - 1, m});
    }
  std::sort(budgets.begin(), budgets.end());
  budgets.erase(std::unique(budgets.begin(), budgets.end()), budgets.end());
  EngineOptions eo;
  eo.model_dir = dir_;
  eo.emulate_device = true;
  int planned[3] = {0, 0, 0};  // refused, depth 0, depth 1
  int off_for_vram = 0;        // depth 0: --vram holds the device only without lookahead
  for (uint64_t vram = 5u << 19; vram < (3u << 20); vram += 8u << 10) {  // 2.5 to 3 MiB
    eo.vram_budget = vram;
    for (const uint64_t budget : budgets) {
      eo.ram_budget = budget;
      SCOPED_TRACE("--vram " + std::to_string(vram) + " --ram " + std::to_string(budget));
      const auto at = [&](std::optional<int> depth) {
        EngineOptions o = eo;
        o.lookahead = depth;
        return plan_engine(*ckpt, nullptr, o, 1, nullptr);
      };
      const auto one = at(1), zero = at(0), automatic = at(std::nullopt);
      const int expected = one.is_ok() ? 1 : zero.is_ok() ? 0 : -1;
      ++planned[expected + 1];
      ASSERT_EQ(automatic.is_ok(), expected >= 0) << automatic.status().message();
      if (expected < 0) continue;
      EXPECT_EQ(automatic->lookahead, expected);
      EXPECT_LE(automatic->dial->held(), budget);
      off_for_vram += automatic->lookahead_lowered.rfind("lookahead off: --vram", 0) == 0;
    }
  }
  EXPECT_GT(off_for_vram, 0);
  EXPECT_GT(planned[0], 0);
  EXPECT_GT(planned[1], 0);
  EXPECT_GT(planned[2], 0);
}

// A tiny synth checkpoint with F32 experts in a fresh temporary folder named after `what`.
fs::path synth_float_experts(const std::string& what) {
  return synth_tiny_variant(what, [](synth::SynthOptions& o) {
    o.experts = synth::ExpertFormat::kF32;
  });
}

// Logits of every position of `ids` on the checkpoint in `dir` under `budget` (none: resident);
// `streamed` gets the trunk layers streamed and `tier_slots` the expert tier's slots (0 when
// resident), so that a test sees the budget take effect.
std::vector<float> float_expert_logits(const fs::path& dir, const std::vector<int32_t>& ids,
                                       std::optional<uint64_t> budget, int64_t* streamed,
                                       int64_t* tier_slots) {
  EngineOptions eo;
  eo.model_dir = dir;
  eo.threads = 2;
  eo.ram_budget = budget;
  auto e = Engine::open(eo);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  if (!e.is_ok()) return {};
  const int64_t vocab = e.value()->checkpoint().config().vocab_size;
  std::vector<float> out(ids.size() * static_cast<size_t>(vocab));
  EXPECT_TRUE(evaluate(e.value()->model(), ids, 3, out.data()).is_ok());
  const TrunkStore* trunk = e.value()->trunk_store();
  *streamed = trunk ? trunk->stats().layers_streamed : 0;
  const ExpertCache* tier = e.value()->expert_cache();
  *tier_slots = tier ? tier->stats().policy_slots : 0;
  return out;
}

// Plain-float experts are never one contiguous run: the tier reads them part by part.
TEST(TrunkStoreFloat, FloatExpertsThroughASmallTierMatchTheResidentRun) {
  const fs::path dir = synth_float_experts("float");
  const std::vector<int32_t> ids = {5, 9, 300, 2, 77, 18, 64};
  auto ckpt = format::Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.is_ok());
  const uint64_t experts = static_cast<uint64_t>(ckpt.value().config().num_moe_layers() *
                                                 ckpt.value().config().num_experts);
  const auto run = [&](std::optional<uint64_t> budget, int64_t* streamed, int64_t* tier_slots) {
    return float_expert_logits(dir, ids, budget, streamed, tier_slots);
  };
  const uint64_t min = minimum_budget_bytes(ckpt.value(), nullptr, kDefaultLookahead);
  int64_t streamed = 0, tier_slots = 0, unused = 0;
  const std::vector<float> small = run(min, &streamed, &tier_slots);
  EXPECT_GT(streamed, 0) << "the minimum budget streams trunk layers";
  EXPECT_LT(static_cast<uint64_t>(tier_slots), experts) << "and holds few experts";
  EXPECT_TRUE(test::same_bytes(small, run(std::nullopt, &unused, &unused)));
  fs::remove_all(dir);
}

// Plain-float experts whose parts have different dtypes (w2 BF16, w1/w3 F32): the tier reads and
// views each part as its own dtype (it took one dtype for all three from a summary that is
// empty when they differ: undefined behaviour, BF16 bytes read as F32).
TEST(TrunkStoreFloat, MixedDtypeExpertsThroughASmallTierMatchTheResidentRun) {
  const fs::path dir = synth_float_experts("mixed");
  // Every shard rewritten with its experts' w2 as BF16 (the top half of each F32).
  int converted = 0;
  uint64_t saved = 0;  // bytes the index's metadata.total_size loses
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    std::vector<format::TensorDecl> decls;
    std::vector<std::vector<uint8_t>> data;
    {
      auto st = format::SafetensorsFile::open(entry.path(), format::OpenMode::kPread);
      ASSERT_TRUE(st.is_ok()) << st.status().message();
      for (const format::TensorInfo& t : st->tensors()) {
        std::vector<uint8_t> bytes(t.nbytes);
        ASSERT_TRUE(st->read(t, bytes.data()).is_ok());
        format::TensorDecl d{t.name, t.dtype, t.shape};
        if (t.name.find(".experts.") != std::string::npos &&
            t.name.size() > 10 && t.name.compare(t.name.size() - 10, 10, ".w2.weight") == 0) {
          ASSERT_EQ(t.dtype, DType::kF32);
          std::vector<uint8_t> half(bytes.size() / 2);
          for (size_t i = 0; i < half.size() / 2; ++i) {  // little-endian: bytes 2 and 3
            half[2 * i] = bytes[4 * i + 2];
            half[2 * i + 1] = bytes[4 * i + 3];
          }
          saved += bytes.size() - half.size();
          bytes = std::move(half);
          d.dtype = DType::kBF16;
          ++converted;
        }
        decls.push_back(d);
        data.push_back(std::move(bytes));
      }
    }
    const fs::path tmp = entry.path().string() + ".mixed";
    auto w = format::SafetensorsWriter::create(tmp, decls);
    ASSERT_TRUE(w.is_ok()) << w.status().message();
    for (const auto& bytes : data) ASSERT_TRUE(w->append(bytes.data(), bytes.size()).is_ok());
    ASSERT_TRUE(w->finish().is_ok());
    fs::rename(tmp, entry.path());
  }
  ASSERT_GT(converted, 0);
  {
    const fs::path index = dir / "model.safetensors.index.json";
    nlohmann::json j = nlohmann::json::parse(std::ifstream(index));
    j["metadata"]["total_size"] = j["metadata"]["total_size"].get<uint64_t>() - saved;
    std::ofstream(index) << j.dump(1);
  }
  auto ckpt = format::Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().message();
  ASSERT_FALSE(ckpt->expert_summary().plain_dtype.has_value()) << "the dtypes are mixed";
  const std::vector<int32_t> ids = {5, 9, 300, 2, 77, 18, 64};
  int64_t tier_slots = 0, unused = 0;
  const std::vector<float> small = float_expert_logits(
      dir, ids, minimum_budget_bytes(ckpt.value(), nullptr, kDefaultLookahead), &unused,
      &tier_slots);
  EXPECT_GT(tier_slots, 0) << "the experts go through the tier";
  const std::vector<float> resident = float_expert_logits(dir, ids, std::nullopt, &unused, &unused);
  ASSERT_EQ(small.size(), resident.size());
  EXPECT_TRUE(std::memcmp(small.data(), resident.data(), small.size() * sizeof(float)) == 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ktier::runtime
