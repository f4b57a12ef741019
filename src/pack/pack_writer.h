#pragma once
// `ktier pack`: writes the trunk pack of a checkpoint (trunk_pack.h, docs/FORMAT.md).
//
// Guarantees:
//  * Interrupt-safe: the pack is written as PACKDIR/.trunk.pack.partial and
//    PACKDIR/.manifest.json.partial, both fsynced, then renamed to trunk.pack and, last,
//    manifest.json; the directory is fsynced after the renames. A folder without manifest.json
//    is never a finished pack, and TrunkPack::open() refuses it. With `force`, an earlier
//    manifest.json is removed just before the renames, so until then the earlier pack stays
//    usable, and after a failure in between the folder is no pack at all (never a mixed one).
//  * Exact: every tensor's bytes are copied as stored (no dtype conversion); padding is zeros.
//    With PackOptions::block_size the layer records are stored as compressed blocks
//    (block_codec.h) whose inflated bytes are exactly those of the plain record.
//  * Bounded memory: one copy buffer of PackOptions::buffer_bytes, whatever the record sizes
//    (plus about 3 x block_size per thread when compressing: the block read, its split planes
//    and the compressed output, with zstd's own working memory).
//    Tensors are read with Checkpoint shard reads of up to that size, in checkpoint order
//    (sequential within each shard), and written with one write() per full buffer.
//  * Errors: PACKDIR holding manifest.json or trunk.pack without `force`, or PACKDIR a file →
//    Status::usage (exit 2, the message says --force where it helps); too little free space, or
//    any I/O failure, or another writer holding PACKDIR's lock → Status::runtime (exit 1)
//    naming the file; partial files are removed on failure. Shard read errors pass through with
//    their own codes. Never throws.
// One writer per PACKDIR: a second one, in this process or another on this host, is refused
// (flock on the folder; a network filesystem may not lock across hosts).

#include <cstdint>
#include <filesystem>
#include <string>

#include "common/status.h"
#include "format/checkpoint.h"

namespace ktier::pack {

struct PackOptions {
  std::filesystem::path out_dir;  // PACKDIR; created if missing
  bool force = false;             // replace an existing pack
  bool progress = false;          // progress meter on stderr
  // Copy buffer: bytes per write() and the largest shard read. Multiple of 4096.
  uint64_t buffer_bytes = uint64_t{64} << 20;
  // > 0: `--compress`, a version-2 pack whose layer records are compressed blocks of this many
  // inflated bytes (a multiple of 4096 in [kMinBlockSize, kMaxBlockSize]); 0: version 1, plain.
  uint64_t block_size = 0;
  // Threads compressing blocks (>= 1). Memory: about 3 x block_size per thread, on top of the
  // buffer.
  int threads = 1;
};

struct PackReport {
  std::filesystem::path pack_path;      // PACKDIR/trunk.pack
  std::filesystem::path manifest_path;  // PACKDIR/manifest.json
  uint64_t records = 0;
  uint64_t layers = 0;
  uint64_t tensors = 0;
  uint64_t payload_bytes = 0;   // tensor bytes copied
  uint64_t file_size = 0;       // trunk.pack, padding included
  uint64_t expert_bytes = 0;    // routed expert bytes left in the shards
  uint64_t ignored_bytes = 0;   // vision / MTP bytes not packed
  uint64_t block_size = 0;      // 0: plain pack
  uint64_t blocks = 0;          // compressed blocks written
  uint64_t layer_bytes = 0;     // layer records, inflated (size, padding included)
  uint64_t layer_stored = 0;    // the same records as stored (== layer_bytes when plain)
  double seconds = 0.0;         // copy, fsync and renames
};

// Status::usage when `out_dir` is a file, holds a manifest.json that is not a trunk pack's
// (another tool's: never replaced), or already holds manifest.json or trunk.pack and `force` is
// false. Cheap; `ktier pack` calls it before opening the checkpoint.
Status check_pack_output(const std::filesystem::path& out_dir, bool force);
// Status::usage naming --block-size unless `block_size` (bytes; 0 = not compressed) is 0 or a
// multiple of kRecordAlignment in kMinBlockSize..kMaxBlockSize. Asked before the checkpoint is
// opened (its validation takes seconds on K3) and again by write_trunk_pack.
Status check_block_size(uint64_t block_size);

Result<PackReport> write_trunk_pack(const format::Checkpoint& ckpt, const PackOptions& options);

// Human summary (what `ktier pack` prints to stdout).
std::string format_pack_report(const PackReport& report);

}  // namespace ktier::pack
