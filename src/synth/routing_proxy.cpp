#include "synth/routing_proxy.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/dtype.h"

namespace ktier::synth {
namespace {

const PlannedTensor* find_tensor(const PlannedShard& shard, const std::string& name) {
  for (const auto& t : shard.tensors)
    if (t.decl.name == name) return &t;
  return nullptr;
}

// Values of rows [row, row + n_rows) exactly as stored (BF16 rounding applied), widened to f32.
std::vector<float> stored_rows(const PlannedTensor& t, int64_t row, int64_t n_rows, int64_t cols) {
  std::vector<float> v(static_cast<size_t>(n_rows * cols));
  generate_values(t.values, static_cast<uint64_t>(row * cols), v.size(), v.data());
  if (t.decl.dtype == DType::kBF16)
    for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

}  // namespace

RoutingProxy routing_proxy(const SynthShape& s, const Plan& plan, const SynthVocab& vocab) {
  RoutingProxy out;
  out.prompt = std::string(sample_prompt());
  const std::vector<int64_t> ids = encode_ordinary(vocab, out.prompt);
  out.tokens = static_cast<int64_t>(ids.size());
  const int64_t E = s.hidden;
  const PlannedTensor* embed = find_tensor(plan.shards.back(), "language_model.model.embed_tokens.weight");
  if (!embed) return out;

  std::vector<std::vector<double>> inputs;  // RMS-normalised embeddings, one per token
  for (int64_t id : ids) {
    const std::vector<float> row = stored_rows(*embed, id, 1, E);
    double ss = 0.0;
    for (float x : row) ss += static_cast<double>(x) * x;
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(E) + 1e-5);
    std::vector<double> x(row.begin(), row.end());
    for (double& v : x) v *= inv;
    inputs.push_back(std::move(x));
  }

  for (int64_t l = 0; l < s.layers; ++l) {
    if (s.is_dense(l)) continue;
    const std::string b = "language_model.model.layers." + std::to_string(l) + ".block_sparse_moe.";
    const PlannedTensor* gate = find_tensor(plan.shards[static_cast<size_t>(l)], b + "gate.weight");
    const PlannedTensor* bias = find_tensor(plan.shards[static_cast<size_t>(l)], b + "gate.e_score_correction_bias");
    if (!gate || !bias) continue;
    const std::vector<float> w = stored_rows(*gate, 0, s.experts, E);
    const std::vector<float> c = stored_rows(*bias, 0, 1, s.experts);
    std::vector<int64_t> uses(static_cast<size_t>(s.experts), 0);
    std::vector<double> score(static_cast<size_t>(s.experts));
    std::vector<int64_t> order(static_cast<size_t>(s.experts));
    for (const auto& x : inputs) {
      for (int64_t e = 0; e < s.experts; ++e) {
        double logit = 0.0;
        const float* we = w.data() + e * E;
        for (int64_t i = 0; i < E; ++i) logit += static_cast<double>(we[i]) * x[static_cast<size_t>(i)];
        score[static_cast<size_t>(e)] = 1.0 / (1.0 + std::exp(-logit)) + c[static_cast<size_t>(e)];
      }
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t bb) {
        return score[static_cast<size_t>(a)] > score[static_cast<size_t>(bb)];
      });
      for (int64_t j = 0; j < s.top_k; ++j) ++uses[static_cast<size_t>(order[static_cast<size_t>(j)])];
    }
    LayerRouting r;
    r.layer = l;
    r.max_bits = std::log2(static_cast<double>(s.experts));
    const double total = static_cast<double>(inputs.size()) * static_cast<double>(s.top_k);
    for (int64_t u : uses) {
      if (u == 0) continue;
      ++r.experts_used;
      const double p = static_cast<double>(u) / total;
      r.entropy_bits -= p * std::log2(p);
    }
    out.layers.push_back(r);
  }
  return out;
}

}  // namespace ktier::synth
