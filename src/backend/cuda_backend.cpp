// The CUDA backend: forwards every op to the module's table on one non-blocking stream, and
// copy_async to one copy stream per CopyQueue (copies ahead of need), ordered by events.
#include "backend/cuda_backend.h"

#include "common/check.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ktier::backend {
namespace {

static_assert(static_cast<int>(cpu::WeightType::kF32) == KTIER_CUDA_F32);
static_assert(static_cast<int>(cpu::WeightType::kBF16) == KTIER_CUDA_BF16);
static_assert(static_cast<int>(cpu::WeightType::kF16) == KTIER_CUDA_F16);
static_assert(static_cast<int>(cpu::WeightType::kMxfp4) == KTIER_CUDA_MXFP4);

KtierCudaWeight to_abi(const cpu::WeightMatrix& w) {
  return {static_cast<int32_t>(w.type), w.data, w.scales, w.rows, w.cols};
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(const KtierCudaOps* ops, int device, std::string name, bool cublas_prefill)
      : module_(ops), device_(device), name_(std::move(name)), cublas_prefill_(cublas_prefill) {}
  ~CudaBackend() override {
    for (KtierCudaStream c : copy_streams_)
      if (c) ops()->stream_synchronize(c);
    if (stream_) ops()->stream_synchronize(stream_);
    for (auto& [bytes, list] : pool_)
      for (void* p : list) ops()->free_device(p);
    for (auto& [p, bytes] : live_) ops()->free_device(p);
    if (ops_done_) ops()->event_destroy(ops_done_);
    for (KtierCudaEvent e : copies_done_)
      if (e) ops()->event_destroy(e);
    for (KtierCudaEvent e : fences_)
      if (e) ops()->event_destroy(e);
    for (KtierCudaStream c : copy_streams_)
      if (c) ops()->stream_destroy(c);
    if (stream_) ops()->stream_destroy(stream_);
  }

  Status open() {
    ops();  // this backend's first call on any thread: init (the device)
    KTIER_RETURN_IF_ERROR(check(0, "init"));
    // Only when asked: the handle's library and workspace stay off the device otherwise.
    uses_blas_ = cublas_prefill_ && ops()->enable_cublas() != 0;
    if (cublas_prefill_) {
      name_.insert(name_.size() - 1,
                   uses_blas_ ? ", cuBLAS prefill" : ", no cuBLAS: fused kernels for prefill");
      if (!uses_blas_)
        spdlog::warn("cuBLAS prefill was asked for, but the CUDA module found no cuBLAS: the "
                     "fused kernels run the prefill (chunk-invariant, slower on long prompts)");
    }
    KTIER_RETURN_IF_ERROR(check(ops()->stream_create(&stream_), "stream_create"));
    for (int q = 0; q < kNumCopyQueues; ++q) {
      KTIER_RETURN_IF_ERROR(
          check(ops()->stream_create(&copy_streams_[q]), "stream_create (copies)"));
      KTIER_RETURN_IF_ERROR(check(ops()->event_create(&copies_done_[q]), "event_create"));
    }
    return check(ops()->event_create(&ops_done_), "event_create");
  }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return name_; }
  bool uses_blas() const override { return uses_blas_; }

  // A forward pass allocates the same scratch sizes on every token; cudaMalloc and cudaFree
  // are slow and synchronise the device, so released blocks are kept by size and handed out
  // again. Reuse is safe without events because every op runs on the ops stream, so the next
  // user of a block is ordered after the last; copy_async (the copy streams) may only write
  // memory that is never released while copies run, and must wait for the ops queued before
  // its first copy into a block (the VRAM tier's arena, DeviceTrunk's slots).
  Result<void*> allocate(size_t bytes) override {
    if (bytes == 0) bytes = 1;
    if (auto it = pool_.find(bytes); it != pool_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      pooled_ -= bytes;
      hand_out(p, bytes);
      return p;
    }
    // Within the limit, kept blocks included (prefill chunks, the last chunk and decode steps
    // each leave blocks of their own sizes): give the kept ones back first.
    if (pooled_ > 0 && use_.live + pooled_ + bytes > limit_) KTIER_RETURN_IF_ERROR(trim_pool());
    void* p = nullptr;
    const std::string what = "allocating " + std::to_string(bytes) + " bytes of VRAM";
    const KtierCudaOps* m = ops();
    // Not on another device: a block made there would be used here, and never freed right.
    KTIER_RETURN_IF_ERROR(check(0, what));
    if (m->malloc_device(&p, bytes) != 0) {
      // Out of memory, perhaps only because released blocks of other sizes are kept: give them
      // back and try once more.
      KTIER_RETURN_IF_ERROR(trim_pool());
      const int rc = ops()->malloc_device(&p, bytes);
      if (rc == KTIER_CUDA_ERROR_OUT_OF_MEMORY && bind_failure().empty())
        return Status::out_of_memory(name_ + ": " + what + " failed: " + module_->last_error());
      KTIER_RETURN_IF_ERROR(check(rc, what));
    }
    hand_out(p, bytes);
    return p;
  }
  void release(void* ptr) override {
    if (!ptr) return;
    auto it = live_.find(ptr);
    KTIER_CHECK_MSG(it != live_.end(), "release of a foreign pointer");  // as the emulated device
    pool_[it->second].push_back(ptr);
    pooled_ += it->second;
    use_.released(it->second);
    live_.erase(it);
  }
  MemoryUse memory_use() const override { return use_; }
  void limit_memory(uint64_t bytes) override { limit_ = bytes; }
  Status upload(void* dst, const void* src, size_t bytes) override {
    KTIER_RETURN_IF_ERROR(check(ops()->memcpy_async(dst, src, bytes, stream_), "upload"));
    // The host source may be reused as soon as upload returns.
    return synchronize();
  }
  Status download(void* dst, const void* src, size_t bytes) override {
    KTIER_RETURN_IF_ERROR(check(ops()->memcpy_async(dst, src, bytes, stream_), "download"));
    return synchronize();
  }
  Status fill(void* dst, uint8_t byte, size_t bytes) override {
    return check(ops()->memset_async(dst, byte, bytes, stream_), "fill");
  }
  Status copy(void* dst, const void* src, size_t bytes) override {
    return check(ops()->memcpy_async(dst, src, bytes, stream_), "copy");
  }
  Status copy_async(CopyQueue q, void* dst, const void* src, size_t bytes) override {
    return check(ops()->memcpy_async(dst, src, bytes, copies(q)), "copy_async");
  }
  Status copies_after_ops(CopyQueue q) override {
    KTIER_RETURN_IF_ERROR(check(ops()->event_record(ops_done_, stream_), "event_record"));
    return check(ops()->stream_wait_event(copies(q), ops_done_), "stream_wait_event");
  }
  Status ops_after_copies(CopyQueue q) override {
    KtierCudaEvent done = copies_done_[static_cast<int>(q)];
    KTIER_RETURN_IF_ERROR(check(ops()->event_record(done, copies(q)), "event_record"));
    return check(ops()->stream_wait_event(stream_, done), "stream_wait_event");
  }
  Result<Fence> create_fence() override {
    KtierCudaEvent e = nullptr;
    KTIER_RETURN_IF_ERROR(check(ops()->event_create(&e), "event_create"));
    fences_.push_back(e);
    return static_cast<Fence>(fences_.size() - 1);
  }
  void destroy_fence(Fence f) override {
    if (KtierCudaEvent& e = fence(f)) {
      ops()->event_destroy(e);
      e = nullptr;
    }
  }
  Status mark_ops(Fence f) override {
    return check(ops()->event_record(fence(f), stream_), "event_record (fence)");
  }
  Status mark_copies(Fence f, CopyQueue q) override {
    return check(ops()->event_record(fence(f), copies(q)), "event_record (fence)");
  }
  Status copies_wait(Fence f, CopyQueue q) override {
    return check(ops()->stream_wait_event(copies(q), fence(f)), "stream_wait_event (fence)");
  }
  Status ops_wait(Fence f) override {
    return check(ops()->stream_wait_event(stream_, fence(f)), "stream_wait_event (fence)");
  }
  Status host_wait(Fence f) override {
    return check(ops()->event_synchronize(fence(f)), "event_synchronize (fence)");
  }
  Result<bool> fence_passed(Fence f) override {
    int passed = 0;
    KTIER_RETURN_IF_ERROR(check(ops()->event_query(fence(f), &passed), "event_query (fence)"));
    return passed != 0;
  }
  Status sync_copies(CopyQueue q) override {
    return check(ops()->stream_synchronize(copies(q)), "stream_synchronize (copies)");
  }
  Result<uint64_t> free_memory() override {
    size_t free_b = 0, total_b = 0;
    KTIER_RETURN_IF_ERROR(check(ops()->mem_info(&free_b, &total_b), "mem_info"));
    return static_cast<uint64_t>(free_b);
  }
  Status pin_host(void* host, size_t bytes) override {
    return check(ops()->host_register(host, bytes),
                 "pinning " + std::to_string(bytes) + " host bytes");
  }
  void unpin_host(void* host) override { ops()->host_unregister(host); }
  Status synchronize() override {
    return check(ops()->stream_synchronize(stream_), "stream_synchronize");
  }

  Status linear(const cpu::LinearJob* jobs, int n_jobs) override {
    std::vector<KtierCudaLinearJob> abi(static_cast<size_t>(n_jobs));
    for (int i = 0; i < n_jobs; ++i)
      abi[i] = {to_abi(jobs[i].w), jobs[i].x, jobs[i].n_tokens, jobs[i].y};
    return check(ops()->linear(abi.data(), n_jobs, uses_blas_ ? 1 : 0, stream_), "linear");
  }
  Status rmsnorm(const float* x, const float* gain, int64_t rows, int64_t n, double eps,
                 float* out) override {
    return check(ops()->rmsnorm(x, gain, rows, n, eps, out, stream_), "rmsnorm");
  }
  Status l2norm(const float* x, int64_t rows, int64_t n, double eps, float* out) override {
    return check(ops()->l2norm(x, rows, n, eps, out, stream_), "l2norm");
  }
  Status situ_glu(const float* a, const float* b, int64_t n, double beta1,
                  std::optional<double> beta2, float* out) override {
    return check(ops()->situ_glu(a, b, n, beta1, beta2.has_value() ? 1 : 0, beta2.value_or(0.0),
                                out, stream_),
                 "situ_glu");
  }
  Status sigmoid(const float* x, int64_t n, float* out) override {
    return check(ops()->sigmoid(x, n, out, stream_), "sigmoid");
  }
  Status sigmoid_gate(const float* x, const float* gate, int64_t n, float* out) override {
    return check(ops()->sigmoid_gate(x, gate, n, out, stream_), "sigmoid_gate");
  }
  Status add(const float* a, const float* b, int64_t n, float* out) override {
    return check(ops()->add(a, b, n, out, stream_), "add");
  }
  Status weighted_sum(const float* rows, const int32_t* row_of, const float* weight, int64_t T,
                      int k, int64_t n, float* out) override {
    return check(ops()->weighted_sum(rows, row_of, weight, T, k, n, out, stream_), "weighted_sum");
  }
  Status gather_rows(const float* src, const int32_t* row_of, int64_t rows, int64_t n,
                     float* dst) override {
    return check(ops()->gather_rows(src, row_of, rows, n, dst, stream_), "gather_rows");
  }
  Status kda_short_conv(const float* u, int64_t T, int64_t C, const float* w, int K,
                        float* history, float* out) override {
    return check(ops()->kda_short_conv(u, T, C, w, K, history, out, stream_), "kda_short_conv");
  }
  Status kda_decay_gate(const float* z, int64_t T, int H, int D, const float* A_log,
                        const float* dt_bias, double g_min, float* g, float* alpha) override {
    return check(ops()->kda_decay_gate(z, T, H, D, A_log, dt_bias, g_min, g, alpha, stream_),
                 "kda_decay_gate");
  }
  Status kda_recurrence(const float* q, const float* k, const float* v, const float* alpha,
                        const float* beta, int64_t T, int H, int Dk, int Dv, double q_scale,
                        float* state, float* out) override {
    return check(
        ops()->kda_recurrence(q, k, v, alpha, beta, T, H, Dk, Dv, q_scale, state, out, stream_),
        "kda_recurrence");
  }
  Status mla_attention(const cpu::MlaDims& dims, const float* q, int64_t T,
                       const cpu::WeightMatrix& kv_b, const float* cache_c, const float* cache_r,
                       int64_t n_past, double scale, float* out) override {
    const KtierCudaMlaDims d{dims.n_heads, dims.qk_nope, dims.qk_rope, dims.v_head,
                             dims.kv_lora};
    const KtierCudaWeight w = to_abi(kv_b);
    return check(
        ops()->mla_attention(&d, q, T, &w, cache_c, cache_r, n_past, scale, out, stream_),
        "mla_attention");
  }
  Status attnres(const float* const* src, int m, int64_t src_stride, int64_t T, int64_t n,
                 const float* f, double eps, float* out) override {
    return check(ops()->attnres(src, m, src_stride, T, n, f, eps, out, stream_), "attnres");
  }
  Status router_topk(const float* logits, const float* bias, int64_t T, int n_experts, int top_k,
                     bool renormalize, double scaling, int32_t* ids, float* weights) override {
    return check(ops()->router_topk(logits, bias, T, n_experts, top_k, renormalize ? 1 : 0,
                                   scaling, ids, weights, stream_),
                 "router_topk");
  }
  Result<int64_t> argmax(const float* x, int64_t n) override {
    if (!argmax_out_) {
      KTIER_ASSIGN_OR_RETURN(argmax_out_, allocate(sizeof(int64_t)));
    }
    KTIER_RETURN_IF_ERROR(
        check(ops()->argmax(x, n, static_cast<int64_t*>(argmax_out_), stream_), "argmax"));
    int64_t index = 0;
    KTIER_RETURN_IF_ERROR(download(&index, argmax_out_, sizeof index));
    return index;
  }

 private:
  // Frees the kept blocks, after the ops that may still use them.
  Status trim_pool() {
    KTIER_RETURN_IF_ERROR(synchronize());
    for (auto& [size, list] : pool_)
      for (void* q : list) ops()->free_device(q);
    pool_.clear();
    pooled_ = 0;
    return Status::ok();
  }
  KtierCudaStream copies(CopyQueue q) const { return copy_streams_[static_cast<int>(q)]; }
  KtierCudaEvent& fence(Fence f) {
    KTIER_CHECK_MSG(f >= 0 && static_cast<size_t>(f) < fences_.size() && fences_[f], "unknown fence");
    return fences_[static_cast<size_t>(f)];
  }
  void hand_out(void* p, size_t bytes) {
    live_[p] = bytes;
    use_.allocated(bytes);
    // The emulated device refuses an allocation past its capacity, and the tests hold every
    // run to it there; a GPU run is not failed for it (the device may still have room), but a
    // working set planned short is a bug worth one line.
    if (use_.live > limit_ && !said_over_limit_) {
      said_over_limit_ = true;
      spdlog::warn("{} holds {} bytes, past the {} planned for it (--vram less the cuBLAS "
                   "allowance): the working-set bound is short", name_, use_.live, limit_);
    }
  }
  // `what` as a view: a call that succeeds allocates nothing (sync_copies runs in clean-ups
  // while a std::bad_alloc unwinds).
  Status check(int rc, std::string_view what) const {
    // The call's ops() could not make the device current: whatever it did, it was not here.
    if (!bind_failure().empty())
      return Status::runtime(name_ + ": " + std::string(what) + ": " + bind_failure());
    if (rc == 0) return Status::ok();
    return Status::runtime(name_ + ": " + std::string(what) + " failed: " +
                           module_->last_error());
  }

  // Every module call goes through here. The CUDA runtime's current device is per host thread,
  // and a backend is called from more than one (serve's connection threads, one at a time, the
  // engine's lock between them): a thread's first call, or its first after it used another
  // backend, makes this device current (init; a cuBLAS handle is the device's, made once). A
  // failed init is kept as the thread's bind_failure(), which check() returns for the call
  // (the next call tries again).
  const KtierCudaOps* ops() const {
    uint64_t& bound = bound_on_this_thread();
    if (bound != id_) {
      bound = 0;  // init may change the current device and then fail
      if (module_->init(device_) == 0) {
        bound = id_;
        bind_failure().clear();
      } else {
        bind_failure() = std::string("making the device current on this thread failed: ") +
                         module_->last_error();
      }
    }
    return module_;
  }
  // The id_ of the backend the calling thread last made current (0: none).
  static uint64_t& bound_on_this_thread() {
    thread_local uint64_t bound = 0;
    return bound;
  }
  // Why the calling thread's last ops() could not make its device current; empty after one
  // that did.
  static std::string& bind_failure() {
    thread_local std::string failure;
    return failure;
  }
  static uint64_t next_id() {
    static std::atomic<uint64_t> next{1};
    return next++;
  }

  const KtierCudaOps* module_;
  const uint64_t id_ = next_id();
  int device_;
  std::string name_;
  const bool cublas_prefill_;  // asked for; uses_blas_: asked for and cuBLAS found
  bool uses_blas_ = false;
  KtierCudaStream stream_ = nullptr;       // the ops
  KtierCudaStream copy_streams_[kNumCopyQueues] = {};  // copy_async, per CopyQueue
  KtierCudaEvent ops_done_ = nullptr, copies_done_[kNumCopyQueues] = {};
  std::vector<KtierCudaEvent> fences_;  // create_fence(); null once destroyed
  void* argmax_out_ = nullptr;  // device int64, from allocate()
  std::unordered_map<void*, size_t> live_;                 // handed out: pointer -> bytes
  MemoryUse use_;                                          // of live_
  uint64_t pooled_ = 0;                                    // bytes in pool_
  uint64_t limit_ = UINT64_MAX;                            // limit_memory()
  bool said_over_limit_ = false;
  std::unordered_map<size_t, std::vector<void*>> pool_;    // released, by size
};

}  // namespace

Result<std::unique_ptr<Backend>> make_cuda_backend(const Result<CudaModuleProbe>& module,
                                                   bool cublas_prefill, int device) {
  if (!module.is_ok()) return module.status();
  const KtierCudaProbe& p = module->probe;
  if (p.device_count == 0) return Status::runtime(std::string("no usable CUDA device: ") + p.error);
  if (device < 0 || device >= p.device_count)
    return Status::runtime("CUDA device " + std::to_string(device) + " does not exist (" +
                           std::to_string(p.device_count) + " found)");
  if (const std::string why = cuda_device_unsupported(p, device); !why.empty())
    return Status::runtime(why);
  const KtierCudaDeviceInfo& info = p.devices[device];
  char name[320];
  std::snprintf(name, sizeof name, "cuda:%d %s (sm_%d%d)", device, info.name, info.compute_major,
                info.compute_minor);
  auto backend = std::make_unique<CudaBackend>(module->ops, device, name, cublas_prefill);
  KTIER_RETURN_IF_ERROR(backend->open());
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace ktier::backend
