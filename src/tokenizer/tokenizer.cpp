// Tokenizer loading, encoding and decoding. See tokenizer.h for the contracts.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <system_error>

#include <nlohmann/json.hpp>

#include "common/check.h"
#include "common/json_text.h"
#include "io/read_file.h"

namespace ktier::tok {
namespace fs = std::filesystem;
namespace {

constexpr uint32_t kDefaultAddedIds = 256;  // K3's num_reserved_special_tokens

// K3's tiktoken.model is a few MB and its tokenizer_config.json a few KB; 64 MiB holds far larger
// vocabularies, and a file past it is not a tokenizer's (exit 3, unread).
constexpr io::SizeLimit kTokenizerFileLimit{uint64_t{64} << 20, &Status::corrupt};

// Reads a whole file. Missing -> usage (exit 2), unreadable -> runtime (exit 1), past
// kTokenizerFileLimit -> corrupt (exit 3).
Result<std::string> read_file(const fs::path& path) {
  KTIER_ASSIGN_OR_RETURN(const bool exists, io::path_exists(path));
  if (!exists) return Status::usage(path.string() + ": file not found");
  return io::read_regular_file(path, kTokenizerFileLimit);
}

// Base64 alphabet values; -1 for other bytes.
struct B64Table {
  int8_t v[256];
  constexpr B64Table() : v() {
    for (int i = 0; i < 256; ++i) v[i] = -1;
    for (int i = 0; i < 26; ++i) {
      v['A' + i] = static_cast<int8_t>(i);
      v['a' + i] = static_cast<int8_t>(26 + i);
    }
    for (int i = 0; i < 10; ++i) v['0' + i] = static_cast<int8_t>(52 + i);
    v[static_cast<int>('+')] = 62;
    v[static_cast<int>('/')] = 63;
  }
};
constexpr B64Table kB64;

// Strict standard base64 with padding (what tiktoken files contain). Returns false on any
// character outside the alphabet, a length not a multiple of 4, misplaced padding, or
// non-zero bits under the padding (non-canonical encodings).
bool b64_decode(std::string_view s, std::string& out) {
  if (s.empty() || s.size() % 4 != 0) return false;
  const size_t pad = s.back() != '=' ? 0 : s[s.size() - 2] == '=' ? 2 : 1;
  out.resize(s.size() / 4 * 3);
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t body = s.size() - pad;  // characters before the padding
  for (size_t i = 0, o = 0; i < s.size(); i += 4, o += 3) {
    int v[4];
    for (int k = 0; k < 4; ++k) v[k] = i + k < body ? kB64.v[p[i + k]] : 0;
    if ((v[0] | v[1] | v[2] | v[3]) < 0) return false;
    const uint32_t w = (static_cast<uint32_t>(v[0]) << 18) | (static_cast<uint32_t>(v[1]) << 12) |
                       (static_cast<uint32_t>(v[2]) << 6) | static_cast<uint32_t>(v[3]);
    out[o] = static_cast<char>(w >> 16);
    out[o + 1] = static_cast<char>((w >> 8) & 0xFF);
    out[o + 2] = static_cast<char>(w & 0xFF);
  }
  // Padding must be "=" or "==" at the end only, and the bits it covers must be zero.
  for (size_t i = 0; i < body; ++i) {
    if (p[i] == '=') return false;
  }
  if (pad == 2 && (kB64.v[p[body - 1]] & 0x0F)) return false;
  if (pad == 1 && (kB64.v[p[body - 1]] & 0x03)) return false;
  out.resize(out.size() - pad);
  return true;
}

// Parses tiktoken.model text into tokens indexed by rank.
Result<std::vector<std::string>> parse_tiktoken(const std::string& text, const std::string& name) {
  std::vector<std::string> tokens;
  std::vector<size_t> line_of;  // line of each rank, for duplicate messages
  std::string bytes;
  size_t line_no = 0;
  // Ranks are unique and cover 0..n-1 over the n lines that hold a token, so a rank can only be
  // valid below n; checking this first keeps a corrupt huge rank (or one past a run of empty
  // lines) from sizing the table. Lines: every "\n" ends one, and a last line may go without;
  // empty ones (or "\r" alone) hold none.
  size_t token_lines = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    const size_t len = eol - pos;
    token_lines += len > 1 || (len == 1 && text[pos] != '\r');
    pos = eol + 1;
  }
  // The shortest valid line is 7 bytes ("AA== 0\n"): a file of short bad lines reserves no more
  // than a valid one of its size would hold.
  tokens.reserve(std::min(token_lines, text.size() / 7 + 1));
  line_of.reserve(std::min(token_lines, text.size() / 7 + 1));
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    auto where = [&] { return name + ":" + std::to_string(line_no) + ": "; };
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos) {
      return Status::corrupt(where() + "expected '<base64> <rank>'");
    }
    const std::string_view b64 = line.substr(0, sp), rank_str = line.substr(sp + 1);
    uint32_t rank = 0;
    const auto [ptr, ec] = std::from_chars(rank_str.data(), rank_str.data() + rank_str.size(), rank);
    if (rank_str.empty() || ec != std::errc() || ptr != rank_str.data() + rank_str.size()) {
      return Status::corrupt(where() + "rank '" + std::string(rank_str) + "' is not a decimal number");
    }
    if (!b64_decode(b64, bytes)) {
      return Status::corrupt(where() + "token '" + std::string(b64) + "' is not valid base64");
    }
    if (rank >= token_lines) {
      return Status::corrupt(where() + "rank " + std::to_string(rank) + " is out of range (the file has " +
                             std::to_string(token_lines) +
                             " token lines, so ranks must lie below that)");
    }
    if (rank >= tokens.size()) {
      tokens.resize(rank + 1);
      line_of.resize(rank + 1, 0);
    }
    if (line_of[rank] != 0) {
      return Status::corrupt(where() + "duplicate rank " + std::to_string(rank) + " (also on line " +
                             std::to_string(line_of[rank]) + ")");
    }
    tokens[rank].assign(bytes);
    line_of[rank] = line_no;
  }
  // n distinct ranks, each below n: they cover 0..n-1.
  for (size_t r = 0; r < tokens.size(); ++r) KTIER_CHECK(line_of[r] != 0);
  if (tokens.empty()) return Status::corrupt(name + ": no tokens");
  return tokens;
}

// Parses tokenizer_config.json's added_tokens_decoder. Sets *n_added per the rule in tokenizer.h.
Status parse_config(const std::string& text, const std::string& name, uint32_t n_ranks,
                    std::vector<AddedToken>& added, uint32_t& n_added) {
  if (const std::string nul = json_nul_problem(text); !nul.empty())
    return Status::corrupt(name + ": not a JSON object: it " + nul);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::corrupt(name + ": not a JSON object");
  const auto it = j.find("added_tokens_decoder");
  if (it == j.end()) {
    n_added = kDefaultAddedIds;
    return Status::ok();
  }
  if (!it->is_object()) return Status::corrupt(name + ": added_tokens_decoder is not an object");
  uint32_t max_id = 0;
  for (const auto& [key, value] : it->items()) {
    const std::string where = name + ": added_tokens_decoder[\"" + key + "\"]: ";
    uint32_t id = 0;
    const auto [ptr, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (key.empty() || ec != std::errc() || ptr != key.data() + key.size()) {
      return Status::corrupt(where + "key is not a decimal id");
    }
    if (!value.is_object() || !value.contains("content") || !value["content"].is_string()) {
      return Status::corrupt(where + "expected an object with a string \"content\"");
    }
    bool special = true;
    if (value.contains("special")) {
      if (!value["special"].is_boolean()) return Status::corrupt(where + "\"special\" is not a boolean");
      special = value["special"].get<bool>();
    }
    if (id < n_ranks) {
      return Status::corrupt(where + "id is inside the rank range 0.." + std::to_string(n_ranks - 1));
    }
    if (id - n_ranks >= kMaxAddedIdsPastRanks)
      return Status::corrupt(where + "id is implausibly large");
    added.push_back({id, value["content"].get<std::string>(), special});
    max_id = std::max(max_id, id);
  }
  n_added = added.empty() ? 0 : max_id - n_ranks + 1;
  return Status::ok();
}

}  // namespace

Result<Tokenizer> Tokenizer::from_parts(std::vector<std::string> tokens_by_rank,
                                        std::vector<AddedToken> added, uint32_t n_added,
                                        SplitPattern pattern) {
  Tokenizer t;
  t.pattern_ = pattern;
  t.ranks_ = RankTable(tokens_by_rank);
  const uint32_t n = t.ranks_.size();
  for (uint32_t r = 0; r < n; ++r) {
    if (tokens_by_rank[r].empty())
      return Status::corrupt("tiktoken.model: rank " + std::to_string(r) + " has an empty token");
  }
  if (const auto dup = t.ranks_.first_duplicate()) {
    return Status::corrupt("tiktoken.model: ranks " + std::to_string(dup->first) + " and " +
                           std::to_string(dup->second) + " have the same bytes");
  }
  for (int b = 0; b < 256; ++b) {
    if (t.ranks_.find(std::string(1, static_cast<char>(b))) == kNoRank) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      return Status::corrupt(std::string("tiktoken.model: the single byte ") + hex +
                             " has no rank (byte-level BPE needs all 256)");
    }
  }
  t.added_.resize(n_added);
  std::vector<bool> named(n_added, false);
  const std::string added_file = "tokenizer_config.json: added token ";
  for (auto& a : added) {
    if (a.id < n || a.id - n >= n_added) {
      return Status::corrupt(added_file + "id " + std::to_string(a.id) +
                             " is outside the added block " + std::to_string(n) + ".." +
                             std::to_string(n + n_added - 1));
    }
    if (named[a.id - n])
      return Status::corrupt(added_file + "id " + std::to_string(a.id) + " is listed twice");
    if (a.content.empty())
      return Status::corrupt(added_file + "id " + std::to_string(a.id) + " has empty content");
    named[a.id - n] = true;
    t.added_[a.id - n] = std::move(a);
  }
  for (uint32_t i = 0; i < n_added; ++i) {
    if (!named[i]) t.added_[i] = {n + i, "<|reserved_token_" + std::to_string(n + i) + "|>", true};
  }
  // Contents must be unique, or "the" id of a marker string would be ambiguous.
  std::vector<uint32_t> order(n_added);
  for (uint32_t i = 0; i < n_added; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return t.added_[a].content < t.added_[b].content;
  });
  for (size_t i = 1; i < order.size(); ++i) {
    if (t.added_[order[i]].content == t.added_[order[i - 1]].content) {
      // An id the file does not list is named <|reserved_token_ID|>: say so, or the message
      // names an id the file does not hold.
      const auto id_of = [&](uint32_t k) {
        return std::to_string(t.added_[k].id) + (named[k] ? "" : " (not listed: its default name)");
      };
      return Status::corrupt("tokenizer_config.json: added tokens " + id_of(order[i - 1]) +
                             " and " + id_of(order[i]) + " have the same content '" +
                             t.added_[order[i]].content + "'");
    }
  }
  t.by_first_byte_.assign(256, {});
  for (uint32_t i = 0; i < n_added; ++i) {
    t.by_first_byte_[static_cast<unsigned char>(t.added_[i].content[0])].push_back(i);
  }
  for (auto& v : t.by_first_byte_) {
    std::stable_sort(v.begin(), v.end(), [&](uint32_t a, uint32_t b) {
      return t.added_[a].content.size() > t.added_[b].content.size();
    });
  }
  return t;
}

Result<Tokenizer> Tokenizer::load(const fs::path& path, SplitPattern pattern) {
  KTIER_ASSIGN_OR_RETURN(const bool exists, io::path_exists(path));
  if (!exists) return Status::usage(path.string() + ": tokenizer path not found");
  std::error_code ec;
  const bool is_dir = fs::is_directory(path, ec);
  const fs::path model = is_dir ? path / "tiktoken.model" : path;
  KTIER_ASSIGN_OR_RETURN(std::string model_text, read_file(model));
  KTIER_ASSIGN_OR_RETURN(std::vector<std::string> tokens, parse_tiktoken(model_text, model.string()));
  std::vector<AddedToken> added;
  uint32_t n_added = 0;
  if (is_dir) {
    const fs::path config = path / "tokenizer_config.json";
    KTIER_ASSIGN_OR_RETURN(std::string config_text, read_file(config));
    KTIER_RETURN_IF_ERROR(parse_config(config_text, config.string(),
                                       static_cast<uint32_t>(tokens.size()), added, n_added));
  }
  auto t = from_parts(std::move(tokens), std::move(added), n_added, pattern);
  if (!t.is_ok()) return t.status().with_context(path.string());
  return t;
}

void Tokenizer::encode_ordinary(std::string_view text, std::vector<uint32_t>& out) const {
  std::vector<std::string_view> pieces;
  split_pieces(text, pattern_, pieces);
  for (const std::string_view p : pieces) bpe_encode(ranks_, p, out);
}

void Tokenizer::encode_chunk(std::string_view chunk, bool allow_special,
                             std::vector<uint32_t>& out) const {
  if (!allow_special || added_.empty()) {
    encode_ordinary(chunk, out);
    return;
  }
  size_t start = 0;  // start of the ordinary text not yet encoded
  for (size_t pos = 0; pos < chunk.size(); ++pos) {
    const auto& cands = by_first_byte_[static_cast<unsigned char>(chunk[pos])];
    for (const uint32_t i : cands) {  // longest first
      const std::string& c = added_[i].content;
      if (chunk.compare(pos, c.size(), c) == 0) {
        encode_ordinary(chunk.substr(start, pos - start), out);
        out.push_back(n_ranks() + i);
        pos += c.size() - 1;
        start = pos + 1;
        break;
      }
    }
  }
  encode_ordinary(chunk.substr(start), out);
}

std::vector<uint32_t> Tokenizer::encode_with_limits(std::string_view text, bool allow_special,
                                                    const ChunkLimits& limits) const {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3 + 1);
  if (pattern_ != SplitPattern::kK3) {
    encode_chunk(text, allow_special, out);
    return out;
  }
  std::vector<std::string_view> chunks;
  chunk_long_input(text, limits, chunks);
  for (const std::string_view c : chunks) encode_chunk(c, allow_special, out);
  return out;
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  return encode_with_limits(text, allow_special, ChunkLimits{});
}

std::optional<std::string_view> Tokenizer::token_bytes(uint32_t id) const {
  if (id < n_ranks()) return ranks_.bytes(id);
  if (id < vocab_size()) return std::string_view(added_[id - n_ranks()].content);
  return std::nullopt;
}

std::optional<uint32_t> Tokenizer::added_token_id(std::string_view content) const {
  if (content.empty()) return std::nullopt;
  for (const uint32_t i : by_first_byte_[static_cast<unsigned char>(content[0])]) {
    if (added_[i].content == content) return n_ranks() + i;
  }
  return std::nullopt;
}

Result<std::string> Tokenizer::decode(std::span<const uint32_t> ids, bool skip_special) const {
  std::string out;
  for (const uint32_t id : ids) {
    const auto b = token_bytes(id);
    if (!b) {
      return Status::usage("token id " + std::to_string(id) + " is out of range (the vocabulary has " +
                           std::to_string(vocab_size()) + " ids)");
    }
    if (skip_special && is_special(id)) continue;
    out += *b;
  }
  return out;
}

size_t incomplete_utf8_suffix(std::string_view bytes) {
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto lead = static_cast<unsigned char>(bytes[n - back]);
    if ((lead & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = 0;
    if (lead >= 0xC2 && lead <= 0xDF) need = 2;
    else if (lead >= 0xE0 && lead <= 0xEF) need = 3;
    else if (lead >= 0xF0 && lead <= 0xF4) need = 4;
    if (need <= back) return 0;  // ASCII, invalid lead, or a complete sequence
    if (back >= 2) {  // the second byte's range depends on the lead (Unicode Table 3-7)
      const auto b1 = static_cast<unsigned char>(bytes[n - back + 1]);
      const unsigned lo = lead == 0xE0 ? 0xA0 : lead == 0xF0 ? 0x90 : 0x80;
      const unsigned hi = lead == 0xED ? 0x9F : lead == 0xF4 ? 0x8F : 0xBF;
      if (b1 < lo || b1 > hi) return 0;
    }
    return back;
  }
  return 0;
}

Result<std::string> StreamingDecoder::push(uint32_t id) {
  const auto b = tok_->token_bytes(id);
  if (!b) {
    return Status::usage("token id " + std::to_string(id) + " is out of range (the vocabulary has " +
                         std::to_string(tok_->vocab_size()) + " ids)");
  }
  pending_ += *b;
  const size_t hold = incomplete_utf8_suffix(pending_);
  std::string ready = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return ready;
}

bool shown_as_text(const Tokenizer& tok, std::span<const int32_t> stop_ids, int32_t id,
                   bool show_special) {
  if (id < 0 || static_cast<uint32_t>(id) >= tok.vocab_size()) return false;
  if (std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end()) return false;
  return show_special || !tok.is_special(static_cast<uint32_t>(id));
}

std::string StreamingDecoder::flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

}  // namespace ktier::tok
