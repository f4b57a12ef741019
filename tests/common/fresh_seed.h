#pragma once
// Seeds for tests on random inputs: fresh each run (so that runs over time cover more inputs),
// printed with the test's name so that a failure can be replayed with KTIER_TEST_SEED=N.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>

namespace ktier::test {

inline uint64_t fresh_seed(const char* what) {
  uint64_t seed;
  if (const char* s = std::getenv("KTIER_TEST_SEED"); s && *s) {
    seed = std::strtoull(s, nullptr, 10);
  } else {
    std::random_device rd;
    seed = (uint64_t{rd()} << 32) ^ rd();
  }
  std::printf("[seed] %s: %llu (KTIER_TEST_SEED=%llu replays it)\n", what,
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  return seed;
}

}  // namespace ktier::test
