#pragma once
// The multi-token (prefill) loop order of the x86 linear kernels: a range of rows goes in panels
// of about kLinearPanelBytes of weights (cpu/kernel_table.h), which stay in L2, and each panel
// runs over the tokens a group at a time, whose x rows stay in L1; within a group, tiles of NR
// rows (the last rows of a panel one at a time). Every weight is then read from memory once per
// panel instead of once per token group, and every x value once per row tile. Loop order only:
// each (token, row) output keeps its own accumulators, so no result depends on it.
//
// Included by kernels compiled with different -m flags: everything here has internal linkage
// (see decode_prefetch.h).

#include <cstdint>

#include "cpu/kernel_table.h"

namespace ktier::cpu::x86 {
namespace {

// tile.template operator()<R, NT>(row, token) computes rows [row, row + R) for tokens
// [token, token + NT), R in {NR, 1}, NT <= G.
template <int NR, int NT, class Tile>
inline void row_tiles(int64_t p0, int64_t p1, int64_t t, const Tile& tile) {
  int64_t r = p0;
  for (; r + NR <= p1; r += NR) tile.template operator()<NR, NT>(r, t);
  for (; r < p1; ++r) tile.template operator()<1, NT>(r, t);
}

// The last group of a panel: nt (< G) tokens, as a compile-time tile width.
template <int NR, int NT, class Tile>
inline void last_group(int64_t p0, int64_t p1, int64_t t, int64_t nt, const Tile& tile) {
  if constexpr (NT >= 1) {
    if (nt == NT) return row_tiles<NR, NT>(p0, p1, t, tile);
    last_group<NR, NT - 1>(p0, p1, t, nt, tile);
  }
}

// Rows [r0, r1) x tokens [0, n_tokens) in panels of panel_rows rows and groups of G tokens.
template <int NR, int G, class Tile>
inline void panel_loop(int64_t r0, int64_t r1, int64_t panel_rows, int64_t n_tokens,
                       const Tile& tile) {
  for (int64_t p0 = r0; p0 < r1; p0 += panel_rows) {
    const int64_t p1 = r1 - p0 < panel_rows ? r1 : p0 + panel_rows;
    int64_t t = 0;
    for (; t + G <= n_tokens; t += G) row_tiles<NR, G>(p0, p1, t, tile);
    last_group<NR, G - 1>(p0, p1, t, n_tokens - t, tile);
  }
}

// ---- float weights, many tokens: blocked (kernel_table.h) -----------------------------------

// One block's place: rows [p0, p0 + kLinearBlockRows) x columns [k0, k1) x tokens from t0;
// `slice` holds the rows' columns widened to double, row stride kLinearBlockCols (how much of a
// row's tail it holds is the kernel's choice); `carry` holds each (row, token)'s 16 accumulator
// lanes between slices.
struct LinearBlock {
  int64_t p0, k0, k1, t0;
  const double* slice;
  double* carry;
};

inline double* carry_of(const LinearBlock& b, int64_t r, int64_t t) {
  return b.carry + ((r - b.p0) * kLinearBlockTokens + (t - b.t0)) * 16;
}

// Rows [r0, r1) of `task` blocked: per block of kLinearBlockTokens tokens, per kLinearBlockRows
// rows, per kLinearBlockCols columns, widen(p0, p1, k0, k1, slice) fills the slice, then
// tile.template operator()<R, NT>(block, row, token) runs every tile of NR rows x G tokens over it
// (token groups outermost). `scratch`: linear_scratch_doubles(task) doubles, 64-byte aligned.
template <int NR, int G, class Widen, class Tile>
inline void blocked_loop(const LinearTask& task, int64_t r0, int64_t r1, double* scratch,
                         const Widen& widen, const Tile& tile) {
  const int64_t n = task.w.cols, T = task.n_tokens;
  double* const slice = scratch;
  double* const carry = scratch + kLinearBlockRows * kLinearBlockCols;
  for (int64_t t0 = 0; t0 < T; t0 += kLinearBlockTokens) {
    const int64_t nt = T - t0 < kLinearBlockTokens ? T - t0 : kLinearBlockTokens;
    for (int64_t p0 = r0; p0 < r1; p0 += kLinearBlockRows) {
      const int64_t p1 = r1 - p0 < kLinearBlockRows ? r1 : p0 + kLinearBlockRows;
      for (int64_t k0 = 0; k0 < n; k0 += kLinearBlockCols) {
        const int64_t k1 = n - k0 < kLinearBlockCols ? n : k0 + kLinearBlockCols;
        widen(p0, p1, k0, k1, slice);
        const LinearBlock b{p0, k0, k1, t0, slice, carry};
        panel_loop<NR, G>(p0, p1, kLinearBlockRows, nt,
                          [&]<int R, int NT>(int64_t r, int64_t t) {
                            tile.template operator()<R, NT>(b, r, t0 + t);
                          });
      }
    }
  }
}

}  // namespace
}  // namespace ktier::cpu::x86
