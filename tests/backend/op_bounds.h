#pragma once
// Random weights for the cross-backend test, and the per-element error bounds of each op.
//
// Each bound is a running (forward) error bound in the style of Higham, Accuracy and Stability
// of Numerical Algorithms, §3: every f32 sum of d terms contributes gamma(d) * sum|terms|, every
// rounded product or quotient u * |value|, and errors already present propagate through the
// op's own arithmetic (softmax: a score error e changes each weight by at most a factor
// exp(2e)). The bounds hold for any summation order and for f32 or wider accumulation, so they
// describe the CUDA kernels (cuda/README.md) and the CPU reference alike; the difference of the
// two is bounded by twice the bound, which is what the test allows. cuBLAS's prefill, whose
// tensor-core sums neither round to nearest nor add one term at a time, has its own bound
// (cublas_linear_bound).

#include <cstdint>
#include <random>
#include <vector>

#include "backend/backend.h"

namespace ktier::backend::test {

// A weight matrix in host memory, in its stored encoding.
struct HostWeight {
  cpu::WeightType type = cpu::WeightType::kF32;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> bytes;   // elements or MXFP4 packed nibbles
  std::vector<uint8_t> scales;  // MXFP4 only

  // Finite values of moderate size (bf16/f16 exponents near 1, MXFP4 scales near 2^0, with
  // some scale-255 blocks), so that no product overflows or underflows.
  static HostWeight random(std::mt19937_64& rng, cpu::WeightType type, int64_t rows,
                           int64_t cols);
  cpu::WeightMatrix view() const;
  // |W| in the same encoding (sign bits cleared).
  HostWeight magnitude() const;
  // MXFP4: every row's block g gets scale 255 (contributes nothing).
  void zero_block_column(int64_t g);
};

// Linear: 2 gamma(cols + 2) (|W| |x|) per output, for any summation order.
std::vector<double> linear_bound(const HostWeight& w, const std::vector<float>& x, int64_t T);
// Linear through cuBLAS's prefill (cuda/README.md): on tensor cores the f32 accumulation may
// truncate instead of rounding (under 2u a step where a rounded sum costs u) and align each
// group of g products to its largest before adding (each shifted product losing up to 2u of the
// group's magnitude, and one more at the group's normalisation): a chain of cols + cols/g + 2
// at 2u, g = 4 the smallest group reported (Fasi et al. 2021), gamma(2 (cols + ceil(cols/4) +
// 2)), plus the CPU reference's own single rounding, u (|W| |x|).
std::vector<double> cublas_linear_bound(const HostWeight& w, const std::vector<float>& x,
                                        int64_t T);

// What CUDA's prefill path feeds cuBLAS for BF16 weights (T >= 8): x = hi + mid + lo exactly,
// each part x's remainder truncated to bf16 (cuda/cublas_gemm.cu; Inf/NaN in hi alone). The
// device sums W lo, W mid and W hi in f32 and adds them (smallest first): the bound above holds.
struct SplitX {
  std::vector<float> hi, mid, lo;
};
SplitX split_x_like_cuda(const std::vector<float>& x);

// RMSNorm / L2Norm: the sum of squares has relative error gamma(n); the inverse square root,
// the product(s) and the rounding add a few u: 2 gamma(n + 6) |out|.
std::vector<double> norm_bound(const std::vector<float>& out, int64_t n);

// Weighted sum (MoE combine): k products and a sum of k terms: 2 gamma(k + 1) sum_j |w_j v_j|.
std::vector<double> weighted_sum_bound(const std::vector<std::vector<float>>& vec,
                                       const std::vector<float>& w);

// Short conv: SiLU's slope is below 1.1, the sum has K terms: 2.2 gamma(K + 1) sum|w v|.
std::vector<double> short_conv_bound(const std::vector<float>& u, const std::vector<float>& hist,
                                     const std::vector<float>& w, int64_t T, int64_t C, int K);

struct RecurrenceInputs {
  std::vector<float> q, k, v, alpha, beta, state;
  // q, k unit rows (as after the caller's L2 norm), alpha in [0.8, 1), beta in (0, 1).
  static RecurrenceInputs random(std::mt19937_64& rng, int64_t T, int H, int Dk, int Dv);
};
struct RecurrenceBound {
  std::vector<double> out, state;
};
RecurrenceBound recurrence_bound(const RecurrenceInputs& in, int64_t T, int H, int Dk, int Dv,
                                 double q_scale);

std::vector<double> mla_bound(const cpu::MlaDims& d, const std::vector<float>& q, int64_t T,
                              const HostWeight& kv_b, const std::vector<float>& cache_c,
                              const std::vector<float>& cache_r, int64_t n_past, double scale);

std::vector<double> attnres_bound(const std::vector<std::vector<float>>& src, int64_t stride,
                                  int64_t T, int64_t n, const std::vector<float>& f, double eps);

}  // namespace ktier::backend::test
