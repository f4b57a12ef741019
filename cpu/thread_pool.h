#pragma once
// A fixed pool of worker threads for the CPU kernels.
//
// parallel_for(n, grain, fn) covers [0, n) with disjoint ranges [b, e) of at most `grain`
// indices (the last may be shorter) and calls fn(b, e) exactly once per range, on the calling
// thread or a worker, then returns when every range is done. Kernels use it only over
// independent outputs (rows, heads, tokens, channels): each output element is written by
// exactly one call and nothing is reduced across calls, so results never depend on the number
// of threads or on which thread ran which range.
//
// Thread-safety: parallel_for may be called from several threads; calls are serialised. A call
// made from inside a range (of any pool) runs inline on that thread, so nesting cannot deadlock.
// fn may throw: the first exception skips the ranges not started yet and is rethrown by
// parallel_for on its caller once no thread is inside the call any more (the ranges may use the
// caller's stack); the pool goes on working. Between calls, workers spin for tens of
// microseconds (kSpinRounds pauses) before they sleep on a condition variable, and so does the
// caller waiting for them: a decode step makes hundreds of short calls, and a sleep/wake-up pair
// costs more than many of them.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace ktier::cpu {

// The most threads a pool takes (the command lines refuse more; see cli::add_threads_option).
inline constexpr int kMaxThreads = 1024;

class ThreadPool {
 public:
  // n_threads counts the calling thread: a pool of N starts N-1 workers. If the system refuses
  // a thread (a process or memory limit: any exception from std::thread), the pool runs with the
  // workers it has: size() says how many threads that is and start_error() why (empty when all
  // started). Output bytes never depend on the count.
  // REQUIRES: 1 <= n_threads <= kMaxThreads.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  const std::string& start_error() const { return start_error_; }

  template <class Fn>
  void parallel_for(int64_t n, int64_t grain, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    run(
        n, grain, [](void* ctx, int64_t b, int64_t e) { (*static_cast<F*>(ctx))(b, e); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using RangeFn = void (*)(void* ctx, int64_t begin, int64_t end);
  struct Job {
    RangeFn fn = nullptr;
    void* ctx = nullptr;
    int64_t n = 0, grain = 1, n_chunks = 0;
    // The caller's floating-point control (x86 MXCSR: rounding, FTZ/DAZ), which the workers
    // take on for the job: a thread inherits its creator's at creation only, so a setting made
    // after the pool started (a library loaded later, an embedding program) would otherwise
    // make denormal results depend on which thread ran a range.
    uint32_t fp_control = 0;
  };

  void run(int64_t n, int64_t grain, RangeFn fn, void* ctx);
  void work_on(const Job& job);
  void worker_loop();

  std::vector<std::thread> workers_;
  std::string start_error_;  // set once by the constructor
  std::mutex submit_mu_;  // one parallel_for at a time
  std::mutex mu_;         // guards job_, generation_; held to notify done_cv_ and to set stopping_
  std::condition_variable work_cv_, done_cv_;
  Job job_;
  uint64_t generation_ = 0;
  std::atomic<uint64_t> published_{0};  // generation_, for workers spinning without mu_
  // Set once, under mu_, by the destructor; read under mu_ by sleeping workers and without it by
  // spinning ones.
  std::atomic<bool> stopping_{false};
  std::atomic<int> pending_{0};         // workers still inside the current generation
  std::atomic<int64_t> next_chunk_{0};
  std::mutex error_mu_;
  std::exception_ptr error_;  // the current call's first exception (guarded by error_mu_)
};

// parallel_for on `pool`, or inline on the calling thread when pool is null.
template <class Fn>
void parallel_for(ThreadPool* pool, int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  if (pool == nullptr) {
    fn(int64_t{0}, n);
    return;
  }
  pool->parallel_for(n, grain, fn);
}

}  // namespace ktier::cpu
