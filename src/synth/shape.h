#pragma once
// Shapes of synthetic K3-family checkpoints: the three presets, command-line overrides and the
// checks that keep a shape loadable (K3-MODEL.md §2.5).
//
// Presets (all keep K3's structure: layer 0 KDA + dense FFN, latent MoE everywhere else, AttnRes,
// gated NoPE MLA on the layers in `mla_layers`):
//
//   tiny      the conformance shape (conformance/ops/MANIFEST.json "config"): E 128, L 13,
//             KDA 4×16, conv 4, MLA 4 heads, q_lora 64, kv_lora 32, nope 24, rope 8, v 16,
//             8 experts top-2, 2 shared, latent 64, I_d 96, S 3, MLA layers (1-based) 4,8,12,13.
//             Two deviations: the vocabulary (256 bytes + 48 BPE merges + 16 added = 320), and
//             I = 64 instead of 48, because MXFP4 needs every expert input width to be a multiple
//             of 32 (w2 reads I) — the same choice as tools/reference (TINY_FLAT_MXFP4). I is 64
//             for --float-experts too, so the float variant holds exactly the dequantised values
//             of the MXFP4 variant (an exact cross-check of the packed and plain expert paths).
//             `--float-experts --expert-inter 48` gives the conformance shape but for the
//             vocabulary (synth's has the 16 added ids besides the 256 bytes). ~3 MB.
//   demo      a model a 2-core CPU decodes well under a second per token, ~2.8 GB on disk:
//             E 1024, L 16, KDA 8×128, MLA 8 heads (q_lora 384, kv_lora 256, nope 64, rope 32,
//             v 128) on 1-based layers 4,8,12,15,16 (every 4th and the last two, K3's rule),
//             256 experts top-8 (K3's 1/32..1/56 sparsity), latent 512, I 768, 2 shared,
//             I_d 4096, S 4, vocabulary 256 + ~3000 merges + 256 added.
//             88% of the bytes are routed experts (2.4 GB); a token touches the 0.33 GB trunk
//             and 8 × 15 experts (75 MB of MXFP4), ~300 M multiply-adds.
//   k3-slice  K3's full widths (E 7168, KDA 96×128, MLA 96 heads, q_lora 1536, kv_lora 512,
//             nope 128, rope 64, v 128, latent 3584, I 3072, I_d 33792, 2 shared, S 12,
//             V 163840, top-16) with 4 layers: 0 KDA + dense, 1-2 KDA + MoE, 3 MLA + MoE, and
//             32 experts per MoE layer (1.68 GB); ~12.1 GB in total, byte-for-byte K3 tensor
//             sizes, so shard 00002 is the release's shard 00002 minus 864 experts.
//
// Default MLA placement when --layers changes without --mla-layers: 1-based layer l ≥ 2 is MLA
// iff l % 4 == 0 or l ≥ L − 1. This reproduces K3 (4, 8, …, 92, 93), tiny and demo; layer 0 is
// always KDA, so any L ≥ 2 has both kinds.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace ktier::synth {

// How routed experts are stored.
enum class ExpertFormat : uint8_t {
  kMxfp4,  // U8 weight_packed + weight_scale (the release)
  kF32,    // plain F32 `.weight` (the MXFP4 round trip of the same values when widths allow)
  kBF16,   // plain BF16 `.weight` (same values; exact in BF16)
};
const char* expert_format_name(ExpertFormat f);

struct SynthShape {
  std::string preset;
  int64_t hidden = 0;        // E
  int64_t layers = 0;        // L
  int64_t vocab = 0;         // V = embedding / lm_head rows
  int64_t kda_heads = 0;     // H_k
  int64_t kda_head_dim = 0;  // D
  int64_t conv_kernel = 4;   // K
  int64_t mla_heads = 0;     // H_m
  int64_t q_lora = 0;
  int64_t kv_lora = 0;
  int64_t qk_nope = 0;
  int64_t qk_rope = 0;
  int64_t v_head = 0;
  int64_t experts = 0;         // N_e
  int64_t top_k = 0;
  int64_t shared_experts = 0;  // fused shared MLP width = expert_inter × this
  int64_t latent = 0;          // ℓ
  int64_t expert_inter = 0;    // I
  int64_t dense_inter = 0;     // I_d
  int64_t block_size = 0;      // S
  int64_t first_k_dense = 1;
  std::vector<int64_t> mla_layers;  // 0-based, ascending
  // Tokenizer (tokenizer_gen.h): BPE merges to learn over the built-in sample text (fewer if the
  // text runs out) and added/special ids, which occupy the top `added_tokens` ids of V.
  int64_t bpe_merges = 0;
  int64_t added_tokens = 0;

  bool is_mla(int64_t layer) const;
  bool is_dense(int64_t layer) const { return layer < first_k_dense; }
  int64_t moe_layers() const { return layers - std::min(first_k_dense, layers); }
  std::vector<int64_t> full_attn_layers_1based() const;
  std::vector<int64_t> kda_layers_1based() const;
};

// Values from the command line; unset fields keep the preset's value.
struct ShapeOverrides {
  std::optional<int64_t> layers, hidden, vocab, kda_heads, kda_head_dim, mla_heads, q_lora, kv_lora,
      qk_nope, qk_rope, v_head, experts, top_k, latent, expert_inter, dense_inter, shared_experts,
      block_size;
  std::optional<std::vector<int64_t>> mla_layers;  // 0-based
};

// Usage error for an unknown name. The vocabulary size is derived (256 + merges + added) except
// for k3-slice (163840, K3's).
Result<SynthShape> preset_shape(std::string_view name);
std::vector<std::string> preset_names();

std::vector<int64_t> default_mla_layers(int64_t layers);

// Applies the overrides, then validates (below).
Result<SynthShape> apply_overrides(SynthShape shape, const ShapeOverrides& o, ExpertFormat format);

// Usage error (exit 2) naming the flag when a shape cannot be written as a loadable checkpoint:
// sizes ≥ 1 (shared experts ≥ 0) and at most kMaxDim (counts — heads, experts, top-k, shared
// experts, block size — at most format::kMaxCount), 2 ≤ L ≤ format::kMaxLayers, MLA layers in
// range, unique and leaving at least one KDA layer, top-k ≤ experts and ≤ format::kMaxTopK,
// 256 + added tokens ≤ V ≤ 256 + tok::kMaxAddedIdsPastRanks, for MXFP4 the expert input widths (latent, expert-inter) multiples of
// 32, and at most kMaxExpertTensors routed-expert tensors in all.
Status validate_shape(const SynthShape& s, ExpertFormat format);

// A lower bound on the bytes of the shards' tensor data (routed experts, embedding and lm_head:
// what dominates any large shape), as a long double so that no combination of flags overflows.
// Synth compares it with the free space of the output directory before planning anything.
long double min_data_bytes(const SynthShape& s, ExpertFormat format);

inline constexpr int64_t kMaxDim = int64_t{1} << 22;
// Routed-expert tensors one checkpoint may hold: 4x the release's 494,592 (92 MoE layers x 896
// experts x 6). The plan holds every tensor's name and shape in memory (~250 B each), so this is
// what keeps a flag like `--experts 4194304` from planning for minutes and ending in bad_alloc.
inline constexpr int64_t kMaxExpertTensors = int64_t{1} << 21;

}  // namespace ktier::synth
