#pragma once
// Internal helpers of the AVX2 kernels (included only by cpu/x86/avx2_*.cpp, which are compiled
// with -mavx2 -mfma -mf16c). Everything has internal linkage and no standard-library templates
// are used, so no AVX2-encoded function can be shared with the scalar translation units.
//
// Lane conventions match cpu/numerics.h exactly: a dot16 keeps its 16 lanes in four __m256d,
// acc[q] holding lanes 4q..4q+3; lane l takes the elements i with i % 16 == l.

#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "cpu/numerics.h"

namespace ktier::cpu::avx2 {
namespace {

// ---- weight element traits: 8 weights -> 8 f32 (exact), plus the scalar twin for tails -------

struct F32Weights {
  using Storage = float;
  using Scalar = num::F32Weights;
  static __m256 load8(const Storage* p) { return _mm256_loadu_ps(p); }
};
struct Bf16Weights {
  using Storage = uint16_t;
  using Scalar = num::Bf16Weights;
  static __m256 load8(const Storage* p) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
  }
};
struct F16Weights {
  using Storage = uint16_t;
  using Scalar = num::F16Weights;
  static __m256 load8(const Storage* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};

// ---- f32 <-> double, 4 at a time ----------------------------------------------------------------

static inline __m256d lo4(__m256 v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
static inline __m256d hi4(__m256 v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }
static inline __m256d load4(const float* p) { return _mm256_cvtps_pd(_mm_loadu_ps(p)); }
static inline void store4(float* p, __m256d v) { _mm_storeu_ps(p, _mm256_cvtpd_ps(v)); }
static inline __m256d bcast(double v) { return _mm256_set1_pd(v); }

static inline void store_lanes16(double* lane, const __m256d* acc) {
  for (int q = 0; q < 4; ++q) _mm256_storeu_pd(lane + 4 * q, acc[q]);
}

// ---- dot16 (NUMERICS.md §3). FMA is used because every product is exact in double, so
// fma(a, b, acc) rounds exactly like the scalar acc + a*b.

// Weight row (any float type) . x (already widened to double).
template <class A>
static inline double dot16_row(const typename A::Storage* w, const double* x, int64_t n) {
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                    _mm256_setzero_pd()};
  const int64_t n16 = n & ~int64_t{15};
  for (int64_t i = 0; i < n16; i += 16) {
    const __m256 a = A::load8(w + i), b = A::load8(w + i + 8);
    acc[0] = _mm256_fmadd_pd(lo4(a), _mm256_loadu_pd(x + i), acc[0]);
    acc[1] = _mm256_fmadd_pd(hi4(a), _mm256_loadu_pd(x + i + 4), acc[1]);
    acc[2] = _mm256_fmadd_pd(lo4(b), _mm256_loadu_pd(x + i + 8), acc[2]);
    acc[3] = _mm256_fmadd_pd(hi4(b), _mm256_loadu_pd(x + i + 12), acc[3]);
  }
  double lane[16];
  store_lanes16(lane, acc);
  num::dot16_accumulate<typename A::Scalar>(lane, w, x, n16, n);
  return num::tree16(lane);
}

// f32 . f32.
static inline double dot16_f32(const float* a, const float* b, int64_t n) {
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                    _mm256_setzero_pd()};
  const int64_t n16 = n & ~int64_t{15};
  for (int64_t i = 0; i < n16; i += 16) {
    const __m256 a0 = _mm256_loadu_ps(a + i), a1 = _mm256_loadu_ps(a + i + 8);
    const __m256 b0 = _mm256_loadu_ps(b + i), b1 = _mm256_loadu_ps(b + i + 8);
    acc[0] = _mm256_fmadd_pd(lo4(a0), lo4(b0), acc[0]);
    acc[1] = _mm256_fmadd_pd(hi4(a0), hi4(b0), acc[1]);
    acc[2] = _mm256_fmadd_pd(lo4(a1), lo4(b1), acc[2]);
    acc[3] = _mm256_fmadd_pd(hi4(a1), hi4(b1), acc[3]);
  }
  double lane[16];
  store_lanes16(lane, acc);
  num::dot16_accumulate_f32(lane, a, b, n16, n);
  return num::tree16(lane);
}

// ---- transcendentals: the same libm call per lane as the scalar kernels (NUMERICS.md §2) ------

static inline __m256d exp4(__m256d v) {
  alignas(32) double t[4];
  _mm256_store_pd(t, v);
  for (int l = 0; l < 4; ++l) t[l] = std::exp(t[l]);
  return _mm256_load_pd(t);
}
static inline __m256d tanh4(__m256d v) {
  alignas(32) double t[4];
  _mm256_store_pd(t, v);
  for (int l = 0; l < 4; ++l) t[l] = std::tanh(t[l]);
  return _mm256_load_pd(t);
}
static inline __m256d neg4(__m256d v) { return _mm256_xor_pd(v, bcast(-0.0)); }
// 1 / (1 + exp(-v)), op for op as num::sigmoid.
static inline __m256d sigmoid4(__m256d v) {
  return _mm256_div_pd(bcast(1.0), _mm256_add_pd(bcast(1.0), exp4(neg4(v))));
}

}  // namespace
}  // namespace ktier::cpu::avx2
