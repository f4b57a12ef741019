#include "server/llama_api.h"

#include <cmath>

namespace ktier::server {

using nlohmann::json;

const char* llama_stop_type(FinishReason finish, const std::string& stopping_word) {
  if (finish == FinishReason::kLength) return "limit";
  return stopping_word.empty() ? "eos" : "word";
}

json llama_completion_result(const std::string& model, const std::string& text,
                             FinishReason finish, const std::string& stopping_word,
                             const Usage& usage, const json& extra, const json& probs) {
  json j = {{"index", 0},
            {"content", text},
            {"tokens", json::array()},
            {"id_slot", 0},
            {"stop", true},
            {"model", model},
            {"tokens_predicted", usage.completion_tokens},
            {"tokens_evaluated", usage.prompt_tokens},
            {"truncated", false},
            {"stop_type", llama_stop_type(finish, stopping_word)},
            {"stopping_word", stopping_word}};
  if (!probs.is_null()) j["completion_probabilities"] = probs;
  for (const auto& [key, value] : extra.items()) j[key] = value;
  return j;
}

json llama_generation_settings(const runtime::SamplingParams& s, int64_t n_predict,
                               bool ignore_eos) {
  json bias = json::array();
  for (const auto& [id, b] : s.logit_bias)
    bias.push_back({id, std::isfinite(b) ? json(b) : json(false)});
  return {{"n_predict", n_predict},
          {"temperature", s.temperature},
          {"top_k", s.top_k},
          {"top_p", s.top_p},
          {"min_p", s.min_p},
          {"seed", s.seed == runtime::kRandomSeed ? json(-1) : json(s.seed)},
          {"repeat_penalty", s.repeat_penalty},
          {"repeat_last_n", s.repeat_last_n},
          {"presence_penalty", s.presence_penalty},
          {"frequency_penalty", s.frequency_penalty},
          {"ignore_eos", ignore_eos},
          {"logit_bias", std::move(bias)}};
}

json llama_request_fields(const std::string& prompt, json settings, const std::string& answer,
                          int64_t positions_held) {
  return {{"prompt", prompt},
          {"generation_settings", std::move(settings)},
          {"has_new_line", answer.find('\n') != std::string::npos},
          {"tokens_cached", positions_held}};
}

json llama_props(const RequestDefaults& defaults, int64_t ctx, const std::string& model,
                 const std::string& model_path, const std::string& build_info) {
  const json params = llama_generation_settings(defaults.sampling, defaults.max_tokens);
  return {{"default_generation_settings", {{"n_ctx", ctx}, {"params", params}}},
          {"total_slots", 1},
          {"model_alias", model},
          {"model_path", model_path},
          {"modalities", {{"vision", false}, {"audio", false}}},
          {"build_info", build_info}};
}

json llama_stream_piece(const std::string& text, const json& probs) {
  json j = {{"index", 0}, {"content", text}, {"tokens", json::array()}, {"id_slot", 0},
            {"stop", false}};
  if (!probs.is_null()) j["completion_probabilities"] = probs;
  return j;
}

}  // namespace ktier::server
