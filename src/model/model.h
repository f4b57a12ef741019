#pragma once
// The whole K3 forward pass on a Backend (K3-MODEL §6.2, §6.7, §6.8): the CPU backend gives the
// exact CPU bytes; the weights, the expert views and the sequence state are that backend's
// memory.
//
// Model::forward consumes T tokens at positions state.n_tokens .. +T-1, layer-major (every
// layer runs over the whole chunk before the next), updates the sequence state and writes the
// logits. A decode step is forward() with T = 1: prefill in any chunking and decode run the same
// code, and give identical bytes on the CPU backends (the numerics contract, docs/NUMERICS.md)
// and on CUDA's fused kernels; CUDA with cuBLAS prefill (8+ tokens) agrees within §13's bounds.
//
// Threads: a Model is not thread-safe (its ExpertSource and Backend are not).

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "common/status.h"
#include "backend/backend.h"
#include "model/blocks.h"
#include "model/experts.h"
#include "model/state.h"
#include "model/weights.h"

namespace ktier::model {

enum class LogitRows {
  kAll,   // logits [T, V]: teacher-forced evaluation
  kLast,  // logits [1, V] of the last token only: prefill before sampling (skips T-1 lm_heads)
  kNone,  // no lm_head at all: a prefill chunk that is not the prompt's last
};

// Optional per-layer probe (tests, checksums, debugging). Called after layer l has added its FFN
// output: P [T, E] is the block partial sum of K3-MODEL §6.2.
class LayerObserver {
 public:
  virtual ~LayerObserver() = default;
  virtual void after_layer(int64_t layer, const float* P, int64_t T, int64_t E) = 0;
};

// Backend memory one sequence needs besides the weights: upper bounds, each allocation rounded
// up to backend::kDeviceAlign, for forward() calls of at most `chunk` tokens over a sequence
// from new_sequence(positions) that runs at most `positions` tokens, with logits as `rows` says
// and with or without router lookahead. GPU mode sets this much of --vram aside before placing
// the trunk and the experts; the emulated device's tests hold the whole run to --vram.
struct WorkingSet {
  uint64_t state_bytes = 0;       // KDA states, conv histories, MLA caches for `positions`
  uint64_t activation_bytes = 0;  // forward()'s buffers, the largest block's scratch, logits
  uint64_t total() const { return state_bytes + activation_bytes; }
};
WorkingSet working_set(const format::ModelConfig& c, int64_t chunk, int64_t positions,
                       LogitRows rows, bool lookahead);

// The residual stream of one forward() chunk of T tokens (K3-MODEL §6.0, §6.2), backend memory.
// Model::forward makes one per call; a test may fill P and the bank itself and run one layer.
struct ResidualStream {
  int64_t T = 0;
  backend::BackendBuffer P;                  // [T, E] the running block partial sum
  std::vector<backend::BackendBuffer> bank;  // [T, E] each: the finished blocks' P, oldest first
  // [T, E] scratch of Model::layer; `ahead` (P as lookahead sees it) only with lookahead.
  backend::BackendBuffer mixed, x, y, shared, ahead;
  std::vector<const float*> sources;         // the bank, then P: AttnRes's inputs

  void gather_sources();
};

class Model {
 public:
  // `trunk`, `experts` and `backend` must outlive the Model; `experts` may be null only when no
  // layer is a MoE layer. Every weight they hand out must be memory of `backend`.
  Model(TrunkSource& trunk, ExpertSource* experts, backend::Backend& backend);

  const format::ModelConfig& config() const { return trunk_.config(); }
  backend::Backend& backend() const { return be_; }
  // A fresh sequence (zero KDA state, empty MLA caches) in the backend's memory, its MLA caches
  // reserved for `positions` tokens (they grow past that, by doubling). Errors: the backend's
  // (out of device memory).
  Result<SequenceState> new_sequence(int64_t positions = 0) const;

  // Runs ids (each in [0, V): Status::usage naming the id otherwise) and writes logits (host
  // memory) as `rows` says (null allowed for kNone). Errors: the TrunkSource's, the
  // ExpertSource's (Status::runtime for I/O, Status::corrupt for a checksum) and the backend's;
  // on error the state is unusable and must be discarded. Runs under cpu::ExactFpScope: the
  // calling thread's rounding mode, FTZ/DAZ and exception masks do not reach the arithmetic.
  Status forward(std::span<const int32_t> ids, SequenceState& state, LogitRows rows,
                 float* logits);

  // A stream for chunks of T >= 1 tokens: P and the scratch allocated (P's contents
  // unspecified), the bank empty. Errors: the backend's.
  Result<ResidualStream> new_stream(int64_t T) const;
  // Decoder layer l (§6.0, §6.3-§6.6) over the stream's T tokens at positions first_position..:
  // the AttnRes mixes, norms, attention, FFN; P and the bank updated (a boundary layer pushes
  // P), `ls` advanced, the routing and lookahead observers called. forward() runs this for each
  // layer; the conformance layer vectors run it on a P and bank of their own. It does not call
  // the ExpertSource's begin_pass (forward does): a caller over a prefetching source calls it
  // before a pass's first layer. Errors: as forward.
  Status layer(int64_t l, const LayerWeights& lw, LayerState& ls, int64_t first_position,
               ResidualStream& s);

  void set_routing_observer(RoutingObserver* o) { last_routing_.next = o; }
  // The selection of the last MoE layer that routed in the last forward() (or a layer() call
  // since): where a pass whose stream turned non-finite after it looks for a damaged expert
  // (Engine::explain_nonfinite). Layer -1 where none has routed in it.
  struct MoeRouting {
    int64_t layer = -1;
    std::vector<int32_t> ids;  // [T, k] in selection order
  };
  const MoeRouting& last_moe_routing() const { return last_routing_.last; }
  // Router lookahead (docs/STRATA.md §4): after layer l's attention, for d = 1..depth, MoE layer
  // l+d's router is scored on the current residual stream (its own AttnRes mix of the bank and
  // P, its post-attention norm) and its top-k goes to the observers. With `refresh`, layer l+1's
  // router is scored once more after layer l's FFN, on the complete residual stream, and given
  // to the observers as a depth-0 prediction made at layer l+1. `routing(l)` gives layer l's
  // routing weights (bind_routing) or null to skip that layer; it must stay valid while the
  // Model runs. Predictions never change an output byte; depth 0 turns lookahead (and the
  // refresh) off.
  using RoutingWeightsFn = std::function<const LayerWeights*(int64_t layer)>;
  void set_lookahead(int depth, bool refresh, RoutingWeightsFn routing) {
    lookahead_depth_ = depth;
    lookahead_refresh_ = depth > 0 && refresh;
    routing_weights_ = std::move(routing);
  }
  int lookahead_depth() const { return lookahead_depth_; }
  bool lookahead_refresh() const { return lookahead_refresh_; }
  // Whether predictions are made: a depth and someone to use them (a memory-mapped run has no
  // tier to prefetch into, and its forward skips them).
  bool lookahead_in_use() const { return lookahead_depth_ > 0 && !lookahead_observers_.empty(); }
  // Observers are called in the order added; they must outlive the Model (or be removed).
  void add_lookahead_observer(LookaheadObserver* o) { lookahead_observers_.push_back(o); }
  void remove_lookahead_observer(LookaheadObserver* o) {
    std::erase(lookahead_observers_, o);
  }
  void set_layer_observer(LayerObserver* o) { layer_observer_ = o; }
  // Called after each layer of every forward() with the layer's index, for progress lines
  // (nothing is copied; in GPU mode the layer's work has been issued, not necessarily run).
  // Null: none.
  void set_layer_progress(std::function<void(int64_t layer)> f) { layer_progress_ = std::move(f); }
  // Asked between two layers of every forward() (after layer_progress): true abandons the pass
  // there with Status::interrupted, the state part-run (some layers hold the chunk, n_tokens
  // does not): the sequence is unusable, as after any error of forward(). For a stop whose
  // sequence is discarded anyway (Ctrl-C in a run that saves nothing). Null: never.
  void set_layer_stop(std::function<bool()> f) { layer_stop_ = std::move(f); }

 private:
  TrunkSource& trunk_;
  ExpertSource* experts_;
  backend::Backend& be_;
  // Scores the routers of MoE layers l+first_depth .. l+last_depth on the residual stream
  // `sources` (the bank and P as the caller has them, backend memory, [T, E] each) and tells the
  // observers, prediction (l, d) for layer l + d.
  Status predict(int64_t l, int first_depth, int last_depth, int64_t first_position,
                 const std::vector<const float*>& sources, int64_t T);
  // AttnRes over the stream's bank and P with scoring vector f: out [T, E].
  Status aggregate(ResidualStream& s, const F32Vec& f, float* out);

  // Keeps the last routing, then tells the routing observer (set_routing_observer's) if any.
  struct RoutingTap : RoutingObserver {
    void on_routing(int64_t layer, int64_t first_position, const int32_t* ids,
                    const float* weights, int64_t T, int k) override;
    MoeRouting last;
    RoutingObserver* next = nullptr;
  } last_routing_;
  int lookahead_depth_ = 0;
  bool lookahead_refresh_ = false;
  RoutingWeightsFn routing_weights_;
  std::vector<LookaheadObserver*> lookahead_observers_;
  LayerObserver* layer_observer_ = nullptr;
  std::function<void(int64_t)> layer_progress_;
  std::function<bool()> layer_stop_;
};

}  // namespace ktier::model
