#include "io/io_engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>

#include "io/pread_io_engine.h"
#include "io/queued_engine.h"
#include "io/uring_io_engine.h"

namespace ktier::io {

Result<ReadFile> IoEngine::open(const std::filesystem::path& path) const {
  return ReadFile::open(path, options_.direct);
}

// ---- CompletionQueue ----------------------------------------------------------------------

CompletionQueue::~CompletionQueue() {
  {
    // Everything delivered (the usual end): nothing of this queue is left in the engine, and a
    // cancel would only wake its threads for nothing.
    std::lock_guard lock(mu_);
    if (ready_.size() >= outstanding_) return;
  }
  engine_.cancel(*this);
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return ready_.size() >= outstanding_; });
}

void CompletionQueue::on_submitted(size_t n) {
  std::lock_guard lock(mu_);
  // Room for every completion outstanding (ready_ never holds more), so that deliver() does not
  // allocate: a throw there, on an engine's thread, would lose a completion someone waits for.
  ready_.reserve(outstanding_ + n);
  outstanding_ += n;
}

void CompletionQueue::deliver(Completion c) {
  // Notified under the lock: the destructor may return, and free this queue, as soon as it
  // sees the last completion, so nothing here may touch the queue after unlocking.
  std::lock_guard lock(mu_);
  ready_.push_back(std::move(c));
  cv_.notify_all();
}

size_t CompletionQueue::wait(size_t min_count, std::vector<Completion>& out) {
  std::unique_lock lock(mu_);
  // Recomputed at each wake: another thread's wait() or discard_all() may take what this one
  // waits for, and what is outstanding falls with it.
  const auto enough = [&] { return ready_.size() >= std::min(min_count, outstanding_); };
  if (!enough()) {
    const auto t0 = std::chrono::steady_clock::now();
    cv_.wait(lock, enough);
    const auto ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                              std::chrono::steady_clock::now() - t0)
                                              .count());
    wait_ns_ += ns;
    engine_.add_wait_ns(ns);  // an atomic add; takes no engine lock
  }
  const size_t n = ready_.size();
  // Room first: a std::bad_alloc then leaves every completion here, none moved out and lost.
  out.reserve(out.size() + n);
  for (Completion& c : ready_) out.push_back(std::move(c));
  ready_.clear();
  outstanding_ -= n;
  if (n > 0) cv_.notify_all();  // other waiters: less is outstanding now
  return n;
}

Status CompletionQueue::wait_all() {
  Status first;
  std::vector<Completion> done;
  while (outstanding() > 0) {
    done.clear();
    wait(outstanding(), done);
    for (Completion& c : done) {
      if (first.is_ok() && !c.status.is_ok()) first = std::move(c.status);
    }
  }
  return first;
}

void CompletionQueue::discard_all() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return ready_.size() >= outstanding_; });
  ready_.clear();
  outstanding_ = 0;
  cv_.notify_all();  // other waiters: nothing is outstanding now
}

size_t CompletionQueue::outstanding() const {
  std::lock_guard lock(mu_);
  return outstanding_;
}

uint64_t CompletionQueue::wait_ns() const {
  std::lock_guard lock(mu_);
  return wait_ns_;
}

Status read_all(IoEngine& engine, std::span<const ReadRequest> batch) {
  CompletionQueue cq(engine);
  KTIER_RETURN_IF_ERROR(cq.submit(batch));
  return cq.wait_all();
}

// ---- factory ------------------------------------------------------------------------------

Result<std::unique_ptr<IoEngine>> make_io_engine(const IoOptions& options) {
  static std::atomic<bool> logged{false};
  const auto say_once = [](const std::string& msg, bool warn) {
    if (logged.exchange(true)) return;
    if (warn) {
      spdlog::warn("{}", msg);
    } else {
      spdlog::info("{}", msg);
    }
  };
  if (options.backend == IoBackend::kPread) {
    say_once("I/O: pread thread pool (" + std::to_string(options.queue_depth) +
                 " in flight; chosen with --io pread)",
             false);
    return PreadIoEngine::create(options);
  }
  auto uring = UringIoEngine::create(options);
  if (uring.is_ok()) {
    say_once("I/O: io_uring (" + std::to_string(options.queue_depth) + " in flight)", false);
    return std::move(uring).value();
  }
  if (options.backend == IoBackend::kUring) return uring.status();
  say_once("I/O: io_uring is unavailable (" + uring.status().message() +
               "); using the pread thread pool instead",
           true);
  return PreadIoEngine::create(options);
}

Result<IoBackend> parse_io_backend(const std::string& text) {
  if (text == "auto") return IoBackend::kAuto;
  if (text == "uring" || text == "io_uring") return IoBackend::kUring;
  if (text == "pread") return IoBackend::kPread;
  return Status::usage("--io: '" + text + "' is not one of auto, uring, pread");
}

uint64_t chunk_reads(const IoOptions& options, uint64_t length) {
  const uint64_t chunk = std::clamp<uint64_t>(options.max_chunk_bytes, 1, detail::kMaxReadBytes);
  return length / chunk + (length % chunk != 0);
}

}  // namespace ktier::io
