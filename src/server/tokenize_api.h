#pragma once
// llama-server's POST /tokenize and POST /detokenize for `ktier serve`: clients count a
// prompt's tokens, or read ids back as text, with the server's own tokenizer.
//
//   /tokenize   {"content": TEXT, "parse_special": true, "with_pieces": false,
//                "add_special": false}
//            -> {"tokens": [ID, ...]}, or with pieces [{"id": ID, "piece": TEXT}, ...] (a piece
//               that is not valid UTF-8 by itself is its bytes, [N, ...], as llama-server does)
//   /detokenize {"tokens": [ID, ...]} -> {"content": TEXT} (valid UTF-8, as answers are)
//
// parse_special defaults to true, as llama-server's: a completion's prompt is encoded so (its
// special-token names are their ids), so the count is the one such a request would run; false
// encodes them as text, as a chat message's content is. add_special true (a BOS) is refused:
// ktier puts no BOS before a prompt (K3-MODEL.md D10).
// Errors: Status::usage naming the field (field_error), for a 400.
// Thread-safety: pure functions.

#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "tokenizer/tokenizer.h"

namespace ktier::server {

Result<nlohmann::json> tokenize_response(const tok::Tokenizer& tokenizer, std::string_view body);
Result<nlohmann::json> detokenize_response(const tok::Tokenizer& tokenizer,
                                           std::string_view body);

}  // namespace ktier::server
