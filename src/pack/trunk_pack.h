#pragma once
// The trunk pack (docs/FORMAT.md, "Trunk pack"): every non-expert tensor of a checkpoint copied
// into one file, PACKDIR/trunk.pack, as 4096-aligned records (one per decoder layer, then "head",
// then "embed"), described by PACKDIR/manifest.json. The engine streams a layer with one O_DIRECT
// read of its record and checks the record's xxh3 before any byte reaches a kernel. Routed
// experts are not in the pack; they are read from the shards.
//
// Version 2 (`ktier pack --compress`) stores each layer record as independently compressed
// blocks (block_codec.h; Record::blocks) whose inflated bytes are exactly the version-1 record;
// head and embed stay stored as they are. Version 1 packs are written and read as before.
//
// This header holds the format (constants, the record table), the layout rule shared by the
// writer (pack_writer.h) and the reader, and the reader, TrunkPack.
//
// TrunkPack::open() validates the manifest against itself, against trunk.pack's size and against
// the checkpoint, and reads no record bytes. Errors:
//   * PACKDIR missing or not a directory: Status::usage (exit 2);
//   * manifest.json or trunk.pack missing, unreadable as JSON, of another format or version, or
//     inconsistent (records outside the file, overlapping, misaligned, tensors outside their
//     record, blocks misplaced or not tiling their record, trunk.pack's size not the
//     manifest's): Status::corrupt (exit 3) naming the file;
//   * a pack whose tensor table differs from the checkpoint's non-expert tensors (names, record,
//     dtype, shape): Status::corrupt naming the tensor;
//   * a pack made from another checkpoint (source fingerprint differs, see SourceFingerprint):
//     Status::usage (exit 2) "pack was made from another checkpoint: rerun ktier pack". Usage,
//     not corrupt: both inputs are intact, the command line pairs the wrong ones.
// A record whose bytes do not match its checksum is found by verify(), when it is read.
//
// Ownership and threads: a TrunkPack owns its parsed manifest (no open file); it is move-only and
// immutable after open(), so every const method may be called from any thread at once. Record
// and TensorEntry references live as long as the TrunkPack.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/dtype.h"
#include "common/status.h"
#include "format/checkpoint.h"
#include "pack/block_codec.h"

namespace ktier::pack {

inline constexpr const char* kPackFormat = "ktier-trunk-pack";
inline constexpr int64_t kPackVersion = 1;            // plain packs (every record as stored)
inline constexpr int64_t kPackVersionCompressed = 2;  // layer records as compressed blocks
inline constexpr const char* kPackFileName = "trunk.pack";
inline constexpr const char* kManifestFileName = "manifest.json";
// A manifest holds ~150 bytes per tensor (K3's trunk: a few thousand); a larger file is not one.
inline constexpr uint64_t kMaxManifestBytes = uint64_t{256} << 20;
// Records start at, and are zero-padded to, multiples of this (the O_DIRECT block of every
// filesystem ktier targets). Bytes.
inline constexpr uint64_t kRecordAlignment = 4096;
// Tensors start at multiples of this inside their record (a cache line; AVX-512 loads). Bytes.
inline constexpr uint64_t kTensorAlignment = 64;
// Bytes of each shard's data section hashed into SourceFingerprint::Shard::sample_xxh3, at the
// start, the middle and the end of the section.
inline constexpr uint64_t kSampleWindowBytes = 4096;
// Bytes sampled at each end of every packed tensor for the fingerprint (sample_xxh3).
inline constexpr uint64_t kTensorSampleBytes = 64;

inline constexpr uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

enum class RecordKind { kLayer, kHead, kEmbed };

// One tensor inside a record.
struct TensorEntry {
  std::string name;  // checkpoint name, e.g. "language_model.model.layers.3.self_attn.o_proj.weight"
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // bytes from the start of the record; multiple of kTensorAlignment
  uint64_t nbytes = 0;  // numel x dtype size; the bytes exactly as stored in the checkpoint
  uint32_t record = 0;  // index of its record in TrunkPack::records() / PackLayout::records
};

// One compressed block of a record (version 2; block_codec.h has its stored bytes). Blocks tile
// the record's inflated bytes in order: block k inflates to [sum of the earlier `inflated`, +
// inflated). Stored back to back in trunk.pack, each starting on a kRecordAlignment boundary.
struct Block {
  uint64_t offset = 0;    // in trunk.pack; multiple of kRecordAlignment
  uint64_t length = 0;    // stored bytes (header + planes); zero padding follows to the alignment
  uint64_t inflated = 0;  // bytes it inflates to, recorded (never derived from the block size)
  uint64_t xxh3 = 0;      // XXH3_64bits of the inflated bytes
  uint64_t raw_offset = 0;  // where they go in the record (not in the manifest: running sum)
};

// One record: a contiguous, aligned range of trunk.pack.
struct Record {
  std::string name;  // "layer.{l}", "head" or "embed"
  RecordKind kind = RecordKind::kLayer;
  int64_t layer = -1;   // decoder layer for kLayer, -1 otherwise
  uint64_t offset = 0;  // in trunk.pack; multiple of kRecordAlignment
  uint64_t size = 0;    // padded (inflated) length; multiple of kRecordAlignment
  uint64_t bytes = 0;   // end of the last tensor (payload); size == align_up(bytes, 4096)
  uint64_t xxh3 = 0;    // XXH3_64bits over all `size` inflated bytes, padding included
  std::vector<TensorEntry> tensors;  // ascending offset, the checkpoint's order
  // Version 2 layer records: stored as `blocks`, occupying [offset, offset + stored_size) of
  // trunk.pack. Otherwise the record's `size` bytes are stored as they are and stored_size == size.
  bool compressed = false;
  uint64_t stored_size = 0;  // multiple of kRecordAlignment
  std::vector<Block> blocks;
};

// What a pack was made from. Cheap to compute (headers plus 12 KiB per shard) and equal for a
// byte-identical copy of the checkpoint anywhere on disk. It tells checkpoints apart, it does not
// prove their tensor bytes intact: synthetic checkpoints that differ only in their seed have
// identical headers and configs, so a sample of each shard's data is hashed too.
struct SourceFingerprint {
  struct Shard {
    std::string file;          // file name inside the model directory
    uint64_t size = 0;         // bytes
    uint64_t header_xxh3 = 0;  // over bytes [0, 8 + N): length prefix and JSON header
    uint64_t sample_xxh3 = 0;  // over up to 3 windows of kSampleWindowBytes of the data section,
                               // then both ends of each packed tensor (kTensorSampleBytes)
  };
  uint64_t config_xxh3 = 0;  // over config.json as stored
  std::vector<Shard> shards;  // Checkpoint::shard() order, every shard it opened

  bool operator==(const SourceFingerprint&) const = default;
};

// Where each record goes and what it holds: the layout rule of version 1, a pure function of the
// checkpoint's headers. Record checksums are left 0.
struct PackLayout {
  std::vector<Record> records;  // L layer records, then head, then embed
  // For every TensorEntry, in record order then tensor order: the tensor in the checkpoint.
  std::vector<std::vector<format::TensorRef>> sources;  // [record][tensor]
  uint64_t file_size = 0;     // end of the last record
  uint64_t payload_bytes = 0;  // sum of tensor nbytes
};

// The layout of `ckpt`'s trunk pack. Every tensor under language_model.model.layers.{l}. with
// l < num_hidden_layers that is not a routed expert (`.block_sparse_moe.experts.`) goes to
// record "layer.{l}"; the final norm, the output AttnRes pair and lm_head to "head"; embed_tokens
// to "embed"; vision and MTP tensors nowhere. Inside a record tensors keep checkpoint order (shard
// order, then file offset). Never fails on a checkpoint that Checkpoint::open() accepted.
PackLayout plan_trunk_pack(const format::Checkpoint& ckpt);

// Where the blocks of a compressed layer record are cut (version 2): the record is divided into
// runs of consecutive tensors of one kind (bf16, or anything else), each tensor's run including
// the padding after it; each run is cut into blocks of `block_size` bytes, the last one shorter.
// Blocks of bf16 runs of even length are byte-split into planes, the others are compressed whole.
// REQUIRES: block_size a positive multiple of kRecordAlignment.
struct BlockPlan {
  uint64_t raw_offset = 0, inflated = 0;
  bool split = false;
};
std::vector<BlockPlan> plan_blocks(const Record& record, uint64_t block_size);

// Status::runtime when config.json or a shard cannot be read.
Result<SourceFingerprint> fingerprint_checkpoint(const format::Checkpoint& ckpt);

// "%016x", as the manifest spells checksums.
std::string hex64(uint64_t v);

// manifest.json for a finished pack (records carry their checksums). `block_size` > 0 writes
// version 2 (compressed layer records, with their blocks; the manifest's block_size is then the
// largest block's inflated size, at least kMinBlockSize), 0 version 1. The text ends with
// "manifest_xxh3", the manifest's own checksum (manifest_checksum).
std::string manifest_json(const std::vector<Record>& records, uint64_t file_size,
                          const SourceFingerprint& source, uint64_t block_size = 0);

// XXH3_64bits of the manifest's canonical form: the JSON text of `manifest_text` parsed, without
// its "manifest_xxh3" member, dumped compactly with sorted keys (nlohmann's default), so a
// manifest's layout of whitespace does not matter but any edit of a value or a name (two tensors'
// names swapped pass every other check) does. std::nullopt when the text is not a JSON object.
std::optional<uint64_t> manifest_checksum(const std::string& manifest_text);
// The same of a manifest already parsed (an object; its "manifest_xxh3", if any, is ignored).
uint64_t manifest_checksum(nlohmann::json manifest);

// `manifest_text` with its "manifest_xxh3" set to manifest_checksum (compact JSON): for tests
// and tools that edit a manifest on purpose and want its other checks to speak.
std::string seal_manifest(const std::string& manifest_text);

class TrunkPack {
 public:
  // Opens the pack in `packdir` and checks it belongs to `ckpt` (see the top of this file).
  // Never throws.
  static Result<TrunkPack> open(const std::filesystem::path& packdir,
                                const format::Checkpoint& ckpt);

  // The same checks of the manifest and trunk.pack, without a checkpoint to compare against
  // (`ktier bench io`). The engine always uses open().
  static Result<TrunkPack> open_unchecked(const std::filesystem::path& packdir);

  TrunkPack(TrunkPack&&) noexcept = default;
  TrunkPack& operator=(TrunkPack&&) noexcept = default;

  const std::filesystem::path& dir() const { return dir_; }
  const std::filesystem::path& pack_path() const { return pack_path_; }  // dir()/trunk.pack
  uint64_t file_size() const { return file_size_; }
  int64_t version() const { return version_; }
  // Version 2: layer records are compressed blocks of at most block_size() inflated bytes.
  bool compressed() const { return version_ == kPackVersionCompressed; }
  uint64_t block_size() const { return block_size_; }  // 0 for version 1

  // L layer records (records()[l] is layer l), then head, then embed.
  const std::vector<Record>& records() const { return records_; }
  const Record& layer_record(int64_t layer) const;  // 0 <= layer < L; anything else is a bug
  const Record& head_record() const { return records_.at(records_.size() - 2); }
  const Record& embed_record() const { return records_.back(); }

  // nullptr when the pack holds no tensor of that name (e.g. a routed expert).
  const TensorEntry* find(const std::string& name) const;

  // Checks `bytes` (record.size bytes, e.g. the destination of one read of
  // [record.offset, record.offset + record.size)) against the record's checksum. Status::corrupt
  // naming the pack file, the record and its offset on a mismatch.
  Status verify(const Record& record, const void* bytes) const;

  // Inflates block `b` of a compressed record from its `block.length` stored bytes into `dst`
  // (block.inflated bytes) and checks the xxh3 of the inflated bytes. Status::corrupt naming the
  // pack file, the record, the block and its offset. Thread-safe (one scratch per thread).
  Status inflate_block(const Record& record, size_t b, const uint8_t* stored, uint8_t* dst,
                       InflateScratch& scratch) const;

  // Reads the whole record into `dst` (caller-owned, at least record.size bytes) with buffered
  // positioned reads, inflating compressed records, and verifies it (every block, then the
  // record's xxh3). For tools and tests; the engine reads through src/io.
  // Status::runtime on an I/O error, Status::corrupt as verify() and inflate_block().
  Status read_record(const Record& record, void* dst) const;
  // The record's stored bytes, [offset, offset + stored_size), unverified (tools, tests).
  Status read_stored(const Record& record, void* dst) const;

 private:
  TrunkPack() = default;
  static Result<TrunkPack> open_impl(const std::filesystem::path& packdir,
                                     const format::Checkpoint* ckpt);
  friend class ManifestParser;

  std::filesystem::path dir_;
  std::filesystem::path pack_path_;
  int64_t version_ = 0;
  uint64_t block_size_ = 0;
  uint64_t file_size_ = 0;
  std::vector<Record> records_;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>> by_name_;  // -> record, tensor
};

}  // namespace ktier::pack
