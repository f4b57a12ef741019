// Replaces the global operator new/delete for the test binaries that link it (failing_new.h).
// Arrays and the sized and nothrow forms go through these by the standard library's defaults.
#include "common/failing_new.h"

#include <cstdlib>
#include <new>

namespace {
thread_local long allocations_until_failure = -1;
}  // namespace

namespace ktier::test {
void fail_allocation_after(long k) { allocations_until_failure = k < 0 ? -1 : k; }
bool allocation_failure_pending() { return allocations_until_failure >= 0; }
}  // namespace ktier::test

void* operator new(std::size_t bytes) {
  if (allocations_until_failure == 0) {
    allocations_until_failure = -1;
    throw std::bad_alloc();
  }
  if (allocations_until_failure > 0) --allocations_until_failure;
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
