// The emulated device: the CPU kernels behind a memory wall. Allocations are registered, and
// every op checks that each pointer it is given lies inside one of them, as a GPU would fault on
// a host pointer. It runs the GPU mode's placement code (device trunk mirror, VRAM expert tier)
// on machines without a GPU, and gives the CPU's bytes, so tests can demand byte identity.
//
// copy_async is as late as the contract allows: the destination is poisoned (NaN bytes) at
// once, and the host bytes are read only when ops_after_copies(q), sync_copies(q) or a wait on
// a fence marked on q after it is called — a wait on another queue never applies it. So an op
// that reads a copy before its fence sees NaN, and host memory overwritten before the wait
// lands in the copy: both change the output, which the tests compare. A GPU may read the host
// bytes any time until the host waits for the copy (sync_copies, host_wait), later than an
// ops-side wait that applied it here: so the host bytes are hashed when applied and checked
// again when the host waits, and a change in between (host memory reused too early) aborts.
#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <xxhash.h>

#include "backend/backend.h"
#include "common/check.h"

namespace ktier::backend {
namespace {

class EmulatedDevice final : public Backend {
 public:
  EmulatedDevice(const cpu::Exec& ex, uint64_t capacity)
      : cpu_(make_cpu_backend(ex)), capacity_(capacity) {}

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return "emulated device over " + cpu_->name(); }

  Result<void*> allocate(size_t bytes) override {
    if (bytes > capacity_ - use_.live)
      return Status::out_of_memory(name() + ": out of memory: " + std::to_string(bytes) +
                                   " bytes asked, " + std::to_string(use_.live) + " of " +
                                   std::to_string(capacity_) + " in use");
    KTIER_ASSIGN_OR_RETURN(void* p, cpu_->allocate(bytes));
    blocks_[reinterpret_cast<uintptr_t>(p)] = bytes;
    use_.allocated(bytes);
    return p;
  }
  void release(void* ptr) override {
    if (!ptr) return;
    auto it = blocks_.find(reinterpret_cast<uintptr_t>(ptr));
    KTIER_CHECK_MSG(it != blocks_.end(), "release of a foreign pointer");
    use_.released(it->second);
    blocks_.erase(it);
    cpu_->release(ptr);
  }
  Result<uint64_t> free_memory() override {
    if (capacity_ == UINT64_MAX) return Backend::free_memory();
    return capacity_ - use_.live;
  }
  MemoryUse memory_use() const override { return use_; }
  Status pin_host(void* host, size_t bytes) override {
    pinned_[reinterpret_cast<uintptr_t>(host)] = bytes;
    return Status::ok();
  }
  void unpin_host(void* host) override { pinned_.erase(reinterpret_cast<uintptr_t>(host)); }
  uint64_t pageable_copy_bytes() const override { return pageable_copy_bytes_; }
  Status upload(void* dst, const void* src, size_t bytes) override {
    mine(dst, bytes, "upload destination");
    return cpu_->upload(dst, src, bytes);
  }
  Status download(void* dst, const void* src, size_t bytes) override {
    mine(src, bytes, "download source");
    return cpu_->download(dst, src, bytes);
  }
  Status fill(void* dst, uint8_t byte, size_t bytes) override {
    mine(dst, bytes, "fill");
    return cpu_->fill(dst, byte, bytes);
  }
  Status copy(void* dst, const void* src, size_t bytes) override {
    mine(dst, bytes, "copy destination");
    mine(src, bytes, "copy source");
    return cpu_->copy(dst, src, bytes);
  }
  Status copy_async(CopyQueue q, void* dst, const void* src, size_t bytes) override {
    mine(dst, bytes, "copy_async destination");
    KTIER_RETURN_IF_ERROR(cpu_->fill(dst, 0xff, bytes));
    Queue& queue = queues_[static_cast<int>(q)];
    queue.pending.push_back({dst, src, bytes, ++queue.issued});
    if (!pinned(src, bytes)) pageable_copy_bytes_ += bytes;
    return Status::ok();
  }
  Status ops_after_copies(CopyQueue q) override { return apply_copies(q, issued(q)); }
  Status sync_copies(CopyQueue q) override { return host_waits(q, issued(q)); }
  // A fence marked on queue q is the number of q's copies issued then: waiting for it applies
  // those copies and no later one, and none of another queue (marks of the ops stream are
  // passed at once: ops run at call time).
  Result<Fence> create_fence() override {
    fences_.push_back({});
    return static_cast<Fence>(fences_.size() - 1);
  }
  Status mark_ops(Fence f) override {
    fence(f) = {};
    return Status::ok();
  }
  Status mark_copies(Fence f, CopyQueue q) override {
    fence(f) = {q, issued(q)};
    return Status::ok();
  }
  // The later copies of the waiting queue come after f's copies: applied now, so that a copy
  // of another queue into the same bytes, issued later, lands last (as on a GPU); and a host
  // wait for those later copies is one for f's copies too (the GPU's chain of events).
  Status copies_wait(Fence f, CopyQueue q) override {
    const FenceMark& m = fence(f);
    if (!m.queue) return Status::ok();
    queues_[static_cast<int>(q)].after.push_back({issued(q), *m.queue, m.copies});
    return apply_copies(*m.queue, m.copies);
  }
  Status ops_wait(Fence f) override {
    const FenceMark& m = fence(f);
    return m.queue ? apply_copies(*m.queue, m.copies) : Status::ok();
  }
  Status host_wait(Fence f) override {
    const FenceMark& m = fence(f);
    return m.queue ? host_waits(*m.queue, m.copies) : Status::ok();
  }
  // Passed once its copies are applied (by a wait on the ops' or the host's side): a copy
  // nothing waited for has not landed yet, however long ago it was issued.
  Result<bool> fence_passed(Fence f) override {
    const FenceMark& m = fence(f);
    if (!m.queue) return true;
    const std::vector<PendingCopy>& pending = queues_[static_cast<int>(*m.queue)].pending;
    return pending.empty() || pending.front().number > m.copies;
  }
  Status synchronize() override { return Status::ok(); }

  Status linear(const cpu::LinearJob* jobs, int n_jobs) override {
    for (int i = 0; i < n_jobs; ++i) {
      const cpu::LinearJob& j = jobs[i];
      weight(j.w, "linear weight");
      floats(j.x, j.n_tokens * j.w.cols, "linear x");
      floats(j.y, j.n_tokens * j.w.rows, "linear y");
    }
    return cpu_->linear(jobs, n_jobs);
  }
  Status rmsnorm(const float* x, const float* gain, int64_t rows, int64_t n, double eps,
                 float* out) override {
    floats(x, rows * n, "rmsnorm x"), floats(out, rows * n, "rmsnorm out");
    if (gain) floats(gain, n, "rmsnorm gain");
    return cpu_->rmsnorm(x, gain, rows, n, eps, out);
  }
  Status l2norm(const float* x, int64_t rows, int64_t n, double eps, float* out) override {
    floats(x, rows * n, "l2norm x"), floats(out, rows * n, "l2norm out");
    return cpu_->l2norm(x, rows, n, eps, out);
  }
  Status situ_glu(const float* a, const float* b, int64_t n, double beta1,
                  std::optional<double> beta2, float* out) override {
    floats(a, n, "situ a"), floats(b, n, "situ b"), floats(out, n, "situ out");
    return cpu_->situ_glu(a, b, n, beta1, beta2, out);
  }
  Status sigmoid(const float* x, int64_t n, float* out) override {
    floats(x, n, "sigmoid x"), floats(out, n, "sigmoid out");
    return cpu_->sigmoid(x, n, out);
  }
  Status sigmoid_gate(const float* x, const float* gate, int64_t n, float* out) override {
    floats(x, n, "gate x"), floats(gate, n, "gate"), floats(out, n, "gate out");
    return cpu_->sigmoid_gate(x, gate, n, out);
  }
  Status add(const float* a, const float* b, int64_t n, float* out) override {
    floats(a, n, "add a"), floats(b, n, "add b"), floats(out, n, "add out");
    return cpu_->add(a, b, n, out);
  }
  Status weighted_sum(const float* rows, const int32_t* row_of, const float* weight, int64_t T,
                      int k, int64_t n, float* out) override {
    if (T * n == 0) return Status::ok();  // nothing to write (as on CUDA)
    if (k > 0) floats(rows, rows_spanned(row_of, T * k) * n, "weighted_sum rows");
    floats(weight, T * k, "weighted_sum weights"), floats(out, T * n, "weighted_sum out");
    return cpu_->weighted_sum(rows, row_of, weight, T, k, n, out);
  }
  Status gather_rows(const float* src, const int32_t* row_of, int64_t rows, int64_t n,
                     float* dst) override {
    if (rows * n == 0) return Status::ok();
    floats(src, rows_spanned(row_of, rows) * n, "gather src"), floats(dst, rows * n, "gather dst");
    return cpu_->gather_rows(src, row_of, rows, n, dst);
  }
  Status kda_short_conv(const float* u, int64_t T, int64_t C, const float* w, int K,
                        float* history, float* out) override {
    floats(u, T * C, "conv u"), floats(w, C * K, "conv taps");
    floats(history, (K - 1) * C, "conv history"), floats(out, T * C, "conv out");
    return cpu_->kda_short_conv(u, T, C, w, K, history, out);
  }
  Status kda_decay_gate(const float* z, int64_t T, int H, int D, const float* A_log,
                        const float* dt_bias, double g_min, float* g, float* alpha) override {
    floats(z, T * H * D, "gate z"), floats(A_log, H, "A_log"), floats(dt_bias, H * D, "dt_bias");
    floats(alpha, T * H * D, "alpha");
    if (g) floats(g, T * H * D, "g");
    return cpu_->kda_decay_gate(z, T, H, D, A_log, dt_bias, g_min, g, alpha);
  }
  Status kda_recurrence(const float* q, const float* k, const float* v, const float* alpha,
                        const float* beta, int64_t T, int H, int Dk, int Dv, double q_scale,
                        float* state, float* out) override {
    floats(q, T * H * Dk, "q"), floats(k, T * H * Dk, "k"), floats(v, T * H * Dv, "v");
    floats(alpha, T * H * Dk, "alpha"), floats(beta, T * H, "beta");
    floats(state, int64_t{H} * Dk * Dv, "state"), floats(out, T * H * Dv, "recurrence out");
    return cpu_->kda_recurrence(q, k, v, alpha, beta, T, H, Dk, Dv, q_scale, state, out);
  }
  Status mla_attention(const cpu::MlaDims& d, const float* q, int64_t T,
                       const cpu::WeightMatrix& kv_b, const float* cache_c, const float* cache_r,
                       int64_t n_past, double scale, float* out) override {
    floats(q, T * d.n_heads * (d.qk_nope + d.qk_rope), "mla q"), weight(kv_b, "kv_b");
    floats(cache_c, (n_past + T) * d.kv_lora, "cache c");
    floats(cache_r, (n_past + T) * d.qk_rope, "cache r");
    floats(out, T * d.n_heads * d.v_head, "mla out");
    return cpu_->mla_attention(d, q, T, kv_b, cache_c, cache_r, n_past, scale, out);
  }
  Status attnres(const float* const* src, int m, int64_t src_stride, int64_t T, int64_t n,
                 const float* f, double eps, float* out) override {
    for (int i = 0; i < m; ++i) floats(src[i], (T - 1) * src_stride + n, "attnres source");
    floats(f, n, "attnres f"), floats(out, T * n, "attnres out");
    return cpu_->attnres(src, m, src_stride, T, n, f, eps, out);
  }
  Status router_topk(const float* logits, const float* bias, int64_t T, int n_experts, int top_k,
                     bool renormalize, double scaling, int32_t* ids, float* weights) override {
    floats(logits, T * n_experts, "router logits");
    if (bias) floats(bias, n_experts, "router bias");
    mine(ids, static_cast<size_t>(T * top_k) * 4, "router ids");
    floats(weights, T * top_k, "router weights");
    return cpu_->router_topk(logits, bias, T, n_experts, top_k, renormalize, scaling, ids,
                             weights);
  }
  Result<int64_t> argmax(const float* x, int64_t n) override {
    floats(x, n, "argmax x");
    return cpu_->argmax(x, n);
  }

 private:
  // A pointer outside every allocation is a host pointer handed to the device: a bug.
  void mine(const void* p, size_t bytes, const char* what) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = blocks_.upper_bound(a);
    bool inside = false;
    if (it != blocks_.begin()) {
      --it;
      inside = a >= it->first && a + bytes <= it->first + it->second;
    }
    if (!inside) {
      std::fprintf(stderr, "ktier: emulated device: %s (%zu bytes at %p) is not device memory\n",
                   what, bytes, p);
      KTIER_CHECK_MSG(inside, what);
    }
  }
  // Rows a host index list reaches: 1 + its largest entry (0 for an empty list).
  static int64_t rows_spanned(const int32_t* row_of, int64_t count) {
    int64_t rows = 0;
    for (int64_t i = 0; i < count; ++i) {
      KTIER_CHECK(row_of[i] >= 0);
      rows = std::max<int64_t>(rows, int64_t{row_of[i]} + 1);
    }
    return rows;
  }
  void floats(const void* p, int64_t n, const char* what) const {
    mine(p, static_cast<size_t>(n) * sizeof(float), what);
  }
  void weight(const cpu::WeightMatrix& w, const char* what) const {
    mine(w.data, weight_data_bytes(w), what);
    if (w.type == cpu::WeightType::kMxfp4) mine(w.scales, weight_scale_bytes(w), what);
  }

  struct PendingCopy {
    void* dst;
    const void* src;
    size_t bytes;
    uint64_t number;  // 1 = the queue's first copy_async
  };
  struct LandedCopy {  // applied, the host not yet waited for it
    const void* src;
    size_t bytes;
    uint64_t number;
    uint64_t src_hash;  // of the host bytes when applied
  };
  // A copies_wait: this queue's copies numbered above `from` run after the first `copies`
  // copies of `queue`.
  struct Waited {
    uint64_t from;
    CopyQueue queue;
    uint64_t copies;
  };
  struct Queue {
    std::vector<PendingCopy> pending;  // copy_async calls not applied yet, in issue order
    std::vector<LandedCopy> landed;    // applied, in issue order
    std::vector<Waited> after;         // copies_wait calls not yet covered by a host wait
    uint64_t issued = 0;
  };
  struct FenceMark {
    std::optional<CopyQueue> queue;  // none: the ops stream's (or never marked): passed
    uint64_t copies = 0;             // the queue's copies issued when marked
  };

  uint64_t issued(CopyQueue q) const { return queues_[static_cast<int>(q)].issued; }
  // Applies q's pending copies numbered up to `last`, in issue order.
  Status apply_copies(CopyQueue q, uint64_t last) {
    Queue& queue = queues_[static_cast<int>(q)];
    size_t n = 0;
    while (n < queue.pending.size() && queue.pending[n].number <= last) {
      const PendingCopy& c = queue.pending[n++];
      KTIER_RETURN_IF_ERROR(cpu_->upload(c.dst, c.src, c.bytes));
      queue.landed.push_back({c.src, c.bytes, c.number, XXH3_64bits(c.src, c.bytes)});
    }
    queue.pending.erase(queue.pending.begin(), queue.pending.begin() + static_cast<std::ptrdiff_t>(n));
    return Status::ok();
  }
  // The host waits for q's copies up to `last`: they land, and their host bytes must not have
  // changed since they were applied (a GPU could have read them until now).
  Status host_waits(CopyQueue q, uint64_t last) {
    KTIER_RETURN_IF_ERROR(apply_copies(q, last));
    // The copies waited for include some issued after a copies_wait: its copies are done too.
    std::vector<Waited>& after = queues_[static_cast<int>(q)].after;
    while (!after.empty() && after.front().from < last) {
      const Waited w = after.front();
      after.erase(after.begin());
      KTIER_RETURN_IF_ERROR(host_waits(w.queue, w.copies));
    }
    std::vector<LandedCopy>& landed = queues_[static_cast<int>(q)].landed;
    size_t n = 0;
    for (; n < landed.size() && landed[n].number <= last; ++n) {
      const LandedCopy& c = landed[n];
      if (XXH3_64bits(c.src, c.bytes) != c.src_hash) {
        std::fprintf(stderr, "ktier: emulated device: the host bytes of copy_async #%llu of queue "
                     "%d (%zu bytes at %p) changed before the host waited for it\n",
                     static_cast<unsigned long long>(c.number), static_cast<int>(q), c.bytes,
                     c.src);
        KTIER_CHECK_MSG(false, "host memory of a copy reused before the host waited for it");
      }
    }
    landed.erase(landed.begin(), landed.begin() + static_cast<std::ptrdiff_t>(n));
    return Status::ok();
  }
  FenceMark& fence(Fence f) {
    KTIER_CHECK_MSG(f >= 0 && static_cast<size_t>(f) < fences_.size(), "unknown fence");
    return fences_[static_cast<size_t>(f)];
  }

  std::unique_ptr<Backend> cpu_;
  const uint64_t capacity_;             // bytes that may be held at once
  MemoryUse use_;
  std::map<uintptr_t, size_t> blocks_;  // allocation start -> bytes
  // Whether [p, p + n) lies inside one pin_host range.
  bool pinned(const void* p, size_t n) const {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto it = pinned_.upper_bound(a);
    if (it == pinned_.begin()) return false;
    --it;
    return a + n <= it->first + it->second;
  }
  Queue queues_[kNumCopyQueues];        // per CopyQueue
  std::map<uintptr_t, size_t> pinned_;  // pin_host ranges: start -> bytes
  uint64_t pageable_copy_bytes_ = 0;
  std::vector<FenceMark> fences_;       // per fence: where it was last marked
};

}  // namespace

std::unique_ptr<Backend> make_emulated_device_backend(const cpu::Exec& ex,
                                                      uint64_t capacity_bytes) {
  return std::make_unique<EmulatedDevice>(ex, capacity_bytes);
}

}  // namespace ktier::backend
