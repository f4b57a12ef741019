#include "cli/serve_threads.h"

#include <chrono>
#include <exception>
#include <new>

#include <spdlog/spdlog.h>

namespace ktier::cli {

HttpTaskQueue::HttpTaskQueue(size_t threads) {
  try {
    threads_.reserve(threads);
    for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
  } catch (const std::exception& e) {
    refusal_ = e.what();
  }
}

void HttpTaskQueue::enqueue(std::function<void()> fn) {
  bool queued = false;
  if (!threads_.empty()) {
    try {
      std::lock_guard lock(mu_);
      jobs_.push_back(std::move(fn));  // all or nothing: fn is kept on a std::bad_alloc
      queued = true;
    } catch (const std::bad_alloc&) {
    }
  }
  if (queued) {
    cv_.notify_one();
  } else {  // no thread, or no room to queue: the listening thread serves it
    run(fn);
  }
}

void HttpTaskQueue::shutdown() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_)
    if (t.joinable()) t.join();
}

void HttpTaskQueue::work() {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      fn = std::move(jobs_.front());
      jobs_.pop_front();
    }
    run(fn);
  }
}

void HttpTaskQueue::run(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    spdlog::error("serve: a connection ended with an error: {}", e.what());
  } catch (...) {
    spdlog::error("serve: a connection ended with an unknown exception");
  }
}

namespace {
// Threads a thread limit must leave to the rest of serve when the connection threads meet it:
// the listening thread, the I/O engine's io_uring thread, the compute pool's one at least.
constexpr size_t kThreadsLeftForTheEngine = 4;
}  // namespace

std::unique_ptr<HttpTaskQueue> start_connection_threads() {
  auto queue = std::make_unique<HttpTaskQueue>(kHttpThreads);
  if (queue->refusal().empty()) return queue;
  const size_t fit = queue->threads();
  const std::string why = queue->refusal();
  queue.reset();  // joins them
  // A joined thread may still count against the limit for a moment (the kernel releases it
  // just after the join returns): a pause, so that the threads below find their room.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const size_t kept = fit > kThreadsLeftForTheEngine ? fit - kThreadsLeftForTheEngine : 0;
  queue = std::make_unique<HttpTaskQueue>(kept);
  spdlog::warn("serve: the system started {} of {} connection threads ({}); serving with {}, "
               "to leave room for the engine's own: connections beyond them wait their turn, "
               "/health and /metrics too while requests generate",
               fit, kHttpThreads, why, queue->threads());
  return queue;
}

}  // namespace ktier::cli
