// cuBLAS for the F32 and BF16 linears with n_tokens >= 8 under --gpu-prefill cublas (linear.cu,
// cuda/README.md): the library (linked statically, or loaded from libcublas.so.<major> by init),
// the per-device handles, the per-(device, stream) scratch buffers holding x split into three
// bf16 parts, and the GEMM calls.
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "kernels.cuh"

namespace ktier_cuda {
namespace {

// x = hi + mid + lo exactly, each a bf16 (so cuBLAS's bf16 products are exact and x is not
// rounded): hi is x truncated to bf16, mid the remainder truncated, lo the remainder of that,
// which has at most 8 significant bits left. Truncation keeps all three with x's sign (so
// |hi| + |mid| + |lo| = |x|) and cannot overflow. Inf and NaN go in hi alone (the remainders
// would be NaN). Only parts below bf16's smallest normal lose bits (x under ~2^-110), as
// f32's subnormals would. Parts are stored as three [n] arrays: out, out + n, out + 2n.
__global__ void split_bf16x3_kernel(const float* __restrict__ x, int64_t n,
                                    __nv_bfloat16* __restrict__ out) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const float v = x[i];
    const __nv_bfloat16 hi = __float2bfloat16_rz(v);
    __nv_bfloat16 mid = __float2bfloat16_rz(0.0f), lo = mid;
    if (isfinite(v)) {
      const float r = __fsub_rn(v, __bfloat162float(hi));  // exact: v's low 16 bits
      mid = __float2bfloat16_rz(r);
      lo = __float2bfloat16_rz(__fsub_rn(r, __bfloat162float(mid)));  // exact
    }
    out[i] = hi;
    out[n + i] = mid;
    out[2 * n + i] = lo;
  }
}

// ---- cuBLAS: linked statically, or loaded from libcublas.so.<major> at init ----

using CreateFn = cublasStatus_t (*)(cublasHandle_t*);
using SetStreamFn = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
using SetMathModeFn = cublasStatus_t (*)(cublasHandle_t, cublasMath_t);
using SgemmFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                   int, const float*, const float*, int, const float*, int,
                                   const float*, float*, int);
using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                    int, const void*, const void*, cudaDataType, int, const void*,
                                    cudaDataType, int, const void*, void*, cudaDataType, int,
                                    cublasComputeType_t, cublasGemmAlgo_t);
struct CublasApi {
  bool ok = false;
  CreateFn create = nullptr;
  SetStreamFn set_stream = nullptr;
  SetMathModeFn set_math_mode = nullptr;
  SgemmFn sgemm = nullptr;
  GemmExFn gemm_ex = nullptr;
};

const CublasApi& cublas_api() {
  static CublasApi api;
  static std::once_flag once;
  std::call_once(once, [] {
#ifdef KTIER_CUBLAS_STATIC
    api.create = &cublasCreate_v2;
    api.set_stream = &cublasSetStream_v2;
    api.set_math_mode = &cublasSetMathMode;
    api.sgemm = &cublasSgemm_v2;
    api.gemm_ex = static_cast<GemmExFn>(&cublasGemmEx);
#else
    char name[64];
    std::snprintf(name, sizeof(name), "libcublas.so.%d", CUBLAS_VER_MAJOR);
    void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    api.create = reinterpret_cast<CreateFn>(dlsym(lib, "cublasCreate_v2"));
    api.set_stream = reinterpret_cast<SetStreamFn>(dlsym(lib, "cublasSetStream_v2"));
    api.set_math_mode = reinterpret_cast<SetMathModeFn>(dlsym(lib, "cublasSetMathMode"));
    api.sgemm = reinterpret_cast<SgemmFn>(dlsym(lib, "cublasSgemm_v2"));
    api.gemm_ex = reinterpret_cast<GemmExFn>(dlsym(lib, "cublasGemmEx"));
#endif
    api.ok = api.create && api.set_stream && api.set_math_mode && api.sgemm && api.gemm_ex;
  });
  return api;
}

// One handle per device for the process, made by the first init on it (one try: leaked at
// exit, as destroying one after the context is gone is unsafe). Not one per thread: serve
// calls from its connection threads, and each handle holds a workspace in VRAM. cuBLAS allows
// a handle on several host threads; g_call_mu[device] keeps a call's set-stream and products
// together. The workspace is the handle's, so products go to one stream at a time: a call on
// another stream than g_handle_stream's first waits for that stream (the engine has one).
constexpr int kMaxDevices = 64;
std::mutex g_handle_mu;                                  // guards making the handles
std::atomic<cublasHandle_t> g_handle[kMaxDevices] = {};  // null until made
bool g_handle_tried[kMaxDevices] = {};  // one attempt per device (g_handle_mu)
std::mutex g_call_mu[kMaxDevices];
cudaStream_t g_handle_stream[kMaxDevices] = {};  // the last call's stream (g_call_mu[device])

// Scratch per (device, stream) for the split copies of x; grown stream-ordered where the
// device has memory pools (cudaDevAttrMemoryPoolsSupported, read by cublas_init), otherwise
// with cudaMalloc/cudaFree, which wait for the device themselves.
struct Scratch {
  void* ptr = nullptr;
  size_t cap = 0;
  bool pooled = false;  // made by cudaMallocAsync (freed with cudaFreeAsync)
};
std::mutex g_scratch_mu;
std::map<std::pair<int, cudaStream_t>, Scratch> g_scratch;
std::atomic<bool> g_memory_pools[kMaxDevices] = {};

// A device that says it has memory pools and then refuses cudaMallocAsync for any reason but
// memory (a virtualised driver passing the attribute through without the feature) is taken at
// its deed: plain cudaMalloc from then on, rather than failing every prefill product.
cudaError_t scratch_alloc(int device, Scratch& sc, size_t bytes, cudaStream_t s) {
  if (g_memory_pools[device].load()) {
    const cudaError_t err = cudaMallocAsync(&sc.ptr, bytes, s);
    if (err == cudaSuccess) {
      sc.pooled = true;
      return err;
    }
    sc.ptr = nullptr;
    if (err == cudaErrorMemoryAllocation) return err;
    (void)cudaGetLastError();
    g_memory_pools[device].store(false);
  }
  sc.pooled = false;
  return cudaMalloc(&sc.ptr, bytes);
}
cudaError_t scratch_free(const Scratch& sc, cudaStream_t s) {
  return sc.pooled ? cudaFreeAsync(sc.ptr, s) : cudaFree(sc.ptr);
}

cudaError_t scratch_get(int device, cudaStream_t s, size_t bytes, void** out) {
  std::lock_guard<std::mutex> lock(g_scratch_mu);
  Scratch& sc = g_scratch[{device, s}];
  if (sc.cap < bytes) {
    if (sc.ptr) {
      // The pool cannot hand the smaller block to the larger request, and keeps it until a
      // synchronisation: wait here (growth happens a few times a run) so that the old and new
      // blocks are never held together, past the cuBLAS allowance budgeted for the largest call.
      cudaError_t err = scratch_free(sc, s);
      if (err == cudaSuccess) err = cudaStreamSynchronize(s);
      sc.ptr = nullptr;
      sc.cap = 0;
      if (err != cudaSuccess) return err;
    }
    const size_t cap = bytes + bytes / 4;
    const cudaError_t err = scratch_alloc(device, sc, cap, s);
    if (err != cudaSuccess) {
      sc.ptr = nullptr;
      return err;
    }
    sc.cap = cap;
  }
  *out = sc.ptr;
  return cudaSuccess;
}

const char* cublas_status_name(cublasStatus_t st) {
  switch (st) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_INTERNAL_ERROR";
  }
}

}  // namespace


void cublas_init(int device) {
  if (device < 0 || device >= kMaxDevices) return;
  std::lock_guard<std::mutex> lock(g_handle_mu);
  // One attempt: a backend asks enable_cublas() once, at open, and budgets VRAM by its answer;
  // a later call (another backend's) answers the same.
  if (g_handle_tried[device]) return;
  g_handle_tried[device] = true;
  const CublasApi& api = cublas_api();
  if (!api.ok) return;
  // Stream-ordered allocation is optional (some virtualised or older setups lack it): where
  // it is absent, the scratch takes plain cudaMalloc rather than failing every prefill product.
  int pools = 0;
  if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device) != cudaSuccess) {
    (void)cudaGetLastError();
    pools = 0;
  }
  g_memory_pools[device].store(pools != 0);
  cublasHandle_t h = nullptr;
  if (api.create(&h) != CUBLAS_STATUS_SUCCESS) {
    (void)cudaGetLastError();  // static cuBLAS shares our runtime: its failure is not an op's
    return;
  }
  // No TF32, f32 reductions (the tolerances assume them): without that, no cuBLAS (the fused
  // kernels serve prefill). The handle is leaked, as at exit, once.
  if (api.set_math_mode(h, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
    (void)cudaGetLastError();
    return;
  }
  g_handle[device].store(h);
}

void scratch_release(cudaStream_t s) {
  for (int d = 0; d < kMaxDevices; ++d) {  // a destroyed stream is never waited for
    std::lock_guard<std::mutex> lock(g_call_mu[d]);
    if (g_handle_stream[d] != s) continue;
    g_handle_stream[d] = nullptr;
    // Nor kept by the handle (whose next set-stream would otherwise be from a dead stream).
    if (const cublasHandle_t h = g_handle[d].load(); h != nullptr && s != nullptr) {
      if (cublas_api().set_stream(h, nullptr) != CUBLAS_STATUS_SUCCESS) (void)cudaGetLastError();
    }
  }
  std::lock_guard<std::mutex> lock(g_scratch_mu);
  for (auto it = g_scratch.begin(); it != g_scratch.end();) {
    if (it->first.second == s) {
      // A failed free (the stream already broken) is not this op's error: drop it (see
      // cuda_check on the runtime's last error).
      if (it->second.ptr && scratch_free(it->second, s) != cudaSuccess)
        (void)cudaGetLastError();
      it = g_scratch.erase(it);
    } else {
      ++it;
    }
  }
}

bool cublas_ready(int device) {
  return device >= 0 && device < kMaxDevices && g_handle[device].load() != nullptr;
}

int cublas_linear(const KtierCudaLinearJob* jobs, const int* idx, int n_idx, int device,
                  cudaStream_t stream) {
  constexpr const char* op = "linear";
  const cublasHandle_t handle = g_handle[device].load();
  const CublasApi& api = cublas_api();
  std::lock_guard<std::mutex> lock(g_call_mu[device]);
  if (g_handle_stream[device] != stream) {
    if (g_handle_stream[device])
      if (const int rc = cuda_check(op, cudaStreamSynchronize(g_handle_stream[device]))) return rc;
    g_handle_stream[device] = stream;
  }
  // cuBLAS: y^T [rows, T] (column-major, ldc = rows) = op_T(W as column-major [cols, rows],
  // lda = cols) * x^T (column-major [cols, T], ldb = cols); alpha = 1, beta = 0.
  if (api.set_stream(handle, stream) != CUBLAS_STATUS_SUCCESS)
    return set_error(cudaErrorUnknown, op, "cublasSetStream failed");
  // Split copies of x (three bf16 parts): one per distinct (x, cols, T) among the BF16 jobs,
  // packed in the scratch buffer.
  struct Copy {
    const float* x;
    int64_t cols, n_tokens;
    size_t offset;
  };
  std::vector<Copy> copies;
  std::vector<size_t> copy_of(static_cast<size_t>(n_idx), 0);
  size_t total = 0;
  for (size_t i = 0; i < static_cast<size_t>(n_idx); ++i) {
    const KtierCudaLinearJob& jb = jobs[idx[i]];
    if (jb.w.type != KTIER_CUDA_BF16) continue;
    size_t c = 0;
    while (c < copies.size() && !(copies[c].x == jb.x && copies[c].cols == jb.w.cols &&
                                  copies[c].n_tokens == jb.n_tokens))
      ++c;
    if (c == copies.size()) {
      copies.push_back({jb.x, jb.w.cols, jb.n_tokens, total});
      total += (static_cast<size_t>(jb.n_tokens) * jb.w.cols * 2 * 3 + 255) / 256 * 256;
    }
    copy_of[i] = c;
  }
  char* scratch = nullptr;
  if (total > 0) {
    void* p = nullptr;
    if (const int rc = cuda_check(op, scratch_get(device, stream, total, &p))) return rc;
    scratch = static_cast<char*>(p);
    for (const Copy& c : copies) {
      const int64_t n = c.n_tokens * c.cols;
      split_bf16x3_kernel<<<grid_for(n), kBlock, 0, stream>>>(
          c.x, n, reinterpret_cast<__nv_bfloat16*>(scratch + c.offset));
    }
    if (const int rc = cuda_check(op, cudaGetLastError())) return rc;
  }
  const float one = 1.0f, zero = 0.0f;
  for (size_t i = 0; i < static_cast<size_t>(n_idx); ++i) {
    const KtierCudaLinearJob& jb = jobs[idx[i]];
    const int m = static_cast<int>(jb.w.rows), n = static_cast<int>(jb.n_tokens),
              k = static_cast<int>(jb.w.cols);
    cublasStatus_t st;
    if (jb.w.type == KTIER_CUDA_F32) {
      st = api.sgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one,
                     static_cast<const float*>(jb.w.data), k, jb.x, k, &zero, jb.y, m);
    } else {
      // y = (W lo + W mid) + W hi: three products with exact bf16 inputs and f32 sums, the
      // smallest first; beta = 1 adds each onto the last.
      const __nv_bfloat16* parts =
          reinterpret_cast<const __nv_bfloat16*>(scratch + copies[copy_of[i]].offset);
      const int64_t part = static_cast<int64_t>(n) * k;
      st = CUBLAS_STATUS_SUCCESS;
      for (int p = 2; p >= 0 && st == CUBLAS_STATUS_SUCCESS; --p)
        st = api.gemm_ex(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, jb.w.data, CUDA_R_16BF,
                         k, parts + p * part, CUDA_R_16BF, k, p == 2 ? &zero : &one, jb.y,
                         CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }
    if (st != CUBLAS_STATUS_SUCCESS)
      return set_error(cudaErrorUnknown, op, "job %d: cuBLAS %s", idx[i],
                       cublas_status_name(st));
  }
  // cuBLAS shares this runtime (static builds) and may leave a tolerated error of its own in
  // the last-error slot; it must not be reported by the next launcher as that launch's failure.
  (void)cudaGetLastError();
  return 0;
}

}  // namespace ktier_cuda
