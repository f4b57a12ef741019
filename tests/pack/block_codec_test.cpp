// The compressed block (src/pack/block_codec.h): the C++ inverse against blocks written by the
// independent Python implementation (tools/trunk_blocks.py, run by CTest before this test), a
// mutation that swaps the planes, damaged headers, and the five adversarial layer shapes of
// issue 7 inflated in parallel at 1, 2, 3, 5 and 8 threads.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <xxhash.h>

#include "cpu/thread_pool.h"
#include "pack/block_codec.h"
#include "pack/trunk_pack.h"

namespace ktier::pack {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// bf16 bytes of N(0, 0.02) weights: a skewed high byte, a noisy low byte, like real trunk tensors.
std::vector<uint8_t> bf16_weights(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.02f);
  std::vector<uint8_t> out(2 * count);
  for (size_t i = 0; i < count; ++i) {
    const float f = d(rng);
    uint32_t u = 0;
    std::memcpy(&u, &f, 4);
    out[2 * i] = static_cast<uint8_t>(u >> 16);
    out[2 * i + 1] = static_cast<uint8_t>(u >> 24);
  }
  return out;
}

// The stored block with planes A and B exchanged (header lengths and codecs too): a well-formed
// block of the same size that inflates to the wrong bytes, the writer bug the checksum must catch.
std::vector<uint8_t> swap_planes(const std::vector<uint8_t>& stored) {
  auto h = parse_block_header(stored);
  EXPECT_TRUE(h.is_ok());
  BlockHeader s = h.value();
  std::swap(s.codec_a, s.codec_b);
  std::swap(s.length_a, s.length_b);
  std::vector<uint8_t> out(stored.size());
  write_block_header(s, out.data());
  const uint8_t* a = stored.data() + kBlockHeaderBytes;
  const uint8_t* b = a + h.value().length_a;
  std::memcpy(out.data() + kBlockHeaderBytes, b, h.value().length_b);
  std::memcpy(out.data() + kBlockHeaderBytes + h.value().length_b, a, h.value().length_a);
  return out;
}

TEST(BlockCodec, InflatesBlocksWrittenByThePythonImplementation) {
  const char* dir = std::getenv("KTIER_BLOCK_FIXTURE_DIR");
  ASSERT_NE(dir, nullptr) << "run through CTest: tools/trunk_blocks.py fixture writes the blocks first";
  std::ifstream list(fs::path(dir) / "cases.txt");
  ASSERT_TRUE(list.good()) << dir;
  std::string line;
  int cases = 0, split = 0;
  InflateScratch scratch;
  while (std::getline(list, line)) {
    std::istringstream in(line);
    int k = -1;
    std::string mode;
    in >> k >> mode;
    const auto src = read_bytes(fs::path(dir) / ("case_" + std::to_string(k) + ".src"));
    const auto block = read_bytes(fs::path(dir) / ("case_" + std::to_string(k) + ".block"));
    auto h = parse_block_header(block);
    ASSERT_TRUE(h.is_ok()) << line << ": " << h.status().message();
    EXPECT_EQ(h.value().mode, mode == "split" ? BlockMode::kBf16Split : BlockMode::kWhole) << line;
    std::vector<uint8_t> out(src.size(), 0xEE);
    const Status st = inflate_block(block, out, scratch);
    ASSERT_TRUE(st.is_ok()) << line << ": " << st.message();
    EXPECT_EQ(out, src) << line;
    // And the C++ writer's block for the same bytes inflates to them too.
    auto mine = deflate_block(src, mode == "split", kZstdLevel);
    ASSERT_TRUE(mine.is_ok());
    std::vector<uint8_t> back(src.size());
    ASSERT_TRUE(inflate_block(mine.value(), back, scratch).is_ok());
    EXPECT_EQ(back, src) << line;
    ++cases;
    split += mode == "split";
  }
  EXPECT_GE(cases, 6);
  EXPECT_GE(split, 3);
}

TEST(BlockCodec, SplitPlanesCompressTheHighByteAndRoundTrip) {
  const auto src = bf16_weights(200000, 1);
  auto z = deflate_block(src, true, kZstdLevel);
  ASSERT_TRUE(z.is_ok());
  const BlockHeader h = parse_block_header(z.value()).value();
  EXPECT_EQ(h.mode, BlockMode::kBf16Split);
  EXPECT_EQ(h.codec_a, PlaneCodec::kZstd);
  EXPECT_LT(h.length_a, src.size() / 2 / 2);  // the exponent plane at least halves
  EXPECT_LT(z.value().size(), src.size() * 0.8);
  InflateScratch s;
  std::vector<uint8_t> out(src.size());
  ASSERT_TRUE(inflate_block(z.value(), out, s).is_ok());
  EXPECT_EQ(out, src);
}

TEST(BlockCodec, SwappedPlanesInflateToOtherBytes) {
  const auto src = bf16_weights(5000, 2);
  auto z = deflate_block(src, true, kZstdLevel);
  ASSERT_TRUE(z.is_ok());
  const auto swapped = swap_planes(z.value());
  ASSERT_EQ(swapped.size(), z.value().size());
  InflateScratch s;
  std::vector<uint8_t> out(src.size());
  // Well formed: only a checksum of the inflated bytes can tell (TrunkPack::inflate_block).
  ASSERT_TRUE(inflate_block(swapped, out, s).is_ok());
  EXPECT_NE(out, src);
  EXPECT_NE(XXH3_64bits(out.data(), out.size()), XXH3_64bits(src.data(), src.size()));
}

TEST(BlockCodec, DamagedHeadersAreCorrupt) {
  const auto src = bf16_weights(3000, 3);
  const auto good = deflate_block(src, true, kZstdLevel).value();
  InflateScratch s;
  std::vector<uint8_t> out(src.size());
  auto expect_corrupt = [&](std::vector<uint8_t> b, std::span<uint8_t> dst, const char* what) {
    const Status st = inflate_block(b, dst, s);
    EXPECT_EQ(st.exit_code(), 3) << what;
    EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
  };
  auto b = good;
  b[0] ^= 1;
  expect_corrupt(b, out, "magic");
  b = good;
  b[4] = 7;
  expect_corrupt(b, out, "unknown mode");
  b = good;
  b[7] = 1;
  expect_corrupt(b, out, "byte 7 (reserved) is 1, not 0");
  b = good;
  b[16] ^= 1;  // plane A length
  expect_corrupt(b, out, "do not fill");
  std::vector<uint8_t> shorter(src.size() - 2);
  expect_corrupt(good, shorter, "inflated bytes, the manifest");
  const auto whole = deflate_block(src, false, kZstdLevel).value();
  ASSERT_TRUE(inflate_block(whole, out, s).is_ok());
  b = whole;
  b[6] = 1;  // a plane-B codec in whole mode, where there is no plane B
  expect_corrupt(b, out, "whole block has a second plane (0 bytes, codec 1)");
  b = good;
  b[kBlockHeaderBytes + 1] ^= 0xFF;  // inside the first zstd frame's header
  const Status st = inflate_block(b, out, s);
  EXPECT_TRUE(!st.is_ok() || out != src);  // a frame error, or bytes the checksum rejects
}

// Compresses `bytes` (one record, tensors as given) with plan_blocks and inflates every block in
// parallel on `threads` threads, each block into its own range; returns the inflated record.
struct Compressed {
  std::vector<Block> blocks;
  std::vector<std::vector<uint8_t>> stored;
};
Compressed compress(const Record& r, const std::vector<uint8_t>& bytes, uint64_t block_size) {
  Compressed c;
  for (const BlockPlan& p : plan_blocks(r, block_size)) {
    auto z = deflate_block(std::span<const uint8_t>(bytes.data() + p.raw_offset, p.inflated), p.split, kZstdLevel);
    EXPECT_TRUE(z.is_ok());
    Block k;
    k.raw_offset = p.raw_offset;
    k.inflated = p.inflated;
    k.length = z.value().size();
    k.xxh3 = XXH3_64bits(bytes.data() + p.raw_offset, p.inflated);
    c.blocks.push_back(k);
    c.stored.push_back(std::move(z).value());
  }
  return c;
}
std::vector<uint8_t> inflate_parallel(const Compressed& c, uint64_t size, int threads) {
  cpu::ThreadPool pool(threads);
  InflateScratchSet scratch(threads, 16384);  // one per running range, as TrunkStore lends them
  std::vector<uint8_t> out(size, 0xEE);
  std::vector<int> ok(c.blocks.size(), 0);
  pool.parallel_for(static_cast<int64_t>(c.blocks.size()), 1, [&](int64_t b, int64_t e) {
    const InflateScratchSet::Lease mine = scratch.borrow();
    for (int64_t i = b; i < e; ++i) {
      const Block& k = c.blocks[static_cast<size_t>(i)];
      std::span<uint8_t> dst(out.data() + k.raw_offset, k.inflated);
      ok[static_cast<size_t>(i)] = inflate_block(c.stored[static_cast<size_t>(i)], dst, *mine).is_ok() &&
                                   XXH3_64bits(dst.data(), dst.size()) == k.xxh3;
    }
  });
  for (size_t i = 0; i < ok.size(); ++i) EXPECT_TRUE(ok[i]) << "block " << i;
  return out;
}

// One bf16 tensor of `n` bytes at offset 0 of a record of `size` bytes (padding after it).
Record record_of(uint64_t n, uint64_t size, DType dtype = DType::kBF16) {
  Record r;
  r.name = "layer.0";
  r.size = size;
  r.bytes = n;
  TensorEntry t;
  t.name = "w";
  t.dtype = dtype;
  t.offset = 0;
  t.nbytes = n;
  r.tensors.push_back(t);
  return r;
}

// A lease ended by a throw gives its scratch back (the set would run short: the next range to
// borrow would find none).
TEST(BlockCodec, ScratchLentIsGivenBackHoweverTheLeaseEnds) {
  InflateScratchSet set(2, 4096);
  EXPECT_EQ(set.bytes(), 2u * 4096);
  for (int round = 0; round < 3; ++round) {
    try {
      const InflateScratchSet::Lease lost = set.borrow();
      throw std::runtime_error("inflating failed");
    } catch (const std::runtime_error&) {
    }
  }
  const InflateScratchSet::Lease a = set.borrow(), b = set.borrow();
  EXPECT_NE(&*a, &*b);
}

// One lease more than the set holds (more inflating threads than scratch) is a bug, caught.
TEST(BlockCodecDeathTest, ALeaseMoreThanTheSetHoldsAborts) {
  InflateScratchSet set(1, 4096);
  const InflateScratchSet::Lease a = set.borrow();
  EXPECT_DEATH({ const InflateScratchSet::Lease b = set.borrow(); },
               "CHECK failed: !set_.free_.empty");
}

TEST(BlockCodec, AdversarialShapesAreIdenticalAtEveryThreadCount) {
  constexpr uint64_t B = 16384;
  struct Shape {
    const char* what;
    Record record;
  };
  std::vector<Shape> shapes = {
      {"run not a multiple of the block size", record_of(3 * B + 4000, 3 * B + 4096)},
      {"exact multiple of the block size", record_of(4 * B, 4 * B)},
      {"smaller than one block", record_of(1000, 4096)},
      {"more blocks than threads", record_of(21 * B, 21 * B)},
      {"odd total length (last block unsplit)", record_of(2 * B + 777, 2 * B + 777)},
  };
  // A mixed record too: bf16, then an f32 run (compressed whole), then bf16 again.
  Record mixed = record_of(B + 64, B + 64);
  TensorEntry f32{"f", DType::kF32, {}, B + 64, 4096, 0};
  TensorEntry tail{"t", DType::kBF16, {}, B + 64 + 4096, 2 * B, 0};
  mixed.tensors.push_back(f32);
  mixed.tensors.push_back(tail);
  mixed.size = mixed.bytes = B + 64 + 4096 + 2 * B;
  shapes.push_back({"mixed dtypes", mixed});

  for (const Shape& s : shapes) {
    const uint64_t size = s.record.size;
    std::vector<uint8_t> bytes = bf16_weights((size + 1) / 2, 11);
    bytes.resize(size);
    const Compressed c = compress(s.record, bytes, B);
    uint64_t covered = 0;
    bool any_whole = false;
    for (const BlockPlan& p : plan_blocks(s.record, B)) {
      EXPECT_EQ(p.raw_offset, covered) << s.what;
      EXPECT_LE(p.inflated, B) << s.what;
      covered += p.inflated;
      any_whole |= !p.split;
    }
    EXPECT_EQ(covered, size) << s.what;
    if (size % 2 == 1) {
      EXPECT_TRUE(any_whole) << s.what;
    }
    if (std::string(s.what) == "more blocks than threads") {
      EXPECT_GT(c.blocks.size(), 8u);
    }
    for (int threads : {1, 2, 3, 5, 8}) {
      EXPECT_EQ(inflate_parallel(c, size, threads), bytes) << s.what << ", " << threads << " threads";
    }
  }
}

}  // namespace
}  // namespace ktier::pack
