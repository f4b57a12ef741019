// AVX-512 linear kernels (NUMERICS.md §3, §4): float weights via traits, MXFP4 straight from the
// packed bytes. Bit-identical to cpu/ref/linear_ref.cpp. Compiled with -mavx512f -mavx512bw
// -mavx512dq -mavx512vl -mfma -mf16c (cpu/CMakeLists.txt); runs only when best_isa() /
// isa_supported(Isa::kAvx512) found all of them and the OS saves zmm state.
//
// How each contract step maps onto zmm registers (8 doubles each):
//  * dot16 (§3): the 16 lanes are two registers, acc[0] = lanes 0-7, acc[1] = lanes 8-15; each
//    16 weights are widened exactly (f32/bf16/f16 -> f32 -> double) and FMA'd (exact products).
//    The last n % 16 elements are loaded with zero masking: the extra products are +0 * +0 = +0,
//    and adding +0 leaves a lane bit for bit unchanged, because a lane starts at +0 and in
//    round-to-nearest can never become -0 (the one value +0 would change).
//  * MXFP4 (§4): a block's 8 lanes are one register, elements 8q..8q+7 (q = 0..3) are its four
//    FMA operands, so lane l sums elements l, l+8, l+16, l+24 in order. Nibbles are decoded
//    straight to doubles by a 16-entry table lookup across two registers (vpermi2pd), indexed by
//    the packed qword shifted so that each lane's nibble sits in bits 0-3 (the lookup ignores the
//    higher bits): no integer -> float conversion at all.
//  * Tree (§3 step 2 is tree8 of acc[0] + acc[1]; §4 step 4 is tree8): four outputs at a time in
//    registers, the same pairs in the same order.
//
// Tiling is a speed choice only: every (token, row) output keeps its own accumulators, so the
// tile shape never changes a result. Like the AVX2 files, this one uses no standard-library
// templates (see cpu/numerics.h).

#include <cstdint>
#include <cstring>

#include "cpu/kernel_table.h"
#include "cpu/numerics.h"
#include "cpu/x86/avx512_intrinsics.h"
#include "cpu/x86/avx512_kernels.h"
#include "cpu/x86/decode_prefetch.h"
#include "cpu/x86/panel_loop.h"

namespace ktier::cpu::avx512 {
namespace {

// Software prefetch for the decode (T = 1) tiles of 4 contiguous rows, whole tiles ahead, at
// least kPrefetchBytes (decode_prefetch.h). Four row streams are more than the hardware
// prefetchers keep ahead of (measured, bf16 [*, 7168] from DRAM: ~14 GB/s without, ~22 GB/s
// with).
#ifndef KTIER_AVX512_PREFETCH_BYTES
#define KTIER_AVX512_PREFETCH_BYTES 4096
#endif
constexpr int64_t kPrefetchBytes = KTIER_AVX512_PREFETCH_BYTES;
constexpr int64_t kTileRows = 4;  // decode tile height of both kernels

static inline int64_t prefetch_ahead(int64_t row_bytes) {
  return x86::whole_tiles_ahead(kTileRows * row_bytes, kPrefetchBytes);
}
using x86::prefetch_range;

// ---- weight element traits: 16 weights -> 16 f32 (exact); masked: missing ones are +0 ----------

struct F32Weights {
  using Storage = float;
  static __m512 load16(const Storage* p) { return _mm512_loadu_ps(p); }
  static __m512 load_part(const Storage* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
};
struct Bf16Weights {
  using Storage = uint16_t;
  static __m512 widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static __m512 load16(const Storage* p) {
    return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m512 load_part(const Storage* p, __mmask16 m) {
    return widen(_mm256_maskz_loadu_epi16(m, p));
  }
};
struct F16Weights {
  using Storage = uint16_t;
  static __m512 load16(const Storage* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m512 load_part(const Storage* p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
};

// f32 lanes 0-7 / 8-15 -> double (exact).
static inline __m512d lo8(__m512 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
static inline __m512d hi8(__m512 v) {
  return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

// ---- the tree ----------------------------------------------------------------------------------

// tree8 of four 8-lane vectors v0..v3, then F: a_l = v_l + v_{l+4} (l < 4), c_0 = a_0 + a_2,
// c_1 = a_1 + a_3, y = c_0 + c_1 (num::tree8, pair for pair). Lane k of the result is F(y) of v_k.
static inline __m128 tree8x4(__m512d v0, __m512d v1, __m512d v2, __m512d v3) {
  // [a0 a1 | a2 a3] of v0, then of v1 (128-bit chunks); likewise v2, v3.
  const __m512d a01 =
      _mm512_add_pd(_mm512_shuffle_f64x2(v0, v1, 0x44), _mm512_shuffle_f64x2(v0, v1, 0xEE));
  const __m512d a23 =
      _mm512_add_pd(_mm512_shuffle_f64x2(v2, v3, 0x44), _mm512_shuffle_f64x2(v2, v3, 0xEE));
  // [c0 c1] of v0, v1, v2, v3.
  const __m512d c =
      _mm512_add_pd(_mm512_shuffle_f64x2(a01, a23, 0x88), _mm512_shuffle_f64x2(a01, a23, 0xDD));
  const __m512d y = _mm512_add_pd(c, _mm512_permute_pd(c, 0x55));  // even lanes: c0 + c1
  const __m256 f = _mm512_cvtpd_ps(y);                             // round to nearest even
  return _mm256_castps256_ps128(
      _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6)));
}

// Finishes k outputs, four at a time: F(tree8(v[j])) -> *dst[j].
static inline void finish_outputs(const __m512d* v, int k, float* const* dst) {
  const __m512d z = _mm512_setzero_pd();
  for (int j0 = 0; j0 < k; j0 += 4) {
    const int m = k - j0 < 4 ? k - j0 : 4;
    const __m512d* u = v + j0;
    alignas(16) float out[4];
    _mm_store_ps(out, tree8x4(u[0], m > 1 ? u[1] : z, m > 2 ? u[2] : z, m > 3 ? u[3] : z));
    for (int j = 0; j < m; ++j) *dst[j0 + j] = out[j];
  }
}

// The 8-lane tree of a tile of NR rows x NT tokens at (r, tok), each output stored to y.
template <int NR, int NT>
static inline void store_tile(const __m512d (&lanes)[NR][NT], const LinearTask& task, int64_t r,
                              int64_t tok) {
  __m512d a[NR * NT];
  float* dst[NR * NT];
#pragma GCC unroll 12
  for (int rr = 0; rr < NR; ++rr)
#pragma GCC unroll 12
    for (int tt = 0; tt < NT; ++tt) {
      a[rr * NT + tt] = lanes[rr][tt];
      dst[rr * NT + tt] = task.y + (tok + tt) * task.w.rows + r + rr;
    }
  finish_outputs(a, NR * NT, dst);
}

// §3 step 2 for a tile of NR rows x NT tokens at (r, tok): a_l = L_l + L_{l+8}, then tree8.
template <int NR, int NT>
static inline void finish_tile(const __m512d (&acc)[NR][NT][2], const LinearTask& task, int64_t r,
                               int64_t tok) {
  __m512d a[NR][NT];
#pragma GCC unroll 12
  for (int rr = 0; rr < NR; ++rr)
#pragma GCC unroll 12
    for (int tt = 0; tt < NT; ++tt) a[rr][tt] = _mm512_add_pd(acc[rr][tt][0], acc[rr][tt][1]);
  store_tile(a, task, r, tok);
}

// ---- float weights (§3) ------------------------------------------------------------------------

// NR rows x NT tokens; each 16 weights are widened once and used NT times, each 16 x values are
// loaded once and used NR times. 2 * NR * NT accumulators + 2 * NT x + 2 weight registers: at
// most the 32 zmm registers.
template <class A, int NR, int NT>
void dense_tile(const LinearTask& task, int64_t r, int64_t tok) {
  static_assert(NR * NT <= 12, "accumulators, x and weights must fit the zmm registers");
  const int64_t n = task.w.cols;
  const auto* W = static_cast<const typename A::Storage*>(task.w.data) + r * n;
  const double* X = task.x_wide + tok * n;
  __m512d acc[NR][NT][2];
#pragma GCC unroll 12
  for (int rr = 0; rr < NR; ++rr)
#pragma GCC unroll 12
    for (int tt = 0; tt < NT; ++tt) acc[rr][tt][0] = acc[rr][tt][1] = _mm512_setzero_pd();
  const int64_t n16 = n & ~int64_t{15};
  // decode: prefetch whole tiles ahead (see kPrefetchBytes), one line per row per 64 bytes
  const int64_t ahead =
      NR == kTileRows && NT == 1 ? prefetch_ahead(n * sizeof(typename A::Storage)) : 0;
  for (int64_t i = 0; i < n16; i += 16) {
    __m512d x[NT][2];
#pragma GCC unroll 12
    for (int tt = 0; tt < NT; ++tt) {
      x[tt][0] = _mm512_loadu_pd(X + tt * n + i);
      x[tt][1] = _mm512_loadu_pd(X + tt * n + i + 8);
    }
    if (NR == kTileRows && NT == 1 && (i & (64 / sizeof(typename A::Storage) - 1)) == 0)
      for (int rr = 0; rr < NR; ++rr)
        _mm_prefetch(reinterpret_cast<const char*>(W + rr * n + i) + ahead, _MM_HINT_T0);
#pragma GCC unroll 12
    for (int rr = 0; rr < NR; ++rr) {
      const __m512 v = A::load16(W + rr * n + i);
      const __m512d w0 = lo8(v), w1 = hi8(v);
#pragma GCC unroll 12
      for (int tt = 0; tt < NT; ++tt) {
        acc[rr][tt][0] = _mm512_fmadd_pd(w0, x[tt][0], acc[rr][tt][0]);
        acc[rr][tt][1] = _mm512_fmadd_pd(w1, x[tt][1], acc[rr][tt][1]);
      }
    }
  }
  if (n16 < n) {  // the tail: element n16 + j goes to lane j, as in the scalar loop
    const __mmask16 m = static_cast<__mmask16>((1u << (n - n16)) - 1);
    const __mmask8 m0 = static_cast<__mmask8>(m & 0xff), m1 = static_cast<__mmask8>(m >> 8);
    __m512d x[NT][2];
#pragma GCC unroll 12
    for (int tt = 0; tt < NT; ++tt) {
      x[tt][0] = _mm512_maskz_loadu_pd(m0, X + tt * n + n16);
      x[tt][1] = _mm512_maskz_loadu_pd(m1, X + tt * n + n16 + 8);
    }
#pragma GCC unroll 12
    for (int rr = 0; rr < NR; ++rr) {
      const __m512 v = A::load_part(W + rr * n + n16, m);
      const __m512d w0 = lo8(v), w1 = hi8(v);
#pragma GCC unroll 12
      for (int tt = 0; tt < NT; ++tt) {
        acc[rr][tt][0] = _mm512_fmadd_pd(w0, x[tt][0], acc[rr][tt][0]);
        acc[rr][tt][1] = _mm512_fmadd_pd(w1, x[tt][1], acc[rr][tt][1]);
      }
    }
  }
  finish_tile<NR, NT>(acc, task, r, tok);
}

// ---- float weights, many tokens: blocked (kernel_table.h, x86/panel_loop.h) ---------------------

// Rows [p0, p1) x columns [k0, k1) widened to double (exact) into the slice, the last partial
// 16-lane block of a row padded with +0 (block_tile masks the matching x to +0).
template <class A>
void widen_slice(const LinearTask& task, int64_t p0, int64_t p1, int64_t k0, int64_t k1,
                 double* slice) {
  const int64_t n = task.w.cols, len16 = (k1 - k0) & ~int64_t{15};
  for (int64_t r = p0; r < p1; ++r) {
    const auto* W = static_cast<const typename A::Storage*>(task.w.data) + r * n + k0;
    double* d = slice + (r - p0) * kLinearBlockCols;
    for (int64_t i = 0; i < len16; i += 16) {
      const __m512 v = A::load16(W + i);
      _mm512_store_pd(d + i, lo8(v));
      _mm512_store_pd(d + i + 8, hi8(v));
    }
    if (len16 < k1 - k0) {  // only the last slice of a row whose width is not a multiple of 16
      const __m512 v =
          A::load_part(W + len16, static_cast<__mmask16>((1u << (k1 - k0 - len16)) - 1));
      _mm512_store_pd(d + len16, lo8(v));
      _mm512_store_pd(d + len16 + 8, hi8(v));
    }
  }
}

// NR rows x NT tokens over one slice: the accumulators start at +0 (first slice) or from the
// carry, run over the slice's columns exactly as dense_tile's, and go back to the carry or, after
// the last slice, through the tree to y. 2 * NR * NT accumulators + 2 * NR weights + 2 x.
template <int NR, int NT>
void block_tile(const LinearTask& task, const x86::LinearBlock& b, int64_t r, int64_t tok) {
  static_assert(NR * NT <= 12 && NR <= 2, "accumulators, weights and x must fit the zmm");
  const int64_t n = task.w.cols;
  const bool first = b.k0 == 0, last = b.k1 == n;
  __m512d acc[NR][NT][2];
#pragma GCC unroll 12
  for (int rr = 0; rr < NR; ++rr)
#pragma GCC unroll 12
    for (int tt = 0; tt < NT; ++tt) {
      const double* c = x86::carry_of(b, r + rr, tok + tt);
      acc[rr][tt][0] = first ? _mm512_setzero_pd() : _mm512_load_pd(c);
      acc[rr][tt][1] = first ? _mm512_setzero_pd() : _mm512_load_pd(c + 8);
    }
  const double* Wd = b.slice + (r - b.p0) * kLinearBlockCols;
  const double* X = task.x_wide + tok * n + b.k0;
  const int64_t len = b.k1 - b.k0, len16 = len & ~int64_t{15};
  for (int64_t i = 0; i < len16; i += 16) {
    __m512d w[NR][2];
#pragma GCC unroll 12
    for (int rr = 0; rr < NR; ++rr) {
      w[rr][0] = _mm512_load_pd(Wd + rr * kLinearBlockCols + i);
      w[rr][1] = _mm512_load_pd(Wd + rr * kLinearBlockCols + i + 8);
    }
#pragma GCC unroll 12
    for (int tt = 0; tt < NT; ++tt) {
      const __m512d x0 = _mm512_loadu_pd(X + tt * n + i), x1 = _mm512_loadu_pd(X + tt * n + i + 8);
#pragma GCC unroll 12
      for (int rr = 0; rr < NR; ++rr) {
        acc[rr][tt][0] = _mm512_fmadd_pd(w[rr][0], x0, acc[rr][tt][0]);
        acc[rr][tt][1] = _mm512_fmadd_pd(w[rr][1], x1, acc[rr][tt][1]);
      }
    }
  }
  if (len16 < len) {  // the row's tail: padded weights are +0, and so are the masked x values
    const __mmask16 m = static_cast<__mmask16>((1u << (len - len16)) - 1);
    const __mmask8 m0 = static_cast<__mmask8>(m & 0xff), m1 = static_cast<__mmask8>(m >> 8);
#pragma GCC unroll 12
    for (int tt = 0; tt < NT; ++tt) {
      const __m512d x0 = _mm512_maskz_loadu_pd(m0, X + tt * n + len16);
      const __m512d x1 = _mm512_maskz_loadu_pd(m1, X + tt * n + len16 + 8);
#pragma GCC unroll 12
      for (int rr = 0; rr < NR; ++rr) {
        const double* wp = Wd + rr * kLinearBlockCols + len16;
        acc[rr][tt][0] = _mm512_fmadd_pd(_mm512_load_pd(wp), x0, acc[rr][tt][0]);
        acc[rr][tt][1] = _mm512_fmadd_pd(_mm512_load_pd(wp + 8), x1, acc[rr][tt][1]);
      }
    }
  }
  if (!last) {
#pragma GCC unroll 12
    for (int rr = 0; rr < NR; ++rr)
#pragma GCC unroll 12
      for (int tt = 0; tt < NT; ++tt) {
        double* c = x86::carry_of(b, r + rr, tok + tt);
        _mm512_store_pd(c, acc[rr][tt][0]);
        _mm512_store_pd(c + 8, acc[rr][tt][1]);
      }
    return;
  }
  finish_tile<NR, NT>(acc, task, r, tok);
}

template <class A>
void dense_rows(const LinearTask& task, int64_t r0, int64_t r1, double* scratch) {
  if (task.n_tokens == 1) {  // decode: four rows share each x load
    const int64_t row_bytes = task.w.cols * static_cast<int64_t>(sizeof(typename A::Storage));
    const int64_t ahead = prefetch_ahead(row_bytes), range = (r1 - r0) * row_bytes;
    prefetch_range(static_cast<const typename A::Storage*>(task.w.data) + r0 * task.w.cols,
                   ahead < range ? ahead : range);
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) dense_tile<A, 4, 1>(task, r, 0);
    for (; r + 2 <= r1; r += 2) dense_tile<A, 2, 1>(task, r, 0);
    if (r < r1) dense_tile<A, 1, 1>(task, r, 0);
    return;
  }
  if (linear_blocked(task)) {  // tiles of 2 rows x 6 tokens over each widened slice
    x86::blocked_loop<2, 6>(
        task, r0, r1, scratch,
        [&](int64_t p0, int64_t p1, int64_t k0, int64_t k1, double* slice) {
          widen_slice<A>(task, p0, p1, k0, k1, slice);
        },
        [&]<int NR, int NT>(const x86::LinearBlock& b, int64_t r, int64_t t) {
          block_tile<NR, NT>(task, b, r, t);
        });
    return;
  }
  // 2-3 tokens: tiles of 4 rows x 3 tokens in panels (x86/panel_loop.h).
  x86::panel_loop<4, 3>(r0, r1, linear_panel_rows(task), task.n_tokens,
                        [&]<int NR, int NT>(int64_t r, int64_t t) {
                          dense_tile<A, NR, NT>(task, r, t);
                        });
}

// ---- MXFP4 (§4) --------------------------------------------------------------------------------

struct Mxfp4Decoder {
  __m512d lut_lo, lut_hi;    // 2*E2M1 of codes 0-7 and 8-15 (code 8, "-0", is +0.0)
  __m512i shift_a, shift_b;  // a packed qword holds 16 nibbles, element e at bits 4e..4e+3
};

static inline Mxfp4Decoder make_decoder() {
  alignas(64) double t[16];
  for (int k = 0; k < 16; ++k) t[k] = static_cast<double>(num::kE2M1Twice[k]);
  return {_mm512_load_pd(t), _mm512_load_pd(t + 8), _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28),
          _mm512_setr_epi64(32, 36, 40, 44, 48, 52, 56, 60)};
}

// 16 packed bytes (32 nibbles, low nibble = even element) -> d[q] = 2*E2M1 of elements
// 8q..8q+7, lane l = element 8q + l.
static inline void decode_block(const Mxfp4Decoder& dec, const uint8_t* p, __m512d* d) {
  uint64_t q0, q1;  // elements 0-15, 16-31
  std::memcpy(&q0, p, 8);
  std::memcpy(&q1, p + 8, 8);
  const __m512i v0 = _mm512_set1_epi64(static_cast<long long>(q0));
  const __m512i v1 = _mm512_set1_epi64(static_cast<long long>(q1));
  d[0] = _mm512_permutex2var_pd(dec.lut_lo, _mm512_srlv_epi64(v0, dec.shift_a), dec.lut_hi);
  d[1] = _mm512_permutex2var_pd(dec.lut_lo, _mm512_srlv_epi64(v0, dec.shift_b), dec.lut_hi);
  d[2] = _mm512_permutex2var_pd(dec.lut_lo, _mm512_srlv_epi64(v1, dec.shift_a), dec.lut_hi);
  d[3] = _mm512_permutex2var_pd(dec.lut_lo, _mm512_srlv_epi64(v1, dec.shift_b), dec.lut_hi);
}

// One decoded block against one token's 32 x values: block lanes from +0.0, elements in order
// (FMA: the products are exact); then R += block * 2^(s-128) (exact: one rounding, as the scalar
// add).
static inline __m512d block_accumulate(const __m512d* d, const __m512d* x, __m512d scale,
                                       __m512d R) {
  __m512d b = _mm512_fmadd_pd(d[0], x[0], _mm512_setzero_pd());
  b = _mm512_fmadd_pd(d[1], x[1], b);
  b = _mm512_fmadd_pd(d[2], x[2], b);
  b = _mm512_fmadd_pd(d[3], x[3], b);
  return _mm512_fmadd_pd(b, scale, R);
}

static inline void load_x32(const double* xp, __m512d* x) {
  for (int q = 0; q < 4; ++q) x[q] = _mm512_loadu_pd(xp + 8 * q);
}

// True if any of the n scale bytes is the zero block (255).
static inline bool has_zero_block(const uint8_t* s, int64_t n) {
  const __m512i z = _mm512_set1_epi8(static_cast<char>(num::kE8M0ZeroBlock));
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    if (_mm512_cmpeq_epi8_mask(_mm512_loadu_si512(s + i), z)) return true;
  if (i < n) {
    const __mmask64 m = (uint64_t{1} << (n - i)) - 1;
    if (_mm512_mask_cmpeq_epi8_mask(m, _mm512_maskz_loadu_epi8(m, s + i), z)) return true;
  }
  return false;
}

// Decode (T = 1), NR consecutive rows none of which has a zero block: no per-block branch; the
// x values of a block are loaded once for all NR rows.
template <int NR>
void mxfp4_rows_no_zero_block(const LinearTask& task, const Mxfp4Decoder& dec, int64_t r) {
  const int64_t n = task.w.cols, G = n / 32, stride = n / 2;
  const uint8_t* P = static_cast<const uint8_t*>(task.w.data) + r * stride;
  const uint8_t* S = task.w.scales + r * G;
  const int64_t ahead = prefetch_ahead(stride);
  __m512d R[NR];
  for (int rr = 0; rr < NR; ++rr) R[rr] = _mm512_setzero_pd();
  for (int64_t g = 0; g < G; ++g) {
    __m512d x[4];
    load_x32(task.x_wide + 32 * g, x);
    if ((g & 3) == 0)  // one line per row per 4 blocks
      for (int rr = 0; rr < NR; ++rr)
        _mm_prefetch(reinterpret_cast<const char*>(P + rr * stride + 16 * g + ahead), _MM_HINT_T0);
    for (int rr = 0; rr < NR; ++rr) {
      __m512d d[4];
      decode_block(dec, P + rr * stride + 16 * g, d);
      R[rr] = block_accumulate(d, x, _mm512_set1_pd(num::kHalfScale.v[S[rr * G + g]]), R[rr]);
    }
  }
  float* dst[NR];
  for (int rr = 0; rr < NR; ++rr) dst[rr] = task.y + r + rr;
  finish_outputs(R, NR, dst);
}

// NR MXFP4 rows against NT tokens, any scales: each block is decoded once and used NT times,
// each token's 32 x values are loaded once and used NR times; a zero block (D12) is skipped per
// row. 4 * NR decoded + NR * NT accumulators + 4 x + the decoder's 4: within the zmm registers.
template <int NR, int NT>
void mxfp4_tile(const LinearTask& task, const Mxfp4Decoder& dec, int64_t r, int64_t tok) {
  static_assert(NR * NT <= 8 && NR <= 2, "decoded blocks and accumulators must fit the zmm");
  const int64_t n = task.w.cols, G = n / 32;
  const uint8_t* P = static_cast<const uint8_t*>(task.w.data) + r * (n / 2);
  const uint8_t* S = task.w.scales + r * G;
  __m512d R[NR][NT];
#pragma GCC unroll 8
  for (int rr = 0; rr < NR; ++rr)
#pragma GCC unroll 8
    for (int tt = 0; tt < NT; ++tt) R[rr][tt] = _mm512_setzero_pd();
  for (int64_t g = 0; g < G; ++g) {
    __m512d d[NR][4], scale[NR];
    bool live[NR];
    bool any = false;
#pragma GCC unroll 8
    for (int rr = 0; rr < NR; ++rr) {
      const uint8_t s = S[rr * G + g];
      live[rr] = s != num::kE8M0ZeroBlock;  // D12: a zero block contributes nothing
      any = any || live[rr];
      if (!live[rr]) continue;
      decode_block(dec, P + rr * (n / 2) + 16 * g, d[rr]);
      scale[rr] = _mm512_set1_pd(num::kHalfScale.v[s]);
    }
    if (!any) continue;
#pragma GCC unroll 8
    for (int tt = 0; tt < NT; ++tt) {
      __m512d x[4];
      load_x32(task.x_wide + (tok + tt) * n + 32 * g, x);
#pragma GCC unroll 8
      for (int rr = 0; rr < NR; ++rr)
        if (live[rr]) R[rr][tt] = block_accumulate(d[rr], x, scale[rr], R[rr][tt]);
    }
  }
  store_tile(R, task, r, tok);
}

void mxfp4_rows(const LinearTask& task, int64_t r0, int64_t r1) {
  const Mxfp4Decoder dec = make_decoder();
  const int64_t G = task.w.cols / 32;
  if (task.n_tokens == 1) {
    // Decode: the weights are usually cold (an expert just read or mapped). Start fetching the
    // first tiles (the tiles then prefetch ahead themselves), then scan the range's scales once
    // for zero blocks: independent loads, where one scan per tile would wait for each line.
    const int64_t stride = task.w.cols / 2, range = (r1 - r0) * stride;
    const int64_t ahead = prefetch_ahead(stride);
    prefetch_range(static_cast<const uint8_t*>(task.w.data) + r0 * stride,
                   ahead < range ? ahead : range);
    const bool any_zero_block = has_zero_block(task.w.scales + r0 * G, (r1 - r0) * G);
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
      if (!any_zero_block || !has_zero_block(task.w.scales + r * G, 4 * G)) {
        mxfp4_rows_no_zero_block<4>(task, dec, r);
      } else {  // rare: row by row, skipping the zero blocks
        for (int k = 0; k < 4; ++k) mxfp4_tile<1, 1>(task, dec, r + k, 0);
      }
    }
    for (; r < r1; ++r) mxfp4_tile<1, 1>(task, dec, r, 0);
    return;
  }
  // Several tokens: tiles of 2 rows x 4 tokens in panels (x86/panel_loop.h).
  x86::panel_loop<2, 4>(r0, r1, linear_panel_rows(task), task.n_tokens,
                        [&]<int NR, int NT>(int64_t r, int64_t t) {
                          mxfp4_tile<NR, NT>(task, dec, r, t);
                        });
}

}  // namespace

void linear_rows_avx512(const LinearTask& task, int64_t r0, int64_t r1, double* scratch) {
  switch (task.w.type) {
    case WeightType::kF32: return dense_rows<F32Weights>(task, r0, r1, scratch);
    case WeightType::kBF16: return dense_rows<Bf16Weights>(task, r0, r1, scratch);
    case WeightType::kF16: return dense_rows<F16Weights>(task, r0, r1, scratch);
    case WeightType::kMxfp4: return mxfp4_rows(task, r0, r1);
  }
}

}  // namespace ktier::cpu::avx512
