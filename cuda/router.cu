// Router top-k (block per token) and argmax (one block), NUMERICS.md §10. No f32 sums: the
// selection and the weights are the CPU's double arithmetic.
#include <cfloat>

#include "kernels.cuh"

namespace ktier_cuda {
namespace {

// The CPU's "strictly better" order made total: a beats b if a's score is better (NaN ranks
// below every number), or neither is better (equal, -0 == +0, or both NaN) and a's index is
// lower. The winner of a block reduction under it is the CPU scan's pick.
__device__ __forceinline__ bool beats(double ca, int ia, double cb, int ib) {
  if (ib < 0) return ia >= 0;
  if (ia < 0) return false;
  const bool a_better = !isnan(ca) && (isnan(cb) || ca > cb);
  const bool b_better = !isnan(cb) && (isnan(ca) || cb > ca);
  if (a_better) return true;
  if (b_better) return false;
  return ia < ib;
}

// Dynamic shared memory: s[n], c[n] (double), taken[n] (bytes).
__global__ void router_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
                             int n, int top_k, bool renormalize, double scaling,
                             int32_t* __restrict__ ids, float* __restrict__ weights) {
  extern __shared__ double smem[];
  double* s = smem;
  double* c = smem + n;
  unsigned char* taken = reinterpret_cast<unsigned char*>(c + n);
  __shared__ double red_c[kBlock / 32];
  __shared__ int red_i[kBlock / 32];
  __shared__ int sel[KTIER_CUDA_MAX_TOPK];
  const int64_t t = blockIdx.x;
  const float* lg = logits + t * n;
  for (int e = threadIdx.x; e < n; e += kBlock) {
    s[e] = dsigmoid(D(lg[e]));
    c[e] = bias ? s[e] + D(bias[e]) : s[e];
    taken[e] = 0;
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int j = 0; j < top_k; ++j) {
    double bc = 0.0;
    int bi = -1;
    for (int e = threadIdx.x; e < n; e += kBlock)
      if (!taken[e] && beats(c[e], e, bc, bi)) {
        bc = c[e];
        bi = e;
      }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const double oc = __shfl_xor_sync(0xffffffffu, bc, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (beats(oc, oi, bc, bi)) {
        bc = oc;
        bi = oi;
      }
    }
    if (lane == 0) {
      red_c[warp] = bc;
      red_i[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      double wc = red_c[0];
      int wi = red_i[0];
      for (int w = 1; w < kBlock / 32; ++w)
        if (beats(red_c[w], red_i[w], wc, wi)) {
          wc = red_c[w];
          wi = red_i[w];
        }
      sel[j] = wi;
      taken[wi] = 1;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {  // num::router_weights
    double sum = 0.0;
    for (int j = 0; j < top_k; ++j) sum += s[sel[j]];
    const double denom = sum + 1e-20;
    for (int j = 0; j < top_k; ++j) {
      double w = s[sel[j]];
      if (renormalize && top_k > 1) w = w / denom;
      ids[t * top_k + j] = sel[j];
      weights[t * top_k + j] = F(w * scaling);
    }
  }
}

// One block: each thread scans i = tid, tid + 1024, ... keeping the first strict maximum
// (NaN skipped); then a (value, index) reduction, larger value first, lower index on ties
// (-0 == +0 compare equal). -1 = none; 0 is written when no value is a number.
constexpr int kArgmaxThreads = 1024;
__device__ __forceinline__ void argmax_merge(float& bv, int64_t& bi, float ov, int64_t oi) {
  if (oi < 0) return;
  if (bi < 0 || ov > bv || (ov == bv && oi < bi)) {
    bv = ov;
    bi = oi;
  }
}
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_kernel(const float* __restrict__ x, int64_t n, int64_t* out) {
  __shared__ float rv[kArgmaxThreads / 32];
  __shared__ int64_t ri[kArgmaxThreads / 32];
  float bv = 0.0f;
  int64_t bi = -1;
  for (int64_t i = threadIdx.x; i < n; i += kArgmaxThreads) {
    const float v = x[i];
    if (!isnan(v) && (bi < 0 || v > bv)) {
      bv = v;
      bi = i;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    argmax_merge(bv, bi, ov, oi);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    rv[warp] = bv;
    ri[warp] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / 32; ++w) argmax_merge(bv, bi, rv[w], ri[w]);
    *out = bi < 0 ? 0 : bi;
  }
}

}  // namespace

cudaError_t launch_router(const float* logits, const float* bias, int64_t T, int n_experts,
                          int top_k, bool renormalize, double scaling, int32_t* ids,
                          float* weights, cudaStream_t s) {
  const size_t shmem = static_cast<size_t>(n_experts) * (2 * sizeof(double) + 1);
  const cudaError_t err = allow_dynamic_shared(router_kernel, shmem);
  if (err != cudaSuccess) return err;
  for (int64_t t0 = 0; t0 < T; t0 += 0x7fffffff) {
    const int64_t nt = T - t0 < 0x7fffffff ? T - t0 : 0x7fffffff;
    router_kernel<<<static_cast<unsigned>(nt), kBlock, shmem, s>>>(
        logits + t0 * n_experts, bias, n_experts, top_k, renormalize, scaling, ids + t0 * top_k,
        weights + t0 * top_k);
  }
  return cudaGetLastError();
}

cudaError_t launch_argmax(const float* x, int64_t n, int64_t* out, cudaStream_t s) {
  argmax_kernel<<<1, kArgmaxThreads, 0, s>>>(x, n, out);
  return cudaGetLastError();
}

}  // namespace ktier_cuda
