// Engine behaviour on both engines: one test per fault the seam injects (issue 4, item 5), the
// rate cap, queue depth, out-of-order completions, cancellation, and several concurrent clients.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <thread>

#include "io/aligned_buffer.h"
#include "io/fault_plan.h"
#include "io/io_engine.h"
#include "io/uring_io_engine.h"
#include "io_test_util.h"
#include "tests/common/out_of_memory.h"

namespace ktier::io::test {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kFileBytes = 4ull << 20;

class IoFaultTest : public ::testing::TestWithParam<IoBackend> {
 protected:
  void SetUp() override {
    content_ = random_bytes(kFileBytes, 42);
    tmp_ = std::make_unique<TempFile>(content_, "fault");
    plan_ = std::make_shared<FaultPlan>();
  }

  // Engine with the fault plan attached; O_DIRECT where the filesystem allows it.
  std::unique_ptr<IoEngine> engine(IoOptions opt = {}) {
    opt.backend = GetParam();
    opt.fault_plan = plan_;
    std::string why;
    auto e = make_engine_or_skip(opt, &why);
    if (!e) skip_reason_ = why;
    return e;
  }
  ReadFile open(const IoEngine& e) { return open_path(e, tmp_->path()); }
  static ReadFile open_path(const IoEngine& e, const std::string& path) {
    auto f = e.open(path);
    EXPECT_TRUE(f.is_ok()) << f.status().message();
    return std::move(f).value();
  }
  // Reads [offset, offset + length) into a fresh aligned buffer; returns the completion.
  Completion read_one(IoEngine& e, const ReadFile& f, uint64_t offset, uint64_t length,
                      AlignedBuffer& out) {
    out = std::move(AlignedBuffer::allocate(length)).value();
    CompletionQueue cq(e);
    const ReadRequest r{&f, offset, length, out.data(), 7};
    EXPECT_TRUE(cq.submit({&r, 1}).is_ok());
    std::vector<Completion> done;
    cq.wait(1, done);
    EXPECT_EQ(done.size(), 1u);
    return done.empty() ? Completion{} : std::move(done[0]);
  }
  // Waits (up to 20 s) until rule `rule` has fired more than `before` times: a delay fires as
  // the engine takes a read, which from then on waits to start. Returns the fires seen.
  uint64_t wait_for_fires(size_t rule, uint64_t before) const {
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (plan_->fires(rule) <= before && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return plan_->fires(rule);
  }
  // `pages` reads of one 4096-byte page each from the start of `f`: page i into `buf` at
  // i * 4096 (buf holds `pages` pages at least), tagged i.
  static std::vector<ReadRequest> page_reads(const ReadFile& f, AlignedBuffer& buf,
                                             uint64_t pages) {
    std::vector<ReadRequest> batch;
    for (uint64_t i = 0; i < pages; ++i)
      batch.push_back({&f, i * 4096, 4096, buf.data() + i * 4096, i});
    return batch;
  }
  bool bytes_match(const AlignedBuffer& buf, uint64_t offset, uint64_t length) const {
    return std::memcmp(buf.data(), content_.data() + offset, length) == 0;
  }

  std::vector<uint8_t> content_;
  std::unique_ptr<TempFile> tmp_;
  std::shared_ptr<FaultPlan> plan_;
  std::string skip_reason_;
};

#define KTIER_ENGINE_OR_SKIP(var, ...)     \
  auto var = engine(__VA_ARGS__);          \
  KTIER_IO_SKIP_IF(!var, skip_reason_)

TEST_P(IoFaultTest, EioOnceIsRetriedAndSucceeds) {
  KTIER_ENGINE_OR_SKIP(e);
  ReadFile f = open(*e);
  const size_t rule = plan_->add(FaultRule::eio(65536, 65537));
  AlignedBuffer buf;
  const Completion c = read_one(*e, f, 65536, 65536, buf);
  EXPECT_TRUE(c.status.is_ok()) << c.status.message();
  EXPECT_EQ(c.tag, 7u);
  EXPECT_TRUE(bytes_match(buf, 65536, 65536));
  EXPECT_EQ(plan_->fires(rule), 1u);
  EXPECT_EQ(e->counters().retries, 1u);
  EXPECT_EQ(e->counters().requests_failed, 0u);
}

TEST_P(IoFaultTest, EioTwiceFailsNamingFileAndOffset) {
  KTIER_ENGINE_OR_SKIP(e);
  ReadFile f = open(*e);
  plan_->add(FaultRule::eio(65536, 65537).times(2));
  AlignedBuffer buf;
  const Completion c = read_one(*e, f, 65536, 65536, buf);
  ASSERT_FALSE(c.status.is_ok());
  EXPECT_EQ(c.status.code(), ExitCode::kRuntime);
  EXPECT_EQ(c.status.exit_code(), 1);
  const std::string& msg = c.status.message();
  EXPECT_NE(msg.find(tmp_->path()), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset 65536"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Input/output error"), std::string::npos) << msg;
  EXPECT_NE(msg.find("EIO"), std::string::npos) << msg;
  EXPECT_EQ(e->counters().requests_failed, 1u);
}

TEST_P(IoFaultTest, ShortReadsAreContinued) {
  for (DirectMode mode : {DirectMode::kAuto, DirectMode::kBuffered}) {
    plan_->clear();
    IoOptions opt;
    opt.direct = mode;
    KTIER_ENGINE_OR_SKIP(e, opt);
    ReadFile f = open(*e);
    // Three short reads in a row on one 1 MiB chunk (unaligned start under O_DIRECT, too).
    plan_->add(FaultRule::short_read().times(3));
    AlignedBuffer buf;
    const Completion c = read_one(*e, f, 1000, 1 << 20, buf);
    EXPECT_TRUE(c.status.is_ok()) << c.status.message();
    EXPECT_TRUE(bytes_match(buf, 1000, 1 << 20)) << direct_name(mode);
    EXPECT_GE(e->counters().short_reads, 3u) << direct_name(mode);
  }
}

TEST_P(IoFaultTest, DelayIsCorrectAndCountedAsWait) {
  KTIER_ENGINE_OR_SKIP(e);
  ReadFile f = open(*e);
  plan_->add(FaultRule::delay_by(std::chrono::milliseconds(150)));
  AlignedBuffer buf = std::move(AlignedBuffer::allocate(8192)).value();
  CompletionQueue cq(*e);
  const ReadRequest r{&f, 8192, 8192, buf.data(), 1};
  const auto t0 = Clock::now();
  ASSERT_TRUE(cq.submit({&r, 1}).is_ok());
  ASSERT_TRUE(cq.wait_all().is_ok());
  const auto elapsed = Clock::now() - t0;
  EXPECT_TRUE(bytes_match(buf, 8192, 8192));
  EXPECT_GE(elapsed, std::chrono::milliseconds(150));
  EXPECT_GE(cq.wait_ns(), 100'000'000u);
  EXPECT_GE(e->counters().wait_ns, 100'000'000u);
  EXPECT_GE(e->counters().busy_ns, 150'000'000u);
}

TEST_P(IoFaultTest, CorruptBytesAreDeliveredCorrupted) {
  KTIER_ENGINE_OR_SKIP(e);
  ReadFile f = open(*e);
  // Two bytes in the middle of a 64 KiB read get their top bit flipped.
  const uint64_t off = 3 * 65536, len = 65536, hit = off + 1000;
  plan_->add(FaultRule::corrupt(hit, hit + 2, 0x80));
  AlignedBuffer buf;
  const Completion c = read_one(*e, f, off, len, buf);
  ASSERT_TRUE(c.status.is_ok()) << "the seam corrupts silently; detection is the checksum's job";
  for (uint64_t i = 0; i < len; ++i) {
    const uint8_t want = content_[off + i] ^ ((off + i == hit || off + i == hit + 1) ? 0x80 : 0);
    ASSERT_EQ(buf.data()[i], want) << "at file offset " << off + i;
  }
  // What an upstream checksum (the pack's xxh3) would see:
  EXPECT_NE(XXH3_64bits(buf.data(), len), XXH3_64bits(content_.data() + off, len));
  EXPECT_EQ(e->counters().faults_injected, 1u);
}

TEST_P(IoFaultTest, EveryNthRequestRule) {
  IoOptions opt;
  opt.queue_depth = 1;  // attempts in a fixed order, so a retry is never the Nth
  KTIER_ENGINE_OR_SKIP(e, opt);
  ReadFile f = open(*e);
  // EIO on every 2nd read attempt of this file, 4 times: each failure is retried once.
  const size_t rule = plan_->add(FaultRule::eio().in_path("fault").every(2).times(4));
  std::vector<AlignedBuffer> bufs;
  std::vector<ReadRequest> batch;
  for (uint64_t i = 0; i < 8; ++i) {
    bufs.push_back(std::move(AlignedBuffer::allocate(4096)).value());
    batch.push_back({&f, i * 4096, 4096, bufs.back().data(), i});
  }
  ASSERT_TRUE(read_all(*e, batch).is_ok());
  for (uint64_t i = 0; i < 8; ++i) EXPECT_TRUE(bytes_match(bufs[i], i * 4096, 4096));
  EXPECT_EQ(plan_->fires(rule), 4u);
  EXPECT_EQ(e->counters().retries, 4u);
}

TEST_P(IoFaultTest, RateLimitCapsThroughput) {
  // 64 MB at 200 MB/s must take at least ~0.32 s (first chunk starts at once: >= 0.30 s).
  const std::vector<uint8_t> big = random_bytes(64ull << 20, 9);
  TempFile tmp(big, "rate");
  IoOptions opt;
  opt.rate_limit_bytes_per_s = 200'000'000;
  opt.direct = DirectMode::kBuffered;  // page cache: far faster than the cap on any machine
  KTIER_ENGINE_OR_SKIP(e, opt);
  auto f = e->open(tmp.path());
  ASSERT_TRUE(f.is_ok());
  auto buf = AlignedBuffer::allocate(big.size());
  ASSERT_TRUE(buf.is_ok());
  const ReadRequest r{&*f, 0, big.size(), buf->data(), 0};
  const auto t0 = Clock::now();
  ASSERT_TRUE(read_all(*e, {&r, 1}).is_ok());
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GE(seconds, 0.30);
  EXPECT_LT(seconds, 20.0);  // a hang guard only; the pacing math is RateLimiterTest's
  EXPECT_EQ(std::memcmp(buf->data(), big.data(), big.size()), 0);
  EXPECT_LE(e->counters().achieved_gbps(), 0.2 * 1.15);
}

TEST_P(IoFaultTest, CompletionsOutOfOrderMatchTags) {
  KTIER_ENGINE_OR_SKIP(e);
  ReadFile f = open(*e);
  // The first request is held back 200 ms; the other seven finish first.
  plan_->add(FaultRule::delay_by(std::chrono::milliseconds(200), 0, 1));
  std::vector<AlignedBuffer> bufs;
  std::vector<ReadRequest> batch;
  for (uint64_t i = 0; i < 8; ++i) {
    bufs.push_back(std::move(AlignedBuffer::allocate(65536)).value());
    batch.push_back({&f, i * 65536, 65536, bufs.back().data(), 100 + i});
  }
  CompletionQueue cq(*e);
  ASSERT_TRUE(cq.submit(batch).is_ok());
  std::vector<Completion> done;
  while (cq.outstanding() > 0) cq.wait(1, done);
  ASSERT_EQ(done.size(), 8u);
  EXPECT_EQ(done.back().tag, 100u) << "the delayed request should complete last";
  EXPECT_NE(done.front().tag, 100u);
  for (const Completion& c : done) {
    ASSERT_TRUE(c.status.is_ok());
    const uint64_t i = c.tag - 100;
    EXPECT_TRUE(bytes_match(bufs[i], i * 65536, 65536)) << "tag " << c.tag;
  }
}

TEST_P(IoFaultTest, QueueDepthReadsInParallel) {
  // 32 reads delayed 100 ms each: at most 16 at once, so two waves (>= 0.2 s); that they ran
  // side by side is the engine's count, not the wall clock (a loaded machine only slows it).
  IoOptions opt;
  opt.queue_depth = 16;
  KTIER_ENGINE_OR_SKIP(e, opt);
  ReadFile f = open(*e);
  plan_->add(FaultRule::delay_by(std::chrono::milliseconds(100)).times(-1));
  auto buf = std::move(AlignedBuffer::allocate(32 * 4096)).value();
  std::vector<ReadRequest> batch = page_reads(f, buf, 32);
  const auto t0 = Clock::now();
  ASSERT_TRUE(read_all(*e, batch).is_ok());
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GE(seconds, 0.19);
  const uint64_t peak = e->counters().peak_chunks_running;
  EXPECT_LE(peak, 16u);
  EXPECT_GE(peak, 8u) << "reads delayed 100 ms each should have run side by side";
  EXPECT_TRUE(bytes_match(buf, 0, 32 * 4096));
}

// A demand read overtakes queued read-ahead: with one read in flight at a time, a demand read
// submitted behind 4 read-ahead ones lands after the one running when it came (held 800 ms, the
// test's time to submit it), not after all 4; the others (400 ms each: the test's time to look
// after the demand read lands) then still all land, in their own order.
TEST_P(IoFaultTest, DemandReadsOvertakeQueuedReadAhead) {
  IoOptions opt;
  opt.queue_depth = 1;
  KTIER_ENGINE_OR_SKIP(e, opt);
  ReadFile f = open(*e);
  constexpr uint64_t kAhead = 4;
  plan_->add(FaultRule::delay_by(std::chrono::milliseconds(800), 0, 4096).times(-1));
  plan_->add(FaultRule::delay_by(std::chrono::milliseconds(400), 4096, kAhead * 4096).times(-1));
  auto buf = std::move(AlignedBuffer::allocate((kAhead + 1) * 4096)).value();
  const std::vector<ReadRequest> batch = page_reads(f, buf, kAhead);
  CompletionQueue ahead(*e, ReadPriority::kReadAhead), demand(*e);
  EXPECT_EQ(ahead.priority(), ReadPriority::kReadAhead);
  EXPECT_EQ(demand.priority(), ReadPriority::kDemand);
  ASSERT_TRUE(ahead.submit(batch).is_ok());
  const ReadRequest u{&f, kAhead * 4096, 4096, buf.data() + kAhead * 4096, 99};
  ASSERT_TRUE(demand.submit({&u, 1}).is_ok());
  std::vector<Completion> done;
  demand.wait(1, done);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.is_ok()) << done[0].status.message();
  done.clear();
  ahead.wait(0, done);
  EXPECT_LE(done.size(), 1u) << "read-ahead queued behind the running one landed before the demand";
  while (ahead.outstanding() > 0) ahead.wait(1, done);
  ASSERT_EQ(done.size(), kAhead);
  for (size_t i = 0; i < done.size(); ++i) {
    EXPECT_TRUE(done[i].status.is_ok()) << done[i].status.message();
    EXPECT_EQ(done[i].tag, i);  // one at a time, in submission order
  }
  EXPECT_TRUE(bytes_match(buf, 0, (kAhead + 1) * 4096));
}

// The same under the rate cap (`--io-rate-limit`): the engine cuts a chunk only once a read
// could start, so a demand read goes next, not after the read-ahead chunks it would otherwise
// have cut ahead and held for their slots (up to queue_depth of them: all 6 here).
TEST_P(IoFaultTest, DemandReadsOvertakeReadAheadUnderTheRateCap) {
  IoOptions opt;
  opt.queue_depth = 16;
  opt.rate_limit_bytes_per_s = 2 * 4096;  // 500 ms a read: a loaded machine's stalls fit
  opt.direct = DirectMode::kBuffered;     // the page cache: far faster than the cap
  KTIER_ENGINE_OR_SKIP(e, opt);
  ReadFile f = open(*e);
  constexpr uint64_t kAhead = 6;
  auto buf = std::move(AlignedBuffer::allocate((kAhead + 1) * 4096)).value();
  const std::vector<ReadRequest> batch = page_reads(f, buf, kAhead);
  CompletionQueue ahead(*e, ReadPriority::kReadAhead), demand(*e);
  ASSERT_TRUE(ahead.submit(batch).is_ok());
  std::vector<Completion> done;
  ahead.wait(1, done);  // the engine has taken the read-ahead in hand by now
  const ReadRequest u{&f, kAhead * 4096, 4096, buf.data() + kAhead * 4096, 99};
  ASSERT_TRUE(demand.submit({&u, 1}).is_ok());
  std::vector<Completion> demanded;
  demand.wait(1, demanded);
  ASSERT_EQ(demanded.size(), 1u);
  EXPECT_TRUE(demanded[0].status.is_ok()) << demanded[0].status.message();
  ahead.wait(0, done);
  // The first and the one cut before the demand came: 2, or 3 or 4 where this thread was up to
  // 1 s late (before the demand, or after it landed); all 6 when they were cut ahead.
  EXPECT_LE(done.size(), 4u) << "read-ahead cut ahead under the cap landed before the demand";
  while (ahead.outstanding() > 0) ahead.wait(1, done);
  ASSERT_EQ(done.size(), kAhead);
  for (const Completion& c : done) EXPECT_TRUE(c.status.is_ok()) << c.status.message();
  EXPECT_TRUE(bytes_match(buf, 0, (kAhead + 1) * 4096));
}

// The caller-side zero-copy pattern for the last tensor of a file whose size is not a multiple
// of the alignment: the cover stops at the end of the file, and the engine reads it.
TEST_P(IoFaultTest, AnAlignedCoverReadsToTheEndOfAFile) {
  KTIER_ENGINE_OR_SKIP(e);
  const std::vector<uint8_t> bytes = random_bytes(3 * 4096 + 300, 5);
  TempFile tmp(bytes, "cover");
  const ReadFile f = open_path(*e, tmp.path());
  const uint64_t offset = 2 * 4096 + 100, length = 4096 + 150;  // ends 50 bytes before the end
  const AlignedCover c = aligned_cover(offset, length, f.alignment(), f.size());
  AlignedBuffer out;
  const Completion done = read_one(*e, f, c.offset, c.length, out);
  ASSERT_TRUE(done.status.is_ok()) << done.status.message();
  EXPECT_EQ(std::memcmp(out.data() + c.payload_offset, bytes.data() + offset, length), 0);
}

TEST_P(IoFaultTest, CancelFailsRequestsNotStarted) {
  IoOptions opt;
  opt.queue_depth = 1;
  KTIER_ENGINE_OR_SKIP(e, opt);
  ReadFile f = open(*e);
  // The first read lands soon; each later one is held 500 ms, the test's time to cancel: the one
  // held when cancel() comes fails too (it has not started), and so do the 14 behind it; one
  // more lands only where the test thread was 500 ms late.
  plan_->add(FaultRule::delay_by(std::chrono::milliseconds(50), 0, 4096).times(-1));
  plan_->add(FaultRule::delay_by(std::chrono::milliseconds(500), 4096).times(-1));
  auto buf = std::move(AlignedBuffer::allocate(16 * 4096)).value();
  std::vector<ReadRequest> batch = page_reads(f, buf, 16);
  // Again with the cancel's first allocation refused (a queue's destructor cancels, noexcept):
  // the request whose message it was for fails all the same, with a shorter one.
  for (const bool short_of_memory : {false, true}) {
    SCOPED_TRACE(short_of_memory ? "an allocation refused" : "memory enough");
    CompletionQueue cq(*e);
    ASSERT_TRUE(cq.submit(batch).is_ok());
    std::vector<Completion> done;
    cq.wait(1, done);
    if (short_of_memory) ktier::test::fail_allocation_after(0);
    cq.cancel();
    EXPECT_FALSE(ktier::test::allocation_failure_pending());
    ktier::test::fail_allocation_after(-1);
    while (cq.outstanding() > 0) cq.wait(1, done);
    ASSERT_EQ(done.size(), 16u);
    size_t cancelled = 0, short_messages = 0;
    for (const Completion& c : done) {
      if (c.status.is_ok()) {
        EXPECT_EQ(std::memcmp(buf.data() + c.tag * 4096, content_.data() + c.tag * 4096, 4096),
                  0);
      } else {
        ++cancelled;
        EXPECT_NE(c.status.message().find("cancelled"), std::string::npos) << c.status.message();
        short_messages += c.status.message() == "read cancelled";
      }
    }
    EXPECT_GE(cancelled, 14u);
    EXPECT_EQ(short_messages, short_of_memory ? 1u : 0u);
  }
}

// A read the engine has taken but holds back (an injected delay here; the rate limit below) has
// not started: cancel(), or the queue's destructor, fails it at once instead of waiting out the
// hold. (Ctrl-C under --io-rate-limit waited for every read the limit had scheduled.) Were the
// hold waited out, the read would be made and succeed, which the checks below refuse.
TEST_P(IoFaultTest, CancelReachesAReadWaitingToStart) {
  KTIER_ENGINE_OR_SKIP(e);
  ReadFile f = open(*e);
  const size_t delayed = plan_->add(FaultRule::delay_by(std::chrono::seconds(30)).times(-1));
  auto buf = std::move(AlignedBuffer::allocate(4096)).value();
  const ReadRequest r{&f, 0, 4096, buf.data(), 3};
  for (const bool by_destructor : {false, true}) {
    SCOPED_TRACE(by_destructor ? "the queue freed" : "cancel()");
    const uint64_t fired = plan_->fires(delayed);
    auto cq = std::make_unique<CompletionQueue>(*e);
    ASSERT_TRUE(cq->submit({&r, 1}).is_ok());
    ASSERT_EQ(wait_for_fires(delayed, fired), fired + 1) << "the engine never took the read";
    if (by_destructor) {
      cq.reset();  // returns once the read has failed
      continue;
    }
    cq->cancel();
    std::vector<Completion> done;
    cq->wait(1, done);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].tag, 3u);
    EXPECT_FALSE(done[0].status.is_ok());
    EXPECT_NE(done[0].status.message().find("cancelled (its reader cancelled it)"),
              std::string::npos)
        << done[0].status.message();
  }
  const IoCounters c = e->counters();
  EXPECT_EQ(c.reads_issued, 0u);
  EXPECT_EQ(c.requests_failed, 2u);
}

// A held read cancelled frees its place in the queue depth: a read of another queue waiting for
// that place is then made, not left until something else wakes the engine.
TEST_P(IoFaultTest, ACancelledHeldReadLetsTheNextQueueIn) {
  IoOptions opt;
  opt.queue_depth = 1;
  KTIER_ENGINE_OR_SKIP(e, opt);
  ReadFile f = open(*e);
  const size_t delayed = plan_->add(FaultRule::delay_by(std::chrono::seconds(30), 0, 4096));
  auto buf = std::move(AlignedBuffer::allocate(2 * 4096)).value();
  auto held = std::make_unique<CompletionQueue>(*e);
  const ReadRequest first{&f, 0, 4096, buf.data(), 1};
  ASSERT_TRUE(held->submit({&first, 1}).is_ok());
  ASSERT_EQ(wait_for_fires(delayed, 0), 1u) << "the engine never took the first read";
  CompletionQueue next(*e);
  const ReadRequest second{&f, 4096, 4096, buf.data() + 4096, 2};
  ASSERT_TRUE(next.submit({&second, 1}).is_ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the engine looks, and waits
  held.reset();
  std::atomic<bool> landed{false};
  std::thread waiter([&] {
    std::vector<Completion> done;
    next.wait(1, done);
    landed = done.size() == 1 && done[0].status.is_ok() && done[0].tag == 2;
  });
  const auto until = Clock::now() + std::chrono::seconds(20);
  while (next.outstanding() > 0 && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const bool stuck = next.outstanding() > 0;
  if (stuck) {  // wake the engine with a third read, so that the waiter can be joined
    AlignedBuffer b;
    read_one(*e, f, 8192, 4096, b);
  }
  waiter.join();
  EXPECT_FALSE(stuck) << "the second queue's read waited for an unrelated wake";
  EXPECT_TRUE(landed.load());
  EXPECT_EQ(std::memcmp(buf.data() + 4096, content_.data() + 4096, 4096), 0);
}

TEST_P(IoFaultTest, CancelReachesReadsTheRateLimitHolds) {
  IoOptions opt;
  opt.queue_depth = 4;
  opt.rate_limit_bytes_per_s = 1024;  // 4 s a read: the first starts at once, the rest queue
  KTIER_ENGINE_OR_SKIP(e, opt);
  ReadFile f = open(*e);
  auto buf = std::move(AlignedBuffer::allocate(16 * 4096)).value();
  std::vector<ReadRequest> batch = page_reads(f, buf, 16);
  CompletionQueue cq(*e);
  ASSERT_TRUE(cq.submit(batch).is_ok());
  std::vector<Completion> done;
  cq.wait(1, done);  // the first; the next is cut 4 s after it
  cq.cancel();
  while (cq.outstanding() > 0) cq.wait(1, done);
  ASSERT_EQ(done.size(), 16u);
  size_t landed = 0;
  for (const Completion& c : done) {
    if (c.status.is_ok()) {
      ++landed;
      EXPECT_EQ(std::memcmp(buf.data() + c.tag * 4096, content_.data() + c.tag * 4096, 4096), 0);
    } else {
      EXPECT_NE(c.status.message().find("cancelled"), std::string::npos) << c.status.message();
    }
  }
  // One, or two where the test thread was late by a whole 4 s.
  EXPECT_GE(landed, 1u);
  EXPECT_LE(landed, 2u);
}

// A short read's continuation reserves a new slot of the rate cap and waits for it; a cancel
// reaches it there (the read fails as cancelled, without waiting out the slot or reading).
TEST_P(IoFaultTest, CancelReachesAContinuationTheRateCapHolds) {
  IoOptions opt;
  opt.queue_depth = 1;
  opt.rate_limit_bytes_per_s = 1024;  // the first attempt's 4 s slot starts at once
  opt.direct = DirectMode::kBuffered;
  KTIER_ENGINE_OR_SKIP(e, opt);
  ReadFile f = open(*e);
  const size_t rule = plan_->add(FaultRule::short_read().times(1));
  auto buf = std::move(AlignedBuffer::allocate(4096)).value();
  CompletionQueue cq(*e);
  const ReadRequest r{&f, 0, 4096, buf.data(), 1};
  ASSERT_TRUE(cq.submit({&r, 1}).is_ok());
  ASSERT_GE(wait_for_fires(rule, 0), 1u);  // the short read came: its rest waits ~4 s
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  cq.cancel();
  std::vector<Completion> done;
  cq.wait(1, done);
  ASSERT_EQ(done.size(), 1u);
  ASSERT_FALSE(done[0].status.is_ok()) << "the continuation waited out its slot and read";
  EXPECT_NE(done[0].status.message().find("cancelled"), std::string::npos)
      << done[0].status.message();
  EXPECT_EQ(e->counters().short_reads, 1u);
}

// A reader may free its queue while a read it submitted is still running (an engine torn down
// after a failed read does): the queue's destructor waits for that read's completion, and the
// engine thread that delivers it must be done with the queue before the destructor can return.
// Here the read is taken and held by its delay when the queue is freed, so the cancel fails it
// and an engine thread delivers that while the destructor waits.
// tools/tsan-inflate.sh runs this case under ThreadSanitizer, which reports any touch of the
// queue that is not ordered before its destruction.
TEST_P(IoFaultTest, QueueFreedWhileItsReadIsRunning) {
  KTIER_ENGINE_OR_SKIP(e);
  ReadFile f = open(*e);
  const size_t delayed = plan_->add(FaultRule::delay_by(std::chrono::milliseconds(4)).times(-1));
  auto buf = std::move(AlignedBuffer::allocate(4096)).value();
  for (uint64_t i = 0; i < 40; ++i) {
    auto cq = std::make_unique<CompletionQueue>(*e);
    const ReadRequest r{&f, (i % 64) * 4096, 4096, buf.data(), i};
    ASSERT_TRUE(cq->submit({&r, 1}).is_ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the read starts, then waits
    // Cancels the read if it has not started (held by its delay: the engine thread wakes and
    // delivers the failure), waits for it if it has: either way an engine thread delivers to
    // the queue while its destructor waits.
    cq.reset();
  }
  EXPECT_GT(plan_->fires(delayed), 0u) << "no read was taken before its queue was freed";
  // Every read that started has ended: the engine serves a new queue, with the file's bytes.
  plan_->clear();
  AlignedBuffer check;
  const Completion c = read_one(*e, f, 8192, 4096, check);
  ASSERT_TRUE(c.status.is_ok()) << c.status.message();
  EXPECT_EQ(c.tag, 7u);
  EXPECT_TRUE(bytes_match(check, 8192, 4096));
}

// Two threads waiting on one queue for the one read outstanding (the contract lets any thread
// wait): one takes it, the other returns with none instead of waiting for a completion that
// will never come. The read is delayed (1 s) so that both wait before it lands, even on a
// loaded machine.
TEST_P(IoFaultTest, TwoWaitersOnOneQueueBothReturn) {
  KTIER_ENGINE_OR_SKIP(e);
  ReadFile f = open(*e);
  const size_t delayed = plan_->add(FaultRule::delay_by(std::chrono::seconds(1)));
  auto buf = std::move(AlignedBuffer::allocate(2 * 4096)).value();
  CompletionQueue cq(*e);
  const ReadRequest r{&f, 0, 4096, buf.data(), 1};
  ASSERT_TRUE(cq.submit({&r, 1}).is_ok());
  std::atomic<int> returned{0};
  std::atomic<size_t> taken{0};
  const auto waiter = [&] {
    std::vector<Completion> done;
    taken += cq.wait(1, done);
    ++returned;
  };
  std::thread a(waiter), b(waiter);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (returned < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const bool both = returned == 2;
  if (!both) {  // free the stuck waiter with a second read, so that the threads can be joined
    const ReadRequest again{&f, 4096, 4096, buf.data() + 4096, 2};
    EXPECT_TRUE(cq.submit({&again, 1}).is_ok());
  }
  a.join();
  b.join();
  EXPECT_TRUE(both) << "a waiter still waited for a completion another took";
  EXPECT_EQ(plan_->fires(delayed), 1u);
  if (both) {
    EXPECT_EQ(taken.load(), 1u);
  }
  EXPECT_EQ(cq.outstanding(), 0u);
}

TEST_P(IoFaultTest, FileShrunkWhileRunningIsRuntimeError) {
  KTIER_ENGINE_OR_SKIP(e);
  ReadFile f = open(*e);
  ASSERT_EQ(truncate(tmp_->path().c_str(), 8192), 0);
  AlignedBuffer buf;
  const Completion c = read_one(*e, f, 65536, 4096, buf);
  ASSERT_FALSE(c.status.is_ok());
  EXPECT_EQ(c.status.code(), ExitCode::kRuntime);
  EXPECT_NE(c.status.message().find(tmp_->path()), std::string::npos) << c.status.message();
  EXPECT_NE(c.status.message().find("ends at or before offset 65536"), std::string::npos)
      << c.status.message();
}

// The end moves into the middle of a read, off any alignment: the first attempt returns the
// bytes before it, and the continuation (which O_DIRECT restarts on an aligned boundary, so it
// re-reads some of them) must fail, not retry the same short read for ever.
TEST_P(IoFaultTest, FileShrunkInsideAReadIsRuntimeError) {
  const uint64_t new_size = 65536 + 4096 + 1000;
  for (DirectMode mode : {DirectMode::kAuto, DirectMode::kBuffered}) {
    IoOptions opt;
    opt.direct = mode;
    KTIER_ENGINE_OR_SKIP(e, opt);
    // Opened at full size (the request passes the submit check), then cut.
    ASSERT_EQ(truncate(tmp_->path().c_str(), static_cast<off_t>(kFileBytes)), 0);
    ReadFile f = open(*e);
    ASSERT_EQ(truncate(tmp_->path().c_str(), static_cast<off_t>(new_size)), 0);
    if (mode == DirectMode::kAuto && !f.direct())
      std::printf("[note] no O_DIRECT for %s: the aligned-continuation case is not exercised\n",
                  tmp_->path().c_str());
    AlignedBuffer buf;
    const Completion c = read_one(*e, f, 65536, 16384, buf);
    ASSERT_FALSE(c.status.is_ok()) << direct_name(mode);
    EXPECT_EQ(c.status.code(), ExitCode::kRuntime);
    EXPECT_NE(c.status.message().find(tmp_->path()), std::string::npos) << c.status.message();
    EXPECT_NE(c.status.message().find("ends at or before offset " + std::to_string(new_size)),
              std::string::npos)
        << c.status.message();
  }
}

TEST_P(IoFaultTest, PastEndOfFileIsRejectedAtSubmit) {
  KTIER_ENGINE_OR_SKIP(e);
  ReadFile f = open(*e);
  auto buf = std::move(AlignedBuffer::allocate(8192)).value();
  const ReadRequest batch[] = {{&f, 0, 4096, buf.data(), 0},
                               {&f, kFileBytes - 100, 4096, buf.data() + 4096, 1}};
  CompletionQueue cq(*e);
  const Status s = cq.submit(batch);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), ExitCode::kCorrupt);
  EXPECT_NE(s.message().find(tmp_->path()), std::string::npos) << s.message();
  EXPECT_EQ(cq.outstanding(), 0u) << "a rejected batch queues nothing";
}

// A submit whose allocation fails, at each allocation it makes in turn, queues nothing: its
// queue counts nothing (nor waits, when destroyed, for reads that never come) and the engine
// reads nothing of it; once no allocation fails, the batch reads its bytes, alone.
TEST_P(IoFaultTest, SubmitThatRunsOutOfMemoryQueuesNothing) {
  KTIER_ENGINE_OR_SKIP(e);
  ReadFile f = open(*e);
  auto buf = std::move(AlignedBuffer::allocate(3 * 4096)).value();
  const ReadRequest batch[] = {{&f, 0, 4096, buf.data(), 0},
                               {&f, 8192, 4096, buf.data() + 4096, 1},
                               {&f, 4096, 0, buf.data() + 8192, 2}};  // empty: delivered at once
  // Every allocation in turn; a fresh queue after each failure.
  std::optional<CompletionQueue> cq(std::in_place, *e);
  const long failures = ktier::test::fail_allocations_in_turn(
      "IoFaultTest.SubmitThatRunsOutOfMemoryQueuesNothing", 1, [&] { return cq->submit(batch); },
      [&](long k, const Status& s) {
        // Thrown, or an error: never an ok that queued nothing.
        EXPECT_FALSE(s.is_ok()) << "allocation " << k << " failed, and submit said ok";
        EXPECT_EQ(cq->outstanding(), 0u) << "allocation " << k << " failed: nothing may be queued";
        cq.emplace(*e);
      });
  ASSERT_TRUE(cq->wait_all().is_ok());
  EXPECT_GT(failures, 0);
  EXPECT_TRUE(bytes_match(buf, 0, 4096));
  EXPECT_EQ(std::memcmp(buf.data() + 4096, content_.data() + 8192, 4096), 0);
  EXPECT_EQ(e->counters().requests_completed, 3u) << "only the batch that got through was read";
}

TEST_P(IoFaultTest, ConcurrentClientsOnOneEngine) {
  // Four threads, each with its own queue, share one engine (the trunk reader and the expert
  // prefetcher will). Each sees exactly its own completions, with the right bytes.
  IoOptions opt;
  opt.queue_depth = 8;
  opt.max_chunk_bytes = 64 << 10;
  KTIER_ENGINE_OR_SKIP(e, opt);
  ReadFile f = open(*e);
  constexpr int kThreads = 4, kRounds = 20, kPerRound = 6;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      CompletionQueue cq(*e);
      uint64_t state = 1000 + t;
      for (int round = 0; round < kRounds; ++round) {
        std::vector<std::vector<uint8_t>> bufs(kPerRound);
        std::vector<ReadRequest> batch;
        for (int i = 0; i < kPerRound; ++i) {
          const uint64_t len = 1 + splitmix64(state) % 200000;
          const uint64_t off = splitmix64(state) % (kFileBytes - len);
          bufs[i].resize(len);
          batch.push_back({&f, off, len, bufs[i].data(), uint64_t(t) << 32 | uint64_t(i)});
        }
        if (!cq.submit(batch).is_ok()) ++failures;
        std::vector<Completion> done;
        while (cq.outstanding() > 0) cq.wait(2, done);
        if (done.size() != batch.size()) ++failures;
        for (const Completion& c : done) {
          const uint64_t i = c.tag & 0xffffffff;
          if ((c.tag >> 32) != uint64_t(t) || i >= batch.size() || !c.status.is_ok() ||
              std::memcmp(bufs[i].data(), content_.data() + batch[i].offset, batch[i].length)) {
            ++failures;
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(e->counters().requests_completed, uint64_t{kThreads * kRounds * kPerRound});
}

// Registration scales to a large expert tier's arena (hundreds of GiB, one slot per GiB): 200
// separately registered regions — more than the 64-slot table this engine once had — each take
// fixed-buffer reads (io_uring; the pread engine registers nothing and reads all the same).
TEST_P(IoFaultTest, ManyRegisteredRegionsEachTakeFixedReads) {
  KTIER_ENGINE_OR_SKIP(e);
  if (GetParam() == IoBackend::kUring && !static_cast<UringIoEngine&>(*e).buffers_registered())
    GTEST_SKIP() << "this kernel refused io_uring's registered-buffer table";
  const ReadFile f = open(*e);
  constexpr int kRegions = 200;
  constexpr uint64_t kBytes = 4096;
  std::vector<AlignedBuffer> regions;
  for (int i = 0; i < kRegions; ++i) {
    regions.push_back(std::move(AlignedBuffer::allocate(kBytes)).value());
    ASSERT_TRUE(e->register_buffer(regions.back().data(), kBytes).is_ok()) << "region " << i;
  }
  std::vector<ReadRequest> reads;
  for (int i = 0; i < kRegions; ++i)
    reads.push_back({&f, static_cast<uint64_t>(i) * kBytes, kBytes, regions[i].data(),
                     static_cast<uint64_t>(i)});
  CompletionQueue cq(*e);
  ASSERT_TRUE(cq.submit(reads).is_ok());
  std::vector<Completion> done;
  while (cq.outstanding() > 0) cq.wait(1, done);
  ASSERT_EQ(done.size(), static_cast<size_t>(kRegions));
  for (const Completion& c : done) {
    ASSERT_TRUE(c.status.is_ok()) << c.status.message();
    EXPECT_TRUE(bytes_match(regions[c.tag], c.tag * kBytes, kBytes)) << "region " << c.tag;
  }
  if (GetParam() == IoBackend::kUring) {
    EXPECT_EQ(e->counters().fixed_reads, static_cast<uint64_t>(kRegions));
  }
  for (AlignedBuffer& b : regions) e->unregister_buffer(b.data());
  // One buffer registered as two adjacent halves: a read inside the second half is fixed, one
  // across the seam is not (it lies in no single region), and both deliver the bytes; a region
  // overlapping a registered one is refused.
  auto two = AlignedBuffer::allocate(4 * kBytes);
  ASSERT_TRUE(two.is_ok());
  ASSERT_TRUE(e->register_buffer(two->data(), 2 * kBytes).is_ok());
  ASSERT_TRUE(e->register_buffer(two->data() + 2 * kBytes, 2 * kBytes).is_ok());
  if (GetParam() == IoBackend::kUring) {
    EXPECT_FALSE(e->register_buffer(two->data() + kBytes, 2 * kBytes).is_ok());
  }
  const uint64_t fixed = e->counters().fixed_reads;
  const ReadRequest inside{&f, 0, kBytes, two->data() + 3 * kBytes, 0};
  const ReadRequest seam{&f, kBytes, 2 * kBytes, two->data() + kBytes, 1};
  ASSERT_TRUE(cq.submit({&inside, 1}).is_ok());
  ASSERT_TRUE(cq.submit({&seam, 1}).is_ok());
  done.clear();
  while (cq.outstanding() > 0) cq.wait(1, done);
  ASSERT_EQ(done.size(), 2u);
  for (const Completion& c : done) ASSERT_TRUE(c.status.is_ok()) << c.status.message();
  EXPECT_EQ(std::memcmp(two->data() + 3 * kBytes, content_.data(), kBytes), 0);
  EXPECT_EQ(std::memcmp(two->data() + kBytes, content_.data() + kBytes, 2 * kBytes), 0);
  if (GetParam() == IoBackend::kUring) {
    EXPECT_EQ(e->counters().fixed_reads - fixed, 1u) << "the read inside the second half only";
  }
  e->unregister_buffer(two->data());
  e->unregister_buffer(two->data() + 2 * kBytes);
}

// More files than the registered-file table holds (io_uring reuses the slots of files with no
// read in flight): every file's bytes arrive, in two rounds, with reads of several files in flight.
TEST_P(IoFaultTest, MoreFilesThanRegisteredSlotsReadCorrectly) {
  KTIER_ENGINE_OR_SKIP(e);
  constexpr int kFiles = 300;
  constexpr uint64_t kBytes = 4096;
  std::vector<std::unique_ptr<TempFile>> files;
  std::vector<ReadFile> opened;
  for (int i = 0; i < kFiles; ++i) {
    files.push_back(std::make_unique<TempFile>(random_bytes(kBytes, 1000 + i), "many" + std::to_string(i)));
    opened.push_back(open_path(*e, files.back()->path()));
  }
  auto dst = AlignedBuffer::allocate(kFiles * kBytes);
  ASSERT_TRUE(dst.is_ok());
  for (int round = 0; round < 2; ++round) {
    std::memset(dst->data(), 0, dst->size());
    CompletionQueue cq(*e);
    for (int first = 0; first < kFiles; first += 50) {  // batches: reads of 50 files in flight
      std::vector<ReadRequest> batch;
      for (int i = first; i < std::min(kFiles, first + 50); ++i)
        batch.push_back({&opened[i], 0, kBytes, dst->data() + i * kBytes, static_cast<uint64_t>(i)});
      ASSERT_TRUE(cq.submit(batch).is_ok());
    }
    std::vector<Completion> done;
    while (cq.outstanding() > 0) cq.wait(1, done);
    ASSERT_EQ(done.size(), static_cast<size_t>(kFiles));
    for (const Completion& c : done) ASSERT_TRUE(c.status.is_ok()) << c.status.message();
    for (int i = 0; i < kFiles; ++i) {
      const std::vector<uint8_t> want = random_bytes(kBytes, 1000 + i);
      ASSERT_EQ(std::memcmp(dst->data() + i * kBytes, want.data(), kBytes), 0) << "file " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, IoFaultTest,
                         ::testing::Values(IoBackend::kUring, IoBackend::kPread),
                         [](const auto& info) { return std::string(backend_name(info.param)); });

}  // namespace
}  // namespace ktier::io::test
