// `ktier bench decode`: decode speed with every weight in RAM, as a ratio of the bandwidth floor
// (issue 3, item 6). The floor is the time the weights a decode step reads would take to stream
// at this machine's measured read bandwidth, at the same thread count, in the same run:
//
//   floor_s = (trunk bytes + expert bytes read per step) / read bandwidth
//   ratio   = floor_s / measured s per step            (1.0 = memory-bound, at the limit)
//
// Trunk bytes per step are every non-expert matrix (lm_head included) plus one embedding row;
// expert bytes come from the expert source's counter. Before timing, every tensor page of the
// checkpoint is touched so that the run reads from RAM (page cache), never from disk.
//
// Prefill (a prompt of --prefill-tokens in one chunk, like llama-bench's pp512) is bound by
// arithmetic, not memory: its figure is the weights' multiply-accumulates per second (every
// trunk matrix and top_k routed experts per token, lm_head once) as a ratio of the double FMA
// rate measured at the same thread count (`bench kernels`' "double fma").
//
//   ktier bench decode -m DIR [-n N] [--threads N] [--prompt-tokens N] [--prefill-tokens N]
//                     [--buffer-mib N] [--pack PACKDIR [--ram SIZE]] [--json FILE]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/kernel_bench.h"
#include "cli/bench_util.h"
#include "cli/cli_input.h"
#include "cli/commands.h"
#include "common/json_text.h"
#include "common/size.h"
#include "io/output_file.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "runtime/run_report.h"

namespace ktier::cli {
namespace {

struct DecodeOptions {
  std::string model, json;
  int64_t tokens = 32, prompt_tokens = 16, prefill_tokens = 512;
  int threads = 0;
  uint64_t buffer_mib = 0;  // 0: as `bench kernels` (max(4 x LLC, 256 MiB)), capped by memory
  std::string pack, ram;    // streamed run: trunk pack and budget (default: the minimum)
  double io_rate_limit_mb_s = 0;  // streamed run: read-rate cap, MB/s; 0 = none
};

// Reads one byte of every 4 KiB page of every tensor (mmap mode): afterwards the weights are in
// the page cache and mapped. Returns the bytes covered.
uint64_t touch_all(const format::Checkpoint& ckpt) {
  uint64_t covered = 0;
  volatile uint8_t sink = 0;
  for (size_t s = 0; s < ckpt.num_shards(); ++s) {
    const format::SafetensorsFile& f = ckpt.shard(s);
    for (const format::TensorInfo& t : f.tensors()) {
      const auto bytes = f.bytes(t);
      for (size_t i = 0; i < bytes.size(); i += 4096) sink = sink + bytes[i];
      covered += bytes.size();
    }
  }
  return covered;
}

// `count` fixed ids first, first + step, ... (mod the vocabulary): a prompt that needs no
// tokenizer and is the same in every run.
std::vector<int32_t> fixed_prompt(int64_t count, int64_t first, int64_t step, int64_t vocab) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < count; ++i)
    ids.push_back(static_cast<int32_t>((first + step * i) % vocab));
  return ids;
}

// Multiply-accumulates of the weights for one prompt token: every trunk matrix but lm_head,
// and top_k routed experts in each MoE layer.
double macs_per_prompt_token(const runtime::Engine& e) {
  const format::ModelConfig& c = e.checkpoint().config();
  double macs = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)  // for_each_tensor only reads here
    model::for_each_tensor(
        const_cast<model::LayerWeights&>(e.weights()->layer(l)),
        [&](cpu::WeightMatrix& m) { macs += static_cast<double>(m.rows * m.cols); },
        [](model::F32Vec&) {});
  const double expert = 3.0 * static_cast<double>(c.moe_intermediate_size) *
                        static_cast<double>(c.routed_expert_hidden_size);
  return macs + static_cast<double>(c.num_moe_layers() * c.num_experts_per_token) * expert;
}

// Timed greedy decode of `tokens` after a 4-token warm-up; returns the stats of the timed run.
Result<runtime::GenerationStats> timed_decode(runtime::Engine& e, const std::vector<int32_t>& prompt,
                                              int64_t tokens, runtime::EngineCounters* start,
                                              runtime::EngineCounters* end) {
  runtime::GenerationOptions gen;
  const auto sink = [](int32_t) { return Status::ok(); };
  gen.max_new_tokens = 4;
  KTIER_RETURN_IF_ERROR(runtime::generate(e.model(), e.experts(), prompt, gen, sink).status());
  gen.max_new_tokens = tokens;
  gen.before_decode = [&] { *start = runtime::EngineCounters::start_window(e); };
  KTIER_ASSIGN_OR_RETURN(runtime::GenerationStats st,
                         runtime::generate(e.model(), e.experts(), prompt, gen, sink));
  *end = runtime::EngineCounters::of(e);
  return st;
}

// The streamed-trunk check (issue 4, item 6b): per-token time with the trunk streamed from the
// pack, against max(I/O time, compute time) measured in the same run: compute = the resident
// s/token, I/O = bytes read per token / raw sequential read GB/s of the pack file.
// The streamed run's engine options, from --pack, --ram (default: the pack's minimum budget) and
// --io-rate-limit. Built before the in-RAM figures are measured, so that a wrong pack or flag is
// refused in a second, not after the whole benchmark.
Result<runtime::EngineOptions> streamed_options(const DecodeOptions& o) {
  runtime::EngineOptions eo;
  eo.model_dir = o.model;
  eo.threads = o.threads;
  eo.pack_dir = o.pack;
  eo.lookahead = runtime::kDefaultLookahead;  // measured as given, never lowered by the budget
  KTIER_ASSIGN_OR_RETURN(eo.io.rate_limit_bytes_per_s, rate_limit_bytes_per_s(o.io_rate_limit_mb_s));
  KTIER_ASSIGN_OR_RETURN(const format::Checkpoint ck,
                         format::Checkpoint::open(o.model, format::OpenMode::kPread));
  KTIER_ASSIGN_OR_RETURN(const pack::TrunkPack pk, pack::TrunkPack::open(o.pack, ck));
  eo.workload.positions = o.prompt_tokens + o.tokens;  // timed_decode's longest sequence
  eo.workload.positions_from = "--prompt-tokens and -n";
  const int threads = runtime::resolve_threads(o.threads);
  const runtime::DialMinimum min =
      runtime::dial_minimum(ck, &pk, *eo.lookahead, threads, /*host_routers=*/true, &eo.workload);
  if (!o.ram.empty()) {
    KTIER_ASSIGN_OR_RETURN(eo.ram_budget, parse_size(o.ram, "--ram"));
    KTIER_RETURN_IF_ERROR(runtime::check_dial_budget(*eo.ram_budget, min, &pk, eo.workload));
  } else {
    eo.ram_budget = min.total();
  }
  return eo;
}

Result<nlohmann::json> streamed_check(const DecodeOptions& o, const runtime::EngineOptions& eo,
                                      const std::vector<int32_t>& prompt, double compute_s) {
  KTIER_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Engine> e, runtime::Engine::open(eo));
  std::fprintf(stderr, "[bench] streamed decode (%lld of %lld layers streamed)\n",
               static_cast<long long>(e->trunk_store()->stats().layers_streamed),
               static_cast<long long>(e->checkpoint().config().num_hidden_layers));
  runtime::EngineCounters a, b;
  KTIER_ASSIGN_OR_RETURN(const runtime::GenerationStats st, timed_decode(*e, prompt, o.tokens, &a, &b));
  const double steps = static_cast<double>(st.decode_steps);
  const double streamed_s = st.decode_seconds / steps;
  const double read = static_cast<double>((b.trunk_bytes_read - a.trunk_bytes_read) +
                                          (b.experts.read_bytes - a.experts.read_bytes)) / steps;
  KTIER_ASSIGN_OR_RETURN(const io::ReadFile f, e->io_engine()->open(std::filesystem::path(o.pack) / "trunk.pack"));
  KTIER_ASSIGN_OR_RETURN(io::AlignedBuffer buf, io::AlignedBuffer::allocate(64 << 20));
  double raw = 0;
  for (int i = 0; i < 3; ++i) {
    KTIER_ASSIGN_OR_RETURN(const double r, raw_read_gbps(f, buf, f.size()));
    raw = std::max(raw, r);
  }
  // With --io-rate-limit the engine's reads are capped below what the raw read measures.
  if (eo.io.rate_limit_bytes_per_s > 0) raw = std::min(raw, static_cast<double>(eo.io.rate_limit_bytes_per_s) / 1e9);
  const double io_s = read / (raw * 1e9);
  const double bound = std::max(io_s, compute_s);
  // Without O_DIRECT (tmpfs, some FUSE) the raw read is a page-cache copy, not the disk's limit.
  std::printf("streamed      %.4f s/token, %.1f MB read/token; raw read %.2f GB/s%s -> I/O %.4f "
              "s, compute %.4f s\n", streamed_s, read / 1e6, raw,
              f.direct() ? "" : " (BUFFERED, no O_DIRECT here: the page cache's, not the disk's)",
              io_s, compute_s);
  std::printf("overlap       %.3f x max(I/O, compute)  (goal <= 1.15)\n", streamed_s / bound);
  return nlohmann::json{{"streamed_s_per_token", streamed_s}, {"bytes_read_per_token", read},
                        {"raw_read_gbps", raw}, {"raw_read_direct", f.direct()},
                        {"io_s_per_token", io_s},
                        {"compute_s_per_token", compute_s}, {"ratio_to_bound", streamed_s / bound},
                        {"layers_streamed", e->trunk_store()->stats().layers_streamed},
                        {"budget_bytes", e->budget_bytes()},
                        {"io_rate_limit_bytes_per_s", eo.io.rate_limit_bytes_per_s},
                        {"compressed_pack", e->trunk_store() != nullptr && e->trunk_store()->stats().staging_bytes > 0},
                        {"inflate_s_per_token", static_cast<double>(b.trunk_inflate_ns - a.trunk_inflate_ns) / 1e9 / steps}};
}

Status run_decode_bench(const DecodeOptions& o) {
  // At most INT32_MAX each and together (a position count), as run's -n and -c.
  const std::string most = std::to_string(INT32_MAX);
  if (o.tokens < 2 || o.tokens > INT32_MAX)
    return Status::usage("-n must be in 2.." + most + " (decode steps = n - 1)");
  if (o.prompt_tokens < 1 || o.prompt_tokens > INT32_MAX)
    return Status::usage("--prompt-tokens must be in 1.." + most);
  if (o.prefill_tokens < 0 || o.prefill_tokens > INT32_MAX)
    return Status::usage("--prefill-tokens must be in 0.." + most + " (0 = skip)");
  if (o.prompt_tokens + o.tokens > INT32_MAX)
    return Status::usage("--prompt-tokens + -n must be at most " + most + " positions");
  KTIER_RETURN_IF_ERROR(check_output_is_not_input(
      "--json", o.json, {{"-m", o.model, true}, {"--pack", o.pack, true}}));
  KTIER_RETURN_IF_ERROR(io::check_can_write("--json", o.json));
  std::optional<runtime::EngineOptions> streamed_eo;
  if (!o.pack.empty()) {
    KTIER_ASSIGN_OR_RETURN(streamed_eo, streamed_options(o));
  } else if (!o.ram.empty() || o.io_rate_limit_mb_s != 0) {
    return Status::usage("--ram and --io-rate-limit shape the streamed run: give --pack too");
  }
  runtime::EngineOptions eo;
  eo.model_dir = o.model;
  eo.threads = o.threads;
  KTIER_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Engine> engine, runtime::Engine::open(eo));
  const format::ModelConfig& c = engine->checkpoint().config();

  std::fprintf(stderr, "[bench] touching every weight page (page cache warm-up)\n");
  const uint64_t covered = touch_all(engine->checkpoint());
  const std::vector<int32_t> prompt = fixed_prompt(o.prompt_tokens, 17, 31, c.vocab_size);
  runtime::GenerationOptions gen;
  gen.max_new_tokens = o.tokens;
  const auto sink = [](int32_t) { return Status::ok(); };
  std::fprintf(stderr, "[bench] warm-up decode (4 tokens)\n");
  gen.max_new_tokens = 4;
  KTIER_RETURN_IF_ERROR(runtime::generate(engine->model(), engine->experts(), prompt, gen, sink).status());
  gen.max_new_tokens = o.tokens;
  std::fprintf(stderr, "[bench] timed decode (%lld tokens)\n", static_cast<long long>(o.tokens));
  KTIER_ASSIGN_OR_RETURN(const runtime::GenerationStats st,
                         runtime::generate(engine->model(), engine->experts(), prompt, gen, sink));

  const cpu::WeightMatrix& embed = engine->weights()->embed_matrix();
  const uint64_t embed_bytes =
      static_cast<uint64_t>(embed.rows * cpu::weight_row_data_bytes(embed.type, embed.cols));
  const uint64_t trunk = engine->weights()->matrix_bytes() - embed_bytes + embed_bytes / embed.rows;
  const double steps = static_cast<double>(st.decode_steps);
  const double experts = static_cast<double>(st.expert_bytes_decode) / steps;
  const double s_per_token = st.decode_seconds / steps;

  std::fprintf(stderr, "[bench] memory read bandwidth at %d threads\n", engine->threads());
  uint64_t buffer = o.buffer_mib ? o.buffer_mib << 20
                                 : bench::default_buffer_bytes(bench::last_level_cache_bytes());
  // A quarter of MemAvailable at most by default (the model is loaded beside it; bench kernels
  // takes half); a size given that exceeds it is refused, as bench kernels refuses one.
  const uint64_t avail = runtime::mem_available_bytes();
  if (avail > 0 && !o.buffer_mib) buffer = std::min(buffer, avail / 4);
  if (avail > 0 && buffer > avail)
    return Status::budget("the bandwidth buffer (" + std::to_string(buffer >> 20) +
                          " MiB) exceeds MemAvailable; pass a smaller --buffer-mib");
  cpu::ThreadPool pool(engine->threads());
  const double gbps = bench::measure_read_gbps(pool, buffer, 5);
  if (gbps <= 0) return Status::runtime("cannot map the bandwidth buffer");
  const double total = static_cast<double>(trunk) + experts;
  const double floor_s = total / (gbps * 1e9);

  std::printf("ktier bench decode: %s, %d threads, isa %s, weights touched %.2f GB\n",
              o.model.c_str(), engine->threads(), cpu::isa_name(engine->exec().isa),
              covered / 1e9);
  std::printf("decode        %.4f s/token  %.2f tok/s  (%lld steps, prompt %lld tokens)\n",
              s_per_token, 1.0 / s_per_token, static_cast<long long>(st.decode_steps),
              static_cast<long long>(o.prompt_tokens));
  std::printf("read/token    %.1f MB (trunk %.1f MB, experts %.1f MB)\n", total / 1e6,
              trunk / 1e6, experts / 1e6);
  std::printf("memory read   %.2f GB/s  -> floor %.4f s/token\n", gbps, floor_s);
  std::printf("ratio         %.3f of the bandwidth floor (weights consumed at %.2f GB/s)\n",
              floor_s / s_per_token, total / s_per_token / 1e9);
  nlohmann::json prefill;
  if (o.prefill_tokens > 0) {
    const std::vector<int32_t> long_prompt = fixed_prompt(o.prefill_tokens, 29, 37, c.vocab_size);
    runtime::GenerationOptions pg;
    pg.max_new_tokens = 1;
    pg.prefill_chunk = o.prefill_tokens;
    double best = 0;  // two passes, the faster kept (the first also grows the buffers)
    for (int pass = 0; pass < 2; ++pass) {
      std::fprintf(stderr, "[bench] prefill of %lld tokens, pass %d of 2\n",
                   static_cast<long long>(o.prefill_tokens), pass + 1);
      KTIER_ASSIGN_OR_RETURN(const runtime::GenerationStats ps,
                             runtime::generate(engine->model(), engine->experts(), long_prompt, pg,
                                               sink));
      if (pass == 0 || ps.prefill_seconds < best) best = ps.prefill_seconds;
    }
    const double lm_head = static_cast<double>(engine->weights()->head().lm_head.rows *
                                               engine->weights()->head().lm_head.cols);
    const double macs =
        macs_per_prompt_token(*engine) * static_cast<double>(o.prefill_tokens) + lm_head;
    const double gmacs = macs / best / 1e9;
    const double fma = bench::measure_fma_gmacs(pool, engine->exec().isa, 5);
    std::printf("prefill       %.3f s for %lld tokens  %.1f tok/s  (%.2f GMAC/s of weights)\n",
                best, static_cast<long long>(o.prefill_tokens),
                static_cast<double>(o.prefill_tokens) / best, gmacs);
    std::printf("double fma    %.2f G lanes/s  -> prefill ratio %.3f\n", fma, gmacs / fma);
    prefill = {{"tokens", o.prefill_tokens},
               {"seconds", best},
               {"tok_per_s", static_cast<double>(o.prefill_tokens) / best},
               {"gmacs", gmacs},
               {"fma_gmacs", fma},
               {"ratio_to_fma", gmacs / fma}};
  }
  nlohmann::json streamed;
  if (streamed_eo) {
    KTIER_ASSIGN_OR_RETURN(streamed, streamed_check(o, *streamed_eo, prompt, s_per_token));
  }
  if (!o.json.empty()) {
    nlohmann::json j = {
        {"model", o.model},
        {"threads", engine->threads()},
        {"isa", cpu::isa_name(engine->exec().isa)},
        {"prompt_tokens", o.prompt_tokens},
        {"decode_steps", st.decode_steps},
        {"decode_s_per_token", s_per_token},
        {"decode_tok_per_s", 1.0 / s_per_token},
        {"bytes_read_per_token", {{"trunk", trunk}, {"experts", experts}, {"total", total}}},
        {"mem_read_gbps", gbps},
        {"floor_s_per_token", floor_s},
        {"ratio_to_floor", floor_s / s_per_token}};
    if (!streamed.is_null()) j["streamed"] = streamed;
    if (!prefill.is_null()) j["prefill"] = prefill;
    KTIER_RETURN_IF_ERROR(io::write_output_file(o.json, json_output_text(j)));
  }
  return Status::ok();
}

}  // namespace

void register_bench_decode_command(CLI::App& bench, int& exit_code) {
  auto o = std::make_shared<DecodeOptions>();
  auto* sub = bench.add_subcommand(
      "decode",
      "Greedy decode with every weight in RAM: s/token and its ratio to the bandwidth floor\n"
      "(bytes read per token / memory read bandwidth measured in the same run); then a\n"
      "prefill's weight multiply-accumulates per second against the double FMA rate");
  sub->add_option("-m,--model", o->model, "Model folder")->required();
  sub->add_option("-n", o->tokens, "Tokens to generate (decode steps = n - 1)")
      ->capture_default_str();
  sub->add_option("--prompt-tokens", o->prompt_tokens, "Length of the fixed id prompt")
      ->capture_default_str();
  sub->add_option("--prefill-tokens", o->prefill_tokens,
                  "Also time a prefill of this many tokens in one chunk (like pp512) against "
                  "the double FMA rate; 0 = skip")
      ->capture_default_str();
  add_threads_option(sub, o->threads, "Worker threads");
  sub->add_option("--buffer-mib", o->buffer_mib,
                  "Bandwidth buffer in MiB, at least 1 (default: max(4x the last-level cache, "
                  "256 MiB), at most a quarter of MemAvailable; more than MemAvailable is "
                  "refused, exit 4; small = in-cache, figures meaningless)")
      ->transform(whole_number<uint64_t>(kMaxBenchMib))
      ->check(CLI::Range(uint64_t{1}, kMaxBenchMib));
  sub->add_option("--pack", o->pack,
                  "Also decode with the trunk streamed from this pack and compare with "
                  "max(I/O time, compute time)");
  sub->add_option("--ram", o->ram, "Budget of the streamed run (default: the minimum)");
  add_rate_limit_option(sub, o->io_rate_limit_mb_s,
                        "Shapes the streamed run: only with --pack (exit 2 without it)");
  sub->add_option("--json", o->json, "Also write the figures to FILE as JSON");
  sub->callback([o, &exit_code] { exit_code = finish(run_decode_bench(*o)); });
}

}  // namespace ktier::cli
