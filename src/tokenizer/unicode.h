#pragma once
// Code-point classification and UTF-8 decoding for the pre-tokenizer.
//
// Contract: cp_bits() returns the class bits of src/tokenizer/unicode_tables.h (generated from
// the Unicode Character Database; Unicode version in kUnicodeVersion) for any uint32_t;
// values past U+10FFFF and kInvalidCp have no bits. decode_utf8() never fails: it reports
// malformed input as a one-byte "invalid" unit, so every byte string has exactly one
// decomposition and the caller can classify invalid bytes deterministically.

#include <cstddef>
#include <cstdint>

#include "tokenizer/unicode_tables.h"

namespace ktier::tok {

// The code point reported for a byte that does not start a well-formed UTF-8 sequence.
inline constexpr uint32_t kInvalidCp = 0xFFFFFFFFu;

// Class bits of one code point (0 for unassigned, surrogates, kInvalidCp).
uint16_t cp_bits(uint32_t cp);

struct DecodedCp {
  uint32_t cp;   // code point, or kInvalidCp
  uint32_t len;  // bytes consumed, 1..4 (always 1 for kInvalidCp)
};

// Decodes the code point at p[0..n), n >= 1. Well-formed means the Unicode Standard's
// Table 3-7: shortest form, no surrogates, at most U+10FFFF. Anything else (a stray
// continuation byte, a truncated sequence, C0/C1/F5..FF leads, overlongs, encoded surrogates)
// consumes exactly one byte as kInvalidCp; decoding resumes at the next byte.
inline DecodedCp decode_utf8(const unsigned char* p, size_t n) {
  const unsigned b0 = p[0];
  if (b0 < 0x80) return {b0, 1};
  auto cont = [&](size_t i) { return i < n && (p[i] & 0xC0) == 0x80; };
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (cont(1)) return {((b0 & 0x1Fu) << 6) | (p[1] & 0x3Fu), 2};
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (cont(1) && cont(2)) {
      const uint32_t cp = ((b0 & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
      if (cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) return {cp, 3};
    }
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (cont(1) && cont(2) && cont(3)) {
      const uint32_t cp = ((b0 & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) |
                          ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
      if (cp >= 0x10000 && cp <= 0x10FFFF) return {cp, 4};
    }
  }
  return {kInvalidCp, 1};
}

// Bytes of p[0..n) (n >= 1) that begin a well-formed sequence (Table 3-7): a complete one's
// length, a truncated one's bytes so far, or 1 for a byte that begins none. Where decode_utf8
// reports kInvalidCp, this is the "maximal subpart" that the Unicode Standard's U+FFFD
// substitution practice (§3.9), and Python's errors="replace", turn into one U+FFFD.
inline size_t utf8_maximal_subpart(const unsigned char* p, size_t n) {
  const unsigned b0 = p[0];
  const size_t need = b0 >= 0xC2 && b0 <= 0xDF   ? 2
                      : b0 >= 0xE0 && b0 <= 0xEF ? 3
                      : b0 >= 0xF0 && b0 <= 0xF4 ? 4
                                                 : 1;
  size_t len = 1;
  for (; len < need && len < n; ++len) {
    // The second byte's range depends on the lead (no overlongs, surrogates or past U+10FFFF).
    const unsigned lo = len > 1 ? 0x80 : b0 == 0xE0 ? 0xA0 : b0 == 0xF0 ? 0x90 : 0x80;
    const unsigned hi = len > 1 ? 0xBF : b0 == 0xED ? 0x9F : b0 == 0xF4 ? 0x8F : 0xBF;
    if (p[len] < lo || p[len] > hi) break;
  }
  return len;
}

// Appends the UTF-8 encoding of a valid scalar value (no surrogates, <= U+10FFFF).
void append_utf8(uint32_t cp, char* out, size_t* len);

}  // namespace ktier::tok
