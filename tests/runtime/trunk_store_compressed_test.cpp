// The trunk store on a compressed pack (issue 7; runtime/trunk_store.h, pack/block_codec.h), on
// the tiny checkpoint packed with small blocks so that every layer record has several: output
// bytes identical to the resident run across budgets, inflate threads and I/O engines; inflated
// bytes equal to the source tensors in the shards; the budget counting the staging and scratch
// buffers; a block with swapped planes or a flipped byte failing with exit 3 naming the block.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "io/fault_plan.h"
#include "pack/block_codec.h"
#include "pack/pack_writer.h"
#include "runtime/engine.h"
#include "runtime/engine_outputs.h"
#include "runtime/generator.h"
#include "synth/synth.h"
#include "tests/common/same_bytes.h"

namespace ktier::runtime {
namespace {

using test::same_bytes;

namespace fs = std::filesystem;
constexpr uint64_t kBlock = 8192;

class CompressedTrunkTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("ktier-trunk-z-" + std::to_string(::getpid()));
    ASSERT_NO_FATAL_FAILURE(synth_tiny(root_ / "ckpt"));
    auto ckpt = format::Checkpoint::open(root_ / "ckpt");
    ASSERT_TRUE(ckpt.is_ok());
    pack::PackOptions po;
    po.out_dir = root_ / "plain";
    ASSERT_TRUE(pack::write_trunk_pack(ckpt.value(), po).is_ok());
    po.out_dir = root_ / "z";
    po.block_size = kBlock;
    po.threads = 3;
    auto rep = pack::write_trunk_pack(ckpt.value(), po);
    ASSERT_TRUE(rep.is_ok()) << rep.status().message();
    ASSERT_GT(rep.value().blocks, 2 * rep.value().layers);
    prompt_ = kDialTestPrompt;
    reference_ = logits({}, 2);
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static std::vector<float> logits(const EngineOptions& eo_in, int threads) {
    EngineOptions eo = eo_in;
    eo.model_dir = root_ / "ckpt";
    eo.threads = threads;
    return logits_then_greedy_ids(eo, prompt_);
  }
  // The smallest whole budget with the pack in `dir` at `threads` inflate threads (default
  // lookahead: its routers included).
  static uint64_t minimum(const fs::path& dir, int threads) {
    auto ckpt = format::Checkpoint::open(root_ / "ckpt");
    EXPECT_TRUE(ckpt.is_ok());
    auto tp = pack::TrunkPack::open(dir, ckpt.value());
    EXPECT_TRUE(tp.is_ok());
    return minimum_budget_bytes(ckpt.value(), &tp.value(), kDefaultLookahead, threads);
  }
  // The compressed pack streamed at its minimum budget on 3 threads, read with pread.
  static EngineOptions streamed_at_the_minimum() {
    EngineOptions eo;
    eo.model_dir = root_ / "ckpt";
    eo.threads = 3;
    eo.pack_dir = root_ / "z";
    eo.ram_budget = minimum(root_ / "z", 3);
    eo.io.backend = io::IoBackend::kPread;
    return eo;
  }
  // A copy of the compressed pack with block `b` of layer `layer` changed by `mutate` (given the
  // block's stored bytes, in place).
  template <class F>
  static fs::path mutated(const std::string& name, int64_t layer, size_t b, F mutate) {
    const fs::path bad = root_ / name;
    fs::remove_all(bad);
    fs::copy(root_ / "z", bad);
    auto ckpt = format::Checkpoint::open(root_ / "ckpt");
    auto tp = pack::TrunkPack::open(bad, ckpt.value());
    EXPECT_TRUE(tp.is_ok());
    const pack::Block k = tp.value().layer_record(layer).blocks.at(b);
    std::fstream f(bad / "trunk.pack", std::ios::in | std::ios::out | std::ios::binary);
    std::vector<uint8_t> stored(k.length);
    f.seekg(static_cast<std::streamoff>(k.offset));
    f.read(reinterpret_cast<char*>(stored.data()), static_cast<std::streamsize>(k.length));
    mutate(stored);
    f.seekp(static_cast<std::streamoff>(k.offset));
    f.write(reinterpret_cast<const char*>(stored.data()), static_cast<std::streamsize>(k.length));
    return bad;
  }
  // evaluate()'s logits per token.
  static size_t vocab_of(const Engine& e) {
    return static_cast<size_t>(e.checkpoint().config().vocab_size);
  }
  static Status run_streamed(const fs::path& pack_dir) {
    EngineOptions eo;
    eo.model_dir = root_ / "ckpt";
    eo.threads = 2;
    eo.pack_dir = pack_dir;
    eo.ram_budget = minimum(pack_dir, 2);
    auto e = Engine::open(eo);
    if (!e.is_ok()) return e.status();
    std::vector<float> out(prompt_.size() * vocab_of(*e.value()));
    return evaluate(e.value()->model(), prompt_, 12, out.data());
  }

  static inline fs::path root_;
  static inline std::vector<int32_t> prompt_;
  static inline std::vector<float> reference_;
};

TEST_F(CompressedTrunkTest, OutputIsIdenticalAcrossBudgetsThreadsAndEngines) {
  int streamed = 0;
  IoEngineTally engines;
  io::IoOptions io_options;
  for (const int threads : {1, 2, 3, 5, 8}) {
    const uint64_t min = minimum(root_ / "z", threads);
    for (const uint64_t budget : {min, min + 400'000, uint64_t{1} << 30}) {
      for (const io::IoBackend backend : {io::IoBackend::kAuto, io::IoBackend::kPread}) {
        if (threads != 2 && (budget != min || backend != io::IoBackend::kAuto)) continue;
        EngineOptions eo;
        eo.pack_dir = root_ / "z";
        eo.ram_budget = budget;
        eo.io.backend = backend;
        eo.model_dir = root_ / "ckpt";
        eo.threads = threads;
        {
          auto e = Engine::open(eo);
          ASSERT_TRUE(e.is_ok()) << e.status().message();
          const TrunkStoreStats& st = e.value()->trunk_store()->stats();
          engines.count(backend, **e);
          io_options = eo.io;
          if (st.layers_streamed > 0) {
            ++streamed;
            EXPECT_GT(st.staging_bytes, 0u);
            EXPECT_EQ(st.scratch_bytes, static_cast<uint64_t>(threads) * kBlock);
          }
        }
        EXPECT_TRUE(same_bytes(logits(eo, threads), reference_))
            << "budget " << budget << ", " << threads << " threads"
            << (backend == io::IoBackend::kPread ? ", pread" : "");
      }
    }
  }
  EXPECT_GE(streamed, 6);
  engines.check(io_options);
}

TEST_F(CompressedTrunkTest, StreamedBytesAreTheStoredBytes) {
  EngineOptions eo;
  eo.model_dir = root_ / "ckpt";
  eo.threads = 2;
  eo.pack_dir = root_ / "z";
  eo.ram_budget = minimum(root_ / "z", 2);
  auto e = Engine::open(eo);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  std::vector<float> out(prompt_.size() * vocab_of(*e.value()));
  ASSERT_TRUE(evaluate(e.value()->model(), prompt_, 12, out.data()).is_ok());
  const TrunkStore& store = *e.value()->trunk_store();
  const TrunkStoreStats& st = store.stats();
  // One pass (the 12-token prompt in one chunk of 12): each streamed layer's record read once,
  // as stored (its blocks), and inflated to its whole size; and, as the pass frees the ring's
  // two slots, the next pass's first two layers read ahead (counted when issued).
  auto ckpt = format::Checkpoint::open(root_ / "ckpt");
  ASSERT_TRUE(ckpt.is_ok());
  auto tp = pack::TrunkPack::open(root_ / "z", ckpt.value());
  ASSERT_TRUE(tp.is_ok()) << tp.status().message();
  uint64_t stored = 0, inflated = 0;
  int64_t streamed = 0;
  for (int64_t l = 0; l < ckpt.value().config().num_hidden_layers; ++l) {
    if (store.is_pinned(l)) continue;
    const pack::Record& r = tp.value().layer_record(l);
    const int times = streamed < 2 ? 2 : 1;
    ++streamed;
    stored += times * r.stored_size;
    inflated += times * r.size;
    EXPECT_FALSE(r.blocks.empty()) << l;
  }
  ASSERT_EQ(streamed, st.layers_streamed);
  ASSERT_GT(streamed, 2) << "more layers streamed than ring slots";
  EXPECT_EQ(st.streamed_bytes_read, stored);
  EXPECT_EQ(st.streamed_bytes_inflated, inflated);
  EXPECT_GT(st.inflate_ns, 0u);
}

// Not just a re-pack: every tensor's inflated bytes against the shard bytes, and every record's
// checksum against the plain pack's (the same inflated bytes, padding included).
TEST_F(CompressedTrunkTest, InflatedBytesEqualTheSourceTensorsInTheShards) {
  auto ckpt = format::Checkpoint::open(root_ / "ckpt", format::OpenMode::kPread);
  ASSERT_TRUE(ckpt.is_ok());
  auto z = pack::TrunkPack::open(root_ / "z", ckpt.value());
  auto plain = pack::TrunkPack::open(root_ / "plain", ckpt.value());
  ASSERT_TRUE(z.is_ok()) << z.status().message();
  ASSERT_TRUE(plain.is_ok());
  EXPECT_EQ(z.value().version(), 2);
  EXPECT_EQ(plain.value().version(), 1);
  EXPECT_EQ(z.value().block_size(), kBlock);
  const auto layout = pack::plan_trunk_pack(ckpt.value());
  uint64_t compared = 0;
  for (size_t ri = 0; ri < z.value().records().size(); ++ri) {
    const pack::Record& r = z.value().records()[ri];
    EXPECT_EQ(r.compressed, r.kind == pack::RecordKind::kLayer) << r.name;
    EXPECT_EQ(r.xxh3, plain.value().records()[ri].xxh3) << r.name;
    EXPECT_EQ(r.offset % 4096, 0u);
    for (const pack::Block& k : r.blocks) EXPECT_EQ(k.offset % 4096, 0u) << r.name;
    std::vector<uint8_t> bytes(r.size);
    const Status st = z.value().read_record(r, bytes.data());
    ASSERT_TRUE(st.is_ok()) << st.message();
    for (size_t t = 0; t < r.tensors.size(); ++t) {
      const format::TensorRef& src = layout.sources[ri][t];
      std::vector<uint8_t> want(src.info->nbytes);
      ASSERT_TRUE(ckpt.value().shard(src.shard).read_bytes(src.info->file_offset, want.size(), want.data()).is_ok());
      ASSERT_EQ(0, std::memcmp(bytes.data() + r.tensors[t].offset, want.data(), want.size())) << r.tensors[t].name;
      compared += want.size();
    }
  }
  EXPECT_EQ(compared, layout.payload_bytes);
}

TEST_F(CompressedTrunkTest, BudgetCountsStagingAndScratch) {
  auto ckpt = format::Checkpoint::open(root_ / "ckpt");
  auto z = pack::TrunkPack::open(root_ / "z", ckpt.value());
  ASSERT_TRUE(z.is_ok());
  uint64_t staging = 0;
  for (const pack::Record& r : z.value().records()) staging = std::max(staging, r.stored_size);
  // Without a pack, less the embedding rows' checksums a pack keeps (8 bytes a row).
  const uint64_t plain = TrunkStore::minimum_bytes(ckpt.value(), nullptr, 2, 4);
  const uint64_t row_sums = 8 * static_cast<uint64_t>(ckpt.value().config().vocab_size);
  EXPECT_EQ(TrunkStore::minimum_bytes(ckpt.value(), &z.value(), 2, 4),
            plain + row_sums + 2 * staging + 4 * kBlock);
  EngineOptions eo;
  eo.model_dir = root_ / "ckpt";
  eo.threads = 4;
  eo.pack_dir = root_ / "z";
  eo.lookahead = kDefaultLookahead;  // as given: automatic lookahead would turn itself off
  eo.ram_budget = minimum(root_ / "z", 4) - 1;
  const auto e = Engine::open(eo);
  ASSERT_EQ(e.status().exit_code(), 4) << e.status().message();
  EXPECT_NE(e.status().message().find("staging"), std::string::npos) << e.status().message();
  // Every layer pinned: the staging buffer that served open()'s reads is gone afterwards, so
  // the store holds what a plain pack's does plus the inflate scratch (the rest of the budget
  // is the expert tier's).
  eo.ram_budget = uint64_t{1} << 30;
  const auto all_z = Engine::open(eo);
  eo.pack_dir = root_ / "plain";
  const auto all_plain = Engine::open(eo);
  ASSERT_TRUE(all_z.is_ok() && all_plain.is_ok());
  const TrunkStoreStats& sz = (*all_z)->trunk_store()->stats();
  ASSERT_EQ(sz.layers_streamed, 0);
  EXPECT_EQ(sz.staging_bytes, 0u);
  EXPECT_EQ(sz.bytes_allocated,
            (*all_plain)->trunk_store()->stats().bytes_allocated + sz.scratch_bytes);
}

// The mutation test of issue 7: the planes of one block swapped on disk make a well-formed block
// of the right length; only the checksum of the inflated bytes catches it, and says so.
TEST_F(CompressedTrunkTest, SwappedPlanesFailWithExitThreeNamingTheBlock) {
  const fs::path bad = mutated("z-swapped", 4, 1, [](std::vector<uint8_t>& stored) {
    const pack::BlockHeader h = pack::parse_block_header(stored).value();
    ASSERT_EQ(h.mode, pack::BlockMode::kBf16Split);
    pack::BlockHeader s = h;
    std::swap(s.codec_a, s.codec_b);
    std::swap(s.length_a, s.length_b);
    std::vector<uint8_t> out(stored.size());
    pack::write_block_header(s, out.data());
    const uint8_t* a = stored.data() + pack::kBlockHeaderBytes;
    std::memcpy(out.data() + pack::kBlockHeaderBytes, a + h.length_a, h.length_b);
    std::memcpy(out.data() + pack::kBlockHeaderBytes + h.length_b, a, h.length_a);
    stored = out;
  });
  const Status s = run_streamed(bad);
  ASSERT_EQ(s.exit_code(), 3) << s.message();
  for (const char* part : {"trunk.pack", "'layer.4'", "block 1 of", "checksum", "planes"})
    EXPECT_NE(s.message().find(part), std::string::npos) << part << ": " << s.message();
  EXPECT_TRUE(run_streamed(root_ / "z").is_ok());  // the control: the intact pack runs
}

TEST_F(CompressedTrunkTest, FlippedByteFailsWithExitThreeNamingTheBlock) {
  const fs::path bad = mutated("z-flipped", 6, 2, [](std::vector<uint8_t>& stored) {
    stored[stored.size() / 2] ^= 0x40;
  });
  const Status s = run_streamed(bad);
  ASSERT_EQ(s.exit_code(), 3) << s.message();
  EXPECT_NE(s.message().find("'layer.6' block 2 of"), std::string::npos) << s.message();
  // Pinned: the same block fails at open.
  EngineOptions eo;
  eo.model_dir = root_ / "ckpt";
  eo.threads = 2;
  eo.pack_dir = bad;
  const Status at_open = Engine::open(eo).status();
  EXPECT_EQ(at_open.exit_code(), 3);
  EXPECT_NE(at_open.message().find("'layer.6' block 2 of"), std::string::npos) << at_open.message();
}

// A failing block read (I/O) is retried once when its layer is needed, then fails with exit 1
// naming the file; after the disk heals the same engine gives the reference bytes again (no
// block of a failed read is ever bound, none is read twice into a slot still being written).
TEST_F(CompressedTrunkTest, FailingBlockReadFailsWithExitOneAndRecovers) {
  EngineOptions eo = streamed_at_the_minimum();
  eo.io.fault_plan = std::make_shared<io::FaultPlan>();
  auto e = Engine::open(eo);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  std::vector<float> want(prompt_.size() * vocab_of(*e.value())), out(want.size());
  ASSERT_TRUE(evaluate(e.value()->model(), prompt_, 12, want.data()).is_ok());
  eo.io.fault_plan->add(io::FaultRule::eio().in_path("trunk.pack").times(-1));
  const Status s = evaluate(e.value()->model(), prompt_, 12, out.data());
  EXPECT_EQ(s.exit_code(), 1) << s.message();
  EXPECT_NE(s.message().find("trunk.pack"), std::string::npos) << s.message();
  eo.io.fault_plan->clear();
  poison_logits(out);
  const Status again = evaluate(e.value()->model(), prompt_, 12, out.data());
  ASSERT_TRUE(again.is_ok()) << again.message();
  EXPECT_TRUE(test::same_bytes(out, want));
}

// A forward pass over the streamed compressed pack run out of memory at one allocation of the
// calling thread after another (serve goes on with the same engine after a std::bad_alloc):
// the ring, its staging and the inflate scratch are left whole, and the next pass gives the
// bytes of a pass that never failed. Every 16th allocation of a 3-token pass, from a fresh
// offset. A block batch lost to a throw once tripped a CHECK on the next pass.
TEST_F(CompressedTrunkTest, AForwardThatRunsOutOfMemoryLeavesTheEngineWhole) {
  auto e = Engine::open(streamed_at_the_minimum());
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  ASSERT_GT(e.value()->trunk_store()->stats().layers_streamed, 0);
  expect_forward_out_of_memory_leaves_engine_whole(
      "CompressedTrunkTest.AForwardThatRunsOutOfMemoryLeavesTheEngineWhole", 16, *e.value(),
      prompt_);
}

}  // namespace
}  // namespace ktier::runtime
