// GET /metrics's text (server/metrics.h): Prometheus's exposition format, each metric with its
// HELP and TYPE once, every figure of the totals under its name and labels.
#include "server/metrics.h"

#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace ktier::server {
namespace {

TEST(PrometheusMetrics, EveryFigureUnderItsNameInTheTextFormat) {
  ServiceTotals t;
  t.requests = 3;
  t.requests_failed = 1;
  t.requests_left = 4;
  t.prompt_tokens = 700;
  t.reused_tokens = 694;
  t.generated_tokens = 12;
  t.decode_steps = 10;
  t.prefill_seconds = 1.5;
  t.decode_seconds = 0.25;
  t.waiting = 2;
  t.processing = 1;
  t.kept_sequences = 2;
  t.kept_bytes = 1 << 20;
  t.kept_sequence_hits = 6;
  t.engine.experts.hit_bytes = 123456789012;
  t.engine.experts.miss_bytes = 5;
  t.engine.vram.hit_bytes = 7;
  t.engine.vram.prefetch_timely = 3;
  t.engine.experts.read_bytes = 11;
  t.engine.experts.prefetch_wasted = 4;
  t.engine.io_wait_ns = 2'500'000'000;
  const std::string text = prometheus_metrics(t);

  std::map<std::string, std::string> samples;  // "name{labels}" -> value
  std::set<std::string> helped, typed;
  const std::regex sample(R"(([a-z_:]+)(\{[a-z_]+="[a-z_]+"\})? (\S+))");
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (line.rfind("# HELP ", 0) == 0) {
      EXPECT_TRUE(helped.insert(line.substr(7, line.find(' ', 7) - 7)).second) << line;
    } else if (line.rfind("# TYPE ", 0) == 0) {
      const std::string name = line.substr(7, line.find(' ', 7) - 7);
      EXPECT_TRUE(typed.insert(name).second) << line;
      const std::string type = line.substr(8 + name.size());
      EXPECT_TRUE(type == "counter" || type == "gauge") << line;
      EXPECT_EQ(type == "counter", name.size() > 6 && name.substr(name.size() - 6) == "_total")
          << line;
    } else {
      ASSERT_TRUE(std::regex_match(line, m, sample)) << line;
      EXPECT_TRUE(helped.count(m[1]) && typed.count(m[1])) << "no HELP/TYPE before " << line;
      EXPECT_TRUE(samples.emplace(m[1].str() + m[2].str(), m[3]).second) << line;
    }
  }
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(samples.size(), 32u) << text;
  EXPECT_EQ(samples["ktier:requests_total"], "3");
  EXPECT_EQ(samples["ktier:requests_failed_total"], "1");
  EXPECT_EQ(samples["ktier:requests_left_total"], "4");
  EXPECT_EQ(samples["ktier:prompt_tokens_total"], "700");
  EXPECT_EQ(samples["ktier:prompt_tokens_reused_total"], "694");
  EXPECT_EQ(samples["ktier:tokens_predicted_total"], "12");
  EXPECT_EQ(samples["ktier:n_decode_total"], "10");
  EXPECT_EQ(samples["ktier:prompt_seconds_total"], "1.5");
  EXPECT_EQ(samples["ktier:tokens_predicted_seconds_total"], "0.25");
  EXPECT_EQ(samples["ktier:requests_deferred"], "2");
  EXPECT_EQ(samples["ktier:requests_processing"], "1");
  EXPECT_EQ(samples["ktier:kept_sequences"], "2");
  EXPECT_EQ(samples["ktier:kept_sequence_bytes"], "1048576");
  EXPECT_EQ(samples["ktier:kept_sequence_hits_total"], "6");
  EXPECT_EQ(samples["ktier:expert_hit_bytes_total{tier=\"ram\"}"], "123456789012");
  EXPECT_EQ(samples["ktier:expert_miss_bytes_total{tier=\"ram\"}"], "5");
  EXPECT_EQ(samples["ktier:expert_hit_bytes_total{tier=\"vram\"}"], "7");
  EXPECT_EQ(samples["ktier:expert_link_bytes_total{link=\"storage_to_ram\"}"], "11");
  EXPECT_EQ(samples["ktier:expert_prefetch_total{outcome=\"wasted\"}"], "4");
  EXPECT_EQ(samples["ktier:expert_lookahead_copies_total{outcome=\"timely\"}"], "3");
  EXPECT_EQ(samples["ktier:io_wait_seconds_total"], "2.5");
}

}  // namespace
}  // namespace ktier::server
