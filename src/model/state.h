#pragma once
// Per-sequence state of the forward pass (K3-MODEL §6.1): what one sequence carries from one
// token to the next. Only the attention mixers keep state; AttnRes and the FFNs are per token.
//
// Ownership and threads: a SequenceState is owned by its caller and lives in the memory of the
// Backend the Model runs on (Model::new_sequence), which must outlive it; one forward pass at a
// time may use it. Move-only.

#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace ktier::model {

struct KdaState {                          // §6.3, per KDA layer
  backend::BackendArray S;                 // [H, D, D] delta-rule state, row = key channel
  backend::BackendArray conv_q, conv_k, conv_v;  // [K-1, C] last pre-conv inputs, oldest first
};

struct MlaCache {            // §6.4, per MLA layer: the absorbed (latent) cache
  backend::BackendArray c;   // [n, kv_lora] normalised latents
  backend::BackendArray r;   // [n, rope] raw (unrotated) rope keys
  int64_t n = 0;             // positions held
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
