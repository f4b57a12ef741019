// AVX2 linear kernels (NUMERICS.md §3, §4): float weights via traits, MXFP4 straight from the
// packed bytes. Bit-identical to cpu/ref/linear_ref.cpp.
//
// Tiling is a speed choice only: every (token, row) output keeps its own accumulators, so the
// tile shape never changes a result.

#include "cpu/kernel_table.h"
#include "cpu/x86/avx2_common.h"
#include "cpu/x86/avx2_kernels.h"
#include "cpu/x86/decode_prefetch.h"
#include "cpu/x86/panel_loop.h"

namespace ktier::cpu::avx2 {
namespace {

// Decode (T = 1) tiles are kTileRows contiguous rows, prefetched whole tiles ahead, at least
// kPrefetchBytes (decode_prefetch.h).
constexpr int64_t kPrefetchBytes = 4096;
constexpr int64_t kTileRows = 2;

static inline int64_t prefetch_ahead(int64_t row_bytes) {
  return x86::whole_tiles_ahead(kTileRows * row_bytes, kPrefetchBytes);
}
using x86::prefetch_range;

// NR rows x NT tokens of float weights; each 16 weights are widened once and used NT times.
template <class A, int NR, int NT>
void dense_tile(const LinearTask& task, int64_t r, int64_t tok) {
  const int64_t n = task.w.cols, rows = task.w.rows;
  const auto* W = static_cast<const typename A::Storage*>(task.w.data);
  __m256d acc[NR][NT][4];
  for (int rr = 0; rr < NR; ++rr)
    for (int tt = 0; tt < NT; ++tt)
      for (int q = 0; q < 4; ++q) acc[rr][tt][q] = _mm256_setzero_pd();
  const int64_t n16 = n & ~int64_t{15};
  const int64_t ahead =
      NR == kTileRows && NT == 1 ? prefetch_ahead(n * sizeof(typename A::Storage)) : 0;
  for (int64_t i = 0; i < n16; i += 16) {
    if (NR == kTileRows && NT == 1 && (i & (64 / sizeof(typename A::Storage) - 1)) == 0)
      for (int rr = 0; rr < NR; ++rr)
        _mm_prefetch(reinterpret_cast<const char*>(W + (r + rr) * n + i) + ahead, _MM_HINT_T0);
    for (int rr = 0; rr < NR; ++rr) {
      const auto* wp = W + (r + rr) * n + i;
      const __m256 a = A::load8(wp), b = A::load8(wp + 8);
      const __m256d w0 = lo4(a), w1 = hi4(a), w2 = lo4(b), w3 = hi4(b);
#pragma GCC unroll 4
      for (int tt = 0; tt < NT; ++tt) {
        const double* xp = task.x_wide + (tok + tt) * n + i;
        acc[rr][tt][0] = _mm256_fmadd_pd(w0, _mm256_loadu_pd(xp), acc[rr][tt][0]);
        acc[rr][tt][1] = _mm256_fmadd_pd(w1, _mm256_loadu_pd(xp + 4), acc[rr][tt][1]);
        acc[rr][tt][2] = _mm256_fmadd_pd(w2, _mm256_loadu_pd(xp + 8), acc[rr][tt][2]);
        acc[rr][tt][3] = _mm256_fmadd_pd(w3, _mm256_loadu_pd(xp + 12), acc[rr][tt][3]);
      }
    }
  }
  for (int rr = 0; rr < NR; ++rr) {
    for (int tt = 0; tt < NT; ++tt) {
      double lane[16];
      store_lanes16(lane, acc[rr][tt]);
      num::dot16_accumulate<typename A::Scalar>(lane, W + (r + rr) * n,
                                                task.x_wide + (tok + tt) * n, n16, n);
      task.y[(tok + tt) * rows + r + rr] = num::F(num::tree16(lane));
    }
  }
}

// ---- float weights, many tokens: blocked (kernel_table.h, x86/panel_loop.h) ---------------------

// Rows [p0, p1) x columns [k0, k1) widened to double (exact) into the slice: whole 16-lane
// blocks only; a row's tail past its last whole block stays in the weights (block_tile's scalar
// tail, as dense_tile's).
template <class A>
void widen_slice(const LinearTask& task, int64_t p0, int64_t p1, int64_t k0, int64_t k1,
                 double* slice) {
  const int64_t n = task.w.cols, len16 = (k1 - k0) & ~int64_t{15};
  for (int64_t r = p0; r < p1; ++r) {
    const auto* W = static_cast<const typename A::Storage*>(task.w.data) + r * n + k0;
    double* d = slice + (r - p0) * kLinearBlockCols;
    for (int64_t i = 0; i < len16; i += 8) {
      const __m256 v = A::load8(W + i);
      _mm256_store_pd(d + i, lo4(v));
      _mm256_store_pd(d + i + 4, hi4(v));
    }
  }
}

// One row x NT tokens over one slice: the accumulators start at +0 (first slice) or from the
// carry, run over the slice's whole blocks exactly as dense_tile's, and go back to the carry or,
// after the last slice, take the scalar tail and the tree to y. 4 * NT accumulators + 4 weights.
template <int NR, int NT, class A>
void block_tile(const LinearTask& task, const x86::LinearBlock& b, int64_t r, int64_t tok) {
  static_assert(NR == 1 && NT <= 3, "accumulators and weights must fit the ymm registers");
  const int64_t n = task.w.cols, rows = task.w.rows;
  const bool first = b.k0 == 0, last = b.k1 == n;
  __m256d acc[NT][4];
#pragma GCC unroll 4
  for (int tt = 0; tt < NT; ++tt) {
    const double* c = x86::carry_of(b, r, tok + tt);
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q)
      acc[tt][q] = first ? _mm256_setzero_pd() : _mm256_load_pd(c + 4 * q);
  }
  const double* Wd = b.slice + (r - b.p0) * kLinearBlockCols;
  const int64_t len16 = (b.k1 - b.k0) & ~int64_t{15};
  for (int64_t i = 0; i < len16; i += 16) {
    const __m256d w0 = _mm256_load_pd(Wd + i), w1 = _mm256_load_pd(Wd + i + 4);
    const __m256d w2 = _mm256_load_pd(Wd + i + 8), w3 = _mm256_load_pd(Wd + i + 12);
#pragma GCC unroll 4
    for (int tt = 0; tt < NT; ++tt) {
      const double* xp = task.x_wide + (tok + tt) * n + b.k0 + i;
      acc[tt][0] = _mm256_fmadd_pd(w0, _mm256_loadu_pd(xp), acc[tt][0]);
      acc[tt][1] = _mm256_fmadd_pd(w1, _mm256_loadu_pd(xp + 4), acc[tt][1]);
      acc[tt][2] = _mm256_fmadd_pd(w2, _mm256_loadu_pd(xp + 8), acc[tt][2]);
      acc[tt][3] = _mm256_fmadd_pd(w3, _mm256_loadu_pd(xp + 12), acc[tt][3]);
    }
  }
  if (!last) {
#pragma GCC unroll 4
    for (int tt = 0; tt < NT; ++tt) store_lanes16(x86::carry_of(b, r, tok + tt), acc[tt]);
    return;
  }
  const auto* W = static_cast<const typename A::Storage*>(task.w.data) + r * n;
  for (int tt = 0; tt < NT; ++tt) {
    double lane[16];
    store_lanes16(lane, acc[tt]);
    num::dot16_accumulate<typename A::Scalar>(lane, W, task.x_wide + (tok + tt) * n,
                                              b.k0 + len16, n);
    task.y[(tok + tt) * rows + r] = num::F(num::tree16(lane));
  }
}

template <class A>
void dense_rows(const LinearTask& task, int64_t r0, int64_t r1, double* scratch) {
  if (task.n_tokens == 1) {  // decode: two rows at a time share the x loads
    const int64_t row_bytes = task.w.cols * static_cast<int64_t>(sizeof(typename A::Storage));
    const int64_t ahead = prefetch_ahead(row_bytes), range = (r1 - r0) * row_bytes;
    prefetch_range(static_cast<const typename A::Storage*>(task.w.data) + r0 * task.w.cols,
                   ahead < range ? ahead : range);
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) dense_tile<A, 2, 1>(task, r, 0);
    if (r < r1) dense_tile<A, 1, 1>(task, r, 0);
    return;
  }
  if (linear_blocked(task)) {  // one row x 3 tokens over each widened slice
    x86::blocked_loop<1, 3>(
        task, r0, r1, scratch,
        [&](int64_t p0, int64_t p1, int64_t k0, int64_t k1, double* slice) {
          widen_slice<A>(task, p0, p1, k0, k1, slice);
        },
        [&]<int NR, int NT>(const x86::LinearBlock& b, int64_t r, int64_t t) {
          block_tile<NR, NT, A>(task, b, r, t);
        });
    return;
  }
  // 2-3 tokens: one row x 2 tokens at a time, in panels (x86/panel_loop.h).
  x86::panel_loop<1, 2>(r0, r1, linear_panel_rows(task), task.n_tokens,
                        [&]<int NR, int NT>(int64_t r, int64_t t) {
                          dense_tile<A, NR, NT>(task, r, t);
                        });
}

// 16 packed bytes (32 nibbles, low nibble = even element) -> 32 doubles holding 2*E2M1, in
// the pairs-split order of x (KernelTable::mxfp4_x_pairs_split): d[2m] = elements 8m, 8m+2,
// 8m+4, 8m+6 (the low nibbles of bytes 4m..4m+3), d[2m+1] = elements 8m+1, 8m+3, ... (their
// high nibbles). No conversion instruction: every value 2*E2M1 has at most two significant bits,
// so its double is fully given by its top 16 bits (sign, exponent, two mantissa bits), which two
// byte tables give and a byte shuffle moves to the top of each 64-bit lane (the rest zero).
inline void mxfp4_decode_block(const uint8_t* p, __m256d* d) {
  // Top and second byte of the double for codes 0..15: 0, 1, 2, 3, 4, 6, 8, 12, then the same
  // negated (code 8, "-0", gives +0).
  const __m256i top = _mm256_setr_epi8(
      0, 0x3f, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0, -0x41, -0x40, -0x40, -0x40, -0x40, -0x40,
      -0x40, 0, 0x3f, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0, -0x41, -0x40, -0x40, -0x40, -0x40,
      -0x40, -0x40);
  const __m256i second = _mm256_setr_epi8(
      0, -0x10, 0, 0x08, 0x10, 0x18, 0x20, 0x28, 0, -0x10, 0, 0x08, 0x10, 0x18, 0x20, 0x28,
      0, -0x10, 0, 0x08, 0x10, 0x18, 0x20, 0x28, 0, -0x10, 0, 0x08, 0x10, 0x18, 0x20, 0x28);
  // 16-bit words 0..3 (first) or 4..7 (second) of each 128-bit half -> the top of four qwords
  // (lane 0 takes two words of the half, lane 1 the next two; both halves hold the same words).
  const __m256i first = _mm256_setr_epi8(-1, -1, -1, -1, -1, -1, 0, 1, -1, -1, -1, -1, -1, -1, 2,
                                         3, -1, -1, -1, -1, -1, -1, 4, 5, -1, -1, -1, -1, -1, -1,
                                         6, 7);
  const __m256i next = _mm256_setr_epi8(-1, -1, -1, -1, -1, -1, 8, 9, -1, -1, -1, -1, -1, -1, 10,
                                        11, -1, -1, -1, -1, -1, -1, 12, 13, -1, -1, -1, -1, -1,
                                        -1, 14, 15);
  const __m256i nib = _mm256_set1_epi8(0x0f);
  const __m256i bytes =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i lo = _mm256_and_si256(bytes, nib);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nib);
  const __m256i lo_top = _mm256_shuffle_epi8(top, lo), lo_second = _mm256_shuffle_epi8(second, lo);
  const __m256i hi_top = _mm256_shuffle_epi8(top, hi), hi_second = _mm256_shuffle_epi8(second, hi);
  const __m256i lo_words[2] = {_mm256_unpacklo_epi8(lo_second, lo_top),   // bytes 0..7
                               _mm256_unpackhi_epi8(lo_second, lo_top)};  // bytes 8..15
  const __m256i hi_words[2] = {_mm256_unpacklo_epi8(hi_second, hi_top),
                               _mm256_unpackhi_epi8(hi_second, hi_top)};
  for (int m = 0; m < 4; ++m) {
    const __m256i pick = (m & 1) ? next : first;
    d[2 * m] = _mm256_castsi256_pd(_mm256_shuffle_epi8(lo_words[m >> 1], pick));
    d[2 * m + 1] = _mm256_castsi256_pd(_mm256_shuffle_epi8(hi_words[m >> 1], pick));
  }
}

// One decoded block against one token's x (pairs split, as d): block lanes b0 = lanes 0, 2, 4, 6
// (elements l, l+8, l+16, l+24), b1 = lanes 1, 3, 5, 7, each from +0.0; then row lanes += block
// lanes * 2^(s-128) (exact).
inline void mxfp4_block_accumulate(const __m256d* d, const double* xp, __m256d scale, __m256d& Ra,
                                   __m256d& Rb) {
  const __m256d zero = _mm256_setzero_pd();
  __m256d b0 = _mm256_fmadd_pd(d[0], _mm256_loadu_pd(xp), zero);
  __m256d b1 = _mm256_fmadd_pd(d[1], _mm256_loadu_pd(xp + 4), zero);
  b0 = _mm256_fmadd_pd(d[2], _mm256_loadu_pd(xp + 8), b0);
  b1 = _mm256_fmadd_pd(d[3], _mm256_loadu_pd(xp + 12), b1);
  b0 = _mm256_fmadd_pd(d[4], _mm256_loadu_pd(xp + 16), b0);
  b1 = _mm256_fmadd_pd(d[5], _mm256_loadu_pd(xp + 20), b1);
  b0 = _mm256_fmadd_pd(d[6], _mm256_loadu_pd(xp + 24), b0);
  b1 = _mm256_fmadd_pd(d[7], _mm256_loadu_pd(xp + 28), b1);
  Ra = _mm256_fmadd_pd(b0, scale, Ra);  // exact product: one rounding, as the scalar add
  Rb = _mm256_fmadd_pd(b1, scale, Rb);
}

// Row lanes Ra = lanes 0, 2, 4, 6 and Rb = lanes 1, 3, 5, 7 -> y (NUMERICS.md §4 steps 4-5).
inline float mxfp4_finish(__m256d Ra, __m256d Rb) {
  double even[4], odd[4];
  _mm256_storeu_pd(even, Ra);
  _mm256_storeu_pd(odd, Rb);
  const double lane[8] = {even[0], odd[0], even[1], odd[1], even[2], odd[2], even[3], odd[3]};
  return num::F(num::tree8(lane));
}

// One MXFP4 row against NT tokens. Block and row lanes as in mxfp4_block_accumulate, row lanes
// in R[t][0..1].
template <int NT>
void mxfp4_tile(const LinearTask& task, int64_t r, int64_t tok) {
  const int64_t n = task.w.cols, rows = task.w.rows, G = n / 32;
  const uint8_t* P = static_cast<const uint8_t*>(task.w.data) + r * (n / 2);
  const uint8_t* S = task.w.scales + r * G;
  const __m256d zero = _mm256_setzero_pd();
  __m256d R[NT][2];
#pragma GCC unroll 4
  for (int tt = 0; tt < NT; ++tt) R[tt][0] = R[tt][1] = zero;
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t s = S[g];
    if (s == num::kE8M0ZeroBlock) continue;
    __m256d d[8];
    mxfp4_decode_block(P + 16 * g, d);
    const __m256d scale = bcast(num::kHalfScale.v[s]);
#pragma GCC unroll 4
    for (int tt = 0; tt < NT; ++tt)
      mxfp4_block_accumulate(d, task.x_wide + (tok + tt) * n + 32 * g, scale, R[tt][0], R[tt][1]);
  }
  for (int tt = 0; tt < NT; ++tt) task.y[(tok + tt) * rows + r] = mxfp4_finish(R[tt][0], R[tt][1]);
}

// Decode (T = 1): two rows at a time, so the core has two independent decode chains in flight.
void mxfp4_two_rows(const LinearTask& task, int64_t r) {
  const int64_t n = task.w.cols, G = n / 32;
  const uint8_t* P0 = static_cast<const uint8_t*>(task.w.data) + r * (n / 2);
  const uint8_t* P1 = P0 + n / 2;
  const uint8_t* S0 = task.w.scales + r * G;
  const uint8_t* S1 = S0 + G;
  const __m256d zero = _mm256_setzero_pd();
  const int64_t ahead = prefetch_ahead(n / 2);
  __m256d R0a = zero, R0b = zero, R1a = zero, R1b = zero;
  for (int64_t g = 0; g < G; ++g) {
    if ((g & 3) == 0) {  // one line per row per 4 blocks
      _mm_prefetch(reinterpret_cast<const char*>(P0 + 16 * g + ahead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(P1 + 16 * g + ahead), _MM_HINT_T0);
    }
    const uint8_t s0 = S0[g], s1 = S1[g];
    const double* xp = task.x_wide + 32 * g;
    if (s0 == num::kE8M0ZeroBlock || s1 == num::kE8M0ZeroBlock) {  // rare: one row at a time
      __m256d d[8];
      if (s0 != num::kE8M0ZeroBlock) {
        mxfp4_decode_block(P0 + 16 * g, d);
        mxfp4_block_accumulate(d, xp, bcast(num::kHalfScale.v[s0]), R0a, R0b);
      }
      if (s1 != num::kE8M0ZeroBlock) {
        mxfp4_decode_block(P1 + 16 * g, d);
        mxfp4_block_accumulate(d, xp, bcast(num::kHalfScale.v[s1]), R1a, R1b);
      }
      continue;
    }
    __m256d d0[8], d1[8];
    mxfp4_decode_block(P0 + 16 * g, d0);
    mxfp4_decode_block(P1 + 16 * g, d1);
    mxfp4_block_accumulate(d0, xp, bcast(num::kHalfScale.v[s0]), R0a, R0b);
    mxfp4_block_accumulate(d1, xp, bcast(num::kHalfScale.v[s1]), R1a, R1b);
  }
  task.y[r] = mxfp4_finish(R0a, R0b);
  task.y[r + 1] = mxfp4_finish(R1a, R1b);
}

void mxfp4_rows(const LinearTask& task, int64_t r0, int64_t r1) {
  if (task.n_tokens == 1) {
    const int64_t stride = task.w.cols / 2, range = (r1 - r0) * stride;
    const int64_t ahead = prefetch_ahead(stride);
    prefetch_range(static_cast<const uint8_t*>(task.w.data) + r0 * stride,
                   ahead < range ? ahead : range);
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) mxfp4_two_rows(task, r);
    if (r < r1) mxfp4_tile<1>(task, r, 0);
    return;
  }
  // Several tokens: one row x 4 tokens at a time, in panels (x86/panel_loop.h).
  x86::panel_loop<1, 4>(r0, r1, linear_panel_rows(task), task.n_tokens,
                        [&]<int NR, int NT>(int64_t r, int64_t t) {
                          mxfp4_tile<NT>(task, r, t);
                        });
}

}  // namespace

void linear_rows_avx2(const LinearTask& task, int64_t r0, int64_t r1, double* scratch) {
  switch (task.w.type) {
    case WeightType::kF32: return dense_rows<F32Weights>(task, r0, r1, scratch);
    case WeightType::kBF16: return dense_rows<Bf16Weights>(task, r0, r1, scratch);
    case WeightType::kF16: return dense_rows<F16Weights>(task, r0, r1, scratch);
    case WeightType::kMxfp4: return mxfp4_rows(task, r0, r1);
  }
}

}  // namespace ktier::cpu::avx2
