// Trace replay. The model and every metric are defined in replay.h and docs/STRATA.md §3-§4.
#include "strata/replay.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <functional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "common/check.h"
#include "cpu/worker_thread.h"

namespace ktier::strata {
namespace {

uint64_t token_id(uint32_t pass, uint32_t position) {
  return (static_cast<uint64_t>(pass) << 32) | position;
}
// A step's place: its token (token_id) and layer, every bit of each kept.
struct StepPlace {
  uint64_t token = 0;
  uint32_t layer = 0;
  bool operator==(const StepPlace&) const = default;
};
struct StepPlaceHash {
  size_t operator()(const StepPlace& p) const {
    return std::hash<uint64_t>()((p.token * 0x9E3779B97F4A7C15ull) ^ p.layer);
  }
};

}  // namespace

Status replay_fits_in_32_bits(uint64_t steps, uint64_t requests, uint64_t predictions) {
  if (std::max({steps, requests, predictions}) < kNeverUsed) return Status::ok();
  return Status::usage("the trace is too long to replay: " + std::to_string(steps) + " steps, " +
                       std::to_string(requests) + " requests, " + std::to_string(predictions) +
                       " predictions; replay indexes each in 32 bits (fewer than " +
                       std::to_string(kNeverUsed) + "): record or replay a shorter run");
}

Result<RequestStream> build_request_stream(const Trace& trace) {
  const TraceHeader& h = trace.header;
  // Requests, predictions and steps are indexed in 32 bits (kNeverUsed is the largest).
  uint64_t requests = 0, predictions = 0;
  for (const TraceStep& s : trace.steps) {
    requests += s.chosen.size();
    predictions += s.refreshed.size();
    for (const auto& list : s.predicted) predictions += list.size();
  }
  KTIER_RETURN_IF_ERROR(replay_fits_in_32_bits(trace.steps.size(), requests, predictions));
  RequestStream st;
  st.experts_per_layer = h.experts_per_layer;
  st.num_keys = h.num_layers * h.experts_per_layer;
  st.expert_bytes = h.expert_bytes;
  st.lookahead_depth = h.lookahead_depth;
  st.refresh = (h.flags & kTraceFlagRefresh) != 0;

  std::vector<uint8_t> layer_seen(h.num_layers, 0);
  std::unordered_set<uint64_t> tokens, passes;
  for (const TraceStep& s : trace.steps) {
    if (!s.chosen.empty()) layer_seen[s.layer] = 1;
    tokens.insert(token_id(s.pass, s.position));
    passes.insert(s.pass);
  }
  st.moe_layers = static_cast<uint32_t>(std::count(layer_seen.begin(), layer_seen.end(), 1));
  st.tokens = tokens.size();
  st.passes = static_cast<uint32_t>(passes.size());
  const double steps_per_token = std::max<uint32_t>(st.moe_layers, 1);

  const size_t n_steps = trace.steps.size();
  st.step_begin.reserve(n_steps + 1);
  st.step_clock.reserve(n_steps);
  uint64_t steps_with_requests = 0;
  for (const TraceStep& s : trace.steps) {
    st.step_begin.push_back(static_cast<uint32_t>(st.keys.size()));
    st.step_clock.push_back(static_cast<double>(steps_with_requests) / steps_per_token);
    if (!s.chosen.empty()) ++steps_with_requests;
    for (const ExpertWeight& e : s.chosen)
      st.keys.push_back(s.layer * h.experts_per_layer + e.expert);
  }
  st.step_begin.push_back(static_cast<uint32_t>(st.keys.size()));

  st.next_use.assign(st.keys.size(), kNeverUsed);
  std::vector<uint32_t> later(st.num_keys, kNeverUsed);
  for (size_t r = st.keys.size(); r-- > 0;) {
    st.next_use[r] = later[st.keys[r]];
    later[st.keys[r]] = static_cast<uint32_t>(r);
  }

  // Predictions: resolve (token, layer + d) to the step that requests it.
  st.prediction_begin.reserve(n_steps + 1);
  std::unordered_map<StepPlace, uint32_t, StepPlaceHash> step_of;
  if (h.lookahead_depth > 0) {
    for (uint32_t i = 0; i < n_steps; ++i) {
      const TraceStep& s = trace.steps[i];
      step_of.emplace(StepPlace{token_id(s.pass, s.position), s.layer}, i);
    }
  }
  for (uint32_t i = 0; i < n_steps; ++i) {
    st.prediction_begin.push_back(static_cast<uint32_t>(st.predictions.size()));
    const TraceStep& s = trace.steps[i];
    for (size_t d = 0; d < s.predicted.size(); ++d) {
      const uint32_t layer = s.layer + static_cast<uint32_t>(d) + 1;
      const auto it = step_of.find(StepPlace{token_id(s.pass, s.position), layer});
      if (layer >= h.num_layers || it == step_of.end() || it->second <= i) {
        st.predictions_without_target += s.predicted[d].size();
        continue;
      }
      for (const ExpertWeight& e : s.predicted[d]) {
        st.predictions.push_back(
            {it->second, layer * h.experts_per_layer + e.expert, static_cast<uint8_t>(d + 1)});
      }
    }
    // The next step's refresh, issued here (its target is that step itself).
    if (i + 1 < n_steps) {
      const TraceStep& next = trace.steps[i + 1];
      for (const ExpertWeight& e : next.refreshed)
        st.predictions.push_back({i + 1, next.layer * h.experts_per_layer + e.expert, 0});
    }
  }
  if (n_steps > 0) st.predictions_without_target += trace.steps[0].refreshed.size();
  st.prediction_begin.push_back(static_cast<uint32_t>(st.predictions.size()));
  return st;
}

std::vector<uint64_t> key_use_counts(const RequestStream& stream) {
  std::vector<uint64_t> counts(stream.num_keys, 0);
  for (uint32_t k : stream.keys) ++counts[k];
  return counts;
}

std::vector<uint32_t> rank_keys_by_use(const std::vector<uint64_t>& counts) {
  std::vector<uint32_t> ranking;
  for (uint32_t k = 0; k < counts.size(); ++k) {
    if (counts[k] > 0) ranking.push_back(k);
  }
  std::stable_sort(ranking.begin(), ranking.end(),
                   [&](uint32_t a, uint32_t b) { return counts[a] > counts[b]; });
  return ranking;
}

std::vector<double> profile_temperatures(const RequestStream& profile, double half_life_tokens) {
  std::vector<double> temp(profile.num_keys, 0.0);
  const uint32_t steps = profile.steps();
  if (steps == 0) return temp;
  // The clock after the last step: one step past its start.
  const double end = profile.step_clock.back() + 1.0 / std::max<uint32_t>(profile.moe_layers, 1);
  for (uint32_t s = 0; s < steps; ++s) {
    const double w = std::exp2(-(end - profile.step_clock[s]) / half_life_tokens);
    for (uint32_t r = profile.step_begin[s]; r < profile.step_begin[s + 1]; ++r) {
      temp[profile.keys[r]] += w;
    }
  }
  return temp;
}

std::vector<PredictionQuality> prediction_quality(const RequestStream& stream) {
  std::vector<PredictionQuality> out;
  const uint32_t steps = stream.steps();
  for (uint32_t d = stream.refresh ? 0 : 1; d <= stream.lookahead_depth; ++d) {
    PredictionQuality q;
    q.depth = d;
    q.requested = stream.requests();
    std::vector<std::vector<uint32_t>> by_target(steps);
    for (const Prediction& p : stream.predictions) {
      if (p.depth == d) by_target[p.target_step].push_back(p.key);
    }
    q.by_layer.resize(stream.num_keys / std::max<uint32_t>(stream.experts_per_layer, 1));
    for (uint32_t t = 0; t < steps; ++t) {
      const uint32_t first = stream.step_begin[t], end = stream.step_begin[t + 1];
      if (first == end) continue;
      PredictionQuality::Counts& layer = q.by_layer[stream.keys[first] / stream.experts_per_layer];
      layer.requested += end - first;
      layer.predicted += by_target[t].size();
      for (uint32_t key : by_target[t]) {
        for (uint32_t r = first; r < end; ++r) {
          if (stream.keys[r] == key) {
            ++layer.correct;
            break;
          }
        }
      }
    }
    for (const PredictionQuality::Counts& layer : q.by_layer) {
      q.predicted += layer.predicted;
      q.correct += layer.correct;
    }
    q.recall = q.requested ? static_cast<double>(q.correct) / q.requested : 0;
    q.precision = q.predicted ? static_cast<double>(q.correct) / q.predicted : 0;
    out.push_back(q);
  }
  return out;
}

ReplayInputs ReplayInputs::from(const RequestStream& stream) {
  ReplayInputs in;
  in.static_ranking = rank_keys_by_use(key_use_counts(stream));
  return in;
}

Result<ReplayInputs> ReplayInputs::from_profile(const std::filesystem::path& path,
                                                const TraceHeader& target,
                                                double half_life_tokens, const std::string& flag) {
  Result<Trace> read = read_trace(path);
  if (!read.is_ok()) return read.status().with_context(flag);
  KTIER_RETURN_IF_ERROR(check_profile_shape(read->header, target, flag + " " + path.string()));
  KTIER_ASSIGN_OR_RETURN(const RequestStream profile, build_request_stream(*read));
  ReplayInputs in;
  in.static_ranking = rank_keys_by_use(key_use_counts(profile));
  in.temperature_seed = profile_temperatures(profile, half_life_tokens);
  in.static_from_profile = true;
  return in;
}

ReplayResult replay(const RequestStream& stream, const ReplaySpec& spec, const ReplayParams& params,
                    const ReplayInputs& inputs) {
  const auto t0 = std::chrono::steady_clock::now();
  const size_t n = spec.tiers.size();
  KTIER_CHECK(n >= 1);
  const uint64_t eb = stream.expert_bytes;

  PolicyInputs pin;
  pin.num_keys = stream.num_keys;
  pin.temperature = params.temperature;
  pin.static_ranking = &inputs.static_ranking;
  if (!inputs.temperature_seed.empty()) pin.temperature_seed = &inputs.temperature_seed;
  const bool lookahead = params.lookahead_depth > 0 && !stream.predictions.empty();
  // Belady's prefetch needs each key's next request from here on: first uses, then next_use.
  std::vector<uint32_t> upcoming;
  if (lookahead && spec.policy == PolicyKind::kBelady) {
    upcoming.assign(stream.num_keys, kNeverUsed);
    for (size_t r = stream.requests(); r-- > 0;) upcoming[stream.keys[r]] = static_cast<uint32_t>(r);
    pin.belady_upcoming = &upcoming;
  }
  std::vector<std::unique_ptr<CacheModel>> caches;
  uint64_t cumulative = 0;
  for (const TierBudget& t : spec.tiers) {
    cumulative += t.slots;
    caches.push_back(make_cache(spec.policy, cumulative, pin));
  }

  std::vector<uint64_t> served_count(n + 1, 0);  // index n = backing store
  std::vector<uint64_t> link_bytes(n, 0);
  PrefetchResult pf;
  std::vector<int64_t> pending_target;
  std::vector<uint8_t> pending_tier;  // the fastest tier a pending prefetch was read into
  uint64_t useful_below_tier0 = 0;    // useful prefetches read into a slower tier than 0
  std::vector<std::vector<uint32_t>> pending_by_step;
  if (lookahead) {
    pending_target.assign(stream.num_keys, -1);
    pending_tier.assign(stream.num_keys, 0);
    pending_by_step.resize(stream.steps());
  }

  const uint32_t steps = stream.steps();
  for (uint32_t s = 0; s < steps; ++s) {
    for (auto& c : caches) c->begin_step(s);
    const double clock = stream.step_clock[s];
    for (uint32_t r = stream.step_begin[s]; r < stream.step_begin[s + 1]; ++r) {
      const uint32_t key = stream.keys[r];
      size_t served = n;
      for (size_t i = 0; i < n; ++i) {
        if (caches[i]->contains(key)) {
          served = i;
          break;
        }
      }
      if (lookahead && pending_target[key] == s) {
        if (served <= pending_tier[key]) {
          ++pf.useful;
          if (served > 0) ++useful_below_tier0;
        }
        pending_target[key] = -1;
      }
      const Request req{r, clock, stream.next_use[r]};
      if (!upcoming.empty()) upcoming[key] = stream.next_use[r];
      for (auto& c : caches) (void)c->access(key, req);
      ++served_count[served];
      for (size_t i = 0; i < served; ++i) link_bytes[i] += eb;
    }
    if (!lookahead) continue;
    for (uint32_t key : pending_by_step[s]) {
      if (pending_target[key] == s) {  // not used at its step: wasted
        pending_target[key] = -1;
        for (auto& c : caches) c->prefetch_unused(key);
      }
    }
    std::vector<uint32_t>().swap(pending_by_step[s]);
    for (uint32_t p = stream.prediction_begin[s]; p < stream.prediction_begin[s + 1]; ++p) {
      const Prediction& pred = stream.predictions[p];
      if (pred.depth == 0 ? !params.refresh : pred.depth > params.lookahead_depth) continue;
      if (caches[0]->contains(pred.key)) {  // nothing to read; kept until its step
        for (auto& c : caches) c->protect(pred.key, pred.target_step);
        continue;
      }
      size_t from = n;
      for (size_t i = 1; i < n; ++i) {
        if (caches[i]->contains(pred.key)) {
          from = i;
          break;
        }
      }
      // Each tier takes it if its policy admits it, as the live tiers prefetch each on its own
      // link (a VRAM tier whose slots are all pinned leaves it to the RAM tier, which still
      // reads it); a tier that holds it keeps it until its step.
      size_t top = n;
      for (size_t i = 0; i < n; ++i) {
        if (caches[i]->prefetch(pred.key, pred.target_step, clock))
          top = std::min(top, i);
        else
          caches[i]->protect(pred.key, pred.target_step);
      }
      if (top >= from) continue;  // no tier faster than the one holding it took it
      ++pf.issued;
      for (size_t i = top; i < from; ++i) link_bytes[i] += eb;
      pending_target[pred.key] = pred.target_step;
      pending_tier[pred.key] = static_cast<uint8_t>(top);
      pending_by_step[pred.target_step].push_back(pred.key);
    }
  }

  ReplayResult res;
  res.policy = spec.policy;
  res.label = spec.label;
  res.requests = stream.requests();
  res.bytes_requested = res.requests * eb;
  uint64_t cap_slots = 0;
  for (size_t i = 0; i <= n; ++i) {
    TierResult t;
    if (i < n) {
      t.name = spec.tiers[i].name;
      t.capacity_bytes = spec.tiers[i].bytes;
      t.slots = spec.tiers[i].slots;
      cap_slots += t.slots;
      res.hits += served_count[i];
    } else {
      t.name = "nvme";
    }
    t.hits = served_count[i];
    t.bytes_served = t.hits * eb;
    t.hit_rate_bytes =
        res.bytes_requested ? static_cast<double>(t.bytes_served) / res.bytes_requested : 0;
    res.tiers.push_back(t);
  }
  res.hit_rate = res.requests ? static_cast<double>(res.hits) / res.requests : 0;
  res.link_bytes = link_bytes;
  res.bytes_read = link_bytes[n - 1];
  res.link_bytes_per_token_last =
      stream.tokens ? static_cast<double>(res.bytes_read) / stream.tokens : 0;
  pf.wasted = pf.issued - pf.useful;
  pf.bytes_issued = pf.issued * eb;
  pf.bytes_wasted = pf.wasted * eb;
  pf.precision = pf.issued ? static_cast<double>(pf.useful) / pf.issued : 0;
  // Would-be misses that no prefetch covered: tier 0's misses less the useful prefetches served
  // from the slower tier they were read into.
  const uint64_t uncovered = res.requests - served_count[0] - useful_below_tier0;
  pf.recall =
      pf.useful + uncovered ? static_cast<double>(pf.useful) / (pf.useful + uncovered) : 0;
  pf.timeliness = pf.useful > 0 ? 1.0 : 0.0;  // 0 over nothing, as the run report's ratios
  res.prefetch = pf;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

std::vector<ReplayResult> replay_sweep(const RequestStream& stream,
                                       const std::vector<ReplaySpec>& specs,
                                       const ReplayParams& params, const ReplayInputs& inputs,
                                       unsigned threads) {
  std::vector<ReplayResult> results(specs.size());
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = std::min<unsigned>(threads, std::max<size_t>(specs.size(), 1));
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < specs.size();) {
      results[i] = replay(stream, specs[i], params, inputs);
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);  // before any starts: a growth's bad_alloc past one is terminate
  for (unsigned t = 1; t < threads; ++t) {
    try {
      pool.emplace_back([&] { run_worker("replay", worker); });
    } catch (const std::exception&) {
      break;  // a thread the system will not start: fewer threads, the same results
    }
  }
  // As the pool's: a bad_alloc unwinding here past joinable threads would be std::terminate.
  run_worker("replay", worker);
  for (auto& t : pool) t.join();
  return results;
}

}  // namespace ktier::strata
