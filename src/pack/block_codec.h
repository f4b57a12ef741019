#pragma once
// One compressed block of a version-2 trunk pack (docs/FORMAT.md, "Compressed records"): up to
// a block size (4 MiB by default) of a layer record's bytes, compressed independently of every
// other block so that blocks are read and inflated in parallel, each into its own disjoint range
// of the destination.
//
// Stored bytes of a block (all integers little-endian):
//   [0, 4)    magic "KTB1"
//   [4]       mode: 0 = whole (the bytes compressed as they are),
//                   1 = bf16 split (plane A = the high byte of every bf16 value, i.e. the bytes at
//                       odd offsets; plane B = the low bytes, at even offsets; inflated length even)
//   [5]       codec of plane A, [6] codec of plane B: 0 = raw (stored as is), 1 = one zstd frame
//   [7]       0
//   [8, 16)   inflated length, bytes
//   [16, 24)  stored length of plane A, bytes
//   [24, 32)  stored length of plane B, bytes (0 in whole mode)
//   [32, ...) plane A, then plane B
// The manifest also records the inflated length and the XXH3_64bits of the inflated bytes; the
// header's copy is checked against it. tools/trunk_blocks.py is an independent implementation.
//
// Thread-safety: the free functions are pure; an InflateScratch is used by one thread at a time.

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "common/status.h"

struct ZSTD_DCtx_s;

namespace ktier::pack {

inline constexpr uint32_t kBlockMagic = 0x3142544bu;  // "KTB1"
inline constexpr uint64_t kBlockHeaderBytes = 32;
// Default inflated bytes per block (`ktier pack --compress --block-size`). Measured in the seed
// notes: the ratio does not depend on it (0.6869 at 4 MB vs 0.6870 at 256 MB), scratch does.
inline constexpr uint64_t kDefaultBlockSize = uint64_t{4} << 20;
// Smallest and largest --block-size: a multiple of 4096 within these bounds.
inline constexpr uint64_t kMinBlockSize = 4096;
inline constexpr uint64_t kMaxBlockSize = uint64_t{1} << 30;
// zstd level of every compressed plane. Level 1 beat 3 on both ratio and speed on real K3
// planes (seed notes: 0.6859x at 838 MB/s vs 0.7143x at 355 MB/s); see docs/PERFORMANCE.md.
inline constexpr int kZstdLevel = 1;

enum class BlockMode : uint8_t { kWhole = 0, kBf16Split = 1 };
enum class PlaneCodec : uint8_t { kRaw = 0, kZstd = 1 };

struct BlockHeader {
  BlockMode mode = BlockMode::kWhole;
  PlaneCodec codec_a = PlaneCodec::kRaw, codec_b = PlaneCodec::kRaw;
  uint64_t inflated = 0;   // bytes
  uint64_t length_a = 0;   // stored bytes of plane A
  uint64_t length_b = 0;   // stored bytes of plane B
};

// Parses and checks the header against the block's stored length (header + planes must be
// exactly `stored.size()` bytes; split mode needs an even inflated length). Status::corrupt
// saying what is wrong (the caller adds the file, record and block).
Result<BlockHeader> parse_block_header(std::span<const uint8_t> stored);
void write_block_header(const BlockHeader& h, uint8_t* out);  // kBlockHeaderBytes bytes

// Compresses `src` into one block: split into bf16 planes when `split` (REQUIRES: even size),
// each plane (or the whole) zstd at `level`, or raw where that is not larger. Returns the stored
// bytes (header included, not padded). Status::runtime only on a zstd failure (out of memory).
Result<std::vector<uint8_t>> deflate_block(std::span<const uint8_t> src, bool split, int level);

// Per-thread state of inflate_block: a zstd decompression context and room for the compressed
// planes of a split block (grown on demand to the block's inflated length). Move-only.
class InflateScratch {
 public:
  InflateScratch();
  ~InflateScratch();
  InflateScratch(InflateScratch&&) noexcept;
  InflateScratch& operator=(InflateScratch&&) noexcept;
  // Bytes held (plane buffer), for budget accounting.
  uint64_t bytes() const { return planes_.size(); }
  // Grows the plane buffer to `inflated` bytes now (so that memory is allocated up front).
  void reserve(uint64_t inflated);

 private:
  friend Status inflate_block(std::span<const uint8_t>, std::span<uint8_t>, InflateScratch&);
  ZSTD_DCtx_s* dctx_ = nullptr;
  std::vector<uint8_t> planes_;
};

// The inflate scratch of the threads that inflate blocks at once: `count` of them, each with room
// for a block of `block_size` inflated bytes (allocated at construction, so nothing grows
// later), lent one at a time. Thread-safety: borrow() and a Lease's return are safe from any
// thread; the set outlives its leases.
class InflateScratchSet {
 public:
  InflateScratchSet(int count, uint64_t block_size);
  InflateScratchSet(const InflateScratchSet&) = delete;
  InflateScratchSet& operator=(const InflateScratchSet&) = delete;

  // Bytes held by all of them, for budget accounting.
  uint64_t bytes() const;

  // One scratch, given back when the lease ends however it ends (a throw too: the set would
  // run short). Returning never allocates.
  class Lease {
   public:
    explicit Lease(InflateScratchSet& set);
    ~Lease();
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    InflateScratch& operator*() const { return *scratch_; }

   private:
    InflateScratchSet& set_;
    InflateScratch* scratch_;
  };
  // REQUIRES (CHECK): fewer than `count` leases out (one per inflating thread).
  Lease borrow() { return Lease(*this); }

 private:
  std::vector<InflateScratch> scratch_;
  std::mutex mu_;
  std::vector<InflateScratch*> free_;  // guarded by mu_; capacity `count`
};

// Inflates the stored block into `dst` (exactly the header's inflated length). Writes only
// `dst`. Status::corrupt when the header, a zstd frame or a plane length is wrong; the content
// itself is checked by the caller (xxh3 of `dst` against the manifest).
Status inflate_block(std::span<const uint8_t> stored, std::span<uint8_t> dst, InflateScratch& scratch);

// bf16 planes: hi[i] = src[2i + 1], lo[i] = src[2i]; and the inverse. n = number of bf16 values.
void split_planes(const uint8_t* src, uint64_t n, uint8_t* hi, uint8_t* lo);
void merge_planes(const uint8_t* hi, const uint8_t* lo, uint64_t n, uint8_t* dst);

// Shannon entropy in bits per byte of a byte histogram (0 for an empty one).
double entropy_bits(const uint64_t (&histogram)[256]);

}  // namespace ktier::pack
