#pragma once
// Paths the tests need. The conformance folder may be overridden with KTIER_CONFORMANCE_DIR.

#include <cstdlib>
#include <filesystem>
#include <string>

namespace ktier::test {

inline std::filesystem::path conformance_dir() {
  if (const char* env = std::getenv("KTIER_CONFORMANCE_DIR"); env && *env) return env;
  return KTIER_CONFORMANCE_DIR;
}
inline std::filesystem::path source_dir() { return KTIER_SOURCE_DIR; }
inline std::filesystem::path binary_dir() { return KTIER_BINARY_DIR; }
// The ktier executable under test (set by CTest; falls back to the build folder).
inline std::filesystem::path ktier_bin() {
  if (const char* env = std::getenv("KTIER_BIN"); env && *env) return env;
  return std::filesystem::path(KTIER_BINARY_DIR) / "ktier";
}

}  // namespace ktier::test
