#include "model/model.h"

#include <algorithm>
#include <string>
#include <vector>

#include "common/check.h"
#include "cpu/kernels.h"

namespace ktier::model {

uint64_t SequenceState::bytes() const {
  uint64_t n = 0;
  for (const LayerState& l : layers)
    n += (l.kda.S.size() + l.kda.conv_q.size() + l.kda.conv_k.size() + l.kda.conv_v.size() +
          l.mla.c.capacity() + l.mla.r.capacity()) *
         sizeof(float);
  return n;
}

Model::Model(TrunkSource& trunk, ExpertSource* experts) : trunk_(trunk), experts_(experts) {
  KTIER_CHECK(experts_ != nullptr || config().num_moe_layers() == 0);
}

SequenceState Model::new_sequence() const {
  const format::ModelConfig& c = config();
  SequenceState s;
  s.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  const size_t C = static_cast<size_t>(c.kda_width());
  const size_t hist = static_cast<size_t>(c.short_conv_kernel_size - 1) * C;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.is_mla(l)) continue;  // the MLA cache starts empty
    KdaState& k = s.layers[static_cast<size_t>(l)].kda;
    k.S.assign(static_cast<size_t>(c.kda_num_heads * c.kda_head_dim * c.kda_head_dim), 0.0f);
    k.conv_q.assign(hist, 0.0f);
    k.conv_k.assign(hist, 0.0f);
    k.conv_v.assign(hist, 0.0f);
  }
  return s;
}

Status Model::forward(std::span<const int32_t> ids, SequenceState& state, LogitRows rows,
                      float* logits, const cpu::Exec& ex) {
  const format::ModelConfig& c = config();
  const int64_t T = static_cast<int64_t>(ids.size()), E = c.hidden_size, V = c.vocab_size;
  KTIER_CHECK(rows == LogitRows::kNone || logits != nullptr);
  KTIER_CHECK(state.layers.size() == static_cast<size_t>(c.num_hidden_layers));
  for (int32_t id : ids)
    if (id < 0 || id >= V)
      return Status::usage("token id " + std::to_string(id) + " is outside the vocabulary 0.." +
                           std::to_string(V - 1));
  if (T == 0) return Status::ok();
  const double eps = c.rms_norm_eps;

  // P: the running block partial sum, starting as the embeddings (no scaling, §6.2).
  std::vector<float> P(static_cast<size_t>(T * E));
  KTIER_RETURN_IF_ERROR(trunk_.embed(ids, P.data()));

  // AttnRes over depth (§6.0): the bank holds each finished block's P, oldest first.
  std::vector<std::vector<float>> bank;
  std::vector<const float*> sources;
  auto aggregate = [&](const std::vector<float>& f, std::vector<float>& out) {
    sources.clear();
    for (const auto& b : bank) sources.push_back(b.data());
    sources.push_back(P.data());
    cpu::attnres(sources.data(), static_cast<int>(sources.size()), E, T, E, f.data(), eps,
                 out.data(), ex);
  };
  std::vector<float> mixed(P.size()), x(P.size()), y(P.size());
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    KTIER_ASSIGN_OR_RETURN(const LayerWeights* acquired, trunk_.acquire_layer(l));
    // Released when the layer is done, or on an error return: a streaming source must get its
    // slot back either way.
    struct Lease {
      TrunkSource& trunk;
      int64_t layer;
      ~Lease() { trunk.release_layer(layer); }
    } lease{trunk_, l};
    const LayerWeights& lw = *acquired;
    LayerState& ls = state.layers[static_cast<size_t>(l)];
    // The attention input mixes the OLD bank with P; at a boundary P is then pushed and restarts
    // as the attention output alone (assignment, not 0 + y).
    if (bank.empty())
      mixed = P;
    else
      aggregate(lw.f_attn, mixed);
    const bool boundary = c.is_boundary(l);
    if (boundary) bank.push_back(P);
    cpu::rmsnorm(mixed.data(), lw.input_norm.data(), T, E, eps, x.data(), ex);
    if (lw.is_mla)
      mla_block(lw.mla, c, x.data(), T, ls.mla, y.data(), ex);
    else
      kda_block(lw.kda, c, x.data(), T, ls.kda, y.data(), ex);
    if (boundary)
      P.swap(y);
    else
      cpu::add(P.data(), y.data(), T * E, P.data(), ex);
    if (lookahead_depth_ > 0 && !lookahead_observers_.empty())
      predict(l, state.n_tokens, P, bank, T, ex);
    aggregate(lw.f_mlp, mixed);  // the bank is never empty here
    cpu::rmsnorm(mixed.data(), lw.post_attention_norm.data(), T, E, eps, x.data(), ex);
    if (lw.is_dense) {
      glu_mlp(lw.dense, c, x.data(), T, y.data(), ex);
    } else {
      KTIER_RETURN_IF_ERROR(moe_block(lw.moe, c, l, state.n_tokens, *experts_, routing_observer_,
                                      x.data(), T, y.data(), ex));
    }
    cpu::add(P.data(), y.data(), T * E, P.data(), ex);
    if (layer_observer_) layer_observer_->after_layer(l, P.data(), T, E);
  }
  state.n_tokens += T;
  if (rows == LogitRows::kNone) return Status::ok();

  // Output AttnRes over bank + P, final norm, lm_head (§6.7) for the rows asked for.
  const HeadWeights& head = trunk_.head();
  aggregate(head.f_out, mixed);
  const int64_t first = rows == LogitRows::kLast ? T - 1 : 0, n = T - first;
  cpu::rmsnorm(mixed.data() + first * E, head.final_norm.data(), n, E, eps, x.data(), ex);
  cpu::linear(head.lm_head, x.data(), n, logits, ex);
  return Status::ok();
}

void Model::predict(int64_t l, int64_t first_position, const std::vector<float>& P,
                    const std::vector<std::vector<float>>& bank, int64_t T, const cpu::Exec& ex) {
  const format::ModelConfig& c = config();
  const int64_t E = c.hidden_size, Ne = c.num_experts;
  const int k = static_cast<int>(c.num_experts_per_token);
  std::vector<const float*> sources;
  for (const auto& b : bank) sources.push_back(b.data());
  sources.push_back(P.data());
  std::vector<float> mixed(P.size()), x(P.size()), logits(static_cast<size_t>(T * Ne));
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  std::vector<float> weights(ids.size());
  std::vector<int> order(static_cast<size_t>(k));
  std::vector<int32_t> sorted_ids(ids.size());
  std::vector<float> sorted_weights(ids.size());
  for (int d = 1; d <= lookahead_depth_; ++d) {
    const int64_t t = l + d;
    if (t >= c.num_hidden_layers) break;
    if (c.is_dense(t)) continue;
    const LayerWeights* w = routing_weights_ ? routing_weights_(t) : nullptr;
    if (w == nullptr) continue;
    cpu::attnres(sources.data(), static_cast<int>(sources.size()), E, T, E, w->f_mlp.data(),
                 c.rms_norm_eps, mixed.data(), ex);
    cpu::rmsnorm(mixed.data(), w->post_attention_norm.data(), T, E, c.rms_norm_eps, x.data(), ex);
    cpu::linear(w->moe.router, x.data(), T, logits.data(), ex);
    cpu::router_topk(logits.data(), w->moe.router_bias.data(), T, static_cast<int>(Ne), k,
                     c.moe_renormalize, c.routed_scaling_factor, ids.data(), weights.data(), ex);
    for (int64_t tok = 0; tok < T; ++tok) {  // highest weight first, ties to the lower id
      const int32_t* id = ids.data() + tok * k;
      const float* wt = weights.data() + tok * k;
      for (int i = 0; i < k; ++i) order[static_cast<size_t>(i)] = i;
      std::sort(order.begin(), order.end(), [&](int a, int b) {
        return wt[a] != wt[b] ? wt[a] > wt[b] : id[a] < id[b];
      });
      for (int i = 0; i < k; ++i) {
        sorted_ids[static_cast<size_t>(tok * k + i)] = id[order[static_cast<size_t>(i)]];
        sorted_weights[static_cast<size_t>(tok * k + i)] = wt[order[static_cast<size_t>(i)]];
      }
    }
    for (LookaheadObserver* o : lookahead_observers_)
      o->on_prediction(l, d, first_position, sorted_ids.data(), sorted_weights.data(), T, k);
  }
}

}  // namespace ktier::model
