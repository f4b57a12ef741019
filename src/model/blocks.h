#pragma once
// The blocks of one K3 decoder layer on the CPU kernels (K3-MODEL §6.3-§6.6). Each takes the
// normed input x [T, E] of T consecutive tokens and writes out [T, E]; activations are f32.
// A token's output never depends on T or on which other tokens share the call, so prefill in
// any chunking and one-token decode give identical bytes (docs/NUMERICS.md §11).

#include <cstdint>

#include "common/status.h"
#include "cpu/exec.h"
#include "format/config.h"
#include "model/experts.h"
#include "model/state.h"
#include "model/weights.h"

namespace ktier::model {

// Sees the routing of every MoE layer (trace recording, expert-use statistics). Called on the
// forward pass's thread, before the layer's experts are fetched.
class RoutingObserver {
 public:
  virtual ~RoutingObserver() = default;
  // ids, weights [T, k]: the selected experts of each token in selection order, and their
  // combine weights. `first_position` is the sequence position of token 0.
  virtual void on_routing(int64_t layer, int64_t first_position, const int32_t* ids,
                          const float* weights, int64_t T, int k) = 0;
};

// Sees router lookahead (docs/STRATA.md §4): after layer `layer`'s attention, the router of MoE
// layer `layer + depth` scored on the current residual stream. Called on the forward pass's
// thread for depth 1, 2, ... in order, before layer `layer`'s experts are routed.
class LookaheadObserver {
 public:
  virtual ~LookaheadObserver() = default;
  // ids, weights [T, k]: each token's predicted experts, highest weight first (ties: lower id).
  virtual void on_prediction(int64_t layer, int depth, int64_t first_position, const int32_t* ids,
                             const float* weights, int64_t T, int k) = 0;
};

// KDA (§6.3): updates the state's S and conv histories.
void kda_block(const KdaWeights& w, const format::ModelConfig& c, const float* x, int64_t T,
               KdaState& st, float* out, const cpu::Exec& ex);

// Gated NoPE MLA, absorbed latent cache (§6.4): appends T positions to the cache.
void mla_block(const MlaWeights& w, const format::ModelConfig& c, const float* x, int64_t T,
               MlaCache& cache, float* out, const cpu::Exec& ex);

// SiTU-GLU MLP (dense layer-0 MLP, shared expert).
void glu_mlp(const GluWeights& w, const format::ModelConfig& c, const float* x, int64_t T,
             float* out, const cpu::Exec& ex);

// Latent MoE with the shared expert (§6.6). The experts the chunk selects are fetched once and
// each runs once over all the tokens that chose it. Errors: the ExpertSource's.
Status moe_block(const MoeWeights& w, const format::ModelConfig& c, int64_t layer,
                 int64_t first_position, ExpertSource& experts, RoutingObserver* observer,
                 const float* x, int64_t T, float* out, const cpu::Exec& ex);

}  // namespace ktier::model
