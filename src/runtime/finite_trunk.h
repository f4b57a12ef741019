#pragma once
// A TrunkSource that lets no trunk weight that is not finite reach a kernel. The forward pass's
// own checks (non-finite logits, a router's scores: generator.h, model/blocks.h) miss an
// infinite weight whose products a gate squashes back to finite values (sigmoid(+Inf) = 1): a
// damaged checkpoint ran to exit 0 with other tokens. So each layer's matrices are checked for
// NaN and ±Inf the first time the layer is acquired (each layer once per process: the bytes a
// streamed layer reads again are the same file's), the head's when opened, and every embedding
// row each time it is read (the small vectors are checked as they are bound: model/weights.cpp).
// A failed check is Status::corrupt naming the tensor, its shard and the element
// (find_nonfinite_weight over that part of the checkpoint).
//
// Cost: one read of the trunk at memory speed, spread over the first pass (split across the
// engine's pool); in map mode that read pages the trunk in, as the first pass would.
// The bytes the kernels see are the inner source's: output never changes.
//
// Not thread-safe, like every TrunkSource: one forward pass at a time.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "cpu/thread_pool.h"
#include "format/checkpoint.h"
#include "model/weights.h"

namespace ktier::runtime {

class FiniteTrunk final : public model::TrunkSource {
 public:
  // `inner`, `ckpt` (the checkpoint `inner`'s bytes came from, scanned to name a damaged
  // tensor) and `pool` (may be null: the calling thread checks alone) must outlive the result.
  // Errors: Status::corrupt when the head holds a value that is not finite; the scan's errors
  // (Status::runtime for a read that fails, Status::interrupted on Ctrl-C).
  static Result<std::unique_ptr<FiniteTrunk>> open(model::TrunkSource& inner,
                                                   const format::Checkpoint& ckpt,
                                                   cpu::ThreadPool* pool);

  const format::ModelConfig& config() const override { return inner_.config(); }
  // Errors: the inner source's; Status::corrupt (the layer released again) when layer l's
  // weights hold a value that is not finite.
  Result<const model::LayerWeights*> acquire_layer(int64_t l) override;
  void release_layer(int64_t l) override { inner_.release_layer(l); }
  const model::HeadWeights& head() const override { return inner_.head(); }
  // Errors: the inner source's; Status::corrupt when a row read holds a value that is not
  // finite (`out` is then not to be used).
  Status embed(std::span<const int32_t> ids, float* out) override;

 private:
  FiniteTrunk(model::TrunkSource& inner, const format::Checkpoint& ckpt, cpu::ThreadPool* pool);
  // The error naming the damaged tensor of `part` (a layer, or kHeadPart), found in the shards.
  Status damaged(int64_t part, const std::string& what) const;

  model::TrunkSource& inner_;
  const format::Checkpoint& ckpt_;
  cpu::ThreadPool* pool_;
  std::vector<uint8_t> layer_checked_;  // [l]: its weights were found finite
};

}  // namespace ktier::runtime
