#pragma once
// The trunk in a device's memory (GPU mode, issue 6): a TrunkSource whose weights are the
// backend's memory, mirrored from a host TrunkSource (resident weights or the memory dial's
// TrunkStore). The head and a prefix of layers stay resident; when the budget cannot hold every
// layer, the rest stream per layer over the host-to-device link through two device slots,
// double-buffered: when a streamed layer's ops have been issued (release_layer), the next
// streamed layer in the forward pass's cyclic order is copied into the other slot on the copy
// stream, after the ops that last read that slot and while this layer's ops run; its ops wait
// for the copy (per-slot fences, Backend::mark_ops/mark_copies; the copies go on their own
// queue, CopyQueue::kLayers, so that the VRAM tier's expert copies never wait behind a layer's),
// and its host layer stays
// acquired until the copy has landed. The routing weights of every non-resident MoE layer (post-
// attention norm, f_mlp, router, router bias) stay resident too, so router lookahead can score
// any layer (the device's RouterBank). The bytes are the host's bytes: nothing is converted.
//
// Not thread-safe: one forward pass at a time, like every TrunkSource.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "io/aligned_buffer.h"
#include "model/weights.h"

namespace ktier::runtime {

class DeviceTrunk final : public model::TrunkSource {
 public:
  // Bytes a layer (or the head) takes on the device: its matrices and vectors, each aligned to
  // 256 bytes.
  static uint64_t layer_bytes(model::LayerWeights w);
  static uint64_t head_bytes(model::HeadWeights w);

  // Where the trunk goes within `vram_bytes` less `reserved_bytes` (kept for others: the VRAM
  // tier's minimum, the working set): the head, then as many layers as fit while leaving room
  // for two streaming slots of the largest layer and the routing weights of the layers that
  // stream (none needed when all fit).
  struct Plan {
    int64_t resident_layers = 0;
    uint64_t slot_bytes = 0;  // each of the two streaming slots; 0 when every layer is resident
    uint64_t head_bytes = 0;
    std::vector<uint64_t> layer_bytes, routing_bytes;  // [L]; routing: 0 for dense layers
    uint64_t largest_vectors = 0;  // f32 vector bytes of the layer with the most (unaligned)
    // Device bytes the trunk holds once open (DeviceTrunk::bytes()): the head, the resident
    // layers, the streamed MoE layers' routing weights and the two slots.
    uint64_t device_bytes() const;
  };
  // From shapes alone: `layer_shapes(l)` gives layer l's (model::bind_layer over
  // model::shapes_in: the checkpoint's shapes, which every TrunkSource of it binds), `head` the
  // head's (bound the same way). Errors: layer_shapes's, and Status::budget (exit 4) naming
  // --vram and its minimum (head, two slots, routers, and the reserve) when that does not fit.
  static Result<Plan> plan(const format::ModelConfig& c,
                           const std::function<Result<model::LayerWeights>(int64_t)>& layer_shapes,
                           model::HeadWeights head, uint64_t vram_bytes, uint64_t reserved_bytes);

  // Mirrors `host` (which must outlive this) into `be`'s memory as `plan` (plan() for the
  // checkpoint `host` binds) places it: each host layer the device needs (resident, or a
  // streamed MoE layer's routing weights) is acquired once, in order. `placed`, when set, is
  // told the number of resident layers before any layer is acquired (GPU mode: the host's
  // TrunkStore starts its read-ahead cycle there, so that its ring reads ahead what this pass
  // and then the first token acquire). Errors: the host's (reading layers) and the backend's.
  static Result<std::unique_ptr<DeviceTrunk>> open(
      model::TrunkSource& host, backend::Backend& be, const Plan& plan,
      const std::function<void(int64_t resident_layers)>& placed = {});

  const format::ModelConfig& config() const override { return host_.config(); }
  ~DeviceTrunk() override;
  // A streamed layer comes from its slot: copied ahead by the previous release_layer, else now.
  // Errors: the host's and the backend's; a failed fence or copy wait in release_layer (which
  // cannot return it) by the next acquire of a streamed layer. A failed copy ahead is not an
  // error: the slot holds no layer, and the layer is copied again when acquired.
  Result<const model::LayerWeights*> acquire_layer(int64_t l) override;
  void release_layer(int64_t l) override;
  const model::HeadWeights& head() const override { return head_; }
  Status embed(std::span<const int32_t> ids, float* out) override { return host_.embed(ids, out); }

  int64_t resident_layers() const { return resident_; }
  // What router lookahead reads for MoE layer l: the layer's mirror when resident, else its
  // resident routing weights (only post_attention_norm, f_mlp, moe.router, moe.router_bias set);
  // null for a dense layer.
  const model::LayerWeights* routing_layer(int64_t l) const;
  uint64_t bytes() const { return bytes_; }  // device bytes held (resident + slots)
  uint64_t streamed_bytes() const { return streamed_bytes_; }  // host -> device, after open

 private:
  DeviceTrunk(model::TrunkSource& host, backend::Backend& be) : host_(host), be_(be) {}
  // Copies `w` into `dst` (layer_bytes(w) of device memory) and points `w` at the copy; with
  // `ahead` on the copy queue kQueue (DevicePlacer), else now.
  template <class Weights>
  Status mirror(Weights& w, uint8_t* dst, bool ahead);
  static constexpr backend::Backend::CopyQueue kQueue = backend::Backend::CopyQueue::kLayers;

  model::TrunkSource& host_;
  backend::Backend& be_;
  model::HeadWeights head_;
  std::vector<model::LayerWeights> layers_;   // resident mirrors, [resident_]
  std::vector<model::LayerWeights> routers_;  // [L]: routing-only mirrors of streamed MoE layers
  std::vector<backend::BackendBuffer> buffers_;
  struct StreamSlot {
    backend::BackendBuffer buf;
    // The layer's f32 vectors (widened by the host, in its pageable heap) are gathered here,
    // page-locked, before they are copied: a copy from pageable memory may make the host wait
    // for the copies before it, i.e. the whole layer. Reused once the slot's copy has landed.
    // Page-aligned, so that page-locking it locks no other object's page.
    io::AlignedBuffer vector_staging;
    bool staging_pinned = false;
    model::LayerWeights weights;  // views into buf
    int64_t layer = -1;           // held or being copied in; -1: none
    bool host_held = false;       // the host layer stays acquired until the copy has landed
    int64_t host_layer = -1;      // that host layer, while host_held
    backend::Backend::Fence read = -1;    // after the ops that read the slot (-1: none made)
    backend::Backend::Fence copied = -1;  // after the copy into the slot (-1: none made)
  };
  // Acquires host layer l and copies it into `s` on its copy queue, after the ops that last
  // read `s`; on error (or a throw) `s` holds nothing.
  Status load(int64_t l, StreamSlot& s);
  // A copy into `s` that will not be used: waits for what was issued, releases the host layer.
  void abandon_copy(StreamSlot& s);
  // Waits for `s`'s copy, then gives its host layer back.
  Status release_host(StreamSlot& s);

  StreamSlot slots_[2];
  int current_ = -1;         // slot of the streamed layer acquired last
  Status prefetch_status_;   // a failed fence or copy wait in release, for the next acquire
  uint64_t slot_bytes_ = 0;
  int64_t resident_ = 0;
  uint64_t bytes_ = 0, streamed_bytes_ = 0;
};

}  // namespace ktier::runtime
