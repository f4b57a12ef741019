#pragma once
// Records a live run's routing as a strata trace (trace_format.h, docs/STRATA.md): `ktier run
// --trace FILE`. One TraceStep per (token, MoE layer): the router's top-k in selection order with
// their combine weights, and with lookahead depth D the predictions made for layers L+1..L+D
// after layer L's attention and routing-free FFN part (highest weight first; fewer near the last
// layer), and with `refresh` each step's own experts as predicted after the previous layer's FFN
// (depth-0 predictions, TraceStep::refreshed). A forward pass (a prefill chunk or one decode
// step) is one `pass`. Predictions made at a dense layer (K3: layer 0, for layer 1) are recorded
// in steps of their own with no chosen experts (k = 0).
//
// Errors from the writer cannot propagate through the observer callback, so the first one is
// kept and returned by close(); later steps are dropped. Not thread-safe (one forward pass).

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "common/status.h"
#include "format/checkpoint.h"
#include "model/blocks.h"
#include "strata/trace_format.h"

namespace ktier::strata {

class TraceRecorder final : public model::RoutingObserver, public model::LookaheadObserver {
 public:
  // Creates `path` with a header describing `ckpt`'s MoE shape. Status::usage when the model does
  // not fit the trace format (more than 65535 experts or top-k above 255), Status::runtime when
  // the file cannot be created.
  // `lookahead_depth`: the header's (0 when no prediction is recorded); `refresh`: whether the
  // header carries kTraceFlagRefresh (the run makes depth-0 predictions).
  static Result<std::unique_ptr<TraceRecorder>> create(const std::filesystem::path& path,
                                                       const format::Checkpoint& ckpt,
                                                       int lookahead_depth = 0,
                                                       bool refresh = false);
  void on_routing(int64_t layer, int64_t first_position, const int32_t* ids, const float* weights,
                  int64_t T, int k) override;
  void on_prediction(int64_t layer, int depth, int64_t first_position, const int32_t* ids,
                     const float* weights, int64_t T, int k) override;
  // Writes the footer. Returns the first error met while recording, if any, and then writes
  // no footer (the file is closed without one when the recorder is destroyed: readers refuse it).
  Status close();
  uint64_t steps() const { return writer_.steps_written(); }

 private:
  TraceRecorder(TraceWriter w, bool refresh) : writer_(std::move(w)), refresh_(refresh) {}
  void start_layer(int64_t layer);  // advances the pass when layers restart
  // Writes predictions whose layer routed nothing (a dense layer) as steps with k = 0.
  void flush_predictions_without_routing();
  TraceWriter writer_;
  Status error_;
  int64_t last_layer_ = INT64_MAX;
  uint32_t pass_ = 0;
  bool started_ = false;
  // Predictions made at layer predicted_layer_ for tokens predicted_first_position_ + [0, T),
  // per depth: [T * k] experts with weights.
  int64_t predicted_layer_ = -1;
  int64_t predicted_first_position_ = 0, predicted_tokens_ = 0;
  int predicted_k_ = 0;
  std::vector<std::vector<ExpertWeight>> predicted_;
  // The refresh of layer refreshed_layer_ for the same tokens: [T * k], or empty. Depth-0
  // predictions are dropped when the header has no refresh flag (refresh_ false).
  bool refresh_ = false;
  int64_t refreshed_layer_ = -1;
  std::vector<ExpertWeight> refreshed_;
};

}  // namespace ktier::strata
