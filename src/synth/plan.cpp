#include "synth/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "synth/rng.h"

namespace ktier::synth {
namespace {

// Salt for the per-matrix scale draw: a different stream from the elements' draws.
constexpr uint64_t kScaleSalt = 0x5ca1ab1e0ddba11ull;

constexpr double kExpertGain = 1.7;
constexpr double kExpertSpread = 0.5;  // u ~ U(−½, ½): experts are more uniform than the trunk
constexpr float kNormSpread = 0.05f;
constexpr float kResProjStd = 0.02f;
constexpr float kRouterBiasStd = 0.02f;
constexpr float kDtBiasStd = 0.1f;
constexpr float kConvStd = 0.3f;
constexpr float kALogLo = -0.4f;
constexpr float kALogHi = 1.2f;

class TensorList {
 public:
  TensorList(uint64_t seed, TensorGroup group) : seed_(seed), group_(group) {}

  // A BF16 matrix [rows, cols] of fan-in `cols`.
  void matrix(const std::string& name, int64_t rows, int64_t cols, double gain = 1.0) {
    add(name, DType::kBF16, {rows, cols}, matrix_values(seed_, name, cols, gain, 1.0));
  }
  // A vector of constant mean and gaussian spread.
  void vec(const std::string& name, DType dtype, std::vector<int64_t> shape, float mean, float std) {
    ValueSpec v;
    v.key = stream_key(seed_, name);
    v.mean = mean;
    v.stddev = std;
    add(name, dtype, std::move(shape), v);
  }
  void norm(const std::string& name, int64_t n, DType dtype = DType::kBF16) {
    vec(name, dtype, {n}, 1.0f, kNormSpread);
  }
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const ValueSpec& v) {
    PlannedTensor t;
    t.decl = {name, dtype, std::move(shape)};
    t.values = v;
    t.encoding = dtype == DType::kF32 ? Encoding::kF32 : Encoding::kBF16;
    t.group = group_;
    t.rows = t.decl.shape.size() == 2 ? t.decl.shape[0] : 1;
    t.cols = static_cast<int64_t>(t.decl.numel()) / std::max<int64_t>(t.rows, 1);
    list_.push_back(std::move(t));
  }

  // Release order of non-expert tensors: dtype size descending, then name.
  std::vector<PlannedTensor> take_sorted() {
    std::stable_sort(list_.begin(), list_.end(), [](const PlannedTensor& a, const PlannedTensor& b) {
      const uint32_t sa = dtype_size(a.decl.dtype), sb = dtype_size(b.decl.dtype);
      if (sa != sb) return sa > sb;
      return a.decl.name < b.decl.name;
    });
    return std::move(list_);
  }

 private:
  uint64_t seed_;
  TensorGroup group_;
  std::vector<PlannedTensor> list_;
};

void add_kda(TensorList& t, const SynthShape& s, const std::string& a) {
  const int64_t E = s.hidden, H = s.kda_heads, D = s.kda_head_dim, C = H * D, K = s.conv_kernel;
  t.matrix(a + "q_proj.weight", C, E);
  t.matrix(a + "k_proj.weight", C, E);
  t.matrix(a + "v_proj.weight", C, E);
  for (const char* n : {"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"})
    t.vec(a + n, DType::kF32, {C, 1, K}, 0.0f, kConvStd);
  t.matrix(a + "f_a_proj.weight", D, E);
  t.matrix(a + "f_b_proj.weight", C, D);
  ValueSpec alog;
  alog.kind = ValueKind::kALogRamp;
  alog.ramp_count = static_cast<uint32_t>(H);
  alog.ramp_lo = kALogLo;
  alog.ramp_hi = kALogHi;
  t.add(a + "A_log", DType::kF32, {std::max(D, H)}, alog);
  t.vec(a + "dt_bias", DType::kF32, {C}, 0.0f, kDtBiasStd);
  t.matrix(a + "b_proj.weight", H, E);
  t.matrix(a + "g_proj.weight", C, E);
  t.norm(a + "o_norm.weight", D, DType::kF32);
  t.matrix(a + "o_proj.weight", E, C);
}

void add_mla(TensorList& t, const SynthShape& s, const std::string& a) {
  const int64_t E = s.hidden, Hm = s.mla_heads;
  t.matrix(a + "q_a_proj.weight", s.q_lora, E);
  t.norm(a + "q_a_layernorm.weight", s.q_lora);
  t.matrix(a + "q_b_proj.weight", Hm * (s.qk_nope + s.qk_rope), s.q_lora);
  t.matrix(a + "kv_a_proj_with_mqa.weight", s.kv_lora + s.qk_rope, E);
  t.norm(a + "kv_a_layernorm.weight", s.kv_lora);
  t.matrix(a + "kv_b_proj.weight", Hm * (s.qk_nope + s.v_head), s.kv_lora);
  t.matrix(a + "g_proj.weight", Hm * s.v_head, E);
  t.matrix(a + "o_proj.weight", E, Hm * s.v_head);
}

void add_moe_trunk(TensorList& t, const SynthShape& s, const std::string& b) {
  const int64_t E = s.hidden, Is = s.expert_inter * s.shared_experts;
  t.matrix(b + "gate.weight", s.experts, E);
  t.vec(b + "gate.e_score_correction_bias", DType::kF32, {s.experts}, 0.0f, kRouterBiasStd);
  t.matrix(b + "routed_expert_down_proj.weight", s.latent, E);
  t.norm(b + "routed_expert_norm.weight", s.latent);
  t.matrix(b + "routed_expert_up_proj.weight", E, s.latent);
  if (Is == 0) return;  // num_shared_experts 0: the config implies no shared-expert tensors
  t.matrix(b + "shared_experts.gate_proj.weight", Is, E);
  t.matrix(b + "shared_experts.up_proj.weight", Is, E);
  t.matrix(b + "shared_experts.down_proj.weight", E, Is);
}

void add_experts(std::vector<PlannedTensor>& out, const SynthShape& s, ExpertFormat format,
                 uint64_t seed, const std::string& b) {
  std::vector<int64_t> order(static_cast<size_t>(s.experts));
  for (int64_t e = 0; e < s.experts; ++e) order[static_cast<size_t>(e)] = e;
  // Lexicographic order of the names = order of the decimal strings ('.' sorts before digits).
  std::sort(order.begin(), order.end(),
            [](int64_t x, int64_t y) { return std::to_string(x) < std::to_string(y); });
  struct Matrix {
    const char* w;
    int64_t rows, cols;
  };
  const Matrix mats[] = {{"w1", s.expert_inter, s.latent},   // gate [I, ℓ]
                         {"w2", s.latent, s.expert_inter},   // down [ℓ, I]
                         {"w3", s.expert_inter, s.latent}};  // up   [I, ℓ]
  for (int64_t e : order) {
    const std::string prefix = b + "experts." + std::to_string(e) + ".";
    for (const Matrix& m : mats) {
      const std::string logical = prefix + m.w;
      PlannedTensor t;
      t.values = matrix_values(seed, logical, m.cols, kExpertGain, kExpertSpread);
      t.group = TensorGroup::kExpert;
      t.rows = m.rows;
      t.cols = m.cols;
      if (format == ExpertFormat::kMxfp4) {
        t.decl = {logical + ".weight_packed", DType::kU8, {m.rows, m.cols / 2}};
        t.encoding = Encoding::kMxfp4Packed;
        out.push_back(t);
        t.decl = {logical + ".weight_scale", DType::kU8, {m.rows, m.cols / 32}};
        t.encoding = Encoding::kMxfp4Scale;
        out.push_back(t);
      } else {
        const bool f32 = format == ExpertFormat::kF32;
        const bool quantisable = m.cols % 32 == 0;
        t.decl = {logical + ".weight", f32 ? DType::kF32 : DType::kBF16, {m.rows, m.cols}};
        t.encoding = quantisable ? (f32 ? Encoding::kDequantF32 : Encoding::kDequantBF16)
                                 : (f32 ? Encoding::kF32 : Encoding::kBF16);
        out.push_back(t);
      }
    }
  }
}

}  // namespace

ValueSpec matrix_values(uint64_t seed, const std::string& name, int64_t fan_in, double gain,
                        double log2_spread) {
  ValueSpec v;
  v.key = stream_key(seed, name);
  const double u = 2.0 * unit_double(mix64(v.key ^ kScaleSalt)) - 1.0;
  v.stddev = static_cast<float>(gain * std::exp2(u * log2_spread) /
                                std::sqrt(static_cast<double>(std::max<int64_t>(fan_in, 1))));
  return v;
}

std::string shard_file_name(int64_t k, int64_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05lld-of-%06lld.safetensors", static_cast<long long>(k),
                static_cast<long long>(n));
  return buf;
}

uint64_t Plan::data_bytes() const {
  uint64_t total = 0;
  for (const auto& shard : shards)
    for (const auto& t : shard.tensors) total += t.decl.nbytes();
  return total;
}

Plan build_plan(const SynthShape& s, ExpertFormat format, uint64_t seed) {
  Plan plan;
  const int64_t n_shards = s.layers + 1;
  const int64_t E = s.hidden;
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "language_model.model.layers." + std::to_string(l) + ".";
    TensorList trunk(seed, TensorGroup::kTrunk);
    trunk.norm(p + "input_layernorm.weight", E);
    trunk.norm(p + "post_attention_layernorm.weight", E);
    for (const char* r : {"self_attention_res", "mlp_res"}) {
      trunk.norm(p + r + "_norm.weight", E);
      trunk.vec(p + r + "_proj.weight", DType::kBF16, {1, E}, 0.0f, kResProjStd);
    }
    if (s.is_mla(l))
      add_mla(trunk, s, p + "self_attn.");
    else
      add_kda(trunk, s, p + "self_attn.");
    if (s.is_dense(l)) {
      trunk.matrix(p + "mlp.gate_proj.weight", s.dense_inter, E);
      trunk.matrix(p + "mlp.up_proj.weight", s.dense_inter, E);
      trunk.matrix(p + "mlp.down_proj.weight", E, s.dense_inter);
    } else {
      add_moe_trunk(trunk, s, p + "block_sparse_moe.");
    }
    PlannedShard shard;
    shard.file_name = shard_file_name(l + 1, n_shards);
    shard.tensors = trunk.take_sorted();
    if (!s.is_dense(l)) add_experts(shard.tensors, s, format, seed, p + "block_sparse_moe.");
    plan.shards.push_back(std::move(shard));
  }
  TensorList model(seed, TensorGroup::kModel);
  const std::string m = "language_model.model.";
  model.matrix(m + "embed_tokens.weight", s.vocab, E);  // rows of width E, σ ~ 1/sqrt(E)
  model.norm(m + "norm.weight", E);
  model.norm(m + "output_attn_res_norm.weight", E);
  model.vec(m + "output_attn_res_proj.weight", DType::kBF16, {1, E}, 0.0f, kResProjStd);
  model.matrix("language_model.lm_head.weight", s.vocab, E);
  PlannedShard last;
  last.file_name = shard_file_name(n_shards, n_shards);
  last.tensors = model.take_sorted();
  plan.shards.push_back(std::move(last));
  return plan;
}

}  // namespace ktier::synth
