#pragma once
// The Backend interface: the ops of one decode step (cpu/kernels.h) on one device, behind one
// virtual dispatch. The CPU backend forwards to the exact CPU kernels; the CUDA backend to the
// dlopen()ed module (libktier_cuda.so). No CUDA header is visible here.
//
// Contracts:
//  * Every pointer an op takes is memory of this backend (allocate()); host memory for the CPU
//    backend, device memory for CUDA. Host <-> backend transfers go through upload/download.
//  * Ops are ordered on the backend's stream: they may return before the work is done (CUDA).
//    download() and synchronize() wait. The CPU backend runs everything before returning.
//  * Shapes, layouts and semantics are those of the same-named op in cpu/kernels.h. The CPU
//    backend gives exactly the CPU bytes; other backends agree within the tolerances derived in
//    tests/backend/cross_backend_test.cpp (arithmetic in cuda/README.md).
//  * Errors the device can cause (launch failure, out of memory) are a Status (kRuntime);
//    a violated REQUIRES of the CPU op still aborts (a caller bug).
//  * Thread-safety: one Backend object is used from one thread at a time, from any thread
//    (serve's connection threads take turns); the CUDA backend makes its device current on
//    each thread's first call (the runtime keeps it per thread; cuBLAS's handle is the
//    device's).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "cpu/kernels.h"

namespace ktier::backend {

enum class DeviceKind : uint8_t { kCpu, kCuda };

class Backend {
 public:
  virtual ~Backend() = default;

  virtual DeviceKind kind() const = 0;
  // "cpu (avx2, 8 threads)", "cuda:0 NVIDIA H200 (sm_90)", "... (sm_90, cuBLAS prefill)".
  virtual std::string name() const = 0;
  // True where F32/BF16 linears of 8 or more tokens run a BLAS library (CUDA asked for cuBLAS
  // prefill and the module found it; cuda/README.md): device memory of its own
  // (runtime/engine_plan.cpp blas_bytes), and output bytes that depend on prefill chunking.
  virtual bool uses_blas() const { return false; }

  // ---- memory (bytes of this backend) ----
  virtual Result<void*> allocate(size_t bytes) = 0;
  virtual void release(void* ptr) = 0;  // null is allowed
  virtual Status upload(void* dst, const void* host_src, size_t bytes) = 0;
  // Waits for the ops issued before it, then copies.
  virtual Status download(void* host_dst, const void* src, size_t bytes) = 0;
  virtual Status fill(void* dst, uint8_t byte, size_t bytes) = 0;
  // Within this backend's memory, ordered with the ops (ranges must not overlap).
  virtual Status copy(void* dst, const void* src, size_t bytes) = 0;
  virtual Status synchronize() = 0;
  // Bytes the device could still allocate (CUDA: cudaMemGetInfo's free figure); the CPU
  // backends have no such limit of their own and say so (Status::usage).
  virtual Result<uint64_t> free_memory() {
    return Status::usage(name() + " has no device memory figure");
  }
  // Bytes handed out by allocate() and not yet released: now, and the most at once so far
  // (as asked, before any rounding). Zero where nothing is counted (the CPU backend). For
  // reports, and for the tests that hold GPU mode to its --vram budget.
  struct MemoryUse {
    uint64_t live = 0, peak = 0;
    void allocated(uint64_t bytes) {
      live += bytes;
      if (live > peak) peak = live;
    }
    void released(uint64_t bytes) { live -= bytes; }
  };
  virtual MemoryUse memory_use() const { return {}; }
  // Keeps what this backend holds of the device's memory — handed out, plus released blocks it
  // keeps for reuse (CUDA) — within `bytes` where it can: kept blocks are given back before an
  // allocation would pass it. GPU mode sets its --vram. No-op where nothing is kept.
  virtual void limit_memory(uint64_t bytes) {}
  // Copies ahead of need, on copy streams of their own, so they overlap the ops. Three queues,
  // independent of each other (CUDA: three copy streams), so that the copies the next ops need
  // soon never wait behind large ones issued ahead: CopyQueue::kExperts (the VRAM expert tier's
  // lookahead copies), CopyQueue::kExpertMisses (its copies on demand, which the ops of the
  // layer being computed wait for) and CopyQueue::kLayers (the streamed trunk layers'
  // copy-ahead). Per queue q:
  //  * copy_async(q, ...): host -> backend memory, in issue order with q's other copies; the
  //    host bytes must stay unchanged until sync_copies(q) returns (or host_wait() on a fence
  //    marked on q after the copy, below), and the destination must not be released while
  //    copies may run (it is not ordered with release()).
  //  * copies_after_ops(q): q's later copies wait for the ops issued so far (a slot the ops
  //    still read is not overwritten).
  //  * ops_after_copies(q): later ops wait for the copies issued on q so far.
  //  * sync_copies(q): the host waits for the copies issued on q so far.
  // The CPU backends copy at once; the fences are then no-ops.
  enum class CopyQueue : uint8_t { kExperts, kExpertMisses, kLayers };
  static constexpr CopyQueue kCopyQueues[] = {CopyQueue::kExperts, CopyQueue::kExpertMisses,
                                              CopyQueue::kLayers};
  static constexpr int kNumCopyQueues = 3;
  virtual Status copy_async(CopyQueue q, void* dst, const void* host_src, size_t bytes) {
    return upload(dst, host_src, bytes);
  }
  virtual Status copies_after_ops(CopyQueue q) { return Status::ok(); }
  virtual Status ops_after_copies(CopyQueue q) { return Status::ok(); }
  virtual Status sync_copies(CopyQueue q) { return Status::ok(); }
  // Fences at chosen points of the streams (CUDA events), for a caller that keeps several
  // copies in flight and must wait for one, not all. A caller creates its fences once and
  // records them again and again; a fence never recorded has passed.
  //  * mark_ops(f): f = the ops issued so far; mark_copies(f, q): f = q's copies so far.
  //  * copies_wait(f, q): q's later copies wait for f; ops_wait(f): later ops wait for f;
  //    host_wait(f): the host waits for f.
  //  * fence_passed(f): whether f has passed now, without waiting (a measurement: whether a
  //    copy landed before the ops that need it were issued; never an ordering).
  // The CPU backend runs everything at once: all are no-ops there, and every fence has passed.
  using Fence = int;
  virtual Result<Fence> create_fence() { return Fence{0}; }
  virtual void destroy_fence(Fence f) {}
  virtual Status mark_ops(Fence f) { return Status::ok(); }
  virtual Status mark_copies(Fence f, CopyQueue q) { return Status::ok(); }
  virtual Status copies_wait(Fence f, CopyQueue q) { return Status::ok(); }
  virtual Status ops_wait(Fence f) { return Status::ok(); }
  virtual Status host_wait(Fence f) { return Status::ok(); }
  virtual Result<bool> fence_passed(Fence f) { return true; }
  // Page-locks host memory that uploads will read (a RAM tier's arena), so they run at full link
  // speed; unpin before the memory is freed. No-ops where host and backend memory are one.
  virtual Status pin_host(void* host, size_t bytes) { return Status::ok(); }
  virtual void unpin_host(void* host) {}
  // Bytes copy_async has read from host memory that was not page-locked with pin_host (on a GPU
  // such a copy is staged by the driver and may make the host wait for the copies before it).
  // The emulated device counts them, for tests; elsewhere 0 (not tracked).
  virtual uint64_t pageable_copy_bytes() const { return 0; }

  // ---- ops (cpu/kernels.h; every pointer is this backend's memory) ----
  // The jobs array itself is host memory; the weights and activations it points at are not.
  virtual Status linear(const cpu::LinearJob* jobs, int n_jobs) = 0;
  virtual Status rmsnorm(const float* x, const float* gain, int64_t rows, int64_t n, double eps,
                         float* out) = 0;
  virtual Status l2norm(const float* x, int64_t rows, int64_t n, double eps, float* out) = 0;
  virtual Status situ_glu(const float* a, const float* b, int64_t n, double beta1,
                          std::optional<double> beta2, float* out) = 0;
  virtual Status sigmoid(const float* x, int64_t n, float* out) = 0;
  virtual Status sigmoid_gate(const float* x, const float* gate, int64_t n, float* out) = 0;
  virtual Status add(const float* a, const float* b, int64_t n, float* out) = 0;
  // The MoE combine for T tokens: out[t] = sum over j < k of weight[t*k + j] * rows[row_of[t*k +
  // j]], j in order (per token, cpu::weighted_sum's arithmetic). rows: backend memory, n floats a
  // row; row_of: host array [T * k] of row indices; weight: backend memory [T * k]; out: [T, n].
  virtual Status weighted_sum(const float* rows, const int32_t* row_of, const float* weight,
                              int64_t T, int k, int64_t n, float* out) = 0;
  // dst[r] = src[row_of[r]] for r < rows (n floats a row; exact). src, dst: backend memory, not
  // overlapping; row_of: host array [rows]. One launch where per-row copies would be many.
  virtual Status gather_rows(const float* src, const int32_t* row_of, int64_t rows, int64_t n,
                             float* dst) = 0;
  virtual Status kda_short_conv(const float* u, int64_t T, int64_t C, const float* w, int K,
                                float* history, float* out) = 0;
  virtual Status kda_decay_gate(const float* z, int64_t T, int H, int D, const float* A_log,
                                const float* dt_bias, double g_min, float* g, float* alpha) = 0;
  virtual Status kda_recurrence(const float* q, const float* k, const float* v,
                                const float* alpha, const float* beta, int64_t T, int H, int Dk,
                                int Dv, double q_scale, float* state, float* out) = 0;
  virtual Status mla_attention(const cpu::MlaDims& dims, const float* q, int64_t T,
                               const cpu::WeightMatrix& kv_b, const float* cache_c,
                               const float* cache_r, int64_t n_past, double scale,
                               float* out) = 0;
  // src: host array of m pointers to backend memory.
  virtual Status attnres(const float* const* src, int m, int64_t src_stride, int64_t T,
                         int64_t n, const float* f, double eps, float* out) = 0;
  // ids, weights: backend memory [T, top_k].
  virtual Status router_topk(const float* logits, const float* bias, int64_t T, int n_experts,
                             int top_k, bool renormalize, double scaling, int32_t* ids,
                             float* weights) = 0;
  // The index is returned to the host (waits for the backend).
  virtual Result<int64_t> argmax(const float* x, int64_t n) = 0;
};

// Bytes of a weight's stored elements (MXFP4: the packed nibbles, rows * cols / 2) and of its
// MXFP4 scales (rows * cols / 32; 0 for float weights): what a copy of the weight moves.
uint64_t weight_data_bytes(const cpu::WeightMatrix& w);
uint64_t weight_scale_bytes(const cpu::WeightMatrix& w);
// Device copies place each piece at this alignment (cudaMalloc's; enough for 16-byte loads).
inline constexpr uint64_t kDeviceAlign = 256;
inline uint64_t device_aligned(uint64_t n) { return (n + kDeviceAlign - 1) / kDeviceAlign * kDeviceAlign; }

// The CPU backend over `ex` (which must outlive it).
std::unique_ptr<Backend> make_cpu_backend(const cpu::Exec& ex);
// The CPU backend behind a memory wall (backend/emulated_device.cpp): every op aborts on a
// pointer outside this backend's allocations, as a GPU would fault on host memory. Runs the GPU
// mode's placement code without a GPU, with the CPU's bytes (tests, --device emulated). Holding
// more than `capacity_bytes` at once fails like a GPU out of memory (Status::out_of_memory), and
// free_memory() is what is left of it.
std::unique_ptr<Backend> make_emulated_device_backend(const cpu::Exec& ex,
                                                      uint64_t capacity_bytes = UINT64_MAX);

// Owns `bytes` of backend memory; released on destruction. Move-only.
class BackendBuffer {
 public:
  BackendBuffer() = default;
  static Result<BackendBuffer> allocate(Backend& backend, size_t bytes);
  BackendBuffer(BackendBuffer&& o) noexcept { *this = std::move(o); }
  BackendBuffer& operator=(BackendBuffer&& o) noexcept;
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;
  ~BackendBuffer() { reset(); }

  void reset();
  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return bytes_; }

 private:
  Backend* backend_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A growable float array in backend memory (sequence state, caches). Growth keeps the
// contents (capacity doubles, so appending is amortised O(1)); new elements are unspecified
// until written. Move-only; the Backend must outlive it.
class BackendArray {
 public:
  BackendArray() = default;
  // n zero-filled floats.
  static Result<BackendArray> zeros(Backend& backend, int64_t n);
  Status resize(Backend& backend, int64_t n);
  // Capacity for at least n floats (contents kept), so that growing up to n allocates nothing:
  // a cache sized once for a whole run, not doubled into twice its need.
  Status reserve(Backend& backend, int64_t n);
  float* data() const { return buf_.as<float>(); }
  int64_t size() const { return n_; }
  int64_t capacity() const { return static_cast<int64_t>(buf_.size() / sizeof(float)); }

 private:
  BackendBuffer buf_;
  int64_t n_ = 0;
};

}  // namespace ktier::backend
