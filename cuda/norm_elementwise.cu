// RMSNorm, L2Norm (block per row) and the elementwise ops (grid-stride loops). Per-element
// formulas in double as on the CPU (NUMERICS.md §5, §6), one rounding to f32; the norms' sum of
// squares is an f32 block reduction (cuda/README.md).
#include "kernels.cuh"

namespace ktier_cuda {
namespace {

// One block per row. ss: each thread sums x[i]^2 for i = tid, tid + 256, ... (f32 FMA, in
// order), then block_sum. inv = 1 / sqrt(D(ss) / n + eps) (l2: D(ss) + eps) in double.
// out may alias x: each thread rewrites only the elements it read, after the reduction.
__global__ void norm_kernel(const float* x, const float* gain,
                            int64_t n, double eps, bool l2, float* out) {
  __shared__ float red[kBlock / 32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kBlock) ss = __fmaf_rn(xr[i], xr[i], ss);
  ss = block_sum(ss, red);
  const double m = l2 ? D(ss) : D(ss) / static_cast<double>(n);
  const double inv = 1.0 / sqrt(m + eps);
  float* o = out + r * n;
  for (int64_t i = threadIdx.x; i < n; i += kBlock) {
    double v = D(xr[i]) * inv;
    if (gain) v = v * D(gain[i]);
    o[i] = F(v);
  }
}

__global__ void situ_glu_kernel(const float* a, const float* b, int64_t n, double beta1,
                                bool cap_up, double beta2, float* out) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const double av = D(a[i]), bv = D(b[i]);
    const double gate = (beta1 * tanh(av / beta1)) * dsigmoid(av);
    const double up = cap_up ? beta2 * tanh(bv / beta2) : bv;
    out[i] = F(gate * up);
  }
}

// gate == nullptr: out = F(sigmoid(x)); else out = F(x * sigmoid(gate)).
__global__ void sigmoid_kernel(const float* x, const float* gate, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    out[i] = gate ? F(D(x[i]) * dsigmoid(D(gate[i]))) : F(dsigmoid(D(x[i])));
  }
}

__global__ void add_kernel(const float* a, const float* b, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = __fadd_rn(a[i], b[i]);
}

// Row indices travel in kernel parameters (no host-to-device copy, no sync): at most
// kIndexParams per launch, which keeps the parameter block under the classic 4 KiB limit.
constexpr int kIndexParams = 960;
struct IndexList {
  int32_t row[kIndexParams];
};

// Tokens t0 + blockIdx.y: the CPU's sum exactly: double, j order, exact products
// (bit-identical). idx holds the chunk's row indices, token-major.
__global__ void weighted_sum_kernel(const float* rows, const __grid_constant__ IndexList idx,
                                    const float* weight, int64_t t0, int k, int64_t n,
                                    float* out) {
  const int64_t t = blockIdx.y;
  const float* w = weight + (t0 + t) * k;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    double acc = 0.0;
    for (int j = 0; j < k; ++j) acc = acc + D(w[j]) * D(rows[idx.row[t * k + j] * n + i]);
    out[(t0 + t) * n + i] = F(acc);
  }
}

__global__ void gather_rows_kernel(const float* src, const __grid_constant__ IndexList idx,
                                   int64_t r0, int64_t n, float* dst) {
  const int64_t r = blockIdx.y;
  const float* from = src + idx.row[r] * n;
  float* to = dst + (r0 + r) * n;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    to[i] = from[i];
}

}  // namespace

cudaError_t launch_norm(const float* x, const float* gain, int64_t rows, int64_t n, double eps,
                        bool l2, float* out, cudaStream_t s) {
  for (int64_t r0 = 0; r0 < rows; r0 += 0x7fffffff) {  // gridDim.x limit
    const int64_t nr = rows - r0 < 0x7fffffff ? rows - r0 : 0x7fffffff;
    norm_kernel<<<static_cast<unsigned>(nr), kBlock, 0, s>>>(x + r0 * n, gain, n, eps, l2,
                                                              out + r0 * n);
  }
  return cudaGetLastError();
}

cudaError_t launch_situ_glu(const float* a, const float* b, int64_t n, double beta1, bool cap_up,
                            double beta2, float* out, cudaStream_t s) {
  situ_glu_kernel<<<grid_for(n), kBlock, 0, s>>>(a, b, n, beta1, cap_up, beta2, out);
  return cudaGetLastError();
}

cudaError_t launch_sigmoid(const float* x, const float* gate, int64_t n, float* out,
                           cudaStream_t s) {
  sigmoid_kernel<<<grid_for(n), kBlock, 0, s>>>(x, gate, n, out);
  return cudaGetLastError();
}

cudaError_t launch_add(const float* a, const float* b, int64_t n, float* out, cudaStream_t s) {
  add_kernel<<<grid_for(n), kBlock, 0, s>>>(a, b, n, out);
  return cudaGetLastError();
}

cudaError_t launch_weighted_sum(const float* rows, const int32_t* row_of, const float* weight,
                                int64_t T, int k, int64_t n, float* out, cudaStream_t s) {
  if (k == 0) {  // an empty sum: zeros
    return cudaMemsetAsync(out, 0, static_cast<size_t>(T * n) * sizeof(float), s);
  }
  const int64_t per_launch = kIndexParams / k;  // tokens whose indices fit one parameter block
  for (int64_t t0 = 0; t0 < T; t0 += per_launch) {
    const int64_t nt = T - t0 < per_launch ? T - t0 : per_launch;
    IndexList idx{};
    for (int64_t i = 0; i < nt * k; ++i) idx.row[i] = row_of[t0 * k + i];
    const dim3 grid(grid_for(n), static_cast<unsigned>(nt));
    weighted_sum_kernel<<<grid, kBlock, 0, s>>>(rows, idx, weight, t0, k, n, out);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t launch_gather_rows(const float* src, const int32_t* row_of, int64_t rows, int64_t n,
                               float* dst, cudaStream_t s) {
  for (int64_t r0 = 0; r0 < rows; r0 += kIndexParams) {
    const int64_t nr = rows - r0 < kIndexParams ? rows - r0 : kIndexParams;
    IndexList idx{};
    for (int64_t i = 0; i < nr; ++i) idx.row[i] = row_of[r0 + i];
    const dim3 grid(grid_for(n), static_cast<unsigned>(nr));
    gather_rows_kernel<<<grid, kBlock, 0, s>>>(src, idx, r0, n, dst);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace ktier_cuda
