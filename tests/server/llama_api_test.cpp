// llama-server's own POST /completion (server/llama_api.h, Endpoint::kLlamaCompletion of
// parse_request): its fields (n_predict, a prompt of token ids), and the shapes of its result
// and stream events that llama.cpp's clients read.
#include "server/llama_api.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

namespace ktier::server {
namespace {

using nlohmann::json;

Result<CompletionRequest> parse(Endpoint endpoint, const json& body) {
  RequestDefaults d;
  d.max_tokens = 33;
  return parse_request(endpoint, body, d);
}
Result<CompletionRequest> llama(const json& body) {
  return parse(Endpoint::kLlamaCompletion, body);
}

TEST(LlamaRequest, NPredictAndTokenIdPromptsAreRead) {
  auto r = llama({{"prompt", "abc"}, {"n_predict", 7}, {"temperature", 0}, {"cache_prompt", true},
                  {"repeat_penalty", 1.1}, {"repeat_last_n", 32}, {"id_slot", -1}});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->endpoint, Endpoint::kLlamaCompletion);
  EXPECT_EQ(r->prompt, "abc");
  EXPECT_TRUE(r->prompt_pieces.empty());
  EXPECT_EQ(r->max_tokens, 7);
  EXPECT_FALSE(r->to_context_end);
  EXPECT_EQ(r->sampling.temperature, 0.0);
  EXPECT_EQ(r->sampling.repeat_penalty, 1.1);
  EXPECT_EQ(r->sampling.repeat_last_n, 32);
  // -1: as many as the context holds (llama-server's "until the context is full").
  r = llama({{"prompt", {5, 0, 7}}, {"n_predict", -1}});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->prompt, "");
  EXPECT_EQ(r->prompt_pieces, (std::vector<PromptPiece>{5, 0, 7}));
  EXPECT_FALSE(r->max_tokens.has_value());
  EXPECT_TRUE(r->to_context_end);
  // Unset: the server's -n (Service::prepare), as the OpenAI endpoints.
  r = llama({{"prompt", {"one string"}}});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->prompt, "one string");
  EXPECT_FALSE(r->max_tokens.has_value());
  EXPECT_FALSE(r->to_context_end);
  // 0: the prompt only (llama-server's way to keep a prompt's state); neutral values of what is
  // not built are taken.
  r = llama({{"prompt", "a"}, {"n_predict", 0}, {"n_probs", 0}, {"return_tokens", false},
             {"top_n_sigma", -1}, {"dynatemp_range", 0}, {"min_keep", 1}});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->max_tokens, 0);
  // -2 (llama.cpp's "until the context is filled") is -1 here; any number of stop texts.
  r = llama({{"prompt", "a"}, {"n_predict", -2}, {"stop", {"a", "b", "c", "d", "e"}}});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_TRUE(r->to_context_end);
  EXPECT_EQ(r->stop.size(), 5u);
  // n_predict wins over max_tokens where both are given.
  r = llama({{"prompt", "a"}, {"max_tokens", 3}, {"n_predict", 4}});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->max_tokens, 4);
  r = llama({{"prompt", "a"}, {"max_tokens", -1}, {"n_predict", 4}});
  ASSERT_TRUE(r.is_ok());
  EXPECT_FALSE(r->to_context_end);
  EXPECT_EQ(r->max_tokens, 4);
  // ... and without it max_tokens counts, -1 too (llama-server's fallback).
  r = llama({{"prompt", "a"}, {"max_tokens", -1}});
  ASSERT_TRUE(r.is_ok());
  EXPECT_TRUE(r->to_context_end);
  EXPECT_FALSE(r->max_tokens.has_value());
  // OpenAI's completions take token ids too.
  r = parse(Endpoint::kCompletions, {{"prompt", {9, 8}}});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->prompt_pieces, (std::vector<PromptPiece>{9, 8}));
  // A batch of one (lm-eval-harness's form).
  r = parse(Endpoint::kCompletions, {{"prompt", {{9, 8}}}});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->prompt_pieces, (std::vector<PromptPiece>{9, 8}));
  // Whole numbers as every integer field takes them.
  r = llama({{"prompt", {3.0, 2147483647}}});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->prompt_pieces, (std::vector<PromptPiece>{3, 2147483647}));
}

TEST(LlamaRequest, RefusalsNameTheField) {
  struct Case {
    Endpoint endpoint;
    json body;
    std::string field;
  };
  const json big = int64_t{std::numeric_limits<int32_t>::max()} + 1;
  const std::vector<Case> cases = {
      {Endpoint::kLlamaCompletion, {{"prompt", "a"}, {"n_predict", -3}}, "n_predict"},
      {Endpoint::kLlamaCompletion, {{"prompt", "a"}, {"min_keep", 2}}, "min_keep"},
      {Endpoint::kLlamaCompletion, {{"prompt", "a"}, {"min_keep", 0.5}}, "min_keep"},
      {Endpoint::kCompletions, {{"prompt", "a"}, {"stop", {"a", "b", "c", "d", "e"}}}, "stop"},
      {Endpoint::kLlamaCompletion, {{"prompt", "a"}, {"n_predict", "5"}}, "n_predict"},
      {Endpoint::kLlamaCompletion, {{"prompt", json::array()}}, "prompt"},
      {Endpoint::kLlamaCompletion, {{"prompt", {1, -1}}}, "prompt"},
      {Endpoint::kLlamaCompletion, {{"prompt", {1, 2.5}}}, "prompt"},
      {Endpoint::kLlamaCompletion, {{"prompt", {1, "a", nullptr}}}, "prompt"},  // (mixed: ok)
      {Endpoint::kLlamaCompletion, {{"prompt", {1, big}}}, "prompt"},
      {Endpoint::kLlamaCompletion, {{"prompt", {{1, 2}, {3}}}}, "prompt"},
      {Endpoint::kLlamaCompletion, {{"n_predict", 3}}, "prompt"},
      {Endpoint::kLlamaCompletion, {{"prompt", "a"}, {"samplers", {"top_k", "mirostat"}}},
       "samplers"},
      {Endpoint::kLlamaCompletion, {{"prompt", "a"}, {"n_probs", 21}}, "n_probs"},
      {Endpoint::kLlamaCompletion, {{"prompt", "a"}, {"n_probs", -1}}, "n_probs"},
      {Endpoint::kLlamaCompletion, {{"prompt", "a"}, {"logprobs", 2}}, "logprobs"},
      {Endpoint::kLlamaCompletion, {{"prompt", "a"}, {"top_logprobs", 2}}, "top_logprobs"},
      {Endpoint::kLlamaCompletion, {{"prompt", "a"}, {"return_tokens", true}}, "return_tokens"},
      {Endpoint::kLlamaCompletion, {{"prompt", "a"}, {"dynatemp_range", 1.5}}, "dynatemp_range"},
      {Endpoint::kLlamaCompletion, {{"prompt", "a"}, {"top_n_sigma", 1}}, "top_n_sigma"},
      {Endpoint::kCompletions, {{"prompt", "a"}, {"n_predict", 3}}, "n_predict"},
      {Endpoint::kChatCompletions,
       {{"messages", {{{"role", "user"}, {"content", "a"}}}}, {"n_predict", 3}},
       "n_predict"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body.dump());
    auto r = parse(c.endpoint, c.body);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), ExitCode::kUsage);
    EXPECT_EQ(error_param(r.status()), c.field) << r.status().message();
  }
  // The OpenAI endpoints say where n_predict is taken.
  auto r = parse(Endpoint::kCompletions, {{"prompt", "a"}, {"n_predict", 3}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("POST /completion"), std::string::npos);
}

TEST(LlamaResponse, ResultPiecesAndPropsHaveLlamaServersShape) {
  const Usage usage{11, 3, 5};
  const json extra = {{"timings", {{"cache_n", 5}}}};
  json j = llama_completion_result("k3", "hello", FinishReason::kStop, "", usage, extra);
  EXPECT_EQ(j["content"], "hello");
  EXPECT_EQ(j["stop"], true);
  EXPECT_EQ(j["model"], "k3");
  EXPECT_EQ(j["tokens_predicted"], 3);
  EXPECT_EQ(j["tokens_evaluated"], 11);
  EXPECT_EQ(j["stop_type"], "eos");
  EXPECT_EQ(j["stopping_word"], "");
  EXPECT_EQ(j["truncated"], false);
  EXPECT_EQ(j["id_slot"], 0);
  EXPECT_TRUE(j["tokens"].empty());
  EXPECT_EQ(j["timings"]["cache_n"], 5);
  j = llama_completion_result("k3", "", FinishReason::kStop, "\n\n", usage, {});
  EXPECT_EQ(j["stop_type"], "word");
  EXPECT_EQ(j["stopping_word"], "\n\n");
  EXPECT_FALSE(j.contains("timings"));
  EXPECT_STREQ(llama_stop_type(FinishReason::kLength, ""), "limit");
  EXPECT_FALSE(j.contains("completion_probabilities"));  // n_probs asked none
  j = llama_completion_result("k3", "", FinishReason::kStop, "", usage, {}, json::array());
  EXPECT_TRUE(j["completion_probabilities"].is_array());
  j = llama_stream_piece("pi");
  EXPECT_EQ(j["content"], "pi");
  EXPECT_EQ(j["stop"], false);
  EXPECT_FALSE(j.contains("completion_probabilities"));
  EXPECT_EQ(llama_stream_piece("pi", json::array({1}))["completion_probabilities"][0], 1);
  EXPECT_EQ(sse_event(j).rfind("data: {", 0), 0u);
  EXPECT_STREQ(endpoint_name(Endpoint::kLlamaCompletion), "/completion");
  RequestDefaults d;
  d.max_tokens = -1;
  d.sampling = {.temperature = 0.5, .top_k = 7, .seed = 9, .repeat_penalty = 1.1};
  j = llama_props(d, 4096, "k3", "/models/k3", "ktier 1.2");
  EXPECT_EQ(j["default_generation_settings"]["n_ctx"], 4096);
  const json& params = j["default_generation_settings"]["params"];
  EXPECT_EQ(params["n_predict"], -1);
  EXPECT_EQ(params["temperature"], 0.5);
  EXPECT_EQ(params["top_k"], 7);
  EXPECT_EQ(params["seed"], 9);
  d.sampling.seed = runtime::kRandomSeed;  // serve's default: shown as llama-server's -1
  const json random = llama_props(d, 4096, "k3", "/models/k3", "ktier 1.2");
  EXPECT_EQ(random["default_generation_settings"]["params"]["seed"], -1);
  EXPECT_EQ(params["repeat_penalty"], 1.1);
  EXPECT_EQ(params["repeat_last_n"], 64);
  EXPECT_EQ(j["total_slots"], 1);
  EXPECT_EQ(j["model_alias"], "k3");
  EXPECT_EQ(j["model_path"], "/models/k3");
  EXPECT_EQ(j["modalities"], json({{"vision", false}, {"audio", false}}));
  EXPECT_FALSE(j.contains("chat_template"));
  // The settings' function is /props' params (-1 for the random seed; a request's own seed is
  // drawn before it is shown), with what llama-server says of its request.
  json settings = llama_generation_settings(d.sampling, -1);
  EXPECT_EQ(settings["seed"], -1);
  settings["seed"] = 9;
  EXPECT_EQ(settings, params);
  const json f = llama_request_fields("The lamp", settings, "a\nb", 7);
  EXPECT_EQ(f["prompt"], "The lamp");
  EXPECT_EQ(f["generation_settings"], settings);
  EXPECT_EQ(f["has_new_line"], true);
  EXPECT_EQ(f["tokens_cached"], 7);
  EXPECT_EQ(llama_request_fields("", settings, "ab", 0)["has_new_line"], false);
  EXPECT_STREQ(endpoint_name(Endpoint::kCompletions), "/v1/completions");
}

}  // namespace
}  // namespace ktier::server
