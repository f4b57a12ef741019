#pragma once
// `ktier run --prompt-cache FILE` (runtime/prompt_cache.h has the file and its contract): which
// saved state a run starts from and when it saves one.
//
//  * A single run starts from the file when the prompt begins with its ids (at least one id
//    left) and saves the prompt's state before the last id (--prompt-cache-all: the sequence as
//    the run leaves it); a run stopped in its prompt saves the part it ran.
//  * A conversation (-i) resumes the conversation the file holds (one saved by a conversation:
//    it has a pending token) and saves the whole conversation after every answer.
//  * Never from another backend's state (logged, then replaced); another checkpoint's is exit 2.
//
// Threads: one run's; not thread-safe.

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "common/status.h"
#include "model/state.h"
#include "runtime/engine.h"
#include "runtime/prompt_cache.h"

namespace ktier::cli {

class RunPromptCache {
 public:
  // Before the (long) load: FILE opened and checked whole against `model_dir`'s config.json when
  // it exists, so a damaged one is exit 3 and another model's exit 2 at once, and neither is
  // replaced. Errors: SavedSequence::open's, config.json's.
  static Result<RunPromptCache> open(const std::string& path, const std::string& model_dir,
                                     bool read_only);

  // The conversation the file holds, if any: its positions and pending turn (not yet checked
  // against the checkpoint or the backend: restore() does that).
  int64_t conversation_positions() const;
  std::optional<runtime::PendingTurn> conversation() const;
  // "cpu", "cuda" or "cuda+cublas": whose bytes the file holds (runtime::backend_label); ""
  // when no file.
  std::string saved_backend() const { return saved_ ? saved_->backend() : std::string(); }
  // Whether the file holds `engine`'s backend's bytes: no state is restored from another
  // backend's (restore() and the caller deciding a resumed conversation's pending token ask
  // the same).
  bool saved_by(const runtime::Engine& engine) const;

  // After the load: the saved state when it serves this run (a single run's `prompt`, or with
  // `conversation` the conversation it holds), in a sequence reserved for `reserve` positions;
  // nullopt otherwise (logged). Status::usage (exit 2) for a file of another checkpoint,
  // Status::budget (exit 4) for a conversation that `reserve` (-c) cannot hold with a message.
  Result<std::optional<model::SequenceState>> restore(const runtime::Engine& engine,
                                                      std::span<const int32_t> prompt,
                                                      bool conversation, int64_t reserve);
  // Positions restored (0 when none).
  int64_t restored() const { return restored_; }
  // The ids the restored state ran (empty when none).
  std::span<const int32_t> restored_ids() const;

  // Saves `state` (it ran `ids`, their first state.n_tokens are saved) with a conversation's
  // pending turn; nothing with --prompt-cache-ro or when the state holds no
  // more than what was restored. A save that fails (save_sequence's errors: a full disk) is a
  // warning and the run goes on; errors: computing the checkpoint's identity.
  Status save(const runtime::Engine& engine, const model::SequenceState& state,
              std::span<const int32_t> ids,
              const std::optional<runtime::PendingTurn>& conversation = std::nullopt);

 private:
  RunPromptCache(std::string path, bool read_only) : path_(std::move(path)), ro_(read_only) {}
  // runtime::checkpoint_identity of the engine's checkpoint, computed once.
  Result<uint64_t> checkpoint_identity(const runtime::Engine& engine);
  std::string path_;
  bool ro_ = false;
  std::optional<runtime::SavedSequence> saved_;  // the file as it was at the start
  std::optional<uint64_t> identity_;             // of the checkpoint, computed once
  uint64_t config_xxh3_ = 0;                     // of -m's config.json
  int64_t restored_ = 0;
};

}  // namespace ktier::cli
