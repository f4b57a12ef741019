#pragma once
// Software prefetch for the decode (T = 1) tiles of the x86 linear kernels, whose rows are
// contiguous in memory: each row stream of a tile fetches the same offset a whole number of
// tiles ahead, at least a given distance, so the prefetches continue every stream exactly; the
// first tiles of a range are fetched up front (prefetch_range). Decode weights are usually cold
// (an expert just read or mapped), and several row streams are more than the hardware
// prefetchers keep ahead of (avx512_linear.cpp has the measurement).
//
// Included by kernels compiled with different -m flags (avx2_linear.cpp, avx512_linear.cpp):
// everything here has internal linkage, so no copy compiled for one instruction set can be
// linked into another's callers.

#include <xmmintrin.h>

#include <cstdint>

namespace ktier::cpu::x86 {
namespace {

// Bytes ahead for tiles of tile_bytes: whole tiles, at least min_bytes (0 for an empty tile).
inline int64_t whole_tiles_ahead(int64_t tile_bytes, int64_t min_bytes) {
  return tile_bytes <= 0 ? 0 : (min_bytes + tile_bytes - 1) / tile_bytes * tile_bytes;
}

// Prefetches [p, p + n), one line at a time.
inline void prefetch_range(const void* p, int64_t n) {
  for (int64_t off = 0; off < n; off += 64)
    _mm_prefetch(static_cast<const char*>(p) + off, _MM_HINT_T0);
}

}  // namespace
}  // namespace ktier::cpu::x86
