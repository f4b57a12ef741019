#include "server/service.h"

#include <algorithm>
#include <variant>

#include <spdlog/spdlog.h>

#include "common/check.h"
#include "common/size.h"
#include "cpu/kernels.h"
#include "runtime/logprobs.h"
#include "server/answer_text.h"
#include "tokenizer/unicode.h"

namespace ktier::server {

size_t stop_prefix_suffix(std::string_view text, const std::vector<std::string>& stops) {
  size_t longest = 0;
  for (const std::string& stop : stops) {
    const size_t most = std::min(text.size(), stop.size() - 1);
    for (size_t n = most; n > longest; --n)
      if (text.substr(text.size() - n) == std::string_view(stop).substr(0, n)) {
        longest = n;
        break;
      }
  }
  return longest;
}

Service::Service(runtime::Engine& engine, const tok::Tokenizer& tokenizer,
                 tok::ChatMarkers markers, ServiceOptions options)
    : engine_(engine), tokenizer_(tokenizer), markers_(markers), options_(std::move(options)) {
  const format::ModelConfig& cfg = engine_.checkpoint().config();
  // Every answer ends at the config's stop ids (K3-MODEL §8.6: <|end_of_msg|>). Chat rendered
  // the prompt, so what follows the response's <|close|> is markup, not the answer (as `run
  // --chat`); a completion's prompt is the client's, which may open another element there (its
  // own thinking prompt goes on past <|close|>think<|sep|>): it runs to the message's end, as
  // `run` and llama-server do.
  completion_stop_ids_.assign(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end());
  chat_stop_ids_ = completion_stop_ids_;
  chat_stop_ids_.push_back(static_cast<int32_t>(markers_.close));
  gen_.prefill_chunk = options_.prefill_chunk;
  gen_.reserve_positions = options_.ctx;
  gen_.sampling = options_.defaults.sampling;
  // GPU mode's sequence lives in the VRAM set aside for one (cmd_serve.cpp turns it off).
  KTIER_CHECK(options_.cache_ram_bytes == 0 || engine_.device_vram_bytes() == 0);
}

Result<PreparedRequest> Service::prepare(CompletionRequest request) const {
  const int64_t vocab = engine_.checkpoint().config().vocab_size;
  for (const auto& [id, bias] : request.sampling.logit_bias)
    if (id < 0 || id >= vocab)
      return field_error("logit_bias", "token " + std::to_string(id) +
                                           " is outside the vocabulary (" +
                                           std::to_string(vocab) + " ids)");
  if (request.ignore_eos)  // as llama-server: the ids that would end the answer never drawn
    for (const int32_t id : request.endpoint == Endpoint::kChatCompletions ? chat_stop_ids_
                                                                            : completion_stop_ids_)
      request.sampling.logit_bias.emplace_back(id, -std::numeric_limits<float>::infinity());
  if (runtime::bans_every_token(request.sampling, vocab))
    return field_error("logit_bias", std::string("no token can be drawn: each of the ") +
                                         std::to_string(vocab) + " ids is banned (false or "
                                         "-inf" + (request.ignore_eos ? ", or ignore_eos" : "") +
                                         ")");
  std::vector<int32_t> ids;
  const auto add_client_id = [&](int32_t id) {  // (parse_request: each >= 0)
    if (id >= vocab)
      return field_error("prompt", "id " + std::to_string(id) + " is past the vocabulary (" +
                                       std::to_string(vocab) + " ids)");
    ids.push_back(id);
    return Status::ok();
  };
  const auto add_encoded = [&](const std::vector<uint32_t>& encoded) {
    for (const uint32_t id : encoded) {
      if (static_cast<int64_t>(id) >= vocab)
        return Status::corrupt("the tokenizer encodes the request to id " + std::to_string(id) +
                               ", past config.json's vocab_size " + std::to_string(vocab) +
                               ": the model folder disagrees with itself");
      ids.push_back(static_cast<int32_t>(id));
    }
    return Status::ok();
  };
  // A chat message's content is text (K3-MODEL §8.4: special-token names in it stay text);
  // a completion's prompt is the client's own render, read as llama-server and vLLM read it:
  // special-token names in it are their ids.
  const auto prompt_text = [&](const std::string& text) {
    return tokenizer_.encode(text, /*allow_special=*/true);
  };
  for (const PromptPiece& piece : request.prompt_pieces)
    KTIER_RETURN_IF_ERROR(std::holds_alternative<int32_t>(piece)
                              ? add_client_id(std::get<int32_t>(piece))
                              : add_encoded(prompt_text(std::get<std::string>(piece))));
  if (request.endpoint == Endpoint::kChatCompletions)
    KTIER_RETURN_IF_ERROR(
        add_encoded(tok::render_conversation(tokenizer_, markers_, request.messages)));
  else if (request.prompt_pieces.empty())
    KTIER_RETURN_IF_ERROR(add_encoded(prompt_text(request.prompt)));
  if (ids.empty()) return Status::usage("request field \"prompt\": empty (no token to run)");
  const int64_t prompt = static_cast<int64_t>(ids.size());
  // A run of P prompt ids and n generated ones uses P + n - 1 positions (the last is not run).
  const int64_t room = options_.ctx - prompt + 1;
  // (n_predict 0 runs the prompt only: P positions, the same bound.) llama-server's /completion
  // stops where the context ends; OpenAI's endpoints refuse a max_tokens past it.
  const bool capped = request.endpoint == Endpoint::kLlamaCompletion;
  if (room < 1 || (!capped && request.max_tokens && *request.max_tokens > room))
    return Status::budget("the prompt's " + std::to_string(prompt) + " tokens" +
                          (request.max_tokens && !capped
                               ? " and max_tokens " + std::to_string(*request.max_tokens)
                               : std::string()) +
                          " need more positions than the context holds (-c/--ctx-size " +
                          std::to_string(options_.ctx) + ")");
  // n_predict -1, or no limit given where the server's -n is -1: all that is left.
  const bool to_context_end =
      request.to_context_end || (!request.max_tokens && options_.defaults.max_tokens < 0);
  const int64_t asked = request.max_tokens.value_or(options_.defaults.max_tokens);
  const bool context_end = to_context_end || asked > room;
  return PreparedRequest{std::move(request), std::move(ids), context_end ? room : asked,
                         context_end};
}

ServiceTotals Service::totals() const {
  std::lock_guard<std::mutex> lock(totals_mutex_);
  return totals_;
}

LinePlace::~LinePlace() {
  if (!held_) return;
  std::lock_guard<std::mutex> totals(service_.totals_mutex_);
  --service_.totals_.waiting;
}

Result<uint64_t> Service::join_line(LinePlace* place) {
  std::lock_guard<std::mutex> lock(turn_mutex_);
  std::lock_guard<std::mutex> totals(totals_mutex_);
  const bool takes_place = place != nullptr && place->held_;
  if (!takes_place) KTIER_RETURN_IF_ERROR(admission_locked());
  line_.push_back(next_ticket_);  // may throw std::bad_alloc: nothing is counted yet
  if (takes_place) {
    place->held_ = false;  // this request takes over the place, counted as waiting already
  } else {
    ++totals_.waiting;
  }
  return next_ticket_++;
}

bool Service::wait_turn(uint64_t ticket, const std::function<bool()>& stop_requested) {
  std::unique_lock<std::mutex> lock(turn_mutex_);
  while (generating_ || line_.front() != ticket) {
    turn_cv_.wait_for(lock, kTurnPoll);
    if (!generating_ && line_.front() == ticket) break;
    // Asked without the lock: it may poll a socket.
    lock.unlock();
    const bool stop = stop_requested && stop_requested();
    lock.lock();
    if (stop) {
      line_.erase(std::find(line_.begin(), line_.end(), ticket));
      turn_cv_.notify_all();  // the next one may be at the front now
      return false;
    }
  }
  line_.pop_front();
  generating_ = true;
  return true;
}

void Service::end_turn() {
  {
    std::lock_guard<std::mutex> lock(turn_mutex_);
    generating_ = false;
  }
  turn_cv_.notify_all();
}

Status Service::admission_locked() const {
  const int64_t waiting = totals_.waiting;
  if (options_.max_waiting > 0 && waiting >= options_.max_waiting)
    return Status::interrupted("the server is busy: " + std::to_string(waiting) +
                               " requests wait for the model already; try again later");
  return Status::ok();
}

Status Service::admission() const {
  std::lock_guard<std::mutex> totals(totals_mutex_);
  return admission_locked();
}

Result<Completion> Service::complete(const PreparedRequest& prepared, const TextSink& on_text,
                                     const std::function<bool()>& stop_requested, bool* busy,
                                     LinePlace* place,
                                     const std::function<bool()>& abandon_requested) {
  if (busy) *busy = false;
  const Result<uint64_t> ticket = join_line(place);
  if (!ticket.is_ok()) {
    if (busy) *busy = true;
    return ticket.status();
  }
  // A request whose client left, or that waited while the server was told to stop, does not
  // start. stop_requested is either; abandon_requested only the latter (cmd_serve.cpp).
  const auto not_started = [&] {
    const bool server_stops = abandon_requested && abandon_requested();
    std::lock_guard<std::mutex> totals(totals_mutex_);
    --totals_.waiting;
    ++(server_stops ? totals_.requests_failed : totals_.requests_left);
    return Status::interrupted(server_stops
                                   ? "the server is stopping: this request was not started"
                                   : "the request was not started: its client left while it "
                                     "waited");
  };
  if (!wait_turn(*ticket, stop_requested)) return not_started();
  // The ops' grow-only per-thread buffers go with the turn: each request may run on another of
  // the server's connection threads, and each kept its own (K3: 117 MB and more a thread, where
  // the budget counts one).
  struct Turn {
    Service& s;
    ~Turn() {
      cpu::release_thread_buffers();
      s.end_turn();
    }
  } turn{*this};
  if (stop_requested && stop_requested()) return not_started();
  std::lock_guard<std::mutex> lock(mutex_);
  {
    std::lock_guard<std::mutex> totals(totals_mutex_);
    --totals_.waiting;
    ++totals_.processing;
  }
  // Whatever way the request ends (an exception too: `serve` answers it as an error and goes
  // on), it is no longer processing: the server's stop waits while anything is.
  // A batch's place is kept in the same step, so that no other request takes it meanwhile.
  bool counted = false;
  struct Done {
    Service& s;
    bool& counted;
    LinePlace* place;
    ~Done() {
      std::lock_guard<std::mutex> totals(s.totals_mutex_);
      --s.totals_.processing;
      if (!counted) ++s.totals_.requests_failed;
      if (place != nullptr) {
        place->held_ = true;  // counted as waiting until its next prompt or ~LinePlace
        ++s.totals_.waiting;
      }
    }
  } end_processing{*this, counted, place};
  Result<Completion> done = complete_locked(prepared, on_text, stop_requested, abandon_requested);
  const runtime::EngineCounters counters = runtime::EngineCounters::of(engine_);
  std::lock_guard<std::mutex> totals(totals_mutex_);
  totals_.engine = counters;
  totals_.kept_sequences = static_cast<int64_t>(kept_.size());
  totals_.kept_bytes = kept_bytes_;
  if (!done.is_ok()) return done;
  counted = true;
  totals_.kept_sequence_hits += done->from_kept_sequence;
  const runtime::GenerationStats& g = done->report.gen;
  // An answer the server's stop cut short reaches its client as an error (cmd_serve.cpp).
  ++(done->cancelled && abandon_requested && abandon_requested() ? totals_.requests_failed
                                                                 : totals_.requests);
  totals_.prompt_tokens += g.prompt_tokens;
  totals_.reused_tokens += done->usage.cached_tokens;
  totals_.generated_tokens += g.generated_tokens;
  totals_.decode_steps += g.decode_steps;
  totals_.prefill_seconds += g.prefill_seconds;
  totals_.decode_seconds += g.decode_seconds;
  return done;
}

void Service::keep_session() {
  std::unique_ptr<runtime::GenerationSession> s = std::move(session_);
  if (!s || s->positions() == 0) return;
  const uint64_t bytes = s->state().bytes();
  if (bytes > options_.cache_ram_bytes) return;  // would never fit
  // The same ids kept already (a request retried): one copy, the most recently used, so that
  // retries do not push the other conversations out.
  const auto same = std::find_if(kept_.begin(), kept_.end(), [&](const auto& k) {
    return std::ranges::equal(k->ids(), s->ids());
  });
  if (same != kept_.end()) {
    kept_bytes_ -= (*same)->state().bytes();
    kept_.erase(same);
  }
  kept_.push_front(std::move(s));
  kept_bytes_ += bytes;
  while (kept_bytes_ > options_.cache_ram_bytes) {
    kept_bytes_ -= kept_.back()->state().bytes();
    kept_.pop_back();
  }
}

std::unique_ptr<runtime::GenerationSession> Service::take_kept(
    const std::function<bool(const runtime::GenerationSession&)>& usable) {
  auto best = kept_.end();
  for (auto it = kept_.begin(); it != kept_.end(); ++it)
    if (usable(**it) && (best == kept_.end() || (*it)->positions() > (*best)->positions()))
      best = it;
  if (best == kept_.end()) return nullptr;
  std::unique_ptr<runtime::GenerationSession> s = std::move(*best);
  kept_bytes_ -= s->state().bytes();
  kept_.erase(best);
  return s;
}

Result<Completion> Service::complete_locked(const PreparedRequest& prepared,
                                            const TextSink& on_text,
                                            const std::function<bool()>& stop_requested,
                                            const std::function<bool()>& abandon_requested) {
  const CompletionRequest& request = prepared.request;
  const std::vector<int32_t>& ids = prepared.ids;
  const int64_t prompt = static_cast<int64_t>(ids.size());
  const int64_t max_tokens = prepared.max_tokens;

  Completion out;
  AnswerText answer(tokenizer_, request.stop, request.logprobs.has_value(), on_text, out);
  const int64_t vocab = engine_.checkpoint().config().vocab_size;
  // Completions' echo: the prompt's text and tokens come first, sent once the prompt has run
  // (before_decode); with logprobs each token but the first is scored by the row before it
  // (score_prompt), so the whole prompt runs afresh. Stop texts are looked for after it.
  // One decoder for both: a character whose bytes the prompt begins and the answer ends is
  // itself (the text of the whole sequence), not two U+FFFD.
  tok::StreamingDecoder decoder(tokenizer_);
  const bool score_echo = request.echo && request.logprobs;
  if (request.echo) {
    for (const int32_t id : ids) KTIER_RETURN_IF_ERROR(answer.add_token(decoder, id, nullptr));
    if (score_echo) out.logprobs.front().scored = false;
    answer.stops_from(out.text.size() + (decoder.pending_bytes() > 0 ? 1 : 0));
  }
  int64_t prompt_scored = 1;  // score_echo: prompt tokens scored so far (the first needs none)
  // A prompt stopped before all of it ran (the server stopping) sends no echo: its entries
  // would hold logprobs never computed.
  const auto echo_unscored = [&] { return score_echo && prompt_scored < prompt; };
  const runtime::ChunkLogitsSink score_prompt = [&](int64_t first, int64_t n,
                                                    const float* logits) -> Status {
    for (int64_t r = 0; r < n; ++r) {
      const int64_t next = first + r + 1;  // the prompt position row r predicts
      if (next >= prompt) break;           // the last row: the answer's first token's
      const float* row = logits + r * vocab;
      KTIER_RETURN_IF_ERROR(runtime::check_logits(row, vocab, next));
      const runtime::TokenLogprobs lp =
          runtime::token_logprobs(row, vocab, ids[static_cast<size_t>(next)], *request.logprobs);
      AnswerToken& a = out.logprobs[static_cast<size_t>(next)];
      ++prompt_scored;
      a.token.logprob = lp.chosen.logprob;
      for (const runtime::IdLogprob& t : lp.top) a.top.push_back(answer.entry_of(t));
    }
    return Status::ok();
  };
  // Every sampled token has its entry (lm-eval-harness counts on one per token); a stop or
  // special one, which shows no text, goes with the text that follows it, or last. Chat lists
  // the tokens of its content only (as OpenAI's, which never shows the end of a message).
  const bool hidden_entries = request.endpoint != Endpoint::kChatCompletions;
  const std::vector<int32_t>& stop_ids =
      request.endpoint == Endpoint::kChatCompletions ? chat_stop_ids_ : completion_stop_ids_;
  const runtime::TokenSink sink = [&](int32_t id) -> Status {
    const bool shown = tok::shown_as_text(tokenizer_, stop_ids, id);
    std::optional<runtime::TokenLogprobs> lp;
    if (request.logprobs && (shown || hidden_entries))
      lp = runtime::token_logprobs(session_->logits().data(), vocab, id, *request.logprobs);
    const runtime::TokenLogprobs* scored = lp ? &*lp : nullptr;
    if (!shown) {
      // A stop id ends the text: bytes held for an unfinished character come before it.
      const bool stop_id = std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end();
      if (stop_id) {
        answer.add_held_text(valid_utf8(decoder.flush()));
        answer.scan();
        if (answer.stop_hit()) return Status::ok();  // the answer ended before the stop id
      }
      if (lp) answer.add_hidden_entry(id, *lp, !stop_id && decoder.pending_bytes() > 0);
      return Status::ok();
    }
    KTIER_RETURN_IF_ERROR(answer.add_token(decoder, id, scored));
    answer.scan();
    return Status::ok();
  };

  // The same ids as the sequence ran (a prompt run with n_predict 0, sent again) sample from the
  // logits it holds.
  const auto extends = [&](const runtime::GenerationSession& s) {
    const std::span<const int32_t> ran = s.ids();
    return !score_echo &&
           (ran.size() < ids.size() || (ran.size() == ids.size() && s.holds_logits())) &&
           std::equal(ran.begin(), ran.end(), ids.begin());
  };
  bool reuse = session_ && extends(*session_);
  if (options_.cache_ram_bytes > 0) {
    // Another conversation's turn (or a kept sequence longer than this one that the request
    // extends too): this sequence is kept, and the longest kept one it extends goes on.
    const size_t have = reuse ? session_->ids().size() : 0;
    std::unique_ptr<runtime::GenerationSession> kept =
        take_kept([&](const runtime::GenerationSession& s) {
          return extends(s) && s.ids().size() > have;
        });
    if (kept || !reuse) keep_session();
    if (kept) {
      session_ = std::move(kept);
      reuse = out.from_kept_sequence = true;
    }
  }
  runtime::GenerationOptions gen = gen_;  // its stop ids: configure_turns' below
  gen.stop_requested = [&] {
    return answer.stop_hit() || answer.client_gone() || (stop_requested && stop_requested());
  };
  gen.before_decode = [&] {
    out.report.decode_start = runtime::EngineCounters::start_window(engine_);
    if (!echo_unscored()) answer.send_upto(out.text.size());  // the echoed prompt, if any
  };
  // A fresh or reused session is told this request's limit, sampling and stop ids.
  if (!reuse) {
    session_.reset();
    Result<std::unique_ptr<runtime::GenerationSession>> opened =
        runtime::GenerationSession::open(engine_.model(), engine_.experts(), gen);
    if (!opened.is_ok() && !kept_.empty()) {  // the kept sequences' memory given back first
      spdlog::warn("a new sequence could not be made ({}): the {} kept ({}) are dropped",
                   opened.status().message(), kept_.size(), format_size(kept_bytes_));
      kept_.clear();
      kept_bytes_ = 0;
      opened = runtime::GenerationSession::open(engine_.model(), engine_.experts(), gen);
    }
    KTIER_ASSIGN_OR_RETURN(session_, std::move(opened));
  }
  session_->configure_turns(max_tokens, request.sampling, stop_ids);
  session_->set_callbacks(gen.stop_requested, gen.before_decode,
                          score_echo ? score_prompt : nullptr, abandon_requested);
  const int64_t cached = session_->positions();
  // Replaced when the decode starts; a turn stopped in its prompt reports from here.
  out.report.decode_start = runtime::EngineCounters::start_window(engine_);
  // An exception out of the turn (std::bad_alloc in a layer) leaves the sequence part-run:
  // some layers' states hold a chunk its ids do not. The next request starts afresh.
  struct DropUnlessReturned {
    std::unique_ptr<runtime::GenerationSession>& session;
    bool returned = false;
    ~DropUnlessReturned() {
      if (!returned) session.reset();
    }
  } drop{session_};
  Result<runtime::GenerationStats> turn =
      session_->turn(std::span<const int32_t>(ids).subspan(static_cast<size_t>(cached)), sink);
  drop.returned = true;
  session_->set_callbacks(nullptr, nullptr);  // they refer to this call's locals
  if (!turn.is_ok()) {  // the sequence is unusable: the next request starts afresh
    session_.reset();
    return engine_.explain_nonfinite(turn.status());
  }
  if (session_->abandoned()) session_.reset();  // part-run, as after an error
  const bool withheld = echo_unscored();  // (then nothing was sampled)
  if (withheld) {
    out.text.clear();
    out.logprobs.clear();
  }
  // Bytes the decoder still holds (an unfinished character) belong after a stop text's cut.
  if (!answer.stop_hit() && !withheld) {
    answer.add_held_text(valid_utf8(decoder.flush()));
    answer.scan();
    if (!answer.stop_hit()) answer.send_upto(out.text.size());
  }
  // Tokens whose text was all sent before them (a token that completed no character).
  answer.send_remaining_entries();

  const runtime::GenerationStats& st = *turn;

  out.finish = st.stopped_at_stop_id || answer.stop_hit() ? FinishReason::kStop
                                                          : FinishReason::kLength;
  out.cancelled = answer.client_gone() || (st.interrupted && !answer.stop_hit());
  out.usage = {prompt, st.generated_tokens, cached};
  out.positions_held = session_ ? session_->positions() : 0;
  out.report.gen = st;
  out.report.cached_prompt_tokens = cached;
  out.report.stopped_at_stop_text = answer.stop_hit();
  out.report.limit_is_context_end = prepared.max_tokens_is_context_end;
  out.report.decode_end = runtime::EngineCounters::of(engine_);
  out.report.peak_rss_bytes = runtime::peak_rss_bytes();
  // Under the lock: the next request changes the engine's counters and memory.
  out.report_json = out.report.to_json(engine_);
  return out;
}

}  // namespace ktier::server
