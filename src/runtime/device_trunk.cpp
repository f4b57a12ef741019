#include "runtime/device_trunk.h"

#include "runtime/device_placement.h"

#include <algorithm>
#include <cstring>

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
Status DeviceTrunk::mirror(Weights& w, uint8_t* dst) {
  DevicePlacer placer(be_, dst, bytes_of(w), /*async=*/false);
  Status status = Status::ok();
  model::for_each_tensor(
      w, [&](cpu::WeightMatrix& m) { if (status.is_ok()) status = placer.place(m); },
      [&](model::F32Vec& v) { if (status.is_ok()) status = placer.place(v); });
  return status;
}

Result<std::unique_ptr<DeviceTrunk>> DeviceTrunk::open(model::TrunkSource& host,
                                                       backend::Backend& be,
                                                       uint64_t vram_bytes,
                                                       uint64_t reserved_bytes) {
  const uint64_t budget_bytes = vram_bytes > reserved_bytes ? vram_bytes - reserved_bytes : 0;
  std::unique_ptr<DeviceTrunk> t(new DeviceTrunk(host, be));
  const format::ModelConfig& c = host.config();
  const int64_t L = c.num_hidden_layers;
  // Sizes first (acquiring each host layer once; a streaming host reads it).
  std::vector<uint64_t> sizes(static_cast<size_t>(L)), routing(static_cast<size_t>(L), 0);
  for (int64_t l = 0; l < L; ++l) {
    KTIER_ASSIGN_OR_RETURN(const model::LayerWeights* w, host.acquire_layer(l));
    sizes[static_cast<size_t>(l)] = layer_bytes(*w);
    if (!c.is_dense(l)) routing[static_cast<size_t>(l)] = layer_bytes(routing_part(*w));
    host.release_layer(l);
  }
  const uint64_t head = head_bytes(host.head());
  uint64_t all = head, all_routing = 0;
  for (int64_t l = 0; l < L; ++l) {
    all += sizes[static_cast<size_t>(l)];
    all_routing += routing[static_cast<size_t>(l)];
  }
  const uint64_t largest = L ? *std::max_element(sizes.begin(), sizes.end()) : 0;
  if (all <= budget_bytes) {
    t->resident_ = L;
  } else {
    // A resident layer's routing weights are part of its mirror: it costs its size less those.
    const uint64_t minimum = head + 2 * largest + all_routing;
    if (budget_bytes < minimum)
      return Status::budget("--vram " + std::to_string(vram_bytes) + " bytes cannot hold the " +
                            "trunk's head, two streaming layer slots and the routers beside the " +
                            std::to_string(reserved_bytes) + " bytes set aside (the VRAM expert " +
                            "tier's minimum and the sequence's working set); the minimum is " +
                            std::to_string(minimum + reserved_bytes) + " bytes");
    uint64_t used = minimum;
    while (t->resident_ < L) {
      const size_t l = static_cast<size_t>(t->resident_);
      if (used + sizes[l] - routing[l] > budget_bytes) break;
      used += sizes[l] - routing[l];
      ++t->resident_;
    }
    t->slot_bytes_ = largest;
  }
  // The head and the resident layers.
  KTIER_ASSIGN_OR_RETURN(backend::BackendBuffer hb, backend::BackendBuffer::allocate(be, head));
  t->head_ = host.head();
  KTIER_RETURN_IF_ERROR(t->mirror(t->head_, hb.as<uint8_t>()));
  t->bytes_ += head;
  t->buffers_.push_back(std::move(hb));
  for (int64_t l = 0; l < t->resident_; ++l) {
    KTIER_ASSIGN_OR_RETURN(const model::LayerWeights* w, host.acquire_layer(l));
    model::LayerWeights copy = *w;
    auto buf = backend::BackendBuffer::allocate(be, sizes[static_cast<size_t>(l)]);
    Status s = buf.is_ok() ? t->mirror(copy, buf->as<uint8_t>()) : buf.status();
    host.release_layer(l);  // the mirror holds no host pointer (its vectors are views)
    KTIER_RETURN_IF_ERROR(s);
    t->bytes_ += sizes[static_cast<size_t>(l)];
    t->buffers_.push_back(std::move(*buf));
    t->layers_.push_back(std::move(copy));
  }
  // Routing weights of the streamed MoE layers, for router lookahead.
  t->routers_.resize(static_cast<size_t>(L));
  for (int64_t l = t->resident_; l < L; ++l) {
    if (c.is_dense(l)) continue;
    KTIER_ASSIGN_OR_RETURN(const model::LayerWeights* w, host.acquire_layer(l));
    model::LayerWeights r = routing_part(*w);
    auto buf = backend::BackendBuffer::allocate(be, routing[static_cast<size_t>(l)]);
    Status s = buf.is_ok() ? t->mirror(r, buf->as<uint8_t>()) : buf.status();
    host.release_layer(l);
    KTIER_RETURN_IF_ERROR(s);
    t->bytes_ += routing[static_cast<size_t>(l)];
    t->buffers_.push_back(std::move(*buf));
    t->routers_[static_cast<size_t>(l)] = std::move(r);
  }
  for (auto& slot : t->slots_) {
    if (t->slot_bytes_ == 0) break;
    KTIER_ASSIGN_OR_RETURN(slot, backend::BackendBuffer::allocate(be, t->slot_bytes_));
    t->bytes_ += t->slot_bytes_;
  }
  return t;
}

const model::LayerWeights* DeviceTrunk::routing_layer(int64_t l) const {
  if (config().is_dense(l)) return nullptr;
  if (l < resident_) return &layers_[static_cast<size_t>(l)];
  return &routers_[static_cast<size_t>(l)];
}

Result<const model::LayerWeights*> DeviceTrunk::acquire_layer(int64_t l) {
  if (l < resident_) return &layers_[static_cast<size_t>(l)];
  // Streamed: into slot l % 2. The copy is ordered after every op already issued (the same
  // stream), so the slot's previous layer (l - 2) is finished with before it is overwritten.
  const size_t slot = static_cast<size_t>(l % 2);
  KTIER_ASSIGN_OR_RETURN(const model::LayerWeights* w, host_.acquire_layer(l));
  model::LayerWeights copy = *w;
  const uint64_t n = layer_bytes(copy);
  const Status s = mirror(copy, slots_[slot].as<uint8_t>());
  host_.release_layer(l);
  KTIER_RETURN_IF_ERROR(s);
  streamed_bytes_ += n;
  slot_layers_[slot] = std::move(copy);
  return &slot_layers_[slot];
}

}  // namespace ktier::runtime
