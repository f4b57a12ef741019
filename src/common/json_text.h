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

// Why `text` is not JSON, in the parser's words ("parse error at line 1, column 9: syntax error
// while parsing value - invalid string: ill-formed UTF-8 byte"), for a reader's message once
// parse_json_depth_bounded has discarded it: parsed again building nothing, without the
// library's "[json.exception...]" tag and its "last read" quote (which holds the token so far:
// a whole unterminated string), at most 200 bytes. "" where the parser has no account.
inline std::string json_syntax_error(std::string_view text) {
  std::string why;
  try {
    [[maybe_unused]] const nlohmann::json none = nlohmann::json::parse(
        text, [](int, nlohmann::json::parse_event_t, nlohmann::json&) { return false; });
  } catch (const nlohmann::json::parse_error& e) {
    why = e.what();
    if (const size_t tag = why.find("] "); why.rfind("[json.exception", 0) == 0 &&
                                           tag != std::string::npos)
      why.erase(0, tag + 2);
    if (const size_t read = why.find("; last read:"); read != std::string::npos)
      why.erase(read);
    constexpr size_t kMaxWhy = 200;
    if (why.size() > kMaxWhy) why = why.substr(0, kMaxWhy) + "...";
  } catch (const nlohmann::json::exception&) {
  }
  return why;
}

// A JSON document ktier writes (a --json file, a report, inspect's output): indented, newline
// ended, and a string that is not UTF-8 — a path: Linux names are bytes — written with U+FFFD
// where the library's default would throw and lose the whole document.
template <typename BasicJson>
std::string json_output_text(const BasicJson& j) {
  return j.dump(2, ' ', false, BasicJson::error_handler_t::replace) + "\n";
}

}  // namespace ktier
