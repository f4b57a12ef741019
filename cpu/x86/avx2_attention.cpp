// AVX2 kernels for the KDA recurrence, MLA attention (absorbed form) and AttnRes
// (NUMERICS.md §7-§9), and the AVX2 kernel table. Vectorised across the value channel j, the
// latent channel c or the hidden index d, so every per-element sum keeps the scalar order.

#include <cstring>

#include "cpu/kernel_table.h"
#include "cpu/x86/avx2_common.h"
#include "cpu/x86/avx2_kernels.h"
#include "cpu/x86/mla_pass_vec.h"

namespace ktier::cpu::avx2 {

using num::D;
using num::F;

// ---- KDA recurrence (§7) ---------------------------------------------------------------------

void recurrence_heads_avx2(const RecurrenceArgs& a, int h0, int h1, double* scratch) {
  const int64_t Dk = a.Dk, Dv = a.Dv, H = a.H;
  const int64_t Dv4 = Dv & ~int64_t{3};
  double* u = scratch;
  double* d = scratch + Dv;
  double* o = scratch + 2 * Dv;
  for (int64_t h = h0; h < h1; ++h) {
    float* S = a.state + h * Dk * Dv;
    for (int64_t t = 0; t < a.T; ++t) {
      const float* q = a.q + (t * H + h) * Dk;
      const float* k = a.k + (t * H + h) * Dk;
      const float* al = a.alpha + (t * H + h) * Dk;
      const float* v = a.v + (t * H + h) * Dv;
      const double beta = D(a.beta[t * H + h]);
      for (int64_t j = 0; j < Dv; ++j) u[j] = 0.0;
      for (int64_t i = 0; i < Dk; ++i) {
        float* Si = S + i * Dv;
        const double ki = D(k[i]);
        const __m128 ai4 = _mm_set1_ps(al[i]);
        const __m256d ki4 = bcast(ki);
        int64_t j = 0;
        for (; j < Dv4; j += 4) {
          const __m128 s = _mm_mul_ps(ai4, _mm_loadu_ps(Si + j));  // f32 decay, as scalar
          _mm_storeu_ps(Si + j, s);
          _mm256_storeu_pd(u + j, _mm256_fmadd_pd(ki4, _mm256_cvtps_pd(s), _mm256_loadu_pd(u + j)));
        }
        for (; j < Dv; ++j) {
          Si[j] = al[i] * Si[j];
          u[j] += ki * D(Si[j]);
        }
      }
      {
        const __m256d beta4 = bcast(beta);
        int64_t j = 0;
        for (; j < Dv4; j += 4) {
          _mm256_storeu_pd(
              d + j, _mm256_mul_pd(beta4, _mm256_sub_pd(load4(v + j), _mm256_loadu_pd(u + j))));
          _mm256_storeu_pd(o + j, _mm256_setzero_pd());
        }
        for (; j < Dv; ++j) {
          d[j] = beta * (D(v[j]) - u[j]);
          o[j] = 0.0;
        }
      }
      for (int64_t i = 0; i < Dk; ++i) {
        float* Si = S + i * Dv;
        const double ki = D(k[i]), qi = D(q[i]);
        const __m256d ki4 = bcast(ki), qi4 = bcast(qi);
        int64_t j = 0;
        for (; j < Dv4; j += 4) {
          // S + k*d: inexact product, so multiply then add (no FMA), exactly as the scalar.
          const __m256d s =
              _mm256_add_pd(load4(Si + j), _mm256_mul_pd(ki4, _mm256_loadu_pd(d + j)));
          const __m128 sf = _mm256_cvtpd_ps(s);
          _mm_storeu_ps(Si + j, sf);
          _mm256_storeu_pd(o + j,
                           _mm256_fmadd_pd(qi4, _mm256_cvtps_pd(sf), _mm256_loadu_pd(o + j)));
        }
        for (; j < Dv; ++j) {
          Si[j] = F(D(Si[j]) + ki * d[j]);
          o[j] += qi * D(Si[j]);
        }
      }
      float* out = a.out + (t * H + h) * Dv;
      const __m256d qs = bcast(a.q_scale);
      int64_t j = 0;
      for (; j < Dv4; j += 4) store4(out + j, _mm256_mul_pd(qs, _mm256_loadu_pd(o + j)));
      for (; j < Dv; ++j) out[j] = F(a.q_scale * o[j]);
    }
  }
}

// ---- MLA, absorbed form (§8) -----------------------------------------------------------------

namespace {

// The double-vector trait of cpu/x86/mla_pass_vec.h: 4 doubles per register.
struct Avx2Doubles {
  using V = __m256d;
  static constexpr int kWidth = 4;
  static V zero() { return _mm256_setzero_pd(); }
  static V load(const double* p) { return _mm256_loadu_pd(p); }
  static void store(double* p, V v) { _mm256_storeu_pd(p, v); }
  static V set1(double v) { return _mm256_set1_pd(v); }
  static V add(V a, V b) { return _mm256_add_pd(a, b); }
  static V mul(V a, V b) { return _mm256_mul_pd(a, b); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
  static V widen(const float* p) { return load4(p); }
  // acc[q] = lanes 4q..4q+3. Pairs (l, l+8), (l, l+4), (l, l+2), (0, 1), as num::tree16.
  static double tree16(const V* acc) {
    const V b = _mm256_add_pd(_mm256_add_pd(acc[0], acc[2]), _mm256_add_pd(acc[1], acc[3]));
    const __m128d c = _mm_add_pd(_mm256_castpd256_pd128(b), _mm256_extractf128_pd(b, 1));
    return _mm_cvtsd_f64(_mm_add_sd(c, _mm_unpackhi_pd(c, c)));
  }
};

template <class A>
void mla_query_typed(const MlaArgs& a, const MlaPass& p, int64_t i0, int64_t i1) {
  const MlaDims& m = a.dims;
  const int64_t H = m.n_heads, dn = m.qk_nope, dr = m.qk_rope, dv = m.v_head, L = m.kv_lora;
  const int64_t L16 = L & ~int64_t{15};
  const auto* W = static_cast<const typename A::Storage*>(a.kv_b.data);
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t h = p.h0 + i;
    const float* q_n = a.q + (p.t * H + h) * (dn + dr);
    const typename A::Storage* w_uk = W + h * (dn + dv) * L;
    double* q_lat = p.q_lat + i * L;
    // 16 columns at a time in registers, summing over the nope index in order.
    for (int64_t c = 0; c < L16; c += 16) {
      __m256d s[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                      _mm256_setzero_pd()};
      for (int64_t k = 0; k < dn; ++k) {
        const __m256d qk = bcast(D(q_n[k]));
        const __m256 w0 = A::load8(w_uk + k * L + c), w1 = A::load8(w_uk + k * L + c + 8);
        s[0] = _mm256_fmadd_pd(lo4(w0), qk, s[0]);
        s[1] = _mm256_fmadd_pd(hi4(w0), qk, s[1]);
        s[2] = _mm256_fmadd_pd(lo4(w1), qk, s[2]);
        s[3] = _mm256_fmadd_pd(hi4(w1), qk, s[3]);
      }
      // Rounded to f32 (the spec's q_lat), then held widened for the score dots.
      for (int qd = 0; qd < 4; ++qd)
        _mm256_storeu_pd(q_lat + c + 4 * qd, _mm256_cvtps_pd(_mm256_cvtpd_ps(s[qd])));
    }
    for (int64_t c = L16; c < L; ++c) {
      double sc = 0.0;
      for (int64_t k = 0; k < dn; ++k) sc += A::Scalar::wide(w_uk[k * L + c]) * D(q_n[k]);
      q_lat[c] = D(F(sc));
    }
    x86::mla_widen<Avx2Doubles>(q_n + dn, dr, p.q_rope + i * dr);
  }
}

template <class A>
void mla_out_typed(const MlaArgs& a, const MlaPass& p, int64_t i0, int64_t i1, double* acc) {
  const MlaDims& m = a.dims;
  const int64_t H = m.n_heads, dn = m.qk_nope, dv = m.v_head, L = m.kv_lora;
  const auto* W = static_cast<const typename A::Storage*>(a.kv_b.data);
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t h = p.h0 + i;
    const typename A::Storage* w_uv = W + h * (dn + dv) * L + dn * L;
    x86::mla_widen<Avx2Doubles>(p.c_hat + i * L, L, acc);
    float* out = a.out + (p.t * H + h) * dv;
    for (int64_t r = 0; r < dv; ++r) out[r] = F(dot16_row<A>(w_uv + r * L, acc, L));
  }
}

}  // namespace

void mla_query_avx2(const MlaArgs& a, const MlaPass& p, int64_t i0, int64_t i1) {
  switch (a.kv_b.type) {
    case WeightType::kF32: return mla_query_typed<F32Weights>(a, p, i0, i1);
    case WeightType::kBF16: return mla_query_typed<Bf16Weights>(a, p, i0, i1);
    case WeightType::kF16: return mla_query_typed<F16Weights>(a, p, i0, i1);
    case WeightType::kMxfp4: return;  // rejected at the entry point
  }
}

void mla_scores_avx2(const MlaArgs& a, const MlaPass& p, int64_t s0, int64_t s1,
                     double* scratch) {
  x86::mla_scores_vec<Avx2Doubles>(a, p, s0, s1, scratch);
}

void mla_mix_avx2(const MlaArgs& a, const MlaPass& p, int64_t c0, int64_t c1, double* scratch) {
  x86::mla_mix_vec<Avx2Doubles>(a, p, c0, c1, scratch);
}

void mla_out_avx2(const MlaArgs& a, const MlaPass& p, int64_t i0, int64_t i1, double* scratch) {
  switch (a.kv_b.type) {
    case WeightType::kF32: return mla_out_typed<F32Weights>(a, p, i0, i1, scratch);
    case WeightType::kBF16: return mla_out_typed<Bf16Weights>(a, p, i0, i1, scratch);
    case WeightType::kF16: return mla_out_typed<F16Weights>(a, p, i0, i1, scratch);
    case WeightType::kMxfp4: return;  // rejected at the entry point
  }
}

// ---- AttnRes (§9) ----------------------------------------------------------------------------

void attnres_tokens_avx2(const AttnResArgs& a, int64_t t0, int64_t t1, double* scratch) {
  const int64_t n = a.n;
  for (int64_t t = t0; t < t1; ++t) {
    float* out = a.out + t * n;
    if (a.m == 1) {
      std::memcpy(out, a.src[0] + t * a.src_stride, static_cast<size_t>(n) * sizeof(float));
      continue;
    }
    for (int i = 0; i < a.m; ++i) {
      const float* v = a.src[i] + t * a.src_stride;
      const double ss = dot16_f32(v, v, n), vf = dot16_f32(v, a.f, n);
      scratch[i] = vf / std::sqrt(ss / static_cast<double>(n) + a.eps);
    }
    num::softmax_inplace(scratch, a.m);
    int64_t d = 0;
    for (; d + 4 <= n; d += 4) {
      __m256d acc = _mm256_setzero_pd();
      for (int i = 0; i < a.m; ++i)
        acc = _mm256_add_pd(
            acc, _mm256_mul_pd(bcast(scratch[i]), load4(a.src[i] + t * a.src_stride + d)));
      store4(out + d, acc);
    }
    for (; d < n; ++d) {
      double acc = 0.0;
      for (int i = 0; i < a.m; ++i) acc += scratch[i] * D(a.src[i][t * a.src_stride + d]);
      out[d] = F(acc);
    }
  }
}

}  // namespace ktier::cpu::avx2

namespace ktier::cpu {

const KernelTable kAvx2Kernels = {
    avx2::linear_rows_avx2,      avx2::rmsnorm_rows_avx2,       avx2::l2norm_rows_avx2,
    avx2::situ_glu_range_avx2,   avx2::sigmoid_range_avx2,      avx2::sigmoid_gate_range_avx2,
    avx2::add_range_avx2,        avx2::weighted_sum_range_avx2, avx2::short_conv_channels_avx2,
    avx2::decay_gate_range_avx2, avx2::recurrence_heads_avx2,   avx2::mla_query_avx2,
    avx2::mla_scores_avx2,       avx2::mla_mix_avx2,            avx2::mla_out_avx2,
    avx2::attnres_tokens_avx2,   avx2::router_tokens_avx2,      avx2::argmax_avx2,
    /*mxfp4_x_pairs_split=*/true,
};

}  // namespace ktier::cpu
