#pragma once
// Test helpers: a raw safetensors byte builder that can also write malformed files, and a small
// synthetic checkpoint in the released nested layout (K3-MODEL §3-§5) that tests mutate before
// writing. Independent of src/format (it never calls the reader), so the reader is checked against
// bytes it did not produce.

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/temp_dir.h"

namespace ktier::test {

using ojson = nlohmann::ordered_json;

struct StTensor {
  std::string name;
  std::string dtype;  // written verbatim, so unknown dtypes can be produced
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
  // Written instead of the computed [begin, end) when set (malformed files).
  std::optional<std::pair<uint64_t, uint64_t>> offsets;
  // > 0: the tensor is this many zero bytes that are never materialised (`data` stays empty);
  // write_st_file() leaves a hole, so K3-sized shards cost only their headers on disk.
  uint64_t hole_bytes = 0;

  uint64_t size() const { return hole_bytes > 0 ? hole_bytes : data.size(); }
};

inline size_t test_dtype_size(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  return 1;
}

// Deterministic filler bytes (xorshift); `seed` makes tensors distinguishable.
inline std::vector<uint8_t> filler_bytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> out(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x1234567;
  for (auto& b : out) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<uint8_t>(x >> 24);
  }
  return out;
}

inline std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

inline int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

// A tensor of `shape` whose bytes are filler (size from dtype and shape).
inline StTensor filled(std::string name, std::string dtype, std::vector<int64_t> shape,
                       uint64_t seed) {
  const size_t n = static_cast<size_t>(numel_of(shape)) * test_dtype_size(dtype);
  return StTensor{std::move(name), std::move(dtype), std::move(shape), filler_bytes(n, seed), {}};
}

// Header JSON for tensors laid out back to back in the given order.
// `metadata` (optional) becomes the __metadata__ member.
inline std::string st_header(const std::vector<StTensor>& tensors,
                             const ojson* metadata = nullptr) {
  ojson h = ojson::object();
  if (metadata != nullptr) h["__metadata__"] = *metadata;
  uint64_t at = 0;
  for (const auto& t : tensors) {
    const auto range = t.offsets ? *t.offsets : std::make_pair(at, at + t.size());
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {range.first, range.second}}};
    at += t.size();
  }
  return h.dump();
}

// u64 LE N, header, data. `n_override` writes a different N (malformed files).
inline std::vector<uint8_t> st_raw(const std::string& header, const std::vector<uint8_t>& data,
                                   std::optional<uint64_t> n_override = std::nullopt) {
  std::vector<uint8_t> out(8);
  const uint64_t n = n_override ? *n_override : header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

inline std::vector<uint8_t> st_file(const std::vector<StTensor>& tensors,
                                    const ojson* metadata = nullptr, size_t pad_header_to = 8) {
  std::string header = st_header(tensors, metadata);
  while (pad_header_to > 1 && header.size() % pad_header_to != 0) header += ' ';
  std::vector<uint8_t> data;
  for (const auto& t : tensors) data.insert(data.end(), t.data.begin(), t.data.end());
  return st_raw(header, data);
}

// Writes a safetensors file whose hole tensors stay sparse (they read back as zeros).
inline void write_st_file(const std::filesystem::path& p, const std::vector<StTensor>& tensors) {
  std::string header = st_header(tensors);
  while (header.size() % 8 != 0) header += ' ';
  {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    const auto prefix = st_raw(header, {});
    out.write(reinterpret_cast<const char*>(prefix.data()), static_cast<std::streamsize>(prefix.size()));
    for (const auto& t : tensors) {
      if (t.hole_bytes > 0) out.seekp(static_cast<std::streamoff>(t.hole_bytes), std::ios::cur);
      else out.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size()));
    }
  }
  uint64_t total = 8 + header.size();
  for (const auto& t : tensors) total += t.size();
  std::filesystem::resize_file(p, total);  // extends over a trailing hole
}

inline void write_bytes(const std::filesystem::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
inline void write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}
inline std::vector<uint8_t> read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// ---- synthetic checkpoint -------------------------------------------------------------------------

struct SynthShard {
  std::string file;
  std::vector<StTensor> tensors;  // written in this order
};

struct SynthCheckpoint {
  ojson config;
  std::vector<SynthShard> shards;
  bool write_index = true;
  std::optional<ojson> index_override;  // written verbatim instead of make_index()

  StTensor* find(const std::string& name, size_t* shard_out = nullptr) {
    for (size_t s = 0; s < shards.size(); ++s)
      for (auto& t : shards[s].tensors)
        if (t.name == name) {
          if (shard_out) *shard_out = s;
          return &t;
        }
    return nullptr;
  }
  const StTensor* find(const std::string& name) const {
    return const_cast<SynthCheckpoint*>(this)->find(name);
  }
  bool remove(const std::string& name) {
    for (auto& sh : shards)
      for (auto it = sh.tensors.begin(); it != sh.tensors.end(); ++it)
        if (it->name == name) return sh.tensors.erase(it), true;
    return false;
  }
  ojson make_index() const {
    ojson wm = ojson::object();
    uint64_t total = 0;
    for (const auto& sh : shards)
      for (const auto& t : sh.tensors) wm[t.name] = sh.file, total += t.size();
    return ojson{{"metadata", {{"total_size", total}}}, {"weight_map", wm}};
  }
  void write(const std::filesystem::path& dir) const {
    write_text(dir / "config.json", config.dump(2));
    for (const auto& sh : shards) write_st_file(dir / sh.file, sh.tensors);
    if (!write_index) return;
    if (index_override) write_text(dir / "model.safetensors.index.json", index_override->dump(2));
    else write_text(dir / "model.safetensors.index.json", make_index().dump(2));
  }
};

// The conformance tiny model (conformance README §3) in the released nested layout. With
// `mxfp4` the experts are packed and moe_intermediate_size is 96 instead of 48: MXFP4 needs every
// expert input width to be a multiple of 32 and w2's input width is I (48 is not), and 96 != 64
// keeps w1 and w2 different shapes so a swapped geometry is caught.
// `num_layers` other than 13 keeps the pattern: MLA on every 4th layer and on the last one.
inline bool tiny_is_mla(int64_t layer, int64_t num_layers) {
  return layer % 4 == 3 || layer == num_layers - 1;
}

inline ojson tiny_nested_config(bool mxfp4, int64_t num_layers = 13) {
  ojson mla_list = ojson::array(), kda_list = ojson::array();
  for (int64_t l = 0; l < num_layers; ++l)
    (tiny_is_mla(l, num_layers) ? mla_list : kda_list).push_back(l + 1);  // 1-based
  ojson lac = {{"full_attn_layers", mla_list},
               {"kda_layers", kda_list},
               {"num_heads", 4},
               {"head_dim", 16},
               {"short_conv_kernel_size", 4},
               {"use_full_rank_gate", true},
               {"gate_lower_bound", -5.0}};
  ojson text = {{"model_type", "kimi_linear"}, {"vocab_size", 256}, {"hidden_size", 128},
                {"num_hidden_layers", num_layers}, {"num_attention_heads", 4}, {"num_key_value_heads", 4},
                {"intermediate_size", 96}, {"moe_intermediate_size", mxfp4 ? 96 : 48},
                {"num_experts", 8}, {"num_experts_per_token", 2}, {"num_shared_experts", 2},
                {"routed_expert_hidden_size", 64}, {"latent_moe_use_norm", true},
                {"first_k_dense_replace", 1}, {"moe_layer_freq", 1}, {"moe_renormalize", true},
                {"moe_router_activation_func", "sigmoid"}, {"routed_scaling_factor", 1.0},
                {"topk_method", "noaux_tc"}, {"use_grouped_topk", true}, {"num_expert_group", 1},
                {"topk_group", 1}, {"q_lora_rank", 64}, {"kv_lora_rank", 32},
                {"qk_nope_head_dim", 24}, {"qk_rope_head_dim", 8}, {"v_head_dim", 16},
                {"mla_use_nope", true}, {"mla_use_output_gate", true}, {"attn_res_block_size", 3},
                {"hidden_act", "situ"}, {"activation_situ_beta", 4.0},
                {"activation_situ_linear_beta", 25.0}, {"rms_norm_eps", 1e-5},
                {"max_position_embeddings", 4096}, {"num_nextn_predict_layers", 0},
                {"tie_word_embeddings", false}, {"bos_token_id", 250}, {"eos_token_id", 251},
                {"pad_token_id", 255}, {"linear_attn_config", lac}};
  if (mxfp4)
    text["quantization_config"] = {
        {"quant_method", "compressed-tensors"},
        {"format", "mxfp4-pack-quantized"},
        {"quantization_status", "compressed"},
        {"config_groups",
         {{"group_0",
           {{"targets", {"Linear"}},
            {"weights", {{"num_bits", 4}, {"type", "float"}, {"strategy", "group"},
                         {"group_size", 32}, {"symmetric", true}, {"dynamic", false},
                         {"scale_dtype", "torch.uint8"}}},
            {"input_activations", nullptr}}}}},
        {"ignore", {"re:.*self_attn.*", "re:.*shared_experts.*", "re:.*lm_head.*"}}};
  return ojson{{"architectures", {"KimiK3ForConditionalGeneration"}}, {"model_type", "kimi_k3"},
               {"bos_token_id", 250}, {"eos_token_id", 251}, {"pad_token_id", 255},
               {"dtype", "bfloat16"}, {"tie_word_embeddings", false},
               {"text_config", text}, {"vision_config", {{"hidden_size", 8}}}};
}

// Tensors of the model `config` describes (released nested layout, every dimension read from
// text_config): one shard per decoder layer (trunk first, then the experts in lexicographic name
// order, like the release), a model-level shard and a vision shard. Matrices are BF16; norm
// gains are F32, or BF16 with `released_dtypes` (K3-MODEL §5 tables); A_log is [D] with the H_k
// real values first and a zero tail. With `sparse`, every tensor except A_log is a hole
// (K3-sized files cost only their headers).
inline SynthCheckpoint make_checkpoint(const ojson& config, bool mxfp4, bool sparse = false,
                                       bool released_dtypes = false) {
  SynthCheckpoint ck;
  ck.config = config;
  const ojson& tc = ck.config["text_config"];
  const ojson& lac = tc["linear_attn_config"];
  auto dim = [&](const ojson& o, const char* key) { return o[key].get<int64_t>(); };
  const int64_t E = dim(tc, "hidden_size"), V = dim(tc, "vocab_size"), L = dim(tc, "num_hidden_layers");
  const int64_t Hk = dim(lac, "num_heads"), D = dim(lac, "head_dim"), C = Hk * D;
  const int64_t K = dim(lac, "short_conv_kernel_size");
  const int64_t Hm = dim(tc, "num_attention_heads"), ql = dim(tc, "q_lora_rank");
  const int64_t kvl = dim(tc, "kv_lora_rank"), nope = dim(tc, "qk_nope_head_dim");
  const int64_t rope = dim(tc, "qk_rope_head_dim"), v = dim(tc, "v_head_dim");
  const int64_t Ne = dim(tc, "num_experts"), ell = dim(tc, "routed_expert_hidden_size");
  const int64_t I = dim(tc, "moe_intermediate_size"), Is = I * dim(tc, "num_shared_experts");
  const int64_t Id = dim(tc, "intermediate_size"), dense = dim(tc, "first_k_dense_replace");
  std::vector<bool> is_mla(static_cast<size_t>(L), false);
  for (const auto& x : lac["full_attn_layers"]) is_mla[x.get<size_t>() - 1] = true;
  uint64_t seed = 1;
  auto make = [&](std::string name, const char* dtype, std::vector<int64_t> shape) {
    if (!sparse) return filled(std::move(name), dtype, std::move(shape), seed++);
    const uint64_t n = static_cast<uint64_t>(numel_of(shape)) * test_dtype_size(dtype);
    return StTensor{std::move(name), dtype, std::move(shape), {}, {}, n};
  };
  const char* gain = released_dtypes ? "BF16" : "F32";  // dtype of RMSNorm / AttnRes gains
  const size_t num_files = static_cast<size_t>(L) + 2;
  auto file_name = [&](size_t i) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%06zu.safetensors", i + 1, num_files);
    return std::string(buf);
  };
  for (int64_t l = 0; l < L; ++l) {
    SynthShard sh{file_name(static_cast<size_t>(l)), {}};
    const std::string P = "language_model.model.layers." + std::to_string(l) + ".";
    auto add = [&](const std::string& suffix, const char* dtype, std::vector<int64_t> shape) {
      sh.tensors.push_back(make(P + suffix, dtype, std::move(shape)));
    };
    add("input_layernorm.weight", gain, {E});
    add("post_attention_layernorm.weight", gain, {E});
    add("self_attention_res_norm.weight", gain, {E});
    add("self_attention_res_proj.weight", "BF16", {1, E});
    add("mlp_res_norm.weight", gain, {E});
    add("mlp_res_proj.weight", "BF16", {1, E});
    if (is_mla[static_cast<size_t>(l)]) {
      add("self_attn.q_a_proj.weight", "BF16", {ql, E});
      add("self_attn.q_a_layernorm.weight", gain, {ql});
      add("self_attn.q_b_proj.weight", "BF16", {Hm * (nope + rope), ql});
      add("self_attn.kv_a_proj_with_mqa.weight", "BF16", {kvl + rope, E});
      add("self_attn.kv_a_layernorm.weight", gain, {kvl});
      add("self_attn.kv_b_proj.weight", "BF16", {Hm * (nope + v), kvl});
      add("self_attn.g_proj.weight", "BF16", {Hm * v, E});
      add("self_attn.o_proj.weight", "BF16", {E, Hm * v});
    } else {
      for (const char* x : {"q", "k", "v"}) {
        add(std::string("self_attn.") + x + "_proj.weight", "BF16", {C, E});
        add(std::string("self_attn.") + x + "_conv1d.weight", "F32", {C, 1, K});
      }
      add("self_attn.f_a_proj.weight", "BF16", {D, E});
      add("self_attn.f_b_proj.weight", "BF16", {C, D});
      std::vector<float> a_log(static_cast<size_t>(D), 0.0f);
      for (int64_t h = 0; h < Hk; ++h) a_log[static_cast<size_t>(h)] = 0.25f * static_cast<float>(h + 1);
      sh.tensors.push_back(StTensor{P + "self_attn.A_log", "F32", {D}, f32_bytes(a_log), {}});
      add("self_attn.dt_bias", "F32", {C});
      add("self_attn.b_proj.weight", "BF16", {Hk, E});
      add("self_attn.g_proj.weight", "BF16", {C, E});
      add("self_attn.o_norm.weight", "F32", {D});
      add("self_attn.o_proj.weight", "BF16", {E, C});
    }
    if (l < dense) {
      add("mlp.gate_proj.weight", "BF16", {Id, E});
      add("mlp.up_proj.weight", "BF16", {Id, E});
      add("mlp.down_proj.weight", "BF16", {E, Id});
    } else {
      add("block_sparse_moe.gate.weight", "BF16", {Ne, E});
      add("block_sparse_moe.gate.e_score_correction_bias", "F32", {Ne});
      add("block_sparse_moe.routed_expert_down_proj.weight", "BF16", {ell, E});
      add("block_sparse_moe.routed_expert_norm.weight", gain, {ell});
      add("block_sparse_moe.routed_expert_up_proj.weight", "BF16", {E, ell});
      add("block_sparse_moe.shared_experts.gate_proj.weight", "BF16", {Is, E});
      add("block_sparse_moe.shared_experts.up_proj.weight", "BF16", {Is, E});
      add("block_sparse_moe.shared_experts.down_proj.weight", "BF16", {E, Is});
      std::vector<std::string> ids;  // lexicographic order: 0, 1, 10, 100, ...
      for (int64_t e = 0; e < Ne; ++e) ids.push_back(std::to_string(e));
      std::sort(ids.begin(), ids.end());
      for (const auto& id : ids) {
        const std::string X = "block_sparse_moe.experts." + id + ".";
        const std::vector<std::vector<int64_t>> logical = {{I, ell}, {ell, I}, {I, ell}};
        for (int w = 0; w < 3; ++w) {
          const std::string W = X + "w" + std::to_string(w + 1) + ".";
          const auto& s = logical[static_cast<size_t>(w)];
          if (mxfp4) {
            add(W + "weight_packed", "U8", {s[0], s[1] / 2});
            add(W + "weight_scale", "U8", {s[0], s[1] / 32});
          } else {
            add(W + "weight", "F32", s);
          }
        }
      }
    }
    ck.shards.push_back(std::move(sh));
  }
  SynthShard top{file_name(static_cast<size_t>(L)), {}};
  top.tensors.push_back(make("language_model.lm_head.weight", "BF16", {V, E}));
  top.tensors.push_back(make("language_model.model.embed_tokens.weight", "BF16", {V, E}));
  top.tensors.push_back(make("language_model.model.norm.weight", gain, {E}));
  top.tensors.push_back(make("language_model.model.output_attn_res_norm.weight", gain, {E}));
  top.tensors.push_back(make("language_model.model.output_attn_res_proj.weight", "BF16", {1, E}));
  ck.shards.push_back(std::move(top));
  SynthShard vision{file_name(static_cast<size_t>(L) + 1), {}};
  vision.tensors.push_back(make("vision_tower.patch_embed.proj.weight", "BF16", {8, 3, 2, 2}));
  vision.tensors.push_back(make("mm_projector.linear_1.weight", "BF16", {16, 8}));
  ck.shards.push_back(std::move(vision));
  return ck;
}

inline SynthCheckpoint make_tiny_checkpoint(bool mxfp4, int64_t num_layers = 13) {
  return make_checkpoint(tiny_nested_config(mxfp4, num_layers), mxfp4, /*sparse=*/false);
}

}  // namespace ktier::test
