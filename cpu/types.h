#pragma once
// Plain descriptors shared by the kernel API (cpu/kernels.h) and the kernels themselves.
// Header-only PODs with no standard-library dependencies (the AVX2 translation units include it).

#include <cstdint>

namespace ktier::cpu {

// ---------------------------------------------------------------------------------------------
// Weights

enum class WeightType : uint8_t {
  kF32,    // float32, row-major [rows, cols]
  kBF16,   // bfloat16 bit patterns (uint16), row-major [rows, cols]
  kF16,    // IEEE binary16 bit patterns (uint16), row-major [rows, cols]
  kMxfp4,  // compressed-tensors MXFP4 (K3-MODEL §7): packed U8 [rows, cols/2], low nibble =
           // even column; scales U8 [rows, cols/32], E8M0 bias 127; scale 255 = zero block
};

// MXFP4's layout: kMxfp4Group columns share one E8M0 scale byte; two columns per packed byte.
inline constexpr int64_t kMxfp4Group = 32;

// Bytes of `cols` stored elements of one row (MXFP4: the packed nibbles; REQUIRES cols even),
// and of the row's MXFP4 scales (0 for the float types). The one place the layout is sized.
constexpr int64_t weight_row_data_bytes(WeightType type, int64_t cols) {
  switch (type) {
    case WeightType::kF32: return 4 * cols;
    case WeightType::kBF16:
    case WeightType::kF16: return 2 * cols;
    case WeightType::kMxfp4: return cols / 2;
  }
  return 4 * cols;
}
constexpr int64_t weight_row_scale_bytes(WeightType type, int64_t cols) {
  return type == WeightType::kMxfp4 ? cols / kMxfp4Group : 0;
}

// A borrowed view of one weight matrix. Nothing is copied or widened ahead of time: the kernels
// widen BF16/F16 and decode MXFP4 straight from these bytes, inside the dot products.
struct WeightMatrix {
  WeightType type = WeightType::kF32;
  const void* data = nullptr;       // the element array, or MXFP4's packed bytes
  const uint8_t* scales = nullptr;  // MXFP4 only: [rows, cols/32] E8M0 bytes
  int64_t rows = 0;
  int64_t cols = 0;  // logical input width; MXFP4 REQUIRES cols % 32 == 0
};

// Shapes of one MLA layer (K3: 96 heads, nope 128, rope 64, v 128, kv_lora 512).
struct MlaDims {
  int n_heads = 0, qk_nope = 0, qk_rope = 0, v_head = 0, kv_lora = 0;
};

}  // namespace ktier::cpu
