// AnswerText (server/answer_text.h) alone, on a byte vocabulary (id b = byte b, 256 = a special
// token): stop texts are never sent and cut the entries at them, bytes of a character split
// over tokens go out once it is complete (or as U+FFFD with the hidden entries after it), and
// every entry is sent once, with the piece that completes its text.
#include "server/answer_text.h"

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/tokenizer/test_vocab.h"

namespace ktier::server {
namespace {

constexpr int32_t kSpecial = 256;

tok::Tokenizer byte_tokenizer() {
  auto t = tok::Tokenizer::from_parts(test::byte_vocab(), {{256, "<|special|>", true}}, 1);
  EXPECT_TRUE(t.is_ok()) << t.status().message();
  return std::move(t).value();
}

runtime::TokenLogprobs scored(int32_t id) { return {{id, -0.5}, {}}; }

// What the client got: the pieces in order, and per piece the ids of the entries sent with it.
struct Client {
  std::vector<std::string> pieces;
  std::vector<std::vector<int32_t>> entries;
  Service::TextSink sink() {
    return [this](std::string_view text, std::span<const AnswerToken> tokens) {
      pieces.emplace_back(text);
      entries.emplace_back();
      for (const AnswerToken& t : tokens) entries.back().push_back(t.token.id);
      return true;
    };
  }
  std::string text() const {
    std::string all;
    for (const std::string& p : pieces) all += p;
    return all;
  }
};

// Streams `bytes` as one token each, as Service::complete's sink does for shown tokens.
void stream(AnswerText& answer, tok::StreamingDecoder& decoder, const std::string& bytes) {
  for (const char c : bytes) {
    const int32_t id = static_cast<unsigned char>(c);
    const runtime::TokenLogprobs lp = scored(id);
    ASSERT_TRUE(answer.add_token(decoder, id, &lp).is_ok());
    answer.scan();
    if (answer.stop_hit()) return;
  }
}

// One answer under test: its text and entries (out), what its client got, its decoder.
struct AnswerUnderTest {
  explicit AnswerUnderTest(std::vector<std::string> stop_texts = {})
      : stops(std::move(stop_texts)) {}
  const tok::Tokenizer tokenizer = byte_tokenizer();
  Client client;
  const Service::TextSink sink = client.sink();
  Completion out;
  const std::vector<std::string> stops;
  AnswerText answer{tokenizer, stops, true, sink, out};
  tok::StreamingDecoder decoder{tokenizer};
};

TEST(AnswerText, AStopTextSplitOverTokensIsNeverSentAndCutsTheEntries) {
  AnswerUnderTest x({"xyz", "cd"});
  auto [answer, decoder, out, client] = std::tie(x.answer, x.decoder, x.out, x.client);
  stream(answer, decoder, "abcdef");
  EXPECT_TRUE(answer.stop_hit());
  EXPECT_EQ(out.text, "ab");
  EXPECT_EQ(out.stopping_word, "cd");
  EXPECT_EQ(client.text(), "ab");
  for (const std::string& piece : client.pieces) EXPECT_EQ(piece.find('c'), std::string::npos);
  ASSERT_EQ(out.logprobs.size(), 2u);  // a and b: c's text begins the stop text
  EXPECT_EQ(out.logprobs[1].text_offset, 1);
  answer.send_remaining_entries();
  std::vector<int32_t> sent;
  for (const auto& e : client.entries) sent.insert(sent.end(), e.begin(), e.end());
  EXPECT_EQ(sent, (std::vector<int32_t>{'a', 'b'}));
}

// "é" is two bytes; a special token comes between them. The character goes out whole with the
// token that completes it; the hidden token's entry stays where the character begins.
TEST(AnswerText, ACharacterSplitOverTokensGoesOutWholeWithItsEntries) {
  AnswerUnderTest x;
  auto [answer, decoder, out, client] = std::tie(x.answer, x.decoder, x.out, x.client);
  stream(answer, decoder, "a\xC3");
  EXPECT_EQ(client.text(), "a");
  answer.add_hidden_entry(kSpecial, scored(kSpecial), decoder.pending_bytes() > 0);
  stream(answer, decoder, "\xA9");
  answer.send_remaining_entries();
  EXPECT_EQ(out.text, "a\xC3\xA9");
  EXPECT_EQ(client.text(), out.text);
  ASSERT_EQ(out.logprobs.size(), 4u);
  EXPECT_EQ(out.logprobs[2].token.id, kSpecial);
  EXPECT_EQ(out.logprobs[2].text_offset, 1);  // before "é"
  EXPECT_EQ(out.logprobs[3].text_offset, 1);
  size_t entries = 0;
  for (const auto& e : client.entries) entries += e.size();
  EXPECT_EQ(entries, 4u) << "each entry sent once";
}

// Held bytes no token completes come out as U+FFFD, and the entry of a token hidden while they
// were held follows it.
TEST(AnswerText, HeldBytesNoTokenCompletesComeOutAsAReplacementBeforeTheHiddenEntry) {
  AnswerUnderTest x;
  auto [answer, decoder, out, client] = std::tie(x.answer, x.decoder, x.out, x.client);
  stream(answer, decoder, "a\xC3");
  answer.add_hidden_entry(kSpecial, scored(kSpecial), decoder.pending_bytes() > 0);
  answer.add_held_text(valid_utf8(decoder.flush()));
  answer.scan();
  answer.send_upto(out.text.size());
  answer.send_remaining_entries();
  EXPECT_EQ(out.text, "a\xEF\xBF\xBD");
  EXPECT_EQ(client.text(), out.text);
  ASSERT_EQ(out.logprobs.size(), 3u);
  EXPECT_EQ(out.logprobs[2].token.id, kSpecial);
  EXPECT_EQ(out.logprobs[2].text_offset, 2);  // after the U+FFFD
}

// Without logprobs no entry is kept; a client that is gone gets nothing more.
TEST(AnswerText, NoEntriesWithoutLogprobsAndNothingAfterTheClientLeft) {
  const tok::Tokenizer tokenizer = byte_tokenizer();
  int calls = 0;
  const Service::TextSink sink = [&](std::string_view, std::span<const AnswerToken>) {
    ++calls;
    return false;
  };
  Completion out;
  const std::vector<std::string> stops;
  AnswerText answer(tokenizer, stops, false, sink, out);
  tok::StreamingDecoder decoder(tokenizer);
  stream(answer, decoder, "abc");
  answer.add_hidden_entry(kSpecial, scored(kSpecial), false);
  EXPECT_TRUE(out.logprobs.empty());
  EXPECT_TRUE(answer.client_gone());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(out.text, "abc");
}

}  // namespace
}  // namespace ktier::server
