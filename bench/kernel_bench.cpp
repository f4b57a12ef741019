// Kernel throughput against measured memory read bandwidth; contracts in kernel_bench.h.
#include "bench/kernel_bench.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <string>

#include "cpu/kernels.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define KTIER_BENCH_X86 1
#endif

namespace ktier::bench {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

// ---- cache size ---------------------------------------------------------------------------

// "32K", "1024K", "32M" or a plain byte count -> bytes; 0 if unreadable.
uint64_t parse_cache_size(const std::string& s) {
  if (s.empty()) return 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  switch (end && *end ? *end : ' ') {
    case 'K': return v << 10;
    case 'M': return v << 20;
    case 'G': return v << 30;
    default: return v;
  }
}

// The largest-level data or unified cache cpu0 reports in sysfs; 0 if there is none.
uint64_t sysfs_llc_bytes() {
  int best_level = 0;
  uint64_t best = 0;
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level_in(dir + "level"), type_in(dir + "type"), size_in(dir + "size");
    int level = 0;
    std::string type, size;
    if (!(level_in >> level) || !(type_in >> type) || !(size_in >> size)) continue;
    if (type == "Instruction") continue;
    if (level > best_level) {
      best_level = level;
      best = parse_cache_size(size);
    }
  }
  return best;
}

// ---- one reusable buffer ------------------------------------------------------------------

// Anonymous mapping with transparent huge pages requested (as io::AlignedBuffer does for the
// engine's weight memory), so the TLB behaves like it does for real weights.
struct Mapping {
  void* p = nullptr;
  size_t n = 0;
  explicit Mapping(size_t bytes) : n(bytes) {
    p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      p = nullptr;
      return;
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(p, n, MADV_HUGEPAGE);
#endif
  }
  ~Mapping() {
    if (p) munmap(p, n);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  uint8_t* bytes() const { return static_cast<uint8_t*>(p); }
};

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Fills [0, n) with 64-bit words from `word(rng_word)`, in parallel blocks each seeded by its
// index: the content does not depend on the thread count. n must be a multiple of 8.
template <class WordFn>
void fill_words(cpu::ThreadPool* pool, uint8_t* p, uint64_t n, uint64_t seed, WordFn word) {
  constexpr int64_t kBlock = 1 << 20;  // bytes per block
  const int64_t n_blocks = static_cast<int64_t>((n + kBlock - 1) / kBlock);
  cpu::parallel_for(pool, n_blocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t blk = b; blk < e; ++blk) {
      uint64_t s = seed ^ (static_cast<uint64_t>(blk) * 0x2545f4914f6cdd1dull);
      const uint64_t lo = static_cast<uint64_t>(blk) * kBlock;
      const uint64_t hi = std::min<uint64_t>(n, lo + kBlock);
      uint64_t* w = reinterpret_cast<uint64_t*>(p + lo);
      for (uint64_t i = 0; i < (hi - lo) / 8; ++i) w[i] = word(splitmix64(s));
    }
  });
}

// Four BF16 values: random sign, magnitude in [2^-7, 2) (exponent 120..127, random mantissa).
uint64_t bf16_word(uint64_t r) {
  uint64_t w = 0;
  for (int k = 0; k < 4; ++k) {
    const uint64_t bits = (r >> (16 * k)) & 0xffff;
    w |= ((bits & 0x8000) | (0x3c00 + (bits & 0x3ff))) << (16 * k);
  }
  return w;
}

// Eight E8M0 scales in 120..130 (block magnitudes 2^-7 .. 2^3, like trained weights).
uint64_t scale_word(uint64_t r) {
  uint64_t w = 0;
  for (int k = 0; k < 8; ++k) w |= (120 + ((r >> (8 * k)) & 0xff) % 11) << (8 * k);
  return w;
}

// Two f32 values in [-1, 1) (the latent cache of the MLA figure).
uint64_t f32_pair_word(uint64_t r) {
  uint64_t w = 0;
  for (int k = 0; k < 2; ++k) {
    const float v = static_cast<float>((r >> (32 * k)) & 0xffffff) / 8388608.0f - 1.0f;
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    w |= static_cast<uint64_t>(bits) << (32 * k);
  }
  return w;
}

// ---- streaming read -----------------------------------------------------------------------

uint64_t read_sum_scalar(const uint8_t* p, uint64_t n) {
  const uint64_t* w = reinterpret_cast<const uint64_t*>(p);
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  uint64_t i = 0;
  for (; i + 4 <= n / 8; i += 4) {
    a0 += w[i];
    a1 += w[i + 1];
    a2 += w[i + 2];
    a3 += w[i + 3];
  }
  for (; i < n / 8; ++i) a0 += w[i];
  return a0 + a1 + a2 + a3;
}

#ifdef KTIER_BENCH_X86
// 128 bytes per iteration into four independent 256-bit accumulators. REQUIRES p 32-byte aligned.
__attribute__((target("avx2"))) uint64_t read_sum_avx2(const uint8_t* p, uint64_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  uint64_t i = 0;
  for (; i + 128 <= n; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  alignas(32) uint64_t lane[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lane),
                     _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  return lane[0] + lane[1] + lane[2] + lane[3] + read_sum_scalar(p + i, n - i);
}
#endif

// Reads all n bytes once, split into equal contiguous 4 KiB-aligned chunks (4 per thread).
uint64_t read_all(cpu::ThreadPool& pool, const uint8_t* p, uint64_t n, cpu::Isa isa) {
  const int64_t n_chunks = 4 * static_cast<int64_t>(pool.size());
  const uint64_t chunk = (n / static_cast<uint64_t>(n_chunks) + 4095) & ~uint64_t{4095};
  std::vector<uint64_t> sums(static_cast<size_t>(n_chunks), 0);
  pool.parallel_for(n_chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const uint64_t lo = std::min(n, static_cast<uint64_t>(c) * chunk);
      const uint64_t hi = std::min(n, lo + chunk);
#ifdef KTIER_BENCH_X86
      if (isa != cpu::Isa::kScalar) {  // kAvx2 or kAvx512 (which implies AVX2)
        sums[static_cast<size_t>(c)] = read_sum_avx2(p + lo, hi - lo);
        continue;
      }
#endif
      sums[static_cast<size_t>(c)] = read_sum_scalar(p + lo, hi - lo);
    }
  });
  uint64_t total = 0;
  for (uint64_t s : sums) total += s;
  return total;
}

// ---- double FMA throughput -----------------------------------------------------------------

// kFmaChains independent chains of `iters` vector FMAs each, in registers: the core's double FMA
// throughput (the linear kernels' arithmetic: each MAC is one double FMA lane). Returns a value
// derived from the chains so that none is optimised away.
constexpr int kFmaChains = 12;
constexpr int64_t kFmaIters = int64_t{1} << 22;

double fma_chains_scalar(int64_t iters) {
  double a[kFmaChains];
  for (int c = 0; c < kFmaChains; ++c) a[c] = 1.0 + c * 1e-9;
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kFmaChains; ++c) a[c] = a[c] * 0.999999999 + 1e-9;  // as the ref kernels
  double s = 0;
  for (double v : a) s += v;
  return s;
}

#ifdef KTIER_BENCH_X86
__attribute__((target("avx2,fma"))) double fma_chains_avx2(int64_t iters) {
  __m256d a[kFmaChains];
  const __m256d m = _mm256_set1_pd(0.999999999), b = _mm256_set1_pd(1e-9);
#pragma GCC unroll 12
  for (int c = 0; c < kFmaChains; ++c) a[c] = _mm256_set1_pd(1.0 + c * 1e-9);
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kFmaChains; ++c) a[c] = _mm256_fmadd_pd(a[c], m, b);
  alignas(32) double lane[4];
  __m256d s = a[0];
#pragma GCC unroll 12
  for (int c = 1; c < kFmaChains; ++c) s = _mm256_add_pd(s, a[c]);
  _mm256_store_pd(lane, s);
  return lane[0] + lane[1] + lane[2] + lane[3];
}

__attribute__((target("avx512f"))) double fma_chains_avx512(int64_t iters) {
  __m512d a[kFmaChains];
  const __m512d m = _mm512_set1_pd(0.999999999), b = _mm512_set1_pd(1e-9);
#pragma GCC unroll 12
  for (int c = 0; c < kFmaChains; ++c) a[c] = _mm512_set1_pd(1.0 + c * 1e-9);
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kFmaChains; ++c) a[c] = _mm512_fmadd_pd(a[c], m, b);
  __m512d s = a[0];
#pragma GCC unroll 12
  for (int c = 1; c < kFmaChains; ++c) s = _mm512_add_pd(s, a[c]);
  alignas(64) double lane[8];
  _mm512_store_pd(lane, s);
  double sum = 0;
  for (double v : lane) sum += v;
  return sum;
}
#endif

// Double FMA lanes per call of fma_chains_* for `isa`: its vector width times the chains.
int fma_lanes(cpu::Isa isa) {
  return kFmaChains * (isa == cpu::Isa::kAvx512 ? 8 : isa == cpu::Isa::kAvx2 ? 4 : 1);
}

double fma_chains(cpu::Isa isa, int64_t iters) {
#ifdef KTIER_BENCH_X86
  if (isa == cpu::Isa::kAvx512) return fma_chains_avx512(iters);
  if (isa == cpu::Isa::kAvx2) return fma_chains_avx2(iters);
#endif
  return fma_chains_scalar(iters);
}

// ---- timing -------------------------------------------------------------------------------

// Best wall seconds of up to config.reps timed passes after one untimed warm-up pass.
template <class Fn>
double best_seconds(const KernelBenchConfig& config, Fn&& fn) {
  using Clock = std::chrono::steady_clock;
  fn();
  double best = std::numeric_limits<double>::infinity(), spent = 0;
  for (int i = 0; i < config.reps; ++i) {
    const auto t0 = Clock::now();
    fn();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, dt);
    spent += dt;
    if (i >= 1 && spent > config.max_seconds_per_figure) break;
  }
  return best;
}

// Double FMA lanes per second (1e9) of the pool's threads, one fma_chains call each.
double fma_gmacs(const KernelBenchConfig& config, cpu::ThreadPool& pool, cpu::Isa isa) {
  volatile double sink = 0;
  const double t = best_seconds(config, [&] {
    pool.parallel_for(pool.size(), 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c)
        if (fma_chains(isa, kFmaIters) < 0) sink = sink + 1;  // never: keeps the chains
    });
  });
  return static_cast<double>(pool.size()) * static_cast<double>(kFmaIters) * fma_lanes(isa) /
         t / 1e9;
}

std::string format_figure(const char* what, int threads, double gbps) {
  char line[160];
  std::snprintf(line, sizeof line, "%s, %d thread%s: %.2f GB/s", what, threads,
                threads == 1 ? "" : "s", gbps);
  return line;
}

}  // namespace

uint64_t last_level_cache_bytes(std::string* source) {
  auto set = [&](const char* s) {
    if (source) *source = s;
  };
  if (const uint64_t b = sysfs_llc_bytes()) {
    set("sysfs");
    return b;
  }
#if defined(_SC_LEVEL3_CACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE)
  for (int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long v = sysconf(name);
    if (v > 0) {
      set("sysconf");
      return static_cast<uint64_t>(v);
    }
  }
#endif
  set("fallback");
  return 32 * kMiB;
}

uint64_t default_buffer_bytes(uint64_t llc_bytes) {
  const uint64_t want = std::max<uint64_t>(4 * llc_bytes, 256 * kMiB);
  return (want + kMiB - 1) / kMiB * kMiB;
}

KernelBenchResult run_kernel_bench(const KernelBenchConfig& config, const ProgressFn& progress) {
  KernelBenchResult out;
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };
  const int64_t cols = config.cols;
  if (cols <= 0 || cols % 32 != 0 || config.buffer_bytes < kMiB || config.reps < 1 ||
      config.thread_counts.empty()) {
    out.error = "bad kernel bench configuration";
    return out;
  }
  for (int t : config.thread_counts)
    if (t < 1) {
      out.error = "thread counts must be >= 1";
      return out;
    }

  const cpu::Isa isa = config.isa.value_or(cpu::best_isa());
  if (!cpu::isa_supported(isa)) {
    out.error = std::string("the ") + cpu::isa_name(isa) + " kernels are not supported here";
    return out;
  }
  out.isa = cpu::isa_name(isa);
  out.cols = cols;
  out.buffer_bytes = config.buffer_bytes / 4096 * 4096;
  const int64_t bf16_row = cpu::weight_row_data_bytes(cpu::WeightType::kBF16, cols);
  const int64_t packed_row = cpu::weight_row_data_bytes(cpu::WeightType::kMxfp4, cols);
  const int64_t mxfp4_row = packed_row + cpu::weight_row_scale_bytes(cpu::WeightType::kMxfp4, cols);
  out.bf16_rows = static_cast<int64_t>(out.buffer_bytes / static_cast<uint64_t>(bf16_row));
  out.mxfp4_rows = static_cast<int64_t>(out.buffer_bytes / static_cast<uint64_t>(mxfp4_row));
  out.bf16_bytes = static_cast<uint64_t>(out.bf16_rows * bf16_row);
  const uint64_t packed_bytes = static_cast<uint64_t>(out.mxfp4_rows * packed_row);
  out.mxfp4_bytes = static_cast<uint64_t>(out.mxfp4_rows * mxfp4_row);
  out.bf16_prefill_rows = std::max<int64_t>(
      1, std::min<int64_t>(out.bf16_rows, static_cast<int64_t>(config.prefill_bytes) / bf16_row));
  out.mxfp4_prefill_rows = std::max<int64_t>(
      1, std::min<int64_t>(out.mxfp4_rows, static_cast<int64_t>(config.prefill_bytes) / mxfp4_row));
  out.bf16_prefill_tokens = std::max<int64_t>(2, config.prefill_tokens_bf16);
  out.mxfp4_prefill_tokens = std::max<int64_t>(2, config.prefill_tokens_mxfp4);
  if (out.bf16_rows < 1 || out.mxfp4_rows < 1) {
    out.error = "buffer too small for one matrix row";
    return out;
  }

  Mapping buf(out.buffer_bytes);
  if (!buf.p) {
    out.error = "cannot map " + std::to_string(out.buffer_bytes) + " bytes for the benchmark";
    return out;
  }
  const int max_threads =
      *std::max_element(config.thread_counts.begin(), config.thread_counts.end());
  std::vector<std::unique_ptr<cpu::ThreadPool>> pools;
  for (int t : config.thread_counts) pools.push_back(std::make_unique<cpu::ThreadPool>(t));
  cpu::ThreadPool fill_pool(max_threads);

  std::vector<float> x(static_cast<size_t>(cols));
  uint64_t xs = 7;
  for (float& v : x) v = static_cast<float>(splitmix64(xs) % 2001) / 1000.0f - 1.0f;
  std::vector<float> y(static_cast<size_t>(std::max(out.bf16_rows, out.mxfp4_rows)));
  // Prefill activations: every token's row a fresh draw; outputs [tokens, rows].
  const int64_t max_prefill_tokens = std::max(out.bf16_prefill_tokens, out.mxfp4_prefill_tokens);
  std::vector<float> xp(static_cast<size_t>(max_prefill_tokens * cols));
  for (float& v : xp) v = static_cast<float>(splitmix64(xs) % 2001) / 1000.0f - 1.0f;
  std::vector<float> yp(static_cast<size_t>(
      std::max(out.bf16_prefill_rows * out.bf16_prefill_tokens,
               out.mxfp4_prefill_rows * out.mxfp4_prefill_tokens)));
  // Multiply-accumulates per second (1e9) of cpu::linear over `tokens` tokens of `w`.
  auto measure_prefill = [&](const cpu::WeightMatrix& w, int64_t tokens, const cpu::Exec& ex,
                             const char* what, int threads) {
    const double t =
        best_seconds(config, [&] { cpu::linear(w, xp.data(), tokens, yp.data(), ex); });
    const double gmacs = static_cast<double>(w.rows * w.cols * tokens) / t / 1e9;
    char line[160];
    std::snprintf(line, sizeof line, "%s x%lld tokens, %d thread%s: %.2f GMAC/s", what,
                  static_cast<long long>(tokens), threads, threads == 1 ? "" : "s", gmacs);
    say(line);
    return gmacs;
  };
  volatile uint64_t sink = 0;
  // Read bandwidth is measured in both phases and the better figure kept, so a burst of load
  // from other processes during one of them does not inflate the ratios.
  auto measure_read = [&](cpu::ThreadPool& pool) {
    const double t = best_seconds(
        config, [&] { sink = sink + read_all(pool, buf.bytes(), out.buffer_bytes, isa); });
    const double gbps = static_cast<double>(out.buffer_bytes) / t / 1e9;
    say(format_figure("memory read", pool.size(), gbps));
    return gbps;
  };

  // Phase 1: the buffer holds the BF16 matrix; read bandwidth and BF16 GEMV per thread count.
  say("filling " + std::to_string(out.buffer_bytes >> 20) + " MiB with BF16 weights");
  fill_words(&fill_pool, buf.bytes(), out.buffer_bytes, 1, bf16_word);
  const cpu::WeightMatrix wb{cpu::WeightType::kBF16, buf.p, nullptr, out.bf16_rows, cols};
  for (size_t i = 0; i < config.thread_counts.size(); ++i) {
    ThreadResult r;
    r.threads = config.thread_counts[i];
    cpu::ThreadPool& pool = *pools[i];
    r.mem_read_gbps = measure_read(pool);
    const cpu::Exec ex{&pool, isa};
    const double t_bf16 =
        best_seconds(config, [&] { cpu::linear(wb, x.data(), 1, y.data(), ex); });
    r.bf16_gemv_gbps = static_cast<double>(out.bf16_bytes) / t_bf16 / 1e9;
    say(format_figure("bf16 gemv", r.threads, r.bf16_gemv_gbps));
    r.fma_gmacs = fma_gmacs(config, pool, isa);
    char line[160];
    std::snprintf(line, sizeof line, "double fma, %d thread%s: %.2f G lanes/s", r.threads,
                  r.threads == 1 ? "" : "s", r.fma_gmacs);
    say(line);
    const cpu::WeightMatrix wbp{cpu::WeightType::kBF16, buf.p, nullptr, out.bf16_prefill_rows,
                                cols};
    r.bf16_prefill_gmacs =
        measure_prefill(wbp, out.bf16_prefill_tokens, ex, "bf16 prefill", r.threads);
    out.results.push_back(r);
  }

  // Phase 2: the MXFP4 matrix (packed nibbles, then scales) over the same bytes.
  say("filling " + std::to_string(out.mxfp4_bytes >> 20) + " MiB with MXFP4 weights");
  // packed_bytes is a multiple of 16 (cols % 32 == 0); the scales' byte count is rounded up to
  // whole words, which stays inside the 4 KiB-rounded buffer.
  fill_words(&fill_pool, buf.bytes(), packed_bytes, 2, [](uint64_t r) { return r; });
  fill_words(&fill_pool, buf.bytes() + packed_bytes, (out.mxfp4_bytes - packed_bytes + 7) / 8 * 8,
             3, scale_word);
  const cpu::WeightMatrix wm{cpu::WeightType::kMxfp4, buf.p, buf.bytes() + packed_bytes,
                             out.mxfp4_rows, cols};
  for (size_t i = 0; i < config.thread_counts.size(); ++i) {
    ThreadResult& r = out.results[i];
    r.mem_read_gbps = std::max(r.mem_read_gbps, measure_read(*pools[i]));
    const cpu::Exec ex{pools[i].get(), isa};
    const double t_mx = best_seconds(config, [&] { cpu::linear(wm, x.data(), 1, y.data(), ex); });
    r.mxfp4_gemv_gbps = static_cast<double>(out.mxfp4_bytes) / t_mx / 1e9;
    say(format_figure("mxfp4 gemv", r.threads, r.mxfp4_gemv_gbps));
    // The first rows' packed bytes, and their scales at the start of the scale array.
    const cpu::WeightMatrix wmp{cpu::WeightType::kMxfp4, buf.p, buf.bytes() + packed_bytes,
                                out.mxfp4_prefill_rows, cols};
    r.mxfp4_prefill_gmacs =
        measure_prefill(wmp, out.mxfp4_prefill_tokens, ex, "mxfp4 prefill", r.threads);
  }

  // Phase 3: one decode token of a K3 MLA layer over a latent cache that fills the buffer.
  const cpu::MlaDims mla{96, 128, 64, 128, 512};
  const uint64_t row_bytes = static_cast<uint64_t>(mla.kv_lora + mla.qk_rope) * sizeof(float);
  out.mla_positions = static_cast<int64_t>(out.buffer_bytes / row_bytes);
  out.mla_cache_bytes = static_cast<uint64_t>(out.mla_positions) * row_bytes;
  const int64_t kv_b_rows = int64_t{mla.n_heads} * (mla.qk_nope + mla.v_head);
  const uint64_t kv_b_bytes = static_cast<uint64_t>(kv_b_rows * mla.kv_lora) * 2;
  Mapping kv_b(kv_b_bytes);
  if (out.mla_positions >= 2 && kv_b.p) {
    say("filling " + std::to_string(out.mla_cache_bytes >> 20) + " MiB with an MLA latent cache (" +
        std::to_string(out.mla_positions) + " positions)");
    fill_words(&fill_pool, buf.bytes(), out.mla_cache_bytes / 8 * 8, 5, f32_pair_word);
    fill_words(&fill_pool, kv_b.bytes(), kv_b_bytes, 6, bf16_word);
    const float* cache_c = static_cast<const float*>(buf.p);
    const float* cache_r = cache_c + out.mla_positions * mla.kv_lora;
    const cpu::WeightMatrix wkv{cpu::WeightType::kBF16, kv_b.p, nullptr, kv_b_rows, mla.kv_lora};
    std::vector<float> q(static_cast<size_t>(mla.n_heads) * (mla.qk_nope + mla.qk_rope));
    for (float& v : q) v = static_cast<float>(splitmix64(xs) % 2001) / 1000.0f - 1.0f;
    std::vector<float> o(static_cast<size_t>(mla.n_heads) * mla.v_head);
    const double scale = 1.0 / std::sqrt(static_cast<double>(mla.qk_nope + mla.qk_rope));
    for (size_t i = 0; i < config.thread_counts.size(); ++i) {
      ThreadResult& r = out.results[i];
      const cpu::Exec ex{pools[i].get(), isa};
      const double t_mla = best_seconds(config, [&] {
        cpu::mla_attention(mla, q.data(), 1, wkv, cache_c, cache_r, out.mla_positions - 1, scale,
                           o.data(), ex);
      });
      r.mla_decode_gbps = static_cast<double>(out.mla_cache_bytes) / t_mla / 1e9;
      say(format_figure("mla decode", r.threads, r.mla_decode_gbps));
    }
  }
  for (ThreadResult& r : out.results) {
    r.bf16_ratio = r.bf16_gemv_gbps / r.mem_read_gbps;
    r.mxfp4_ratio = r.mxfp4_gemv_gbps / r.mem_read_gbps;
    r.mla_ratio = r.mla_decode_gbps / r.mem_read_gbps;
    r.bf16_prefill_ratio = r.bf16_prefill_gmacs / r.fma_gmacs;
    r.mxfp4_prefill_ratio = r.mxfp4_prefill_gmacs / r.fma_gmacs;
  }
  return out;
}

double measure_fma_gmacs(cpu::ThreadPool& pool, cpu::Isa isa, int reps) {
  KernelBenchConfig config;
  config.reps = std::max(1, reps);
  return fma_gmacs(config, pool, isa);
}

double measure_read_gbps(cpu::ThreadPool& pool, uint64_t bytes, int reps) {
  bytes = (bytes + 4095) / 4096 * 4096;
  Mapping buf(bytes);
  if (!buf.p) return 0;
  fill_words(&pool, buf.bytes(), bytes, 4, [](uint64_t r) { return r; });
  KernelBenchConfig config;
  config.reps = std::max(1, reps);
  volatile uint64_t sink = 0;
  const double t = best_seconds(
      config, [&] { sink = sink + read_all(pool, buf.bytes(), bytes, cpu::best_isa()); });
  return static_cast<double>(bytes) / t / 1e9;
}

}  // namespace ktier::bench
