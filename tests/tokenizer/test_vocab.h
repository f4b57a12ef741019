#pragma once
// Small synthetic vocabularies for the tokenizer tests.

#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace ktier::test {

// Ranks 0..255 are the single bytes (rank b = byte b), then `merges` in order (rank 256, ...).
inline std::vector<std::string> byte_vocab(const std::vector<std::string>& merges = {}) {
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.emplace_back(1, static_cast<char>(b));
  v.insert(v.end(), merges.begin(), merges.end());
  return v;
}

inline std::string b64(const std::string& s) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 3 <= s.size(); i += 3) {
    const unsigned w = (static_cast<unsigned char>(s[i]) << 16) |
                       (static_cast<unsigned char>(s[i + 1]) << 8) | static_cast<unsigned char>(s[i + 2]);
    out += {k[w >> 18], k[(w >> 12) & 63], k[(w >> 6) & 63], k[w & 63]};
  }
  if (s.size() - i == 1) {
    const unsigned w = static_cast<unsigned char>(s[i]) << 16;
    out += {k[w >> 18], k[(w >> 12) & 63], '=', '='};
  } else if (s.size() - i == 2) {
    const unsigned w = (static_cast<unsigned char>(s[i]) << 16) | (static_cast<unsigned char>(s[i + 1]) << 8);
    out += {k[w >> 18], k[(w >> 12) & 63], k[(w >> 6) & 63], '='};
  }
  return out;
}

// tiktoken.model text for tokens indexed by rank.
inline std::string tiktoken_text(const std::vector<std::string>& tokens) {
  std::string t;
  for (size_t r = 0; r < tokens.size(); ++r) t += b64(tokens[r]) + " " + std::to_string(r) + "\n";
  return t;
}

inline void write_file(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

// A fresh empty folder under the build tree for one test.
inline std::filesystem::path fresh_dir(const std::string& name) {
  const auto d = std::filesystem::path(KTIER_BINARY_DIR) / "tokenizer-test-tmp" / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// A merge list that makes BPE do something on English-like and whitespace text.
inline std::vector<std::string> demo_merges() {
  return {"he", "ll", "llo", "hello", " w", "or", " wor", "ld", " world", "  ", "    ", "\n\n",
          "in", "ing", " t", "th", " th", " the", "'s", "er", "an", "\xe4\xb8", "\xe4\xb8\xad",
          "\n/"};
}

// CPU time of the calling thread, for performance assertions that must not flake under load.
inline double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace ktier::test
