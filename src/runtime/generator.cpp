#include "runtime/generator.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>

namespace ktier::runtime {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Result<GenerationStats> generate(model::Model& model, const model::ExpertSource* experts,
                                 std::span<const int32_t> prompt, const GenerationOptions& opts,
                                 const TokenSink& sink) {
  if (prompt.empty()) return Status::usage("the prompt is empty: give at least one token");
  if (opts.prefill_chunk < 1) return Status::usage("--chunk must be >= 1");
  if (opts.max_new_tokens < 0) return Status::usage("-n must be >= 0");
  KTIER_RETURN_IF_ERROR(validate(opts.sampling));
  const int64_t V = model.config().vocab_size;
  auto expert_bytes = [&] { return experts ? experts->bytes_fetched() : 0; };

  GenerationStats st;
  st.prompt_tokens = static_cast<int64_t>(prompt.size());
  if (opts.reserve_positions < 0) return Status::usage("reserve_positions must be >= 0");
  KTIER_ASSIGN_OR_RETURN(model::SequenceState seq, model.new_sequence(opts.reserve_positions));
  std::vector<float> logits(static_cast<size_t>(V));
  const uint64_t bytes0 = expert_bytes();
  auto t0 = std::chrono::steady_clock::now();
  for (size_t pos = 0; pos < prompt.size();) {
    const size_t n = std::min(prompt.size() - pos, static_cast<size_t>(opts.prefill_chunk));
    const bool last = pos + n == prompt.size();
    KTIER_RETURN_IF_ERROR(model.forward(prompt.subspan(pos, n), seq,
                                        last ? model::LogitRows::kLast : model::LogitRows::kNone,
                                        last ? logits.data() : nullptr));
    pos += n;
  }
  st.prefill_seconds = seconds_since(t0);
  st.expert_bytes_prefill = expert_bytes() - bytes0;

  if (opts.before_decode) opts.before_decode();
  Sampler sampler(opts.sampling);
  const uint64_t bytes1 = expert_bytes();
  t0 = std::chrono::steady_clock::now();
  while (st.generated_tokens < opts.max_new_tokens) {
    const int32_t id = sampler.next(logits.data(), V);
    ++st.generated_tokens;
    KTIER_RETURN_IF_ERROR(sink(id));
    if (std::find(opts.stop_ids.begin(), opts.stop_ids.end(), id) != opts.stop_ids.end()) {
      st.stopped_at_stop_id = true;
      break;
    }
    if (st.generated_tokens == opts.max_new_tokens) break;
    const int32_t one[1] = {id};
    KTIER_RETURN_IF_ERROR(model.forward(one, seq, model::LogitRows::kLast, logits.data()));
    ++st.decode_steps;
  }
  st.decode_seconds = seconds_since(t0);
  st.expert_bytes_decode = expert_bytes() - bytes1;
  return st;
}

Status evaluate(model::Model& model, std::span<const int32_t> ids, int64_t chunk, float* logits) {
  if (chunk < 1) return Status::usage("--chunk must be >= 1");
  const int64_t V = model.config().vocab_size;
  KTIER_ASSIGN_OR_RETURN(model::SequenceState seq,
                         model.new_sequence(static_cast<int64_t>(ids.size())));
  for (size_t pos = 0; pos < ids.size();) {
    const size_t n = std::min(ids.size() - pos, static_cast<size_t>(chunk));
    KTIER_RETURN_IF_ERROR(model.forward(ids.subspan(pos, n), seq, model::LogitRows::kAll,
                                        logits + static_cast<int64_t>(pos) * V));
    pos += n;
  }
  return Status::ok();
}

uint64_t peak_rss_bytes() {
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // Linux reports kilobytes
}

}  // namespace ktier::runtime
