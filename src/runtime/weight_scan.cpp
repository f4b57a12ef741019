#include "runtime/weight_scan.h"

#include <vector>

#include "common/interrupt.h"
#include "format/value_check.h"
#include "model/blocks.h"
#include "model/weights.h"
#include "runtime/generator.h"

namespace ktier::runtime {

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
    const std::optional<format::TensorRef> ref = ckpt.find(name);
    if (!ref) continue;  // (bound from another name, or optional)
    const format::TensorInfo& t = *ref->info;
    const format::SafetensorsFile& shard = ckpt.shard(ref->shard);
    if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16) continue;
    format::TensorValueCounts c;
    KTIER_RETURN_IF_ERROR(format::count_tensor_values(shard, t, c, scratch, [&](uint64_t) {
      return InterruptRequest::requested()
                 ? Status::interrupted("stopped (Ctrl-C or SIGTERM) at " + name)
                 : Status::ok();
    }));
    if (c.nan + c.inf > 0)
      return std::optional<std::string>(name + " in " + shard.path().filename().string() +
                                        ": element " + std::to_string(c.first_element) +
                                        " is " + (c.first_is_nan ? "NaN" : "infinite"));
  }
  return std::optional<std::string>();
}

bool is_nonfinite_logits(const Status& s) {
  return s.code() == ExitCode::kCorrupt &&
         (s.message().find(kNonFiniteLogits) != std::string::npos ||
          s.message().find(model::kNonFiniteRouterScores) != std::string::npos);
}

}  // namespace ktier::runtime
