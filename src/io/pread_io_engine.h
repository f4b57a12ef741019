#pragma once
// PreadIoEngine: the portable IoEngine. A pool of worker threads, each taking the next chunk in
// submission order and reading it with pread(2); min(queue_depth, kMaxPreadThreads) threads
// give that many reads in flight. Used where io_uring is unavailable (containers with seccomp
// filters, io_uring_disabled, old kernels) and by `--io pread`.
//
// Why threads and not one synchronous loop: the expert path needs many reads in flight to keep
// an NVMe queue busy (issue 4: at least 16); the anchor engine reached only 1.1-1.2 GB/s cold
// on experts with few reads in flight.
//
// Thread-safety and contract: as IoEngine (io_engine.h). The destructor cancels requests not yet
// started (they complete with Status::runtime), waits for running reads, and joins the threads.

#include <memory>
#include <thread>
#include <vector>

#include "io/queued_engine.h"

namespace ktier::io {

class PreadIoEngine final : public detail::QueuedIoEngine {
 public:
  // Starts the threads. Status::runtime if a thread cannot be started.
  static Result<std::unique_ptr<IoEngine>> create(const IoOptions& options);
  ~PreadIoEngine() override;
  const char* name() const override { return "pread"; }

 private:
  explicit PreadIoEngine(const IoOptions& options) : QueuedIoEngine(options) {}
  void worker_loop();
  std::vector<std::thread> workers_;
};

}  // namespace ktier::io
