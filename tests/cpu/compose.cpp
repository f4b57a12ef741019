#include "compose.h"

#include <cmath>
#include <map>
#include <stdexcept>

namespace ktier::cpu::test {

OwnedMatrix load_matrix(const Fixture& fx, const std::string& key) {
  const Tensor t = fx.tensor(key);
  OwnedMatrix m;
  m.rows = t.shape.at(0);
  m.cols = t.numel() / m.rows;
  m.data = t.f32();
  return m;
}

std::vector<float> fold_attnres(const std::vector<float>& norm, const std::vector<float>& proj) {
  std::vector<float> f(norm.size());
  for (size_t i = 0; i < f.size(); ++i) f[i] = norm[i] * proj[i];
  return f;
}

// ---- KDA -------------------------------------------------------------------------------------

KdaWeights load_kda(const Fixture& fx, bool layer_names, int H, int D, double g_min, double eps) {
  auto key = [&](const std::string& short_name, const std::string& layer_name) {
    return layer_names ? "self_attn_" + layer_name : short_name;
  };
  KdaWeights w;
  w.H = H;
  w.D = D;
  w.g_min = g_min;
  w.eps = eps;
  w.q = load_matrix(fx, key("q_proj", "q_proj_weight"));
  w.k = load_matrix(fx, key("k_proj", "k_proj_weight"));
  w.v = load_matrix(fx, key("v_proj", "v_proj_weight"));
  w.g = load_matrix(fx, key("g_proj", "g_proj_weight"));
  w.o = load_matrix(fx, key("o_proj", "o_proj_weight"));
  w.b = load_matrix(fx, key("b_proj", "b_proj_weight"));
  w.f_a = load_matrix(fx, key("f_a", "f_a_proj_weight"));
  w.f_b = load_matrix(fx, key("f_b", "f_b_proj_weight"));
  const Tensor qc = fx.tensor(key("q_conv", "q_conv1d_weight"));  // [C, 1, K] or [C, K]
  w.K = static_cast<int>(qc.shape.back());
  w.q_conv = qc.f32();
  w.k_conv = fx.f32(key("k_conv", "k_conv1d_weight"));
  w.v_conv = fx.f32(key("v_conv", "v_conv1d_weight"));
  w.A_log = fx.f32(key("A_log", "A_log"));
  w.dt_bias = fx.f32(key("dt_bias", "dt_bias"));
  w.o_norm = fx.f32(key("o_norm", "o_norm_weight"));
  return w;
}

KdaState KdaState::zeros(const KdaWeights& w) {
  const size_t C = static_cast<size_t>(w.H) * w.D, hist = static_cast<size_t>(w.K - 1) * C;
  KdaState s;
  s.S.assign(static_cast<size_t>(w.H) * w.D * w.D, 0.0f);
  s.hist_q.assign(hist, 0.0f);
  s.hist_k.assign(hist, 0.0f);
  s.hist_v.assign(hist, 0.0f);
  return s;
}

void kda_block(const KdaWeights& w, const float* x, int64_t T, KdaState& st, float* out,
               const Exec& ex) {
  const int H = w.H, D = w.D;
  const int64_t C = static_cast<int64_t>(H) * D, n = T * C;
  std::vector<float> q_pre(n), k_pre(n), v_pre(n), g_lin(n), b_lin(T * H), fa(T * w.f_a.rows);
  const LinearJob proj[] = {{w.q.view(), x, T, q_pre.data()}, {w.k.view(), x, T, k_pre.data()},
                            {w.v.view(), x, T, v_pre.data()}, {w.g.view(), x, T, g_lin.data()},
                            {w.b.view(), x, T, b_lin.data()}, {w.f_a.view(), x, T, fa.data()}};
  linear(proj, 6, ex);  // 1. projections (all read x: one parallel pass)
  std::vector<float> z(n), q(n), k(n), v(n), beta(T * H), alpha(n), o(n), y(n);
  linear(w.f_b.view(), fa.data(), T, z.data(), ex);
  kda_short_conv(q_pre.data(), T, C, w.q_conv.data(), w.K, st.hist_q.data(), q.data(), ex);  // 2.
  kda_short_conv(k_pre.data(), T, C, w.k_conv.data(), w.K, st.hist_k.data(), k.data(), ex);
  kda_short_conv(v_pre.data(), T, C, w.v_conv.data(), w.K, st.hist_v.data(), v.data(), ex);
  constexpr double kL2Eps = 1e-6;                    // D4
  l2norm(q.data(), T * H, D, kL2Eps, q.data(), ex);  // 3-4.
  l2norm(k.data(), T * H, D, kL2Eps, k.data(), ex);
  sigmoid(b_lin.data(), T * H, beta.data(), ex);  // 5.
  kda_decay_gate(z.data(), T, H, D, w.A_log.data(), w.dt_bias.data(), w.g_min, nullptr,
                 alpha.data(), ex);  // 6.
  kda_recurrence(q.data(), k.data(), v.data(), alpha.data(), beta.data(), T, H, D, D,
                 1.0 / std::sqrt(static_cast<double>(D)), st.S.data(), o.data(), ex);  // 7.
  rmsnorm(o.data(), w.o_norm.data(), T * H, D, w.eps, o.data(), ex);                   // 8.
  sigmoid_gate(o.data(), g_lin.data(), n, y.data(), ex);
  linear(w.o.view(), y.data(), T, out, ex);  // 9.
}

// ---- MLA -------------------------------------------------------------------------------------

MlaWeights load_mla(const Fixture& fx, const std::string& prefix, const MlaDims& dims, int q_lora) {
  MlaWeights w;
  w.dims = dims;
  w.q_lora = q_lora;
  w.q_a = load_matrix(fx, prefix + "q_a_proj_weight");
  w.q_b = load_matrix(fx, prefix + "q_b_proj_weight");
  w.kv_a = load_matrix(fx, prefix + "kv_a_proj_with_mqa_weight");
  w.kv_b = load_matrix(fx, prefix + "kv_b_proj_weight");
  w.o = load_matrix(fx, prefix + "o_proj_weight");
  w.g = load_matrix(fx, prefix + "g_proj_weight");
  w.q_a_ln = fx.f32(prefix + "q_a_layernorm_weight");
  w.kv_a_ln = fx.f32(prefix + "kv_a_layernorm_weight");
  return w;
}

void mla_block(const MlaWeights& w, const float* x, int64_t T, MlaCache& cache, float* out,
               const Exec& ex) {
  const MlaDims& d = w.dims;
  const int64_t H = d.n_heads, L = d.kv_lora, dr = d.qk_rope, qd = d.qk_nope + d.qk_rope;
  std::vector<float> cq(T * w.q_lora), kv(T * (L + dr)), g_lin(T * H * d.v_head);
  const LinearJob proj[] = {{w.q_a.view(), x, T, cq.data()},
                            {w.kv_a.view(), x, T, kv.data()},
                            {w.g.view(), x, T, g_lin.data()}};
  linear(proj, 3, ex);
  rmsnorm(cq.data(), w.q_a_ln.data(), T, w.q_lora, kMlaLowRankEps, cq.data(), ex);  // 1.
  std::vector<float> q(T * H * qd);
  linear(w.q_b.view(), cq.data(), T, q.data(), ex);
  const int64_t n_past = cache.n;  // 2. append (c, r) for the T new positions
  cache.c.resize((n_past + T) * L);
  cache.r.resize((n_past + T) * dr);
  for (int64_t t = 0; t < T; ++t) {
    const float* row = kv.data() + t * (L + dr);
    std::copy(row, row + L, cache.c.begin() + (n_past + t) * L);
    std::copy(row + L, row + L + dr, cache.r.begin() + (n_past + t) * dr);
  }
  rmsnorm(cache.c.data() + n_past * L, w.kv_a_ln.data(), T, L, kMlaLowRankEps,
          cache.c.data() + n_past * L, ex);
  cache.n = n_past + T;
  std::vector<float> o(T * H * d.v_head);  // 3-6.
  mla_attention(d, q.data(), T, w.kv_b.view(), cache.c.data(), cache.r.data(), n_past,
                1.0 / std::sqrt(static_cast<double>(qd)), o.data(), ex);
  sigmoid_gate(o.data(), g_lin.data(), static_cast<int64_t>(o.size()), o.data(), ex);  // 7.
  linear(w.o.view(), o.data(), T, out, ex);
}

// ---- MoE -------------------------------------------------------------------------------------

MoeWeights load_moe(const Fixture& fx, const std::string& prefix, int n_experts, int top_k) {
  MoeWeights w;
  w.top_k = top_k;
  w.gate = load_matrix(fx, prefix + "gate_weight");
  w.bias = fx.f32(prefix + "e_score_correction_bias");
  w.down = load_matrix(fx, prefix + "down_weight");
  w.up = load_matrix(fx, prefix + "up_weight");
  w.norm = fx.f32(prefix + "norm_weight");
  w.shared_w1 = load_matrix(fx, prefix + "shared_w1_weight");
  w.shared_w3 = load_matrix(fx, prefix + "shared_w3_weight");
  w.shared_w2 = load_matrix(fx, prefix + "shared_w2_weight");
  for (int e = 0; e < n_experts; ++e) {
    const std::string base = prefix + "experts_" + std::to_string(e) + "_";
    w.w1.push_back(load_matrix(fx, base + "w1_weight"));
    w.w3.push_back(load_matrix(fx, base + "w3_weight"));
    w.w2.push_back(load_matrix(fx, base + "w2_weight"));
  }
  return w;
}

void moe_block(const MoeWeights& w, const float* x, int64_t T, float* out, const Exec& ex,
               std::vector<int32_t>* ids_out) {
  const int64_t E = w.up.rows, lat = w.down.rows, I = w.w1.at(0).rows, Is = w.shared_w1.rows;
  const int n_exp = static_cast<int>(w.w1.size()), k = w.top_k;
  std::vector<float> logits(T * n_exp), u_in(T * lat), sg(T * Is), su(T * Is);
  const LinearJob first[] = {{w.gate.view(), x, T, logits.data()},
                             {w.down.view(), x, T, u_in.data()},
                             {w.shared_w1.view(), x, T, sg.data()},
                             {w.shared_w3.view(), x, T, su.data()}};
  linear(first, 4, ex);
  std::vector<int32_t> ids(T * k);
  std::vector<float> wts(T * k);
  router_topk(logits.data(), w.bias.data(), T, n_exp, k, w.renormalize, w.scaling, ids.data(),
              wts.data(), ex);
  if (ids_out) *ids_out = ids;
  // Group the (token, slot) pairs by expert: each expert's rows are read once for all its tokens.
  std::map<int, std::vector<int64_t>> users;  // expert -> token*k + slot
  for (int64_t p = 0; p < T * k; ++p) users[ids[p]].push_back(p);
  std::vector<std::vector<float>> xin, a1, a3, y2;
  std::vector<LinearJob> jobs;
  for (const auto& [e, list] : users) {
    const int64_t m = static_cast<int64_t>(list.size());
    xin.emplace_back(m * lat);
    for (int64_t i = 0; i < m; ++i)
      std::copy(u_in.begin() + (list[i] / k) * lat, u_in.begin() + (list[i] / k + 1) * lat,
                xin.back().begin() + i * lat);
    a1.emplace_back(m * I);
    a3.emplace_back(m * I);
    y2.emplace_back(m * lat);
  }
  size_t gi = 0;
  for (const auto& [e, list] : users) {
    const int64_t m = static_cast<int64_t>(list.size());
    jobs.push_back({w.w1[e].view(), xin[gi].data(), m, a1[gi].data()});
    jobs.push_back({w.w3[e].view(), xin[gi].data(), m, a3[gi].data()});
    ++gi;
  }
  linear(jobs.data(), static_cast<int>(jobs.size()), ex);
  jobs.clear();
  gi = 0;
  for (const auto& [e, list] : users) {
    situ_glu(a1[gi].data(), a3[gi].data(), static_cast<int64_t>(a1[gi].size()), w.beta1, w.beta2,
             a1[gi].data(), ex);
    jobs.push_back(
        {w.w2[e].view(), a1[gi].data(), static_cast<int64_t>(list.size()), y2[gi].data()});
    ++gi;
  }
  linear(jobs.data(), static_cast<int>(jobs.size()), ex);
  // Combine per token in its selection order, whatever order the experts ran in.
  std::vector<const float*> slot_out(T * k);
  gi = 0;
  for (const auto& [e, list] : users) {
    for (size_t i = 0; i < list.size(); ++i) slot_out[list[i]] = y2[gi].data() + i * lat;
    ++gi;
  }
  std::vector<float> u(T * lat), y_r(T * E), y_s(T * E);
  for (int64_t t = 0; t < T; ++t)
    weighted_sum(slot_out.data() + t * k, wts.data() + t * k, k, lat, u.data() + t * lat, ex);
  if (w.latent_norm) rmsnorm(u.data(), w.norm.data(), T, lat, w.eps, u.data(), ex);
  linear(w.up.view(), u.data(), T, y_r.data(), ex);
  situ_glu(sg.data(), su.data(), T * Is, w.beta1, w.beta2, sg.data(), ex);
  linear(w.shared_w2.view(), sg.data(), T, y_s.data(), ex);
  add(y_r.data(), y_s.data(), T * E, out, ex);
}

// ---- decoder layer ---------------------------------------------------------------------------

void decoder_layer(const LayerWeights& w, int layer_idx, int block_size, double eps, int64_t T,
                   int64_t E, std::vector<float>& P, std::vector<std::vector<float>>& bank,
                   LayerState& st, const Exec& ex) {
  auto aggregate = [&](const std::vector<float>& f, const std::vector<float>& live) {
    std::vector<const float*> src;
    for (const auto& b : bank) src.push_back(b.data());
    src.push_back(live.data());
    std::vector<float> out(T * E);
    attnres(src.data(), static_cast<int>(src.size()), E, T, E, f.data(), eps, out.data(), ex);
    return out;
  };
  std::vector<float> a_in = bank.empty() ? P : aggregate(w.f_attn, P);
  const bool boundary = layer_idx % block_size == 0;
  if (boundary) bank.push_back(P);  // push the finished block; P restarts below
  std::vector<float> x(T * E), y(T * E);
  rmsnorm(a_in.data(), w.input_ln.data(), T, E, eps, x.data(), ex);
  if (w.is_mla)
    mla_block(w.mla, x.data(), T, st.mla, y.data(), ex);
  else
    kda_block(w.kda, x.data(), T, st.kda, y.data(), ex);
  if (boundary)
    P = y;  // assignment, not 0 + y
  else
    add(P.data(), y.data(), T * E, P.data(), ex);
  const std::vector<float> f_in = aggregate(w.f_mlp, P);  // the bank is never empty here
  rmsnorm(f_in.data(), w.post_ln.data(), T, E, eps, x.data(), ex);
  moe_block(w.moe, x.data(), T, y.data(), ex);
  add(P.data(), y.data(), T * E, P.data(), ex);
}

}  // namespace ktier::cpu::test
