#include "runtime/weight_scan.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/interrupt.h"
#include "model/blocks.h"
#include "model/weights.h"
#include "runtime/generator.h"

namespace ktier::runtime {

namespace {

// Index and kind of the first element whose exponent bits are all ones (NaN or infinite) in
// `n` elements of `dtype` at `bytes`; -1 when none.
int64_t first_nonfinite(DType dtype, const uint8_t* bytes, int64_t n, bool& is_nan) {
  const auto scan = [&](auto bits, auto exponent, auto mantissa) -> int64_t {
    for (int64_t i = 0; i < n; ++i) {
      decltype(bits) v;
      std::memcpy(&v, bytes + i * static_cast<int64_t>(sizeof v), sizeof v);
      if ((v & exponent) == exponent) {
        is_nan = (v & mantissa) != 0;
        return i;
      }
    }
    return -1;
  };
  switch (dtype) {
    case DType::kF32:
      return scan(uint32_t{}, uint32_t{0x7F800000}, uint32_t{0x007FFFFF});
    case DType::kBF16:
      return scan(uint16_t{}, uint16_t{0x7F80}, uint16_t{0x007F});
    case DType::kF16:
      return scan(uint16_t{}, uint16_t{0x7C00}, uint16_t{0x03FF});
    default:
      return -1;  // integer codes (MXFP4 bytes, scales)
  }
}

}  // namespace

Result<std::optional<std::string>> find_nonfinite_weight(const format::Checkpoint& ckpt) {
  // The names the model binds, in the order it binds them: those it reads.
  std::vector<std::string> names = {model::embedding_tensor_name()};
  const model::TensorLookup shapes = model::shapes_in(ckpt);
  const model::TensorLookup record = [&](const std::string& name) {
    names.push_back(name);
    return shapes(name);
  };
  const format::ModelConfig& c = ckpt.config();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    KTIER_RETURN_IF_ERROR(model::bind_layer(c, l, record).status());
  KTIER_RETURN_IF_ERROR(model::bind_head(c, record).status());

  constexpr uint64_t kPiece = 16ull << 20;  // bytes read at a time (a multiple of 4)
  std::vector<uint8_t> buffer;
  for (const std::string& name : names) {
    const std::optional<format::TensorRef> ref = ckpt.find(name);
    if (!ref) continue;  // (bound from another name, or optional)
    const format::TensorInfo& t = *ref->info;
    const format::SafetensorsFile& shard = ckpt.shard(ref->shard);
    const uint64_t size = dtype_size(t.dtype);
    if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16) continue;
    buffer.resize(static_cast<size_t>(std::min(kPiece, t.nbytes)));
    for (uint64_t at = 0; at < t.nbytes; at += kPiece) {
      if (InterruptRequest::requested())
        return Status::interrupted("stopped (Ctrl-C or SIGTERM) at " + name);
      const uint64_t n = std::min(kPiece, t.nbytes - at);
      KTIER_RETURN_IF_ERROR(shard.read_bytes(t.file_offset + at, n, buffer.data()));
      bool is_nan = false;
      const int64_t i =
          first_nonfinite(t.dtype, buffer.data(), static_cast<int64_t>(n / size), is_nan);
      if (i >= 0)
        return std::optional<std::string>(
            name + " in " + shard.path().filename().string() + ": element " +
            std::to_string(at / size + static_cast<uint64_t>(i)) + " is " +
            (is_nan ? "NaN" : "infinite"));
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
