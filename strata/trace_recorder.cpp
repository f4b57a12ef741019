#include "strata/trace_recorder.h"

#include <string>

namespace ktier::strata {
namespace {

// The model's picks (ids [n] as int32, weights [n]) in the trace's form, replacing `out`.
void copy_picks(const int32_t* ids, const float* weights, int64_t n,
                std::vector<ExpertWeight>& out) {
  out.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    out[static_cast<size_t>(i)] = {static_cast<uint16_t>(ids[i]), weights[i]};
}

}  // namespace

Result<std::unique_ptr<TraceRecorder>> TraceRecorder::create(const std::filesystem::path& path,
                                                             const format::Checkpoint& ckpt,
                                                             int lookahead_depth, bool refresh) {
  const format::ModelConfig& c = ckpt.config();
  TraceHeader h;
  h.num_layers = static_cast<uint32_t>(c.num_hidden_layers);
  h.first_moe_layer = static_cast<uint32_t>(c.first_k_dense_replace);
  h.experts_per_layer = static_cast<uint32_t>(c.num_experts);
  h.top_k = static_cast<uint32_t>(c.num_experts_per_token);
  if (lookahead_depth < 0 || lookahead_depth > kMaxTraceLookahead)
    return Status::usage("--lookahead " + std::to_string(lookahead_depth) +
                         ": a trace records depths 0.." + std::to_string(kMaxTraceLookahead));
  h.lookahead_depth = static_cast<uint32_t>(lookahead_depth);
  h.expert_bytes = ckpt.expert_summary().bytes_per_expert;
  h.flags = kTraceFlagWeights | (refresh ? kTraceFlagRefresh : 0u);
  KTIER_ASSIGN_OR_RETURN(TraceWriter w, TraceWriter::create(path, h));
  return std::unique_ptr<TraceRecorder>(new TraceRecorder(std::move(w), refresh));
}

void TraceRecorder::start_layer(int64_t layer) {
  // Layers arrive in increasing order within a forward pass; a lower one starts the next pass.
  if (started_ && layer <= last_layer_) ++pass_;
  started_ = true;
  last_layer_ = layer;
}

void TraceRecorder::flush_predictions_without_routing() {
  if (predicted_layer_ < 0) return;
  if (predicted_.empty()) {  // its depth-1 target was dense too: nothing to record
    predicted_layer_ = -1;
    return;
  }
  // A layer that routes nothing (dense) but predicted later layers: steps with k = 0.
  start_layer(predicted_layer_);
  TraceStep step;
  step.pass = pass_;
  step.layer = static_cast<uint16_t>(predicted_layer_);
  for (int64_t t = 0; t < predicted_tokens_ && error_.is_ok(); ++t) {
    step.position = static_cast<uint32_t>(predicted_first_position_ + t);
    step.predicted.clear();
    for (const std::vector<ExpertWeight>& depth : predicted_) {
      const auto first = depth.begin() + t * predicted_k_;
      step.predicted.emplace_back(first, first + predicted_k_);
    }
    error_ = writer_.append(step);
  }
  predicted_layer_ = -1;
}

void TraceRecorder::on_routing(int64_t layer, int64_t first_position, const int32_t* ids,
                               const float* weights, int64_t T, int k) {
  if (!error_.is_ok()) return;
  if (predicted_layer_ != layer) flush_predictions_without_routing();
  start_layer(layer);
  TraceStep step;
  step.pass = pass_;
  step.layer = static_cast<uint16_t>(layer);
  const bool with_predictions = predicted_layer_ == layer;
  const bool with_refresh =
      refreshed_layer_ == layer && refreshed_.size() == static_cast<size_t>(T * k);
  for (int64_t t = 0; t < T && error_.is_ok(); ++t) {
    step.position = static_cast<uint32_t>(first_position + t);
    copy_picks(ids + t * k, weights + t * k, k, step.chosen);
    step.predicted.clear();
    for (size_t d = 0; with_predictions && d < predicted_.size(); ++d) {
      const auto first = predicted_[d].begin() + t * k;
      step.predicted.emplace_back(first, first + k);
    }
    if (with_refresh) step.refreshed.assign(refreshed_.begin() + t * k, refreshed_.begin() + (t + 1) * k);
    error_ = writer_.append(step);
  }
  predicted_layer_ = -1;
  refreshed_layer_ = -1;
}

void TraceRecorder::on_prediction(int64_t layer, int depth, int64_t first_position,
                                  const int32_t* ids, const float* weights, int64_t T, int k) {
  if (!error_.is_ok()) return;
  if (depth == 0) {  // the refresh of `layer`, before its attention: kept for its routing
    if (!refresh_) return;
    refreshed_layer_ = layer;
    copy_picks(ids, weights, T * k, refreshed_);
    return;
  }
  if (layer != predicted_layer_) {
    flush_predictions_without_routing();
    predicted_layer_ = layer;
    predicted_first_position_ = first_position;
    predicted_tokens_ = T;
    predicted_k_ = k;
    predicted_.clear();
  }
  // Depths arrive in order 1, 2, ...; one that is skipped (a dense target) ends the list.
  if (static_cast<size_t>(depth) != predicted_.size() + 1) return;
  copy_picks(ids, weights, T * k, predicted_.emplace_back());
}

Status TraceRecorder::close() {
  // A step refused (a lookahead weight not finite: activations that are not) leaves the file
  // without its footer (the writer's destructor closes it), so that readers refuse it rather
  // than take the steps before it for the whole run.
  if (!error_.is_ok()) return error_;
  flush_predictions_without_routing();
  return error_.is_ok() ? writer_.close() : error_;
}

}  // namespace ktier::strata
