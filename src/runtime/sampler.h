#pragma once
// Choosing the next token from one row of logits (K3-MODEL §6.7 for greedy).
//
// First each logit_bias is added to its token's logit (in double; a finite logit stays finite
// unless the bias is -Inf). Then, when a penalty is on (llama.cpp's rule and order): the logit l
// of each token that occurs c > 0 times among the last repeat_last_n ids of the sequence (prompt
// and answer so far; -1: all of them) becomes (l <= 0 ? l * repeat_penalty : l / repeat_penalty)
// - c * frequency_penalty - presence_penalty, in double, rounded to float (a finite logit stays
// finite: clamped to the float range). Then, on those logits:
// temperature == 0: greedy, the largest logit, lowest index on ties (NaN never wins).
// temperature > 0: seeded sampling in this fixed order (the Hugging Face order):
//   1. candidates = tokens with a finite logit, ordered by (logit desc, id asc);
//   2. keep the first top_k (0 = all);
//   3. p_i = exp((l_i - l_max) / temperature) / sum, in double;
//   4. keep the shortest prefix whose cumulative p reaches top_p (at least one token);
//   4b. keep those whose p is at least min_p times the largest p (min-p: 0 = off);
//   5. draw u in [0, 1) from std::mt19937_64(seed) (53 bits of one draw) and take the first
//      candidate whose cumulative p (renormalised over the kept prefix) exceeds u.
// temperature_last (llama.cpp's default order, top_k → top_p → min_p → temperature): steps 4
// and 4b cut on the p of temperature 1, and the kept prefix's p are then made again at the
// temperature for step 5. (Both orders keep a prefix of step 1's: top-k and the order are the
// same at every temperature.)
// Every step is deterministic, so one seed gives the same tokens on every machine and for every
// thread count, memory budget or tier placement.

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "common/status.h"

namespace ktier::runtime {

// The seed that asks for a random one, as llama.cpp's -1 (`-s -1`, serve's default): the caller
// draws it with resolve_seed() before sampling, so that the seed used can be printed.
inline constexpr uint64_t kRandomSeed = UINT64_MAX;
// `seed`, or a fresh one from std::random_device, below 2^53 (so never kRandomSeed), when it is
// kRandomSeed.
uint64_t resolve_seed(uint64_t seed);

struct SamplingParams {
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;         // 0: no top-k cut
  double top_p = 1.0;        // 1: no nucleus cut
  uint64_t seed = 0;          // kRandomSeed: resolve_seed() first
  double min_p = 0.0;        // 0: no min-p cut
  // Penalties on ids already in the sequence (llama.cpp's defaults: all off).
  double repeat_penalty = 1.0;     // 1: off
  int64_t repeat_last_n = 64;      // ids looked back at; 0: none, -1: the whole sequence
  double presence_penalty = 0.0;   // 0: off
  double frequency_penalty = 0.0;  // 0: off
  // top_p and min_p cut before the temperature is applied (llama.cpp's order), not after (the
  // Hugging Face order, the default). Only serve's `samplers` field sets it.
  bool temperature_last = false;
  // (id, bias) added to that id's logit first, before the penalties and the cuts (llama.cpp's
  // order; OpenAI's and llama-server's logit_bias): -Inf, never drawn. Ids below the logits'
  // length. serve's logit_bias and run's -l/--logit-bias; ignore_eos / --ignore-eos as -Inf on
  // the stop ids.
  std::vector<std::pair<int32_t, float>> logit_bias{};
};

// Status::usage naming the flag when a parameter is out of range (temperature < 0 or not
// finite, top_k < 0, top_p outside [0, 1], min_p outside [0, 1], repeat_penalty not a finite
// number > 0, repeat_last_n outside -1..INT32_MAX, presence or frequency penalty not finite, a
// logit_bias id < 0 or bias neither finite nor -Inf).
Status validate(const SamplingParams& p);

// Whether the -Inf biases of `p.logit_bias` ban every id of a vocabulary of `vocab` (then the
// sampler's rule for a row without a finite logit would draw id 0, banned too): callers refuse
// such a request before anything runs.
bool bans_every_token(const SamplingParams& p, int64_t vocab);

// Whether `p` changes any logit by the ids before it (a penalty on, over at least one id).
bool penalizes(const SamplingParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);  // REQUIRES validate(params).is_ok()
  // logits [n]; `sequence` the ids before the one chosen (each in [0, n); read only when
  // penalizes()). Returns a token id in [0, n). All-NaN/-inf rows give 0 (greedy's rule).
  int32_t next(const float* logits, int64_t n, std::span<const int32_t> sequence);
  // Draws made from the seed so far (one per token sampled with temperature > 0).
  uint64_t draws() const { return draws_; }
  // Goes on as a sampler that has made `n` draws more (a resumed conversation's, which made
  // them before it was saved): the next token samples what that one's would.
  void skip_draws(uint64_t n) {
    rng_.discard(n);
    draws_ += n;
  }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  uint64_t draws_ = 0;
  std::vector<int32_t> order_;
  std::vector<double> prob_;
  std::vector<uint32_t> counts_;   // [n] per id; all zero between calls
  std::vector<float> adjusted_;    // the logits after the bias and the penalties

  // `logits`, or adjusted_ holding them after the bias and the penalties.
  const float* adjust_logits(const float* logits, int64_t n, std::span<const int32_t> sequence);
};

}  // namespace ktier::runtime
