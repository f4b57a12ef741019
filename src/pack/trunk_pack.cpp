// TrunkPack: manifest parsing and validation, checksums. See trunk_pack.h for the contract.
#include "pack/trunk_pack.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <map>
#include <new>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "common/check.h"
#include "common/json_text.h"
#include "format/config.h"
#include "io/read_file.h"

namespace ktier::pack {

using json = nlohmann::json;

namespace {

// A problem in the manifest; caught in TrunkPack::open() and turned into Status::corrupt.
struct ManifestError {
  std::string msg;
};

const json& member(const json& obj, const char* key, const std::string& where) {
  if (!obj.is_object()) throw ManifestError{where + " is not an object"};
  auto it = obj.find(key);
  if (it == obj.end()) throw ManifestError{where + " has no \"" + key + "\""};
  return *it;
}

uint64_t get_u64(const json& obj, const char* key, const std::string& where) {
  const json& v = member(obj, key, where);
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
    throw ManifestError{where + "." + key + " is " + v.dump() + ", expected a non-negative integer"};
  return v.get<uint64_t>();
}

std::string get_string(const json& obj, const char* key, const std::string& where) {
  const json& v = member(obj, key, where);
  if (!v.is_string()) throw ManifestError{where + "." + key + " is " + v.dump() + ", expected a string"};
  return v.get<std::string>();
}

uint64_t get_hex64(const json& obj, const char* key, const std::string& where) {
  const std::string s = get_string(obj, key, where);
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  // The writer's spelling only (FORMAT.md): a manifest edited by hand is not this writer's.
  const bool lower = std::all_of(s.begin(), s.end(), [](char c) { return c < 'A' || c > 'F'; });
  if (s.size() != 16 || ec != std::errc() || end != s.data() + s.size() || !lower)
    throw ManifestError{where + "." + key + " is \"" + s +
                        "\", expected 16 lower-case hex digits"};
  return v;
}

Status fingerprint_mismatch(const std::filesystem::path& dir, const std::string& what) {
  return Status::usage(dir.string() + ": pack was made from another checkpoint (" + what +
                       "): rerun ktier pack (with --force to replace this one)");
}

// First difference between the pack's source and the checkpoint, or ok.
Status compare_source(const std::filesystem::path& dir, const SourceFingerprint& pack,
                      const SourceFingerprint& ckpt) {
  if (pack.config_xxh3 != ckpt.config_xxh3) return fingerprint_mismatch(dir, "config.json differs");
  if (pack.shards.size() != ckpt.shards.size())
    return fingerprint_mismatch(dir, std::to_string(pack.shards.size()) + " shards in the pack's source, " +
                                         std::to_string(ckpt.shards.size()) + " in the checkpoint");
  for (size_t i = 0; i < pack.shards.size(); ++i) {
    const auto& a = pack.shards[i];
    const auto& b = ckpt.shards[i];
    if (a.file != b.file)
      return fingerprint_mismatch(dir, "shard " + std::to_string(i) + " is " + a.file + " in the pack's source, " +
                                           b.file + " in the checkpoint");
    if (a.size != b.size) return fingerprint_mismatch(dir, b.file + " has another size");
    if (a.header_xxh3 != b.header_xxh3) return fingerprint_mismatch(dir, b.file + " has another header");
    if (a.sample_xxh3 != b.sample_xxh3) return fingerprint_mismatch(dir, b.file + " holds other bytes");
  }
  return Status::ok();
}

}  // namespace

// Fills a TrunkPack from a parsed manifest. Throws ManifestError for anything inconsistent.
class ManifestParser {
 public:
  ManifestParser(TrunkPack& pack, const json& root) : pack_(pack), root_(root) {}

  // Format, version, file, and the record table checked against itself and `file_size`.
  void parse_structure(uint64_t actual_file_size) {
    const std::string format = get_string(root_, "format", "manifest");
    if (format != kPackFormat)
      throw ManifestError{"format is \"" + format + "\", not \"" + kPackFormat + "\""};
    const json& v = member(root_, "version", "manifest");
    if (!v.is_number_integer() ||
        (v.get<int64_t>() != kPackVersion && v.get<int64_t>() != kPackVersionCompressed))
      throw ManifestError{"version " + v.dump() + "; this ktier reads versions " +
                          std::to_string(kPackVersion) + " and " + std::to_string(kPackVersionCompressed) +
                          " (rerun ktier pack)"};
    pack_.version_ = v.get<int64_t>();
    if (pack_.version_ == kPackVersionCompressed) {
      const json& c = member(root_, "compression", "manifest");
      if (get_string(c, "codec", "compression") != "zstd" ||
          get_string(c, "planes", "compression") != "bf16-split")
        throw ManifestError{"compression " + c.dump() + " is not zstd with bf16-split planes"};
      pack_.block_size_ = get_u64(c, "block_size", "compression");
      if (pack_.block_size_ < kMinBlockSize || pack_.block_size_ > kMaxBlockSize)
        throw ManifestError{"compression.block_size " + std::to_string(pack_.block_size_) + " is outside [" +
                            std::to_string(kMinBlockSize) + ", " + std::to_string(kMaxBlockSize) + "]"};
    }
    if (get_u64(root_, "alignment", "manifest") != kRecordAlignment)
      throw ManifestError{"alignment is not " + std::to_string(kRecordAlignment)};
    if (get_string(root_, "file", "manifest") != kPackFileName)
      throw ManifestError{std::string("file is not \"") + kPackFileName + "\""};
    pack_.file_size_ = get_u64(root_, "file_size", "manifest");
    if (pack_.file_size_ != actual_file_size)
      throw ManifestError{pack_.pack_path_.string() + " is " + std::to_string(actual_file_size) +
                          " bytes, the manifest says " + std::to_string(pack_.file_size_) +
                          " (truncated, or the files of two packs mixed): rerun ktier pack"};
    const json& records = member(root_, "records", "manifest");
    if (!records.is_array()) throw ManifestError{"records is not an array"};
    uint64_t prev_end = 0;
    for (size_t i = 0; i < records.size(); ++i) {
      pack_.records_.push_back(parse_record(records[i], "records[" + std::to_string(i) + "]"));
      Record& r = pack_.records_.back();
      for (TensorEntry& t : r.tensors) t.record = static_cast<uint32_t>(i);
      if (r.offset < prev_end)
        throw ManifestError{"record '" + r.name + "' at offset " + std::to_string(r.offset) +
                            " overlaps the record before it (which ends at " + std::to_string(prev_end) + ")"};
      if (r.offset > pack_.file_size_ || r.stored_size > pack_.file_size_ - r.offset)
        throw ManifestError{"record '" + r.name + "' [" + std::to_string(r.offset) + ", +" +
                            std::to_string(r.stored_size) + ") lies outside " + kPackFileName + " (" +
                            std::to_string(pack_.file_size_) + " bytes)"};
      prev_end = r.offset + r.stored_size;
    }
    if (pack_.block_size_ > 0 && pack_.block_size_ != std::max(largest_block_, kMinBlockSize))
      throw ManifestError{"compression.block_size " + std::to_string(pack_.block_size_) +
                          " is not the largest block's inflated size, " +
                          std::to_string(std::max(largest_block_, kMinBlockSize)) +
                          " (readers size their inflate scratch by it)"};
  }

  SourceFingerprint parse_source() {
    const json& src = member(root_, "source", "manifest");
    SourceFingerprint fp;
    fp.config_xxh3 = get_hex64(src, "config_xxh3", "source");
    const json& shards = member(src, "shards", "source");
    if (!shards.is_array()) throw ManifestError{"source.shards is not an array"};
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string w = "source.shards[" + std::to_string(i) + "]";
      SourceFingerprint::Shard s;
      s.file = get_string(shards[i], "file", w);
      s.size = get_u64(shards[i], "size", w);
      s.header_xxh3 = get_hex64(shards[i], "header_xxh3", w);
      s.sample_xxh3 = get_hex64(shards[i], "sample_xxh3", w);
      fp.shards.push_back(std::move(s));
    }
    return fp;
  }

  // The record table against the checkpoint's layout: the same records in the same order, and in
  // each the same tensors (name, dtype, shape). Offsets are the manifest's own.
  void match_layout(const PackLayout& want) {
    auto& have = pack_.records_;
    if (have.size() != want.records.size())
      throw ManifestError{std::to_string(have.size()) + " records, the checkpoint needs " +
                          std::to_string(want.records.size()) + " (" +
                          std::to_string(want.records.size() - 2) + " layers, head, embed)"};
    for (size_t i = 0; i < have.size(); ++i) {
      Record& h = have[i];
      const Record& w = want.records[i];
      if (h.name != w.name)
        throw ManifestError{"record " + std::to_string(i) + " is '" + h.name + "', expected '" + w.name + "'"};
      if (h.layer != w.layer) {
        const auto layer_text = [](const Record& r) {
          return r.layer >= 0 ? std::to_string(r.layer) : std::string("null");  // -1: null
        };
        throw ManifestError{"record '" + h.name + "' has layer " + layer_text(h) + ", expected " +
                            layer_text(w)};
      }
      h.kind = w.kind;
      std::map<std::string_view, const TensorEntry*> expected;
      for (const TensorEntry& t : w.tensors) expected.emplace(t.name, &t);
      for (const TensorEntry& t : h.tensors) {
        auto it = expected.find(t.name);
        if (it == expected.end())
          throw ManifestError{"record '" + h.name + "' holds tensor '" + t.name +
                              "', which is not a non-expert tensor of that record in the checkpoint"};
        if (it->second->dtype != t.dtype || it->second->shape != t.shape)
          throw ManifestError{"tensor '" + t.name + "' is " + std::string(dtype_name(t.dtype)) + " " +
                              format::shape_string(t.shape) + " in the pack, " +
                              std::string(dtype_name(it->second->dtype)) + " " +
                              format::shape_string(it->second->shape) + " in the checkpoint"};
        expected.erase(it);
      }
      if (!expected.empty())
        throw ManifestError{"record '" + h.name + "' lacks tensor '" + std::string(expected.begin()->first) + "'"};
    }
    for (uint32_t r = 0; r < have.size(); ++r)
      for (uint32_t k = 0; k < have[r].tensors.size(); ++k)
        if (!pack_.by_name_.emplace(have[r].tensors[k].name, std::make_pair(r, k)).second)
          throw ManifestError{"tensor '" + have[r].tensors[k].name + "' appears twice"};
  }

 private:
  // The blocks of a compressed record: stored back to back from r.offset, each aligned, their
  // inflated lengths tiling [0, r.size), none larger than the pack's block size.
  void parse_blocks(const json& j, Record& r, const std::string& rw) {
    if (pack_.version_ != kPackVersionCompressed || r.layer < 0)
      throw ManifestError{rw + ": blocks in a version-1 pack or a non-layer record"};
    r.compressed = true;
    r.stored_size = get_u64(j, "stored_size", rw);
    const json& blocks = member(j, "blocks", rw);
    if (!blocks.is_array()) throw ManifestError{rw + ": blocks is not an array"};
    uint64_t at = r.offset, raw = 0;
    for (size_t b = 0; b < blocks.size(); ++b) {
      const std::string bw = rw + " block " + std::to_string(b);
      Block k;
      k.offset = get_u64(blocks[b], "offset", bw);
      k.length = get_u64(blocks[b], "length", bw);
      k.inflated = get_u64(blocks[b], "inflated", bw);
      k.xxh3 = get_hex64(blocks[b], "xxh3", bw);
      k.raw_offset = raw;
      if (k.offset != at)
        throw ManifestError{bw + ": offset " + std::to_string(k.offset) + ", expected " + std::to_string(at) +
                            " (blocks are stored back to back, each on a " +
                            std::to_string(kRecordAlignment) + "-byte boundary)"};
      if (k.length < kBlockHeaderBytes || k.length > kBlockHeaderBytes + 2 * pack_.block_size_ + 1024 ||
          k.inflated == 0 || k.inflated > pack_.block_size_ || k.inflated > r.size - raw)
        throw ManifestError{bw + ": length " + std::to_string(k.length) + " or inflated length " +
                            std::to_string(k.inflated) + " is impossible (block size " +
                            std::to_string(pack_.block_size_) + ", record " + std::to_string(r.size) + " bytes)"};
      at = align_up(k.offset + k.length, kRecordAlignment);
      raw += k.inflated;
      r.blocks.push_back(k);
    }
    if (raw != r.size)
      throw ManifestError{rw + ": blocks inflate to " + std::to_string(raw) + " bytes, the record has " +
                          std::to_string(r.size)};
    for (const Block& k : r.blocks) largest_block_ = std::max(largest_block_, k.inflated);
    if (r.stored_size != at - r.offset)
      throw ManifestError{rw + ": stored_size " + std::to_string(r.stored_size) + ", its blocks end at +" +
                          std::to_string(at - r.offset)};
  }

  Record parse_record(const json& j, const std::string& w) {
    Record r;
    r.name = get_string(j, "name", w);
    const std::string rw = "record '" + r.name + "'";
    const json& layer = member(j, "layer", w);
    if (!layer.is_null() && (!layer.is_number_integer() || layer.get<int64_t>() < 0 ||
                             layer.get<int64_t>() >= format::kMaxLayers))
      throw ManifestError{rw + ": layer is " + layer.dump() + ", expected an integer 0.." +
                          std::to_string(format::kMaxLayers - 1) + " or null"};
    r.layer = layer.is_null() ? -1 : layer.get<int64_t>();
    // match_layout checks it against the checkpoint; an unchecked open (bench) has only this.
    r.kind = r.layer >= 0 ? RecordKind::kLayer
                          : r.name == "head" ? RecordKind::kHead : RecordKind::kEmbed;
    r.offset = get_u64(j, "offset", w);
    r.size = get_u64(j, "size", w);
    r.bytes = get_u64(j, "bytes", w);
    r.xxh3 = get_hex64(j, "xxh3", w);
    if (r.offset % kRecordAlignment != 0 || r.size % kRecordAlignment != 0)
      throw ManifestError{rw + ": offset " + std::to_string(r.offset) + " or size " +
                          std::to_string(r.size) + " is not a multiple of " + std::to_string(kRecordAlignment)};
    if (r.bytes > r.size || r.size - r.bytes >= kRecordAlignment)
      throw ManifestError{rw + ": size " + std::to_string(r.size) + " is not " +
                          std::to_string(r.bytes) + " bytes padded to " + std::to_string(kRecordAlignment)};
    r.stored_size = r.size;
    if (j.contains("blocks")) parse_blocks(j, r, rw);
    const json& tensors = member(j, "tensors", w);
    if (!tensors.is_array()) throw ManifestError{rw + ": tensors is not an array"};
    uint64_t end = 0;
    for (size_t k = 0; k < tensors.size(); ++k) {
      const std::string tw = rw + " tensors[" + std::to_string(k) + "]";
      TensorEntry t;
      t.name = get_string(tensors[k], "name", tw);
      const std::string dt = get_string(tensors[k], "dtype", tw);
      const auto dtype = parse_dtype(dt);
      if (!dtype) throw ManifestError{tw + ": unknown dtype \"" + dt + "\""};
      t.dtype = *dtype;
      const json& shape = member(tensors[k], "shape", tw);
      if (!shape.is_array() || shape.size() > format::kMaxTensorRank)
        throw ManifestError{tw + ": shape is " + shape.dump()};
      uint64_t numel = 1;
      for (const json& d : shape) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > (int64_t{1} << 40))
          throw ManifestError{tw + ": shape is " + shape.dump()};
        const uint64_t dim = static_cast<uint64_t>(d.get<int64_t>());
        t.shape.push_back(static_cast<int64_t>(dim));
        if (dim != 0 && numel > (uint64_t{1} << 48) / dim)  // checked before it can wrap
          throw ManifestError{tw + ": shape is " + shape.dump() + ", more than 2^48 elements"};
        numel *= dim;
      }
      t.offset = get_u64(tensors[k], "offset", tw);
      t.nbytes = get_u64(tensors[k], "nbytes", tw);
      if (t.nbytes != numel * dtype_size(t.dtype))
        throw ManifestError{tw + " ('" + t.name + "'): nbytes " + std::to_string(t.nbytes) + " is not " +
                            std::to_string(numel) + " x " + std::to_string(dtype_size(t.dtype))};
      // Each at the first multiple of 64 after the one before (as written): a record holds no
      // room beyond its tensors' (a compressed record's zero gaps would cost nothing on disk
      // and could size its inflate past any budget).
      const uint64_t next = align_up(end, kTensorAlignment);
      if (t.offset != next || t.offset > r.bytes || t.nbytes > r.bytes - t.offset)
        throw ManifestError{tw + " ('" + t.name + "') at [" + std::to_string(t.offset) + ", +" +
                            std::to_string(t.nbytes) + ") is not at " + std::to_string(next) +
                            " (the first multiple of 64 after the tensor before it) or lies "
                            "outside the record's " + std::to_string(r.bytes) + " bytes"};
      end = t.offset + t.nbytes;
      r.tensors.push_back(std::move(t));
    }
    if (end != r.bytes)
      throw ManifestError{rw + ": bytes is " + std::to_string(r.bytes) + " but its last tensor ends at " +
                          std::to_string(end)};
    return r;
  }

  TrunkPack& pack_;
  const json& root_;
  uint64_t largest_block_ = 0;  // of every compressed record's blocks
};

Result<TrunkPack> TrunkPack::open(const std::filesystem::path& packdir, const format::Checkpoint& ckpt) {
  return open_impl(packdir, &ckpt);
}

Result<TrunkPack> TrunkPack::open_unchecked(const std::filesystem::path& packdir) {
  return open_impl(packdir, nullptr);
}

Result<TrunkPack> TrunkPack::open_impl(const std::filesystem::path& packdir,
                                       const format::Checkpoint* ckpt) {
  TrunkPack pack;
  pack.dir_ = packdir;
  pack.pack_path_ = packdir / kPackFileName;
  const std::filesystem::path manifest_path = packdir / kManifestFileName;
  try {
    std::error_code ec;
    if (!std::filesystem::is_directory(packdir, ec)) {
      KTIER_ASSIGN_OR_RETURN(const bool exists, io::path_exists(packdir));
      return Status::usage(packdir.string() + ": not a trunk pack (" +
                           (exists ? "not a directory" : "no such directory") +
                           "); make one with ktier pack -m MODEL -o " + packdir.string());
    }
    KTIER_ASSIGN_OR_RETURN(const bool has_manifest, io::path_exists(manifest_path));
    if (!has_manifest)
      return Status::corrupt(manifest_path.string() + ": missing, so " + packdir.string() +
                             " is not a finished trunk pack (an interrupted ktier pack?): rerun ktier pack");
    // A folder, a FIFO or a device in its place would read as a library error, block, or read
    // without end; a manifest has one line per tensor, far below the cap.
    if (!std::filesystem::is_regular_file(manifest_path, ec))
      return Status::corrupt(manifest_path.string() + ": not a regular file: rerun ktier pack");
    KTIER_ASSIGN_OR_RETURN(
        const std::string text,
        io::read_regular_file(manifest_path, {kMaxManifestBytes, &Status::corrupt}));
    if (const std::string nul = json_nul_problem(text); !nul.empty())
      return Status::corrupt(manifest_path.string() + ": not valid JSON: it " + nul +
                             ": rerun ktier pack");
    // Ours nests 5 deep; copying or dumping a far deeper value (a damaged or hostile file)
    // recurses once per level and would overflow the stack.
    constexpr int kMaxManifestDepth = 32;
    bool too_deep = false;
    json root = parse_json_depth_bounded(text, kMaxManifestDepth, &too_deep);
    if (too_deep)
      return Status::corrupt(manifest_path.string() + ": nested deeper than " +
                             std::to_string(kMaxManifestDepth) + " levels, not a ktier manifest: "
                             "rerun ktier pack");
    if (root.is_discarded())
      return Status::corrupt(manifest_path.string() + ": not valid JSON: rerun ktier pack");
    // The manifest's own checksum first: an edit the other checks cannot see (two tensors of one
    // shape with their names swapped) must not reach a run.
    if (root.is_object()) {
      const auto stored = root.find("manifest_xxh3");
      if (stored == root.end() || !stored->is_string())
        return Status::corrupt(manifest_path.string() + ": no \"manifest_xxh3\" (a pack made "
                               "before manifests carried their checksum?): rerun ktier pack");
      const std::string sum = hex64(manifest_checksum(root));
      if (sum != stored->get<std::string>())
        return Status::corrupt(manifest_path.string() + ": its text does not match its "
                               "manifest_xxh3 " + stored->get<std::string>() + " (computed " +
                               sum + "): edited or damaged: rerun ktier pack");
    }

    // file_size() on a FIFO or folder says only "Operation not supported" / "Is a directory".
    const std::filesystem::file_status pack_status = std::filesystem::status(pack.pack_path_, ec);
    if (!ec && std::filesystem::exists(pack_status) &&
        !std::filesystem::is_regular_file(pack_status))
      return Status::corrupt(pack.pack_path_.string() + ": not a regular file (the manifest "
                             "names it as the pack's data): rerun ktier pack");
    const uint64_t actual_size = std::filesystem::file_size(pack.pack_path_, ec);
    if (ec)
      return Status::corrupt(pack.pack_path_.string() + ": " + ec.message() +
                             " (the manifest names it): rerun ktier pack");
    ManifestParser parser(pack, root);
    SourceFingerprint source;
    try {
      parser.parse_structure(actual_size);
      source = parser.parse_source();
    } catch (const ManifestError& e) {
      return Status::corrupt(manifest_path.string() + ": " + e.msg);
    }
    if (ckpt == nullptr) return pack;  // structure only (benchmarks)
    {
      KTIER_ASSIGN_OR_RETURN(const SourceFingerprint mine, fingerprint_checkpoint(*ckpt));
      KTIER_RETURN_IF_ERROR(compare_source(packdir, source, mine));
    }
    try {
      parser.match_layout(plan_trunk_pack(*ckpt));
    } catch (const ManifestError& e) {
      return Status::corrupt(manifest_path.string() + ": " + e.msg + " (the pack does not match " +
                             ckpt->dir().string() + "): rerun ktier pack");
    }
  } catch (const std::bad_alloc&) {  // the machine's memory, not the pack (exit 1, as main's)
    return Status::out_of_memory(manifest_path.string() + ": out of memory while opening the pack");
  } catch (const std::exception& e) {  // json type errors missed above; never escape
    return Status::corrupt(manifest_path.string() + ": " + e.what());
  }
  return pack;
}

const Record& TrunkPack::layer_record(int64_t layer) const {
  KTIER_CHECK(layer >= 0 && static_cast<size_t>(layer) + 2 < records_.size());
  return records_[static_cast<size_t>(layer)];
}

const TensorEntry* TrunkPack::find(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return nullptr;
  return &records_[it->second.first].tensors[it->second.second];
}

Status TrunkPack::verify(const Record& record, const void* bytes) const {
  const uint64_t got = XXH3_64bits(bytes, record.size);
  if (got == record.xxh3) return Status::ok();
  return Status::corrupt(pack_path_.string() + ": record '" + record.name + "' at offset " +
                         std::to_string(record.offset) + " (" + std::to_string(record.size) +
                         " bytes) fails its checksum (xxh3 " + hex64(got) + ", manifest " +
                         hex64(record.xxh3) + "): the pack is damaged; rerun ktier pack --force");
}

Status TrunkPack::inflate_block(const Record& record, size_t b, const uint8_t* stored, uint8_t* dst,
                                InflateScratch& scratch) const {
  KTIER_CHECK(record.compressed && b < record.blocks.size());
  const Block& k = record.blocks[b];
  auto where = [&] {
    return pack_path_.string() + ": record '" + record.name + "' block " + std::to_string(b) + " of " +
           std::to_string(record.blocks.size()) + " (offset " + std::to_string(k.offset) + ", " +
           std::to_string(k.length) + " stored bytes, " + std::to_string(k.inflated) + " inflated)";
  };
  const Status st = pack::inflate_block(std::span<const uint8_t>(stored, k.length),
                                        std::span<uint8_t>(dst, k.inflated), scratch);
  if (!st.is_ok())
    return Status::corrupt(where() + ": " + st.message() + ": the pack is damaged; rerun ktier pack --force");
  const uint64_t got = XXH3_64bits(dst, k.inflated);
  if (got != k.xxh3)
    return Status::corrupt(where() + ": the inflated bytes fail their checksum (xxh3 " + hex64(got) +
                           ", manifest " + hex64(k.xxh3) + "): the pack is damaged (or its planes are "
                           "swapped or misplaced); rerun ktier pack --force");
  return Status::ok();
}

Status TrunkPack::read_record(const Record& record, void* dst) const {
  if (!record.compressed) {
    KTIER_RETURN_IF_ERROR(read_stored(record, dst));
    return verify(record, dst);
  }
  std::vector<uint8_t> stored(record.stored_size);
  KTIER_RETURN_IF_ERROR(read_stored(record, stored.data()));
  InflateScratch scratch;
  auto* out = static_cast<uint8_t*>(dst);
  for (size_t b = 0; b < record.blocks.size(); ++b)
    KTIER_RETURN_IF_ERROR(inflate_block(record, b, stored.data() + (record.blocks[b].offset - record.offset),
                                        out + record.blocks[b].raw_offset, scratch));
  return verify(record, dst);
}

Status TrunkPack::read_stored(const Record& record, void* dst) const {
  const int fd = ::open(pack_path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;  // before the message's allocations
    return Status::runtime("cannot open " + pack_path_.string() + ": " + std::strerror(err));
  }
  auto* p = static_cast<uint8_t*>(dst);
  uint64_t done = 0;
  while (done < record.stored_size) {
    const ssize_t r = ::pread(fd, p + done, record.stored_size - done, static_cast<off_t>(record.offset + done));
    const int err = r < 0 ? errno : 0;
    if (err == EINTR) continue;
    if (r <= 0) {
      const std::string why = r < 0 ? std::strerror(err) : "the file shrank since it was opened";
      ::close(fd);
      return Status::runtime("read of " + pack_path_.string() + " record '" + record.name + "' failed at offset " +
                             std::to_string(record.offset + done) + ": " + why);
    }
    done += static_cast<uint64_t>(r);
  }
  ::close(fd);
  return Status::ok();
}

}  // namespace ktier::pack
