// Checkpoint: index vs shard headers, model-level validation (K3-MODEL §2.5 rule 9, §5) and
// expert locations, on small synthetic checkpoints written by st_builder.h.
#include "format/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include <gtest/gtest.h>

#include "common/test_paths.h"
#include "format/st_builder.h"

namespace ktier::format {
namespace {

using ktier::test::make_tiny_checkpoint;
using ktier::test::StTensor;
using ktier::test::SynthCheckpoint;
using ktier::test::SynthShard;
using ktier::test::TempDir;

#define EXPECT_HAS(msg, text) EXPECT_NE((msg).find(text), std::string::npos) << "message: " << (msg)

const std::string kP = "language_model.model.layers.";

Result<Checkpoint> write_and_open(const SynthCheckpoint& s, const TempDir& dir,
                                  OpenMode mode = OpenMode::kMap) {
  s.write(dir.path());
  return Checkpoint::open(dir.path(), mode);
}

// Writes, opens, expects failure with `exit_code`; returns the message.
std::string open_error(const SynthCheckpoint& s, int exit_code) {
  TempDir dir("ckpt_err");
  auto r = write_and_open(s, dir);
  EXPECT_FALSE(r.is_ok());
  if (r.is_ok()) return "";
  EXPECT_EQ(r.status().exit_code(), exit_code) << r.status().message();
  return r.status().message();
}

std::string expert_name(int layer, int e, const std::string& part) {
  return kP + std::to_string(layer) + ".block_sparse_moe.experts." + std::to_string(e) + "." + part;
}

// ---- loads --------------------------------------------------------------------------------------

class TinyCheckpoint : public ::testing::TestWithParam<OpenMode> {};

TEST_P(TinyCheckpoint, LoadsWithExpertLocationsAndCensus) {
  const SynthCheckpoint s = make_tiny_checkpoint(/*mxfp4=*/true);
  TempDir dir("ckpt_ok");
  auto r = write_and_open(s, dir, GetParam());
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const Checkpoint& ck = *r;
  EXPECT_EQ(ck.config().shape, ConfigShape::kNested);
  EXPECT_EQ(ck.config().moe_intermediate_size, 96);
  EXPECT_TRUE(ck.has_index());
  EXPECT_EQ(ck.num_shards(), s.shards.size());

  const ExpertSummary& ex = ck.expert_summary();
  EXPECT_EQ(ex.storage, ExpertStorage::kMxfp4);
  EXPECT_EQ(ex.count, 12u * 8u);
  EXPECT_EQ(ex.contiguous, 12u * 8u);
  // w1, w3: packed [96, 32] + scale [96, 2]; w2: packed [64, 48] + scale [64, 3].
  EXPECT_EQ(ex.bytes_per_expert, 3u * (96 * 32 + 96 * 2));

  // Every expert: the six parts are where the independent writer put them, back to back.
  for (int l = 1; l < 13; ++l) {
    const SafetensorsFile& shard = ck.shard(static_cast<size_t>(l));
    ASSERT_EQ(shard.path().filename().string(), s.shards[static_cast<size_t>(l)].file);
    for (int e = 0; e < 8; ++e) {
      const ExpertLocation& loc = ck.expert(l, e);
      EXPECT_TRUE(loc.contiguous);
      EXPECT_EQ(loc.num_parts, 6u);
      EXPECT_EQ(loc.shard, static_cast<uint32_t>(l));
      std::vector<uint8_t> expected;
      for (size_t p = 0; p < 6; ++p) {
        const std::string name = expert_name(l, e, ExpertLocation::kPackedPartNames[p]);
        const TensorInfo* t = shard.find(name);
        ASSERT_NE(t, nullptr) << name;
        EXPECT_EQ(loc.parts[p].file_offset, t->file_offset) << name;
        EXPECT_EQ(loc.parts[p].nbytes, t->nbytes) << name;
        const StTensor* src = s.find(name);
        expected.insert(expected.end(), src->data.begin(), src->data.end());
      }
      EXPECT_EQ(loc.file_offset, loc.parts[0].file_offset);
      EXPECT_EQ(loc.nbytes, expected.size());
      std::vector<uint8_t> run(loc.nbytes);
      ASSERT_TRUE(ck.shard(loc.shard).read_bytes(loc.file_offset, loc.nbytes, run.data()).is_ok());
      EXPECT_EQ(run, expected) << "layer " << l << " expert " << e;
    }
  }

  // Census, recomputed from the writer's tensors by name.
  ByteCensus want;
  for (const auto& sh : s.shards)
    for (const auto& t : sh.tensors) {
      CensusEntry* kind = &want.trunk;
      if (t.name.find(".experts.") != std::string::npos) kind = &want.experts;
      else if (t.name.rfind(kP, 0) != 0) kind = t.name.rfind("language_model.", 0) == 0
                                                      ? &want.embeddings_head : &want.ignored;
      kind->tensors += 1;
      kind->bytes += t.data.size();
    }
  EXPECT_EQ(ck.census().trunk.tensors, want.trunk.tensors);
  EXPECT_EQ(ck.census().trunk.bytes, want.trunk.bytes);
  EXPECT_EQ(ck.census().experts.tensors, 12u * 8u * 6u);
  EXPECT_EQ(ck.census().experts.bytes, want.experts.bytes);
  EXPECT_EQ(ck.census().embeddings_head.tensors, 5u);
  EXPECT_EQ(ck.census().embeddings_head.bytes, want.embeddings_head.bytes);
  EXPECT_EQ(ck.census().ignored.tensors, 2u);  // vision tower + projector
  EXPECT_EQ(ck.census().ignored.bytes, want.ignored.bytes);

  auto lm = ck.find("language_model.lm_head.weight");
  ASSERT_TRUE(lm.has_value());
  EXPECT_EQ(lm->shard, 13u);
  EXPECT_EQ(lm->info->shape, (std::vector<int64_t>{256, 128}));
  EXPECT_FALSE(ck.find("language_model.model.nope").has_value());
}

INSTANTIATE_TEST_SUITE_P(Modes, TinyCheckpoint, ::testing::Values(OpenMode::kMap, OpenMode::kPread),
                         [](const auto& info) {
                           return info.param == OpenMode::kMap ? std::string("Map")
                                                               : std::string("Pread");
                         });

// The flat test shape with plain-float experts, all in one unindexed file.
TEST(Checkpoint, FlatPlainFloatSingleFile) {
  for (const char* file : {"model.safetensors", "model-00001-of-00001.safetensors"}) {
    SynthCheckpoint s = make_tiny_checkpoint(/*mxfp4=*/false);
    std::ifstream in(ktier::test::conformance_dir() / "ops" / "MANIFEST.json");
    s.config = nlohmann::ordered_json::parse(in)["config"];
    ktier::test::SynthShard all{file, {}};
    for (auto& sh : s.shards)
      for (auto& t : sh.tensors) all.tensors.push_back(std::move(t));
    s.shards = {std::move(all)};
    s.write_index = false;
    TempDir dir("ckpt_flat");
    auto r = write_and_open(s, dir);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_FALSE(r->has_index());
    EXPECT_EQ(r->config().shape, ConfigShape::kFlat);
    const ExpertSummary& ex = r->expert_summary();
    EXPECT_EQ(ex.storage, ExpertStorage::kPlainFloat);
    ASSERT_TRUE(ex.plain_dtype.has_value());
    EXPECT_EQ(*ex.plain_dtype, DType::kF32);
    EXPECT_EQ(ex.contiguous, 0u);
    EXPECT_EQ(ex.bytes_per_expert, 3u * 48u * 64u * 4u);
    const ExpertLocation& loc = r->expert(12, 7);
    EXPECT_EQ(loc.num_parts, 3u);
    EXPECT_FALSE(loc.contiguous);
    EXPECT_EQ(loc.parts[1].file_offset, r->find(expert_name(12, 7, "w2.weight"))->info->file_offset);
  }
}

// K3's real widths (K3-MODEL §2.2) over 4 layers: 0 KDA+dense, 1-2 KDA+MoE, 3 MLA+MoE, with the
// released dtypes and lexicographic expert order; data are holes in sparse files. The byte totals
// must close exactly as in K3-MODEL §5.9 and the expert runs as in §3.5.
TEST(Checkpoint, K3GeometryOnSparseShards) {
  ktier::test::ojson cfg = ktier::test::tiny_nested_config(true, 4);
  auto& t = cfg["text_config"];
  for (const auto& [k, v] : std::vector<std::pair<const char*, int64_t>>{
           {"vocab_size", 163840}, {"hidden_size", 7168}, {"num_attention_heads", 96},
           {"intermediate_size", 33792}, {"moe_intermediate_size", 3072}, {"num_experts", 896},
           {"num_experts_per_token", 16}, {"routed_expert_hidden_size", 3584}, {"q_lora_rank", 1536},
           {"kv_lora_rank", 512}, {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64},
           {"v_head_dim", 128}, {"attn_res_block_size", 12}})
    t[k] = v;
  t["linear_attn_config"]["num_heads"] = 96;
  t["linear_attn_config"]["head_dim"] = 128;
  const SynthCheckpoint s = ktier::test::make_checkpoint(cfg, true, /*sparse=*/true, /*released_dtypes=*/true);
  TempDir dir("ckpt_k3");
  s.write(dir.path());
  struct stat st {};
  ASSERT_EQ(::stat((dir.path() / s.shards[1].file).c_str(), &st), 0);
  if (static_cast<uint64_t>(st.st_blocks) * 512 > static_cast<uint64_t>(st.st_size) / 2)
    GTEST_SKIP() << "the temp filesystem does not keep files sparse";
  auto r = Checkpoint::open(dir.path());
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const Checkpoint& ck = *r;
  EXPECT_EQ(ck.census().trunk.bytes, 2341213184ull + 2 * 1267744256ull + 844335616ull);
  EXPECT_EQ(ck.census().trunk.tensors, 23u + 2 * 28u + 22u);
  EXPECT_EQ(ck.census().experts.bytes, 3 * 15722348544ull);
  EXPECT_EQ(ck.census().experts.tensors, 3u * 896u * 6u);
  EXPECT_EQ(ck.census().embeddings_head.bytes, 4697663488ull);
  EXPECT_EQ(ck.expert_summary().bytes_per_expert, 17547264u);
  EXPECT_EQ(ck.expert_summary().count, 3u * 896u);
  EXPECT_EQ(ck.expert_summary().contiguous, 3u * 896u);

  // Experts follow the trunk in lexicographic order of their ids: 0, 1, 10, 100, ..., 2, ...
  std::vector<std::string> ids;
  for (int e = 0; e < 896; ++e) ids.push_back(std::to_string(e));
  std::sort(ids.begin(), ids.end());
  const uint64_t first = ck.shard(1).data_offset() + 1267744256ull;  // right after the trunk
  for (int e : {0, 1, 10, 2, 895}) {
    const uint64_t rank = static_cast<uint64_t>(std::find(ids.begin(), ids.end(), std::to_string(e)) - ids.begin());
    const ExpertLocation& loc = ck.expert(1, e);
    EXPECT_EQ(loc.file_offset, first + rank * 17547264ull) << "expert " << e;
    const uint64_t run[6] = {0, 5505024, 5849088, 11354112, 11698176, 17203200};
    for (size_t p = 0; p < 6; ++p) EXPECT_EQ(loc.parts[p].file_offset - loc.file_offset, run[p]);
  }
  EXPECT_EQ(ck.expert(1, 2).file_offset - first, 112u * 17547264ull);  // after "0" and 111 ids "1*"
}

TEST(Checkpoint, AcceptedShapeVariants) {
  SynthCheckpoint s = make_tiny_checkpoint(true);
  s.find(kP + "2.self_attention_res_proj.weight")->shape = {128};      // [E] instead of [1, E]
  s.find(kP + "0.self_attn.q_conv1d.weight")->shape = {64, 4};         // [C, K] instead of [C, 1, K]
  StTensor* a_log = s.find(kP + "1.self_attn.A_log");                   // exactly H_k elements
  a_log->shape = {4};
  a_log->data.resize(16);
  StTensor* norm = s.find("language_model.model.norm.weight");          // F16 is fine too
  norm->dtype = "F16";
  norm->data.resize(256);
  TempDir dir("ckpt_var");
  auto r = write_and_open(s, dir);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
}

TEST(Checkpoint, MtpLayersAreIgnoredOnlyWhenConfigured) {
  SynthCheckpoint s = make_tiny_checkpoint(true);
  s.shards[12].tensors.push_back(ktier::test::filled(kP + "13.eh_proj.weight", "BF16", {4, 4}, 99));
  EXPECT_HAS(open_error(s, 3), "unknown tensor '" + kP + "13.eh_proj.weight' in shard " + s.shards[12].file);
  s.config["text_config"]["num_nextn_predict_layers"] = 1;
  TempDir dir("ckpt_mtp");
  auto r = write_and_open(s, dir);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->census().ignored.tensors, 3u);
  // Only the head's own layers (L .. L + n - 1): a tensor past them is still unknown.
  s.shards[12].tensors.push_back(ktier::test::filled(kP + "14.eh_proj.weight", "BF16", {4, 4}, 7));
  EXPECT_HAS(open_error(s, 3), "unknown tensor '" + kP + "14.eh_proj.weight' in shard " + s.shards[12].file);
  s.config["text_config"]["num_nextn_predict_layers"] = 2;
  TempDir dir2("ckpt_mtp2");
  r = write_and_open(s, dir2);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
}

// ---- model-level errors (exit 3 naming the tensor) ------------------------------------------------

TEST(Checkpoint, MissingTensors) {
  SynthCheckpoint s = make_tiny_checkpoint(true);
  ASSERT_TRUE(s.remove(kP + "5.self_attn.q_proj.weight"));
  std::string m = open_error(s, 3);
  EXPECT_HAS(m, "missing tensor '" + kP + "5.self_attn.q_proj.weight' (the config implies shape [64, 128])");
  ASSERT_TRUE(s.remove("language_model.lm_head.weight"));
  m = open_error(s, 3);
  EXPECT_HAS(m, "2 problems");
  EXPECT_HAS(m, "missing tensor 'language_model.lm_head.weight'");
}

// A num_experts the shards cannot hold (an expert is at least 3 tensors) is refused before
// anything is sized by it: 10^7 experts took gigabytes and minutes to list as missing (now the
// config's own bound, 2^16 - 1, refuses those; within it the shards are the judge).
TEST(Checkpoint, MoreExpertsThanTheShardsHoldAreRefusedAtOnce) {
  SynthCheckpoint s = make_tiny_checkpoint(true);
  s.config["text_config"]["num_experts"] = 65535;
  const std::string m = open_error(s, 3);
  EXPECT_HAS(m, "config.json says 65535 routed experts in each of 12 MoE layers, but the "
                "shards hold only ");
  EXPECT_HAS(m, "... and ");  // the rest counted, not listed
}

TEST(Checkpoint, WrongShape) {
  SynthCheckpoint s = make_tiny_checkpoint(true);
  s.find(kP + "3.self_attn.q_b_proj.weight")->shape = {64, 128};  // same bytes, transposed
  const std::string m = open_error(s, 3);
  EXPECT_HAS(m, "tensor '" + kP + "3.self_attn.q_b_proj.weight' (shard " + s.shards[3].file +
                    ") has shape [64, 128] but the config implies [128, 64]");
}

TEST(Checkpoint, ALogTailMustBeZero) {
  SynthCheckpoint s = make_tiny_checkpoint(true);
  StTensor* t = s.find(kP + "0.self_attn.A_log");
  const float v = 1.5f;
  std::memcpy(t->data.data() + 10 * 4, &v, 4);
  EXPECT_HAS(open_error(s, 3), "tensor '" + kP + "0.self_attn.A_log' (shard " + s.shards[0].file +
                                   "): element 10 is 1.5; elements 4..15 past the 4 heads must be exactly 0");
  // A tail longer than the chunk it is read in (2^18 elements): the last element is checked.
  const int64_t n = 4 + 3 * (int64_t{1} << 18) + 5;
  t->dtype = "BF16";
  t->shape = {n};
  t->data.assign(static_cast<size_t>(n) * 2, 0);
  {
    TempDir dir("ckpt_alog");
    auto zero_tail = write_and_open(s, dir);
    EXPECT_TRUE(zero_tail.is_ok()) << zero_tail.status().message();
  }
  t->data[static_cast<size_t>(n - 1) * 2 + 1] = 0xBF;  // bf16 0xBF00: -0.5
  EXPECT_HAS(open_error(s, 3), "): element " + std::to_string(n - 1) + " is -0.5; elements 4.." +
                                   std::to_string(n - 1) + " past the 4 heads must be exactly 0");
  t->dtype = "F32";
  t->shape = {3};
  t->data.resize(12);
  EXPECT_HAS(open_error(s, 3), "3 elements, fewer than the 4 KDA heads");
}

TEST(Checkpoint, NonExpertTensorMayNotBePacked) {
  SynthCheckpoint s = make_tiny_checkpoint(true);
  StTensor* t = s.find(kP + "1.block_sparse_moe.gate.e_score_correction_bias");
  t->dtype = "U8";
  t->data.resize(8);
  EXPECT_HAS(open_error(s, 3), "e_score_correction_bias' (shard " + s.shards[1].file +
                                   ") is U8; only routed experts may be packed");
}

TEST(Checkpoint, PackedAndPlainExpertsMixed) {
  SynthCheckpoint s = make_tiny_checkpoint(true);
  auto& tensors = s.shards[2].tensors;
  for (const char* part : ExpertLocation::kPackedPartNames) ASSERT_TRUE(s.remove(expert_name(2, 5, part)));
  tensors.push_back(ktier::test::filled(expert_name(2, 5, "w1.weight"), "BF16", {96, 64}, 1));
  tensors.push_back(ktier::test::filled(expert_name(2, 5, "w2.weight"), "BF16", {64, 96}, 2));
  tensors.push_back(ktier::test::filled(expert_name(2, 5, "w3.weight"), "BF16", {96, 64}, 3));
  const std::string m = open_error(s, 3);
  EXPECT_HAS(m, "routed experts mix MXFP4 ('" + expert_name(1, 0, "w1.weight_packed") +
                    "') and plain float ('" + expert_name(2, 5, "w1.weight") + "')");
  EXPECT_EQ(m.find("\n"), std::string::npos) << "only the mix is wrong: " << m;
}

TEST(Checkpoint, ExpertMatrixBothOrNeither) {
  SynthCheckpoint s = make_tiny_checkpoint(true);
  s.shards[2].tensors.push_back(ktier::test::filled(expert_name(2, 1, "w1.weight"), "BF16", {96, 64}, 1));
  ASSERT_TRUE(s.remove(expert_name(3, 4, "w3.weight_packed")));
  const std::string m = open_error(s, 3);
  EXPECT_HAS(m, "expert matrix '" + expert_name(2, 1, "w1.*") + "' has both weight_packed and weight");
  EXPECT_HAS(m, "missing tensor '" + expert_name(3, 4, "w3.weight_packed") + "'");
  EXPECT_HAS(m, "found only its weight_scale");
}

TEST(Checkpoint, PackedGeometry) {
  SynthCheckpoint s = make_tiny_checkpoint(true);
  StTensor* scale = s.find(expert_name(1, 0, "w2.weight_scale"));  // [64, 3] -> [64, 2]
  scale->shape = {64, 2};
  scale->data.resize(128);
  StTensor* packed = s.find(expert_name(4, 6, "w1.weight_packed"));  // logical [96, 32]
  packed->shape = {96, 16};
  packed->data.resize(96 * 16);
  StTensor* sc = s.find(expert_name(4, 6, "w1.weight_scale"));
  sc->shape = {96, 1};
  sc->data.resize(96);
  const std::string m = open_error(s, 3);
  EXPECT_HAS(m, expert_name(1, 0, "w2.weight_packed") + "' (shard " + s.shards[1].file +
                    ") shape [64, 48] does not match its weight_scale [64, 2]");
  EXPECT_HAS(m, expert_name(4, 6, "w1.weight_packed") +
                    "' (shard " + s.shards[4].file + ") has shape [96, 16], i.e. logical [96, 32], "
                    "but the config implies [96, 64]");
}

// A scale stored as F8_E8M0 is the same byte as the release's U8 (K3-MODEL §5.8); the nibbles
// are U8 only (refused by name otherwise).
TEST(Checkpoint, Mxfp4ScalesMayBeF8E8M0) {
  SynthCheckpoint s = make_tiny_checkpoint(true);
  for (SynthShard& sh : s.shards)
    for (StTensor& t : sh.tensors)
      if (t.name.ends_with(".weight_scale")) t.dtype = "F8_E8M0";
  {
    TempDir dir("ckpt_e8m0");
    auto r = write_and_open(s, dir);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(r->expert_storage(), ExpertStorage::kMxfp4);
    EXPECT_EQ(r->expert_summary().contiguous, r->expert_summary().count);
    const auto scale = r->find(expert_name(1, 0, "w1.weight_scale"));
    ASSERT_TRUE(scale.has_value());
    EXPECT_EQ(scale->info->dtype, DType::kE8M0);
  }
  s.find(expert_name(2, 3, "w2.weight_packed"))->dtype = "F8_E8M0";
  EXPECT_HAS(open_error(s, 3), "tensor '" + expert_name(2, 3, "w2.weight_packed") +
                                   "' is F8_E8M0, MXFP4 nibbles must be U8");
}

TEST(Checkpoint, PackedExpertsNeedQuantizationConfig) {
  SynthCheckpoint s = make_tiny_checkpoint(true);
  s.config["text_config"].erase("quantization_config");
  EXPECT_HAS(open_error(s, 3), "tensor '" + expert_name(1, 0, "w1.weight_packed") +
                                   "' is MXFP4-packed but " );
  EXPECT_HAS(open_error(s, 3), "config.json has no quantization_config");
}

TEST(Checkpoint, UnknownTensorsUnderLayers) {
  SynthCheckpoint s = make_tiny_checkpoint(true);
  s.shards[4].tensors.push_back(ktier::test::filled(kP + "4.self_attn.extra.weight", "BF16", {2, 2}, 5));
  s.shards[4].tensors.push_back(ktier::test::filled(expert_name(4, 8, "w1.weight_packed"), "U8", {96, 32}, 6));
  const std::string m = open_error(s, 3);
  EXPECT_HAS(m, "unknown tensor '" + kP + "4.self_attn.extra.weight' in shard " + s.shards[4].file +
                    " (not implied by the config)");
  EXPECT_HAS(m, "unknown tensor '" + expert_name(4, 8, "w1.weight_packed") + "' in shard " +
                    s.shards[4].file + " (a packed tensor outside the routed experts");
  // Outside the layers too, in the text model (§2.5 rule 9); the vision tensors stay ignored.
  SynthCheckpoint outside = make_tiny_checkpoint(true);
  outside.shards[13].tensors.push_back(
      ktier::test::filled("language_model.lm_head.weight_scale", "U8", {256, 4}, 7));
  outside.shards.back().tensors.push_back(
      ktier::test::filled("vision_tower.blocks.0.weight_packed", "U8", {4, 4}, 8));
  const std::string o = open_error(outside, 3);
  EXPECT_HAS(o, "unknown tensor 'language_model.lm_head.weight_scale' in shard " +
                    outside.shards[13].file + " (a packed tensor outside the routed experts");
  EXPECT_EQ(o.find("vision_tower"), std::string::npos) << o;
}

TEST(Checkpoint, NonContiguousExpertFallsBackToPartReads) {
  SynthCheckpoint s = make_tiny_checkpoint(true);
  auto& ts = s.shards[1].tensors;
  for (const char* part : {"w2.weight_packed", "w2.weight_scale"}) {  // move to the shard's end
    auto it = std::find_if(ts.begin(), ts.end(),
                           [&](const StTensor& t) { return t.name == expert_name(1, 3, part); });
    ASSERT_NE(it, ts.end());
    StTensor moved = *it;
    ts.erase(it);
    ts.push_back(std::move(moved));
  }
  TempDir dir("ckpt_noncontig");
  auto r = write_and_open(s, dir);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->expert_summary().contiguous, 95u);
  EXPECT_TRUE(r->expert(1, 2).contiguous);
  EXPECT_TRUE(r->expert(1, 4).contiguous);
  const ExpertLocation& loc = r->expert(1, 3);
  EXPECT_FALSE(loc.contiguous);
  ASSERT_EQ(loc.num_parts, 6u);
  for (size_t p = 0; p < 6; ++p) {
    const std::string name = expert_name(1, 3, ExpertLocation::kPackedPartNames[p]);
    std::vector<uint8_t> got(loc.parts[p].nbytes);
    ASSERT_TRUE(r->shard(loc.parts[p].shard).read_bytes(loc.parts[p].file_offset, got.size(), got.data()).is_ok());
    EXPECT_EQ(got, s.find(name)->data) << name;
  }
}

// ---- index and shard problems ----------------------------------------------------------------------

TEST(Checkpoint, IndexEntryPointingAtTheWrongShard) {
  SynthCheckpoint s = make_tiny_checkpoint(true);
  auto index = s.make_index();
  const std::string name = kP + "6.self_attn.o_proj.weight";
  index["weight_map"][name] = s.shards[7].file;
  s.index_override = index;
  const std::string m = open_error(s, 3);
  EXPECT_HAS(m, "model.safetensors.index.json: maps tensor '" + name + "' to shard " + s.shards[7].file +
                    ", but it is in the header of shard " + s.shards[6].file);
}

TEST(Checkpoint, IndexProblems) {
  SynthCheckpoint s = make_tiny_checkpoint(true);
  auto index = s.make_index();
  index["weight_map"]["language_model.model.norm.weight"] = "model-00099-of-000015.safetensors";
  s.index_override = index;
  EXPECT_HAS(open_error(s, 3), "maps tensor 'language_model.model.norm.weight' to shard "
                               "model-00099-of-000015.safetensors, which does not exist");

  index = s.make_index();
  index["metadata"]["total_size"] = index["metadata"]["total_size"].get<uint64_t>() + 1;
  s.index_override = index;
  EXPECT_HAS(open_error(s, 3), "metadata.total_size is");
  // Without total_size, or with null (a cross-check only, §3.3), the index is read.
  for (const bool null : {false, true}) {
    if (null)
      index["metadata"]["total_size"] = nullptr;
    else
      index["metadata"].erase("total_size");
    s.index_override = index;
    TempDir dir("ckpt_no_total");
    auto r = write_and_open(s, dir);
    EXPECT_TRUE(r.is_ok()) << null << ": " << r.status().message();
  }

  index = s.make_index();
  index["weight_map"].erase("language_model.model.norm.weight");
  s.index_override = index;
  EXPECT_HAS(open_error(s, 3), "does not list tensor 'language_model.model.norm.weight' held by shard " +
                                   s.shards[13].file);

  index = s.make_index();
  index["weight_map"]["language_model.model.norm.weight"] = "../elsewhere.safetensors";
  s.index_override = index;
  EXPECT_HAS(open_error(s, 3), "expected a shard file name");

  index = s.make_index();
  index["weight_map"][kP + "0.extra"] = s.shards[0].file;  // indexed, but the header lacks it
  s.index_override = index;
  EXPECT_HAS(open_error(s, 3), "maps tensor '" + kP + "0.extra' to shard " + s.shards[0].file +
                                   ", but no shard header has it");
}

TEST(Checkpoint, MalformedIndexFiles) {
  const SynthCheckpoint s = make_tiny_checkpoint(true);
  const std::string weights = s.make_index()["weight_map"].dump();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"metadata": {"total_size": 1}, "weight_map": [1]})", "weight_map is an array, expected an object"},
      {R"({"metadata": {"total_size": 1}})", "has no \"weight_map\" object"},
      {R"({"weight_map": {"a": 5}})", "weight_map['a'] is 5, expected a shard file name"},
      {R"({"metadata": {"total_size": -3}, "weight_map": {}})", "metadata.total_size is -3"},
      {R"({"weight_map": {"a": "x.safetensors"},)", "not valid JSON"},
      {s.make_index().dump() + std::string(1, '\0') + "junk", "holds a NUL byte at byte"},
      {R"({"metadata": {"total_size": 1}, "weight_map": {"language_model.model.norm.weight": ")" +
           s.shards[13].file + R"(", "language_model.model.norm.weight": ")" + s.shards[13].file + "\"}}",
       "lists tensor 'language_model.model.norm.weight' more than once"},
  };
  for (const auto& [text, want] : cases) {
    TempDir dir("ckpt_badindex");
    SynthCheckpoint copy = s;
    copy.write_index = false;
    copy.write(dir.path());
    ktier::test::write_text(dir.path() / "model.safetensors.index.json", text);
    auto r = Checkpoint::open(dir.path());
    ASSERT_FALSE(r.is_ok()) << text;
    EXPECT_EQ(r.status().exit_code(), 3) << r.status().message();
    EXPECT_HAS(r.status().message(), "model.safetensors.index.json: ");
    EXPECT_HAS(r.status().message(), want);
  }
  // Unknown members and unknown metadata are skipped.
  TempDir dir("ckpt_index_extra");
  SynthCheckpoint copy = s;
  auto index = copy.make_index();
  index["metadata"]["format"] = {{"nested", {1, 2, {{"x", nullptr}}}}};
  index["extra"] = {1, {{"weight_map", 5}}};
  copy.index_override = index;
  auto r = write_and_open(copy, dir);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
}

TEST(Checkpoint, TensorInTwoShards) {
  SynthCheckpoint s = make_tiny_checkpoint(true);
  s.shards[14].tensors.push_back(*s.find("language_model.model.norm.weight"));
  EXPECT_HAS(open_error(s, 3), "tensor 'language_model.model.norm.weight' is in both shard " +
                                   s.shards[13].file + " and shard " + s.shards[14].file);
}

TEST(Checkpoint, TruncatedShard) {
  SynthCheckpoint s = make_tiny_checkpoint(true);
  TempDir dir("ckpt_trunc");
  s.write(dir.path());
  const auto shard = dir.path() / s.shards[5].file;
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 5);
  auto r = Checkpoint::open(dir.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 3);
  EXPECT_HAS(r.status().message(), s.shards[5].file + ": truncated: tensor '" +
                                       s.shards[5].tensors.back().name + "'");
}

TEST(Checkpoint, ConfigProblemsStayUsageErrors) {
  SynthCheckpoint s = make_tiny_checkpoint(true);
  s.config["text_config"]["hidden_act"] = "silu";
  EXPECT_HAS(open_error(s, 2), "config.json: text_config.hidden_act: is \"silu\"");
}

TEST(Checkpoint, DirectoriesWithoutWeights) {
  TempDir dir("ckpt_empty");
  SynthCheckpoint s = make_tiny_checkpoint(true);
  ktier::test::write_text(dir.path() / "config.json", s.config.dump());
  auto r = Checkpoint::open(dir.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_HAS(r.status().message(), "no weights");

  s.write_index = false;
  s.write(dir.path());
  r = Checkpoint::open(dir.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 3);
  EXPECT_HAS(r.status().message(), "15 safetensors shards but no model.safetensors.index.json");

  r = Checkpoint::open(ktier::test::conformance_dir() / "cache");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_HAS(r.status().message(), "config.json: not found");

  r = Checkpoint::open(dir.path() / "does-not-exist");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 2);
}

}  // namespace
}  // namespace ktier::format
