#include "io/uring_io_engine.h"

#include <sys/eventfd.h>
#include <sys/uio.h>
#include <fcntl.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>
#include <system_error>

#include "common/check.h"
#include "cpu/worker_thread.h"

namespace ktier::io {

struct UringIoEngine::Op {
  std::unique_ptr<detail::Chunk> chunk;
  detail::Attempt attempt;
  int file_slot = -1;  // registered file slot of the read in flight, -1 = plain fd
};

namespace {
// user_data of the armed eventfd read; every other user_data is an Op*.
constexpr uint64_t kWakeTag = 0;
}  // namespace

Result<std::unique_ptr<IoEngine>> UringIoEngine::create(const IoOptions& options) {
  std::unique_ptr<UringIoEngine> engine(new UringIoEngine(options));
  if (Status s = engine->init(); !s.is_ok()) {
    engine->shutdown();  // no reaper yet; lets the base destructor's checks pass
    return s;
  }
  return std::unique_ptr<IoEngine>(std::move(engine));
}

int UringIoEngine::read_dev_null() {
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  char byte = 0;
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  io_uring_prep_read(sqe, fd, &byte, 1, 0);
  int res = io_uring_submit_and_wait(&ring_, 1);
  io_uring_cqe* cqe = nullptr;
  if (res >= 0) res = io_uring_wait_cqe(&ring_, &cqe);
  if (res >= 0) {
    res = cqe->res;  // 0: end of file, the read works
    io_uring_cqe_seen(&ring_, cqe);
  }
  ::close(fd);
  return res;
}

Status UringIoEngine::init() {
  // Every op holds at most one SQE, plus the armed eventfd read.
  const unsigned entries = options_.queue_depth + 1;
  if (int r = io_uring_queue_init(entries, &ring_, 0); r < 0) {
    // ENOMEM here is most often the locked-memory limit: rings count against RLIMIT_MEMLOCK
    // on kernels before 5.12.
    return Status::runtime("io_uring_queue_init failed: " + errno_text(-r) +
                           (r == -ENOMEM ? " (the locked-memory limit, ulimit -l?)" : ""));
  }
  ring_ready_ = true;

  // The probe needs io_uring_register, which a sandbox may refuse while reads work (the
  // registrations below are optional): then a read of /dev/null answers instead. Kernels before
  // 5.6 have no probe and no IORING_OP_READ, so the read fails there (EINVAL).
  if (io_uring_probe* probe = io_uring_get_probe_ring(&ring_)) {
    const bool has_ops = io_uring_opcode_supported(probe, IORING_OP_READ) &&
                         io_uring_opcode_supported(probe, IORING_OP_READ_FIXED);
    io_uring_free_probe(probe);
    if (!has_ops)
      return Status::runtime("the kernel's io_uring lacks IORING_OP_READ (Linux < 5.6)");
  } else if (const int res = read_dev_null(); res < 0) {
    return Status::runtime("io_uring cannot read (IORING_OP_READ on /dev/null: " +
                           errno_text(-res) + "; Linux < 5.6 lacks it)");
  }

  // Smoke test: seccomp profiles can allow io_uring_setup and block io_uring_enter.
  KTIER_RETURN_IF_ERROR(run_nop());

  // Buffered reads of cold pages cannot complete inline and go to the kernel's io-wq workers,
  // whose default bound is min(entries, 4 x CPUs): 8 on a 2-core VM, which caps a queue depth of
  // 32 at 8 reads in flight. Raise it to the depth (a hint; older kernels lack it).
  unsigned iowq_workers[2] = {options_.queue_depth, 0};  // bounded, unbounded (0 = unchanged)
  (void)io_uring_register_iowq_max_workers(&ring_, iowq_workers);

  wake_fd_ = eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) return Status::runtime("eventfd failed: " + errno_text(errno));

  if (int r = io_uring_register_files_sparse(&ring_, kFileSlots); r == 0) {
    files_registered_ = true;
    slot_file_.assign(kFileSlots, 0);
    slot_reads_.assign(kFileSlots, 0);
  } else {
    spdlog::debug("io_uring: no registered file table ({}); using plain descriptors",
                  errno_text(-r));
  }
  if (int r = io_uring_register_buffers_sparse(&ring_, kBufferSlots); r == 0) {
    buffers_registered_ = true;
    buffer_slot_used_.assign(kBufferSlots, false);
  } else {
    spdlog::debug("io_uring: no registered buffer table ({}); using plain reads",
                  errno_text(-r));
  }

  // The reaper's first submit makes the kernel set up that thread's io_uring context, which
  // can fail (ENOMEM under a tight memory limit): it runs a no-op first and says how that went,
  // so that such a failure is this Status (and make_io_engine's pread fallback), not the
  // reaper's abort on a ring that stopped working.
  std::promise<Status> started;
  std::future<Status> reaper_ready = started.get_future();
  try {
    reaper_ = std::thread([this, started = std::move(started)]() mutable {
      run_worker("io_uring", [&] {
        Status s = run_nop();
        const bool ok = s.is_ok();
        started.set_value(std::move(s));
        if (ok) reaper_loop();
      });
    });
  } catch (const std::system_error& e) {
    return Status::runtime(std::string("cannot start the io_uring thread: ") + e.what());
  }
  if (Status s = reaper_ready.get(); !s.is_ok()) {
    reaper_.join();
    return s.with_context("the io_uring thread");
  }
  return Status::ok();
}

Status UringIoEngine::run_nop() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  KTIER_CHECK(sqe != nullptr);  // only at start, before any other entry
  io_uring_prep_nop(sqe);
  io_uring_cqe* cqe = nullptr;
  if (int r = io_uring_submit_and_wait(&ring_, 1); r < 0) {
    return Status::runtime("io_uring_enter failed: " + errno_text(-r));
  }
  if (int r = io_uring_wait_cqe(&ring_, &cqe); r < 0) {
    return Status::runtime("io_uring_wait_cqe failed: " + errno_text(-r));
  }
  io_uring_cqe_seen(&ring_, cqe);
  return Status::ok();
}

UringIoEngine::~UringIoEngine() {
  shutdown();
  if (reaper_.joinable()) reaper_.join();
  if (ring_ready_) io_uring_queue_exit(&ring_);  // also drops registered files and buffers
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void UringIoEngine::wake() {
  if (wake_fd_ < 0) return;
  const uint64_t one = 1;
  // Cannot fail short of a bug: the counter saturates only after 2^64 - 2 unread wakes.
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
}

// ---- registered buffers -------------------------------------------------------------------

Status UringIoEngine::register_buffer(void* base, uint64_t bytes) {
  if (bytes == 0) return Status::ok();
  if (!buffers_registered_)
    return Status::runtime("the kernel refused io_uring's registered-buffer table");
  auto* p = static_cast<uint8_t*>(base);
  // One (un)registration at a time; the kernel pins the pages (seconds for a few GiB) outside
  // regions_mu_, which every read's slot lookup takes.
  std::lock_guard registering(register_mu_);
  std::vector<Region> added;
  {
    std::lock_guard lock(regions_mu_);
    // Regions never overlap (buffer_slot_for relies on it): the neighbours decide.
    if (auto next = regions_.lower_bound(p);
        (next != regions_.end() && next->first < p + bytes) ||
        (next != regions_.begin() &&
         std::prev(next)->second.base + std::prev(next)->second.bytes > p))
      return Status::runtime("the region overlaps one registered already");
    // Slots below bounce_count() are reserved for the engine's bounce buffers.
    unsigned slot = bounce_count();
    for (uint64_t off = 0; off < bytes; off += detail::kMaxReadBytes) {
      while (slot < kBufferSlots && buffer_slot_used_[slot]) ++slot;
      if (slot >= kBufferSlots) {
        for (const Region& r : added) buffer_slot_used_[r.slot] = false;
        return Status::runtime("no free registered-buffer slot (" +
                               std::to_string(kBufferSlots) + " in the table)");
      }
      buffer_slot_used_[slot] = true;  // reserved: not looked up until inserted below
      added.push_back(Region{p, p + off, std::min(bytes - off, detail::kMaxReadBytes), slot});
    }
  }
  Status error;
  size_t done = 0;
  for (; done < added.size(); ++done) {
    const Region& r = added[done];
    iovec iov{r.base, r.bytes};
    if (int e = io_uring_register_buffers_update_tag(&ring_, r.slot, &iov, nullptr, 1); e < 0) {
      error = Status::runtime("registering " + std::to_string(r.bytes) +
                              " bytes with io_uring failed: " + errno_text(-e) +
                              " (RLIMIT_MEMLOCK too low?)");
      break;
    }
  }
  for (size_t i = 0; i < done && !error.is_ok(); ++i) {
    iovec empty{nullptr, 0};
    (void)io_uring_register_buffers_update_tag(&ring_, added[i].slot, &empty, nullptr, 1);
  }
  std::lock_guard lock(regions_mu_);
  for (const Region& r : added) {
    if (error.is_ok())
      regions_.emplace(r.base, r);
    else
      buffer_slot_used_[r.slot] = false;
  }
  return error;
}

void UringIoEngine::unregister_buffer(void* base) {
  std::lock_guard registering(register_mu_);
  std::vector<Region> removed;
  {
    std::lock_guard lock(regions_mu_);
    std::erase_if(regions_, [&](const auto& entry) {
      if (entry.second.owner != base) return false;
      removed.push_back(entry.second);
      return true;
    });
  }
  for (const Region& r : removed) {
    iovec empty{nullptr, 0};
    (void)io_uring_register_buffers_update_tag(&ring_, r.slot, &empty, nullptr, 1);
  }
  std::lock_guard lock(regions_mu_);
  for (const Region& r : removed) buffer_slot_used_[r.slot] = false;
}

void UringIoEngine::on_bounce_allocated(uint32_t index, uint8_t* data, uint64_t bytes) {
  if (!buffers_registered_ || index >= kBufferSlots) return;
  iovec iov{data, bytes};
  if (io_uring_register_buffers_update_tag(&ring_, index, &iov, nullptr, 1) < 0) return;
  std::lock_guard lock(regions_mu_);
  buffer_slot_used_[index] = true;
  regions_.emplace(data, Region{data, data, bytes, index});
}

int UringIoEngine::buffer_slot_for(const uint8_t* buf, uint64_t bytes) {
  if (!buffers_registered_) return -1;
  std::lock_guard lock(regions_mu_);
  // The region starting at or below buf (regions never overlap): one lookup per read, however
  // many regions a large expert tier registered.
  auto it = regions_.upper_bound(const_cast<uint8_t*>(buf));
  if (it == regions_.begin()) return -1;
  const Region& r = std::prev(it)->second;
  return buf + bytes <= r.base + r.bytes ? static_cast<int>(r.slot) : -1;
}

// ---- registered files ---------------------------------------------------------------------

int UringIoEngine::file_slot_for(const ReadFile& file) {
  if (!files_registered_) return -1;
  if (auto it = file_slot_of_.find(file.id()); it != file_slot_of_.end()) {
    return static_cast<int>(it->second);
  }
  // A free slot, else one whose file has no read in flight.
  int slot = -1;
  for (unsigned s = 0; s < kFileSlots && slot < 0; ++s) {
    if (slot_file_[s] == 0) slot = static_cast<int>(s);
  }
  for (unsigned s = 0; s < kFileSlots && slot < 0; ++s) {
    if (slot_reads_[s] == 0) slot = static_cast<int>(s);
  }
  if (slot < 0) return -1;
  const int fd = file.fd();
  if (io_uring_register_files_update(&ring_, static_cast<unsigned>(slot), &fd, 1) != 1) return -1;
  if (slot_file_[slot] != 0) file_slot_of_.erase(slot_file_[slot]);
  slot_file_[slot] = file.id();
  file_slot_of_[file.id()] = static_cast<unsigned>(slot);
  return slot;
}

// ---- the reaper ---------------------------------------------------------------------------

io_uring_sqe* UringIoEngine::get_sqe() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) {
    // The SQ holds queue_depth + 1 entries and each op uses at most one, so it is never full
    // after a submit.
    (void)io_uring_submit(&ring_);
    sqe = io_uring_get_sqe(&ring_);
  }
  KTIER_CHECK(sqe != nullptr);
  return sqe;
}

void UringIoEngine::arm_wake_read() {
  io_uring_sqe* sqe = get_sqe();
  io_uring_prep_read(sqe, wake_fd_, &wake_value_, sizeof wake_value_, 0);
  io_uring_sqe_set_data64(sqe, kWakeTag);
}

void UringIoEngine::start_attempt(Op* op) {
  op->attempt = plan_attempt(*op->chunk);
  if (abandon_if_cancelled(*op->chunk, op->attempt)) {
    finish(op);
    return;
  }
  if (op->attempt.inject_eio) {
    complete(op, -EIO);
    return;
  }
  if (op->attempt.not_before > detail::Clock::now()) {
    parked_.push_back(op);
    return;
  }
  issue(op);
}

void UringIoEngine::issue(Op* op) {
  const detail::Attempt& a = op->attempt;
  const ReadFile& file = *op->chunk->file;
  io_uring_sqe* sqe = get_sqe();
  op->file_slot = file_slot_for(file);
  const int fd = op->file_slot >= 0 ? op->file_slot : file.fd();
  const auto len = static_cast<unsigned>(a.length);
  if (int buf_slot = buffer_slot_for(a.buf, a.length); buf_slot >= 0) {
    io_uring_prep_read_fixed(sqe, fd, a.buf, len, a.file_offset, buf_slot);
    count_fixed_read();
  } else {
    io_uring_prep_read(sqe, fd, a.buf, len, a.file_offset);
  }
  if (op->file_slot >= 0) {
    sqe->flags |= IOSQE_FIXED_FILE;
    ++slot_reads_[op->file_slot];
  }
  io_uring_sqe_set_data(sqe, op);
  count_read_issued();
}

void UringIoEngine::complete(Op* op, int64_t res) {
  if (op->file_slot >= 0) --slot_reads_[op->file_slot];
  op->file_slot = -1;
  if (on_result(*op->chunk, op->attempt, res) == Step::kAgain) {
    start_attempt(op);  // recursion depth is bounded by the retry limits
    return;
  }
  finish(op);
}

void UringIoEngine::finish(Op* op) {
  finish_chunk(std::move(op->chunk));
  delete op;
  --ops_active_;
}

void UringIoEngine::reaper_loop() {
  arm_wake_read();
  for (;;) {
    // The rate cap's next opening, where it held the queue's head back.
    auto earliest = detail::Clock::time_point::max();
    while (ops_active_ < options_.queue_depth) {
      std::unique_ptr<detail::Chunk> chunk = take_chunk(Take::kNonBlocking, &earliest);
      if (!chunk) break;
      ++ops_active_;
      auto* op = new Op;
      op->chunk = std::move(chunk);
      start_attempt(op);
    }
    const auto now = detail::Clock::now();
    // A cancel or shutdown wakes this loop (wake()) to fail the parked reads it reached. Each
    // frees a slot of the depth: back to the top, to take what waits for one (a wait below with
    // nothing parked or in flight would not end until something else woke it).
    bool abandoned = false;
    std::erase_if(parked_, [&](Op* op) {
      if (abandon_if_cancelled(*op->chunk, op->attempt)) {
        finish(op);
        abandoned = true;
        return true;
      }
      if (op->attempt.not_before <= now) {
        issue(op);
        return true;
      }
      earliest = std::min(earliest, op->attempt.not_before);
      return false;
    });
    if (abandoned) continue;  // the reads issued above go out with the next pass's submit
    for (;;) {
      const int r = io_uring_submit(&ring_);
      if (r >= 0) break;
      // EINTR: retry. EAGAIN/EBUSY: the kernel is short of resources; completions free them,
      // and the wait below is bounded so that the entries left unsent (the wake read among
      // them) are submitted again even when nothing is in flight to complete.
      // Other errors mean a broken ring (a bug here or a kernel fault): the message names it.
      KTIER_CHECK_MSG(r == -EINTR || r == -EAGAIN || r == -EBUSY, std::strerror(-r));
      if (r != -EINTR) {
        earliest = std::min(earliest, now + std::chrono::milliseconds(1));
        break;
      }
    }
    // Nothing in flight and nothing queued (take_chunk fails what is queued once shut down): a
    // request queued after the take above and before the shutdown is failed, not left behind.
    if (ops_active_ == 0 && shut_down_and_drained()) break;

    io_uring_cqe* cqe = nullptr;
    int r;
    if (earliest == detail::Clock::time_point::max()) {
      r = io_uring_wait_cqe(&ring_, &cqe);
    } else {
      const auto ns = std::max<int64_t>(
          0, std::chrono::duration_cast<std::chrono::nanoseconds>(earliest - now).count());
      __kernel_timespec ts{ns / 1000000000, ns % 1000000000};
      r = io_uring_wait_cqe_timeout(&ring_, &cqe, &ts);
    }
    if (r < 0) {
      KTIER_CHECK_MSG(r == -EINTR || r == -ETIME || r == -EAGAIN || r == -EBUSY,
                      std::strerror(-r));
      continue;
    }
    // Take every completion that is ready before going back to issue more.
    io_uring_cqe* batch[64];
    unsigned n;
    while ((n = io_uring_peek_batch_cqe(&ring_, batch, 64)) > 0) {
      for (unsigned i = 0; i < n; ++i) {
        const uint64_t data = io_uring_cqe_get_data64(batch[i]);
        const int res = batch[i]->res;
        io_uring_cqe_seen(&ring_, batch[i]);
        if (data == LIBURING_UDATA_TIMEOUT) {
          continue;  // liburing's own timeout entry on kernels without IORING_ENTER_EXT_ARG
        } else if (data == kWakeTag) {
          arm_wake_read();  // the read consumed the eventfd counter: all wakes so far are seen
        } else {
          complete(reinterpret_cast<Op*>(data), res);
        }
      }
    }
  }
  // Leave no SQE pointing at this object: the armed wake read stays in the kernel until
  // io_uring_queue_exit cancels it, and it only writes wake_value_, which outlives the ring.
}

}  // namespace ktier::io
