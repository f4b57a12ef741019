#pragma once
// The fixture of the serve-generation tests (service_test.cpp: answers, stop texts, logprobs;
// service_turns_test.cpp: waiting, stopping, the context, clients that leave): the tiny
// checkpoint synthesized once per suite, an engine, its tokenizer and chat markers, and the
// helpers that run a request and check it against a fresh generation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/service.h"
#include "cpu/kernels.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "runtime/logprobs.h"
#include "server/tokenize_api.h"
#include "synth/synth.h"

namespace ktier::server {

namespace fs = std::filesystem;

inline int64_t code_points(std::string_view utf8) {
  return std::count_if(utf8.begin(), utf8.end(), [](char c) { return (c & 0xC0) != 0x80; });
}

// Token ids as a completion's array prompt (CompletionRequest::prompt_pieces).
template <class Id>
std::vector<PromptPiece> id_pieces(const std::vector<Id>& ids) {
  std::vector<PromptPiece> pieces;
  for (const Id id : ids) pieces.emplace_back(static_cast<int32_t>(id));
  return pieces;
}

class ServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("ktier-service-" + std::to_string(::getpid()));
    synth::SynthOptions o;
    o.out_dir = dir_;
    o.threads = 1;
    ASSERT_TRUE(synth::run_synth(o).is_ok());
    runtime::EngineOptions eo;
    eo.model_dir = dir_;
    eo.threads = 2;
    auto e = runtime::Engine::open(eo);
    ASSERT_TRUE(e.is_ok()) << e.status().message();
    engine_ = std::move(*e).release();
    auto t = tok::Tokenizer::load(dir_.string());
    ASSERT_TRUE(t.is_ok()) << t.status().message();
    tokenizer_ = new tok::Tokenizer(std::move(*t));
    auto m = tok::chat_markers(*tokenizer_);
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    markers_ = *m;
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete engine_;
    fs::remove_all(dir_);
  }

  // max_waiting 0: no limit on the line (ServiceOptions).
  static std::unique_ptr<Service> service(int64_t ctx = 256, int64_t default_max_tokens = 9,
                                          int64_t max_waiting = 0, uint64_t cache_ram_bytes = 0) {
    ServiceOptions o;
    o.ctx = ctx;
    o.prefill_chunk = 7;
    o.defaults.max_tokens = default_max_tokens;
    o.max_waiting = max_waiting;
    o.cache_ram_bytes = cache_ram_bytes;
    return std::make_unique<Service>(*engine_, *tokenizer_, markers_, o);
  }
  static CompletionRequest text_request(const std::string& prompt, int64_t max_tokens,
                                        runtime::SamplingParams sampling = {}) {
    CompletionRequest r;
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.sampling = sampling;
    return r;
  }
  static CompletionRequest chat_request(std::vector<tok::ChatMessage> messages,
                                        int64_t max_tokens) {
    CompletionRequest r;
    r.endpoint = Endpoint::kChatCompletions;
    r.messages = std::move(messages);
    r.max_tokens = max_tokens;
    return r;
  }
  // The answer and what was streamed of it (must be the same text, and the same logprobs
  // entries, each streamed with the text that completes its token's or after it).
  static Completion answer(Service& s, const CompletionRequest& request,
                           std::string* streamed = nullptr) {
    auto prepared = s.prepare(request);
    EXPECT_TRUE(prepared.is_ok()) << prepared.status().message();
    if (!prepared.is_ok()) return {};
    std::string pieces;
    std::vector<AnswerToken> tokens;
    std::vector<int64_t> streamed_before;  // per token: characters streamed once it came
    auto done = s.complete(
        *prepared,
        [&](std::string_view text, std::span<const AnswerToken> with) {
          pieces += text;
          tokens.insert(tokens.end(), with.begin(), with.end());
          streamed_before.resize(tokens.size(), code_points(pieces));
          return true;
        },
        nullptr);
    EXPECT_TRUE(done.is_ok()) << done.status().message();
    if (!done.is_ok()) return {};
    EXPECT_EQ(pieces, done->text);
    EXPECT_EQ(tokens.size(), done->logprobs.size());
    std::string bytes;  // of the tokens before
    for (size_t i = 0; i < std::min(tokens.size(), done->logprobs.size()); ++i) {
      EXPECT_EQ(tokens[i].token.id, done->logprobs[i].token.id);
      EXPECT_EQ(tokens[i].text_offset, done->logprobs[i].text_offset);
      if (!shown(tokens[i].token.id, request.endpoint == Endpoint::kChatCompletions))
        continue;  // its text is not the answer's
      // Not before its text: where a token's bytes are whole characters after whole ones, all
      // of them (up to a stop text's cut) were streamed when it came.
      const std::string& own = tokens[i].token.bytes;
      if (tok::incomplete_utf8_suffix(bytes) == 0 && tok::incomplete_utf8_suffix(own) == 0 &&
          valid_utf8(own) == own) {
        EXPECT_GE(streamed_before[i], std::min(tokens[i].text_offset + code_points(own),
                                               code_points(done->text)))
            << i;
      }
      bytes += own;
    }
    if (streamed) *streamed = pieces;
    return std::move(*done);
  }
  // The config's stop ids, and for chat the response's <|close|> (K3-MODEL §8.6).
  static std::vector<int32_t> stop_ids(bool chat) {
    const auto& eos = engine_->checkpoint().config().eos_token_ids;
    std::vector<int32_t> ids(eos.begin(), eos.end());
    if (chat) ids.push_back(static_cast<int32_t>(markers_.close));
    return ids;
  }
  // Whether a sampled id's text is the answer's (not a stop or special id: K3's <|close|> is not
  // flagged special, so a completion shows it as text).
  static bool shown(int32_t id, bool chat) {
    return tok::shown_as_text(*tokenizer_, stop_ids(chat), id);
  }
  // The ids generate() samples after `ids` (the service's stop ids for chat or completions;
  // greedy by default).
  static std::vector<int32_t> generated_ids(const std::vector<uint32_t>& ids, int64_t n,
                                            const runtime::SamplingParams& sampling = {},
                                            bool chat = false) {
    runtime::GenerationOptions g;
    g.max_new_tokens = n;
    g.sampling = sampling;
    g.stop_ids = stop_ids(chat);
    const std::vector<int32_t> prompt(ids.begin(), ids.end());
    std::vector<int32_t> out;
    auto st = runtime::generate(engine_->model(), engine_->experts(), prompt, g, [&](int32_t id) {
      out.push_back(id);
      return Status::ok();
    });
    EXPECT_TRUE(st.is_ok()) << st.status().message();
    return out;
  }
  // Their text as the service shows it (special and stop ids hidden).
  static std::string generated_text(const std::vector<uint32_t>& ids, int64_t n, bool chat) {
    const std::vector<int32_t> stops = stop_ids(chat);
    tok::StreamingDecoder decoder(*tokenizer_);
    std::string text;
    for (const int32_t id : generated_ids(ids, n, {}, chat)) {
      if (!tok::shown_as_text(*tokenizer_, stops, id)) continue;
      auto piece = decoder.push(static_cast<uint32_t>(id));
      EXPECT_TRUE(piece.is_ok());
      if (piece.is_ok()) text += *piece;
    }
    return valid_utf8(text + decoder.flush());
  }

  static inline fs::path dir_;
  static inline runtime::Engine* engine_ = nullptr;
  static inline tok::Tokenizer* tokenizer_ = nullptr;
  static inline tok::ChatMarkers markers_;
};

}  // namespace ktier::server
