#include "runtime/generator.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>

#include "common/check.h"

namespace ktier::runtime {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Reports a pass over `total` tokens in chunks as its layers finish: layer l of the chunk
// [start, start + n) counts start + n * (l + 1) / L tokens done (a K3 chunk on a CPU takes
// minutes, so chunk granularity is too coarse). Calls progress(0, total) at once; removes its
// hook from the model when it ends. A null `progress`: nothing.
class LayerProgress {
 public:
  LayerProgress(model::Model& model, const ProgressFn& progress, int64_t total)
      : model_(model), progress_(progress), total_(total) {
    if (!progress_) return;
    progress_(0, total_);
    const int64_t layers = model_.config().num_hidden_layers;
    model_.set_layer_progress([this, layers](int64_t layer) {
      progress_(start_ + n_ * (layer + 1) / layers, total_);
    });
  }
  ~LayerProgress() {
    if (progress_) model_.set_layer_progress(nullptr);
  }
  LayerProgress(const LayerProgress&) = delete;
  LayerProgress& operator=(const LayerProgress&) = delete;
  void chunk(int64_t start, int64_t n) {
    start_ = start;
    n_ = n;
  }

 private:
  model::Model& model_;
  const ProgressFn& progress_;
  int64_t total_, start_ = 0, n_ = 0;
};

// Asks `abandon` between the layers of the model's passes while it lives, and sets `abandoned`
// when it says so (the pass then ends part-run). A null `abandon`: nothing.
class LayerStop {
 public:
  LayerStop(model::Model& model, const std::function<bool()>& abandon, bool& abandoned)
      : model_(model), active_(static_cast<bool>(abandon)) {
    if (!active_) return;
    model_.set_layer_stop([&abandon, &abandoned] {
      abandoned = abandoned || abandon();
      return abandoned;
    });
  }
  ~LayerStop() {
    if (active_) model_.set_layer_stop(nullptr);
  }
  LayerStop(const LayerStop&) = delete;
  LayerStop& operator=(const LayerStop&) = delete;

 private:
  model::Model& model_;
  bool active_;
};
}  // namespace

Status check_logits(const float* logits, int64_t n, int64_t positions) {
  bool any_possible = false;  // a logit above -Inf: a token with probability > 0
  for (int64_t i = 0; i < n; ++i) {
    const float l = logits[i];
    any_possible = any_possible || l > -std::numeric_limits<float>::infinity();
    if (!std::isnan(l) && l != std::numeric_limits<float>::infinity()) continue;
    return Status::corrupt(std::string(kNonFiniteLogits) + std::to_string(positions) +
                           (positions == 1 ? " position" : " positions") + " hold " +
                           (std::isnan(l) ? "NaN" : "+Inf") + " (first at id " +
                           std::to_string(i) + "): weights or activations are not finite "
                           "(a shard or pack damaged or rewritten during the run, or a "
                           "config.json scale too large for 32-bit floats?); no token is "
                           "drawn from them");
  }
  if (n > 0 && !any_possible)
    return Status::corrupt(std::string(kNonFiniteLogits) + std::to_string(positions) +
                           (positions == 1 ? " position" : " positions") +
                           " are all -Inf: weights or activations are not finite (a shard or "
                           "pack damaged or rewritten during the run?); no token is drawn from "
                           "them");
  return Status::ok();
}

Result<GenerationStats> generate(model::Model& model, const model::ExpertSource* experts,
                                 std::span<const int32_t> prompt, const GenerationOptions& opts,
                                 const TokenSink& sink) {
  if (prompt.empty()) return Status::usage("the prompt is empty: give at least one token");
  KTIER_ASSIGN_OR_RETURN(std::unique_ptr<GenerationSession> session,
                         GenerationSession::open(model, experts, opts));
  return session->turn(prompt, sink);
}

namespace {
Status check_options(const GenerationOptions& opts) {
  if (opts.prefill_chunk < 1) return Status::usage("--chunk must be >= 1");
  if (opts.max_new_tokens < 0) return Status::usage("-n must be >= 0");
  if (opts.reserve_positions < 0) return Status::usage("reserve_positions must be >= 0");
  return validate(opts.sampling);
}
}  // namespace

Result<std::unique_ptr<GenerationSession>> GenerationSession::open(
    model::Model& model, const model::ExpertSource* experts, const GenerationOptions& opts) {
  KTIER_RETURN_IF_ERROR(check_options(opts));  // before the caches are allocated
  Result<model::SequenceState> seq = model.new_sequence(opts.reserve_positions);
  if (!seq.is_ok())
    return seq.status().with_context("the caches for " + std::to_string(opts.reserve_positions) +
                                     " positions (the prompt + -n, or -c/--ctx-size)");
  return open(model, experts, opts, std::move(*seq), {});
}

Result<std::unique_ptr<GenerationSession>> GenerationSession::open(
    model::Model& model, const model::ExpertSource* experts, const GenerationOptions& opts,
    model::SequenceState state, std::vector<int32_t> ids) {
  KTIER_RETURN_IF_ERROR(check_options(opts));
  KTIER_CHECK(state.layers.size() == static_cast<size_t>(model.config().num_hidden_layers));
  KTIER_CHECK(static_cast<int64_t>(ids.size()) == state.n_tokens);
  return std::unique_ptr<GenerationSession>(
      new GenerationSession(model, experts, opts, std::move(state), std::move(ids)));
}

Status GenerationSession::forward(std::span<const int32_t> ids, model::LogitRows rows,
                                  float* logits) {
  KTIER_RETURN_IF_ERROR(model_.forward(ids, seq_, rows, logits));
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  return Status::ok();
}

void GenerationSession::configure_turns(int64_t max_new_tokens, const SamplingParams& sampling,
                                        std::span<const int32_t> stop_ids) {
  KTIER_CHECK(max_new_tokens >= 0 && validate(sampling).is_ok());
  opts_.max_new_tokens = max_new_tokens;
  opts_.sampling = sampling;
  opts_.stop_ids.assign(stop_ids.begin(), stop_ids.end());
  sampler_ = Sampler(sampling);
}

void GenerationSession::set_max_new_tokens(int64_t max_new_tokens) {
  KTIER_CHECK(max_new_tokens >= 0);
  opts_.max_new_tokens = max_new_tokens;
}

void GenerationSession::set_callbacks(std::function<bool()> stop_requested,
                                      std::function<void()> before_decode,
                                      ChunkLogitsSink prompt_logits,
                                      std::function<bool()> abandon_requested) {
  opts_.stop_requested = std::move(stop_requested);
  opts_.abandon_requested = std::move(abandon_requested);
  opts_.before_decode = std::move(before_decode);
  opts_.prompt_logits = std::move(prompt_logits);
}

Result<GenerationStats> GenerationSession::turn(std::span<const int32_t> ids,
                                                const TokenSink& sink) {
  KTIER_CHECK(!abandoned_);
  if (ids.empty() && !holds_logits_)
    return Status::usage("a turn needs at least one token (no logits are held)");
  const int64_t V = model_.config().vocab_size;
  auto expert_bytes = [&] { return experts_ ? experts_->bytes_fetched() : 0; };

  GenerationStats st;
  st.prompt_tokens = static_cast<int64_t>(ids.size());
  logits_.resize(static_cast<size_t>(V));
  const uint64_t bytes0 = expert_bytes();
  auto t0 = std::chrono::steady_clock::now();
  const int64_t total = static_cast<int64_t>(ids.size());
  const auto stop_requested = [&] {
    st.interrupted = opts_.stop_requested && opts_.stop_requested();
    return st.interrupted;
  };
  // With before_last_prompt_id the last id is a chunk of its own, after the callback.
  const bool snapshot = opts_.before_last_prompt_id && ids.size() >= 2;
  const size_t snapshot_at = ids.size() - 1;
  const bool all_rows = static_cast<bool>(opts_.prompt_logits);
  std::vector<float> rows;  // all_rows: a chunk's logits
  if (all_rows)
    rows.resize(static_cast<size_t>(std::min<int64_t>(opts_.prefill_chunk, total) * V));
  const LayerStop layer_stop(model_, opts_.abandon_requested, abandoned_);
  Status prefilled;
  {  // the progress hook is the prefill's only: the decode's forward passes report none
    LayerProgress progress(model_, opts_.prefill_progress, total);
    for (size_t pos = 0; pos < ids.size() && prefilled.is_ok();) {
      if (snapshot && pos == snapshot_at) {
        const auto saving = std::chrono::steady_clock::now();
        prefilled = opts_.before_last_prompt_id(seq_);
        if (!prefilled.is_ok()) break;
        t0 += std::chrono::steady_clock::now() - saving;  // prefill_seconds is the model's time
      }
      const size_t end = snapshot && pos < snapshot_at ? snapshot_at : ids.size();
      const size_t n = std::min(end - pos, static_cast<size_t>(opts_.prefill_chunk));
      const bool last = pos + n == ids.size();
      progress.chunk(static_cast<int64_t>(pos), static_cast<int64_t>(n));
      holds_logits_ = false;
      if (all_rows) {
        prefilled = forward(ids.subspan(pos, n), model::LogitRows::kAll, rows.data());
        const size_t row = static_cast<size_t>(V);
        if (prefilled.is_ok())
          prefilled = opts_.prompt_logits(seq_.n_tokens - static_cast<int64_t>(n),
                                          static_cast<int64_t>(n), rows.data());
        if (prefilled.is_ok() && last)
          std::copy(rows.begin() + static_cast<std::ptrdiff_t>((n - 1) * row),
                    rows.begin() + static_cast<std::ptrdiff_t>(n * row), logits_.begin());
      } else {
        prefilled = forward(ids.subspan(pos, n),
                            last ? model::LogitRows::kLast : model::LogitRows::kNone,
                            last ? logits_.data() : nullptr);
      }
      if (abandoned_) {  // the chunk was left part-run: none of it counts
        // The stop ends the pass at once (Model::forward): no other failure is dropped here.
        KTIER_CHECK(prefilled.code() == ExitCode::kInterrupted);
        prefilled = Status::ok();
        st.interrupted = true;
        st.prompt_tokens = static_cast<int64_t>(pos);
        break;
      }
      holds_logits_ = last && prefilled.is_ok();
      pos += n;
      if (prefilled.is_ok() && !last && stop_requested()) {
        st.prompt_tokens = static_cast<int64_t>(pos);
        break;
      }
    }
  }
  KTIER_RETURN_IF_ERROR(prefilled);
  st.prefill_seconds = seconds_since(t0);
  st.expert_bytes_prefill = expert_bytes() - bytes0;

  if (opts_.before_decode) opts_.before_decode();
  const uint64_t bytes1 = expert_bytes();
  t0 = std::chrono::steady_clock::now();
  while (!st.interrupted && st.generated_tokens < opts_.max_new_tokens) {
    KTIER_RETURN_IF_ERROR(check_logits(logits_.data(), V, seq_.n_tokens));
    const int32_t id = sampler_.next(logits_.data(), V, ids_);
    ++st.generated_tokens;
    KTIER_RETURN_IF_ERROR(sink(id));
    if (std::find(opts_.stop_ids.begin(), opts_.stop_ids.end(), id) != opts_.stop_ids.end()) {
      st.stopped_at_stop_id = true;
      break;
    }
    if (st.generated_tokens == opts_.max_new_tokens || stop_requested()) break;
    const int32_t one[1] = {id};
    holds_logits_ = false;
    const Status ran = forward(one, model::LogitRows::kLast, logits_.data());
    if (abandoned_) {  // the token's pass was left part-run
      KTIER_CHECK(ran.code() == ExitCode::kInterrupted);
      st.interrupted = true;
      break;
    }
    KTIER_RETURN_IF_ERROR(ran);
    holds_logits_ = true;
    ++st.decode_steps;
  }
  st.decode_seconds = seconds_since(t0);
  st.expert_bytes_decode = expert_bytes() - bytes1;
  return st;
}

Status evaluate(model::Model& model, std::span<const int32_t> ids, int64_t chunk, float* logits) {
  const int64_t V = model.config().vocab_size;
  return evaluate_chunks(model, ids, chunk, 0, [&](int64_t first, int64_t n, const float* l) {
    std::copy(l, l + n * V, logits + first * V);
    return Status::ok();
  });
}

Status evaluate_chunks(model::Model& model, std::span<const int32_t> ids, int64_t chunk,
                       int64_t first_logits, const ChunkLogitsSink& sink,
                       const ProgressFn& progress) {
  if (chunk < 1) return Status::usage("--chunk must be >= 1");
  const int64_t V = model.config().vocab_size, total = static_cast<int64_t>(ids.size());
  KTIER_ASSIGN_OR_RETURN(model::SequenceState seq, model.new_sequence(total));
  std::vector<float> logits(static_cast<size_t>(std::min(chunk, total) * V));
  LayerProgress layers(model, progress, total);
  for (int64_t pos = 0; pos < total;) {
    const int64_t n = std::min(total - pos, chunk);
    layers.chunk(pos, n);
    const bool wanted = pos + n > first_logits;
    const auto part = ids.subspan(static_cast<size_t>(pos), static_cast<size_t>(n));
    KTIER_RETURN_IF_ERROR(model.forward(part, seq,
                                        wanted ? model::LogitRows::kAll : model::LogitRows::kNone,
                                        wanted ? logits.data() : nullptr));
    KTIER_RETURN_IF_ERROR(sink(pos, n, wanted ? logits.data() : nullptr));
    pos += n;
  }
  return Status::ok();
}

uint64_t peak_rss_bytes() {
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // Linux reports kilobytes
}

}  // namespace ktier::runtime
