// `ktier inspect -m DIR [--json]`: opens and fully validates a model directory (config, index,
// shard headers, tensor inventory) and prints what ktier sees: the config, the layer map, bytes
// by kind and how the routed experts are stored. Exit 0 when the model would load; otherwise the
// loader's exit code (2 config, 3 corrupt checkpoint, 1 I/O) with its message.
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "common/json_text.h"
#include "common/size.h"
#include "format/checkpoint.h"

namespace ktier::cli {
namespace {

using format::Checkpoint;
using format::ModelConfig;

// Layers at or below this count get one line each; longer models get a compact map.
constexpr int64_t kMaxLinePerLayer = 32;

std::string with_commas(uint64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

// "16.73 MiB (17,547,264 bytes)", "812 B".
std::string human_bytes(uint64_t bytes) {
  return format_size(bytes) + (bytes >= 1024 ? " (" + with_commas(bytes) + " bytes)" : "");
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string eos_text(const ModelConfig& c) {
  if (c.eos_token_ids.empty()) return "none";
  std::string s;
  for (size_t i = 0; i < c.eos_token_ids.size(); ++i)
    s += (i ? ", " : "") + std::to_string(c.eos_token_ids[i]);
  return s;
}

std::string quant_text(const ModelConfig& c) {
  if (!c.quantization) return "none";
  const auto& q = *c.quantization;
  return q.quant_method + " " + q.format + " (" + std::to_string(q.num_bits) + "-bit " + q.type +
         ", group " + std::to_string(q.group_size) + ", from " + q.found_in + ")";
}

std::string expert_dtype_text(const format::ExpertSummary& s) {
  if (s.storage == format::ExpertStorage::kMxfp4) return "MXFP4 (U8 packed + E8M0 scales)";
  if (s.storage == format::ExpertStorage::kPlainFloat)
    return "plain float " + (s.plain_dtype ? std::string(dtype_name(*s.plain_dtype)) : "(mixed dtypes)");
  return "none";
}

void print_layer_map(const ModelConfig& c) {
  const int64_t L = c.num_hidden_layers;
  if (L <= kMaxLinePerLayer) {
    std::printf("layer map:\n");
    for (int64_t l = 0; l < L; ++l)
      std::printf("  %3" PRId64 "  %s  %s\n", l, c.is_mla(l) ? "MLA" : "KDA",
                  c.is_boundary(l) ? (c.is_dense(l) ? "dense  boundary" : "MoE    boundary")
                                   : (c.is_dense(l) ? "dense" : "MoE"));
    return;
  }
  std::string attn, ffn, mla, bounds;
  for (int64_t l = 0; l < L; ++l) {
    if (c.is_boundary(l)) attn += '|', ffn += '|', bounds += " " + std::to_string(l);
    attn += c.is_mla(l) ? 'M' : 'K';
    ffn += c.is_dense(l) ? 'D' : 'E';
    if (c.is_mla(l)) mla += " " + std::to_string(l);
  }
  std::printf("layer map (%" PRId64 " layers, 0-based; | marks an AttnRes boundary):\n", L);
  std::printf("  attention  %s   (K = KDA, M = MLA)\n", attn.c_str());
  std::printf("  ffn        %s   (D = dense, E = MoE)\n", ffn.c_str());
  std::printf("  MLA layers:%s\n", mla.c_str());
  std::printf("  boundaries:%s\n", bounds.c_str());
}

void print_text(const Checkpoint& ck) {
  const ModelConfig& c = ck.config();
  std::printf("model: %s\n", ck.dir().string().c_str());
  std::printf("config: %s shape (%s)\n", format::config_shape_name(c.shape), c.source.c_str());
  std::printf("  E %" PRId64 ", L %" PRId64 ", V %" PRId64 ", rms_norm_eps %s\n", c.hidden_size,
              c.num_hidden_layers, c.vocab_size, number(c.rms_norm_eps).c_str());
  std::printf("  KDA: %" PRId64 " layers, %" PRId64 " heads x %" PRId64 " (width %" PRId64
              "), conv %" PRId64 ", gate_lower_bound %s\n",
              c.num_kda_layers(), c.kda_num_heads, c.kda_head_dim, c.kda_width(),
              c.short_conv_kernel_size, number(c.gate_lower_bound).c_str());
  std::printf("  MLA: %" PRId64 " layers, %" PRId64 " heads, q_lora %" PRId64 ", kv_lora %" PRId64
              ", qk %" PRId64 "+%" PRId64 ", v %" PRId64 ", output gate %s\n",
              c.num_mla_layers(), c.num_attention_heads, c.q_lora_rank, c.kv_lora_rank,
              c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim,
              c.mla_use_output_gate ? "on" : "off");
  std::printf("  FFN: %" PRId64 " dense (I_d %" PRId64 "), %" PRId64 " MoE: %" PRId64
              " experts, top-%" PRId64 ", %" PRId64 " shared, latent %" PRId64 ", I %" PRId64
              ", scale %s, renorm %s, latent norm %s\n",
              c.num_dense_layers(), c.intermediate_size, c.num_moe_layers(), c.num_experts,
              c.num_experts_per_token, c.num_shared_experts, c.routed_expert_hidden_size,
              c.moe_intermediate_size, number(c.routed_scaling_factor).c_str(),
              c.moe_renormalize ? "on" : "off", c.latent_moe_use_norm ? "on" : "off");
  std::printf("  AttnRes block size %" PRId64 "; SiTU beta %s / %s; eos %s\n",
              c.attn_res_block_size, number(c.situ_beta).c_str(),
              c.situ_linear_beta ? number(*c.situ_linear_beta).c_str() : "none (uncapped)",
              eos_text(c).c_str());
  std::printf("  quantization: %s\n", quant_text(c).c_str());
  print_layer_map(c);

  const auto& cs = ck.census();
  std::printf("tensors (%zu shard%s, %s):\n", ck.num_shards(), ck.num_shards() == 1 ? "" : "s",
              ck.has_index() ? "indexed" : "no index");
  auto row = [](const char* kind, const format::CensusEntry& e) {
    std::printf("  %-16s %9s tensors  %s\n", kind, with_commas(e.tensors).c_str(),
                human_bytes(e.bytes).c_str());
  };
  row("trunk", cs.trunk);
  row("experts", cs.experts);
  row("embeddings/head", cs.embeddings_head);
  if (cs.ignored.tensors > 0) row("ignored", cs.ignored);
  row("total", {cs.trunk.tensors + cs.experts.tensors + cs.embeddings_head.tensors + cs.ignored.tensors,
                cs.trunk.bytes + cs.experts.bytes + cs.embeddings_head.bytes + cs.ignored.bytes});

  const auto& ex = ck.expert_summary();
  std::printf("experts: %s, %s experts", expert_dtype_text(ex).c_str(), with_commas(ex.count).c_str());
  if (ex.bytes_per_expert > 0) std::printf(", %s each", human_bytes(ex.bytes_per_expert).c_str());
  if (ex.storage == format::ExpertStorage::kMxfp4)
    std::printf(", contiguous: %s (%s of %s)",
                ex.contiguous == ex.count ? "yes" : ex.contiguous == 0 ? "no" : "partly",
                with_commas(ex.contiguous).c_str(), with_commas(ex.count).c_str());
  std::printf("\n");
}

nlohmann::ordered_json to_json(const Checkpoint& ck) {
  const ModelConfig& c = ck.config();
  nlohmann::ordered_json j;
  j["model"] = ck.dir().string();
  j["config"] = {
      {"shape", format::config_shape_name(c.shape)},
      {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"vocab_size", c.vocab_size},
      {"kda_num_heads", c.kda_num_heads},
      {"kda_head_dim", c.kda_head_dim},
      {"num_attention_heads", c.num_attention_heads},
      {"num_experts", c.num_experts},
      {"num_experts_per_token", c.num_experts_per_token},
      {"num_shared_experts", c.num_shared_experts},
      {"routed_expert_hidden_size", c.routed_expert_hidden_size},
      {"moe_intermediate_size", c.moe_intermediate_size},
      {"intermediate_size", c.intermediate_size},
      {"attn_res_block_size", c.attn_res_block_size},
      {"mla_layers", c.num_mla_layers()},
      {"kda_layers", c.num_kda_layers()},
      {"dense_layers", c.num_dense_layers()},
      {"eos_token_ids", c.eos_token_ids},
      {"quantization", c.quantization ? nlohmann::ordered_json(c.quantization->format) : nullptr},
  };
  auto& layers = j["layers"] = nlohmann::ordered_json::array();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    layers.push_back({{"layer", l},
                      {"attention", c.is_mla(l) ? "MLA" : "KDA"},
                      {"ffn", c.is_dense(l) ? "dense" : "MoE"},
                      {"boundary", c.is_boundary(l)}});
  const auto& cs = ck.census();
  auto entry = [](const format::CensusEntry& e) {
    return nlohmann::ordered_json{{"tensors", e.tensors}, {"bytes", e.bytes}};
  };
  j["census"] = {{"trunk", entry(cs.trunk)},
                 {"experts", entry(cs.experts)},
                 {"embeddings_head", entry(cs.embeddings_head)},
                 {"ignored", entry(cs.ignored)}};
  const auto& ex = ck.expert_summary();
  j["experts"] = {{"storage", format::expert_storage_name(ex.storage)},
                  {"plain_dtype", ex.plain_dtype ? nlohmann::ordered_json(dtype_name(*ex.plain_dtype))
                                                 : nullptr},
                  {"count", ex.count},
                  {"bytes_per_expert", ex.bytes_per_expert},
                  {"contiguous", ex.contiguous}};
  j["shards"] = ck.num_shards();
  j["indexed"] = ck.has_index();
  return j;
}

struct InspectOptions {
  std::string model_dir;
  bool json = false;
};

Status run_inspect(const InspectOptions& opt) {
  KTIER_ASSIGN_OR_RETURN(Checkpoint ck, Checkpoint::open(opt.model_dir));
  if (opt.json) std::fputs(json_output_text(to_json(ck)).c_str(), stdout);
  else print_text(ck);
  return Status::ok();
}

}  // namespace

void register_inspect_command(CLI::App& app, int& exit_code) {
  auto opt = std::make_shared<InspectOptions>();
  auto* sub = app.add_subcommand(
      "inspect", "Validate a model directory and print its config, layer map and tensor bytes");
  sub->add_option("-m,--model", opt->model_dir, "Model directory (config.json + safetensors)")
      ->required();
  sub->add_flag("--json", opt->json, "Print the summary as JSON");
  sub->callback([opt, &exit_code] { exit_code = finish(run_inspect(*opt)); });
}

}  // namespace ktier::cli
