// Replaces every form of the global operator new and delete for the test binaries that link it
// (failing_new.h): plain, array, nothrow and aligned, on malloc / aligned_alloc and free, one
// count for all of them. An armed failure throws std::bad_alloc (nothrow forms: return null).
#include "tests/common/failing_new.h"

#include <cstddef>
#include <cstdlib>
#include <new>

namespace {

thread_local long allocations_until_failure = -1;

// Null where the armed failure comes now (or malloc fails).
void* allocate(std::size_t bytes, std::size_t alignment) {
  if (allocations_until_failure == 0) {
    allocations_until_failure = -1;
    return nullptr;
  }
  if (allocations_until_failure > 0) --allocations_until_failure;
  if (bytes == 0) bytes = 1;
  if (alignment <= alignof(std::max_align_t)) return std::malloc(bytes);
  // aligned_alloc wants a size that is a multiple of the alignment.
  return std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
}

void* allocate_or_throw(std::size_t bytes, std::size_t alignment) {
  if (void* p = allocate(bytes, alignment)) return p;
  throw std::bad_alloc();
}

}  // namespace

namespace ktier::test {
void fail_allocation_after(long k) { allocations_until_failure = k < 0 ? -1 : k; }
bool allocation_failure_pending() { return allocations_until_failure >= 0; }
}  // namespace ktier::test

constexpr std::size_t kPlain = alignof(std::max_align_t);

void* operator new(std::size_t n) { return allocate_or_throw(n, kPlain); }
void* operator new[](std::size_t n) { return allocate_or_throw(n, kPlain); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return allocate(n, kPlain); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return allocate(n, kPlain); }
void* operator new(std::size_t n, std::align_val_t a) {
  return allocate_or_throw(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return allocate_or_throw(n, static_cast<std::size_t>(a));
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return allocate(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return allocate(n, static_cast<std::size_t>(a));
}

void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  std::free(p);
}
