#pragma once
// The non-expert weights of a K3 checkpoint, bound as cpu::WeightMatrix views (K3-MODEL §4, §5).
//
// Matrices are used in their stored dtype (F32, BF16 or F16): nothing is widened or converted
// ahead of time. In OpenMode::kMap the views point into the checkpoint's mapping (zero copy);
// in OpenMode::kPread, or when a tensor's bytes are not aligned to its element size, the bytes
// are read into buffers owned by ModelWeights. Small vectors (norm gains, conv taps, A_log,
// dt_bias, router bias, the folded AttnRes vectors) are widened to f32 once, at load.
//
// Lifetime and threads: a ModelWeights borrows the Checkpoint it was loaded from (which must
// outlive it) and is immutable after load(), so any number of threads may read it.

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "cpu/types.h"
#include "format/checkpoint.h"

namespace ktier::model {

// SiTU-GLU MLP: down(situ(gate x, up x)). The dense layer-0 MLP and the fused shared expert.
struct GluWeights {
  cpu::WeightMatrix gate, up, down;  // [I, E], [I, E], [E, I]
};

struct KdaWeights {  // §6.3; C = H*D
  cpu::WeightMatrix q, k, v, g;      // [C, E]
  cpu::WeightMatrix b;               // [H, E]
  cpu::WeightMatrix f_a, f_b;        // [D, E], [C, D]
  cpu::WeightMatrix o;               // [E, C]
  std::vector<float> q_conv, k_conv, v_conv;  // [C, K] taps, tap K-1 = current input
  std::vector<float> A_log;          // [H] (the first H elements of the stored tensor, D1)
  std::vector<float> dt_bias;        // [C]
  std::vector<float> o_norm;         // [D]
};

struct MlaWeights {  // §6.4
  cpu::WeightMatrix q_a, q_b;   // [q_lora, E], [H*(nope+rope), q_lora]
  cpu::WeightMatrix kv_a;       // [kv_lora+rope, E]
  cpu::WeightMatrix kv_b;       // [H*(nope+v), kv_lora]
  cpu::WeightMatrix o;          // [E, H*v]
  cpu::WeightMatrix g;          // [H*v, E]; data == nullptr when mla_use_output_gate is false
  std::vector<float> q_a_norm, kv_a_norm;
};

struct MoeWeights {  // §6.6: the trunk of a MoE layer (the routed experts come from an ExpertSource)
  cpu::WeightMatrix router;          // [N_e, E]
  std::vector<float> router_bias;    // [N_e] e_score_correction_bias
  cpu::WeightMatrix down, up;        // [latent, E], [E, latent]
  std::vector<float> latent_norm;    // [latent]; empty when latent_moe_use_norm is false
  bool has_shared = false;
  GluWeights shared;                 // [I*n_shared, E] ...
};

struct LayerWeights {
  bool is_mla = false, is_dense = false;
  std::vector<float> input_norm, post_attention_norm;  // [E]
  std::vector<float> f_attn, f_mlp;  // folded AttnRes scoring vectors res_norm ⊙ res_proj [E]
  KdaWeights kda;                    // when !is_mla
  MlaWeights mla;                    // when is_mla
  GluWeights dense;                  // when is_dense
  MoeWeights moe;                    // when !is_dense
};

class ModelWeights {
 public:
  // Binds every non-expert tensor the config implies. The checkpoint has already validated
  // names, shapes and dtypes (checkpoint.h); errors here are I/O errors of pread mode.
  static Result<std::unique_ptr<ModelWeights>> load(const format::Checkpoint& ckpt);

  const format::ModelConfig& config() const { return *config_; }
  const cpu::WeightMatrix& embed() const { return embed_; }      // [V, E]
  const cpu::WeightMatrix& lm_head() const { return lm_head_; }  // [V, E]
  const std::vector<float>& final_norm() const { return final_norm_; }
  const std::vector<float>& f_out() const { return f_out_; }
  const LayerWeights& layer(int64_t l) const { return layers_.at(static_cast<size_t>(l)); }
  // Bytes of matrix data bound (views and copies), for reports.
  uint64_t matrix_bytes() const { return matrix_bytes_; }
  // Bytes this object copied into its own buffers (0 in map mode with aligned tensors).
  uint64_t owned_bytes() const { return owned_bytes_; }

 private:
  friend class WeightBinder;
  const format::ModelConfig* config_ = nullptr;
  cpu::WeightMatrix embed_, lm_head_;
  std::vector<float> final_norm_, f_out_;
  std::vector<LayerWeights> layers_;
  std::vector<std::unique_ptr<uint8_t[]>> owned_;
  uint64_t matrix_bytes_ = 0, owned_bytes_ = 0;
};

// The kernel weight type of a stored float dtype (F32, BF16, F16; U8 is a bug).
cpu::WeightType weight_type_of(DType dtype);

}  // namespace ktier::model
