#pragma once
// The OpenAI-compatible HTTP API of `ktier serve` (POST /v1/completions, /v1/chat/completions):
// request bodies parsed into a typed request, and the response bodies and stream events built.
// No HTTP here (cli/cmd_serve.cpp has it), so that every rule is unit-tested.
//
// What a request may say (docs/TUNING.md "Serving"): model (any; the one loaded answers),
// prompt (completions: a string, an array of one string, an array of token ids, or ids and
// texts mixed (llama-server's), special-token names in a text read as their ids; or a batch
// of two or more of them, answered in turn as one choice each, not streamed), n_predict
// (llama-server's /completion only: its max_tokens, capped to the context left, -1 or -2 = all
// of it, 0 = the prompt only), messages (chat: roles user and assistant, content a string or an
// array of {"type": "text"} parts), max_tokens (max_completion_tokens), temperature, top_p,
// top_k, min_p, seed, presence_penalty, frequency_penalty, repeat_penalty, repeat_last_n
// (llama-server's), logit_bias, ignore_eos, stop (a string or up to 4; any number on
// /completion), stream, stream_options.include_usage, n (1 only), log-probabilities (chat:
// logprobs true and top_logprobs; completions: logprobs N; /completion: n_probs N; N <= 20),
// echo (completions). Fields that would change the output in ways not built
// (repetition_penalty, the other samplers of llama-server's that ktier knows of, grammars,
// return_tokens, suffix, tools, system messages whose format is not in K3-MODEL.md) are refused
// with the field named unless they hold their neutral value, never silently ignored; other
// fields are ignored.
//
// Thread-safety: pure functions.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "runtime/sampler.h"
#include "tokenizer/chat.h"

namespace ktier::server {

// kLlamaCompletion: llama-server's own POST /completion (its fields, its response: llama_api.h).
enum class Endpoint { kCompletions, kChatCompletions, kLlamaCompletion };
// Its path, for logs: "/v1/completions", "/v1/chat/completions", "/completion".
const char* endpoint_name(Endpoint endpoint);

// What a request leaves unsaid, from `ktier serve`'s flags.
struct RequestDefaults {
  runtime::SamplingParams sampling{.temperature = 1.0};  // OpenAI's temperature 1; --seed
  int64_t max_tokens = 512;  // -n, capped to the context left (< 0: all of it)
};

// Most alternatives a request may ask log-probabilities of, per token (vLLM's default bound).
constexpr int64_t kMaxTopLogprobs = 20;

// A token id or a text of a prompt that mixes them.
using PromptPiece = std::variant<int32_t, std::string>;

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string prompt;                      // completions given text
  // Completions given an array: token ids, or ids and texts mixed (llama-server's [12, "text",
  // 34]; each text encoded as `prompt` is, in its place). Then `prompt` is empty.
  std::vector<PromptPiece> prompt_pieces;
  std::vector<tok::ChatMessage> messages;  // chat: at least one, the last the user's
  std::optional<int64_t> max_tokens;       // unset: RequestDefaults::max_tokens, capped; 0
                                           // (n_predict only): the prompt runs, nothing more
  bool to_context_end = false;             // n_predict < 0: as many as the context holds
  runtime::SamplingParams sampling;  // logit_bias ids unchecked against the vocabulary yet
  // ignore_eos, as llama-server's: the endpoint's stop ids are never drawn (a -Inf logit_bias,
  // added by Service::prepare), so the answer runs to its limit (vLLM's draws them and goes on).
  bool ignore_eos = false;
  std::vector<std::string> stop;  // texts that end the answer (not part of it); none empty
  bool stream = false, include_usage = false;
  // Set: each answer token's log-probability and those of the `*logprobs` most likely tokens
  // (0..kMaxTopLogprobs) at its place. Unset: none.
  std::optional<int64_t> logprobs;
  // Completions' echo: the text (and the logprobs, the first token's unscored) begin with the
  // prompt's; max_tokens may then be 0.
  bool echo = false;
};

// Sampling values OpenAI's API bounds tighter than `run` does: a request's field past them is
// refused, and so is `serve`'s flag for what a request leaves unsaid.
struct OpenAiBound {
  const char* field;  // the request's
  const char* flag;   // serve's
  int min, max;
  double runtime::SamplingParams::*value;
};
inline constexpr OpenAiBound kOpenAiBounds[] = {
    {"temperature", "--temp", 0, 2, &runtime::SamplingParams::temperature},
    {"presence_penalty", "--presence-penalty", -2, 2, &runtime::SamplingParams::presence_penalty},
    {"frequency_penalty", "--frequency-penalty", -2, 2,
     &runtime::SamplingParams::frequency_penalty}};
// Status::usage naming the flag of the first value of `p` outside kOpenAiBounds.
Status check_openai_bounds(const runtime::SamplingParams& p);

// Completions' batch of prompts (`prompt` an array of two or more prompts, each a string or an
// array of token ids: OpenAI's, lm-eval-harness's batches): the body (parse_body_object's) once
// per prompt, with that prompt alone; empty where `body` holds no batch (parse_request reads
// it). Status::usage for a batch with "stream" set (not built) or not a bool, and for one whose
// copies of the other fields (their JSON text's bytes, once per prompt) would pass
// `max_copied_bytes` (serve: its body limit).
Result<std::vector<nlohmann::json>> split_prompt_batch(const nlohmann::json& body,
                                                       size_t max_copied_bytes);
// The response to a batch: the answers' choices in order, each with its index and, where the
// answer had them, its own `timings` and `ktier` run report (each prompt runs alone: one
// answer's figures are not the batch's); their usage summed; id, created and model the last
// answer's.
nlohmann::json batch_response(std::vector<nlohmann::json> answers);

// Checks a request body (a JSON object, as parse_body_object returns it). Status::usage naming
// the field (e.g. "messages[2].role") for a wrong type or value, or something not built.
Result<CompletionRequest> parse_request(Endpoint endpoint, const nlohmann::json& body,
                                        const RequestDefaults& defaults);

// How an answer ended, as OpenAI's finish_reason says it.
enum class FinishReason { kStop, kLength };
const char* finish_reason_name(FinishReason r);

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0;
  int64_t cached_tokens = 0;  // of the prompt: the previous request's state went on
};

// A token and its log-probability under the model's logits at its place (log softmax of the
// logits as they are: before penalties, temperature or cuts). `bytes` are the token's (a token
// may hold part of a character).
struct TokenLogprob {
  int32_t id = 0;
  double logprob = 0;
  std::string bytes;
};
// A token of the answer (a stop or special one too, whose text is not shown; chat: of its
// content only) or of an echoed prompt, with the alternatives asked for.
struct AnswerToken {
  TokenLogprob token;
  std::vector<TokenLogprob> top;  // the most likely first (lower id first among equals)
  int64_t text_offset = 0;        // characters (code points) of the text before its own
  bool scored = true;  // false: an echoed prompt's first token (no logits before it)
};
// A request's "logprobs" in its endpoint's form, for the answer's tokens `tokens` (a streamed
// chunk's, or all): completions {"tokens", "token_logprobs", "top_logprobs", "text_offset"},
// chat {"content": [{"token", "logprob", "bytes", "top_logprobs"}]}, /completion's
// "completion_probabilities" array [{"id", "token", "logprob", "bytes", "top_logprobs"}]. A
// token's text is its bytes as valid_utf8; a log-probability of -Inf is written -9999 (as vLLM:
// JSON has no infinity); an unscored token's logprob and top_logprobs are null.
nlohmann::json logprobs_json(Endpoint endpoint, std::span<const AnswerToken> tokens);

// Identity of one response: its id ("cmpl-…" / "chatcmpl-…": a prefix drawn when the server
// starts, then the request's number), creation time, model name.
struct ResponseHead {
  std::string id;
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// The whole response of a request that did not stream. `extra` fields (ktier's "timings" and
// run report) are merged in at the top level. `logprobs`: the choice's (logprobs_json), null
// when the request asked none.
nlohmann::json completion_response(Endpoint endpoint, const ResponseHead& head,
                                   const std::string& text, FinishReason finish,
                                   const Usage& usage, const nlohmann::json& extra,
                                   const nlohmann::json& logprobs = nullptr);
// One streamed event's JSON: a piece of text (`finish` unset) with its tokens' `logprobs` (null
// when the request asked none), or the last one with its finish reason and empty text. Chat's
// first event (role only) is stream_role_chunk.
nlohmann::json stream_chunk(Endpoint endpoint, const ResponseHead& head, const std::string& text,
                            std::optional<FinishReason> finish,
                            const nlohmann::json& logprobs = nullptr);
nlohmann::json stream_role_chunk(const ResponseHead& head);
// The event after the last chunk when the request asked for stream_options.include_usage.
nlohmann::json stream_usage_chunk(Endpoint endpoint, const ResponseHead& head, const Usage& usage,
                                  const nlohmann::json& extra);
// Status::usage "request field \"FIELD\": WHAT", the form error_param reads back.
Status field_error(const std::string& field, const std::string& what);
// A request body as a JSON object; Status::usage when it is not valid JSON, not an object, or
// nests values deeper than kMaxJsonDepth (an array or object in the body's object is level 1).
inline constexpr int kMaxJsonDepth = 64;
Result<nlohmann::json> parse_body_object(std::string_view body);
// `body[name]` as a bool: `fallback` when absent or null; field_error when not a bool.
// `shown`: the field's name in the error where it is nested ("stream_options.include_usage").
Result<bool> bool_field(const nlohmann::json& body, const char* name, bool fallback,
                        const char* shown = nullptr);
// The request field a parse_request (or field_error) error names (its "param"), if it names one.
std::optional<std::string> error_param(const Status& s);
// OpenAI's error body: {"error": {"message", "type", "param", "code"}}.
nlohmann::json error_body(const std::string& message, const std::string& type,
                          const std::optional<std::string>& code = std::nullopt,
                          const std::optional<std::string>& param = std::nullopt);
// `bytes` as valid UTF-8: each maximal subpart of an ill-formed sequence (a byte that begins
// none, or a sequence cut short: tok::utf8_maximal_subpart) becomes one U+FFFD, as tiktoken's
// decode (Python's errors="replace") gives. A model may sample bytes that are not text; JSON
// cannot carry them, and the text a client quotes back must be the text held here.
std::string valid_utf8(std::string_view bytes);
// JSON text that never throws: bytes that are not UTF-8 (a path, an --alias) become U+FFFD.
std::string dump(const nlohmann::json& j);
// "data: JSON\n\n", a server-sent event (dump()).
std::string sse_event(const nlohmann::json& j);

}  // namespace ktier::server
