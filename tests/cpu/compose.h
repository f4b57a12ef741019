#pragma once
// Test-side composition of K3 blocks from the cpu/ kernels (K3-MODEL §6.2-§6.6), with weights
// taken from the conformance fixtures. This is not the engine's model code (that lives in src/);
// it exists to check the kernels against whole-block fixtures, and shows the call sequence a
// model layer uses. All weights are plain F32 here; activations are f32 [T, width].

#include <cstdint>
#include <string>
#include <vector>

#include "cpu/kernels.h"
#include "test_support.h"

namespace ktier::cpu::test {

struct OwnedMatrix {
  std::vector<float> data;
  int64_t rows = 0, cols = 0;
  WeightMatrix view() const { return {WeightType::kF32, data.data(), nullptr, rows, cols}; }
};
OwnedMatrix load_matrix(const Fixture& fx, const std::string& key);

// ---- KDA (§6.3) ------------------------------------------------------------------------------

struct KdaWeights {
  OwnedMatrix q, k, v, g, o, b, f_a, f_b;
  std::vector<float> q_conv, k_conv, v_conv;  // [C, K]
  std::vector<float> A_log, dt_bias, o_norm;
  int H = 0, D = 0, K = 0;
  double g_min = -5.0, eps = 1e-5;
};
// `prefix` + names: "" with the kda_layer* short names, or "self_attn_" with the layer names.
KdaWeights load_kda(const Fixture& fx, bool layer_names, int H, int D, double g_min, double eps);

struct KdaState {
  std::vector<float> S;                       // [H, D, D]
  std::vector<float> hist_q, hist_k, hist_v;  // [K-1, C] each
  static KdaState zeros(const KdaWeights& w);
};
// x [T, E] (already normed) -> out [T, E]; updates state.
void kda_block(const KdaWeights& w, const float* x, int64_t T, KdaState& st, float* out,
               const Exec& ex);

// ---- MLA (§6.4) ------------------------------------------------------------------------------

inline constexpr double kMlaLowRankEps = 1e-6;  // q_a_layernorm / kv_a_layernorm (D2)

struct MlaWeights {
  OwnedMatrix q_a, q_b, kv_a, kv_b, o, g;
  std::vector<float> q_a_ln, kv_a_ln;
  MlaDims dims;
  int q_lora = 0;
};
MlaWeights load_mla(const Fixture& fx, const std::string& prefix, const MlaDims& dims, int q_lora);

struct MlaCache {
  std::vector<float> c, r;  // [n, kv_lora], [n, rope]
  int64_t n = 0;
};
// x [T, E] -> out [T, E]; appends T positions to the cache.
void mla_block(const MlaWeights& w, const float* x, int64_t T, MlaCache& cache, float* out,
               const Exec& ex);

// ---- latent MoE (§6.6) -----------------------------------------------------------------------

struct MoeWeights {
  OwnedMatrix gate, down, up, shared_w1, shared_w3, shared_w2;
  std::vector<float> bias, norm;
  std::vector<OwnedMatrix> w1, w3, w2;  // per expert
  int top_k = 0;
  bool renormalize = true, latent_norm = true;
  double scaling = 1.0, eps = 1e-5, beta1 = 4.0, beta2 = 25.0;
};
MoeWeights load_moe(const Fixture& fx, const std::string& prefix, int n_experts, int top_k);
// x [T, E] (already normed) -> out [T, E]. Experts run grouped by expert over the tokens that
// chose them (the prefill pattern); each token's combine runs in its own selection order.
void moe_block(const MoeWeights& w, const float* x, int64_t T, float* out, const Exec& ex,
               std::vector<int32_t>* ids_out = nullptr);

// ---- one decoder layer with the AttnRes bookkeeping (§6.2) -----------------------------------

struct LayerWeights {
  bool is_mla = false;
  KdaWeights kda;
  MlaWeights mla;
  MoeWeights moe;
  std::vector<float> input_ln, post_ln, f_attn, f_mlp;
};
struct LayerState {
  KdaState kda;
  MlaCache mla;
};
// P [T, E] in/out (the block partial sum); bank: AttnRes bank entries, each [T, E], oldest first.
void decoder_layer(const LayerWeights& w, int layer_idx, int block_size, double eps, int64_t T,
                   int64_t E, std::vector<float>& P, std::vector<std::vector<float>>& bank,
                   LayerState& st, const Exec& ex);

// f = F(norm ⊙ proj): the folded AttnRes scoring vector, an f32 product (NUMERICS.md §9).
std::vector<float> fold_attnres(const std::vector<float>& norm, const std::vector<float>& proj);

}  // namespace ktier::cpu::test
