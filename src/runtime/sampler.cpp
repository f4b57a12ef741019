#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/check.h"
#include "cpu/fp_control.h"
#include "cpu/kernels.h"

namespace ktier::runtime {

Status validate(const SamplingParams& p) {
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature))
    return Status::usage("--temp must be a finite number >= 0 (0 = greedy), got " +
                         std::to_string(p.temperature));
  if (p.top_k < 0) return Status::usage("--top-k must be >= 0 (0 = off)");
  if (!(p.top_p >= 0 && p.top_p <= 1))
    return Status::usage("--top-p must be in [0, 1] (1 = off; 0 keeps the most likely token), "
                         "got " + std::to_string(p.top_p));
  if (!(p.min_p >= 0 && p.min_p <= 1))
    return Status::usage("--min-p must be in [0, 1] (0 = off), got " + std::to_string(p.min_p));
  if (!(p.repeat_penalty > 0) || !std::isfinite(p.repeat_penalty))
    return Status::usage("--repeat-penalty must be a finite number > 0 (1 = off), got " +
                         std::to_string(p.repeat_penalty));
  if (p.repeat_last_n < -1 || p.repeat_last_n > std::numeric_limits<int32_t>::max())
    return Status::usage("--repeat-last-n must be in -1.." +
                         std::to_string(std::numeric_limits<int32_t>::max()) +
                         " (0 = off, -1 = the whole sequence)");
  if (!std::isfinite(p.presence_penalty))
    return Status::usage("--presence-penalty must be a finite number (0 = off)");
  if (!std::isfinite(p.frequency_penalty))
    return Status::usage("--frequency-penalty must be a finite number (0 = off)");
  for (const auto& [id, bias] : p.logit_bias)
    if (id < 0 || !(std::isfinite(bias) || bias == -std::numeric_limits<float>::infinity()))
      return Status::usage("logit_bias: id " + std::to_string(id) + " must be >= 0 and its bias "
                           "a finite number or -Inf (never drawn)");
  return Status::ok();
}

bool bans_every_token(const SamplingParams& p, int64_t vocab) {
  if (vocab <= 0 || p.logit_bias.size() < static_cast<size_t>(vocab)) return false;
  std::vector<bool> banned(static_cast<size_t>(vocab), false);
  int64_t n = 0;
  for (const auto& [id, bias] : p.logit_bias)
    if (bias == -std::numeric_limits<float>::infinity() && id >= 0 && id < vocab &&
        !banned[static_cast<size_t>(id)]) {
      banned[static_cast<size_t>(id)] = true;
      ++n;
    }
  return n == vocab;
}

bool penalizes(const SamplingParams& p) {
  return p.repeat_last_n != 0 &&
         (p.repeat_penalty != 1 || p.presence_penalty != 0 || p.frequency_penalty != 0);
}

uint64_t resolve_seed(uint64_t seed) {
  if (seed != kRandomSeed) return seed;
  std::random_device rd;
  // Below 2^53: a drawn seed a report or a response shows goes back unchanged through any JSON
  // reader (a double's integers) and a request's signed seed field.
  return ((uint64_t{rd()} << 32) ^ rd()) & ((uint64_t{1} << 53) - 1);
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  KTIER_CHECK(validate(params).is_ok());
}

const float* Sampler::adjust_logits(const float* logits, int64_t n,
                                    std::span<const int32_t> sequence) {
  const bool penalized = penalizes(params_) && !sequence.empty();
  if (!penalized && params_.logit_bias.empty()) return logits;
  constexpr double kFloatMax = std::numeric_limits<float>::max();
  adjusted_.assign(logits, logits + n);
  for (const auto& [id, bias] : params_.logit_bias) {
    KTIER_CHECK(id < n);
    const float logit = adjusted_[static_cast<size_t>(id)];
    double l = static_cast<double>(logit) + bias;
    // A finite logit stays finite unless banned (-Inf); NaN stays NaN.
    if (std::isfinite(logit) && std::isfinite(bias)) l = std::clamp(l, -kFloatMax, kFloatMax);
    adjusted_[static_cast<size_t>(id)] = static_cast<float>(l);
  }
  if (!penalized) return adjusted_.data();
  const size_t last = params_.repeat_last_n < 0
                          ? sequence.size()
                          : std::min(sequence.size(), static_cast<size_t>(params_.repeat_last_n));
  const std::span<const int32_t> window = sequence.last(last);
  // O(window) a token (K3's whole context is 2^20 ids): counted, then each id penalized once.
  if (counts_.size() != static_cast<size_t>(n)) counts_.assign(static_cast<size_t>(n), 0);
  for (const int32_t id : window) {
    KTIER_CHECK(id >= 0 && id < n);
    ++counts_[static_cast<size_t>(id)];
  }
  for (const int32_t id : window) {
    const size_t i = static_cast<size_t>(id);
    if (counts_[i] == 0) continue;  // penalized already
    const double count = counts_[i];
    counts_[i] = 0;  // all zero again once every id is done
    const float logit = adjusted_[i];
    double l = logit;
    l = l <= 0 ? l * params_.repeat_penalty : l / params_.repeat_penalty;
    l -= count * params_.frequency_penalty + params_.presence_penalty;
    // -Inf (a token that cannot be) stays so; a finite logit stays finite.
    if (std::isfinite(logit)) l = std::clamp(l, -kFloatMax, kFloatMax);
    adjusted_[i] = static_cast<float>(l);
  }
  return adjusted_.data();
}

int32_t Sampler::next(const float* raw_logits, int64_t n, std::span<const int32_t> sequence) {
  const cpu::ExactFpScope exact_fp;  // the probabilities' rounding is part of the draw
  const float* logits = adjust_logits(raw_logits, n, sequence);
  if (params_.temperature == 0) return static_cast<int32_t>(cpu::argmax(logits, n, cpu::Exec{}));
  order_.clear();
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(logits[i])) order_.push_back(static_cast<int32_t>(i));
  if (order_.empty()) return 0;
  const auto before = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  size_t keep = order_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(keep),
                      order_.end(), before);
    order_.resize(keep);
  } else {
    std::sort(order_.begin(), order_.end(), before);
  }
  prob_.resize(keep);
  const double l_max = logits[order_[0]];
  // The p the cuts below see, and (unless made again after them) the draw's.
  const auto make_probs = [&](double temperature) {
    double total = 0;
    for (size_t i = 0; i < keep; ++i) {
      prob_[i] = std::exp((static_cast<double>(logits[order_[i]]) - l_max) / temperature);
      total += prob_[i];
    }
    return total;
  };
  double sum = make_probs(params_.temperature_last ? 1.0 : params_.temperature);
  if (params_.top_p < 1) {
    double cum = 0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      cum += prob_[i] / sum;
      if (cum >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += prob_[i];
  }
  if (params_.min_p > 0) {
    // prob_[0] is exp(0) = 1, the largest: the cut is p_i >= min_p (never the first).
    size_t cut = 1;
    while (cut < keep && prob_[cut] >= params_.min_p) ++cut;
    if (cut < keep) {
      keep = cut;
      sum = 0;
      for (size_t i = 0; i < keep; ++i) sum += prob_[i];
    }
  }
  if (params_.temperature_last && params_.temperature != 1.0) sum = make_probs(params_.temperature);
  ++draws_;
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * sum;
  double cum = 0;
  for (size_t i = 0; i < keep; ++i) {
    cum += prob_[i];
    if (u < cum) return order_[i];
  }
  return order_[keep - 1];  // u rounded up to the total
}

}  // namespace ktier::runtime
