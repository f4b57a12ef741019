#include "cpu/thread_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>
#include <utility>

#include "cpu/fp_control.h"
#include "cpu/worker_thread.h"

namespace ktier::cpu {
namespace {
// Set while this thread runs a range of some pool: a nested parallel_for then runs inline.
thread_local bool tls_inside_range = false;

// Pauses spent waiting for the next call (a worker) or for the workers (the caller) before
// sleeping: ~10-100 us depending on the CPU's pause latency.
constexpr int kSpinRounds = 2000;

inline void cpu_pause() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Spins until done() or kSpinRounds pauses; returns done().
template <class Done>
bool spin_until(const Done& done) {
  for (int i = 0; i < kSpinRounds; ++i) {
    if (done()) return true;
    cpu_pause();
  }
  return done();
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads < 1 || n_threads > kMaxThreads) {
    std::fprintf(stderr, "ktier_cpu: ThreadPool takes 1..%d threads (got %d)\n", kMaxThreads,
                 n_threads);
    std::abort();
  }
  workers_.reserve(static_cast<size_t>(n_threads - 1));
  for (int i = 1; i < n_threads; ++i) {
    try {
      workers_.emplace_back([this] { run_worker("compute", [this] { worker_loop(); }); });
    } catch (const std::exception& e) {  // a thread or memory limit: run with those started
      try {
        start_error_ = "could start only " + std::to_string(i - 1) + " of " +
                       std::to_string(n_threads - 1) + " worker threads (" + e.what() + ")";
      } catch (...) {
        start_error_ = "out of memory";  // fits the string's own buffer: no allocation
      }
      break;
    }
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_.store(true, std::memory_order_relaxed);  // under mu_: the sleepers' predicate
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::work_on(const Job& job) {
  struct Inside {  // restored however the ranges end
    bool was = tls_inside_range;
    Inside() { tls_inside_range = true; }
    ~Inside() { tls_inside_range = was; }
  } inside;
  for (;;) {
    const int64_t c = next_chunk_.fetch_add(1, std::memory_order_relaxed);
    if (c >= job.n_chunks) break;
    const int64_t b = c * job.grain;
    try {
      job.fn(job.ctx, b, std::min(job.n, b + job.grain));
    } catch (...) {
      // The call has failed: the ranges not started are skipped, and run() rethrows the first
      // exception on its caller once no thread is inside the job (whose ranges may use the
      // caller's stack and buffers).
      std::lock_guard<std::mutex> lk(error_mu_);
      if (!error_) error_ = std::current_exception();
      next_chunk_.store(job.n_chunks, std::memory_order_relaxed);
    }
  }
}

void ThreadPool::run(int64_t n, int64_t grain, RangeFn fn, void* ctx) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t n_chunks = (n + grain - 1) / grain;
  if (workers_.empty() || n_chunks == 1 || tls_inside_range) {
    for (int64_t b = 0; b < n; b += grain) fn(ctx, b, std::min(n, b + grain));
    return;
  }
  std::lock_guard<std::mutex> serial(submit_mu_);
  Job job{fn, ctx, n, grain, n_chunks, fp_control_now()};
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = job;
    next_chunk_.store(0, std::memory_order_relaxed);
    pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    ++generation_;
    published_.store(generation_, std::memory_order_release);
  }
  work_cv_.notify_all();
  work_on(job);
  // Acquire: the workers' writes (their ranges' outputs, error_) happen before their decrement.
  const auto all_done = [this] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(all_done)) {
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, all_done);
  }
  std::exception_ptr failed;
  {
    std::lock_guard<std::mutex> lk(error_mu_);
    failed = std::exchange(error_, nullptr);
  }
  if (failed) std::rethrow_exception(failed);
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    // Spin a little for the next call before sleeping; the job itself is read under mu_.
    spin_until([&] {
      return published_.load(std::memory_order_acquire) != seen ||
             stopping_.load(std::memory_order_relaxed);
    });
    Job job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      const auto stopping = [&] { return stopping_.load(std::memory_order_relaxed); };
      work_cv_.wait(lk, [&] { return stopping() || generation_ != seen; });
      if (stopping()) return;
      seen = generation_;
      job = job_;
    }
    take_fp_control(job.fp_control);
    work_on(job);
    // The last worker out wakes a caller that went to sleep; taking mu_ first means the caller
    // is either still before its predicate check or already waiting, never in between.
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lk(mu_);
      done_cv_.notify_one();
    }
  }
}

}  // namespace ktier::cpu
