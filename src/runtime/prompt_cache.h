#pragma once
// The prompt cache (`ktier run --prompt-cache FILE`, as llama.cpp's): a sequence's state saved by
// one run, so that a later run whose prompt starts with the same ids skips their prefill.
//
// The file is safetensors (format/safetensors.h). `__metadata__`: "format" "ktier.sequence",
// "version" "1", "checkpoint" (checkpoint_identity, 16 hex digits), "config_xxh3" (XXH3 of
// config.json as stored: another model is told apart before its load), "backend" ("cpu", "cuda" or
// "cuda+cublas": which backend's bytes these are), "positions" (n, decimal), for a conversation's
// state "pending" (decimal: the last token its last answer sampled, which is never run and begins
// the next turn) and "sampler_draws" (decimal: the draws its sampler had made, Sampler::draws;
// absent in files of older ktier: 0) and "pending_stop" ("1" when the pending token is one of the
// run's stop ids, "0" when not; absent in files of older ktier: unknown), and "xxh3" (16 hex
// digits: XXH3_64bits of every other entry as "key=value\n" lines sorted by key, then the tensors'
// bytes in file order). Tensors, in this order: "ids" I32 [n] (the ids the state has run); per KDA
// layer l "layers.l.kda.S" F32 [H, D, D] and "layers.l.kda.conv_q", "…conv_k", "…conv_v" F32 [K-1,
// C]; per MLA layer l "layers.l.mla.c" F32 [n, kv_lora_rank] and "layers.l.mla.r" F32 [n,
// qk_rope_head_dim] (model/state.h).
//
// Whole prefixes only: a KDA state is recurrent and cannot be cut back to fewer positions, so a
// saved state serves a prompt only when its ids are a prefix of the prompt with at least one id
// left over (the run needs that id's logits).
//
// Exactness: a restored state holds the bytes its ids' prefill gave on the backend that saved it.
// On the CPU prefill gives the same bytes in any chunking (docs/NUMERICS.md), so a run from a
// restored state prints exactly what the same run without the cache prints (a resumed
// conversation's sampler goes on past the draws the saved one made, so a resumed seeded
// conversation samples what the uninterrupted one would). A GPU's state differs
// from the CPU's within its tolerances, so the CPU uses only states a CPU backend saved.
//
// Threads: none kept; one call at a time per file.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "format/checkpoint.h"
#include "format/safetensors.h"
#include "model/model.h"

namespace ktier::runtime {

inline constexpr const char* kPromptCacheFormat = "ktier.sequence";
inline constexpr int kPromptCacheVersion = 1;

// What tells checkpoints apart for the cache: XXH3 over pack::fingerprint_checkpoint (config.json
// as stored, every shard's size and header, samples of their data), so a copy of the checkpoint
// elsewhere is the same checkpoint and a synthetic one of another seed is not. Status::runtime
// (exit 1) when a file cannot be read.
Result<uint64_t> checkpoint_identity(const format::Checkpoint& ckpt);

// XXH3_64bits of `model_dir`/config.json as stored. Status::runtime when it cannot be read.
Result<uint64_t> config_identity(const std::filesystem::path& model_dir);
// The same of the file's text, read already.
uint64_t config_text_identity(std::string_view config_text);

// "cpu", "cuda" or "cuda+cublas" (cuBLAS prefill, whose bytes depend on the chunking): whose
// bytes a sequence's state holds.
const char* backend_label(const backend::Backend& backend);
// The same for a backend about to be opened (EngineOptions::device and cublas_prefill, which a
// module without cuBLAS does not honour; emulated is "cpu").
const char* backend_label(backend::DeviceKind kind, bool blas = false);

// What a conversation's state holds besides its sequence: its last answer's last token `id`
// (never run: it begins the next turn), the draws its sampler had made, and whether `id` was
// one of the saving run's stop ids (nullopt: a file of older ktier, which did not say).
struct PendingTurn {
  int32_t id = 0;
  uint64_t sampler_draws = 0;
  std::optional<bool> stop;
};

// A saved state, opened and checked whole: its metadata (strings) and tensors matching "xxh3", the
// tensors back to back, every float finite; then, intact, Status::usage (exit 2) when
// "config_xxh3" is not `config_xxh3` (config_identity: another model's file); then at least one
// id, every id and "pending" in the vocabulary, every tensor present with the dtype and shape
// `config` gives it and nothing else. Status::corrupt (exit 3) naming the file (and the field or
// tensor) for anything wrong, Status::runtime (exit 1) when it cannot be read. So a file is
// never replaced unread.
class SavedSequence {
 public:
  static Result<SavedSequence> open(const std::filesystem::path& path,
                                    const format::ModelConfig& config, uint64_t config_xxh3);

  const std::filesystem::path& path() const { return file_.path(); }
  uint64_t checkpoint() const { return checkpoint_; }
  const std::string& backend() const { return backend_; }
  std::span<const int32_t> ids() const { return ids_; }
  // A conversation's state: its pending turn (the pending id is not in ids()); nullopt for a
  // single run's state.
  const std::optional<PendingTurn>& conversation() const { return conversation_; }
  uint64_t file_bytes() const { return file_.file_size(); }

  // A sequence of `model` (on its backend) holding the saved state, its MLA caches reserved for
  // `reserve_positions` (at least ids().size()). The bytes are read and hashed again (the file
  // may have changed since open): Status::corrupt naming the file when they do not match
  // "xxh3" (then nothing was computed from them), Status::runtime for I/O, the backend's errors.
  Result<model::SequenceState> restore(const model::Model& model, int64_t reserve_positions) const;

 private:
  SavedSequence(format::SafetensorsFile file) : file_(std::move(file)) {}
  // Every tensor's bytes ("ids" first), in file order, a piece at a time: `take` gets the
  // tensor's index in the file, the piece's offset in it, the bytes and their length.
  using PieceFn = std::function<Status(size_t tensor, uint64_t offset, const uint8_t*, size_t)>;
  Status for_each_piece(const PieceFn& take) const;
  format::SafetensorsFile file_;
  uint64_t checkpoint_ = 0, xxh3_ = 0;
  std::string meta_text_;  // what "xxh3" covers before the tensors
  std::string backend_;
  std::vector<int32_t> ids_;
  std::optional<PendingTurn> conversation_;
};

// Writes `state` with the `ids` it ran (ids.size() == state.n_tokens) and, for a conversation, its
// pending turn, as `path`: to a partial file of this writer's
// own, then renamed, so `path` is the old file or a whole new one (of the writer that renamed last)
// even with several runs saving at once. `config_xxh3`: config_identity of the model.
// Status::runtime (exit 1) naming the file on failure, the backend's errors.
Status save_sequence(const std::filesystem::path& path, const model::Model& model,
                     const model::SequenceState& state, std::span<const int32_t> ids,
                     uint64_t checkpoint, uint64_t config_xxh3,
                     const std::optional<PendingTurn>& conversation = std::nullopt);

}  // namespace ktier::runtime
