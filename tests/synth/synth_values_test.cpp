// The pieces of `ktier synth` below the file level: value streams, MXFP4 quantisation, the
// synthetic tokenizer, shapes, and the tensor plan checked against K3's published byte counts.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "common/dtype.h"
#include "format/config.h"
#include "format/safetensors_writer.h"
#include "synth/plan.h"
#include "synth/rng.h"
#include "synth/shape.h"
#include "synth/synth_test_util.h"
#include "synth/tokenizer_gen.h"
#include "synth/values.h"
#include "common/test_paths.h"

namespace ktier::synth {
namespace {

TEST(SynthValues, AnyElementRangeGivesTheSameValues) {
  ValueSpec v;
  v.key = stream_key(42, "some.tensor");
  v.mean = 0.5f;
  v.stddev = 0.1f;
  std::vector<float> whole(1000);
  generate_values(v, 0, whole.size(), whole.data());
  // Ranges that start and end inside a 4-element draw.
  for (auto [first, count] : std::vector<std::pair<size_t, size_t>>{{0, 1}, {1, 2}, {3, 5}, {7, 993}, {998, 2}}) {
    std::vector<float> part(count);
    generate_values(v, first, count, part.data());
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(f32_to_bits(part[i]), f32_to_bits(whole[first + i])) << first + i;
  }
}

TEST(SynthValues, NormalStreamHasUnitMomentsAndDiffersBySeedAndName) {
  ValueSpec v;
  v.key = stream_key(1, "x");
  std::vector<float> a(1 << 18);
  generate_values(v, 0, a.size(), a.data());
  double sum = 0, sq = 0;
  for (float x : a) sum += x, sq += static_cast<double>(x) * x;
  const double mean = sum / a.size(), var = sq / a.size() - mean * mean;
  // Standard errors at n = 262144: 0.002 for the mean, 0.003 for the variance.
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(var, 1.0, 0.015);
  EXPECT_NE(stream_key(1, "x"), stream_key(2, "x"));
  EXPECT_NE(stream_key(1, "x"), stream_key(1, "y"));
  const float* t = normal_table();
  EXPECT_EQ(t[0], -t[65535]);
  EXPECT_GT(t[32768], 0.0f);
}

// Groups that exercise the edges of the quantiser: exact ties at every threshold, zeros and
// negative zeros, subnormals, a group maximum on a power of two.
std::vector<std::vector<float>> edge_groups() {
  std::vector<std::vector<float>> groups;
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f};
  std::vector<float> g(32, 0.0f);
  for (int i = 0; i < 8; ++i) g[i] = ties[i], g[8 + i] = -ties[i];
  groups.push_back(g);
  groups.push_back(std::vector<float>(32, 0.0f));
  groups.push_back(std::vector<float>(32, -0.0f));
  std::vector<float> sub(32, 1e-42f);
  sub[3] = -3e-41f;
  groups.push_back(sub);
  std::vector<float> pow2(32, 0.001f);
  pow2[31] = 0.125f;
  groups.push_back(pow2);
  return groups;
}

TEST(SynthMxfp4, SimdAndScalarQuantisersAgreeByteForByte) {
  auto groups = edge_groups();
  ValueSpec v;
  v.key = stream_key(9, "q");
  v.stddev = 0.02f;
  for (int k = 0; k < 4000; ++k) {
    std::vector<float> g(32);
    generate_values(v, static_cast<uint64_t>(k) * 32, 32, g.data());
    groups.push_back(g);
  }
  for (const auto& g : groups) {
    uint8_t a[16], b[16];
    const uint8_t sa = mxfp4_quantize_group(g.data(), a);
    const uint8_t sb = mxfp4_quantize_group_scalar(g.data(), b);
    ASSERT_EQ(sa, sb);
    ASSERT_EQ(0, std::memcmp(a, b, 16));
  }
}

TEST(SynthMxfp4, ScaleRuleAndRoundingError) {
  ValueSpec v;
  v.key = stream_key(3, "w");
  v.stddev = 0.0167f;  // ~1/sqrt(3584), a K3 expert width
  std::map<float, int> max_codes;
  std::set<uint8_t> codes_seen;
  for (int k = 0; k < 2000; ++k) {
    float x[32], y[32];
    uint8_t packed[16];
    generate_values(v, static_cast<uint64_t>(k) * 32, 32, x);
    const uint8_t s = mxfp4_quantize_group(x, packed);
    ASSERT_NE(s, 255);
    mxfp4_dequantize_group(packed, s, y);
    float amax = 0, dmax = 0;
    const float unit = std::ldexp(1.0f, s - 127);
    for (int i = 0; i < 32; ++i) {
      amax = std::max(amax, std::fabs(x[i]));
      dmax = std::max(dmax, std::fabs(y[i]) / unit);
      // Nearest E2M1 value: within half the local step (0.5 below 2, 1 below 4, 2 above).
      const float m = std::fabs(x[i]) / unit;
      const float half_step = m < 2 ? 0.25f : (m < 4 ? 0.5f : 1.0f);
      ASSERT_LE(std::fabs(y[i] - x[i]), half_step * unit) << "group " << k << " element " << i;
      ASSERT_EQ(std::signbit(y[i]), std::signbit(x[i]));  // sign kept, −0 included
      codes_seen.insert(static_cast<uint8_t>(i % 2 ? packed[i / 2] >> 4 : packed[i / 2] & 15));
    }
    // The smallest power of two with 6·2^e ≥ max|x|: the maximum lands in (3, 6] scale units.
    EXPECT_LE(amax, 6 * unit);
    EXPECT_GT(amax, 3 * unit);
    ++max_codes[dmax];
  }
  // Like the release (conformance/mxfp4.json): group maxima 3, 4 and 6, never clipped.
  EXPECT_EQ(max_codes.size(), 3u);
  EXPECT_GT(max_codes[3.0f], 0);
  EXPECT_GT(max_codes[4.0f], 0);
  EXPECT_GT(max_codes[6.0f], 0);
  EXPECT_TRUE(codes_seen.count(8)) << "negative values rounding to zero keep the sign (code 8)";
}

TEST(SynthMxfp4, DecoderMatchesTheReleasedBytes) {
  // conformance/mxfp4.json: real K3 bytes and their exact values (low nibble = even element).
  const auto path = test::conformance_dir() / "mxfp4.json";
  ASSERT_TRUE(std::filesystem::exists(path)) << "no conformance data at " << path;
  const auto j = nlohmann::json::parse(test::read_file(path));
  const auto packed = j.at("packed").at("data").get<std::vector<uint8_t>>();
  const auto scales = j.at("scales").at("data").get<std::vector<uint8_t>>();
  const auto expected = j.at("expected").at("data").get<std::vector<double>>();
  const size_t rows = 64, groups = 112;
  for (size_t r = 0; r < rows; ++r)
    for (size_t g = 0; g < groups; ++g) {
      float out[32];
      mxfp4_dequantize_group(&packed[r * 1792 + g * 16], scales[r * groups + g], out);
      for (size_t i = 0; i < 32; ++i)
        ASSERT_EQ(f32_to_bits(out[i]), f32_to_bits(static_cast<float>(expected[r * 3584 + g * 32 + i])))
            << "row " << r << " element " << g * 32 + i;
    }
}

TEST(SynthTokenizer, TinyVocabularyLayout) {
  auto v = build_vocab(48, 16, 320);
  ASSERT_TRUE(v.is_ok()) << v.status().message();
  EXPECT_EQ(v->ranks.size(), 304u);
  EXPECT_EQ(v->merges_learned, 48);
  EXPECT_EQ(v->added_begin, 304);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(v->ranks[b], std::string(1, static_cast<char>(b)));
  std::set<std::string> unique(v->ranks.begin(), v->ranks.end());
  EXPECT_EQ(unique.size(), v->ranks.size());
  const std::vector<std::string> names = {"[BOS]", "[EOS]", "<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>",
                                          "[start_header_id]", "[end_header_id]", "<|reserved_token_312|>", "[EOT]"};
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(v->added[i].content, names[i]);
  EXPECT_EQ(v->added[14].content, "[UNK]");
  EXPECT_EQ(v->added[15].content, "[PAD]");
  EXPECT_FALSE(v->added[3].special);
  EXPECT_TRUE(v->added[2].special);
  EXPECT_EQ(v->bos_id, 304);
  EXPECT_EQ(v->eos_id, 306);
  EXPECT_EQ(v->pad_id, 319);
}

TEST(SynthTokenizer, K3SliceIdsSitAtK3Ids) {
  auto v = build_vocab(3000, 256, 163840);
  ASSERT_TRUE(v.is_ok());
  EXPECT_EQ(v->merges_learned, 3000);  // the sample text supports the presets' merge count
  EXPECT_EQ(v->ranks.size(), 3256u);
  EXPECT_EQ(v->added_begin, 163584);
  const std::map<int64_t, std::string> k3 = {{163584, "[BOS]"},         {163585, "[EOS]"},
                                             {163586, "<|end_of_msg|>"}, {163587, "<|open|>"},
                                             {163588, "<|close|>"},      {163589, "<|sep|>"},
                                             {163593, "[EOT]"},          {163605, "<|media_pad|>"},
                                             {163838, "[UNK]"},          {163839, "[PAD]"}};
  for (const auto& [id, name] : k3) EXPECT_EQ(v->added[static_cast<size_t>(id - 163584)].content, name);
  EXPECT_EQ(v->added[100].content, "<|reserved_token_163684|>");
  EXPECT_EQ(v->bos_id, 163584);
  EXPECT_EQ(v->eos_id, 163586);
  EXPECT_EQ(v->pad_id, 163839);
}

TEST(SynthTokenizer, EncodeRoundTripsAndMergesHelp) {
  auto v = build_vocab(3000, 256, 3512);
  ASSERT_TRUE(v.is_ok());
  const std::string text = std::string(sample_prompt()) + " Ünïcödé 12345 \n\n  tabs\tand  spaces ";
  const auto ids = encode_ordinary(*v, text);
  std::string decoded;
  for (int64_t id : ids) decoded += v->ranks.at(static_cast<size_t>(id));
  EXPECT_EQ(decoded, text);
  EXPECT_LT(ids.size(), text.size() / 3);  // a useful vocabulary: > 3 bytes per token
  std::string joined;
  for (auto p : split_pieces(text)) joined += p;
  EXPECT_EQ(joined, text);
}

TEST(SynthTokenizer, Base64) {
  EXPECT_EQ(base64_encode(""), "");
  EXPECT_EQ(base64_encode("f"), "Zg==");
  EXPECT_EQ(base64_encode("fo"), "Zm8=");
  EXPECT_EQ(base64_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_encode(std::string(1, '\xff')), "/w==");
}

TEST(SynthShape, DefaultMlaRuleReproducesK3TinyAndDemo) {
  std::vector<int64_t> k3;
  for (int64_t l = 4; l <= 92; l += 4) k3.push_back(l - 1);
  k3.push_back(92);
  EXPECT_EQ(default_mla_layers(93), k3);  // 1-based 4, 8, ..., 92, 93: 24 layers
  EXPECT_EQ(default_mla_layers(13), (std::vector<int64_t>{3, 7, 11, 12}));
  EXPECT_EQ(default_mla_layers(16), (std::vector<int64_t>{3, 7, 11, 14, 15}));
  EXPECT_EQ(default_mla_layers(2), (std::vector<int64_t>{1}));
}

TEST(SynthShape, PresetsAreValidAndOverridesAreChecked) {
  for (const auto& name : preset_names()) {
    auto s = preset_shape(name);
    ASSERT_TRUE(s.is_ok());
    EXPECT_TRUE(validate_shape(*s, ExpertFormat::kMxfp4).is_ok()) << name;
  }
  EXPECT_EQ(preset_shape("huge").status().exit_code(), 2);
  const SynthShape tiny = *preset_shape("tiny");
  ShapeOverrides o;
  o.top_k = 9;
  EXPECT_EQ(apply_overrides(tiny, o, ExpertFormat::kMxfp4).status().exit_code(), 2);
  o = {};
  o.expert_inter = 48;
  EXPECT_EQ(apply_overrides(tiny, o, ExpertFormat::kMxfp4).status().exit_code(), 2);
  EXPECT_TRUE(apply_overrides(tiny, o, ExpertFormat::kF32).is_ok());  // the conformance shape
  o = {};
  o.mla_layers = std::vector<int64_t>{13};
  EXPECT_EQ(apply_overrides(tiny, o, ExpertFormat::kMxfp4).status().exit_code(), 2);
  o.mla_layers = std::vector<int64_t>{};
  EXPECT_EQ(apply_overrides(tiny, o, ExpertFormat::kMxfp4).status().exit_code(), 2);
  // The engine's own limits (config.h) and the expert-tensor cap.
  o = {};
  o.layers = format::kMaxLayers + 1;
  EXPECT_EQ(apply_overrides(tiny, o, ExpertFormat::kMxfp4).status().exit_code(), 2);
  o.layers = format::kMaxLayers;
  EXPECT_TRUE(apply_overrides(tiny, o, ExpertFormat::kMxfp4).is_ok());
  o = {};
  o.experts = 100;
  o.top_k = format::kMaxTopK + 1;
  EXPECT_EQ(apply_overrides(tiny, o, ExpertFormat::kMxfp4).status().exit_code(), 2);
  o.top_k = format::kMaxTopK;
  EXPECT_TRUE(apply_overrides(tiny, o, ExpertFormat::kMxfp4).is_ok());
  const int64_t moe_layers = tiny.moe_layers();
  o = {};
  o.experts = kMaxExpertTensors / (6 * moe_layers);
  EXPECT_TRUE(apply_overrides(tiny, o, ExpertFormat::kMxfp4).is_ok());
  o.experts = *o.experts + 1;
  const Status too_many = apply_overrides(tiny, o, ExpertFormat::kMxfp4).status();
  EXPECT_EQ(too_many.exit_code(), 2);
  EXPECT_NE(too_many.message().find("--experts"), std::string::npos) << too_many.message();
  EXPECT_TRUE(apply_overrides(tiny, o, ExpertFormat::kF32).is_ok());  // 3 tensors per expert
  o = {};
  o.layers = 6;
  auto s = apply_overrides(tiny, o, ExpertFormat::kMxfp4);
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ(s->mla_layers, (std::vector<int64_t>{3, 4, 5}));  // default rule for L = 6
}

// min_data_bytes bounds the plan's exact total from below, and is close to it where the experts
// dominate (demo; tiny and k3-slice are half trunk).
TEST(SynthShape, MinDataBytesBoundsThePlan) {
  for (const auto& name : preset_names()) {
    const SynthShape s = *preset_shape(name);
    for (ExpertFormat f : {ExpertFormat::kMxfp4, ExpertFormat::kF32, ExpertFormat::kBF16}) {
      const auto exact = static_cast<long double>(build_plan(s, f, 0).data_bytes());
      const long double bound = min_data_bytes(s, f);
      EXPECT_LE(bound, exact) << name << " " << expert_format_name(f);
      if (name == "demo") {
        EXPECT_GT(bound, 0.8L * exact) << expert_format_name(f);  // 0.87-0.98
      }
    }
  }
}

// The plan at K3 widths must reproduce the released byte counts of K3-MODEL.md §3.4, §5.7, §5.9
// exactly: tensor sizes and dtypes per layer kind, the expert run layout, and (since header
// length depends on every name, dtype, shape and offset) the released header lengths N.
TEST(SynthPlan, K3WidthsReproduceTheReleasedShardBytes) {
  SynthShape s = *preset_shape("k3-slice");
  s.experts = 896;  // layer 1 KDA+MoE, layer 3 MLA+MoE, as shards 00002 and 00004 of the release
  const Plan plan = build_plan(s, ExpertFormat::kMxfp4, 0);
  ASSERT_EQ(plan.shards.size(), 5u);
  struct Expect {
    size_t shard;
    uint64_t trunk, experts, header, tensors;
  };
  const Expect expect[] = {{0, 2341213184ull, 0, 2920, 23},
                           {1, 1267744256ull, 896ull * 17547264ull, 818696, 28 + 896 * 6},
                           {3, 844335616ull, 896ull * 17547264ull, 817608, 22 + 896 * 6},
                           {4, 4697663488ull, 0, 576, 5}};
  for (const Expect& e : expect) {
    const PlannedShard& shard = plan.shards[e.shard];
    uint64_t trunk = 0, experts = 0;
    std::vector<format::TensorDecl> decls;
    for (const auto& t : shard.tensors) {
      (t.group == TensorGroup::kExpert ? experts : trunk) += t.decl.nbytes();
      decls.push_back(t.decl);
    }
    EXPECT_EQ(trunk, e.trunk) << shard.file_name;
    EXPECT_EQ(experts, e.experts) << shard.file_name;
    EXPECT_EQ(shard.tensors.size(), e.tensors) << shard.file_name;
    EXPECT_EQ(format::SafetensorsWriter::header_json(decls).size(), e.header) << shard.file_name;
  }
  EXPECT_EQ(plan.shards[1].file_name, "model-00002-of-000005.safetensors");
  // One expert: six tensors at run offsets 0, 5505024, 5849088, 11354112, 11698176, 17203200.
  const auto& t = plan.shards[1].tensors;
  size_t first = 0;
  while (t[first].group != TensorGroup::kExpert) ++first;
  const uint64_t run_offsets[] = {0, 5505024, 5849088, 11354112, 11698176, 17203200, 17547264};
  uint64_t off = 0;
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(off, run_offsets[i]);
    off += t[first + i].decl.nbytes();
  }
  EXPECT_EQ(off, run_offsets[6]);
  EXPECT_EQ(t[first].decl.name, "language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_packed");
  EXPECT_EQ(t[first + 6].decl.name, "language_model.model.layers.1.block_sparse_moe.experts.1.w1.weight_packed");
  EXPECT_EQ(t[first + 12].decl.name, "language_model.model.layers.1.block_sparse_moe.experts.10.w1.weight_packed");
  EXPECT_EQ(t[first + 18].decl.name, "language_model.model.layers.1.block_sparse_moe.experts.100.w1.weight_packed");
}

}  // namespace
}  // namespace ktier::synth
