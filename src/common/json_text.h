#pragma once
// nlohmann::json ends its input at a NUL byte (as a C string ends), so a JSON file holding a NUL
// followed by anything — a disk's zeroed tail, a damaged copy — parses as the part before it,
// the rest unseen. JSON text never holds a raw NUL (a string writes it \u0000): a file that does
// is not JSON. The readers of ktier's JSON files (config.json, the shard index,
// tokenizer_config.json, a pack's manifest, serve's request bodies) refuse one by this check;
// the safetensors header reader does the same (format/safetensors.cpp).

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace ktier {

// The offset of the first NUL byte of `text`, or none.
inline std::optional<size_t> json_nul_byte(std::string_view text) {
  const size_t at = text.find('\0');
  return at == std::string_view::npos ? std::nullopt : std::optional<size_t>(at);
}

// "holds a NUL byte at byte N (not JSON text)", for the readers' messages; "" when there is none.
inline std::string json_nul_problem(std::string_view text) {
  const std::optional<size_t> at = json_nul_byte(text);
  return at ? "holds a NUL byte at byte " + std::to_string(*at) + " (not JSON text)"
            : std::string();
}

}  // namespace ktier
