// `ktier bench kernels` in its --quick mode: the command runs end to end and writes every figure
// the acceptance checks read. Never a timing assertion: only "present, finite, positive".
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "common/run_process.h"
#include "common/test_paths.h"

namespace ktier::test {
namespace {

std::string ktier() { return ktier_bin().string(); }

void expect_positive(const nlohmann::json& j, const char* key) {
  ASSERT_TRUE(j.contains(key)) << "missing " << key << " in " << j.dump();
  ASSERT_TRUE(j[key].is_number()) << key;
  const double v = j[key].get<double>();
  EXPECT_TRUE(std::isfinite(v) && v > 0) << key << " = " << v;
}

TEST(CliBench, QuickKernelsWritesTableAndJson) {
  const auto json_path = std::filesystem::temp_directory_path() /
                         ("ktier_bench_kernels_" + std::to_string(::getpid()) + ".json");
  const auto r =
      run_process(ktier() + " bench kernels --quick --threads 2 --json " + json_path.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* what : {"memory read", "bf16 gemv", "mxfp4 gemv", "ratio", "double fma",
                           "bf16 prefill", "mxfp4 prefill"})
    EXPECT_NE(r.out.find(what), std::string::npos) << "table lacks " << what << ":\n" << r.out;

  std::ifstream in(json_path);
  ASSERT_TRUE(in) << "no JSON written";
  const nlohmann::json j = nlohmann::json::parse(in);
  std::filesystem::remove(json_path);
  expect_positive(j, "mem_read_gbps");
  expect_positive(j, "llc_bytes");
  expect_positive(j, "buffer_bytes");
  EXPECT_DOUBLE_EQ(j.value("goal_bf16", 0.0), 0.85);
  EXPECT_DOUBLE_EQ(j.value("goal_mxfp4", 0.0), 0.75);
  EXPECT_TRUE(j.value("quick", false));
  ASSERT_TRUE(j.contains("buffer_under_4x_llc"));  // 8 MiB: true wherever the LLC is over 2 MiB
  EXPECT_EQ(j["buffer_under_4x_llc"].get<bool>(),
            j["buffer_bytes"].get<double>() < 4 * j["llc_bytes"].get<double>());
  ASSERT_TRUE(j.contains("results") && j["results"].is_array());
  ASSERT_EQ(j["results"].size(), 2u) << "expected 1 thread and 2 threads";
  EXPECT_EQ(j["results"][0].value("threads", 0), 1);
  EXPECT_EQ(j["results"][1].value("threads", 0), 2);
  for (const auto& t : j["results"])
    for (const char* key : {"mem_read_gbps", "bf16_gemv_gbps", "bf16_ratio", "mxfp4_gemv_gbps",
                            "mxfp4_ratio", "fma_gmacs", "bf16_prefill_gmacs", "bf16_prefill_ratio",
                            "mxfp4_prefill_gmacs", "mxfp4_prefill_ratio"})
      expect_positive(t, key);
}

#ifdef KTIER_IO_BENCH
// ktier_io_bench --file names a file to read, which may be a model shard: an existing one is
// never written or removed (one of another size is refused, exit 2); only the file it made
// itself is removed at the end.
TEST(IoBench, NeverWritesOrRemovesAFileItDidNotMake) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ktier_io_bench_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string shard = (dir / "model-00001-of-00096.safetensors").string();
  const std::string bytes(3000, 'k');
  std::ofstream(shard, std::ios::binary) << bytes;
  const std::string bench = std::string(KTIER_IO_BENCH) + " --block 64K --runs 1 --file ";
  const auto content = [&] {
    std::ifstream in(shard, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };

  auto r = run_process(bench + shard + " --size 1M");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find(shard + ": exists with 3000 bytes, not --size 1048576"), std::string::npos)
      << r.err;
  EXPECT_EQ(content(), bytes);
  r = run_process(bench + shard + " --size 3000");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // Its unaligned end read with O_DIRECT too (where the filesystem has O_DIRECT at all).
  EXPECT_EQ(r.out.find("pread failed"), std::string::npos) << r.out;
  EXPECT_EQ(content(), bytes);

  const std::string made = (dir / "made.bin").string();
  r = run_process(bench + made + " --size 1M");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(std::filesystem::exists(made));
  std::filesystem::remove_all(dir);
}
#endif

// `bench device` on the emulated device (GPU mode's code on the CPU): the figures the device
// script's table reads are written. Where CUDA cannot be used, `--device cuda` exits 2 with the
// reason, as `run --device cuda` does.
TEST(CliBench, DeviceOnEmulatedWritesFiguresAndCudaWithoutGpuExitsTwo) {
  const auto json_path = std::filesystem::temp_directory_path() /
                         ("ktier_bench_device_" + std::to_string(::getpid()) + ".json");
  const auto r = run_process(ktier() + " bench device --device emulated --bytes 4M --passes 1 --json " +
                             json_path.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(json_path);
  ASSERT_TRUE(in) << "no JSON written";
  const nlohmann::json j = nlohmann::json::parse(in);
  std::filesystem::remove(json_path);
  for (const char* key : {"copy_gbps", "h2d_gbps", "h2d_pinned_gbps", "bf16_gemv_gbps",
                          "bf16_ratio", "mxfp4_gemv_gbps", "mxfp4_ratio"})
    expect_positive(j, key);
  // Stdout: a line per figure, in the order measured (that each is printed as soon as it is
  // measured, before a later step could fail, is not seen here: the emulated device does not
  // fail).
  size_t at = 0;
  for (const char* key : {"copy_gbps", "h2d_gbps", "h2d_pinned_gbps", "bf16_gemv_gbps",
                          "mxfp4_gemv_gbps"}) {
    at = r.out.find(std::string("\n") + key + " ", at);
    ASSERT_NE(at, std::string::npos) << key << " not printed in order:\n" << r.out;
  }

  if (run_process(ktier() + " doctor").out.find("using the CPU path") == std::string::npos)
    GTEST_SKIP() << "a GPU is usable here: the no-GPU half does not apply";
  const auto cuda = run_process(ktier() + " bench device --device cuda --bytes 4M");
  EXPECT_EQ(cuda.exit_code, 2) << cuda.err;
  EXPECT_NE(cuda.err.find("ktier: error: --device cuda: CUDA cannot be used"), std::string::npos)
      << cuda.err;
}

TEST(CliBench, BadOptionsExitTwo) {
  EXPECT_EQ(run_process(ktier() + " bench").exit_code, 2);
  EXPECT_EQ(run_process(ktier() + " bench kernels --quick --threads 5000").exit_code, 2);
  EXPECT_EQ(run_process(ktier() + " bench kernels --reps 0").exit_code, 2);
  // --quick sets the size and the passes itself: given with either, refused, not overridden.
  EXPECT_EQ(run_process(ktier() + " bench kernels --quick --passes 3").exit_code, 2);
  EXPECT_EQ(run_process(ktier() + " bench kernels --quick --size-mib 64").exit_code, 2);
  EXPECT_EQ(run_process(ktier() + " bench kernels --quick --threads many").exit_code, 2);
  // A size of 0 was the default, silently; refused as bench io's --raw-block-mib 0 is.
  const auto zero_size = run_process(ktier() + " bench kernels --size-mib 0");
  EXPECT_EQ(zero_size.exit_code, 2);
  EXPECT_NE(zero_size.err.find("--size-mib: Value 0 not in range"), std::string::npos)
      << zero_size.err;
  const auto zero_buffer = run_process(ktier() + " bench decode -m /nonexistent --buffer-mib 0");
  EXPECT_EQ(zero_buffer.exit_code, 2);
  EXPECT_NE(zero_buffer.err.find("--buffer-mib: Value 0 not in range"), std::string::npos)
      << zero_buffer.err;
  // More than the machine has free: a budget that cannot be met (exit 4, as bench inflate's).
  const auto huge = run_process(ktier() + " bench kernels --size-mib 1048576");
  EXPECT_EQ(huge.exit_code, 4) << huge.err;
  EXPECT_NE(huge.err.find("exceeds MemAvailable"), std::string::npos) << huge.err;
}

TEST(CliBench, UnwritableJsonExitsOneBeforeMeasuring) {
  const auto r = run_process(ktier() + " bench kernels --quick --json /nonexistent-dir/k.json");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cannot write /nonexistent-dir/k.json"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("bf16 gemv"), std::string::npos) << "measured before failing";
}

// `ktier bench decode` on the tiny checkpoint: runs end to end, JSON has every figure.
TEST(CliBench, DecodeOnTinyWritesJson) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("ktier_bench_decode_" + std::to_string(::getpid()));
  ASSERT_EQ(run_process(ktier() + " synth --preset tiny -q --force -o " + dir.string()).exit_code, 0);
  // Beside the model, not in it: an existing file inside -m is refused as an output.
  const std::filesystem::path json_path = dir.string() + "-decode.json";
  const auto r = run_process(ktier() + " bench decode -m " + dir.string() +
                             " -n 4 --buffer-mib 8 --prefill-tokens 37 --json " +
                             json_path.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("of the bandwidth floor"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("prefill ratio"), std::string::npos) << r.out;
  std::ifstream in(json_path);
  ASSERT_TRUE(in) << "no JSON written";
  const nlohmann::json j = nlohmann::json::parse(in);
  for (const char* key : {"decode_s_per_token", "decode_tok_per_s", "mem_read_gbps",
                          "floor_s_per_token", "ratio_to_floor"})
    expect_positive(j, key);
  EXPECT_EQ(j.at("decode_steps").get<int>(), 3);
  expect_positive(j.at("bytes_read_per_token"), "trunk");
  expect_positive(j.at("bytes_read_per_token"), "experts");
  ASSERT_TRUE(j.contains("prefill")) << j.dump();
  EXPECT_EQ(j.at("prefill").at("tokens").get<int>(), 37);
  for (const char* key : {"seconds", "tok_per_s", "gmacs", "fma_gmacs", "ratio_to_fma"})
    expect_positive(j.at("prefill"), key);
  EXPECT_EQ(run_process(ktier() + " bench decode -m " + dir.string() + " -n 1").exit_code, 2);
  // With a pack: the streamed-trunk check is added.
  ASSERT_EQ(run_process(ktier() + " pack -q -m " + dir.string() + " -o " + (dir / "pack").string()).exit_code, 0);
  const auto r2 = run_process(ktier() + " bench decode -m " + dir.string() + " -n 4 --buffer-mib 8 --pack " +
                              (dir / "pack").string() + " --json " + json_path.string());
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  std::ifstream in2(json_path);
  const nlohmann::json j2 = nlohmann::json::parse(in2);
  ASSERT_TRUE(j2.contains("streamed")) << j2.dump();
  for (const char* key : {"streamed_s_per_token", "io_s_per_token", "compute_s_per_token", "ratio_to_bound"})
    expect_positive(j2.at("streamed"), key);
  EXPECT_GT(j2.at("streamed").at("layers_streamed").get<int>(), 0);
  // A budget the streamed run cannot meet is refused before anything is measured, with the
  // sequence sized for the bench's own positions (4 prompt + 4 new), not run's default 4096.
  const auto small = run_process(ktier() + " bench decode -m " + dir.string() +
                                 " -n 4 --prompt-tokens 4 --buffer-mib 8 --pack " +
                                 (dir / "pack").string() + " --ram 1K");
  EXPECT_EQ(small.exit_code, 4) << small.err;
  EXPECT_NE(small.err.find("state and activations for 8 positions"), std::string::npos)
      << small.err;
  EXPECT_EQ(small.err.find("[bench]"), std::string::npos) << small.err;
  EXPECT_EQ(small.out, "");
  // The model's own files are not outputs.
  const auto over = run_process(ktier() + " bench decode -m " + dir.string() +
                                " -n 2 --buffer-mib 8 --json " + (dir / "config.json").string());
  EXPECT_EQ(over.exit_code, 2);
  EXPECT_NE(over.err.find("is inside -m"), std::string::npos) << over.err;
  // A report of the user's own inside the folder is written, and written again by a rerun.
  for (int run = 0; run < 2; ++run) {
    const auto mine = run_process(ktier() + " bench decode -m " + dir.string() +
                                  " -n 2 --prefill-tokens 0 --buffer-mib 8 --json " +
                                  (dir / "my-bench.json").string());
    EXPECT_EQ(mine.exit_code, 0) << "run " << run << ": " << mine.err;
  }
  std::filesystem::remove_all(dir);
  std::filesystem::remove(json_path);
}

// `ktier bench io` on a tiny pack: runs, JSON has the three figures the acceptance reads.
TEST(CliBench, IoOnTinyPackWritesJson) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("ktier_bench_io_" + std::to_string(::getpid()));
  ASSERT_EQ(run_process(ktier() + " synth --preset tiny -q --force -o " + (dir / "m").string()).exit_code, 0);
  ASSERT_EQ(run_process(ktier() + " pack -q -m " + (dir / "m").string() + " -o " + (dir / "p").string()).exit_code, 0);
  const auto json_path = dir / "io.json";
  const auto r = run_process(ktier() + " bench io --pack " + (dir / "p").string() +
                             " --passes 1 --raw-block-mib 1 --json " + json_path.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(json_path);
  ASSERT_TRUE(in) << "no JSON written";
  const nlohmann::json j = nlohmann::json::parse(in);
  for (const char* key : {"engine_gbps", "raw_gbps", "ratio"}) expect_positive(j, key);
  EXPECT_EQ(run_process(ktier() + " bench io --pack " + (dir / "nope").string()).exit_code, 2);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ktier::test
