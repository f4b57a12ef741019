#pragma once
// Byte equality of two float buffers, for the "same output bytes" checks: unlike ==, it tells
// -0 from +0 and a NaN equals the same NaN.

#include <cstring>
#include <vector>

namespace ktier::test {

inline bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace ktier::test
