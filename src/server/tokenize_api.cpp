#include "server/tokenize_api.h"

#include <cstdint>
#include <string>
#include <vector>

#include "server/openai_api.h"
#include "server/service.h"

namespace ktier::server {

using nlohmann::json;

Result<json> tokenize_response(const tok::Tokenizer& tokenizer, std::string_view body) {
  KTIER_ASSIGN_OR_RETURN(const json j, parse_body_object(body));
  const auto content = j.find("content");
  if (content == j.end() || !content->is_string())
    return field_error("content", "must be a string (the text to tokenize)");
  KTIER_ASSIGN_OR_RETURN(const bool parse_special, bool_field(j, "parse_special", true));
  KTIER_ASSIGN_OR_RETURN(const bool with_pieces, bool_field(j, "with_pieces", false));
  KTIER_ASSIGN_OR_RETURN(const bool add_special, bool_field(j, "add_special", false));
  if (add_special)
    return field_error("add_special", "ktier puts no BOS before a prompt (K3-MODEL.md D10)");
  const std::vector<uint32_t> ids =
      tokenizer.encode(content->get_ref<const std::string&>(), parse_special);
  json tokens = json::array();
  for (const uint32_t id : ids) {
    if (!with_pieces) {
      tokens.push_back(id);
      continue;
    }
    const uint32_t one[1] = {id};
    KTIER_ASSIGN_OR_RETURN(const std::string piece, tokenizer.decode(one));
    if (valid_utf8(piece) == piece) {
      tokens.push_back({{"id", id}, {"piece", piece}});
    } else {
      json bytes = json::array();
      for (const char c : piece) bytes.push_back(static_cast<uint8_t>(c));
      tokens.push_back({{"id", id}, {"piece", bytes}});
    }
  }
  return json{{"tokens", tokens}};
}

Result<json> detokenize_response(const tok::Tokenizer& tokenizer, std::string_view body) {
  KTIER_ASSIGN_OR_RETURN(const json j, parse_body_object(body));
  const auto tokens = j.find("tokens");
  if (tokens == j.end() || !tokens->is_array())
    return field_error("tokens", "must be an array of token ids");
  std::vector<uint32_t> ids;
  ids.reserve(tokens->size());
  for (size_t i = 0; i < tokens->size(); ++i) {
    const json& t = (*tokens)[i];
    const std::string field = "tokens[" + std::to_string(i) + "]";
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<uint64_t>() >= tokenizer.vocab_size())
      return field_error(field, "must be a token id in 0.." +
                                    std::to_string(tokenizer.vocab_size() - 1));
    ids.push_back(t.get<uint32_t>());
  }
  KTIER_ASSIGN_OR_RETURN(const std::string text, tokenizer.decode(ids));
  return json{{"content", valid_utf8(text)}};
}

}  // namespace ktier::server
