#pragma once
// llama-server's own completion API (POST /completion, and /completions as llama-server routes
// it): the response bodies and stream events `ktier serve` answers it with. Requests are parsed
// by parse_request (Endpoint::kLlamaCompletion: OpenAI's sampling fields, n_predict, a prompt
// of text or token ids). No HTTP here (cli/cmd_serve.cpp has it).
//
// A stream is events of llama_stream_piece, then one llama_completion_result with content ""
// (llama-server's last event; no "[DONE]" after it).
//
// Thread-safety: pure functions.

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "server/openai_api.h"

namespace ktier::server {

// How an answer ended, as llama-server's "stop_type" says it: "eos" (a stop token), "word" (a
// stop text, `stopping_word`), "limit" (n_predict, or the context).
const char* llama_stop_type(FinishReason finish, const std::string& stopping_word);

// The result: the whole answer (`text`) when not streamed, a stream's last event (`text` "")
// otherwise. `extra` ("timings", whose cache_n is the prompt tokens reused, and ktier's run
// report) is merged in at the top level. `probs` (logprobs_json; null: n_probs asked none) is
// its "completion_probabilities" (a stream's last event has none: its pieces had them).
nlohmann::json llama_completion_result(const std::string& model, const std::string& text,
                                       FinishReason finish, const std::string& stopping_word,
                                       const Usage& usage, const nlohmann::json& extra,
                                       const nlohmann::json& probs = nullptr);

// A streamed piece of the answer's text, with its tokens' "completion_probabilities" (`probs`)
// where the request asked n_probs.
nlohmann::json llama_stream_piece(const std::string& text, const nlohmann::json& probs = nullptr);

// The values a request runs with, as llama-server names them (its result's
// "generation_settings", /props' "params"): `n_predict`, the most tokens it may generate (the
// request's capped to the context's room, or the server's -n; -1: to the context's end), the
// seed -1 where it is kRandomSeed (drawn per request), `ignore_eos`, and `logit_bias` as
// [id, bias] pairs (false: never drawn; with ignore_eos its stop ids' too, as llama-server's).
nlohmann::json llama_generation_settings(const runtime::SamplingParams& s, int64_t n_predict,
                                         bool ignore_eos = false);

// What llama-server's result says beside the answer: "prompt" (the prompt's text),
// "generation_settings" (`settings`), "has_new_line" (the whole `answer` has one, streamed or
// not) and "tokens_cached" (`positions_held`: the positions the sequence holds after the answer,
// which the next request may reuse as far as its prompt agrees). Merged into `extra`.
nlohmann::json llama_request_fields(const std::string& prompt, nlohmann::json settings,
                                    const std::string& answer, int64_t positions_held);

// GET /props: what a request that gives none takes (`defaults`), the context (`ctx` positions),
// one slot (one request at a time), the model's name, its folder as `model_path`, no
// `modalities` (text only: front-ends look there for vision) and ktier's version as
// `build_info`. No "chat_template": K3 has none (its renderer is ktier's, K3-MODEL §8.6).
nlohmann::json llama_props(const RequestDefaults& defaults, int64_t ctx,
                           const std::string& model, const std::string& model_path,
                           const std::string& build_info);

}  // namespace ktier::server
