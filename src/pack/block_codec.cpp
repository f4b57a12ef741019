// The compressed block format (block_codec.h).
#include "pack/block_codec.h"

#include <cmath>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include <zstd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common/check.h"

namespace ktier::pack {
namespace {

uint64_t load_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
void store_u64(uint64_t v, uint8_t* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// One plane, zstd-compressed or raw, whichever is smaller. Appends to `out`.
Status deflate_plane(const uint8_t* src, uint64_t n, int level, std::vector<uint8_t>& out,
                     PlaneCodec* codec, uint64_t* length) {
  const size_t bound = ZSTD_compressBound(n);
  const size_t at = out.size();
  out.resize(at + bound);
  const size_t z = ZSTD_compress(out.data() + at, bound, src, n, level);
  if (ZSTD_isError(z)) return Status::runtime(std::string("zstd compression failed: ") + ZSTD_getErrorName(z));
  if (z < n) {
    out.resize(at + z);
    *codec = PlaneCodec::kZstd;
    *length = z;
  } else {
    out.resize(at + n);
    if (n > 0) std::memcpy(out.data() + at, src, n);
    *codec = PlaneCodec::kRaw;
    *length = n;
  }
  return Status::ok();
}

// Inflates one plane of `n` bytes into `dst`, or points `*plane` at the raw bytes in the block.
Status inflate_plane(ZSTD_DCtx* dctx, PlaneCodec codec, const uint8_t* src, uint64_t len,
                     uint8_t* dst, uint64_t n, const uint8_t** plane, const char* which) {
  if (codec == PlaneCodec::kRaw) {
    if (len != n)
      return Status::corrupt(std::string("raw plane ") + which + " holds " + std::to_string(len) +
                             " bytes, expected " + std::to_string(n));
    *plane = src;
    return Status::ok();
  }
  const size_t got = ZSTD_decompressDCtx(dctx, dst, n, src, len);
  if (ZSTD_isError(got))
    return Status::corrupt(std::string("zstd plane ") + which + " does not decode (" +
                           ZSTD_getErrorName(got) + ")");
  if (got != n)
    return Status::corrupt(std::string("zstd plane ") + which + " decodes to " + std::to_string(got) +
                           " bytes, expected " + std::to_string(n));
  *plane = dst;
  return Status::ok();
}

}  // namespace

Result<BlockHeader> parse_block_header(std::span<const uint8_t> stored) {
  if (stored.size() < kBlockHeaderBytes)
    return Status::corrupt("block of " + std::to_string(stored.size()) + " bytes is shorter than its header");
  const uint8_t* p = stored.data();
  const uint32_t magic = static_cast<uint32_t>(load_u64(p) & 0xffffffffu);
  if (magic != kBlockMagic) return Status::corrupt("block does not start with the magic \"KTB1\"");
  BlockHeader h;
  if (p[4] > 1 || p[5] > 1 || p[6] > 1)
    return Status::corrupt("block header has an unknown mode or codec (" + std::to_string(p[4]) + ", " +
                           std::to_string(p[5]) + ", " + std::to_string(p[6]) + ")");
  if (p[7] != 0)
    return Status::corrupt("block header byte 7 (reserved) is " + std::to_string(p[7]) +
                           ", not 0");
  h.mode = static_cast<BlockMode>(p[4]);
  h.codec_a = static_cast<PlaneCodec>(p[5]);
  h.codec_b = static_cast<PlaneCodec>(p[6]);
  h.inflated = load_u64(p + 8);
  h.length_a = load_u64(p + 16);
  h.length_b = load_u64(p + 24);
  const uint64_t body = stored.size() - kBlockHeaderBytes;
  if (h.length_a > body || h.length_b != body - h.length_a)
    return Status::corrupt("block planes of " + std::to_string(h.length_a) + " + " + std::to_string(h.length_b) +
                           " bytes do not fill its " + std::to_string(body) + " stored bytes");
  if (h.mode == BlockMode::kBf16Split && h.inflated % 2 != 0)
    return Status::corrupt("split block has an odd inflated length " + std::to_string(h.inflated));
  if (h.mode == BlockMode::kWhole && (h.length_b != 0 || h.codec_b != PlaneCodec::kRaw))
    return Status::corrupt("whole block has a second plane (" + std::to_string(h.length_b) +
                           " bytes, codec " + std::to_string(p[6]) + ")");
  return h;
}

void write_block_header(const BlockHeader& h, uint8_t* out) {
  store_u64(kBlockMagic, out);
  out[4] = static_cast<uint8_t>(h.mode);
  out[5] = static_cast<uint8_t>(h.codec_a);
  out[6] = static_cast<uint8_t>(h.codec_b);
  out[7] = 0;
  store_u64(h.inflated, out + 8);
  store_u64(h.length_a, out + 16);
  store_u64(h.length_b, out + 24);
}

Result<std::vector<uint8_t>> deflate_block(std::span<const uint8_t> src, bool split, int level) {
  KTIER_CHECK(!split || src.size() % 2 == 0);
  BlockHeader h;
  h.inflated = src.size();
  std::vector<uint8_t> out(kBlockHeaderBytes);
  // Every plane's worst case at once: growing plane by plane could hold two copies of the block.
  out.reserve(kBlockHeaderBytes + (split ? 2 * ZSTD_compressBound(src.size() / 2)
                                         : ZSTD_compressBound(src.size())));
  if (split) {
    const uint64_t n = src.size() / 2;
    std::vector<uint8_t> planes(src.size());
    split_planes(src.data(), n, planes.data(), planes.data() + n);
    h.mode = BlockMode::kBf16Split;
    KTIER_RETURN_IF_ERROR(deflate_plane(planes.data(), n, level, out, &h.codec_a, &h.length_a));
    KTIER_RETURN_IF_ERROR(deflate_plane(planes.data() + n, n, level, out, &h.codec_b, &h.length_b));
  } else {
    h.mode = BlockMode::kWhole;
    KTIER_RETURN_IF_ERROR(deflate_plane(src.data(), src.size(), level, out, &h.codec_a, &h.length_a));
  }
  write_block_header(h, out.data());
  return out;
}

InflateScratch::InflateScratch() : dctx_(ZSTD_createDCtx()) {
  if (dctx_ == nullptr) throw std::bad_alloc();  // zstd's only reason to fail
}
InflateScratch::~InflateScratch() { ZSTD_freeDCtx(dctx_); }
InflateScratch::InflateScratch(InflateScratch&& o) noexcept
    : dctx_(std::exchange(o.dctx_, nullptr)), planes_(std::move(o.planes_)) {}
InflateScratch& InflateScratch::operator=(InflateScratch&& o) noexcept {
  std::swap(dctx_, o.dctx_);
  std::swap(planes_, o.planes_);
  return *this;
}
void InflateScratch::reserve(uint64_t inflated) {
  if (planes_.size() < inflated) planes_.resize(inflated);
}

InflateScratchSet::InflateScratchSet(int count, uint64_t block_size) {
  KTIER_CHECK(count > 0);
  scratch_.resize(static_cast<size_t>(count));
  free_.reserve(scratch_.size());
  for (InflateScratch& s : scratch_) {
    s.reserve(block_size);
    free_.push_back(&s);
  }
}
uint64_t InflateScratchSet::bytes() const {
  uint64_t n = 0;
  for (const InflateScratch& s : scratch_) n += s.bytes();
  return n;
}
InflateScratchSet::Lease::Lease(InflateScratchSet& set) : set_(set) {
  std::lock_guard lock(set_.mu_);
  KTIER_CHECK(!set_.free_.empty());
  scratch_ = set_.free_.back();
  set_.free_.pop_back();
}
InflateScratchSet::Lease::~Lease() {
  std::lock_guard lock(set_.mu_);
  set_.free_.push_back(scratch_);
}

Status inflate_block(std::span<const uint8_t> stored, std::span<uint8_t> dst, InflateScratch& s) {
  KTIER_ASSIGN_OR_RETURN(const BlockHeader h, parse_block_header(stored));
  if (h.inflated != dst.size())
    return Status::corrupt("block header says " + std::to_string(h.inflated) + " inflated bytes, the manifest " +
                           std::to_string(dst.size()));
  const uint8_t* a = stored.data() + kBlockHeaderBytes;
  const uint8_t* b = a + h.length_a;
  if (h.mode == BlockMode::kWhole) {
    const uint8_t* plane = nullptr;
    KTIER_RETURN_IF_ERROR(inflate_plane(s.dctx_, h.codec_a, a, h.length_a, dst.data(), dst.size(), &plane, "A"));
    if (plane != dst.data() && !dst.empty()) std::memcpy(dst.data(), plane, dst.size());
    return Status::ok();
  }
  const uint64_t n = h.inflated / 2;
  s.reserve(h.inflated);
  const uint8_t *hi = nullptr, *lo = nullptr;
  KTIER_RETURN_IF_ERROR(inflate_plane(s.dctx_, h.codec_a, a, h.length_a, s.planes_.data(), n, &hi, "A (high bytes)"));
  KTIER_RETURN_IF_ERROR(inflate_plane(s.dctx_, h.codec_b, b, h.length_b, s.planes_.data() + n, n, &lo, "B (low bytes)"));
  merge_planes(hi, lo, n, dst.data());
  return Status::ok();
}

void split_planes(const uint8_t* src, uint64_t n, uint8_t* hi, uint8_t* lo) {
  for (uint64_t i = 0; i < n; ++i) {
    lo[i] = src[2 * i];
    hi[i] = src[2 * i + 1];
  }
}

void merge_planes(const uint8_t* hi, const uint8_t* lo, uint64_t n, uint8_t* dst) {
  uint64_t i = 0;
#if defined(__SSE2__)
  for (; i + 16 <= n; i += 16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi + i));
    const __m128i l = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lo + i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), _mm_unpacklo_epi8(l, h));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i + 16), _mm_unpackhi_epi8(l, h));
  }
#endif
  for (; i < n; ++i) {
    dst[2 * i] = lo[i];
    dst[2 * i + 1] = hi[i];
  }
}

double entropy_bits(const uint64_t (&histogram)[256]) {
  uint64_t total = 0;
  for (uint64_t c : histogram) total += c;
  if (total == 0) return 0.0;
  double bits = 0;
  for (uint64_t c : histogram) {
    if (c == 0) continue;
    const double p = static_cast<double>(c) / static_cast<double>(total);
    bits -= p * std::log2(p);
  }
  return bits;
}

}  // namespace ktier::pack
