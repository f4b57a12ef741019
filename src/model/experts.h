#pragma once
// Routed experts as the forward pass sees them: an ExpertSource hands out views of the experts a
// MoE layer needs for one chunk of tokens. The views are MXFP4 (packed bytes + E8M0 scales,
// multiplied straight from those bytes) or plain float, exactly as stored (K3-MODEL §5.7, §5.8).
//
// CheckpointExpertSource reads them from the checkpoint itself: in OpenMode::kMap the views
// point into the mapping (the page cache is the only copy); in OpenMode::kPread each fetch reads
// the experts into buffers it owns. The memory dial and the tiered stores (issues 4, 5) are other
// ExpertSources; none of them may change an output byte.

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "cpu/types.h"
#include "format/checkpoint.h"

namespace ktier::model {

// One routed expert: u -> w2(situ(w1 u, w3 u)). w1, w3 [I, latent]; w2 [latent, I].
struct ExpertWeights {
  cpu::WeightMatrix w1, w2, w3;
};
// Stored bytes of one expert's three matrices (MXFP4: packed nibbles + scales).
uint64_t expert_bytes(const ExpertWeights& e);

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  // Makes experts `ids` (distinct, each in [0, num_experts)) of MoE layer `layer` available and
  // writes their views to out[0 .. ids.size()). The views stay valid until the next fetch() on
  // this source. Not thread-safe: one forward pass calls it from one thread.
  // Errors: Status::runtime for an I/O failure, Status::corrupt for a range past the end of its
  // file (a shard shorter than its header says); no partial view is ever used.
  virtual Status fetch(int64_t layer, std::span<const int32_t> ids, ExpertWeights* out) = 0;
  // fetch() that hands experts over as they become available, so a caller computes with some
  // while others still load: calls `ready` with indices into `ids` (each exactly once over the
  // call, in groups: a tiered source gives those in memory first, then each group of reads as
  // it lands), out[i] valid from then until the next fetch — or, when ids.size() exceeds
  // max_batch(), only until that `ready` call returns (the source may then reuse the memory for
  // a later expert of the same call). At most max_each() ids. If `ready` fails, or a read does,
  // no later group is handed over and the first error is returned once every read issued has
  // landed. Default: fetch(), then ready(all) once.
  using ReadyFn = std::function<Status(std::span<const size_t> indices)>;
  virtual Status fetch_each(int64_t layer, std::span<const int32_t> ids, ExpertWeights* out,
                            const ReadyFn& ready);
  // Announces MoE layer `layer`'s routing for one forward chunk, before its fetches: ids [T, k],
  // each token's experts in selection order; token t is at sequence position first_position + t.
  // A tiered source drives its placement policy with it (one policy step per token). Default:
  // ignored.
  virtual void begin_layer(int64_t layer, int64_t first_position, const int32_t* ids, int64_t T,
                           int k) {}
  // A forward pass (Model::forward) begins, before its first layer: whatever an earlier pass
  // left for layers it never reached (it ended early, on an error) belongs to no later pass.
  // Default: ignored (a source without prefetch).
  virtual void begin_pass() {}
  // Bytes of expert data handed out since construction (for the per-token reports).
  virtual uint64_t bytes_fetched() const = 0;
  // Most experts one fetch() may ask for (a RAM tier's slot count); callers split larger sets.
  virtual int64_t max_batch() const { return INT64_MAX; }
  // Most experts one fetch_each() may ask for: max_batch(), unless the source streams a larger
  // set through its slots (reading the next experts while the caller computes with earlier ones).
  virtual int64_t max_each() const { return max_batch(); }
  // Views of expert `id` of MoE layer `layer` when its bytes are in memory now (no I/O, no
  // waiting), else false. Counts as no use. The views stay valid until this source overwrites
  // that memory, which it does only after calling the reuse fence (below). For a tier above
  // (GPU mode) that copies experts ahead of need. Default: false.
  virtual bool peek(int64_t layer, int32_t id, ExpertWeights* out) { return false; }
  // Called with [begin, begin + bytes) before that memory, handed out by peek() or fetch(), is
  // overwritten by a new read, so a tier above can first wait for the copies still reading it
  // (and only those). Default: the source never reuses such memory, or has no peek.
  using ReuseFence = std::function<void(const void* begin, size_t bytes)>;
  virtual void set_reuse_fence(ReuseFence fence) {}
  // A tier above (GPU mode) says which experts it holds and keeps through their predicted use
  // (`held(layer, id)`), so this source's lookahead does not read them again. Null: none.
  // Default: ignored (a source without prefetch).
  virtual void set_held_above(std::function<bool(int64_t layer, int32_t id)> held) {}
};

class CheckpointExpertSource final : public ExpertSource {
 public:
  // The checkpoint must outlive the source and must have routed experts (a MoE layer).
  explicit CheckpointExpertSource(const format::Checkpoint& ckpt);
  Status fetch(int64_t layer, std::span<const int32_t> ids, ExpertWeights* out) override;
  uint64_t bytes_fetched() const override { return bytes_fetched_; }
  // Mapped checkpoints: views into the mapping (valid for the source's life). Pread mode: false.
  bool peek(int64_t layer, int32_t id, ExpertWeights* out) override;

 private:
  // One expert matrix. Its packed bytes and scales may sit in different shards (the index
  // locates every tensor on its own, K3-MODEL §3.3).
  struct Matrix {
    uint32_t data_shard = 0, scales_shard = 0;
    const format::TensorInfo* data = nullptr;    // weight_packed or plain weight
    const format::TensorInfo* scales = nullptr;  // weight_scale (MXFP4 only)
  };
  Result<cpu::WeightMatrix> view(const Matrix& m, int64_t rows, int64_t cols, size_t slot);

  const format::Checkpoint& ckpt_;
  bool packed_ = false;
  std::vector<std::array<Matrix, 3>> matrices_;  // [(layer - first MoE layer) * N_e + e] w1 w2 w3
  // Read buffers (pread mode, or a misaligned plain-float tensor): two per matrix slot.
  std::vector<std::unique_ptr<uint8_t[]>> buffers_;
  std::vector<uint64_t> buffer_sizes_;
  uint64_t bytes_fetched_ = 0;
};

}  // namespace ktier::model
