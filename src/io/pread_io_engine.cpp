#include "io/pread_io_engine.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>
#include <thread>

#include "cpu/worker_thread.h"

namespace ktier::io {

Result<std::unique_ptr<IoEngine>> PreadIoEngine::create(const IoOptions& options) {
  std::unique_ptr<PreadIoEngine> engine(new PreadIoEngine(options));
  const uint32_t n = std::min(options.queue_depth, kMaxPreadThreads);
  for (uint32_t i = 0; i < n; ++i) {
    try {
      engine->workers_.emplace_back(
          [e = engine.get()] { run_worker("pread I/O", [e] { e->worker_loop(); }); });
    } catch (const std::system_error& err) {
      // The destructor joins the threads that did start.
      return Status::runtime("cannot start I/O thread " + std::to_string(i) + " of " +
                             std::to_string(n) + ": " + err.what());
    }
  }
  return std::unique_ptr<IoEngine>(std::move(engine));
}

PreadIoEngine::~PreadIoEngine() {
  shutdown();
  for (std::thread& t : workers_) t.join();
}

void PreadIoEngine::worker_loop() {
  while (auto chunk = take_chunk(Take::kBlocking)) {
    for (;;) {
      const detail::Attempt a = plan_attempt(*chunk);
      // A slow disk (rate cap) or an injected delay: this worker's read starts later, unless
      // its reader cancels it meanwhile.
      if (!wait_to_start(*chunk, a)) break;
      int64_t res;
      if (a.inject_eio) {
        res = -EIO;
      } else {
        count_read_issued();
        const ssize_t n = pread(chunk->file->fd(), a.buf, a.length, static_cast<off_t>(a.file_offset));
        res = n >= 0 ? n : -int64_t{errno};
      }
      if (on_result(*chunk, a, res) == Step::kDone) break;
    }
    finish_chunk(std::move(chunk));
  }
}

}  // namespace ktier::io
