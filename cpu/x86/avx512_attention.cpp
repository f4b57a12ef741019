// AVX-512 kernels of the two cache-reading MLA steps (KernelTable::mla_scores, mla_mix;
// NUMERICS.md §8): cpu/x86/mla_pass_vec.h over 8 doubles per register. Bit-identical to
// cpu/ref/ops_ref.cpp. Compiled with the AVX-512 flags of cpu/CMakeLists.txt; runs only where
// isa_supported(Isa::kAvx512).

#include <cstdint>

#include "cpu/kernel_table.h"
#include "cpu/x86/avx512_intrinsics.h"
#include "cpu/x86/avx512_kernels.h"
#include "cpu/x86/mla_pass_vec.h"

namespace ktier::cpu::avx512 {
namespace {

struct Avx512Doubles {
  using V = __m512d;
  static constexpr int kWidth = 8;
  static V zero() { return _mm512_setzero_pd(); }
  static V load(const double* p) { return _mm512_loadu_pd(p); }
  static void store(double* p, V v) { _mm512_storeu_pd(p, v); }
  static V set1(double v) { return _mm512_set1_pd(v); }
  static V add(V a, V b) { return _mm512_add_pd(a, b); }
  static V mul(V a, V b) { return _mm512_mul_pd(a, b); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
  static V widen(const float* p) { return _mm512_cvtps_pd(_mm256_loadu_ps(p)); }
  // acc[0] = lanes 0-7, acc[1] = lanes 8-15. Pairs (l, l+8), (l, l+4), (l, l+2), (0, 1), as
  // num::tree16.
  static double tree16(const V* acc) {
    const V a = _mm512_add_pd(acc[0], acc[1]);
    const __m256d b = _mm256_add_pd(_mm512_castpd512_pd256(a), _mm512_extractf64x4_pd(a, 1));
    const __m128d c = _mm_add_pd(_mm256_castpd256_pd128(b), _mm256_extractf128_pd(b, 1));
    return _mm_cvtsd_f64(_mm_add_sd(c, _mm_unpackhi_pd(c, c)));
  }
};

}  // namespace

void mla_scores_avx512(const MlaArgs& a, const MlaPass& p, int64_t s0, int64_t s1,
                       double* scratch) {
  x86::mla_scores_vec<Avx512Doubles>(a, p, s0, s1, scratch);
}

void mla_mix_avx512(const MlaArgs& a, const MlaPass& p, int64_t c0, int64_t c1, double* scratch) {
  x86::mla_mix_vec<Avx512Doubles>(a, p, c0, c1, scratch);
}

}  // namespace ktier::cpu::avx512
