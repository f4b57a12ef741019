#pragma once
// A model directory: config.json + safetensors shards (+ model.safetensors.index.json),
// K3-MODEL.md §3-§5.
//
// Checkpoint::open() does all load-time validation before anything is computed:
//   * config.json (§2.5 rules 1-8; Status::usage, exit 2);
//   * every shard header (safetensors.h; Status::corrupt, exit 3, naming shard and tensor);
//   * the index against the shard headers: every mapped shard exists, every indexed tensor is in
//     the header of the shard the index names, no shard holds an unindexed tensor, and
//     metadata.total_size, where given, equals the sum of tensor bytes (Status::corrupt);
//   * the model against the config (§2.5 rule 9, §5): every expected tensor present with exactly
//     the implied shape (only the §5.10 variants), non-expert tensors F32/BF16/F16, routed experts
//     either all MXFP4-packed or all plain float (§5.8), A_log's padding exactly 0, no unknown
//     tensor under language_model.model.layers. (Status::corrupt naming the tensor).
// Vision tensors (vision_tower.*, mm_projector.*) are ignored.
//
// Ownership and threads: a Checkpoint owns its shards (see SafetensorsFile); it is move-only and
// immutable after open(), so every const method may be called from any thread. TensorRef and
// ExpertLocation values refer into the Checkpoint and live as long as it does.

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "format/config.h"
#include "format/safetensors.h"

namespace ktier::format {

inline constexpr const char* kIndexFileName = "model.safetensors.index.json";

// Where a tensor lives.
struct TensorRef {
  uint32_t shard = 0;                // index into Checkpoint::shard()
  const TensorInfo* info = nullptr;  // owned by that shard
};

enum class ExpertStorage {
  kNone,        // no MoE layer (every layer dense)
  kMxfp4,       // weight_packed + weight_scale per matrix (§5.7, §7)
  kPlainFloat,  // one F32/BF16/F16 `.weight` per matrix (small test models)
};
const char* expert_storage_name(ExpertStorage s);

// One tensor of a routed expert.
struct ExpertPart {
  uint32_t shard = 0;
  uint64_t file_offset = 0;  // absolute, in that shard
  uint64_t nbytes = 0;
  // MXFP4 parts: U8 (scales U8 or F8_E8M0); plain-float parts: each its own float dtype.
  DType dtype = DType::kU8;
};

// Where one routed expert's bytes are. The in-memory layout of a fetched expert is the parts
// back to back in `parts` order, whether it was read in one go or part by part.
struct ExpertLocation {
  // kMxfp4: 6 parts, in the order of kPackedPartNames. kPlainFloat: 3 parts, w1, w2, w3 `.weight`.
  static constexpr std::array<const char*, 6> kPackedPartNames = {
      "w1.weight_packed", "w1.weight_scale", "w2.weight_packed",
      "w2.weight_scale",  "w3.weight_packed", "w3.weight_scale"};
  static constexpr std::array<const char*, 3> kPlainPartNames = {"w1.weight", "w2.weight",
                                                                 "w3.weight"};

  uint32_t shard = 0;        // = parts[0].shard
  uint64_t file_offset = 0;  // = parts[0].file_offset
  uint64_t nbytes = 0;       // sum of the parts' bytes
  // Packed experts only: the parts are adjacent, in order, in one shard, so the expert is the
  // single range [file_offset, file_offset + nbytes) of `shard` (§3.5). When false the expert
  // must be fetched with one read per part. Always false for plain-float experts.
  bool contiguous = false;
  uint32_t num_parts = 0;
  std::array<ExpertPart, 6> parts{};
};

struct CensusEntry {
  uint64_t tensors = 0;
  uint64_t bytes = 0;
};

// Tensor bytes on disk by kind.
struct ByteCensus {
  CensusEntry trunk;            // per-layer non-expert tensors (attention, norms, dense FFN, MoE trunk)
  CensusEntry experts;          // routed experts
  CensusEntry embeddings_head;  // embed_tokens, lm_head, final norm, output AttnRes pair
  CensusEntry ignored;          // vision, MTP layers and other tensors ktier does not use
};

struct ExpertSummary {
  ExpertStorage storage = ExpertStorage::kNone;
  uint64_t count = 0;              // experts in the checkpoint: MoE layers x num_experts
  uint64_t contiguous = 0;         // how many of them are contiguous (packed only)
  uint64_t bytes_per_expert = 0;   // when every expert has the same size, else 0
  // Plain-float experts that all share one dtype (informative: each part has its own dtype,
  // ExpertPart::dtype, and mixed dtypes run).
  std::optional<DType> plain_dtype;
};

class Checkpoint {
 public:
  // Opens and validates the model directory `dir`. Never throws. Exit codes as described at the
  // top of this file; an unreadable directory or shard is Status::runtime.
  static Result<Checkpoint> open(const std::filesystem::path& dir, OpenMode mode = OpenMode::kMap);
  // The first check open() makes, alone and cheap (before a command does other work with
  // `dir`): Status::usage "not a model directory" unless `dir` is a directory.
  static Status check_directory(const std::filesystem::path& dir);

  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;

  const ModelConfig& config() const { return config_; }
  const std::filesystem::path& dir() const { return dir_; }
  bool has_index() const { return has_index_; }

  size_t num_shards() const { return shards_.size(); }
  const SafetensorsFile& shard(size_t i) const { return shards_.at(i); }

  // Any tensor of the checkpoint (vision included); nullopt if absent.
  std::optional<TensorRef> find(std::string_view name) const;

  ExpertStorage expert_storage() const { return expert_summary_.storage; }
  const ExpertSummary& expert_summary() const { return expert_summary_; }
  // Expert e (0..num_experts-1) of MoE layer `layer`; asking for a dense layer is a bug.
  const ExpertLocation& expert(int64_t layer, int64_t e) const;

  const ByteCensus& census() const { return census_; }

  // Whether tensor `index` of shard `shard` is one the model reads (census trunk, experts,
  // embeddings/head), not an ignored one (vision, MTP).
  bool used(size_t shard, size_t index) const { return used_.at(shard).at(index) != 0; }

 private:
  Checkpoint() = default;
  friend class CheckpointBuilder;

  std::filesystem::path dir_;
  ModelConfig config_;
  bool has_index_ = false;
  std::vector<SafetensorsFile> shards_;
  // Keys view TensorInfo::name inside shards_ (stable: the shards' tensor vectors never change
  // after open, and moving a vector keeps its elements in place).
  std::unordered_map<std::string_view, TensorRef> by_name_;
  std::vector<ExpertLocation> experts_;  // [(layer - first_k_dense_replace) * num_experts + e]
  ExpertSummary expert_summary_;
  ByteCensus census_;
  std::vector<std::vector<uint8_t>> used_;  // [shard][tensor index in that shard]
};

// Tensor name helpers (K3-MODEL §4).
std::string layer_prefix(int64_t layer);  // "language_model.model.layers.{l}."
std::string expert_prefix(int64_t layer, int64_t e);  // layer_prefix + "block_sparse_moe.experts.{e}."

}  // namespace ktier::format
