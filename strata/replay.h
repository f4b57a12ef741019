#pragma once
// Trace replay: a trace's requests driven through a tier hierarchy run by one cache policy, for
// sweeps of budgets. Definitions of every reported number: docs/STRATA.md §3-§4.
//
//   KTIER_ASSIGN_OR_RETURN(Trace trace, read_trace(path));
//   KTIER_ASSIGN_OR_RETURN(const RequestStream stream, build_request_stream(trace));
//   ReplaySpec spec{PolicyKind::kLru, {{"ram", 8'000'000'000, 455}}};
//   ReplayResult r = replay(stream, spec, ReplayParams{}, ReplayInputs::from(stream));
//
// Tier model: memory tiers fastest first (e.g. vram, ram), each with a capacity in slots, and an
// unbounded backing store (nvme) after them. The policy keeps one cache per tier boundary with
// the cumulative capacity of tiers 0..i; a request is served from the fastest tier i whose
// cumulative cache holds the key, else from the backing store. For stack policies (LRU, LFU,
// static, Belady) the cumulative caches nest, so this is exactly "the hottest fill the fastest
// tier" with demotion to the next tier on eviction. Experts are computed in tier 0: a request
// served from tier j moves its bytes over every link j -> j-1 -> ... -> 0.

#include <cstdint>
#include <string>
#include <vector>

#include "strata/cache_policy.h"
#include "strata/trace_format.h"

namespace ktier::strata {

// A prediction as replay uses it: at the end of the step that holds it, `key` is predicted for
// step `target_step` (same token, layer + depth). A refresh (depth 0, recorded in its target
// step) is held by the step before its target in the stream, after that step's own predictions.
struct Prediction {
  uint32_t target_step = 0;
  uint32_t key = 0;
  uint8_t depth = 0;  // 1 = the next layer; 0 = the refresh
};

// The trace flattened for replay. Built once per trace; read-only afterwards (shareable).
struct RequestStream {
  uint32_t experts_per_layer = 0;
  uint32_t num_keys = 0;  // num_layers * experts_per_layer
  uint64_t expert_bytes = 0;
  uint32_t moe_layers = 0;  // distinct layers with requests (steps per token)
  uint64_t tokens = 0;      // distinct (pass, position) pairs, counted per pass
  uint32_t passes = 0;
  uint32_t lookahead_depth = 0;         // recorded prediction depths
  bool refresh = false;                 // refresh predictions recorded (depth 0)
  std::vector<uint32_t> keys;           // per request: layer * experts_per_layer + expert
  std::vector<uint32_t> step_begin;     // requests of step s: [step_begin[s], step_begin[s + 1])
  std::vector<double> step_clock;       // per step: token clock = step / moe_layers
  std::vector<uint32_t> next_use;       // per request: next request index of its key, or kNeverUsed
  std::vector<Prediction> predictions;  // grouped by issuing step, depth then weight order
  std::vector<uint32_t> prediction_begin;   // predictions of step s: [begin[s], begin[s + 1])
  uint64_t predictions_without_target = 0;  // predicted (token, layer) never requested

  uint32_t steps() const { return static_cast<uint32_t>(step_clock.size()); }
  uint64_t requests() const { return keys.size(); }
};

// Status::usage when the trace is too long to index in 32 bits (replay_fits_in_32_bits).
Result<RequestStream> build_request_stream(const Trace& trace);
// Whether a stream of these counts can be indexed: each below kNeverUsed (4,294,967,295;
// requests run out first, after about 2.9 million K3 tokens). Status::usage naming them if not.
Status replay_fits_in_32_bits(uint64_t steps, uint64_t requests, uint64_t predictions);

// Per-key demand counts of a stream (a routing profile).
std::vector<uint64_t> key_use_counts(const RequestStream& stream);
// Keys ranked by count (descending), ties to the lower key; keys never used are left out.
std::vector<uint32_t> rank_keys_by_use(const std::vector<uint64_t>& counts);
// Temperature of every key at the end of `profile`, re-based to clock 0 of the replay.
std::vector<double> profile_temperatures(const RequestStream& profile, double half_life_tokens);

// Predictor quality at one depth (0: the refresh, listed first when recorded), independent of
// any cache: over every (step, depth d)
// prediction set P and the target step's request set A, recall = sum |P∩A| / sum |A| (targets
// with no prediction at d count with P empty), precision = sum |P∩A| / sum |P|.
// `by_layer[l]`: the same sums over the target steps of layer l only (index = model layer;
// layers without requests stay zero), so recall per layer is correct / requested there.
struct PredictionQuality {
  struct Counts {
    uint64_t predicted = 0, requested = 0, correct = 0;
  };
  uint32_t depth = 0;
  uint64_t predicted = 0, requested = 0, correct = 0;
  double recall = 0, precision = 0;
  std::vector<Counts> by_layer;
};
std::vector<PredictionQuality> prediction_quality(const RequestStream& stream);

struct TierBudget {
  std::string name;    // "vram", "ram"
  uint64_t bytes = 0;  // as given (slots * expert_bytes when given in slots)
  uint64_t slots = 0;  // floor(bytes / expert_bytes)
};

struct ReplaySpec {
  PolicyKind policy = PolicyKind::kLru;
  std::vector<TierBudget> tiers;  // memory tiers, fastest first; the backing store is implicit
  std::string label;              // e.g. "8GB" or "vram=8GB ram=32GB"
};

struct ReplayParams {
  TemperatureParams temperature;
  uint32_t lookahead_depth = 0;  // use recorded predictions up to this depth (0: none)
  bool refresh = true;           // with lookahead_depth >= 1, also the recorded refresh
};

// Inputs derived from a profile (or the trace itself). Shared by all replays of a sweep.
struct ReplayInputs {
  std::vector<uint32_t> static_ranking;  // for kStatic
  std::vector<double> temperature_seed;  // for kTemperature; empty = no seed
  bool static_from_profile = false;
  // Static ranked by the replayed stream's own counts (the oracle-ish baseline); no seed.
  static ReplayInputs from(const RequestStream& stream);
  // Static ranked by the profile trace at `path` and the temperatures at its end as the seed
  // (`half_life_tokens`). The profile must be of `target`'s shape (check_profile_shape). Errors
  // name `flag` (e.g. "--profile"): the trace's own (exit 1/3), usage for another shape.
  static Result<ReplayInputs> from_profile(const std::filesystem::path& path,
                                           const TraceHeader& target, double half_life_tokens,
                                           const std::string& flag);
};

struct TierResult {
  std::string name;
  uint64_t capacity_bytes = 0;  // 0 for the backing store (unbounded)
  uint64_t slots = 0;
  uint64_t hits = 0;          // requests served from this tier
  uint64_t bytes_served = 0;  // hits * expert_bytes
  double hit_rate_bytes = 0;  // bytes_served / bytes requested
};

struct PrefetchResult {
  // Reads started for predicted keys not in tier 0, into each tier whose policy takes them
  // (the fastest of those: where the read lands).
  uint64_t issued = 0;
  // Of those, requested at their target step and served from the fastest tier they were read
  // into or a faster one.
  uint64_t useful = 0;
  uint64_t wasted = 0;  // issued - useful
  uint64_t bytes_issued = 0, bytes_wasted = 0;
  double precision = 0;  // useful / issued
  // useful / (useful + tier-0 demand misses that no useful prefetch served)
  double recall = 0;
  // useful that arrived before need / useful: 1 by construction (0 when none was useful)
  double timeliness = 0;
};

struct ReplayResult {
  PolicyKind policy = PolicyKind::kLru;
  std::string label;
  std::vector<TierResult> tiers;  // memory tiers, then the backing store ("nvme")
  uint64_t requests = 0;
  uint64_t hits = 0;    // served from any memory tier
  double hit_rate = 0;  // hits / requests (= by bytes: every expert has the same size)
  uint64_t bytes_requested = 0;
  uint64_t bytes_read = 0;           // read from the backing store: demand misses + prefetches
  std::vector<uint64_t> link_bytes;  // link i carries tier i+1 -> tier i (last: nvme -> slowest)
  double link_bytes_per_token_last = 0;  // backing store reads per token
  PrefetchResult prefetch;
  double seconds = 0;
};

ReplayResult replay(const RequestStream& stream, const ReplaySpec& spec, const ReplayParams& params,
                    const ReplayInputs& inputs);

// Runs every spec (on up to `threads` threads; 0 = hardware concurrency). Results in spec order.
std::vector<ReplayResult> replay_sweep(const RequestStream& stream,
                                       const std::vector<ReplaySpec>& specs,
                                       const ReplayParams& params, const ReplayInputs& inputs,
                                       unsigned threads = 0);

}  // namespace ktier::strata
