// AVX2 kernels for norms, elementwise ops, the KDA short conv and decay gate, the router and
// argmax (NUMERICS.md §5-§7, §10). Each is op for op the scalar kernel in cpu/ref/ops_ref.cpp,
// four lanes at a time, with the scalar formula for the tail and the same libm call per element.

#include "cpu/kernel_table.h"
#include "cpu/x86/avx2_common.h"
#include "cpu/x86/avx2_kernels.h"

namespace ktier::cpu::avx2 {

using num::D;
using num::F;

namespace {
// Not std::isnan: see the note on standard-library functions in avx2_common.h.
inline bool is_nan(float v) { return v != v; }
}  // namespace

// ---- norms (§5) ------------------------------------------------------------------------------

void rmsnorm_rows_avx2(const float* x, const float* gain, int64_t n, double eps, int64_t r0,
                       int64_t r1, float* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * n;
    float* o = out + r * n;
    const double inv = 1.0 / std::sqrt(dot16_f32(xr, xr, n) / static_cast<double>(n) + eps);
    const __m256d vinv = bcast(inv);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      __m256d v = _mm256_mul_pd(load4(xr + i), vinv);
      if (gain) v = _mm256_mul_pd(v, load4(gain + i));
      store4(o + i, v);
    }
    for (; i < n; ++i) {
      double v = D(xr[i]) * inv;
      if (gain) v = v * D(gain[i]);
      o[i] = F(v);
    }
  }
}

void l2norm_rows_avx2(const float* x, int64_t n, double eps, int64_t r0, int64_t r1, float* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * n;
    float* o = out + r * n;
    const double inv = 1.0 / std::sqrt(dot16_f32(xr, xr, n) + eps);
    const __m256d vinv = bcast(inv);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) store4(o + i, _mm256_mul_pd(load4(xr + i), vinv));
    for (; i < n; ++i) o[i] = F(D(xr[i]) * inv);
  }
}

// ---- elementwise (§6) ------------------------------------------------------------------------

void situ_glu_range_avx2(const float* a, const float* b, double beta1, bool cap_up, double beta2,
                         int64_t i0, int64_t i1, float* out) {
  const __m256d b1 = bcast(beta1), b2 = bcast(beta2);
  int64_t i = i0;
  for (; i + 4 <= i1; i += 4) {
    const __m256d va = load4(a + i), vb = load4(b + i);
    const __m256d gate =
        _mm256_mul_pd(_mm256_mul_pd(b1, tanh4(_mm256_div_pd(va, b1))), sigmoid4(va));
    const __m256d up = cap_up ? _mm256_mul_pd(b2, tanh4(_mm256_div_pd(vb, b2))) : vb;
    store4(out + i, _mm256_mul_pd(gate, up));
  }
  for (; i < i1; ++i) out[i] = F(num::situ(D(a[i]), D(b[i]), beta1, cap_up, beta2));
}

void sigmoid_range_avx2(const float* x, int64_t i0, int64_t i1, float* out) {
  int64_t i = i0;
  for (; i + 4 <= i1; i += 4) store4(out + i, sigmoid4(load4(x + i)));
  for (; i < i1; ++i) out[i] = F(num::sigmoid(D(x[i])));
}

void sigmoid_gate_range_avx2(const float* x, const float* gate, int64_t i0, int64_t i1,
                             float* out) {
  int64_t i = i0;
  for (; i + 4 <= i1; i += 4)
    store4(out + i, _mm256_mul_pd(load4(x + i), sigmoid4(load4(gate + i))));
  for (; i < i1; ++i) out[i] = F(D(x[i]) * num::sigmoid(D(gate[i])));
}

void add_range_avx2(const float* a, const float* b, int64_t i0, int64_t i1, float* out) {
  int64_t i = i0;
  for (; i + 8 <= i1; i += 8)
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  for (; i < i1; ++i) out[i] = a[i] + b[i];
}

void weighted_sum_range_avx2(const float* const* vec, const float* weight, int k, int64_t i0,
                             int64_t i1, float* out) {
  int64_t i = i0;
  for (; i + 4 <= i1; i += 4) {
    __m256d acc = _mm256_setzero_pd();
    for (int j = 0; j < k; ++j) acc = _mm256_fmadd_pd(bcast(D(weight[j])), load4(vec[j] + i), acc);
    store4(out + i, acc);
  }
  for (; i < i1; ++i) {
    double acc = 0.0;
    for (int j = 0; j < k; ++j) acc += D(weight[j]) * D(vec[j][i]);
    out[i] = F(acc);
  }
}

// ---- KDA short conv and decay gate (§7) ------------------------------------------------------

void short_conv_channels_avx2(const ShortConvArgs& a, int64_t c0, int64_t c1) {
  const int64_t C = a.C, K = a.K, hist = K - 1;
  int64_t c = c0;
  for (; c + 4 <= c1; c += 4) {
    for (int64_t t = 0; t < a.T; ++t) {
      __m256d y = _mm256_setzero_pd();
      for (int64_t j = 0; j < K; ++j) {
        const int64_t s = t - hist + j;
        const float* src = s >= 0 ? a.u + s * C : a.history + (hist + s) * C;
        const __m256d w = _mm256_setr_pd(D(a.w[c * K + j]), D(a.w[(c + 1) * K + j]),
                                         D(a.w[(c + 2) * K + j]), D(a.w[(c + 3) * K + j]));
        y = _mm256_fmadd_pd(w, load4(src + c), y);  // exact f32 x f32 product
      }
      store4(a.out + t * C + c, _mm256_mul_pd(y, sigmoid4(y)));
    }
  }
  for (; c < c1; ++c) {
    for (int64_t t = 0; t < a.T; ++t) {
      double y = 0.0;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t s = t - hist + j;
        const float v = s >= 0 ? a.u[s * C + c] : a.history[(hist + s) * C + c];
        y += D(a.w[c * K + j]) * D(v);
      }
      a.out[t * C + c] = F(num::silu(y));
    }
  }
  for (int64_t ch = c0; ch < c1; ++ch) {
    for (int64_t q = 0; q < hist; ++q) {
      const int64_t s = a.T - hist + q;
      a.history[q * C + ch] = s >= 0 ? a.u[s * C + ch] : a.history[(q + a.T) * C + ch];
    }
  }
}

void decay_gate_range_avx2(const DecayGateArgs& a, int64_t i0, int64_t i1) {
  const int64_t HD = static_cast<int64_t>(a.H) * a.D;
  const __m256d g_min = bcast(a.g_min);
  int64_t e = i0;
  for (; e + 4 <= i1; e += 4) {
    alignas(32) double A[4], bias[4];
    for (int l = 0; l < 4; ++l) {
      const int64_t c = (e + l) % HD;
      A[l] = a.A[c / a.D];
      bias[l] = D(a.dt_bias[c]);
    }
    const __m256d arg =
        _mm256_mul_pd(_mm256_load_pd(A), _mm256_add_pd(load4(a.z + e), _mm256_load_pd(bias)));
    const __m256d g = _mm256_mul_pd(g_min, sigmoid4(arg));
    if (a.g) store4(a.g + e, g);
    store4(a.alpha + e, exp4(g));
  }
  for (; e < i1; ++e) {
    const int64_t c = e % HD, h = c / a.D;
    const double g = a.g_min * num::sigmoid(a.A[h] * (D(a.z[e]) + D(a.dt_bias[c])));
    if (a.g) a.g[e] = F(g);
    a.alpha[e] = F(std::exp(g));
  }
}

// ---- router and argmax (§10) -----------------------------------------------------------------

void router_tokens_avx2(const RouterArgs& a, int64_t t0, int64_t t1, double* scratch) {
  const int n = a.n_experts;
  double* s = scratch;
  double* c = scratch + n;
  for (int64_t t = t0; t < t1; ++t) {
    const float* logits = a.logits + t * n;
    int e = 0;
    for (; e + 4 <= n; e += 4) {
      const __m256d sv = sigmoid4(load4(logits + e));
      _mm256_storeu_pd(s + e, sv);
      _mm256_storeu_pd(c + e, a.bias ? _mm256_add_pd(sv, load4(a.bias + e)) : sv);
    }
    for (; e < n; ++e) {
      s[e] = num::sigmoid(D(logits[e]));
      c[e] = a.bias ? s[e] + D(a.bias[e]) : s[e];
    }
    int32_t* ids = a.ids + t * a.top_k;
    // Shared scalar selection (kernel_table.h); its flags in the scratch's third n.
    router_select_topk(c, n, a.top_k, ids, reinterpret_cast<uint8_t*>(scratch + 2 * n));
    num::router_weights(s, ids, a.top_k, a.renormalize, a.scaling, a.weights + t * a.top_k);
  }
}

// Eight interleaved lanes each track their first maximum (strict '>', NaN skipped, -0 == +0);
// the lanes are merged by value then lowest index, and the scalar rule finishes the tail. This
// returns the first index of the global maximum, exactly as argmax_ref.
int64_t argmax_avx2(const float* x, int64_t n) {
  const int64_t n8 = (n < (int64_t{1} << 30)) ? (n & ~int64_t{7}) : 0;
  int64_t best = -1;
  float best_v = 0.0f;
  if (n8 > 0) {
    __m256 bv = _mm256_set1_ps(0.0f);
    __m256i bi = _mm256_set1_epi32(-1);
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i step = _mm256_set1_epi32(8);
    for (int64_t i = 0; i < n8; i += 8, idx = _mm256_add_epi32(idx, step)) {
      const __m256 v = _mm256_loadu_ps(x + i);
      const __m256 ordered = _mm256_cmp_ps(v, v, _CMP_ORD_Q);
      const __m256 empty = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_setzero_si256(), bi));
      const __m256 take =
          _mm256_or_ps(_mm256_and_ps(empty, ordered), _mm256_cmp_ps(v, bv, _CMP_GT_OQ));
      bv = _mm256_blendv_ps(bv, v, take);
      bi = _mm256_castps_si256(
          _mm256_blendv_ps(_mm256_castsi256_ps(bi), _mm256_castsi256_ps(idx), take));
    }
    alignas(32) float lv[8];
    alignas(32) int32_t li[8];
    _mm256_store_ps(lv, bv);
    _mm256_store_si256(reinterpret_cast<__m256i*>(li), bi);
    for (int l = 0; l < 8; ++l) {
      if (li[l] < 0) continue;
      if (best < 0 || lv[l] > best_v || (lv[l] == best_v && li[l] < best)) {
        best = li[l];
        best_v = lv[l];
      }
    }
  }
  for (int64_t i = n8; i < n; ++i) {
    const float v = x[i];
    if (is_nan(v)) continue;
    if (best < 0 || v > best_v) {
      best = i;
      best_v = v;
    }
  }
  return best < 0 ? 0 : best;
}

}  // namespace ktier::cpu::avx2
