#pragma once
// Internal: the per-ISA kernel table behind the entry points of cpu/kernels.h.
//
// Each op's entry point (cpu/dispatch.cpp) validates its arguments, prepares scratch, splits
// the work over the thread pool and calls one of these range kernels per range. The scalar table
// (cpu/ref/*, the `_ref` kernels), the AVX2 table (cpu/x86/avx2_*) and the AVX-512 table (the AVX2
// one with its own linear and MLA cache kernels, cpu/x86/avx512_*.cpp) have identical signatures
// and must produce identical bytes for every range. Range kernels never allocate, never throw,
// and write only the outputs of their range.

#include <cstdint>

#include "cpu/exec.h"
#include "cpu/types.h"

namespace ktier::cpu {

// One linear job with its activations widened to double (exact) by the entry point.
struct LinearTask {
  WeightMatrix w;
  // [n_tokens, w.cols]; for MXFP4 weights in the order the table asks for
  // (KernelTable::mxfp4_x_pairs_split)
  const double* x_wide = nullptr;
  int64_t n_tokens = 0;
  float* y = nullptr;  // [n_tokens, w.rows]
};

// Several tokens (docs/PERFORMANCE.md "Prefill"): the vector kernels take a range's rows in
// panels of about kLinearPanelBytes of weights (kept in L2) and run each panel over the tokens a
// group at a time (the group's x in L1), so each weight is read from memory once per panel, not
// once per token group.
//
// Float weights with at least kLinearWidenMinTokens tokens are blocked further, so that each
// weight is also widened to double once per block of tokens rather than once per token group,
// and a token group's x stays in L1 even for K3's 7168-wide rows: per block of
// kLinearBlockTokens tokens, per panel of kLinearBlockRows rows, per slice of kLinearBlockCols
// columns, the slice is widened into the caller's per-thread scratch, then every (row tile,
// token group) runs over it, its double accumulators carried from slice to slice in the scratch
// (stored and reloaded exactly: every output's sum keeps its order, so no byte changes).
inline constexpr int64_t kLinearPanelBytes = 96 << 10;
inline constexpr int64_t kLinearWidenMinTokens = 4;
inline constexpr int64_t kLinearBlockRows = 32;    // a multiple of every row tile
inline constexpr int64_t kLinearBlockCols = 512;   // a multiple of 16
inline constexpr int64_t kLinearBlockTokens = 48;

// The helpers below are compiled into kernels built with different -m flags: internal linkage,
// so that no copy compiled for one instruction set is linked into another's callers.
namespace {

// Bytes of one stored row of `w` (MXFP4: packed nibbles and scales).
inline int64_t weight_row_bytes(const WeightMatrix& w) {
  return weight_row_data_bytes(w.type, w.cols) + weight_row_scale_bytes(w.type, w.cols);
}

// True when linear_rows blocks `task` as above (and needs scratch). A zero-width matrix is not
// blocked: it has no column slice, and its outputs are +0 written by the unblocked tiles.
inline bool linear_blocked(const LinearTask& task) {
  return task.w.type != WeightType::kMxfp4 && task.n_tokens >= kLinearWidenMinTokens &&
         task.w.cols > 0;
}

// Rows of a panel of `task`'s range: a multiple of 4 (the kernels' widest row tile), >= 4.
inline int64_t linear_panel_rows(const LinearTask& task) {
  if (linear_blocked(task)) return kLinearBlockRows;
  const int64_t bytes = weight_row_bytes(task.w);
  const int64_t rows = kLinearPanelBytes / (bytes > 0 ? bytes : 1);
  return rows < 4 ? 4 : rows / 4 * 4;
}

// Per-thread scratch (doubles) linear_rows needs for `task`: a widened slice [rows][cols] and
// the accumulators [rows][tokens][16] of one block, or 0.
inline int64_t linear_scratch_doubles(const LinearTask& task) {
  if (!linear_blocked(task)) return 0;
  return kLinearBlockRows * kLinearBlockCols + kLinearBlockRows * kLinearBlockTokens * 16;
}

}  // namespace

struct ShortConvArgs {
  const float* u;
  int64_t T, C;
  const float* w;
  int K;
  float* history;
  float* out;
};

struct DecayGateArgs {
  const float* z;
  int H, D;
  const double* A;  // [H] exp(A_log[h]) in double, computed once by the entry point
  const float* dt_bias;
  double g_min;
  float* g;  // may be null
  float* alpha;
};

struct RecurrenceArgs {
  const float *q, *k, *v, *alpha, *beta;
  int64_t T;
  int H, Dk, Dv;
  double q_scale;
  float* state;
  float* out;
};

struct MlaArgs {
  MlaDims dims;
  const float* q;
  int64_t T;
  WeightMatrix kv_b;
  const float* cache_c;
  const float* cache_r;
  int64_t n_past;
  double scale;
  float* out;
};

struct AttnResArgs {
  const float* const* src;
  int m;
  int64_t src_stride, n;
  const float* f;
  double eps;
  float* out;
};

struct RouterArgs {
  const float* logits;
  const float* bias;
  int n_experts, top_k;
  bool renormalize;
  double scaling;
  int32_t* ids;
  float* weights;
};

// Scratch sizes (in doubles) the entry points hand to the kernels that need them.
inline int64_t recurrence_scratch_doubles(int Dv) { return 3 * static_cast<int64_t>(Dv); }

// One MLA pass (NUMERICS.md §8): token t of the call (position n_past + t), heads
// [h0, h0 + heads), attending positions 0 .. n_pos - 1 (n_pos = n_past + t + 1). The buffers
// belong to the entry point and are shared by every range of the pass; each step writes only
// its range's part. The pass reads the latent cache twice in all (scores, then mix), whatever
// the number of heads, instead of twice per head.
struct MlaPass {
  int64_t t = 0;
  int h0 = 0, heads = 0;
  int64_t n_pos = 0;
  double* q_lat = nullptr;   // [heads, kv_lora]  W_UK,h^T q_nope rounded to f32, held widened
  double* q_rope = nullptr;  // [heads, qk_rope]  the query's rope part, widened
  double* probs = nullptr;   // [heads, n_pos]    scaled scores; the entry point softmaxes them
  float* c_hat = nullptr;    // [heads, kv_lora]  sum_s probs_s c(s), rounded to f32
};
// Scratch (doubles) of mla_scores and mla_mix ranges; the mix takes latent channels
// [c0, c1) with c1 - c0 <= max_channels.
inline constexpr int64_t kMlaScoreTile = 4;  // positions per tile of mla_scores
inline int64_t mla_scores_scratch_doubles(const MlaDims& d) {
  return kMlaScoreTile * (static_cast<int64_t>(d.kv_lora) + d.qk_rope);
}
inline constexpr int64_t kMlaMixTile = 64;  // positions per tile of mla_mix
inline int64_t mla_mix_scratch_doubles(int heads, int64_t max_channels) {
  return (heads + kMlaMixTile) * max_channels;
}

struct KernelTable {
  // rows [r0, r1) of one job, every token; scratch: this thread's, 64-byte aligned, at least
  // linear_scratch_doubles(task) doubles (null when that is 0)
  void (*linear_rows)(const LinearTask& task, int64_t r0, int64_t r1, double* scratch);
  // rows [r0, r1) of a [rows, n] matrix
  void (*rmsnorm_rows)(const float* x, const float* gain, int64_t n, double eps, int64_t r0,
                       int64_t r1, float* out);
  void (*l2norm_rows)(const float* x, int64_t n, double eps, int64_t r0, int64_t r1, float* out);
  // elements [i0, i1)
  void (*situ_glu_range)(const float* a, const float* b, double beta1, bool cap_up, double beta2,
                         int64_t i0, int64_t i1, float* out);
  void (*sigmoid_range)(const float* x, int64_t i0, int64_t i1, float* out);
  void (*sigmoid_gate_range)(const float* x, const float* gate, int64_t i0, int64_t i1, float* out);
  void (*add_range)(const float* a, const float* b, int64_t i0, int64_t i1, float* out);
  void (*weighted_sum_range)(const float* const* vec, const float* weight, int k, int64_t i0,
                             int64_t i1, float* out);
  // channels [c0, c1), all T tokens, and their history
  void (*short_conv_channels)(const ShortConvArgs& a, int64_t c0, int64_t c1);
  // elements [i0, i1) of [T, H*D]
  void (*decay_gate_range)(const DecayGateArgs& a, int64_t i0, int64_t i1);
  // heads [h0, h1), all T tokens; scratch: recurrence_scratch_doubles(Dv)
  void (*recurrence_heads)(const RecurrenceArgs& a, int h0, int h1, double* scratch);
  // MLA, one pass (MlaPass) in four steps; the entry point softmaxes probs between 2 and 3.
  // 1. heads [i0, i1) of the pass: q_lat and q_rope
  void (*mla_query)(const MlaArgs& a, const MlaPass& p, int64_t i0, int64_t i1);
  // 2. positions [s0, s1), every head of the pass: probs (the scaled scores); scratch:
  //    mla_scores_scratch_doubles(dims)
  void (*mla_scores)(const MlaArgs& a, const MlaPass& p, int64_t s0, int64_t s1, double* scratch);
  // 3. latent channels [c0, c1), every head: c_hat; scratch: mla_mix_scratch_doubles(heads, c1-c0)
  void (*mla_mix)(const MlaArgs& a, const MlaPass& p, int64_t c0, int64_t c1, double* scratch);
  // 4. heads [i0, i1) of the pass: their rows of out; scratch: kv_lora doubles
  void (*mla_out)(const MlaArgs& a, const MlaPass& p, int64_t i0, int64_t i1, double* scratch);
  // tokens [t0, t1); scratch: m doubles
  void (*attnres_tokens)(const AttnResArgs& a, int64_t t0, int64_t t1, double* scratch);
  // tokens [t0, t1); scratch: 3 * n_experts doubles (the third n: router_select_topk's flags)
  void (*router_tokens)(const RouterArgs& a, int64_t t0, int64_t t1, double* scratch);
  int64_t (*argmax)(const float* x, int64_t n);
  // How the entry point lays out x_wide for MXFP4 weights: false, in column order; true, each
  // group of 8 columns as its 4 even columns, then its 4 odd ones (8m, 8m+2, 8m+4, 8m+6, 8m+1,
  // ...), the order in which the AVX2 kernel decodes a packed byte's two nibbles (low = even
  // column) into separate vectors without interleaving them. Which lane sums which product, and
  // in what order, is the same either way (NUMERICS.md §4): no byte changes.
  bool mxfp4_x_pairs_split;
};

extern const KernelTable kRefKernels;
#if KTIER_CPU_HAVE_AVX2
extern const KernelTable kAvx2Kernels;
#endif
// kAvx512 has no table object of its own: kernel_table(Isa::kAvx512) is kAvx2Kernels with
// linear_rows, mla_scores and mla_mix replaced by the avx512:: kernels (cpu/x86/avx512_kernels.h);
// every other op runs its AVX2 kernel.

// The table for `isa`; aborts with a message if isa is not supported on this CPU/build.
const KernelTable& kernel_table(Isa isa);

// Shared by both tables (compiled once, in a scalar TU): the router's selection step.
// c [n] selection scores; writes the top_k indices by decreasing c, ties to the lower index,
// NaN last. taken: n bytes of scratch (overwritten).
void router_select_topk(const double* c, int n, int top_k, int32_t* ids, uint8_t* taken);

}  // namespace ktier::cpu
