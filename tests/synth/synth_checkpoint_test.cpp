// `ktier synth` end to end: the tiny preset written to disk and read back independently of the
// engine's reader (file set, shard names and contents, index, config, tokenizer files, MXFP4
// bytes, determinism), plus the engine's own loader (Checkpoint::open, `ktier inspect`) and the
// command line (refusal to overwrite, shape flags).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/dtype.h"
#include "common/run_process.h"
#include "format/checkpoint.h"
#include "synth/plan.h"
#include "synth/synth.h"
#include "synth/synth_test_util.h"
#include "synth/tokenizer_gen.h"
#include "synth/values.h"
#include "common/test_paths.h"

namespace ktier::synth {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

SynthOptions tiny_options(const fs::path& dir, uint64_t seed, ExpertFormat experts = ExpertFormat::kMxfp4) {
  SynthOptions o;
  o.preset = "tiny";
  o.out_dir = dir;
  o.seed = seed;
  o.experts = experts;
  o.threads = 2;
  return o;
}

// One tiny checkpoint per variant, written once for the whole suite.
class SynthTiny : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new test::TempDir("tiny");
    for (auto [name, fmt] : {std::pair{"mxfp4", ExpertFormat::kMxfp4}, std::pair{"f32", ExpertFormat::kF32},
                             std::pair{"bf16", ExpertFormat::kBF16}}) {
      auto r = run_synth(tiny_options(root_->path() / name, 7, fmt));
      ASSERT_TRUE(r.is_ok()) << r.status().message();
    }
  }
  static void TearDownTestSuite() {
    delete root_;
    root_ = nullptr;
  }
  static fs::path dir(const char* variant) { return root_->path() / variant; }
  static json load_json(const fs::path& p) { return json::parse(test::read_file(p)); }

  static test::TempDir* root_;
};
test::TempDir* SynthTiny::root_ = nullptr;

const SynthShape& tiny() {
  static const SynthShape s = *preset_shape("tiny");
  return s;
}

TEST_F(SynthTiny, FileSetIsTheReleasedLayout) {
  // (.ktier-synth: the marker that lets --force replace this checkpoint, not a release file.)
  std::vector<std::string> want = {".ktier-synth", "config.json", "generation_config.json",
                                   "model.safetensors.index.json", "tiktoken.model",
                                   "tokenizer_config.json"};
  for (int k = 1; k <= 14; ++k) want.push_back(shard_file_name(k, 14));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(test::list_dir(dir("mxfp4")), want);  // nothing else: no .partial / .tmp left
  EXPECT_EQ(shard_file_name(3, 14), "model-00003-of-000014.safetensors");
}

TEST_F(SynthTiny, IndexMapsEveryTensorToItsShardWithExactTotal) {
  const json index = load_json(dir("mxfp4") / "model.safetensors.index.json");
  ASSERT_EQ(index.size(), 2u);
  const json& map = index.at("weight_map");
  uint64_t total = 0;
  size_t tensors = 0;
  for (int k = 1; k <= 14; ++k) {
    const std::string file = shard_file_name(k, 14);
    const test::RawShard s = test::read_raw_shard(dir("mxfp4") / file);
    for (const auto& t : s.tensors) {
      EXPECT_EQ(map.at(t.name).get<std::string>(), file) << t.name;
      total += t.end - t.begin;
      ++tensors;
    }
    EXPECT_EQ(s.file_size, 8 + s.header_len + s.tensors.back().end) << file;
  }
  EXPECT_EQ(map.size(), tensors);
  EXPECT_EQ(index.at("metadata").at("total_size").get<uint64_t>(), total);
}

TEST_F(SynthTiny, ShardsHoldOneLayerEachInReleasedOrderAndDtypes) {
  const SynthShape& s = tiny();
  for (int k = 1; k <= 14; ++k) {
    const test::RawShard sh = test::read_raw_shard(dir("mxfp4") / shard_file_name(k, 14));
    EXPECT_EQ(sh.header_len % 8, 0u);
    EXPECT_FALSE(sh.has_metadata);
    uint64_t next = 0;
    bool in_experts = false;
    std::vector<std::string> trunk_names, expert_names;
    std::vector<std::pair<bool, std::string>> trunk_order;  // (not F32, name)
    for (const auto& t : sh.tensors) {
      EXPECT_EQ(t.begin, next) << t.name;  // back to back, no gaps
      next = t.end;
      const bool expert = t.name.find(".experts.") != std::string::npos;
      EXPECT_TRUE(!in_experts || expert) << "trunk tensor after the experts: " << t.name;
      in_experts = in_experts || expert;
      (expert ? expert_names : trunk_names).push_back(t.name);
      // Released dtypes (K3-MODEL.md §5).
      const bool f32 = t.name.find("conv1d") != std::string::npos || t.name.ends_with("A_log") ||
                       t.name.ends_with("dt_bias") || t.name.ends_with("o_norm.weight") ||
                       t.name.ends_with("e_score_correction_bias");
      EXPECT_EQ(t.dtype, expert ? "U8" : (f32 ? "F32" : "BF16")) << t.name;
      if (!expert) trunk_order.emplace_back(t.dtype != "F32", t.name);
    }
    if (k == 14) {
      EXPECT_EQ(trunk_names, (std::vector<std::string>{
                                 "language_model.lm_head.weight", "language_model.model.embed_tokens.weight",
                                 "language_model.model.norm.weight", "language_model.model.output_attn_res_norm.weight",
                                 "language_model.model.output_attn_res_proj.weight"}));
      continue;
    }
    const int64_t l = k - 1;
    const std::string prefix = "language_model.model.layers." + std::to_string(l) + ".";
    for (const auto& n : trunk_names) EXPECT_EQ(n.rfind(prefix, 0), 0u) << n;
    // Trunk: F32 first, then BF16, each alphabetical (the release writer's order).
    EXPECT_TRUE(std::is_sorted(trunk_order.begin(), trunk_order.end())) << "shard " << k;
    const size_t want_trunk = 6 + (s.is_mla(l) ? 8 : 14) + (s.is_dense(l) ? 3 : 8);
    EXPECT_EQ(trunk_names.size(), want_trunk) << "layer " << l;
    // Experts: lexicographic order of names, each one six contiguous tensors in release order.
    EXPECT_EQ(expert_names.size(), s.is_dense(l) ? 0u : static_cast<size_t>(s.experts * 6));
    EXPECT_TRUE(std::is_sorted(expert_names.begin(), expert_names.end()));
    const char* parts[] = {"w1.weight_packed", "w1.weight_scale", "w2.weight_packed",
                           "w2.weight_scale",  "w3.weight_packed", "w3.weight_scale"};
    for (size_t i = 0; i < expert_names.size(); ++i) EXPECT_TRUE(expert_names[i].ends_with(parts[i % 6])) << expert_names[i];
  }
  // Shapes of the accepted-variant tensors (§5.10): A_log stored with D elements and a zero tail.
  const test::RawShard l0 = test::read_raw_shard(dir("mxfp4") / shard_file_name(1, 14));
  for (const auto& t : l0.tensors) {
    if (t.name.ends_with("A_log")) {
      EXPECT_EQ(t.shape, (std::vector<int64_t>{16}));
      const auto bytes = test::read_range(dir("mxfp4") / shard_file_name(1, 14), l0.data_offset() + t.begin, 64);
      float a[16];
      std::memcpy(a, bytes.data(), 64);
      EXPECT_FLOAT_EQ(a[0], -0.4f);
      EXPECT_FLOAT_EQ(a[3], 1.2f);
      for (int i = 4; i < 16; ++i) EXPECT_EQ(f32_to_bits(a[i]), 0u);
    }
    if (t.name.ends_with("q_conv1d.weight")) {
      EXPECT_EQ(t.shape, (std::vector<int64_t>{64, 1, 4}));
    }
    if (t.name.ends_with("self_attention_res_proj.weight")) {
      EXPECT_EQ(t.shape, (std::vector<int64_t>{1, 128}));
    }
  }
}

TEST_F(SynthTiny, ConfigIsTheNestedReleasedShape) {
  const json c = load_json(dir("mxfp4") / "config.json");
  EXPECT_EQ(c.at("model_type"), "kimi_k3");
  EXPECT_EQ(c.at("architectures"), json::array({"KimiK3ForConditionalGeneration"}));
  EXPECT_EQ(c.at("tie_word_embeddings"), false);
  const json& tc = c.at("text_config");
  const std::map<std::string, json> want = {
      {"model_type", "kimi_linear"}, {"hidden_size", 128}, {"num_hidden_layers", 13}, {"vocab_size", 320},
      {"num_attention_heads", 4}, {"q_lora_rank", 64}, {"kv_lora_rank", 32}, {"qk_nope_head_dim", 24},
      {"qk_rope_head_dim", 8}, {"v_head_dim", 16}, {"num_experts", 8}, {"num_experts_per_token", 2},
      {"num_shared_experts", 2}, {"routed_expert_hidden_size", 64}, {"moe_intermediate_size", 64},
      {"intermediate_size", 96}, {"attn_res_block_size", 3}, {"first_k_dense_replace", 1},
      {"mla_use_output_gate", true}, {"moe_renormalize", true}, {"latent_moe_use_norm", true},
      {"routed_scaling_factor", 1.0}, {"activation_situ_beta", 4.0}, {"activation_situ_linear_beta", 25.0},
      {"rms_norm_eps", 1e-5},
      // guard fields with their K3 values (§2.4)
      {"hidden_act", "situ"}, {"mla_use_nope", true}, {"moe_router_activation_func", "sigmoid"},
      {"num_expert_group", 1}, {"topk_group", 1}, {"moe_layer_freq", 1}, {"tie_word_embeddings", false},
      {"num_nextn_predict_layers", 0}};
  for (const auto& [k, v] : want) EXPECT_EQ(tc.at(k), v) << k;
  EXPECT_FALSE(tc.contains("head_dim"));
  EXPECT_FALSE(tc.contains("rope_theta"));
  const json& lac = tc.at("linear_attn_config");
  EXPECT_EQ(lac.at("full_attn_layers"), json({4, 8, 12, 13}));
  EXPECT_EQ(lac.at("kda_layers"), json({1, 2, 3, 5, 6, 7, 9, 10, 11}));
  EXPECT_EQ(lac.at("num_heads"), 4);
  EXPECT_EQ(lac.at("head_dim"), 16);
  EXPECT_EQ(lac.at("short_conv_kernel_size"), 4);
  EXPECT_EQ(lac.at("gate_lower_bound"), -5.0);
  EXPECT_EQ(lac.at("use_full_rank_gate"), true);
  const json& q = tc.at("quantization_config");
  EXPECT_EQ(q.at("quant_method"), "compressed-tensors");
  EXPECT_EQ(q.at("format"), "mxfp4-pack-quantized");
  const json& w = q.at("config_groups").at("group_0").at("weights");
  EXPECT_EQ(w.at("num_bits"), 4);
  EXPECT_EQ(w.at("type"), "float");
  EXPECT_EQ(w.at("strategy"), "group");
  EXPECT_EQ(w.at("group_size"), 32);
  EXPECT_EQ(w.at("symmetric"), true);
  EXPECT_EQ(q.at("ignore").size(), 6u);
  EXPECT_FALSE(c.contains("quantization_config"));  // inside text_config, as released
  EXPECT_FALSE(load_json(dir("f32") / "config.json").at("text_config").contains("quantization_config"));
  // Token ids point at the added tokens: bos [BOS], eos <|end_of_msg|> (D3), pad [PAD].
  const json tok = load_json(dir("mxfp4") / "tokenizer_config.json");
  const json& added = tok.at("added_tokens_decoder");
  auto name_of = [&](const json& id) { return added.at(std::to_string(id.get<int64_t>())).at("content").get<std::string>(); };
  EXPECT_EQ(name_of(c.at("bos_token_id")), "[BOS]");
  EXPECT_EQ(name_of(c.at("eos_token_id")), "<|end_of_msg|>");
  EXPECT_EQ(name_of(c.at("pad_token_id")), "[PAD]");
  EXPECT_EQ(load_json(dir("mxfp4") / "generation_config.json").at("eos_token_id"), c.at("eos_token_id"));
}

TEST_F(SynthTiny, TokenizerFilesCoverEveryId) {
  const std::string model = test::read_file(dir("mxfp4") / "tiktoken.model");
  std::istringstream in(model);
  std::string line;
  int64_t rank = 0;
  std::set<std::string> tokens;
  while (std::getline(in, line)) {
    const size_t sp = line.find(' ');
    ASSERT_NE(sp, std::string::npos);
    EXPECT_EQ(std::stoll(line.substr(sp + 1)), rank++);
    tokens.insert(line.substr(0, sp));
  }
  EXPECT_EQ(rank, 304);
  EXPECT_EQ(tokens.size(), 304u);  // unique byte strings
  const json added = load_json(dir("mxfp4") / "tokenizer_config.json").at("added_tokens_decoder");
  EXPECT_EQ(added.size(), 16u);
  for (int64_t id = 304; id < 320; ++id) EXPECT_TRUE(added.contains(std::to_string(id))) << id;
}

// Decodes every MXFP4 expert matrix of one layer (low nibble = even element) and compares it with
// the float values the generator drew for it.
TEST_F(SynthTiny, Mxfp4BytesDecodeBackToTheirSourceValues) {
  const SynthShape& s = tiny();
  const Plan plan = build_plan(s, ExpertFormat::kMxfp4, 7);
  const fs::path file = dir("mxfp4") / shard_file_name(3, 14);  // layer 2
  const test::RawShard sh = test::read_raw_shard(file);
  const auto& planned = plan.shards[2].tensors;
  double err_ok = 0, err_swapped = 0, norm = 0;
  for (size_t i = 0; i < sh.tensors.size(); ++i) {
    if (!sh.tensors[i].name.ends_with("weight_packed")) continue;
    const auto& packed_t = sh.tensors[i];
    const auto& scale_t = sh.tensors[i + 1];
    const PlannedTensor& p = planned[i];
    ASSERT_EQ(p.decl.name, packed_t.name);
    const int64_t rows = packed_t.shape[0], cols = packed_t.shape[1] * 2;
    ASSERT_EQ(scale_t.shape, (std::vector<int64_t>{rows, cols / 32}));
    const auto packed = test::read_range(file, sh.data_offset() + packed_t.begin, packed_t.end - packed_t.begin);
    const auto scales = test::read_range(file, sh.data_offset() + scale_t.begin, scale_t.end - scale_t.begin);
    std::vector<float> src(static_cast<size_t>(rows * cols));
    generate_values(p.values, 0, src.size(), src.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const uint8_t byte = packed[static_cast<size_t>(r * cols / 2 + c / 2)];
        const float unit = std::ldexp(1.0f, scales[static_cast<size_t>(r * cols / 32 + c / 32)] - 127);
        const float v = e2m1_value(c % 2 ? byte >> 4 : byte & 15) * unit;
        const float swapped = e2m1_value(c % 2 ? byte & 15 : byte >> 4) * unit;
        const float x = src[static_cast<size_t>(r * cols + c)];
        const float m = std::fabs(x) / unit;
        ASSERT_LE(std::fabs(v - x), (m < 2 ? 0.25f : m < 4 ? 0.5f : 1.0f) * unit) << packed_t.name << " [" << r << "," << c << "]";
        err_ok += (v - x) * (v - x);
        err_swapped += (swapped - x) * (swapped - x);
        norm += x * x;
      }
  }
  ASSERT_GT(norm, 0);
  EXPECT_LT(std::sqrt(err_ok / norm), 0.12);       // 4-bit rounding: ~8% relative RMS error
  EXPECT_GT(std::sqrt(err_swapped / norm), 1.0);  // nibble order matters
}

TEST_F(SynthTiny, FloatExpertsHoldTheDequantisedValuesAndNoPackedTensors) {
  const fs::path mx = dir("mxfp4"), f32 = dir("f32"), bf16 = dir("bf16");
  for (int k : {2, 13}) {
    const std::string file = shard_file_name(k, 14);
    const test::RawShard a = test::read_raw_shard(mx / file);
    const test::RawShard b = test::read_raw_shard(f32 / file);
    const test::RawShard c = test::read_raw_shard(bf16 / file);
    std::map<std::string, const test::RawTensor*> fb, fc;
    for (const auto& t : b.tensors) {
      EXPECT_EQ(t.name.find("weight_packed"), std::string::npos);
      EXPECT_EQ(t.name.find("weight_scale"), std::string::npos);
      fb[t.name] = &t;
    }
    for (const auto& t : c.tensors) fc[t.name] = &t;
    for (size_t i = 0; i < a.tensors.size(); ++i) {
      const auto& p = a.tensors[i];
      if (!p.name.ends_with(".weight_packed")) continue;
      const std::string plain = p.name.substr(0, p.name.size() - 7);  // "…w1.weight"
      const auto* tf = fb.at(plain);
      const auto* tb = fc.at(plain);
      const int64_t rows = p.shape[0], cols = p.shape[1] * 2;
      EXPECT_EQ(tf->dtype, "F32");
      EXPECT_EQ(tb->dtype, "BF16");
      EXPECT_EQ(tf->shape, (std::vector<int64_t>{rows, cols}));
      const auto packed = test::read_range(mx / file, a.data_offset() + p.begin, p.end - p.begin);
      const auto& s = a.tensors[i + 1];
      const auto scales = test::read_range(mx / file, a.data_offset() + s.begin, s.end - s.begin);
      const auto fbytes = test::read_range(f32 / file, b.data_offset() + tf->begin, tf->end - tf->begin);
      const auto bbytes = test::read_range(bf16 / file, c.data_offset() + tb->begin, tb->end - tb->begin);
      for (int64_t g = 0; g < rows * cols / 32; ++g) {
        float want[32];
        mxfp4_dequantize_group(&packed[static_cast<size_t>(g * 16)], scales[static_cast<size_t>(g)], want);
        for (int j = 0; j < 32; ++j) {
          float got_f;
          std::memcpy(&got_f, &fbytes[static_cast<size_t>((g * 32 + j) * 4)], 4);
          uint16_t got_b;
          std::memcpy(&got_b, &bbytes[static_cast<size_t>((g * 32 + j) * 2)], 2);
          ASSERT_EQ(f32_to_bits(got_f), f32_to_bits(want[j])) << plain;
          ASSERT_EQ(f32_to_bits(bf16_to_f32(got_b)), f32_to_bits(want[j])) << plain;
        }
      }
    }
  }
}

TEST_F(SynthTiny, SameSeedSameBytesOtherSeedOtherBytes) {
  test::TempDir again("again");
  SynthOptions o = tiny_options(again.path() / "same", 7);
  o.threads = 1;  // thread count must not matter
  ASSERT_TRUE(run_synth(o).is_ok());
  ASSERT_TRUE(run_synth(tiny_options(again.path() / "other", 8)).is_ok());
  for (const auto& name : test::list_dir(dir("mxfp4"))) {
    const std::string ref = test::read_file(dir("mxfp4") / name);
    EXPECT_EQ(test::read_file(again.path() / "same" / name), ref) << name;
    const bool weights = name.ends_with(".safetensors");
    EXPECT_EQ(test::read_file(again.path() / "other" / name) != ref, weights) << name;
  }
}

// --shapes-only writes what the full run writes, headers and sizes alike, with every data byte
// zero and the index saying so; Checkpoint::open takes it, and a command that opens it warns.
TEST_F(SynthTiny, ShapesOnlyHasTheLayoutWithZeroData) {
  test::TempDir shapes("shapes");
  SynthOptions o = tiny_options(shapes.path() / "ck", 7);
  o.shapes_only = true;
  const Result<SynthReport> r = run_synth(o);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_TRUE(r->routing.layers.empty()) << "no routing is measured over zeros";
  const std::vector<std::string> names = test::list_dir(dir("mxfp4"));
  EXPECT_EQ(test::list_dir(shapes.path() / "ck"), names);
  int shards = 0;
  for (const auto& name : names) {
    const std::string ref = test::read_file(dir("mxfp4") / name);
    const std::string got = test::read_file(shapes.path() / "ck" / name);
    if (name == "model.safetensors.index.json") {
      json marked = json::parse(got);
      EXPECT_EQ(marked["metadata"]["ktier_synth"], "shapes-only");
      marked["metadata"].erase("ktier_synth");
      EXPECT_EQ(marked, json::parse(ref)) << "the same index but for the mark";
      continue;
    }
    if (!name.ends_with(".safetensors")) {
      EXPECT_EQ(got, ref) << name;
      continue;
    }
    ++shards;
    ASSERT_EQ(got.size(), ref.size()) << name;
    uint64_t n = 0;
    std::memcpy(&n, ref.data(), 8);
    EXPECT_EQ(got.substr(0, 8 + n), ref.substr(0, 8 + n)) << name;
    EXPECT_EQ(got.find_first_not_of('\0', 8 + n), std::string::npos) << name << ": data not zero";
  }
  EXPECT_GT(shards, 1);
  EXPECT_TRUE(format::Checkpoint::open(shapes.path() / "ck").is_ok());
  const auto inspect = test::run_process(test::ktier_bin().string() + " inspect -m " +
                                         (shapes.path() / "ck").string());
  EXPECT_EQ(inspect.exit_code, 0) << inspect.err;
  EXPECT_NE(inspect.err.find("--shapes-only`: every weight is 0"), std::string::npos)
      << inspect.err;
  const auto full = test::run_process(test::ktier_bin().string() + " inspect -m " +
                                      dir("mxfp4").string());
  EXPECT_EQ(full.err.find("--shapes-only"), std::string::npos) << full.err;
}

TEST_F(SynthTiny, EngineLoaderAcceptsEveryVariant) {
  for (const char* v : {"mxfp4", "f32", "bf16"}) {
    auto ck = format::Checkpoint::open(dir(v));
    ASSERT_TRUE(ck.is_ok()) << v << ": " << ck.status().message();
    EXPECT_EQ(ck->config().hidden_size, 128);
    EXPECT_EQ(ck->expert_summary().count, 12u * 8u);
    if (std::string(v) == "mxfp4") {
      EXPECT_EQ(ck->expert_storage(), format::ExpertStorage::kMxfp4);
      EXPECT_EQ(ck->expert_summary().contiguous, 96u);
    } else {
      EXPECT_EQ(ck->expert_storage(), format::ExpertStorage::kPlainFloat);
    }
  }
  const auto r = test::run_process(test::ktier_bin().string() + " inspect -m " + dir("mxfp4").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("contiguous: yes"), std::string::npos) << r.out;
}

// The engine's tokenizer (`ktier tokenize`, the real Kimi split pattern) reads the synthetic
// tokenizer files and encodes the routing-measurement prompt to the same ids as the synth's encoder.
TEST_F(SynthTiny, EngineTokenizerAgreesWithTheSynthEncoder) {
  auto vocab = build_vocab(tiny().bpe_merges, tiny().added_tokens, tiny().vocab);
  ASSERT_TRUE(vocab.is_ok());
  const auto ids = encode_ordinary(*vocab, sample_prompt());
  std::string want;
  for (size_t i = 0; i < ids.size(); ++i) want += (i ? "," : "") + std::to_string(ids[i]);
  const auto r = test::run_process(test::ktier_bin().string() + " tokenize --tokenizer " + dir("mxfp4").string() +
                                   " -p '" + std::string(sample_prompt()) + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.substr(0, r.out.find_last_not_of("\n") + 1), want);
  const auto d = test::run_process(test::ktier_bin().string() + " tokenize --tokenizer " + dir("mxfp4").string() +
                                   " --decode --ids 304,306,319");
  EXPECT_EQ(d.exit_code, 0) << d.err;
  EXPECT_EQ(d.out.substr(0, d.out.find_last_not_of("\n") + 1), "[BOS]<|end_of_msg|>[PAD]");
}

TEST(SynthCli, RefusesToOverwriteWithoutForce) {
  test::TempDir dir("refuse");
  { std::ofstream(dir.path() / "keep.txt") << "mine"; }
  const std::string base = test::ktier_bin().string() + " synth --preset tiny -q -o " + dir.path().string();
  auto r = test::run_process(base);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  EXPECT_EQ(test::list_dir(dir.path()), std::vector<std::string>{"keep.txt"});
  r = test::run_process(base + " --force");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir.path() / "model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(dir.path() / "keep.txt"));  // unrelated files are left alone
  // The library says the same: a usage error.
  EXPECT_EQ(run_synth(tiny_options(dir.path(), 0)).status().exit_code(), 2);
  // --force over a different shape removes the old shards (their total changes).
  r = test::run_process(base + " --force --layers 3");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  size_t shards = 0;
  for (const auto& n : test::list_dir(dir.path())) shards += n.ends_with(".safetensors");
  EXPECT_EQ(shards, 4u);
}

// --force replaces only a checkpoint synth wrote (its .ktier-synth marker): a downloaded one,
// whose shards have synth's names, is refused whole and left as it was (a mistyped -o).
TEST(SynthCli, ForceLeavesACheckpointSynthDidNotWrite) {
  test::TempDir dir("foreign");
  { std::ofstream(dir.path() / "model-00001-of-000096.safetensors") << "downloaded"; }
  { std::ofstream(dir.path() / "config.json") << "{}"; }
  const std::string synth =
      test::ktier_bin().string() + " synth --preset tiny -q --force -o " + dir.path().string();
  auto r = test::run_process(synth);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("did not write"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(".ktier-synth"), std::string::npos) << r.err;
  EXPECT_EQ(test::list_dir(dir.path()),
            (std::vector<std::string>{"config.json", "model-00001-of-000096.safetensors"}));
  EXPECT_EQ(test::read_file(dir.path() / "model-00001-of-000096.safetensors"), "downloaded");
  // Synth's own output carries the marker, and --force replaces it.
  test::TempDir ours("ours");
  r = test::run_process(test::ktier_bin().string() + " synth --preset tiny -q -o " +
                        ours.path().string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(ours.path() / ".ktier-synth"));
  r = test::run_process(test::ktier_bin().string() + " synth --preset tiny -q --force -o " +
                        ours.path().string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(SynthCli, ShapeFlagsOverrideThePreset) {
  test::TempDir dir("flags");
  const auto r = test::run_process(test::ktier_bin().string() +
                                   " synth --preset tiny -q --seed 3 --layers 5 --hidden 64 --experts 4 "
                                   "--top-k 1 --mla-layers 2 --mla-layers 1,4 --latent 32 "
                                   "--expert-inter 32 -o " +
                                   dir.path().string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json c = json::parse(test::read_file(dir.path() / "config.json"));
  const json& tc = c.at("text_config");
  EXPECT_EQ(tc.at("num_hidden_layers"), 5);
  EXPECT_EQ(tc.at("hidden_size"), 64);
  EXPECT_EQ(tc.at("num_experts"), 4);
  EXPECT_EQ(tc.at("num_experts_per_token"), 1);
  // The last --mla-layers counts, as every option's last value (CLI11 joined the lists).
  EXPECT_EQ(tc.at("linear_attn_config").at("full_attn_layers"), json({2, 5}));
  EXPECT_EQ(tc.at("linear_attn_config").at("kda_layers"), json({1, 3, 4}));
  EXPECT_TRUE(fs::exists(dir.path() / "model-00006-of-000006.safetensors"));
  EXPECT_NE(r.out.find("routing entropy"), std::string::npos);
  auto ck = format::Checkpoint::open(dir.path());
  EXPECT_TRUE(ck.is_ok()) << ck.status().message();
}

TEST(SynthCli, RejectsBadFlagsWithUsageErrors) {
  test::TempDir dir("bad");
  const std::string base = test::ktier_bin().string() + " synth -q -o " + (dir.path() / "x").string();
  // Each refused for its own reason, named (a renamed flag would be refused as unknown).
  const std::pair<std::string, std::string> refused[] = {
      {" --preset nope", "--preset: nope not in"},
      {" --preset tiny --expert-dtype bf16", "--expert-dtype needs --float-experts"},
      {" --preset tiny --top-k 9", "--top-k (9) must not exceed --experts (8)"},
      {" --preset tiny --mla-layers 0,1,2,3,4,5,6,7,8,9,10,11,12", "must stay KDA"},
  };
  for (const auto& [args, why] : refused) {
    const auto bad = test::run_process(base + args);
    EXPECT_EQ(bad.exit_code, 2) << args;
    EXPECT_NE(bad.err.find(why), std::string::npos) << args << ": " << bad.err;
  }
  // Shapes the engine would refuse, or no memory could plan: refused at once by name.
  auto r = test::run_process(base + " --preset tiny --experts 65535 --top-k 65535");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--top-k"), std::string::npos) << r.err;
  r = test::run_process(base + " --preset tiny --experts 65535");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("expert tensors"), std::string::npos) << r.err;
  EXPECT_EQ(test::run_process(base + " --preset tiny --layers 5000").exit_code, 2);
  // Past the engine's bounds on counts and on the tokenizer's added ids; a layer count that
  // would size the default MLA list by itself (it took gigabytes before the range check).
  for (const auto& [flags, named] :
       {std::pair<std::string, std::string>{" --experts 65536", "--experts"},
        {" --mla-heads 65536", "--mla-heads"},
        {" --vocab 1048833", "--vocab"},
        {" --layers 9223372036854775807", "--layers"}}) {
    r = test::run_process(base + " --preset tiny" + flags);
    EXPECT_EQ(r.exit_code, 2) << flags << "\n" << r.err;
    EXPECT_NE(r.err.find(named), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(dir.path() / "x"));
}

// A shape larger than its file system's free space is refused before anything is written; the
// bound is min_data_bytes, so a refusal never stops a checkpoint that would have fit.
TEST(SynthCli, RefusesAShapeLargerThanTheFreeSpace) {
  test::TempDir dir("space");
  const fs::path out = dir.path() / "x" / "y";
  // 2 x (256 + 2^20) x 2^22 BF16 values (embedding + lm_head) alone: 1.8e13 bytes.
  const auto r = test::run_process(test::ktier_bin().string() + " synth -q --preset tiny -o " +
                                   out.string() + " --vocab 1048832 --hidden 4194304");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("GB free"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(out.string()), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir.path() / "x"));
  // A non-empty folder without --force is the usage error it always was, checked first.
  { std::ofstream(dir.path() / "keep.txt") << "mine"; }
  const auto busy = test::run_process(test::ktier_bin().string() + " synth -q --preset tiny -o " +
                                      dir.path().string() + " --vocab 1048832 --hidden 4194304");
  EXPECT_EQ(busy.exit_code, 2) << busy.err;
}

}  // namespace
}  // namespace ktier::synth
