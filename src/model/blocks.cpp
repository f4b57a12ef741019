#include "model/blocks.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/kernels.h"

namespace ktier::model {

namespace {
constexpr double kL2NormEps = 1e-6;       // KDA q, k L2 norm (decision D4)
constexpr double kMlaLowRankEps = 1e-6;   // q_a_layernorm, kv_a_layernorm (decision D2)

std::vector<float> buffer(int64_t n) { return std::vector<float>(static_cast<size_t>(n)); }
}  // namespace

void kda_block(const KdaWeights& w, const format::ModelConfig& c, const float* x, int64_t T,
               KdaState& st, float* out, const cpu::Exec& ex) {
  const int H = static_cast<int>(c.kda_num_heads), D = static_cast<int>(c.kda_head_dim);
  const int K = static_cast<int>(c.short_conv_kernel_size);
  const int64_t C = static_cast<int64_t>(H) * D, n = T * C;
  auto q_pre = buffer(n), k_pre = buffer(n), v_pre = buffer(n), g_lin = buffer(n);
  auto b_lin = buffer(T * H), fa = buffer(T * D);
  const cpu::LinearJob proj[] = {{w.q, x, T, q_pre.data()}, {w.k, x, T, k_pre.data()},
                                 {w.v, x, T, v_pre.data()}, {w.g, x, T, g_lin.data()},
                                 {w.b, x, T, b_lin.data()}, {w.f_a, x, T, fa.data()}};
  cpu::linear(proj, 6, ex);
  auto z = buffer(n), q = buffer(n), k = buffer(n), v = buffer(n), beta = buffer(T * H);
  auto alpha = buffer(n), o = buffer(n);
  cpu::linear(w.f_b, fa.data(), T, z.data(), ex);
  cpu::kda_short_conv(q_pre.data(), T, C, w.q_conv.data(), K, st.conv_q.data(), q.data(), ex);
  cpu::kda_short_conv(k_pre.data(), T, C, w.k_conv.data(), K, st.conv_k.data(), k.data(), ex);
  cpu::kda_short_conv(v_pre.data(), T, C, w.v_conv.data(), K, st.conv_v.data(), v.data(), ex);
  cpu::l2norm(q.data(), T * H, D, kL2NormEps, q.data(), ex);
  cpu::l2norm(k.data(), T * H, D, kL2NormEps, k.data(), ex);
  cpu::sigmoid(b_lin.data(), T * H, beta.data(), ex);
  cpu::kda_decay_gate(z.data(), T, H, D, w.A_log.data(), w.dt_bias.data(), c.gate_lower_bound,
                      nullptr, alpha.data(), ex);
  cpu::kda_recurrence(q.data(), k.data(), v.data(), alpha.data(), beta.data(), T, H, D, D,
                      1.0 / std::sqrt(static_cast<double>(D)), st.S.data(), o.data(), ex);
  cpu::rmsnorm(o.data(), w.o_norm.data(), T * H, D, c.rms_norm_eps, o.data(), ex);
  cpu::sigmoid_gate(o.data(), g_lin.data(), n, o.data(), ex);
  cpu::linear(w.o, o.data(), T, out, ex);
}

void mla_block(const MlaWeights& w, const format::ModelConfig& c, const float* x, int64_t T,
               MlaCache& cache, float* out, const cpu::Exec& ex) {
  const cpu::MlaDims d{static_cast<int>(c.num_attention_heads),
                       static_cast<int>(c.qk_nope_head_dim), static_cast<int>(c.qk_rope_head_dim),
                       static_cast<int>(c.v_head_dim), static_cast<int>(c.kv_lora_rank)};
  const int64_t H = d.n_heads, L = d.kv_lora, dr = d.qk_rope, qd = d.qk_nope + d.qk_rope;
  const bool gated = w.g.data != nullptr;
  auto cq = buffer(T * c.q_lora_rank), kv = buffer(T * (L + dr));
  auto g_lin = buffer(gated ? T * H * d.v_head : 0);
  const cpu::LinearJob proj[] = {{w.q_a, x, T, cq.data()},
                                 {w.kv_a, x, T, kv.data()},
                                 {w.g, x, T, g_lin.data()}};
  cpu::linear(proj, gated ? 3 : 2, ex);
  cpu::rmsnorm(cq.data(), w.q_a_norm.data(), T, c.q_lora_rank, kMlaLowRankEps, cq.data(), ex);
  auto q = buffer(T * H * qd);
  cpu::linear(w.q_b, cq.data(), T, q.data(), ex);
  const int64_t n_past = cache.n;
  cache.c.resize(static_cast<size_t>((n_past + T) * L));
  cache.r.resize(static_cast<size_t>((n_past + T) * dr));
  for (int64_t t = 0; t < T; ++t) {
    const float* row = kv.data() + t * (L + dr);
    std::copy(row, row + L, cache.c.begin() + (n_past + t) * L);
    std::copy(row + L, row + L + dr, cache.r.begin() + (n_past + t) * dr);
  }
  float* c_new = cache.c.data() + n_past * L;
  cpu::rmsnorm(c_new, w.kv_a_norm.data(), T, L, kMlaLowRankEps, c_new, ex);
  cache.n = n_past + T;
  auto o = buffer(T * H * d.v_head);
  cpu::mla_attention(d, q.data(), T, w.kv_b, cache.c.data(), cache.r.data(), n_past,
                     1.0 / std::sqrt(static_cast<double>(qd)), o.data(), ex);
  if (gated)
    cpu::sigmoid_gate(o.data(), g_lin.data(), static_cast<int64_t>(o.size()), o.data(), ex);
  cpu::linear(w.o, o.data(), T, out, ex);
}

void glu_mlp(const GluWeights& w, const format::ModelConfig& c, const float* x, int64_t T,
             float* out, const cpu::Exec& ex) {
  const int64_t I = w.gate.rows;
  auto a = buffer(T * I), b = buffer(T * I);
  const cpu::LinearJob jobs[] = {{w.gate, x, T, a.data()}, {w.up, x, T, b.data()}};
  cpu::linear(jobs, 2, ex);
  cpu::situ_glu(a.data(), b.data(), T * I, c.situ_beta, c.situ_linear_beta, a.data(), ex);
  cpu::linear(w.down, a.data(), T, out, ex);
}

Status moe_block(const MoeWeights& w, const format::ModelConfig& c, int64_t layer,
                 int64_t first_position, ExpertSource& experts, RoutingObserver* observer,
                 const float* x, int64_t T, float* out, const cpu::Exec& ex) {
  const int64_t E = c.hidden_size, lat = c.routed_expert_hidden_size;
  const int64_t I = c.moe_intermediate_size, Ne = c.num_experts;
  const int k = static_cast<int>(c.num_experts_per_token);
  auto logits = buffer(T * Ne), u_in = buffer(T * lat);
  const cpu::LinearJob first[] = {{w.router, x, T, logits.data()}, {w.down, x, T, u_in.data()}};
  cpu::linear(first, 2, ex);
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  auto weights = buffer(T * k);
  cpu::router_topk(logits.data(), w.router_bias.data(), T, static_cast<int>(Ne), k,
                   c.moe_renormalize, c.routed_scaling_factor, ids.data(), weights.data(), ex);
  if (observer) observer->on_routing(layer, first_position, ids.data(), weights.data(), T, k);
  experts.begin_layer(layer, first_position, ids.data(), T, k);

  // Group the (token, slot) pairs by expert, experts in ascending id order: each selected
  // expert is fetched once and its rows are read once for all the tokens that chose it.
  std::vector<std::vector<int64_t>> users(static_cast<size_t>(Ne));  // expert -> token*k + slot
  for (int64_t p = 0; p < T * k; ++p) users[static_cast<size_t>(ids[p])].push_back(p);
  std::vector<int32_t> selected;
  for (int64_t e = 0; e < Ne; ++e)
    if (!users[static_cast<size_t>(e)].empty()) selected.push_back(static_cast<int32_t>(e));
  // Per selected expert g: its m_g gathered input rows, then W1/W3, SiTU-GLU, W2.
  std::vector<int64_t> row0(selected.size() + 1, 0);  // first gathered row of each expert
  for (size_t g = 0; g < selected.size(); ++g)
    row0[g + 1] = row0[g] + static_cast<int64_t>(users[static_cast<size_t>(selected[g])].size());
  const int64_t rows = row0.back();  // = T * k
  auto xin = buffer(rows * lat), a1 = buffer(rows * I), a3 = buffer(rows * I);
  auto y2 = buffer(rows * lat);
  std::vector<const float*> slot_out(static_cast<size_t>(T * k));
  for (size_t g = 0; g < selected.size(); ++g) {
    const auto& list = users[static_cast<size_t>(selected[g])];
    for (size_t i = 0; i < list.size(); ++i) {
      const float* src = u_in.data() + (list[i] / k) * lat;
      std::copy(src, src + lat, xin.begin() + (row0[g] + static_cast<int64_t>(i)) * lat);
      slot_out[static_cast<size_t>(list[i])] =
          y2.data() + (row0[g] + static_cast<int64_t>(i)) * lat;
    }
  }
  // Experts run in batches the source can hold at once (a RAM tier's slot count); each
  // expert's rows are computed exactly as in one batch, so the batching changes no byte.
  const size_t batch = static_cast<size_t>(std::max<int64_t>(1, experts.max_batch()));
  std::vector<ExpertWeights> views(std::min(batch, selected.size()));
  std::vector<cpu::LinearJob> jobs;
  for (size_t b0 = 0; b0 < selected.size(); b0 += batch) {
    const size_t b1 = std::min(selected.size(), b0 + batch);
    KTIER_RETURN_IF_ERROR(experts.fetch(
        layer, std::span<const int32_t>(selected.data() + b0, b1 - b0), views.data()));
    jobs.clear();
    for (size_t g = b0; g < b1; ++g) {
      const int64_t m = row0[g + 1] - row0[g];
      jobs.push_back({views[g - b0].w1, xin.data() + row0[g] * lat, m, a1.data() + row0[g] * I});
      jobs.push_back({views[g - b0].w3, xin.data() + row0[g] * lat, m, a3.data() + row0[g] * I});
    }
    cpu::linear(jobs.data(), static_cast<int>(jobs.size()), ex);
    const int64_t r0 = row0[b0], r1 = row0[b1];
    cpu::situ_glu(a1.data() + r0 * I, a3.data() + r0 * I, (r1 - r0) * I, c.situ_beta,
                  c.situ_linear_beta, a1.data() + r0 * I, ex);
    jobs.clear();
    for (size_t g = b0; g < b1; ++g)
      jobs.push_back({views[g - b0].w2, a1.data() + row0[g] * I, row0[g + 1] - row0[g],
                      y2.data() + row0[g] * lat});
    cpu::linear(jobs.data(), static_cast<int>(jobs.size()), ex);
  }

  // Combine per token in its own selection order, whatever order the experts ran in.
  auto u = buffer(T * lat);
  for (int64_t t = 0; t < T; ++t)
    cpu::weighted_sum(slot_out.data() + t * k, weights.data() + t * k, k, lat, u.data() + t * lat,
                      ex);
  if (!w.latent_norm.empty())
    cpu::rmsnorm(u.data(), w.latent_norm.data(), T, lat, c.rms_norm_eps, u.data(), ex);
  cpu::linear(w.up, u.data(), T, out, ex);
  if (w.has_shared) {
    auto shared = buffer(T * E);
    glu_mlp(w.shared, c, x, T, shared.data(), ex);
    cpu::add(out, shared.data(), T * E, out, ex);
  }
  return Status::ok();
}

}  // namespace ktier::model
