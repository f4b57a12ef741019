// The version-1 layout rule, the source fingerprint and the manifest text (trunk_pack.h).
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "common/check.h"
#include "format/config.h"
#include "io/read_file.h"
#include "pack/trunk_pack.h"

namespace ktier::pack {
namespace {

constexpr std::string_view kLayersPrefix = "language_model.model.layers.";
constexpr std::string_view kRoutedExperts = "block_sparse_moe.experts.";
constexpr std::string_view kEmbedName = "language_model.model.embed_tokens.weight";
constexpr std::string_view kHeadNames[] = {
    "language_model.model.norm.weight", "language_model.model.output_attn_res_norm.weight",
    "language_model.model.output_attn_res_proj.weight", "language_model.lm_head.weight"};

// Record index of a tensor in a model of `layers` decoder layers, or nullopt if it is not packed.
std::optional<size_t> record_for(std::string_view name, int64_t layers) {
  const auto L = static_cast<size_t>(layers);
  if (name == kEmbedName) return L + 1;
  for (std::string_view h : kHeadNames)
    if (name == h) return L;
  if (!name.starts_with(kLayersPrefix)) return std::nullopt;  // vision, other non-text tensors
  const std::string_view rest = name.substr(kLayersPrefix.size());
  int64_t layer = -1;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), layer);
  if (ec != std::errc() || end == rest.data() || end == rest.data() + rest.size() || *end != '.')
    return std::nullopt;
  if (layer < 0 || layer >= layers) return std::nullopt;  // MTP head layers
  if (std::string_view(end + 1, rest.data() + rest.size() - end - 1).starts_with(kRoutedExperts))
    return std::nullopt;
  return static_cast<size_t>(layer);
}

std::string json_string(std::string_view s) { return nlohmann::json(std::string(s)).dump(); }

}  // namespace

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

PackLayout plan_trunk_pack(const format::Checkpoint& ckpt) {
  const int64_t L = ckpt.config().num_hidden_layers;
  PackLayout out;
  out.records.resize(static_cast<size_t>(L) + 2);
  out.sources.resize(out.records.size());
  for (int64_t l = 0; l < L; ++l) {
    Record& r = out.records[static_cast<size_t>(l)];
    r.name = "layer." + std::to_string(l);
    r.kind = RecordKind::kLayer;
    r.layer = l;
  }
  out.records[static_cast<size_t>(L)].name = "head";
  out.records[static_cast<size_t>(L)].kind = RecordKind::kHead;
  out.records[static_cast<size_t>(L) + 1].name = "embed";
  out.records[static_cast<size_t>(L) + 1].kind = RecordKind::kEmbed;

  for (uint32_t s = 0; s < ckpt.num_shards(); ++s)
    for (const format::TensorInfo& t : ckpt.shard(s).tensors()) {
      const std::optional<size_t> r = record_for(t.name, L);
      if (!r) continue;
      TensorEntry e;
      e.name = t.name;
      e.dtype = t.dtype;
      e.shape = t.shape;
      e.nbytes = t.nbytes;
      e.record = static_cast<uint32_t>(*r);
      out.records[*r].tensors.push_back(std::move(e));
      out.sources[*r].push_back(format::TensorRef{s, &t});
    }

  uint64_t file_cursor = 0, layer_bytes = 0, model_bytes = 0;
  for (Record& r : out.records) {
    uint64_t cursor = 0;
    for (TensorEntry& t : r.tensors) {
      t.offset = align_up(cursor, kTensorAlignment);
      cursor = t.offset + t.nbytes;
      out.payload_bytes += t.nbytes;
      (r.kind == RecordKind::kLayer ? layer_bytes : model_bytes) += t.nbytes;
    }
    r.offset = file_cursor;
    r.bytes = cursor;
    r.size = align_up(cursor, kRecordAlignment);
    file_cursor += r.size;
  }
  out.file_size = file_cursor;
  // Checkpoint::open() claimed exactly these tensors as trunk and model-level; a difference is a
  // bug in one of the two walks.
  KTIER_CHECK_MSG(layer_bytes == ckpt.census().trunk.bytes, "trunk pack layout vs census (layers)");
  KTIER_CHECK_MSG(model_bytes == ckpt.census().embeddings_head.bytes,
                  "trunk pack layout vs census (head, embed)");
  return out;
}

std::vector<BlockPlan> plan_blocks(const Record& r, uint64_t block_size) {
  KTIER_CHECK(block_size > 0 && block_size % kRecordAlignment == 0);
  std::vector<BlockPlan> out;
  size_t k = 0;
  while (k < r.tensors.size()) {
    const bool bf16 = r.tensors[k].dtype == DType::kBF16;
    const uint64_t begin = k == 0 ? 0 : r.tensors[k].offset;
    while (k + 1 < r.tensors.size() && (r.tensors[k + 1].dtype == DType::kBF16) == bf16) ++k;
    const uint64_t end = k + 1 < r.tensors.size() ? r.tensors[k + 1].offset : r.size;
    ++k;
    for (uint64_t at = begin; at < end; at += block_size) {
      const uint64_t n = std::min(block_size, end - at);
      out.push_back({at, n, bf16 && n % 2 == 0 && at % 2 == 0});
    }
  }
  if (r.tensors.empty() && r.size > 0) out.push_back({0, r.size, false});
  return out;
}

Result<SourceFingerprint> fingerprint_checkpoint(const format::Checkpoint& ckpt) {
  SourceFingerprint fp;
  {
    KTIER_ASSIGN_OR_RETURN(
        const std::string config,
        io::read_regular_file(ckpt.dir() / "config.json", format::kConfigJsonLimit));
    fp.config_xxh3 = XXH3_64bits(config.data(), config.size());
  }
  std::vector<uint8_t> buf;
  for (size_t i = 0; i < ckpt.num_shards(); ++i) {
    const format::SafetensorsFile& sh = ckpt.shard(i);
    SourceFingerprint::Shard s;
    s.file = sh.path().filename().string();
    s.size = sh.file_size();
    buf.resize(sh.data_offset());
    KTIER_RETURN_IF_ERROR(sh.read_bytes(0, buf.size(), buf.data()));
    s.header_xxh3 = XXH3_64bits(buf.data(), buf.size());
    const uint64_t data_len = sh.file_size() - sh.data_offset();
    const uint64_t w = std::min(data_len, kSampleWindowBytes);
    const uint64_t starts[3] = {0, (data_len - w) / 2, data_len - w};
    buf.resize(3 * w);
    for (int k = 0; k < 3; ++k)
      KTIER_RETURN_IF_ERROR(sh.read_bytes(sh.data_offset() + starts[k], w, buf.data() + k * w));
    // And every packed tensor's first and last kTensorSampleBytes: a trunk tensor rewritten in
    // place (a layer edited or retrained) changes them, where the three windows above rarely
    // lie (the pack then decoded the old weights with exit 0). ~2 small reads per tensor.
    for (const format::TensorInfo& t : sh.tensors()) {
      if (t.nbytes == 0 || !record_for(t.name, ckpt.config().num_hidden_layers)) continue;
      const uint64_t n = std::min(t.nbytes, kTensorSampleBytes), at = buf.size();
      buf.resize(at + 2 * n);
      KTIER_RETURN_IF_ERROR(sh.read_bytes(t.file_offset, n, buf.data() + at));
      KTIER_RETURN_IF_ERROR(sh.read_bytes(t.file_offset + t.nbytes - n, n, buf.data() + at + n));
    }
    s.sample_xxh3 = XXH3_64bits(buf.data(), buf.size());
    fp.shards.push_back(std::move(s));
  }
  return fp;
}

// Written by hand so that each tensor takes one line: the release's manifest has ~2,400 of them.
std::string manifest_json(const std::vector<Record>& records, uint64_t file_size,
                          const SourceFingerprint& source, uint64_t block_size) {
  std::string o;
  auto num = [](uint64_t v) { return std::to_string(v); };
  o += "{\n";
  o += " \"format\": " + json_string(kPackFormat) + ",\n";
  o += " \"version\": " + std::to_string(block_size > 0 ? kPackVersionCompressed : kPackVersion) + ",\n";
  if (block_size > 0) {
    // What the reader sizes its inflate scratch by: the blocks' largest, not the option (a
    // 1 GiB --block-size over 200 KiB records made every reader allocate 1 GiB).
    uint64_t largest = kMinBlockSize;
    for (const Record& r : records)
      for (const Block& k : r.blocks) largest = std::max(largest, k.inflated);
    o += " \"compression\": {\"codec\": \"zstd\", \"level\": " + std::to_string(kZstdLevel) +
         ", \"planes\": \"bf16-split\", \"block_size\": " + num(largest) +
         ", \"block_alignment\": " + num(kRecordAlignment) + "},\n";
  }
  o += " \"alignment\": " + num(kRecordAlignment) + ",\n";
  o += " \"tensor_alignment\": " + num(kTensorAlignment) + ",\n";
  o += " \"source\": {\n  \"config_xxh3\": \"" + hex64(source.config_xxh3) + "\",\n  \"shards\": [";
  for (size_t i = 0; i < source.shards.size(); ++i) {
    const auto& s = source.shards[i];
    o += (i ? ",\n   " : "\n   ");
    o += "{\"file\": " + json_string(s.file) + ", \"size\": " + num(s.size) +
         ", \"header_xxh3\": \"" + hex64(s.header_xxh3) + "\", \"sample_xxh3\": \"" +
         hex64(s.sample_xxh3) + "\"}";
  }
  o += "\n  ]\n },\n";
  o += " \"file\": " + json_string(kPackFileName) + ",\n";
  o += " \"file_size\": " + num(file_size) + ",\n";
  o += " \"records\": [";
  for (size_t i = 0; i < records.size(); ++i) {
    const Record& r = records[i];
    o += (i ? ",\n  {" : "\n  {");
    o += "\"name\": " + json_string(r.name) + ", \"layer\": " +
         (r.kind == RecordKind::kLayer ? std::to_string(r.layer) : std::string("null")) +
         ", \"offset\": " + num(r.offset) + ", \"size\": " + num(r.size) + ", \"bytes\": " +
         num(r.bytes) + ", \"xxh3\": \"" + hex64(r.xxh3) + "\",";
    if (r.compressed) {
      o += "\n   \"stored_size\": " + num(r.stored_size) + ", \"blocks\": [";
      for (size_t b = 0; b < r.blocks.size(); ++b) {
        const Block& k = r.blocks[b];
        o += (b ? ",\n    " : "\n    ");
        o += "{\"offset\": " + num(k.offset) + ", \"length\": " + num(k.length) + ", \"inflated\": " +
             num(k.inflated) + ", \"xxh3\": \"" + hex64(k.xxh3) + "\"}";
      }
      o += "\n   ],";
    }
    o += "\n   \"tensors\": [";
    for (size_t k = 0; k < r.tensors.size(); ++k) {
      const TensorEntry& t = r.tensors[k];
      o += (k ? ",\n    " : "\n    ");
      o += "{\"name\": " + json_string(t.name) + ", \"dtype\": \"" + std::string(dtype_name(t.dtype)) +
           "\", \"shape\": " + nlohmann::json(t.shape).dump() + ", \"offset\": " + num(t.offset) +
           ", \"nbytes\": " + num(t.nbytes) + "}";
    }
    o += "\n   ]}";
  }
  o += "\n ]\n}\n";
  const std::optional<uint64_t> sum = manifest_checksum(o);
  KTIER_CHECK(sum.has_value());  // our own text
  o.resize(o.size() - 3);  // "\n}\n"
  o += ",\n \"manifest_xxh3\": \"" + hex64(*sum) + "\"\n}\n";
  return o;
}

uint64_t manifest_checksum(nlohmann::json manifest) {
  manifest.erase("manifest_xxh3");
  const std::string canonical = manifest.dump();
  return XXH3_64bits(canonical.data(), canonical.size());
}

std::optional<uint64_t> manifest_checksum(const std::string& manifest_text) {
  nlohmann::json root = nlohmann::json::parse(manifest_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) return std::nullopt;
  return manifest_checksum(std::move(root));
}

std::string seal_manifest(const std::string& manifest_text) {
  nlohmann::json root = nlohmann::json::parse(manifest_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) return manifest_text;
  root["manifest_xxh3"] = hex64(manifest_checksum(root));
  return root.dump();
}

}  // namespace ktier::pack
