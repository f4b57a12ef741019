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

// One router call's buffers in backend memory, one allocation laid out [ids T x k | weights
// T x k | logits T x N_e] (ids: int32 in float-sized cells), so that select_experts brings all
// three to the host in one download: on a GPU one synchronization per router, not three.
struct RoutingBuffers {
  float* base = nullptr;  // T * (2k + N_e) floats; null after a failed Scratch allocation
  int64_t T = 0, k = 0, n_experts = 0;

  static int64_t floats(int64_t T, int64_t k, int64_t n_experts) { return T * (2 * k + n_experts); }
  float* ids() const { return base; }
  float* weights() const { return base + T * k; }
  float* logits() const { return base + 2 * T * k; }
};
RoutingBuffers routing_buffers(Scratch& s, const format::ModelConfig& c, int64_t T);

// Host copies of one router call, as select_experts leaves them.
struct Routing {
  std::vector<int32_t> ids;    // [T, k]
  std::vector<float> weights;  // [T, k]
  std::vector<float> scores;   // [T, N_e]: the router's logits
};

// Top-k of the router's logits (buf.logits(), written by the caller): ids and weights into
// buf.ids()/buf.weights() (the expert kernels read them there), then all of `buf` copied to
// `host` in one download; the tiers, observers and grouping read the host copies.
Status select_experts(const MoeWeights& w, const format::ModelConfig& c, const RoutingBuffers& buf,
                      Routing& host, backend::Backend& be);

// Status::corrupt when one of a MoE router's logits (host.scores, [T, N_e]) for layer `layer`
// at positions from `first_position` is NaN or infinite: top-k ranks NaN below every score, so
// a damaged router weight would change the experts chosen without reaching the logits check.
// The message begins with kNonFiniteRouterScores.
Status check_router_scores(const Routing& host, int64_t n_experts, int64_t layer,
                           int64_t first_position);
inline constexpr std::string_view kNonFiniteRouterScores = "the router scores of layer ";

}  // namespace ktier::model
