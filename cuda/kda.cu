// KDA pieces (NUMERICS.md §7): short conv (thread per channel, sequential in t), decay gate
// (elementwise), delta-rule recurrence (thread per (head, value column), sequential in t).
#include "kernels.cuh"

namespace ktier_cuda {
namespace {

// Thread per channel c. y = sum in order j of D(w[c, j]) * D(v_j) in double (exact products),
// out = F(SiLU(y)): the CPU's arithmetic. Then the new history = the last K-1 of
// (old history ++ u): entry q reads old entry q + T (> q, not yet overwritten) or u.
__global__ void short_conv_kernel(const float* __restrict__ u, int64_t T, int64_t C,
                                  const float* __restrict__ w, int K, float* history,
                                  float* __restrict__ out) {
  const int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t hist = K - 1;
  for (int64_t t = 0; t < T; ++t) {
    double y = 0.0;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t s = t - hist + j;  // token index; negative = carried history
      const float v = s >= 0 ? u[s * C + c] : history[(hist + s) * C + c];
      y = __dadd_rn(y, __dmul_rn(D(w[c * K + j]), D(v)));
    }
    out[t * C + c] = F(__dmul_rn(y, dsigmoid(y)));
  }
  for (int64_t q = 0; q < hist; ++q) {
    const int64_t s = T - hist + q;
    history[q * C + c] = s >= 0 ? u[s * C + c] : history[(q + T) * C + c];
  }
}

// A_h = exp(D(A_log[h])) (double, never rounded); g = g_min * sigmoid(A_h * (z + dt_bias));
// outputs F(g) and F(exp(g)).
__global__ void decay_gate_kernel(const float* z, int64_t total, int H, int D_, const float* A_log,
                                  const float* dt_bias, double g_min, float* g, float* alpha) {
  const int64_t HD = static_cast<int64_t>(H) * D_;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t c = e % HD, h = c / D_;
    const double A = exp(D(A_log[h]));
    const double gv = g_min * dsigmoid(A * (D(z[e]) + D(dt_bias[c])));
    if (g) g[e] = F(gv);
    alpha[e] = F(exp(gv));
  }
}

// Block (head h, 128 value columns); thread = column j of S[h] (Dk x Dv, row i = key channel),
// which it alone reads and writes, so no synchronisation. Per token t:
//   S[i][j] = alpha[i] * S[i][j] (f32 product); u = sum_i k[i] * S[i][j] (f32 FMA, in order i);
//   d = D(beta) * (D(v[j]) - D(u)) (double); S[i][j] = F(D(S) + D(k[i]) * d) (double product,
//   then double sum: no FMA, as the CPU); o = sum_i q[i] * S[i][j] (f32 FMA, in order i);
//   out[j] = F(q_scale * D(o)).
constexpr int kRecCols = 128;
__global__ void recurrence_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                  const float* __restrict__ v, const float* __restrict__ alpha,
                                  const float* __restrict__ beta, int64_t T, int H, int Dk, int Dv,
                                  double q_scale, float* __restrict__ state,
                                  float* __restrict__ out) {
  const int h = blockIdx.x;
  const int j = blockIdx.y * kRecCols + threadIdx.x;
  if (j >= Dv) return;
  float* S = state + static_cast<int64_t>(h) * Dk * Dv + j;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t th = t * H + h;
    const float* qt = q + th * Dk;
    const float* kt = k + th * Dk;
    const float* at = alpha + th * Dk;
    float u = 0.0f;
    for (int i = 0; i < Dk; ++i) {
      const float s = __fmul_rn(at[i], S[static_cast<int64_t>(i) * Dv]);
      S[static_cast<int64_t>(i) * Dv] = s;
      u = __fmaf_rn(kt[i], s, u);
    }
    const double d = D(beta[th]) * (D(v[th * Dv + j]) - D(u));
    float o = 0.0f;
    for (int i = 0; i < Dk; ++i) {
      float* p = S + static_cast<int64_t>(i) * Dv;
      const float s = F(__dadd_rn(D(*p), __dmul_rn(D(kt[i]), d)));
      *p = s;
      o = __fmaf_rn(qt[i], s, o);
    }
    out[th * Dv + j] = F(q_scale * D(o));
  }
}

}  // namespace

cudaError_t launch_short_conv(const float* u, int64_t T, int64_t C, const float* w, int K,
                              float* history, float* out, cudaStream_t s) {
  const int64_t blocks = (C + kBlock - 1) / kBlock;
  short_conv_kernel<<<static_cast<unsigned>(blocks), kBlock, 0, s>>>(u, T, C, w, K, history, out);
  return cudaGetLastError();
}

cudaError_t launch_decay_gate(const float* z, int64_t T, int H, int D_, const float* A_log,
                              const float* dt_bias, double g_min, float* g, float* alpha,
                              cudaStream_t s) {
  const int64_t total = T * H * static_cast<int64_t>(D_);
  decay_gate_kernel<<<grid_for(total), kBlock, 0, s>>>(z, total, H, D_, A_log, dt_bias, g_min, g,
                                                       alpha);
  return cudaGetLastError();
}

cudaError_t launch_recurrence(const float* q, const float* k, const float* v, const float* alpha,
                              const float* beta, int64_t T, int H, int Dk, int Dv, double q_scale,
                              float* state, float* out, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(H), static_cast<unsigned>((Dv + kRecCols - 1) / kRecCols));
  const int threads = Dv < kRecCols ? (Dv + 31) / 32 * 32 : kRecCols;
  recurrence_kernel<<<grid, threads, 0, s>>>(q, k, v, alpha, beta, T, H, Dk, Dv, q_scale, state,
                                             out);
  return cudaGetLastError();
}

}  // namespace ktier_cuda
