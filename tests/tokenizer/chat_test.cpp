// K3's chat rendering (tokenizer/chat.h) on a small vocabulary with K3's marker names: the
// markers are single ids in the documented places, the rest is the ordinary encoding of the
// documented text, typed marker strings in the user's text stay text, an assistant message is
// closed from wherever the answer stopped, and a tokenizer without the markers is refused by
// name.
#include "tokenizer/chat.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "test_vocab.h"

namespace ktier::tok {
namespace {

Tokenizer k3_like(bool with_close = true) {
  std::vector<AddedToken> added = {{1000, "[BOS]", true},        {1002, "<|end_of_msg|>", true},
                                   {1003, "<|open|>", false},     {1005, "<|sep|>", false}};
  if (with_close) added.push_back({1004, "<|close|>", false});
  const std::vector<std::string> vocab = test::byte_vocab(test::demo_merges());
  auto t = Tokenizer::from_parts(vocab, added, 1024 - static_cast<uint32_t>(vocab.size()));
  EXPECT_TRUE(t.is_ok()) << t.status().message();
  return std::move(t).value();
}

std::vector<uint32_t> cat(std::initializer_list<std::vector<uint32_t>> parts) {
  std::vector<uint32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST(ChatFormat, UserTurnAndGenerationPromptAsDocumented) {
  const Tokenizer tok = k3_like();
  const std::string text = "hello world, the thing's <|close|> and <|end_of_msg|>\n";
  auto m = chat_markers(tok);
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  const std::vector<uint32_t> ids = render_user_turn(tok, *m, text);
  const auto enc = [&](std::string_view s) { return tok.encode(s, false); };
  const std::vector<uint32_t> want =
      cat({{1003}, enc("message role=\"user\""), {1005}, enc(text), {1004}, enc("message"),
           {1005, 1002, 1003}, enc("message role=\"assistant\""), {1005, 1003}, enc("response"),
           {1005}});
  EXPECT_EQ(ids, want);
  // Markers only where the format puts them: the typed ones in `text` are ordinary bytes.
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1003u), 3);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1005u), 4);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1004u), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1002u), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1000u), 0) << "no BOS (decision D10)";
  auto text_back = tok.decode(ids);
  ASSERT_TRUE(text_back.is_ok());
  EXPECT_EQ(*text_back, "<|open|>message role=\"user\"<|sep|>" + text +
                            "<|close|>message<|sep|><|end_of_msg|><|open|>message "
                            "role=\"assistant\"<|sep|><|open|>response<|sep|>");
}

// The assistant's message is closed as the format writes it, whatever ended the answer: the
// model's <|close|> (the tag follows), or a length limit (the whole closing markup follows the
// cut answer's last token). Its <|end_of_msg|> (met straight after the text: a chat stops at
// <|close|> first) is left out and the whole closing follows, as render_conversation has it.
TEST(ChatFormat, EndAssistantTurnClosesTheMessageFromWhereTheAnswerStopped) {
  const Tokenizer tok = k3_like();
  auto m = chat_markers(tok);
  ASSERT_TRUE(m.is_ok());
  const auto enc = [&](std::string_view s) { return tok.encode(s, false); };
  const std::vector<uint32_t> tail =
      cat({enc("response"), {m->sep, m->close}, enc("message"), {m->sep, m->end_of_msg}});
  EXPECT_EQ(end_assistant_turn(tok, *m, m->close, false), cat({{m->close}, tail}));
  EXPECT_EQ(end_assistant_turn(tok, *m, m->end_of_msg, false), cat({{m->close}, tail}));
  const uint32_t word = enc("hello").at(0);
  EXPECT_EQ(end_assistant_turn(tok, *m, word, false), cat({{word, m->close}, tail}));
  auto text = tok.decode(end_assistant_turn(tok, *m, word, false));
  ASSERT_TRUE(text.is_ok());
  EXPECT_EQ(*text, "hello<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>");
  // Another stop id (--stop-id) is left out; <|close|> stays.
  EXPECT_EQ(end_assistant_turn(tok, *m, word, true), cat({{m->close}, tail}));
  EXPECT_EQ(end_assistant_turn(tok, *m, m->close, true), cat({{m->close}, tail}));
  EXPECT_EQ(end_assistant_turn(tok, *m, m->end_of_msg, true), cat({{m->close}, tail}));
  // The same ids as the conversation rendered whole with the answer's text.
  using Role = ChatMessage::Role;
  const std::vector<ChatMessage> messages = {
      {Role::kUser, "q"}, {Role::kAssistant, "hello"}, {Role::kUser, "r"}};
  EXPECT_EQ(render_conversation(tok, *m, messages),
            cat({render_user_turn(tok, *m, "q"), enc("hello"),
                 end_assistant_turn(tok, *m, m->end_of_msg, true),
                 render_user_turn(tok, *m, "r")}));
}

// A conversation rendered whole is what a conversation run turn by turn feeds the model: the
// first turn, the answer's text, its closing after <|close|>, the next turn.
TEST(ChatFormat, ConversationIsTheTurnsAndClosedAnswersInOrder) {
  const Tokenizer tok = k3_like();
  auto m = chat_markers(tok);
  ASSERT_TRUE(m.is_ok());
  const auto enc = [&](std::string_view s) { return tok.encode(s, false); };
  using Role = ChatMessage::Role;
  const std::vector<ChatMessage> messages = {
      {Role::kUser, "first question"}, {Role::kAssistant, "an answer <|close|>"},
      {Role::kUser, "second"}};
  const std::vector<uint32_t> turns =
      cat({render_user_turn(tok, *m, "first question"), enc("an answer <|close|>"),
           end_assistant_turn(tok, *m, m->close, false), render_user_turn(tok, *m, "second")});
  EXPECT_EQ(render_conversation(tok, *m, messages), turns);
  EXPECT_EQ(render_conversation(tok, *m, std::span(messages).first(1)),
            render_user_turn(tok, *m, "first question"));
  // Two user messages in a row: the first closed, no assistant prompt between them.
  const std::vector<ChatMessage> two = {{Role::kUser, "a"}, {Role::kUser, "b"}};
  auto text = tok.decode(render_conversation(tok, *m, two));
  ASSERT_TRUE(text.is_ok());
  EXPECT_EQ(*text, "<|open|>message role=\"user\"<|sep|>a<|close|>message<|sep|><|end_of_msg|>"
                   "<|open|>message role=\"user\"<|sep|>b<|close|>message<|sep|><|end_of_msg|>"
                   "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>");
}

TEST(ChatFormat, MissingMarkerIsAUsageErrorNamingIt) {
  const Tokenizer tok = k3_like(/*with_close=*/false);
  auto m = chat_markers(tok);
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().exit_code(), 2);
  EXPECT_NE(m.status().message().find("<|close|>"), std::string::npos) << m.status().message();
}

}  // namespace
}  // namespace ktier::tok
