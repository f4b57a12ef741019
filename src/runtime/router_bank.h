#pragma once
// The routing weights router lookahead reads (model::Model::set_lookahead) when the trunk is
// streamed: for every MoE layer l > 0 from `from_layer` on (the first layer the TrunkStore
// streams), its router matrix and bias and its FFN input's norm and AttnRes vector
// (model::bind_routing), read once from the shards and kept resident. A streamed layer's record
// is not in memory when an earlier layer predicts it, so these few tensors are held apart from
// the TrunkStore (K3: ~12.9 MB per layer in bf16, 92 layers, about 1.2 GB when nothing is pinned;
// counted in the budget, docs/TUNING.md). Pinned layers' routers are read from the TrunkStore.
//
// Ownership: the bank owns its buffers; the LayerWeights it hands out view them and live as
// long as the bank. Immutable after load(): any thread may call routing().

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "format/checkpoint.h"
#include "io/aligned_buffer.h"
#include "io/io_engine.h"
#include "model/weights.h"

namespace ktier::runtime {

class RouterBank {
 public:
  // Bytes load() allocates for `ckpt` from layer `from_layer` on, without reading anything.
  static uint64_t bytes_needed(const format::Checkpoint& ckpt, int64_t from_layer = 0);
  // The same per layer ([num_hidden_layers], 0 for a layer the bank never holds).
  static std::vector<uint64_t> layer_bytes(const format::Checkpoint& ckpt);
  // Reads the tensors through `engine` (`shards`: one ReadFile per shard, Checkpoint order; they
  // must outlive the call). Errors: the I/O layer's (exit 1, naming file and offset).
  static Result<std::unique_ptr<RouterBank>> load(const format::Checkpoint& ckpt,
                                                  io::IoEngine& engine,
                                                  const std::vector<io::ReadFile>& shards,
                                                  int64_t from_layer = 0);
  // Layer l's routing weights, or null for a layer the bank does not hold (dense layers, layers
  // before from_layer, and layer 0: nothing precedes it to predict it).
  const model::LayerWeights* routing(int64_t l) const;
  uint64_t bytes_allocated() const { return bytes_; }  // = bytes_needed()

 private:
  RouterBank() = default;
  int64_t first_ = 0;  // first layer held
  std::vector<model::LayerWeights> layers_;
  std::vector<io::AlignedBuffer> buffers_;
  uint64_t bytes_ = 0;
};

}  // namespace ktier::runtime
