#include "io/aligned_buffer.h"

#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "common/check.h"

namespace ktier::io {
namespace {
std::atomic<uint64_t> g_live_bytes{0};
}

Result<AlignedBuffer> AlignedBuffer::allocate(size_t bytes, size_t alignment, HugePages huge) {
  KTIER_CHECK(alignment >= alignof(std::max_align_t) && (alignment & (alignment - 1)) == 0);
  AlignedBuffer buf;
  if (bytes == 0) return buf;
  if (huge == HugePages::kYes && alignment < kHugePageBytes) alignment = kHugePageBytes;
  const size_t rounded = align_up(bytes, alignment);
  if (rounded < bytes) return Status::runtime("cannot allocate " + std::to_string(bytes) + " bytes");
  void* p = std::aligned_alloc(alignment, rounded);
  if (p == nullptr) {
    return Status::runtime("cannot allocate " + std::to_string(rounded) +
                           " bytes of aligned memory (out of memory?)");
  }
  // A hint only: without THP support the buffer still works, on 4 KiB pages.
  if (huge == HugePages::kYes) (void)madvise(p, rounded, MADV_HUGEPAGE);
  buf.data_ = static_cast<uint8_t*>(p);
  buf.size_ = rounded;
  buf.alignment_ = alignment;
  g_live_bytes.fetch_add(rounded, std::memory_order_relaxed);
  return buf;
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(other.data_), size_(other.size_), alignment_(other.alignment_) {
  other.data_ = nullptr;
  other.size_ = 0;
  other.alignment_ = 0;
}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    size_ = other.size_;
    alignment_ = other.alignment_;
    other.data_ = nullptr;
    other.size_ = 0;
    other.alignment_ = 0;
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { release(); }

void AlignedBuffer::release() {
  if (data_ != nullptr) {
    std::free(data_);
    g_live_bytes.fetch_sub(size_, std::memory_order_relaxed);
  }
  data_ = nullptr;
  size_ = 0;
  alignment_ = 0;
}

uint64_t AlignedBuffer::live_bytes() { return g_live_bytes.load(std::memory_order_relaxed); }

}  // namespace ktier::io
