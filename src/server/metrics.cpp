#include "server/metrics.h"

#include <cstdint>
#include <iterator>
#include <string_view>
#include <utility>

#include <spdlog/fmt/fmt.h>

namespace ktier::server {
namespace {

// The exposition text, written metric by metric: HELP and TYPE go before a metric's first
// sample, so the samples of one metric (its label sets) must be added one after the other.
class Exposition {
 public:
  // One sample; `labels` as Prometheus spells them ("" or `tier="ram"`).
  void add(std::string_view name, std::string_view type, std::string_view help, double value,
           std::string_view labels = {}) {
    if (name != last_) {
      fmt::format_to(std::back_inserter(text_), "# HELP {} {}\n# TYPE {} {}\n", name, help, name,
                     type);
      last_ = name;
    }
    if (labels.empty())
      fmt::format_to(std::back_inserter(text_), "{} {}\n", name, value);
    else
      fmt::format_to(std::back_inserter(text_), "{}{{{}}} {}\n", name, labels, value);
  }
  std::string take() { return std::move(text_); }

 private:
  std::string text_;
  std::string_view last_;
};

double seconds(uint64_t ns) { return static_cast<double>(ns) * 1e-9; }

}  // namespace

std::string prometheus_metrics(const ServiceTotals& t) {
  Exposition m;
  const auto counter = [&](std::string_view name, std::string_view help, double value,
                           std::string_view labels = {}) {
    m.add(name, "counter", help, value, labels);
  };
  counter("ktier:requests_total", "Requests answered (one its client left mid-answer included).",
          static_cast<double>(t.requests));
  counter("ktier:requests_failed_total",
          "Requests accepted, then ended by an error or by the server's stop.",
          static_cast<double>(t.requests_failed));
  counter("ktier:requests_left_total", "Requests whose client left before they started.",
          static_cast<double>(t.requests_left));
  counter("ktier:prompt_tokens_total", "Prompt tokens run.", static_cast<double>(t.prompt_tokens));
  counter("ktier:prompt_tokens_reused_total",
          "Prompt tokens the previous request's sequence, or a kept one, held (not run again).",
          static_cast<double>(t.reused_tokens));
  counter("ktier:kept_sequence_hits_total",
          "Requests that went on from a sequence kept in RAM (--cache-ram).",
          static_cast<double>(t.kept_sequence_hits));
  m.add("ktier:kept_sequences", "gauge", "Earlier sequences kept in RAM (--cache-ram).",
        static_cast<double>(t.kept_sequences));
  m.add("ktier:kept_sequence_bytes", "gauge", "Their states' bytes.",
        static_cast<double>(t.kept_bytes));
  counter("ktier:prompt_seconds_total", "Prefill time.", t.prefill_seconds);
  counter("ktier:tokens_predicted_total", "Tokens generated.",
          static_cast<double>(t.generated_tokens));
  counter("ktier:tokens_predicted_seconds_total", "Decode time.", t.decode_seconds);
  counter("ktier:n_decode_total", "Decode steps (one token's forward pass each).",
          static_cast<double>(t.decode_steps));
  m.add("ktier:requests_processing", "gauge", "Requests generating now.",
        static_cast<double>(t.processing));
  m.add("ktier:requests_deferred", "gauge", "Requests waiting for the sequence.",
        static_cast<double>(t.waiting));

  const runtime::EngineCounters& e = t.engine;
  const runtime::ExpertCacheStats& x = e.experts;
  const runtime::VramTierStats& v = e.vram;
  const char* hit = "Routed experts' stored bytes served from the tier (RAM: without waiting; "
                    "VRAM: lookahead copies still landing included).";
  counter("ktier:expert_hit_bytes_total", hit, static_cast<double>(v.hit_bytes), "tier=\"vram\"");
  counter("ktier:expert_hit_bytes_total", hit, static_cast<double>(x.hit_bytes), "tier=\"ram\"");
  const char* miss = "Routed experts' stored bytes the tier did not hold (or not yet).";
  counter("ktier:expert_miss_bytes_total", miss, static_cast<double>(v.miss_bytes),
          "tier=\"vram\"");
  counter("ktier:expert_miss_bytes_total", miss, static_cast<double>(x.miss_bytes),
          "tier=\"ram\"");
  counter("ktier:expert_late_bytes_total",
          "Of the RAM tier's misses, bytes prefetched but still in flight when needed.",
          static_cast<double>(x.late_bytes));
  const char* link = "Expert bytes moved over a link (demand and prefetch).";
  counter("ktier:expert_link_bytes_total", link, static_cast<double>(x.read_bytes),
          "link=\"storage_to_ram\"");
  counter("ktier:expert_link_bytes_total", link, static_cast<double>(v.copied_bytes),
          "link=\"ram_to_vram\"");
  // Prefetch outcomes: the RAM tier's reads ahead, the VRAM tier's lookahead copies.
  const auto outcomes = [&](std::string_view name, std::string_view help, uint64_t issued,
                            uint64_t useful, uint64_t timely, uint64_t wasted) {
    const std::pair<const char*, uint64_t> by_outcome[] = {
        {"outcome=\"issued\"", issued},
        {"outcome=\"useful\"", useful},
        {"outcome=\"timely\"", timely},
        {"outcome=\"wasted\"", wasted}};
    for (const auto& [label, value] : by_outcome)
      counter(name, help, static_cast<double>(value), label);
  };
  outcomes("ktier:expert_prefetch_total", "Expert prefetches by outcome (RAM tier).",
           x.prefetch_issued, x.prefetch_useful, x.prefetch_timely, x.prefetch_wasted);
  outcomes("ktier:expert_lookahead_copies_total",
           "Router-lookahead copies into VRAM by outcome (VRAM tier, GPU mode).",
           v.prefetch_issued, v.prefetch_useful, v.prefetch_timely, v.prefetch_wasted);
  counter("ktier:trunk_read_bytes_total", "Trunk bytes read from storage (streamed layers).",
          static_cast<double>(e.trunk_bytes_read));
  counter("ktier:io_read_bytes_total", "Bytes the I/O layer read from storage.",
          static_cast<double>(e.io_bytes));
  counter("ktier:io_wait_seconds_total", "Time the model waited for reads.",
          seconds(e.io_wait_ns));
  return m.take();
}

}  // namespace ktier::server
