#pragma once
// The I/O engine: batched, asynchronous positioned reads for trunk streaming and expert reads
// (DESIGN.md §6). Two implementations sit behind IoEngine: UringIoEngine (io_uring via
// liburing, registered files and buffers) and PreadIoEngine (a thread pool doing pread);
// make_io_engine() picks io_uring when it works and says once in the log which one it uses.
//
// Usage:
//   IoOptions opt;                          // defaults: auto backend, auto O_DIRECT, depth 32
//   KTIER_ASSIGN_OR_RETURN(auto engine, make_io_engine(opt));
//   KTIER_ASSIGN_OR_RETURN(ReadFile shard, engine->open(path));
//   CompletionQueue cq(*engine);            // one per client (trunk reader, expert prefetcher)
//   std::vector<ReadRequest> batch = ...;   // sorted by file offset by the caller
//   KTIER_RETURN_IF_ERROR(cq.submit(batch));
//   std::vector<Completion> done;
//   while (cq.outstanding() > 0) {
//     cq.wait(1, done);                     // completions arrive in any order; match by tag
//     for (Completion& c : done) KTIER_RETURN_IF_ERROR(c.status);
//     done.clear();
//   }
//
// Contract of every engine:
// - Requests are issued in submission order (all chunks of one request before the next) within
//   each priority (ReadPriority: every demand request before any read-ahead one not yet
//   started), with up to IoOptions::queue_depth chunk reads in flight across all queues.
//   Completions are delivered per request, in any order, to the queue the request was
//   submitted on.
// - Large requests are split into chunks of at most max_chunk_bytes, read in parallel.
// - Unaligned requests under O_DIRECT: the engine reads the covering aligned range into one of
//   its own bounce buffers and copies the payload out (one extra memcpy). A request is read
//   zero-copy when offset, length and destination are multiples of ReadFile::alignment(), and
//   otherwise its aligned middle still is, if destination and offset agree modulo the alignment.
//   Callers that want zero-copy reads of unaligned tensors read aligned_cover() into an
//   AlignedBuffer (aligned_buffer.h).
// - Short reads are continued; EINTR and EAGAIN are retried (up to kMaxTransientRetries in a
//   row, queued_engine.h, then they count as an error); any other error is retried once,
//   then the request completes with Status::runtime naming the file, the offset and the errno
//   text. Reading past the end of the file is Status::corrupt (the file is shorter than the
//   headers say) when detected at submit, Status::runtime when the file shrank while running.
// - A request completes only after the engine has stopped writing its destination. A request's
//   destination bytes are unspecified while it is outstanding and after it fails.
// - Counters (IoCounters) cover all queues of the engine.
//
// Thread-safety and lifetime: IoEngine and CompletionQueue are thread-safe; any thread may
// submit, wait, cancel or read counters. The engine owns its threads (pread workers, or the
// io_uring reaper). Destroy every CompletionQueue before its engine; the engine's destructor
// fails requests not yet started, waits for reads in flight, and joins its threads.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "io/fault_plan.h"
#include "io/read_file.h"

namespace ktier::io {

enum class IoBackend {
  kAuto,   // io_uring if it can be set up here, else pread (logged once)
  kUring,  // io_uring or fail with Status::runtime
  kPread,  // thread pool doing pread
};

struct IoOptions {
  IoBackend backend = IoBackend::kAuto;
  // How IoEngine::open() opens files. The commands always use kAuto; tests force each mode.
  DirectMode direct = DirectMode::kAuto;
  // Chunk reads in flight at once, >= 1 (the expert path wants >= 16: one layer's top-16).
  // The pread engine runs this many threads, capped at kMaxPreadThreads.
  uint32_t queue_depth = 32;
  // Requests larger than this are split into chunks read in parallel. Bytes; rounded up to a
  // multiple of the file's alignment. 4 MiB keeps an NVMe queue busy without long tails.
  uint64_t max_chunk_bytes = uint64_t{4} << 20;
  // Bounce buffers for unaligned reads under O_DIRECT: count and bytes each (multiple of 4096).
  // They are allocated on first need and counted in IoCounters::buffer_bytes.
  uint32_t bounce_buffers = 8;
  uint64_t bounce_buffer_bytes = uint64_t{1} << 20;
  // Read-rate cap in bytes per second, 0 = unlimited (`--io-rate-limit`, emulated slow disks).
  uint64_t rate_limit_bytes_per_s = 0;
  // Test seam; null in normal runs.
  std::shared_ptr<FaultPlan> fault_plan;
};

inline constexpr uint32_t kMaxPreadThreads = 128;

struct ReadRequest {
  const ReadFile* file = nullptr;  // must outlive the request
  uint64_t offset = 0;             // file offset, bytes
  uint64_t length = 0;             // bytes; 0 completes at once
  void* dst = nullptr;             // caller-owned, >= length bytes; not touched by the caller
                                   // until the request's Completion has been taken
  uint64_t tag = 0;                // caller's id, returned in the Completion
};

// Chunk reads a request of `length` bytes is split into (before O_DIRECT alignment widens its
// ends, which may add a bounced head or tail): what IoOptions::queue_depth counts.
uint64_t chunk_reads(const IoOptions& options, uint64_t length);

struct Completion {
  uint64_t tag = 0;
  Status status;  // ok, or the error of the request (runtime: I/O; corrupt: past end of file)
};

struct IoCounters {
  uint64_t requests_completed = 0;  // requests delivered, failed ones included
  uint64_t requests_failed = 0;
  uint64_t bytes_delivered = 0;     // payload bytes of successful requests
  uint64_t bytes_read = 0;          // bytes the kernel returned (incl. alignment widening)
  uint64_t reads_issued = 0;        // read syscalls / SQEs
  uint64_t retries = 0;             // attempts repeated after an error (not EINTR/EAGAIN)
  uint64_t short_reads = 0;         // continuations after a short read
  uint64_t bounced_chunks = 0;      // chunks read through a bounce buffer and copied out
  uint64_t bounced_bytes = 0;       // payload bytes of those chunks (copied out of the buffer)
  uint64_t fixed_reads = 0;         // reads issued into registered buffers (io_uring only)
  uint64_t faults_injected = 0;     // events caused by the fault plan
  uint64_t wait_ns = 0;             // time callers spent blocked in CompletionQueue::wait
  uint64_t busy_ns = 0;             // wall time with at least one request outstanding
  uint64_t buffer_bytes = 0;        // engine-owned aligned memory (bounce buffers), bytes
  uint64_t peak_chunks_running = 0; // most chunk reads running at once (<= queue_depth)

  // bytes_delivered / busy time, in GB/s (1e9 bytes per second); 0 when nothing was read.
  double achieved_gbps() const {
    return busy_ns == 0 ? 0.0 : static_cast<double>(bytes_delivered) / static_cast<double>(busy_ns);
  }
};

class CompletionQueue;

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  // "io_uring" or "pread".
  virtual const char* name() const = 0;
  const IoOptions& options() const { return options_; }

  // Opens a file the way the options say (IoOptions::direct).
  Result<ReadFile> open(const std::filesystem::path& path) const;

  // Queues `batch` for reading, in order; completions go to `cq`. Validates all requests first
  // and queues none if any is invalid (Status::corrupt for a range past the end of its file), nor
  // when it throws std::bad_alloc.
  // A null file, or a null dst with a nonzero length, is a bug (aborts). Does not block on I/O.
  virtual Status submit(std::span<const ReadRequest> batch, CompletionQueue& cq) = 0;

  // Registers [base, base + bytes) with the kernel so that reads into it skip per-read page
  // pinning (io_uring fixed buffers); a no-op returning ok in the pread engine. Optional: on
  // failure (Status::runtime, e.g. RLIMIT_MEMLOCK) reads into the region still work, unregistered.
  // A region overlapping one registered already is refused (Status::runtime; read unregistered).
  // REQUIRES: no outstanding request targets the region while it is registered or unregistered;
  // the region stays valid until unregister_buffer(base) or the engine's destruction.
  virtual Status register_buffer(void* base, uint64_t bytes) { return Status::ok(); }
  virtual void unregister_buffer(void* base) {}

  // Fails every request of `cq` that has not started (Status::runtime "cancelled"), and every
  // read of them still waiting to start (held back by the rate limit or an injected delay);
  // requests with reads in the kernel finish those reads and then complete, with the cancel
  // error if any of their bytes were left unread. For error paths and stale prefetches. Does
  // not block, and does not throw (a queue's destructor calls it).
  virtual void cancel(CompletionQueue& cq) = 0;

  virtual IoCounters counters() const = 0;

 protected:
  explicit IoEngine(IoOptions options) : options_(std::move(options)) {}
  // Called by CompletionQueue::wait to account blocked time.
  virtual void add_wait_ns(uint64_t ns) = 0;
  friend class CompletionQueue;

  const IoOptions options_;
};

// Picks io_uring when it can be set up (unless options.backend forces one) and logs once per
// process which engine it uses and why. Status::runtime when the forced backend is unavailable.
Result<std::unique_ptr<IoEngine>> make_io_engine(const IoOptions& options);

// Which of an engine's two FIFOs a queue's requests wait in. kDemand: reads the caller blocks
// on as it submits them (the expert tier's misses, synchronous loads); kReadAhead: reads issued
// ahead of need (the trunk ring's next layers, expert prefetch), which keep their common FIFO
// order among themselves. Chunks are cut from demand requests first: a miss waits only for the
// chunks already in flight, never behind queued read-ahead.
enum class ReadPriority { kDemand = 0, kReadAhead = 1 };

// One client's completions. Thread-safe. Requests submitted through it complete into it, in the
// engine FIFO of its priority. Its destructor cancels the requests that have not started and
// blocks until the rest have completed (so their buffers are no longer written), discarding the
// completions.
// REQUIRES: the engine outlives the queue.
class CompletionQueue {
 public:
  explicit CompletionQueue(IoEngine& engine, ReadPriority priority = ReadPriority::kDemand)
      : engine_(engine), priority_(priority) {}
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;
  ~CompletionQueue();

  IoEngine& engine() { return engine_; }
  ReadPriority priority() const { return priority_; }
  Status submit(std::span<const ReadRequest> batch) { return engine_.submit(batch, *this); }
  // IoEngine::cancel for this queue.
  void cancel() { engine_.cancel(*this); }

  // Blocks until at least min(min_count, outstanding()) completions are ready, then moves every
  // ready completion to the end of `out`. Returns how many were moved. wait(0, out) polls. If
  // growing `out` throws std::bad_alloc, no completion is taken. outstanding() is read afresh
  // at each wake: with several threads waiting on one queue, one may take what another waited
  // for, and that one returns with fewer (even none) once less is outstanding.
  size_t wait(size_t min_count, std::vector<Completion>& out);
  // Waits for every outstanding request; returns the first error among them (in completion
  // order), or ok. Completions are consumed.
  Status wait_all();
  // Waits for every outstanding request and drops its completion, allocating nothing: for
  // clean-up while an exception unwinds (an allocation there would end the process).
  void discard_all();
  // Requests submitted here whose completion has not been taken yet (ready ones included).
  size_t outstanding() const;
  // Time this queue's callers spent blocked in wait(), ns.
  uint64_t wait_ns() const;

  // Engine side: count requests in, deliver completions. on_submitted may throw std::bad_alloc
  // (counting nothing then); deliver does not allocate.
  void on_submitted(size_t n);
  void deliver(Completion c);
  // Engine side: how many times the engine has cancelled this queue's requests. A request
  // submitted before the latest cancel starts no further read once the engine has seen it.
  uint64_t cancels() const { return cancels_.load(std::memory_order_acquire); }
  void count_cancel() { cancels_.fetch_add(1, std::memory_order_acq_rel); }

 private:
  IoEngine& engine_;
  const ReadPriority priority_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Completion> ready_;  // guarded by mu_
  size_t outstanding_ = 0;         // guarded by mu_
  uint64_t wait_ns_ = 0;           // guarded by mu_
  std::atomic<uint64_t> cancels_{0};
};

// Convenience for one synchronous batch: submit on a private queue and wait for all; returns the
// first error. The buffers are no longer written when it returns, success or not.
Status read_all(IoEngine& engine, std::span<const ReadRequest> batch);

// `--io`: "auto" | "uring" | "io_uring" | "pread"; anything else is Status::usage naming --io.
Result<IoBackend> parse_io_backend(const std::string& text);

}  // namespace ktier::io
