#include "server/answer_text.h"

#include <algorithm>
#include <optional>
#include <span>
#include <string_view>

#include "common/check.h"

namespace ktier::server {

AnswerText::AnswerText(const tok::Tokenizer& tokenizer, const std::vector<std::string>& stops,
                       bool with_entries, const Service::TextSink& on_text, Completion& out)
    : tokenizer_(tokenizer),
      stops_(stops),
      with_entries_(with_entries),
      on_text_(on_text),
      out_(out) {}

TokenLogprob AnswerText::entry_of(const runtime::IdLogprob& t) const {
  const std::optional<std::string_view> bytes =
      tokenizer_.token_bytes(static_cast<uint32_t>(t.id));
  return TokenLogprob{t.id, t.logprob, std::string(bytes.value_or(""))};
}

void AnswerText::send_upto(size_t upto) {
  if (upto <= sent_) return;
  size_t ready = tokens_sent_;
  while (ready < token_end_.size() && token_end_[ready] <= upto && token_begin_[ready] < upto)
    ++ready;
  const std::span<const AnswerToken> tokens =
      std::span<const AnswerToken>(out_.logprobs).subspan(tokens_sent_, ready - tokens_sent_);
  if (!client_gone_ &&
      !on_text_(std::string_view(out_.text).substr(sent_, upto - sent_), tokens))
    client_gone_ = true;
  sent_ = upto;
  tokens_sent_ = ready;
}

void AnswerText::send_remaining_entries() {
  if (tokens_sent_ < out_.logprobs.size() && !client_gone_ &&
      !on_text_({}, std::span<const AnswerToken>(out_.logprobs).subspan(tokens_sent_)))
    client_gone_ = true;
}

// A stop text cannot begin before sent_: what could still begin one is held back.
void AnswerText::scan() {
  if (stop_hit_) return;
  size_t first = std::string::npos;
  for (const std::string& stop : stops_) {
    // Of the stop texts found once this token's text is in, the one that begins first (the
    // first given of those that begin there; one found already would have ended the answer).
    const size_t at = out_.text.find(stop, std::max(sent_, stops_from_));
    if (at < first) first = at, out_.stopping_word = stop;
  }
  if (first != std::string::npos) {
    out_.text.resize(first);
    // The tokens of the stop text and after it are not the answer's.
    const size_t kept = static_cast<size_t>(
        std::lower_bound(token_begin_.begin(), token_begin_.end(), first) - token_begin_.begin());
    KTIER_CHECK(kept >= tokens_sent_);  // a sent token's text begins before sent_
    token_begin_.resize(kept);
    token_end_.resize(kept);
    out_.logprobs.resize(kept);
    for (size_t& end : token_end_) end = std::min(end, first);
    send_upto(first);
    stop_hit_ = true;
    return;
  }
  send_upto(out_.text.size() -
            stop_prefix_suffix(std::string_view(out_.text).substr(sent_), stops_));
}

void AnswerText::add_text(const std::string& text) {
  out_.text += text;
  characters_ += static_cast<int64_t>(
      std::count_if(text.begin(), text.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

// `text_bytes` of text about to be added at the end are the entry's.
void AnswerText::add_entry(int32_t id, const runtime::TokenLogprobs* lp, size_t text_bytes) {
  if (!with_entries_) return;
  AnswerToken& a = out_.logprobs.emplace_back();
  a.token = entry_of(lp ? lp->chosen : runtime::IdLogprob{id, 0});
  if (lp)
    for (const runtime::IdLogprob& t : lp->top) a.top.push_back(entry_of(t));
  a.text_offset = characters_;
  token_begin_.push_back(out_.text.size());
  token_end_.push_back(out_.text.size() + text_bytes);
}

void AnswerText::add_hidden_entry(int32_t id, const runtime::TokenLogprobs& lp, bool while_held) {
  if (!with_entries_) return;
  if (while_held) hidden_while_held_.push_back(out_.logprobs.size());
  add_entry(id, &lp, 0);
}

void AnswerText::add_held_text(const std::string& text) {
  add_text(text);
  for (const size_t i : hidden_while_held_) {
    token_begin_[i] = token_end_[i] = out_.text.size();
    out_.logprobs[i].text_offset = characters_;
  }
  hidden_while_held_.clear();
}

Status AnswerText::add_token(tok::StreamingDecoder& decoder, int32_t id,
                             const runtime::TokenLogprobs* lp) {
  const size_t held = decoder.pending_bytes();
  KTIER_ASSIGN_OR_RETURN(const std::string piece, decoder.push(static_cast<uint32_t>(id)));
  std::string text = valid_utf8(piece);
  if (held > 0 && !piece.empty()) {  // (then the piece begins with the held bytes)
    const std::string held_text = valid_utf8(std::string_view(piece).substr(0, held));
    if (text == held_text + valid_utf8(std::string_view(piece).substr(held))) {
      add_held_text(held_text);
      text.erase(0, held_text.size());
    }
    hidden_while_held_.clear();
  }
  add_entry(id, lp, text.size());
  add_text(text);
  return Status::ok();
}

}  // namespace ktier::server
