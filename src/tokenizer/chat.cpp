#include "tokenizer/chat.h"

#include <string>

namespace ktier::tok {

Result<ChatMarkers> chat_markers(const Tokenizer& tok) {
  ChatMarkers m;
  for (auto [name, id] : {std::pair{"<|open|>", &m.open}, std::pair{"<|close|>", &m.close},
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

Result<std::vector<uint32_t>> render_user_turn(const Tokenizer& tok, std::string_view text) {
  KTIER_ASSIGN_OR_RETURN(const ChatMarkers m, chat_markers(tok));
  std::vector<uint32_t> ids;
  const auto append_text = [&](std::string_view s) {
    const std::vector<uint32_t> part = tok.encode(s, /*allow_special=*/false);
    ids.insert(ids.end(), part.begin(), part.end());
  };
  const auto open = [&](std::string_view tag_and_attrs) {
    ids.push_back(m.open);
    append_text(tag_and_attrs);
    ids.push_back(m.sep);
  };
  open("message role=\"user\"");
  append_text(text);
  ids.push_back(m.close);
  append_text("message");
  ids.push_back(m.sep);
  ids.push_back(m.end_of_msg);
  open("message role=\"assistant\"");
  open("response");
  return ids;
}

}  // namespace ktier::tok
