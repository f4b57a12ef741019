#pragma once
// Per-sequence state of the forward pass (K3-MODEL §6.1): what one sequence carries from one
// token to the next. Only the attention mixers keep state; AttnRes and the FFNs are per token.
//
// Ownership and threads: a SequenceState is a plain value owned by its caller; one forward pass
// at a time may use it. Copying it forks the sequence.

#include <cstdint>
#include <vector>

namespace ktier::model {

struct KdaState {                        // §6.3, per KDA layer
  std::vector<float> S;                  // [H, D, D] delta-rule state, row = key channel
  std::vector<float> conv_q, conv_k, conv_v;  // [K-1, C] last pre-conv inputs, oldest first
};

struct MlaCache {          // §6.4, per MLA layer: the absorbed (latent) cache
  std::vector<float> c;    // [n, kv_lora] normalised latents
  std::vector<float> r;    // [n, rope] raw (unrotated) rope keys
  int64_t n = 0;           // positions held
};

struct LayerState {
  KdaState kda;  // used by KDA layers
  MlaCache mla;  // used by MLA layers
};

struct SequenceState {
  std::vector<LayerState> layers;  // [L]
  int64_t n_tokens = 0;            // tokens consumed (the next token's position)
  // Bytes held by the state (KDA states + conv histories + MLA caches), for reports.
  uint64_t bytes() const;
};

}  // namespace ktier::model
