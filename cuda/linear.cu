// The linear op (NUMERICS.md §3, §4 semantics; arithmetic in cuda/README.md):
//  * fused matrix-vector kernels, one launch per (weight type, alignment) for up to kMaxJobs
//    jobs: a warp per row (dense) or per 1-4 rows (MXFP4), weight bytes decoded in registers,
//    f32 accumulation (MXFP4: f32 within a word, double across words), up to kMaxNt tokens per
//    pass with one accumulator per (row, token);
//  * with allow_cublas (`--gpu-prefill cublas`), F32 and BF16 weights with n_tokens >= 8:
//    cuBLAS (cublas_gemm.cu; F16 stays fused). Without it every token count takes the fused
//    kernels, whose sum for a (row, token) is the same for any n_tokens (chunk invariance).
#include <cuda_fp16.h>
#include <vector>

#include "kernels.cuh"

namespace ktier_cuda {
namespace {

constexpr int kMaxJobs = 64;       // jobs per launch (kernel parameter space: ~3.6 KB)
constexpr int kWarpsPerBlock = 8;  // 256 threads; dense: one row per warp
constexpr int kMaxNt = 8;          // tokens per pass of the fused kernels
constexpr int64_t kCublasMinTokens = 8;

struct LinJob {
  const void* w;
  const uint8_t* scales;
  const float* x;
  float* y;
  int64_t rows, cols;
  int32_t n_tokens;
  int32_t block0;  // first block of this job in the launch
};
struct LinBatch {
  int32_t n_jobs;
  int32_t n_blocks;
  LinJob job[kMaxJobs];
};

#ifdef KTIER_CUDA_EMULATION  // the host emulation checks the pointers a launch carries
void emulation_check_pointers(const char* kernel, int index, const LinBatch& b) {
  for (int j = 0; j < b.n_jobs; ++j) {
    const LinJob& jb = b.job[j];
    for (const void* p : {jb.w, static_cast<const void*>(jb.scales),
                          static_cast<const void*>(jb.x), static_cast<const void*>(jb.y)})
      ktier_emu::check_device_pointer(kernel, index, p);
  }
}
#endif

// Which job block b belongs to (binary search over block0).
__device__ __forceinline__ int find_job(const LinBatch& b, int block) {
  int lo = 0, hi = b.n_jobs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (b.job[mid].block0 <= block) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// 16 weight bytes, not kept in L1 (read once; x is what L1 should hold).
__device__ __forceinline__ uint4 load_stream16(const void* p) {
  uint4 r;
#ifdef KTIER_CUDA_EMULATION  // the host emulation (cuda/emulation): a plain 16-byte load
  ktier_emu::check_aligned(p, 16, "ld.global.nc.v4.u32");
  memcpy(&r, p, sizeof(r));
#else
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
#endif
  return r;
}
// Weight traits for the dense kernel: E elements per 16-byte chunk, unpacked exactly to f32.
struct F32T : F32W {
  static constexpr int E = 4;
  static __device__ __forceinline__ void unpack(uint4 r, float* o) {
    o[0] = __uint_as_float(r.x); o[1] = __uint_as_float(r.y);
    o[2] = __uint_as_float(r.z); o[3] = __uint_as_float(r.w);
  }
};
struct Bf16T : Bf16W {
  static constexpr int E = 8;
  static __device__ __forceinline__ void unpack(uint4 r, float* o) {
    const uint32_t u[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      o[2 * i] = __uint_as_float(u[i] << 16);
      o[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
  }
};
struct F16T : F16W {
  static constexpr int E = 8;
  static __device__ __forceinline__ void unpack(uint4 r, float* o) {
    const uint32_t u[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __half2 h;
      memcpy(&h, &u[i], 4);
      const float2 f = __half22float2(h);
      o[2 * i] = f.x;
      o[2 * i + 1] = f.y;
    }
  }
};

// Dense weights. Warp per row; lane l takes the 16-byte chunks l, l + 32, ... (Vec: rows and
// x rows 16-byte aligned) or the elements l, l + 32, ... (otherwise), in increasing order, one
// f32 FMA per element into the token's accumulator; then the 5-level butterfly.
template <class Wt, bool Vec, int NT>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    dense_kernel(const __grid_constant__ LinBatch batch) {
  const LinJob& jb = batch.job[find_job(batch, blockIdx.x)];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x - jb.block0) * kWarpsPerBlock + warp;
  if (r >= jb.rows) return;
  const int64_t cols = jb.cols;
  using St = typename Wt::Storage;
  const St* wr = static_cast<const St*>(jb.w) + r * cols;
  for (int t0 = 0; t0 < jb.n_tokens; t0 += NT) {
    const int nt = jb.n_tokens - t0 < NT ? jb.n_tokens - t0 : NT;
    const float* xt = jb.x + static_cast<int64_t>(t0) * cols;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
    if constexpr (Vec) {
      constexpr int E = Wt::E, U = 4;
      const int64_t nchunk = cols / E;
      for (int64_t base = lane; base < nchunk; base += 32 * U) {
        uint4 raw[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t ch = base + 32 * u;
          raw[u] = ch < nchunk ? load_stream16(wr + ch * E) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t ch = base + 32 * u;
          if (ch >= nchunk) break;
          float wv[E];
          Wt::unpack(raw[u], wv);
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            if (t < nt) {
              const float4* xp = reinterpret_cast<const float4*>(xt + t * cols + ch * E);
#pragma unroll
              for (int q = 0; q < E / 4; ++q) {
                const float4 xv = __ldg(xp + q);
                acc[t] = __fmaf_rn(wv[4 * q + 0], xv.x, acc[t]);
                acc[t] = __fmaf_rn(wv[4 * q + 1], xv.y, acc[t]);
                acc[t] = __fmaf_rn(wv[4 * q + 2], xv.z, acc[t]);
                acc[t] = __fmaf_rn(wv[4 * q + 3], xv.w, acc[t]);
              }
            }
          }
        }
      }
    } else {
      for (int64_t i = lane; i < cols; i += 32) {
        const float wv = Wt::wide(wr[i]);
#pragma unroll
        for (int t = 0; t < NT; ++t)
          if (t < nt) acc[t] = __fmaf_rn(wv, __ldg(xt + t * cols + i), acc[t]);
      }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float s = warp_sum(acc[t]);
      if (lane == 0 && t < nt) jb.y[static_cast<int64_t>(t0 + t) * jb.rows + r] = s;
    }
  }
}

// Two E2M1 codes, at bits 12-15 and 28-31 of v, as f32 values times 2^-14 (exact): the code's
// sign, exponent and mantissa bits moved into binary16 fields, then widened.
__device__ __forceinline__ float2 e2m1x2(uint32_t v) {
  const uint32_t h = (v & 0x80008000u) | ((v >> 3) & 0x0e000e00u);
  __half2 hh;
  memcpy(&hh, &h, 4);
  return __half22float2(hh);
}

// MXFP4 rows per warp for NT tokens per pass: a lane's x values (8 per token) are reused from
// registers by all of its rows, which keeps the L1 traffic of x below that of the weights' 8x.
template <int NT>
__host__ __device__ constexpr int mxfp4_rows_per_warp() { return NT <= 2 ? 4 : NT == 4 ? 2 : 1; }

// MXFP4. A warp takes RPW consecutive rows; lane l takes the 4-byte words w = l, l + 32, ... of
// each row (8 elements, a quarter of a block; consecutive lanes read consecutive weight bytes and
// consecutive x), in increasing order, U words per step with all loads issued first. Per word,
// row and token: two f32 partial sums of 4 FMAs (elements 0-3, elements 4-7 of the word), added;
// that sum times 2^(s - 113) (exact; the E2M1 codes are decoded as binary16 values
// 2^-14 times theirs) is added to the (row, token) double accumulator. Words of a
// scale-255 block are skipped for that row (their x is never used). Lanes are summed by the
// double butterfly; one rounding to f32.
template <bool Vec, int NT>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    mxfp4_kernel(const __grid_constant__ LinBatch batch) {
  constexpr int RPW = mxfp4_rows_per_warp<NT>(), U = 2;
  const LinJob& jb = batch.job[find_job(batch, blockIdx.x)];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x - jb.block0) * kWarpsPerBlock + warp) * RPW;
  if (r0 >= jb.rows) return;
  const int64_t cols = jb.cols, nblk = cols / 32, nwords = cols / 8;
  const uint8_t* wr[RPW];
  const uint8_t* sr[RPW];
#pragma unroll
  for (int q = 0; q < RPW; ++q) {
    const int64_t r = r0 + q < jb.rows ? r0 + q : r0;  // rows past the end: computed, not stored
    wr[q] = static_cast<const uint8_t*>(jb.w) + r * (cols / 2);
    sr[q] = jb.scales + r * nblk;
  }
  for (int t0 = 0; t0 < jb.n_tokens; t0 += NT) {
    const int nt = jb.n_tokens - t0 < NT ? jb.n_tokens - t0 : NT;
    const float* xt = jb.x + static_cast<int64_t>(t0) * cols;
    double acc[RPW][NT];
#pragma unroll
    for (int q = 0; q < RPW; ++q)
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[q][t] = 0.0;
    for (int64_t w0 = lane; w0 < nwords; w0 += 32 * U) {
      uint32_t wd[U][RPW], sc[U][RPW];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t w = w0 + 32 * u;
#pragma unroll
        for (int q = 0; q < RPW; ++q) {
          if (w < nwords) {
            sc[u][q] = sr[q][w >> 2];
            if constexpr (Vec) {
              wd[u][q] = __ldg(reinterpret_cast<const unsigned int*>(wr[q]) + w);
            } else {
              const uint8_t* b = wr[q] + 4 * w;
              wd[u][q] = static_cast<uint32_t>(b[0]) | static_cast<uint32_t>(b[1]) << 8 |
                         static_cast<uint32_t>(b[2]) << 16 | static_cast<uint32_t>(b[3]) << 24;
            }
          } else {
            sc[u][q] = 255u;
            wd[u][q] = 0u;
          }
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t w = w0 + 32 * u;
        if (w >= nwords) break;
        float xa[NT][4], xb[NT][4];
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          if (t < nt) {
            const float* xp = xt + t * cols + 8 * w;
            if constexpr (Vec) {
              const float4 a = __ldg(reinterpret_cast<const float4*>(xp));
              const float4 b = __ldg(reinterpret_cast<const float4*>(xp) + 1);
              xa[t][0] = a.x; xa[t][1] = a.y; xa[t][2] = a.z; xa[t][3] = a.w;
              xb[t][0] = b.x; xb[t][1] = b.y; xb[t][2] = b.z; xb[t][3] = b.w;
            } else {
#pragma unroll
              for (int k = 0; k < 4; ++k) {
                xa[t][k] = __ldg(xp + k);
                xb[t][k] = __ldg(xp + 4 + k);
              }
            }
          }
        }
#pragma unroll
        for (int q = 0; q < RPW; ++q) {
          const uint32_t s = sc[u][q];
          if (s == 255u) continue;
          // The decoded values are E2M1 * 2^-14, so the scale is 2^(s - 127 + 14).
          const double scale = __longlong_as_double(static_cast<long long>(s + 1023 - 113) << 52);
          float2 v[4];  // v[k] = (element k, element k + 4) of the word
#pragma unroll
          for (int k = 0; k < 4; ++k) v[k] = e2m1x2(wd[u][q] << (12 - 4 * k));
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            if (t < nt) {
              float pa = 0.0f, pb = 0.0f;
#pragma unroll
              for (int k = 0; k < 4; ++k) {
                pa = __fmaf_rn(v[k].x, xa[t][k], pa);
                pb = __fmaf_rn(v[k].y, xb[t][k], pb);
              }
              acc[q][t] = __dadd_rn(acc[q][t], __dmul_rn(D(__fadd_rn(pa, pb)), scale));
            }
          }
        }
      }
    }
#pragma unroll
    for (int q = 0; q < RPW; ++q) {
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const double s = warp_sum_d(acc[q][t]);
        if (lane == 0 && t < nt && r0 + q < jb.rows)
          jb.y[static_cast<int64_t>(t0 + t) * jb.rows + r0 + q] = F(s);
      }
    }
  }
}

// ---- launch of the fused kernels ----

template <int NT>
cudaError_t launch_fused_nt(int type, bool vec, const LinBatch& b, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(b.n_blocks)), block(kWarpsPerBlock * 32);
  switch (type) {
    case KTIER_CUDA_F32:
      if (vec) dense_kernel<F32T, true, NT><<<grid, block, 0, s>>>(b);
      else dense_kernel<F32T, false, NT><<<grid, block, 0, s>>>(b);
      break;
    case KTIER_CUDA_BF16:
      if (vec) dense_kernel<Bf16T, true, NT><<<grid, block, 0, s>>>(b);
      else dense_kernel<Bf16T, false, NT><<<grid, block, 0, s>>>(b);
      break;
    case KTIER_CUDA_F16:
      if (vec) dense_kernel<F16T, true, NT><<<grid, block, 0, s>>>(b);
      else dense_kernel<F16T, false, NT><<<grid, block, 0, s>>>(b);
      break;
    default:
      if (vec) mxfp4_kernel<true, NT><<<grid, block, 0, s>>>(b);
      else mxfp4_kernel<false, NT><<<grid, block, 0, s>>>(b);
      break;
  }
  return cudaGetLastError();
}

int nt_for(int max_tokens) {
  return max_tokens <= 1 ? 1 : max_tokens <= 2 ? 2 : max_tokens <= 4 ? 4 : kMaxNt;
}

int rows_per_block(int type, int nt) {
  if (type != KTIER_CUDA_MXFP4) return kWarpsPerBlock;
  switch (nt) {
    case 1: return kWarpsPerBlock * mxfp4_rows_per_warp<1>();
    case 2: return kWarpsPerBlock * mxfp4_rows_per_warp<2>();
    case 4: return kWarpsPerBlock * mxfp4_rows_per_warp<4>();
    default: return kWarpsPerBlock * mxfp4_rows_per_warp<kMaxNt>();
  }
}

cudaError_t launch_fused(int type, bool vec, const LinBatch& b, int nt, cudaStream_t s) {
  switch (nt) {
    case 1: return launch_fused_nt<1>(type, vec, b, s);
    case 2: return launch_fused_nt<2>(type, vec, b, s);
    case 4: return launch_fused_nt<4>(type, vec, b, s);
    default: return launch_fused_nt<kMaxNt>(type, vec, b, s);
  }
}

constexpr int64_t kIntMax = 0x7fffffff;

}  // namespace

int linear_run(const KtierCudaLinearJob* jobs, int n_jobs, bool allow_cublas,
               cudaStream_t stream) {
  constexpr const char* op = "linear";
  if (n_jobs < 0 || (n_jobs > 0 && !jobs)) return set_error(kArgError, op, "bad job list");
  // Checks first (cpu/dispatch.cpp's), so that a bad job launches nothing.
  for (int j = 0; j < n_jobs; ++j) {
    const KtierCudaLinearJob& jb = jobs[j];
    const KtierCudaWeight& w = jb.w;
    if (w.rows < 0 || w.cols < 0)
      return set_error(kArgError, op, "job %d: negative weight shape [%lld, %lld]", j,
                       (long long)w.rows, (long long)w.cols);
    if (w.type < KTIER_CUDA_F32 || w.type > KTIER_CUDA_MXFP4)
      return set_error(kArgError, op, "job %d: unknown weight type %d", j, (int)w.type);
    if (w.rows > 0 && w.cols > 0 && !w.data)
      return set_error(kArgError, op, "job %d: null weight data", j);
    if (w.type == KTIER_CUDA_MXFP4) {
      if (w.cols % 32 != 0)
        return set_error(kArgError, op, "job %d: MXFP4 width %lld is not a multiple of 32", j,
                         (long long)w.cols);
      if (w.rows > 0 && w.cols > 0 && !w.scales)
        return set_error(kArgError, op, "job %d: null MXFP4 scales", j);
    }
    if (jb.n_tokens < 0) return set_error(kArgError, op, "job %d: negative token count", j);
    if (w.rows == 0 || jb.n_tokens == 0) continue;
    if (!jb.y || (w.cols > 0 && !jb.x))
      return set_error(kArgError, op, "null x or y in job %d", j);
    if (jb.n_tokens > kIntMax || (w.rows + kWarpsPerBlock - 1) / kWarpsPerBlock > kIntMax)
      return set_error(kArgError, op, "job %d: too large (%lld tokens, %lld rows)", j,
                       (long long)jb.n_tokens, (long long)w.rows);
  }
  int device = 0;
  if (const int rc = cuda_check(op, cudaGetDevice(&device))) return rc;
  const bool have_cublas = allow_cublas && cublas_ready(device);

  // Fused launches: one per (type, alignment) group and kMaxJobs jobs.
  std::vector<int> cublas_jobs, group;
  for (int type = KTIER_CUDA_F32; type <= KTIER_CUDA_MXFP4; ++type) {
    for (int vec = 1; vec >= 0; --vec) {
      group.clear();
      for (int j = 0; j < n_jobs; ++j) {
        const KtierCudaLinearJob& jb = jobs[j];
        const KtierCudaWeight& w = jb.w;
        if (w.type != type || w.rows == 0 || jb.n_tokens == 0) continue;
        const size_t esize = type == KTIER_CUDA_F32 ? 4 : type == KTIER_CUDA_MXFP4 ? 1 : 2;
        const size_t row_bytes = type == KTIER_CUDA_MXFP4 ? w.cols / 2 : w.cols * esize;
        const bool aligned = reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
                             row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(jb.x) % 16 == 0;
        if (aligned != (vec != 0)) continue;
        if ((type == KTIER_CUDA_F32 || type == KTIER_CUDA_BF16) &&
            jb.n_tokens >= kCublasMinTokens && w.cols > 0 &&
            have_cublas && w.rows <= kIntMax && w.cols <= kIntMax) {
          cublas_jobs.push_back(j);
          continue;
        }
        group.push_back(j);
      }
      size_t next = 0;
      while (next < group.size()) {
        // Up to kMaxJobs jobs whose blocks (counted with one row per warp, the most blocks any
        // NT gives) fit the grid.
        size_t end = next;
        int64_t bound = 0;
        int max_tokens = 0;
        while (end < group.size() && end - next < static_cast<size_t>(kMaxJobs)) {
          const KtierCudaLinearJob& jb = jobs[group[end]];
          const int64_t blocks = (jb.w.rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
          if (end > next && bound + blocks > kIntMax) break;
          bound += blocks;
          if (jb.n_tokens > max_tokens) max_tokens = static_cast<int>(jb.n_tokens);
          ++end;
        }
        const int nt = nt_for(max_tokens);
        const int64_t rpb = rows_per_block(type, nt);
        LinBatch batch;
        batch.n_jobs = 0;
        batch.n_blocks = 0;
        for (size_t g = next; g < end; ++g) {
          const KtierCudaLinearJob& jb = jobs[group[g]];
          LinJob& lj = batch.job[batch.n_jobs++];
          lj.w = jb.w.data;
          lj.scales = jb.w.scales;
          lj.x = jb.x;
          lj.y = jb.y;
          lj.rows = jb.w.rows;
          lj.cols = jb.w.cols;
          lj.n_tokens = static_cast<int32_t>(jb.n_tokens);
          lj.block0 = batch.n_blocks;
          batch.n_blocks += static_cast<int32_t>((jb.w.rows + rpb - 1) / rpb);
        }
        if (const int rc = cuda_check(op, launch_fused(type, vec != 0, batch, nt, stream)))
          return rc;
        next = end;
      }
    }
  }
  return cublas_jobs.empty()
             ? 0
             : cublas_linear(jobs, cublas_jobs.data(), static_cast<int>(cublas_jobs.size()), device,
                             stream);
}

}  // namespace ktier_cuda
