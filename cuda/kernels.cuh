#pragma once
// Private to libktier_cuda.so: the kernel launchers behind the op table (module_ops.cu) and the
// device helpers they share. Launchers take raw device pointers, sizes and a stream, enqueue
// their kernels and return cudaGetLastError(); arguments are checked by module_ops.cu.
// Arithmetic: cuda/README.md (per op: launch shape, f32 accumulation chain, what differs from
// the CPU contract docs/NUMERICS.md).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda_module_abi.h"

#define KTIER_CUDA_EXPORT extern "C" __attribute__((visibility("default")))

namespace ktier_cuda {

// ---- errors (module_ops.cu) ----------------------------------------------------------------
// Records "op: message" as the calling thread's last error; returns `code` (non-zero).
int set_error(int code, const char* op, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
// 0 on cudaSuccess, else records the CUDA error name for `op` and returns the error code.
int cuda_check(const char* op, cudaError_t err);
constexpr int kArgError = -1;  // returned for argument errors (a bug in the caller)

// ---- device helpers --------------------------------------------------------------------------
constexpr int kBlock = 256;  // threads per block of the reduction kernels (8 warps)

__device__ __forceinline__ double D(float x) { return static_cast<double>(x); }
__device__ __forceinline__ float F(double v) { return __double2float_rn(v); }
__device__ __forceinline__ double dsigmoid(double v) { return 1.0 / (1.0 + exp(-v)); }

// Butterfly sum over the 32 lanes: 5 f32 additions deep; every lane gets the same bits.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over a kBlock-thread block: warp butterfly (5) + butterfly over the 8 warp sums (3),
// 8 f32 additions deep. Every thread gets the result. `red` is __shared__ float[kBlock / 32];
// contains __syncthreads(), so call it from all threads.
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // red may still be read by a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  // Every group of 8 lanes holds all 8 warp sums, so the 3-level butterfly leaves the total
  // (same bits: each step adds the same two values, commuted) in every lane, not just 0-7.
  float w = red[lane & (kBlock / 32 - 1)];
#pragma unroll
  for (int o = kBlock / 64; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
  return w;
}

// Weight element traits (F32, BF16, F16): storage type and exact widening to f32.
struct F32W {
  using Storage = float;
  static __device__ __forceinline__ float wide(Storage v) { return v; }
};
struct Bf16W {
  using Storage = uint16_t;
  static __device__ __forceinline__ float wide(Storage v) {
    return __uint_as_float(static_cast<uint32_t>(v) << 16);
  }
};
struct F16W {
  using Storage = uint16_t;
  static __device__ __forceinline__ float wide(Storage v) {
    return __half2float(__ushort_as_half(v));
  }
};

// ---- launchers -------------------------------------------------------------------------------
// linear.cu: the whole linear op (argument checks, grouping, fused kernels, then, with
// `allow_cublas`, cublas_linear for the jobs it routes there); returns 0 or an error code with
// set_error done.
int linear_run(const KtierCudaLinearJob* jobs, int n_jobs, bool allow_cublas,
               cudaStream_t stream);
// cublas_gemm.cu. cublas_init (enable_cublas): loads cuBLAS (if needed) and creates the
// process's handle for `device` (one attempt, from any thread); failure is not an error (the
// fused kernels take over). cublas_ready: that handle exists. cublas_linear: runs
// jobs[idx[0..n_idx)] (checked float-weight jobs, rows, cols and n_tokens < 2^31) through cuBLAS
// on `stream`; returns 0 or an error code with set_error done.
void cublas_init(int device);
bool cublas_ready(int device);
int cublas_linear(const KtierCudaLinearJob* jobs, const int* idx, int n_idx, int device,
                  cudaStream_t stream);
// Frees the scratch buffers of `stream` (stream-ordered), before the stream is destroyed.
void scratch_release(cudaStream_t stream);

// norm_elementwise.cu
cudaError_t launch_norm(const float* x, const float* gain, int64_t rows, int64_t n, double eps,
                        bool l2, float* out, cudaStream_t s);
cudaError_t launch_situ_glu(const float* a, const float* b, int64_t n, double beta1, bool cap_up,
                            double beta2, float* out, cudaStream_t s);
cudaError_t launch_sigmoid(const float* x, const float* gate, int64_t n, float* out,
                           cudaStream_t s);  // gate == nullptr: sigmoid(x); else x*sigmoid(gate)
cudaError_t launch_add(const float* a, const float* b, int64_t n, float* out, cudaStream_t s);
// row_of: host arrays, passed to the kernels in kernel parameters (kIndexParams at a time).
cudaError_t launch_weighted_sum(const float* rows, const int32_t* row_of, const float* weight,
                                int64_t T, int k, int64_t n, float* out, cudaStream_t s);
cudaError_t launch_gather_rows(const float* src, const int32_t* row_of, int64_t rows, int64_t n,
                               float* dst, cudaStream_t s);

// kda.cu
cudaError_t launch_short_conv(const float* u, int64_t T, int64_t C, const float* w, int K,
                              float* history, float* out, cudaStream_t s);
cudaError_t launch_decay_gate(const float* z, int64_t T, int H, int D, const float* A_log,
                              const float* dt_bias, double g_min, float* g, float* alpha,
                              cudaStream_t s);
cudaError_t launch_recurrence(const float* q, const float* k, const float* v, const float* alpha,
                              const float* beta, int64_t T, int H, int Dk, int Dv, double q_scale,
                              float* state, float* out, cudaStream_t s);

// mla_attnres.cu
cudaError_t launch_mla(const KtierCudaMlaDims& d, const float* q, int64_t T,
                       const KtierCudaWeight& kv_b, const float* cache_c, const float* cache_r,
                       int64_t n_past, double scale, float* out, cudaStream_t s);
cudaError_t launch_attnres(const float* const* src, int m, int64_t src_stride, int64_t T,
                           int64_t n, const float* f, double eps, float* out, cudaStream_t s);

// router.cu
cudaError_t launch_router(const float* logits, const float* bias, int64_t T, int n_experts,
                          int top_k, bool renormalize, double scaling, int32_t* ids,
                          float* weights, cudaStream_t s);
cudaError_t launch_argmax(const float* x, int64_t n, int64_t* out, cudaStream_t s);

// Grid size for a grid-stride loop over n elements with kBlock threads.
inline unsigned grid_for(int64_t n) {
  const int64_t b = (n + kBlock - 1) / kBlock;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

// Lets `kernel` take `dynamic_bytes` of dynamic shared memory. Past 48 KiB per block — static
// (the kernel's own __shared__ arrays) and dynamic together — a kernel must opt in; the
// static part is asked of the runtime so that a size just under 48 KiB is not refused at launch.
template <class Kernel>
cudaError_t allow_dynamic_shared(Kernel* kernel, size_t dynamic_bytes) {
  // This module's kernels keep well under 16 KiB of static arrays: no question to ask below.
  if (dynamic_bytes <= 32 * 1024) return cudaSuccess;
  cudaFuncAttributes a{};
  const cudaError_t err = cudaFuncGetAttributes(&a, kernel);
  if (err != cudaSuccess) return err;
  if (dynamic_bytes + a.sharedSizeBytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(dynamic_bytes));
}

}  // namespace ktier_cuda
