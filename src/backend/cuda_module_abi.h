#pragma once
/* The C ABI between the ktier executable and the optional CUDA module libktier_cuda.so.
 * ktier never links against libcudart or libcublas: it dlopen()s the module and resolves the
 * symbols below. Plain C, no CUDA headers, so both sides can include it.
 * Bump KTIER_CUDA_ABI_VERSION on any change; ktier refuses a module of another version. */
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KTIER_CUDA_ABI_VERSION 9

typedef struct KtierCudaDeviceInfo {
  char name[256];
  int compute_major;
  int compute_minor;
  int multiprocessors;
  uint64_t total_bytes;
  uint64_t free_bytes;  /* device 0 only (the one ktier runs on), else 0: asking opens a context
                           (hundreds of MB) on the device for the life of the process */
} KtierCudaDeviceInfo;

typedef struct KtierCudaProbe {
  int abi_version;      /* KTIER_CUDA_ABI_VERSION of the module */
  int runtime_version;  /* cudaRuntimeGetVersion, e.g. 13000 */
  int driver_version;   /* cudaDriverGetVersion; 0 when no driver is installed */
  int device_count;     /* usable CUDA devices; 0 when none */
  char error[256];      /* why device_count is 0, empty otherwise */
  int min_compute;      /* 10 * major + minor of the oldest GPU the module has kernels for (the
                           lowest architecture it was built for, e.g. 80): older ones cannot run
                           it (ABI v6) */
  KtierCudaDeviceInfo devices[8];
} KtierCudaProbe;

/* Symbol "ktier_cuda_abi_version": returns KTIER_CUDA_ABI_VERSION. */
typedef int (*KtierCudaAbiVersionFn)(void);
/* Symbol "ktier_cuda_probe": fills *out; never aborts, whatever the machine lacks. */
typedef void (*KtierCudaProbeFn)(KtierCudaProbe* out);

/* ------------------------------------------------------------------------------------------
 * Ops. Symbol "ktier_cuda_ops": returns the module's table (static storage, never null).
 *
 * Conventions (the CPU kernel API, cpu/kernels.h, with device pointers):
 *  - Every pointer an op reads or writes is device memory (cudaMalloc) unless the field says
 *    "host"; host arrays are read before the call returns (the module copies them into kernel
 *    parameters), so the caller may reuse them at once.
 *  - Every op is asynchronous on `stream` (a cudaStream_t; NULL = the legacy default stream).
 *  - Every function returns 0 on success; on failure a non-zero code, and last_error() then
 *    describes the failure (CUDA error name and the op) until the next failing call on the same
 *    host thread. Argument errors (a bug in the caller) also return non-zero, never abort.
 *  - Shapes, layouts and semantics are exactly those of the same-named op in cpu/kernels.h;
 *    the arithmetic is f32 with the accumulation chains stated per op in cuda/README.md, so the
 *    results agree with the CPU within the tolerances the cross-backend test derives from them.
 *  - Thread-safety: ops on different streams may be issued from different host threads.
 * ------------------------------------------------------------------------------------------ */

/* What malloc_device returns where the device has no room for the block: the value of
 * cudaErrorMemoryAllocation, which modules of this ABI version always returned, so that ktier
 * can tell a full device from other failures without reading last_error()'s text. */
#define KTIER_CUDA_ERROR_OUT_OF_MEMORY 2

typedef void* KtierCudaStream;
typedef void* KtierCudaEvent;

/* Weight types: the numeric values of ktier::cpu::WeightType. */
enum { KTIER_CUDA_F32 = 0, KTIER_CUDA_BF16 = 1, KTIER_CUDA_F16 = 2, KTIER_CUDA_MXFP4 = 3 };

typedef struct KtierCudaWeight {
  int32_t type;           /* KTIER_CUDA_* */
  const void* data;       /* device: elements, or MXFP4 packed bytes [rows, cols/2] */
  const uint8_t* scales;  /* device: MXFP4 E8M0 scales [rows, cols/32]; NULL otherwise */
  int64_t rows;
  int64_t cols;           /* MXFP4 requires cols % 32 == 0 */
} KtierCudaWeight;

typedef struct KtierCudaLinearJob {
  KtierCudaWeight w;
  const float* x; /* device [n_tokens, w.cols] */
  int64_t n_tokens;
  float* y;       /* device [n_tokens, w.rows]; y ranges of one call are disjoint */
} KtierCudaLinearJob;

typedef struct KtierCudaMlaDims {
  int n_heads, qk_nope, qk_rope, v_head, kv_lora;
} KtierCudaMlaDims;

#define KTIER_CUDA_MAX_TOPK 64      /* weighted_sum k, router top_k */
#define KTIER_CUDA_MAX_SOURCES 128  /* attnres m */

typedef struct KtierCudaOps {
  size_t struct_size; /* sizeof(KtierCudaOps) as the module was built */
  const char* (*last_error)(void);

  /* Selects the device for the calling thread (and creates its context). Call on each host
   * thread before it issues anything else (the CUDA runtime's current device is per thread). */
  int (*init)(int device);

  /* ---- memory, streams, events ---- */
  int (*malloc_device)(void** ptr, size_t bytes);
  int (*free_device)(void* ptr);
  int (*malloc_host)(void** ptr, size_t bytes); /* pinned, cudaHostAlloc (portable) */
  int (*free_host)(void* ptr);
  /* Page-locks existing host memory (cudaHostRegister, portable) so copies from it run at full
   * link speed; unregister before the memory is freed. */
  int (*host_register)(void* ptr, size_t bytes);
  int (*host_unregister)(void* ptr);
  int (*mem_info)(size_t* free_bytes, size_t* total_bytes);
  /* cudaMemcpyAsync with cudaMemcpyDefault (unified addressing decides the direction). */
  int (*memcpy_async)(void* dst, const void* src, size_t bytes, KtierCudaStream stream);
  int (*memset_async)(void* dst, int value, size_t bytes, KtierCudaStream stream);
  int (*stream_create)(KtierCudaStream* stream); /* non-blocking stream */
  int (*stream_destroy)(KtierCudaStream stream);
  int (*stream_synchronize)(KtierCudaStream stream);
  int (*event_create)(KtierCudaEvent* event); /* timing disabled */
  int (*event_destroy)(KtierCudaEvent event);
  int (*event_record)(KtierCudaEvent event, KtierCudaStream stream);
  int (*stream_wait_event)(KtierCudaStream stream, KtierCudaEvent event);
  int (*event_synchronize)(KtierCudaEvent event);
  /* Without waiting (cudaEventQuery): *passed = 1 when the work recorded before the event has
   * completed (or it was never recorded), 0 when not yet (ABI v9). */
  int (*event_query)(KtierCudaEvent event, int* passed);

  /* ---- ops (cpu/kernels.h names) ---- */
  /* jobs: host array. Every job runs the fused matrix-vector kernels (weights decoded in
   * registers), whose sum for a (row, token) does not depend on n_tokens, so a prefill gives
   * the same bytes however it is chunked (K3-MODEL §9.2). With allow_cublas non-zero and cuBLAS
   * enabled (enable_cublas), F32 and BF16 jobs of n_tokens >= 8 run cuBLAS instead (BF16: x split
   * exactly into three bf16 parts; F32: SGEMM; f32 sums in cuBLAS's order, which may change
   * with the shape): a faster prefill whose bytes depend on the chunking (ABI v8). */
  int (*linear)(const KtierCudaLinearJob* jobs, int n_jobs, int allow_cublas,
                KtierCudaStream stream);
  int (*rmsnorm)(const float* x, const float* gain, int64_t rows, int64_t n, double eps,
                 float* out, KtierCudaStream stream);
  int (*l2norm)(const float* x, int64_t rows, int64_t n, double eps, float* out,
                KtierCudaStream stream);
  /* cap_up == 0: the up factor is b itself (beta2 ignored). */
  int (*situ_glu)(const float* a, const float* b, int64_t n, double beta1, int cap_up,
                  double beta2, float* out, KtierCudaStream stream);
  int (*sigmoid)(const float* x, int64_t n, float* out, KtierCudaStream stream);
  int (*sigmoid_gate)(const float* x, const float* gate, int64_t n, float* out,
                      KtierCudaStream stream);
  int (*add)(const float* a, const float* b, int64_t n, float* out, KtierCudaStream stream);
  /* out[t] = sum_j weight[t*k + j] * rows[row_of[t*k + j]] (n floats a row), j in order.
   * row_of: host array [T * k]; rows, weight [T * k], out [T, n]: device. k <= MAX_TOPK. */
  int (*weighted_sum)(const float* rows, const int32_t* row_of, const float* weight, int64_t T,
                      int k, int64_t n, float* out, KtierCudaStream stream);
  /* dst[r] = src[row_of[r]] for r < rows, n floats a row. row_of: host array [rows]. */
  int (*gather_rows)(const float* src, const int32_t* row_of, int64_t rows, int64_t n,
                     float* dst, KtierCudaStream stream);
  int (*kda_short_conv)(const float* u, int64_t T, int64_t C, const float* w, int K,
                        float* history, float* out, KtierCudaStream stream);
  /* g may be NULL. */
  int (*kda_decay_gate)(const float* z, int64_t T, int H, int D, const float* A_log,
                        const float* dt_bias, double g_min, float* g, float* alpha,
                        KtierCudaStream stream);
  int (*kda_recurrence)(const float* q, const float* k, const float* v, const float* alpha,
                        const float* beta, int64_t T, int H, int Dk, int Dv, double q_scale,
                        float* state, float* out, KtierCudaStream stream);
  /* dims, kv_b: host structs (kv_b's pointers are device). kv_b is F32, BF16 or F16. */
  int (*mla_attention)(const KtierCudaMlaDims* dims, const float* q, int64_t T,
                       const KtierCudaWeight* kv_b, const float* cache_c, const float* cache_r,
                       int64_t n_past, double scale, float* out, KtierCudaStream stream);
  /* src: host array of m device pointers, m <= KTIER_CUDA_MAX_SOURCES. */
  int (*attnres)(const float* const* src, int m, int64_t src_stride, int64_t T, int64_t n,
                 const float* f, double eps, float* out, KtierCudaStream stream);
  /* bias may be NULL; ids, weights device [T, top_k]; top_k <= KTIER_CUDA_MAX_TOPK. Selection
   * is computed in double (sigmoid, bias add), so ids equal the CPU's except where two scores
   * lie within a few double roundings of each other. */
  int (*router_topk)(const float* logits, const float* bias, int64_t T, int n_experts, int top_k,
                     int renormalize, double scaling, int32_t* ids, float* weights,
                     KtierCudaStream stream);
  /* out: device int64 [1]; the CPU rule (lowest index on ties, NaN never wins, 0 if none). */
  int (*argmax)(const float* x, int64_t n, int64_t* out, KtierCudaStream stream);

  /* Loads cuBLAS (unless linked statically) and makes its handle, with the handle's workspace
   * in device memory, for the calling thread's current device: once per device for the
   * process, later calls answering as the first. 1 where linear's allow_cublas then takes
   * effect on that device, 0 where cuBLAS cannot be used (the fused kernels run). A process
   * that never calls it keeps cuBLAS off the device (ABI v8; v5-v7's init made the handle and
   * uses_cublas answered). */
  int (*enable_cublas)(void);
} KtierCudaOps;

/* Symbol "ktier_cuda_ops". */
typedef const KtierCudaOps* (*KtierCudaOpsFn)(void);

#ifdef __cplusplus
}
#endif
