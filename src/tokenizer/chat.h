#pragma once
// Kimi K3's chat format (K3-MODEL.md §8.6, "XTML"), as far as it is verified: one user turn and
// the assistant's generation prompt with thinking off. An element is
//   <|open|>TAG ATTRS<|sep|>CONTENT<|close|>TAG<|sep|>
// where the three markers are single added-token ids and the tag, its attributes and the
// content are ordinary text; a message ends with <|end_of_msg|>. The rendered prompt is
//   <|open|>message role="user"<|sep|>TEXT<|close|>message<|sep|><|end_of_msg|>
//   <|open|>message role="assistant"<|sep|><|open|>response<|sep|>
// (no separator between the two lines, no BOS: decision D10). The model then writes the
// response's content and closes it with <|close|>; a conversation goes on with the assistant's
// message closed (end_assistant_turn) and the next user turn; render_conversation writes such
// a history whole (`ktier serve`). Thinking mode, system messages
// and tools need texts from the release's encoding_k3.py that K3-MODEL.md does not reproduce:
// not here.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "tokenizer/tokenizer.h"

namespace ktier::tok {

struct ChatMarkers {
  uint32_t open = 0, close = 0, sep = 0, end_of_msg = 0;
};
// The markers' ids, looked up by name in the tokenizer's added tokens. Status::usage naming
// the first one missing (a tokenizer that is not K3's).
Result<ChatMarkers> chat_markers(const Tokenizer& tok);

// The prompt above for one user message `text`, encoded as ordinary text: marker strings typed
// in it are text, never markers (K3-MODEL.md §8.4: user content is untrusted). `markers` from
// chat_markers(tok).
std::vector<uint32_t> render_user_turn(const Tokenizer& tok, const ChatMarkers& markers,
                                       std::string_view text);

// One message of a conversation (render_conversation).
struct ChatMessage {
  enum class Role { kUser, kAssistant };
  Role role = Role::kUser;
  std::string text;
};
// A conversation ending with the assistant's generation prompt, every text encoded as
// render_user_turn does: each user message as there (without the prompt after it), each
// assistant message as a closed response,
//   <|open|>message role="assistant"<|sep|><|open|>response<|sep|>TEXT<|close|>response<|sep|>
//   <|close|>message<|sep|><|end_of_msg|>
// so that [user, assistant, user] is render_user_turn, the answer's text, end_assistant_turn's
// ids after <|close|>, then render_user_turn of the next message. The ids depend on the texts
// only. REQUIRES messages not empty.
std::vector<uint32_t> render_conversation(const Tokenizer& tok, const ChatMarkers& markers,
                                          std::span<const ChatMessage> messages);

// What ends the assistant's message in the history after a turn whose last sampled token
// (never run: GenerationSession) was `last`: `last` itself, then
//   after <|close|> (the response closed):  response<|sep|><|close|>message<|sep|><|end_of_msg|>
//   after anything else (a length limit):   <|close|>response<|sep|><|close|>message<|sep|>
//                                           <|end_of_msg|>
// except that <|end_of_msg|> (which a chat, stopping at <|close|> first, only meets straight
// after the response's text) and another stop id (`last_is_stop`: e.g. --stop-id's [EOS]) are
// not part of the answer: they are left out and the response closed as after a length limit,
// as render_conversation closes the same answer. So that
// render_user_turn's ids can follow. `markers` from chat_markers(tok).
std::vector<uint32_t> end_assistant_turn(const Tokenizer& tok, const ChatMarkers& markers,
                                         uint32_t last, bool last_is_stop);

}  // namespace ktier::tok
