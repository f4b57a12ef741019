// The entry points of cpu/kernels.h: validate once, prepare scratch, split over the thread pool,
// call the range kernel of the chosen instruction set. This is the only place an op is
// dispatched.
//
// Work splits only ever cut independent outputs (rows, elements, channels, heads, tokens);
// no range kernel reduces across ranges, so no split can change a byte (NUMERICS.md §1).

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cpu/kernel_table.h"
#include "cpu/kernels.h"
#include "cpu/numerics.h"
#if KTIER_CPU_HAVE_AVX512
#include "cpu/x86/avx512_kernels.h"
#endif

namespace ktier::cpu {
namespace {

[[noreturn]] void die(const char* op, const char* fmt, ...) {
  std::fprintf(stderr, "ktier_cpu: %s: ", op);
  va_list args;
  va_start(args, fmt);
  std::vfprintf(stderr, fmt, args);
  va_end(args);
  std::fputc('\n', stderr);
  std::abort();
}

#define KTIER_CPU_REQUIRE(op, cond, ...) \
  do {                                   \
    if (!(cond)) die(op, __VA_ARGS__);   \
  } while (0)

// Chunk sizes: large enough that a chunk's work dwarfs the pool's per-chunk cost (one atomic
// increment), small enough that two to a few dozen threads stay balanced on K3 shapes.
constexpr int64_t kLinearChunkMacs = 1 << 17;   // ~0.1 ms of MXFP4/BF16 work per chunk
constexpr int64_t kElementwiseChunk = 1 << 12;  // elements (libm-bound ops: ~0.1 ms)
constexpr int64_t kNormChunkElems = 1 << 14;    // rows x width per chunk
constexpr int64_t kConvChunkChannels = 256;
constexpr int64_t kWideAlign = 8;  // doubles: linear's widened activations start 64-byte aligned

int64_t chunk_rows(int64_t work_per_row, int64_t target) {
  return std::max<int64_t>(1, target / std::max<int64_t>(1, work_per_row));
}

// The calling thread's grow-only buffers, kept at their largest so that steady-state decode
// does not allocate; release_thread_buffers() gives them back.
struct ThreadBuffers {
  std::vector<double> panel;    // linear_panel_scratch
  std::vector<double> scratch;  // thread_scratch
  // linear's widened activations and its per-call lists
  std::vector<double> wide;
  std::vector<int64_t> wide_offset;
  std::vector<uint8_t> owns_wide;  // job j widens its own x (else shares one)
  std::vector<LinearTask> tasks;
  std::vector<int64_t> first_row;
  std::vector<double> mla_pass;  // mla_attention's pass buffers (mla_buffer_bytes)
};
thread_local ThreadBuffers t_buffers;

// linear's widened weight panels (kernel_table.h): grow-only, per thread, 64-byte aligned; a
// buffer of its own, since linear may run inside an op that holds thread_scratch.
double* linear_panel_scratch(int64_t n_doubles) {
  std::vector<double>& buf = t_buffers.panel;
  if (static_cast<int64_t>(buf.size()) < n_doubles + 8)
    buf.resize(static_cast<size_t>(n_doubles + 8));
  return reinterpret_cast<double*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t{63});
}

// Grow-only per-thread scratch, so steady-state decode does not allocate.
double* thread_scratch(int64_t n_doubles) {
  std::vector<double>& buf = t_buffers.scratch;
  if (static_cast<int64_t>(buf.size()) < n_doubles) buf.resize(static_cast<size_t>(n_doubles));
  return buf.data();
}

void check_weight(const char* op, const WeightMatrix& w) {
  KTIER_CPU_REQUIRE(op, w.rows >= 0 && w.cols >= 0, "negative weight shape [%lld, %lld]",
                    static_cast<long long>(w.rows), static_cast<long long>(w.cols));
  KTIER_CPU_REQUIRE(op, w.type <= WeightType::kMxfp4, "unknown weight type %d",
                    static_cast<int>(w.type));
  if (w.rows > 0 && w.cols > 0) KTIER_CPU_REQUIRE(op, w.data != nullptr, "null weight data");
  if (w.type == WeightType::kMxfp4) {
    KTIER_CPU_REQUIRE(op, w.cols % 32 == 0, "MXFP4 width %lld is not a multiple of 32",
                      static_cast<long long>(w.cols));
    if (w.rows > 0 && w.cols > 0) KTIER_CPU_REQUIRE(op, w.scales != nullptr, "null MXFP4 scales");
  }
}

}  // namespace

// ---- ISA selection ---------------------------------------------------------------------------

#if KTIER_CPU_HAVE_AVX512
// The AVX-512 set: linear and MLA's cache-reading steps have their own kernels; every other op
// reuses the AVX2 one.
// (A function-local static, so it is ready whenever the first op runs.)
namespace {
const KernelTable& avx512_kernels() {
  static const KernelTable table = [] {
    KernelTable t = kAvx2Kernels;
    t.linear_rows = avx512::linear_rows_avx512;
    t.mla_scores = avx512::mla_scores_avx512;
    t.mla_mix = avx512::mla_mix_avx512;
    t.mxfp4_x_pairs_split = false;  // its MXFP4 kernel reads x in column order
    return t;
  }();
  return table;
}
}  // namespace
#endif

const KernelTable& kernel_table(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return kRefKernels;
    case Isa::kAvx2:
#if KTIER_CPU_HAVE_AVX2
      if (isa_supported(Isa::kAvx2)) return kAvx2Kernels;
#endif
      die("dispatch",
          "AVX2 kernels requested, but this build has none or the CPU lacks AVX2/FMA/F16C "
          "(use best_isa())");
    case Isa::kAvx512:
#if KTIER_CPU_HAVE_AVX512
      if (isa_supported(Isa::kAvx512)) return avx512_kernels();
#endif
      die("dispatch",
          "AVX-512 kernels requested, but this build has none, or the CPU lacks "
          "AVX512F/BW/DQ/VL (or AVX2/FMA/F16C), or the OS does not save zmm state "
          "(use best_isa())");
  }
  die("dispatch", "unknown instruction set %d", static_cast<int>(isa));
}

const char* weight_type_name(WeightType t) {
  switch (t) {
    case WeightType::kF32: return "F32";
    case WeightType::kBF16: return "BF16";
    case WeightType::kF16: return "F16";
    case WeightType::kMxfp4: return "MXFP4";
  }
  return "?";
}

// ---- linear ----------------------------------------------------------------------------------

void linear(const LinearJob* jobs, int n_jobs, const Exec& ex) {
  constexpr const char* op = "linear";
  const KernelTable& kt = kernel_table(ex.isa);
  KTIER_CPU_REQUIRE(op, n_jobs >= 0 && (n_jobs == 0 || jobs != nullptr), "bad job list");
  // Widen each distinct activation block to double once (exact), in the column order the
  // table's kernel reads it in (KernelTable::mxfp4_x_pairs_split); jobs with the same x, width,
  // order and at least as many tokens share it. Per-thread buffers: steady-state decode never allocates.
  // Each block starts on a 64-byte boundary (so do its token rows when cols % 8 == 0): a vector
  // load that crosses a cache line costs the AVX-512 kernels a second load slot.
  std::vector<double>& wide = t_buffers.wide;
  std::vector<int64_t>& wide_offset = t_buffers.wide_offset;
  std::vector<uint8_t>& owns_wide = t_buffers.owns_wide;
  std::vector<LinearTask>& tasks = t_buffers.tasks;
  std::vector<int64_t>& first_row = t_buffers.first_row;
  wide_offset.assign(static_cast<size_t>(n_jobs), -1);
  owns_wide.assign(static_cast<size_t>(n_jobs), 0);
  tasks.clear();
  first_row.clear();
  int64_t wide_total = 0, total_rows = 0, total_macs = 0, max_tokens = 0;
  int64_t panel_rows = 4, scratch_doubles = 0;  // the widest task's panel and scratch
  const auto pairs_split = [&](int j) {
    return kt.mxfp4_x_pairs_split && jobs[j].w.type == WeightType::kMxfp4;
  };
  for (int j = 0; j < n_jobs; ++j) {
    const LinearJob& job = jobs[j];
    check_weight(op, job.w);
    KTIER_CPU_REQUIRE(op, job.n_tokens >= 0, "negative token count");
    if (job.w.rows == 0 || job.n_tokens == 0) continue;
    KTIER_CPU_REQUIRE(op, job.y != nullptr && (job.w.cols == 0 || job.x != nullptr),
                      "null x or y in job %d", j);
    for (int p = 0; p < j && wide_offset[j] < 0; ++p)
      if (wide_offset[p] >= 0 && jobs[p].x == job.x && jobs[p].w.cols == job.w.cols &&
          jobs[p].n_tokens >= job.n_tokens && pairs_split(p) == pairs_split(j))
        wide_offset[j] = wide_offset[p];
    if (wide_offset[j] < 0) {
      owns_wide[j] = 1;
      wide_offset[j] = wide_total;
      wide_total += (job.n_tokens * job.w.cols + kWideAlign - 1) / kWideAlign * kWideAlign;
    }
    first_row.push_back(total_rows);
    tasks.push_back(LinearTask{job.w, nullptr, job.n_tokens, job.y});
    total_rows += job.w.rows;
    total_macs += job.w.rows * job.n_tokens * std::max<int64_t>(1, job.w.cols);
    max_tokens = std::max(max_tokens, job.n_tokens);
    panel_rows = std::max(panel_rows, linear_panel_rows(tasks.back()));
    scratch_doubles = std::max(scratch_doubles, linear_scratch_doubles(tasks.back()));
  }
  if (total_rows == 0) return;
  first_row.push_back(total_rows);
  if (static_cast<int64_t>(wide.size()) < wide_total + kWideAlign)
    wide.resize(static_cast<size_t>(wide_total + kWideAlign));
  double* const wide_base = reinterpret_cast<double*>(
      (reinterpret_cast<uintptr_t>(wide.data()) + 63) & ~uintptr_t{63});  // < kWideAlign ahead
  for (int j = 0, t = 0; j < n_jobs; ++j) {
    if (jobs[j].w.rows == 0 || jobs[j].n_tokens == 0) continue;
    double* xw = wide_base + wide_offset[j];
    tasks[t++].x_wide = xw;
    if (!owns_wide[j]) continue;
    const float* x = jobs[j].x;
    const int64_t nx = jobs[j].n_tokens * jobs[j].w.cols;
    if (!pairs_split(j)) {
      for (int64_t i = 0; i < nx; ++i) xw[i] = num::D(x[i]);
      continue;
    }
    for (int64_t i = 0; i < nx; i += 8)  // MXFP4 rows are a whole number of 32-column blocks
      for (int64_t p = 0; p < 4; ++p) {
        xw[i + p] = num::D(x[i + 2 * p]);
        xw[i + 4 + p] = num::D(x[i + 2 * p + 1]);
      }
  }
  // Whole tiles of 4 rows per chunk where possible (the vector kernels' decode tile height);
  // with several tokens, whole panels (kLinearPanelBytes) as long as every thread gets two.
  int64_t grain = (chunk_rows(total_macs / total_rows, kLinearChunkMacs) + 3) / 4 * 4;
  if (max_tokens > 1) {
    const int64_t threads = ex.pool ? ex.pool->size() : 1;
    const int64_t share = (total_rows + 2 * threads - 1) / (2 * threads);
    grain = std::max(grain, (std::min(panel_rows, share) + 3) / 4 * 4);
  }
  const LinearTask* task_list = tasks.data();
  const int64_t* starts = first_row.data();
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());
  parallel_for(ex.pool, total_rows, grain, [&](int64_t b, int64_t e) {
    double* scratch = scratch_doubles > 0 ? linear_panel_scratch(scratch_doubles) : nullptr;
    int64_t j = std::upper_bound(starts, starts + n_tasks + 1, b) - starts - 1;
    for (; j < n_tasks && starts[j] < e; ++j) {
      const int64_t r0 = std::max(b, starts[j]) - starts[j];
      const int64_t r1 = std::min(e, starts[j + 1]) - starts[j];
      kt.linear_rows(task_list[j], r0, r1, scratch);
    }
  });
}

void mxfp4_decode(const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols,
                  float* out) {
  KTIER_CPU_REQUIRE("mxfp4_decode", cols % 32 == 0 && rows >= 0, "bad shape");
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < cols / 32; ++g) {  // one multiplier per group of 32
      const uint8_t s = scales[r * (cols / 32) + g];
      const float mult = s == num::kE8M0ZeroBlock ? 0.0f : std::ldexp(1.0f, s - 127);
      for (int64_t i = 32 * g; i < 32 * g + 32; ++i) {
        const uint8_t byte = packed[r * (cols / 2) + i / 2];
        const int code = (i & 1) ? (byte >> 4) : (byte & 0x0f);
        out[r * cols + i] = s == num::kE8M0ZeroBlock ? 0.0f : num::kE2M1[code] * mult;
      }
    }
  }
}

void widen_to_f32(WeightType type, const void* src, int64_t n, float* out) {
  switch (type) {
    case WeightType::kF32:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<const float*>(src)[i];
      return;
    case WeightType::kBF16:
      for (int64_t i = 0; i < n; ++i)
        out[i] = num::bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
      return;
    case WeightType::kF16:
      for (int64_t i = 0; i < n; ++i)
        out[i] = num::f16_to_f32(static_cast<const uint16_t*>(src)[i]);
      return;
    case WeightType::kMxfp4: break;
  }
  die("widen_to_f32", "weight type %s is not a plain float type", weight_type_name(type));
}

// ---- norms and elementwise -------------------------------------------------------------------

void rmsnorm(const float* x, const float* gain, int64_t rows, int64_t n, double eps, float* out,
             const Exec& ex) {
  const KernelTable& kt = kernel_table(ex.isa);
  KTIER_CPU_REQUIRE("rmsnorm", rows >= 0 && n > 0, "bad shape [%lld, %lld]",
                    static_cast<long long>(rows), static_cast<long long>(n));
  parallel_for(ex.pool, rows, chunk_rows(n, kNormChunkElems),
               [&](int64_t b, int64_t e) { kt.rmsnorm_rows(x, gain, n, eps, b, e, out); });
}

void l2norm(const float* x, int64_t rows, int64_t n, double eps, float* out, const Exec& ex) {
  const KernelTable& kt = kernel_table(ex.isa);
  KTIER_CPU_REQUIRE("l2norm", rows >= 0 && n > 0, "bad shape");
  parallel_for(ex.pool, rows, chunk_rows(n, kNormChunkElems),
               [&](int64_t b, int64_t e) { kt.l2norm_rows(x, n, eps, b, e, out); });
}

void situ_glu(const float* a, const float* b, int64_t n, double beta1, std::optional<double> beta2,
              float* out, const Exec& ex) {
  const KernelTable& kt = kernel_table(ex.isa);
  KTIER_CPU_REQUIRE("situ_glu", n >= 0 && beta1 > 0 && (!beta2 || *beta2 > 0),
                    "bad size or non-positive beta");
  const bool cap_up = beta2.has_value();
  const double b2 = cap_up ? *beta2 : 1.0;
  parallel_for(ex.pool, n, kElementwiseChunk, [&](int64_t i0, int64_t i1) {
    kt.situ_glu_range(a, b, beta1, cap_up, b2, i0, i1, out);
  });
}

void sigmoid(const float* x, int64_t n, float* out, const Exec& ex) {
  const KernelTable& kt = kernel_table(ex.isa);
  parallel_for(ex.pool, n, kElementwiseChunk,
               [&](int64_t i0, int64_t i1) { kt.sigmoid_range(x, i0, i1, out); });
}

void sigmoid_gate(const float* x, const float* gate, int64_t n, float* out, const Exec& ex) {
  const KernelTable& kt = kernel_table(ex.isa);
  parallel_for(ex.pool, n, kElementwiseChunk,
               [&](int64_t i0, int64_t i1) { kt.sigmoid_gate_range(x, gate, i0, i1, out); });
}

void add(const float* a, const float* b, int64_t n, float* out, const Exec& ex) {
  const KernelTable& kt = kernel_table(ex.isa);
  kt.add_range(a, b, 0, std::max<int64_t>(0, n), out);  // memory-bound: not worth a pool hop
}

void weighted_sum(const float* const* vec, const float* weight, int k, int64_t n, float* out,
                  const Exec& ex) {
  const KernelTable& kt = kernel_table(ex.isa);
  KTIER_CPU_REQUIRE("weighted_sum", k >= 0 && n >= 0, "bad sizes");
  kt.weighted_sum_range(vec, weight, k, 0, n, out);
}

// ---- KDA -------------------------------------------------------------------------------------

void kda_short_conv(const float* u, int64_t T, int64_t C, const float* w, int K, float* history,
                    float* out, const Exec& ex) {
  const KernelTable& kt = kernel_table(ex.isa);
  KTIER_CPU_REQUIRE("kda_short_conv", T >= 0 && C >= 0 && K >= 1, "bad shape");
  const ShortConvArgs args{u, T, C, w, K, history, out};
  parallel_for(ex.pool, C, kConvChunkChannels,
               [&](int64_t c0, int64_t c1) { kt.short_conv_channels(args, c0, c1); });
}

void kda_decay_gate(const float* z, int64_t T, int H, int D, const float* A_log,
                    const float* dt_bias, double g_min, float* g, float* alpha, const Exec& ex) {
  const KernelTable& kt = kernel_table(ex.isa);
  KTIER_CPU_REQUIRE("kda_decay_gate", T >= 0 && H > 0 && D > 0, "bad shape");
  std::vector<double> A(static_cast<size_t>(H));
  for (int h = 0; h < H; ++h) A[h] = std::exp(num::D(A_log[h]));  // exp(A_log) in double, once
  const DecayGateArgs args{z, H, D, A.data(), dt_bias, g_min, g, alpha};
  parallel_for(ex.pool, T * H * static_cast<int64_t>(D), kElementwiseChunk,
               [&](int64_t i0, int64_t i1) { kt.decay_gate_range(args, i0, i1); });
}

void kda_recurrence(const float* q, const float* k, const float* v, const float* alpha,
                    const float* beta, int64_t T, int H, int Dk, int Dv, double q_scale,
                    float* state, float* out, const Exec& ex) {
  const KernelTable& kt = kernel_table(ex.isa);
  KTIER_CPU_REQUIRE("kda_recurrence", T >= 0 && H > 0 && Dk > 0 && Dv > 0, "bad shape");
  const RecurrenceArgs args{q, k, v, alpha, beta, T, H, Dk, Dv, q_scale, state, out};
  parallel_for(ex.pool, H, 1, [&](int64_t h0, int64_t h1) {
    kt.recurrence_heads(args, static_cast<int>(h0), static_cast<int>(h1),
                        thread_scratch(recurrence_scratch_doubles(Dv)));
  });
}

// ---- MLA, AttnRes, router, argmax ------------------------------------------------------------

namespace {
// A pass holds its heads' scores (heads x positions doubles); 8 Mi doubles (64 MiB) keeps all
// 96 heads of K3 in one pass up to ~87k positions and a million positions in 12 passes.
constexpr int64_t kMlaScoreDoubles = int64_t{8} << 20;
// The pass buffer: q_lat and q_rope (doubles), probs (doubles), c_hat (f32, in doubles' room).
int64_t mla_buffer_doubles(int64_t L, int64_t dr, int64_t heads, int64_t n_positions) {
  return heads * (L + dr + n_positions) + (heads * L + 1) / 2;
}
}  // namespace

void release_thread_buffers() { t_buffers = ThreadBuffers{}; }

uint64_t thread_buffer_bytes() {
  const ThreadBuffers& b = t_buffers;
  return (b.panel.capacity() + b.scratch.capacity() + b.wide.capacity() + b.mla_pass.capacity()) *
             sizeof(double) +
         (b.wide_offset.capacity() + b.first_row.capacity()) * sizeof(int64_t) +
         b.owns_wide.capacity() + b.tasks.capacity() * sizeof(LinearTask);
}

uint64_t mla_buffer_bytes(const MlaDims& d, int64_t n_positions) {
  // Largest over the calls up to n_positions: it grows with n while every head fits one pass,
  // and past that point (fewer heads per pass) it shrinks, so the peak is at n_positions or at
  // the last n with all heads in one pass.
  auto at = [&](int64_t n) {
    const int G = mla_heads_per_pass(d.n_heads, n);
    return static_cast<uint64_t>(mla_buffer_doubles(d.kv_lora, d.qk_rope, G, n)) * sizeof(double);
  };
  const int64_t all_heads = kMlaScoreDoubles / std::max(1, d.n_heads);
  return std::max(at(n_positions), at(std::min(n_positions, all_heads)));
}

int mla_heads_per_pass(int n_heads, int64_t n_positions) {
  const int64_t fit = kMlaScoreDoubles / std::max<int64_t>(1, n_positions);
  return static_cast<int>(std::clamp<int64_t>(fit, 1, std::max(1, n_heads)));
}

void mla_attention_in_passes(const MlaDims& d, const float* q, int64_t T, const WeightMatrix& kv_b,
                             const float* cache_c, const float* cache_r, int64_t n_past,
                             double scale, float* out, int heads_per_pass, const Exec& ex) {
  constexpr const char* op = "mla_attention";
  const KernelTable& kt = kernel_table(ex.isa);
  KTIER_CPU_REQUIRE(op,
                    d.n_heads > 0 && d.qk_nope > 0 && d.qk_rope >= 0 && d.v_head > 0 &&
                        d.kv_lora > 0 && T >= 0 && n_past >= 0 && heads_per_pass > 0,
                    "bad dims");
  check_weight(op, kv_b);
  KTIER_CPU_REQUIRE(op, kv_b.type != WeightType::kMxfp4, "kv_b must be a float weight");
  KTIER_CPU_REQUIRE(op,
                    kv_b.rows == static_cast<int64_t>(d.n_heads) * (d.qk_nope + d.v_head) &&
                        kv_b.cols == d.kv_lora,
                    "kv_b is [%lld, %lld], expected [%d, %d]", static_cast<long long>(kv_b.rows),
                    static_cast<long long>(kv_b.cols), d.n_heads * (d.qk_nope + d.v_head),
                    d.kv_lora);
  if (T == 0) return;
  const MlaArgs args{d, q, T, kv_b, cache_c, cache_r, n_past, scale, out};
  const int G = std::min(heads_per_pass, d.n_heads);
  const int64_t L = d.kv_lora, dr = d.qk_rope, n_max = n_past + T;
  // The pass's shared buffers (q_lat, q_rope, probs, c_hat) live on the calling thread; not in
  // thread_scratch, which this thread also uses as a worker of the pool.
  std::vector<double>& pass_buf = t_buffers.mla_pass;
  const size_t need = static_cast<size_t>(mla_buffer_doubles(L, dr, G, n_max));
  if (pass_buf.size() < need) pass_buf.resize(need);
  MlaPass p;
  p.q_lat = pass_buf.data();
  p.q_rope = p.q_lat + G * L;
  p.probs = p.q_rope + G * dr;
  p.c_hat = reinterpret_cast<float*>(p.probs + G * n_max);
  // Ranges: positions in runs of 64 for the scores, latent channels in 32s (whole 16-channel
  // vectors) for the mix.
  constexpr int64_t kScoreGrain = 64, kMixChannels = 32;
  const int64_t n_mix = (L + kMixChannels - 1) / kMixChannels;
  for (int64_t t = 0; t < T; ++t) {
    for (int h0 = 0; h0 < d.n_heads; h0 += G) {
      p.t = t;
      p.h0 = h0;
      p.heads = std::min(G, d.n_heads - h0);
      p.n_pos = n_past + t + 1;
      parallel_for(ex.pool, p.heads, 1,
                   [&](int64_t i0, int64_t i1) { kt.mla_query(args, p, i0, i1); });
      parallel_for(ex.pool, p.n_pos, kScoreGrain, [&](int64_t s0, int64_t s1) {
        kt.mla_scores(args, p, s0, s1, thread_scratch(mla_scores_scratch_doubles(d)));
      });
      parallel_for(ex.pool, p.heads, 1, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) num::softmax_inplace(p.probs + i * p.n_pos, p.n_pos);
      });
      parallel_for(ex.pool, n_mix, 1, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t c0 = b * kMixChannels, c1 = std::min(L, c0 + kMixChannels);
          kt.mla_mix(args, p, c0, c1, thread_scratch(mla_mix_scratch_doubles(p.heads, c1 - c0)));
        }
      });
      parallel_for(ex.pool, p.heads, 1, [&](int64_t i0, int64_t i1) {
        kt.mla_out(args, p, i0, i1, thread_scratch(L));
      });
    }
  }
}

void mla_attention(const MlaDims& d, const float* q, int64_t T, const WeightMatrix& kv_b,
                   const float* cache_c, const float* cache_r, int64_t n_past, double scale,
                   float* out, const Exec& ex) {
  mla_attention_in_passes(d, q, T, kv_b, cache_c, cache_r, n_past, scale, out,
                          mla_heads_per_pass(d.n_heads, n_past + T), ex);
}

void attnres(const float* const* src, int m, int64_t src_stride, int64_t T, int64_t n,
             const float* f, double eps, float* out, const Exec& ex) {
  const KernelTable& kt = kernel_table(ex.isa);
  KTIER_CPU_REQUIRE("attnres", m >= 1 && T >= 0 && n > 0, "bad shape (m=%d)", m);
  const AttnResArgs args{src, m, src_stride, n, f, eps, out};
  parallel_for(ex.pool, T, 1,
               [&](int64_t t0, int64_t t1) { kt.attnres_tokens(args, t0, t1, thread_scratch(m)); });
}

void router_topk(const float* logits, const float* bias, int64_t T, int n_experts, int top_k,
                 bool renormalize, double scaling, int32_t* ids, float* weights, const Exec& ex) {
  const KernelTable& kt = kernel_table(ex.isa);
  KTIER_CPU_REQUIRE("router_topk", T >= 0 && top_k >= 1 && top_k <= n_experts,
                    "top_k %d outside 1..%d", top_k, n_experts);
  const RouterArgs args{logits, bias, n_experts, top_k, renormalize, scaling, ids, weights};
  parallel_for(ex.pool, T, 1, [&](int64_t t0, int64_t t1) {
    kt.router_tokens(args, t0, t1, thread_scratch(3 * static_cast<int64_t>(n_experts)));
  });
}

int64_t argmax(const float* x, int64_t n, const Exec& ex) {
  return kernel_table(ex.isa).argmax(x, std::max<int64_t>(0, n));
}

}  // namespace ktier::cpu
