// SafetensorsWriter: header spelling and padding, chunked streaming, byte-count checks and the
// .partial → rename protocol.
#include "format/safetensors_writer.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <numeric>

#include "format/safetensors.h"

#include "synth/synth_test_util.h"

namespace ktier {
namespace {

using format::SafetensorsWriter;
using format::TensorDecl;
namespace fs = std::filesystem;

std::vector<TensorDecl> sample_decls() {
  return {
      {"a.bf16", DType::kBF16, {3, 5}},                  // 30 bytes
      {"scalar", DType::kF32, {}},                       // rank 0: one element
      {"empty", DType::kF32, {0, 8}},                    // zero elements
      {"we\"ird\\name", DType::kU8, {7}},                // escaped in JSON
      {"big", DType::kF16, {1000}},                      // 2000 bytes: crosses chunk boundaries
  };
}

TEST(SafetensorsWriter, StreamsChunksAndWritesThePaddedHeader) {
  test::TempDir dir("writer_ok");
  const fs::path path = dir.path() / "x.safetensors";
  const auto decls = sample_decls();
  auto w = SafetensorsWriter::create(path, decls);
  ASSERT_TRUE(w.is_ok()) << w.status().message();
  EXPECT_TRUE(fs::exists(path.string() + ".partial"));
  EXPECT_FALSE(fs::exists(path));
  const uint64_t total = 30 + 4 + 0 + 7 + 2000;
  EXPECT_EQ(w->data_bytes(), total);
  std::vector<uint8_t> bytes(total);
  std::iota(bytes.begin(), bytes.end(), 0);
  // Odd chunk sizes, one past a tensor boundary, one across several tensors.
  size_t off = 0;
  for (size_t n : {1, 30, 3, 8, 1999}) {
    ASSERT_TRUE(w->append(bytes.data() + off, n).is_ok());
    off += n;
  }
  ASSERT_EQ(off, total);
  ASSERT_TRUE(w->finish().is_ok());
  EXPECT_FALSE(fs::exists(path.string() + ".partial"));

  const test::RawShard s = test::read_raw_shard(path);
  EXPECT_EQ(s.header_len % 8, 0u);
  EXPECT_EQ(s.header_len, w->header_bytes());
  EXPECT_FALSE(s.has_metadata);  // the release has no __metadata__
  EXPECT_EQ(s.file_size, 8 + s.header_len + total);
  ASSERT_EQ(s.tensors.size(), decls.size());
  uint64_t expect_begin = 0;
  for (size_t i = 0; i < decls.size(); ++i) {
    EXPECT_EQ(s.tensors[i].name, decls[i].name);
    EXPECT_EQ(s.tensors[i].dtype, std::string(dtype_name(decls[i].dtype)));
    EXPECT_EQ(s.tensors[i].shape, decls[i].shape);
    EXPECT_EQ(s.tensors[i].begin, expect_begin) << decls[i].name;  // back to back
    EXPECT_EQ(s.tensors[i].end - s.tensors[i].begin, decls[i].nbytes());
    expect_begin = s.tensors[i].end;
  }
  EXPECT_EQ(test::read_range(path, s.data_offset(), total), bytes);
  // Compact JSON as released, then space padding.
  const std::string header = SafetensorsWriter::header_json(decls);
  EXPECT_EQ(header.rfind("{\"a.bf16\":{\"dtype\":\"BF16\",\"shape\":[3,5],\"data_offsets\":[0,30]}", 0), 0u);
  EXPECT_EQ(header.find_last_not_of(' '), header.find_last_of('}'));
}

// The writer's buffer (1 MiB) at its edges: a chunk of 256 KiB or more goes straight to the
// file after what is buffered; small chunks that would overfill the buffer flush it first. The
// file's bytes are in append order either way.
TEST(SafetensorsWriter, ChunksAroundTheBufferLandInOrder) {
  test::TempDir dir("writer_large");
  const fs::path path = dir.path() / "x.safetensors";
  constexpr size_t kKiB = 1024;
  const std::vector<TensorDecl> decls = {{"head", DType::kU8, {3}},
                                         {"body", DType::kU8, {1536 * kKiB}}};
  auto w = SafetensorsWriter::create(path, decls);
  ASSERT_TRUE(w.is_ok()) << w.status().message();
  const uint64_t total = 3 + 1536 * kKiB;
  std::vector<uint8_t> bytes(total);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 131 + i / 251);
  // 3 buffered, 300 KiB straight after them, 9 x 100 KiB buffered, 200 KiB that would overfill
  // the buffer (flushed first), then the rest in odd pieces.
  std::vector<size_t> chunks = {3, 300 * kKiB};
  for (int i = 0; i < 9; ++i) chunks.push_back(100 * kKiB);
  chunks.push_back(200 * kKiB);
  size_t listed = 0;
  for (size_t n : chunks) listed += n;
  for (size_t n = 7777; listed < total; listed += n) chunks.push_back(std::min(n, total - listed));
  size_t off = 0;
  for (size_t n : chunks) {
    ASSERT_TRUE(w->append(bytes.data() + off, n).is_ok()) << "at " << off;
    off += n;
  }
  ASSERT_EQ(off, total);
  ASSERT_TRUE(w->finish().is_ok());
  const test::RawShard s = test::read_raw_shard(path);
  EXPECT_EQ(s.file_size, 8 + s.header_len + total);
  EXPECT_EQ(test::read_range(path, s.data_offset(), total), bytes);
}

TEST(SafetensorsWriter, WritesMetadataOnlyWhenGiven) {
  const std::string h = SafetensorsWriter::header_json({{"t", DType::kF32, {1}}}, {{"format", "pt"}});
  EXPECT_EQ(h.rfind("{\"__metadata__\":{\"format\":\"pt\"},\"t\":", 0), 0u);
}

TEST(SafetensorsWriter, RefusesMoreBytesThanDeclaredAndLeavesNoFile) {
  test::TempDir dir("writer_over");
  const fs::path path = dir.path() / "over.safetensors";
  {
    auto w = SafetensorsWriter::create(path, {{"only", DType::kF32, {2}}});
    ASSERT_TRUE(w.is_ok());
    const uint8_t bytes[12] = {};
    const Status s = w->append(bytes, 12);
    ASSERT_FALSE(s.is_ok());
    EXPECT_EQ(s.exit_code(), 1);
    EXPECT_NE(s.message().find(path.string()), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("'only'"), std::string::npos) << s.message();
  }  // destroyed unfinished: the partial file goes away
  EXPECT_TRUE(test::list_dir(dir.path()).empty());
}

TEST(SafetensorsWriter, FinishRefusesMissingBytesAndNamesTheTensor) {
  test::TempDir dir("writer_short");
  const fs::path path = dir.path() / "short.safetensors";
  auto w = SafetensorsWriter::create(path, {{"first", DType::kU8, {4}}, {"second", DType::kU8, {4}}});
  ASSERT_TRUE(w.is_ok());
  const uint8_t bytes[6] = {};
  ASSERT_TRUE(w->append(bytes, 6).is_ok());
  const Status s = w->finish();
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("'second'"), std::string::npos) << s.message();
  EXPECT_TRUE(test::list_dir(dir.path()).empty());
  EXPECT_FALSE(w->append(bytes, 1).is_ok());  // the writer is dead after a failed finish
}

// skip() leaves bytes that read as zeros, between written ones and at the end (where finish()
// sets the length), and is bounded by the declaration like append().
TEST(SafetensorsWriter, SkippedBytesReadAsZeros) {
  test::TempDir dir("writer_skip");
  const fs::path path = dir.path() / "holes.safetensors";
  auto w = SafetensorsWriter::create(path, {{"a", DType::kU8, {4}}, {"b", DType::kU8, {6}},
                                            {"c", DType::kU8, {5}}});
  ASSERT_TRUE(w.is_ok());
  const uint8_t ones[4] = {1, 1, 1, 1}, twos[2] = {2, 2};
  ASSERT_TRUE(w->append(ones, 4).is_ok());
  ASSERT_TRUE(w->skip(4).is_ok());
  ASSERT_TRUE(w->append(twos, 2).is_ok());
  EXPECT_FALSE(w->skip(6).is_ok()) << "past the declared bytes";
  ASSERT_TRUE(w->skip(5).is_ok());
  ASSERT_TRUE(w->finish().is_ok());
  const std::string file = test::read_file(path);
  ASSERT_EQ(file.size(), w->file_bytes());
  const std::string data = file.substr(file.size() - 15);
  EXPECT_EQ(data, std::string("\x01\x01\x01\x01", 4) + std::string(4, '\0') + "\x02\x02" +
                      std::string(5, '\0'));
}

TEST(SafetensorsWriter, UnfinishedWriterRemovesItsPartialFile) {
  test::TempDir dir("writer_abandon");
  {
    auto w = SafetensorsWriter::create(dir.path() / "y.safetensors", {{"t", DType::kU8, {3}}});
    ASSERT_TRUE(w.is_ok());
    const uint8_t b = 1;
    ASSERT_TRUE(w->append(&b, 1).is_ok());
    EXPECT_EQ(test::list_dir(dir.path()).size(), 1u);
  }
  EXPECT_TRUE(test::list_dir(dir.path()).empty());
}

// A stale "<path>.partial" is never written through: a symlink there (to a file the writer must
// not touch, e.g. a model shard) is removed, and the bytes go to a new file.
TEST(SafetensorsWriter, StalePartialSymlinkIsRemovedNotFollowed) {
  test::TempDir dir("writer_symlink");
  const fs::path path = dir.path() / "s.safetensors", victim = dir.path() / "victim.bin";
  std::ofstream(victim) << "keep me";
  fs::create_symlink(victim, path.string() + ".partial");
  auto w = SafetensorsWriter::create(path, {{"t", DType::kU8, {3}}});
  ASSERT_TRUE(w.is_ok()) << w.status().message();
  const uint8_t b[3] = {1, 2, 3};
  ASSERT_TRUE(w->append(b, 3).is_ok());
  ASSERT_TRUE(w->finish().is_ok());
  EXPECT_EQ(test::read_file(victim), "keep me");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(path)));
  EXPECT_EQ(test::list_dir(dir.path()), (std::vector<std::string>{"s.safetensors", "victim.bin"}));
}

// One Partial::kUnique writer of `path`, to the end: a 1-byte tensor.
Status write_unique(const fs::path& path) {
  auto w = SafetensorsWriter::create(path, {{"t", DType::kU8, {1}}}, {},
                                     SafetensorsWriter::Partial::kUnique);
  if (!w.is_ok()) return w.status();
  const uint8_t b = 7;
  KTIER_RETURN_IF_ERROR(w->append(&b, 1));
  return w->finish();
}

// Partial::kUnique: writers of one path at once each write a file of their own and rename it
// whole; the path holds the file of the one that finished last, and nothing else is left.
TEST(SafetensorsWriter, UniquePartialsLetWritersOfOnePathOverlap) {
  test::TempDir dir("writer_unique");
  const fs::path path = dir.path() / "u.safetensors";
  using P = SafetensorsWriter::Partial;
  auto w1 = SafetensorsWriter::create(path, {{"t", DType::kU8, {2}}}, {}, P::kUnique);
  auto w2 = SafetensorsWriter::create(path, {{"t", DType::kU8, {2}}}, {}, P::kUnique);
  ASSERT_TRUE(w1.is_ok() && w2.is_ok());
  EXPECT_EQ(test::list_dir(dir.path()).size(), 2u);
  const uint8_t one[2] = {1, 1}, two[2] = {2, 2};
  ASSERT_TRUE(w1->append(one, 2).is_ok());
  ASSERT_TRUE(w2->append(two, 2).is_ok());
  ASSERT_TRUE(w2->finish().is_ok());
  ASSERT_TRUE(w1->finish().is_ok());
  const std::string bytes = test::read_file(path);
  EXPECT_EQ(bytes.substr(bytes.size() - 2), std::string("\x01\x01", 2));
  EXPECT_EQ(test::list_dir(dir.path()), std::vector<std::string>{"u.safetensors"});
}

// Partial names left by killed writers of this pid (a container's pid 1 is every run's) are
// passed over, and left as they are while recent.
TEST(SafetensorsWriter, UniquePartialPassesOverNamesLeftBehind) {
  test::TempDir dir("writer_left");
  const fs::path path = dir.path() / "l.safetensors";
  const std::string stem = path.string() + ".partial." + std::to_string(::getpid()) + "-";
  uint64_t next = 0;  // the name the next writer would take, learnt from one
  {
    auto probe = SafetensorsWriter::create(path, {{"t", DType::kU8, {1}}}, {},
                                           SafetensorsWriter::Partial::kUnique);
    ASSERT_TRUE(probe.is_ok()) << probe.status().message();
    const std::vector<std::string> names = test::list_dir(dir.path());
    ASSERT_EQ(names.size(), 1u);
    next = std::stoull(names[0].substr(names[0].rfind('-') + 1)) + 1;
  }  // abandoned: its partial file goes away
  for (uint64_t k = next; k < next + 300; ++k) std::ofstream(stem + std::to_string(k)) << "left";
  const Status written = write_unique(path);
  ASSERT_TRUE(written.is_ok()) << written.message();
  EXPECT_EQ(test::list_dir(dir.path()).size(), 301u);
  EXPECT_EQ(test::read_file(stem + std::to_string(next)), "left");
}

// Partial files of killed writers (their process gone, the file unchanged for 10 minutes) are
// removed by the next unique writer of the same path; everything else is left.
TEST(SafetensorsWriter, UniqueWriterRemovesPartialsOfDeadWriters) {
  test::TempDir dir("writer_dead");
  const fs::path path = dir.path() / "d.safetensors";
  const pid_t dead = ::fork();  // a pid that has just ended
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  const std::string of_dead = path.string() + ".partial." + std::to_string(dead) + "-";
  const auto write = [](const std::string& name, bool old) {
    std::ofstream(name) << "left";
    if (old) fs::last_write_time(name, fs::file_time_type::clock::now() - std::chrono::hours(1));
  };
  write(of_dead + "0", true);    // removed
  write(path.string() + ".partial." + std::to_string(::getpid()) + "-900", true);  // removed:
  // this pid's, from an earlier process of it (a container's PID 1), 10 minutes old
  write(of_dead + "1", false);   // recent: kept (its writer may be of another pid namespace)
  write(of_dead + "2x", true);   // not a partial name: kept
  write(path.string() + ".partial." + std::to_string(::getppid()) + "-0", true);  // alive: kept
  write((dir.path() / "e.safetensors.partial.").string() + std::to_string(dead) + "-0", true);
  write(path.string() + ".partial.0" + std::to_string(dead) + "-0", true);  // not as written
  write((dir.path() / "target").string(), true);  // an old file behind a symlink: kept, both
  fs::create_symlink(dir.path() / "target", of_dead + "3");
  const Status written = write_unique(path);
  ASSERT_TRUE(written.is_ok()) << written.message();
  const std::string dead_id = std::to_string(dead), parent_id = std::to_string(::getppid());
  std::vector<std::string> kept = {"d.safetensors", "d.safetensors.partial." + dead_id + "-1",
                                   "d.safetensors.partial." + dead_id + "-2x",
                                   "d.safetensors.partial." + parent_id + "-0",
                                   "e.safetensors.partial." + dead_id + "-0",
                                   "d.safetensors.partial.0" + dead_id + "-0",
                                   "d.safetensors.partial." + dead_id + "-3", "target"};
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(test::list_dir(dir.path()), kept);
}

TEST(SafetensorsWriter, IoFailureIsARuntimeErrorNamingTheFile) {
  const fs::path path = "/nonexistent-ktier-dir/sub/z.safetensors";
  auto w = SafetensorsWriter::create(path, {{"t", DType::kU8, {3}}});
  ASSERT_FALSE(w.is_ok());
  EXPECT_EQ(w.status().exit_code(), 1);
  EXPECT_NE(w.status().message().find("z.safetensors.partial"), std::string::npos) << w.status().message();
}

// A header no reader would open (format::kMaxHeaderBytes) is refused before a file exists.
TEST(SafetensorsWriter, RefusesAHeaderOverTheReadersLimit) {
  test::TempDir dir("writer_header");
  const std::string long_name(format::kMaxHeaderBytes, 'n');
  auto w = SafetensorsWriter::create(dir.path() / "h.safetensors", {{long_name, DType::kU8, {1}}});
  ASSERT_FALSE(w.is_ok());
  EXPECT_EQ(w.status().exit_code(), 2);
  EXPECT_NE(w.status().message().find("h.safetensors"), std::string::npos);
  EXPECT_TRUE(test::list_dir(dir.path()).empty());
}

TEST(SafetensorsWriter, RejectsInvalidDeclarations) {
  test::TempDir dir("writer_bad");
  const auto refused = [&](const char* file, const std::vector<TensorDecl>& decls,
                           const std::string& why) {
    const auto w = SafetensorsWriter::create(dir.path() / file, decls);
    ASSERT_FALSE(w.is_ok()) << why;
    EXPECT_NE(w.status().message().find(why), std::string::npos) << w.status().message();
  };
  refused("a", {{"t", DType::kU8, {1}}, {"t", DType::kU8, {1}}}, "tensor 't' is declared twice");
  refused("b", {{"__metadata__", DType::kU8, {1}}}, "'__metadata__' is reserved");
  refused("c", {{"", DType::kU8, {1}}}, "a tensor has an empty name");
  refused("d", {{"n", DType::kU8, {-1}}}, "tensor 'n' has a negative dimension");
  EXPECT_TRUE(test::list_dir(dir.path()).empty());
}

}  // namespace
}  // namespace ktier
