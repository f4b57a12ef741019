#pragma once
// Tokenizer files of a synthetic checkpoint: `tiktoken.model` and `tokenizer_config.json`, in
// the released formats (K3-MODEL.md §8.2, §8.3), over a small byte-level BPE vocabulary.
//
// Id layout rule (V = vocab_size, A = added tokens, R = ranks):
//
//   [0, 256)        rank b is the single byte b (so every byte string is encodable)
//   [256, R)        BPE merges learned over sample_text(), in learning order (a merge's rank is
//                   higher than the ranks of its two parts, as tiktoken requires);
//                   R = min(256 + merges learned, V − A)
//   [R, V − A)      unused: embedding and lm_head rows exist, but no text encodes to these ids
//                   and they are in neither file. Empty for tiny and demo (V = R + A); for
//                   k3-slice V = 163840 and A = 256 like K3, so ids R..163583 are unused and the
//                   added ids sit exactly at K3's ids 163584..163839.
//   [V − A, V)      added tokens, all listed in added_tokens_decoder. With A = 256 each has K3's
//                   name at K3's offset: +0 [BOS], +1 [EOS], +2 <|end_of_msg|>, +3 <|open|>,
//                   +4 <|close|>, +5 <|sep|>, +6 [start_header_id], +7 [end_header_id], +9 [EOT],
//                   +18..+21 <|media_begin|> <|media_content|> <|media_end|> <|media_pad|>,
//                   +254 [UNK], +255 [PAD], every other id <|reserved_token_{id}|>. With A < 256
//                   (tiny: 16) the offsets below A − 2 keep their K3 names and the last two are
//                   [UNK], [PAD], mirroring K3 where they close the table. A ≥ 8.
//
// config.json points at them as K3 does: bos = [BOS], eos = <|end_of_msg|> (decision D3; the
// tokenizer_config.json eos_token is "[EOS]" as in the release), pad = [PAD].
// `special` flags follow K3: false for <|open|>, <|close|>, <|sep|>, true for the rest.
//
// Learning is deterministic (ties broken by the lower pair of ids). Pre-tokenisation for
// learning and for encode_ordinary() is a simplified ASCII version of the Kimi split pattern
// (§8.4: letters with one optional leading non-letter, 1-3 digits, punctuation runs, whitespace
// rules); the engine's tokenizer uses the real pattern, which may split some text differently,
// but any byte string still encodes, because all 256 single bytes are ranks.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace ktier::synth {

struct AddedToken {
  std::string content;
  bool special = true;
};

struct SynthVocab {
  std::vector<std::string> ranks;  // ranks[i] = raw bytes of token i, i < R
  int64_t vocab_size = 0;          // V
  int64_t added_begin = 0;         // V − A; added[j] has id added_begin + j
  std::vector<AddedToken> added;
  int64_t merges_learned = 0;      // before truncation to V − A
  int64_t bos_id = 0, eos_id = 0, pad_id = 0, unk_id = 0;
};

// Learns up to `merges` merges and lays out ids as above. Usage error if V < 256 + A or A < 8.
Result<SynthVocab> build_vocab(int64_t merges, int64_t added_tokens, int64_t vocab_size);

// `tiktoken.model`: one line "<base64 of bytes> <rank>\n" per rank, ranks ascending.
std::string tiktoken_model_text(const SynthVocab& vocab);
// `tokenizer_config.json` (added_tokens_decoder, bos/eos/pad/unk token strings, class name).
std::string tokenizer_config_json(const SynthVocab& vocab);

// Encodes text without specials with the vocabulary's ranks (tiktoken merge rule: repeatedly
// merge the adjacent pair whose concatenation has the lowest rank). For the routing measurement and
// tests; the engine has its own tokenizer.
std::vector<int64_t> encode_ordinary(const SynthVocab& vocab, std::string_view text);

// Splits text into pre-tokenisation pieces (see above); concatenated they give back the text.
std::vector<std::string_view> split_pieces(std::string_view text);

std::string base64_encode(std::string_view bytes);

std::string_view sample_text();    // the learning corpus (sample_text.cpp)
std::string_view sample_prompt();  // the routing-measurement prompt

}  // namespace ktier::synth
