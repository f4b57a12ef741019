#include "model/blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/check.h"

namespace ktier::model {

namespace {
constexpr double kL2NormEps = 1e-6;       // KDA q, k L2 norm (decision D4)
constexpr double kMlaLowRankEps = 1e-6;   // q_a_layernorm, kv_a_layernorm (decision D2)
}  // namespace


float* Scratch::floats(int64_t n) {
  if (!status_.is_ok()) return nullptr;
  auto buf = backend::BackendBuffer::allocate(be_, static_cast<size_t>(std::max<int64_t>(n, 1)) *
                                                       sizeof(float));
  if (!buf.is_ok()) {
    status_ = buf.status();
    return nullptr;
  }
  buffers_.push_back(std::move(*buf));
  return buffers_.back().as<float>();
}

Status kda_block(const KdaWeights& w, const format::ModelConfig& c, const float* x, int64_t T,
                 KdaState& st, float* out, backend::Backend& be) {
  const int H = static_cast<int>(c.kda_num_heads), D = static_cast<int>(c.kda_head_dim);
  const int K = static_cast<int>(c.short_conv_kernel_size);
  const int64_t C = static_cast<int64_t>(H) * D, n = T * C;
  Scratch s(be);
  float *q_pre = s.floats(n), *k_pre = s.floats(n), *v_pre = s.floats(n), *g_lin = s.floats(n);
  float *b_lin = s.floats(T * H), *fa = s.floats(T * D);
  float *z = s.floats(n), *q = s.floats(n), *k = s.floats(n), *v = s.floats(n);
  float *beta = s.floats(T * H), *alpha = s.floats(n), *o = s.floats(n);
  KTIER_RETURN_IF_ERROR(s.status());
  const cpu::LinearJob proj[] = {{w.q, x, T, q_pre}, {w.k, x, T, k_pre}, {w.v, x, T, v_pre},
                                 {w.g, x, T, g_lin}, {w.b, x, T, b_lin}, {w.f_a, x, T, fa}};
  KTIER_RETURN_IF_ERROR(be.linear(proj, 6));
  const cpu::LinearJob fb{w.f_b, fa, T, z};
  KTIER_RETURN_IF_ERROR(be.linear(&fb, 1));
  KTIER_RETURN_IF_ERROR(be.kda_short_conv(q_pre, T, C, w.q_conv.data(), K, st.conv_q.data(), q));
  KTIER_RETURN_IF_ERROR(be.kda_short_conv(k_pre, T, C, w.k_conv.data(), K, st.conv_k.data(), k));
  KTIER_RETURN_IF_ERROR(be.kda_short_conv(v_pre, T, C, w.v_conv.data(), K, st.conv_v.data(), v));
  KTIER_RETURN_IF_ERROR(be.l2norm(q, T * H, D, kL2NormEps, q));
  KTIER_RETURN_IF_ERROR(be.l2norm(k, T * H, D, kL2NormEps, k));
  KTIER_RETURN_IF_ERROR(be.sigmoid(b_lin, T * H, beta));
  KTIER_RETURN_IF_ERROR(be.kda_decay_gate(z, T, H, D, w.A_log.data(), w.dt_bias.data(), c.gate_lower_bound,
                             nullptr, alpha));
  KTIER_RETURN_IF_ERROR(be.kda_recurrence(q, k, v, alpha, beta, T, H, D, D,
                             1.0 / std::sqrt(static_cast<double>(D)), st.S.data(), o));
  KTIER_RETURN_IF_ERROR(be.rmsnorm(o, w.o_norm.data(), T * H, D, c.rms_norm_eps, o));
  KTIER_RETURN_IF_ERROR(be.sigmoid_gate(o, g_lin, n, o));
  const cpu::LinearJob oj{w.o, o, T, out};
  return be.linear(&oj, 1);
}

cpu::MlaDims mla_dims(const format::ModelConfig& c) {
  return {static_cast<int>(c.num_attention_heads), static_cast<int>(c.qk_nope_head_dim),
          static_cast<int>(c.qk_rope_head_dim), static_cast<int>(c.v_head_dim),
          static_cast<int>(c.kv_lora_rank)};
}

Status mla_block(const MlaWeights& w, const format::ModelConfig& c, const float* x, int64_t T,
                 MlaCache& cache, float* out, backend::Backend& be) {
  const cpu::MlaDims d = mla_dims(c);
  const int64_t H = d.n_heads, L = d.kv_lora, dr = d.qk_rope, qd = d.qk_nope + d.qk_rope;
  const bool gated = w.g.data != nullptr;
  Scratch s(be);
  float *cq = s.floats(T * c.q_lora_rank), *kv = s.floats(T * (L + dr));
  float* g_lin = gated ? s.floats(T * H * d.v_head) : nullptr;
  float *q = s.floats(T * H * qd), *o = s.floats(T * H * d.v_head);
  KTIER_RETURN_IF_ERROR(s.status());
  const cpu::LinearJob proj[] = {{w.q_a, x, T, cq}, {w.kv_a, x, T, kv}, {w.g, x, T, g_lin}};
  KTIER_RETURN_IF_ERROR(be.linear(proj, gated ? 3 : 2));
  KTIER_RETURN_IF_ERROR(be.rmsnorm(cq, w.q_a_norm.data(), T, c.q_lora_rank, kMlaLowRankEps, cq));
  const cpu::LinearJob qb{w.q_b, cq, T, q};
  KTIER_RETURN_IF_ERROR(be.linear(&qb, 1));
  const int64_t n_past = cache.n;
  KTIER_RETURN_IF_ERROR(cache.c.resize(be, (n_past + T) * L));
  KTIER_RETURN_IF_ERROR(cache.r.resize(be, (n_past + T) * dr));
  for (int64_t t = 0; t < T; ++t) {
    const float* row = kv + t * (L + dr);
    KTIER_RETURN_IF_ERROR(be.copy(cache.c.data() + (n_past + t) * L, row, L * sizeof(float)));
    KTIER_RETURN_IF_ERROR(be.copy(cache.r.data() + (n_past + t) * dr, row + L, dr * sizeof(float)));
  }
  float* c_new = cache.c.data() + n_past * L;
  KTIER_RETURN_IF_ERROR(be.rmsnorm(c_new, w.kv_a_norm.data(), T, L, kMlaLowRankEps, c_new));
  cache.n = n_past + T;
  KTIER_RETURN_IF_ERROR(be.mla_attention(d, q, T, w.kv_b, cache.c.data(), cache.r.data(), n_past,
                            1.0 / std::sqrt(static_cast<double>(qd)), o));
  if (gated) KTIER_RETURN_IF_ERROR(be.sigmoid_gate(o, g_lin, T * H * d.v_head, o));
  const cpu::LinearJob oj{w.o, o, T, out};
  return be.linear(&oj, 1);
}

Status glu_mlp(const GluWeights& w, const format::ModelConfig& c, const float* x, int64_t T,
               float* out, backend::Backend& be) {
  const int64_t I = w.gate.rows;
  Scratch s(be);
  float *a = s.floats(T * I), *b = s.floats(T * I);
  KTIER_RETURN_IF_ERROR(s.status());
  const cpu::LinearJob jobs[] = {{w.gate, x, T, a}, {w.up, x, T, b}};
  KTIER_RETURN_IF_ERROR(be.linear(jobs, 2));
  KTIER_RETURN_IF_ERROR(be.situ_glu(a, b, T * I, c.situ_beta, c.situ_linear_beta, a));
  const cpu::LinearJob dj{w.down, a, T, out};
  return be.linear(&dj, 1);
}

RoutingBuffers routing_buffers(Scratch& s, const format::ModelConfig& c, int64_t T) {
  const int64_t k = c.num_experts_per_token, Ne = c.num_experts;
  return RoutingBuffers{s.floats(RoutingBuffers::floats(T, k, Ne)), T, k, Ne};
}

Status select_experts(const MoeWeights& w, const format::ModelConfig& c, const RoutingBuffers& buf,
                      Routing& host, backend::Backend& be) {
  KTIER_CHECK(buf.k == c.num_experts_per_token && buf.n_experts == c.num_experts);
  KTIER_RETURN_IF_ERROR(be.router_topk(buf.logits(), w.router_bias.data(), buf.T,
                                       static_cast<int>(buf.n_experts), static_cast<int>(buf.k),
                                       c.moe_renormalize, c.routed_scaling_factor,
                                       reinterpret_cast<int32_t*>(buf.ids()), buf.weights()));
  std::vector<float> all(static_cast<size_t>(RoutingBuffers::floats(buf.T, buf.k, buf.n_experts)));
  KTIER_RETURN_IF_ERROR(be.download(all.data(), buf.base, all.size() * sizeof(float)));
  const size_t picks = static_cast<size_t>(buf.T * buf.k);
  host.ids.resize(picks);
  std::memcpy(host.ids.data(), all.data(), picks * sizeof(int32_t));
  host.weights.assign(all.begin() + static_cast<std::ptrdiff_t>(picks),
                      all.begin() + static_cast<std::ptrdiff_t>(2 * picks));
  host.scores.assign(all.begin() + static_cast<std::ptrdiff_t>(2 * picks), all.end());
  return Status::ok();
}

Status check_router_scores(const Routing& host, int64_t n_experts, int64_t layer,
                           int64_t first_position) {
  const std::vector<float>& scores = host.scores;
  for (size_t i = 0; i < scores.size(); ++i) {
    if (std::isfinite(scores[i])) continue;
    const int64_t token = static_cast<int64_t>(i) / n_experts;
    return Status::corrupt(std::string(kNonFiniteRouterScores) + std::to_string(layer) + " (" +
                           router_tensor_name(layer) + ") at position " +
                           std::to_string(first_position + token) + " hold " +
                           (std::isnan(scores[i]) ? "NaN" : "an infinity") + " (expert " +
                           std::to_string(static_cast<int64_t>(i) % n_experts) +
                           "): its weights or the hidden state are not finite; top-k would "
                           "pass over it and change the tokens silently");
  }
  return Status::ok();
}

Status moe_block(const MoeWeights& w, const format::ModelConfig& c, int64_t layer,
                 int64_t first_position, ExpertSource& experts, RoutingObserver* observer,
                 const float* x, const float* shared_out, int64_t T, float* out,
                 backend::Backend& be) {
  KTIER_CHECK(w.has_shared == (shared_out != nullptr));
  const int64_t E = c.hidden_size, lat = c.routed_expert_hidden_size;
  const int64_t I = c.moe_intermediate_size, Ne = c.num_experts;
  const int k = static_cast<int>(c.num_experts_per_token);
  Scratch s(be);
  const RoutingBuffers routing = routing_buffers(s, c, T);
  float* u_in = s.floats(T * lat);
  float *xin = s.floats(T * k * lat), *a1 = s.floats(T * k * I), *a3 = s.floats(T * k * I);
  float *y2 = s.floats(T * k * lat), *u = s.floats(T * lat);
  KTIER_RETURN_IF_ERROR(s.status());
  const cpu::LinearJob first[] = {{w.router, x, T, routing.logits()}, {w.down, x, T, u_in}};
  KTIER_RETURN_IF_ERROR(be.linear(first, 2));
  Routing chosen;
  KTIER_RETURN_IF_ERROR(select_experts(w, c, routing, chosen, be));
  KTIER_RETURN_IF_ERROR(check_router_scores(chosen, Ne, layer, first_position));
  const std::vector<int32_t>& ids = chosen.ids;
  if (observer)
    observer->on_routing(layer, first_position, ids.data(), chosen.weights.data(), T, k);
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
  // Gathered row r holds token src_row[r]'s input; slot (t, j)'s output is y2's row
  // row_of_slot[t * k + j].
  std::vector<int32_t> src_row(static_cast<size_t>(T * k)), row_of_slot(static_cast<size_t>(T * k));
  for (size_t g = 0; g < selected.size(); ++g) {
    const auto& list = users[static_cast<size_t>(selected[g])];
    for (size_t i = 0; i < list.size(); ++i) {
      const int64_t row = row0[g] + static_cast<int64_t>(i);
      src_row[static_cast<size_t>(row)] = static_cast<int32_t>(list[i] / k);
      row_of_slot[static_cast<size_t>(list[i])] = static_cast<int32_t>(row);
    }
  }
  KTIER_RETURN_IF_ERROR(be.gather_rows(u_in, src_row.data(), T * k, lat, xin));
  // Experts run in batches the source can take in one fetch_each (a RAM tier: all of them,
  // streamed through its slots), and within a batch in the groups the source hands over (those
  // in memory first, then each as it lands). Each expert's rows are computed exactly as in one
  // batch, so neither changes a byte.
  const size_t batch = static_cast<size_t>(std::max<int64_t>(1, experts.max_each()));
  std::vector<ExpertWeights> views(std::min(batch, selected.size()));
  std::vector<cpu::LinearJob> jobs;
  for (size_t b0 = 0; b0 < selected.size(); b0 += batch) {
    const size_t b1 = std::min(selected.size(), b0 + batch);
    const auto run_group = [&](std::span<const size_t> group) -> Status {
      jobs.clear();
      for (size_t i : group) {
        const size_t g = b0 + i;
        const int64_t m = row0[g + 1] - row0[g];
        jobs.push_back({views[i].w1, xin + row0[g] * lat, m, a1 + row0[g] * I});
        jobs.push_back({views[i].w3, xin + row0[g] * lat, m, a3 + row0[g] * I});
      }
      KTIER_RETURN_IF_ERROR(be.linear(jobs.data(), static_cast<int>(jobs.size())));
      // SiTU-GLU over each run of consecutive experts' rows (one call for a whole batch handed
      // over at once: a GPU launches one kernel, not one per expert).
      for (size_t k = 0; k < group.size();) {
        size_t e = k + 1;
        while (e < group.size() && group[e] == group[e - 1] + 1) ++e;
        const int64_t r0 = row0[b0 + group[k]], r1 = row0[b0 + group[e - 1] + 1];
        KTIER_RETURN_IF_ERROR(be.situ_glu(a1 + r0 * I, a3 + r0 * I, (r1 - r0) * I, c.situ_beta,
                                          c.situ_linear_beta, a1 + r0 * I));
        k = e;
      }
      jobs.clear();
      for (size_t i : group) {
        const size_t g = b0 + i;
        jobs.push_back({views[i].w2, a1 + row0[g] * I, row0[g + 1] - row0[g], y2 + row0[g] * lat});
      }
      return be.linear(jobs.data(), static_cast<int>(jobs.size()));
    };
    KTIER_RETURN_IF_ERROR(experts.fetch_each(
        layer, std::span<const int32_t>(selected.data() + b0, b1 - b0), views.data(), run_group));
  }

  // Combine per token in its own selection order, whatever order the experts ran in.
  KTIER_RETURN_IF_ERROR(be.weighted_sum(y2, row_of_slot.data(), routing.weights(), T, k, lat, u));
  if (!w.latent_norm.empty())
    KTIER_RETURN_IF_ERROR(be.rmsnorm(u, w.latent_norm.data(), T, lat, c.rms_norm_eps, u));
  const cpu::LinearJob up{w.up, u, T, out};
  KTIER_RETURN_IF_ERROR(be.linear(&up, 1));
  if (shared_out) KTIER_RETURN_IF_ERROR(be.add(out, shared_out, T * E, out));
  return Status::ok();
}


}  // namespace ktier::model
