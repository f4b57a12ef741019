#pragma once
// Internal: the two cache-reading steps of an MLA pass (KernelTable::mla_scores, mla_mix;
// NUMERICS.md §8), written once over a double-vector trait and instantiated by the AVX2 file
// (4 doubles per register) and the AVX-512 file (8). Included only by cpu/x86/*_attention.cpp,
// after <immintrin.h> and with that file's ISA flags; everything has internal linkage, so each
// file gets its own instantiations and none can be merged across ISAs.
//
// A trait VD provides: V (the register type), kWidth (doubles per register, 4 or 8), zero(),
// load(const double*), store(double*, V), set1(double), add, mul, fmadd(a, b, c) = a*b + c
// rounded once, widen(const float*): kWidth floats widened to doubles, and tree16(const V*):
// num::tree16 of the 16 lanes held in 16 / kWidth registers, pair for pair.
//
// dot16's lanes (NUMERICS.md §3) are 16 / kWidth registers: register j holds lanes
// j*kWidth .. j*kWidth + kWidth - 1, so element i always lands in lane i % 16. The products are
// of f32 values widened to double, exact, so an FMA adds them exactly as the scalar `+=` does.

#include <cstdint>

#include "cpu/kernel_table.h"
#include "cpu/numerics.h"

namespace ktier::cpu::x86 {
namespace {

template <class VD>
inline void mla_widen(const float* x, int64_t n, double* out) {
  int64_t i = 0;
  for (; i + VD::kWidth <= n; i += VD::kWidth) VD::store(out + i, VD::widen(x + i));
  for (; i < n; ++i) out[i] = num::D(x[i]);
}

// out[h] = q_h . x for KH rows q_h = q + h * stride, over n widened f32 values, with dot16's
// lanes and tree: KH x 16/kWidth independent accumulators share each load of x.
template <class VD, int KH>
inline void mla_dot16_rows(const double* q, int64_t stride, const double* x, int64_t n,
                           double* out) {
  constexpr int kRegs = 16 / VD::kWidth;
  typename VD::V acc[KH][kRegs];
#pragma GCC unroll 8
  for (int h = 0; h < KH; ++h)
#pragma GCC unroll 4
    for (int j = 0; j < kRegs; ++j) acc[h][j] = VD::zero();
  const int64_t n16 = n & ~int64_t{15};
  for (int64_t k = 0; k < n16; k += 16) {
#pragma GCC unroll 4
    for (int j = 0; j < kRegs; ++j) {
      const typename VD::V xv = VD::load(x + k + j * VD::kWidth);
#pragma GCC unroll 8
      for (int h = 0; h < KH; ++h)
        acc[h][j] = VD::fmadd(VD::load(q + h * stride + k + j * VD::kWidth), xv, acc[h][j]);
    }
  }
  for (int h = 0; h < KH; ++h) {
    if (n16 == n) {
      out[h] = VD::tree16(acc[h]);
      continue;
    }
    double lane[16];
#pragma GCC unroll 4
    for (int j = 0; j < kRegs; ++j) VD::store(lane + j * VD::kWidth, acc[h][j]);
    for (int64_t k = n16; k < n; ++k) lane[k & 15] += q[h * stride + k] * x[k];
    out[h] = num::tree16(lane);
  }
}

// Scores of KH heads (i .. i+KH-1 of the pass) against one widened position (cw, rw).
template <class VD, int KH>
inline void mla_score_heads(const MlaArgs& a, const MlaPass& p, int64_t i, int64_t s,
                            const double* cw, const double* rw) {
  const int64_t dr = a.dims.qk_rope, L = a.dims.kv_lora;
  double latent[KH], rope[KH];
  mla_dot16_rows<VD, KH>(p.q_lat + i * L, L, cw, L, latent);
  mla_dot16_rows<VD, KH>(p.q_rope + i * dr, dr, rw, dr, rope);
  for (int h = 0; h < KH; ++h) p.probs[(i + h) * p.n_pos + s] = (latent[h] + rope[h]) * a.scale;
}

// KernelTable::mla_scores. Positions go kMlaScoreTile at a time: the tile is widened once into
// scratch, and each block of heads then takes every position of it while the block's queries
// stay in L1, so the cache is read once per pass rather than once per head, and the queries
// once per tile rather than once per position.
template <class VD>
void mla_scores_vec(const MlaArgs& a, const MlaPass& p, int64_t s0, int64_t s1, double* scratch) {
  constexpr int KH = VD::kWidth / 2;  // 8 accumulators in all
  const int64_t dr = a.dims.qk_rope, L = a.dims.kv_lora, row = L + dr;
  for (int64_t t0 = s0; t0 < s1; t0 += kMlaScoreTile) {
    const int64_t n = s1 - t0 < kMlaScoreTile ? s1 - t0 : kMlaScoreTile;
    for (int64_t s = 0; s < n; ++s) {
      mla_widen<VD>(a.cache_c + (t0 + s) * L, L, scratch + s * row);
      mla_widen<VD>(a.cache_r + (t0 + s) * dr, dr, scratch + s * row + L);
    }
    int64_t i = 0;
    for (; i + KH <= p.heads; i += KH) {
      for (int64_t s = 0; s < n; ++s)
        mla_score_heads<VD, KH>(a, p, i, t0 + s, scratch + s * row, scratch + s * row + L);
    }
    for (; i < p.heads; ++i) {
      for (int64_t s = 0; s < n; ++s)
        mla_score_heads<VD, 1>(a, p, i, t0 + s, scratch + s * row, scratch + s * row + L);
    }
  }
}

// One tile's share of KH heads (i ..) over channels [c, c + 32) of the widened tile (rows of
// width W): KH x 32/kWidth independent add chains. probs_s * c(s) is rounded before the add
// (no FMA), as in the scalar kernel, and each head's sum runs in increasing s.
template <class VD, int KH>
inline void mla_mix_block(const MlaPass& p, int64_t i, int64_t s0, int64_t n, const double* tile,
                          int64_t W, int64_t c, double* acc) {
  constexpr int kRegs = 32 / VD::kWidth;
  typename VD::V v[KH][kRegs];
#pragma GCC unroll 8
  for (int h = 0; h < KH; ++h)
#pragma GCC unroll 8
    for (int j = 0; j < kRegs; ++j) v[h][j] = VD::load(acc + (i + h) * W + c + j * VD::kWidth);
  for (int64_t s = 0; s < n; ++s) {
    const double* ts = tile + s * W + c;
#pragma GCC unroll 8
    for (int j = 0; j < kRegs; ++j) {
      const typename VD::V x = VD::load(ts + j * VD::kWidth);
#pragma GCC unroll 8
      for (int h = 0; h < KH; ++h)
        v[h][j] = VD::add(v[h][j], VD::mul(VD::set1(p.probs[(i + h) * p.n_pos + s0 + s]), x));
    }
  }
#pragma GCC unroll 8
  for (int h = 0; h < KH; ++h)
#pragma GCC unroll 8
    for (int j = 0; j < kRegs; ++j) VD::store(acc + (i + h) * W + c + j * VD::kWidth, v[h][j]);
}

// KernelTable::mla_mix. Tiles of kMlaMixTile positions: a tile's channels [c0, c1) are widened
// once into scratch and stay in L1 while every head of the pass adds its share; the partial
// sums live in scratch between tiles.
template <class VD>
void mla_mix_vec(const MlaArgs& a, const MlaPass& p, int64_t c0, int64_t c1, double* scratch) {
  constexpr int KH = VD::kWidth / 4;  // 8 accumulators in all
  const int64_t L = a.dims.kv_lora, W = c1 - c0;
  double* acc = scratch;                 // [heads, W]
  double* tile = scratch + p.heads * W;  // [kMlaMixTile, W]
  for (int64_t k = 0; k < p.heads * W; ++k) acc[k] = 0.0;
  for (int64_t s0 = 0; s0 < p.n_pos; s0 += kMlaMixTile) {
    const int64_t n = p.n_pos - s0 < kMlaMixTile ? p.n_pos - s0 : kMlaMixTile;
    for (int64_t s = 0; s < n; ++s) mla_widen<VD>(a.cache_c + (s0 + s) * L + c0, W, tile + s * W);
    const int64_t W32 = W & ~int64_t{31};
    for (int64_t c = 0; c < W32; c += 32) {
      int64_t i = 0;
      for (; i + KH <= p.heads; i += KH) mla_mix_block<VD, KH>(p, i, s0, n, tile, W, c, acc);
      for (; i < p.heads; ++i) mla_mix_block<VD, 1>(p, i, s0, n, tile, W, c, acc);
    }
    for (int64_t i = 0; i < p.heads; ++i) {
      const double* pr = p.probs + i * p.n_pos + s0;
      for (int64_t c = W32; c < W; ++c) {
        double x = acc[i * W + c];
        for (int64_t s = 0; s < n; ++s) x += pr[s] * tile[s * W + c];
        acc[i * W + c] = x;
      }
    }
  }
  for (int64_t i = 0; i < p.heads; ++i)
    for (int64_t c = 0; c < W; ++c) p.c_hat[i * L + c0 + c] = num::F(acc[i * W + c]);
}

}  // namespace
}  // namespace ktier::cpu::x86
