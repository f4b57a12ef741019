#include "model/weights.h"

#include "backend/backend.h"

#include <cmath>
#include <cstring>
#include <string>

#include "common/check.h"
#include "cpu/kernels.h"

namespace ktier::model {

cpu::WeightType weight_type_of(DType dtype) {
  switch (dtype) {
    case DType::kF32: return cpu::WeightType::kF32;
    case DType::kBF16: return cpu::WeightType::kBF16;
    case DType::kF16: return cpu::WeightType::kF16;
    case DType::kU8:
    case DType::kI32:
    case DType::kE8M0: break;
  }
  KTIER_CHECK_MSG(false, "U8, I32 and F8_E8M0 are not float weight dtypes");
  return cpu::WeightType::kF32;
}

namespace {

// Binds tensors found by a TensorLookup. Shapes were validated by Checkpoint::open (and, for
// packs, by TrunkPack::open against the checkpoint), so a wrong element count is a bug.
class Binder {
 public:
  explicit Binder(const TensorLookup& find) : find_(find) {}

  // A [rows, cols] matrix; the stored tensor may have any shape of rows*cols elements.
  Result<cpu::WeightMatrix> matrix(const std::string& name, int64_t rows, int64_t cols) {
    KTIER_ASSIGN_OR_RETURN(const TensorView t, find_(name));
    KTIER_CHECK_MSG(t.numel == rows * cols, name.c_str());
    return cpu::WeightMatrix{weight_type_of(t.dtype), t.data, nullptr, rows, cols};
  }

  // The first n elements of a float tensor, widened to f32 (zeros for a shape-only view).
  // Status::corrupt naming the tensor when one is NaN or infinite: no sound checkpoint holds
  // such a norm gain, bias or gate parameter, and some (the router's bias under top-k, dt_bias
  // under the decay gate) would change tokens without ever reaching the logits check.
  Result<std::vector<float>> vec(const std::string& name, int64_t n) {
    KTIER_ASSIGN_OR_RETURN(const TensorView t, find_(name));
    KTIER_CHECK_MSG(t.numel >= n, name.c_str());
    std::vector<float> out(static_cast<size_t>(n));
    if (t.data) cpu::widen_to_f32(weight_type_of(t.dtype), t.data, n, out.data());
    for (size_t i = 0; i < out.size(); ++i)
      if (!std::isfinite(out[i]))
        return Status::corrupt(name + (t.file.empty() ? "" : " in " + std::string(t.file)) +
                               ": element " + std::to_string(i) + " is " +
                               (std::isnan(out[i]) ? "NaN" : "infinite") +
                               " (the checkpoint's bytes are damaged)");
    return out;
  }

  // The folded AttnRes scoring vector f = res_norm ⊙ res_proj, an f32 product (NUMERICS.md §9).
  Result<std::vector<float>> folded(const std::string& norm, const std::string& proj, int64_t n) {
    KTIER_ASSIGN_OR_RETURN(std::vector<float> f, vec(norm, n));
    KTIER_ASSIGN_OR_RETURN(const std::vector<float> p, vec(proj, n));
    for (size_t i = 0; i < f.size(); ++i) f[i] = f[i] * p[i];
    return f;
  }

  Result<GluWeights> glu(const std::string& prefix, int64_t inter, int64_t width) {
    GluWeights g;
    KTIER_ASSIGN_OR_RETURN(g.gate, matrix(prefix + "gate_proj.weight", inter, width));
    KTIER_ASSIGN_OR_RETURN(g.up, matrix(prefix + "up_proj.weight", inter, width));
    KTIER_ASSIGN_OR_RETURN(g.down, matrix(prefix + "down_proj.weight", width, inter));
    return g;
  }

 private:
  const TensorLookup& find_;
};

Status bind_kda(Binder& b, const format::ModelConfig& c, const std::string& a, KdaWeights& k) {
  const int64_t E = c.hidden_size, H = c.kda_num_heads, D = c.kda_head_dim, C = H * D;
  const int64_t K = c.short_conv_kernel_size;
  KTIER_ASSIGN_OR_RETURN(k.q, b.matrix(a + "q_proj.weight", C, E));
  KTIER_ASSIGN_OR_RETURN(k.k, b.matrix(a + "k_proj.weight", C, E));
  KTIER_ASSIGN_OR_RETURN(k.v, b.matrix(a + "v_proj.weight", C, E));
  KTIER_ASSIGN_OR_RETURN(k.g, b.matrix(a + "g_proj.weight", C, E));
  KTIER_ASSIGN_OR_RETURN(k.b, b.matrix(a + "b_proj.weight", H, E));
  KTIER_ASSIGN_OR_RETURN(k.f_a, b.matrix(a + "f_a_proj.weight", D, E));
  KTIER_ASSIGN_OR_RETURN(k.f_b, b.matrix(a + "f_b_proj.weight", C, D));
  KTIER_ASSIGN_OR_RETURN(k.o, b.matrix(a + "o_proj.weight", E, C));
  KTIER_ASSIGN_OR_RETURN(k.q_conv, b.vec(a + "q_conv1d.weight", C * K));  // [C,1,K] or [C,K]
  KTIER_ASSIGN_OR_RETURN(k.k_conv, b.vec(a + "k_conv1d.weight", C * K));
  KTIER_ASSIGN_OR_RETURN(k.v_conv, b.vec(a + "v_conv1d.weight", C * K));
  KTIER_ASSIGN_OR_RETURN(k.A_log, b.vec(a + "A_log", H));
  KTIER_ASSIGN_OR_RETURN(k.dt_bias, b.vec(a + "dt_bias", C));
  KTIER_ASSIGN_OR_RETURN(k.o_norm, b.vec(a + "o_norm.weight", D));
  return Status::ok();
}

Status bind_mla(Binder& b, const format::ModelConfig& c, const std::string& a, MlaWeights& m) {
  const int64_t E = c.hidden_size, H = c.num_attention_heads;
  const int64_t qk = c.mla_qk_head_dim(), dv = c.v_head_dim, dr = c.qk_rope_head_dim;
  KTIER_ASSIGN_OR_RETURN(m.q_a, b.matrix(a + "q_a_proj.weight", c.q_lora_rank, E));
  KTIER_ASSIGN_OR_RETURN(m.q_b, b.matrix(a + "q_b_proj.weight", H * qk, c.q_lora_rank));
  KTIER_ASSIGN_OR_RETURN(m.kv_a, b.matrix(a + "kv_a_proj_with_mqa.weight", c.kv_lora_rank + dr, E));
  KTIER_ASSIGN_OR_RETURN(m.kv_b,
                         b.matrix(a + "kv_b_proj.weight", H * (c.qk_nope_head_dim + dv), c.kv_lora_rank));
  KTIER_ASSIGN_OR_RETURN(m.o, b.matrix(a + "o_proj.weight", E, H * dv));
  if (c.mla_use_output_gate) {
    KTIER_ASSIGN_OR_RETURN(m.g, b.matrix(a + "g_proj.weight", H * dv, E));
  }
  KTIER_ASSIGN_OR_RETURN(m.q_a_norm, b.vec(a + "q_a_layernorm.weight", c.q_lora_rank));
  KTIER_ASSIGN_OR_RETURN(m.kv_a_norm, b.vec(a + "kv_a_layernorm.weight", c.kv_lora_rank));
  return Status::ok();
}

Status bind_router(Binder& b, const format::ModelConfig& c, int64_t l, MoeWeights& m) {
  const std::string p = format::layer_prefix(l) + "block_sparse_moe.";
  KTIER_ASSIGN_OR_RETURN(m.router, b.matrix(router_tensor_name(l), c.num_experts, c.hidden_size));
  KTIER_ASSIGN_OR_RETURN(m.router_bias, b.vec(p + "gate.e_score_correction_bias", c.num_experts));
  return Status::ok();
}

Status bind_moe(Binder& b, const format::ModelConfig& c, int64_t l, MoeWeights& m) {
  const std::string p = format::layer_prefix(l) + "block_sparse_moe.";
  const int64_t E = c.hidden_size, lat = c.routed_expert_hidden_size;
  KTIER_RETURN_IF_ERROR(bind_router(b, c, l, m));
  KTIER_ASSIGN_OR_RETURN(m.down, b.matrix(p + "routed_expert_down_proj.weight", lat, E));
  KTIER_ASSIGN_OR_RETURN(m.up, b.matrix(p + "routed_expert_up_proj.weight", E, lat));
  if (c.latent_moe_use_norm) {
    KTIER_ASSIGN_OR_RETURN(m.latent_norm, b.vec(p + "routed_expert_norm.weight", lat));
  }
  m.has_shared = c.num_shared_experts > 0;
  if (m.has_shared) {
    KTIER_ASSIGN_OR_RETURN(m.shared, b.glu(p + "shared_experts.", c.shared_expert_width(), E));
  }
  return Status::ok();
}

const std::string kModelPrefix = "language_model.model.";

// The FFN input of layer l: its AttnRes scoring vector and norm.
Status bind_ffn_input(Binder& b, const format::ModelConfig& c, const std::string& P,
                      LayerWeights& lw) {
  const int64_t E = c.hidden_size;
  KTIER_ASSIGN_OR_RETURN(lw.post_attention_norm, b.vec(P + "post_attention_layernorm.weight", E));
  KTIER_ASSIGN_OR_RETURN(lw.f_mlp, b.folded(P + "mlp_res_norm.weight", P + "mlp_res_proj.weight", E));
  return Status::ok();
}

}  // namespace

std::string embedding_tensor_name() { return kModelPrefix + "embed_tokens.weight"; }

std::string router_tensor_name(int64_t l) {
  return format::layer_prefix(l) + "block_sparse_moe.gate.weight";
}

Result<LayerWeights> bind_routing(const format::ModelConfig& c, int64_t l, const TensorLookup& find) {
  KTIER_CHECK(!c.is_dense(l));
  Binder b(find);
  const std::string P = format::layer_prefix(l);
  LayerWeights lw;
  lw.is_mla = c.is_mla(l);
  KTIER_RETURN_IF_ERROR(bind_ffn_input(b, c, P, lw));
  KTIER_RETURN_IF_ERROR(bind_router(b, c, l, lw.moe));
  return lw;
}

Result<LayerWeights> bind_layer(const format::ModelConfig& c, int64_t l, const TensorLookup& find) {
  Binder b(find);
  const int64_t E = c.hidden_size;
  const std::string P = format::layer_prefix(l);
  LayerWeights lw;
  lw.is_mla = c.is_mla(l);
  lw.is_dense = c.is_dense(l);
  KTIER_ASSIGN_OR_RETURN(lw.input_norm, b.vec(P + "input_layernorm.weight", E));
  KTIER_ASSIGN_OR_RETURN(lw.f_attn, b.folded(P + "self_attention_res_norm.weight",
                                             P + "self_attention_res_proj.weight", E));
  KTIER_RETURN_IF_ERROR(bind_ffn_input(b, c, P, lw));
  if (lw.is_mla) {
    KTIER_RETURN_IF_ERROR(bind_mla(b, c, P + "self_attn.", lw.mla));
  } else {
    KTIER_RETURN_IF_ERROR(bind_kda(b, c, P + "self_attn.", lw.kda));
  }
  if (lw.is_dense) {
    KTIER_ASSIGN_OR_RETURN(lw.dense, b.glu(P + "mlp.", c.intermediate_size, E));
  } else {
    KTIER_RETURN_IF_ERROR(bind_moe(b, c, l, lw.moe));
  }
  return lw;
}

Result<HeadWeights> bind_head(const format::ModelConfig& c, const TensorLookup& find) {
  Binder b(find);
  const int64_t E = c.hidden_size;
  HeadWeights h;
  KTIER_ASSIGN_OR_RETURN(h.lm_head, b.matrix("language_model.lm_head.weight", c.vocab_size, E));
  KTIER_ASSIGN_OR_RETURN(h.final_norm, b.vec(kModelPrefix + "norm.weight", E));
  KTIER_ASSIGN_OR_RETURN(h.f_out, b.folded(kModelPrefix + "output_attn_res_norm.weight",
                                           kModelPrefix + "output_attn_res_proj.weight", E));
  return h;
}

Result<std::unique_ptr<ModelWeights>> ModelWeights::load(const format::Checkpoint& ckpt) {
  auto w = std::make_unique<ModelWeights>();
  const format::ModelConfig& c = ckpt.config();
  w->config_ = &c;
  ModelWeights& self = *w;
  // The checkpoint's bytes: the mapping where the address suits the element type, else a copy.
  const TensorLookup find = [&ckpt, &self](const std::string& name) -> Result<TensorView> {
    const auto ref = ckpt.find(name);
    KTIER_CHECK_MSG(ref.has_value(), name.c_str());  // Checkpoint::open verified it exists
    const format::SafetensorsFile& shard = ckpt.shard(ref->shard);
    const format::TensorInfo& info = *ref->info;
    const bool matrix_like = info.shape.size() >= 2;
    if (matrix_like) self.matrix_bytes_ += info.nbytes;
    if (shard.mode() == format::OpenMode::kMap) {
      const uint8_t* p = shard.bytes(info).data();
      if (reinterpret_cast<uintptr_t>(p) % dtype_traits(info.dtype).size == 0)
        return TensorView{info.dtype, info.numel(), p, shard.path().native()};
    }
    auto buf = std::make_unique<uint8_t[]>(info.nbytes ? info.nbytes : 1);
    if (shard.mode() == format::OpenMode::kMap)
      std::memcpy(buf.get(), shard.bytes(info).data(), info.nbytes);
    else
      KTIER_RETURN_IF_ERROR(shard.read(info, buf.get()));
    self.owned_bytes_ += info.nbytes;
    const void* data = buf.get();
    self.owned_.push_back(std::move(buf));
    return TensorView{info.dtype, info.numel(), data, shard.path().native()};
  };
  KTIER_ASSIGN_OR_RETURN(const TensorView embed, find(embedding_tensor_name()));
  w->embed_ = {weight_type_of(embed.dtype), embed.data, nullptr, c.vocab_size, c.hidden_size};
  KTIER_ASSIGN_OR_RETURN(w->head_, bind_head(c, find));
  w->layers_.reserve(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    KTIER_ASSIGN_OR_RETURN(LayerWeights lw, bind_layer(c, l, find));
    w->layers_.push_back(std::move(lw));
  }
  return w;
}

void for_each_tensor(LayerWeights& w, const std::function<void(cpu::WeightMatrix&)>& matrix,
                     const std::function<void(F32Vec&)>& vector) {
  auto m = [&](cpu::WeightMatrix& x) {
    if (x.rows > 0) matrix(x);
  };
  auto v = [&](F32Vec& x) {
    if (!x.empty()) vector(x);
  };
  auto glu = [&](GluWeights& g) {
    m(g.gate), m(g.up), m(g.down);
  };
  v(w.input_norm), v(w.post_attention_norm), v(w.f_attn), v(w.f_mlp);
  KdaWeights& k = w.kda;
  m(k.q), m(k.k), m(k.v), m(k.g), m(k.b), m(k.f_a), m(k.f_b), m(k.o);
  v(k.q_conv), v(k.k_conv), v(k.v_conv), v(k.A_log), v(k.dt_bias), v(k.o_norm);
  MlaWeights& a = w.mla;
  m(a.q_a), m(a.q_b), m(a.kv_a), m(a.kv_b), m(a.o), m(a.g);
  v(a.q_a_norm), v(a.kv_a_norm);
  glu(w.dense);
  MoeWeights& e = w.moe;
  m(e.router), m(e.down), m(e.up);
  v(e.router_bias), v(e.latent_norm);
  glu(e.shared);
}

void for_each_tensor(HeadWeights& w, const std::function<void(cpu::WeightMatrix&)>& matrix,
                     const std::function<void(F32Vec&)>& vector) {
  if (w.lm_head.rows > 0) matrix(w.lm_head);
  if (!w.final_norm.empty()) vector(w.final_norm);
  if (!w.f_out.empty()) vector(w.f_out);
}

TensorLookup shapes_in(const format::Checkpoint& ckpt) {
  return [&ckpt](const std::string& name) -> Result<TensorView> {
    const std::optional<format::TensorRef> ref = ckpt.find(name);
    KTIER_CHECK_MSG(ref.has_value(), name.c_str());  // Checkpoint::open validated the names
    return TensorView{ref->info->dtype, ref->info->numel(), nullptr, {}};
  };
}

uint64_t matrix_bytes(const cpu::WeightMatrix& m) {
  return backend::weight_data_bytes(m) + backend::weight_scale_bytes(m);
}

Status ModelWeights::embed(std::span<const int32_t> ids, float* out) {
  const int64_t E = embed_.cols;
  const size_t row_bytes = static_cast<size_t>(cpu::weight_row_data_bytes(embed_.type, E));
  for (size_t t = 0; t < ids.size(); ++t)
    cpu::widen_to_f32(embed_.type, static_cast<const uint8_t*>(embed_.data) + ids[t] * row_bytes, E,
                      out + t * E);
  return Status::ok();
}

}  // namespace ktier::model
