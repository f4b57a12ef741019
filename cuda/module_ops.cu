// The exported op table (symbol ktier_cuda_ops): errors, memory, streams, events, and the
// argument checks of every op (the same REQUIRES as cpu/dispatch.cpp, answered with an error
// code instead of an abort) in front of the launchers of kernels.cuh.
#include <cstdarg>
#include <cstdio>

#include "kernels.cuh"

namespace ktier_cuda {

namespace {
thread_local char g_last_error[512] = "";
}

int set_error(int code, const char* op, const char* fmt, ...) {
  int len = std::snprintf(g_last_error, sizeof(g_last_error), "%s: ", op);
  if (len < 0 || len >= static_cast<int>(sizeof(g_last_error))) len = 0;
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(g_last_error + len, sizeof(g_last_error) - len, fmt, ap);
  va_end(ap);
  return code;
}

int cuda_check(const char* op, cudaError_t err) {
  if (err == cudaSuccess) return 0;
  // The runtime keeps a failed call's error as the thread's "last error" until it is read; the
  // launchers read it to see their own launch fail, so a failure reported here (or tolerated by
  // the caller: a refused cudaHostRegister, an out-of-memory cudaMalloc retried after freeing
  // the pool) must not be reported again by the next, successful launch. Sticky errors (a fault
  // inside a kernel) are not cleared by this; every later call reports them.
  (void)cudaGetLastError();
  return set_error(static_cast<int>(err), op, "%s (%s)", cudaGetErrorName(err),
                   cudaGetErrorString(err));
}

namespace {

cudaStream_t S(KtierCudaStream s) { return static_cast<cudaStream_t>(s); }

#define KC_REQUIRE(op, cond, ...) \
  do {                            \
    if (!(cond)) return set_error(kArgError, op, __VA_ARGS__); \
  } while (0)

const char* last_error() { return g_last_error; }

int init(int device) {
  if (const int rc = cuda_check("init", cudaSetDevice(device))) return rc;
  if (const int rc = cuda_check("init", cudaFree(nullptr))) return rc;  // create the context
  return 0;
}

// ---- memory, streams, events ----

static_assert(KTIER_CUDA_ERROR_OUT_OF_MEMORY == cudaErrorMemoryAllocation,
              "the ABI's out-of-memory code is the CUDA runtime's");
int malloc_device(void** ptr, size_t bytes) {
  KC_REQUIRE("malloc_device", ptr != nullptr, "null ptr");
  return cuda_check("malloc_device", cudaMalloc(ptr, bytes));
}
int free_device(void* ptr) { return cuda_check("free_device", cudaFree(ptr)); }
int malloc_host(void** ptr, size_t bytes) {
  KC_REQUIRE("malloc_host", ptr != nullptr, "null ptr");
  return cuda_check("malloc_host", cudaHostAlloc(ptr, bytes, cudaHostAllocPortable));
}
int free_host(void* ptr) { return cuda_check("free_host", cudaFreeHost(ptr)); }
int host_register(void* ptr, size_t bytes) {
  KC_REQUIRE("host_register", ptr != nullptr, "null ptr");
  return cuda_check("host_register", cudaHostRegister(ptr, bytes, cudaHostRegisterPortable));
}
int host_unregister(void* ptr) { return cuda_check("host_unregister", cudaHostUnregister(ptr)); }
int mem_info(size_t* free_bytes, size_t* total_bytes) {
  KC_REQUIRE("mem_info", free_bytes != nullptr && total_bytes != nullptr, "null output");
  return cuda_check("mem_info", cudaMemGetInfo(free_bytes, total_bytes));
}
int memcpy_async(void* dst, const void* src, size_t bytes, KtierCudaStream stream) {
  return cuda_check("memcpy_async", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, S(stream)));
}
int memset_async(void* dst, int value, size_t bytes, KtierCudaStream stream) {
  return cuda_check("memset_async", cudaMemsetAsync(dst, value, bytes, S(stream)));
}
int stream_create(KtierCudaStream* stream) {
  KC_REQUIRE("stream_create", stream != nullptr, "null output");
  cudaStream_t s = nullptr;
  const int rc = cuda_check("stream_create", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  if (rc == 0) *stream = s;
  return rc;
}
int stream_destroy(KtierCudaStream stream) {
  scratch_release(S(stream));
  return cuda_check("stream_destroy", cudaStreamDestroy(S(stream)));
}
int stream_synchronize(KtierCudaStream stream) {
  return cuda_check("stream_synchronize", cudaStreamSynchronize(S(stream)));
}
int event_create(KtierCudaEvent* event) {
  KC_REQUIRE("event_create", event != nullptr, "null output");
  cudaEvent_t e = nullptr;
  const int rc = cuda_check("event_create", cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  if (rc == 0) *event = e;
  return rc;
}
int event_destroy(KtierCudaEvent event) {
  return cuda_check("event_destroy", cudaEventDestroy(static_cast<cudaEvent_t>(event)));
}
int event_record(KtierCudaEvent event, KtierCudaStream stream) {
  return cuda_check("event_record", cudaEventRecord(static_cast<cudaEvent_t>(event), S(stream)));
}
int stream_wait_event(KtierCudaStream stream, KtierCudaEvent event) {
  return cuda_check("stream_wait_event",
                    cudaStreamWaitEvent(S(stream), static_cast<cudaEvent_t>(event), 0));
}
int event_synchronize(KtierCudaEvent event) {
  return cuda_check("event_synchronize", cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}
int event_query(KtierCudaEvent event, int* passed) {
  KC_REQUIRE("event_query", passed != nullptr, "null output");
  const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (err == cudaErrorNotReady) {
    // Not an error, but some runtimes keep it as the thread's last error, which the next
    // launch would then report as its own: cleared, and only when it is that.
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
    *passed = 0;
    return 0;
  }
  const int rc = cuda_check("event_query", err);
  if (rc == 0) *passed = 1;
  return rc;
}

// ---- ops ----

int linear(const KtierCudaLinearJob* jobs, int n_jobs, int allow_cublas,
           KtierCudaStream stream) {
  return linear_run(jobs, n_jobs, allow_cublas != 0, S(stream));
}

int rmsnorm(const float* x, const float* gain, int64_t rows, int64_t n, double eps, float* out,
            KtierCudaStream stream) {
  KC_REQUIRE("rmsnorm", rows >= 0 && n > 0, "bad shape [%lld, %lld]", (long long)rows,
             (long long)n);
  if (rows == 0) return 0;
  KC_REQUIRE("rmsnorm", x && out, "null pointer");
  return cuda_check("rmsnorm", launch_norm(x, gain, rows, n, eps, false, out, S(stream)));
}

int l2norm(const float* x, int64_t rows, int64_t n, double eps, float* out,
           KtierCudaStream stream) {
  KC_REQUIRE("l2norm", rows >= 0 && n > 0, "bad shape [%lld, %lld]", (long long)rows,
             (long long)n);
  if (rows == 0) return 0;
  KC_REQUIRE("l2norm", x && out, "null pointer");
  return cuda_check("l2norm", launch_norm(x, nullptr, rows, n, eps, true, out, S(stream)));
}

int situ_glu(const float* a, const float* b, int64_t n, double beta1, int cap_up, double beta2,
             float* out, KtierCudaStream stream) {
  KC_REQUIRE("situ_glu", n >= 0 && beta1 > 0 && (!cap_up || beta2 > 0),
             "bad size or non-positive beta");
  if (n == 0) return 0;
  KC_REQUIRE("situ_glu", a && b && out, "null pointer");
  return cuda_check("situ_glu",
                    launch_situ_glu(a, b, n, beta1, cap_up != 0, cap_up ? beta2 : 1.0, out,
                                    S(stream)));
}

int sigmoid(const float* x, int64_t n, float* out, KtierCudaStream stream) {
  if (n <= 0) return 0;
  KC_REQUIRE("sigmoid", x && out, "null pointer");
  return cuda_check("sigmoid", launch_sigmoid(x, nullptr, n, out, S(stream)));
}

int sigmoid_gate(const float* x, const float* gate, int64_t n, float* out,
                 KtierCudaStream stream) {
  if (n <= 0) return 0;
  KC_REQUIRE("sigmoid_gate", x && gate && out, "null pointer");
  return cuda_check("sigmoid_gate", launch_sigmoid(x, gate, n, out, S(stream)));
}

int add(const float* a, const float* b, int64_t n, float* out, KtierCudaStream stream) {
  if (n <= 0) return 0;
  KC_REQUIRE("add", a && b && out, "null pointer");
  return cuda_check("add", launch_add(a, b, n, out, S(stream)));
}

int weighted_sum(const float* rows, const int32_t* row_of, const float* weight, int64_t T, int k,
                 int64_t n, float* out, KtierCudaStream stream) {
  KC_REQUIRE("weighted_sum", T >= 0 && k >= 0 && n >= 0, "bad sizes");
  KC_REQUIRE("weighted_sum", k <= KTIER_CUDA_MAX_TOPK, "k = %d > %d", k, KTIER_CUDA_MAX_TOPK);
  if (n == 0 || T == 0) return 0;
  KC_REQUIRE("weighted_sum", out && (k == 0 || (rows && row_of && weight)), "null pointer");
  for (int64_t i = 0; i < T * k; ++i)
    KC_REQUIRE("weighted_sum", row_of[i] >= 0, "row_of[%lld] = %d", (long long)i, row_of[i]);
  return cuda_check("weighted_sum",
                    launch_weighted_sum(rows, row_of, weight, T, k, n, out, S(stream)));
}

int gather_rows(const float* src, const int32_t* row_of, int64_t rows, int64_t n, float* dst,
                KtierCudaStream stream) {
  KC_REQUIRE("gather_rows", rows >= 0 && n >= 0, "bad sizes");
  if (n == 0 || rows == 0) return 0;
  KC_REQUIRE("gather_rows", src && row_of && dst, "null pointer");
  for (int64_t i = 0; i < rows; ++i)
    KC_REQUIRE("gather_rows", row_of[i] >= 0, "row_of[%lld] = %d", (long long)i, row_of[i]);
  return cuda_check("gather_rows", launch_gather_rows(src, row_of, rows, n, dst, S(stream)));
}

int kda_short_conv(const float* u, int64_t T, int64_t C, const float* w, int K, float* history,
                   float* out, KtierCudaStream stream) {
  KC_REQUIRE("kda_short_conv", T >= 0 && C >= 0 && K >= 1, "bad shape");
  if (C == 0 || T == 0) return 0;  // T == 0: the history is unchanged
  KC_REQUIRE("kda_short_conv", w && u && out && (K == 1 || history),
             "null pointer");
  return cuda_check("kda_short_conv", launch_short_conv(u, T, C, w, K, history, out, S(stream)));
}

int kda_decay_gate(const float* z, int64_t T, int H, int D, const float* A_log,
                   const float* dt_bias, double g_min, float* g, float* alpha,
                   KtierCudaStream stream) {
  KC_REQUIRE("kda_decay_gate", T >= 0 && H > 0 && D > 0, "bad shape");
  if (T == 0) return 0;
  KC_REQUIRE("kda_decay_gate", z && A_log && dt_bias && alpha, "null pointer");
  return cuda_check("kda_decay_gate",
                    launch_decay_gate(z, T, H, D, A_log, dt_bias, g_min, g, alpha, S(stream)));
}

int kda_recurrence(const float* q, const float* k, const float* v, const float* alpha,
                   const float* beta, int64_t T, int H, int Dk, int Dv, double q_scale,
                   float* state, float* out, KtierCudaStream stream) {
  KC_REQUIRE("kda_recurrence", T >= 0 && H > 0 && Dk > 0 && Dv > 0, "bad shape");
  if (T == 0) return 0;
  KC_REQUIRE("kda_recurrence", q && k && v && alpha && beta && state && out, "null pointer");
  return cuda_check("kda_recurrence", launch_recurrence(q, k, v, alpha, beta, T, H, Dk, Dv,
                                                        q_scale, state, out, S(stream)));
}

int mla_attention(const KtierCudaMlaDims* dims, const float* q, int64_t T,
                  const KtierCudaWeight* kv_b, const float* cache_c, const float* cache_r,
                  int64_t n_past, double scale, float* out, KtierCudaStream stream) {
  constexpr const char* op = "mla_attention";
  KC_REQUIRE(op, dims && kv_b, "null dims or kv_b");
  const KtierCudaMlaDims& d = *dims;
  KC_REQUIRE(op,
             d.n_heads > 0 && d.qk_nope > 0 && d.qk_rope >= 0 && d.v_head > 0 && d.kv_lora > 0 &&
                 T >= 0 && n_past >= 0,
             "bad dims");
  KC_REQUIRE(op,
             kv_b->type == KTIER_CUDA_F32 || kv_b->type == KTIER_CUDA_BF16 ||
                 kv_b->type == KTIER_CUDA_F16,
             "kv_b must be a float weight (type %d)", (int)kv_b->type);
  KC_REQUIRE(op,
             kv_b->rows == (int64_t)d.n_heads * (d.qk_nope + d.v_head) && kv_b->cols == d.kv_lora,
             "kv_b is [%lld, %lld], expected [%d, %d]", (long long)kv_b->rows,
             (long long)kv_b->cols, d.n_heads * (d.qk_nope + d.v_head), d.kv_lora);
  if (T == 0) return 0;
  KC_REQUIRE(op, q && kv_b->data && cache_c && (d.qk_rope == 0 || cache_r) && out,
             "null pointer");
  return cuda_check(op, launch_mla(d, q, T, *kv_b, cache_c, cache_r, n_past, scale, out,
                                   S(stream)));
}

int attnres(const float* const* src, int m, int64_t src_stride, int64_t T, int64_t n,
            const float* f, double eps, float* out, KtierCudaStream stream) {
  KC_REQUIRE("attnres", m >= 1 && T >= 0 && n > 0, "bad shape (m=%d)", m);
  KC_REQUIRE("attnres", m <= KTIER_CUDA_MAX_SOURCES, "m = %d > %d", m, KTIER_CUDA_MAX_SOURCES);
  if (T == 0) return 0;
  KC_REQUIRE("attnres", src && f && out, "null pointer");
  for (int i = 0; i < m; ++i) KC_REQUIRE("attnres", src[i], "null src[%d]", i);
  return cuda_check("attnres", launch_attnres(src, m, src_stride, T, n, f, eps, out, S(stream)));
}

int router_topk(const float* logits, const float* bias, int64_t T, int n_experts, int top_k,
                int renormalize, double scaling, int32_t* ids, float* weights,
                KtierCudaStream stream) {
  KC_REQUIRE("router_topk", T >= 0 && top_k >= 1 && top_k <= n_experts,
             "top_k %d outside 1..%d", top_k, n_experts);
  KC_REQUIRE("router_topk", top_k <= KTIER_CUDA_MAX_TOPK, "top_k %d > %d", top_k,
             KTIER_CUDA_MAX_TOPK);
  if (T == 0) return 0;
  KC_REQUIRE("router_topk", logits && ids && weights, "null pointer");
  return cuda_check("router_topk", launch_router(logits, bias, T, n_experts, top_k,
                                                 renormalize != 0, scaling, ids, weights,
                                                 S(stream)));
}

int argmax(const float* x, int64_t n, int64_t* out, KtierCudaStream stream) {
  KC_REQUIRE("argmax", out && (n <= 0 || x), "null pointer");
  return cuda_check("argmax", launch_argmax(x, n < 0 ? 0 : n, out, S(stream)));
}

int enable_cublas() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  cublas_init(device);
  return cublas_ready(device) ? 1 : 0;
}

const KtierCudaOps kOps = {
    sizeof(KtierCudaOps),
    last_error,
    init,
    malloc_device,
    free_device,
    malloc_host,
    free_host,
    host_register,
    host_unregister,
    mem_info,
    memcpy_async,
    memset_async,
    stream_create,
    stream_destroy,
    stream_synchronize,
    event_create,
    event_destroy,
    event_record,
    stream_wait_event,
    event_synchronize,
    event_query,
    linear,
    rmsnorm,
    l2norm,
    situ_glu,
    sigmoid,
    sigmoid_gate,
    add,
    weighted_sum,
    gather_rows,
    kda_short_conv,
    kda_decay_gate,
    kda_recurrence,
    mla_attention,
    attnres,
    router_topk,
    argmax,
    enable_cublas,
};

}  // namespace
}  // namespace ktier_cuda

KTIER_CUDA_EXPORT const KtierCudaOps* ktier_cuda_ops(void) { return &ktier_cuda::kOps; }
