#pragma once
// Log-probabilities of tokens under one row of logits: log softmax(logits), in double, of the
// model's logits as they are (before penalties, temperature or any cut: the model's own
// distribution, what OpenAI's `logprobs` and llama-server's `n_probs` report).
//
// Thread-safety: pure functions.

#include <cstdint>
#include <vector>

namespace ktier::runtime {

// log softmax(l)[i] = (l[i] - max) - log(sum_j exp(l[j] - max)): the difference first (with
// large logits, max + log(sum) would round log(sum) away). -Inf for a -Inf logit, and for every
// token when all are -Inf.
struct LogSoftmax {
  double max = 0, log_sum = 0;
  double at(float logit) const { return (static_cast<double>(logit) - max) - log_sum; }
};
// Over logits [V], summed in index order. REQUIRES no NaN (check_logits).
LogSoftmax log_softmax(const float* logits, int64_t V);

struct IdLogprob {
  int32_t id = 0;
  double logprob = 0;
};

// The sampled token's log-probability and the `top` most likely tokens' (at most V), most
// likely first, lower id first among equals. REQUIRES 0 <= chosen < V, top >= 0, no NaN.
struct TokenLogprobs {
  IdLogprob chosen;
  std::vector<IdLogprob> top;
};
TokenLogprobs token_logprobs(const float* logits, int64_t V, int32_t chosen, int64_t top);

}  // namespace ktier::runtime
