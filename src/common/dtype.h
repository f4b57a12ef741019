#pragma once
// Element types of tensors on disk and their exact widening to f32.
// BF16 -> f32: the 16 stored bits become the high half of the f32 pattern (exact).
// F16  -> f32: exact IEEE half conversion, subnormals, +-inf and NaN included.

#include <cstdint>
#include <optional>
#include <string_view>

#include "cpu/float_bits.h"

namespace ktier {

// kI32: prompt cache ids. kE8M0: an MXFP4 scale stored as safetensors' F8_E8M0 (one byte, the
// same meaning as the release's U8 scale bytes, K3-MODEL §5.8).
enum class DType : uint8_t { kF32, kBF16, kF16, kU8, kI32, kE8M0 };

struct DTypeTraits {
  DType dtype;
  std::string_view name;  // safetensors spelling
  uint32_t size;          // bytes per element
};

inline constexpr DTypeTraits kDTypeTraits[] = {
    {DType::kF32, "F32", 4},
    {DType::kBF16, "BF16", 2},
    {DType::kF16, "F16", 2},
    {DType::kU8, "U8", 1},
    {DType::kI32, "I32", 4},
    {DType::kE8M0, "F8_E8M0", 1},
};

inline constexpr const DTypeTraits& dtype_traits(DType t) {
  return kDTypeTraits[static_cast<int>(t)];
}
inline constexpr uint32_t dtype_size(DType t) { return dtype_traits(t).size; }
inline constexpr std::string_view dtype_name(DType t) { return dtype_traits(t).name; }

// Parses a safetensors dtype string; nullopt for dtypes ktier does not read.
inline std::optional<DType> parse_dtype(std::string_view s) {
  for (const auto& t : kDTypeTraits)
    if (t.name == s) return t.dtype;
  return std::nullopt;
}

// Exact widenings, one definition with the kernels' (cpu/float_bits.h), and the writers'
// rounding to bf16.
using cpu::float_bits::bf16_to_f32;
using cpu::float_bits::bits_to_f32;
using cpu::float_bits::f16_to_f32;
using cpu::float_bits::f32_to_bf16;
using cpu::float_bits::f32_to_bits;

}  // namespace ktier
