#include "synth/shape.h"

#include <algorithm>
#include <set>

#include "format/config.h"
#include "tokenizer/tokenizer.h"

namespace ktier::synth {
namespace {

// Vocabulary rule shared by the presets without a fixed V: 256 byte tokens, the merges, then the
// added ids (tokenizer_gen.h).
int64_t derived_vocab(int64_t merges, int64_t added) { return 256 + merges + added; }

SynthShape tiny_shape() {
  SynthShape s;
  s.preset = "tiny";
  s.hidden = 128;
  s.layers = 13;
  s.kda_heads = 4;
  s.kda_head_dim = 16;
  s.conv_kernel = 4;
  s.mla_heads = 4;
  s.q_lora = 64;
  s.kv_lora = 32;
  s.qk_nope = 24;
  s.qk_rope = 8;
  s.v_head = 16;
  s.experts = 8;
  s.top_k = 2;
  s.shared_experts = 2;
  s.latent = 64;
  s.expert_inter = 64;  // conformance has 48; see shape.h
  s.dense_inter = 96;
  s.block_size = 3;
  s.mla_layers = {3, 7, 11, 12};
  s.bpe_merges = 48;
  s.added_tokens = 16;
  s.vocab = derived_vocab(s.bpe_merges, s.added_tokens);
  return s;
}

SynthShape demo_shape() {
  SynthShape s;
  s.preset = "demo";
  s.hidden = 1024;
  s.layers = 16;
  s.kda_heads = 8;
  s.kda_head_dim = 128;
  s.conv_kernel = 4;
  s.mla_heads = 8;
  s.q_lora = 384;
  s.kv_lora = 256;
  s.qk_nope = 64;
  s.qk_rope = 32;
  s.v_head = 128;
  s.experts = 256;
  s.top_k = 8;
  s.shared_experts = 2;
  s.latent = 512;
  s.expert_inter = 768;
  s.dense_inter = 4096;
  s.block_size = 4;
  s.mla_layers = default_mla_layers(s.layers);
  s.bpe_merges = 3000;
  s.added_tokens = 256;
  s.vocab = derived_vocab(s.bpe_merges, s.added_tokens);
  return s;
}

SynthShape k3_slice_shape() {
  SynthShape s;
  s.preset = "k3-slice";
  s.hidden = 7168;
  s.layers = 4;
  s.kda_heads = 96;
  s.kda_head_dim = 128;
  s.conv_kernel = 4;
  s.mla_heads = 96;
  s.q_lora = 1536;
  s.kv_lora = 512;
  s.qk_nope = 128;
  s.qk_rope = 64;
  s.v_head = 128;
  s.experts = 32;
  s.top_k = 16;
  s.shared_experts = 2;
  s.latent = 3584;
  s.expert_inter = 3072;
  s.dense_inter = 33792;
  s.block_size = 12;
  s.mla_layers = {3};
  s.bpe_merges = 3000;
  s.added_tokens = 256;
  s.vocab = 163840;  // K3's; ids between the ranks and 163584 are unused (tokenizer_gen.h)
  return s;
}

Status check_range(const char* flag, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi)
    return Status::usage(std::string(flag) + " must be between " + std::to_string(lo) + " and " +
                         std::to_string(hi) + " (got " + std::to_string(v) + ")");
  return Status::ok();
}

}  // namespace

const char* expert_format_name(ExpertFormat f) {
  switch (f) {
    case ExpertFormat::kMxfp4: return "mxfp4";
    case ExpertFormat::kF32: return "f32";
    case ExpertFormat::kBF16: return "bf16";
  }
  return "?";
}

bool SynthShape::is_mla(int64_t layer) const {
  return std::binary_search(mla_layers.begin(), mla_layers.end(), layer);
}

std::vector<int64_t> SynthShape::full_attn_layers_1based() const {
  std::vector<int64_t> out;
  for (int64_t l : mla_layers) out.push_back(l + 1);
  return out;
}

std::vector<int64_t> SynthShape::kda_layers_1based() const {
  std::vector<int64_t> out;
  for (int64_t l = 0; l < layers; ++l)
    if (!is_mla(l)) out.push_back(l + 1);
  return out;
}

std::vector<std::string> preset_names() { return {"tiny", "demo", "k3-slice"}; }

Result<SynthShape> preset_shape(std::string_view name) {
  if (name == "tiny") return tiny_shape();
  if (name == "demo") return demo_shape();
  if (name == "k3-slice") return k3_slice_shape();
  return Status::usage("unknown preset '" + std::string(name) + "' (choose tiny, demo or k3-slice)");
}

std::vector<int64_t> default_mla_layers(int64_t layers) {
  std::vector<int64_t> out;
  for (int64_t l1 = 2; l1 <= layers; ++l1)  // 1-based; layer 1 (0-based 0) stays KDA
    if (l1 % 4 == 0 || l1 >= layers - 1) out.push_back(l1 - 1);
  return out;
}

Result<SynthShape> apply_overrides(SynthShape s, const ShapeOverrides& o, ExpertFormat format) {
  auto set = [](int64_t& field, const std::optional<int64_t>& v) {
    if (v) field = *v;
  };
  set(s.layers, o.layers);
  set(s.hidden, o.hidden);
  set(s.kda_heads, o.kda_heads);
  set(s.kda_head_dim, o.kda_head_dim);
  set(s.mla_heads, o.mla_heads);
  set(s.q_lora, o.q_lora);
  set(s.kv_lora, o.kv_lora);
  set(s.qk_nope, o.qk_nope);
  set(s.qk_rope, o.qk_rope);
  set(s.v_head, o.v_head);
  set(s.experts, o.experts);
  set(s.top_k, o.top_k);
  set(s.latent, o.latent);
  set(s.expert_inter, o.expert_inter);
  set(s.dense_inter, o.dense_inter);
  set(s.shared_experts, o.shared_experts);
  set(s.block_size, o.block_size);
  set(s.vocab, o.vocab);
  if (o.mla_layers) {
    s.mla_layers = *o.mla_layers;
    std::sort(s.mla_layers.begin(), s.mla_layers.end());
  } else if (o.layers && s.layers <= format::kMaxLayers) {  // else validate_shape refuses it
    s.mla_layers = default_mla_layers(s.layers);
  }
  KTIER_RETURN_IF_ERROR(validate_shape(s, format));
  return s;
}

Status validate_shape(const SynthShape& s, ExpertFormat format) {
  struct Dim {
    const char* flag;
    int64_t value;
    int64_t min, max;
  };
  // Counts within the engine's bound on them (format::kMaxCount), sizes within kMaxDim.
  constexpr int64_t kCount = format::kMaxCount;
  const Dim dims[] = {
      {"--hidden", s.hidden, 1, kMaxDim},          {"--layers", s.layers, 2, kMaxDim},
      {"--kda-heads", s.kda_heads, 1, kCount},     {"--kda-head-dim", s.kda_head_dim, 1, kMaxDim},
      {"--mla-heads", s.mla_heads, 1, kCount},     {"--q-lora", s.q_lora, 1, kMaxDim},
      {"--kv-lora", s.kv_lora, 1, kMaxDim},        {"--qk-nope", s.qk_nope, 1, kMaxDim},
      {"--qk-rope", s.qk_rope, 1, kMaxDim},        {"--v-head", s.v_head, 1, kMaxDim},
      {"--experts", s.experts, 1, kCount},         {"--top-k", s.top_k, 1, kCount},
      {"--latent", s.latent, 1, kMaxDim},          {"--expert-inter", s.expert_inter, 1, kMaxDim},
      {"--dense-inter", s.dense_inter, 1, kMaxDim},
      {"--shared-experts", s.shared_experts, 0, kCount},
      {"--block-size", s.block_size, 1, kCount},
  };
  static_assert(kMaxDim <= format::kMaxWidth, "synth writes only widths the engine reads");
  for (const Dim& d : dims) KTIER_RETURN_IF_ERROR(check_range(d.flag, d.value, d.min, d.max));
  // The engine's limits (config.h): a checkpoint it would refuse is not worth writing.
  if (s.layers > format::kMaxLayers)
    return Status::usage("--layers must be at most " + std::to_string(format::kMaxLayers) +
                         ", the most ktier loads (got " + std::to_string(s.layers) + ")");
  if (s.top_k > s.experts)
    return Status::usage("--top-k (" + std::to_string(s.top_k) + ") must not exceed --experts (" +
                         std::to_string(s.experts) + ")");
  if (s.top_k > format::kMaxTopK)
    return Status::usage("--top-k must be at most " + std::to_string(format::kMaxTopK) +
                         ", the most ktier routes (got " + std::to_string(s.top_k) + ")");
  const int64_t moe_layers = s.moe_layers();
  const int64_t per_expert = format == ExpertFormat::kMxfp4 ? 6 : 3;
  // experts ≤ 2^22 and layers ≤ 4096: the product fits easily in int64.
  if (moe_layers * s.experts * per_expert > kMaxExpertTensors)
    return Status::usage("--experts " + std::to_string(s.experts) + " over " +
                         std::to_string(moe_layers) + " MoE layers makes " +
                         std::to_string(moe_layers * s.experts * per_expert) +
                         " expert tensors; synth writes at most " +
                         std::to_string(kMaxExpertTensors) + " (K3 has 494592)");
  // The added ids take the top of V, the ranks (256 bytes + merges) the bottom: the tokenizer
  // reads added ids up to 2^20 past the ranks, so V up to 256 + 2^20 loads whatever the merges.
  const int64_t min_vocab = 256 + s.added_tokens, max_vocab = 256 + tok::kMaxAddedIdsPastRanks;
  if (s.vocab < min_vocab || s.vocab > max_vocab)
    return Status::usage("--vocab must be at least " + std::to_string(min_vocab) +
                         " (256 byte tokens + " + std::to_string(s.added_tokens) +
                         " added ids) and at most " + std::to_string(max_vocab) +
                         " (256 + the 2^20 added ids the tokenizer reads past its ranks; got " +
                         std::to_string(s.vocab) + ")");
  std::set<int64_t> seen;
  for (int64_t l : s.mla_layers) {
    if (l < 0 || l >= s.layers)
      return Status::usage("--mla-layers: layer " + std::to_string(l) + " is outside 0.." +
                           std::to_string(s.layers - 1) + " (the list is 0-based)");
    if (!seen.insert(l).second)
      return Status::usage("--mla-layers: layer " + std::to_string(l) + " is listed twice");
  }
  if (s.mla_layers.empty())
    return Status::usage("--mla-layers: at least one MLA layer is required (full_attn_layers "
                         "must not be empty)");
  if (static_cast<int64_t>(s.mla_layers.size()) >= s.layers)
    return Status::usage("--mla-layers: at least one layer must stay KDA");
  if (format == ExpertFormat::kMxfp4) {
    if (s.latent % 32 != 0)
      return Status::usage("--latent (" + std::to_string(s.latent) +
                           ") must be a multiple of 32 for MXFP4 experts (w1/w3 read it); "
                           "use --float-experts for other widths");
    if (s.expert_inter % 32 != 0)
      return Status::usage("--expert-inter (" + std::to_string(s.expert_inter) +
                           ") must be a multiple of 32 for MXFP4 experts (w2 reads it); "
                           "use --float-experts for other widths");
  }
  return Status::ok();
}

long double min_data_bytes(const SynthShape& s, ExpertFormat format) {
  using LD = long double;
  const LD moe_layers = static_cast<LD>(s.moe_layers());
  const LD weights = 3.0L * static_cast<LD>(s.expert_inter) * static_cast<LD>(s.latent);
  LD per_weight = 0;
  switch (format) {
    case ExpertFormat::kMxfp4: per_weight = 0.5L + 1.0L / 32; break;  // packed nibble + scale
    case ExpertFormat::kF32: per_weight = 4; break;
    case ExpertFormat::kBF16: per_weight = 2; break;
  }
  const LD experts = moe_layers * static_cast<LD>(s.experts) * weights * per_weight;
  const LD embedding_and_head = 2.0L * 2 * static_cast<LD>(s.vocab) * static_cast<LD>(s.hidden);
  return experts + embedding_and_head;
}

}  // namespace ktier::synth
