#pragma once
// Internal to src/io: the part of an IoEngine that does not depend on how a read reaches the
// kernel. It owns the request queue, cuts requests into chunks, decides each read attempt (the
// aligned position, faults, the rate limit), interprets results (short reads, retries, EOF),
// copies bounce buffers out, and delivers completions. A backend (PreadIoEngine,
// UringIoEngine) only moves attempts to the kernel and results back:
//
//   auto chunk = take_chunk(...);                     // FIFO; holds an in-flight slot
//   for (;;) {
//     Attempt a = plan_attempt(*chunk);
//     if (!wait_to_start(*chunk, a)) break;           // until a.not_before, unless cancelled
//     int64_t res = a.inject_eio ? -EIO : pread(file fd, a.buf, a.length, a.file_offset);
//     if (on_result(*chunk, a, res) == Step::kDone) break;
//   }
//   finish_chunk(std::move(chunk));
//
// Thread-safety: take_chunk / plan_attempt / wait_to_start / abandon_if_cancelled / on_result /
// finish_chunk may be called from any number of backend threads, each for chunks it holds; a
// Chunk is used by one thread at a time.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "io/aligned_buffer.h"
#include "io/io_engine.h"
#include "io/rate_limiter.h"

namespace ktier::io::detail {

using Clock = std::chrono::steady_clock;

// Retries of EINTR / EAGAIN before they count as an error. The kernel returns EAGAIN for a
// full device queue; EAGAIN retries wait kTransientBackoff (100 us) each, so a stall of about
// 0.4 s is given up on (EINTR retries at once).
inline constexpr uint32_t kMaxTransientRetries = 4096;
// Error retries per chunk before its request fails (the "retried once" rule of issue 4).
inline constexpr uint32_t kMaxErrorRetries = 1;
// Short reads in a row that bring no new byte before the file counts as ended there. Under
// O_DIRECT a continuation restarts on an aligned boundary below what was read, so a file that
// ends inside a chunk returns the same few bytes again instead of 0; a short read that merely
// stopped early (rare, but allowed) brings new bytes on the next try.
inline constexpr uint32_t kMaxStalledReads = 4;
// Pause before repeating an attempt that got EAGAIN, so a full device queue is not spun on.
inline constexpr std::chrono::microseconds kTransientBackoff{100};
// Largest single read: io_uring takes a 32-bit length, Linux pread moves at most 2 GiB - 4 KiB,
// and a registered buffer may not exceed 1 GiB.
inline constexpr uint64_t kMaxReadBytes = uint64_t{1} << 30;

struct Request {
  ReadRequest read;
  CompletionQueue* cq = nullptr;
  uint64_t next_offset = 0;     // chunking cursor, absolute file offset
  uint32_t chunks_running = 0;  // chunks taken and not finished
  Status error;                 // first failure of any chunk
  uint64_t cancels_at_submit = 0;  // cq->cancels() when submitted: a later cancel reaches it
};

struct Chunk {
  std::shared_ptr<Request> request;
  const ReadFile* file = nullptr;
  uint64_t offset = 0;  // payload: file offset and length, bytes
  uint64_t length = 0;
  uint8_t* dst = nullptr;
  // What is read: [io_offset, io_offset + io_length) into io_buf. Equal to the payload unless
  // bounced, in which case it is the aligned cover and io_buf is a bounce buffer.
  uint64_t io_offset = 0;
  uint64_t io_length = 0;
  uint8_t* io_buf = nullptr;
  int bounce_index = -1;
  bool bounce_allocated = false;  // its bounce buffer was made for it (take_chunk registers it)
  uint64_t done = 0;  // bytes of the io range known read, counted from io_offset
  uint32_t error_retries = 0;
  uint32_t transient_retries = 0;
  uint32_t stalled_reads = 0;  // consecutive attempts that read no new byte
  bool back_off = false;  // the last attempt got EAGAIN: start the next one a little later
  // The rate-cap slot reserved as the chunk was cut (its first attempt's; plan_attempt takes it).
  uint64_t cut_reserved = 0;
  Clock::time_point cut_slot{};
  Status error;
  void* backend_state = nullptr;  // free for the backend (the uring engine's attempt record)
};

struct Attempt {
  uint8_t* buf = nullptr;
  uint64_t file_offset = 0;
  uint64_t length = 0;
  Clock::time_point not_before{};  // do not start before (rate limit, injected delay)
  uint64_t rate_reserved = 0;      // bytes reserved from the rate limit for this attempt,
  Clock::time_point rate_slot{};   // from this moment (RateLimiter::reserve)
  bool inject_eio = false;         // do not read; the result is -EIO
  bool short_read = false;         // deliver only half of what the kernel returns
};

class QueuedIoEngine : public IoEngine {
 public:
  Status submit(std::span<const ReadRequest> batch, CompletionQueue& cq) final;
  void cancel(CompletionQueue& cq) final;
  IoCounters counters() const final;

 protected:
  explicit QueuedIoEngine(IoOptions options);
  ~QueuedIoEngine() override;

  enum class Take { kNonBlocking, kBlocking };
  // The next chunk in submission order, holding one in-flight slot until finish_chunk. Returns
  // null when there is none: queue empty, the head needs a bounce buffer and none is free, or
  // the rate cap lets no read start before `*paced_until` (set then, else left alone; a
  // backend that does not block here wakes itself by then); with kBlocking it waits for one
  // instead and returns null only once shutdown() was called and the queue is empty.
  std::unique_ptr<Chunk> take_chunk(Take mode, Clock::time_point* paced_until = nullptr);
  Attempt plan_attempt(Chunk& c);
  // Whether the chunk's request was cancelled, or the engine shut down, since it was
  // submitted; if so the attempt `a`, not started, is never made: the chunk fails
  // ("cancelled"), `a`'s rate reservation is given back, and the backend finishes the chunk.
  bool abandon_if_cancelled(Chunk& c, const Attempt& a);
  // Blocks the calling thread until a.not_before, or less if cancel or shutdown reach the
  // chunk meanwhile. Returns false if the attempt is abandoned (as abandon_if_cancelled).
  bool wait_to_start(Chunk& c, const Attempt& a);
  enum class Step { kAgain, kDone };
  // `res` is the byte count the kernel returned, or -errno.
  Step on_result(Chunk& c, const Attempt& a, int64_t res);
  void finish_chunk(std::unique_ptr<Chunk> c);
  // Whether `f` is shorter now than when it was opened (fstat).
  static bool file_shrank(const ReadFile& f);

  // Stops accepting work; requests not yet started complete with an error, and so do chunks
  // taken but still waiting to start (abandon_if_cancelled). Reads in the kernel run to the
  // end. Backends call it first thing in their destructor, then join.
  void shutdown();
  // Shut down, and no request left in a queue (a backend's loop may end once its own
  // operations are done too).
  bool shut_down_and_drained();
  // Bounce buffers, for backends that register them: index -> memory (null until allocated).
  uint32_t bounce_count() const { return static_cast<uint32_t>(bounce_.size()); }
  uint64_t bounce_bytes() const { return bounce_bytes_; }

  // Backend hook: called (without locks) after work was queued, a bounce buffer was freed,
  // requests were cancelled, or shutdown began, so a backend that does not wait on
  // take_chunk(kBlocking) or wait_to_start can look again.
  virtual void wake() {}
  // Backend hook: a bounce buffer was just allocated (the uring engine registers it); called
  // without mu_ by the thread that took its first chunk, before take_chunk returns that chunk.
  virtual void on_bounce_allocated(uint32_t index, uint8_t* data, uint64_t bytes) {}

  void add_wait_ns(uint64_t ns) final { wait_ns_.fetch_add(ns, std::memory_order_relaxed); }
  void count_read_issued() { reads_issued_.fetch_add(1, std::memory_order_relaxed); }
  void count_fixed_read() { fixed_reads_.fetch_add(1, std::memory_order_relaxed); }

 private:
  // REQUIRES mu_. Cuts the next chunk off the head request; null as take_chunk, with
  // `paced_until` set where the rate cap held it back.
  std::unique_ptr<Chunk> take_chunk_locked(Clock::time_point& paced_until);
  // REQUIRES mu_. The FIFO chunks are cut from next (demand before read-ahead); null if both
  // are empty.
  std::deque<std::shared_ptr<Request>>* next_queue_locked();
  // REQUIRES mu_. Delivers `r` if it is fully cut and no chunk of it runs.
  void maybe_deliver_locked(Request& r);
  Status attempt_error(const Chunk& c, uint64_t pos, uint64_t len, int err) const;
  // REQUIRES mu_. Marks the unread rest of `r` as failed with `why`. Never throws: a queue's
  // destructor cancels through it, under mu_, inside an erase_if.
  static void stop_request_locked(Request& r, const char* why) noexcept;

  // Whether cancel or shutdown reached the chunk's request (reads no lock: see the .cpp).
  bool cancelled(const Chunk& c) const;
  // Wakes the threads in wait_to_start, after a cancel or shutdown.
  void wake_waiting_to_start();

  RateLimiter limiter_;
  const uint64_t bounce_bytes_;

  std::mutex start_mu_;              // pairs with start_cv_; guards nothing else
  std::condition_variable start_cv_;  // cancel or shutdown: threads in wait_to_start look again

  mutable std::mutex mu_;
  std::condition_variable work_cv_;                 // queue grew, bounce freed, shutdown
  // Requests not fully cut, one FIFO per ReadPriority (demand first). Guarded by mu_.
  std::deque<std::shared_ptr<Request>> queues_[2];
  std::vector<AlignedBuffer> bounce_;               // guarded by mu_ (the vector, not the bytes)
  std::vector<uint32_t> free_bounce_;               // guarded by mu_
  std::atomic<bool> stopping_{false};               // written under mu_; read anywhere
  uint64_t requests_outstanding_ = 0;               // guarded by mu_
  Clock::time_point busy_since_{};                  // guarded by mu_
  uint64_t busy_ns_ = 0;                            // guarded by mu_; closed busy intervals
  uint64_t chunks_running_ = 0;                     // guarded by mu_; taken, not yet finished
  uint64_t peak_chunks_running_ = 0;                // guarded by mu_

  std::atomic<uint64_t> requests_completed_{0}, requests_failed_{0}, bytes_delivered_{0},
      bytes_read_{0}, reads_issued_{0}, retries_{0}, short_reads_{0}, bounced_chunks_{0},
      bounced_bytes_{0}, fixed_reads_{0}, faults_injected_{0}, wait_ns_{0}, buffer_bytes_{0};
};

}  // namespace ktier::io::detail
