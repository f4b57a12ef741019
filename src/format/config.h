#pragma once
// The model configuration (config.json) as ktier reads it: K3-MODEL.md §2.
//
// Two shapes are accepted (§2.1): the released *nested* one (model fields in `text_config`, KDA
// fields in `text_config.linear_attn_config`) and the *flat* test shape (every field at the root,
// with the aliases kda_num_heads / kda_head_dim / situ_beta / situ_linear_beta). Lookups follow
// decision D6: in the nested shape a key is read only from the object the spec assigns it to;
// there is never a fallback from one object to another for a model field, and the flat aliases
// are never read in the nested shape. Nothing that feeds arithmetic has a default (D7).
//
// Validation (§2.5 rules 1-8) happens in parse_model_config(): every problem is collected and
// reported together in one Status::usage (exit 2), one line per problem (the first 25; the
// rest counted), each naming the source file, the key and the object it was expected in. Rule 9
// (config vs tensors) is the checkpoint's job (checkpoint.h).
//
// A ModelConfig is an immutable value after parsing; it is safe to share between threads.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"
#include "io/read_file.h"

namespace ktier::format {

// ktier's fixed upper bound on num_experts_per_token (rule 6). Routing keeps the selected
// experts in fixed-size arrays on the stack; 64 is the bound the public C99 engine used and is
// four times K3's 16.
inline constexpr int64_t kMaxTopK = 64;
// Most decoder layers ktier accepts (K3 has 93): per-layer tables are sized by the config before
// the shards are read, so a corrupt count must not allocate by it.
inline constexpr int64_t kMaxLayers = 4096;
// Bounds on the other shape fields, far past any real model (K3: widths up to 163,840 (vocab),
// 896 experts, 96 heads) and small enough that the products the shape checks and budgets form
// (two widths, or a width, a count and a position count) stay inside int64.
inline constexpr int64_t kMaxWidth = int64_t{1} << 24;  // sizes, ranks, head dims, vocabulary
// heads, experts, conv taps, block size (a trace holds an expert id in 16 bits)
inline constexpr int64_t kMaxCount = (int64_t{1} << 16) - 1;

// Which of the two accepted config.json layouts a config came from (§2.1).
enum class ConfigShape { kNested, kFlat };

// `quantization_config` (compressed-tensors). Only MXFP4 with 4-bit float weights in groups of
// 32, symmetric, weight-only with stored per-group scales, is accepted (rule 7), so the fields
// below are what was read and verified, kept for reporting. Packing is decided per tensor by
// name (§5.8), never from targets/ignore.
struct QuantizationConfig {
  std::string quant_method;  // "compressed-tensors"
  std::string format;        // "mxfp4-pack-quantized"
  int64_t num_bits = 0;      // 4
  std::string type;          // "float"
  int64_t group_size = 0;    // 32 (inputs per E8M0 scale byte)
  bool symmetric = false;    // true
  std::string strategy;      // "group" ("" when the config leaves it out)
  std::string found_in;      // "text_config.quantization_config" or "quantization_config"
};

struct ModelConfig {
  ConfigShape shape = ConfigShape::kFlat;
  std::string source;  // file name used in messages (e.g. "config.json")

  // --- trunk -------------------------------------------------------------------------------
  int64_t hidden_size = 0;        // E
  int64_t num_hidden_layers = 0;  // L
  int64_t vocab_size = 0;         // V: rows of embed_tokens and lm_head
  double rms_norm_eps = 0;        // eps of every RMSNorm except the two MLA low-rank norms (D2)

  // --- KDA (nested: text_config.linear_attn_config) -------------------------------------------
  int64_t kda_num_heads = 0;           // H_k (nested `num_heads`, flat `kda_num_heads`)
  int64_t kda_head_dim = 0;            // D   (nested `head_dim`,  flat `kda_head_dim`)
  int64_t short_conv_kernel_size = 0;  // K, conv taps
  double gate_lower_bound = 0;         // g_min (< 0); replaces the decay formula (D8)
  std::vector<int64_t> full_attn_layers;          // 1-based MLA layers, as in the file
  std::optional<std::vector<int64_t>> kda_layers;  // 1-based; cross-checked when present

  // --- MLA --------------------------------------------------------------------------------------
  int64_t num_attention_heads = 0;  // H_m
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;  // an unrotated slot (NoPE); nothing is rotated
  int64_t v_head_dim = 0;
  bool mla_use_output_gate = false;

  // --- MoE --------------------------------------------------------------------------------------
  int64_t num_experts = 0;                // N_e routed experts per MoE layer
  int64_t num_experts_per_token = 0;      // top-k, 1..min(N_e, kMaxTopK)
  int64_t num_shared_experts = 0;         // fused shared MLP width = I * this (0: none)
  int64_t routed_expert_hidden_size = 0;  // latent width l
  int64_t moe_intermediate_size = 0;      // I
  double routed_scaling_factor = 0;
  bool moe_renormalize = false;
  bool latent_moe_use_norm = false;
  int64_t first_k_dense_replace = 0;  // layers l < this use the dense MLP
  int64_t intermediate_size = 0;      // I_d; 0 when no layer is dense (then it is not read)

  // --- AttnRes and activation ---------------------------------------------------------------------
  int64_t attn_res_block_size = 0;  // S
  double situ_beta = 0;             // beta_1 (gate branch cap)
  // beta_2 (up branch cap); nullopt means the file says null explicitly: no cap on the up branch.
  std::optional<double> situ_linear_beta;

  // --- tokens and limits (informational; root first, then text_config) --------------------------
  // config.json's eos_token_id, then generation_config.json's not among them (D3; the latter
  // added by load_model_config only). Empty: none given (generation must get one elsewhere).
  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> pad_token_id;
  std::optional<int64_t> max_position_embeddings;

  // Guard field num_nextn_predict_layers (§2.4): > 0 is logged and ignored; tensors of layers
  // >= L then belong to the MTP head and are skipped by the checkpoint validator.
  int64_t num_nextn_predict_layers = 0;

  std::optional<QuantizationConfig> quantization;

  // --- derived layer map (§2.6); l is 0-based and must be in [0, L) ------------------------------
  bool is_mla(int64_t l) const;       // l+1 in full_attn_layers
  bool is_kda(int64_t l) const { return !is_mla(l); }
  bool is_dense(int64_t l) const;     // l < first_k_dense_replace
  bool is_moe(int64_t l) const { return !is_dense(l); }
  bool is_boundary(int64_t l) const;  // l mod S == 0
  int64_t num_mla_layers() const;
  int64_t num_kda_layers() const { return num_hidden_layers - num_mla_layers(); }
  int64_t num_dense_layers() const { return first_k_dense_replace; }
  int64_t num_moe_layers() const { return num_hidden_layers - first_k_dense_replace; }

  // --- derived widths -------------------------------------------------------------------------
  int64_t kda_width() const { return kda_num_heads * kda_head_dim; }  // 12288 for K3
  int64_t mla_qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t shared_expert_width() const { return moe_intermediate_size * num_shared_experts; }

  // Filled by parse_model_config: mla_by_layer[l] for l in [0, L).
  std::vector<bool> mla_by_layer;
};

// Parses and validates a config held in memory. `source_name` prefixes every message (use the
// file name). Never throws. Errors: Status::usage counting every problem found and listing the
// first 25.
Result<ModelConfig> parse_model_config(const nlohmann::json& root, const std::string& source_name);

// Parses and validates the text of a config.json: invalid JSON is Status::usage naming
// `source_name`, the rest as parse_model_config. Never throws.
Result<ModelConfig> parse_model_config_text(std::string_view text, const std::string& source_name);

// How large a config.json or generation_config.json may be (K3's are a few KB): past it
// Status::usage naming the file, unread.
inline constexpr io::SizeLimit kConfigJsonLimit{uint64_t{16} << 20, &Status::usage};

// Reads and validates config.json, and adds the eos_token_id of a generation_config.json beside
// it (D3). A missing config.json, invalid JSON in either, one over kConfigJsonLimit, or a bad
// eos id there is Status::usage naming the file; an unreadable file (I/O error) is
// Status::runtime. Never throws.
Result<ModelConfig> load_model_config(const std::filesystem::path& config_json);

const char* config_shape_name(ConfigShape shape);  // "nested" / "flat"

}  // namespace ktier::format
