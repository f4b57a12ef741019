#pragma once
// run_worker: the body of a long-lived worker thread (the io_uring reaper, the pread workers,
// the compute pool). An exception escaping a std::thread calls std::terminate (an abort and a
// core dump). The one the environment can cause there is std::bad_alloc under a memory limit
// (ulimit -v, a cgroup), and nothing can complete the requests such a thread holds, so the
// process ends instead with exit 1 (runtime, docs/ARCHITECTURE.md's table) and one line naming the
// thread. Output written so far is flushed first. In cpu/ (the lowest library) because the
// compute pool uses it; the I/O engines of src/io use it too.

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>

namespace ktier {

// Prints and exits inside each handler: the exception (and its what()) dies with the handler.
[[noreturn]] inline void end_worker(const char* thread_name, const char* what) noexcept {
  std::fflush(nullptr);
  std::fprintf(stderr, "ktier: error: %s thread: %s\n", thread_name, what);
  std::_Exit(1);
}

template <typename Body>
void run_worker(const char* thread_name, Body&& body) noexcept {
  try {
    body();
  } catch (const std::bad_alloc&) {
    end_worker(thread_name, "out of memory (the system refused an allocation outside the budgets)");
  } catch (const std::exception& e) {
    end_worker(thread_name, e.what());
  }
}

}  // namespace ktier
