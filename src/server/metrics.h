#pragma once
// `ktier serve --metrics`: GET /metrics in Prometheus's text format (version 0.0.4), as
// llama-server's (its `llamacpp:` names under `ktier:`), with the engine's tier figures beside
// them: per-tier expert bytes served and missed, link bytes, prefetch outcomes. Every counter
// counts from the model's load; a hit rate is rate(hit bytes) / rate(hit + miss bytes).

#include <string>

#include "server/service.h"

namespace ktier::server {

// The exposition text of `totals`: for each metric "# HELP", "# TYPE" and one sample line.
std::string prometheus_metrics(const ServiceTotals& totals);

}  // namespace ktier::server
