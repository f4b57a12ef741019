// Scalar reference kernels for linear layers (NUMERICS.md §3, §4): the ground truth the AVX2
// kernels must reproduce bit for bit.

#include "cpu/kernel_table.h"
#include "cpu/numerics.h"
#include "cpu/ref/ref_kernels.h"

namespace ktier::cpu {
namespace {

template <class W>
void dense_rows_ref(const LinearTask& task, int64_t r0, int64_t r1) {
  const int64_t n = task.w.cols, rows = task.w.rows;
  const auto* w = static_cast<const typename W::Storage*>(task.w.data);
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t t = 0; t < task.n_tokens; ++t) {
      double lane[num::kDotLanes] = {};
      num::dot16_accumulate<W>(lane, w + r * n, task.x_wide + t * n, 0, n);
      task.y[t * rows + r] = num::F(num::tree16(lane));
    }
  }
}

// One MXFP4 row against one token: 8 lanes per 32-block (lane k % 8, k increasing, from +0.0),
// each block's lanes times 2^(s-128) (exact) added into 8 row lanes in block order, tree8.
double mxfp4_row_dot_ref(const uint8_t* packed, const uint8_t* scales, int64_t n, const double* x) {
  double row[8] = {};
  for (int64_t g = 0; g < n / 32; ++g) {
    const uint8_t s = scales[g];
    if (s == num::kE8M0ZeroBlock) continue;
    double block[8] = {};
    for (int k = 0; k < 32; ++k) {
      const uint8_t byte = packed[16 * g + k / 2];
      const int code = (k & 1) ? (byte >> 4) : (byte & 0x0f);
      block[k & 7] += static_cast<double>(num::kE2M1Twice[code]) * x[32 * g + k];
    }
    const double scale = num::kHalfScale.v[s];
    for (int l = 0; l < 8; ++l) row[l] += block[l] * scale;
  }
  return num::tree8(row);
}

void mxfp4_rows_ref(const LinearTask& task, int64_t r0, int64_t r1) {
  const int64_t n = task.w.cols, rows = task.w.rows;
  const auto* packed = static_cast<const uint8_t*>(task.w.data);
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t t = 0; t < task.n_tokens; ++t) {
      const double v = mxfp4_row_dot_ref(packed + r * (n / 2), task.w.scales + r * (n / 32), n,
                                         task.x_wide + t * n);
      task.y[t * rows + r] = num::F(v);
    }
  }
}

}  // namespace

void linear_rows_ref(const LinearTask& task, int64_t r0, int64_t r1, double* /*scratch*/) {
  switch (task.w.type) {
    case WeightType::kF32: return dense_rows_ref<num::F32Weights>(task, r0, r1);
    case WeightType::kBF16: return dense_rows_ref<num::Bf16Weights>(task, r0, r1);
    case WeightType::kF16: return dense_rows_ref<num::F16Weights>(task, r0, r1);
    case WeightType::kMxfp4: return mxfp4_rows_ref(task, r0, r1);
  }
}

}  // namespace ktier::cpu
