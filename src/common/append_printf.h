#pragma once
// printf-style text appended to a std::string, as long as it comes out: reports whose lines hold
// paths and per-layer lists have no length a fixed buffer could be sure of.

#include <cstdio>
#include <string>

#include "common/check.h"

namespace ktier {

// Appends snprintf(fmt, args...) to `out`, never cut. A format snprintf refuses is a bug: CHECK.
template <typename... Args>
void append_printf(std::string& out, const char* fmt, Args... args) {
  const int n = std::snprintf(nullptr, 0, fmt, args...);
  KTIER_CHECK(n >= 0);
  const size_t at = out.size();
  out.resize(at + static_cast<size_t>(n) + 1);  // snprintf writes its NUL too
  std::snprintf(out.data() + at, static_cast<size_t>(n) + 1, fmt, args...);
  out.pop_back();
}

}  // namespace ktier
