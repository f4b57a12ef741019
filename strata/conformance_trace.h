#pragma once
// Reads the conformance routing trace (`../shared/conformance/expert_trace.bin`, README §10) and
// converts it to a ktier Trace.
//
// Input: no header, a flat array of little-endian int32 pairs (layer, expert), one per expert
// request, in request order. Structure (README §10.2): full-recompute forward passes; inside a
// pass, for each MoE layer in increasing order, for each position t = 0..T-1, the top_k experts
// chosen for that token at that layer.
//
// Conversion: every group of top_k consecutive records becomes one TraceStep = one (token,
// layer) request set, keeping the file's order. The pass structure is inferred, not assumed:
// a pass starts with a run of groups at the lowest layer (its length is T, the pass's positions
// 0..T-1), and each following layer must have exactly T groups, layers rising by one, until the
// lowest layer appears again (the next pass) or the file ends. step.pass is the pass index,
// step.position the position inside it. No weights (0, flag kTraceFlagWeights clear) and no
// predictions (lookahead_depth 0) exist in this format.
//
// Errors: a size that is not a whole number of groups, an id out of range, a group mixing
// layers or repeating an expert, or a pass that breaks the structure is Status::corrupt (exit 3)
// naming the file and the record index (0-based, 8 bytes per record).

#include <cstdint>
#include <filesystem>

#include "common/status.h"
#include "strata/trace_format.h"

namespace ktier::strata {

// K3's shape (K3-MODEL.md §1): 896 routed experts per MoE layer, top-16, 17,547,264 bytes each.
inline constexpr uint32_t kK3ExpertsPerLayer = 896;
inline constexpr uint32_t kK3TopK = 16;
inline constexpr uint64_t kK3ExpertBytes = 17547264;

struct ConformanceTraceOptions {
  uint32_t top_k = kK3TopK;                         // records per group (one step)
  uint32_t experts_per_layer = kK3ExpertsPerLayer;  // expert ids must be below it
  uint64_t expert_bytes = kK3ExpertBytes;           // written to the header
};

Result<Trace> read_conformance_trace(const std::filesystem::path& path,
                                     const ConformanceTraceOptions& options = {});

}  // namespace ktier::strata
