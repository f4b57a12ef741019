#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/check.h"
#include "cpu/fp_control.h"

namespace ktier::model {

uint64_t SequenceState::bytes() const {
  uint64_t n = 0;
  for (const LayerState& l : layers)
    n += static_cast<uint64_t>(l.kda.S.capacity() + l.kda.conv_q.capacity() +
                               l.kda.conv_k.capacity() + l.kda.conv_v.capacity() +
                               l.mla.c.capacity() + l.mla.r.capacity()) *
         sizeof(float);
  return n;
}

Model::Model(TrunkSource& trunk, ExpertSource* experts, backend::Backend& backend)
    : trunk_(trunk), experts_(experts), be_(backend) {
  KTIER_CHECK(experts_ != nullptr || config().num_moe_layers() == 0);
}

WorkingSet working_set(const format::ModelConfig& c, int64_t chunk, int64_t positions,
                       LogitRows rows, bool lookahead) {
  KTIER_CHECK(chunk >= 1 && positions >= 0);
  // Bytes of one allocation of n floats, as Scratch and BackendBuffer ask (at least one float).
  auto buf = [](int64_t n) {
    return backend::device_aligned(static_cast<uint64_t>(std::max<int64_t>(n, 1)) * sizeof(float));
  };
  WorkingSet w;
  const int64_t C = c.kda_width(), hist = (c.short_conv_kernel_size - 1) * C;
  w.state_bytes =
      static_cast<uint64_t>(c.num_kda_layers()) *
          (buf(c.kda_num_heads * c.kda_head_dim * c.kda_head_dim) + 3 * buf(hist)) +
      (positions > 0 ? static_cast<uint64_t>(c.num_mla_layers()) *
                           (buf(positions * c.kv_lora_rank) + buf(positions * c.qk_rope_head_dim))
                     : 0);

  const int64_t T = std::min(chunk, std::max<int64_t>(positions, 1));
  const int64_t E = c.hidden_size, V = c.vocab_size;
  int64_t boundaries = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) boundaries += c.is_boundary(l) ? 1 : 0;
  // forward(): P, mixed, x, y, shared (+ the lookahead copy), and the bank of finished blocks;
  // all live through every layer.
  const uint64_t stream = static_cast<uint64_t>(5 + (lookahead ? 1 : 0) + boundaries) * buf(T * E);
  // Beside them, one at a time: a block's scratch, a prediction's, or the logits at the end.
  uint64_t largest = 0;
  auto take = [&](uint64_t b) { largest = std::max(largest, b); };
  if (c.num_kda_layers() > 0) {  // kda_block
    const int64_t H = c.kda_num_heads, D = c.kda_head_dim;
    take(10 * buf(T * C) + 2 * buf(T * H) + buf(T * D));
  }
  if (c.num_mla_layers() > 0) {  // mla_block (the cache is reserved: no growth inside)
    const int64_t H = c.num_attention_heads, vh = c.v_head_dim;
    take(buf(T * c.q_lora_rank) + buf(T * (c.kv_lora_rank + c.qk_rope_head_dim)) +
         (c.mla_use_output_gate ? buf(T * H * vh) : 0) + buf(T * H * c.mla_qk_head_dim()) +
         buf(T * H * vh));
  }
  if (c.num_dense_layers() > 0) take(2 * buf(T * c.intermediate_size));        // glu_mlp
  if (c.num_shared_experts > 0) take(2 * buf(T * c.shared_expert_width()));    // shared experts
  if (c.num_moe_layers() > 0) {                                                 // moe_block
    const int64_t k = c.num_experts_per_token, lat = c.routed_expert_hidden_size;
    const int64_t I = c.moe_intermediate_size;
    take(buf(T * c.num_experts) + 2 * buf(T * lat) + 2 * buf(T * k) + 2 * buf(T * k * lat) +
         2 * buf(T * k * I));
    if (lookahead)  // Model::predict
      take(2 * buf(T * E) + buf(T * c.num_experts) + 2 * buf(T * k));
  }
  if (rows != LogitRows::kNone) take(buf((rows == LogitRows::kAll ? T : 1) * V));
  w.activation_bytes = stream + largest;
  return w;
}

Result<SequenceState> Model::new_sequence(int64_t positions) const {
  const format::ModelConfig& c = config();
  SequenceState s;
  s.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  const int64_t C = c.kda_width(), hist = (c.short_conv_kernel_size - 1) * C;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.is_mla(l)) {  // the MLA cache starts empty
      MlaCache& m = s.layers[static_cast<size_t>(l)].mla;
      KTIER_RETURN_IF_ERROR(m.c.reserve(be_, positions * c.kv_lora_rank));
      KTIER_RETURN_IF_ERROR(m.r.reserve(be_, positions * c.qk_rope_head_dim));
      continue;
    }
    KdaState& k = s.layers[static_cast<size_t>(l)].kda;
    KTIER_ASSIGN_OR_RETURN(k.S,
                           backend::BackendArray::zeros(
                               be_, c.kda_num_heads * c.kda_head_dim * c.kda_head_dim));
    KTIER_ASSIGN_OR_RETURN(k.conv_q, backend::BackendArray::zeros(be_, hist));
    KTIER_ASSIGN_OR_RETURN(k.conv_k, backend::BackendArray::zeros(be_, hist));
    KTIER_ASSIGN_OR_RETURN(k.conv_v, backend::BackendArray::zeros(be_, hist));
  }
  return s;
}

Result<ResidualStream> Model::new_stream(int64_t T) const {
  KTIER_CHECK(T >= 1);
  const size_t row_bytes = static_cast<size_t>(T * config().hidden_size) * sizeof(float);
  ResidualStream s;
  s.T = T;
  for (backend::BackendBuffer* b : {&s.P, &s.mixed, &s.x, &s.y, &s.shared}) {
    KTIER_ASSIGN_OR_RETURN(*b, backend::BackendBuffer::allocate(be_, row_bytes));
  }
  if (lookahead_depth_ > 0 && !lookahead_observers_.empty()) {
    KTIER_ASSIGN_OR_RETURN(s.ahead, backend::BackendBuffer::allocate(be_, row_bytes));
  }
  return s;
}

void ResidualStream::gather_sources() {
  sources.clear();
  for (const auto& b : bank) sources.push_back(b.as<float>());
  sources.push_back(P.as<float>());
}

Status Model::aggregate(ResidualStream& s, const F32Vec& f, float* out) {
  const int64_t E = config().hidden_size;
  s.gather_sources();
  return be_.attnres(s.sources.data(), static_cast<int>(s.sources.size()), E, s.T, E, f.data(),
                     config().rms_norm_eps, out);
}

void Model::RoutingTap::on_routing(int64_t layer, int64_t first_position, const int32_t* ids,
                                   const float* weights, int64_t T, int k) {
  last.layer = layer;
  last.ids.assign(ids, ids + T * k);  // allocates only past the largest pass so far
  if (next) next->on_routing(layer, first_position, ids, weights, T, k);
}

Status Model::layer(int64_t l, const LayerWeights& lw, LayerState& ls, int64_t first_position,
                    ResidualStream& s) {
  const format::ModelConfig& c = config();
  const int64_t T = s.T, E = c.hidden_size;
  const double eps = c.rms_norm_eps;
  const size_t row_bytes = static_cast<size_t>(T * E) * sizeof(float);
  float *mixed = s.mixed.as<float>(), *x = s.x.as<float>();
  // The attention input mixes the OLD bank with P; at a boundary P is then pushed and restarts
  // as the attention output alone (assignment, not 0 + y).
  if (s.bank.empty())
    KTIER_RETURN_IF_ERROR(be_.copy(mixed, s.P.get(), row_bytes));
  else
    KTIER_RETURN_IF_ERROR(aggregate(s, lw.f_attn, mixed));
  const bool boundary = c.is_boundary(l);
  if (boundary) {
    KTIER_ASSIGN_OR_RETURN(backend::BackendBuffer pushed,
                           backend::BackendBuffer::allocate(be_, row_bytes));
    KTIER_RETURN_IF_ERROR(be_.copy(pushed.get(), s.P.get(), row_bytes));
    s.bank.push_back(std::move(pushed));
  }
  KTIER_RETURN_IF_ERROR(be_.rmsnorm(mixed, lw.input_norm.data(), T, E, eps, x));
  if (lw.is_mla)
    KTIER_RETURN_IF_ERROR(mla_block(lw.mla, c, x, T, ls.mla, s.y.as<float>(), be_));
  else
    KTIER_RETURN_IF_ERROR(kda_block(lw.kda, c, x, T, ls.kda, s.y.as<float>(), be_));
  if (boundary)
    std::swap(s.P, s.y);
  else
    KTIER_RETURN_IF_ERROR(be_.add(s.P.as<float>(), s.y.as<float>(), T * E, s.P.as<float>()));
  KTIER_RETURN_IF_ERROR(aggregate(s, lw.f_mlp, mixed));  // the bank is never empty
  KTIER_RETURN_IF_ERROR(be_.rmsnorm(mixed, lw.post_attention_norm.data(), T, E, eps, x));
  // The part of the FFN output that needs no routing — the dense MLP, or the MoE's shared
  // experts — first, so that router lookahead scores the next layers on P plus it: on `demo`
  // depth-1 recall 61.6% -> 70.7% (docs/STRATA.md §7). The sum into P is unchanged.
  float* known = nullptr;  // [T, E]
  if (lw.is_dense) {
    KTIER_RETURN_IF_ERROR(glu_mlp(lw.dense, c, x, T, s.y.as<float>(), be_));
    known = s.y.as<float>();
  } else if (lw.moe.has_shared) {
    KTIER_RETURN_IF_ERROR(glu_mlp(lw.moe.shared, c, x, T, s.shared.as<float>(), be_));
    known = s.shared.as<float>();
  }
  const bool lookahead = s.ahead.get() != nullptr && lookahead_depth_ > 0 &&
                         !lookahead_observers_.empty();
  if (lookahead) {
    s.gather_sources();
    if (known) {
      KTIER_RETURN_IF_ERROR(be_.add(s.P.as<float>(), known, T * E, s.ahead.as<float>()));
      s.sources.back() = s.ahead.as<float>();
    }
    KTIER_RETURN_IF_ERROR(predict(l, 1, lookahead_depth_, first_position, s.sources, T));
  }
  if (!lw.is_dense) {
    KTIER_RETURN_IF_ERROR(moe_block(lw.moe, c, l, first_position, *experts_, &last_routing_,
                                    x, known, T, s.y.as<float>(), be_));
  }
  KTIER_RETURN_IF_ERROR(be_.add(s.P.as<float>(), s.y.as<float>(), T * E, s.P.as<float>()));
  // The refresh: layer l+1's router on the complete stream, which now holds layer l's routed
  // experts too (the part the prediction above misses most: on `demo`, layer 2's depth-1
  // recall is 15%, docs/STRATA.md §7).
  if (lookahead && lookahead_refresh_ && l + 1 < c.num_hidden_layers) {
    s.gather_sources();
    KTIER_RETURN_IF_ERROR(predict(l + 1, 0, 0, first_position, s.sources, T));
  }
  return Status::ok();
}

Status Model::forward(std::span<const int32_t> ids, SequenceState& state, LogitRows rows,
                      float* logits) {
  const cpu::ExactFpScope exact_fp;  // whatever the embedding program's MXCSR
  const format::ModelConfig& c = config();
  const int64_t T = static_cast<int64_t>(ids.size()), E = c.hidden_size, V = c.vocab_size;
  KTIER_CHECK(rows == LogitRows::kNone || logits != nullptr);
  KTIER_CHECK(state.layers.size() == static_cast<size_t>(c.num_hidden_layers));
  for (int32_t id : ids)
    if (id < 0 || id >= V)
      return Status::usage("token id " + std::to_string(id) + " is outside the vocabulary 0.." +
                           std::to_string(V - 1));
  if (T == 0) return Status::ok();
  last_routing_.last.layer = -1;  // this pass's, not an earlier one's
  if (experts_ != nullptr) experts_->begin_pass();
  const size_t row_bytes = static_cast<size_t>(T * E) * sizeof(float);

  // P: the running block partial sum, starting as the embeddings (no scaling, §6.2).
  KTIER_ASSIGN_OR_RETURN(ResidualStream s, new_stream(T));
  {
    std::vector<float> embedded(static_cast<size_t>(T * E));
    KTIER_RETURN_IF_ERROR(trunk_.embed(ids, embedded.data()));
    KTIER_RETURN_IF_ERROR(be_.upload(s.P.get(), embedded.data(), row_bytes));
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    KTIER_ASSIGN_OR_RETURN(const LayerWeights* acquired, trunk_.acquire_layer(l));
    // Released when the layer is done, or on an error return: a streaming source must get its
    // slot back either way.
    struct Lease {
      TrunkSource& trunk;
      int64_t layer;
      ~Lease() { trunk.release_layer(layer); }
    } lease{trunk_, l};
    KTIER_RETURN_IF_ERROR(
        layer(l, *acquired, state.layers[static_cast<size_t>(l)], state.n_tokens, s));
    if (layer_observer_) {
      std::vector<float> host(static_cast<size_t>(T * E));
      KTIER_RETURN_IF_ERROR(be_.download(host.data(), s.P.get(), row_bytes));
      layer_observer_->after_layer(l, host.data(), T, E);
    }
    if (layer_progress_) layer_progress_(l);
    if (layer_stop_ && l + 1 < c.num_hidden_layers && layer_stop_())
      return Status::interrupted("the forward pass was stopped after layer " + std::to_string(l));
  }
  state.n_tokens += T;
  if (rows == LogitRows::kNone) return Status::ok();

  // Output AttnRes over bank + P, final norm, lm_head (§6.7) for the rows asked for.
  const HeadWeights& head = trunk_.head();
  KTIER_RETURN_IF_ERROR(aggregate(s, head.f_out, s.mixed.as<float>()));
  const int64_t first = rows == LogitRows::kLast ? T - 1 : 0, n = T - first;
  KTIER_RETURN_IF_ERROR(be_.rmsnorm(s.mixed.as<float>() + first * E, head.final_norm.data(), n,
                                    E, c.rms_norm_eps, s.x.as<float>()));
  const size_t logit_bytes = static_cast<size_t>(n * V) * sizeof(float);
  KTIER_ASSIGN_OR_RETURN(backend::BackendBuffer out, backend::BackendBuffer::allocate(be_, logit_bytes));
  const cpu::LinearJob lm{head.lm_head, s.x.as<float>(), n, out.as<float>()};
  KTIER_RETURN_IF_ERROR(be_.linear(&lm, 1));
  return be_.download(logits, out.get(), logit_bytes);
}

Status Model::predict(int64_t l, int first_depth, int last_depth, int64_t first_position,
                      const std::vector<const float*>& sources, int64_t T) {
  const format::ModelConfig& c = config();
  const int64_t E = c.hidden_size;
  const int k = static_cast<int>(c.num_experts_per_token);
  Scratch s(be_);
  float *mixed = s.floats(T * E), *x = s.floats(T * E);
  const RoutingBuffers routing = routing_buffers(s, c, T);
  KTIER_RETURN_IF_ERROR(s.status());
  Routing chosen;
  std::vector<int> order(static_cast<size_t>(k));
  std::vector<int32_t> sorted_ids(static_cast<size_t>(T * k));
  std::vector<float> sorted_weights(sorted_ids.size());
  for (int d = first_depth; d <= last_depth; ++d) {
    const int64_t t = l + d;
    if (t >= c.num_hidden_layers) break;
    if (c.is_dense(t)) continue;
    const LayerWeights* w = routing_weights_ ? routing_weights_(t) : nullptr;
    if (w == nullptr) continue;
    KTIER_RETURN_IF_ERROR(be_.attnres(sources.data(), static_cast<int>(sources.size()), E, T, E,
                                      w->f_mlp.data(), c.rms_norm_eps, mixed));
    KTIER_RETURN_IF_ERROR(
        be_.rmsnorm(mixed, w->post_attention_norm.data(), T, E, c.rms_norm_eps, x));
    const cpu::LinearJob router{w->moe.router, x, T, routing.logits()};
    KTIER_RETURN_IF_ERROR(be_.linear(&router, 1));
    KTIER_RETURN_IF_ERROR(select_experts(w->moe, c, routing, chosen, be_));
    // Highest weight first, ties to the lower id, NaN weights (lookahead scores are not
    // checked for finiteness, §10) after every number: a strict weak order, as std::sort needs.
    for (int64_t tok = 0; tok < T; ++tok) {
      const int32_t* id = chosen.ids.data() + tok * k;
      const float* wt = chosen.weights.data() + tok * k;
      for (int i = 0; i < k; ++i) order[static_cast<size_t>(i)] = i;
      std::sort(order.begin(), order.end(), [&](int a, int b) {
        const bool nan_a = std::isnan(wt[a]), nan_b = std::isnan(wt[b]);
        if (nan_a != nan_b) return nan_b;
        if (!nan_a && wt[a] != wt[b]) return wt[a] > wt[b];
        return id[a] < id[b];
      });
      for (int i = 0; i < k; ++i) {
        sorted_ids[static_cast<size_t>(tok * k + i)] = id[order[static_cast<size_t>(i)]];
        sorted_weights[static_cast<size_t>(tok * k + i)] = wt[order[static_cast<size_t>(i)]];
      }
    }
    for (LookaheadObserver* o : lookahead_observers_)
      o->on_prediction(l, d, first_position, sorted_ids.data(), sorted_weights.data(), T, k);
  }
  return Status::ok();
}

}  // namespace ktier::model
