#include "io/queued_engine.h"

#include <sys/stat.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <string>

#include "common/check.h"

namespace ktier::io::detail {
namespace {

std::string range_text(uint64_t offset, uint64_t length) {
  return "[" + std::to_string(offset) + ", " + std::to_string(offset + length) + ")";
}

}  // namespace

QueuedIoEngine::QueuedIoEngine(IoOptions options)
    : IoEngine(std::move(options)),
      limiter_(options_.rate_limit_bytes_per_s),
      bounce_bytes_(align_up(std::clamp<uint64_t>(options_.bounce_buffer_bytes, 64 << 10,
                                                  kMaxReadBytes),
                             kDefaultAlignment)) {
  KTIER_CHECK(options_.queue_depth >= 1);
  KTIER_CHECK(options_.max_chunk_bytes >= 1);
  const uint32_t n_bounce = std::max<uint32_t>(options_.bounce_buffers, 1);
  bounce_.resize(n_bounce);
  for (uint32_t i = n_bounce; i-- > 0;) free_bounce_.push_back(i);
}

QueuedIoEngine::~QueuedIoEngine() {
  // Backends must have shut down and joined their threads already.
  std::lock_guard lock(mu_);
  KTIER_CHECK(stopping_ && next_queue_locked() == nullptr && requests_outstanding_ == 0);
}

Status QueuedIoEngine::submit(std::span<const ReadRequest> batch, CompletionQueue& cq) {
  for (const ReadRequest& r : batch) {
    KTIER_CHECK(r.file != nullptr && r.file->is_open());
    KTIER_CHECK(r.dst != nullptr || r.length == 0);
    if (r.offset > r.file->size() || r.length > r.file->size() - r.offset) {
      return Status::corrupt("read past the end of " + r.file->path() + ": bytes " +
                             range_text(r.offset, r.length) + " requested but the file has " +
                             std::to_string(r.file->size()) +
                             " bytes (truncated or incomplete download?)");
    }
  }
  if (batch.empty()) return Status::ok();
  // Chunks this batch makes (at most; bounce chunks may be smaller): how many waiting workers
  // are worth waking. Waking all of them for one small read costs a 2-core machine dearly.
  uint64_t chunks = 0;
  for (const ReadRequest& r : batch) {
    chunks += chunk_reads(options_, r.length);
  }
  // The requests are made, and queued with a way back, before any is counted: a std::bad_alloc
  // leaves none queued, so neither this engine nor `cq` waits for a read that never comes.
  std::vector<std::shared_ptr<Request>> requests;
  requests.reserve(batch.size());
  for (const ReadRequest& r : batch) {
    auto req = std::make_shared<Request>();
    req->read = r;
    req->cq = &cq;
    req->next_offset = r.offset;
    requests.push_back(std::move(req));
  }
  {
    std::lock_guard lock(mu_);
    KTIER_CHECK_MSG(!stopping_, "submit() on an IoEngine that is being destroyed");
    auto& queue = queues_[static_cast<int>(cq.priority())];
    const size_t queued_before = queue.size();
    // Read under mu_, which cancel() counts under: a cancel is wholly before this batch (and
    // reaches none of it) or wholly after (and reaches all of it).
    const uint64_t cancels = cq.cancels();
    for (const auto& req : requests) req->cancels_at_submit = cancels;
    try {
      for (const auto& req : requests)
        if (req->read.length != 0) queue.push_back(req);
      cq.on_submitted(batch.size());
    } catch (...) {  // no worker took one: they take under mu_
      queue.erase(queue.begin() + static_cast<std::ptrdiff_t>(queued_before), queue.end());
      throw;
    }
    if (requests_outstanding_ == 0) busy_since_ = Clock::now();
    requests_outstanding_ += batch.size();
    for (const auto& req : requests)
      if (req->read.length == 0) maybe_deliver_locked(*req);
  }
  if (chunks >= options_.queue_depth) {
    work_cv_.notify_all();
  } else {
    for (uint64_t i = 0; i < chunks; ++i) work_cv_.notify_one();
  }
  wake();
  return Status::ok();
}

std::unique_ptr<Chunk> QueuedIoEngine::take_chunk(Take mode, Clock::time_point* paced_until) {
  std::unique_lock lock(mu_);
  for (;;) {
    Clock::time_point paced = Clock::time_point::max();
    if (auto c = take_chunk_locked(paced)) {
      peak_chunks_running_ = std::max(peak_chunks_running_, ++chunks_running_);
      // Pass the baton: if more work is ready, wake one more waiter, which does the same.
      if (mode == Take::kBlocking && next_queue_locked() != nullptr) work_cv_.notify_one();
      if (c->bounce_allocated) {
        // Registering waits for the ring's kernel lock, which a caller registering gigabytes
        // holds for seconds: not under mu_, which submit() and cancel() take.
        const uint64_t bytes = bounce_[c->bounce_index].size();
        lock.unlock();
        on_bounce_allocated(static_cast<uint32_t>(c->bounce_index), c->io_buf, bytes);
      }
      return c;
    }
    if (mode == Take::kNonBlocking) {
      if (paced_until != nullptr && paced != Clock::time_point::max()) *paced_until = paced;
      return nullptr;
    }
    if (stopping_ && next_queue_locked() == nullptr) return nullptr;
    if (paced != Clock::time_point::max()) {
      work_cv_.wait_until(lock, paced);
    } else {
      work_cv_.wait(lock);
    }
  }
}

std::deque<std::shared_ptr<Request>>* QueuedIoEngine::next_queue_locked() {
  for (auto& q : queues_)
    if (!q.empty()) return &q;
  return nullptr;
}

std::unique_ptr<Chunk> QueuedIoEngine::take_chunk_locked(Clock::time_point& paced_until) {
  while (auto* queue = next_queue_locked()) {
    Request& r = *queue->front();
    const ReadFile& file = *r.read.file;
    const uint64_t end = r.read.offset + r.read.length;
    // Fail what is not read yet rather than read data nobody will wait for; chunks already
    // running finish first, and the request is delivered after them.
    if (stopping_) stop_request_locked(r, "the I/O engine was shut down");
    if (r.next_offset == end) {
      auto done = std::move(queue->front());
      queue->pop_front();
      maybe_deliver_locked(*done);
      continue;
    }
    // Under a rate cap a chunk is cut only once a read could start now. Were chunks cut ahead
    // and held for their slots, up to queue_depth read-ahead chunks would hold the next slots
    // and a demand read submitted after them would wait for all of them.
    const Clock::time_point now = Clock::now();
    if (!limiter_.unlimited()) {
      if (const Clock::time_point free_at = limiter_.next_free(); free_at > now) {
        paced_until = free_at;
        return nullptr;
      }
    }

    auto c = std::make_unique<Chunk>();
    c->file = &file;
    c->offset = r.next_offset;
    c->dst = static_cast<uint8_t*>(r.read.dst) + (r.next_offset - r.read.offset);
    const uint64_t remaining = end - c->offset;
    const uint64_t align = file.alignment();
    const uint64_t chunk_limit = align_up(std::min(options_.max_chunk_bytes, kMaxReadBytes), align);
    if (!file.direct()) {
      c->length = std::min(remaining, chunk_limit);
    } else if (is_aligned(c->offset, align) && is_aligned(c->dst, align) && remaining >= align) {
      c->length = align_down(std::min(remaining, chunk_limit), align);
    } else {
      // Bounce. If destination and offset agree modulo the alignment, only this unaligned head
      // (or tail) block needs it and the middle goes direct; otherwise every byte is bounced.
      KTIER_CHECK_MSG(2 * align <= bounce_bytes_, "direct-I/O alignment larger than a bounce buffer");
      if (free_bounce_.empty()) return nullptr;  // head-of-line: keep submission order
      const uint64_t io_offset = align_down(c->offset, align);
      const bool relative_ok = is_aligned(reinterpret_cast<uintptr_t>(c->dst) - c->offset, align);
      const uint64_t limit = relative_ok ? align_down(c->offset, align) + align
                                         : std::min(io_offset + align_down(bounce_bytes_, align),
                                                    c->offset + chunk_limit);
      c->length = std::min(end, limit) - c->offset;
      const uint32_t index = free_bounce_.back();
      if (bounce_[index].empty()) {
        auto buf = AlignedBuffer::allocate(bounce_bytes_, kMaxDirectAlignment);
        if (!buf.is_ok()) {  // an earlier chunk's read error stays the one reported
          if (r.error.is_ok())
            r.error = buf.status().with_context("bounce buffer for " + file.path());
          r.next_offset = end;
          continue;
        }
        bounce_[index] = std::move(buf).value();
        buffer_bytes_.fetch_add(bounce_[index].size(), std::memory_order_relaxed);
        c->bounce_allocated = true;
      }
      free_bounce_.pop_back();
      c->bounce_index = static_cast<int>(index);
      c->io_offset = io_offset;
      c->io_length = align_up(c->offset + c->length, align) - io_offset;
      c->io_buf = bounce_[index].data();
    }
    if (c->bounce_index < 0) {
      c->io_offset = c->offset;
      c->io_length = c->length;
      c->io_buf = c->dst;
    }
    if (!limiter_.unlimited()) {
      c->cut_slot = limiter_.reserve(c->io_length, now);
      c->cut_reserved = c->io_length;
    }
    r.next_offset += c->length;
    ++r.chunks_running;
    c->request = queue->front();
    if (r.next_offset == end) queue->pop_front();
    return c;
  }
  return nullptr;
}

Attempt QueuedIoEngine::plan_attempt(Chunk& c) {
  Attempt a;
  uint64_t pos = c.io_offset + c.done;
  // Under O_DIRECT a continuation must restart on an aligned boundary; re-reading the bytes
  // between it and `pos` rewrites identical data inside this chunk's own range.
  if (c.file->direct()) pos = align_down(pos, c.file->alignment());
  a.file_offset = pos;
  a.buf = c.io_buf + (pos - c.io_offset);
  a.length = c.io_length - (pos - c.io_offset);
  const Clock::time_point now = Clock::now();
  a.not_before = now;
  if (c.back_off) {
    a.not_before += kTransientBackoff;
    c.back_off = false;
  }
  if (options_.fault_plan) {
    const AttemptFaults f = options_.fault_plan->on_attempt(c.file->path(), pos, a.length);
    a.inject_eio = f.eio;
    a.short_read = f.short_read;
    a.not_before += f.delay;
    const uint64_t n = uint64_t{f.eio} + uint64_t{f.short_read} + uint64_t{f.delay.count() > 0};
    if (n > 0) faults_injected_.fetch_add(n, std::memory_order_relaxed);
  }
  // The first attempt reads the chunk's whole io range, reserved as the chunk was cut.
  if (c.cut_reserved > 0 && a.inject_eio) limiter_.give_back(c.cut_reserved, c.cut_slot, now);
  if (!a.inject_eio && !limiter_.unlimited()) {
    a.rate_reserved = a.length;
    a.rate_slot = c.cut_reserved > 0 ? c.cut_slot : limiter_.reserve(a.length, now);
    a.not_before = std::max(a.not_before, a.rate_slot);
  }
  c.cut_reserved = 0;
  return a;
}

bool QueuedIoEngine::cancelled(const Chunk& c) const {
  // No lock: a request is not delivered while a chunk of it runs, so its queue is alive and
  // r.cq, written under mu_ before the chunk was taken, does not change; both counts are
  // atomics, changed under mu_ before the wake that makes a waiting chunk look.
  const Request& r = *c.request;
  return stopping_.load(std::memory_order_acquire) || r.cq->cancels() != r.cancels_at_submit;
}

bool QueuedIoEngine::abandon_if_cancelled(Chunk& c, const Attempt& a) {
  if (!cancelled(c)) return false;
  if (a.rate_reserved > 0) limiter_.give_back(a.rate_reserved, a.rate_slot, Clock::now());
  const char* why = stopping_.load(std::memory_order_acquire) ? "the I/O engine was shut down"
                                                              : "its reader cancelled it";
  c.error = Status::runtime("read of " + c.file->path() + " at offset " +
                            std::to_string(c.offset) + " cancelled (" + why + ")");
  return true;
}

bool QueuedIoEngine::wait_to_start(Chunk& c, const Attempt& a) {
  if (a.not_before > Clock::now()) {
    std::unique_lock lock(start_mu_);
    start_cv_.wait_until(lock, a.not_before, [&] { return cancelled(c); });
  }
  return !abandon_if_cancelled(c, a);
}

void QueuedIoEngine::wake_waiting_to_start() {
  // Taken and let go first: a thread in wait_to_start that has looked and not yet slept holds
  // start_mu_, so the notify cannot fall between its look and its sleep.
  { std::lock_guard lock(start_mu_); }
  start_cv_.notify_all();
}

Status QueuedIoEngine::attempt_error(const Chunk& c, uint64_t pos, uint64_t len, int err) const {
  const ReadRequest& r = c.request->read;
  return Status::runtime("read of " + c.file->path() + " failed at offset " + std::to_string(pos) +
                         " (" + std::to_string(len) + " bytes; request offset " +
                         std::to_string(r.offset) + ", length " + std::to_string(r.length) +
                         "): " + errno_text(err) + "; retried " +
                         std::to_string(c.error_retries) +
                         (c.error_retries == 1 ? " time" : " times") +
                         " (check the disk and the kernel log)");
}

QueuedIoEngine::Step QueuedIoEngine::on_result(Chunk& c, const Attempt& a, int64_t res) {
  if ((res == -EINTR || res == -EAGAIN) && c.transient_retries < kMaxTransientRetries) {
    ++c.transient_retries;
    c.back_off = res == -EAGAIN;
    return Step::kAgain;
  }
  if (res < 0) {
    const int err = static_cast<int>(-res);
    if (c.error_retries < kMaxErrorRetries) {
      ++c.error_retries;
      retries_.fetch_add(1, std::memory_order_relaxed);
      spdlog::debug("read of {} at offset {} failed ({}); retrying", c.file->path(), a.file_offset,
                    errno_text(err));
      return Step::kAgain;
    }
    c.error = attempt_error(c, a.file_offset, a.length, err);
    return Step::kDone;
  }
  bytes_read_.fetch_add(static_cast<uint64_t>(res), std::memory_order_relaxed);
  if (a.short_read && res > 1) res /= 2;  // injected: pretend the rest did not arrive
  const uint64_t needed = c.offset + c.length - c.io_offset;
  const uint64_t reached = (a.file_offset - c.io_offset) + static_cast<uint64_t>(res);
  const bool stalled = reached <= c.done;
  // Short reads that never get past where they started: a file cut short inside the range
  // (direct reads restart at the aligned offset below its new end), or, where the file kept its
  // size, a device that keeps returning less than one aligned block.
  const bool gave_up = res > 0 && stalled && ++c.stalled_reads > kMaxStalledReads;
  if (gave_up && !file_shrank(*c.file)) {
    c.error = Status::runtime(c.file->path() + ": reads at offset " +
                              std::to_string(a.file_offset) + " make no progress (" +
                              std::to_string(res) + " bytes each, short of the next aligned "
                              "block) while reading bytes " +
                              range_text(c.request->read.offset, c.request->read.length));
    return Step::kDone;
  }
  if (res == 0 || gave_up) {
    c.error = Status::runtime(c.file->path() + " ends at or before offset " +
                              std::to_string(a.file_offset + static_cast<uint64_t>(res)) +
                              " while reading bytes " +
                              range_text(c.request->read.offset, c.request->read.length) +
                              "; it had " + std::to_string(c.file->size()) +
                              " bytes when opened (was it truncated or replaced while ktier ran?)");
    return Step::kDone;
  }
  if (!stalled) {  // progress: the transient and stall limits count refusals in a row
    c.done = reached;
    c.stalled_reads = 0;
    c.transient_retries = 0;
  }
  if (c.done >= needed) return Step::kDone;
  short_reads_.fetch_add(1, std::memory_order_relaxed);
  return Step::kAgain;
}

bool QueuedIoEngine::file_shrank(const ReadFile& f) {
  struct stat st {};
  return ::fstat(f.fd(), &st) == 0 && static_cast<uint64_t>(st.st_size) < f.size();
}

void QueuedIoEngine::finish_chunk(std::unique_ptr<Chunk> c) {
  if (c->error.is_ok()) {
    if (c->bounce_index >= 0) {
      std::memcpy(c->dst, c->io_buf + (c->offset - c->io_offset), c->length);
      bounced_chunks_.fetch_add(1, std::memory_order_relaxed);
      bounced_bytes_.fetch_add(c->length, std::memory_order_relaxed);
    }
    if (options_.fault_plan) {
      std::vector<CorruptSpan> spans;
      options_.fault_plan->on_chunk_done(c->file->path(), c->offset, c->length, spans);
      for (const CorruptSpan& s : spans) {
        for (uint64_t i = s.begin; i < s.end; ++i) c->dst[i - c->offset] ^= s.xor_mask;
      }
      if (!spans.empty()) faults_injected_.fetch_add(spans.size(), std::memory_order_relaxed);
    }
  }
  bool freed_bounce = false;
  {
    std::lock_guard lock(mu_);
    if (c->bounce_index >= 0) {
      free_bounce_.push_back(static_cast<uint32_t>(c->bounce_index));
      freed_bounce = true;
    }
    Request& r = *c->request;
    if (!c->error.is_ok() && r.error.is_ok()) r.error = std::move(c->error);
    --r.chunks_running;
    --chunks_running_;
    maybe_deliver_locked(r);
  }
  if (freed_bounce) {
    work_cv_.notify_one();  // one buffer lets one chunk go
    wake();
  }
}

void QueuedIoEngine::maybe_deliver_locked(Request& r) {
  if (r.next_offset != r.read.offset + r.read.length || r.chunks_running != 0) return;
  if (r.cq == nullptr) return;  // already delivered
  requests_completed_.fetch_add(1, std::memory_order_relaxed);
  if (r.error.is_ok()) {
    bytes_delivered_.fetch_add(r.read.length, std::memory_order_relaxed);
  } else {
    requests_failed_.fetch_add(1, std::memory_order_relaxed);
  }
  CompletionQueue* cq = r.cq;
  r.cq = nullptr;
  if (--requests_outstanding_ == 0) {
    busy_ns_ += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - busy_since_).count());
  }
  // Lock order: engine mu_, then the queue's mutex; a queue never calls into the engine while
  // holding its own.
  cq->deliver(Completion{r.read.tag, std::move(r.error)});
}

void QueuedIoEngine::stop_request_locked(Request& r, const char* why) noexcept {
  const uint64_t end = r.read.offset + r.read.length;
  if (r.next_offset == end) return;
  if (r.error.is_ok()) {
    try {
      r.error = Status::runtime("read of " + r.read.file->path() + " at offset " +
                                std::to_string(r.next_offset) + " cancelled (" + why + ")");
    } catch (const std::bad_alloc&) {
      // A queue's destructor cancels (noexcept): the request fails all the same, with a
      // message short enough for std::string's inline buffer (no allocation).
      r.error = Status::runtime("read cancelled");
    }
  }
  r.next_offset = end;
}

void QueuedIoEngine::cancel(CompletionQueue& cq) {
  bool erased = false, running = false;
  {
    std::lock_guard lock(mu_);
    cq.count_cancel();  // reaches its chunks already taken that have not started (cancelled())
    running = chunks_running_ > 0;
    for (auto& queue : queues_) {
      std::erase_if(queue, [&](const std::shared_ptr<Request>& r) {
        if (r->cq != &cq) return false;
        stop_request_locked(*r, "its reader cancelled it");
        maybe_deliver_locked(*r);  // delivers now unless chunks of it are still running
        erased = true;
        return true;
      });
    }
  }
  if (erased) work_cv_.notify_all();
  if (erased || running) {
    wake_waiting_to_start();
    wake();
  }
}

void QueuedIoEngine::shutdown() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  wake_waiting_to_start();
  wake();
}

bool QueuedIoEngine::shut_down_and_drained() {
  std::lock_guard lock(mu_);
  return stopping_ && next_queue_locked() == nullptr;
}

IoCounters QueuedIoEngine::counters() const {
  IoCounters c;
  const auto load = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  c.requests_completed = load(requests_completed_);
  c.requests_failed = load(requests_failed_);
  c.bytes_delivered = load(bytes_delivered_);
  c.bytes_read = load(bytes_read_);
  c.reads_issued = load(reads_issued_);
  c.retries = load(retries_);
  c.short_reads = load(short_reads_);
  c.bounced_chunks = load(bounced_chunks_);
  c.bounced_bytes = load(bounced_bytes_);
  c.fixed_reads = load(fixed_reads_);
  c.faults_injected = load(faults_injected_);
  c.wait_ns = load(wait_ns_);
  c.buffer_bytes = load(buffer_bytes_);
  std::lock_guard lock(mu_);
  c.busy_ns = busy_ns_;
  c.peak_chunks_running = peak_chunks_running_;
  if (requests_outstanding_ > 0) {
    c.busy_ns += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - busy_since_).count());
  }
  return c;
}

}  // namespace ktier::io::detail
