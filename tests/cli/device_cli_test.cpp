// `--device cuda` through the command line on the tiny checkpoint: where a CUDA device is usable
// (a GPU, or the host emulation's module that CTest's cuda_emulation.cli loads through
// KTIER_CUDA_MODULE); skips, saying why, elsewhere. The end-to-end criteria at the
// command line: teacher-forced argmax equal to the CPU's wherever its top-2 margin exceeds 1e-3,
// greedy ids equal up to the first near tie, the same ids at three VRAM budgets; and `bench
// device` measuring on the device.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/run_process.h"
#include "common/test_paths.h"

namespace ktier::test {
namespace {

namespace fs = std::filesystem;

std::string ktier() { return ktier_bin().string(); }

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

class DeviceCli : public ::testing::Test {
 protected:
  void SetUp() override {
    const ProcessResult doctor = run_process(ktier() + " doctor");
    if (doctor.out.find("using the CPU path") != std::string::npos ||
        doctor.out.find("(unusable") != std::string::npos)
      GTEST_SKIP() << "no usable CUDA device here: " << doctor.out;
    dir_ = fs::temp_directory_path() / ("ktier-device-cli-" + std::to_string(::getpid()));
    const ProcessResult r =
        run_process(ktier() + " synth --preset tiny --seed 0 -q --force -o " + dir_.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::ifstream in(source_dir() / "tests/fixtures/golden/tiny-mxfp4.json");
    golden_ = nlohmann::json::parse(in);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string model() const { return " -m " + dir_.string(); }
  std::string prompt_ids() const {
    return join_ids(golden_.at("prompt_ids").get<std::vector<int>>());
  }

  fs::path dir_;
  nlohmann::json golden_;
};

// --device auto on a GPU too small for the run at its default --vram (90% of the free memory;
// an emulated GPU of 1 MiB, and -c 1024 for a working set past it): the CPU decodes instead,
// saying why (and that --gpu-prefill cublas no longer applies), and prints the CPU's ids;
// --device cuda, or a --vram given, refuses (exit 4), the former naming the default it used.
TEST_F(DeviceCli, AutoFallsBackToTheCpuWhereTheGpuIsTooSmall) {
  const ProcessResult doctor = run_process(ktier() + " doctor");
  if (doctor.out.find("ktier host emulation") == std::string::npos)
    GTEST_SKIP() << "needs the emulated device (its memory is KTIER_CUDA_EMULATION_MIB)";
  const std::string small = "KTIER_CUDA_EMULATION_MIB=1 ";
  const std::string args =
      " run" + model() + " --ids " + prompt_ids() + " -n 6 -c 1024 --print-ids";
  const ProcessResult cpu = run_process(ktier() + args + " --device cpu");
  const ProcessResult fallback = run_process(small + ktier() + args + " --gpu-prefill cublas");
  const ProcessResult cuda = run_process(small + ktier() + args + " --device cuda");
  const ProcessResult given = run_process(small + ktier() + args + " --vram 900K");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  ASSERT_EQ(fallback.exit_code, 0) << fallback.err;
  EXPECT_EQ(fallback.out, cpu.out);
  EXPECT_NE(fallback.err.find("the GPU is too small for this run, decoding on the CPU"),
            std::string::npos)
      << fallback.err;
  EXPECT_NE(fallback.err.find("; --gpu-prefill cublas ignored)"), std::string::npos)
      << fallback.err;
  EXPECT_EQ(cuda.exit_code, 4) << cuda.err;
  EXPECT_NE(cuda.err.find("--vram was not given: it is 90% of the"), std::string::npos)
      << cuda.err;
  EXPECT_EQ(given.exit_code, 4) << given.err;
  EXPECT_EQ(given.err.find("decoding on the CPU"), std::string::npos) << given.err;

  // A conversation a CPU run saved goes on after the fallback as it does on the CPU (the run
  // planned its positions by the device asked for, and skipped closing its last answer).
  const fs::path saved = dir_ / "conversation.st", copy = dir_ / "conversation-copy.st";
  const std::string chat =
      " run" + model() + " --chat -i -n 4 -c 1024 --print-ids --prompt-cache ";
  ASSERT_EQ(run_process(ktier() + chat + saved.string() + " -p hi --device cpu </dev/null")
                .exit_code,
            0);
  fs::copy_file(saved, copy);
  const ProcessResult on_cpu =
      run_process("echo there | " + ktier() + chat + saved.string() + " --device cpu");
  const ProcessResult resumed =
      run_process("echo there | " + small + ktier() + chat + copy.string());
  ASSERT_EQ(on_cpu.exit_code, 0) << on_cpu.err;
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(resumed.out, on_cpu.out);
  EXPECT_NE(resumed.err.find("decoding on the CPU"), std::string::npos) << resumed.err;
}

TEST_F(DeviceCli, CudaAgreesWithTheCpuAndIsTheSameAtEveryVramBudget) {
  // Teacher-forced argmax against the CPU's (the golden file) where the CPU's margin is clear.
  const ProcessResult eval =
      run_process(ktier() + " eval" + model() + " --ids " + prompt_ids() + " --argmax" +
                  " --device cuda");
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  const std::vector<int> argmax = split_ids(last_line(eval.out));
  const nlohmann::json& forced = golden_.at("teacher_forced");
  ASSERT_EQ(argmax.size(), forced.size()) << eval.out;
  int compared = 0;
  for (size_t i = 0; i < forced.size(); ++i) {
    if (forced[i].at("top2_margin").get<double>() <= 1e-3) continue;
    EXPECT_EQ(argmax[i], forced[i].at("argmax").get<int>()) << "position " << i;
    ++compared;
  }
  EXPECT_GT(compared, 0);

  // Greedy: everything resident first; its report sizes the smaller budgets as
  // bench/device-check.sh does (10 % of the experts; half the trunk, the rest streamed).
  const int n = static_cast<int>(golden_.at("greedy").size());
  auto greedy = [&](const std::string& vram, const fs::path& report) {
    const ProcessResult r = run_process(ktier() + " run" + model() + " --ids " + prompt_ids() +
                                        " -n " + std::to_string(n) + " --device cuda --vram " +
                                        vram + " --print-ids --report-json " + report.string());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return last_line(r.out);
  };
  const fs::path resident_report = dir_ / "resident.json";
  const std::string resident = greedy("64M", resident_report);
  const nlohmann::json j = read_json(resident_report);
  const nlohmann::json& d = j.at("device");
  const nlohmann::json& v = j.at("tiers").at("vram");
  const uint64_t trunk = d.at("trunk_bytes"), working = d.at("working_set_bytes");
  const uint64_t keys = d.at("expert_keys"), slot = v.at("slot_bytes");
  EXPECT_GT(d.at("host_page_locked_bytes").get<uint64_t>(), 0u) << "the RAM tier's arena";
  EXPECT_EQ(d.at("host_page_lock_refused_bytes").get<uint64_t>(), 0u);
  const uint64_t bypass = v.at("slots").get<uint64_t>() - v.at("policy_slots").get<uint64_t>();
  EXPECT_EQ(d.at("trunk_layers_resident").get<int>(),
            golden_.at("config_summary").at("num_hidden_layers").get<int>());
  const std::string few_experts = std::to_string(trunk + working + (keys / 10 + bypass) * slot);
  const std::string half_trunk = std::to_string(trunk / 2 + working + 2 * bypass * slot);
  const fs::path small_report = dir_ / "small.json", half_report = dir_ / "half.json";
  EXPECT_EQ(greedy(few_experts, small_report), resident) << "10% of the experts in VRAM";
  EXPECT_LT(read_json(small_report).at("tiers").at("vram").at("slots").get<uint64_t>(),
            v.at("slots").get<uint64_t>());
  EXPECT_EQ(greedy(half_trunk, half_report), resident) << "half the trunk in VRAM";
  EXPECT_LT(read_json(half_report).at("device").at("trunk_layers_resident").get<int>(),
            d.at("trunk_layers_resident").get<int>());

  // Equal to the CPU's greedy ids up to the first step whose CPU margin is a near tie (there
  // the device may take the other id, and everything after differs).
  const std::vector<int> ids = split_ids(resident);
  const nlohmann::json& detail = golden_.at("greedy_detail");
  ASSERT_EQ(ids.size(), detail.size()) << resident;
  for (size_t i = 0; i < detail.size(); ++i) {
    if (detail[i].at("top2_margin").get<double>() <= 1e-3) break;
    EXPECT_EQ(ids[i], detail[i].at("argmax").get<int>()) << "greedy step " << i;
  }
}

// The GPU's logits do not depend on how eval chunks the ids (K3-MODEL §9.2): whole, 1 and 5
// at a time give the same bytes. --gpu-prefill cublas says so in the device line (the
// emulation's module has cuBLAS; a GPU's may not) and agrees with them by argmax wherever the
// CPU's margin is clear; its prompt cache says `cuda+cublas`, which a fused run does not use.
TEST_F(DeviceCli, ChunkingDoesNotChangeTheGpusLogits) {
  const auto eval = [&](const std::string& flags, const fs::path& logits) {
    const ProcessResult r = run_process(ktier() + " eval" + model() + " --ids " + prompt_ids() +
                                        " --device cuda --argmax --logits-out " +
                                        logits.string() + flags);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r;
  };
  const fs::path whole = dir_ / "whole.f32";
  const ProcessResult fused = eval("", whole);
  EXPECT_EQ(fused.err.find("cuBLAS"), std::string::npos) << fused.err;
  const std::string bytes = read_text(whole);
  ASSERT_EQ(bytes.size(), golden_.at("teacher_forced").size() *
                              golden_.at("config_summary").at("vocab_size").get<size_t>() * 4);
  for (const char* chunk : {"1", "5"}) {
    const fs::path p = dir_ / (std::string("chunk") + chunk + ".f32");
    eval(std::string(" --chunk ") + chunk, p);
    EXPECT_TRUE(read_text(p) == bytes) << "--chunk " << chunk << " changed the GPU's logits";
  }
  const ProcessResult blas = eval(" --gpu-prefill cublas", dir_ / "cublas.f32");
  // doctor says beforehand what the run found.
  const bool found = blas.err.find("no cuBLAS") == std::string::npos;
  const ProcessResult doctor = run_process(ktier() + " doctor");
  EXPECT_NE(doctor.out.find(std::string("cuda: --gpu-prefill cublas: ") +
                            (found ? "available" : "unavailable")),
            std::string::npos)
      << doctor.out;
  if (!found) return;
  EXPECT_NE(blas.err.find("cuBLAS prefill"), std::string::npos) << blas.err;
  const std::vector<int> a = split_ids(last_line(fused.out)), b = split_ids(last_line(blas.out));
  const nlohmann::json& forced = golden_.at("teacher_forced");
  ASSERT_EQ(a.size(), forced.size()) << fused.out;
  ASSERT_EQ(b.size(), forced.size()) << blas.out;
  for (size_t i = 0; i < forced.size(); ++i) {
    if (forced[i].at("top2_margin").get<double>() <= 1e-3) continue;
    EXPECT_EQ(a[i], b[i]) << "position " << i;
  }
  const fs::path cache = dir_ / "cublas.st";
  const std::string run = ktier() + " run" + model() + " --ids " + prompt_ids() +
                          " -n 1 --device cuda --prompt-cache " + cache.string();
  const ProcessResult saved = run_process(run + " --gpu-prefill cublas");
  ASSERT_EQ(saved.exit_code, 0) << saved.err;
  const ProcessResult not_used = run_process(run);
  EXPECT_EQ(not_used.exit_code, 0) << not_used.err;
  EXPECT_NE(not_used.err.find("holds a cuda+cublas run's state and this run is on the cuda: "
                              "not used"),
            std::string::npos)
      << not_used.err;
}

TEST_F(DeviceCli, BenchDeviceMeasuresTheDevice) {
  const fs::path json = dir_ / "bench-device.json";
  const ProcessResult r = run_process(ktier() + " bench device --device cuda --bytes 4M " +
                                      "--passes 1 --json " + json.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("cuda:0"), std::string::npos) << r.out;
  const nlohmann::json j = read_json(json);
  for (const char* key :
       {"copy_gbps", "h2d_gbps", "h2d_pinned_gbps", "bf16_gemv_gbps", "mxfp4_gemv_gbps"})
    EXPECT_GT(j.at(key).get<double>(), 0.0) << key;
}

}  // namespace
}  // namespace ktier::test
