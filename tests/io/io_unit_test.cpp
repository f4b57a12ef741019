// Unit tests of the I/O layer's parts: ReadFile, AlignedBuffer, FaultPlan, RateLimiter, the
// factory and the CLI parsers.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "io/aligned_buffer.h"
#include "io/fault_plan.h"
#include "io/io_engine.h"
#include "io/rate_limiter.h"
#include "io/read_file.h"
#include "io_test_util.h"

namespace ktier::io::test {
namespace {

constexpr SizeLimit kAnySize{uint64_t{1} << 30, &Status::usage};

TEST(ReadFileTest, MissingFileIsRuntimeErrorNamingPath) {
  auto f = ReadFile::open("/tmp/ktier-io-test-does-not-exist.bin");
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().code(), ExitCode::kRuntime);
  EXPECT_NE(f.status().message().find("/tmp/ktier-io-test-does-not-exist.bin"), std::string::npos);
  EXPECT_NE(f.status().message().find("ENOENT"), std::string::npos) << f.status().message();
}

TEST(ReadFileTest, DirectoryIsRejected) {
  auto f = ReadFile::open("/tmp", DirectMode::kBuffered);
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().code(), ExitCode::kUsage);
  EXPECT_EQ(f.status().message(), "/tmp: is a directory, not a regular file");
}

// A FIFO is refused without waiting for a writer (a blocking open would wait forever), by every
// reader of the engine's input files; /dev/null is a device.
TEST(ReadFileTest, FifoAndDeviceAreRejectedWithoutBlocking) {
  const std::string fifo = "/tmp/ktier-readfile-fifo-" + std::to_string(::getpid());
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const DirectMode mode : {DirectMode::kAuto, DirectMode::kBuffered}) {
    auto f = ReadFile::open(fifo, mode);
    ASSERT_FALSE(f.is_ok());
    EXPECT_EQ(f.status().message(), fifo + ": is a FIFO (named pipe), not a regular file");
  }
  auto whole = read_regular_file(fifo, kAnySize);
  ASSERT_FALSE(whole.is_ok());
  EXPECT_EQ(whole.status().code(), ExitCode::kUsage);
  ::unlink(fifo.c_str());
  auto device = open_regular_file("/dev/null");
  ASSERT_FALSE(device.is_ok());
  EXPECT_EQ(device.status().message(), "/dev/null: is a device, not a regular file");
  // A regular file comes back blocking (io_uring reads of an O_NONBLOCK file could fail EAGAIN).
  TempFile tmp(random_bytes(100, 2), "readfile-flags");
  auto fd = open_regular_file(tmp.path());
  ASSERT_TRUE(fd.is_ok()) << fd.status().message();
  EXPECT_EQ(::fcntl(*fd, F_GETFL) & O_NONBLOCK, 0);
  ::close(*fd);
  auto bytes = read_regular_file(tmp.path(), kAnySize);
  ASSERT_TRUE(bytes.is_ok());
  EXPECT_EQ(bytes->size(), 100u);
}

// A file read whole is refused past its limit with the limit's error naming it: a file by its
// size, unread; one whose size says 0 (procfs) as soon as a read passes the limit. At the limit
// it is read.
TEST(ReadFileTest, AFileReadWholeIsRefusedPastItsLimit) {
  TempFile tmp(random_bytes(100, 4), "readfile-limit");
  auto exact = read_regular_file(tmp.path(), {100, &Status::corrupt});
  ASSERT_TRUE(exact.is_ok()) << exact.status().message();
  EXPECT_EQ(exact->size(), 100u);
  auto over = read_regular_file(tmp.path(), {99, &Status::corrupt});
  ASSERT_FALSE(over.is_ok());
  EXPECT_EQ(over.status().code(), ExitCode::kCorrupt);
  EXPECT_EQ(over.status().message(),
            tmp.path() + ": 100 bytes, more than the 99 bytes a file of its kind may hold");
  // A regular file whose size says 0 and whose reads give more (procfs; a file that grows
  // after its size was taken reads the same way).
  struct stat st {};
  ASSERT_EQ(::stat("/proc/self/maps", &st), 0);
  ASSERT_EQ(st.st_size, 0);
  auto unsized = read_regular_file("/proc/self/maps", {10, &Status::usage});
  ASSERT_FALSE(unsized.is_ok());
  EXPECT_EQ(unsized.status().code(), ExitCode::kUsage);
  EXPECT_EQ(unsized.status().message(),
            "/proc/self/maps: read past the 10 bytes a file of its kind may hold");
}

// Missing is false; what cannot be looked at is an error naming the path, never "missing".
TEST(ReadFileTest, PathExistsTellsMissingFromUnreachable) {
  TempFile tmp(random_bytes(10, 3), "path-exists");
  EXPECT_TRUE(*path_exists(tmp.path()));
  EXPECT_FALSE(*path_exists("/tmp/ktier-io-test-does-not-exist.bin"));
  EXPECT_FALSE(*path_exists(tmp.path() + "/below-a-file"));  // ENOTDIR
  const std::string loop = "/tmp/ktier-path-exists-loop-" + std::to_string(::getpid());
  ::unlink(loop.c_str());
  ASSERT_EQ(::symlink(loop.c_str(), loop.c_str()), 0);
  auto looped = path_exists(loop);
  ::unlink(loop.c_str());
  ASSERT_FALSE(looped.is_ok());
  EXPECT_EQ(looped.status().code(), ExitCode::kRuntime);
  EXPECT_EQ(looped.status().message(),
            loop + ": cannot access: Too many levels of symbolic links (ELOOP)");
}

TEST(ReadFileTest, ModesAndAlignment) {
  TempFile tmp(random_bytes(10000, 1), "readfile");
  auto buffered = ReadFile::open(tmp.path(), DirectMode::kBuffered);
  ASSERT_TRUE(buffered.is_ok());
  EXPECT_FALSE(buffered->direct());
  EXPECT_EQ(buffered->alignment(), 1u);
  EXPECT_EQ(buffered->size(), 10000u);
  EXPECT_EQ(buffered->path(), tmp.path());

  auto autod = ReadFile::open(tmp.path(), DirectMode::kAuto);
  ASSERT_TRUE(autod.is_ok());
  auto direct = ReadFile::open(tmp.path(), DirectMode::kDirect);
  if (!direct.is_ok()) {
    EXPECT_FALSE(autod->direct()) << "kAuto must fall back where kDirect fails";
    KTIER_IO_SKIP_IF(true, "O_DIRECT unavailable on /tmp: " + direct.status().message());
  }
  EXPECT_TRUE(direct->direct());
  EXPECT_TRUE(autod->direct());
  const uint32_t a = direct->alignment();
  EXPECT_GE(a, 512u);
  EXPECT_LE(a, kDefaultAlignment) << "AlignedBuffer's default would not satisfy this filesystem";
  EXPECT_EQ(a & (a - 1), 0u);
  std::printf("  /tmp: O_DIRECT works, alignment %u bytes\n", a);
  EXPECT_NE(direct->id(), autod->id());

  ReadFile moved = std::move(direct).value();
  EXPECT_TRUE(moved.is_open());
  EXPECT_TRUE(moved.direct());
}

TEST(ReadFileTest, FilesystemThatRefusesDirectIo) {
  // tmpfs refused O_DIRECT before Linux 6.6; where it still does, kAuto must fall back.
  const std::string path = "/dev/shm/ktier-io-test-" + std::to_string(getpid()) + ".bin";
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    KTIER_IO_SKIP_IF(f == nullptr, std::string("no writable /dev/shm"));
    std::fputs("hello", f);
    std::fclose(f);
  }
  auto direct = ReadFile::open(path, DirectMode::kDirect);
  auto autod = ReadFile::open(path, DirectMode::kAuto);
  std::remove(path.c_str());
  ASSERT_TRUE(autod.is_ok());
  if (direct.is_ok()) {
    EXPECT_TRUE(autod->direct());
    KTIER_IO_SKIP_IF(true, std::string("/dev/shm accepts O_DIRECT on this kernel; the fallback "
                                       "path is not reachable here"));
  }
  EXPECT_EQ(direct.status().code(), ExitCode::kRuntime);
  EXPECT_NE(direct.status().message().find("O_DIRECT"), std::string::npos);
  EXPECT_FALSE(autod->direct());
  EXPECT_EQ(autod->alignment(), 1u);
}

// procfs refuses O_DIRECT at open (EINVAL) on every kernel: kAuto reopens buffered, kDirect
// says why, naming the file. (statx's "no direct I/O" and the failed probe read, the other two
// refusals, need a filesystem that opens with O_DIRECT and then refuses: none is at hand here.)
TEST(ReadFileTest, ProcfsRefusesDirectIoAtOpen) {
  const std::string path = "/proc/version";
  auto buffered = ReadFile::open(path, DirectMode::kBuffered);
  KTIER_IO_SKIP_IF(!buffered.is_ok(), "no " + path + ": " + buffered.status().message());
  auto direct = ReadFile::open(path, DirectMode::kDirect);
  KTIER_IO_SKIP_IF(direct.is_ok(), path + " takes O_DIRECT on this kernel: the refusal at open is "
                                          "not reachable here");
  EXPECT_EQ(direct.status().code(), ExitCode::kRuntime);
  EXPECT_EQ(direct.status().message(),
            "O_DIRECT was requested for " + path + " but open with O_DIRECT failed: " +
                "Invalid argument (EINVAL) (use buffered I/O, or put the file on a filesystem "
                "such as ext4 or xfs)");
  auto autod = ReadFile::open(path, DirectMode::kAuto);
  ASSERT_TRUE(autod.is_ok()) << autod.status().message();
  EXPECT_TRUE(autod->is_open());
  EXPECT_FALSE(autod->direct());
  EXPECT_EQ(autod->alignment(), 1u);
}

TEST(AlignedBufferTest, AlignmentSizeAndCounting) {
  const uint64_t before = AlignedBuffer::live_bytes();
  {
    auto a = AlignedBuffer::allocate(5000);
    ASSERT_TRUE(a.is_ok());
    EXPECT_TRUE(is_aligned(a->data(), kDefaultAlignment));
    EXPECT_EQ(a->size(), 8192u);
    EXPECT_EQ(AlignedBuffer::live_bytes(), before + 8192);
    auto h = AlignedBuffer::allocate(3 << 20, kDefaultAlignment, HugePages::kYes);
    ASSERT_TRUE(h.is_ok());
    EXPECT_TRUE(is_aligned(h->data(), kHugePageBytes));
    EXPECT_EQ(h->size(), 4u << 20);
    EXPECT_EQ(AlignedBuffer::live_bytes(), before + 8192 + (4 << 20));
    AlignedBuffer moved = std::move(a).value();
    EXPECT_EQ(AlignedBuffer::live_bytes(), before + 8192 + (4 << 20));
    moved = AlignedBuffer();
    EXPECT_EQ(AlignedBuffer::live_bytes(), before + (4 << 20));
  }
  EXPECT_EQ(AlignedBuffer::live_bytes(), before);
  auto empty = AlignedBuffer::allocate(0);
  ASSERT_TRUE(empty.is_ok());
  EXPECT_TRUE(empty->empty());
}

TEST(AlignedBufferTest, HugeAllocationFailsWithStatus) {
#ifdef __SANITIZE_ADDRESS__
  GTEST_SKIP() << "AddressSanitizer aborts on a request past its allocator's limit";
#endif
  auto a = AlignedBuffer::allocate(size_t{1} << 62);
  ASSERT_FALSE(a.is_ok());
  EXPECT_EQ(a.status().code(), ExitCode::kRuntime);
}

TEST(AlignedBufferTest, AlignedCover) {
  const AlignedCover c = aligned_cover(20608, 1632, 4096, 1 << 20);
  EXPECT_EQ(c.offset, 20480u);
  EXPECT_EQ(c.length, 4096u);
  EXPECT_EQ(c.payload_offset, 128u);
  const AlignedCover d = aligned_cover(4000, 200, 4096, 1 << 20);
  EXPECT_EQ(d.offset, 0u);
  EXPECT_EQ(d.length, 8192u);
  // The last tensor of a file whose size is not a multiple of the alignment: the cover ends
  // with the file, so that the engine accepts the read.
  const AlignedCover e = aligned_cover(8200, 100, 4096, 8300);
  EXPECT_EQ(e.offset, 8192u);
  EXPECT_EQ(e.length, 108u);
  EXPECT_EQ(e.payload_offset, 8u);
}

TEST(FaultPlanTest, MatchingNthAndLimits) {
  FaultPlan plan;
  const size_t a = plan.add(FaultRule::eio(100, 200).in_path("shard-2").every(2).times(2));
  EXPECT_FALSE(plan.on_attempt("/m/shard-1", 100, 10).eio);  // other file
  EXPECT_FALSE(plan.on_attempt("/m/shard-2", 0, 100).eio);    // [0,100) misses [100,200)
  EXPECT_FALSE(plan.on_attempt("/m/shard-2", 150, 10).eio);   // 1st match
  EXPECT_TRUE(plan.on_attempt("/m/shard-2", 150, 10).eio);    // 2nd
  EXPECT_FALSE(plan.on_attempt("/m/shard-2", 199, 10).eio);   // 3rd
  EXPECT_TRUE(plan.on_attempt("/m/shard-2", 0, 101).eio);     // 4th
  EXPECT_FALSE(plan.on_attempt("/m/shard-2", 150, 10).eio);   // limit reached
  EXPECT_FALSE(plan.on_attempt("/m/shard-2", 150, 10).eio);
  EXPECT_EQ(plan.fires(a), 2u);

  plan.add(FaultRule::delay_by(std::chrono::microseconds(5)).times(-1));
  plan.add(FaultRule::short_read());
  const AttemptFaults f = plan.on_attempt("/x", 0, 1);
  EXPECT_EQ(f.delay, std::chrono::microseconds(5));
  EXPECT_TRUE(f.short_read);
  EXPECT_FALSE(plan.on_attempt("/x", 0, 1).short_read);

  plan.add(FaultRule::corrupt(10, 20, 0xFF));
  std::vector<CorruptSpan> spans;
  plan.on_chunk_done("/x", 15, 100, spans);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].begin, 15u);
  EXPECT_EQ(spans[0].end, 20u);
  EXPECT_EQ(spans[0].xor_mask, 0xFF);
  plan.clear();
  EXPECT_EQ(plan.total_fires(), 0u);
}

TEST(RateLimiterTest, PacesReads) {
  using namespace std::chrono;
  RateLimiter unlimited(0);
  const auto t0 = RateLimiter::Clock::now();
  EXPECT_EQ(unlimited.reserve(1 << 30, t0), t0);

  RateLimiter r(1'000'000);  // 1 MB/s: 1000 bytes per ms
  EXPECT_EQ(r.reserve(1000, t0), t0);
  EXPECT_EQ(r.reserve(1000, t0), t0 + milliseconds(1));
  EXPECT_EQ(r.reserve(500, t0), t0 + milliseconds(2));
  EXPECT_EQ(r.reserve(1, t0), t0 + microseconds(2500));
  // Idle time earns no burst credit.
  const auto later = t0 + seconds(10);
  EXPECT_EQ(r.reserve(1000, later), later);
  EXPECT_EQ(r.reserve(1000, later), later + milliseconds(1));
}

TEST(RateLimiterTest, GiveBackMovesLaterReadsUp) {
  using namespace std::chrono;
  const auto t0 = RateLimiter::Clock::now();
  RateLimiter r(1'000'000);  // 1 MB/s: 1000 bytes per ms
  EXPECT_EQ(r.reserve(1000, t0), t0);
  EXPECT_EQ(r.reserve(1000, t0), t0 + milliseconds(1));
  EXPECT_EQ(r.reserve(1000, t0), t0 + milliseconds(2));
  r.give_back(1000, t0 + milliseconds(2), t0);  // the last two will not be read
  r.give_back(1000, t0 + milliseconds(1), t0);
  EXPECT_EQ(r.reserve(1000, t0), t0 + milliseconds(1));  // [t0+1ms, t0+2ms)
  // A slot half elapsed gives back its other half; one elapsed gives back nothing.
  r.give_back(1000, t0 + milliseconds(1), t0 + microseconds(1500));
  EXPECT_EQ(r.reserve(1000, t0), t0 + microseconds(1500));  // [t0+1.5ms, t0+2.5ms)
  r.give_back(1000, t0, t0 + milliseconds(3));
  EXPECT_EQ(r.reserve(1000, t0), t0 + microseconds(2500));
  // Idle time earns no credit: a read still starts no earlier than now.
  EXPECT_EQ(r.reserve(1000, t0 + milliseconds(5)), t0 + milliseconds(5));
  EXPECT_EQ(r.reserve(1000, t0 + milliseconds(5)), t0 + milliseconds(6));
  RateLimiter unlimited(0);
  unlimited.give_back(1 << 20, t0, t0);
  EXPECT_EQ(unlimited.reserve(1 << 20, t0), t0);
}

TEST(IoFactoryTest, AutoPicksAWorkingEngineAndForcedPread) {
  IoOptions opt;
  auto e = make_io_engine(opt);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  const std::string name = (*e)->name();
  EXPECT_TRUE(name == "io_uring" || name == "pread") << name;
  std::printf("  auto engine here: %s\n", name.c_str());

  opt.backend = IoBackend::kPread;
  auto p = make_io_engine(opt);
  ASSERT_TRUE(p.is_ok());
  EXPECT_STREQ((*p)->name(), "pread");

  opt.backend = IoBackend::kUring;
  auto u = make_io_engine(opt);
  if (u.is_ok()) {
    EXPECT_STREQ((*u)->name(), "io_uring");
    EXPECT_EQ(name, "io_uring") << "auto must prefer io_uring where it works";
  } else {
    EXPECT_EQ(u.status().code(), ExitCode::kRuntime);
    EXPECT_EQ(name, "pread");
  }
}

TEST(IoFactoryTest, EmptyAndZeroLengthBatches) {
  auto e = make_io_engine(IoOptions{});
  ASSERT_TRUE(e.is_ok());
  TempFile tmp(random_bytes(100, 3), "empty");
  auto f = (*e)->open(tmp.path());
  ASSERT_TRUE(f.is_ok());
  EXPECT_TRUE(read_all(**e, {}).is_ok());
  const ReadRequest zero{&*f, 100, 0, nullptr, 5};
  CompletionQueue cq(**e);
  ASSERT_TRUE(cq.submit({&zero, 1}).is_ok());
  std::vector<Completion> done;
  EXPECT_EQ(cq.wait(1, done), 1u);
  EXPECT_EQ(done[0].tag, 5u);
  EXPECT_TRUE(done[0].status.is_ok());
  EXPECT_EQ(cq.wait(0, done), 0u) << "poll with nothing outstanding";
}

TEST(IoFactoryTest, ParseCliValues) {
  EXPECT_EQ(parse_io_backend("uring").value(), IoBackend::kUring);
  EXPECT_EQ(parse_io_backend("io_uring").value(), IoBackend::kUring);
  EXPECT_EQ(parse_io_backend("pread").value(), IoBackend::kPread);
  EXPECT_EQ(parse_io_backend("auto").value(), IoBackend::kAuto);
  EXPECT_EQ(parse_io_backend("aio").status().code(), ExitCode::kUsage);
  EXPECT_EQ(parse_io_backend("aio").status().message(),
            "--io: 'aio' is not one of auto, uring, pread");
}

}  // namespace
}  // namespace ktier::io::test
