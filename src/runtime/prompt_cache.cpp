#include "runtime/prompt_cache.h"

#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "format/config.h"
#include "format/safetensors_writer.h"
#include "io/read_file.h"
#include "common/check.h"
#include "common/xxh3_state.h"
#include "pack/trunk_pack.h"

namespace ktier::runtime {

namespace {

// Host bytes moved at a time between the backend and the file.
constexpr size_t kPieceBytes = size_t{16} << 20;

// One tensor of the file: its declaration and, for the state's arrays, which array holds it.
struct Part {
  format::TensorDecl decl;
  int64_t layer = -1;  // -1: "ids"
  enum Array { kS, kConvQ, kConvK, kConvV, kC, kR } array = kS;
};

// A state's tensor 0, whatever the model.
format::TensorDecl ids_decl(int64_t n) { return {"ids", DType::kI32, {n}}; }

// The file's tensors for a sequence of n positions, in file order.
std::vector<Part> parts_for(const format::ModelConfig& c, int64_t n) {
  std::vector<Part> parts;
  parts.push_back({ids_decl(n), -1});
  const int64_t hist = c.short_conv_kernel_size - 1, C = c.kda_width();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    if (c.is_mla(l)) {
      parts.push_back({{p + "mla.c", DType::kF32, {n, c.kv_lora_rank}}, l, Part::kC});
      parts.push_back({{p + "mla.r", DType::kF32, {n, c.qk_rope_head_dim}}, l, Part::kR});
      continue;
    }
    const int64_t H = c.kda_num_heads, D = c.kda_head_dim;
    parts.push_back({{p + "kda.S", DType::kF32, {H, D, D}}, l, Part::kS});
    parts.push_back({{p + "kda.conv_q", DType::kF32, {hist, C}}, l, Part::kConvQ});
    parts.push_back({{p + "kda.conv_k", DType::kF32, {hist, C}}, l, Part::kConvK});
    parts.push_back({{p + "kda.conv_v", DType::kF32, {hist, C}}, l, Part::kConvV});
  }
  return parts;
}

template <class State>
auto& array_of(State& s, const Part& p) {
  auto& layer = s.layers[static_cast<size_t>(p.layer)];
  switch (p.array) {
    case Part::kS: return layer.kda.S;
    case Part::kConvQ: return layer.kda.conv_q;
    case Part::kConvK: return layer.kda.conv_k;
    case Part::kConvV: return layer.kda.conv_v;
    case Part::kC: return layer.mla.c;
    case Part::kR: break;
  }
  return layer.mla.r;
}

std::string hex(uint64_t v) { return pack::hex64(v); }

// Numbers as the writer spells them (decimal, or 16 lower-case hex digits) and nothing else.
std::optional<uint64_t> parse_unsigned(const std::string& s, int base) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  if (s != (base == 16 ? hex(v) : std::to_string(v))) return std::nullopt;
  return v;
}

// Every saved tensor's bytes in file order, `piece` at a time from the backend.
Status for_each_state_piece(const model::Model& model, const model::SequenceState& state,
                      std::span<const int32_t> ids,
                      const std::function<Status(const void*, size_t)>& take) {
  KTIER_RETURN_IF_ERROR(take(ids.data(), ids.size_bytes()));
  std::vector<uint8_t> buf;
  for (const Part& p : parts_for(model.config(), state.n_tokens)) {
    if (p.layer < 0) continue;
    const backend::BackendArray& a = array_of(state, p);
    const size_t bytes = p.decl.nbytes();
    KTIER_CHECK(a.size() * sizeof(float) == bytes);
    buf.resize(std::min(bytes, kPieceBytes));
    const auto* src = reinterpret_cast<const uint8_t*>(a.data());
    for (size_t at = 0; at < bytes; at += kPieceBytes) {
      const size_t n = std::min(bytes - at, kPieceBytes);
      KTIER_RETURN_IF_ERROR(model.backend().download(buf.data(), src + at, n));
      KTIER_RETURN_IF_ERROR(take(buf.data(), n));
    }
  }
  return Status::ok();
}

// What "xxh3" covers before the tensors: every other metadata entry, sorted by key, one
// "key=value" line each.
std::string metadata_text(const std::map<std::string, std::string>& meta) {
  std::string text;
  for (const auto& [k, v] : meta)
    if (k != "xxh3") text += k + "=" + v + "\n";
  return text;
}

// A hash of "xxh3", started with the metadata text it covers first.
Xxh3State new_hash(const std::string& meta_text) {
  Xxh3State h = new_xxh3_state();
  XXH3_64bits_update(h.get(), meta_text.data(), meta_text.size());
  return h;
}

}  // namespace

Result<uint64_t> checkpoint_identity(const format::Checkpoint& ckpt) {
  KTIER_ASSIGN_OR_RETURN(const pack::SourceFingerprint fp, pack::fingerprint_checkpoint(ckpt));
  std::string text = hex(fp.config_xxh3);
  for (const auto& s : fp.shards)
    text += "|" + s.file + ":" + std::to_string(s.size) + ":" + hex(s.header_xxh3) + ":" +
            hex(s.sample_xxh3);
  return XXH3_64bits(text.data(), text.size());
}

Result<uint64_t> config_identity(const std::filesystem::path& model_dir) {
  KTIER_ASSIGN_OR_RETURN(const std::string text, io::read_regular_file(model_dir / "config.json",
                                                                      format::kConfigJsonLimit));
  return config_text_identity(text);
}

uint64_t config_text_identity(std::string_view config_text) {
  return XXH3_64bits(config_text.data(), config_text.size());
}

const char* backend_label(backend::DeviceKind kind, bool blas) {
  if (kind != backend::DeviceKind::kCuda) return "cpu";
  return blas ? "cuda+cublas" : "cuda";
}

const char* backend_label(const backend::Backend& backend) {
  return backend_label(backend.kind(), backend.uses_blas());
}

Result<SavedSequence> SavedSequence::open(const std::filesystem::path& path,
                                          const format::ModelConfig& config,
                                          uint64_t config_xxh3) {
  const std::string name = path.string();
  auto not_cache = [&](const std::string& why) {
    return Status::corrupt(name + ": not a ktier prompt cache (" + why +
                           "): give --prompt-cache another path");
  };
  auto damaged = [&](const std::string& why) {
    return Status::corrupt(name + ": " + why + " (a damaged prompt cache, or one of another "
                           "ktier: delete it and the next run writes it again)");
  };
  Result<format::SafetensorsFile> file =
      format::SafetensorsFile::open(path, format::OpenMode::kPread);
  if (!file.is_ok())  // its message names the file; a device or an I/O error is no damage
    return file.status().with_context(file.status().code() == ExitCode::kCorrupt
                                           ? "--prompt-cache (not a prompt cache, or a damaged one)"
                                           : "--prompt-cache");
  SavedSequence s(std::move(*file));

  // The metadata: the safetensors reader skips it, so the header is read again here. It is
  // small (a few tensors per layer, a dozen short strings: tens of KB on K3); a larger one, up to
  // the reader's 100 MiB of anything in __metadata__, would be parsed whole into a tree of many
  // times its size before any check.
  constexpr uint64_t kMaxHeaderBytes = uint64_t{1} << 20;
  if (s.file_.data_offset() - 8 > kMaxHeaderBytes)
    return not_cache("a header of " + std::to_string(s.file_.data_offset() - 8) +
                     " bytes, where a prompt cache's has tens of KB");
  std::string header(s.file_.data_offset() - 8, '\0');
  KTIER_RETURN_IF_ERROR(s.file_.read_bytes(8, header.size(), header.data()));
  std::map<std::string, std::string> meta;
  try {
    const nlohmann::json j = nlohmann::json::parse(header);
    const auto m = j.find("__metadata__");
    if (m == j.end() || !m->is_object()) return not_cache("no __metadata__");
    for (const auto& [k, v] : m->items()) {
      if (!v.is_string()) return damaged("__metadata__ \"" + k + "\" is not a string");
      meta[k] = v.get<std::string>();
    }
  } catch (const nlohmann::json::exception& e) {
    return not_cache(std::string("header: ") + e.what());
  }
  if (meta["format"] != kPromptCacheFormat)
    return not_cache("its __metadata__ \"format\" is \"" + meta["format"] + "\"");
  if (meta["version"] != std::to_string(kPromptCacheVersion))
    return damaged("version \"" + meta["version"] + "\", this ktier reads version " +
                   std::to_string(kPromptCacheVersion));
  auto number = [&](const char* key, int base) -> Result<uint64_t> {
    const auto it = meta.find(key);
    if (it == meta.end()) return damaged(std::string("__metadata__ has no \"") + key + "\"");
    const auto v = parse_unsigned(it->second, base);
    if (!v) return damaged("\"" + std::string(key) + "\" is \"" + it->second + "\"");
    return *v;
  };
  KTIER_ASSIGN_OR_RETURN(const uint64_t xxh3, number("xxh3", 16));
  KTIER_ASSIGN_OR_RETURN(const uint64_t saved_config, number("config_xxh3", 16));
  KTIER_ASSIGN_OR_RETURN(s.checkpoint_, number("checkpoint", 16));
  s.backend_ = meta["backend"];
  if (s.backend_ != "cpu" && s.backend_ != "cuda" && s.backend_ != "cuda+cublas")
    return damaged("\"backend\" is \"" + s.backend_ + "\", not cpu, cuda or cuda+cublas");
  KTIER_ASSIGN_OR_RETURN(const uint64_t n, number("positions", 10));
  if (n == 0 || n > INT32_MAX) return damaged("\"positions\" is " + std::to_string(n));
  if (meta.count("pending")) {
    KTIER_ASSIGN_OR_RETURN(const uint64_t id, number("pending", 10));
    if (id > INT32_MAX) return damaged("\"pending\" is " + std::to_string(id));
    PendingTurn& turn = s.conversation_.emplace();
    turn.id = static_cast<int32_t>(id);
    if (meta.count("sampler_draws")) {
      KTIER_ASSIGN_OR_RETURN(turn.sampler_draws, number("sampler_draws", 10));
      // A draw per token sampled: at most every saved position and the pending token (a
      // larger count would make the resumed sampler skip for as long as it says).
      if (turn.sampler_draws > n + 1)
        return damaged("\"sampler_draws\" " + std::to_string(turn.sampler_draws) +
                       " is more than its " + std::to_string(n) +
                       " positions and pending token could draw");
    }
    if (const auto stop = meta.find("pending_stop"); stop != meta.end()) {
      if (stop->second != "0" && stop->second != "1")
        return damaged("\"pending_stop\" is \"" + stop->second + "\", not 0 or 1");
      turn.stop = stop->second == "1";
    }
  } else {
    for (const char* key : {"sampler_draws", "pending_stop"})
      if (meta.count(key))
        return damaged("\"" + std::string(key) +
                       "\" without \"pending\" (only a conversation has it)");
  }

  // Every byte checked now, metadata included, so that a damaged file is refused (and kept)
  // whether or not this run would use it.
  // (SafetensorsFile::open has checked that the tensors tile the data section.)
  const std::vector<format::TensorInfo>& tensors = s.file_.tensors();
  s.meta_text_ = metadata_text(meta);
  Xxh3State hash = new_hash(s.meta_text_);
  // Every model's state begins with its ids, I32 [positions]: checked before tensor 0's bytes
  // are held (any size otherwise), whoever's the file is.
  const format::TensorDecl ids = ids_decl(static_cast<int64_t>(n));
  if (tensors.empty() || tensors[0].name != ids.name || tensors[0].dtype != ids.dtype ||
      tensors[0].shape != ids.shape)
    return damaged(tensors.empty() ? std::string("it holds no tensors")
                                   : "tensor 0 is '" + tensors[0].name + "' " +
                                         std::string(dtype_name(tensors[0].dtype)) +
                                         format::shape_string(tensors[0].shape) +
                                         ", a state begins with 'ids' I32" +
                                         format::shape_string(ids.shape));
  std::string first;  // tensor 0's bytes as hashed: the ids
  KTIER_RETURN_IF_ERROR(s.for_each_piece([&](size_t t, uint64_t, const uint8_t* p,
                                             size_t len) -> Status {
    XXH3_64bits_update(hash.get(), p, len);
    if (t == 0) first.append(reinterpret_cast<const char*>(p), len);
    if (tensors[t].dtype != DType::kF32) return Status::ok();
    const float* f = reinterpret_cast<const float*>(p);
    for (size_t i = 0; i < len / sizeof(float); ++i)
      if (!std::isfinite(f[i]))
        return damaged("tensor '" + tensors[t].name + "' holds a NaN or Inf");
    return Status::ok();
  }));
  if (XXH3_64bits_digest(hash.get()) != xxh3)
    return damaged("its metadata and tensors do not match its \"xxh3\"");
  s.xxh3_ = xxh3;

  // Intact: whose is it?
  if (saved_config != config_xxh3)
    return Status::usage(name + ": --prompt-cache was saved from another model (its config.json "
                         "differs from -m's): give another file, or delete this one");
  const std::vector<Part> parts = parts_for(config, static_cast<int64_t>(n));
  if (tensors.size() != parts.size())
    return damaged(std::to_string(tensors.size()) + " tensors, a state of this model has " +
                   std::to_string(parts.size()));
  for (size_t i = 0; i < parts.size(); ++i) {
    const format::TensorDecl& want = parts[i].decl;
    const format::TensorInfo& t = tensors[i];
    if (t.name != want.name || t.dtype != want.dtype || t.shape != want.shape)
      return damaged("tensor " + std::to_string(i) + " is '" + t.name + "' " +
                     std::string(dtype_name(t.dtype)) + format::shape_string(t.shape) +
                     ", this model's state has '" + want.name + "' " +
                     std::string(dtype_name(want.dtype)) + format::shape_string(want.shape) +
                     " there");
  }
  s.ids_.resize(static_cast<size_t>(n));
  std::memcpy(s.ids_.data(), first.data(), first.size());  // "ids" is I32 [n]: checked above
  const std::string vocab = ", outside the vocabulary 0.." + std::to_string(config.vocab_size - 1);
  for (size_t i = 0; i < s.ids_.size(); ++i)
    if (s.ids_[i] < 0 || s.ids_[i] >= config.vocab_size)
      return damaged("id " + std::to_string(i) + " is " + std::to_string(s.ids_[i]) + vocab);
  if (s.conversation_ && s.conversation_->id >= config.vocab_size)
    return damaged("\"pending\" " + std::to_string(s.conversation_->id) + vocab);
  return s;
}

Status SavedSequence::for_each_piece(const PieceFn& take) const {
  std::vector<uint8_t> buf;
  const std::vector<format::TensorInfo>& tensors = file_.tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const format::TensorInfo& t = tensors[i];
    buf.resize(std::min<size_t>(t.nbytes, kPieceBytes));
    for (uint64_t at = 0; at < t.nbytes; at += kPieceBytes) {
      const size_t len = static_cast<size_t>(std::min<uint64_t>(t.nbytes - at, kPieceBytes));
      KTIER_RETURN_IF_ERROR(file_.read_bytes(t.file_offset + at, len, buf.data()));
      KTIER_RETURN_IF_ERROR(take(i, at, buf.data(), len));
    }
  }
  return Status::ok();
}

Result<model::SequenceState> SavedSequence::restore(const model::Model& model,
                                                    int64_t reserve_positions) const {
  const int64_t n = static_cast<int64_t>(ids_.size());
  KTIER_ASSIGN_OR_RETURN(model::SequenceState state,
                         model.new_sequence(std::max(reserve_positions, n)));
  backend::Backend& be = model.backend();
  const std::vector<format::TensorInfo>& tensors = file_.tensors();
  const std::vector<Part> parts = parts_for(model.config(), n);
  for (size_t i = 1; i < parts.size(); ++i)
    KTIER_RETURN_IF_ERROR(array_of(state, parts[i]).resize(be, tensors[i].numel()));
  Xxh3State hash = new_hash(meta_text_);
  KTIER_RETURN_IF_ERROR(for_each_piece([&](size_t t, uint64_t at, const uint8_t* p,
                                           size_t len) -> Status {
    XXH3_64bits_update(hash.get(), p, len);
    if (t == 0) return Status::ok();  // the ids, read by open()
    return be.upload(reinterpret_cast<uint8_t*>(array_of(state, parts[t]).data()) + at, p, len);
  }));
  if (XXH3_64bits_digest(hash.get()) != xxh3_)
    return Status::corrupt(path().string() + ": changed since it was opened: its bytes no longer "
                           "match its \"xxh3\" (nothing was computed from them)");
  for (model::LayerState& l : state.layers) l.mla.n = n;
  state.n_tokens = n;
  return state;
}

Status save_sequence(const std::filesystem::path& path, const model::Model& model,
                     const model::SequenceState& state, std::span<const int32_t> ids,
                     uint64_t checkpoint, uint64_t config_xxh3,
                     const std::optional<PendingTurn>& conversation) {
  KTIER_CHECK(static_cast<int64_t>(ids.size()) == state.n_tokens);
  std::map<std::string, std::string> meta = {
      {"format", kPromptCacheFormat},
      {"version", std::to_string(kPromptCacheVersion)},
      {"checkpoint", hex(checkpoint)},
      {"config_xxh3", hex(config_xxh3)},
      {"backend", backend_label(model.backend())},
      {"positions", std::to_string(state.n_tokens)},
  };
  if (conversation) {
    meta["pending"] = std::to_string(conversation->id);
    meta["sampler_draws"] = std::to_string(conversation->sampler_draws);
    if (conversation->stop) meta["pending_stop"] = *conversation->stop ? "1" : "0";
  }
  // The checksum goes into the header, which is written first: one pass to hash, one to write
  // (the state is not held twice in host memory).
  Xxh3State hash = new_hash(metadata_text(meta));
  KTIER_RETURN_IF_ERROR(for_each_state_piece(model, state, ids, [&](const void* p, size_t n) {
    XXH3_64bits_update(hash.get(), p, n);
    return Status::ok();
  }));
  meta["xxh3"] = hex(XXH3_64bits_digest(hash.get()));
  std::vector<format::TensorDecl> decls;
  for (Part& p : parts_for(model.config(), state.n_tokens)) decls.push_back(std::move(p.decl));
  KTIER_ASSIGN_OR_RETURN(
      format::SafetensorsWriter w,
      format::SafetensorsWriter::create(path, std::move(decls), meta,
                                        format::SafetensorsWriter::Partial::kUnique));
  KTIER_RETURN_IF_ERROR(for_each_state_piece(model, state, ids, [&](const void* p, size_t n) {
    return w.append(p, n);
  }));
  return w.finish();
}

}  // namespace ktier::runtime
