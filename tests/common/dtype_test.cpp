#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "common/dtype.h"

namespace ktier {
namespace {

TEST(DType, ParseAndSizes) {
  EXPECT_EQ(parse_dtype("BF16"), DType::kBF16);
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kU8), 1u);
  EXPECT_FALSE(parse_dtype("F64").has_value());
}

// F16 -> f32 must be exact for every one of the 65536 patterns: compare with a
// float computed from the definition (sign, exponent, mantissa) in double.
TEST(DType, F16WideningIsExactForAllPatterns) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = f16_to_f32(static_cast<uint16_t>(h));
    const int sign = (h >> 15) & 1, exp = (h >> 10) & 31, mant = h & 1023;
    if (exp == 31) {
      if (mant == 0) {
        EXPECT_TRUE(std::isinf(got)) << h;
        EXPECT_EQ(std::signbit(got), sign == 1) << h;
      } else {
        EXPECT_TRUE(std::isnan(got)) << h;
      }
      continue;
    }
    const double mag = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
    const double want = sign ? -mag : mag;
    EXPECT_EQ(static_cast<double>(got), want) << h;
    EXPECT_EQ(std::signbit(got), sign == 1) << h;
  }
}

// (f16_to_f32 is the kernels' own widening, cpu/float_bits.h; each kernel set's F16
// conversion is held to it for every pattern by Contract.F16WeightsWidenExactlyForEveryPattern
// in tests/cpu.)

TEST(DType, Bf16RoundTripAndRounding) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    EXPECT_EQ(f32_to_bits(f), h << 16);
    if (!std::isnan(f)) {
      EXPECT_EQ(f32_to_bf16(f), h) << h;
    }
  }
  // Ties go to even: 1 + 2^-8 sits exactly between 1 and 1 + 2^-7.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
}

}  // namespace
}  // namespace ktier
