#pragma once
// nlohmann::json ends its input at a NUL byte (as a C string ends), so a JSON file holding a NUL
// followed by anything — a disk's zeroed tail, a damaged copy — parses as the part before it,
// the rest unseen. JSON text never holds a raw NUL (a string writes it \u0000): a file that does
// is not JSON. The readers of ktier's JSON files (safetensors headers, config.json, the shard
// index, tokenizer_config.json, a pack's manifest, serve's request bodies) refuse one by this
// check.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

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

// nlohmann::json::parse of `text` without exceptions (is_discarded() when it is not JSON) that
// builds no value nested deeper than `max_depth` (a value in the top object or array is at
// depth 1) and sets *too_deep when the text has one: copying, comparing or dumping a deep value
// recurses once per level, so a small file of brackets would overflow a thread's stack. The
// parser itself keeps no recursion. A caller refuses the text when *too_deep.
inline nlohmann::json parse_json_depth_bounded(std::string_view text, int max_depth,
                                               bool* too_deep) {
  *too_deep = false;
  return nlohmann::json::parse(
      text,
      [max_depth, too_deep](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
        if (depth <= max_depth) return true;
        *too_deep = true;
        return false;
      },
      /*allow_exceptions=*/false);
}

// A JSON document ktier writes (a --json file, a report, inspect's output): indented, newline
// ended, and a string that is not UTF-8 — a path: Linux names are bytes — written with U+FFFD
// where the library's default would throw and lose the whole document.
template <typename BasicJson>
std::string json_output_text(const BasicJson& j) {
  return j.dump(2, ' ', false, BasicJson::error_handler_t::replace) + "\n";
}

}  // namespace ktier
