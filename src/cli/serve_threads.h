#pragma once
// The connection threads of `ktier serve` (cpp-httplib's TaskQueue).
//
// cpp-httplib's own ThreadPool ends the process where the system refuses a thread (a pids or
// thread limit: its constructor unwinds past joinable threads, which is std::terminate); this
// one serves with the threads it could start (refusal() says why the rest did not), and with
// none on the listening thread itself, one connection at a time.
// Thread-safety: enqueue() from any thread (cpp-httplib's listening thread); shutdown() once the
// listener has stopped (cpp-httplib calls it; so does the destructor).

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

namespace ktier::cli {

// The connection threads asked for.
inline constexpr size_t kHttpThreads = 32;

class HttpTaskQueue final : public httplib::TaskQueue {
 public:
  explicit HttpTaskQueue(size_t threads);
  ~HttpTaskQueue() override { shutdown(); }
  size_t threads() const { return threads_.size(); }
  const std::string& refusal() const { return refusal_; }
  HttpTaskQueue(const HttpTaskQueue&) = delete;
  HttpTaskQueue& operator=(const HttpTaskQueue&) = delete;

  // Queued for a thread; with no thread, or no room to queue, run on the caller's.
  void enqueue(std::function<void()> fn) override;
  // Runs what is queued, then joins the threads.
  void shutdown() override;

 private:
  void work();
  // A connection's work. What escapes it (cpp-httplib catches its handlers' exceptions, not
  // all of its own) is logged and the thread goes on; the server lives, but cpp-httplib leaves
  // that connection's socket open (its client waits for its own timeout).
  static void run(const std::function<void()>& fn);

  std::mutex mu_;  // guards jobs_ and stopping_
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::string refusal_;  // empty when every thread asked for started
  std::vector<std::thread> threads_;  // last: started once the members they use exist
};

// kHttpThreads connection threads, or under a thread limit (ulimit -u, a container's
// pids.max) as many as leave room for the engine's own threads, said in one warning.
std::unique_ptr<HttpTaskQueue> start_connection_threads();

}  // namespace ktier::cli
