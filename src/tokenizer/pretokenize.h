#pragma once
// Pre-tokenization: splitting text into the pieces that BPE encodes one by one
// (docs: K3-MODEL §8.4 step 2). A hand-written matcher, not a regex engine, that reproduces
// what a backtracking engine (tiktoken's fancy-regex) returns for two patterns:
//
//   kK3    the Kimi K3 pat_str (tokenization_kimi.py):
//            [\p{Han}]+
//          | [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*
//              [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//          | [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+
//              [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//          | \p{N}{1,3} | ␠?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
//   kO200k OpenAI's o200k_base pat_str: the same without the Han alternative, with Han inside
//          the letter classes, and with [\r\n/]* (slash included) after the symbol run.
//
// Semantics (contract):
//  * Alternatives are tried in order at each position and the first that matches wins
//    (leftmost-first), with greedy quantifiers and backtracking inside an alternative.
//    Every code point starts a match of some alternative, so the pieces tile the input.
//  * Classes come from unicode_tables (Unicode version: kUnicodeVersion). \s is the Unicode
//    White_Space property, as in Rust's regex crate; (?i:…) uses simple case folding, so
//    "'ſ" (U+017F) matches like "'s" (the only non-ASCII fold onto these letters).
//  * Input is bytes. Malformed UTF-8 is decoded per unicode.h: each offending byte is one
//    unit with no class bits, i.e. it behaves like a symbol (U+FFFD is a symbol too), and
//    stays in the piece byte for byte, so pieces always concatenate back to the input.
//  * Lookahead (?!\S) sees the end of `text` as "no character": callers that split the input
//    (special tokens, long-input chunks) get tiktoken's behaviour at those boundaries.
// No exceptions; no allocation beyond the output vector and one scratch buffer.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace ktier::tok {

enum class SplitPattern { kK3, kO200k };

// "k3" / "o200k".
std::string_view pattern_name(SplitPattern p);
// Parses "k3" or "o200k"; usage error otherwise.
Result<SplitPattern> parse_pattern(std::string_view name);

// Appends the pieces of `text` to `out` in order (views into `text`).
void split_pieces(std::string_view text, SplitPattern pattern, std::vector<std::string_view>& out);

// Long-input chunking of the K3 reference (tokenization_kimi.py, K3-MODEL §8.4 step 4),
// applied before special-token splitting: the text is cut every `max_chunk_chars` code points,
// then each chunk is cut so that no piece holds a run of more than `max_run_chars` consecutive
// "space" or "non-space" code points (Python str.isspace(): class bit kCpPYSPACE). A run
// that reaches max_run_chars + 1 is cut before that code point and counting restarts at 1,
// exactly as _split_whitespaces_or_nonwhitespaces does. An invalid UTF-8 byte counts as one
// non-space code point. 0 disables a limit. Appends non-empty views into `text` to `out`
// (nothing for empty text).
struct ChunkLimits {
  size_t max_chunk_chars = 400000;
  size_t max_run_chars = 25000;
};
void chunk_long_input(std::string_view text, const ChunkLimits& limits,
                      std::vector<std::string_view>& out);

}  // namespace ktier::tok
