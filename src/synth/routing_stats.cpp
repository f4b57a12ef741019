#include "synth/routing_stats.h"

#include <chrono>
#include <cmath>

#include "runtime/engine.h"

namespace ktier::synth {
namespace {

class UseCounter final : public model::RoutingObserver {
 public:
  explicit UseCounter(const format::ModelConfig& c)
      : uses(static_cast<size_t>(c.num_hidden_layers),
             std::vector<int64_t>(static_cast<size_t>(c.num_experts), 0)) {}
  void on_routing(int64_t layer, int64_t, const int32_t* ids, const float*, int64_t T,
                  int k) override {
    for (int64_t i = 0; i < T * k; ++i) ++uses[static_cast<size_t>(layer)][static_cast<size_t>(ids[i])];
  }
  std::vector<std::vector<int64_t>> uses;  // [layer][expert]
};

}  // namespace

Result<RoutingStats> measure_routing(const std::filesystem::path& dir, const SynthVocab& vocab,
                                     int64_t max_tokens, int threads) {
  RoutingStats out;
  out.prompt = std::string(sample_prompt());
  std::vector<int64_t> ids64 = encode_ordinary(vocab, out.prompt);
  if (static_cast<int64_t>(ids64.size()) > max_tokens) ids64.resize(static_cast<size_t>(max_tokens));
  const std::vector<int32_t> ids(ids64.begin(), ids64.end());
  out.tokens = static_cast<int64_t>(ids.size());

  runtime::EngineOptions eo;
  eo.model_dir = dir;
  eo.threads = threads;
  KTIER_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Engine> engine, runtime::Engine::open(eo));
  const format::ModelConfig& c = engine->checkpoint().config();
  if (c.num_moe_layers() == 0 || ids.empty()) return out;
  UseCounter counter(c);
  engine->model().set_routing_observer(&counter);
  KTIER_ASSIGN_OR_RETURN(model::SequenceState seq, engine->model().new_sequence());
  const auto t0 = std::chrono::steady_clock::now();
  KTIER_RETURN_IF_ERROR(
      engine->model().forward(ids, seq, model::LogitRows::kNone, nullptr));
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  engine->model().set_routing_observer(nullptr);

  const double total = static_cast<double>(ids.size()) * static_cast<double>(c.num_experts_per_token);
  for (int64_t l = c.first_k_dense_replace; l < c.num_hidden_layers; ++l) {
    LayerRouting r;
    r.layer = l;
    r.max_bits = std::log2(static_cast<double>(c.num_experts));
    for (int64_t u : counter.uses[static_cast<size_t>(l)]) {
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
