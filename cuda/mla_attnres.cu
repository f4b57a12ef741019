// MLA attention, absorbed latent form (NUMERICS.md §8), and AttnRes aggregation (§9).
#include "kernels.cuh"

namespace ktier_cuda {
namespace {

constexpr int kWarps = kBlock / 32;

// Score of cache position s for the block's (token, head), computed by one warp: lanes take
// c = lane, lane + 32, ... of the latent part, then of the rope part (f32 FMA, in order), then
// the warp butterfly. Every lane gets the same bits; the same warp recomputes the same position
// in pass B, so both passes see identical scores.
__device__ __forceinline__ double mla_score(const float* q_lat, const float* q_r,
                                            const float* __restrict__ cc,
                                            const float* __restrict__ cr, int L, int dr,
                                            int64_t s, double scale) {
  const int lane = threadIdx.x & 31;
  const float* c = cc + s * L;
  const float* r = cr + s * dr;
  float p = 0.0f;
  for (int i = lane; i < L; i += 32) p = __fmaf_rn(q_lat[i], c[i], p);
  for (int i = lane; i < dr; i += 32) p = __fmaf_rn(q_r[i], r[i], p);
  // __dmul_rn: never contracted with the caller's "- max" into an FMA, so pass B recomputes
  // pass A's score bits exactly.
  return __dmul_rn(D(warp_sum(p)), scale);
}

// Block per (token t, head h), 8 warps. Dynamic shared: q_lat[L], q_r[dr], c_hat[L],
// acc[8][L] (f32).
//  1. q_lat[c] = sum in order i < nope of W_UK[i, c] * q_n[i] (thread per c, f32 FMA).
//  2. Pass A: warp w scores positions s = w, w + 8, ... (mla_score); m = the max (fmax: a NaN
//     score makes every output NaN through Z, as on the CPU).
//  3. Pass B: the same warps recompute the scores; e = exp(score - m) (double); Z = sum of e
//     (double: per warp in order, then the 8 warps in order); acc_w[c] += F(e) * c(s)[c]
//     (f32 FMA). c_hat[c] = F(D(pairwise sum of the 8 acc_w[c]) / Z).
//  4. o[j] = sum_c W_UV[j, c] * c_hat[c]: warp per row j, lanes over c, then the butterfly.
template <class Wt>
__global__ void mla_kernel(KtierCudaMlaDims d, const float* __restrict__ q, const void* kv_b,
                           const float* __restrict__ cache_c, const float* __restrict__ cache_r,
                           int64_t n_past, double scale, float* __restrict__ out) {
  extern __shared__ float sm[];
  const int H = d.n_heads, dn = d.qk_nope, dr = d.qk_rope, dv = d.v_head, L = d.kv_lora;
  float* q_lat = sm;
  float* q_r = q_lat + L;
  float* c_hat = q_r + dr;
  float* acc = c_hat + L;
  __shared__ double red_m[kWarps], red_z[kWarps];
  const int64_t j = blockIdx.x;
  const int64_t t = j / H;
  const int h = static_cast<int>(j % H);
  const int64_t n_pos = n_past + t + 1;
  const float* q_n = q + (t * H + h) * (dn + dr);
  const auto* w = static_cast<const typename Wt::Storage*>(kv_b);
  const typename Wt::Storage* w_uk = w + static_cast<int64_t>(h) * (dn + dv) * L;
  const typename Wt::Storage* w_uv = w_uk + static_cast<int64_t>(dn) * L;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  for (int c = threadIdx.x; c < L; c += kBlock) {
    float a = 0.0f;
    for (int i = 0; i < dn; ++i)
      a = __fmaf_rn(Wt::wide(w_uk[static_cast<int64_t>(i) * L + c]), q_n[i], a);
    q_lat[c] = a;
  }
  for (int i = threadIdx.x; i < dr; i += kBlock) q_r[i] = q_n[dn + i];
  float* acc_w = acc + warp * L;
  for (int c = lane; c < L; c += 32) acc_w[c] = 0.0f;
  __syncthreads();

  double mx = -INFINITY;
  for (int64_t s = warp; s < n_pos; s += kWarps)
    mx = fmax(mx, mla_score(q_lat, q_r, cache_c, cache_r, L, dr, s, scale));
  if (lane == 0) red_m[warp] = mx;
  __syncthreads();
  mx = red_m[0];
  for (int w2 = 1; w2 < kWarps; ++w2) mx = fmax(mx, red_m[w2]);

  double z = 0.0;
  for (int64_t s = warp; s < n_pos; s += kWarps) {
    const double e = exp(mla_score(q_lat, q_r, cache_c, cache_r, L, dr, s, scale) - mx);
    z += e;
    const float pe = F(e);
    const float* cs = cache_c + s * L;
    for (int c = lane; c < L; c += 32) acc_w[c] = __fmaf_rn(pe, cs[c], acc_w[c]);
  }
  if (lane == 0) red_z[warp] = z;
  __syncthreads();
  z = 0.0;
  for (int w2 = 0; w2 < kWarps; ++w2) z += red_z[w2];
  for (int c = threadIdx.x; c < L; c += kBlock) {
    float a[kWarps];
#pragma unroll
    for (int w2 = 0; w2 < kWarps; ++w2) a[w2] = acc[w2 * L + c];
    const float sum = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    c_hat[c] = F(D(sum) / z);
  }
  __syncthreads();

  float* o = out + (t * H + h) * dv;
  for (int r = warp; r < dv; r += kWarps) {
    const typename Wt::Storage* wr = w_uv + static_cast<int64_t>(r) * L;
    float p = 0.0f;
    for (int c = lane; c < L; c += 32) p = __fmaf_rn(Wt::wide(wr[c]), c_hat[c], p);
    p = warp_sum(p);
    if (lane == 0) o[r] = p;
  }
}

struct SrcList {
  const float* v[KTIER_CUDA_MAX_SOURCES];
};

#ifdef KTIER_CUDA_EMULATION  // the host emulation checks the pointers a launch carries
void emulation_check_pointers(const char* kernel, int index, const SrcList& list) {
  for (const float* p : list.v) ktier_emu::check_device_pointer(kernel, index, p);
}
#endif

// Block per token. m == 1: exact copy. Else per source i: ss = sum v^2, vf = sum v*f (each
// thread in order over d = tid, tid + 256, ..., f32 FMA, then block_sum);
// score_i = D(vf) / sqrt(D(ss) / n + eps) (double); softmax over the m scores exactly as
// num::softmax_inplace (thread 0, double); out[d] = F(sum in order i of alpha_i * D(v_i[d]))
// (double, no FMA): the CPU's combine.
__global__ void attnres_kernel(const __grid_constant__ SrcList src, int m, int64_t stride,
                               int64_t n, const float* __restrict__ f, double eps,
                               float* __restrict__ out) {
  __shared__ float red[kWarps];
  __shared__ double score[KTIER_CUDA_MAX_SOURCES];
  const int64_t t = blockIdx.x;
  float* o = out + t * n;
  if (m == 1) {
    const float* v = src.v[0] + t * stride;
    for (int64_t i = threadIdx.x; i < n; i += kBlock) o[i] = v[i];
    return;
  }
  for (int i = 0; i < m; ++i) {
    const float* v = src.v[i] + t * stride;
    float ss = 0.0f, vf = 0.0f;
    for (int64_t k = threadIdx.x; k < n; k += kBlock) {
      ss = __fmaf_rn(v[k], v[k], ss);
      vf = __fmaf_rn(v[k], f[k], vf);
    }
    ss = block_sum(ss, red);
    vf = block_sum(vf, red);
    if (threadIdx.x == 0) score[i] = D(vf) / sqrt(D(ss) / static_cast<double>(n) + eps);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double mx = score[0];
    for (int i = 1; i < m; ++i)
      if (score[i] > mx) mx = score[i];
    double sum = 0.0;
    for (int i = 0; i < m; ++i) {
      score[i] = exp(score[i] - mx);
      sum += score[i];
    }
    for (int i = 0; i < m; ++i) score[i] = score[i] / sum;
  }
  __syncthreads();
  for (int64_t k = threadIdx.x; k < n; k += kBlock) {
    double a = 0.0;
    for (int i = 0; i < m; ++i) a = __dadd_rn(a, __dmul_rn(score[i], D(src.v[i][t * stride + k])));
    o[k] = F(a);
  }
}

template <class Wt>
cudaError_t launch_mla_typed(const KtierCudaMlaDims& d, const float* q, int64_t T,
                             const void* kv_b, const float* cache_c, const float* cache_r,
                             int64_t n_past, double scale, float* out, cudaStream_t s) {
  const size_t shmem = (static_cast<size_t>(kWarps + 2) * d.kv_lora + d.qk_rope) * sizeof(float);
  const cudaError_t err = allow_dynamic_shared(mla_kernel<Wt>, shmem);
  if (err != cudaSuccess) return err;
  const int64_t H = d.n_heads;
  const int64_t per_launch = 0x7fffffff / H;  // tokens per launch (gridDim.x limit)
  for (int64_t t0 = 0; t0 < T; t0 += per_launch) {
    const int64_t nt = T - t0 < per_launch ? T - t0 : per_launch;
    mla_kernel<Wt><<<static_cast<unsigned>(nt * H), kBlock, shmem, s>>>(
        d, q + t0 * H * (d.qk_nope + d.qk_rope), kv_b, cache_c, cache_r, n_past + t0, scale,
        out + t0 * H * d.v_head);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_mla(const KtierCudaMlaDims& d, const float* q, int64_t T,
                       const KtierCudaWeight& kv_b, const float* cache_c, const float* cache_r,
                       int64_t n_past, double scale, float* out, cudaStream_t s) {
  switch (kv_b.type) {
    case KTIER_CUDA_F32:
      return launch_mla_typed<F32W>(d, q, T, kv_b.data, cache_c, cache_r, n_past, scale, out, s);
    case KTIER_CUDA_BF16:
      return launch_mla_typed<Bf16W>(d, q, T, kv_b.data, cache_c, cache_r, n_past, scale, out, s);
    default:
      return launch_mla_typed<F16W>(d, q, T, kv_b.data, cache_c, cache_r, n_past, scale, out, s);
  }
}

cudaError_t launch_attnres(const float* const* src, int m, int64_t src_stride, int64_t T,
                           int64_t n, const float* f, double eps, float* out, cudaStream_t s) {
  SrcList list{};
  for (int i = 0; i < m; ++i) list.v[i] = src[i];
  for (int64_t t0 = 0; t0 < T; t0 += 0x7fffffff) {
    const int64_t nt = T - t0 < 0x7fffffff ? T - t0 : 0x7fffffff;
    SrcList shifted = list;
    for (int i = 0; i < m; ++i) shifted.v[i] = list.v[i] + t0 * src_stride;
    attnres_kernel<<<static_cast<unsigned>(nt), kBlock, 0, s>>>(shifted, m, src_stride, n, f, eps,
                                                                out + t0 * n);
  }
  return cudaGetLastError();
}

}  // namespace ktier_cuda
