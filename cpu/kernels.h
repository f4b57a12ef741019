#pragma once
// ktier CPU kernels: the public API a model layer calls.
//
// Every op takes raw pointers and sizes (no engine types) plus an Exec (instruction set and
// thread pool). Each op has exactly one entry point here; it validates its arguments once
// (a violated REQUIRES aborts with a message: it is a bug in the caller, not an input error),
// then runs the scalar *_ref kernel or the AVX2 / AVX-512 kernel chosen by Exec::isa. They produce
// identical output bytes, for any thread count, under the numerics contract in
// docs/NUMERICS.md; each function below names the contract section it follows.
//
// Conventions:
//  * Activations are f32, row-major, contiguous: a "[T, n]" buffer holds T tokens of n values.
//  * A weight W [rows, cols] acts as y[r] = sum_c W[r, c] * x[c] (no bias anywhere).
//  * Outputs must not alias inputs unless the op says so.
//  * Ops are thread-safe as long as concurrent calls write disjoint outputs and states.
//
// Example (one decode step of a KDA block's first projections, T = 1):
//   cpu::ThreadPool pool(8);
//   cpu::Exec ex{&pool};
//   cpu::LinearJob jobs[3] = {{wq, x, 1, q}, {wk, x, 1, k}, {wv, x, 1, v}};
//   cpu::linear(jobs, 3, ex);

#include <cstdint>
#include <optional>

#include "cpu/exec.h"
#include "cpu/thread_pool.h"
#include "cpu/types.h"

namespace ktier::cpu {

const char* weight_type_name(WeightType t);

// ---------------------------------------------------------------------------------------------
// (a, b) Linear: y[t, r] = sum_c W[r, c] x[t, c]                          NUMERICS.md §3, §4
//
// A job is one weight applied to n_tokens activation rows: x [n_tokens, w.cols] ->
// y [n_tokens, w.rows]. One call runs a whole list of jobs (e.g. the 16 selected experts' W1
// and W3, possibly of different types, in one parallel_for over all their rows); jobs may share
// x but their y ranges must be disjoint. Each (token, row) output is computed on its own, so the
// result of a token never depends on n_tokens, on the other jobs, or on the thread split.
struct LinearJob {
  WeightMatrix w;
  const float* x = nullptr;  // [n_tokens, w.cols]
  int64_t n_tokens = 1;
  float* y = nullptr;  // [n_tokens, w.rows]
};
void linear(const LinearJob* jobs, int n_jobs, const Exec& ex);
inline void linear(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y,
                   const Exec& ex) {
  const LinearJob job{w, x, n_tokens, y};
  linear(&job, 1, ex);
}

// Decodes MXFP4 rows to f32, exactly where the value fits f32 (E2M1(nibble) * 2^(scale-127);
// -0 stays -0; a scale-255 block decodes to +0; scales 253-254 with large codes pass 2^128 and
// give +-Inf, where the linear kernels, which scale in double, stay finite). For tests and
// inspection only: the linear kernels never store a decoded copy. out [rows, cols].
// REQUIRES cols % 32 == 0.
void mxfp4_decode(const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols,
                  float* out);

// Widens one row of a float weight (F32/BF16/F16) to f32, exactly (embedding lookup, small
// vectors at load time). REQUIRES type != kMxfp4.
void widen_to_f32(WeightType type, const void* src, int64_t n, float* out);

// ---------------------------------------------------------------------------------------------
// (c, d) Norms                                                             NUMERICS.md §5
//
// RMSNorm over rows of n: out[t, i] = gain[i] * x[t, i] / sqrt(mean_j x[t, j]^2 + eps).
// gain may be null (no gain: AttnRes-style key norm). out may alias x. REQUIRES n > 0.
void rmsnorm(const float* x, const float* gain, int64_t rows, int64_t n, double eps, float* out,
             const Exec& ex);
// L2Norm over rows of n (KDA q, k; D4): out = x / sqrt(sum_j x[j]^2 + eps). out may alias x.
void l2norm(const float* x, int64_t rows, int64_t n, double eps, float* out, const Exec& ex);

// ---------------------------------------------------------------------------------------------
// (e) and other elementwise ops                                            NUMERICS.md §6
//
// SiTU-GLU: out[i] = [b1*tanh(a[i]/b1) * sigmoid(a[i])] * [b2*tanh(b[i]/b2)], the sigmoid on the
// uncapped a. beta2 == nullopt (config null) means the up factor is b[i] itself.
// a, b, out [n]; out may alias a or b.
void situ_glu(const float* a, const float* b, int64_t n, double beta1, std::optional<double> beta2,
              float* out, const Exec& ex);
// out[i] = sigmoid(x[i]). out may alias x.
void sigmoid(const float* x, int64_t n, float* out, const Exec& ex);
// out[i] = x[i] * sigmoid(gate[i]) (KDA and MLA output gates). out may alias x.
void sigmoid_gate(const float* x, const float* gate, int64_t n, float* out, const Exec& ex);
// out[i] = a[i] + b[i] in f32 (residual sums). out may alias a or b.
void add(const float* a, const float* b, int64_t n, float* out, const Exec& ex);
// out[i] = sum_{j=0..k-1} weight[j] * vec[j][i], accumulated in j order (MoE combine in
// selection order). vec[j] [n]; out must not alias any vec[j].
void weighted_sum(const float* const* vec, const float* weight, int k, int64_t n, float* out,
                  const Exec& ex);

// ---------------------------------------------------------------------------------------------
// (f, g, h) KDA pieces (K3-MODEL §6.3)                                     NUMERICS.md §7
//
// Causal depthwise short convolution with SiLU, over T new tokens.
//   u       [T, C]    pre-conv inputs (the projections q̂, k̂ or v̂)
//   w       [C, K]    taps; tap K-1 multiplies the current input, tap 0 the oldest
//   history [K-1, C]  in/out: the last K-1 pre-conv input vectors, oldest first (zeros at
//                     sequence start); on return it holds the last K-1 of history ++ u
//   out     [T, C]    SiLU(conv)
// Running T tokens at once or one at a time gives identical bytes. REQUIRES K >= 1; out must
// not alias u or history.
void kda_short_conv(const float* u, int64_t T, int64_t C, const float* w, int K, float* history,
                    float* out, const Exec& ex);

// Decay gate, lower-bound form (D8): g = g_min * sigmoid(exp(A_log[h]) * (z + dt_bias)),
// alpha = exp(g). z [T, H*D] is W_fb(W_fa x) without dt_bias; A_log [H] (per head);
// dt_bias [H*D] (per channel). g may be null; alpha [T, H*D].
void kda_decay_gate(const float* z, int64_t T, int H, int D, const float* A_log,
                    const float* dt_bias, double g_min, float* g, float* alpha, const Exec& ex);

// Delta-rule recurrence for T tokens, sequential in t, heads independent (threaded over heads).
// Per token and head: S <- diag(alpha) S; u = S^T k; S <- S + k (beta (v - u))^T;
// out = q_scale * S^T q (from the updated state).
//   q, k, alpha [T, H, Dk] (q unscaled; q and k already L2-normalised by the caller)
//   v [T, H, Dv]; beta [T, H]; state [H, Dk, Dv] in/out (row = key channel), f32
//   out [T, H, Dv]; q_scale is normally 1/sqrt(Dk)
void kda_recurrence(const float* q, const float* k, const float* v, const float* alpha,
                    const float* beta, int64_t T, int H, int Dk, int Dv, double q_scale,
                    float* state, float* out, const Exec& ex);

// ---------------------------------------------------------------------------------------------
// (i) MLA attention, absorbed latent form (K3-MODEL §6.4, D14)             NUMERICS.md §8
//
// Steps 3-6 of §6.4 for T new tokens whose (c, r) are already appended to the cache.
//   q       [T, H, nope+rope]  per-head queries (W_qb c_q), nope part first
//   kv_b    [H*(nope+v), kv_lora] float weight (F32/BF16/F16): per head h, rows
//           h*(nope+v) .. +nope-1 are W_UK,h and the next v rows are W_UV,h
//   cache_c [N, kv_lora], cache_r [N, rope]  normalised latents and raw rope keys, N >= n_past+T
//   token t attends cache positions 0 .. n_past+t (causal); scale is 1/sqrt(nope+rope)
//   out     [T, H*v]           o_h = W_UV,h * sum_s softmax_s(score_h(s)) c(s)  (before the gate)
// A token's output depends only on its own query and positions 0..n_past+t, so prefill of any
// chunking and decode give identical bytes. Each token runs in passes over groups of heads (all
// of them unless their scores would pass 64 MiB: mla_heads_per_pass); a pass reads the cache
// once for the scores (threaded over positions) and once for the weighted latent (threaded over
// latent channels), whatever the number of heads. Neither the grouping nor the threading
// changes a byte. Uses a per-calling-thread buffer of heads x (kv_lora + rope + N) doubles.
void mla_attention(const MlaDims& dims, const float* q, int64_t T, const WeightMatrix& kv_b,
                   const float* cache_c, const float* cache_r, int64_t n_past, double scale,
                   float* out, const Exec& ex);
// Heads per pass mla_attention uses for n_positions (= n_past + T) cached positions.
int mla_heads_per_pass(int n_heads, int64_t n_positions);
// Bytes of the calling thread's buffer mla_attention keeps (it grows to the largest call and is
// kept for the next): for calls attending up to n_positions positions.
uint64_t mla_buffer_bytes(const MlaDims& dims, int64_t n_positions);
// Frees the calling thread's grow-only op buffers (linear's widened activations, up to 117 MB
// for K3 at chunk 256; mla_attention's; the per-thread scratch), which ops otherwise keep for
// the next call. For a thread that ran a forward pass and will not run the next one soon: a
// server's connection thread (each would keep its own copy; the budget counts one). Not while
// an op runs on this thread.
void release_thread_buffers();
// Bytes the calling thread's op buffers hold now (what release_thread_buffers() gives back).
uint64_t thread_buffer_bytes();
// mla_attention with an explicit heads_per_pass (>= 1; more than n_heads means all): for tests
// that the grouping leaves every byte as it is.
void mla_attention_in_passes(const MlaDims& dims, const float* q, int64_t T,
                             const WeightMatrix& kv_b, const float* cache_c, const float* cache_r,
                             int64_t n_past, double scale, float* out, int heads_per_pass,
                             const Exec& ex);

// ---------------------------------------------------------------------------------------------
// (j) AttnRes aggregation (K3-MODEL §6.0)                                  NUMERICS.md §9
//
// For each token t: sources v_i = src[i] + t*src_stride (i = 0..m-1, bank order, P last), each
// [n]; score s_i = (v_i . f) / sqrt(mean(v_i^2) + eps); alpha = softmax(s);
// out[t] = sum_i alpha_i v_i (raw sources). m == 1 copies the source exactly.
// f [n] is the folded scoring vector res_norm ⊙ res_proj (f32 product, NUMERICS.md §9).
// out [T, n] must not alias a source.
void attnres(const float* const* src, int m, int64_t src_stride, int64_t T, int64_t n,
             const float* f, double eps, float* out, const Exec& ex);

// ---------------------------------------------------------------------------------------------
// (k) Router, (l) argmax                                                   NUMERICS.md §10
//
// Per token: s_e = sigmoid(logits[e]); selection score c_e = s_e + bias[e] (bias may be null);
// ids = the top_k experts by decreasing c, ties to the lower index (NaN ranks last);
// weights from the unbiased s: w_j = s_{ids[j]}, divided by (sum_j w_j + 1e-20) when
// renormalize && top_k > 1, then times scaling.
//   logits [T, n_experts] (the gate matmul's output); ids, weights [T, top_k]
void router_topk(const float* logits, const float* bias, int64_t T, int n_experts, int top_k,
                 bool renormalize, double scaling, int32_t* ids, float* weights, const Exec& ex);

// Index of the largest value, lowest index on ties (-0 == +0); NaN never wins; 0 if n == 0 or
// all values are NaN.
int64_t argmax(const float* x, int64_t n, const Exec& ex);

}  // namespace ktier::cpu
