#include "synth/values.h"

#include <cmath>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common/dtype.h"
#include "cpu/kernels.h"
#include "cpu/numerics.h"
#include "synth/rng.h"

namespace ktier::synth {
namespace {

// Acklam's rational approximation of the standard-normal quantile (relative error < 1.2e-9,
// far below the f32 table precision). Only +, *, /, sqrt and log: reproducible per libm.
double normal_quantile(double p) {
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                             1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01,  -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                             3.754408661907416e+00};
  constexpr double kLow = 0.02425;
  auto tail = [&](double q) {
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
           ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1.0);
  };
  if (p < kLow) return tail(std::sqrt(-2.0 * std::log(p)));
  if (p > 1.0 - kLow) return -tail(std::sqrt(-2.0 * std::log(1.0 - p)));
  const double q = p - 0.5;
  const double r = q * q;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
         (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0);
}

}  // namespace

const float* normal_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (size_t i = 0; i < t.size(); ++i)
      t[i] = static_cast<float>(normal_quantile((static_cast<double>(i) + 0.5) / 65536.0));
    for (size_t i = 0; i < t.size() / 2; ++i) t[t.size() - 1 - i] = -t[i];  // exactly symmetric
    return t;
  }();
  return table.data();
}

void generate_values(const ValueSpec& spec, uint64_t first, size_t count, float* out) {
  if (spec.kind == ValueKind::kALogRamp) {
    for (size_t j = 0; j < count; ++j) {
      const uint64_t i = first + j;
      if (i >= spec.ramp_count) {
        out[j] = 0.0f;
      } else if (spec.ramp_count == 1) {
        out[j] = spec.ramp_lo;
      } else {
        const double t = static_cast<double>(i) / static_cast<double>(spec.ramp_count - 1);
        out[j] = static_cast<float>(spec.ramp_lo + (spec.ramp_hi - spec.ramp_lo) * t);
      }
    }
    return;
  }
  // One 64-bit draw feeds four consecutive elements 4k..4k+3, 16 bits each (lowest bits to 4k).
  const float* table = normal_table();
  const float mean = spec.mean, stddev = spec.stddev;
  size_t j = 0;
  uint64_t i = first;
  for (; (i & 3) != 0 && j < count; ++i, ++j)  // leading partial draw
    out[j] = mean + stddev * table[(counter_draw(spec.key, i >> 2) >> (16 * (i & 3))) & 0xffff];
  for (; j + 4 <= count; j += 4, i += 4) {
    const uint64_t r = counter_draw(spec.key, i >> 2);
    out[j] = mean + stddev * table[r & 0xffff];
    out[j + 1] = mean + stddev * table[(r >> 16) & 0xffff];
    out[j + 2] = mean + stddev * table[(r >> 32) & 0xffff];
    out[j + 3] = mean + stddev * table[r >> 48];
  }
  for (; j < count; ++i, ++j)  // trailing partial draw
    out[j] = mean + stddev * table[(counter_draw(spec.key, i >> 2) >> (16 * (i & 3))) & 0xffff];
}

float e2m1_value(uint8_t code) { return cpu::num::kE2M1[code & 15]; }

namespace {

// Smallest e with 6·2^e ≥ amax, from amax's bit pattern (amax = 1.f·2^E: e = E − 2 if
// 1.f ≤ 1.5, else E − 1), clamped to the scale bytes 0..254 (255 is the NaN / zero-block marker,
// decision D12). An all-zero group gets the neutral scale 2^0.
inline int mxfp4_exponent(uint32_t amax_bits) {
  if (amax_bits == 0) return 0;
  const int field = static_cast<int>(amax_bits >> 23);
  if (field == 0) return -127;  // subnormal maximum: the smallest scale
  const int E = field - 127;
  const int e = (amax_bits & 0x7fffffu) > 0x400000u ? E - 1 : E - 2;
  return e < -127 ? -127 : (e > 127 ? 127 : e);
}

// 2^−e from its bits (a libm ldexp per group would cost more than the group itself). e ≤ 126
// keeps 127 − e a normal exponent; e = 127 needs amax > 2^129, not a weight.
inline float mxfp4_inverse_scale(int e) {
  return e < 127 ? bits_to_f32(static_cast<uint32_t>(127 - e) << 23) : std::ldexp(1.0f, -e);
}

// Nearest E2M1 code of q (|q| ≤ 6), ties to the even code (OCP MX): the thresholds are the
// midpoints between neighbouring values. The sign bit is kept even when the magnitude rounds to
// 0 (code 8, −0), as in the released data.
inline uint8_t e2m1_code(float q) {
  const uint32_t qb = f32_to_bits(q);
  const float m = bits_to_f32(qb & 0x7fffffffu);
  return static_cast<uint8_t>((m > 0.25f) + (m >= 0.75f) + (m > 1.25f) + (m >= 1.75f) + (m > 2.5f) +
                              (m >= 3.5f) + (m > 5.0f) + ((qb >> 28) & 8u));
}

}  // namespace

uint8_t mxfp4_quantize_group_scalar(const float* x, uint8_t* packed) {
  uint32_t amax_bits = 0;  // max |x| on bit patterns: monotonic for non-NaN floats
  for (size_t i = 0; i < kMxfp4Group; ++i) {
    const uint32_t b = f32_to_bits(x[i]) & 0x7fffffffu;
    amax_bits = b > amax_bits ? b : amax_bits;
  }
  const int e = mxfp4_exponent(amax_bits);
  const float inv = mxfp4_inverse_scale(e);
  for (size_t j = 0; j < kMxfp4Group / 2; ++j)  // x·inv is exact: a power-of-two scaling
    packed[j] = static_cast<uint8_t>(e2m1_code(x[2 * j] * inv) | (e2m1_code(x[2 * j + 1] * inv) << 4));
  return static_cast<uint8_t>(127 + e);
}

#if defined(__SSE2__)
// The same arithmetic as the scalar version, 4 lanes at a time (SSE2 is part of x86-64): every
// comparison, the exponent rule and the nibble order are identical, so the bytes are too
// (checked by synth_values_test).
uint8_t mxfp4_quantize_group(const float* x, uint8_t* packed) {
  const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
  __m128 v[8];
  __m128 amax = _mm_setzero_ps();
  for (int k = 0; k < 8; ++k) {
    v[k] = _mm_loadu_ps(x + 4 * k);
    amax = _mm_max_ps(amax, _mm_and_ps(v[k], abs_mask));
  }
  amax = _mm_max_ps(amax, _mm_shuffle_ps(amax, amax, _MM_SHUFFLE(1, 0, 3, 2)));
  amax = _mm_max_ps(amax, _mm_shuffle_ps(amax, amax, _MM_SHUFFLE(2, 3, 0, 1)));
  const int e = mxfp4_exponent(static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_castps_si128(amax))));
  const __m128 inv = _mm_set1_ps(mxfp4_inverse_scale(e));
  const __m128 t1 = _mm_set1_ps(0.25f), t2 = _mm_set1_ps(0.75f), t3 = _mm_set1_ps(1.25f),
               t4 = _mm_set1_ps(1.75f), t5 = _mm_set1_ps(2.5f), t6 = _mm_set1_ps(3.5f),
               t7 = _mm_set1_ps(5.0f);
  __m128i code32[8];
  for (int k = 0; k < 8; ++k) {
    const __m128 q = _mm_mul_ps(v[k], inv);
    const __m128 m = _mm_and_ps(q, abs_mask);
    // Each comparison is all-ones (−1) when true: subtracting the masks counts them.
    __m128i c = _mm_slli_epi32(_mm_srli_epi32(_mm_castps_si128(q), 31), 3);  // sign → bit 3
    c = _mm_sub_epi32(c, _mm_castps_si128(_mm_cmpgt_ps(m, t1)));
    c = _mm_sub_epi32(c, _mm_castps_si128(_mm_cmpge_ps(m, t2)));
    c = _mm_sub_epi32(c, _mm_castps_si128(_mm_cmpgt_ps(m, t3)));
    c = _mm_sub_epi32(c, _mm_castps_si128(_mm_cmpge_ps(m, t4)));
    c = _mm_sub_epi32(c, _mm_castps_si128(_mm_cmpgt_ps(m, t5)));
    c = _mm_sub_epi32(c, _mm_castps_si128(_mm_cmpge_ps(m, t6)));
    c = _mm_sub_epi32(c, _mm_castps_si128(_mm_cmpgt_ps(m, t7)));
    code32[k] = c;
  }
  // 32-bit codes → bytes (0..15, so saturation never triggers), then byte j = c[2j] | c[2j+1] << 4:
  // in 16-bit lanes (c[2j] | c[2j+1] << 8), lane | lane >> 4 holds the pair in its low byte.
  const __m128i lo = _mm_packus_epi16(_mm_packs_epi32(code32[0], code32[1]), _mm_packs_epi32(code32[2], code32[3]));
  const __m128i hi = _mm_packus_epi16(_mm_packs_epi32(code32[4], code32[5]), _mm_packs_epi32(code32[6], code32[7]));
  const __m128i byte_mask = _mm_set1_epi16(0x00ff);
  const __m128i plo = _mm_and_si128(_mm_or_si128(lo, _mm_srli_epi16(lo, 4)), byte_mask);
  const __m128i phi = _mm_and_si128(_mm_or_si128(hi, _mm_srli_epi16(hi, 4)), byte_mask);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(packed), _mm_packus_epi16(plo, phi));
  return static_cast<uint8_t>(127 + e);
}
#else
uint8_t mxfp4_quantize_group(const float* x, uint8_t* packed) { return mxfp4_quantize_group_scalar(x, packed); }
#endif

void mxfp4_dequantize_group(const uint8_t* packed, uint8_t scale, float* out) {
  cpu::mxfp4_decode(packed, &scale, 1, static_cast<int64_t>(kMxfp4Group), out);
}

void mxfp4_round_trip(float* x, size_t count) {
  uint8_t packed[kMxfp4Group / 2];
  for (size_t g = 0; g + kMxfp4Group <= count; g += kMxfp4Group) {
    const uint8_t s = mxfp4_quantize_group(x + g, packed);
    mxfp4_dequantize_group(packed, s, x + g);
  }
}

uint64_t HighByteHistogram::total() const {
  uint64_t t = 0;
  for (uint64_t c : count) t += c;
  return t;
}

double HighByteHistogram::entropy_bits() const {
  const uint64_t t = total();
  if (t == 0) return 0.0;
  double h = 0.0;
  for (uint64_t c : count) {
    if (c == 0) continue;
    const double p = static_cast<double>(c) / static_cast<double>(t);
    h -= p * std::log2(p);
  }
  return h;
}

void encode_bf16(const float* x, size_t count, uint8_t* out, HighByteHistogram* hist) {
  for (size_t i = 0; i < count; ++i) {
    const uint16_t h = f32_to_bf16(x[i]);
    out[2 * i] = static_cast<uint8_t>(h);
    out[2 * i + 1] = static_cast<uint8_t>(h >> 8);
  }
  if (hist)
    for (size_t i = 0; i < count; ++i) ++hist->count[out[2 * i + 1]];
}

void encode_f32(const float* x, size_t count, uint8_t* out) {
  for (size_t i = 0; i < count; ++i) {
    const uint32_t b = f32_to_bits(x[i]);
    out[4 * i] = static_cast<uint8_t>(b);
    out[4 * i + 1] = static_cast<uint8_t>(b >> 8);
    out[4 * i + 2] = static_cast<uint8_t>(b >> 16);
    out[4 * i + 3] = static_cast<uint8_t>(b >> 24);
  }
}

}  // namespace ktier::synth
