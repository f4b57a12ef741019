#include "op_bounds.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cross_backend_support.h"

namespace ktier::backend::test {
namespace {

constexpr double u = kUnitRoundoff;

double widen(const HostWeight& w, int64_t r, int64_t c) {
  const int64_t i = r * w.cols + c;
  switch (w.type) {
    case cpu::WeightType::kF32: {
      float f;
      std::memcpy(&f, w.bytes.data() + 4 * i, 4);
      return f;
    }
    case cpu::WeightType::kBF16: {
      uint16_t h;
      std::memcpy(&h, w.bytes.data() + 2 * i, 2);
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    default:  // F16 and MXFP4 are widened by the CPU kernels (linear_bound uses them)
      std::abort();
  }
}

std::vector<double> softmax(std::vector<double> s) {
  const double mx = *std::max_element(s.begin(), s.end());
  double sum = 0;
  for (double& v : s) sum += (v = std::exp(v - mx));
  for (double& v : s) v /= sum;
  return s;
}

}  // namespace

HostWeight HostWeight::random(std::mt19937_64& rng, cpu::WeightType type, int64_t rows,
                              int64_t cols) {
  HostWeight w;
  w.type = type, w.rows = rows, w.cols = cols;
  std::uniform_int_distribution<uint32_t> bits;
  auto sign = [&] { return bits(rng) & 1u; };
  auto mant = [&](int nbits) { return bits(rng) & ((1u << nbits) - 1); };
  auto exp_in = [&](int lo, int hi) { return std::uniform_int_distribution<uint32_t>(lo, hi)(rng); };
  const int64_t n = rows * cols;
  switch (type) {
    case cpu::WeightType::kF32:
      w.bytes.resize(4 * n);
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t b = sign() << 31 | exp_in(118, 128) << 23 | mant(23);
        std::memcpy(w.bytes.data() + 4 * i, &b, 4);
      }
      break;
    case cpu::WeightType::kBF16:
      w.bytes.resize(2 * n);
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t b = static_cast<uint16_t>(sign() << 15 | exp_in(118, 128) << 7 | mant(7));
        std::memcpy(w.bytes.data() + 2 * i, &b, 2);
      }
      break;
    case cpu::WeightType::kF16:
      w.bytes.resize(2 * n);
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t b = static_cast<uint16_t>(sign() << 15 | exp_in(6, 16) << 10 | mant(10));
        std::memcpy(w.bytes.data() + 2 * i, &b, 2);
      }
      break;
    case cpu::WeightType::kMxfp4:
      w.bytes.resize(n / 2);
      for (auto& b : w.bytes) b = static_cast<uint8_t>(bits(rng));
      w.scales.resize(n / 32);
      for (auto& s : w.scales) s = static_cast<uint8_t>(bits(rng) % 16 == 0 ? 255 : exp_in(120, 130));
      break;
  }
  return w;
}

cpu::WeightMatrix HostWeight::view() const {
  return {type, bytes.data(), scales.empty() ? nullptr : scales.data(), rows, cols};
}

HostWeight HostWeight::magnitude() const {
  HostWeight m = *this;
  switch (type) {
    case cpu::WeightType::kF32:
      for (size_t i = 3; i < m.bytes.size(); i += 4) m.bytes[i] &= 0x7f;
      break;
    case cpu::WeightType::kBF16:
    case cpu::WeightType::kF16:
      for (size_t i = 1; i < m.bytes.size(); i += 2) m.bytes[i] &= 0x7f;
      break;
    case cpu::WeightType::kMxfp4:
      for (auto& b : m.bytes) b &= 0x77;  // bit 3 of each nibble is its sign
      break;
  }
  return m;
}

void HostWeight::zero_block_column(int64_t g) {
  for (int64_t r = 0; r < rows; ++r) scales[r * (cols / 32) + g] = 255;
}

namespace {
// rel (|W| |x|) per output.
std::vector<double> magnitude_bound(const HostWeight& w, const std::vector<float>& x, int64_t T,
                                    double rel) {
  // |W| |x| by the CPU kernel itself: its own rounding is far below the bound.
  const HostWeight mw = w.magnitude();
  std::vector<float> mx(x.size()), mag(T * w.rows);
  for (size_t i = 0; i < x.size(); ++i) mx[i] = std::fabs(x[i]);
  cpu::linear(mw.view(), mx.data(), T, mag.data(), cpu::Exec{nullptr, cpu::Isa::kScalar});
  std::vector<double> tol(mag.size());
  for (size_t i = 0; i < mag.size(); ++i) tol[i] = rel * mag[i];
  return tol;
}
}  // namespace

std::vector<double> linear_bound(const HostWeight& w, const std::vector<float>& x, int64_t T) {
  return magnitude_bound(w, x, T, 2 * gamma(static_cast<double>(w.cols) + 2));
}

std::vector<double> cublas_linear_bound(const HostWeight& w, const std::vector<float>& x,
                                        int64_t T) {
  const double chain = static_cast<double>(w.cols + (w.cols + 3) / 4 + 2);
  return magnitude_bound(w, x, T, gamma(2 * chain) + kUnitRoundoff);
}

SplitX split_x_like_cuda(const std::vector<float>& x) {
  const auto truncate = [](float v) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    b &= 0xffff0000u;
    std::memcpy(&v, &b, 4);
    return v;
  };
  SplitX s{x, std::vector<float>(x.size()), std::vector<float>(x.size())};
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) continue;
    s.hi[i] = truncate(x[i]);
    const float r = x[i] - s.hi[i];
    s.mid[i] = truncate(r);
    s.lo[i] = r - s.mid[i];
  }
  return s;
}

std::vector<double> norm_bound(const std::vector<float>& out, int64_t n) {
  std::vector<double> tol(out.size());
  for (size_t i = 0; i < out.size(); ++i)
    tol[i] = 2 * gamma(static_cast<double>(n) + 6) * std::fabs(out[i]);
  return tol;
}

std::vector<double> weighted_sum_bound(const std::vector<std::vector<float>>& vec,
                                       const std::vector<float>& w) {
  const int k = static_cast<int>(w.size());
  std::vector<double> tol(vec.empty() ? 0 : vec[0].size());
  for (size_t i = 0; i < tol.size(); ++i) {
    double mag = 0;
    for (int j = 0; j < k; ++j) mag += std::fabs(double{w[j]} * vec[j][i]);
    tol[i] = 2 * gamma(k + 1) * mag;
  }
  return tol;
}

std::vector<double> short_conv_bound(const std::vector<float>& u, const std::vector<float>& hist,
                                     const std::vector<float>& w, int64_t T, int64_t C, int K) {
  std::vector<double> tol(T * C);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double mag = 0;
      for (int j = 0; j < K; ++j) {
        const int64_t s = t - (K - 1) + j;
        const float v = s >= 0 ? u[s * C + c] : hist[(K - 1 + s) * C + c];
        mag += std::fabs(double{w[c * K + j]} * v);
      }
      tol[t * C + c] = 2.2 * gamma(K + 1) * mag;
    }
  return tol;
}

RecurrenceInputs RecurrenceInputs::random(std::mt19937_64& rng, int64_t T, int H, int Dk,
                                          int Dv) {
  RecurrenceInputs in;
  auto unit_rows = [&](int64_t rows, int d) {
    auto v = random_floats(rng, rows * d, -1.0f, 1.0f);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int i = 0; i < d; ++i) ss += double{v[r * d + i]} * v[r * d + i];
      for (int i = 0; i < d; ++i) v[r * d + i] = static_cast<float>(v[r * d + i] / std::sqrt(ss));
    }
    return v;
  };
  in.q = unit_rows(T * H, Dk);
  in.k = unit_rows(T * H, Dk);
  in.v = random_floats(rng, T * H * Dv, -1.0f, 1.0f);
  in.alpha = random_floats(rng, T * H * Dk, 0.8f, 0.9999f);
  in.beta = random_floats(rng, T * H, 0.01f, 0.99f);
  in.state = random_floats(rng, static_cast<size_t>(H) * Dk * Dv, -0.5f, 0.5f);
  return in;
}

RecurrenceBound recurrence_bound(const RecurrenceInputs& in, int64_t T, int H, int Dk, int Dv,
                                 double q_scale) {
  RecurrenceBound b;
  b.out.assign(T * H * Dv, 0.0);
  b.state.assign(in.state.size(), 0.0);
  std::vector<double> S(Dk * Dv), E(Dk * Dv), uu(Dv), eu(Dv), d(Dv), ed(Dv);
  for (int h = 0; h < H; ++h) {
    for (int64_t i = 0; i < Dk * Dv; ++i) S[i] = in.state[h * Dk * Dv + i], E[i] = 0;
    for (int64_t t = 0; t < T; ++t) {
      const float* q = &in.q[(t * H + h) * Dk];
      const float* k = &in.k[(t * H + h) * Dk];
      const float* al = &in.alpha[(t * H + h) * Dk];
      const float* v = &in.v[(t * H + h) * Dv];
      const double beta = in.beta[t * H + h];
      std::fill(uu.begin(), uu.end(), 0.0);
      std::fill(eu.begin(), eu.end(), 0.0);
      for (int i = 0; i < Dk; ++i)
        for (int j = 0; j < Dv; ++j) {  // decay (an f32 product), then u = S^T k
          double& s = S[i * Dv + j];
          s *= al[i];
          E[i * Dv + j] = al[i] * E[i * Dv + j] + u * std::fabs(s);
          uu[j] += k[i] * s;
          eu[j] += std::fabs(k[i]) * (E[i * Dv + j] + gamma(Dk + 1) * std::fabs(s));
        }
      for (int j = 0; j < Dv; ++j) {
        d[j] = beta * (v[j] - uu[j]);
        ed[j] = beta * eu[j] + gamma(3) * beta * (std::fabs(v[j]) + std::fabs(uu[j]));
      }
      for (int j = 0; j < Dv; ++j) {
        double o = 0, eo = 0;
        for (int i = 0; i < Dk; ++i) {  // delta write, then the output read
          double& s = S[i * Dv + j];
          const double kd = k[i] * d[j];
          E[i * Dv + j] += std::fabs(k[i]) * ed[j] + gamma(2) * (std::fabs(s) + std::fabs(kd));
          s += kd;
          o += q[i] * s;
          eo += std::fabs(q[i]) * (E[i * Dv + j] + gamma(Dk + 2) * std::fabs(s));
        }
        b.out[(t * H + h) * Dv + j] = 2 * q_scale * (eo + u * std::fabs(o));
      }
    }
    for (int64_t i = 0; i < Dk * Dv; ++i) b.state[h * Dk * Dv + i] = 2 * E[i];
  }
  return b;
}

std::vector<double> mla_bound(const cpu::MlaDims& d, const std::vector<float>& q, int64_t T,
                              const HostWeight& kv_b, const std::vector<float>& cache_c,
                              const std::vector<float>& cache_r, int64_t n_past, double scale) {
  const int64_t H = d.n_heads, dn = d.qk_nope, dr = d.qk_rope, dv = d.v_head, L = d.kv_lora;
  std::vector<double> tol(T * H * dv);
  std::vector<double> ql(L), eql(L), ch(L), ech(L);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const float* qn = &q[(t * H + h) * (dn + dr)];
      const float* qr = qn + dn;
      const int64_t uk0 = h * (dn + dv), uv0 = uk0 + dn, N = n_past + t + 1;
      for (int64_t c = 0; c < L; ++c) {
        double v = 0, mag = 0;
        for (int64_t i = 0; i < dn; ++i) {
          v += widen(kv_b, uk0 + i, c) * qn[i];
          mag += std::fabs(widen(kv_b, uk0 + i, c) * qn[i]);
        }
        ql[c] = v, eql[c] = gamma(dn + 1) * mag + u * std::fabs(v);
      }
      std::vector<double> s(N);
      double E = 0;
      for (int64_t p = 0; p < N; ++p) {
        double v = 0, mag = 0, prop = 0;
        for (int64_t c = 0; c < L; ++c) {
          v += ql[c] * cache_c[p * L + c];
          mag += std::fabs(ql[c] * cache_c[p * L + c]);
          prop += eql[c] * std::fabs(cache_c[p * L + c]);
        }
        for (int64_t i = 0; i < dr; ++i) {
          v += double{qr[i]} * cache_r[p * dr + i];
          mag += std::fabs(double{qr[i]} * cache_r[p * dr + i]);
        }
        s[p] = scale * v;
        E = std::max(E, scale * (prop + gamma(L + dr + 2) * mag) + u * std::fabs(s[p]));
      }
      const auto pi = softmax(s);
      const double rel_p = std::expm1(2 * E) + gamma(N + 4) + 4 * u;
      for (int64_t c = 0; c < L; ++c) {
        double v = 0, mag = 0;
        for (int64_t p = 0; p < N; ++p) {
          v += pi[p] * cache_c[p * L + c];
          mag += pi[p] * std::fabs(cache_c[p * L + c]);
        }
        ch[c] = v, ech[c] = (rel_p + gamma(N + 1)) * mag + u * std::fabs(v);
      }
      for (int64_t r = 0; r < dv; ++r) {
        double prop = 0, mag = 0;
        for (int64_t c = 0; c < L; ++c) {
          const double w = std::fabs(widen(kv_b, uv0 + r, c));
          prop += w * ech[c];
          mag += w * std::fabs(ch[c]);
        }
        tol[(t * H + h) * dv + r] = 2 * (prop + gamma(L + 1) * mag);
      }
    }
  return tol;
}

std::vector<double> attnres_bound(const std::vector<std::vector<float>>& src, int64_t stride,
                                  int64_t T, int64_t n, const std::vector<float>& f, double eps) {
  const int m = static_cast<int>(src.size());
  std::vector<double> tol(T * n);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> s(m);
    double E = 0;
    for (int i = 0; i < m; ++i) {
      const float* v = &src[i][t * stride];
      double num = 0, mag = 0, ss = 0;
      for (int64_t j = 0; j < n; ++j) {
        num += double{v[j]} * f[j];
        mag += std::fabs(double{v[j]} * f[j]);
        ss += double{v[j]} * v[j];
      }
      const double den = std::sqrt(ss / n + eps);
      s[i] = num / den;
      E = std::max(E, gamma(n + 1) * mag / den + std::fabs(s[i]) * (gamma(n + 1) + 4 * u));
    }
    const auto p = softmax(s);
    const double rel_p = std::expm1(2 * E) + gamma(m + 4) + 4 * u;
    for (int64_t j = 0; j < n; ++j) {
      double mag = 0;
      for (int i = 0; i < m; ++i) mag += p[i] * std::fabs(src[i][t * stride + j]);
      tol[t * n + j] = 2 * (rel_p + gamma(m + 1)) * mag;
    }
  }
  return tol;
}

}  // namespace ktier::backend::test
