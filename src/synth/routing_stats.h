#pragma once
// Expert-use entropy of a freshly written synthetic checkpoint, measured with the engine's own
// forward pass: a quick check that its routers are not degenerate (a collapsed router would make
// every tier-placement figure meaningless).
//
// The sample prompt (sample_text.cpp) is encoded with the synthetic vocabulary, cut to
// `max_tokens`, and run through Model::forward as one teacher-forced chunk; every MoE layer's
// selections are counted. The report is the Shannon entropy (bits) of each layer's distribution
// of expert-use counts, against its maximum log2(num_experts).

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "common/status.h"
#include "synth/tokenizer_gen.h"

namespace ktier::synth {

struct LayerRouting {
  int64_t layer = 0;
  double entropy_bits = 0.0;
  double max_bits = 0.0;     // log2(num_experts)
  int64_t experts_used = 0;  // distinct experts selected at least once
};

struct RoutingStats {
  std::string prompt;
  int64_t tokens = 0;
  double seconds = 0.0;              // the forward pass
  std::vector<LayerRouting> layers;  // MoE layers, ascending
};

// Opens the checkpoint in `dir` and runs the forward pass with `threads` threads (0 = all).
// Errors: those of opening the checkpoint (it was just written, so any is a bug or an I/O error).
Result<RoutingStats> measure_routing(const std::filesystem::path& dir, const SynthVocab& vocab,
                                     int64_t max_tokens, int threads);

}  // namespace ktier::synth
