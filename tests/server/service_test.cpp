// `ktier serve`'s generation (server/service.h) on the tiny checkpoint, its answers: an answer
// is the generation of the rendered request whatever came before it (a request that goes on
// from the previous one's sequence reuses it, and still answers byte for byte as a fresh one),
// stop texts end it before them and are never streamed, logprobs and echo are the model's.
// Waiting, stopping, the context and clients that leave: service_turns_test.cpp.
#include "server/service.h"

#include "tests/server/service_fixture.h"

namespace ktier::server {
namespace {

TEST_F(ServiceTest, AnAnswerIsTheGenerationOfTheRenderedRequest) {
  auto s = service();
  const std::vector<tok::ChatMessage> messages = {{tok::ChatMessage::Role::kUser, "hello there"}};
  const Completion c = answer(*s, chat_request(messages, 6));
  const std::vector<uint32_t> ids = tok::render_user_turn(*tokenizer_, markers_, "hello there");
  EXPECT_EQ(c.text, generated_text(ids, 6, /*chat=*/true));
  EXPECT_FALSE(c.text.empty());
  EXPECT_EQ(c.usage.prompt_tokens, static_cast<int64_t>(ids.size()));
  EXPECT_EQ(c.usage.cached_tokens, 0);
  EXPECT_GE(c.usage.completion_tokens, 1);
  EXPECT_EQ(c.finish, c.usage.completion_tokens == 6 ? FinishReason::kLength : FinishReason::kStop);
  const Completion t = answer(*s, text_request("The lighthouse keeper", 5));
  EXPECT_EQ(t.text, generated_text(tokenizer_->encode("The lighthouse keeper", false), 5, false));
}

// A completion's text prompt is the client's own render: special-token names in it run as their
// ids (as llama-server and vLLM read a prompt), the answer that of those ids given; a chat
// message's content keeps them as text (K3-MODEL §8.4).
TEST_F(ServiceTest, ACompletionsPromptNamesSpecialTokensAndAChatMessageKeepsThemText) {
  using Role = tok::ChatMessage::Role;
  auto s = service();
  const std::string text = "<|open|>message role=\"user\"<|sep|>The lamp";
  const std::vector<uint32_t> ids = tokenizer_->encode(text, /*allow_special=*/true);
  ASSERT_LT(ids.size(), tokenizer_->encode(text, false).size());
  const Completion named = answer(*s, text_request(text, 6));
  EXPECT_EQ(named.usage.prompt_tokens, static_cast<int64_t>(ids.size()));
  EXPECT_EQ(named.text, generated_text(ids, 6, /*chat=*/false));
  CompletionRequest given;
  given.prompt_pieces = id_pieces(ids);
  given.max_tokens = 6;
  EXPECT_EQ(answer(*s, given).text, named.text);
  // Ids and texts mixed (llama-server's): each text encoded in its place.
  CompletionRequest mixed;
  mixed.prompt_pieces = {static_cast<int32_t>(markers_.open),
                         std::string("message role=\"user\""),
                         static_cast<int32_t>(markers_.sep), std::string("The lamp")};
  mixed.max_tokens = 6;
  const Completion by_pieces = answer(*s, mixed);
  EXPECT_EQ(by_pieces.usage.prompt_tokens, static_cast<int64_t>(ids.size()));
  EXPECT_EQ(by_pieces.text, named.text);
  const Completion chat = answer(*s, chat_request({{Role::kUser, text}}, 6));
  const auto opens = [&](const std::string& content) {
    const std::vector<uint32_t> r = tok::render_user_turn(*tokenizer_, markers_, content);
    return std::count(r.begin(), r.end(), markers_.open);
  };
  EXPECT_EQ(opens(text), opens("The lamp"));  // the names in the content are text
  EXPECT_EQ(chat.usage.prompt_tokens,
            static_cast<int64_t>(tok::render_user_turn(*tokenizer_, markers_, text).size()));
}

// The second request begins with everything the first ran: only the rest runs, and the answer
// is a fresh service's, greedy and sampled (each request seeds its own sampler).
TEST_F(ServiceTest, ARequestThatGoesOnFromTheLastRunsOnlyTheRestWithTheSameAnswer) {
  const std::string first = "The lighthouse keeper", second = first + " checked the lamp";
  const std::vector<uint32_t> first_ids = tokenizer_->encode(first, false);
  const std::vector<uint32_t> second_ids = tokenizer_->encode(second, false);
  ASSERT_TRUE(std::equal(first_ids.begin(), first_ids.end(), second_ids.begin()));
  for (const runtime::SamplingParams& sampling :
       {runtime::SamplingParams{}, runtime::SamplingParams{0.9, 0, 1.0, 7},
        // The penalties look back at the whole prompt, reused or not.
        runtime::SamplingParams{.temperature = 0.9, .seed = 7, .repeat_penalty = 1.5,
                                .repeat_last_n = -1, .frequency_penalty = 0.3}}) {
    SCOPED_TRACE("temperature " + std::to_string(sampling.temperature) + ", repeat penalty " +
                 std::to_string(sampling.repeat_penalty));
    auto reused = service();
    // One token: the first request's sequence is its prompt (the token sampled is not run).
    const Completion a = answer(*reused, text_request(first, 1, sampling));
    EXPECT_EQ(a.usage.completion_tokens, 1);
    const Completion b = answer(*reused, text_request(second, 8, sampling));
    EXPECT_EQ(b.usage.cached_tokens, static_cast<int64_t>(first_ids.size()));
    EXPECT_EQ(b.report.cached_prompt_tokens, static_cast<int64_t>(first_ids.size()));
    EXPECT_EQ(b.report.gen.prompt_tokens,
              static_cast<int64_t>(second_ids.size() - first_ids.size()));
    EXPECT_EQ(b.usage.prompt_tokens, static_cast<int64_t>(second_ids.size()));
    auto fresh = service();
    const Completion c = answer(*fresh, text_request(second, 8, sampling));
    EXPECT_EQ(c.usage.cached_tokens, 0);
    EXPECT_EQ(b.text, c.text);
    EXPECT_EQ(b.usage.completion_tokens, c.usage.completion_tokens);
    // The same request again does not begin with the sequence (which ran its answer): fresh.
    const Completion d = answer(*reused, text_request(second, 8, sampling));
    EXPECT_EQ(d.usage.cached_tokens, 0);
    EXPECT_EQ(d.text, c.text);
  }
}

// A conversation's next message goes on from the previous request's sequence.
TEST_F(ServiceTest, AConversationsNextMessageReusesTheSequence) {
  using Role = tok::ChatMessage::Role;
  auto s = service();
  std::vector<tok::ChatMessage> messages = {{Role::kUser, "hello there"}};
  const Completion a = answer(*s, chat_request(messages, 1));
  messages.push_back({Role::kAssistant, a.text});
  messages.push_back({Role::kUser, "and then?"});
  const Completion b = answer(*s, chat_request(messages, 6));
  EXPECT_EQ(b.usage.cached_tokens, a.usage.prompt_tokens);
  const std::vector<uint32_t> ids = tok::render_conversation(*tokenizer_, markers_, messages);
  EXPECT_EQ(b.usage.prompt_tokens, static_cast<int64_t>(ids.size()));
  EXPECT_EQ(b.text, generated_text(ids, 6, /*chat=*/true));
}

// The previous answer's own tokens are reused too (all but the last, never run) when the next
// prompt goes on from the answer's text and encodes to them; where it does not, nothing is.
TEST_F(ServiceTest, AnAnswersTokensAreReusedWhenItsTextEncodesBackToThem) {
  int through_the_answer = 0;
  for (int i = 0; i < 24; ++i) {
    const std::string prompt = "The keeper " + std::to_string(i) + " said";
    const int64_t n = 2 + i % 3;
    SCOPED_TRACE(prompt);
    auto s = service();
    const Completion a = answer(*s, text_request(prompt, n));
    const std::vector<uint32_t> first = tokenizer_->encode(prompt, false);
    const std::vector<int32_t> sampled = generated_ids(first, n);
    ASSERT_EQ(a.usage.completion_tokens, static_cast<int64_t>(sampled.size()));
    const std::string next_prompt = prompt + a.text + " and went on";
    const std::vector<uint32_t> next = tokenizer_->encode(next_prompt, false);
    // What the sequence ran: the first prompt and the answer but its last token.
    std::vector<uint32_t> ran = first;
    ran.insert(ran.end(), sampled.begin(), sampled.end() - 1);
    const bool goes_on =
        next.size() > ran.size() && std::equal(ran.begin(), ran.end(), next.begin());
    const Completion b = answer(*s, text_request(next_prompt, 4));
    EXPECT_EQ(b.usage.cached_tokens, goes_on ? static_cast<int64_t>(ran.size()) : 0);
    through_the_answer += goes_on && sampled.size() > 1;
    auto fresh = service();
    EXPECT_EQ(b.text, answer(*fresh, text_request(next_prompt, 4)).text);
  }
  EXPECT_GT(through_the_answer, 0) << "no answer of the tiny model encoded back to its tokens";
}

// The stop text straddles two tokens' pieces, so its first part must be held back.
TEST_F(ServiceTest, AStopTextEndsTheAnswerBeforeItAndIsNeverStreamed) {
  auto s = service();
  const std::string prompt = "The lighthouse keeper";
  auto prepared = s->prepare(text_request(prompt, 16));
  ASSERT_TRUE(prepared.is_ok());
  std::vector<std::string> pieces;
  auto whole = s->complete(
      *prepared,
      [&](std::string_view text, std::span<const AnswerToken>) {
        pieces.emplace_back(text);
        return true;
      },
      nullptr);
  ASSERT_TRUE(whole.is_ok()) << whole.status().message();
  ASSERT_GE(pieces.size(), 4u) << "the tiny model's greedy answer is too short to cut";
  // The last character of a middle piece and the first of the next.
  const auto char_start = [](const std::string& t, size_t at) {
    while (at > 0 && (static_cast<unsigned char>(t[at]) & 0xC0) == 0x80) --at;
    return at;
  };
  const std::string& left = pieces[pieces.size() / 2 - 1];
  const std::string& right = pieces[pieces.size() / 2];
  size_t right_end = 1;
  while (right_end < right.size() && (static_cast<unsigned char>(right[right_end]) & 0xC0) == 0x80)
    ++right_end;
  const std::string stop = left.substr(char_start(left, left.size() - 1)) +
                           right.substr(0, right_end);
  CompletionRequest r = text_request(prompt, 16);
  r.stop = {"never in this text \x01", stop};
  std::string streamed;
  const Completion cut = answer(*s, r, &streamed);  // checks streamed == text
  EXPECT_EQ(cut.text, whole->text.substr(0, whole->text.find(stop)));
  EXPECT_EQ(streamed.find(stop), std::string::npos);
  EXPECT_EQ(cut.finish, FinishReason::kStop);
  EXPECT_EQ(cut.stopping_word, stop);  // llama-server's /completion names it
  EXPECT_EQ(whole->stopping_word, "");
  EXPECT_LT(cut.usage.completion_tokens, whole->usage.completion_tokens);
  EXPECT_FALSE(cut.cancelled);
  // Two stop texts that begin at the same place and are complete with the same token's text:
  // the first given is the one named.
  const std::string longer = stop + right.substr(right_end);
  ASSERT_EQ(whole->text.find(longer), whole->text.find(stop));
  r.stop = {longer, stop};
  const Completion both = answer(*s, r);
  EXPECT_EQ(both.text, cut.text);
  EXPECT_EQ(both.stopping_word, longer);
}

// Sampled answers cut at U+FFFD (what bytes that are not text become): the decoder's unfinished
// bytes after the cut must not come back as another U+FFFD in the whole answer. answer() checks
// the whole answer against what was streamed.
TEST_F(ServiceTest, TheWholeAnswerIsWhatWasStreamedWhenAStopCutsIt) {
  auto s = service();
  int cut = 0;
  for (uint64_t seed = 0; seed < 60; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    CompletionRequest r = text_request("stop test", 40, {1.0, 0, 1.0, seed});
    r.stop = {"\xef\xbf\xbd"};
    std::string streamed;
    const Completion c = answer(*s, r, &streamed);
    EXPECT_EQ(c.text.find("\xef\xbf\xbd"), std::string::npos);
    cut += c.finish == FinishReason::kStop && c.usage.completion_tokens < 40;
  }
  EXPECT_GT(cut, 10) << "the tiny model's sampled text should hold U+FFFD often";
}

// Each answer token's logprobs are the model's own at its place: those of the logits of a
// teacher-forced pass over the prompt and the answer (the CPU path's logits do not depend on
// chunking), for each sampled token (a stop or special one too), with the most likely
// alternatives in order; the shown tokens' bytes make up the answer. A stop text drops the
// tokens from it on.
TEST_F(ServiceTest, LogprobsAreTheModelsAtEachAnswerToken) {
  auto s = service();
  const int64_t V = engine_->checkpoint().config().vocab_size;
  const std::string prompt = "The lighthouse keeper";
  const std::vector<uint32_t> prompt_ids = tokenizer_->encode(prompt);
  int checked = 0, held_back = 0, stop_tokens = 0, held_tokens = 0;
  const std::vector<int32_t> stops = stop_ids(false);
  for (uint64_t seed = 0; seed < 5; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const runtime::SamplingParams sampling{.temperature = seed == 0 ? 0.0 : 1.0, .seed = seed};
    CompletionRequest r = text_request(prompt, 12, sampling);
    r.logprobs = 3;
    const Completion c = answer(*s, r);
    const std::vector<int32_t> generated = generated_ids(prompt_ids, 12, sampling);
    ASSERT_EQ(static_cast<int64_t>(generated.size()), c.usage.completion_tokens);
    // The ids the request ran: the prompt's, then those sampled but the last.
    std::vector<int32_t> ids(prompt_ids.begin(), prompt_ids.end());
    ids.insert(ids.end(), generated.begin(), generated.end() - 1);
    std::vector<float> logits(ids.size() * static_cast<size_t>(V));
    ASSERT_TRUE(runtime::evaluate(engine_->model(), ids, 5, logits.data()).is_ok());
    size_t entry = 0;
    std::string bytes;  // the answer's tokens' bytes so far
    for (size_t i = 0; i < generated.size(); ++i) {
      ASSERT_LT(entry, c.logprobs.size());
      const AnswerToken& a = c.logprobs[entry++];
      const runtime::TokenLogprobs want = runtime::token_logprobs(
          logits.data() + (prompt_ids.size() - 1 + i) * static_cast<size_t>(V), V,
          generated[i], 3);
      EXPECT_EQ(a.token.id, generated[i]);
      EXPECT_EQ(a.token.logprob, want.chosen.logprob);
      EXPECT_EQ(a.token.bytes, *tokenizer_->token_bytes(static_cast<uint32_t>(generated[i])));
      ASSERT_EQ(a.top.size(), 3u);
      for (size_t k = 0; k < 3; ++k) {
        EXPECT_EQ(a.top[k].id, want.top[k].id);
        EXPECT_EQ(a.top[k].logprob, want.top[k].logprob);
        EXPECT_EQ(a.top[k].bytes,
                  tokenizer_->token_bytes(static_cast<uint32_t>(want.top[k].id)).value_or(""));
      }
      // A token's text begins after the characters of the bytes before it: bytes held for an
      // unfinished character count as U+FFFD unless the next token that shows text (this one,
      // or a later one for a token that shows none; none after a stop id) completes the
      // character.
      const std::string_view whole(bytes);
      const std::string held(whole.substr(whole.size() - tok::incomplete_utf8_suffix(whole)));
      std::string next;
      for (size_t j = i; j < generated.size() && next.empty(); ++j)
        if (shown(generated[j], false))
          next = *tokenizer_->token_bytes(static_cast<uint32_t>(generated[j]));
      const bool completed = !held.empty() && !next.empty() &&
                             valid_utf8(held + next) != valid_utf8(held) + valid_utf8(next);
      EXPECT_EQ(a.text_offset,
                code_points(valid_utf8(whole.substr(0, whole.size() - (completed ? held.size()
                                                                                 : 0)))));
      stop_tokens += std::count(stops.begin(), stops.end(), generated[i]) > 0;
      held_tokens += !held.empty();
      if (shown(a.token.id, false)) bytes += a.token.bytes;
      ++checked;
    }
    EXPECT_EQ(entry, c.logprobs.size());
    EXPECT_EQ(valid_utf8(bytes), c.text);
    EXPECT_TRUE(answer(*s, text_request(prompt, 12, sampling)).logprobs.empty());  // none asked

    // A stop text at the middle token's first character: the tokens whose text begins before
    // the text's first place are kept, streamed as before.
    ASSERT_GE(c.logprobs.size(), 4u);
    const int64_t middle = c.logprobs[c.logprobs.size() / 2].text_offset;
    size_t at = 0;  // the byte where the middle token's text begins
    for (int64_t cp = -1; at < c.text.size(); ++at)
      if ((c.text[at] & 0xC0) != 0x80 && ++cp == middle) break;
    ASSERT_LT(at, c.text.size());
    size_t len = 1;
    while (at + len < c.text.size() && (c.text[at + len] & 0xC0) == 0x80) ++len;
    r.stop = {c.text.substr(at, len)};
    const Completion cut = answer(*s, r);
    const int64_t cut_at = code_points(std::string_view(c.text).substr(0, c.text.find(r.stop[0])));
    size_t kept = 0;
    while (kept < c.logprobs.size() && c.logprobs[kept].text_offset < cut_at) ++kept;
    EXPECT_LT(kept, c.logprobs.size());
    ASSERT_EQ(cut.logprobs.size(), kept);
    for (size_t i = 0; i < kept; ++i) {
      EXPECT_EQ(cut.logprobs[i].token.id, c.logprobs[i].token.id);
      EXPECT_EQ(cut.logprobs[i].token.logprob, c.logprobs[i].token.logprob);
    }
    // A stop text that begins with the last character of a token of two or more (held back
    // until the next token tells it apart) and never comes: the same tokens, each streamed
    // with its whole text (answer() checks).
    std::string before;
    for (size_t i = 0; i + 1 < c.logprobs.size(); ++i) {
      if (!shown(c.logprobs[i].token.id, false)) continue;
      const std::string& own = c.logprobs[i].token.bytes;
      if (tok::incomplete_utf8_suffix(before) == 0 && tok::incomplete_utf8_suffix(own) == 0 &&
          valid_utf8(own) == own && code_points(own) >= 2) {
        size_t last = own.size() - 1;
        while ((own[last] & 0xC0) == 0x80) --last;
        r.stop = {own.substr(last) + "\x01\x02\x03"};
        const Completion held = answer(*s, r);
        EXPECT_EQ(held.text, c.text);
        ASSERT_EQ(held.logprobs.size(), c.logprobs.size());
        ++held_back;
        break;
      }
      before += own;
    }
  }
  EXPECT_GT(checked, 20);
  EXPECT_GE(held_back, 2);
  EXPECT_GE(stop_tokens, 1) << "the tiny model's samples here should end at a stop id";
  EXPECT_GE(held_tokens, 3) << "the tiny model's samples here should split characters";
}

// Completions' echo: the text and the logprobs begin with the prompt's, each prompt token (but
// the first, unscored) scored by the teacher-forced row before it; the answer after it is the
// one without echo. lm-eval-harness's loglikelihood asks it with max_tokens 0 or 1.
TEST_F(ServiceTest, AnEchoedPromptComesFirstWithItsTokensLogprobs) {
  auto s = service();
  const int64_t V = engine_->checkpoint().config().vocab_size;
  const std::string prompt = "The lighthouse keeper's lamp";
  std::vector<int32_t> ids;
  for (const uint32_t id : tokenizer_->encode(prompt)) ids.push_back(static_cast<int32_t>(id));
  std::vector<float> logits(ids.size() * static_cast<size_t>(V));
  ASSERT_TRUE(runtime::evaluate(engine_->model(), ids, 4, logits.data()).is_ok());
  for (const int64_t max_tokens : {0, 1, 6}) {
    SCOPED_TRACE("max_tokens " + std::to_string(max_tokens));
    CompletionRequest plain = text_request(prompt, max_tokens);
    plain.logprobs = 2;
    const Completion answer_only = max_tokens > 0 ? answer(*s, plain) : Completion{};
    CompletionRequest r = plain;
    r.echo = true;
    // The previous request's sequence holds this prompt: the echo with logprobs runs it afresh.
    const Completion c = answer(*s, r);
    EXPECT_EQ(c.usage.cached_tokens, 0);
    EXPECT_EQ(c.text, prompt + answer_only.text);
    ASSERT_EQ(c.logprobs.size(), ids.size() + answer_only.logprobs.size());
    EXPECT_FALSE(c.logprobs[0].scored);
    EXPECT_TRUE(c.logprobs[0].top.empty());
    int64_t offset = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const AnswerToken& a = c.logprobs[i];
      EXPECT_EQ(a.token.id, ids[i]);
      EXPECT_EQ(a.text_offset, offset);
      offset += code_points(valid_utf8(a.token.bytes));  // the prompt is plain ASCII
      if (i == 0) continue;
      EXPECT_TRUE(a.scored);
      const runtime::TokenLogprobs want =
          runtime::token_logprobs(logits.data() + (i - 1) * static_cast<size_t>(V), V, ids[i], 2);
      EXPECT_EQ(a.token.logprob, want.chosen.logprob) << i;
      ASSERT_EQ(a.top.size(), 2u);
      EXPECT_EQ(a.top[0].id, want.top[0].id);
      EXPECT_EQ(a.top[1].logprob, want.top[1].logprob);
    }
    for (size_t i = 0; i < answer_only.logprobs.size(); ++i) {
      const AnswerToken& a = c.logprobs[ids.size() + i];
      EXPECT_EQ(a.token.id, answer_only.logprobs[i].token.id);
      EXPECT_EQ(a.token.logprob, answer_only.logprobs[i].token.logprob);
      EXPECT_EQ(a.text_offset, code_points(prompt) + answer_only.logprobs[i].text_offset);
    }
    // Without logprobs: the text only, and the sequence may be reused.
    r.logprobs.reset();
    const Completion text_only = answer(*s, r);
    EXPECT_EQ(text_only.text, c.text);
    EXPECT_TRUE(text_only.logprobs.empty());
  }
  // A prompt that ends inside a character the answer does not go on with: its bytes left over
  // are U+FFFD, counted before the answer's offsets (a fuzzing find).
  const auto byte_token = [&](std::string_view bytes) {
    for (int32_t id = 0; id < 300; ++id)
      if (tokenizer_->token_bytes(static_cast<uint32_t>(id)) == bytes) return id;
    return -1;
  };
  const int32_t lead = byte_token("\xe2"), second = byte_token("\x82"),
                third = byte_token("\xac"), letter = byte_token("x");
  ASSERT_GE(lead, 0);
  ASSERT_GE(second, 0);
  ASSERT_GE(third, 0);
  ASSERT_GE(letter, 0);
  CompletionRequest cut_char;
  cut_char.prompt_pieces = {lead};
  cut_char.max_tokens = 2;
  cut_char.echo = true;
  cut_char.logprobs = 0;
  cut_char.sampling.logit_bias = {{letter, 1e30f}};
  const Completion partial = answer(*s, cut_char);
  ASSERT_EQ(partial.logprobs.size(), 3u);
  EXPECT_EQ(partial.text, "\ufffdxx");
  EXPECT_EQ(partial.logprobs[1].text_offset, 1);
  // A character the prompt begins and the answer ends is itself: the echo is the text of the
  // whole sequence (prompt and answer decoded apart, it was two U+FFFD).
  CompletionRequest euro;
  euro.prompt_pieces = {lead, second};
  euro.max_tokens = 1;
  euro.echo = true;
  euro.sampling.logit_bias = {{third, 1e30f}};
  euro.logprobs = 0;
  const Completion whole = answer(*s, euro);
  EXPECT_EQ(whole.text, "\u20ac");
  ASSERT_EQ(whole.logprobs.size(), 3u);  // one entry per token, the prompt's two too
  // Nor is a stop text there: the character begins in the prompt.
  euro.stop = {"\u20ac"};
  const Completion unstopped = answer(*s, euro);
  EXPECT_EQ(unstopped.text, "\u20ac");
  EXPECT_EQ(unstopped.stopping_word, "");
  EXPECT_EQ(unstopped.logprobs.size(), 3u);
  // A stop text is looked for in the answer only, never in the echoed prompt.
  CompletionRequest r = text_request(prompt, 6);
  r.echo = true;
  r.stop = {"lighthouse"};
  const Completion c = answer(*s, r);
  EXPECT_EQ(c.text.rfind(prompt, 0), 0u);
  EXPECT_EQ(c.stopping_word, "");
}

// A fuzzing find: text held back (it may begin a stop text) where a character split over two
// byte tokens begins, then a stop text found at that character. The entry of the token that
// completed no character went out with the text before it and was then dropped by the cut (a
// CHECK failure: the server aborted). Sampled from the tiny model: "7" held for "7\x01", then
// U+01D1 from two tokens held for "\u01d1H", then "H".
TEST_F(ServiceTest, AStopTextAtACharacterSplitOverTokensKeepsTheSentEntries) {
  auto s = service();
  CompletionRequest r;
  r.endpoint = Endpoint::kLlamaCompletion;
  r.prompt_pieces = {28, 28, 28, 28, 28, 28};
  r.max_tokens = 8;
  r.sampling = {.temperature = 1.0, .seed = 2};
  r.stop = {"7\x01", "\xc7\x91H"};
  const Completion plain = answer(*s, r);
  ASSERT_EQ(plain.stopping_word, "\xc7\x91H") << "the tiny model's sample changed";
  r.logprobs = 1;
  const Completion c = answer(*s, r);  // streamed entries == whole ones
  EXPECT_EQ(c.text, plain.text);
  EXPECT_EQ(c.stopping_word, plain.stopping_word);
  std::string bytes;
  for (const AnswerToken& a : c.logprobs)
    if (shown(a.token.id, false)) bytes += a.token.bytes;
  EXPECT_EQ(valid_utf8(bytes), c.text);
}

// A stop token has its entry (its own text, which the answer does not show), the last:
// lm-eval-harness takes one per generated token (echo, max_tokens 1: the prompt's entries are
// those before the last). The tiny checkpoint's stop ids are hardly ever sampled, so a copy of
// it names the greedy answer's third token its eos_token_id.
TEST_F(ServiceTest, AStopTokenHasTheLastEntry) {
  const std::vector<uint32_t> prompt_ids = tokenizer_->encode("The lighthouse keeper");
  const std::vector<int32_t> greedy = generated_ids(prompt_ids, 3);
  ASSERT_EQ(greedy.size(), 3u);
  ASSERT_TRUE(greedy[2] != greedy[0] && greedy[2] != greedy[1]) << "choose another prompt";
  const fs::path copy = dir_.string() + "-eos";
  fs::remove_all(copy);
  fs::copy(dir_, copy, fs::copy_options::recursive);
  {
    std::ifstream in(copy / "config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    config["eos_token_id"] = greedy[2];
    std::ofstream(copy / "config.json") << config.dump();
  }
  runtime::EngineOptions eo;
  eo.model_dir = copy;
  eo.threads = 2;
  auto engine = runtime::Engine::open(eo);
  ASSERT_TRUE(engine.is_ok()) << engine.status().message();
  ServiceOptions o;
  o.prefill_chunk = 7;
  Service eos_service(**engine, *tokenizer_, markers_, o);
  auto s = service();
  CompletionRequest r;
  r.prompt_pieces = id_pieces(prompt_ids);
  r.max_tokens = 3;
  r.logprobs = 2;
  const Completion plain = answer(*s, r);  // greedy[2] is text there
  ASSERT_EQ(plain.logprobs.size(), 3u);
  r.max_tokens = 8;
  const Completion c = answer(eos_service, r);
  EXPECT_EQ(c.finish, FinishReason::kStop);
  EXPECT_EQ(c.usage.completion_tokens, 3);
  ASSERT_EQ(c.logprobs.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(c.logprobs[i].token.id, greedy[i]);
    EXPECT_EQ(c.logprobs[i].token.logprob, plain.logprobs[i].token.logprob);
    EXPECT_EQ(c.logprobs[i].top.size(), 2u);
  }
  EXPECT_EQ(c.logprobs[2].token.bytes, plain.logprobs[2].token.bytes);  // its own text
  EXPECT_EQ(c.logprobs[2].text_offset, code_points(c.text));            // none after it
  r.max_tokens = 2;
  EXPECT_EQ(c.text, answer(*s, r).text);
  // lm-eval-harness's request: the prompt goes on to the stop token, which comes next.
  r.prompt_pieces.insert(r.prompt_pieces.end(), greedy.begin(), greedy.begin() + 2);
  r.max_tokens = 1;
  r.echo = true;
  r.logprobs = 1;
  const Completion echoed = answer(eos_service, r);
  ASSERT_EQ(echoed.logprobs.size(), r.prompt_pieces.size() + 1);
  EXPECT_EQ(echoed.logprobs.back().token.id, greedy[2]);
  EXPECT_EQ(echoed.logprobs.back().token.logprob, plain.logprobs[2].token.logprob);
  fs::remove_all(copy);  // (a shard still mapped stays readable)
}

// The server told to stop while an echo with logprobs runs its prompt: the prompt's entries
// would hold logprobs never computed, so neither they nor its text are sent (a fuzzing find:
// 0.0 entries were streamed); without logprobs the echo is only text, and is sent.
TEST_F(ServiceTest, AnEchoStoppedInItsPromptSendsNoUnscoredEntries) {
  auto s = service();  // chunks of 7
  const std::string prompt = "The lighthouse keeper checked the lamp, the lens and the";
  ASSERT_GT(tokenizer_->encode(prompt).size(), 7u);
  CompletionRequest r = text_request(prompt, 4);
  r.echo = true;
  for (const bool logprobs : {true, false}) {
    SCOPED_TRACE(logprobs ? "logprobs" : "text only");
    if (logprobs) r.logprobs = 1;
    else r.logprobs.reset();
    auto prepared = s->prepare(r);
    ASSERT_TRUE(prepared.is_ok()) << prepared.status().message();
    int asked = 0;
    std::string sent;
    size_t entries = 0;
    auto done = s->complete(
        *prepared,
        [&](std::string_view text, std::span<const AnswerToken> tokens) {
          sent += text;
          entries += tokens.size();
          return true;
        },
        [&] { return ++asked > 1; });  // asked before the start, then after the first chunk
    ASSERT_TRUE(done.is_ok()) << done.status().message();
    EXPECT_TRUE(done->cancelled);
    EXPECT_EQ(done->report.gen.prompt_tokens, 7);
    EXPECT_EQ(done->usage.completion_tokens, 0);
    EXPECT_EQ(done->text, logprobs ? "" : prompt);
    EXPECT_EQ(sent, done->text);
    EXPECT_TRUE(done->logprobs.empty());
    EXPECT_EQ(entries, 0u);
  }
}

// Chat lists its content's tokens only (OpenAI's chat never shows the end of a message) and ends
// where the response closes (<|close|>); a completion of the same rendered prompt lists every
// token, a stop or special one too, and goes on past <|close|> to the config's stop ids
// (K3-MODEL §8.6: a client's own prompt may open another element there), as `run` does.
TEST_F(ServiceTest, ChatEndsAtTheResponsesCloseAndACompletionAtTheMessagesEnd) {
  auto s = service();
  const auto ids_of = [](const Completion& c) {
    std::vector<int32_t> ids;
    for (const AnswerToken& a : c.logprobs) ids.push_back(a.token.id);
    return ids;
  };
  int hidden = 0, past_close = 0, reused = 0;
  for (uint64_t seed = 0; seed < 12; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const runtime::SamplingParams sampling{.temperature = 1.0, .seed = seed};
    CompletionRequest chat = chat_request({{tok::ChatMessage::Role::kUser, "The lamp"}}, 12);
    chat.sampling = sampling;
    chat.logprobs = 1;
    const std::vector<uint32_t> rendered =
        tok::render_conversation(*tokenizer_, markers_, chat.messages);
    const std::vector<int32_t> chat_ids = generated_ids(rendered, 12, sampling, /*chat=*/true);
    std::vector<int32_t> content;
    for (const int32_t id : chat_ids)
      if (shown(id, /*chat=*/true)) content.push_back(id);
    hidden += static_cast<int>(chat_ids.size() - content.size());
    const Completion c = answer(*s, chat);
    EXPECT_EQ(ids_of(c), content);
    EXPECT_EQ(c.usage.completion_tokens, static_cast<int64_t>(chat_ids.size()));
    CompletionRequest text;
    text.prompt_pieces = id_pieces(rendered);
    text.max_tokens = 12;
    text.sampling = sampling;
    text.logprobs = 1;
    const std::vector<int32_t> text_ids = generated_ids(rendered, 12, sampling);
    const Completion t = answer(*s, text);
    EXPECT_EQ(ids_of(t), text_ids);
    // Chat's answer <|close|> alone left its sequence, which this completion goes on from,
    // told its own stop ids: it does not stop at that <|close|>.
    reused += t.usage.cached_tokens > 0 && text_ids.size() > 1 &&
              text_ids[0] == static_cast<int32_t>(markers_.close);
    const auto close = std::find(text_ids.begin(), text_ids.end(), markers_.close);
    if (close == text_ids.end() || close + 1 == text_ids.end()) continue;
    ++past_close;  // the same draws up to <|close|>, where chat ended
    EXPECT_EQ(c.finish, FinishReason::kStop);
    EXPECT_EQ(c.usage.completion_tokens, close - text_ids.begin() + 1);
    EXPECT_TRUE(std::equal(chat_ids.begin(), chat_ids.end(), text_ids.begin()));
  }
  EXPECT_GE(hidden, 1) << "the tiny model's chat answers here should end at a stop id";
  EXPECT_GE(past_close, 1) << "no completion here went on past <|close|>: choose other seeds";
  EXPECT_GE(reused, 1) << "no chat answer here was <|close|> alone: choose other seeds";
}

// ignore_eos (llama-server's): an answer that ended at a stop id runs to max_tokens instead, no
// stop id of its endpoint drawn (chat's <|close|> too: else it would end there). logit_bias:
// -Inf on the greedy answer's first token gives the runner-up there, +100 on another gives
// that one.
TEST_F(ServiceTest, IgnoreEosRunsToTheLimitAndLogitBiasMovesTheDraw) {
  auto s = service();
  int stopped = 0;
  for (const bool chat : {false, true}) {
    for (uint64_t seed = 1; seed <= 12; ++seed) {
      CompletionRequest r = chat ? chat_request({{tok::ChatMessage::Role::kUser, "The lamp"}}, 24)
                                 : text_request("The lamp", 24);
      r.sampling = {.temperature = 1.5, .seed = seed};
      const Completion plain = answer(*s, r);
      if (plain.finish != FinishReason::kStop) continue;
      ++stopped;
      r.ignore_eos = true;
      const Completion full = answer(*s, r);
      EXPECT_EQ(full.finish, FinishReason::kLength) << seed;
      EXPECT_EQ(full.usage.completion_tokens, 24) << seed;
    }
  }
  EXPECT_GE(stopped, 4) << "the tiny model's hot answers should often end at a stop id";
  CompletionRequest greedy = text_request("The lamp", 2);
  greedy.logprobs = 2;
  const Completion first = answer(*s, greedy);
  ASSERT_EQ(first.logprobs.size(), 2u);
  ASSERT_EQ(first.logprobs[0].top.size(), 2u);
  const int32_t best = first.logprobs[0].token.id, runner_up = first.logprobs[0].top[1].id;
  greedy.sampling.logit_bias = {{best, -std::numeric_limits<float>::infinity()}};
  EXPECT_EQ(answer(*s, greedy).logprobs[0].token.id, runner_up);
  const int32_t other = best == 5 ? 6 : 5;
  greedy.sampling.logit_bias = {{other, 100.0f}};
  EXPECT_EQ(answer(*s, greedy).logprobs[0].token.id, other);
  const int32_t vocab = static_cast<int32_t>(engine_->checkpoint().config().vocab_size);
  greedy.sampling.logit_bias = {{vocab, 1.0f}};
  const auto past = s->prepare(greedy);
  ASSERT_FALSE(past.is_ok());
  EXPECT_EQ(error_param(past.status()), "logit_bias") << past.status().message();
  // Every id banned (here one by ignore_eos): refused, not id 0 drawn from a row of -Inf.
  constexpr float kBan = -std::numeric_limits<float>::infinity();
  greedy.sampling.logit_bias.clear();
  const std::vector<int32_t> stops = stop_ids(/*chat=*/false);
  ASSERT_FALSE(stops.empty());
  for (int32_t id = 0; id < vocab; ++id)
    if (id != stops.front()) greedy.sampling.logit_bias.emplace_back(id, kBan);
  greedy.ignore_eos = false;
  EXPECT_TRUE(s->prepare(greedy).is_ok());
  greedy.ignore_eos = true;
  const auto none = s->prepare(greedy);
  ASSERT_FALSE(none.is_ok());
  EXPECT_EQ(error_param(none.status()), "logit_bias") << none.status().message();
  EXPECT_NE(none.status().message().find("no token can be drawn"), std::string::npos);
}

// Bytes held for a character that no token completes come out as U+FFFD, the text of the
// tokens that held them: a token whose bytes follow begins after it (a stop text there drops
// it), and so does a hidden token that came between (fuzzing finds, from the tiny model's
// greedy answers).
TEST_F(ServiceTest, HeldBytesNoTokenCompletesComeBeforeTheNextTokensText) {
  auto s = service();
  CompletionRequest r = text_request("The lighthouse keeper", 3);
  r.logprobs = 0;
  const Completion c = answer(*s, r);  // "F", 0xC6, "[": "F\ufffd["
  ASSERT_EQ(c.text, "F\xef\xbf\xbd[") << "the tiny model's answer changed";
  ASSERT_EQ(c.logprobs.size(), 3u);
  EXPECT_EQ(c.logprobs[1].text_offset, 1);
  EXPECT_EQ(c.logprobs[2].text_offset, 2);
  r.stop = {"["};
  const Completion cut = answer(*s, r);
  EXPECT_EQ(cut.text, "F\xef\xbf\xbd");
  EXPECT_EQ(cut.logprobs.size(), 2u);  // "[" begins at the stop text
  // 0xEA held, then a special token, then the answer's end (length): the special follows the
  // U+FFFD, as a stop id there does.
  CompletionRequest special;
  special.prompt_pieces = {124, 206, 212, 88};
  special.max_tokens = 4;
  special.logprobs = 0;
  const Completion h = answer(*s, special);
  ASSERT_EQ(h.logprobs.size(), 4u);
  ASSERT_TRUE(tokenizer_->is_special(static_cast<uint32_t>(h.logprobs[3].token.id)) &&
              h.logprobs[2].token.bytes == "\xea")
      << "the tiny model's answer changed";
  EXPECT_EQ(h.logprobs[3].text_offset, code_points(h.text));
}

}  // namespace
}  // namespace ktier::server
