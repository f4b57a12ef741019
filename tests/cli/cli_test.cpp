// The ktier executable as a user meets it: help, version, exit codes, CUDA fallback.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "common/run_process.h"
#include "common/test_paths.h"

namespace ktier::test {
namespace {

std::string ktier() { return ktier_bin().string(); }

TEST(Cli, HelpListsEverySubcommandAndExitsZero) {
  const auto r = run_process(ktier() + " --help");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const char* sub : {"run", "eval", "synth", "inspect", "tokenize", "doctor", "trace"})
    EXPECT_NE(r.out.find(sub), std::string::npos) << "--help does not mention " << sub;
}

TEST(Cli, VersionPrintsProjectVersion) {
  const auto r = run_process(ktier() + " --version");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.rfind("ktier 0.", 0), 0u) << r.out;
}

TEST(Cli, UsageErrorsExitTwo) {
  EXPECT_EQ(run_process(ktier()).exit_code, 2);
  const auto unknown = run_process(ktier() + " no-such-subcommand");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_EQ(unknown.err.rfind("ktier: error: unknown command 'no-such-subcommand' (choose from "
                              "run, eval, perplexity, synth,", 0), 0u)
      << unknown.err;
  // Nested commands too, and a missing one is asked for with the choices.
  for (const auto& [args, what] : std::vector<std::pair<std::string, std::string>>{
           {" trace bogus", "unknown trace command 'bogus' (choose from convert, convert-k3c, "
                            "info, replay)"},
           {" bench", "bench needs a command: kernels, decode, io, inflate, device"},
           {" --bogus", "unknown option '--bogus' before the command"},
           {" --log-level warn", "ktier needs a command: run, eval"},
           // CLI11 would read an empty value as zero (-n '' as -n 0, --pack= as no pack).
           {" run -m x --ids 1 -n ''", "--n-predict: empty value"},
           {" run -m x --ids 1 --pack ''", "--pack: empty value"},
           {" trace convert '' out", "IN: empty value"},
           // A list of none (only delimiters, or "=" and nothing) took the next argument.
           {" run -m x --ids 1 --stop-id , 24", "--stop-id: empty value"},
           {" run -m x --ids 1 --stop-id= 24", "--stop-id: empty value"},
           {" run -m x --ids 1 --stop-id ,,, -n 3", "--stop-id: empty value"},
           {" run -m x -p --stop-id=", "x: not a model directory"},  // the prompt's text
           // CLI11 alone wraps a negative value of an unsigned option to its largest, and
           // saturates one past it.
           {" synth --preset tiny -o x --seed -1", "--seed: '-1' is not a whole number"},
           {" run -m x --ids 1 --seed ' -1'", "--seed: ' -1' is not a whole number"},
           {" run -m x --ids 1 --seed 18446744073709551616",
            "--seed: '18446744073709551616' is not a whole number 0..18446744073709551614, or -1 "
            "(random)"},
           // -1's bits are the random seed, not a seed of their own.
           {" run -m x --ids 1 --seed 18446744073709551615",
            "--seed: '18446744073709551615' is not a whole number 0..18446744073709551614"},
           {" trace replay x --slots 4 --expert-bytes -1", "--expert-bytes: '-1' is not"},
           {" trace replay x --slots 4 --expert-bytes 1073741825",
            "--expert-bytes: '1073741825' is not a whole number 0..1073741824"},
           {" bench io --pack x --raw-block-mib 17592186044416",
            "--raw-block-mib: '17592186044416' is not a whole number 0..1048576"},
           {" bench io --pack x --raw-block-mib -1", "--raw-block-mib: '-1' is not"},
           {" run -m x --ids 1 -c 9223372036854775807", "-c/--ctx-size must be in 0..2147483647"},
           {" bench device --device emulated --bytes 0", "--bytes must be at least 1M"},
           {" eval -m x --ids 1 --gpu-prefill blas", "--gpu-prefill: blas not in {fused,cublas}"},
           // CLI11 alone reads integers in base 0 (0x3, and 010 as octal 8), saturates past
           // int64, and lets a float underflow to 0 (for --io-rate-limit "no cap").
           {" run -m x --ids 1 -n 0x3", "--n-predict: '0x3' is not a whole number in decimal"},
           {" run -m x --ids 1 -t 1e3", "--threads: '1e3' is not a whole number in decimal"},
           {" run -m x --ids 1 -c 99999999999999999999",
            "--ctx-size: '99999999999999999999' is out of range (-9223372036854775808.."},
           {" synth --preset tiny -o x --layers 2.5", "--layers: '2.5' is not a whole number"},
           {" run -m x --ids 1 --temp 1e-400",
            "--temp: '1e-400' is too small for a double (give 0 where 0 is meant)"},
           {" run -m x --ids 1 --ram 1G --io-rate-limit 1e-5000", "--io-rate-limit: '1e-5000'"},
           {" run -m x --ids 1 --top-p 1e999", "--top-p: '1e999' is too large for a double"},
           {" bench decode -m x -n 99999999999", "-n must be in 2..2147483647"},
           {" bench decode -m x --prompt-tokens 9223372036854775807",
            "--prompt-tokens must be in 1..2147483647"},
           {" bench decode -m x -n 2000000000 --prompt-tokens 2000000000",
            "--prompt-tokens + -n must be at most 2147483647 positions"},
           // Conformance-only flags given without the conversion were ignored.
           {" trace info x --top-k 7", "--top-k requires --convert-conformance"},
           // A block size no pack takes, before the checkpoint (seconds of validation on K3).
           {" pack -m x -o y --compress --block-size 5000",
            "--block-size 5000 must be a multiple of 4096"},
           {" trace replay x --slots 4 --experts-per-layer 3",
            "--experts-per-layer requires --convert-conformance"},
           // llama.cpp's flags are named, not read as bundles of ktier's one-letter flags
           // (-ngl as "-n gl", -fa as "-f a": a prompt file named 'a').
           {" run -m x --ids 1 -ngl 99", "'-ngl' is llama.cpp's flag; ktier's equivalent: "
                                         "ktier places the trunk and experts by --vram"},
           {" run -m x -fa --ids 1", "'-fa' is llama.cpp's flag"},
           {" run -m x -p hi -no-cnv", "'-no-cnv' is llama.cpp's flag"},
           {" run -m x -p hi -cmoe", "'-cmoe' is llama.cpp's flag"},
           {" run -m x -p hi -ncmoe 3", "'-ncmoe' is llama.cpp's flag"},
           {" run -mli -m x -p hi", "'-mli' is llama.cpp's flag"},
           {" run -m x --ids 1 --temperature=0.5",
            "'--temperature=0.5' is llama.cpp's flag; ktier's equivalent: --temp"},
           // ... but a prompt may say anything, and a file may be named so.
           {" run -m x -p -ngl", "x: not a model directory"},
           {" run -m x -f -co", "x: not a model directory"},
           {" run -m x --ids 1 --trace -ngl", "x: not a model directory"}}) {
    const auto r = run_process(ktier() + args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find("ktier: error: " + what), std::string::npos) << args << ": " << r.err;
  }
  // "--opt=" is CLI11's own refusal; a prompt that ends in '=' is still a prompt.
  EXPECT_EQ(run_process(ktier() + " run -m x --ids 1 --pack=").exit_code, 2);
  // Output a full disk or a closed descriptor refused: exit 1, not a silent 0.
  for (const char* redirect : {" >/dev/full", " >&-"}) {
    const auto r = run_process(ktier() + " doctor" + redirect);
    EXPECT_EQ(r.exit_code, 1) << redirect << ": " << r.err;
    EXPECT_NE(r.err.find("error writing standard output"), std::string::npos) << r.err;
  }
  // The last of a repeated option counts, --log-level too.
  EXPECT_EQ(run_process(ktier() + " --log-level loud --log-level warn doctor").exit_code, 0);
  const auto level = run_process(ktier() + " --log-level loud doctor");
  EXPECT_EQ(level.exit_code, 2);
  EXPECT_EQ(level.err.rfind("ktier: error: --log-level: unknown level 'loud'", 0), 0u) << level.err;
  // A debugging variable of the wrong form is a usage error naming it, before any command
  // (it once aborted, or was read as 0); a good one is taken.
  for (const char* env : {"KTIER_DEBUG_MEM_AVAILABLE_MIB=lots", "KTIER_DEBUG_MEM_AVAILABLE_MIB=0",
                          "KTIER_DEBUG_SERVE_LOAD_DELAY_MS=-5", "KTIER_DEBUG_SERVE_THROW=yes"}) {
    const auto r = run_process(std::string(env) + " " + ktier() + " doctor");
    EXPECT_EQ(r.exit_code, 2) << env << ": " << r.err;
    const std::string name(env, std::string(env).find('='));
    EXPECT_EQ(r.err.rfind("ktier: error: " + name + "=", 0), 0u) << r.err;
  }
  const auto taken = run_process("KTIER_DEBUG_MEM_AVAILABLE_MIB=4096 " + ktier() + " doctor");
  EXPECT_EQ(taken.exit_code, 0) << taken.err;
  EXPECT_NE((taken.out + taken.err).find("MemAvailable 4.00 GiB"), std::string::npos)
      << taken.out << taken.err;
  // Thread counts beyond what a pool takes are refused up front, by every command.
  for (const char* cmd : {"run -m x --ids 1", "eval -m x --ids 1", "synth --preset tiny -o x",
                          "pack -m x -o y", "bench decode -m x", "bench inflate --pack x",
                          "trace replay x"}) {
    const auto r = run_process(ktier() + " " + cmd + " --threads 100000");
    EXPECT_EQ(r.exit_code, 2) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find("--threads: Value 100000 not in range"), std::string::npos)
        << cmd << ": " << r.err;
  }
}

// Without a GPU (as in CI) doctor must still succeed and say the CPU path is used; with one,
// it lists the devices. Either way the answer is one of the two, never a crash.
TEST(Cli, DoctorReportsCudaStateWithoutFailing) {
  const auto r = run_process(ktier() + " doctor");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const bool cpu_path = r.out.find("using the CPU path") != std::string::npos;
  const bool gpu = r.out.find("device(s)") != std::string::npos;
  EXPECT_TRUE(cpu_path != gpu) << r.out;
  // The budget --preset auto gives here (from /proc/meminfo).
  EXPECT_NE(r.out.find("--preset auto (the default with --pack or in GPU mode) budgets "),
            std::string::npos)
      << r.out;
  // The kernel set named is the one `--isa auto` runs: AVX-512 wherever the CPU and OS have it.
  // Decided here from the kernel's own list (/proc/cpuinfo, which leaves out AVX-512 when the OS
  // does not save zmm state), not from doctor's words, so a wrong detection is seen.
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) == 0) {
      flags = line.substr(line.find(':') + 1) + " ";
      break;
    }
  }
  ASSERT_FALSE(flags.empty()) << "no flags line in /proc/cpuinfo";
  const auto has = [&](const char* flag) {
    return flags.find(" " + std::string(flag) + " ") != std::string::npos;
  };
  const bool has_avx2 = has("avx2") && has("fma") && has("f16c");
  const bool has_avx512 = has_avx2 && has("avx512f") && has("avx512dq") && has("avx512bw") &&
                          has("avx512vl");
  const char* expected = has_avx512 ? "-> avx512 kernels" : has_avx2 ? "-> avx2 kernels"
                                                                    : "-> scalar kernels";
  EXPECT_NE(r.out.find(expected), std::string::npos) << r.out;
}

// A broken module must not take the binary down: it is reported and the CPU path is used.
TEST(Cli, BrokenCudaModuleFallsBackToCpu) {
  const auto fake = std::filesystem::temp_directory_path() /
                    ("ktier_fake_cuda_module-" + std::to_string(::getpid()) + ".so");
  std::ofstream(fake) << "not an ELF file";
  const auto r = run_process("KTIER_CUDA_MODULE=" + fake.string() + " " + ktier() + " doctor");
  std::filesystem::remove(fake);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("cuda: unavailable, using the CPU path: CUDA module not loaded"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find(fake.string()), std::string::npos) << "the reason names the file";

  // A path the system cannot look at (a name past NAME_MAX): said why, not an exception (which
  // ended the program with exit 1).
  const std::string unreachable = "/tmp/" + std::string(300, 'x') + "/libktier_cuda.so";
  const auto odd = run_process("KTIER_CUDA_MODULE=" + unreachable + " " + ktier() + " doctor");
  ASSERT_EQ(odd.exit_code, 0) << odd.err;
  EXPECT_NE(odd.out.find("File name too long"), std::string::npos) << odd.out;
}

// The executable itself must never need libcudart or libcublas (they live in the module).
TEST(Cli, ExecutableDoesNotLinkCudaLibraries) {
  const auto r = run_process("readelf -d " + ktier());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("NEEDED"), std::string::npos);
  EXPECT_EQ(r.out.find("cudart"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("cublas"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace ktier::test
