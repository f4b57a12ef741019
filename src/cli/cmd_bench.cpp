// `ktier bench kernels`: BF16 and MXFP4 matrix-vector throughput as a ratio of this machine's
// measured memory read bandwidth (issue 3; docs/PERFORMANCE.md), and their several-token
// (prefill) throughput as a ratio of its measured double FMA rate. What is measured and how is
// stated in bench/kernel_bench.h; this file is the command line, the table and the JSON.
//
//   ktier bench kernels [--json FILE] [--threads N] [--reps/--passes N] [--size-mib N] [--quick]
//
// Exit codes: 0 measured (whether or not a goal is met), 1 no memory or JSON not writable,
// 2 bad options.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/kernel_bench.h"
#include "cli/cli_input.h"
#include "cli/commands.h"
#include "common/json_text.h"
#include "cpu/exec.h"
#include "io/output_file.h"
#include "runtime/engine.h"

namespace ktier::cli {
namespace {

// Goals of issue 3: GEMV weight bytes per second over read bandwidth at the same thread count.
constexpr double kGoalBf16 = 0.85;
constexpr double kGoalMxfp4 = 0.75;
constexpr uint64_t kQuickBufferBytes = 8ull << 20;

struct KernelsOptions {
  std::string json;
  int threads = 0;  // the "all threads" count; 0 = one per hardware thread
  int reps = 5;
  uint64_t size_mib = 0;  // 0: max(4 x LLC, 256 MiB)
  bool quick = false;
  std::string isa = "auto";
};

// ratio < 0: the row has none (memory read itself); goal <= 0: a ratio without a goal.
void print_row(const char* what, int threads, double gbps, double ratio, double goal) {
  if (ratio < 0) {
    std::printf("%-12s %7d %10.2f %7s %7s\n", what, threads, gbps, "-", "-");
    return;
  }
  if (goal <= 0) {
    std::printf("%-12s %7d %10.2f %7.3f %7s\n", what, threads, gbps, ratio, "-");
    return;
  }
  std::printf("%-12s %7d %10.2f %7.3f  >=%.2f  %s\n", what, threads, gbps, ratio, goal,
              ratio >= goal ? "met" : "below");
}

// A buffer the caches can hold a good share of: its "memory read" is not DRAM's (--size-mib).
bool buffer_under_4x_llc(const bench::KernelBenchResult& r, uint64_t llc) {
  return r.buffer_bytes < 4 * llc;
}

nlohmann::json to_json(const bench::KernelBenchResult& r, uint64_t llc, const std::string& llc_src,
                       bool capped, const KernelsOptions& o) {
  nlohmann::json list = nlohmann::json::array();
  for (const bench::ThreadResult& t : r.results)
    list.push_back({{"threads", t.threads},
                    {"mem_read_gbps", t.mem_read_gbps},
                    {"bf16_gemv_gbps", t.bf16_gemv_gbps},
                    {"bf16_ratio", t.bf16_ratio},
                    {"mxfp4_gemv_gbps", t.mxfp4_gemv_gbps},
                    {"mxfp4_ratio", t.mxfp4_ratio},
                    {"mla_decode_gbps", t.mla_decode_gbps},
                    {"mla_ratio", t.mla_ratio},
                    {"fma_gmacs", t.fma_gmacs},
                    {"bf16_prefill_gmacs", t.bf16_prefill_gmacs},
                    {"bf16_prefill_ratio", t.bf16_prefill_ratio},
                    {"mxfp4_prefill_gmacs", t.mxfp4_prefill_gmacs},
                    {"mxfp4_prefill_ratio", t.mxfp4_prefill_ratio}});
  const bench::ThreadResult& all = r.results.back();  // the largest thread count
  return {{"mem_read_gbps", all.mem_read_gbps},
          {"threads", all.threads},
          {"bf16_gemv_gbps", all.bf16_gemv_gbps},
          {"bf16_ratio", all.bf16_ratio},
          {"mxfp4_gemv_gbps", all.mxfp4_gemv_gbps},
          {"mxfp4_ratio", all.mxfp4_ratio},
          {"mla_decode_gbps", all.mla_decode_gbps},
          {"mla_ratio", all.mla_ratio},
          {"fma_gmacs", all.fma_gmacs},
          {"bf16_prefill_gmacs", all.bf16_prefill_gmacs},
          {"bf16_prefill_ratio", all.bf16_prefill_ratio},
          {"mxfp4_prefill_gmacs", all.mxfp4_prefill_gmacs},
          {"mxfp4_prefill_ratio", all.mxfp4_prefill_ratio},
          {"prefill_shape",
           {{"bf16", {r.bf16_prefill_rows, r.cols, r.bf16_prefill_tokens}},
            {"mxfp4", {r.mxfp4_prefill_rows, r.cols, r.mxfp4_prefill_tokens}}}},
          {"mla_positions", r.mla_positions},
          {"mla_cache_bytes", r.mla_cache_bytes},
          {"results", list},
          {"isa", r.isa},
          {"llc_bytes", llc},
          {"llc_source", llc_src},
          {"buffer_bytes", r.buffer_bytes},
          {"buffer_capped_by_memory", capped},
          {"buffer_under_4x_llc", buffer_under_4x_llc(r, llc)},
          {"matrix_bytes", {{"bf16", r.bf16_bytes}, {"mxfp4", r.mxfp4_bytes}}},
          {"matrix_shape",
           {{"bf16", {r.bf16_rows, r.cols}}, {"mxfp4", {r.mxfp4_rows, r.cols}}}},
          {"reps", o.quick ? 1 : o.reps},
          {"quick", o.quick},
          {"goal_bf16", kGoalBf16},
          {"goal_mxfp4", kGoalMxfp4},
          {"units", "GB/s = 1e9 bytes per second; ratio = GEMV / mem_read at the same threads; "
                    "GMAC/s = 1e9 multiply-accumulates per second, prefill ratio = prefill / "
                    "fma at the same threads"}};
}

Status run_kernels(const KernelsOptions& o) {
  if (o.reps < 1 || o.reps > 1000)
    return Status::usage("--reps/--passes must be between 1 and 1000, got " +
                         std::to_string(o.reps));
  if (o.size_mib > (uint64_t{1} << 24)) return Status::usage("--size-mib is too large");
  // Checked before the long measurement, so a bad path fails at once.
  KTIER_RETURN_IF_ERROR(io::check_can_write("--json", o.json));

  const int n_threads = runtime::resolve_threads(o.threads);
  std::string llc_src;
  const uint64_t llc = bench::last_level_cache_bytes(&llc_src);
  bench::KernelBenchConfig cfg;
  KTIER_ASSIGN_OR_RETURN(cfg.isa, runtime::parse_isa(o.isa));
  if (cfg.isa && !cpu::isa_supported(*cfg.isa))
    return Status::usage(std::string("--isa ") + cpu::isa_name(*cfg.isa) +
                         ": this CPU or build does not support it");
  cfg.thread_counts = n_threads == 1 ? std::vector<int>{1} : std::vector<int>{1, n_threads};
  cfg.buffer_bytes = o.quick      ? kQuickBufferBytes
                     : o.size_mib ? o.size_mib << 20
                                  : bench::default_buffer_bytes(llc);
  // The default size follows the LLC, which some machines report as the whole host's; it is
  // capped at half of MemAvailable (the figures then say so) rather than risk the OOM killer.
  bool capped = false;
  const uint64_t avail = runtime::mem_available_bytes();
  if (!o.quick && !o.size_mib && avail > 0 && cfg.buffer_bytes > avail / 2) {
    cfg.buffer_bytes = std::max<uint64_t>(avail / 2 >> 20 << 20, 1 << 20);
    capped = true;
    std::fprintf(stderr, "[bench] capping the buffer at %llu MiB (half of MemAvailable)\n",
                 static_cast<unsigned long long>(cfg.buffer_bytes >> 20));
  }
  if (avail > 0 && cfg.buffer_bytes > avail)
    return Status::budget("the benchmark buffer (" + std::to_string(cfg.buffer_bytes >> 20) +
                          " MiB) exceeds MemAvailable; pass a smaller --size-mib");
  cfg.reps = o.quick ? 1 : o.reps;
  if (o.quick) cfg.max_seconds_per_figure = 0;

  const bench::KernelBenchResult r = bench::run_kernel_bench(cfg, [](const std::string& line) {
    std::fprintf(stderr, "[bench] %s\n", line.c_str());
  });
  if (!r.error.empty()) return Status::runtime(r.error);

  std::printf("ktier bench kernels: isa %s, LLC %.1f MiB (%s), buffer %.1f MiB (%.2fx LLC)%s\n",
              r.isa.c_str(), llc / 1048576.0, llc_src.c_str(), r.buffer_bytes / 1048576.0,
              static_cast<double>(r.buffer_bytes) / static_cast<double>(llc),
              o.quick   ? ", QUICK: in-cache smoke run, figures meaningless"
              : capped  ? ", capped by memory: smaller than max(4x LLC, 256 MiB)"
              : buffer_under_4x_llc(r, llc)
                  ? ", UNDER 4x LLC: partly read from cache, the ratios are not against DRAM"
                  : "");
  std::printf("bf16 [%lld x %lld] %.1f MiB, mxfp4 [%lld x %lld] %.1f MiB; best of %d pass(es)\n",
              static_cast<long long>(r.bf16_rows), static_cast<long long>(r.cols),
              r.bf16_bytes / 1048576.0, static_cast<long long>(r.mxfp4_rows),
              static_cast<long long>(r.cols), r.mxfp4_bytes / 1048576.0, cfg.reps);
  if (r.mla_positions > 0)
    std::printf("mla decode: one token, K3 MLA layer (96 heads), %lld cached positions, %.1f MiB "
                "of latent cache\n",
                static_cast<long long>(r.mla_positions), r.mla_cache_bytes / 1048576.0);
  std::printf("ratio = GEMV weight (or MLA cache) GB/s / memory read GB/s at the same thread "
              "count (GB = 1e9 bytes)\n\n");
  std::printf("%-12s %7s %10s %7s %7s\n", "what", "threads", "GB/s", "ratio", "goal");
  for (const bench::ThreadResult& t : r.results) {
    print_row("memory read", t.threads, t.mem_read_gbps, -1, 0);
    print_row("bf16 gemv", t.threads, t.bf16_gemv_gbps, t.bf16_ratio, kGoalBf16);
    print_row("mxfp4 gemv", t.threads, t.mxfp4_gemv_gbps, t.mxfp4_ratio, kGoalMxfp4);
    if (t.mla_decode_gbps > 0)
      print_row("mla decode", t.threads, t.mla_decode_gbps, t.mla_ratio, 0);
  }
  std::printf("\nprefill: bf16 [%lld x %lld] x %lld tokens, mxfp4 [%lld x %lld] x %lld tokens; "
              "ratio = GMAC/s / double FMA lanes/s at the same thread count\n\n",
              static_cast<long long>(r.bf16_prefill_rows), static_cast<long long>(r.cols),
              static_cast<long long>(r.bf16_prefill_tokens),
              static_cast<long long>(r.mxfp4_prefill_rows), static_cast<long long>(r.cols),
              static_cast<long long>(r.mxfp4_prefill_tokens));
  std::printf("%-12s %7s %10s %7s\n", "what", "threads", "G/s", "ratio");
  for (const bench::ThreadResult& t : r.results) {
    std::printf("%-12s %7d %10.2f %7s\n", "double fma", t.threads, t.fma_gmacs, "-");
    std::printf("%-12s %7d %10.2f %7.3f\n", "bf16 prefill", t.threads, t.bf16_prefill_gmacs,
                t.bf16_prefill_ratio);
    std::printf("%-12s %7d %10.2f %7.3f\n", "mxfp4 prefill", t.threads, t.mxfp4_prefill_gmacs,
                t.mxfp4_prefill_ratio);
  }

  if (!o.json.empty()) {
    KTIER_RETURN_IF_ERROR(
        io::write_output_file(o.json, json_output_text(to_json(r, llc, llc_src, capped, o))));
    std::fprintf(stderr, "[bench] wrote %s\n", o.json.c_str());
  }
  return Status::ok();
}

}  // namespace

void register_bench_command(CLI::App& app, int& exit_code) {
  auto* bench = app.add_subcommand(
      "bench", "Measure this machine: kernels, decode, I/O and the device against limits measured "
               "in the same run (memory read bandwidth, double FMA rate, raw disk read, device "
               "copy); inflate against its fixed goal (GB/s per core) and the compression ratio");
  bench->require_subcommand(1);
  auto* sub = bench->add_subcommand(
      "kernels",
      "Memory read bandwidth, then BF16 and MXFP4 matrix-vector weight GB/s on matrices of\n"
      "max(4x the last-level cache, 256 MiB) by default (at most half of MemAvailable;\n"
      "--size-mib, --quick set it), at 1 thread and all threads, each as a ratio of the read\n"
      "bandwidth at the same thread count (goals: bf16 >= 0.85, mxfp4 >= 0.75); then the\n"
      "prefill products (several tokens at once) as a ratio of the measured double FMA rate");
  auto o = std::make_shared<KernelsOptions>();
  sub->add_option("--json", o->json, "also write the figures to FILE as JSON");
  add_threads_option(sub, o->threads, "Threads of the 'all threads' figures");
  auto* reps = sub->add_option("--reps,--passes", o->reps,
                  "timed passes per figure, best kept (after one warm-up; fewer where a figure "
                  "has taken 4 s)")
      ->capture_default_str();
  auto* size = sub->add_option("--size-mib", o->size_mib,
                  "buffer and matrix size in MiB, at least 1 (default: max(4 x LLC, 256 MiB), "
                  "capped at half of MemAvailable; more than MemAvailable is refused, exit 4)")
      ->transform(whole_number<uint64_t>(kMaxBenchMib))
      ->check(CLI::Range(uint64_t{1}, kMaxBenchMib));
  sub->add_option("--isa", o->isa, "Kernel set to measure: auto, scalar, avx2 or avx512")
      ->capture_default_str();
  sub->add_flag("--quick", o->quick,
                "8 MiB in-cache matrices, one pass: checks the command runs; figures meaningless")
      ->excludes(reps)
      ->excludes(size);  // it sets both: refused rather than overridden unsaid
  sub->callback([o, &exit_code] { exit_code = finish(run_kernels(*o)); });
  register_bench_decode_command(*bench, exit_code);
  register_bench_io_command(*bench, exit_code);
  register_bench_inflate_command(*bench, exit_code);
  register_bench_device_command(*bench, exit_code);
}

}  // namespace ktier::cli
