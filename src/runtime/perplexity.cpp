#include "runtime/perplexity.h"

#include <cmath>

#include "runtime/generator.h"
#include "runtime/logprobs.h"

namespace ktier::runtime {

double negative_log_likelihood(const float* logits, int64_t V, int32_t target) {
  return -log_softmax(logits, V).at(logits[target]);
}

Status PerplexityMeter::add(const float* logits, int64_t V, int32_t target, int64_t positions) {
  KTIER_RETURN_IF_ERROR(check_logits(logits, V, positions));
  const double nll = negative_log_likelihood(logits, V, target);
  ++count_;
  sum_ += nll;
  sum_sq_ += nll * nll;
  return Status::ok();
}

double PerplexityMeter::mean_nll() const {
  return count_ > 0 ? sum_ / static_cast<double>(count_) : 0.0;
}

double PerplexityMeter::perplexity() const { return std::exp(mean_nll()); }

double PerplexityMeter::perplexity_error() const {
  if (count_ < 2) return 0.0;
  const double n = static_cast<double>(count_), mean = mean_nll();
  const double variance = std::fmax(0.0, sum_sq_ / n - mean * mean);
  return perplexity() * std::sqrt(variance / (n - 1.0));
}

}  // namespace ktier::runtime
