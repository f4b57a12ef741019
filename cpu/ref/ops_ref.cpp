// Scalar reference kernels for everything but the linear layers (NUMERICS.md §5-§10), and the
// scalar kernel table. Written to read like the contract; the AVX2 kernels reproduce each one
// bit for bit.

#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/kernel_table.h"
#include "cpu/numerics.h"
#include "cpu/ref/ref_kernels.h"

namespace ktier::cpu {

using num::D;
using num::F;

// ---- norms (§5) ------------------------------------------------------------------------------

void rmsnorm_rows_ref(const float* x, const float* gain, int64_t n, double eps, int64_t r0,
                      int64_t r1, float* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * n;
    const double inv = 1.0 / std::sqrt(num::dot16_f32(xr, xr, n) / static_cast<double>(n) + eps);
    for (int64_t i = 0; i < n; ++i) {
      double v = D(xr[i]) * inv;
      if (gain) v = v * D(gain[i]);
      out[r * n + i] = F(v);
    }
  }
}

void l2norm_rows_ref(const float* x, int64_t n, double eps, int64_t r0, int64_t r1, float* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * n;
    const double inv = 1.0 / std::sqrt(num::dot16_f32(xr, xr, n) + eps);
    for (int64_t i = 0; i < n; ++i) out[r * n + i] = F(D(xr[i]) * inv);
  }
}

// ---- elementwise (§6) ------------------------------------------------------------------------

void situ_glu_range_ref(const float* a, const float* b, double beta1, bool cap_up, double beta2,
                        int64_t i0, int64_t i1, float* out) {
  for (int64_t i = i0; i < i1; ++i) out[i] = F(num::situ(D(a[i]), D(b[i]), beta1, cap_up, beta2));
}

void sigmoid_range_ref(const float* x, int64_t i0, int64_t i1, float* out) {
  for (int64_t i = i0; i < i1; ++i) out[i] = F(num::sigmoid(D(x[i])));
}

void sigmoid_gate_range_ref(const float* x, const float* gate, int64_t i0, int64_t i1, float* out) {
  for (int64_t i = i0; i < i1; ++i) out[i] = F(D(x[i]) * num::sigmoid(D(gate[i])));
}

void add_range_ref(const float* a, const float* b, int64_t i0, int64_t i1, float* out) {
  for (int64_t i = i0; i < i1; ++i) out[i] = a[i] + b[i];
}

void weighted_sum_range_ref(const float* const* vec, const float* weight, int k, int64_t i0,
                            int64_t i1, float* out) {
  for (int64_t i = i0; i < i1; ++i) {
    double acc = 0.0;
    for (int j = 0; j < k; ++j) acc += D(weight[j]) * D(vec[j][i]);
    out[i] = F(acc);
  }
}

// ---- KDA (§7) --------------------------------------------------------------------------------

void short_conv_channels_ref(const ShortConvArgs& a, int64_t c0, int64_t c1) {
  const int64_t C = a.C, K = a.K, hist = K - 1;
  for (int64_t c = c0; c < c1; ++c) {
    for (int64_t t = 0; t < a.T; ++t) {
      double y = 0.0;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t s = t - hist + j;  // token index; negative = carried history
        const float v = s >= 0 ? a.u[s * C + c] : a.history[(hist + s) * C + c];
        y += D(a.w[c * K + j]) * D(v);
      }
      a.out[t * C + c] = F(num::silu(y));
    }
  }
  // New history = the last K-1 of (old history ++ u); entry q reads old entry q+T (> q) or u.
  for (int64_t c = c0; c < c1; ++c) {
    for (int64_t q = 0; q < hist; ++q) {
      const int64_t s = a.T - hist + q;
      a.history[q * C + c] = s >= 0 ? a.u[s * C + c] : a.history[(q + a.T) * C + c];
    }
  }
}

void decay_gate_range_ref(const DecayGateArgs& a, int64_t i0, int64_t i1) {
  const int64_t HD = static_cast<int64_t>(a.H) * a.D;
  for (int64_t e = i0; e < i1; ++e) {
    const int64_t c = e % HD, h = c / a.D;
    const double g = a.g_min * num::sigmoid(a.A[h] * (D(a.z[e]) + D(a.dt_bias[c])));
    if (a.g) a.g[e] = F(g);
    a.alpha[e] = F(std::exp(g));
  }
}

void recurrence_heads_ref(const RecurrenceArgs& a, int h0, int h1, double* scratch) {
  const int64_t Dk = a.Dk, Dv = a.Dv, H = a.H;
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
      // 1-2: decay row i (an f32 product), read u = S^T k from the decayed state.
      for (int64_t j = 0; j < Dv; ++j) u[j] = 0.0;
      for (int64_t i = 0; i < Dk; ++i) {
        float* Si = S + i * Dv;
        const double ki = D(k[i]);
        for (int64_t j = 0; j < Dv; ++j) {
          Si[j] = al[i] * Si[j];
          u[j] += ki * D(Si[j]);
        }
      }
      for (int64_t j = 0; j < Dv; ++j) {
        d[j] = beta * (D(v[j]) - u[j]);
        o[j] = 0.0;
      }
      // 3-4: delta write, then read the output from the updated row.
      for (int64_t i = 0; i < Dk; ++i) {
        float* Si = S + i * Dv;
        const double ki = D(k[i]), qi = D(q[i]);
        for (int64_t j = 0; j < Dv; ++j) {
          Si[j] = F(D(Si[j]) + ki * d[j]);
          o[j] += qi * D(Si[j]);
        }
      }
      float* out = a.out + (t * H + h) * Dv;
      for (int64_t j = 0; j < Dv; ++j) out[j] = F(a.q_scale * o[j]);
    }
  }
}

// ---- MLA (§8) --------------------------------------------------------------------------------

namespace {

template <class Wt>
void mla_query_typed_ref(const MlaArgs& a, const MlaPass& p, int64_t i0, int64_t i1) {
  const MlaDims& m = a.dims;
  const int64_t H = m.n_heads, dn = m.qk_nope, dr = m.qk_rope, dv = m.v_head, L = m.kv_lora;
  const auto* w = static_cast<const typename Wt::Storage*>(a.kv_b.data);
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t h = p.h0 + i;
    const float* q_n = a.q + (p.t * H + h) * (dn + dr);
    const typename Wt::Storage* w_uk = w + h * (dn + dv) * L;
    // q_lat = W_UK,h^T q_n: per column c, a sum over the nope index in increasing order.
    double* acc = p.q_lat + i * L;
    for (int64_t c = 0; c < L; ++c) acc[c] = 0.0;
    for (int64_t k = 0; k < dn; ++k) {
      const double qk = D(q_n[k]);
      for (int64_t c = 0; c < L; ++c) acc[c] += Wt::wide(w_uk[k * L + c]) * qk;
    }
    for (int64_t c = 0; c < L; ++c) acc[c] = D(F(acc[c]));
    for (int64_t k = 0; k < dr; ++k) p.q_rope[i * dr + k] = D(q_n[dn + k]);
  }
}

template <class Wt>
void mla_out_typed_ref(const MlaArgs& a, const MlaPass& p, int64_t i0, int64_t i1,
                       double* scratch) {
  const MlaDims& m = a.dims;
  const int64_t H = m.n_heads, dn = m.qk_nope, dv = m.v_head, L = m.kv_lora;
  const auto* w = static_cast<const typename Wt::Storage*>(a.kv_b.data);
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t h = p.h0 + i;
    const typename Wt::Storage* w_uv = w + h * (dn + dv) * L + dn * L;
    // o_h = W_UV,h c_hat: ordinary dot16 rows.
    for (int64_t c = 0; c < L; ++c) scratch[c] = D(p.c_hat[i * L + c]);
    float* out = a.out + (p.t * H + h) * dv;
    for (int64_t r = 0; r < dv; ++r) {
      double lane[num::kDotLanes] = {};
      num::dot16_accumulate<Wt>(lane, w_uv + r * L, scratch, 0, L);
      out[r] = F(num::tree16(lane));
    }
  }
}

}  // namespace

void mla_query_ref(const MlaArgs& a, const MlaPass& p, int64_t i0, int64_t i1) {
  switch (a.kv_b.type) {
    case WeightType::kF32: return mla_query_typed_ref<num::F32Weights>(a, p, i0, i1);
    case WeightType::kBF16: return mla_query_typed_ref<num::Bf16Weights>(a, p, i0, i1);
    case WeightType::kF16: return mla_query_typed_ref<num::F16Weights>(a, p, i0, i1);
    case WeightType::kMxfp4: return;  // rejected at the entry point
  }
}

// score_h(s) = (q_lat . c(s) + q_rope . r(s)) * scale, each dot a dot16 of exact products.
void mla_scores_ref(const MlaArgs& a, const MlaPass& p, int64_t s0, int64_t s1, double*) {
  const int64_t dr = a.dims.qk_rope, L = a.dims.kv_lora;
  for (int64_t s = s0; s < s1; ++s) {
    const float* cs = a.cache_c + s * L;
    const float* rs = a.cache_r + s * dr;
    for (int64_t i = 0; i < p.heads; ++i) {
      double lc[num::kDotLanes] = {}, lr[num::kDotLanes] = {};
      num::dot16_accumulate<num::F32Weights>(lc, cs, p.q_lat + i * L, 0, L);
      num::dot16_accumulate<num::F32Weights>(lr, rs, p.q_rope + i * dr, 0, dr);
      p.probs[i * p.n_pos + s] = (num::tree16(lc) + num::tree16(lr)) * a.scale;
    }
  }
}

// c_hat_h[c] = sum_s probs_h(s) c(s)[c], in position order; probs_s * c(s) is rounded before
// the add (no FMA).
void mla_mix_ref(const MlaArgs& a, const MlaPass& p, int64_t c0, int64_t c1, double*) {
  const int64_t L = a.dims.kv_lora;
  for (int64_t i = 0; i < p.heads; ++i) {
    const double* pr = p.probs + i * p.n_pos;
    for (int64_t c = c0; c < c1; ++c) {
      double acc = 0.0;
      for (int64_t s = 0; s < p.n_pos; ++s) acc += pr[s] * D(a.cache_c[s * L + c]);
      p.c_hat[i * L + c] = F(acc);
    }
  }
}

void mla_out_ref(const MlaArgs& a, const MlaPass& p, int64_t i0, int64_t i1, double* scratch) {
  switch (a.kv_b.type) {
    case WeightType::kF32: return mla_out_typed_ref<num::F32Weights>(a, p, i0, i1, scratch);
    case WeightType::kBF16: return mla_out_typed_ref<num::Bf16Weights>(a, p, i0, i1, scratch);
    case WeightType::kF16: return mla_out_typed_ref<num::F16Weights>(a, p, i0, i1, scratch);
    case WeightType::kMxfp4: return;  // rejected at the entry point
  }
}

// ---- AttnRes (§9) ----------------------------------------------------------------------------

void attnres_tokens_ref(const AttnResArgs& a, int64_t t0, int64_t t1, double* scratch) {
  const int64_t n = a.n;
  for (int64_t t = t0; t < t1; ++t) {
    float* out = a.out + t * n;
    if (a.m == 1) {
      std::memcpy(out, a.src[0] + t * a.src_stride, static_cast<size_t>(n) * sizeof(float));
      continue;
    }
    for (int i = 0; i < a.m; ++i) {
      const float* v = a.src[i] + t * a.src_stride;
      const double ss = num::dot16_f32(v, v, n), vf = num::dot16_f32(v, a.f, n);
      scratch[i] = vf / std::sqrt(ss / static_cast<double>(n) + a.eps);
    }
    num::softmax_inplace(scratch, a.m);
    for (int64_t d = 0; d < n; ++d) {
      double acc = 0.0;
      for (int i = 0; i < a.m; ++i) acc += scratch[i] * D(a.src[i][t * a.src_stride + d]);
      out[d] = F(acc);
    }
  }
}

// ---- router and argmax (§10) -----------------------------------------------------------------

void router_select_topk(const double* c, int n, int top_k, int32_t* ids, uint8_t* taken) {
  // Strictly-better scan in increasing index: ties keep the lower index; NaN loses to numbers.
  auto better = [](double x, double y) { return !std::isnan(x) && (std::isnan(y) || x > y); };
  std::fill(taken, taken + n, uint8_t{0});
  for (int j = 0; j < top_k; ++j) {
    int best = -1;
    for (int e = 0; e < n; ++e) {
      if (taken[e]) continue;
      if (best < 0 || better(c[e], c[best])) best = e;
    }
    taken[best] = 1;
    ids[j] = best;
  }
}

void router_tokens_ref(const RouterArgs& a, int64_t t0, int64_t t1, double* scratch) {
  const int n = a.n_experts;
  double* s = scratch;
  double* c = scratch + n;
  for (int64_t t = t0; t < t1; ++t) {
    const float* logits = a.logits + t * n;
    for (int e = 0; e < n; ++e) {
      s[e] = num::sigmoid(D(logits[e]));
      c[e] = a.bias ? s[e] + D(a.bias[e]) : s[e];
    }
    int32_t* ids = a.ids + t * a.top_k;
    router_select_topk(c, n, a.top_k, ids, reinterpret_cast<uint8_t*>(scratch + 2 * n));
    num::router_weights(s, ids, a.top_k, a.renormalize, a.scaling, a.weights + t * a.top_k);
  }
}

int64_t argmax_ref(const float* x, int64_t n) {
  int64_t best = -1;
  float best_v = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    if (std::isnan(v)) continue;
    if (best < 0 || v > best_v) {
      best = i;
      best_v = v;
    }
  }
  return best < 0 ? 0 : best;
}

const KernelTable kRefKernels = {
    linear_rows_ref,         rmsnorm_rows_ref,       l2norm_rows_ref,      situ_glu_range_ref,
    sigmoid_range_ref,       sigmoid_gate_range_ref, add_range_ref,        weighted_sum_range_ref,
    short_conv_channels_ref, decay_gate_range_ref,   recurrence_heads_ref, mla_query_ref,
    mla_scores_ref,          mla_mix_ref,            mla_out_ref,          attnres_tokens_ref,
    router_tokens_ref,       argmax_ref,             /*mxfp4_x_pairs_split=*/false,
};

}  // namespace ktier::cpu
