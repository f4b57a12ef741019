#pragma once
// AlignedBuffer: an owned, aligned block of host memory for O_DIRECT reads (ring slots, expert
// slots, bounce buffers), with a process-wide count of live bytes so that the memory budget
// (DESIGN.md §4, "every allocation is counted") can include it.
//
// Why a separate type: O_DIRECT needs the destination aligned to the device's DMA alignment
// (ReadFile::alignment(), at most kDefaultAlignment on every filesystem we know), and large
// slots want 2 MiB transparent huge pages: the kernel pins every destination page of a direct
// read, and a 2.37 GB slot on 4 KiB pages means ~578,000 pins per read (ANCHOR-ENGINE.md §2.3).
//
// Ownership: an AlignedBuffer owns its memory and frees it in the destructor; it is move-only.
// Thread-safety: the object itself is not synchronised (like std::vector); live_bytes() may be
// called from any thread.

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/status.h"

namespace ktier::io {

// Alignment that satisfies O_DIRECT on every filesystem ktier expects (4 KiB pages / sectors).
inline constexpr size_t kDefaultAlignment = 4096;
// The largest direct-I/O alignment a file is read directly at (a power of two that statx reports
// up to this; larger ones are read buffered): bounce buffers are aligned to it and hold two.
inline constexpr size_t kMaxDirectAlignment = size_t{32} << 10;
// Transparent huge page size on x86-64; huge-page buffers are aligned to and sized in it.
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

enum class HugePages {
  kNo,   // plain aligned allocation
  kYes,  // align and round to 2 MiB and madvise(MADV_HUGEPAGE); a hint, never an error
};

class AlignedBuffer {
 public:
  AlignedBuffer() = default;  // empty: data() == nullptr, size() == 0
  // Allocates at least `bytes` (rounded up to `alignment`, or to 2 MiB with huge pages).
  // REQUIRES: alignment is a power of two >= alignof(max_align_t). Contents are uninitialised.
  // Status::runtime when the allocation fails (message states the size).
  static Result<AlignedBuffer> allocate(size_t bytes, size_t alignment = kDefaultAlignment,
                                        HugePages huge = HugePages::kNo);

  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  // Usable bytes (the rounded size); this is what is counted against a budget.
  size_t size() const { return size_; }
  size_t alignment() const { return alignment_; }
  std::span<uint8_t> span() { return {data_, size_}; }
  std::span<const uint8_t> span() const { return {data_, size_}; }
  bool empty() const { return size_ == 0; }

  // Sum of size() over all live AlignedBuffers in the process, in bytes.
  static uint64_t live_bytes();

 private:
  void release();
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t alignment_ = 0;
};

// Rounding helpers for alignments that are powers of two.
constexpr uint64_t align_down(uint64_t x, uint64_t alignment) { return x & ~(alignment - 1); }
constexpr uint64_t align_up(uint64_t x, uint64_t alignment) {
  return (x + alignment - 1) & ~(alignment - 1);
}
constexpr bool is_aligned(uint64_t x, uint64_t alignment) { return (x & (alignment - 1)) == 0; }
inline bool is_aligned(const void* p, uint64_t alignment) {
  return is_aligned(reinterpret_cast<uintptr_t>(p), alignment);
}

// The aligned range that covers [offset, offset + length) of a file of `file_size` bytes: read
// `length` bytes into an aligned buffer at file offset `offset`, then find the payload at
// buffer + `payload_offset`. This is the caller-side pattern that keeps O_DIRECT reads of
// unaligned tensors zero-copy (no bounce buffer). The cover stops at the end of the file (a
// read past it is refused): there its last block is shorter, and the engine bounces only that.
// REQUIRES offset + length <= file_size.
struct AlignedCover {
  uint64_t offset = 0;          // align_down(offset)
  uint64_t length = 0;          // min(align_up(offset + length), file_size) - this->offset
  uint64_t payload_offset = 0;  // offset - this->offset
};
constexpr AlignedCover aligned_cover(uint64_t offset, uint64_t length, uint64_t alignment,
                                     uint64_t file_size) {
  const uint64_t begin = align_down(offset, alignment);
  const uint64_t end = align_up(offset + length, alignment);
  return {begin, (end < file_size ? end : file_size) - begin, offset - begin};
}

}  // namespace ktier::io
