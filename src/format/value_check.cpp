#include "format/value_check.h"

#include <algorithm>
#include <cstring>
#include <string_view>

namespace ktier::format {
namespace {

// A float format's bit fields: all-ones exponent is Inf (mantissa 0) or NaN (any other).
template <class Bits, Bits kExponent, Bits kMantissa>
struct FloatBits {
  using Word = Bits;
  static constexpr Bits exponent = kExponent, mantissa = kMantissa;
};
using F32Bits = FloatBits<uint32_t, 0x7f800000u, 0x007fffffu>;
using BF16Bits = FloatBits<uint16_t, 0x7f80u, 0x007fu>;
using F16Bits = FloatBits<uint16_t, 0x7c00u, 0x03ffu>;

// Reads whole elements: a multiple of every element size.
constexpr uint64_t kReadBytes = 8u << 20;

bool nothing_counted(const TensorValueCounts& c) { return c.nan + c.inf + c.scale_255 == 0; }

// An all-ones exponent anywhere. Fixed-size blocks, so that the compiler vectorizes the inner
// loop at -O2 (K3's trunk is 109 GB: this runs at memory speed, where the element loop ran at
// half of it).
template <class F>
bool has_nonfinite_of(const uint8_t* p, uint64_t n) {
  using Word = typename F::Word;
  constexpr uint64_t kBlock = 64;
  const auto nonfinite = [](Word w) { return static_cast<Word>((w & F::exponent) == F::exponent); };
  uint64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    Word w[kBlock];
    std::memcpy(w, p + i * sizeof(Word), sizeof w);
    Word hit = 0;
    for (uint64_t j = 0; j < kBlock; ++j) hit |= nonfinite(w[j]);
    if (hit) return true;
  }
  for (; i < n; ++i) {
    Word w;
    std::memcpy(&w, p + i * sizeof(Word), sizeof(Word));
    if (nonfinite(w)) return true;
  }
  return false;
}

// Counts NaN and Inf, element by element only in the pieces the blocked test finds one in
// (a finite tensor, the usual case, is read at has_nonfinite_of's speed).
template <class F>
void count_nonfinite(const uint8_t* p, uint64_t n, uint64_t first, TensorValueCounts& c) {
  using Word = typename F::Word;
  constexpr uint64_t kPiece = 4096;
  for (uint64_t at = 0; at < n; at += kPiece) {
    const uint64_t m = std::min(kPiece, n - at);
    const uint8_t* q = p + at * sizeof(Word);
    if (!has_nonfinite_of<F>(q, m)) continue;
    for (uint64_t i = 0; i < m; ++i) {
      Word w;
      std::memcpy(&w, q + i * sizeof(Word), sizeof(Word));
      if ((w & F::exponent) != F::exponent) continue;
      const bool nan = (w & F::mantissa) != 0;
      if (nothing_counted(c)) c.first_element = first + at + i, c.first_is_nan = nan;
      (nan ? c.nan : c.inf) += 1;
    }
  }
}

void count_scale_255(const uint8_t* p, uint64_t n, uint64_t first, TensorValueCounts& c) {
  for (uint64_t i = 0; i < n; ++i) {
    if (p[i] != 255) continue;
    if (nothing_counted(c)) c.first_element = first + i;
    c.scale_255 += 1;
  }
}

// Counts over [from, from + n) elements of `t` held in `p`.
void count(const TensorInfo& t, const uint8_t* p, uint64_t n, uint64_t from,
           TensorValueCounts& c) {
  switch (t.dtype) {
    case DType::kF32: return count_nonfinite<F32Bits>(p, n, from, c);
    case DType::kBF16: return count_nonfinite<BF16Bits>(p, n, from, c);
    case DType::kF16: return count_nonfinite<F16Bits>(p, n, from, c);
    case DType::kU8:
    case DType::kE8M0: return count_scale_255(p, n, from, c);
    case DType::kI32: return;
  }
}

}  // namespace

bool has_nonfinite(DType dtype, const void* data, uint64_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  switch (dtype) {
    case DType::kF32: return has_nonfinite_of<F32Bits>(p, n);
    case DType::kBF16: return has_nonfinite_of<BF16Bits>(p, n);
    case DType::kF16: return has_nonfinite_of<F16Bits>(p, n);
    case DType::kU8:
    case DType::kI32:
    case DType::kE8M0: return false;
  }
  return false;
}

bool has_checked_values(const TensorInfo& t) {
  switch (t.dtype) {
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
    case DType::kE8M0:  // only scales have it
      return true;
    case DType::kU8:
      return std::string_view(t.name).ends_with(".weight_scale");
    case DType::kI32:
      return false;
  }
  return false;
}

Status count_tensor_values(const SafetensorsFile& shard, const TensorInfo& t,
                           TensorValueCounts& c, std::vector<uint8_t>& scratch,
                           const std::function<Status(uint64_t)>& before_piece) {
  if (!has_checked_values(t)) return Status::ok();
  const uint64_t element = dtype_size(t.dtype);
  const size_t piece = static_cast<size_t>(std::min(kReadBytes, t.nbytes));
  if (scratch.size() < piece) scratch.resize(piece);
  for (uint64_t at = 0; at < t.nbytes; at += kReadBytes) {
    if (before_piece) KTIER_RETURN_IF_ERROR(before_piece(at));
    const uint64_t n = std::min(kReadBytes, t.nbytes - at);
    KTIER_RETURN_IF_ERROR(shard.read_bytes(t.file_offset + at, n, scratch.data()));
    count(t, scratch.data(), n / element, at / element, c);
  }
  return Status::ok();
}

uint64_t value_check_bytes(const Checkpoint& ck) {
  uint64_t total = 0;
  for (size_t s = 0; s < ck.num_shards(); ++s) {
    const auto& ts = ck.shard(s).tensors();
    for (size_t i = 0; i < ts.size(); ++i)
      if (ck.used(s, i) && has_checked_values(ts[i])) total += ts[i].nbytes;
  }
  return total;
}

Result<ValueCheckReport> check_tensor_values(const Checkpoint& ck,
                                             const std::function<void(uint64_t)>& progress) {
  ValueCheckReport r;
  std::vector<uint8_t> scratch;
  for (size_t s = 0; s < ck.num_shards(); ++s) {
    const SafetensorsFile& shard = ck.shard(s);
    const auto& ts = shard.tensors();
    for (size_t i = 0; i < ts.size(); ++i) {
      const TensorInfo& t = ts[i];
      if (!ck.used(s, i)) continue;
      if (!has_checked_values(t)) {
        r.tensors_skipped += 1;
        continue;
      }
      TensorValueCounts c{t.name, shard.path().filename().string()};
      KTIER_RETURN_IF_ERROR(count_tensor_values(shard, t, c, scratch, [&](uint64_t done) {
        if (progress && done > 0) progress(r.bytes_read + done);
        return Status::ok();
      }));
      r.bytes_read += t.nbytes;
      if (progress) progress(r.bytes_read);
      r.tensors_read += 1;
      r.nan += c.nan;
      r.inf += c.inf;
      r.scale_255 += c.scale_255;
      if (c.nan + c.inf > 0) r.nonfinite.push_back(std::move(c));
      else if (c.scale_255 > 0) r.scale_255_tensors.push_back(std::move(c));
    }
  }
  return r;
}

}  // namespace ktier::format
