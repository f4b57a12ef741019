#include "synth/config_gen.h"

#include <nlohmann/json.hpp>

namespace ktier::synth {
namespace {

nlohmann::json quantization_config() {
  using nlohmann::json;
  json weights = {{"num_bits", 4},         {"type", "float"},   {"strategy", "group"},
                  {"group_size", 32},      {"symmetric", true}, {"dynamic", false},
                  {"scale_dtype", "torch.uint8"}, {"actorder", nullptr}, {"block_structure", nullptr},
                  {"observer", "minmax"},  {"observer_kwargs", json::object()}};
  json group = {{"targets", {"Linear"}},
                {"weights", weights},
                {"input_activations", nullptr},
                {"output_activations", nullptr}};
  return {{"quant_method", "compressed-tensors"},
          {"format", "mxfp4-pack-quantized"},
          {"quantization_status", "compressed"},
          {"config_groups", {{"group_0", group}}},
          {"kv_cache_scheme", nullptr},
          {"ignore",
           {"re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
            "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"}}};
}

}  // namespace

std::string config_json(const SynthShape& s, ExpertFormat format, const SynthVocab& vocab) {
  using nlohmann::json;
  json lac = {
      {"full_attn_layers", s.full_attn_layers_1based()},
      {"kda_layers", s.kda_layers_1based()},
      {"num_heads", s.kda_heads},
      {"head_dim", s.kda_head_dim},
      {"short_conv_kernel_size", s.conv_kernel},
      {"use_full_rank_gate", true},
      {"gate_lower_bound", -5.0},
  };
  json tc = {
      {"model_type", "kimi_linear"},
      {"vocab_size", s.vocab},
      {"hidden_size", s.hidden},
      {"num_hidden_layers", s.layers},
      {"num_attention_heads", s.mla_heads},
      {"num_key_value_heads", s.mla_heads},
      {"intermediate_size", s.dense_inter},
      {"moe_intermediate_size", s.expert_inter},
      {"num_experts", s.experts},
      {"num_experts_per_token", s.top_k},
      {"num_shared_experts", s.shared_experts},
      {"routed_expert_hidden_size", s.latent},
      {"latent_moe_use_norm", true},
      {"first_k_dense_replace", s.first_k_dense},
      {"moe_layer_freq", 1},
      {"moe_renormalize", true},
      {"moe_router_activation_func", "sigmoid"},
      {"routed_scaling_factor", 1.0},
      {"topk_method", "noaux_tc"},
      {"use_grouped_topk", true},
      {"num_expert_group", 1},
      {"topk_group", 1},
      {"q_lora_rank", s.q_lora},
      {"kv_lora_rank", s.kv_lora},
      {"qk_nope_head_dim", s.qk_nope},
      {"qk_rope_head_dim", s.qk_rope},
      {"v_head_dim", s.v_head},
      {"mla_use_nope", true},
      {"mla_use_output_gate", true},
      {"attn_res_block_size", s.block_size},
      {"hidden_act", "situ"},
      {"activation_situ_beta", 4.0},
      {"activation_situ_linear_beta", 25.0},
      {"rms_norm_eps", 1e-05},
      {"max_position_embeddings", 1048576},
      {"num_nextn_predict_layers", 0},
      {"tie_word_embeddings", false},
      {"bos_token_id", vocab.bos_id},
      {"eos_token_id", vocab.eos_id},
      {"pad_token_id", vocab.pad_id},
      {"linear_attn_config", lac},
  };
  if (format == ExpertFormat::kMxfp4) tc["quantization_config"] = quantization_config();
  json root = {
      {"architectures", {"KimiK3ForConditionalGeneration"}},
      {"model_type", "kimi_k3"},
      {"bos_token_id", vocab.bos_id},
      {"eos_token_id", vocab.eos_id},
      {"pad_token_id", vocab.pad_id},
      {"dtype", "bfloat16"},
      {"tie_word_embeddings", false},
      {"text_config", tc},
  };
  return root.dump(2) + "\n";
}

std::string generation_config_json(const SynthVocab& vocab) {
  nlohmann::json g = {{"bos_token_id", vocab.bos_id}, {"eos_token_id", vocab.eos_id}};
  return g.dump(2) + "\n";
}

}  // namespace ktier::synth
