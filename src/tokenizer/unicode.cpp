// A flat table of class bits for all 0x110000 code points (2.2 MB), filled from the generated
// ranges on first use (thread-safe function-local static; about a millisecond). One load per
// lookup; real text touches few pages of it.
#include "tokenizer/unicode.h"

#include <algorithm>
#include <vector>

namespace ktier::tok {
namespace {

const std::vector<uint16_t>& table() {
  static const std::vector<uint16_t> t = [] {
    std::vector<uint16_t> v(0x110000, 0);
    for (size_t r = 0; r < kUnicodeRangeCount; ++r) {
      const uint32_t end = r + 1 < kUnicodeRangeCount ? kUnicodeRanges[r + 1].first : 0x110000;
      std::fill(v.begin() + kUnicodeRanges[r].first, v.begin() + end, kUnicodeRanges[r].bits);
    }
    return v;
  }();
  return t;
}

}  // namespace

uint16_t cp_bits(uint32_t cp) { return cp < 0x110000 ? table()[cp] : 0; }

void append_utf8(uint32_t cp, char* out, size_t* len) {
  size_t n = *len;
  if (cp < 0x80) {
    out[n++] = static_cast<char>(cp);
  } else if (cp < 0x800) {
    out[n++] = static_cast<char>(0xC0 | (cp >> 6));
    out[n++] = static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out[n++] = static_cast<char>(0xE0 | (cp >> 12));
    out[n++] = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out[n++] = static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out[n++] = static_cast<char>(0xF0 | (cp >> 18));
    out[n++] = static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out[n++] = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out[n++] = static_cast<char>(0x80 | (cp & 0x3F));
  }
  *len = n;
}

}  // namespace ktier::tok
