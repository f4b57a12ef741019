#pragma once
// Kernel throughput against the machine's own memory bandwidth (`ktier bench kernels`).
//
// What is measured, at each thread count (1 and the full count):
//  * mem_read_gbps: streaming read of one buffer of `buffer_bytes` (summed with 256-bit loads
//    when AVX2 is available, split over the thread pool in equal contiguous chunks).
//  * bf16_gemv_gbps: cpu::linear of a BF16 [rows, cols] matrix that fills the buffer, one token;
//    bytes = rows * cols * 2.
//  * mxfp4_gemv_gbps: cpu::linear of an MXFP4 [rows, cols] matrix that fills the buffer, one
//    token; bytes = packed (rows * cols / 2) + scales (rows * cols / 32).
//  * mla_decode_gbps: cpu::mla_attention of one decode token of a K3 MLA layer (96 heads,
//    kv_lora 512, rope 64, BF16 kv_b) over a latent cache that fills the buffer; bytes = the
//    cache's (positions * 576 * 4). The kernel reads the cache at least twice (scores, then
//    the probability-weighted latent), so its ratio cannot pass 0.5; with 96 heads in double
//    precision (~90 flop per cache byte) arithmetic bounds it well below that on most machines.
//  * fma_gmacs: double FMA lanes per second of independent register-only FMA chains on every
//    thread (the widest vector of the measured ISA): the arithmetic limit of the linear kernels,
//    which spend one double FMA lane per multiply-accumulate.
//  * bf16_prefill_gmacs / mxfp4_prefill_gmacs: cpu::linear of the first rows (prefill_bytes of
//    weights) of the same matrices over `prefill_tokens_*` tokens at once, as in a prefill chunk
//    (the trunk sees every token of the chunk; a routed expert a few): multiply-accumulates per
//    second (rows * cols * tokens / s / 1e9), as a ratio of fma_gmacs at the same thread count.
// Every figure is bytes / seconds / 1e9 (GB = 1e9 bytes) of the best timed pass after one
// untimed warm-up pass. A ratio is a GEMV figure divided by the read figure at the SAME thread
// count, so it says how close the kernel comes to streaming its weights at the speed the memory
// system delivers to that many threads.
//
// The one buffer is reused for all four figures (phase 1: the BF16 matrix, read and BF16 GEMV at
// each thread count; phase 2: the MXFP4 matrix written over it, read and MXFP4 GEMV at each
// thread count; phase 3: the MLA cache written over it, plus a separate 25 MB kv_b), so the peak
// footprint is about buffer_bytes. mem_read_gbps is the better of the two
// phases' read figures: load from other processes during one phase must not make the GEMV look
// closer to the memory limit than it is.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cpu/exec.h"

namespace ktier::cpu {
class ThreadPool;
}  // namespace ktier::cpu

namespace ktier::bench {

// Size of the last-level data or unified cache in bytes, from
// /sys/devices/system/cpu/cpu0/cache, else sysconf(_SC_LEVEL{3,2}_CACHE_SIZE), else 32 MiB.
// `source` (optional) receives where the figure came from: "sysfs", "sysconf" or "fallback".
uint64_t last_level_cache_bytes(std::string* source = nullptr);

// Default buffer size for a given LLC: max(4 * llc, 256 MiB), rounded up to 1 MiB.
uint64_t default_buffer_bytes(uint64_t llc_bytes);

struct KernelBenchConfig {
  std::vector<int> thread_counts = {1};  // each >= 1, measured in this order
  uint64_t buffer_bytes = 256ull << 20;  // >= 1 MiB; matrices are sized to fill it
  int64_t cols = 7168;                   // K3 hidden width; REQUIRES cols % 32 == 0
  int reps = 5;                          // timed passes per figure (best is kept), >= 1
  double max_seconds_per_figure = 4.0;   // stop timed passes early past this (after 2)
  std::optional<cpu::Isa> isa;           // kernel set to measure; default cpu::best_isa()
  uint64_t prefill_bytes = 16ull << 20;  // weight bytes of the prefill figures' matrices
  int64_t prefill_tokens_bf16 = 64;      // tokens of one bf16 prefill call, >= 2
  int64_t prefill_tokens_mxfp4 = 8;      // tokens of one MXFP4 prefill call, >= 2
};

struct ThreadResult {
  int threads = 0;
  double mem_read_gbps = 0, bf16_gemv_gbps = 0, mxfp4_gemv_gbps = 0;
  double mla_decode_gbps = 0;                // 0: not measured (buffer or memory too small)
  double bf16_ratio = 0, mxfp4_ratio = 0;  // GEMV / mem_read at this thread count
  double mla_ratio = 0;                      // mla_decode / mem_read at this thread count
  double fma_gmacs = 0;                      // double FMA lanes per second, 1e9
  double bf16_prefill_gmacs = 0, mxfp4_prefill_gmacs = 0;  // multiply-accumulates/s, 1e9
  double bf16_prefill_ratio = 0, mxfp4_prefill_ratio = 0;  // prefill / fma at these threads
};

struct KernelBenchResult {
  std::string isa;  // cpu::isa_name of the kernels ("avx512", "avx2", "scalar"); the read loop
                    // is the AVX2 one for both vector sets, else scalar
  uint64_t buffer_bytes = 0;
  int64_t bf16_rows = 0, mxfp4_rows = 0, cols = 0;
  uint64_t bf16_bytes = 0, mxfp4_bytes = 0;  // weight bytes one GEMV reads
  int64_t mla_positions = 0;                 // cache positions the MLA token attends
  uint64_t mla_cache_bytes = 0;              // their latent cache bytes
  int64_t bf16_prefill_rows = 0, mxfp4_prefill_rows = 0;      // rows of the prefill matrices
  int64_t bf16_prefill_tokens = 0, mxfp4_prefill_tokens = 0;  // tokens of one prefill call
  std::vector<ThreadResult> results;         // one per config thread count, same order
  std::string error;                         // non-empty: nothing was measured (e.g. no memory)
};

// One line of progress (no newline) per measured figure; may be empty.
using ProgressFn = std::function<void(const std::string&)>;

// Runs the whole measurement. Takes seconds to minutes; single call at a time per process.
KernelBenchResult run_kernel_bench(const KernelBenchConfig& config, const ProgressFn& progress);

// Streaming read bandwidth (GB/s, best of `reps` passes after a warm-up) of a freshly filled
// buffer of `bytes`, read by `pool` as in run_kernel_bench. 0 if the buffer cannot be mapped.
// Used by `ktier bench decode` to state decode speed as a ratio of the bandwidth floor.
double measure_read_gbps(cpu::ThreadPool& pool, uint64_t bytes, int reps);

// Double FMA lanes per second (1e9) of `pool`'s threads on `isa`, as fma_gmacs above (best of
// `reps` passes after a warm-up). Used by `ktier bench decode` for its prefill ratio.
double measure_fma_gmacs(cpu::ThreadPool& pool, cpu::Isa isa, int reps);

}  // namespace ktier::bench
