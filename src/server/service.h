#pragma once
// The generation behind `ktier serve`: one sequence, one request at a time, the previous
// request's state kept so that a request whose ids begin with everything it ran (a
// conversation's next message, an agent's next step) runs only the rest.
//
// A K3 sequence cannot be cut back (a KDA state is recurrent), so a request that does not begin
// with the ids run so far starts a fresh sequence; on the CPU what a request generates never
// depends on which it was (exact across chunking: the continuation is byte-identical to a fresh
// run), and so in GPU mode by default; with --gpu-prefill cublas there is no such identity
// across chunking (NUMERICS.md §13).
// With ServiceOptions::cache_ram_bytes (`--cache-ram`, llama-server's), a sequence a request
// would drop (it does not begin with that sequence's ids) is kept in RAM instead, the least
// recently used dropped past the limit, and a request that begins with a kept sequence's ids
// goes on from the longest such one: several conversations take turns without running each
// other's prompts again. The state moves, nothing is copied or recomputed, so the answer's
// bytes are those without the cache. CPU sequences only: GPU mode's lives in the VRAM set aside
// for one.
// A request's ids depend on its text only (tok::render_conversation for chat), so a conversation
// reuses the previous answer's state when the answer's text encodes to the ids sampled for it
// (as a trained model's text mostly does); otherwise it reuses nothing.
//
// Thread-safety: complete() may be called from any thread; calls are serialized (one sequence,
// one model): the others wait in arrival order, up to ServiceOptions::max_waiting of them.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "runtime/run_report.h"
#include "server/openai_api.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace ktier::server {

struct ServiceOptions {
  int64_t ctx = 4096;           // positions a sequence may use (-c); reserved up front
  int64_t prefill_chunk = 256;  // --chunk
  RequestDefaults defaults;
  // Requests that may wait for the one generating; one more is refused at once (503, "busy"),
  // so that waiting requests cannot take every connection thread from /health. 0: no limit.
  int64_t max_waiting = 0;
  // Bytes of sequence state kept for later requests besides the current sequence (each
  // SequenceState::bytes(): its -c positions reserved); 0: none kept. Not in GPU mode.
  uint64_t cache_ram_bytes = 0;
};

class Service;

// A completions batch's place in the line for the model. `serve` runs a batch's prompts one
// after another on its connection's thread; between two of them the thread is still taken, so
// the place is kept: it counts against max_waiting as a waiting request would, and the next
// prompt joins with it, unrefused (the batch was let in whole, and its answers so far would be
// thrown away with a refusal). The first prompt joins as any request. Given back when
// destroyed. Not thread-safe: one batch's thread uses it.
class LinePlace {
 public:
  explicit LinePlace(Service& service) : service_(service) {}
  ~LinePlace();
  LinePlace(const LinePlace&) = delete;
  LinePlace& operator=(const LinePlace&) = delete;

 private:
  friend class Service;
  Service& service_;
  bool held_ = false;  // counted in Service's totals_.waiting
};

struct Completion {
  std::string text;  // as streamed: special tokens hidden, cut before a stop text
  FinishReason finish = FinishReason::kLength;
  std::string stopping_word;  // the request's stop text that ended the answer; "" for none
  Usage usage;
  runtime::RunReport report;
  nlohmann::json report_json;  // report.to_json, made while the engine was this request's
  bool cancelled = false;  // the client went away (or the server stops): ended early
  // Positions the sequence holds after the answer (0 where it was dropped: an error, a pass
  // left part-run): what the next request may reuse.
  int64_t positions_held = 0;
  // The request asked for logprobs: one for each token of the answer, in order (a stop or
  // special token too, but in chat: its `token` is its own text, which `text` does not show); a
  // stop text drops the tokens whose text begins at it or after.
  std::vector<AnswerToken> logprobs;
  // The request went on from a sequence kept in RAM (ServiceOptions::cache_ram_bytes), not the
  // last request's.
  bool from_kept_sequence = false;
};

// What a service has done since it was made (`ktier serve --metrics`).
struct ServiceTotals {
  uint64_t requests = 0;         // answered (an answer its client cut short included)
  uint64_t requests_failed = 0;  // accepted, then ended by an error or by the server's stop
  uint64_t requests_left = 0;    // accepted, and their client left before they started
  int64_t prompt_tokens = 0;     // prompt tokens run
  int64_t reused_tokens = 0;     // prompt tokens the previous request's sequence held
                                 // (or a kept one: ServiceOptions::cache_ram_bytes)
  int64_t generated_tokens = 0, decode_steps = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  // Requests generating now / waiting for the sequence (a batch between two prompts included:
  // LinePlace), as the busy refusal counts them.
  int64_t processing = 0, waiting = 0;
  runtime::EngineCounters engine;       // the engine's counters after the last request
  // Sequences kept (ServiceOptions::cache_ram_bytes) and their bytes; requests that went on from
  // one of them.
  int64_t kept_sequences = 0;
  uint64_t kept_bytes = 0;
  uint64_t kept_sequence_hits = 0;
};

// A request tokenized and checked against the context, ready to run.
struct PreparedRequest {
  CompletionRequest request;
  std::vector<int32_t> ids;  // the prompt's
  int64_t max_tokens = 0;    // the request's, or the default capped to the context left
  bool max_tokens_is_context_end = false;  // the context left is the limit (not one asked for)
};

class Service {
 public:
  // `engine` and `tokenizer` outlive the service; `markers` from tok::chat_markers.
  Service(runtime::Engine& engine, const tok::Tokenizer& tokenizer, tok::ChatMarkers markers,
          ServiceOptions options);

  // Text as it becomes final (never cut inside a UTF-8 sequence, a stop text held back until it
  // is told apart), with the Completion::logprobs entries of the tokens whose text it completes
  // (`tokens`; all of them over all calls; a last call may bring tokens with no text); false
  // when the client is gone, which ends the answer at the next token.
  using TextSink =
      std::function<bool(std::string_view text, std::span<const AnswerToken> tokens)>;
  // The request's ids (chat: the conversation rendered) and its
  // generation limit. Errors: Status::usage for a request that cannot run (an empty prompt),
  // Status::budget for one past the context (-c), Status::corrupt for ids past the vocabulary.
  Result<PreparedRequest> prepare(CompletionRequest request) const;
  // Generates the answer. `stop_requested` (may be null) is asked between tokens and prompt
  // chunks, as GenerationOptions::stop_requested, and while the request waits for its turn
  // (every kTurnPoll) and before it starts: true there is Status::interrupted (its client left,
  // or the server was told to stop, while it waited). Status::interrupted too, at once, when
  // max_waiting requests wait already (busy: `busy` set), unless `place` (a batch's; may be
  // null) holds a place from its previous prompt, which this request takes; `place` holds one
  // again once the request has ended.
  // Other errors: the model's (I/O, corrupt bytes), after which the next request starts a fresh
  // sequence. `abandon_requested` (may be null; the server stopping) is asked between the layers
  // of each forward pass as well (GenerationOptions::abandon_requested): true ends the answer
  // inside the pass, as stop_requested does at a token, and the next request starts a fresh
  // sequence.
  Result<Completion> complete(const PreparedRequest& prepared, const TextSink& on_text,
                              const std::function<bool()>& stop_requested,
                              bool* busy = nullptr, LinePlace* place = nullptr,
                              const std::function<bool()>& abandon_requested = nullptr);
  static constexpr std::chrono::milliseconds kTurnPoll{100};
  // complete()'s refusal of a request while max_waiting requests wait (Status::interrupted),
  // or ok: asked before a streamed answer's status line is sent (complete() asks again).
  Status admission() const;

  const ServiceOptions& options() const { return options_; }
  const tok::Tokenizer& tokenizer() const { return tokenizer_; }
  // A copy, without waiting for the request in progress.
  ServiceTotals totals() const;

 private:
  runtime::Engine& engine_;
  const tok::Tokenizer& tokenizer_;
  const tok::ChatMarkers markers_;
  const ServiceOptions options_;
  // What a session opens with: chunk, reserve (per request: sampling, limit, stop ids).
  runtime::GenerationOptions gen_;
  // The ids that end a request's answer: the config's, and for chat the response's <|close|>.
  std::vector<int32_t> completion_stop_ids_, chat_stop_ids_;

  Result<Completion> complete_locked(const PreparedRequest& prepared, const TextSink& on_text,
                                     const std::function<bool()>& stop_requested,
                                     const std::function<bool()>& abandon_requested);
  // The line of requests waiting to generate (first come, first served). join_line takes a
  // place (its ticket) and counts the request as waiting, in one step (the busy refusal
  // otherwise); wait_turn returns true when that ticket's turn has come (end_turn() after it),
  // false, having left the line, when `stop_requested` said so while it waited.
  Result<uint64_t> join_line(LinePlace* place);
  bool wait_turn(uint64_t ticket, const std::function<bool()>& stop_requested);
  void end_turn();
  Status admission_locked() const;  // totals_mutex_ held
  friend class LinePlace;

  // Guards totals_; never held while generating.
  mutable std::mutex totals_mutex_;
  ServiceTotals totals_;
  std::mutex turn_mutex_;  // guards line_, next_ticket_, generating_; taken before totals_mutex_
  std::condition_variable turn_cv_;
  std::deque<uint64_t> line_;  // the waiting requests' tickets, in arrival order
  uint64_t next_ticket_ = 0;
  bool generating_ = false;
  std::mutex mutex_;  // guards everything below
  std::unique_ptr<runtime::GenerationSession> session_;
  // Sequences kept for later requests (cache_ram_bytes), the most recently used first, and
  // their bytes.
  std::list<std::unique_ptr<runtime::GenerationSession>> kept_;
  uint64_t kept_bytes_ = 0;
  // session_ into kept_ (when it holds positions and fits cache_ram_bytes; in place of a kept
  // one with the same ids), the least recently used dropped past the limit; session_ is null
  // after it. (A fresh sequence that cannot be made drops every kept one, and is tried again.)
  void keep_session();
  // The kept sequence whose ids the request's `ids` extend (`usable`), the longest, moved out
  // of kept_; null where none.
  std::unique_ptr<runtime::GenerationSession> take_kept(
      const std::function<bool(const runtime::GenerationSession&)>& usable);
};

// Where a stop text could still begin: the length of the longest suffix of `text` that is a
// proper prefix of one of `stops` (text held back while streaming).
size_t stop_prefix_suffix(std::string_view text, const std::vector<std::string>& stops);

}  // namespace ktier::server
