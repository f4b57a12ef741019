// config.json: K3-MODEL §2 and conformance README §3, §9.
#include "format/config.h"

#include <fstream>
#include <limits>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "format/st_builder.h"
#include "common/test_paths.h"

namespace ktier::format {
namespace {

using json = nlohmann::json;
using ktier::test::conformance_dir;
namespace fs = std::filesystem;

json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

json manifest_config() { return read_json(conformance_dir() / "ops" / "MANIFEST.json")["config"]; }

// The released nested config with K3's values (K3-MODEL §2.2), minus the vision block.
json k3_config() {
  json mla = json::array(), kda = json::array();
  for (int l = 1; l <= 93; ++l) ((l % 4 == 0 || l == 93) ? mla : kda).push_back(l);
  json lac = {{"full_attn_layers", mla}, {"kda_layers", kda}, {"num_heads", 96},
              {"head_dim", 128}, {"short_conv_kernel_size", 4}, {"use_full_rank_gate", true},
              {"gate_lower_bound", -5.0}};
  json quant = {{"quant_method", "compressed-tensors"}, {"format", "mxfp4-pack-quantized"},
                {"quantization_status", "compressed"},
                {"config_groups", {{"group_0", {{"targets", {"Linear"}},
                                                {"weights", {{"num_bits", 4}, {"type", "float"},
                                                             {"strategy", "group"}, {"group_size", 32},
                                                             {"symmetric", true}, {"dynamic", false},
                                                             {"scale_dtype", "torch.uint8"}}},
                                                {"input_activations", nullptr}}}}},
                {"ignore", {"re:.*self_attn.*", "re:.*shared_experts.*", "re:.*lm_head.*"}}};
  json text = {{"model_type", "kimi_linear"}, {"vocab_size", 163840}, {"hidden_size", 7168},
               {"num_hidden_layers", 93}, {"num_attention_heads", 96}, {"num_key_value_heads", 96},
               {"intermediate_size", 33792}, {"moe_intermediate_size", 3072}, {"num_experts", 896},
               {"num_experts_per_token", 16}, {"num_shared_experts", 2},
               {"routed_expert_hidden_size", 3584}, {"latent_moe_use_norm", true},
               {"first_k_dense_replace", 1}, {"moe_layer_freq", 1}, {"moe_renormalize", true},
               {"moe_router_activation_func", "sigmoid"}, {"routed_scaling_factor", 1.0},
               {"topk_method", "noaux_tc"}, {"use_grouped_topk", true}, {"num_expert_group", 1},
               {"topk_group", 1}, {"q_lora_rank", 1536}, {"kv_lora_rank", 512},
               {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64}, {"v_head_dim", 128},
               {"mla_use_nope", true}, {"mla_use_output_gate", true}, {"attn_res_block_size", 12},
               {"hidden_act", "situ"}, {"activation_situ_beta", 4.0},
               {"activation_situ_linear_beta", 25.0}, {"rms_norm_eps", 1e-05},
               {"max_position_embeddings", 1048576}, {"num_nextn_predict_layers", 0},
               {"tie_word_embeddings", false}, {"bos_token_id", 163584}, {"eos_token_id", 163586},
               {"pad_token_id", 163839}, {"linear_attn_config", lac}, {"quantization_config", quant}};
  return {{"architectures", {"KimiK3ForConditionalGeneration"}}, {"model_type", "kimi_k3"},
          {"bos_token_id", 163584}, {"eos_token_id", 163586}, {"pad_token_id", 163839},
          {"dtype", "bfloat16"}, {"tie_word_embeddings", false},
          {"media_placeholder_token_id", 163605}, {"text_config", text}};
}

ModelConfig parse_ok(const json& j) {
  auto r = parse_model_config(j, "config.json");
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  if (!r.is_ok()) return ModelConfig{};
  return std::move(r).value();
}

// Parses, expects a usage error and returns its message.
std::string parse_err(const json& j) {
  auto r = parse_model_config(j, "config.json");
  EXPECT_FALSE(r.is_ok()) << "config unexpectedly loaded";
  if (r.is_ok()) return "";
  EXPECT_EQ(r.status().code(), ExitCode::kUsage);
  return r.status().message();
}

#define EXPECT_HAS(msg, text) EXPECT_NE((msg).find(text), std::string::npos) << "message: " << (msg)

size_t problem_lines(const std::string& msg) {
  size_t n = 0;
  for (size_t p = msg.find("\n  "); p != std::string::npos; p = msg.find("\n  ", p + 1)) ++n;
  return n == 0 ? 1 : n;
}

// ---- conformance ---------------------------------------------------------------------------

TEST(Config, ManifestConfigLoadsWithExactValues) {
  const ModelConfig c = parse_ok(manifest_config());
  EXPECT_EQ(c.shape, ConfigShape::kFlat);
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.num_hidden_layers, 13);
  EXPECT_EQ(c.vocab_size, 256);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.kda_num_heads, 4);
  EXPECT_EQ(c.kda_head_dim, 16);
  EXPECT_EQ(c.short_conv_kernel_size, 4);
  EXPECT_EQ(c.gate_lower_bound, -5.0);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.q_lora_rank, 64);
  EXPECT_EQ(c.kv_lora_rank, 32);
  EXPECT_EQ(c.qk_nope_head_dim, 24);
  EXPECT_EQ(c.qk_rope_head_dim, 8);
  EXPECT_EQ(c.v_head_dim, 16);
  EXPECT_TRUE(c.mla_use_output_gate);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.num_experts_per_token, 2);
  EXPECT_EQ(c.num_shared_experts, 2);
  EXPECT_EQ(c.routed_expert_hidden_size, 64);
  EXPECT_EQ(c.moe_intermediate_size, 48);
  EXPECT_EQ(c.routed_scaling_factor, 1.0);
  EXPECT_TRUE(c.moe_renormalize);
  EXPECT_TRUE(c.latent_moe_use_norm);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.intermediate_size, 96);
  EXPECT_EQ(c.attn_res_block_size, 3);
  EXPECT_EQ(c.situ_beta, 4.0);
  ASSERT_TRUE(c.situ_linear_beta.has_value());
  EXPECT_EQ(*c.situ_linear_beta, 25.0);
  EXPECT_EQ(c.full_attn_layers, (std::vector<int64_t>{4, 8, 12, 13}));
  EXPECT_FALSE(c.kda_layers.has_value());
  EXPECT_FALSE(c.quantization.has_value());
  EXPECT_TRUE(c.eos_token_ids.empty());
  std::string map;
  for (int64_t l = 0; l < 13; ++l) map += c.is_mla(l) ? 'M' : 'K';
  EXPECT_EQ(map, "KKKMKKKMKKKMM");
  std::vector<int64_t> bounds;
  for (int64_t l = 0; l < 13; ++l)
    if (c.is_boundary(l)) bounds.push_back(l);
  EXPECT_EQ(bounds, (std::vector<int64_t>{0, 3, 6, 9, 12}));
  EXPECT_TRUE(c.is_dense(0));
  EXPECT_TRUE(c.is_moe(1));
  EXPECT_EQ(c.num_mla_layers(), 4);
  EXPECT_EQ(c.num_kda_layers(), 9);
  EXPECT_EQ(c.num_moe_layers(), 12);
}

TEST(Config, RejectsBadLayerIndex) {
  auto r = load_model_config(conformance_dir() / "cfg" / "bad_layer_index.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  const std::string& m = r.status().message();
  EXPECT_HAS(m, "bad_layer_index.json");
  EXPECT_HAS(m, "full_attn_layers");
  EXPECT_HAS(m, "999");
  EXPECT_HAS(m, "outside 1..13");
  EXPECT_EQ(problem_lines(m), 1u);
}

TEST(Config, RejectsBadTopK) {
  auto r = load_model_config(conformance_dir() / "cfg" / "bad_topk.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  const std::string& m = r.status().message();
  EXPECT_HAS(m, "bad_topk.json");
  EXPECT_HAS(m, "num_experts_per_token: is 128, larger than num_experts (8)");
  EXPECT_HAS(m, "top-k bound 64");
}

TEST(Config, RejectsMissingLayerMap) {
  auto r = load_model_config(conformance_dir() / "cfg" / "no_layermap.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  const std::string& m = r.status().message();
  EXPECT_HAS(m, "no_layermap.json: full_attn_layers: missing at the root (required; never defaulted)");
  EXPECT_EQ(problem_lines(m), 1u);
}

// ---- the released nested shape ----------------------------------------------------------------

TEST(Config, K3NestedLayerMap) {
  const ModelConfig c = parse_ok(k3_config());
  EXPECT_EQ(c.shape, ConfigShape::kNested);
  EXPECT_EQ(c.kda_num_heads, 96);
  EXPECT_EQ(c.kda_head_dim, 128);
  EXPECT_EQ(c.kda_width(), 12288);
  EXPECT_EQ(c.num_experts, 896);
  EXPECT_EQ(c.num_experts_per_token, 16);
  EXPECT_EQ(c.shared_expert_width(), 6144);
  std::vector<int64_t> mla, bounds;
  for (int64_t l = 0; l < 93; ++l) {
    if (c.is_mla(l)) mla.push_back(l);
    if (c.is_boundary(l)) bounds.push_back(l);
  }
  std::vector<int64_t> want_mla;
  for (int64_t l = 3; l <= 87; l += 4) want_mla.push_back(l);
  want_mla.push_back(91);
  want_mla.push_back(92);
  EXPECT_EQ(mla, want_mla);
  EXPECT_EQ(bounds, (std::vector<int64_t>{0, 12, 24, 36, 48, 60, 72, 84}));
  EXPECT_EQ(c.num_mla_layers(), 24);
  EXPECT_EQ(c.num_kda_layers(), 69);
  EXPECT_TRUE(c.is_kda(0));
  EXPECT_TRUE(c.is_dense(0));
  EXPECT_FALSE(c.is_dense(1));
  EXPECT_EQ(c.num_moe_layers(), 92);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{163586}));
  ASSERT_TRUE(c.quantization.has_value());
  EXPECT_EQ(c.quantization->format, "mxfp4-pack-quantized");
  EXPECT_EQ(c.quantization->group_size, 32);
  EXPECT_EQ(c.quantization->found_in, "text_config.quantization_config");
}

// A corrupt layer count is refused without allocating or scanning by it (it sizes per-layer
// tables before any shard is read): past the limit, and when the layer lists leave layers out.
TEST(Config, HugeLayerCountsAreRefusedCheaply) {
  for (const int64_t L : {int64_t{4097}, int64_t{1} << 40}) {
    json j = k3_config();
    j["text_config"]["num_hidden_layers"] = L;
    j["text_config"]["linear_attn_config"].erase("kda_layers");
    EXPECT_HAS(parse_err(j), "text_config.num_hidden_layers: is " + std::to_string(L) +
                                 ", more than ktier's limit of 4096 layers");
  }
  json j = k3_config();
  j["text_config"]["num_hidden_layers"] = 4096;
  EXPECT_HAS(parse_err(j),
             "does not cover 1..4096 (missing 94, 95, 96, 97, 98, 99, 100, 101, ...)");
}

// Widths and counts far past any model are refused by name: their products in the shape checks
// wrapped around int64, so 4 + 2^61 heads passed as 4 (fuzz round 18).
TEST(Config, ShapeFieldsPastTheLimitsAreRefusedByName) {
  const std::pair<const char*, int64_t> cases[] = {
      {"num_attention_heads", (int64_t{1} << 61) + 4}, {"num_attention_heads", 65536},
      {"qk_nope_head_dim", (int64_t{1} << 62) + 24},   {"v_head_dim", (int64_t{1} << 62) + 16},
      {"num_shared_experts", (int64_t{1} << 62) + 2},  {"kv_lora_rank", INT64_MAX},
      {"hidden_size", (int64_t{1} << 24) + 1},         {"vocab_size", int64_t{1} << 40}};
  for (const auto& [key, v] : cases) {
    json j = k3_config();
    j["text_config"][key] = v;
    EXPECT_HAS(parse_err(j), std::string("text_config.") + key + ": is " + std::to_string(v) +
                                 ", more than ktier's limit of ");
  }
  json j = k3_config();
  j["text_config"]["num_attention_heads"] = 65535;  // at the limit
  j["text_config"]["vocab_size"] = int64_t{1} << 24;
  EXPECT_EQ(parse_ok(j).num_attention_heads, 65535);
}

// The two MLA head widths may not both be 0; two near INT64_MAX are refused by name without
// their sum (which overflowed) being formed.
TEST(Config, MlaQueryKeyWidthIsCheckedWithoutASum) {
  json j = k3_config();
  j["text_config"]["qk_nope_head_dim"] = 0;
  j["text_config"]["qk_rope_head_dim"] = 0;
  EXPECT_HAS(parse_err(j), "qk_nope_head_dim + qk_rope_head_dim must be >= 1");
  // A rope part alone passes K3-MODEL.md's rule; the kernels need a no-rope part (an abort in
  // the first forward, before): refused by name.
  j["text_config"]["qk_rope_head_dim"] = 64;
  EXPECT_HAS(parse_err(j), "text_config.qk_nope_head_dim: is 0: ktier's MLA needs a no-rope");
  j["text_config"]["qk_nope_head_dim"] = INT64_MAX;
  j["text_config"]["qk_rope_head_dim"] = INT64_MAX;
  const std::string m = parse_err(j);
  EXPECT_HAS(m, "text_config.qk_nope_head_dim: is 9223372036854775807, more than ktier's limit");
  EXPECT_HAS(m, "text_config.qk_rope_head_dim: is 9223372036854775807, more than ktier's limit");
  EXPECT_EQ(m.find("must be >= 1"), std::string::npos) << m;
}

TEST(Config, MaxPositionEmbeddingsIsPositiveWhenGiven) {
  for (const int64_t v : {0, -1}) {
    json j = k3_config();
    j["text_config"]["max_position_embeddings"] = v;
    EXPECT_HAS(parse_err(j), "text_config.max_position_embeddings: is " + std::to_string(v) +
                                 ", must be >= 1");
  }
  json j = k3_config();
  j["text_config"]["max_position_embeddings"] = nullptr;  // null: not stated
  EXPECT_FALSE(parse_ok(j).max_position_embeddings.has_value());
}

TEST(Config, ResavedHeadDimIsNotTheKdaHeadDim) {
  json j = k3_config();
  j["text_config"]["head_dim"] = 74;  // transformers adds floor(7168/96) on load
  EXPECT_EQ(parse_ok(j).kda_head_dim, 128);

  // Without the linear_attn_config value the bogus one must not be used as a fallback.
  j["text_config"]["linear_attn_config"].erase("head_dim");
  const std::string m = parse_err(j);
  EXPECT_HAS(m, "config.json: text_config.linear_attn_config.head_dim: missing (required; never defaulted)");
}

TEST(Config, NestedReadsKdaFieldsOnlyFromLinearAttnConfig) {
  json j = k3_config();
  auto& lac = j["text_config"]["linear_attn_config"];
  j["text_config"]["full_attn_layers"] = lac["full_attn_layers"];  // wrong object
  j["text_config"]["kda_num_heads"] = 96;                           // flat alias, wrong shape
  lac.erase("full_attn_layers");
  lac.erase("num_heads");
  const std::string m = parse_err(j);
  EXPECT_HAS(m, "text_config.linear_attn_config.full_attn_layers: missing (required; never defaulted)");
  EXPECT_HAS(m, "text_config.linear_attn_config.num_heads: missing");
  EXPECT_EQ(problem_lines(m), 2u);
}

TEST(Config, NestedModelFieldsAreNotReadFromTheRoot) {
  json j = k3_config();
  j["hidden_size"] = 7168;
  j["text_config"].erase("hidden_size");
  EXPECT_HAS(parse_err(j), "text_config.hidden_size: missing");
}

TEST(Config, NestedNeedsLinearAttnConfigObject) {
  json j = k3_config();
  j["text_config"]["linear_attn_config"] = "none";
  EXPECT_HAS(parse_err(j), "text_config.linear_attn_config: expected an object");
  j["text_config"].erase("linear_attn_config");
  EXPECT_HAS(parse_err(j), "text_config.linear_attn_config: missing");
  j = k3_config();
  j["text_config"] = 5;
  EXPECT_HAS(parse_err(j), "text_config: expected an object");
  // Only an object member makes the shape nested (§2.1): a null one is absent.
  json flat = manifest_config();
  ASSERT_FALSE(flat.contains("text_config"));
  const ModelConfig without = parse_ok(flat);
  flat["text_config"] = nullptr;
  const ModelConfig with_null = parse_ok(flat);
  EXPECT_EQ(with_null.shape, ConfigShape::kFlat);
  EXPECT_EQ(with_null.hidden_size, without.hidden_size);
  EXPECT_EQ(with_null.kda_layers, without.kda_layers);
  EXPECT_HAS(parse_err(json::array()), "expected a JSON object at the root");
}

// ---- rule 2: presence and types, all reported together -------------------------------------------

TEST(Config, MistypedFieldsAreAllReported) {
  json j = k3_config();
  auto& t = j["text_config"];
  t["hidden_size"] = "7168";
  t["rms_norm_eps"] = "1e-5";
  t["mla_use_output_gate"] = 1;
  t["num_experts"] = 896.0;
  t["linear_attn_config"]["full_attn_layers"] = {4, "8"};
  t["linear_attn_config"]["gate_lower_bound"] = false;
  const std::string m = parse_err(j);
  EXPECT_HAS(m, "6 problems");
  EXPECT_HAS(m, "text_config.hidden_size: expected an integer, got string");
  EXPECT_HAS(m, "text_config.rms_norm_eps: expected a number");
  EXPECT_HAS(m, "text_config.mla_use_output_gate: expected true or false");
  EXPECT_HAS(m, "text_config.num_experts: expected an integer, got number 896.0");
  EXPECT_HAS(m, "text_config.linear_attn_config.full_attn_layers[1]: expected an integer");
  EXPECT_HAS(m, "text_config.linear_attn_config.gate_lower_bound: expected a number");
  EXPECT_EQ(problem_lines(m), 6u);
}

// Another family's config (here DeepSeek V3's fields) fails on K3's required fields; the
// message says first that it is not a K3 config. model_type alone decides nothing.
TEST(Config, AnotherModelTypeIsNamedBeforeItsProblems) {
  const json ds = {{"architectures", {"DeepseekV3ForCausalLM"}}, {"model_type", "deepseek_v3"},
                   {"hidden_size", 7168}, {"num_hidden_layers", 61}, {"vocab_size", 129280},
                   {"n_routed_experts", 256}, {"rms_norm_eps", 1e-6}};
  const std::string m = parse_err(ds);
  EXPECT_EQ(m.rfind("config.json: model_type is \"deepseek_v3\" (DeepseekV3ForCausalLM), not "
                    "Kimi K3's", 0), 0u) << m;
  EXPECT_HAS(m, "num_experts: missing at the root");

  json nested = k3_config();
  nested["text_config"]["model_type"] = "qwen3_moe";
  nested["text_config"].erase("num_experts");
  const std::string one = parse_err(nested);
  EXPECT_HAS(one, "config.json: text_config.model_type is \"qwen3_moe\"");
  EXPECT_HAS(one, "1 problem:\n  config.json: text_config.num_experts: missing");

  // K3's own model_type adds nothing; an unknown one on an otherwise valid config still loads.
  json k3 = k3_config();
  k3["text_config"].erase("num_experts");
  EXPECT_EQ(parse_err(k3).find("model_type"), std::string::npos);
  json renamed = k3_config();
  renamed["model_type"] = "kimi_k3_resaved";
  EXPECT_EQ(parse_ok(renamed).num_experts, 896);
}

TEST(Config, MissingFieldsAreAllReportedWithoutDefaults) {
  json j = manifest_config();
  for (const char* k : {"mla_use_output_gate", "moe_renormalize", "latent_moe_use_norm",
                        "gate_lower_bound", "routed_scaling_factor"})
    j.erase(k);
  const std::string m = parse_err(j);
  EXPECT_EQ(problem_lines(m), 5u);
  for (const char* k : {"mla_use_output_gate", "moe_renormalize", "latent_moe_use_norm",
                        "gate_lower_bound", "routed_scaling_factor"})
    EXPECT_HAS(m, std::string("config.json: ") + k + ": missing at the root (required; never defaulted)");
}

TEST(Config, NullRanksAreRefusedWithAReason) {
  json j = k3_config();
  j["text_config"]["q_lora_rank"] = nullptr;
  j["text_config"]["routed_expert_hidden_size"] = nullptr;
  const std::string m = parse_err(j);
  EXPECT_HAS(m, "text_config.q_lora_rank: null (no query compression)");
  EXPECT_HAS(m, "text_config.routed_expert_hidden_size: null (not a latent MoE)");
}

TEST(Config, IntermediateSizeOnlyRequiredWithDenseLayers) {
  json j = manifest_config();
  j.erase("intermediate_size");
  EXPECT_HAS(parse_err(j), "intermediate_size: missing");
  j["first_k_dense_replace"] = 0;
  const ModelConfig c = parse_ok(j);
  EXPECT_EQ(c.num_dense_layers(), 0);
  EXPECT_EQ(c.intermediate_size, 0);
}

// ---- flat aliases ----------------------------------------------------------------------------------

TEST(Config, FlatBareHeadFieldsAreNotRead) {
  json j = manifest_config();
  j["head_dim"] = j["kda_head_dim"];
  j.erase("kda_head_dim");
  const std::string m = parse_err(j);
  EXPECT_HAS(m, "kda_head_dim: missing at the root");
  EXPECT_HAS(m, "a bare 'head_dim' at a flat root is ambiguous and is not read");
}

TEST(Config, FlatRejectsLinearAttnConfig) {
  json j = manifest_config();
  j["linear_attn_config"] = {{"num_heads", 4}};
  EXPECT_HAS(parse_err(j), "linear_attn_config: not allowed in the flat shape");
}

TEST(Config, BetaSpellings) {
  json j = manifest_config();
  j["activation_situ_beta"] = 4.0;  // both spellings, agreeing
  EXPECT_EQ(parse_ok(j).situ_beta, 4.0);
  j["activation_situ_beta"] = 5.0;  // disagreeing
  EXPECT_HAS(parse_err(j), "activation_situ_beta: disagrees with its alias 'situ_beta'");

  j = manifest_config();
  j["activation_situ_linear_beta"] = j["situ_linear_beta"];
  j.erase("situ_linear_beta");
  EXPECT_EQ(*parse_ok(j).situ_linear_beta, 25.0);

  j = manifest_config();
  j["situ_linear_beta"] = nullptr;  // explicit null: no cap on the up branch
  EXPECT_FALSE(parse_ok(j).situ_linear_beta.has_value());
  j["situ_beta"] = nullptr;  // beta_1 has no such option
  EXPECT_HAS(parse_err(j), "situ_beta: null, expected a number");
}

TEST(Config, MissingBetas) {
  json j = manifest_config();
  j.erase("situ_beta");
  j.erase("situ_linear_beta");
  std::string m = parse_err(j);
  EXPECT_HAS(m, "activation_situ_beta: missing at the root (required; never defaulted; the flat alias 'situ_beta' is also accepted)");
  EXPECT_HAS(m, "activation_situ_linear_beta: missing at the root");
  EXPECT_EQ(problem_lines(m), 2u);

  json k = k3_config();
  k["text_config"].erase("activation_situ_linear_beta");
  k["text_config"]["situ_linear_beta"] = 25.0;  // flat alias: not read in the nested shape
  m = parse_err(k);
  EXPECT_HAS(m, "text_config.activation_situ_linear_beta: missing (required; never defaulted)");
  k["text_config"]["activation_situ_linear_beta"] = nullptr;
  EXPECT_FALSE(parse_ok(k).situ_linear_beta.has_value());
}

// ---- rules 3-6 ---------------------------------------------------------------------------------------

TEST(Config, ValueRanges) {
  json j = manifest_config();
  j["hidden_size"] = 0;
  j["rms_norm_eps"] = 0.0;
  j["gate_lower_bound"] = 0.5;
  j["situ_beta"] = -1.0;
  j["routed_scaling_factor"] = 0;
  j["first_k_dense_replace"] = 14;
  j["num_shared_experts"] = -1;
  j["attn_res_block_size"] = 0;
  const std::string m = parse_err(j);
  EXPECT_HAS(m, "hidden_size: is 0, must be >= 1");
  EXPECT_HAS(m, "rms_norm_eps: is 0, must be finite and > 0");
  EXPECT_HAS(m, "gate_lower_bound: is 0.5, must be finite and < 0");
  EXPECT_HAS(m, "situ_beta: is -1, must be finite and > 0");
  EXPECT_HAS(m, "routed_scaling_factor: is 0, must be finite and > 0");
  EXPECT_HAS(m, "first_k_dense_replace: is 14, must be in 0..num_hidden_layers (13)");
  EXPECT_HAS(m, "num_shared_experts: is -1, must be >= 0");
  EXPECT_HAS(m, "attn_res_block_size: is 0, must be >= 1");
  EXPECT_EQ(problem_lines(m), 8u);

  j = manifest_config();
  // JSON text cannot spell inf (nlohmann refuses 1e999), but an in-memory config can hold it.
  j["rms_norm_eps"] = std::numeric_limits<double>::infinity();
  EXPECT_HAS(parse_err(j), "rms_norm_eps: is inf, must be finite and > 0");
  // Finite doubles the kernels' 32-bit floats cannot hold (inf or 0 there): refused too.
  j = manifest_config();
  j["rms_norm_eps"] = 1e300;
  j["gate_lower_bound"] = -1e-50;
  j["routed_scaling_factor"] = 4e38;
  const std::string f = parse_err(j);
  EXPECT_HAS(f, "rms_norm_eps: is 1e+300, outside what a 32-bit float holds (it would be inf");
  EXPECT_HAS(f, "gate_lower_bound: is -1e-50, outside what a 32-bit float holds (it would be 0)");
  EXPECT_HAS(f, "routed_scaling_factor: is 4e+38, outside what a 32-bit");
  EXPECT_EQ(problem_lines(f), 3u);
  j = manifest_config();
  j["gate_lower_bound"] = -3.4028235e38;  // FLT_MAX as usually printed: rounds to it
  j["rms_norm_eps"] = 1e-40;              // a denormal float, not 0
  EXPECT_NO_FATAL_FAILURE(parse_ok(j));
}

TEST(Config, LayerListRules) {
  json j = manifest_config();
  j["full_attn_layers"] = {4, 4, 0, 13};
  std::string m = parse_err(j);
  EXPECT_HAS(m, "entry [1] = 4 is a duplicate");
  EXPECT_HAS(m, "entry [2] = 0 is outside 1..13 (the list is 1-based");

  j["full_attn_layers"] = json::array();
  EXPECT_HAS(parse_err(j), "full_attn_layers: is empty");

  json all = json::array();
  for (int l = 1; l <= 13; ++l) all.push_back(l);
  j["full_attn_layers"] = all;
  EXPECT_HAS(parse_err(j), "at least one layer must be KDA");

  // A long list of wrong entries: every one counted, the first 25 shown.
  j["full_attn_layers"] = json(std::vector<int>(1000, 0));
  m = parse_err(j);
  EXPECT_EQ(problem_lines(m), 26u) << m;  // 25 and the count of the rest
  EXPECT_HAS(m, "1999 problems:");        // each 0 is out of range, the 999 after it repeats
  EXPECT_HAS(m, "\n  (and 1974 more)");
}

TEST(Config, KdaLayersCrossCheck) {
  json j = k3_config();
  auto& lac = j["text_config"]["linear_attn_config"];
  EXPECT_TRUE(parse_ok(j).kda_layers.has_value());

  lac["kda_layers"].push_back(4);  // also MLA
  EXPECT_HAS(parse_err(j), "text_config.linear_attn_config.kda_layers: entry [69] = 4 is also in full_attn_layers");

  j = k3_config();
  j["text_config"]["linear_attn_config"]["kda_layers"].erase(0);  // layer 1 now in neither list
  EXPECT_HAS(parse_err(j), "kda_layers: together with full_attn_layers does not cover 1..93 (missing 1)");

  j = k3_config();
  j["text_config"]["linear_attn_config"]["kda_layers"].push_back(94);
  EXPECT_HAS(parse_err(j), "entry [69] = 94 is outside 1..93");

  j = k3_config();
  auto& kda = j["text_config"]["linear_attn_config"]["kda_layers"];
  kda.push_back(kda[2]);
  EXPECT_HAS(parse_err(j), "kda_layers: entry [69] = " + kda[2].dump() + " is a duplicate");
}

TEST(Config, TopKBounds) {
  json j = manifest_config();
  j["num_experts_per_token"] = 0;
  EXPECT_HAS(parse_err(j), "num_experts_per_token: is 0, must be >= 1");
  j["num_experts"] = 200;
  j["num_experts_per_token"] = kMaxTopK + 1;
  const std::string m = parse_err(j);
  EXPECT_HAS(m, "larger than ktier's top-k bound 64");
  EXPECT_EQ(problem_lines(m), 1u);
  j["num_experts_per_token"] = kMaxTopK;
  EXPECT_EQ(parse_ok(j).num_experts_per_token, 64);
}

// ---- rule 7: quantization_config ------------------------------------------------------------------

TEST(Config, QuantizationConfigMustBeMxfp4) {
  json j = k3_config();
  auto& q = j["text_config"]["quantization_config"];
  q["format"] = "nvfp4-pack-quantized";
  q["config_groups"]["group_0"]["weights"]["num_bits"] = 8;
  q["config_groups"]["group_0"]["weights"]["group_size"] = 16;
  q["config_groups"]["group_0"]["weights"]["symmetric"] = false;
  q["config_groups"]["group_0"]["weights"]["type"] = "int";
  const std::string m = parse_err(j);
  EXPECT_HAS(m, "text_config.quantization_config.format: is \"nvfp4-pack-quantized\" but ktier accepts only \"mxfp4-pack-quantized\"");
  EXPECT_HAS(m, "text_config.quantization_config.config_groups.group_0.weights.num_bits: is 8 but ktier accepts only 4");
  EXPECT_HAS(m, "weights.group_size: is 16 but ktier accepts only 32");
  EXPECT_HAS(m, "weights.symmetric: is false");
  EXPECT_HAS(m, "weights.type: is \"int\" but ktier accepts only \"float\"");
  EXPECT_EQ(problem_lines(m), 5u);

  j = k3_config();
  j["text_config"]["quantization_config"]["quant_method"] = "awq";
  EXPECT_HAS(parse_err(j), "quant_method: is \"awq\"");
  j = k3_config();
  j["text_config"]["quantization_config"]["config_groups"]["group_1"] = {{"weights", {}}};
  EXPECT_HAS(parse_err(j), "config_groups: expected an object with exactly one weight group");
}

// A key given twice counts with its last value, as Python's json module (transformers) reads it.
TEST(Config, AKeyGivenTwiceCountsWithItsLastValue) {
  std::string text = k3_config().dump();
  const std::string key = "\"hidden_size\":7168";
  const size_t at = text.find(key);
  ASSERT_NE(at, std::string::npos) << text.substr(0, 200);
  text.insert(at, "\"hidden_size\":12345,");
  auto c = parse_model_config_text(text, "config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->hidden_size, 7168);
}

// strategy, dynamic and input/output_activations may be left out (older compressed-tensors
// configs), but when given they must describe weight-only, per-group, stored scales.
TEST(Config, QuantizationSchemeDetailsWhenGiven) {
  json j = k3_config();
  auto& w = j["text_config"]["quantization_config"]["config_groups"]["group_0"];
  w["weights"].erase("strategy");
  w["weights"].erase("dynamic");
  w.erase("input_activations");
  EXPECT_EQ(parse_ok(j).quantization->strategy, "");
  EXPECT_EQ(parse_ok(k3_config()).quantization->strategy, "group");
  const std::string g = "text_config.quantization_config.config_groups.group_0.";
  j = k3_config();
  auto& q = j["text_config"]["quantization_config"]["config_groups"]["group_0"];
  q["weights"]["strategy"] = "tensor";
  q["weights"]["dynamic"] = true;
  q["input_activations"] = {{"num_bits", 8}, {"type", "float"}};
  q["output_activations"] = {{"num_bits", 8}};
  const std::string m = parse_err(j);
  EXPECT_HAS(m, g + "weights.strategy: is \"tensor\" but ktier accepts only \"group\"");
  EXPECT_HAS(m, g + "weights.dynamic: is true but ktier accepts only false");
  EXPECT_HAS(m, g + "input_activations: is object {");
  EXPECT_HAS(m, g + "output_activations: is object {");
  EXPECT_HAS(m, "ktier quantizes weights only");
  EXPECT_EQ(problem_lines(m), 4u);
  // A quantized KV cache likewise (null, as released, is fine).
  j = k3_config();
  j["text_config"]["quantization_config"]["kv_cache_scheme"] = nullptr;
  parse_ok(j);
  j["text_config"]["quantization_config"]["kv_cache_scheme"] = {{"num_bits", 8}};
  EXPECT_HAS(parse_err(j), "text_config.quantization_config.kv_cache_scheme: is object {");
  EXPECT_HAS(parse_err(j), "ktier keeps the caches unquantized (expected null)");
}

TEST(Config, QuantizationConfigAtTheRootOfAResavedConfig) {
  json j = k3_config();
  j["quantization_config"] = j["text_config"]["quantization_config"];
  j["text_config"].erase("quantization_config");
  const ModelConfig c = parse_ok(j);
  ASSERT_TRUE(c.quantization.has_value());
  EXPECT_EQ(c.quantization->found_in, "quantization_config");
  // The text_config copy wins when both exist (D9): a bad root copy is then not read.
  json both = k3_config();
  both["quantization_config"] = {{"quant_method", "awq"}};
  EXPECT_EQ(parse_ok(both).quantization->found_in, "text_config.quantization_config");
}

// ---- rule 8: guard fields -----------------------------------------------------------------------

TEST(Config, GuardFieldViolations) {
  json j = k3_config();
  auto& t = j["text_config"];
  t["hidden_act"] = "silu";
  t["mla_use_nope"] = false;
  t["moe_router_activation_func"] = "softmax";
  t["topk_method"] = "greedy";
  t["num_expert_group"] = 8;
  t["topk_group"] = 4;
  t["moe_layer_freq"] = 2;
  t["linear_attn_config"]["use_full_rank_gate"] = false;
  t["tie_word_embeddings"] = true;
  j["tie_word_embeddings"] = true;
  const std::string m = parse_err(j);
  EXPECT_EQ(problem_lines(m), 10u);
  EXPECT_HAS(m, "text_config.hidden_act: is \"silu\" but ktier implements only \"situ\"");
  EXPECT_HAS(m, "text_config.mla_use_nope: is false");
  EXPECT_HAS(m, "text_config.moe_router_activation_func: is \"softmax\"");
  EXPECT_HAS(m, "text_config.topk_method: is \"greedy\" but ktier implements only \"noaux_tc\"");
  EXPECT_HAS(m, "text_config.num_expert_group: is 8");
  EXPECT_HAS(m, "text_config.topk_group: is 4");
  EXPECT_HAS(m, "text_config.moe_layer_freq: is 2");
  EXPECT_HAS(m, "text_config.linear_attn_config.use_full_rank_gate: is false");
  EXPECT_HAS(m, "config.json: tie_word_embeddings: is true");
  EXPECT_HAS(m, "text_config.tie_word_embeddings: is true");
}

TEST(Config, GuardFieldsAbsentOrAcceptedValues) {
  json j = k3_config();
  j["text_config"]["num_expert_group"] = nullptr;
  j["text_config"]["topk_group"] = nullptr;
  j["text_config"]["num_nextn_predict_layers"] = 1;  // logged and ignored
  EXPECT_EQ(parse_ok(j).num_nextn_predict_layers, 1);
  j["text_config"]["num_nextn_predict_layers"] = -1;
  EXPECT_HAS(parse_err(j), "num_nextn_predict_layers: is -1, must be >= 0");
  // The flat test shape carries no guard fields at all (the manifest has only tie=false).
  json flat = manifest_config();
  flat["tie_word_embeddings"] = true;
  EXPECT_HAS(parse_err(flat), "tie_word_embeddings: is true");
}

// ---- token ids and files ---------------------------------------------------------------------------

TEST(Config, EosIds) {
  json j = k3_config();
  j["eos_token_id"] = {163586, 163585};
  EXPECT_EQ(parse_ok(j).eos_token_ids, (std::vector<int64_t>{163586, 163585}));
  j.erase("eos_token_id");  // falls back to text_config
  j["text_config"]["eos_token_id"] = 7;
  EXPECT_EQ(parse_ok(j).eos_token_ids, (std::vector<int64_t>{7}));
  j["eos_token_id"] = "x";
  EXPECT_HAS(parse_err(j), "config.json: eos_token_id: expected an integer, got string");
  const int64_t V = parse_ok(k3_config()).vocab_size;
  j["eos_token_id"] = V;  // one past the last id
  EXPECT_HAS(parse_err(j), "config.json: eos_token_id: id " + std::to_string(V) +
                               " is outside the vocabulary (0.." + std::to_string(V - 1) + ")");
  j["eos_token_id"] = {163586, -1};
  EXPECT_HAS(parse_err(j), "id -1 is outside the vocabulary");
  j["eos_token_id"] = V - 1;
  EXPECT_EQ(parse_ok(j).eos_token_ids, (std::vector<int64_t>{V - 1}));
  j["eos_token_id"] = {163586, 163585, 163586, 163585};  // each id once, in order
  EXPECT_EQ(parse_ok(j).eos_token_ids, (std::vector<int64_t>{163586, 163585}));
}

// D3: the stop ids are config.json's and generation_config.json's together (each id once, the
// config's first); that file is optional, and a bad one is refused naming it.
TEST(Config, GenerationConfigStopIdsAreAdded) {
  ktier::test::TempDir dir("genconfig");
  json j = k3_config();
  j["eos_token_id"] = 163586;
  ktier::test::write_text(dir.path() / "config.json", j.dump());
  const fs::path cfg = dir.path() / "config.json", gen = dir.path() / "generation_config.json";
  auto alone = load_model_config(cfg);
  ASSERT_TRUE(alone.is_ok()) << alone.status().message();
  EXPECT_EQ(alone->eos_token_ids, (std::vector<int64_t>{163586}));
  ktier::test::write_text(gen, R"({"eos_token_id": [163585, 163586], "temperature": 1.0})");
  auto both = load_model_config(cfg);
  ASSERT_TRUE(both.is_ok()) << both.status().message();
  EXPECT_EQ(both->eos_token_ids, (std::vector<int64_t>{163586, 163585}));
  ktier::test::write_text(gen, R"({"eos_token_id": null})");
  EXPECT_EQ(load_model_config(cfg)->eos_token_ids, (std::vector<int64_t>{163586}));
  const std::pair<std::string, std::string> bad[] = {
      {R"({"eos_token_id": "163585"})", "generation_config.json: eos_token_id: expected an "
                                        "integer or a list of integers, got string"},
      {R"({"eos_token_id": [1, 2.5]})",
       "expected an integer or a list of integers, got number in the list"},
      {R"({"eos_token_id": [1, "x"]})", "list of integers, got string in the list"},
      {R"({"eos_token_id": 18446744073709551615})",
       "list of integers, got integer 18446744073709551615, out of range"},
      {R"({"eos_token_id": 999999999})", "generation_config.json: eos_token_id: id 999999999 "
                                         "is outside the vocabulary"},
      {R"({"eos_token_id": 1,)", "generation_config.json: not valid JSON: "},
      {"[1]", "generation_config.json: not a JSON object (its top level is array)"},
      {std::string(70, '['), "generation_config.json: nested deeper than 64 levels"}};
  for (const auto& [text, said] : bad) {
    ktier::test::write_text(gen, text);
    const auto r = load_model_config(cfg);
    ASSERT_FALSE(r.is_ok()) << text;
    EXPECT_EQ(r.status().exit_code(), 2) << text;
    EXPECT_HAS(r.status().message(), said);
  }
}

TEST(Config, LoadFromFileErrors) {
  ktier::test::TempDir dir("config");
  auto missing = load_model_config(dir.path() / "config.json");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().exit_code(), 2);
  EXPECT_HAS(missing.status().message(), "config.json: not found");

  ktier::test::write_text(dir.path() / "config.json", "{\"hidden_size\": 12,");
  auto bad = load_model_config(dir.path() / "config.json");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().exit_code(), 2);
  EXPECT_HAS(bad.status().message(), "config.json: not valid JSON: ");
  EXPECT_HAS(bad.status().message(), "parse error") << "the parser's account of where";
  // Nested far past any config: dumping the refused value recursed until the stack overflowed.
  for (const std::string& deep :
       {std::string(100000, '[') + std::string(100000, ']'),
        "{\"text_config\": {\"hidden_size\": " + std::string(100000, '[') +
            std::string(100000, ']') + "}}"}) {
    ktier::test::write_text(dir.path() / "config.json", deep);
    auto refused = load_model_config(dir.path() / "config.json");
    ASSERT_FALSE(refused.is_ok());
    EXPECT_EQ(refused.status().exit_code(), 2);
    EXPECT_HAS(refused.status().message(),
               "config.json: nested deeper than 64 levels");
  }
  // A NUL ends nlohmann's input: what follows it (here a second object) went unread.
  ktier::test::write_text(dir.path() / "config.json",
                          k3_config().dump() + std::string(1, '\0') + "{\"hidden_size\": 12}");
  auto nul = load_model_config(dir.path() / "config.json");
  ASSERT_FALSE(nul.is_ok());
  EXPECT_EQ(nul.status().exit_code(), 2);
  EXPECT_HAS(nul.status().message(), "config.json: not valid JSON: it holds a NUL byte at byte");

  // Past kConfigJsonLimit: refused by its size, unread (the error would say where the JSON
  // failed if it were read).
  ktier::test::write_text(dir.path() / "config.json",
                          std::string(kConfigJsonLimit.bytes + 1, ' ') + "{");
  auto huge = load_model_config(dir.path() / "config.json");
  ASSERT_FALSE(huge.is_ok());
  EXPECT_EQ(huge.status().exit_code(), 2);
  EXPECT_HAS(huge.status().message(),
             "config.json: " + std::to_string(kConfigJsonLimit.bytes + 2) +
                 " bytes, more than the " + std::to_string(kConfigJsonLimit.bytes) +
                 " bytes a file of its kind may hold");

  ktier::test::write_text(dir.path() / "config.json", k3_config().dump());
  auto good = load_model_config(dir.path() / "config.json");
  ASSERT_TRUE(good.is_ok()) << good.status().message();
  EXPECT_EQ(good->source, (dir.path() / "config.json").string());
}

}  // namespace
}  // namespace ktier::format
