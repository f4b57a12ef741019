#pragma once
// The exact bit-level conversions between f32, bf16 and f16 (IEEE binary16), and the writers'
// rounding of f32 to bf16, shared by the numerics contract (cpu/numerics.h: the kernels' scalar
// tails) and by the checkpoint and test code (src/common/dtype.h). Internal linkage, for
// cpu/numerics.h's reason: a translation unit compiled for AVX2 or AVX-512 gets its own copy,
// which the linker can never hand to a scalar caller. No standard-library templates, for the
// same reason.

#include <cstdint>
#include <cstring>

namespace ktier::cpu::float_bits {
namespace {  // internal linkage, see above

static inline float bits_to_f32(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
static inline uint32_t f32_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}
static inline float bf16_to_f32(uint16_t h) { return bits_to_f32(static_cast<uint32_t>(h) << 16); }

// IEEE binary16 -> binary32, exact for every pattern (subnormals, infinities, NaN).
static inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal half: normalise into an f32 normal
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return bits_to_f32(bits);
}

// Round-to-nearest-even f32 -> bf16 (writers only: the engine never rounds activations). NaN
// stays a quiet NaN.
static inline uint16_t f32_to_bf16(float f) {
  uint32_t b = f32_to_bits(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x0040u);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

}  // namespace
}  // namespace ktier::cpu::float_bits
