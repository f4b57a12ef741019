#include "tokenizer/chat.h"

#include <string>

#include "common/check.h"

namespace ktier::tok {
namespace {
void append_text(const Tokenizer& tok, std::string_view s, std::vector<uint32_t>& ids) {
  const std::vector<uint32_t> part = tok.encode(s, /*allow_special=*/false);
  ids.insert(ids.end(), part.begin(), part.end());
}
// <|close|>TAG<|sep|>
void close_element(const Tokenizer& tok, const ChatMarkers& m, std::string_view tag,
                   std::vector<uint32_t>& ids) {
  ids.push_back(m.close);
  append_text(tok, tag, ids);
  ids.push_back(m.sep);
}
}  // namespace

Result<ChatMarkers> chat_markers(const Tokenizer& tok) {
  ChatMarkers m;
  for (auto [name, id] :
       {std::pair{"<|open|>", &m.open}, std::pair{"<|close|>", &m.close},
        std::pair{"<|sep|>", &m.sep}, std::pair{"<|end_of_msg|>", &m.end_of_msg}}) {
    const std::optional<uint32_t> found = tok.added_token_id(name);
    if (!found)
      return Status::usage(std::string("the tokenizer has no added token ") + name +
                           " (tokenizer_config.json added_tokens_decoder): the chat format needs "
                           "Kimi K3's markers");
    *id = *found;
  }
  return m;
}

std::vector<uint32_t> render_user_turn(const Tokenizer& tok, const ChatMarkers& m,
                                       std::string_view text) {
  const ChatMessage message{ChatMessage::Role::kUser, std::string(text)};
  return render_conversation(tok, m, std::span<const ChatMessage>(&message, 1));
}

std::vector<uint32_t> render_conversation(const Tokenizer& tok, const ChatMarkers& m,
                                          std::span<const ChatMessage> messages) {
  KTIER_CHECK(!messages.empty());
  std::vector<uint32_t> ids;
  const auto open = [&](std::string_view tag_and_attrs) {
    ids.push_back(m.open);
    append_text(tok, tag_and_attrs, ids);
    ids.push_back(m.sep);
  };
  for (const ChatMessage& message : messages) {
    const bool user = message.role == ChatMessage::Role::kUser;
    open(user ? "message role=\"user\"" : "message role=\"assistant\"");
    if (!user) open("response");
    append_text(tok, message.text, ids);
    if (!user) close_element(tok, m, "response", ids);
    close_element(tok, m, "message", ids);
    ids.push_back(m.end_of_msg);
  }
  open("message role=\"assistant\"");
  open("response");
  return ids;
}

std::vector<uint32_t> end_assistant_turn(const Tokenizer& tok, const ChatMarkers& m,
                                         uint32_t last, bool last_is_stop) {
  std::vector<uint32_t> ids;
  // A chat stops at <|close|> first, so an <|end_of_msg|> came straight after the response's
  // text, its elements unclosed: left out and closed as after a length limit, as `serve` renders
  // the same answer (the text only, closed).
  if (last == m.close || (!last_is_stop && last != m.end_of_msg)) ids.push_back(last);
  if (last == m.close) {  // the model's own <|close|>: the tag follows
    append_text(tok, "response", ids);
    ids.push_back(m.sep);
  } else {
    close_element(tok, m, "response", ids);
  }
  close_element(tok, m, "message", ids);
  ids.push_back(m.end_of_msg);
  return ids;
}

}  // namespace ktier::tok
