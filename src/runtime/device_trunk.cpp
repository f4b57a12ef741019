#include "runtime/device_trunk.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/check.h"
#include "common/on_exception.h"
#include "common/progress.h"
#include "runtime/device_placement.h"

namespace ktier::runtime {
namespace {

template <class Weights>
uint64_t bytes_of(Weights& w) {
  uint64_t n = 0;
  model::for_each_tensor(
      w, [&](cpu::WeightMatrix& m) { n += DevicePlacer::bytes(m); },
      [&](model::F32Vec& v) { n += DevicePlacer::bytes(v); });
  return n;
}

// Only what router lookahead reads of a MoE layer (as model::bind_routing binds).
model::LayerWeights routing_part(const model::LayerWeights& w) {
  model::LayerWeights r;
  r.post_attention_norm = w.post_attention_norm;
  r.f_mlp = w.f_mlp;
  r.moe.router = w.moe.router;
  r.moe.router_bias = w.moe.router_bias;
  return r;
}

}  // namespace

uint64_t DeviceTrunk::layer_bytes(model::LayerWeights w) { return bytes_of(w); }
uint64_t DeviceTrunk::head_bytes(model::HeadWeights w) { return bytes_of(w); }

template <class Weights>
Status DeviceTrunk::mirror(Weights& w, uint8_t* dst, bool ahead) {
  DevicePlacer placer(be_, dst, bytes_of(w),
                      ahead ? std::optional(kQueue) : std::nullopt);
  Status status = Status::ok();
  model::for_each_tensor(
      w, [&](cpu::WeightMatrix& m) { if (status.is_ok()) status = placer.place(m); },
      [&](model::F32Vec& v) { if (status.is_ok()) status = placer.place(v); });
  return status;
}

Result<DeviceTrunk::Plan> DeviceTrunk::plan(
    const format::ModelConfig& c,
    const std::function<Result<model::LayerWeights>(int64_t)>& layer_shapes,
    model::HeadWeights head, uint64_t vram_bytes, uint64_t reserved_bytes) {
  const uint64_t budget_bytes = vram_bytes > reserved_bytes ? vram_bytes - reserved_bytes : 0;
  const int64_t L = c.num_hidden_layers;
  Plan p;
  p.layer_bytes.assign(static_cast<size_t>(L), 0);
  p.routing_bytes.assign(static_cast<size_t>(L), 0);
  for (int64_t l = 0; l < L; ++l) {
    KTIER_ASSIGN_OR_RETURN(model::LayerWeights shapes, layer_shapes(l));
    uint64_t vectors = 0;
    model::for_each_tensor(
        shapes, [](cpu::WeightMatrix&) {}, [&](model::F32Vec& v) { vectors += v.size() * sizeof(float); });
    p.largest_vectors = std::max(p.largest_vectors, vectors);
    p.layer_bytes[static_cast<size_t>(l)] = layer_bytes(shapes);
    if (!c.is_dense(l)) p.routing_bytes[static_cast<size_t>(l)] = layer_bytes(routing_part(shapes));
  }
  p.head_bytes = head_bytes(std::move(head));
  uint64_t all = p.head_bytes, all_routing = 0;
  for (int64_t l = 0; l < L; ++l) {
    all += p.layer_bytes[static_cast<size_t>(l)];
    all_routing += p.routing_bytes[static_cast<size_t>(l)];
  }
  if (all <= budget_bytes) {
    p.resident_layers = L;
    return p;
  }
  const uint64_t largest = *std::max_element(p.layer_bytes.begin(), p.layer_bytes.end());
  // A resident layer's routing weights are part of its mirror: it costs its size less those.
  const uint64_t minimum = p.head_bytes + 2 * largest + all_routing;
  if (budget_bytes < minimum)
    return Status::budget("--vram " + std::to_string(vram_bytes) + " bytes cannot hold the " +
                          "trunk's head, two streaming layer slots and the routers beside the " +
                          std::to_string(reserved_bytes) + " bytes set aside (the VRAM expert " +
                          "tier's minimum and the sequence's working set); the minimum is " +
                          std::to_string(minimum + reserved_bytes) + " bytes");
  uint64_t used = minimum;
  while (p.resident_layers < L) {
    const size_t l = static_cast<size_t>(p.resident_layers);
    if (used + p.layer_bytes[l] - p.routing_bytes[l] > budget_bytes) break;
    used += p.layer_bytes[l] - p.routing_bytes[l];
    ++p.resident_layers;
  }
  p.slot_bytes = largest;
  return p;
}

uint64_t DeviceTrunk::Plan::device_bytes() const {
  uint64_t n = head_bytes + (slot_bytes > 0 ? 2 * slot_bytes : 0);
  for (size_t l = 0; l < layer_bytes.size(); ++l)
    n += static_cast<int64_t>(l) < resident_layers ? layer_bytes[l] : routing_bytes[l];
  return n;
}

Result<std::unique_ptr<DeviceTrunk>> DeviceTrunk::open(model::TrunkSource& host,
                                                       backend::Backend& be, const Plan& p,
                                                       const std::function<void(int64_t)>& placed) {
  const format::ModelConfig& c = host.config();
  const int64_t L = c.num_hidden_layers;
  KTIER_CHECK(static_cast<int64_t>(p.layer_bytes.size()) == L && p.resident_layers <= L);
  std::unique_ptr<DeviceTrunk> t(new DeviceTrunk(host, be));
  t->resident_ = p.resident_layers;
  t->slot_bytes_ = p.slot_bytes;
  const std::vector<uint64_t>& sizes = p.layer_bytes;
  const std::vector<uint64_t>& routing = p.routing_bytes;
  const uint64_t head = p.head_bytes;
  if (placed) placed(t->resident_);
  // The head; then, each host layer acquired once and in order, the resident layers' mirrors and
  // the streamed MoE layers' routing weights (for router lookahead).
  KTIER_ASSIGN_OR_RETURN(backend::BackendBuffer hb, backend::BackendBuffer::allocate(be, head));
  t->head_ = host.head();
  KTIER_RETURN_IF_ERROR(t->mirror(t->head_, hb.as<uint8_t>(), /*ahead=*/false));
  t->bytes_ += head;
  t->buffers_.push_back(std::move(hb));
  t->routers_.resize(static_cast<size_t>(L));
  uint64_t to_copy = 0, copied = 0;
  for (int64_t l = 0; l < t->resident_; ++l) to_copy += sizes[static_cast<size_t>(l)];
  for (int64_t l = t->resident_; l < L; ++l) to_copy += routing[static_cast<size_t>(l)];
  ProgressMeter meter("trunk to device", to_copy, spdlog::should_log(spdlog::level::info));
  for (int64_t l = 0; l < L; ++l) {
    const bool resident = l < t->resident_;
    if (!resident && c.is_dense(l)) continue;
    const uint64_t n = resident ? sizes[static_cast<size_t>(l)] : routing[static_cast<size_t>(l)];
    KTIER_ASSIGN_OR_RETURN(const model::LayerWeights* w, host.acquire_layer(l));
    model::LayerWeights copy = resident ? *w : routing_part(*w);
    KTIER_CHECK(layer_bytes(copy) == n);  // the plan is of the checkpoint the host binds
    auto buf = backend::BackendBuffer::allocate(be, n);
    Status s = buf.is_ok() ? t->mirror(copy, buf->as<uint8_t>(), /*ahead=*/false) : buf.status();
    host.release_layer(l);  // the mirror holds no host pointer (its vectors are views)
    KTIER_RETURN_IF_ERROR(s);
    t->bytes_ += n;
    t->buffers_.push_back(std::move(*buf));
    if (resident)
      t->layers_.push_back(std::move(copy));
    else
      t->routers_[static_cast<size_t>(l)] = std::move(copy);
    meter.update(copied += n);
  }
  meter.finish_if_shown(copied);
  for (StreamSlot& slot : t->slots_) {
    if (t->slot_bytes_ == 0) break;
    KTIER_ASSIGN_OR_RETURN(slot.buf, backend::BackendBuffer::allocate(be, t->slot_bytes_));
    if (p.largest_vectors > 0) {
      KTIER_ASSIGN_OR_RETURN(slot.vector_staging, io::AlignedBuffer::allocate(p.largest_vectors));
      // Refused: the copies still work, from pageable memory.
      slot.staging_pinned =
          be.pin_host(slot.vector_staging.data(), slot.vector_staging.size()).is_ok();
    }
    KTIER_ASSIGN_OR_RETURN(slot.read, be.create_fence());
    KTIER_ASSIGN_OR_RETURN(slot.copied, be.create_fence());
    // The block may be one the backend kept from a buffer whose ops are still queued (CUDA
    // reuses released blocks in the ops stream's order): the first copy into it waits for them.
    KTIER_RETURN_IF_ERROR(be.mark_ops(slot.read));
    t->bytes_ += t->slot_bytes_;
  }
  KTIER_CHECK(t->bytes_ == p.device_bytes());
  return t;
}

DeviceTrunk::~DeviceTrunk() {
  for (StreamSlot& s : slots_) {
    (void)release_host(s);  // a copy ahead nobody acquired (the last token's)
    for (backend::Backend::Fence f : {s.read, s.copied})
      if (f >= 0) be_.destroy_fence(f);
    if (s.staging_pinned) be_.unpin_host(s.vector_staging.data());
  }
}

const model::LayerWeights* DeviceTrunk::routing_layer(int64_t l) const {
  if (config().is_dense(l)) return nullptr;
  if (l < resident_) return &layers_[static_cast<size_t>(l)];
  return &routers_[static_cast<size_t>(l)];
}

Status DeviceTrunk::load(int64_t l, StreamSlot& s) {
  KTIER_RETURN_IF_ERROR(release_host(s));
  s.layer = -1;
  KTIER_ASSIGN_OR_RETURN(const model::LayerWeights* w, host_.acquire_layer(l));
  s.weights = *w;
  s.host_held = true;  // from here on the copy may read the host bytes
  s.host_layer = l;
  const uint64_t n = layer_bytes(s.weights);  // <= slot_bytes_, the largest layer's
  Status status;
  {
    // std::bad_alloc: the slot holds no layer half placed.
    const OnException unwind([&] { abandon_copy(s); });
    // The vectors move to the slot's staging (its last copy landed in release_host above).
    size_t staged = 0;
    model::for_each_tensor(
        s.weights, [](cpu::WeightMatrix&) {},
        [&](model::F32Vec& v) {
          KTIER_CHECK((staged + v.size()) * sizeof(float) <= s.vector_staging.size());  // Plan
          float* at = reinterpret_cast<float*>(s.vector_staging.data()) + staged;
          std::copy(v.data(), v.data() + v.size(), at);
          v = model::F32Vec::view(at, v.size());
          staged += v.size();
        });
    status = be_.copies_wait(s.read, kQueue);
    if (status.is_ok()) status = mirror(s.weights, s.buf.as<uint8_t>(), /*ahead=*/true);
    if (status.is_ok()) status = be_.mark_copies(s.copied, kQueue);
  }
  if (!status.is_ok()) {
    abandon_copy(s);
    return status;
  }
  s.layer = l;  // its copies issued, their fence marked
  streamed_bytes_ += n;
  return Status::ok();
}

void DeviceTrunk::abandon_copy(StreamSlot& s) {
  (void)be_.sync_copies(kQueue);  // what was issued may still read the host layer
  s.host_held = false;
  host_.release_layer(s.host_layer);
}

Status DeviceTrunk::release_host(StreamSlot& s) {
  if (!s.host_held) return Status::ok();
  const Status waited = be_.host_wait(s.copied);
  if (!waited.is_ok()) (void)be_.sync_copies(kQueue);  // the host bytes must not go while read
  s.host_held = false;
  host_.release_layer(s.host_layer);
  return waited;
}

Result<const model::LayerWeights*> DeviceTrunk::acquire_layer(int64_t l) {
  if (l < resident_) return &layers_[static_cast<size_t>(l)];
  if (!prefetch_status_.is_ok()) return std::exchange(prefetch_status_, Status::ok());
  int s = slots_[0].layer == l ? 0 : slots_[1].layer == l ? 1 : -1;
  if (s < 0) {  // not copied ahead (the first token, or after an error): now
    s = current_ < 0 ? 0 : 1 - current_;  // not the slot the layer before may still read
    KTIER_RETURN_IF_ERROR(load(l, slots_[s]));
  }
  KTIER_RETURN_IF_ERROR(be_.ops_wait(slots_[s].copied));
  current_ = s;
  return &slots_[s].weights;
}

void DeviceTrunk::release_layer(int64_t l) {
  if (l < resident_ || current_ < 0 || slots_[current_].layer != l) return;
  StreamSlot& cur = slots_[current_];
  StreamSlot& other = slots_[1 - current_];
  // The next streamed layer in the forward pass's order: after the last, the next token's first.
  const int64_t next = l + 1 < config().num_hidden_layers ? l + 1 : resident_;
  try {
    Status s = be_.mark_ops(cur.read);
    if (Status released = release_host(cur); s.is_ok()) s = released;
    if (!s.is_ok() && prefetch_status_.is_ok()) prefetch_status_ = s;
    // A copy ahead that fails is speculative, as the host's read ahead is: `other` holds no
    // layer (load's contract), so acquire_layer copies it again when it is needed and what
    // fails then fails the pass that needs it (in serve, after this pass's end, another
    // request's), not this one nor a later one.
    if (s.is_ok() && next != cur.layer && next != other.layer) (void)load(next, other);
  } catch (...) {
    // Called from a destructor (Model's lease): nothing may escape. A layer not copied ahead
    // (load leaves no slot half placed) is loaded by acquire_layer when needed.
  }
}

}  // namespace ktier::runtime
