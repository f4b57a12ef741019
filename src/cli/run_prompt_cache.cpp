#include "cli/run_prompt_cache.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "common/check.h"
#include "format/config.h"
#include "io/read_file.h"

namespace ktier::cli {

Result<RunPromptCache> RunPromptCache::open(const std::string& path, const std::string& model_dir,
                                            bool read_only) {
  RunPromptCache c(path, read_only);
  // One read: the identity a saved state is checked against and the config it is read with come
  // from the same bytes.
  const std::filesystem::path config_json = std::filesystem::path(model_dir) / "config.json";
  KTIER_ASSIGN_OR_RETURN(const std::string config_text,
                         io::read_regular_file(config_json, format::kConfigJsonLimit));
  c.config_xxh3_ = runtime::config_text_identity(config_text);
  KTIER_ASSIGN_OR_RETURN(const bool exists, io::path_exists(path));
  if (!exists) {
    spdlog::info("prompt cache: {} does not exist{}", path,
                 read_only ? " (--prompt-cache-ro: it is not written)" : " yet");
    return c;
  }
  KTIER_ASSIGN_OR_RETURN(const format::ModelConfig config,
                         format::parse_model_config_text(config_text, config_json.string()));
  KTIER_ASSIGN_OR_RETURN(c.saved_, runtime::SavedSequence::open(path, config, c.config_xxh3_));
  return c;
}

int64_t RunPromptCache::conversation_positions() const {
  return conversation() ? static_cast<int64_t>(saved_->ids().size()) : 0;
}

std::optional<runtime::PendingTurn> RunPromptCache::conversation() const {
  return saved_ ? saved_->conversation() : std::nullopt;
}

std::span<const int32_t> RunPromptCache::restored_ids() const {
  return restored_ > 0 ? saved_->ids() : std::span<const int32_t>();
}

Result<uint64_t> RunPromptCache::checkpoint_identity(const runtime::Engine& engine) {
  if (!identity_) {
    KTIER_ASSIGN_OR_RETURN(identity_, runtime::checkpoint_identity(engine.checkpoint()));
  }
  return *identity_;
}

bool RunPromptCache::saved_by(const runtime::Engine& engine) const {
  return saved_ && saved_->backend() == runtime::backend_label(engine.backend());
}

Result<std::optional<model::SequenceState>> RunPromptCache::restore(
    const runtime::Engine& engine, std::span<const int32_t> prompt, bool conversation,
    int64_t reserve) {
  using Restored = std::optional<model::SequenceState>;
  if (!saved_) return Restored();
  const auto t0 = std::chrono::steady_clock::now();
  KTIER_ASSIGN_OR_RETURN(const uint64_t identity, checkpoint_identity(engine));
  if (saved_->checkpoint() != identity)
    return Status::usage(path_ + ": --prompt-cache was saved from another checkpoint than -m " +
                         engine.checkpoint().dir().string() + " (another config, shards or "
                         "weights): give another file, or delete this one");
  const std::span<const int32_t> ids = saved_->ids();
  if (!saved_by(engine)) {
    spdlog::info("prompt cache: {} holds a {} run's state and this run is on the {}: not used "
                 "(each backend starts only from its own bytes)", path_, saved_->backend(),
                 runtime::backend_label(engine.backend()));
    return Restored();
  }
  if (conversation && !saved_->conversation()) {
    spdlog::info("prompt cache: {} holds a single run's state, not a conversation: a new "
                 "conversation starts", path_);
    return Restored();
  }
  if (conversation && static_cast<int64_t>(ids.size()) >= reserve)
    return Status::budget("the conversation in " + path_ + " holds " +
                          std::to_string(ids.size()) + " positions, -c/--ctx-size " +
                          std::to_string(reserve) + " cannot go on with it: start it again with "
                          "a larger -c");
  if (!conversation) {
    const size_t same = static_cast<size_t>(
        std::mismatch(ids.begin(), ids.end(), prompt.begin(), prompt.end()).first - ids.begin());
    if (same == prompt.size()) {  // the prompt is all among the saved ids
      spdlog::info("prompt cache: {} holds {} ids and the prompt's {} are their start: not used, "
                   "the run needs its last id's logits and a state cannot be cut back (a prompt "
                   "that goes on past the saved ids uses it)", path_, ids.size(), prompt.size());
      return Restored();
    }
    if (same < ids.size()) {  // same < prompt.size(): they part at `same`
      spdlog::info("prompt cache: {} holds {} ids and the prompt's {} differ from them at "
                   "position {}: not used, a state cannot be cut back to the {} ids the same",
                   path_, ids.size(), prompt.size(), same, same);
      return Restored();
    }
  }
  KTIER_ASSIGN_OR_RETURN(model::SequenceState state, saved_->restore(engine.model(), reserve));
  restored_ = state.n_tokens;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (conversation)
    spdlog::info("prompt cache: the conversation of {} positions in {} goes on ({:.1f} MB, "
                 "{:.2f} s)", ids.size(), path_, saved_->file_bytes() / 1e6, seconds);
  else
    spdlog::info("prompt cache: {} of the prompt's {} tokens restored from {} ({:.1f} MB, "
                 "{:.2f} s)", ids.size(), prompt.size(), path_, saved_->file_bytes() / 1e6,
                 seconds);
  return Restored(std::move(state));
}

Status RunPromptCache::save(const runtime::Engine& engine, const model::SequenceState& state,
                            std::span<const int32_t> ids,
                            const std::optional<runtime::PendingTurn>& conversation) {
  KTIER_CHECK(ids.size() >= static_cast<size_t>(state.n_tokens));
  if (ro_ || state.n_tokens <= restored_) return Status::ok();  // the file holds that already
  KTIER_ASSIGN_OR_RETURN(const uint64_t identity, checkpoint_identity(engine));
  const Status saved = runtime::save_sequence(path_, engine.model(), state,
                                             ids.first(static_cast<size_t>(state.n_tokens)),
                                             identity, config_xxh3_, conversation);
  // The cache only saves time: a run whose state cannot be written (a full disk) goes on.
  if (!saved.is_ok())
    spdlog::warn("prompt cache: not saved: {}", saved.message());
  else
    spdlog::info("prompt cache: the state after {} tokens saved to {}", state.n_tokens, path_);
  return Status::ok();
}

}  // namespace ktier::cli
