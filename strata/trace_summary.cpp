// Trace summary for `ktier trace info`.
#include "strata/trace_summary.h"

#include <cstdio>
#include <map>

#include "common/append_printf.h"
#include "strata/budget.h"

namespace ktier::strata {

TraceSummary summarize_trace(const Trace& trace, const RequestStream& stream) {
  TraceSummary s;
  for (const TraceStep& step : trace.steps) {
    if (step.chosen.empty())
      ++s.prediction_only_steps;
    else
      ++s.steps;
  }
  s.requests = stream.requests();
  s.tokens = stream.tokens;
  s.passes = stream.passes;
  s.moe_layers = stream.moe_layers;
  bool any = false;
  std::map<std::pair<uint32_t, uint32_t>, const TraceStep*> first;  // (position, layer)
  for (const TraceStep& step : trace.steps) {
    if (!step.chosen.empty()) {
      s.first_layer = any ? std::min<uint32_t>(s.first_layer, step.layer) : step.layer;
      s.last_layer = any ? std::max<uint32_t>(s.last_layer, step.layer) : step.layer;
      any = true;
    }
    const auto [it, inserted] = first.emplace(std::make_pair(step.position, step.layer), &step);
    if (inserted || it->second->pass == step.pass) continue;
    ++s.repeated_groups;
    bool same = it->second->chosen.size() == step.chosen.size();
    for (size_t i = 0; same && i < step.chosen.size(); ++i) {
      same = it->second->chosen[i].expert == step.chosen[i].expert;
    }
    if (!same) ++s.mismatched_groups;
  }
  std::vector<uint8_t> seen(stream.num_keys, 0);
  for (uint32_t k : stream.keys) {
    if (!seen[k]) {
      seen[k] = 1;
      ++s.distinct_keys;
    }
  }
  s.hit_ceiling = s.requests - s.distinct_keys;
  s.hit_ceiling_rate = s.requests ? static_cast<double>(s.hit_ceiling) / s.requests : 0;
  s.working_set_bytes = s.distinct_keys * stream.expert_bytes;
  s.prediction = prediction_quality(stream);
  return s;
}

std::string format_summary(const TraceSummary& s, const TraceHeader& h, const std::string& source) {
  std::string out;
  // Each line as long as it comes out: K3's recall-by-layer line runs past 500 characters, and a
  // trace's path may be long.
  auto line = [&](const char* fmt, auto... args) {
    append_printf(out, fmt, args...);
    out += '\n';
  };
  line("trace:            %s", source.c_str());
  line("format:           ktier trace v%u%s", h.version,
       (h.flags & kTraceFlagConverted) ? " (converted from conformance int32 pairs)" : "");
  line("model shape:      %u layers (MoE from %u), %u experts/layer, top-%u, %s per expert",
       h.num_layers, h.first_moe_layer, h.experts_per_layer, h.top_k,
       format_count(h.expert_bytes).c_str());
  line("routing weights:  %s", (h.flags & kTraceFlagWeights) ? "recorded" : "not recorded");
  line("lookahead depth:  %u%s", h.lookahead_depth,
       (h.flags & kTraceFlagRefresh) ? " + refresh (depth 0)" : "");
  line("passes:           %u", s.passes);
  line("tokens:           %s (token computations: distinct (pass, position))",
       format_count(s.tokens).c_str());
  if (s.prediction_only_steps == 0)
    line("steps:            %s ((token, layer) request sets)", format_count(s.steps).c_str());
  else
    line("steps:            %s ((token, layer) request sets) + %s with predictions only (no "
         "expert chosen: dense layers)",
         format_count(s.steps).c_str(), format_count(s.prediction_only_steps).c_str());
  line("requests:         %s", format_count(s.requests).c_str());
  if (s.moe_layers == 0)
    line("MoE layers:       0 (no routing recorded)");
  else
    line("MoE layers:       %u (layers %u..%u)", s.moe_layers, s.first_layer, s.last_layer);
  line("distinct keys:    %s (working set %s)", format_count(s.distinct_keys).c_str(),
       format_bytes(s.working_set_bytes).c_str());
  line("hit ceiling:      %s hits = %.2f%% (requests - distinct keys: compulsory misses, "
       "without prefetch)",
       format_count(s.hit_ceiling).c_str(), 100.0 * s.hit_ceiling_rate);
  line("determinism:      %s repeated (position, layer) groups, %s mismatches",
       format_count(s.repeated_groups).c_str(), format_count(s.mismatched_groups).c_str());
  for (const PredictionQuality& q : s.prediction) {
    char name[24];
    if (q.depth == 0)
      std::snprintf(name, sizeof name, "refresh:");
    else
      std::snprintf(name, sizeof name, "d=%u:", q.depth);
    line("lookahead %-7s recall %.2f%%, precision %.2f%% (%s of %s requests predicted)", name,
         100.0 * q.recall, 100.0 * q.precision, format_count(q.correct).c_str(),
         format_count(q.requested).c_str());
    std::string per_layer;
    for (size_t l = 0; l < q.by_layer.size(); ++l) {
      const PredictionQuality::Counts& c = q.by_layer[l];
      if (c.requested == 0) continue;
      append_printf(per_layer, " %zu:%.0f", l, 100.0 * c.correct / c.requested);
    }
    line("  recall by layer %%:%s", per_layer.c_str());
  }
  return out;
}

}  // namespace ktier::strata
