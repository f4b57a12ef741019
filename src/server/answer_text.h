#pragma once
// One answer's text as `serve` builds and streams it (Service::complete): the tokens' text in
// order, the logprobs entries each tied to the bytes of its token's text, the request's stop
// texts looked for as text comes in (text that may begin one is held back), and what goes to
// the client: each piece with the entries whose text it completes.
//
//   * Bytes a streaming decoder holds for an unfinished character come out with the token that
//     completes it, or as U+FFFD (add_held_text) when none does; entries of tokens that show no
//     text while bytes are held follow that U+FFFD.
//   * A stop text ends the answer before it: the text is cut, the entries of tokens whose text
//     begins at it or after are dropped, and nothing of it is ever sent.
//   * An entry is sent with the piece that holds the end of its token's text and a byte past
//     its beginning (a token that completes no character or shows none goes with the next
//     character, or last: send_remaining_entries).
//
// Not thread-safe: one request's, on its thread.

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/logprobs.h"
#include "server/service.h"
#include "tokenizer/tokenizer.h"

namespace ktier::server {

class AnswerText {
 public:
  // The text and entries go to `out` (text, logprobs, stopping_word); `stops` are the request's
  // stop texts, `with_entries` whether it asked for logprobs; `on_text` gets what is sent (a
  // false return: the client is gone, and nothing more is sent). All outlive this.
  AnswerText(const tok::Tokenizer& tokenizer, const std::vector<std::string>& stops,
             bool with_entries, const Service::TextSink& on_text, Completion& out);

  // Adds token `id`'s text, through `decoder`, with its entry (logprobs `lp`; null: an echoed
  // prompt token, scored later if at all). Held bytes it does not complete come first, as the
  // earlier tokens' text; the character it completes begins its own.
  Status add_token(tok::StreamingDecoder& decoder, int32_t id, const runtime::TokenLogprobs* lp);
  // The entry of a token that shows no text (a special one; a stop id after add_held_text);
  // `while_held`: a decoder holds an unfinished character's bytes, and the entry goes where
  // that character ends up.
  void add_hidden_entry(int32_t id, const runtime::TokenLogprobs& lp, bool while_held);
  // Bytes a decoder held that no token completed (`text`: their U+FFFD), followed by the
  // entries of the tokens hidden while they were held.
  void add_held_text(const std::string& text);
  // Looks for the stop texts in what is not sent yet (and from stops_from()): one found ends
  // the answer before it; otherwise what cannot begin one is sent.
  void scan();
  // Stop texts are looked for from byte `at` of out.text on (an echoed prompt's end; past the
  // first byte of a character the prompt began and the answer ends: a stop text beginning
  // there would begin in the prompt).
  void stops_from(size_t at) { stops_from_ = at; }
  // Sends the text up to byte `upto` of out.text, with the entries it completes.
  void send_upto(size_t upto);
  // Sends the entries not sent yet (tokens whose text was all sent before them), with no text.
  void send_remaining_entries();
  // An entry's token: its id, log-probability and bytes.
  TokenLogprob entry_of(const runtime::IdLogprob& t) const;

  bool stop_hit() const { return stop_hit_; }
  bool client_gone() const { return client_gone_; }

 private:
  void add_text(const std::string& text);
  void add_entry(int32_t id, const runtime::TokenLogprobs* lp, size_t text_bytes);

  const tok::Tokenizer& tokenizer_;
  const std::vector<std::string>& stops_;
  const bool with_entries_;
  const Service::TextSink& on_text_;
  Completion& out_;
  size_t sent_ = 0;  // bytes of out_.text handed to on_text_
  size_t stops_from_ = 0;
  bool stop_hit_ = false, client_gone_ = false;
  int64_t characters_ = 0;  // code points in out_.text (valid UTF-8)
  // Per out_.logprobs entry: where its token's text begins and ends in out_.text (bytes; a
  // token that completes no character or shows none ends where it begins); entries before
  // tokens_sent_ are sent.
  std::vector<size_t> token_begin_, token_end_;
  size_t tokens_sent_ = 0;
  // Entries of tokens that showed no text while a decoder held an unfinished character's
  // bytes: they stay where the character begins if a later token completes it, and follow its
  // U+FFFD if none does.
  std::vector<size_t> hidden_while_held_;
};

}  // namespace ktier::server
