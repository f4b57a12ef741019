#include "runtime/weight_scan.h"

#include <algorithm>
#include <array>
#include <vector>

#include "common/interrupt.h"
#include "cpu/numerics.h"
#include "format/value_check.h"
#include "model/blocks.h"
#include "model/weights.h"
#include "runtime/generator.h"

namespace ktier::runtime {
namespace {

// "NAME in SHARD: element E is NaN" for the checkpoint's float tensor `name` holding a NaN or an
// infinity; nullopt where it is finite, not a float tensor or not there.
Result<std::optional<std::string>> nonfinite_in(const format::Checkpoint& ckpt,
                                                const std::string& name,
                                                std::vector<uint8_t>& scratch) {
  const std::optional<format::TensorRef> ref = ckpt.find(name);
  if (!ref) return std::optional<std::string>();  // (bound from another name, or optional)
  const format::TensorInfo& t = *ref->info;
  const format::SafetensorsFile& shard = ckpt.shard(ref->shard);
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16)
    return std::optional<std::string>();
  format::TensorValueCounts c;
  KTIER_RETURN_IF_ERROR(format::count_tensor_values(shard, t, c, scratch, [&](uint64_t) {
    return InterruptRequest::requested()
               ? Status::interrupted("stopped (Ctrl-C or SIGTERM) at " + name)
               : Status::ok();
  }));
  if (c.nan + c.inf == 0) return std::optional<std::string>();
  return std::optional<std::string>(name + " in " + shard.path().filename().string() +
                                    ": element " + std::to_string(c.first_element) + " is " +
                                    (c.first_is_nan ? "NaN" : "infinite"));
}

std::vector<int32_t> distinct(std::span<const int32_t> experts) {
  std::vector<int32_t> ids(experts.begin(), experts.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace

Result<std::optional<std::string>> find_nonfinite_weight(const format::Checkpoint& ckpt,
                                                         int64_t part) {
  // The names the model binds, in the order it binds them: those it reads.
  std::vector<std::string> names;
  if (part == kAllParts) names.push_back(model::embedding_tensor_name());
  const model::TensorLookup shapes = model::shapes_in(ckpt);
  const model::TensorLookup record = [&](const std::string& name) {
    names.push_back(name);
    return shapes(name);
  };
  const format::ModelConfig& c = ckpt.config();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (part == kAllParts || part == l)
      KTIER_RETURN_IF_ERROR(model::bind_layer(c, l, record).status());
  if (part == kAllParts || part == kHeadPart)
    KTIER_RETURN_IF_ERROR(model::bind_head(c, record).status());

  std::vector<uint8_t> scratch;
  for (const std::string& name : names) {
    KTIER_ASSIGN_OR_RETURN(std::optional<std::string> found, nonfinite_in(ckpt, name, scratch));
    if (found) return found;
  }
  return std::optional<std::string>();
}

Result<std::optional<std::string>> find_nonfinite_expert(const format::Checkpoint& ckpt,
                                                         int64_t layer,
                                                         std::span<const int32_t> experts) {
  if (ckpt.expert_storage() != format::ExpertStorage::kPlainFloat)
    return std::optional<std::string>();
  const std::vector<int32_t> ids = distinct(experts);
  std::vector<uint8_t> scratch;
  for (const size_t p : {1, 0, 2})  // w2's first, as the scale scan's
    for (const int32_t e : ids) {
      KTIER_ASSIGN_OR_RETURN(
          std::optional<std::string> found,
          nonfinite_in(ckpt, format::expert_prefix(layer, e) +
                                 format::ExpertLocation::kPlainPartNames[p],
                       scratch));
      if (found) return found;
    }
  return std::optional<std::string>();
}

Result<std::optional<std::string>> find_damaged_expert_scale(const format::Checkpoint& ckpt,
                                                             int64_t layer,
                                                             std::span<const int32_t> experts) {
  if (ckpt.expert_storage() != format::ExpertStorage::kMxfp4) return std::optional<std::string>();
  const std::vector<int32_t> ids = distinct(experts);
  // The weight_scale parts, w2's first: SiTU-GLU bounds the activation w2 reads where both its
  // betas are set, as K3's (|SiTU| <= beta1 * beta2 = 100 even for infinite w1 and w3
  // outputs: K3-MODEL §6.0), so w2's products are where an overflow reaches the stream.
  struct Part {
    int32_t expert;
    size_t index;  // into ExpertLocation::kPackedPartNames
  };
  std::vector<Part> parts;
  for (const size_t p : {3, 1, 5})
    for (const int32_t e : ids) parts.push_back({e, p});
  // Two passes, one part's bytes held at a time (a prefill's routing may name every expert of
  // the layer: ~0.9 GB of K3's scales): the histogram, then the first byte out of range.
  std::vector<uint8_t> bytes;
  const auto read = [&](const Part& p) -> Result<const format::ExpertPart*> {
    const format::ExpertPart& part = ckpt.expert(layer, p.expert).parts[p.index];
    bytes.resize(part.nbytes);
    KTIER_RETURN_IF_ERROR(
        ckpt.shard(part.shard).read_bytes(part.file_offset, part.nbytes, bytes.data()));
    return &part;
  };
  std::array<uint64_t, 256> count{};  // blocks by scale byte, zero blocks left out
  for (const Part& p : parts) {
    KTIER_RETURN_IF_ERROR(read(p).status());
    for (const uint8_t b : bytes)
      if (b != cpu::num::kE8M0ZeroBlock) ++count[b];
  }
  uint64_t blocks = 0, below = 0;
  for (const uint64_t n : count) blocks += n;
  int median = 0;
  while (median < 255 && 2 * (below + count[static_cast<size_t>(median)]) <= blocks)
    below += count[static_cast<size_t>(median++)];
  constexpr int kPastFloatRange = 253;  // 6 * 2^126 > the largest float
  for (const Part& p : parts) {
    KTIER_ASSIGN_OR_RETURN(const format::ExpertPart* part, read(p));
    for (size_t i = 0; i < bytes.size(); ++i) {
      const int b = bytes[i];
      if (b == cpu::num::kE8M0ZeroBlock || (b < kPastFloatRange && b < median + 64)) continue;
      return std::optional<std::string>(
          format::expert_prefix(layer, p.expert) +
          format::ExpertLocation::kPackedPartNames[p.index] + " in " +
          ckpt.shard(part->shard).path().filename().string() + ": block " + std::to_string(i) +
          "'s scale is 2^" + std::to_string(b - 127) + " (byte " + std::to_string(b) + "), 2^" +
          std::to_string(b - median) + " times the median block's of the experts layer " +
          std::to_string(layer) + " routed to: a damaged byte?" +
          (b >= kPastFloatRange ? " (its values pass 32-bit floats' range)" : ""));
    }
  }
  return std::optional<std::string>();
}

bool is_nonfinite_logits(const Status& s) {
  return s.code() == ExitCode::kCorrupt &&
         (s.message().find(kNonFiniteLogits) != std::string::npos ||
          s.message().find(model::kNonFiniteRouterScores) != std::string::npos);
}

}  // namespace ktier::runtime
