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
