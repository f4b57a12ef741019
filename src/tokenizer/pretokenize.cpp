// The split-pattern matcher. See pretokenize.h for the patterns and the contract.
//
// The text is decoded once into a vector of units (byte offset + pattern-level class mask);
// each alternative is then a small function over unit indices that returns the end of its
// match or kNoMatch. The functions mirror the backtracking order of the regex exactly:
// greedy loops first, then giving characters back one at a time. All scans are bounded by
// the run they examine, and a failed alternative only rescans the run that the winning
// alternative then consumes (or leaves to the next piece), so splitting is linear in practice.
#include "tokenizer/pretokenize.h"

#include "tokenizer/unicode.h"

namespace ktier::tok {
namespace {

// Pattern-level classes of one unit, computed once per unit for the active pattern.
enum : uint16_t {
  kPre = 1 << 0,    // [^\r\n\p{L}\p{N}]       (the optional prefix of alternatives 2/3)
  kUp = 1 << 1,     // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] (minus Han for K3)
  kLow = 1 << 2,    // [\p{Ll}\p{Lm}\p{Lo}\p{M}]       (minus Han for K3)
  kNum = 1 << 3,    // \p{N}
  kSpace = 1 << 4,  // \s  (White_Space)
  kSym = 1 << 5,    // [^\s\p{L}\p{N}]
  kHan = 1 << 6,    // \p{Han} (only set for K3: o200k has no Han alternative)
  kNl = 1 << 7,     // [\r\n]
  kTail = 1 << 8,   // the class after a symbol run: [\r\n] (K3) or [\r\n/] (o200k)
};

struct Unit {
  uint32_t off;  // byte offset of the unit in the text
  uint32_t cp;   // code point or kInvalidCp
  uint16_t cls;
};

constexpr size_t kNoMatch = static_cast<size_t>(-1);

uint16_t classify(uint32_t cp, bool k3) {
  const uint16_t b = cp_bits(cp);
  const bool letter = (b & (kCpLu | kCpLl | kCpLt | kCpLm | kCpLo)) != 0;
  const bool num = (b & kCpN) != 0;
  const bool space = (b & kCpWS) != 0;
  const bool han = k3 && (b & kCpHAN) != 0;
  const bool nl = cp == '\r' || cp == '\n';
  uint16_t c = 0;
  if (!nl && !letter && !num) c |= kPre;
  if (!han && (b & (kCpLu | kCpLt | kCpLm | kCpLo | kCpM))) c |= kUp;
  if (!han && (b & (kCpLl | kCpLm | kCpLo | kCpM))) c |= kLow;
  if (num) c |= kNum;
  if (space) c |= kSpace;
  if (!space && !letter && !num) c |= kSym;
  if (han) c |= kHan;
  if (nl) c |= kNl;
  if (nl || (!k3 && cp == '/')) c |= kTail;
  return c;
}

class Matcher {
 public:
  Matcher(const std::vector<Unit>& u, bool k3) : u_(u), n_(u.size() - 1), k3_(k3) {}

  // End (unit index) of the piece starting at unit i < n_.
  size_t piece_end(size_t i) const {
    size_t e;
    if (k3_ && (e = run(i, kHan)) != i) return e;  // 1: [\p{Han}]+
    if ((e = word_lower(i)) != kNoMatch) return e;  // 2
    if ((e = word_upper(i)) != kNoMatch) return e;  // 3
    if (has(i, kNum)) return digits(i);             // 4: \p{N}{1,3}
    if ((e = symbols(i)) != kNoMatch) return e;     // 5
    // 6..8 all start with \s; every unit that reaches here is \s (the others matched above).
    const size_t k = run(i, kSpace);
    if (k == i) return i + 1;  // unreachable: every non-space unit matches 2..5
    for (size_t j = k; j > i; --j) {  // 6: \s*[\r\n]+ : give back to the last newline
      if (has(j - 1, kNl)) return j;
    }
    if (k == n_) return k;          // 7: \s+(?!\S) at the end of the text
    if (k - 1 > i) return k - 1;    // 7: leave the last space to the next piece
    return k;                       // 8: \s+ (a single space before a non-space)
  }

 private:
  bool has(size_t i, uint16_t c) const { return i < n_ && (u_[i].cls & c); }
  size_t run(size_t i, uint16_t c) const {
    while (has(i, c)) ++i;
    return i;
  }
  uint32_t cp(size_t i) const { return i < n_ ? u_[i].cp : 0; }

  // (?i:'s|'t|'re|'ve|'m|'ll|'d)? at unit e: the end after the optional contraction.
  size_t contraction(size_t e) const {
    if (cp(e) != '\'') return e;
    const uint32_t c1 = cp(e + 1);
    const uint32_t l1 = c1 == 0x17F ? 's' : (c1 >= 'A' && c1 <= 'Z' ? c1 + 32 : c1);
    if (l1 == 's' || l1 == 't' || l1 == 'm' || l1 == 'd') return e + 2;
    const uint32_t c2 = cp(e + 2);
    const uint32_t l2 = c2 >= 'A' && c2 <= 'Z' ? c2 + 32 : c2;
    if ((l1 == 'r' || l1 == 'v') && l2 == 'e') return e + 3;
    if (l1 == 'l' && l2 == 'l') return e + 3;
    return e;
  }

  // 2: P? U* L+ C?   The prefix is tried taken, then not taken (a combining mark is both a
  // possible prefix and an upper/lower unit). U* is greedy; L+ needs a lower unit at the
  // point where U* stops, so U* gives units back until one is a lower unit.
  size_t word_lower(size_t i) const {
    for (int take = has(i, kPre) ? 1 : 0; take >= 0; --take) {
      const size_t u = i + static_cast<size_t>(take);
      const size_t k = run(u, kUp);
      for (size_t j = k + 1; j-- > u;) {
        if (has(j, kLow)) return contraction(run(j, kLow));
      }
    }
    return kNoMatch;
  }

  // 3: P? U+ L* C?   L* always succeeds, so only U+ being empty can fail.
  size_t word_upper(size_t i) const {
    for (int take = has(i, kPre) ? 1 : 0; take >= 0; --take) {
      const size_t u = i + static_cast<size_t>(take);
      const size_t k = run(u, kUp);
      if (k > u) return contraction(run(k, kLow));
    }
    return kNoMatch;
  }

  size_t digits(size_t i) const {
    size_t e = i;
    while (e < i + 3 && has(e, kNum)) ++e;
    return e;
  }

  // 5: ␠?[^\s\p{L}\p{N}]+[\r\n]*  (o200k: [\r\n/]*)
  size_t symbols(size_t i) const {
    size_t s = i;
    if (cp(i) == ' ' && has(i + 1, kSym)) {
      s = i + 1;
    } else if (!has(i, kSym)) {
      return kNoMatch;
    }
    return run(run(s, kSym), kTail);
  }

  const std::vector<Unit>& u_;
  size_t n_;
  bool k3_;
};

}  // namespace

std::string_view pattern_name(SplitPattern p) {
  return p == SplitPattern::kK3 ? "k3" : "o200k";
}

Result<SplitPattern> parse_pattern(std::string_view name) {
  if (name == "k3") return SplitPattern::kK3;
  if (name == "o200k") return SplitPattern::kO200k;
  return Status::usage("unknown split pattern '" + std::string(name) + "' (expected k3 or o200k)");
}

void split_pieces(std::string_view text, SplitPattern pattern,
                  std::vector<std::string_view>& out) {
  if (text.empty()) return;
  const bool k3 = pattern == SplitPattern::kK3;
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  std::vector<Unit> units;
  units.reserve(text.size() + 1);
  for (size_t off = 0; off < text.size();) {
    const DecodedCp d = decode_utf8(p + off, text.size() - off);
    units.push_back({static_cast<uint32_t>(off), d.cp, classify(d.cp, k3)});
    off += d.len;
  }
  units.push_back({static_cast<uint32_t>(text.size()), 0, 0});  // sentinel: end offset
  const Matcher m(units, k3);
  const size_t n = units.size() - 1;
  for (size_t i = 0; i < n;) {
    const size_t e = m.piece_end(i);
    out.push_back(text.substr(units[i].off, units[e].off - units[i].off));
    i = e;
  }
}

void chunk_long_input(std::string_view text, const ChunkLimits& limits,
                      std::vector<std::string_view>& out) {
  if (text.empty()) return;
  // A text of n bytes has at most n code points: no cut can happen if n is within both limits.
  const auto within = [&](size_t limit) { return limit == 0 || text.size() <= limit; };
  if (within(limits.max_chunk_chars) && within(limits.max_run_chars)) {
    out.push_back(text);
    return;
  }
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  size_t chunk_start = 0;  // byte offset of the current 400k-character chunk
  size_t chunk_chars = 0;
  size_t slice_start = 0;  // byte offset of the current output slice
  size_t run_len = 0;
  bool run_space = false;
  for (size_t off = 0; off < text.size();) {
    if (limits.max_chunk_chars && chunk_chars == limits.max_chunk_chars) {
      // A new chunk starts: flush the open slice and restart the run state, as the reference
      // calls the run splitter afresh on each chunk.
      out.push_back(text.substr(slice_start, off - slice_start));
      chunk_start = slice_start = off;
      chunk_chars = 0;
    }
    const DecodedCp d = decode_utf8(p + off, text.size() - off);
    const bool space = (cp_bits(d.cp) & kCpPYSPACE) != 0;
    if (off == chunk_start) {
      run_space = space;
      run_len = 1;
    } else if (space != run_space) {
      run_space = space;
      run_len = 1;
    } else if (++run_len > limits.max_run_chars && limits.max_run_chars) {
      out.push_back(text.substr(slice_start, off - slice_start));
      slice_start = off;
      run_len = 1;
    }
    ++chunk_chars;
    off += d.len;
  }
  if (slice_start < text.size()) out.push_back(text.substr(slice_start));
}

}  // namespace ktier::tok
