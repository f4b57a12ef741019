#pragma once
// Records a live run's routing as a strata trace (trace_format.h, docs/STRATA.md): `ktier run
// --trace FILE`. One TraceStep per (token, MoE layer): the router's top-k in selection order with
// their combine weights. A forward pass (a prefill chunk or one decode step) is one `pass`.
// Lookahead predictions are not recorded yet (header lookahead_depth 0).
//
// Errors from the writer cannot propagate through the observer callback, so the first one is
// kept and returned by close(); later steps are dropped. Not thread-safe (one forward pass).

#include <cstdint>
#include <filesystem>
#include <optional>

#include "common/status.h"
#include "format/checkpoint.h"
#include "model/blocks.h"
#include "strata/trace_format.h"

namespace ktier::strata {

class TraceRecorder final : public model::RoutingObserver {
 public:
  // Creates `path` with a header describing `ckpt`'s MoE shape. Status::usage when the model does
  // not fit the trace format (more than 65535 experts or top-k above 255), Status::runtime when
  // the file cannot be created.
  static Result<std::unique_ptr<TraceRecorder>> create(const std::filesystem::path& path,
                                                       const format::Checkpoint& ckpt);
  void on_routing(int64_t layer, int64_t first_position, const int32_t* ids, const float* weights,
                  int64_t T, int k) override;
  // Writes the footer. Returns the first error met while recording, if any.
  Status close();
  uint64_t steps() const { return writer_.steps_written(); }

 private:
  explicit TraceRecorder(TraceWriter w) : writer_(std::move(w)) {}
  TraceWriter writer_;
  Status error_;
  int64_t last_layer_ = INT64_MAX;
  uint32_t pass_ = 0;
  bool started_ = false;
};

}  // namespace ktier::strata
