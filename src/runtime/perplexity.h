#pragma once
// Perplexity of a text under the model (llama.cpp's llama-perplexity): the exponential of the
// mean negative log-likelihood, in nats, of each scored token given the tokens before it.
//
// The sums are in double, over f32 logits, in a fixed order: the result depends only on the
// logits' bytes, which the CPU path makes independent of threads, chunking and ISA.
// Not thread-safe.

#include <cstdint>

#include "common/status.h"

namespace ktier::runtime {

class PerplexityMeter {
 public:
  // One prediction: `logits` [V] of the position before `target`. Status::corrupt (exit 3,
  // naming `positions`) when a logit is NaN or +Inf, as for a generated token (check_logits).
  Status add(const float* logits, int64_t V, int32_t target, int64_t positions);

  int64_t count() const { return count_; }
  double mean_nll() const;   // nats; 0 before the first add
  double perplexity() const;  // exp(mean_nll)
  // The standard error of perplexity() from the spread of the per-token NLLs (the delta
  // method, as llama-perplexity prints it): 0 with fewer than two predictions.
  double perplexity_error() const;

 private:
  int64_t count_ = 0;
  double sum_ = 0.0, sum_sq_ = 0.0;
};

// -log softmax(logits)[target] in double (runtime::log_softmax): +Inf for an impossible target.
double negative_log_likelihood(const float* logits, int64_t V, int32_t target);

}  // namespace ktier::runtime
