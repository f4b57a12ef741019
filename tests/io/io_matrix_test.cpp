// The I/O matrix (STYLE-ANCHORS.md practice 23): every engine x {O_DIRECT, buffered} x queue
// depth {1, 16, 64} x {aligned, unaligned} requests x {plain, registered} buffers reads a file of
// known pseudo-random bytes and must return exactly those bytes. Combinations this kernel or
// filesystem lacks are skipped with the reason printed.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "io/aligned_buffer.h"
#include "io/io_engine.h"
#include "io/uring_io_engine.h"
#include "io_test_util.h"
#include "common/test_paths.h"

namespace ktier::io::test {
namespace {

enum class Layout { kAligned, kUnaligned };
enum class Registration { kPlain, kRegistered };

using MatrixParam = std::tuple<IoBackend, DirectMode, uint32_t, Layout, Registration>;

std::string matrix_name(const ::testing::TestParamInfo<MatrixParam>& info) {
  const auto& [backend, direct, depth, layout, reg] = info.param;
  return std::string(backend_name(backend)) + "_" + direct_name(direct) + "_qd" +
         std::to_string(depth) + (layout == Layout::kAligned ? "_aligned" : "_unaligned") +
         (reg == Registration::kRegistered ? "_registered" : "_plain");
}

struct Planned {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t dst_misalign = 0;  // bytes past an aligned slot start
};

// Requests that exercise chunking, bounce heads and tails, EOF, tiny and empty reads.
std::vector<Planned> plan_requests(Layout layout, uint64_t file_size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Planned> out;
  auto pick = [&](uint64_t lo, uint64_t hi) {  // inclusive
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  const uint64_t blocks = file_size / kDefaultAlignment;
  if (layout == Layout::kAligned) {
    for (int i = 0; i < 40; ++i) {
      const uint64_t len_blocks = pick(1, 160);  // up to 640 KiB: several 256 KiB chunks
      const uint64_t start = pick(0, blocks - len_blocks);
      out.push_back({start * kDefaultAlignment, len_blocks * kDefaultAlignment, 0});
    }
    out.push_back({0, 3ull << 20, 0});  // twelve chunks at once
    out.push_back({(blocks - 1) * kDefaultAlignment, kDefaultAlignment, 0});
  } else {
    for (int i = 0; i < 40; ++i) {
      const uint64_t off = pick(0, file_size - 1);
      const uint64_t len = pick(1, std::min<uint64_t>(file_size - off, 700000));
      // Every third one has destination and offset agreeing modulo 4096: only head and tail
      // need a bounce buffer, the middle goes direct.
      const uint64_t mis = i % 3 == 0 ? off % kDefaultAlignment : pick(1, kDefaultAlignment - 1);
      out.push_back({off, len, mis});
    }
    out.push_back({file_size - 5000, 5000, 3});  // ends at an unaligned EOF
    out.push_back({file_size - 1, 1, 1});        // last byte
    out.push_back({12345, 0, 0});                // empty
    out.push_back({1, file_size - 1, 1});        // nearly all of it
  }
  std::sort(out.begin(), out.end(),
            [](const Planned& a, const Planned& b) { return a.offset < b.offset; });
  return out;
}

class IoMatrixTest : public ::testing::TestWithParam<MatrixParam> {};

TEST_P(IoMatrixTest, ReadsExactBytes) {
  const auto& [backend, direct, depth, layout, reg] = GetParam();
  IoOptions opt;
  opt.backend = backend;
  opt.direct = direct;
  opt.queue_depth = depth;
  opt.max_chunk_bytes = 256 << 10;  // small, so that requests split into many chunks

  std::string why;
  auto engine = make_engine_or_skip(opt, &why);
  KTIER_IO_SKIP_IF(!engine, why);
  if (reg == Registration::kRegistered) {
    KTIER_IO_SKIP_IF(!static_cast<UringIoEngine&>(*engine).buffers_registered(),
                     std::string("this kernel refused a registered-buffer table"));
  }

  const uint64_t file_size = (6ull << 20) + 777;  // not a multiple of any alignment
  const uint64_t seed = std::hash<std::string>{}(matrix_name({GetParam(), 0}));
  const std::vector<uint8_t> content = random_bytes(file_size, seed);
  TempFile tmp(content, "matrix");
  ReadFile file;
  KTIER_IO_SKIP_IF(!open_or_skip(*engine, tmp.path(), &file, &why), why);
  ASSERT_EQ(file.direct(), direct == DirectMode::kDirect);
  ASSERT_EQ(file.size(), file_size);

  const std::vector<Planned> plan = plan_requests(layout, file_size, seed);
  // One arena for all destinations, each slot starting on a 4096 boundary plus dst_misalign.
  std::vector<uint64_t> slot_offset;
  uint64_t arena_bytes = 0;
  for (const Planned& p : plan) {
    slot_offset.push_back(arena_bytes + p.dst_misalign);
    arena_bytes = align_up(arena_bytes + p.dst_misalign + p.length + 1, kDefaultAlignment);
  }
  auto arena = AlignedBuffer::allocate(arena_bytes);
  ASSERT_TRUE(arena.is_ok()) << arena.status().message();
  std::memset(arena->data(), 0xA5, arena->size());
  if (reg == Registration::kRegistered) {
    ASSERT_TRUE(engine->register_buffer(arena->data(), arena->size()).is_ok());
  }

  std::vector<ReadRequest> requests;
  uint64_t payload = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    requests.push_back({&file, plan[i].offset, plan[i].length, arena->data() + slot_offset[i], i});
    payload += plan[i].length;
  }
  CompletionQueue cq(*engine);
  const size_t half = requests.size() / 2;  // two batches: the second lands while reads run
  ASSERT_TRUE(cq.submit(std::span(requests).first(half)).is_ok());
  ASSERT_TRUE(cq.submit(std::span(requests).subspan(half)).is_ok());

  std::set<uint64_t> seen;
  std::vector<Completion> done;
  while (cq.outstanding() > 0) {
    done.clear();
    ASSERT_GE(cq.wait(1, done), 1u);
    for (const Completion& c : done) {
      ASSERT_LT(c.tag, plan.size());
      ASSERT_TRUE(seen.insert(c.tag).second) << "tag " << c.tag << " completed twice";
      ASSERT_TRUE(c.status.is_ok()) << c.status.message();
      const Planned& p = plan[c.tag];
      const uint8_t* got = arena->data() + slot_offset[c.tag];
      ASSERT_EQ(std::memcmp(got, content.data() + p.offset, p.length), 0)
          << "bytes differ for offset " << p.offset << " length " << p.length << " dst+"
          << p.dst_misalign;
      ASSERT_EQ(got[p.length], 0xA5) << "wrote past the end of the destination";
      if (p.dst_misalign > 0) {
        ASSERT_EQ(got[-1], 0xA5) << "wrote before the destination";
      }
    }
  }
  EXPECT_EQ(seen.size(), plan.size());

  const IoCounters k = engine->counters();
  EXPECT_EQ(k.requests_completed, plan.size());
  EXPECT_EQ(k.requests_failed, 0u);
  EXPECT_EQ(k.bytes_delivered, payload);
  EXPECT_GE(k.bytes_read, payload);
  EXPECT_GT(k.busy_ns, 0u);
  if (direct == DirectMode::kDirect && layout == Layout::kUnaligned) {
    EXPECT_GT(k.bounced_chunks, 0u);
  } else {
    EXPECT_EQ(k.bounced_chunks, 0u);
  }
  if (reg == Registration::kRegistered) {
    EXPECT_GT(k.fixed_reads, 0u);
    engine->unregister_buffer(arena->data());
  } else if (k.bounced_chunks == 0) {
    EXPECT_EQ(k.fixed_reads, 0u);  // (bounce buffers are registered, so bounced reads are fixed)
  }
}

// Registered buffers exist only in the io_uring engine, so pread runs the plain half.
INSTANTIATE_TEST_SUITE_P(
    Uring, IoMatrixTest,
    ::testing::Combine(::testing::Values(IoBackend::kUring),
                       ::testing::Values(DirectMode::kDirect, DirectMode::kBuffered),
                       ::testing::Values(1u, 16u, 64u),
                       ::testing::Values(Layout::kAligned, Layout::kUnaligned),
                       ::testing::Values(Registration::kPlain, Registration::kRegistered)),
    matrix_name);
INSTANTIATE_TEST_SUITE_P(
    Pread, IoMatrixTest,
    ::testing::Combine(::testing::Values(IoBackend::kPread),
                       ::testing::Values(DirectMode::kDirect, DirectMode::kBuffered),
                       ::testing::Values(1u, 16u, 64u),
                       ::testing::Values(Layout::kAligned, Layout::kUnaligned),
                       ::testing::Values(Registration::kPlain)),
    matrix_name);

// ---- the conformance cache fixture: 24 experts of 1632 bytes at 20608 + 1632 e ----------------

using FixtureParam = std::tuple<IoBackend, DirectMode, uint32_t>;

std::string fixture_name(const ::testing::TestParamInfo<FixtureParam>& info) {
  const auto& [backend, direct, depth] = info.param;
  return std::string(backend_name(backend)) + "_" + direct_name(direct) + "_qd" +
         std::to_string(depth);
}

class ConformanceExpertsTest : public ::testing::TestWithParam<FixtureParam> {};

TEST_P(ConformanceExpertsTest, AllExpertsInRandomOrder) {
  constexpr uint64_t kFirstExpert = 20608, kExpertBytes = 1632, kExperts = 24;
  const auto& [backend, direct, depth] = GetParam();
  const std::filesystem::path path =
      ktier::test::conformance_dir() / "cache" / "model-00001-of-00001.safetensors";
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in.good()) << "missing fixture " << path;
  const std::vector<uint8_t> plain((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  ASSERT_EQ(plain.size(), kFirstExpert + kExperts * kExpertBytes) << "fixture layout changed";

  IoOptions opt;
  opt.backend = backend;
  opt.direct = direct;
  opt.queue_depth = depth;
  std::string why;
  auto engine = make_engine_or_skip(opt, &why);
  KTIER_IO_SKIP_IF(!engine, why);
  ReadFile file;
  KTIER_IO_SKIP_IF(!open_or_skip(*engine, path.string(), &file, &why), why);

  std::vector<uint64_t> order(kExperts);
  for (uint64_t e = 0; e < kExperts; ++e) order[e] = e;
  std::shuffle(order.begin(), order.end(), std::mt19937(7 + depth));
  std::vector<std::vector<uint8_t>> slots(kExperts, std::vector<uint8_t>(kExpertBytes));
  std::vector<ReadRequest> batch;
  for (uint64_t e : order) {
    batch.push_back({&file, kFirstExpert + kExpertBytes * e, kExpertBytes, slots[e].data(), e});
  }
  CompletionQueue cq(*engine);
  ASSERT_TRUE(cq.submit(batch).is_ok());
  std::vector<Completion> done;
  while (cq.outstanding() > 0) cq.wait(1, done);
  ASSERT_EQ(done.size(), kExperts);
  for (const Completion& c : done) {
    ASSERT_TRUE(c.status.is_ok()) << c.status.message();
    EXPECT_EQ(std::memcmp(slots[c.tag].data(), plain.data() + kFirstExpert + kExpertBytes * c.tag,
                          kExpertBytes),
              0)
        << "expert " << c.tag;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixture, ConformanceExpertsTest,
                         ::testing::Combine(::testing::Values(IoBackend::kUring, IoBackend::kPread),
                                            ::testing::Values(DirectMode::kDirect,
                                                              DirectMode::kBuffered),
                                            ::testing::Values(1u, 16u, 64u)),
                         fixture_name);

}  // namespace
}  // namespace ktier::io::test
