// `ktier inspect -m DIR [--json] [--check-tensors]`: opens and fully validates a model directory
// (config, index, shard headers, tensor inventory) and prints what ktier sees: the config, the
// layer map, bytes by kind and how the routed experts are stored. Exit 0 when the model would
// load; otherwise the loader's exit code (2 config, 3 corrupt checkpoint, 1 I/O) with its
// message. --check-tensors also reads the values (format/value_check.h): NaN/Inf in a weight is
// exit 3 naming each tensor; MXFP4 scale-255 blocks (zero blocks, K3-MODEL D12) are counted.
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "common/json_text.h"
#include "common/progress.h"
#include "common/size.h"
#include "format/checkpoint.h"
#include "format/value_check.h"

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

// Tensors listed one per line at most; the counts cover them all.
constexpr size_t kMaxListedTensors = 20;

std::string count_of(uint64_t n, const char* thing) {
  return with_commas(n) + " " + thing + (n == 1 ? "" : "s");
}

std::string counts_text(const format::TensorValueCounts& c) {
  std::string s = c.name + " (" + c.shard + "): ";
  if (c.nan + c.inf > 0)
    s += with_commas(c.nan) + " NaN, " + with_commas(c.inf) + " Inf";
  else
    s += count_of(c.scale_255, "block");
  return s + ", the first at element " + with_commas(c.first_element);
}

void print_tensor_list(const std::vector<format::TensorValueCounts>& list) {
  for (size_t i = 0; i < list.size() && i < kMaxListedTensors; ++i)
    std::printf("  %s\n", counts_text(list[i]).c_str());
  if (list.size() > kMaxListedTensors)
    std::printf("  ... and %zu more\n", list.size() - kMaxListedTensors);
}

void print_value_check(const format::ValueCheckReport& r) {
  std::printf("check-tensors: %s read, %s; %s of MXFP4 nibbles need no check\n",
              count_of(r.tensors_read, "tensor").c_str(), human_bytes(r.bytes_read).c_str(),
              count_of(r.tensors_skipped, "tensor").c_str());
  if (r.nonfinite.empty()) {
    std::printf("NaN/Inf: none\n");
  } else {
    std::printf("NaN/Inf: %s NaN and %s Inf in %s\n", with_commas(r.nan).c_str(),
                with_commas(r.inf).c_str(), count_of(r.nonfinite.size(), "tensor").c_str());
    print_tensor_list(r.nonfinite);
  }
  std::printf("MXFP4 scale 255 (NaN in OCP MX; a zero block in ktier, K3-MODEL D12): %s\n",
              r.scale_255 == 0 ? "none"
                               : (count_of(r.scale_255, "block") + " in " +
                                  count_of(r.scale_255_tensors.size(), "tensor"))
                                     .c_str());
  print_tensor_list(r.scale_255_tensors);
}

nlohmann::ordered_json value_check_json(const format::ValueCheckReport& r) {
  const auto list = [](const std::vector<format::TensorValueCounts>& v) {
    auto a = nlohmann::ordered_json::array();
    for (const auto& c : v)
      a.push_back({{"tensor", c.name}, {"shard", c.shard}, {"nan", c.nan}, {"inf", c.inf},
                   {"scale_255", c.scale_255}, {"first_element", c.first_element}});
    return a;
  };
  return {{"tensors_read", r.tensors_read}, {"bytes_read", r.bytes_read},
          {"tensors_skipped", r.tensors_skipped}, {"nan", r.nan}, {"inf", r.inf},
          {"scale_255", r.scale_255}, {"nonfinite_tensors", list(r.nonfinite)},
          {"scale_255_tensors", list(r.scale_255_tensors)}};
}

struct InspectOptions {
  std::string model_dir;
  bool json = false;
  bool check_tensors = false;
};

Status run_inspect(const InspectOptions& opt) {
  // Positioned reads for the value check: a shard that shrank is an error naming it.
  KTIER_ASSIGN_OR_RETURN(
      Checkpoint ck, Checkpoint::open(opt.model_dir, opt.check_tensors ? format::OpenMode::kPread
                                                                       : format::OpenMode::kMap));
  if (!opt.check_tensors) {
    if (opt.json) std::fputs(json_output_text(to_json(ck)).c_str(), stdout);
    else print_text(ck);
    return Status::ok();
  }
  ProgressMeter meter("check-tensors", format::value_check_bytes(ck),
                      spdlog::should_log(spdlog::level::info));
  Result<format::ValueCheckReport> checked =
      format::check_tensor_values(ck, [&](uint64_t done) { meter.update(done); });
  if (!checked.is_ok()) {
    meter.abandon();
    return checked.status();
  }
  const format::ValueCheckReport& r = *checked;
  meter.finish_if_shown(r.bytes_read);
  if (opt.json) {
    nlohmann::ordered_json j = to_json(ck);
    j["check_tensors"] = value_check_json(r);
    std::fputs(json_output_text(j).c_str(), stdout);
  } else {
    print_text(ck);
    print_value_check(r);
  }
  if (r.nonfinite.empty()) return Status::ok();
  const format::TensorValueCounts& first = r.nonfinite.front();
  return Status::corrupt(opt.model_dir + ": " + std::to_string(r.nonfinite.size()) +
                         " tensor(s) hold NaN or Inf values, e.g. '" + first.name + "' in " +
                         first.shard + " (" + with_commas(first.nan) + " NaN, " +
                         with_commas(first.inf) + " Inf); a forward through it is not finite");
}

}  // namespace

void register_inspect_command(CLI::App& app, int& exit_code) {
  auto opt = std::make_shared<InspectOptions>();
  auto* sub = app.add_subcommand(
      "inspect", "Validate a model directory and print its config, layer map and tensor bytes");
  sub->add_option("-m,--model", opt->model_dir, "Model directory (config.json + safetensors)")
      ->required();
  sub->add_flag("--json", opt->json, "Print the summary as JSON");
  sub->add_flag("--check-tensors", opt->check_tensors,
                "Also read every used tensor's values: NaN/Inf in a weight is exit 3 naming it; "
                "MXFP4 scale-255 blocks (zero blocks) are counted (the float tensors and the "
                "scales are read: about 199 GB of K3's 1.56 TB)");
  sub->callback([opt, &exit_code] { exit_code = finish(run_inspect(*opt)); });
}

}  // namespace ktier::cli
