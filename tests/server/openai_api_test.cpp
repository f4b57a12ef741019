// `ktier serve`'s request parsing and response bodies (server/openai_api.h): what a request may
// say, the defaults it takes from the flags, every refusal naming its field, and the shapes of
// the bodies and events OpenAI's clients read.
#include "server/openai_api.h"

#include <gtest/gtest.h>

#include <limits>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "server/service.h"

namespace ktier::server {
namespace {

using nlohmann::json;

// logit_bias as OpenAI sends it (ids as strings) and as llama-server's array (false: never
// drawn); ignore_eos read (Service::prepare turns it into -Inf biases).
TEST(OpenAiApi, LogitBiasAndIgnoreEosAreRead) {
  const float banned = -std::numeric_limits<float>::infinity();
  auto r = parse_request(Endpoint::kCompletions,
                         json{{"prompt", "a"}, {"logit_bias", {{"15", -100}, {"7", 2.5}}}}, {});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->sampling.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{15, -100.0f}, {7, 2.5f}}));
  EXPECT_FALSE(r->ignore_eos);
  r = parse_request(Endpoint::kLlamaCompletion,
                    json{{"prompt", "a"}, {"ignore_eos", true},
                         {"logit_bias", json::array({json::array({3, false}),
                                                     json::array({4, 1})})}},
                    {});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->sampling.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{3, banned}, {4, 1.0f}}));
  EXPECT_TRUE(r->ignore_eos);
}

RequestDefaults defaults() {
  RequestDefaults d;
  d.sampling = {.temperature = 0.7, .top_k = 5, .top_p = 0.9, .seed = 42,
                .repeat_penalty = 1.2, .presence_penalty = 0.25};
  d.max_tokens = 33;
  return d;
}

// A body as the server reads it: the JSON text, then the request.
Result<CompletionRequest> parse_text(Endpoint endpoint, const std::string& body,
                                     const RequestDefaults& d) {
  KTIER_ASSIGN_OR_RETURN(const json j, parse_body_object(body));
  return parse_request(endpoint, j, d);
}
Result<CompletionRequest> chat(const json& body) {
  return parse_request(Endpoint::kChatCompletions, body, defaults());
}
Result<CompletionRequest> completion(const json& body) {
  return parse_request(Endpoint::kCompletions, body, defaults());
}
const json kUser = json::array({{{"role", "user"}, {"content", "hi"}}});

TEST(OpenAiRequest, ChatMessagesAndFieldsAreRead) {
  const json body = {
      {"model", "anything"},
      {"messages",
       {{{"role", "user"}, {"content", "one"}},
        {{"role", "assistant"}, {"content", "two"}},
        {{"role", "user"},
         {"content", {{{"type", "text"}, {"text", "thr"}}, {{"type", "text"}, {"text", "ee"}}}}}}},
      {"max_tokens", 7},
      {"temperature", 0},
      {"top_p", 0.5},
      {"top_k", 3},
      {"seed", -1},
      {"stop", {"\n\n", "END"}},
      {"stream", true},
      {"stream_options", {{"include_usage", true}}},
      {"n", 1},
      {"presence_penalty", -0.5},
      {"frequency_penalty", 2},
      {"repeat_penalty", 1.3},
      {"repeat_last_n", -1},
      {"repetition_penalty", 1},
      {"min_p", 0.05},
      {"ignore_eos", false},
      {"logprobs", false},
      // Fields ktier does not build, at the value that asks for nothing.
      {"tool_choice", "none"},
      {"function_call", "none"},
      {"grammar", ""},
      {"suffix", ""},
      // Asking for the prompt ktier renders: thinking off, the assistant's turn opened.
      {"chat_template", ""},
      {"add_generation_prompt", true},
      {"reasoning_effort", "none"},
      {"thinking", {{"type", "disabled"}}},
      {"enable_thinking", false},
      {"continue_final_message", false},
      {"chat_template_kwargs", {{"thinking", false}, {"enable_thinking", nullptr}}},
      {"unknown_field", {1, 2}}};
  auto r = chat(body);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  ASSERT_EQ(r->messages.size(), 3u);
  EXPECT_EQ(r->messages[0].role, tok::ChatMessage::Role::kUser);
  EXPECT_EQ(r->messages[1].role, tok::ChatMessage::Role::kAssistant);
  EXPECT_EQ(r->messages[1].text, "two");
  EXPECT_EQ(r->messages[2].text, "thr\nee");  // parts joined by a line, as vLLM
  EXPECT_EQ(r->max_tokens, 7);
  EXPECT_EQ(r->sampling.temperature, 0.0);
  EXPECT_EQ(r->sampling.top_p, 0.5);
  EXPECT_EQ(r->sampling.top_k, 3);
  EXPECT_EQ(r->sampling.min_p, 0.05);
  EXPECT_EQ(r->sampling.presence_penalty, -0.5);
  EXPECT_EQ(r->sampling.frequency_penalty, 2.0);
  EXPECT_EQ(r->sampling.repeat_penalty, 1.3);
  EXPECT_EQ(r->sampling.repeat_last_n, -1);
  EXPECT_NE(r->sampling.seed, runtime::kRandomSeed);  // -1: a random seed, drawn
  EXPECT_EQ(r->stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
}

// serve's default seed is random: a request that gives none gets a new one each time (the
// same chat request twice may answer differently, as with llama-server and OpenAI).
TEST(OpenAiRequest, ARandomDefaultSeedIsDrawnForEachRequest) {
  RequestDefaults d = defaults();
  d.sampling.seed = runtime::kRandomSeed;
  std::set<uint64_t> seeds;
  for (int i = 0; i < 4; ++i) {
    auto r = parse_text(Endpoint::kCompletions, R"({"prompt": "a"})", d);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_NE(r->sampling.seed, runtime::kRandomSeed);
    // Below 2^53: shown in a response, it goes back as a request's seed unchanged.
    EXPECT_LT(r->sampling.seed, uint64_t{1} << 53);
    const json again = {{"prompt", "a"}, {"seed", json::parse(json(r->sampling.seed).dump())}};
    auto reused = parse_text(Endpoint::kCompletions, again.dump(), d);
    ASSERT_TRUE(reused.is_ok()) << reused.status().message();
    EXPECT_EQ(reused->sampling.seed, r->sampling.seed);
    seeds.insert(r->sampling.seed);
  }
  EXPECT_EQ(seeds.size(), 4u);
  auto fixed = parse_text(Endpoint::kCompletions, R"({"prompt": "a", "seed": 5})", d);
  ASSERT_TRUE(fixed.is_ok());
  EXPECT_EQ(fixed->sampling.seed, 5u);
}

TEST(OpenAiRequest, WhatARequestLeavesUnsaidComesFromTheFlags) {
  auto r = completion({{"prompt", "abc"}});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->prompt, "abc");
  EXPECT_FALSE(r->max_tokens.has_value());
  EXPECT_EQ(r->sampling.temperature, 0.7);
  EXPECT_EQ(r->sampling.top_k, 5);
  EXPECT_EQ(r->sampling.top_p, 0.9);
  EXPECT_EQ(r->sampling.seed, 42u);
  EXPECT_EQ(r->sampling.repeat_penalty, 1.2);
  EXPECT_EQ(r->sampling.repeat_last_n, 64);  // llama.cpp's default
  EXPECT_EQ(r->sampling.presence_penalty, 0.25);
  EXPECT_EQ(r->sampling.frequency_penalty, 0.0);
  EXPECT_FALSE(r->stream);
  EXPECT_TRUE(r->stop.empty());
  // An array of one prompt, max_completion_tokens, a stop string, nulls as absent.
  r = completion({{"prompt", {"xyz"}}, {"max_completion_tokens", 4}, {"stop", "Q"},
                  {"temperature", nullptr}, {"seed", nullptr}});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->prompt, "xyz");
  EXPECT_EQ(r->max_tokens, 4);
  EXPECT_EQ(r->stop, std::vector<std::string>{"Q"});
  EXPECT_EQ(r->sampling.temperature, 0.7);
  // Ids and texts mixed (llama-server's): one prompt, in order.
  r = completion({{"prompt", {12, "ab", 7}}});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_TRUE(r->prompt.empty());
  EXPECT_EQ(r->prompt_pieces, (std::vector<PromptPiece>{12, std::string("ab"), 7}));
}

// Each refusal is a usage error (HTTP 400) that names the field.
TEST(OpenAiRequest, RefusalsNameTheField) {
  struct Case {
    json body;
    std::string field;
  };
  const std::vector<Case> cases = {
      {{{"messages", json::array()}}, "messages"},
      {{{"messages", {{{"role", "system"}, {"content", "be nice"}}, kUser[0]}}},
       "messages[0].role"},
      {{{"messages", {{{"role", "tool"}, {"content", "x"}}}}}, "messages[0].role"},
      {{{"messages", {{{"role", "user"}}}}}, "messages[0].content"},
      {{{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}},
       "messages[0].content[0]"},
      {{{"messages", {kUser[0], {{"role", "assistant"}, {"content", "a"}}}}}, "messages"},
      {{{"messages", {{{"role", "assistant"}, {"content", "a"}, {"tool_calls", {1}}}, kUser[0]}}},
       "messages[0].tool_calls"},
      {{{"messages", kUser}, {"max_tokens", 0}}, "max_tokens"},
      {{{"messages", kUser}, {"max_tokens", 2.5}}, "max_tokens"},
      {{{"messages", kUser}, {"max_tokens", "7"}}, "max_tokens"},
      {{{"messages", kUser}, {"temperature", -0.1}}, "temperature"},
      {{{"messages", kUser}, {"temperature", 2.5}}, "temperature"},
      {{{"messages", kUser}, {"top_p", -0.01}}, "top_p"},
      {{{"messages", kUser}, {"top_p", 1.01}}, "top_p"},
      {{{"messages", kUser}, {"top_p", "0"}}, "top_p"},
      {{{"messages", kUser}, {"top_k", 2147483648}}, "top_k"},
      {{{"messages", kUser}, {"seed", 1e30}}, "seed"},
      {{{"messages", kUser}, {"stop", ""}}, "stop"},
      {{{"messages", kUser}, {"stop", {"a", "b", "c", "d", "e"}}}, "stop"},
      {{{"messages", kUser}, {"stop", {1}}}, "stop"},
      {{{"messages", kUser}, {"stream", "yes"}}, "stream"},
      {{{"messages", kUser}, {"n", 2}}, "n"},
      {{{"messages", kUser}, {"presence_penalty", 2.5}}, "presence_penalty"},
      {{{"messages", kUser}, {"frequency_penalty", -2.01}}, "frequency_penalty"},
      {{{"messages", kUser}, {"frequency_penalty", "1"}}, "frequency_penalty"},
      {{{"messages", kUser}, {"repeat_penalty", 0}}, "repeat_penalty"},
      {{{"messages", kUser}, {"repeat_last_n", -2}}, "repeat_last_n"},
      {{{"messages", kUser}, {"repeat_last_n", 1.5}}, "repeat_last_n"},
      {{{"messages", kUser}, {"repetition_penalty", 1.1}}, "repetition_penalty"},
      {{{"messages", kUser}, {"logprobs", 3}}, "logprobs"},
      {{{"messages", kUser}, {"top_logprobs", 2}}, "top_logprobs"},
      {{{"messages", kUser}, {"logprobs", true}, {"top_logprobs", 21}}, "top_logprobs"},
      {{{"messages", kUser}, {"logprobs", true}, {"n_probs", 2}}, "n_probs"},
      {{{"messages", kUser}, {"tools", {{{"type", "function"}}}}}, "tools"},
      {{{"messages", kUser}, {"response_format", {{"type", "json_object"}}}}, "response_format"},
      {{{"messages", kUser}, {"model", 3}}, "model"},
      {{{"messages", kUser}, {"min_p", 1.5}}, "min_p"},
      {{{"messages", kUser}, {"min_p", "0.1"}}, "min_p"},
      {{{"messages", kUser}, {"mirostat", 2}}, "mirostat"},
      {{{"messages", kUser}, {"grammar", "root ::= \"a\""}}, "grammar"},
      {{{"messages", kUser}, {"suffix", " end"}}, "suffix"},
      {{{"messages", kUser}, {"tool_choice", "auto"}}, "tool_choice"},
      {{{"messages", kUser}, {"function_call", "auto"}}, "function_call"},
      {{{"messages", kUser}, {"ignore_eos", "yes"}}, "ignore_eos"},
      {{{"messages", kUser}, {"logit_bias", 3}}, "logit_bias"},
      {{{"messages", kUser}, {"logit_bias", {{"hello", 1}}}}, "logit_bias"},
      {{{"messages", kUser}, {"logit_bias", {{"-5", 1}}}}, "logit_bias"},
      {{{"messages", kUser}, {"logit_bias", {{"5", "up"}}}}, "logit_bias"},
      {{{"messages", kUser}, {"logit_bias", {{"5", true}}}}, "logit_bias"},
      {{{"messages", kUser}, {"logit_bias", json::array({json::array({5})})}}, "logit_bias"},
      {{{"messages", kUser}, {"logit_bias", json::array({json::array({"a", 1})})}}, "logit_bias"},
      {{{"messages", kUser}, {"n_predict", 5}}, "n_predict"},
      {{{"messages", kUser}, {"echo", "yes"}}, "echo"},
      // Another prompt than K3's render with thinking off: never silently the same one.
      {{{"messages", kUser}, {"chat_template", "{{ messages }}"}}, "chat_template"},
      {{{"messages", kUser}, {"add_generation_prompt", false}}, "add_generation_prompt"},
      {{{"messages", kUser}, {"reasoning_effort", "high"}}, "reasoning_effort"},
      {{{"messages", kUser}, {"thinking", {{"type", "enabled"}}}}, "thinking"},
      {{{"messages", kUser}, {"thinking", true}}, "thinking"},
      {{{"messages", kUser}, {"enable_thinking", true}}, "enable_thinking"},
      {{{"messages", kUser}, {"continue_final_message", true}}, "continue_final_message"},
      {{{"messages", kUser}, {"chat_template_kwargs", {{"thinking", true}}}},
       "chat_template_kwargs"},
      {{{"messages", kUser}, {"chat_template_kwargs", {{"tools_in_user_message", false}}}},
       "chat_template_kwargs"},
      {{{"messages", kUser}, {"chat_template_kwargs", "thinking"}}, "chat_template_kwargs"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body.dump());
    auto r = chat(c.body);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), ExitCode::kUsage);
    EXPECT_NE(r.status().message().find("\"" + c.field + "\""), std::string::npos)
        << r.status().message();
    EXPECT_EQ(error_param(r.status()), c.field);  // the error body's "param"
  }
  EXPECT_EQ(error_param(Status::usage("the request body is not valid JSON")), std::nullopt);
  EXPECT_EQ(error_param(Status::budget("request field \"x\": not a field error")), std::nullopt);
  for (const json& body : {json{{"prompt", 3}}, json{{"prompt", {"a", "b"}}}, json::object(),
                           json{{"prompt", {1, "a", true}}}, json{{"prompt", {1, "a", -2}}},
                           json{{"prompt", {1, json::array({2})}}}}) {
    auto r = completion(body);
    ASSERT_FALSE(r.is_ok()) << body.dump();
    EXPECT_NE(r.status().message().find("\"prompt\""), std::string::npos);
  }
  // thinking false, as {"type": "disabled"}, asks for the prompt ktier renders.
  EXPECT_TRUE(chat({{"messages", kUser}, {"thinking", false}}).is_ok());
  // echo: completions' only (with max_tokens 0 allowed there).
  auto r = chat({{"messages", kUser}, {"echo", true}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(error_param(r.status()), "echo");
  r = parse_text(Endpoint::kLlamaCompletion, R"({"prompt": "a", "echo": true})", defaults());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(error_param(r.status()), "echo");
  r = completion({{"prompt", "a"}, {"max_tokens", 0}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(error_param(r.status()), "max_tokens");
  EXPECT_NE(r.status().message().find("0 only with echo"), std::string::npos)
      << r.status().message();
  // -1 or -2, as llama-server reads max_tokens (its n_predict): until the context's end.
  for (const int limit : {-1, -2}) {
    r = completion({{"prompt", "a"}, {"max_tokens", limit}});
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_TRUE(r->to_context_end);
    EXPECT_FALSE(r->max_tokens.has_value());
  }
  r = completion({{"prompt", "a"}, {"max_completion_tokens", -1}, {"max_tokens", 5}});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_TRUE(r->to_context_end);
  EXPECT_FALSE(completion({{"prompt", "a"}, {"max_tokens", -3}}).is_ok());
  r = completion({{"prompt", "a"}, {"echo", true}, {"max_tokens", 0}, {"logprobs", 1}});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_TRUE(r->echo);
  EXPECT_EQ(r->max_tokens, 0);
  EXPECT_FALSE(completion({{"prompt", "a"}, {"echo", false}})->echo);
  for (const std::string& body : {std::string("{"), std::string("[1]"), std::string("\"text\""),
                                 std::string("{\"prompt\": \"\xff\"}"),
                                 std::string("{\"prompt\": \"a\"}") + '\0' + "junk"}) {
    auto bad = parse_text(Endpoint::kCompletions, body, defaults());
    ASSERT_FALSE(bad.is_ok()) << body;
    EXPECT_EQ(bad.status().code(), ExitCode::kUsage);
  }
}

// Values nested past kMaxJsonDepth are refused before any is built: a deep one copied or
// compared later (a batch's body per prompt, a content part's type) recursed once per level and
// 400 KB of brackets overflowed a connection thread's stack (the server died of SIGSEGV).
TEST(OpenAiRequest, BodiesNestedTooDeepAreRefused) {
  const auto nested = [](int depth) {
    const auto n = static_cast<size_t>(depth);
    return std::string(n, '[') + std::string(n, ']');
  };
  auto ok = parse_body_object(R"({"prompt": ["a", "b"], "x": )" + nested(kMaxJsonDepth) + "}");
  ASSERT_TRUE(ok.is_ok()) << ok.status().message();
  for (const int depth : {kMaxJsonDepth + 1, 1000000}) {
    SCOPED_TRACE(depth);
    for (const std::string& body :
         {R"({"prompt": ["a", "b"], "x": )" + nested(depth) + "}",
          R"({"messages": [{"role": "user", "content": [{"type": )" + nested(depth) + "}]}]}"}) {
      auto r = parse_body_object(body);
      ASSERT_FALSE(r.is_ok());
      EXPECT_EQ(r.status().code(), ExitCode::kUsage);
      EXPECT_NE(r.status().message().find("deeper than 64 levels"), std::string::npos)
          << r.status().message();
    }
  }
  // Unclosed as well: the second parse that finds the reason builds nothing either.
  auto unclosed = parse_body_object(R"({"x": )" + std::string(1000000, '['));
  ASSERT_FALSE(unclosed.is_ok());
  EXPECT_NE(unclosed.status().message().find("not valid JSON: parse error at line 1"),
            std::string::npos)
      << unclosed.status().message();
  // A body that is not UTF-8 says so (the CLI's -p takes any bytes; a JSON string cannot).
  auto bytes = parse_body_object("{\"prompt\": \"a\xff\"}");
  ASSERT_FALSE(bytes.is_ok());
  EXPECT_NE(bytes.status().message().find("ill-formed UTF-8"), std::string::npos)
      << bytes.status().message();
  // ... without quoting the body back: an unterminated string of a megabyte.
  auto open_string = parse_body_object("{\"prompt\": \"" + std::string(1 << 20, 'a'));
  ASSERT_FALSE(open_string.is_ok());
  EXPECT_LT(open_string.status().message().size(), 300u) << open_string.status().message();
  // A content part's type of another kind than a string is refused by name, as any other.
  auto part = chat({{"messages", {{{"role", "user"}, {"content", {{{"type", {1, 2}}}}}}}}});
  ASSERT_FALSE(part.is_ok());
  EXPECT_EQ(error_param(part.status()), "messages[0].content[0]");
}

// Seeds are 64-bit: every integer in range is taken exactly, nothing past it is wrapped.
TEST(OpenAiRequest, WholeNumbersAreExactOrRefused) {
  const auto seed_of = [](const std::string& literal) -> std::optional<uint64_t> {
    auto r = parse_text(Endpoint::kCompletions, "{\"prompt\": \"a\", \"seed\": " + literal + "}",
                        defaults());
    if (!r.is_ok()) return std::nullopt;
    return r->sampling.seed;
  };
  EXPECT_EQ(seed_of("9223372036854775807"), uint64_t{0x7fffffffffffffff});
  EXPECT_EQ(seed_of("-9223372036854775808"), uint64_t{0x8000000000000000});
  // -1 (llama.cpp's "random"): a fresh seed each time, never -1's bits.
  const std::optional<uint64_t> a = seed_of("-1"), b = seed_of("-1");
  ASSERT_TRUE(a && b);
  EXPECT_NE(*a, runtime::kRandomSeed);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(seed_of("3.0"), 3u);
  EXPECT_EQ(seed_of("1e15"), uint64_t{1000000000000000});
  for (const char* bad : {"9223372036854775808", "18446744073709551615", "-9223372036854775809",
                          "9.2233720368547758e18", "1e30", "2.5", "true"})
    EXPECT_EQ(seed_of(bad), std::nullopt) << bad;
  // max_completion_tokens wins where both are given; null is absent.
  auto r = completion({{"prompt", "a"}, {"max_completion_tokens", nullptr}, {"max_tokens", 3}});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->max_tokens, 3);
  r = completion({{"prompt", "a"}, {"max_completion_tokens", 2}, {"max_tokens", 3}});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->max_tokens, 2);
  // ... but the one that loses is checked too.
  r = completion({{"prompt", "a"}, {"max_completion_tokens", 2}, {"max_tokens", "abc"}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(error_param(r.status()), "max_tokens");
  // An integer past 64 bits (which the parser reads as a double) is out of range, in words.
  r = parse_text(Endpoint::kCompletions, R"({"prompt": "a", "max_tokens": 99999999999999999999})",
                 defaults());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("\"max_tokens\": must be in -2..2147483647"),
            std::string::npos)
      << r.status().message();
  // stream_options belong to a stream, and are named whole.
  r = completion({{"prompt", "a"}, {"stream_options", {{"include_usage", true}}}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(error_param(r.status()), "stream_options");
  r = completion(
      {{"prompt", "a"}, {"stream", true}, {"stream_options", {{"include_usage", "yes"}}}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(error_param(r.status()), "stream_options.include_usage");
  // A negative top_k is off, as 0 (vLLM's default -1, llama-server's <= 0).
  r = completion({{"prompt", "a"}, {"top_k", -1}});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->sampling.top_k, 0);
  // top_p 0 (in OpenAI's range [0, 1]) keeps the most likely token, as llama.cpp's sampler.
  r = completion({{"prompt", "a"}, {"top_p", 0}});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->sampling.top_p, 0.0);
  // A request's temperature past OpenAI's range is refused, the server's default is not checked
  // again (serve refuses a --temp past it at start).
  RequestDefaults hot = defaults();
  hot.sampling.temperature = 1.5;
  r = parse_text(Endpoint::kCompletions, R"({"prompt": "a"})", hot);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->sampling.temperature, 1.5);
}

TEST(OpenAiResponse, BodiesHaveOpenAisShape) {
  const ResponseHead head{"chatcmpl-7", 1700000000, "k3"};
  const Usage usage{11, 3, 5};
  const json extra = {{"timings", {{"prompt_n", 6}}}};
  json j = completion_response(Endpoint::kChatCompletions, head, "hello", FinishReason::kStop,
                               usage, extra);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"], "chatcmpl-7");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "k3");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "hello");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["total_tokens"], 14);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 5);
  EXPECT_EQ(j["timings"]["prompt_n"], 6);
  j = completion_response(Endpoint::kCompletions, head, "abc", FinishReason::kLength, usage, {});
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "abc");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");

  j = stream_role_chunk(head);
  EXPECT_EQ(j["object"], "chat.completion.chunk");
  EXPECT_EQ(j["choices"][0]["delta"]["role"], "assistant");
  j = stream_chunk(Endpoint::kChatCompletions, head, "pi", std::nullopt);
  EXPECT_EQ(j["choices"][0]["delta"]["content"], "pi");
  EXPECT_TRUE(j["choices"][0]["finish_reason"].is_null());
  j = stream_chunk(Endpoint::kChatCompletions, head, "", FinishReason::kLength);
  EXPECT_TRUE(j["choices"][0]["delta"].empty());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  j = stream_chunk(Endpoint::kCompletions, head, "pi", std::nullopt);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "pi");
  j = stream_usage_chunk(Endpoint::kChatCompletions, head, usage, extra);
  EXPECT_TRUE(j["choices"].empty());
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);

  EXPECT_EQ(sse_event(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  j = error_body("too long", "invalid_request_error", "context_length_exceeded");
  EXPECT_EQ(j["error"]["message"], "too long");
  EXPECT_EQ(j["error"]["code"], "context_length_exceeded");
  EXPECT_TRUE(error_body("x", "server_error")["error"]["code"].is_null());
  EXPECT_EQ(error_body("x", "invalid_request_error", std::nullopt, "top_p")["error"]["param"],
            "top_p");
  // Bytes that are not UTF-8 (an --alias) do not throw.
  EXPECT_EQ(dump(json{{"id", "k\xff"}}), "{\"id\":\"k\xef\xbf\xbd\"}");
}

constexpr size_t kBodyLimit = size_t{1} << 20;

// Completions' batch of prompts: the request once per prompt (strings and id arrays, texts
// mixed in or not, alike, the other fields kept); not a batch where the prompt is one (a string,
// an id array, ids and texts mixed, a batch of one); a streamed batch refused. Its response: the
// choices in order, usage summed.
TEST(OpenAiRequest, ABatchOfPromptsIsOneRequestEach) {
  const json body = {
      {"prompt", {"a", {1, 2}, "c", {3, "d"}}}, {"max_tokens", 2}, {"echo", true}};
  auto batch = split_prompt_batch(body, kBodyLimit);
  ASSERT_TRUE(batch.is_ok()) << batch.status().message();
  ASSERT_EQ(batch->size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    json want = body;
    want["prompt"] = body["prompt"][i];
    EXPECT_EQ((*batch)[i], want);
    EXPECT_TRUE(completion((*batch)[i]).is_ok());
  }
  for (const json& one :
       {json("a"), json::array({1, 2}), json::array({json::array({1, 2})}), json::array({"a"}),
        json::array({"a", 1}), json::array({"a", json::array({json::array({"b"})})}),
        json::array({json::array({1}), json::array({json::array({2})})})}) {
    auto none = split_prompt_batch(json{{"prompt", one}}, kBodyLimit);
    ASSERT_TRUE(none.is_ok()) << one.dump();
    EXPECT_TRUE(none->empty()) << one.dump();
  }
  auto streamed = split_prompt_batch(json{{"prompt", {"a", "b"}}, {"stream", true}}, kBodyLimit);
  ASSERT_FALSE(streamed.is_ok());
  EXPECT_EQ(streamed.status().exit_code(), 2);
  EXPECT_TRUE(
      split_prompt_batch(json::parse(R"({"prompt": ["a", "b"], "stream": null})"), kBodyLimit)
          .is_ok());
  EXPECT_EQ(error_param(split_prompt_batch(json::parse(R"({"prompt": ["a", "b"], "stream": 1})"),
                                           kBodyLimit)
                            .status()),
            "stream");

  const ResponseHead head{"cmpl-3", 1700000000, "k3"};
  std::vector<json> answers;
  answers.push_back(completion_response(Endpoint::kCompletions, head, "x",
                                        FinishReason::kLength, Usage{4, 2, 1},
                                        {{"timings", {{"prompt_n", 4}}}, {"ktier", {{"a", 1}}}}));
  answers.push_back(completion_response(Endpoint::kCompletions, head, "yz", FinishReason::kStop,
                                        Usage{5, 1, 0},
                                        {{"timings", {{"prompt_n", 5}}}, {"ktier", {{"a", 2}}}}));
  const json j = batch_response(std::move(answers));
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["text"], "x");
  EXPECT_EQ(j["choices"][1]["index"], 1);
  EXPECT_EQ(j["choices"][1]["text"], "yz");
  EXPECT_EQ(j["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 9);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 12);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
  // Each prompt's figures with its choice; none at the top, where they would read as the batch's.
  EXPECT_EQ(j["choices"][0]["timings"]["prompt_n"], 4);
  EXPECT_EQ(j["choices"][1]["timings"]["prompt_n"], 5);
  EXPECT_EQ(j["choices"][0]["ktier"]["a"], 1);
  EXPECT_EQ(j["choices"][1]["ktier"]["a"], 2);
  EXPECT_FALSE(j.contains("timings")) << j.dump();
  EXPECT_FALSE(j.contains("ktier")) << j.dump();
  EXPECT_EQ(j["id"], "cmpl-3");
}

// A batch's copies of its shared fields are bounded: prompts whose copies of a large field (an
// ignored one too) would pass the limit are refused, naming `prompt`, before any copy is made;
// at the limit they are split.
TEST(OpenAiRequest, ABatchWhoseCopiesPassTheLimitIsRefused) {
  const json body = {{"prompt", {"a", "b", "c"}}, {"pad", std::string(1000, 'x')}};
  const size_t shared = json{{"pad", std::string(1000, 'x')}}.dump().size();
  auto refused = split_prompt_batch(body, 3 * shared - 1);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().exit_code(), 2);
  EXPECT_EQ(error_param(refused.status()), "prompt");
  EXPECT_NE(refused.status().message().find("3 prompts"), std::string::npos)
      << refused.status().message();
  auto split = split_prompt_batch(body, 3 * shared);
  ASSERT_TRUE(split.is_ok()) << split.status().message();
  EXPECT_EQ(split->size(), 3u);
}

// Each endpoint's own field: chat logprobs true (+ top_logprobs), completions logprobs N,
// /completion n_probs N (0: none); the other endpoints' refused unless neutral.
TEST(OpenAiRequest, LogprobsAreAskedInEachEndpointsField) {
  const auto asked = [](Endpoint endpoint, json body) -> std::optional<int64_t> {
    if (endpoint == Endpoint::kChatCompletions) body["messages"] = kUser;
    else body["prompt"] = "a";
    auto r = parse_request(endpoint, body, defaults());
    EXPECT_TRUE(r.is_ok()) << body.dump() << ": " << r.status().message();
    return r.is_ok() ? r->logprobs : std::nullopt;
  };
  EXPECT_EQ(asked(Endpoint::kChatCompletions, json::object()), std::nullopt);
  EXPECT_EQ(asked(Endpoint::kChatCompletions, {{"logprobs", false}}), std::nullopt);
  EXPECT_EQ(asked(Endpoint::kChatCompletions, {{"logprobs", true}}), 0);
  EXPECT_EQ(asked(Endpoint::kChatCompletions, {{"logprobs", true}, {"top_logprobs", 20}}), 20);
  EXPECT_EQ(asked(Endpoint::kChatCompletions, {{"top_logprobs", nullptr}, {"n_probs", 0}}),
            std::nullopt);
  // Neutral: no alternatives asked for, so no logprobs needed (OpenAI's SDKs send it so).
  EXPECT_EQ(asked(Endpoint::kChatCompletions, {{"logprobs", false}, {"top_logprobs", 0}}),
            std::nullopt);
  EXPECT_EQ(asked(Endpoint::kCompletions, {{"logprobs", nullptr}}), std::nullopt);
  EXPECT_EQ(asked(Endpoint::kCompletions, {{"logprobs", 0}}), 0);
  EXPECT_EQ(asked(Endpoint::kCompletions, {{"logprobs", false}}), std::nullopt);
  EXPECT_EQ(asked(Endpoint::kCompletions, {{"logprobs", 5}, {"top_logprobs", 0}}), 5);
  EXPECT_EQ(asked(Endpoint::kLlamaCompletion, {{"n_probs", 0}}), std::nullopt);
  EXPECT_EQ(asked(Endpoint::kLlamaCompletion, {{"n_probs", 3}, {"logprobs", false}}), 3);
  for (const json& bad : {json{{"prompt", "a"}, {"logprobs", true}},
                          json{{"prompt", "a"}, {"logprobs", 21}},
                          json{{"prompt", "a"}, {"logprobs", -1}}}) {
    auto r = completion(bad);
    ASSERT_FALSE(r.is_ok()) << bad.dump();
    EXPECT_EQ(error_param(r.status()), "logprobs");
  }
  auto r = completion({{"prompt", "a"}, {"top_logprobs", 2}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(error_param(r.status()), "top_logprobs");
  EXPECT_NE(r.status().message().find("give \"logprobs\""), std::string::npos);
}

// A sampled token, an alternative whose bytes are part of a character, an impossible one.
std::vector<AnswerToken> some_tokens() {
  AnswerToken a;
  a.token = {17, -0.25, "Hi"};
  a.top = {{17, -0.25, "Hi"}, {4, -2.5, "\xe2\x82"}};
  AnswerToken b;
  b.token = {9, -std::numeric_limits<double>::infinity(), " \xc3\xa9"};
  b.text_offset = 2;
  return {a, b};
}

// An echoed prompt's first token has no logprob: null, as OpenAI's.
TEST(OpenAiResponse, AnUnscoredTokensLogprobIsNull) {
  std::vector<AnswerToken> tokens = some_tokens();
  tokens[0].scored = false;
  tokens[0].top.clear();
  json j = logprobs_json(Endpoint::kCompletions, tokens);
  EXPECT_TRUE(j["token_logprobs"][0].is_null());
  EXPECT_TRUE(j["top_logprobs"][0].is_null());
  EXPECT_EQ(j["tokens"][0], "Hi");
  EXPECT_EQ(j["token_logprobs"][1], -9999.0);
  j = logprobs_json(Endpoint::kChatCompletions, tokens);
  EXPECT_TRUE(j["content"][0]["logprob"].is_null());
  EXPECT_TRUE(j["content"][0]["top_logprobs"].is_null());
}

TEST(OpenAiResponse, LogprobsHaveEachEndpointsShape) {
  const std::vector<AnswerToken> tokens = some_tokens();
  json j = logprobs_json(Endpoint::kChatCompletions, tokens);
  ASSERT_EQ(j["content"].size(), 2u);
  const json& first = j["content"][0];
  EXPECT_EQ(first["token"], "Hi");
  EXPECT_EQ(first["logprob"], -0.25);
  EXPECT_EQ(first["bytes"], json::array({72, 105}));
  ASSERT_EQ(first["top_logprobs"].size(), 2u);
  // A character cut short: one U+FFFD (as tiktoken's decode), its bytes as they are.
  EXPECT_EQ(first["top_logprobs"][1]["token"], "\xef\xbf\xbd");
  EXPECT_EQ(first["top_logprobs"][1]["bytes"], json::array({0xe2, 0x82}));
  EXPECT_FALSE(first.contains("id"));
  EXPECT_EQ(j["content"][1]["logprob"], -9999.0);  // JSON has no -Inf
  EXPECT_EQ(j["content"][1]["token"], " \xc3\xa9");
  EXPECT_TRUE(j["content"][1]["top_logprobs"].empty());

  j = logprobs_json(Endpoint::kCompletions, tokens);
  EXPECT_EQ(j["tokens"], json::array({"Hi", " \xc3\xa9"}));
  EXPECT_EQ(j["token_logprobs"], json::array({-0.25, -9999.0}));
  EXPECT_EQ(j["text_offset"], json::array({0, 2}));
  // The sampled token is always among the alternatives (OpenAI's legacy form).
  EXPECT_EQ(j["top_logprobs"][0],
            json({{"Hi", -0.25}, {"\xef\xbf\xbd", -2.5}}));
  EXPECT_EQ(j["top_logprobs"][1], json({{" \xc3\xa9", -9999.0}}));
  // An alternative with the sampled token's text does not replace its logprob.
  std::vector<AnswerToken> same_text = some_tokens();
  same_text[0].top = {{5, -0.125, "\xff"}, {6, -3.0, "\xfe"}};
  same_text[0].token.bytes = "\xfd";
  j = logprobs_json(Endpoint::kCompletions, same_text);
  EXPECT_EQ(j["top_logprobs"][0], json({{"\xef\xbf\xbd", -0.25}}));

  j = logprobs_json(Endpoint::kLlamaCompletion, tokens);
  ASSERT_TRUE(j.is_array());
  EXPECT_EQ(j[0]["id"], 17);
  EXPECT_EQ(j[0]["top_logprobs"][1]["id"], 4);
  EXPECT_EQ(j[1]["token"], " \xc3\xa9");

  // In the bodies: the choice's "logprobs", null when none were asked.
  const ResponseHead head{"cmpl-1", 1, "k3"};
  for (const Endpoint e : {Endpoint::kCompletions, Endpoint::kChatCompletions}) {
    const json probs = logprobs_json(e, tokens);
    EXPECT_TRUE(completion_response(e, head, "Hi", FinishReason::kStop, {}, {})["choices"][0]
                    .at("logprobs")
                    .is_null());
    EXPECT_EQ(completion_response(e, head, "Hi", FinishReason::kStop, {}, {}, probs)["choices"][0]
                  ["logprobs"],
              probs);
    EXPECT_TRUE(stream_chunk(e, head, "Hi", std::nullopt)["choices"][0].at("logprobs").is_null());
    EXPECT_EQ(stream_chunk(e, head, "Hi", std::nullopt, probs)["choices"][0]["logprobs"], probs);
  }
}

TEST(ServiceText, InvalidBytesBecomeReplacementCharacters) {
  EXPECT_EQ(valid_utf8("plain \xc3\xa9 \xf0\x9f\x98\x80"), "plain \xc3\xa9 \xf0\x9f\x98\x80");
  EXPECT_EQ(valid_utf8("a\xff" "b"), "a\xef\xbf\xbd" "b");
  // One U+FFFD per maximal subpart, as Python's bytes.decode("utf-8", "replace") (tiktoken's
  // decode) gives (each case below checked against it): a sequence cut short is one, however
  // many of its bytes came (a completion cut by max_tokens inside a character); a byte that
  // can begin no sequence, or continue none here (overlong, surrogate, past U+10FFFF), is one.
  const std::string fffd = "\xef\xbf\xbd";
  for (const auto& [in, out] : std::vector<std::pair<std::string, std::string>>{
           {"\xe2\x82", fffd},
           {"\xe4\xb8x", fffd + "x"},
           {"\xf0\x9f\x98\xe4\xb8", fffd + fffd},
           {"\xf0\x9f\x98\x80\x80", "\xf0\x9f\x98\x80" + fffd},
           {"\xc0\xaf", fffd + fffd},
           {"\xe0\x80\xaf", fffd + fffd + fffd},
           {"\xed\xa0\x80", fffd + fffd + fffd},
           {"\xf4\x90\x80\x80", fffd + fffd + fffd + fffd},
           {"x\x80\xf5y", "x" + fffd + fffd + "y"}})
    EXPECT_EQ(valid_utf8(in), out) << testing::PrintToString(in);
  // The result is valid: encoding again changes nothing, and JSON carries it unchanged.
  const std::string once = valid_utf8("x\x80\xf5y");
  EXPECT_EQ(valid_utf8(once), once);
  EXPECT_EQ(json::parse(json(once).dump()).get<std::string>(), once);
}

TEST(ServiceText, HeldBackIsTheLongestSuffixThatMayBeginAStop) {
  const std::vector<std::string> stops = {"END", "\n\n"};
  EXPECT_EQ(stop_prefix_suffix("hello", stops), 0u);
  EXPECT_EQ(stop_prefix_suffix("hello E", stops), 1u);
  EXPECT_EQ(stop_prefix_suffix("hello EN", stops), 2u);
  EXPECT_EQ(stop_prefix_suffix("hello\n", stops), 1u);
  EXPECT_EQ(stop_prefix_suffix("EN", stops), 2u);
  EXPECT_EQ(stop_prefix_suffix("", stops), 0u);
  EXPECT_EQ(stop_prefix_suffix("abc", {}), 0u);
  // Only proper prefixes: a whole stop is found, not held.
  EXPECT_EQ(stop_prefix_suffix("xEND", {"END"}), 0u);
  EXPECT_EQ(stop_prefix_suffix("aaa", {"aab"}), 2u);
}

// llama-server's `samplers` (server/sampler_order.h): llama.cpp's web UI sends "edkypmxt" with
// every request (it was refused: every chat from it failed 400). Its order, temperature last,
// is run as such; a sampler left out is not applied; an order ktier cannot run is refused,
// naming the pair.
TEST(SamplerOrder, LlamaCppOrdersRunAsTheyAreOrRefusedByName) {
  const json web_ui = {{"prompt", "a"},        {"samplers", "edkypmxt"}, {"temperature", 0.8},
                       {"top_k", 40},          {"top_p", 0.95},          {"min_p", 0.05},
                       {"typical_p", 1},       {"dry_multiplier", 0},    {"xtc_probability", 0},
                       {"max_tokens", -1}};
  auto r = completion(web_ui);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_TRUE(r->sampling.temperature_last);
  EXPECT_EQ(r->sampling.top_k, 40);
  EXPECT_EQ(r->sampling.top_p, 0.95);
  EXPECT_EQ(r->sampling.min_p, 0.05);
  EXPECT_EQ(r->sampling.temperature, 0.8);
  EXPECT_EQ(r->sampling.repeat_penalty, 1.2);  // the server's default: 'e' is listed
  // Names, as a list or joined by ';'; the temperature first is ktier's own order.
  for (const json& names : {json{"penalties", "top_k", "temperature", "top_p", "min_p"},
                            json("penalties;top_k;temperature;top_p;min_p")}) {
    json body = web_ui;
    body["samplers"] = names;
    r = completion(body);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_FALSE(r->sampling.temperature_last) << names;
  }
  // Left out, a sampler is not applied (llama-server's chain holds only those listed): no
  // penalties, top-k or min-p here, and the temperature 1 without 't'.
  json body = web_ui;
  body["samplers"] = "kp";
  r = completion(body);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->sampling.repeat_penalty, 1.0);
  EXPECT_EQ(r->sampling.presence_penalty, 0.0);
  EXPECT_EQ(r->sampling.top_k, 40);
  EXPECT_EQ(r->sampling.top_p, 0.95);
  EXPECT_EQ(r->sampling.min_p, 0.0);
  EXPECT_EQ(r->sampling.temperature, 1.0);
  // Empty: no sampler (llama-server's empty chain draws at temperature 1); null: nothing asked.
  for (const json& empty : {json(""), json::array()}) {
    body = web_ui;
    body["samplers"] = empty;
    r = completion(body);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(r->sampling.min_p, 0.0);
    EXPECT_EQ(r->sampling.top_k, 0);
    EXPECT_EQ(r->sampling.repeat_penalty, 1.0);
    EXPECT_EQ(r->sampling.temperature, 1.0);
  }
  body = web_ui;
  body["samplers"] = nullptr;
  r = completion(body);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->sampling.min_p, 0.05);
  EXPECT_FALSE(r->sampling.temperature_last);
  // Orders ktier does not run, and names it does not know, refused naming the field.
  for (const auto& [samplers, why] : std::vector<std::pair<json, std::string>>{
           {json("kpmte"), "ktier runs penalties before top_k"},
           {json("epkmt"), "ktier runs top_k before top_p"},
           {json("ekmpt"), "ktier runs top_p before min_p"},
           {json("ekptm"), "the temperature between top_p and min_p is not built"},
           {json("ekpmtt"), "temperature is given twice"},
           {json("ekpmtz"), "unknown sampler 'z'"},
           {json{"top_k", "mirostat"}, "unknown sampler 'mirostat'"},
           // Names llama-server drops without a word, and infill (no field makes it neutral).
           {json{"top_k", "temp"}, "unknown sampler 'temp'"},
           {json("ekpmti"), "infill is not built"},
           {json(7), "must be a string or an array"}}) {
    body = web_ui;
    body["samplers"] = samplers;
    r = completion(body);
    ASSERT_FALSE(r.is_ok()) << samplers;
    EXPECT_EQ(error_param(r.status()), "samplers");
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().message();
  }
  // Greedy takes the top token where the temperature stands, so only the penalties' place
  // counts ("te": llama-server takes the top token before the penalties).
  body = web_ui;
  body["samplers"] = "kptme";
  body["temperature"] = 0;
  r = completion(body);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("ktier runs penalties before top_k"), std::string::npos)
      << r.status().message();
  body["samplers"] = "ekptm";  // the temperature between the cuts: no matter for greedy
  r = completion(body);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->sampling.temperature, 0.0);
  body["samplers"] = "ekpm";  // left out: llama-server draws at temperature 1, greedy or not
  r = completion(body);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->sampling.temperature, 1.0);
  // A temperature of 1 is no step: its place does not count. A sampler that is off may stand
  // anywhere ("t" before "p" with top_p 1 is either order).
  body = web_ui;
  body["temperature"] = 1;
  body["samplers"] = "ektpm";  // between the cuts
  EXPECT_TRUE(completion(body).is_ok());
  body["temperature"] = 0.8;
  body["top_p"] = 1;
  body["samplers"] = "ektpm";  // top_p off: the temperature is before the only cut
  r = completion(body);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_FALSE(r->sampling.temperature_last);
}

}  // namespace
}  // namespace ktier::server
