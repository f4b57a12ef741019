#pragma once
// The blocks of one K3 decoder layer on a Backend (K3-MODEL §6.3-§6.6). Each takes the normed
// input x [T, E] of T consecutive tokens and writes out [T, E]; activations are f32. Every
// pointer (activations, weights, state) is memory of that backend. On the CPU backends a
// token's output never depends on T or on which other tokens share the call, so prefill in any
// chunking and one-token decode give identical bytes (docs/NUMERICS.md §11; CUDA: §13). Errors: the backend's (device
// failures; never on the CPU) and, for moe_block, the ExpertSource's.

#include <cstdint>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "backend/backend.h"
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
// thread for depth 1, 2, ... in order, before layer `layer`'s experts are routed. Depth 0 is the
// refresh: layer `layer`'s own router scored after layer `layer - 1`'s FFN, before `layer`'s
// attention (so before its depth 1, 2, ... calls).
class LookaheadObserver {
 public:
  virtual ~LookaheadObserver() = default;
  // ids, weights [T, k]: each token's predicted experts, highest weight first (ties: lower id).
  virtual void on_prediction(int64_t layer, int depth, int64_t first_position, const int32_t* ids,
                             const float* weights, int64_t T, int k) = 0;
};

// KDA (§6.3): updates the state's S and conv histories.
Status kda_block(const KdaWeights& w, const format::ModelConfig& c, const float* x, int64_t T,
                 KdaState& st, float* out, backend::Backend& be);

// The MLA attention shape of config `c` (§6.4): what the kernels and the buffer sizing take.
cpu::MlaDims mla_dims(const format::ModelConfig& c);

// Gated NoPE MLA, absorbed latent cache (§6.4): appends T positions to the cache.
Status mla_block(const MlaWeights& w, const format::ModelConfig& c, const float* x, int64_t T,
                 MlaCache& cache, float* out, backend::Backend& be);

// SiTU-GLU MLP (dense layer-0 MLP, shared expert).
Status glu_mlp(const GluWeights& w, const format::ModelConfig& c, const float* x, int64_t T,
               float* out, backend::Backend& be);

// Latent MoE with the shared expert (§6.6). The experts the chunk selects are fetched once and
// each runs once over all the tokens that chose it; the ExpertSource's views must be memory of
// `be` too. shared_out [T, E]: glu_mlp(w.shared) of the same x, computed by the caller (before
// router lookahead, which sees it: docs/STRATA.md §7); null exactly when !w.has_shared. out =
// latent path + shared_out.
Status moe_block(const MoeWeights& w, const format::ModelConfig& c, int64_t layer,
                 int64_t first_position, ExpertSource& experts, RoutingObserver* observer,
                 const float* x, const float* shared_out, int64_t T, float* out,
                 backend::Backend& be);

// Top-k of a MoE router's logits [T, N_e] (backend memory): ids and weights [T, k] into
// ids_dev/weights_dev (backend memory; ids_dev holds int32 in float-sized cells), then copied to
// the host vectors (resized to T * k), which the tiers, observers and grouping read.
Status select_experts(const MoeWeights& w, const format::ModelConfig& c, const float* logits,
                      int64_t T, float* ids_dev, float* weights_dev, std::vector<int32_t>& ids,
                      std::vector<float>& weights, backend::Backend& be);

// Status::corrupt when one of a MoE router's logits [T, N_e] (backend memory) for layer `layer`
// at positions from `first_position` is NaN or infinite: top-k ranks NaN below every score, so
// a damaged router weight would change the experts chosen without reaching the logits check.
// The message begins with kNonFiniteRouterScores.
Status check_router_scores(const float* logits, int64_t T, int64_t n_experts, int64_t layer,
                           int64_t first_position, backend::Backend& be);
inline constexpr std::string_view kNonFiniteRouterScores = "the router scores of layer ";

// Scratch floats in backend memory for one call: allocations are checked together (status())
// before any op uses them; everything is released with the Scratch.
class Scratch {
 public:
  explicit Scratch(backend::Backend& be) : be_(be) {}
  float* floats(int64_t n);  // null after a failed allocation (see status())
  Status status() const { return status_; }

 private:
  backend::Backend& be_;
  std::vector<backend::BackendBuffer> buffers_;
  Status status_ = Status::ok();
};

}  // namespace ktier::model
