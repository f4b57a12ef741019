#include "runtime/finite_trunk.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>

#include "common/check.h"
#include "common/on_exception.h"
#include "format/value_check.h"
#include "runtime/weight_scan.h"

namespace ktier::runtime {
namespace {

// Elements of one float matrix's stored data, or a piece of it.
struct FloatSpan {
  DType dtype;
  const uint8_t* data;
  uint64_t count;
};

// Pieces a pool thread checks at a time: 1M elements (2-4 MiB).
constexpr uint64_t kPieceElements = uint64_t{1} << 20;

void add_pieces(DType dtype, const void* data, uint64_t count, std::vector<FloatSpan>& out) {
  const auto* p = static_cast<const uint8_t*>(data);
  const uint64_t size = dtype_size(dtype);
  for (uint64_t at = 0; at < count; at += kPieceElements)
    out.push_back({dtype, p + at * size, std::min(kPieceElements, count - at)});
}

// Whether any element of `w`'s float matrices is a NaN or ±Inf. MXFP4 holds none (K3-MODEL
// §7.3); the vectors were checked as they were bound (model/weights.cpp). `w`:
// model::LayerWeights or model::HeadWeights (a copy: for_each_tensor takes its argument to write).
template <class Weights>
bool any_nonfinite(Weights w, cpu::ThreadPool* pool) {
  std::vector<FloatSpan> pieces;
  const auto matrix = [&](cpu::WeightMatrix& m) {
    if (m.data == nullptr) return;
    const uint64_t n = static_cast<uint64_t>(m.rows) * static_cast<uint64_t>(m.cols);
    switch (m.type) {
      case cpu::WeightType::kF32: return add_pieces(DType::kF32, m.data, n, pieces);
      case cpu::WeightType::kBF16: return add_pieces(DType::kBF16, m.data, n, pieces);
      case cpu::WeightType::kF16: return add_pieces(DType::kF16, m.data, n, pieces);
      case cpu::WeightType::kMxfp4: return;
    }
  };
  model::for_each_tensor(w, matrix, [](model::F32Vec&) {});
  std::atomic<bool> found{false};
  const auto check = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end && !found.load(std::memory_order_relaxed); ++i) {
      const FloatSpan& s = pieces[static_cast<size_t>(i)];
      if (format::has_nonfinite(s.dtype, s.data, s.count)) found = true;
    }
  };
  const int64_t n = static_cast<int64_t>(pieces.size());
  if (pool != nullptr) pool->parallel_for(n, 1, check);
  else check(0, n);
  return found;
}

}  // namespace

FiniteTrunk::FiniteTrunk(model::TrunkSource& inner, const format::Checkpoint& ckpt,
                         cpu::ThreadPool* pool)
    : inner_(inner),
      ckpt_(ckpt),
      pool_(pool),
      layer_checked_(static_cast<size_t>(inner.config().num_hidden_layers), 0) {}

Result<std::unique_ptr<FiniteTrunk>> FiniteTrunk::open(model::TrunkSource& inner,
                                                       const format::Checkpoint& ckpt,
                                                       cpu::ThreadPool* pool) {
  std::unique_ptr<FiniteTrunk> t(new FiniteTrunk(inner, ckpt, pool));
  if (any_nonfinite(inner.head(), pool))
    return t->damaged(kHeadPart, "the head's weights (lm_head, final norm, output AttnRes)");
  return t;
}

Status FiniteTrunk::damaged(int64_t part, const std::string& what) const {
  const std::string lead = what + " hold a value that is not finite: ";
  Result<std::optional<std::string>> found = find_nonfinite_weight(ckpt_, part);
  if (!found.is_ok()) return found.status().with_context(lead + "looking for it in the shards");
  if (!*found)  // the bytes read are not the shards' (a trunk pack's)
    return Status::corrupt(lead + "the shards' bytes of them are finite: a trunk pack's differ");
  return Status::corrupt(lead + **found);
}

Result<const model::LayerWeights*> FiniteTrunk::acquire_layer(int64_t l) {
  KTIER_ASSIGN_OR_RETURN(const model::LayerWeights* w, inner_.acquire_layer(l));
  KTIER_CHECK(l >= 0 && l < static_cast<int64_t>(layer_checked_.size()));
  uint8_t& checked = layer_checked_[static_cast<size_t>(l)];
  if (checked) return w;
  bool nonfinite = false;
  {
    // std::bad_alloc (the pieces' list): the layer goes back, as a failed check gives it.
    const OnException give_back([&] { inner_.release_layer(l); });
    nonfinite = any_nonfinite(*w, pool_);
  }
  if (nonfinite) {
    inner_.release_layer(l);
    return damaged(l, "layer " + std::to_string(l) + "'s weights");
  }
  checked = 1;
  return w;
}

Status FiniteTrunk::embed(std::span<const int32_t> ids, float* out) {
  KTIER_RETURN_IF_ERROR(inner_.embed(ids, out));
  const int64_t E = config().hidden_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    const float* row = out + static_cast<int64_t>(i) * E;
    const float* bad = std::find_if(row, row + E, [](float x) { return !std::isfinite(x); });
    if (bad == row + E) continue;
    const std::string name = model::embedding_tensor_name();
    const std::optional<format::TensorRef> ref = ckpt_.find(name);
    const std::string shard =
        ref ? " in " + ckpt_.shard(ref->shard).path().filename().string() : std::string();
    const int64_t element = static_cast<int64_t>(ids[i]) * E + (bad - row);
    return Status::corrupt("the embedding of token id " + std::to_string(ids[i]) +
                           " holds a value that is not finite: " + name + shard + ": element " +
                           std::to_string(element) + " is " +
                           (std::isnan(*bad) ? "NaN" : "infinite"));
  }
  return Status::ok();
}

}  // namespace ktier::runtime
