// The CPU backend: the Backend interface over the exact CPU kernels (cpu/kernels.h). Memory is
// ordinary host memory, every op completes before it returns, and the bytes are the CPU path's.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "cpu/thread_pool.h"

namespace ktier::backend {
namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const cpu::Exec& ex) : ex_(ex) {}

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override {
    const int threads = ex_.pool ? ex_.pool->size() : 1;
    return std::string("cpu (") + cpu::isa_name(ex_.isa) + ", " + std::to_string(threads) +
           (threads == 1 ? " thread)" : " threads)");
  }

  Result<void*> allocate(size_t bytes) override {
    // 64-byte alignment: what the vector kernels prefer; aligned_alloc wants a multiple.
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (!p) return Status::out_of_memory("cpu backend: out of memory allocating " +
                                         std::to_string(bytes) + " bytes");
    return p;
  }
  void release(void* ptr) override { std::free(ptr); }
  Status upload(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return Status::ok();
  }
  Status download(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return Status::ok();
  }
  Status fill(void* dst, uint8_t byte, size_t bytes) override {
    std::memset(dst, byte, bytes);
    return Status::ok();
  }
  Status copy(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return Status::ok();
  }
  Status synchronize() override { return Status::ok(); }

  Status linear(const cpu::LinearJob* jobs, int n_jobs) override {
    cpu::linear(jobs, n_jobs, ex_);
    return Status::ok();
  }
  Status rmsnorm(const float* x, const float* gain, int64_t rows, int64_t n, double eps,
                 float* out) override {
    cpu::rmsnorm(x, gain, rows, n, eps, out, ex_);
    return Status::ok();
  }
  Status l2norm(const float* x, int64_t rows, int64_t n, double eps, float* out) override {
    cpu::l2norm(x, rows, n, eps, out, ex_);
    return Status::ok();
  }
  Status situ_glu(const float* a, const float* b, int64_t n, double beta1,
                  std::optional<double> beta2, float* out) override {
    cpu::situ_glu(a, b, n, beta1, beta2, out, ex_);
    return Status::ok();
  }
  Status sigmoid(const float* x, int64_t n, float* out) override {
    cpu::sigmoid(x, n, out, ex_);
    return Status::ok();
  }
  Status sigmoid_gate(const float* x, const float* gate, int64_t n, float* out) override {
    cpu::sigmoid_gate(x, gate, n, out, ex_);
    return Status::ok();
  }
  Status add(const float* a, const float* b, int64_t n, float* out) override {
    cpu::add(a, b, n, out, ex_);
    return Status::ok();
  }
  Status weighted_sum(const float* rows, const int32_t* row_of, const float* weight, int64_t T,
                      int k, int64_t n, float* out) override {
    std::vector<const float*> vec(static_cast<size_t>(k));
    for (int64_t t = 0; t < T; ++t) {
      for (int j = 0; j < k; ++j) vec[static_cast<size_t>(j)] = rows + row_of[t * k + j] * n;
      cpu::weighted_sum(vec.data(), weight + t * k, k, n, out + t * n, ex_);
    }
    return Status::ok();
  }
  Status gather_rows(const float* src, const int32_t* row_of, int64_t rows, int64_t n,
                     float* dst) override {
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + r * n, src + row_of[r] * n, static_cast<size_t>(n) * sizeof(float));
    return Status::ok();
  }
  Status kda_short_conv(const float* u, int64_t T, int64_t C, const float* w, int K,
                        float* history, float* out) override {
    cpu::kda_short_conv(u, T, C, w, K, history, out, ex_);
    return Status::ok();
  }
  Status kda_decay_gate(const float* z, int64_t T, int H, int D, const float* A_log,
                        const float* dt_bias, double g_min, float* g, float* alpha) override {
    cpu::kda_decay_gate(z, T, H, D, A_log, dt_bias, g_min, g, alpha, ex_);
    return Status::ok();
  }
  Status kda_recurrence(const float* q, const float* k, const float* v, const float* alpha,
                        const float* beta, int64_t T, int H, int Dk, int Dv, double q_scale,
                        float* state, float* out) override {
    cpu::kda_recurrence(q, k, v, alpha, beta, T, H, Dk, Dv, q_scale, state, out, ex_);
    return Status::ok();
  }
  Status mla_attention(const cpu::MlaDims& dims, const float* q, int64_t T,
                       const cpu::WeightMatrix& kv_b, const float* cache_c, const float* cache_r,
                       int64_t n_past, double scale, float* out) override {
    cpu::mla_attention(dims, q, T, kv_b, cache_c, cache_r, n_past, scale, out, ex_);
    return Status::ok();
  }
  Status attnres(const float* const* src, int m, int64_t src_stride, int64_t T, int64_t n,
                 const float* f, double eps, float* out) override {
    cpu::attnres(src, m, src_stride, T, n, f, eps, out, ex_);
    return Status::ok();
  }
  Status router_topk(const float* logits, const float* bias, int64_t T, int n_experts, int top_k,
                     bool renormalize, double scaling, int32_t* ids, float* weights) override {
    cpu::router_topk(logits, bias, T, n_experts, top_k, renormalize, scaling, ids, weights, ex_);
    return Status::ok();
  }
  Result<int64_t> argmax(const float* x, int64_t n) override { return cpu::argmax(x, n, ex_); }

 private:
  cpu::Exec ex_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const cpu::Exec& ex) {
  return std::make_unique<CpuBackend>(ex);
}

uint64_t weight_data_bytes(const cpu::WeightMatrix& w) {
  return static_cast<uint64_t>(w.rows) *
         static_cast<uint64_t>(cpu::weight_row_data_bytes(w.type, w.cols));
}

uint64_t weight_scale_bytes(const cpu::WeightMatrix& w) {
  return static_cast<uint64_t>(w.rows) *
         static_cast<uint64_t>(cpu::weight_row_scale_bytes(w.type, w.cols));
}

Result<BackendBuffer> BackendBuffer::allocate(Backend& backend, size_t bytes) {
  KTIER_ASSIGN_OR_RETURN(void* p, backend.allocate(bytes));
  BackendBuffer b;
  b.backend_ = &backend;
  b.ptr_ = p;
  b.bytes_ = bytes;
  return b;
}

BackendBuffer& BackendBuffer::operator=(BackendBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    backend_ = o.backend_;
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.backend_ = nullptr;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

Result<BackendArray> BackendArray::zeros(Backend& backend, int64_t n) {
  BackendArray a;
  KTIER_RETURN_IF_ERROR(a.resize(backend, n));
  if (n > 0)
    KTIER_RETURN_IF_ERROR(backend.fill(a.data(), 0, static_cast<size_t>(n) * sizeof(float)));
  return a;
}

Status BackendArray::resize(Backend& backend, int64_t n) {
  if (n > capacity()) KTIER_RETURN_IF_ERROR(reserve(backend, std::max<int64_t>(n, 2 * capacity())));
  n_ = n;
  return Status::ok();
}

Status BackendArray::reserve(Backend& backend, int64_t n) {
  if (n <= capacity()) return Status::ok();
  KTIER_ASSIGN_OR_RETURN(BackendBuffer grown,
                         BackendBuffer::allocate(backend, static_cast<size_t>(n) * sizeof(float)));
  if (n_ > 0)
    KTIER_RETURN_IF_ERROR(backend.copy(grown.get(), buf_.get(), static_cast<size_t>(n_) * sizeof(float)));
  buf_ = std::move(grown);
  return Status::ok();
}

void BackendBuffer::reset() {
  if (backend_ && ptr_) backend_->release(ptr_);
  backend_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace ktier::backend
