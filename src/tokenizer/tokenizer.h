#pragma once
// The K3 tokenizer: tiktoken ranks + added (special) tokens + a split pattern
// (docs: K3-MODEL §8). Loading validates everything and reports problems as Status; encode and
// decode never throw (allocation failure aside).
//
// Vocabulary layout: ids 0..n_ranks-1 are the ranks of tiktoken.model; ids
// n_ranks..vocab_size-1 are added tokens. Rule for the number of added ids: if
// tokenizer_config.json has a non-empty "added_tokens_decoder", the added block runs from
// n_ranks up to its largest id (K3: 163584..163839, 256 ids; a synthetic vocabulary may have
// fewer, o200k's exported config gives 199998..200018); an id in the block without an entry is
// named "<|reserved_token_{id}|>". Without "added_tokens_decoder" the block is K3's default of
// 256 reserved ids; an empty object means no added ids. Loading from a bare tiktoken file
// (no config) gives no added ids.
//
// Encoding (encode): [K3 only] long-input chunking as the reference wrapper does it
// (pretokenize.h ChunkLimits), then — when special tokens are allowed — splitting at added-token
// strings (earliest occurrence; at one position the longest string), then the split pattern,
// then BPE per piece. Not allowed (the default) means marker strings are ordinary text.
// o200k mode skips the chunking: it mirrors plain tiktoken, for the cross-check.
//
// A loaded Tokenizer is immutable: encode/decode are const and safe to call from several
// threads at once. Throughput is about 5-6 MB/s per core on mixed multilingual text.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenize.h"

namespace ktier::tok {

// An added token's id is below ranks + this (K3: 163,840 - 163,584 = 256 past them); a larger
// one is corrupt ("implausibly large"): the added-token table is sized by the largest id.
inline constexpr uint32_t kMaxAddedIdsPastRanks = 1u << 20;

struct AddedToken {
  uint32_t id;
  std::string content;
  bool special = true;  // the config's flag; only decode(skip_special) looks at it
};

class Tokenizer {
 public:
  // `path` is a directory holding tiktoken.model and tokenizer_config.json (both required), or
  // a tiktoken.model file on its own (no added tokens; used by the cross-check).
  // Errors: missing file -> usage (exit 2) naming the path; malformed content -> corrupt
  // (exit 3) naming the file and, where there is one, the line.
  static Result<Tokenizer> load(const std::filesystem::path& path,
                                SplitPattern pattern = SplitPattern::kK3);

  // Builds from memory (tests, synthetic vocabularies). Validates like load(): unique
  // non-empty tokens, all 256 single bytes present, added ids >= tokens.size(), unique
  // non-empty contents. `n_added` is the size of the added block (ids without an entry get
  // reserved names); it must cover every added id.
  static Result<Tokenizer> from_parts(std::vector<std::string> tokens_by_rank,
                                      std::vector<AddedToken> added, uint32_t n_added,
                                      SplitPattern pattern = SplitPattern::kK3);

  std::vector<uint32_t> encode(std::string_view text, bool allow_special = false) const;
  // As encode(), with explicit long-input limits (K3 only; tests and the cross-check).
  std::vector<uint32_t> encode_with_limits(std::string_view text, bool allow_special,
                                           const ChunkLimits& limits) const;
  // Ids of text with no special-token handling and no chunking (split + BPE only).
  void encode_ordinary(std::string_view text, std::vector<uint32_t>& out) const;

  // Concatenated bytes of the ids (added ids give their content). An id >= vocab_size() is a
  // usage error naming it. skip_special drops added tokens whose "special" flag is set.
  Result<std::string> decode(std::span<const uint32_t> ids, bool skip_special = false) const;

  // Bytes of one id, or nullopt if out of range.
  std::optional<std::string_view> token_bytes(uint32_t id) const;
  // Id of an added token by content, e.g. "<|end_of_msg|>".
  std::optional<uint32_t> added_token_id(std::string_view content) const;
  bool is_added(uint32_t id) const { return id >= n_ranks() && id < vocab_size(); }
  // An added token whose config flag "special" is set (what decode(skip_special) drops).
  bool is_special(uint32_t id) const { return is_added(id) && added_[id - n_ranks()].special; }

  uint32_t n_ranks() const { return ranks_.size(); }
  uint32_t vocab_size() const { return n_ranks() + static_cast<uint32_t>(added_.size()); }
  SplitPattern pattern() const { return pattern_; }

 private:
  Tokenizer() = default;
  void encode_chunk(std::string_view chunk, bool allow_special, std::vector<uint32_t>& out) const;

  RankTable ranks_;
  std::vector<AddedToken> added_;  // index = id - n_ranks; every slot named
  // Added-token indices by first byte, longest content first (special-token matching).
  std::vector<std::vector<uint32_t>> by_first_byte_;
  SplitPattern pattern_ = SplitPattern::kK3;
};

// Incremental decoding for streaming output. push() returns the bytes that are safe to show:
// everything except a trailing *incomplete but still valid* UTF-8 sequence, which is held back
// until the ids completing it arrive. Bytes that can never become valid UTF-8 are passed
// through at once (raw, not replaced), so the stream never stalls and, for any id sequence,
// concat(push outputs) + flush() == decode(ids) byte for byte. flush() returns any held-back
// bytes raw (a truncated sequence at the end of generation); callers that need valid UTF-8
// for display replace them themselves.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer) : tok_(&tokenizer) {}
  Result<std::string> push(uint32_t id);
  std::string flush();
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  std::string pending_;
};

// Whether a generated id is shown as the answer's text: not one of `stop_ids` (what ends the
// answer is not part of it), an id of `tok` (a model may have more), and, unless
// `show_special`, not a special one (markup). The filter of `run`'s stream and `serve`'s text.
bool shown_as_text(const Tokenizer& tok, std::span<const int32_t> stop_ids, int32_t id,
                   bool show_special = false);

// Length of the longest suffix of `bytes` (at most 3) that is an incomplete but valid prefix
// of a UTF-8 sequence; 0 if the bytes end on a boundary or in bytes that can never complete.
size_t incomplete_utf8_suffix(std::string_view bytes);

}  // namespace ktier::tok
