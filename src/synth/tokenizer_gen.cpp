#include "synth/tokenizer_gen.h"

#include <algorithm>
#include <limits>
#include <map>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace ktier::synth {
namespace {

// ASCII classes; bytes >= 0x80 (UTF-8 sequences) count as letters so words stay together.
bool is_letter(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_newline(unsigned char c) { return c == '\r' || c == '\n'; }
bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\v' || c == '\f' || is_newline(c); }
unsigned char lower(unsigned char c) { return (c >= 'A' && c <= 'Z') ? static_cast<unsigned char>(c + 32) : c; }

using Text = std::string_view;

// Each matcher returns the length of its match at p (0 = no match), mirroring one alternative of
// the Kimi pattern (K3-MODEL.md §8.4), tried in the same order.
size_t match_letters(Text t, size_t p) {  // [^\r\n\p{L}\p{N}]?\p{L}+(contraction)?
  size_t q = p;
  const auto c = static_cast<unsigned char>(t[q]);
  if (!is_letter(c) && !is_digit(c) && !is_newline(c) && q + 1 < t.size() &&
      is_letter(static_cast<unsigned char>(t[q + 1])))
    ++q;
  if (!is_letter(static_cast<unsigned char>(t[q]))) return 0;
  while (q < t.size() && is_letter(static_cast<unsigned char>(t[q]))) ++q;
  if (q + 1 < t.size() && t[q] == '\'') {
    const unsigned char a = lower(t[q + 1]);
    const unsigned char b = q + 2 < t.size() ? lower(t[q + 2]) : 0;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return q + 3 - p;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return q + 2 - p;
  }
  return q - p;
}

size_t match_digits(Text t, size_t p) {  // \p{N}{1,3}
  size_t q = p;
  while (q < t.size() && q - p < 3 && is_digit(static_cast<unsigned char>(t[q]))) ++q;
  return q - p;
}

size_t match_punct(Text t, size_t p) {  // ␠?[^\s\p{L}\p{N}]+[\r\n]*
  size_t q = p;
  if (t[q] == ' ') ++q;
  const size_t start = q;
  while (q < t.size()) {
    const auto c = static_cast<unsigned char>(t[q]);
    if (is_space(c) || is_letter(c) || is_digit(c)) break;
    ++q;
  }
  if (q == start) return 0;
  while (q < t.size() && is_newline(static_cast<unsigned char>(t[q]))) ++q;
  return q - p;
}

size_t space_run_end(Text t, size_t p) {
  size_t r = p;
  while (r < t.size() && is_space(static_cast<unsigned char>(t[r]))) ++r;
  return r;
}

size_t match_whitespace(Text t, size_t p) {
  const size_t r = space_run_end(t, p);
  if (r == p) return 0;
  for (size_t i = r; i > p; --i)  // \s*[\r\n]+ : through the last newline of the run
    if (is_newline(static_cast<unsigned char>(t[i - 1]))) return i - p;
  if (r == t.size()) return r - p;      // \s+(?!\S) at the end of the text
  if (r - p >= 2) return r - p - 1;     // \s+(?!\S): leave one space for the next word
  return 1;                             // \s+
}

std::string added_name(int64_t offset, int64_t added_count, int64_t id) {
  if (offset == added_count - 1) return "[PAD]";
  if (offset == added_count - 2) return "[UNK]";
  switch (offset) {
    case 0: return "[BOS]";
    case 1: return "[EOS]";
    case 2: return "<|end_of_msg|>";
    case 3: return "<|open|>";
    case 4: return "<|close|>";
    case 5: return "<|sep|>";
    case 6: return "[start_header_id]";
    case 7: return "[end_header_id]";
    case 9: return "[EOT]";
    case 18: return "<|media_begin|>";
    case 19: return "<|media_content|>";
    case 20: return "<|media_end|>";
    case 21: return "<|media_pad|>";
    default: return "<|reserved_token_" + std::to_string(id) + "|>";
  }
}

// Learns up to `merges` BPE merges over sample_text(); returns the token byte strings (256
// single bytes first) and how many merges were learned.
std::vector<std::string> learn_ranks(int64_t merges, int64_t* learned_out) {
  std::map<std::string, int64_t> piece_counts;  // ordered: deterministic word order
  for (Text piece : split_pieces(sample_text())) ++piece_counts[std::string(piece)];
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> freq;
  for (const auto& [piece, n] : piece_counts) {
    std::vector<int32_t> syms;
    for (unsigned char c : piece) syms.push_back(c);
    words.push_back(std::move(syms));
    freq.push_back(n);
  }
  std::vector<std::string> tokens;
  std::unordered_map<std::string, int32_t> id_of;
  for (int b = 0; b < 256; ++b) {
    tokens.emplace_back(1, static_cast<char>(b));
    id_of.emplace(tokens.back(), b);
  }
  int64_t learned = 0;
  std::unordered_map<uint64_t, int64_t> pair_count;
  while (learned < merges) {
    pair_count.clear();
    for (size_t w = 0; w < words.size(); ++w)
      for (size_t i = 0; i + 1 < words[w].size(); ++i)
        pair_count[(static_cast<uint64_t>(words[w][i]) << 32) | static_cast<uint32_t>(words[w][i + 1])] += freq[w];
    if (pair_count.empty()) break;  // every piece is a single token: the text is exhausted
    uint64_t best = 0;
    int64_t best_count = 0;
    for (const auto& [pair, n] : pair_count)
      if (n > best_count || (n == best_count && pair < best)) {
        best = pair;
        best_count = n;
      }
    const auto a = static_cast<int32_t>(best >> 32);
    const auto b = static_cast<int32_t>(best & 0xffffffffu);
    std::string joined = tokens[a] + tokens[b];
    int32_t id;
    if (auto it = id_of.find(joined); it != id_of.end()) {
      id = it->second;  // same bytes reached through another split: no new rank
    } else {
      id = static_cast<int32_t>(tokens.size());
      id_of.emplace(joined, id);
      tokens.push_back(std::move(joined));
      ++learned;
    }
    for (auto& syms : words) {
      size_t out = 0;
      for (size_t i = 0; i < syms.size(); ++i) {
        if (i + 1 < syms.size() && syms[i] == a && syms[i + 1] == b) {
          syms[out++] = id;
          ++i;
        } else {
          syms[out++] = syms[i];
        }
      }
      syms.resize(out);
    }
  }
  *learned_out = learned;
  return tokens;
}

}  // namespace

std::vector<std::string_view> split_pieces(std::string_view t) {
  std::vector<std::string_view> out;
  size_t p = 0;
  while (p < t.size()) {
    size_t n = match_letters(t, p);
    if (n == 0) n = match_digits(t, p);
    if (n == 0) n = match_punct(t, p);
    if (n == 0) n = match_whitespace(t, p);
    if (n == 0) n = 1;  // unreachable with the classes above; keeps the loop total
    out.push_back(t.substr(p, n));
    p += n;
  }
  return out;
}

std::string base64_encode(std::string_view bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (static_cast<uint8_t>(bytes[i]) << 16) | (static_cast<uint8_t>(bytes[i + 1]) << 8) |
                       static_cast<uint8_t>(bytes[i + 2]);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i + 1 == bytes.size()) {
    const uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == bytes.size()) {
    const uint32_t v = (static_cast<uint8_t>(bytes[i]) << 16) | (static_cast<uint8_t>(bytes[i + 1]) << 8);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

Result<SynthVocab> build_vocab(int64_t merges, int64_t added_tokens, int64_t vocab_size) {
  if (added_tokens < 8)
    return Status::usage("the synthetic vocabulary needs at least 8 added ids (got " +
                         std::to_string(added_tokens) + ")");
  if (vocab_size < 256 + added_tokens)
    return Status::usage("vocabulary of " + std::to_string(vocab_size) + " ids cannot hold 256 byte "
                         "tokens and " + std::to_string(added_tokens) + " added ids");
  SynthVocab v;
  v.vocab_size = vocab_size;
  v.added_begin = vocab_size - added_tokens;
  v.ranks = learn_ranks(std::max<int64_t>(0, merges), &v.merges_learned);
  if (static_cast<int64_t>(v.ranks.size()) > v.added_begin) v.ranks.resize(v.added_begin);
  for (int64_t j = 0; j < added_tokens; ++j) {
    AddedToken t;
    t.content = added_name(j, added_tokens, v.added_begin + j);
    t.special = !(j == 3 || j == 4 || j == 5);  // <|open|>, <|close|>, <|sep|> are not special
    v.added.push_back(std::move(t));
  }
  v.bos_id = v.added_begin;
  v.eos_id = v.added_begin + 2;
  v.unk_id = vocab_size - 2;
  v.pad_id = vocab_size - 1;
  return v;
}

std::string tiktoken_model_text(const SynthVocab& vocab) {
  std::string out;
  for (size_t i = 0; i < vocab.ranks.size(); ++i) {
    out += base64_encode(vocab.ranks[i]);
    out += ' ';
    out += std::to_string(i);
    out += '\n';
  }
  return out;
}

std::string tokenizer_config_json(const SynthVocab& vocab) {
  nlohmann::json decoder = nlohmann::json::object();
  for (size_t j = 0; j < vocab.added.size(); ++j) {
    const AddedToken& t = vocab.added[j];
    decoder[std::to_string(vocab.added_begin + static_cast<int64_t>(j))] = {
        {"content", t.content}, {"lstrip", false},       {"normalized", false},
        {"rstrip", false},      {"single_word", false}, {"special", t.special}};
  }
  const auto name = [&](int64_t id) { return vocab.added[id - vocab.added_begin].content; };
  nlohmann::json cfg = {
      {"added_tokens_decoder", decoder},
      {"bos_token", name(vocab.bos_id)},
      {"eos_token", name(vocab.bos_id + 1)},  // "[EOS]", as in the release (decision D3)
      {"pad_token", name(vocab.pad_id)},
      {"unk_token", name(vocab.unk_id)},
      {"clean_up_tokenization_spaces", false},
      {"model_max_length", 1048576},
      {"tokenizer_class", "TikTokenTokenizer"},
  };
  return cfg.dump(2) + "\n";
}

std::vector<int64_t> encode_ordinary(const SynthVocab& vocab, std::string_view text) {
  std::unordered_map<std::string_view, int64_t> rank_of;
  for (size_t i = 0; i < vocab.ranks.size(); ++i) rank_of.emplace(vocab.ranks[i], static_cast<int64_t>(i));
  std::vector<int64_t> ids;
  for (std::string_view piece : split_pieces(text)) {
    if (auto it = rank_of.find(piece); it != rank_of.end()) {
      ids.push_back(it->second);
      continue;
    }
    // parts[k] = [start, end) byte ranges of the piece; merge the lowest-ranked adjacent pair.
    std::vector<std::pair<size_t, size_t>> parts;
    for (size_t i = 0; i < piece.size(); ++i) parts.emplace_back(i, i + 1);
    for (;;) {
      int64_t best_rank = std::numeric_limits<int64_t>::max();
      size_t best = 0;
      for (size_t k = 0; k + 1 < parts.size(); ++k) {
        auto it = rank_of.find(piece.substr(parts[k].first, parts[k + 1].second - parts[k].first));
        if (it != rank_of.end() && it->second < best_rank) {
          best_rank = it->second;
          best = k;
        }
      }
      if (best_rank == std::numeric_limits<int64_t>::max()) break;
      parts[best].second = parts[best + 1].second;
      parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
    for (const auto& [b, e] : parts) ids.push_back(rank_of.at(piece.substr(b, e - b)));
  }
  return ids;
}

}  // namespace ktier::synth
