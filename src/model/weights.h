#pragma once
// The non-expert weights of a K3 checkpoint, bound as cpu::WeightMatrix views (K3-MODEL §4, §5),
// and the TrunkSource interface the forward pass reads them through.
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
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "cpu/types.h"
#include "format/checkpoint.h"

namespace ktier::model {

// A small f32 vector of the weights (norm gains, conv taps, biases, folded AttnRes vectors):
// owned host floats as bound from the checkpoint, or a view of floats elsewhere (a device
// mirror, DeviceTrunk). Copies share the owned floats, so a copied LayerWeights stays valid.
class F32Vec {
 public:
  F32Vec() = default;
  F32Vec(std::vector<float> v)  // NOLINT(implicit): the binders assign widened vectors
      : owned_(std::make_shared<const std::vector<float>>(std::move(v))),
        data_(owned_->data()),
        size_(owned_->size()) {}
  static F32Vec view(const float* data, size_t size) {
    F32Vec v;
    v.data_ = data;
    v.size_ = size;
    return v;
  }
  const float* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  std::shared_ptr<const std::vector<float>> owned_;
  const float* data_ = nullptr;
  size_t size_ = 0;
};

// SiTU-GLU MLP: down(situ(gate x, up x)). The dense layer-0 MLP and the fused shared expert.
struct GluWeights {
  cpu::WeightMatrix gate, up, down;  // [I, E], [I, E], [E, I]
};

struct KdaWeights {  // §6.3; C = H*D
  cpu::WeightMatrix q, k, v, g;      // [C, E]
  cpu::WeightMatrix b;               // [H, E]
  cpu::WeightMatrix f_a, f_b;        // [D, E], [C, D]
  cpu::WeightMatrix o;               // [E, C]
  F32Vec q_conv, k_conv, v_conv;     // [C, K] taps, tap K-1 = current input
  F32Vec A_log;                      // [H] (the first H elements of the stored tensor, D1)
  F32Vec dt_bias;                    // [C]
  F32Vec o_norm;                     // [D]
};

struct MlaWeights {  // §6.4
  cpu::WeightMatrix q_a, q_b;   // [q_lora, E], [H*(nope+rope), q_lora]
  cpu::WeightMatrix kv_a;       // [kv_lora+rope, E]
  cpu::WeightMatrix kv_b;       // [H*(nope+v), kv_lora]
  cpu::WeightMatrix o;          // [E, H*v]
  cpu::WeightMatrix g;          // [H*v, E]; data == nullptr when mla_use_output_gate is false
  F32Vec q_a_norm, kv_a_norm;
};

struct MoeWeights {  // §6.6: the trunk of a MoE layer (the routed experts come from an ExpertSource)
  cpu::WeightMatrix router;          // [N_e, E]
  F32Vec router_bias;                // [N_e] e_score_correction_bias
  cpu::WeightMatrix down, up;        // [latent, E], [E, latent]
  F32Vec latent_norm;                // [latent]; empty when latent_moe_use_norm is false
  bool has_shared = false;
  GluWeights shared;                 // [I*n_shared, E] ...
};

struct LayerWeights {
  bool is_mla = false, is_dense = false;
  F32Vec input_norm, post_attention_norm;  // [E]
  F32Vec f_attn, f_mlp;              // folded AttnRes scoring vectors res_norm ⊙ res_proj [E]
  KdaWeights kda;                    // when !is_mla
  MlaWeights mla;                    // when is_mla
  GluWeights dense;                  // when is_dense
  MoeWeights moe;                    // when !is_dense
};

struct HeadWeights {  // §6.7
  cpu::WeightMatrix lm_head;           // [V, E]
  F32Vec final_norm;                   // [E]
  F32Vec f_out;                        // folded output AttnRes scoring vector [E]
};

// Calls matrix(m) for every bound matrix (rows > 0; its data is null when bound from shapes
// alone) and vector(v) for every non-empty vector of the layer, in one fixed order (device
// mirrors copy them in that order).
void for_each_tensor(LayerWeights& w, const std::function<void(cpu::WeightMatrix&)>& matrix,
                     const std::function<void(F32Vec&)>& vector);
void for_each_tensor(HeadWeights& w, const std::function<void(cpu::WeightMatrix&)>& matrix,
                     const std::function<void(F32Vec&)>& vector);
// Bytes of one matrix's data (MXFP4: packed bytes + scales).
uint64_t matrix_bytes(const cpu::WeightMatrix& m);

// Where the binders find a stored tensor: its dtype, element count and bytes (aligned to the
// element size). The bytes must outlive the weights bound from them. Null data: shapes only —
// the binders read nothing, a matrix is bound with null data and a vector as zeros of its size
// (to size weights before, or without, reading them).
struct TensorView {
  DType dtype = DType::kF32;
  int64_t numel = 0;
  const void* data = nullptr;
  // The file the bytes came from (a shard or trunk.pack), for messages; empty where unknown.
  // Must outlive the bind (a path the checkpoint or pack holds).
  std::string_view file;
};
using TensorLookup = std::function<Result<TensorView>(const std::string& name)>;
// Shapes only, from the checkpoint's index (reads nothing): for sizing weights before they are
// read. `ckpt` must outlive the lookup.
TensorLookup shapes_in(const format::Checkpoint& ckpt);

// Bind layer l's (or the head's) weights from `find`: matrices become views of the found bytes,
// small vectors are widened to f32. The names and shapes are K3-MODEL §4's; a name `find` cannot
// produce is its error.
Result<LayerWeights> bind_layer(const format::ModelConfig& c, int64_t l, const TensorLookup& find);
Result<HeadWeights> bind_head(const format::ModelConfig& c, const TensorLookup& find);
// Only what router lookahead reads of MoE layer l (model.h): post_attention_norm, f_mlp,
// moe.router and moe.router_bias; every other field is left empty. REQUIRES: l is a MoE layer.
Result<LayerWeights> bind_routing(const format::ModelConfig& c, int64_t l, const TensorLookup& find);
// The stored name of MoE layer l's router matrix.
std::string router_tensor_name(int64_t l);
// The token embedding's name (K3-MODEL §4).
std::string embedding_tensor_name();

// What the forward pass reads the non-expert weights through. Model::forward acquires layers in
// order 0..L-1 and releases each when its FFN is done; a streaming source uses the order to read
// ahead. Not thread-safe: one forward at a time.
class TrunkSource {
 public:
  virtual ~TrunkSource() = default;
  virtual const format::ModelConfig& config() const = 0;
  // Layer l's weights, valid until release_layer(l). Errors: Status::runtime (I/O),
  // Status::corrupt (a checksum mismatch); no byte of a failed read reaches a kernel.
  virtual Result<const LayerWeights*> acquire_layer(int64_t l) = 0;
  // Never throws: Model::forward calls it from a destructor, also while an exception unwinds.
  virtual void release_layer(int64_t l) = 0;
  virtual const HeadWeights& head() const = 0;
  // Embedding rows of `ids` (each in [0, V)), widened to f32: out [ids.size(), E].
  virtual Status embed(std::span<const int32_t> ids, float* out) = 0;
};

// Every non-expert weight resident: views into the checkpoint's mapping (zero copy) or, in
// OpenMode::kPread and for tensors whose address does not suit their element type, owned copies.
class ModelWeights final : public TrunkSource {
 public:
  // Binds every non-expert tensor the config implies. The checkpoint has already validated
  // names, shapes and dtypes (checkpoint.h); errors here are I/O errors of pread mode.
  static Result<std::unique_ptr<ModelWeights>> load(const format::Checkpoint& ckpt);

  const format::ModelConfig& config() const override { return *config_; }
  Result<const LayerWeights*> acquire_layer(int64_t l) override { return &layer(l); }
  void release_layer(int64_t) override {}
  const HeadWeights& head() const override { return head_; }
  Status embed(std::span<const int32_t> ids, float* out) override;

  const cpu::WeightMatrix& embed_matrix() const { return embed_; }  // [V, E]
  const LayerWeights& layer(int64_t l) const { return layers_.at(static_cast<size_t>(l)); }
  // Bytes of matrix data bound (views and copies), for reports.
  uint64_t matrix_bytes() const { return matrix_bytes_; }
  // Bytes this object copied into its own buffers (0 in map mode with aligned tensors).
  uint64_t owned_bytes() const { return owned_bytes_; }

 private:
  const format::ModelConfig* config_ = nullptr;
  cpu::WeightMatrix embed_;
  HeadWeights head_;
  std::vector<LayerWeights> layers_;
  std::vector<std::unique_ptr<uint8_t[]>> owned_;
  uint64_t matrix_bytes_ = 0, owned_bytes_ = 0;
};

// The kernel weight type of a stored float dtype (F32, BF16, F16; U8 is a bug).
cpu::WeightType weight_type_of(DType dtype);

}  // namespace ktier::model
