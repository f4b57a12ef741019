#pragma once
// Text generation over a Model: chunked prefill of the prompt, then one token at a time.
//
// Prefill runs the prompt in chunks of `prefill_chunk` tokens (each MoE layer fetches the
// experts a chunk selects once and applies each once to all its tokens); only the last chunk
// computes logits, and only for its last token. Decode then alternates sample -> forward(1).
// Generation stops after max_new_tokens or right after a stop token was sampled (the stop token
// is reported to the sink and counted, then nothing more is computed).

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "common/check.h"
#include "common/status.h"
#include "cpu/exec.h"
#include "model/model.h"
#include "runtime/sampler.h"

namespace ktier::runtime {

// After a chunk of at most `chunk` ids has run: its first position, its length and its logits
// [n, V] (valid until the sink returns). A sink error stops the pass and is returned.
using ChunkLogitsSink = std::function<Status(int64_t first, int64_t n, const float* logits)>;
// Tokens of a pass done so far, as its layers finish (done < total until the pass ends).
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

struct GenerationOptions {
  int64_t max_new_tokens = 128;
  int64_t prefill_chunk = 256;  // tokens per prefill forward; >= 1
  // Positions the sequence's MLA caches are reserved for up front (Model::new_sequence); 0:
  // they grow as needed, doubling. `ktier run` reserves what it planned (prompt + -n - 1, or
  // -c; EngineOptions::Workload), so that GPU mode stays inside --vram and no run copies its
  // caches to grow them.
  int64_t reserve_positions = 0;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;  // usually the config's eos_token_ids
  // Called once between prefill and the first sampled token (reports snapshot counters here).
  std::function<void()> before_decode;
  // Prefill progress of a turn: once with done == 0 before the first chunk, then after every
  // layer of every prompt chunk, the prompt tokens done (whole chunks, plus the layers done of
  // the current one, rounded down) and the turn's total; the last call has done == total
  // unless the turn stopped in its prompt. Null: none.
  ProgressFn prefill_progress;
  // Asked after every prefill chunk but the last, and after every sampled token has gone to the
  // sink (before it is run): true ends the turn there, at a whole token, with
  // GenerationStats::interrupted (Ctrl-C in `ktier run`). A turn stopped inside its prompt has
  // run GenerationStats::prompt_tokens of its ids and sampled nothing. Null: never.
  std::function<bool()> stop_requested;
  // Asked between the layers of every forward pass of a turn (prompt chunks and tokens): true
  // abandons the pass there and ends the turn as stop_requested does (GenerationStats::
  // interrupted; prompt_tokens and generated_tokens count what ran whole), but leaves the
  // sequence part-run, so that the session is unusable (abandoned()). For a stop whose sequence
  // is discarded anyway (Ctrl-C in a run that saves no prompt cache and no trace): one layer
  // comes much sooner than the end of a chunk (a K3 chunk on a CPU can take minutes). Null:
  // never.
  std::function<bool()> abandon_requested;
  // Called at most once in a turn of two or more ids, when all of them but the last have run
  // (not when stop_requested ends the turn before); the last then runs as a forward pass of its
  // own. The prompt cache saves the state here. Its error ends the turn; its time is not counted
  // in prefill_seconds. Null: none (and the last id runs with the chunk before it).
  std::function<Status(const model::SequenceState&)> before_last_prompt_id;
  // Where set, every prompt chunk of a turn computes the logits of all its rows (lm_head over
  // the chunk: [chunk, V] floats held) and hands them here before the next chunk runs: `first`
  // the chunk's first position in the sequence, `n` rows, `logits` [n, V] valid during the call
  // (`serve`'s echoed prompt logprobs). Its error ends the turn. Null: only the last row.
  ChunkLogitsSink prompt_logits;
};

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  // The time the passes took, an abandoned one's part included (not its tokens or step).
  double prefill_seconds = 0;  // prompt forward passes, up to the first token's logits
  double decode_seconds = 0;   // sampling + forward of every generated token but the last
  int64_t decode_steps = 0;    // forward(1) calls that ran whole
  bool stopped_at_stop_id = false;
  bool interrupted = false;  // stop_requested() or abandon_requested() ended the turn
  uint64_t expert_bytes_prefill = 0, expert_bytes_decode = 0;  // from the ExpertSource
};

// Called with each generated token as soon as it is chosen; a non-ok Status ends generation
// with that error (e.g. stdout closed).
using TokenSink = std::function<Status(int32_t id)>;

// Generates from `prompt` (at least one token). `experts` is the Model's source (may be null
// when the model has no MoE layer), read only for the byte counts.
Result<GenerationStats> generate(model::Model& model, const model::ExpertSource* experts,
                                 std::span<const int32_t> prompt, const GenerationOptions& opts,
                                 const TokenSink& sink);

// Generation that goes on in one sequence across calls (a conversation's turns): each turn()
// runs its ids after everything run before, then samples as generate() does (which is one
// turn of a fresh session). The token a turn sampled last is never run: the next turn's ids
// start with it where the text goes on through it (a stop token that is chat markup included;
// `run --chat -i` leaves another stop id out, tok::end_assistant_turn). One sampler serves
// every turn, so a seeded conversation repeats. Model, experts and opts as for generate();
// opts.max_new_tokens is per turn. After an error, or a turn that abandoned a pass, the session
// is unusable.
class GenerationSession {
 public:
  static Result<std::unique_ptr<GenerationSession>> open(model::Model& model,
                                                         const model::ExpertSource* experts,
                                                         const GenerationOptions& opts);
  // The same, going on from `state` (a restored prompt cache: a sequence of `model`) after
  // `ids`, the ids it ran (the penalties look back at them). REQUIRES ids.size() ==
  // state.n_tokens.
  static Result<std::unique_ptr<GenerationSession>> open(model::Model& model,
                                                         const model::ExpertSource* experts,
                                                         const GenerationOptions& opts,
                                                         model::SequenceState state,
                                                         std::vector<int32_t> ids);
  // Errors: generate()'s; `ids` empty only where holds_logits() (then nothing runs before the
  // first token is sampled from them). REQUIRES !abandoned().
  Result<GenerationStats> turn(std::span<const int32_t> ids, const TokenSink& sink);
  // Whether a turn ended by abandon_requested left a forward pass part-run: the sequence holds
  // part of a chunk or token in some layers, so nothing may run on it or save it.
  bool abandoned() const { return abandoned_; }
  // Whether the logits after the last id run are held (a turn ran to its sampling; not after a
  // turn stopped in its prompt, nor for a restored state).
  bool holds_logits() const { return holds_logits_; }
  // The logits held [vocab_size] (REQUIRES holds_logits()): inside a TokenSink call, those the
  // token it was given was sampled from (before the sampler's penalties). Valid until the sink
  // returns or the next turn.
  std::span<const float> logits() const {
    KTIER_CHECK(holds_logits_);
    return logits_;
  }
  // The turns from now on generate at most `max_new_tokens` each, sample with a fresh
  // Sampler(sampling) and stop at `stop_ids` (`ktier serve`: each request its own). REQUIRES
  // max_new_tokens >= 0 and validate(sampling).is_ok().
  void configure_turns(int64_t max_new_tokens, const SamplingParams& sampling,
                       std::span<const int32_t> stop_ids);
  // The turns from now on generate at most `max_new_tokens` each, the same sampler going on.
  // REQUIRES max_new_tokens >= 0.
  void set_max_new_tokens(int64_t max_new_tokens);
  // The turns from now on call these (GenerationOptions' callbacks of the same names; null:
  // none), in place of those the session was opened with.
  void set_callbacks(std::function<bool()> stop_requested, std::function<void()> before_decode,
                     ChunkLogitsSink prompt_logits = nullptr,
                     std::function<bool()> abandon_requested = nullptr);
  int64_t positions() const { return seq_.n_tokens; }  // tokens run so far
  // The ids run so far, in order (positions() of them).
  std::span<const int32_t> ids() const { return ids_; }
  // The sampler's draws so far, and a skip past those of a saved conversation (Sampler).
  uint64_t sampler_draws() const { return sampler_.draws(); }
  void skip_sampler_draws(uint64_t n) { sampler_.skip_draws(n); }
  // The sequence's state after the tokens run so far (valid until the next turn). REQUIRES
  // !abandoned().
  const model::SequenceState& state() const {
    KTIER_CHECK(!abandoned_);
    return seq_;
  }

 private:
  GenerationSession(model::Model& model, const model::ExpertSource* experts,
                    const GenerationOptions& opts, model::SequenceState seq,
                    std::vector<int32_t> ids)
      : model_(model), experts_(experts), opts_(opts), seq_(std::move(seq)),
        ids_(std::move(ids)), sampler_(opts.sampling) {}
  // Runs `ids` after those run so far (Model::forward), then adds them to ids_.
  Status forward(std::span<const int32_t> ids, model::LogitRows rows, float* logits);
  model::Model& model_;
  const model::ExpertSource* experts_;
  GenerationOptions opts_;
  model::SequenceState seq_;
  std::vector<int32_t> ids_;  // the ids seq_ has run
  bool holds_logits_ = false;  // logits_ are those after ids_.back()
  bool abandoned_ = false;     // abandon_requested ended a forward pass inside
  Sampler sampler_;
  std::vector<float> logits_;
};

// Teacher-forced forward over ids in chunks; logits [ids.size(), V] of every position.
Status evaluate(model::Model& model, std::span<const int32_t> ids, int64_t chunk, float* logits);

// The same, streamed: `sink` gets each chunk's logits, so only one chunk's are held. Chunks
// that end before `first_logits` run without lm_head (their logits are null). `progress`
// (optional) hears of each finished layer of each chunk.
Status evaluate_chunks(model::Model& model, std::span<const int32_t> ids, int64_t chunk,
                       int64_t first_logits, const ChunkLogitsSink& sink,
                       const ProgressFn& progress = nullptr);

// Status::corrupt (exit 3) when a row of `n` logits holds a NaN or +Inf (naming `positions`, the
// sequence length they follow, and the first such id), or is all -Inf (no token possible): no
// token is drawn or reported from it.
// Weights or activations that are not finite never come from a sound checkpoint (bytes damaged
// or rewritten under the run, or an overflow); greedy argmax would say token 0 and carry on.
Status check_logits(const float* logits, int64_t n, int64_t positions);
// How check_logits' messages begin (weight_scan.h: is_nonfinite_logits).
inline constexpr std::string_view kNonFiniteLogits = "the logits after ";

// Peak resident set size of this process in bytes (getrusage), 0 if unknown.
uint64_t peak_rss_bytes();

}  // namespace ktier::runtime
