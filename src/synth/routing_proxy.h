#pragma once
// Router-on-embedding proxy for expert-use entropy: a quick check that a synthetic checkpoint's
// routers are not degenerate, usable before (and without) the engine's forward pass.
//
// For each token of a prompt: x = RMS-normalised embedding row (x / sqrt(mean(x²) + 1e-5), no
// gain); then for every MoE layer, with that layer's stored router (BF16 gate.weight and F32
// e_score_correction_bias, regenerated bit-exactly from the plan): s = σ(W x), choice score
// s + bias, the top-k by decreasing score (ties to the lower index, decision D5). The report is
// the Shannon entropy (bits) of the distribution of expert-use counts per layer over the prompt,
// against its maximum log2(num_experts). This is NOT what the model's forward pass routes: real
// router inputs are the post-attention-layernorm of the residual stream, not raw embeddings.

#include <cstdint>
#include <string>
#include <vector>

#include "synth/plan.h"
#include "synth/shape.h"
#include "synth/tokenizer_gen.h"

namespace ktier::synth {

struct LayerRouting {
  int64_t layer = 0;
  double entropy_bits = 0.0;
  double max_bits = 0.0;        // log2(num_experts)
  int64_t experts_used = 0;     // distinct experts selected at least once
};

struct RoutingProxy {
  std::string prompt;
  int64_t tokens = 0;
  std::vector<LayerRouting> layers;  // MoE layers, ascending
};

RoutingProxy routing_proxy(const SynthShape& shape, const Plan& plan, const SynthVocab& vocab);

}  // namespace ktier::synth
