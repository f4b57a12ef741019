// `ktier inspect`, run as a process: output and exit codes.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/test_paths.h"
#include "format/st_builder.h"

namespace ktier::format {
namespace {

using ktier::test::make_tiny_checkpoint;
using ktier::test::SynthCheckpoint;
using ktier::test::SynthShard;
using ktier::test::StTensor;
using ktier::test::TempDir;
namespace fs = std::filesystem;

#define EXPECT_HAS(msg, text) EXPECT_NE((msg).find(text), std::string::npos) << "output: " << (msg)

struct ProcessResult {
  int exit_code = -1;
  std::string out;  // stdout, then stderr when `merge_stderr`
};

ProcessResult run_ktier(const std::string& args, bool merge_stderr = true) {
  const std::string cmd = "'" + ktier::test::ktier_bin().string() + "' " + args +
                          (merge_stderr ? " 2>&1" : " 2>/dev/null");
  ProcessResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(Inspect, PrintsTheSummaryOfAGoodCheckpoint) {
  TempDir dir("inspect_ok");
  make_tiny_checkpoint(true).write(dir.path());
  const ProcessResult r = run_ktier("inspect -m '" + dir.path().string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_HAS(r.out, "config: nested shape");
  EXPECT_HAS(r.out, "E 128, L 13, V 256");
  EXPECT_HAS(r.out, "KDA: 9 layers, 4 heads x 16 (width 64)");
  EXPECT_HAS(r.out, "MLA: 4 layers, 4 heads");
  EXPECT_HAS(r.out, "8 experts, top-2, 2 shared, latent 64, I 96");
  EXPECT_HAS(r.out, "quantization: compressed-tensors mxfp4-pack-quantized");
  EXPECT_HAS(r.out, "    0  KDA  dense  boundary\n");
  EXPECT_HAS(r.out, "    3  MLA  MoE    boundary\n");
  EXPECT_HAS(r.out, "    4  KDA  MoE\n");
  EXPECT_HAS(r.out, "   12  MLA  MoE    boundary\n");
  EXPECT_HAS(r.out, "tensors (15 shards, indexed)");
  EXPECT_HAS(r.out, "experts                576 tensors");
  EXPECT_HAS(r.out, "embeddings/head          5 tensors");
  EXPECT_HAS(r.out, "experts: MXFP4 (U8 packed + E8M0 scales), 96 experts, 9.56 KiB (9,792 bytes) each, "
                    "contiguous: yes (96 of 96)");
}

TEST(Inspect, LongModelsGetACompactLayerMap) {
  TempDir dir("inspect_long");
  make_tiny_checkpoint(true, 40).write(dir.path());
  const ProcessResult r = run_ktier("inspect -m '" + dir.path().string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_HAS(r.out, "layer map (40 layers, 0-based; | marks an AttnRes boundary):\n");
  std::string attn, ffn;  // AttnRes block size 3 in the tiny config
  for (int64_t l = 0; l < 40; ++l) {
    if (l % 3 == 0) attn += '|', ffn += '|';
    attn += ktier::test::tiny_is_mla(l, 40) ? 'M' : 'K';
    ffn += l == 0 ? 'D' : 'E';
  }
  EXPECT_HAS(r.out, "  attention  " + attn + "   (K = KDA, M = MLA)\n");
  EXPECT_HAS(r.out, "  ffn        " + ffn + "   (D = dense, E = MoE)\n");
  EXPECT_HAS(r.out, "  MLA layers: 3 7 11 15 19 23 27 31 35 39\n");
  EXPECT_HAS(r.out, "  boundaries: 0 3 6 9");
  EXPECT_EQ(r.out.find("  39  MLA"), std::string::npos) << "no per-layer lines for long models";
}

TEST(Inspect, Json) {
  TempDir dir("inspect_json");
  make_tiny_checkpoint(true).write(dir.path());
  const ProcessResult r = run_ktier("inspect --json -m '" + dir.path().string() + "'", false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["config"]["shape"], "nested");
  EXPECT_EQ(j["config"]["mla_layers"], 4);
  EXPECT_EQ(j["layers"].size(), 13u);
  EXPECT_EQ(j["layers"][12]["attention"], "MLA");
  EXPECT_EQ(j["census"]["experts"]["tensors"], 576);
  EXPECT_EQ(j["experts"]["storage"], "MXFP4");
  EXPECT_EQ(j["experts"]["contiguous"], 96);
  EXPECT_EQ(j["shards"], 15);
  // A folder whose name is not UTF-8 (Linux names are bytes): still JSON, the byte as U+FFFD
  // (the library's default dump threw, and nothing was printed).
  const fs::path latin1 = dir.path().string() + "-caf\xe9";
  fs::create_directory_symlink(dir.path(), latin1);
  const ProcessResult odd = run_ktier("inspect --json -m '" + latin1.string() + "'", false);
  fs::remove(latin1);
  ASSERT_EQ(odd.exit_code, 0) << odd.out;
  const auto named = nlohmann::json::parse(odd.out);
  EXPECT_EQ(named["model"], dir.path().string() + "-caf\xEF\xBF\xBD");
  EXPECT_EQ(named["shards"], 15);
}

// --check-tensors reads the values: NaN/Inf in a used float tensor (BF16, F32, F16) is exit 3
// naming it; an MXFP4 scale byte 255 (U8 or F8_E8M0) is counted (exit 0); neither is looked
// for in an ignored (vision) tensor, nor in the packed nibbles (every code is a value).
TEST(Inspect, CheckTensorsCountsNonFiniteWeightsAndScale255) {
  SynthCheckpoint ck = make_tiny_checkpoint(true);
  uint64_t floats = 0, scales = 0, packed = 0, bytes = 0;
  const auto set = [&](const std::string& name, size_t element, std::vector<uint8_t> value) {
    StTensor* t = ck.find(name);
    ASSERT_NE(t, nullptr) << name;
    std::copy(value.begin(), value.end(), t->data.begin() + element * value.size());
  };
  // Finite floats and scales of 2^0 everywhere (the builder's filler bytes are random), the
  // final norm stored as F16, every nibble byte 0xff.
  StTensor* norm = ck.find("language_model.model.norm.weight");
  ASSERT_NE(norm, nullptr);
  norm->dtype = "F16";
  norm->data.resize(norm->data.size() / 2);
  for (SynthShard& sh : ck.shards)
    for (StTensor& t : sh.tensors) {
      const bool scale = t.name.ends_with(".weight_scale");
      const bool nibbles = t.name.ends_with(".weight_packed");
      std::fill(t.data.begin(), t.data.end(), scale ? 127 : nibbles ? 0xff : 0);
      if (!t.name.starts_with("language_model.")) continue;
      (scale ? scales : nibbles ? packed : floats) += 1;
      if (!nibbles) bytes += t.data.size();
    }
  const std::string w1_scale =
      "language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_scale";
  ck.find(w1_scale)->dtype = "F8_E8M0";  // counted as the U8 scales are
  set(w1_scale, 3, {255});
  set(w1_scale, 7, {255});
  set("vision_tower.patch_embed.proj.weight", 0, {0xc1, 0x7f});  // NaN, ignored
  TempDir dir("inspect_values");
  ck.write(dir.path());
  const std::string cmd = "inspect --check-tensors -m '" + dir.path().string() + "'";
  const ProcessResult clean = run_ktier(cmd);
  ASSERT_EQ(clean.exit_code, 0) << clean.out;
  EXPECT_HAS(clean.out, "check-tensors: " + std::to_string(floats + scales) + " tensors read, ");
  EXPECT_HAS(clean.out,
             "; " + std::to_string(packed) + " tensors of MXFP4 nibbles need no check\n");
  EXPECT_HAS(clean.out, "NaN/Inf: none\n");
  EXPECT_HAS(clean.out, "MXFP4 scale 255 (NaN in OCP MX; a zero block in ktier, K3-MODEL D12): "
                        "2 blocks in 1 tensor\n  " + w1_scale +
                            " (model-00002-of-000015.safetensors): 2 blocks, the first at "
                            "element 3\n");

  const std::string bias =
      "language_model.model.layers.1.block_sparse_moe.gate.e_score_correction_bias";
  const std::string o_proj = "language_model.model.layers.2.self_attn.o_proj.weight";
  set(bias, 3, {0x00, 0x00, 0x80, 0x7f});  // F32 +Inf
  set(o_proj, 5, {0xc1, 0x7f});             // BF16 NaN
  set(o_proj, 9, {0x80, 0xff});             // BF16 -Inf
  set("language_model.model.norm.weight", 2, {0x00, 0x7e});  // F16 NaN
  ck.write(dir.path());
  const ProcessResult bad = run_ktier(cmd);
  EXPECT_EQ(bad.exit_code, 3) << bad.out;
  EXPECT_HAS(bad.out, "NaN/Inf: 2 NaN and 2 Inf in 3 tensors\n  " + bias +
                          " (model-00002-of-000015.safetensors): 0 NaN, 1 Inf, the first at "
                          "element 3\n  " + o_proj +
                          " (model-00003-of-000015.safetensors): 1 NaN, 1 Inf, the first at "
                          "element 5\n  language_model.model.norm.weight");
  EXPECT_HAS(bad.out, "ktier: error: " + dir.path().string() + ": 3 tensor(s) hold NaN or Inf "
                      "values, e.g. '" + bias + "' in model-00002-of-000015.safetensors");
  const ProcessResult json = run_ktier("inspect --json --check-tensors -m '" +
                                       dir.path().string() + "'", false);
  EXPECT_EQ(json.exit_code, 3);
  const auto j = nlohmann::json::parse(json.out);
  const auto& v = j.at("check_tensors");
  EXPECT_EQ(v.at("tensors_read"), floats + scales);
  EXPECT_EQ(v.at("bytes_read"), bytes);
  EXPECT_EQ(v.at("tensors_skipped"), packed);
  EXPECT_EQ(v.at("nan"), 2);
  EXPECT_EQ(v.at("inf"), 2);
  EXPECT_EQ(v.at("scale_255"), 2);
  ASSERT_EQ(v.at("nonfinite_tensors").size(), 3u);
  EXPECT_EQ(v.at("nonfinite_tensors")[2].at("tensor"), "language_model.model.norm.weight");
  EXPECT_EQ(v.at("nonfinite_tensors")[2].at("nan"), 1);
  EXPECT_EQ(v.at("nonfinite_tensors")[2].at("first_element"), 2);
  EXPECT_EQ(v.at("scale_255_tensors")[0].at("tensor"), w1_scale);
}

TEST(Inspect, ExitCodesOnBadInput) {
  ProcessResult r = run_ktier("inspect -m '" + (ktier::test::conformance_dir() / "cache").string() + "'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_HAS(r.out, "ktier: error: ");
  EXPECT_HAS(r.out, "config.json: not found");

  TempDir dir("inspect_bad");
  auto s = make_tiny_checkpoint(true);
  s.remove("language_model.model.layers.2.mlp_res_norm.weight");
  s.write(dir.path());
  r = run_ktier("inspect -m '" + dir.path().string() + "'");
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_HAS(r.out, "missing tensor 'language_model.model.layers.2.mlp_res_norm.weight'");

  r = run_ktier("inspect");
  EXPECT_EQ(r.exit_code, 2);
}

}  // namespace
}  // namespace ktier::format
