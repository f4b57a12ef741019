#pragma once
// Counter-based random numbers for the synthetic checkpoint generator.
//
// Every random value is a pure function of (seed, tensor key, element index): draw i of a tensor
// is splitmix64's finaliser applied to `key + (i + 1) * golden`, which is exactly the i-th output
// of a splitmix64 stream started at `key`. No generator state is carried from one value to the
// next, so any element range can be produced by any thread in any order and the bytes are the
// same; this is what makes `ktier synth` deterministic and parallel at once.
//
// Normal variates are read from a 65,536-entry table of standard-normal quantiles at the cell
// midpoints, Φ⁻¹((i + ½) / 65536), indexed by 16 random bits, so one 64-bit draw yields four
// values with no arithmetic beyond a lookup. 65,536 levels are far finer than BF16's 8-bit
// mantissa or MXFP4's 8 levels; tails end at ±4.17σ, which random matrices of these sizes barely
// exceed. The table is built once with only +, *, /, sqrt and log, so a given build and libm
// always produce the same bytes.

#include <cstdint>
#include <string_view>

namespace ktier::synth {

inline constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

// splitmix64 finaliser: a bijective 64-bit mix.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Draw `counter` of the stream `key`.
inline uint64_t counter_draw(uint64_t key, uint64_t counter) {
  return mix64(key + (counter + 1) * kGolden);
}

// Key of one named stream under a seed (FNV-1a of the name, mixed with the seed). Distinct names
// give unrelated streams; the same (seed, name) always gives the same stream.
inline uint64_t stream_key(uint64_t seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return mix64(h ^ mix64(seed + kGolden));
}

// Uniform in [0, 1) from the top 53 bits of a draw.
inline double unit_double(uint64_t draw) { return static_cast<double>(draw >> 11) * 0x1.0p-53; }

// The quantile table (65,536 floats, antisymmetric); built on first use (thread-safe).
const float* normal_table();

}  // namespace ktier::synth
