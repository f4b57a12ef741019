#include "runtime/logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/check.h"

namespace ktier::runtime {

LogSoftmax log_softmax(const float* logits, int64_t V) {
  double max = -INFINITY;
  for (int64_t i = 0; i < V; ++i) max = std::fmax(max, static_cast<double>(logits[i]));
  if (max == -INFINITY) return {0, INFINITY};  // every token impossible: -Inf for each
  double sum = 0.0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  return {max, std::log(sum)};
}

TokenLogprobs token_logprobs(const float* logits, int64_t V, int32_t chosen, int64_t top) {
  KTIER_CHECK(chosen >= 0 && chosen < V && top >= 0);
  const LogSoftmax ls = log_softmax(logits, V);
  TokenLogprobs out;
  out.chosen = {chosen, ls.at(logits[chosen])};
  const size_t k = static_cast<size_t>(std::min(top, V));
  if (k == 0) return out;
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  // Logit desc, id asc: a strict total order without NaN (-Inf ties go by id).
  const auto before = [logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    before);
  out.top.reserve(k);
  for (size_t i = 0; i < k; ++i) out.top.push_back({order[i], ls.at(logits[order[i]])});
  return out;
}

}  // namespace ktier::runtime
