#include "server/llama_api.h"

namespace ktier::server {

using nlohmann::json;

const char* llama_stop_type(FinishReason finish, const std::string& stopping_word) {
  if (finish == FinishReason::kLength) return "limit";
  return stopping_word.empty() ? "eos" : "word";
}

json llama_completion_result(const std::string& model, const std::string& text,
                             FinishReason finish, const std::string& stopping_word,
                             const Usage& usage, const json& extra) {
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
  for (const auto& [key, value] : extra.items()) j[key] = value;
  return j;
}

json llama_stream_piece(const std::string& text) {
  return {{"index", 0}, {"content", text}, {"tokens", json::array()}, {"id_slot", 0},
          {"stop", false}};
}

}  // namespace ktier::server
