#pragma once
// `ktier trace info`: what a trace holds, and the two facts every replay is measured against —
// the distinct keys (the compulsory-miss ceiling: without prefetch no policy of any size can hit
// more than requests - distinct keys) and the determinism oracle (a (position, layer)
// recomputed by a later pass must choose the same experts; docs/STRATA.md §2.3).

#include <cstdint>
#include <string>
#include <vector>

#include "strata/replay.h"
#include "strata/trace_format.h"

namespace ktier::strata {

struct TraceSummary {
  uint64_t steps = 0;     // (token, layer) request sets
  uint64_t prediction_only_steps = 0;  // steps with no request (a dense layer's predictions)
  uint64_t requests = 0;  // expert requests
  uint64_t tokens = 0;    // distinct (pass, position), counted per pass
  uint32_t passes = 0;
  uint32_t moe_layers = 0;  // distinct layers with requests
  uint32_t first_layer = 0, last_layer = 0;
  uint64_t distinct_keys = 0;      // distinct (layer, expert)
  uint64_t hit_ceiling = 0;        // requests - distinct_keys
  double hit_ceiling_rate = 0;     // hit_ceiling / requests
  uint64_t working_set_bytes = 0;  // distinct_keys * expert_bytes
  uint64_t repeated_groups = 0;    // (position, layer) occurrences after the first
  uint64_t mismatched_groups = 0;  // of those, chosen experts (in order) differ from the first
  std::vector<PredictionQuality> prediction;  // per recorded depth
};

TraceSummary summarize_trace(const Trace& trace, const RequestStream& stream);

// Human-readable lines for `ktier trace info`.
std::string format_summary(const TraceSummary& summary, const TraceHeader& header,
                           const std::string& source);

}  // namespace ktier::strata
