#pragma once
// Internal: the scalar building blocks of the numerics contract (docs/NUMERICS.md).
//
// The `_ref` kernels are written with these, and the AVX2 kernels use them for their scalar
// tails and per-element transcendentals, so both follow one definition. Everything here has
// internal linkage (anonymous namespace): each translation unit gets its own copy compiled with
// its own flags, so the linker can never hand an AVX2-compiled copy to a scalar caller. For the
// same reason the AVX2 translation units use no standard-library templates (not even std::min
// or std::bit_cast: an out-of-line instance could be merged across translation units).
//
// Notation used in the comments: D(x) widens f32 -> double (exact); F(v) rounds double -> f32
// (round to nearest even). -ffp-contract=off is required: a*b+c here is two roundings.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu/float_bits.h"

namespace ktier::cpu::num {
namespace {  // internal linkage, see above

static inline double D(float x) { return static_cast<double>(x); }
static inline float F(double v) { return static_cast<float>(v); }

// ---- element widening (exact) ------------------------------------------------------------

// The exact widenings of cpu/float_bits.h, here as num:: like the rest of the contract.
using float_bits::bf16_to_f32;
using float_bits::bits_to_f32;
using float_bits::f16_to_f32;
using float_bits::f32_to_bits;

// Weight element traits: storage type and exact widening to double. Every widened weight has
// at most 24 significant bits, so its product with an f32 activation is exact in double.
struct F32Weights {
  using Storage = float;
  static double wide(Storage v) { return static_cast<double>(v); }
};
struct Bf16Weights {
  using Storage = uint16_t;
  static double wide(Storage v) { return static_cast<double>(bf16_to_f32(v)); }
};
struct F16Weights {
  using Storage = uint16_t;
  static double wide(Storage v) { return static_cast<double>(f16_to_f32(v)); }
};

// ---- fixed-order sums (NUMERICS.md §3) ---------------------------------------------------

inline constexpr int kDotLanes = 16;

// The pairwise tree over 16 lanes: (l, l+8), then (l, l+4), (l, l+2), (0, 1).
static inline double tree16(const double* lane) {
  double a[8], b[4];
  for (int l = 0; l < 8; ++l) a[l] = lane[l] + lane[l + 8];
  for (int l = 0; l < 4; ++l) b[l] = a[l] + a[l + 4];
  const double c0 = b[0] + b[2], c1 = b[1] + b[3];
  return c0 + c1;
}

// The same tree over 8 lanes: (l, l+4), (l, l+2), (0, 1).
static inline double tree8(const double* lane) {
  double b[4];
  for (int l = 0; l < 4; ++l) b[l] = lane[l] + lane[l + 4];
  const double c0 = b[0] + b[2], c1 = b[1] + b[3];
  return c0 + c1;
}

// dot16: lane l accumulates, from +0.0 and in increasing i, the exact products of the elements
// i with i % 16 == l; the lanes are combined by tree16. `lane` carries partial lanes in and out
// so a vector kernel can hand over its tail; start from all +0.0.
template <class W>
static inline void dot16_accumulate(double* lane, const typename W::Storage* w, const double* x,
                                    int64_t i0, int64_t n) {
  for (int64_t i = i0; i < n; ++i) lane[i & 15] += W::wide(w[i]) * x[i];
}
static inline void dot16_accumulate_f32(double* lane, const float* a, const float* b, int64_t i0,
                                        int64_t n) {
  for (int64_t i = i0; i < n; ++i) lane[i & 15] += D(a[i]) * D(b[i]);
}
static inline double dot16_f32(const float* a, const float* b, int64_t n) {
  double lane[kDotLanes] = {};
  dot16_accumulate_f32(lane, a, b, 0, n);
  return tree16(lane);
}

// ---- MXFP4 (NUMERICS.md §4) --------------------------------------------------------------

// Twice the E2M1 value of each nibble (bit 3 sign, bits 0-2 magnitude); code 8 (-0) is 0.
inline constexpr int8_t kE2M1Twice[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
// The E2M1 values themselves (decoder), code 8 = -0.0f.
inline constexpr float kE2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
inline constexpr uint8_t kE8M0ZeroBlock = 255;  // D12: the block contributes nothing

struct HalfScaleTable {
  double v[256];
};
// v[s] = 2^(s-128): the E8M0 multiplier for half-unit (kE2M1Twice) block sums. Exact normal
// doubles; v[255] is unused (zero block).
constexpr HalfScaleTable make_half_scales() {
  HalfScaleTable t{};
  double p = 1.0;  // 2^(s-128), built by exact halvings and doublings
  for (int s = 128; s >= 0; --s, p *= 0.5) t.v[s] = p;
  p = 2.0;
  for (int s = 129; s < 255; ++s, p *= 2.0) t.v[s] = p;
  t.v[255] = 0.0;
  return t;
}
inline constexpr HalfScaleTable kHalfScale = make_half_scales();

// ---- transcendentals (NUMERICS.md §2): libm, double, one call per element -------------------

static inline double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
static inline double silu(double v) { return v * sigmoid(v); }
static inline double situ(double a, double b, double beta1, bool cap_up, double beta2) {
  const double gate = (beta1 * std::tanh(a / beta1)) * sigmoid(a);
  const double up = cap_up ? beta2 * std::tanh(b / beta2) : b;
  return gate * up;
}

// Softmax in place over s[0..m): max by strict '>' scan from s[0]; e = exp(s - max);
// sum in index order; s[i] = e[i] / sum. Used identically by every kernel that needs it.
static inline void softmax_inplace(double* s, int64_t m) {
  double mx = s[0];
  for (int64_t i = 1; i < m; ++i)
    if (s[i] > mx) mx = s[i];
  double sum = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    s[i] = std::exp(s[i] - mx);
    sum += s[i];
  }
  for (int64_t i = 0; i < m; ++i) s[i] = s[i] / sum;
}

// ---- router (NUMERICS.md §10) -------------------------------------------------------------

inline constexpr double kRouterRenormEps = 1e-20;  // D5, added to the top-k weight sum

// Weights of the selected experts from the unbiased scores s: sum in selection order,
// w / (sum + 1e-20) when renormalising with k > 1, then times scaling; one rounding to f32.
static inline void router_weights(const double* s, const int32_t* ids, int k, bool renormalize,
                                  double scaling, float* out) {
  double sum = 0.0;
  for (int j = 0; j < k; ++j) sum += s[ids[j]];
  const double denom = sum + kRouterRenormEps;
  for (int j = 0; j < k; ++j) {
    double w = s[ids[j]];
    if (renormalize && k > 1) w = w / denom;
    out[j] = F(w * scaling);
  }
}

}  // namespace
}  // namespace ktier::cpu::num
