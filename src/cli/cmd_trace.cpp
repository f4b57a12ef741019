// `ktier trace`: convert, inspect and replay routing traces (strata, issue 5; docs/STRATA.md §6).
//   trace convert IN.bin OUT.ktrace          conformance expert_trace.bin -> ktier trace
//   trace convert-k3c IN.bin -o OUT.ktrace   the same, spelled as the acceptance checks call it
//   trace info TRACE                         summary, distinct keys, hit ceiling, determinism
//   trace replay TRACE --policy ... --ram SIZES [--vram SIZES] [--csv F] [--json F] [--plot F]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/cli_input.h"
#include "cli/commands.h"
#include "io/output_file.h"
#include "strata/budget.h"
#include "strata/conformance_trace.h"
#include "strata/replay.h"
#include "strata/replay_report.h"
#include "strata/trace_format.h"
#include "strata/trace_summary.h"

namespace ktier::cli {
namespace {

using namespace ktier::strata;

struct LoadOptions {
  bool convert_conformance = false;
  bool convert_flag = true;  // --convert-conformance is how convert_conformance was asked
  uint64_t expert_bytes = 0;  // 0: from the trace header (conformance: K3's size)
  uint32_t top_k = kK3TopK;   // conformance conversion only
  uint32_t experts_per_layer = kK3ExpertsPerLayer;
};

Result<Trace> load_trace(const std::string& path, const LoadOptions& o) {
  Trace trace;
  if (o.convert_conformance) {
    ConformanceTraceOptions c;
    c.top_k = o.top_k;
    c.experts_per_layer = o.experts_per_layer;
    if (o.expert_bytes) c.expert_bytes = o.expert_bytes;
    Result<Trace> converted = read_conformance_trace(path, c);
    if (!converted.is_ok() && looks_like_ktier_trace(path))
      return converted.status().with_note(
          o.convert_flag ? "It is a ktier trace: read it without --convert-conformance"
                         : "It is a ktier trace already: nothing to convert");
    KTIER_ASSIGN_OR_RETURN(trace, std::move(converted));
  } else {
    Result<Trace> read = read_trace(path);
    std::error_code ec;  // a FIFO or a folder is not said to be some other format
    if (!read.is_ok() && read.status().code() == ExitCode::kCorrupt &&
        std::filesystem::is_regular_file(path, ec) && !looks_like_ktier_trace(path))
      return read.status().with_note("Or read it as one with --convert-conformance");
    KTIER_ASSIGN_OR_RETURN(trace, std::move(read));
  }
  if (o.expert_bytes) trace.header.expert_bytes = o.expert_bytes;
  return trace;
}

void add_load_options(CLI::App* sub, LoadOptions& o, bool conversion_flag) {
  CLI::Option* conversion = nullptr;
  if (conversion_flag) {
    conversion = sub->add_flag("--convert-conformance", o.convert_conformance,
                               "TRACE is the conformance expert_trace.bin (int32 pairs); convert "
                               "on the fly");
  }
  sub->add_option("--expert-bytes", o.expert_bytes,
                  "bytes per routed expert (0 or unset: the trace's own; a conformance trace: K3's "
                  "17547264)")
      ->transform(whole_number<decltype(o.expert_bytes)>(strata::kMaxExpertBytes));
  CLI::Option* top_k =
      sub->add_option("--top-k", o.top_k, "conformance input: records per (token, layer) group")
          ->transform(whole_number<decltype(o.top_k)>())
          ->capture_default_str();
  CLI::Option* experts = sub->add_option("--experts-per-layer", o.experts_per_layer,
                                         "conformance input: routed experts per MoE layer")
                             ->transform(whole_number<decltype(o.experts_per_layer)>())
                             ->capture_default_str();
  if (conversion) {  // a ktier trace states both itself: given without it they were ignored
    top_k->needs(conversion);
    experts->needs(conversion);
  }
}

Status run_convert(const std::string& in, const std::string& out, LoadOptions o) {
  if (out.empty()) return Status::usage("trace convert: give the output file");
  KTIER_RETURN_IF_ERROR(check_output_is_not_input("trace convert: the output", out, {{"IN", in}}));
  KTIER_RETURN_IF_ERROR(io::check_not_own_stdout("trace convert: the output", out));
  KTIER_RETURN_IF_ERROR(io::check_can_write("trace convert: the output", out));
  o.convert_conformance = true;
  o.convert_flag = false;  // converting is what the command does
  KTIER_ASSIGN_OR_RETURN(const Trace trace, load_trace(in, o));
  KTIER_RETURN_IF_ERROR(write_trace(out, trace));
  KTIER_ASSIGN_OR_RETURN(const RequestStream stream, build_request_stream(trace));
  std::printf("wrote %s: %s steps, %s requests, %u passes, %s tokens\n", out.c_str(),
              format_count(trace.steps.size()).c_str(), format_count(stream.requests()).c_str(),
              stream.passes, format_count(stream.tokens).c_str());
  return Status::ok();
}

Status run_info(const std::string& path, const LoadOptions& o) {
  KTIER_ASSIGN_OR_RETURN(const Trace trace, load_trace(path, o));
  KTIER_ASSIGN_OR_RETURN(const RequestStream stream, build_request_stream(trace));
  const TraceSummary summary = summarize_trace(trace, stream);
  std::fputs(format_summary(summary, trace.header, path).c_str(), stdout);
  return Status::ok();
}

struct ReplayOptions {
  std::string trace;
  LoadOptions load;
  std::string policies = "all";
  std::string ram, vram, slots;
  double half_life = kDefaultHalfLifeTokens;
  double admit_ratio = kDefaultAdmitRatio;
  double window_fraction = kDefaultWindowFraction;
  bool fixed_window = false;
  uint32_t lookahead = 0;
  bool no_refresh = false;
  std::string profile;
  std::string csv, json, plot;
  int threads = 0;
};

Status run_replay(const ReplayOptions& o) {
  // (Far smaller ones make the token clock over the half-life infinite: NaN scores.)
  if (!(o.half_life >= kMinHalfLifeTokens) || !std::isfinite(o.half_life))
    return Status::usage("--half-life must be a finite number of tokens, at least 0.001");
  if (!(o.admit_ratio > 0) || !std::isfinite(o.admit_ratio))
    return Status::usage("--admit-ratio must be a finite number > 0");
  for (const auto& [flag, out] : {std::pair<std::string, std::string>{"--csv", o.csv},
                                  {"--json", o.json}, {"--plot", o.plot}}) {
    KTIER_RETURN_IF_ERROR(check_output_is_not_input(
        flag, out, {{"TRACE", o.trace}, {"--profile", o.profile}}));
    KTIER_RETURN_IF_ERROR(io::check_can_write(flag, out));
  }
  KTIER_RETURN_IF_ERROR(check_output_is_not_input("--json", o.json, {{"--csv", o.csv}}));
  KTIER_RETURN_IF_ERROR(
      check_output_is_not_input("--plot", o.plot, {{"--csv", o.csv}, {"--json", o.json}}));
  if (!(o.window_fraction >= 0 && o.window_fraction <= 1)) {
    return Status::usage("--window-fraction must be in 0..1");
  }
  if (!o.slots.empty() && !o.ram.empty()) {
    return Status::usage("give the RAM tier once: --ram SIZES or --slots N,... (not both)");
  }
  if (o.slots.empty() && o.ram.empty() && o.vram.empty()) {
    return Status::usage(
        "trace replay needs budgets: --ram SIZES (e.g. 8GB,16GB or 455x), "
        "--slots N,..., and/or --vram SIZES");
  }
  KTIER_ASSIGN_OR_RETURN(const std::vector<PolicyKind> policies, parse_policy_list(o.policies));
  KTIER_ASSIGN_OR_RETURN(const Trace trace, load_trace(o.trace, o.load));
  KTIER_ASSIGN_OR_RETURN(const RequestStream stream, build_request_stream(trace));
  if (stream.requests() == 0)
    return Status::usage(o.trace + ": the trace holds no requests to replay");
  const uint64_t eb = stream.expert_bytes;
  if (o.lookahead > stream.lookahead_depth) {
    return Status::usage("--lookahead " + std::to_string(o.lookahead) + ": " + o.trace +
                         " records predictions to depth " + std::to_string(stream.lookahead_depth) +
                         " only");
  }

  // Budget lists: RAM from --ram or --slots, VRAM from --vram; a sweep is their product.
  std::vector<Budget> ram, vram;
  if (!o.slots.empty()) {
    KTIER_ASSIGN_OR_RETURN(ram, parse_slot_list(o.slots, eb, "--slots"));
  } else if (!o.ram.empty()) {
    KTIER_ASSIGN_OR_RETURN(ram, parse_budget_list(o.ram, eb, "--ram"));
  }
  if (!o.vram.empty()) {
    KTIER_ASSIGN_OR_RETURN(vram, parse_budget_list(o.vram, eb, "--vram"));
  }
  std::vector<ReplaySpec> specs;
  for (PolicyKind p : policies) {
    for (size_t v = 0; v < std::max<size_t>(vram.size(), 1); ++v) {
      for (size_t r = 0; r < std::max<size_t>(ram.size(), 1); ++r) {
        ReplaySpec spec;
        spec.policy = p;
        if (!vram.empty()) spec.tiers.push_back({"vram", vram[v].bytes, vram[v].slots});
        if (!ram.empty()) spec.tiers.push_back({"ram", ram[r].bytes, ram[r].slots});
        spec.label = vram.empty()  ? ram[r].label
                     : ram.empty() ? vram[v].label
                                   : "vram=" + vram[v].label + " ram=" + ram[r].label;
        specs.push_back(std::move(spec));
      }
    }
  }

  ReplayParams params;
  params.temperature.half_life_tokens = o.half_life;
  params.temperature.admit_ratio = o.admit_ratio;
  params.temperature.window_fraction = o.window_fraction;
  params.temperature.adapt_window = !o.fixed_window;
  params.lookahead_depth = o.lookahead;
  params.refresh = !o.no_refresh;
  ReplayInputs inputs = ReplayInputs::from(stream);
  // A profile's keys are the trace's: the same layers and experts (no padding or truncation).
  if (!o.profile.empty()) {
    KTIER_ASSIGN_OR_RETURN(inputs, ReplayInputs::from_profile(o.profile, trace.header,
                                                              o.half_life, "--profile"));
  }

  const TraceSummary summary = summarize_trace(trace, stream);
  std::printf(
      "trace %s: %s steps, %s requests, %s tokens, %s distinct keys "
      "(hit ceiling without prefetch %s = %.2f%%)\n",
      o.trace.c_str(), format_count(summary.steps).c_str(), format_count(summary.requests).c_str(),
      format_count(summary.tokens).c_str(), format_count(summary.distinct_keys).c_str(),
      format_count(summary.hit_ceiling).c_str(), 100.0 * summary.hit_ceiling_rate);
  std::printf(
      "expert bytes %s; temperature half-life %g tokens, admit ratio %g, window %g%s; "
      "static ranked by %s; lookahead depth %u%s\n\n",
      format_count(eb).c_str(), o.half_life, o.admit_ratio, o.window_fraction,
      o.fixed_window ? " fixed" : " adaptive",
      inputs.static_from_profile ? ("the profile " + o.profile).c_str()
                                 : "this trace's own counts (oracle-ish)",
      o.lookahead,
      o.lookahead > 0 && stream.refresh ? (o.no_refresh ? ", refresh not used" : " + refresh")
                                        : "");

  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<ReplayResult> results = replay_sweep(stream, specs, params, inputs, static_cast<unsigned>(o.threads));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fputs(format_replay_table(results, o.lookahead > 0).c_str(), stdout);
  std::printf("\n%zu replays of %s requests in %.2f s\n", results.size(),
              format_count(stream.requests()).c_str(), seconds);

  if (!o.csv.empty()) KTIER_RETURN_IF_ERROR(write_replay_csv(o.csv, results));
  if (!o.json.empty()) {
    KTIER_RETURN_IF_ERROR(write_replay_json(o.json, o.trace, summary, params, results));
  }
  if (!o.plot.empty()) {
    const std::string title = std::filesystem::path(o.trace).filename().string() + ": " +
                              format_count(stream.requests()) + " expert requests";
    // A prefetched key's first request can hit: the compulsory-miss ceiling bounds demand only.
    KTIER_RETURN_IF_ERROR(
        plot_replay(results, o.plot, title, o.lookahead > 0 ? -1.0 : summary.hit_ceiling_rate));
  }
  return Status::ok();
}

}  // namespace

void register_trace_command(CLI::App& app, int& exit_code) {
  auto* trace = app.add_subcommand("trace", "Convert, inspect and replay expert routing traces");
  trace->require_subcommand(1);

  {
    struct Args {
      std::string in, out;
      LoadOptions load;
    };
    auto a = std::make_shared<Args>();
    auto* sub = trace->add_subcommand(
        "convert", "Convert the conformance expert_trace.bin (int32 pairs) to a ktier trace");
    sub->add_option("IN", a->in, "conformance trace (int32 layer, expert pairs)")->required();
    sub->add_option("OUT", a->out, "ktier trace to write")->required();
    add_load_options(sub, a->load, /*conversion_flag=*/false);
    sub->callback([a, &exit_code] { exit_code = finish(run_convert(a->in, a->out, a->load)); });

    auto b = std::make_shared<Args>();
    auto* k3c = trace->add_subcommand("convert-k3c", "Same as convert, output given with -o");
    k3c->add_option("IN", b->in, "conformance trace (int32 layer, expert pairs)")->required();
    k3c->add_option("-o,--output", b->out, "ktier trace to write")->required();
    add_load_options(k3c, b->load, /*conversion_flag=*/false);
    k3c->callback([b, &exit_code] { exit_code = finish(run_convert(b->in, b->out, b->load)); });
  }
  {
    struct Args {
      std::string path;
      LoadOptions load;
    };
    auto a = std::make_shared<Args>();
    auto* sub = trace->add_subcommand(
        "info", "Summarise a trace: tokens, layers, distinct keys, hit ceiling, determinism");
    sub->add_option("TRACE", a->path,
                    "ktier trace (or conformance .bin with --convert-conformance)")
        ->required();
    add_load_options(sub, a->load, /*conversion_flag=*/true);
    sub->callback([a, &exit_code] { exit_code = finish(run_info(a->path, a->load)); });
  }
  {
    auto o = std::make_shared<ReplayOptions>();
    auto* sub = trace->add_subcommand(
        "replay", "Replay a trace under cache policies over sweeps of tier budgets");
    sub->add_option("TRACE", o->trace,
                    "ktier trace (or conformance .bin with --convert-conformance)")
        ->required();
    add_load_options(sub, o->load, /*conversion_flag=*/true);
    sub->add_option("--policy", o->policies,
                    "comma list of lru, lfu, temperature, static, belady, or all")
        ->capture_default_str();
    sub->add_option("--ram,--budgets", o->ram,
                    "RAM tier sizes, comma list: 8GB (1e9), 16GiB or 16G (2^30), 8e9, or 455x (experts)");
    sub->add_option("--slots", o->slots, "RAM tier sizes in experts, comma list (= --ram Nx,...)");
    sub->add_option("--vram", o->vram, "VRAM tier sizes (the fastest tier), comma list");
    sub->add_option("--half-life", o->half_life, "temperature half-life in tokens (at least 0.001)")
        ->capture_default_str();
    sub->add_option("--admit-ratio", o->admit_ratio,
                    "temperature admission hysteresis: a newcomer must be this many times "
                    "hotter than the coldest resident")
        ->capture_default_str();
    sub->add_option("--window-fraction", o->window_fraction,
                    "temperature: initial share of the capacity kept as a recency window")
        ->capture_default_str();
    sub->add_flag("--fixed-window", o->fixed_window,
                  "temperature: keep the window at its initial share (no adaptation)");
    sub->add_option("--lookahead", o->lookahead,
                    "prefetch recorded predictions up to this depth (0: demand only)")
        ->transform(whole_number<decltype(o->lookahead)>())
        ->capture_default_str();
    sub->add_flag("--no-refresh,--no-lookahead-refresh", o->no_refresh,
                  "with --lookahead, leave out the recorded refresh predictions (depth 0: each "
                  "layer re-predicted after the previous layer's FFN)");
    sub->add_option("--profile", o->profile,
                    "ktier trace whose counts rank `static` and seed `temperature`");
    sub->add_option("--csv", o->csv, "write one row per (policy, budget)");
    sub->add_option("--json", o->json, "write results per policy, budget and tier");
    sub->add_option("--plot", o->plot, "draw hit rate against budget (PNG, matplotlib)");
    add_threads_option(sub, o->threads, "Replay threads");
    sub->callback([o, &exit_code] { exit_code = finish(run_replay(*o)); });
  }
}

}  // namespace ktier::cli
