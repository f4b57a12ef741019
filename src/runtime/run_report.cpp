#include "runtime/run_report.h"

#include <cstdio>

namespace ktier::runtime {

EngineCounters EngineCounters::of(const Engine& e) {
  EngineCounters c;
  if (const TrunkStore* t = e.trunk_store()) {
    c.trunk_bytes_read = t->stats().streamed_bytes_read;
    c.trunk_wait_ns = t->stats().io_wait_ns;
    c.trunk_inflate_ns = t->stats().inflate_ns;
  }
  if (const ExpertCache* x = e.expert_cache()) c.experts = x->stats();
  if (const VramExpertTier* v = e.vram_tier()) c.vram = v->stats();
  if (const DeviceTrunk* t = e.device_trunk()) c.device_trunk_streamed = t->streamed_bytes();
  c.io_wait_ns = c.trunk_wait_ns + c.experts.io_wait_ns;
  if (const io::IoEngine* io = e.io_engine()) {
    const io::IoCounters k = io->counters();
    c.io_bytes = k.bytes_delivered;
    c.io_busy_ns = k.busy_ns;
    c.io_reads = k.reads_issued;
    c.io_fixed_reads = k.fixed_reads;
  }
  return c;
}

EngineCounters EngineCounters::start_window(Engine& e) {
  e.begin_report_window();
  return of(e);
}

namespace {
double ratio(uint64_t num, uint64_t den) {
  return den ? static_cast<double>(num) / static_cast<double>(den) : 0.0;
}

// Why the generation ended: "stop text" (`serve`), "interrupted" (Ctrl-C, a client gone),
// "stop token", "context end" (-c) or "length limit" (-n).
const char* stop_name(const RunReport& r) {
  return r.stopped_at_stop_text     ? "stop text"
         : r.gen.interrupted        ? "interrupted"
         : r.gen.stopped_at_stop_id ? "stop token"
         : r.limit_is_context_end   ? "context end"
                                    : "length limit";
}
}  // namespace

nlohmann::json RunReport::to_json(const Engine& e) const {
  const double steps = static_cast<double>(gen.decode_steps);
  const auto per_step = [&](uint64_t v) { return steps > 0 ? static_cast<double>(v) / steps : 0.0; };
  const auto share = [&](uint64_t ns) {
    return gen.decode_seconds > 0 ? static_cast<double>(ns) / 1e9 / gen.decode_seconds : 0.0;
  };
  const EngineCounters& a = decode_start;
  const EngineCounters& b = decode_end;
  const ExpertCacheStats& xa = a.experts;
  const ExpertCacheStats& xb = b.experts;
  const auto d = [](uint64_t end, uint64_t start) { return end - start; };
  const uint64_t hit = d(xb.hit_bytes, xa.hit_bytes), miss = d(xb.miss_bytes, xa.miss_bytes);
  const uint64_t issued = d(xb.prefetch_issued, xa.prefetch_issued);
  // The prefetch figures are those of the prefetches issued in the window and settled (used
  // or lost) in it: not those issued before it (the prefill's, settled in the window: carried),
  // nor those the window's end leaves pending. Recall counts every use in the window: the share
  // of its would-be misses that prefetch covered.
  const uint64_t carried_useful = d(xb.carried_useful, xa.carried_useful);
  const uint64_t carried_wasted = d(xb.carried_wasted, xa.carried_wasted);
  const uint64_t all_useful = d(xb.prefetch_useful, xa.prefetch_useful);
  const uint64_t useful = all_useful - carried_useful;
  const uint64_t timely =
      d(xb.prefetch_timely, xa.prefetch_timely) - d(xb.carried_timely, xa.carried_timely);
  const uint64_t wasted = d(xb.prefetch_wasted, xa.prefetch_wasted) - carried_wasted;
  const uint64_t busy = b.io_busy_ns - a.io_busy_ns;
  const TrunkStore* t = e.trunk_store();
  const ExpertCache* x = e.expert_cache();
  const VramTierStats& va = a.vram;
  const VramTierStats& vb = b.vram;
  const VramExpertTier* v = e.vram_tier();
  const uint64_t vram_useful =
      d(vb.prefetch_useful, va.prefetch_useful) - d(vb.carried_useful, va.carried_useful);
  const uint64_t vram_wasted =
      d(vb.prefetch_wasted, va.prefetch_wasted) - d(vb.carried_wasted, va.carried_wasted);
  const uint64_t vram_timely =
      d(vb.prefetch_timely, va.prefetch_timely) - d(vb.carried_timely, va.carried_timely);
  // As the RAM tier's recall: every use in the window against the fetches copied on demand.
  const uint64_t vram_all_useful = d(vb.prefetch_useful, va.prefetch_useful);
  const uint64_t vram_misses = d(vb.requests, va.requests) - d(vb.hits, va.hits);
  const DeviceTrunk* dt = e.device_trunk();
  // STRATA.md §4: a tier's hit rate is over every demanded byte. In GPU mode the RAM tier sees
  // only the VRAM tier's misses, so its hits are divided by what the VRAM tier was asked for:
  // the VRAM, RAM and NVMe shares then add up to 1.
  const uint64_t vram_demanded =
      d(vb.hit_bytes, va.hit_bytes) + d(vb.miss_bytes, va.miss_bytes);
  const uint64_t demanded = v ? vram_demanded : hit + miss;
  nlohmann::json j = {
      {"prompt_tokens", gen.prompt_tokens},
      {"prompt_cache_tokens", cached_prompt_tokens},
      {"generated_tokens", gen.generated_tokens},
      {"stop", stop_name(*this)},
      {"prefill_s", gen.prefill_seconds},
      {"prefill_tok_per_s", gen.prefill_seconds > 0 ? gen.prompt_tokens / gen.prefill_seconds : 0.0},
      {"decode_steps", gen.decode_steps},
      {"decode_s_per_token", steps > 0 ? gen.decode_seconds / steps : 0.0},
      {"decode_tok_per_s", gen.decode_seconds > 0 ? steps / gen.decode_seconds : 0.0},
      {"bytes_read_per_token",
       {{"trunk", per_step(b.trunk_bytes_read - a.trunk_bytes_read)},
        {"experts", per_step(d(xb.read_bytes, xa.read_bytes))}}},
      {"read_gbps", ratio(b.io_bytes - a.io_bytes, busy)},
      {"io_wait_share", share(b.io_wait_ns - a.io_wait_ns)},
      {"fixed_buffer_read_share", ratio(b.io_fixed_reads - a.io_fixed_reads, b.io_reads - a.io_reads)},
      {"expert_wait_share", share(d(xb.io_wait_ns, xa.io_wait_ns))},
      {"tiers",
       {{"ram",
         {{"hit_rate_bytes", ratio(hit, demanded)},
          {"hits", d(xb.hits, xa.hits)},
          {"requests", d(xb.hits, xa.hits) + d(xb.demand_reads, xa.demand_reads) + d(xb.late, xa.late)},
          {"slots", x ? x->stats().slots : 0},
          {"policy_slots", x ? x->stats().policy_slots : 0},
          {"bytes", x ? x->stats().bytes_allocated : 0}}},
        {"vram",
         {{"hit_rate_bytes", ratio(d(vb.hit_bytes, va.hit_bytes), vram_demanded)},
          {"hits", d(vb.hits, va.hits)},
          {"requests", d(vb.requests, va.requests)},
          {"slots", v ? v->stats().slots : 0},
          {"policy_slots", v ? v->stats().policy_slots : 0},
          {"slot_bytes", v ? v->stats().slot_bytes : 0},
          {"prefetch_issued", d(vb.prefetch_issued, va.prefetch_issued)},
          {"prefetch_useful", vram_useful},
          {"prefetch_timely", vram_timely},
          {"prefetch_wasted", vram_wasted},
          {"prefetch_carried_useful", d(vb.carried_useful, va.carried_useful)},
          {"prefetch_carried_wasted", d(vb.carried_wasted, va.carried_wasted)},
          {"prefetch_precision", ratio(vram_useful, vram_useful + vram_wasted)},
          {"prefetch_recall", ratio(vram_all_useful, vram_all_useful + vram_misses)},
          {"prefetch_timeliness", ratio(vram_timely, vram_useful)}}}}},
      {"links",
       {{"nvme_to_ram_bytes_per_token", per_step(d(xb.read_bytes, xa.read_bytes))},
        {"ram_to_vram_bytes_per_token",
         per_step(d(vb.copied_bytes, va.copied_bytes) + d(b.device_trunk_streamed, a.device_trunk_streamed))}}},
      {"device",
       {{"name", e.backend().name()},
        {"gpu_mode", dt != nullptr},
        {"trunk_layers_resident", dt ? dt->resident_layers() : 0},
        {"trunk_bytes", dt ? dt->bytes() : 0},
        {"vram_budget_bytes", e.device_vram_bytes()},
        {"working_set_bytes", e.device_working_bytes()},
        {"host_page_locked_bytes", e.host_page_locked_bytes()},
        {"host_page_lock_refused_bytes", e.host_page_lock_refused_bytes()},
        {"memory_peak_bytes", e.backend().memory_use().peak},
        {"expert_keys", e.checkpoint().config().num_moe_layers() * e.checkpoint().config().num_experts}}},
      {"prefetch",
       {{"issued", issued},
        {"useful", useful},
        {"timely", timely},
        {"cancelled", d(xb.prefetch_cancelled, xa.prefetch_cancelled)},
        {"carried_useful", carried_useful},
        {"carried_wasted", carried_wasted},
        {"precision", ratio(useful, useful + wasted)},
        {"recall", ratio(all_useful, all_useful + d(xb.demand_reads, xa.demand_reads))},
        {"timeliness", ratio(timely, useful)},
        {"wasted", wasted},
        {"wasted_bytes", d(xb.prefetch_wasted_bytes, xa.prefetch_wasted_bytes) -
                             d(xb.carried_wasted_bytes, xa.carried_wasted_bytes)}}},
      {"policy", x ? std::string(strata::policy_name(x->policy())) : std::string("none")},
      {"lookahead", e.model().lookahead_in_use() ? e.model().lookahead_depth() : 0},
      {"lookahead_refresh", e.model().lookahead_in_use() && e.model().lookahead_refresh()},
      {"trunk_layers_pinned", t ? t->stats().layers_pinned : e.checkpoint().config().num_hidden_layers},
      {"trunk_layers_streamed", t ? t->stats().layers_streamed : 0},  // from disk every token
      {"trunk_bytes", t ? t->stats().bytes_allocated : 0},
      {"router_bank_bytes", e.router_bank() ? e.router_bank()->bytes_allocated() : 0},
      {"peak_rss_bytes", peak_rss_bytes},
      {"budget_bytes", e.budget_bytes()},
      {"threads", e.threads()},
      {"isa", cpu::isa_name(e.exec().isa)},
      {"io_engine", e.io_engine() ? e.io_engine()->name() : "mmap"},
  };
  return j;
}

std::string RunReport::to_table(const Engine& e) const {
  const nlohmann::json j = to_json(e);
  char buf[1024];
  std::string out;
  const double mb = 1e6;
  std::snprintf(buf, sizeof buf, "\nktier: prompt %lld tokens",
                static_cast<long long>(gen.prompt_tokens));
  out += buf;
  if (cached_prompt_tokens > 0) {
    std::snprintf(buf, sizeof buf, " (+%lld from the prompt cache)",
                  static_cast<long long>(cached_prompt_tokens));
    out += buf;
  }
  std::snprintf(buf, sizeof buf, ", generated %lld (%s)\n",
                static_cast<long long>(gen.generated_tokens), stop_name(*this));
  out += buf;
  std::snprintf(buf, sizeof buf, "ktier: prefill %.3f s (%.2f tok/s)", gen.prefill_seconds,
                j["prefill_tok_per_s"].get<double>());
  out += buf;
  if (gen.decode_steps > 0)
    std::snprintf(buf, sizeof buf, "; decode %.3f s/token (%.2f tok/s) over %lld steps\n",
                  j["decode_s_per_token"].get<double>(), j["decode_tok_per_s"].get<double>(),
                  static_cast<long long>(gen.decode_steps));
  else
    std::snprintf(buf, sizeof buf, "; no decode step\n");
  out += buf;
  std::snprintf(buf, sizeof buf,
                "ktier: read/token: trunk %.1f MB, experts %.1f MB; read %.2f GB/s; I/O wait %.0f%% "
                "of decode; expert RAM hit rate %.1f%% (by bytes)\n",
                j["bytes_read_per_token"]["trunk"].get<double>() / mb,
                j["bytes_read_per_token"]["experts"].get<double>() / mb, j["read_gbps"].get<double>(),
                100 * j["io_wait_share"].get<double>(),
                100 * j["tiers"]["ram"]["hit_rate_bytes"].get<double>());
  if (e.trunk_store()) out += buf;
  if (e.device_trunk()) {
    const nlohmann::json& vr = j["tiers"]["vram"];
    std::snprintf(buf, sizeof buf,
                  "ktier: device %s: trunk layers resident %lld of %lld; VRAM expert hit rate "
                  "%.1f%% (by bytes, %llu slots, lookahead copies %llu, useful %llu, landed in "
                  "time %llu); RAM->VRAM %.1f MB/token\n",
                  e.backend().name().c_str(),
                  static_cast<long long>(j["device"]["trunk_layers_resident"].get<int64_t>()),
                  static_cast<long long>(e.checkpoint().config().num_hidden_layers),
                  100 * vr["hit_rate_bytes"].get<double>(),
                  static_cast<unsigned long long>(vr["slots"].get<uint64_t>()),
                  static_cast<unsigned long long>(vr["prefetch_issued"].get<uint64_t>()),
                  static_cast<unsigned long long>(vr["prefetch_useful"].get<uint64_t>()),
                  static_cast<unsigned long long>(vr["prefetch_timely"].get<uint64_t>()),
                  j["links"]["ram_to_vram_bytes_per_token"].get<double>() / mb);
    out += buf;
    std::snprintf(buf, sizeof buf,
                  "ktier: device memory: peak %.1f MB of --vram %.1f MB (trunk %.1f MB, working "
                  "set %.1f MB, expert slots the rest)\n",
                  j["device"]["memory_peak_bytes"].get<double>() / mb,
                  j["device"]["vram_budget_bytes"].get<double>() / mb,
                  j["device"]["trunk_bytes"].get<double>() / mb,
                  j["device"]["working_set_bytes"].get<double>() / mb);
    out += buf;
    if (e.host_page_lock_refused_bytes() > 0) {
      std::snprintf(buf, sizeof buf,
                    "ktier: device copies: %.1f MB of host memory not page-locked (refused; "
                    "RLIMIT_MEMLOCK?): their copies ran slower\n",
                    static_cast<double>(e.host_page_lock_refused_bytes()) / mb);
      out += buf;
    }
  }
  if (e.expert_cache()) {
    const nlohmann::json& p = j["prefetch"];
    const nlohmann::json& ram = j["tiers"]["ram"];
    // Rates over nothing are not shown as 0%: without lookahead or a decode step nothing was
    // prefetched, and a decode whose experts the RAM tier already held (or never saw: in GPU
    // mode it is asked only for the VRAM tier's misses) issued none (the prefill's, settling
    // in the decode, are only in the JSON's carried_*). These are the RAM tier's reads ahead
    // from disk; the device line counts the VRAM tier's copies.
    char prefetch[160];
    const uint64_t prefetches = p["issued"].get<uint64_t>() + p["useful"].get<uint64_t>() +
                                p["wasted"].get<uint64_t>();
    const uint64_t requests = ram["requests"].get<uint64_t>();
    if (j["lookahead"].get<int>() == 0) {
      std::snprintf(prefetch, sizeof prefetch, "no prefetch");
    } else if (gen.decode_steps == 0) {
      std::snprintf(prefetch, sizeof prefetch, "no decode step");
    } else if (prefetches == 0 && requests == 0) {
      std::snprintf(prefetch, sizeof prefetch,
                    "no read-ahead in the decode: the RAM tier was asked for nothing");
    } else if (prefetches == 0 && ram["hits"].get<uint64_t>() == requests) {
      std::snprintf(prefetch, sizeof prefetch,
                    "no read-ahead in the decode: the RAM tier held every expert asked of it");
    } else {
      std::snprintf(prefetch, sizeof prefetch,
                    "prefetch precision %.1f%%, recall %.1f%%, timely %.1f%%, wasted %.1f MB",
                    100 * p["precision"].get<double>(), 100 * p["recall"].get<double>(),
                    100 * p["timeliness"].get<double>(), p["wasted_bytes"].get<double>() / mb);
    }
    std::snprintf(buf, sizeof buf,
                  "ktier: experts: %s policy, lookahead %d%s; %s; waiting on experts %.0f%% of "
                  "decode\n",
                  j["policy"].get<std::string>().c_str(), j["lookahead"].get<int>(),
                  j["lookahead_refresh"].get<bool>() ? " + refresh" : "", prefetch,
                  100 * j["expert_wait_share"].get<double>());
    out += buf;
  }
  const uint64_t budget = e.budget_bytes();
  char budget_text[48] = "";
  if (budget && budget != UINT64_MAX)
    std::snprintf(budget_text, sizeof budget_text, " (budget %.1f MB)",
                  static_cast<double>(budget) / mb);
  char on_device[48] = "";
  if (const DeviceTrunk* dt = e.device_trunk())
    std::snprintf(on_device, sizeof on_device, " (the device holds %lld)",
                  static_cast<long long>(dt->resident_layers()));
  std::snprintf(buf, sizeof buf, "ktier: %strunk layers pinned %lld, streamed %lld%s; peak RSS %.1f "
                "MB%s; %d threads, %s, %s\n", e.device_trunk() ? "host " : "",
                static_cast<long long>(j["trunk_layers_pinned"].get<int64_t>()),
                static_cast<long long>(j["trunk_layers_streamed"].get<int64_t>()), on_device,
                peak_rss_bytes / mb, budget_text,
                e.threads(), cpu::isa_name(e.exec().isa), j["io_engine"].get<std::string>().c_str());
  out += buf;
  return out;
}

}  // namespace ktier::runtime
