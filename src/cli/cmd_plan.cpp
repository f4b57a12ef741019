// ktier plan: where a run would put the model for a memory budget, without loading it.
//
//   ktier plan -m DIR [--pack DIR] [--ram SIZE | --preset NAME] [--device cpu|cuda|emulated]
//              [--vram SIZE] [--policy P] [--lookahead D] [-c N] [--chunk N] [-t N]
//              [--json FILE]
//
// It takes run's memory, device and strata flags and plans with the functions Engine::open
// places by (runtime/engine_plan.h; the engine CHECKs that it did as planned): the sequence's
// working set, the trunk layers pinned and streamed, the lookahead routers, the expert RAM
// tier's slots and, in GPU mode, the device's working set, its resident trunk layers and VRAM
// expert slots. Only the checkpoint's headers (and a pack's manifest) are read. A budget below
// the minimum exits 4 with the message `run` gives.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/cuda_backend.h"
#include "cli/cli_input.h"
#include "cli/commands.h"
#include "cli/strata_options.h"
#include "common/json_text.h"
#include "common/size.h"
#include "format/checkpoint.h"
#include "io/output_file.h"
#include "pack/trunk_pack.h"
#include "runtime/engine.h"
#include "strata/cache_policy.h"

namespace ktier::cli {
namespace {

struct PlanArgs {
  std::string model, json;
  MemoryArgs memory;
  StrataArgs strata;
  int64_t ctx = runtime::EngineOptions::Workload{}.positions;
  int64_t chunk = runtime::EngineOptions::Workload{}.chunk;
  int threads = 0;
  // The command planned for: run keeps the last position's logits; serve, eval and perplexity
  // every position's of a chunk (chunk x vocabulary floats set aside for the sequence).
  std::string planned_for = "run";
  bool ctx_given = false, chunk_given = false;  // else --for's command's own defaults
};

// What one plan holds: the CPU's dial, GPU mode's device and dial, or a mapped checkpoint.
struct Plan {
  runtime::EnginePlan engine;
  // Without the dial: the trunk layers' bytes in the shards (what the kernel pages in for
  // them), and the sequence's working set.
  uint64_t mapped_layers = 0, mapped_sequence = 0;
  // The plan a run on this machine would open now, where `engine` does not fit in 90% of
  // MemAvailable (fit_plan_to_memory).
  std::optional<runtime::EnginePlan> here;
  uint64_t mem_available = 0;  // MemAvailable when the plan was made (0: unknown)
  // The layers the host serves (all, or in GPU mode those the device streams) and of those the
  // ones read from disk every token (not pinned).
  int64_t host_layers = 0, from_disk = 0;
};

std::string percent(uint64_t part, uint64_t whole) {
  const double p = whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
  char buf[32];
  std::snprintf(buf, sizeof buf, p >= 0.995 || p == 0 ? "%.1f%%" : "%.2g%%", p);  // K3: 0.021%
  return buf;
}

std::string layer_range(int64_t first, int64_t count) {
  if (count <= 0) return "none";
  if (count == 1) return "layer " + std::to_string(first);
  return "layers " + std::to_string(first) + ".." + std::to_string(first + count - 1);
}

// Trunk bytes read from disk for each token: the layers neither pinned by the host nor (GPU
// mode) resident on the device, once each.
uint64_t trunk_read_per_token(const runtime::DialPlan& d, const runtime::DevicePlan* device) {
  const runtime::TrunkPlan& t = d.trunk;
  uint64_t n = 0;
  for (int64_t l = device ? device->trunk.resident_layers : 0;
       l < static_cast<int64_t>(t.layer_read_bytes.size()); ++l)
    if (l < t.first_pinned || l >= t.first_pinned + t.layers_pinned)
      n += t.layer_read_bytes[static_cast<size_t>(l)];
  return n;
}

// Engine::open's plan, and what a mapped checkpoint or this machine make of it.
Result<Plan> make_plan(const format::Checkpoint& ckpt, const pack::TrunkPack* pk,
                       const runtime::EngineOptions& eo, int threads) {
  Plan out;
  std::unique_ptr<backend::Backend> gpu;  // asked for its free memory
  if (runtime::device_mode(eo) && !eo.emulate_device) {
    KTIER_ASSIGN_OR_RETURN(gpu, backend::make_cuda_backend(backend::probe_cuda_module(),
                                                           eo.cublas_prefill));
  }
  KTIER_ASSIGN_OR_RETURN(out.engine, runtime::plan_engine(ckpt, pk, eo, threads, gpu.get()));
  out.mem_available = out.engine.mem_available ? out.engine.mem_available
                                               : runtime::mem_available_bytes();
  const runtime::EnginePlan& p = out.engine;
  const int64_t L = ckpt.config().num_hidden_layers;
  out.host_layers = L - (p.device ? p.device->trunk.resident_layers : 0);
  if (!p.dial) {
    const runtime::DialMinimum m = runtime::dial_minimum(
        ckpt, nullptr, p.lookahead, threads, false, &eo.workload);
    out.mapped_sequence = m.sequence;
    KTIER_ASSIGN_OR_RETURN(const runtime::TrunkPlan all,
                           runtime::TrunkStore::plan(ckpt, nullptr, {}, threads));
    for (const uint64_t b : all.layer_read_bytes) out.mapped_layers += b;
    return out;
  }
  out.from_disk = out.host_layers - p.dial->trunk.layers_pinned;
  KTIER_ASSIGN_OR_RETURN(out.here, runtime::fit_plan_to_memory(ckpt, pk, eo, p, threads,
                                                               gpu.get(), out.mem_available));
  return out;
}

// What the run would log as warnings about its plan, in that order: the fallback to the CPU,
// the raised budget, lookahead lowered or capped, the options a mapped checkpoint ignores.
std::vector<std::string> plan_notes(const runtime::EnginePlan& e) {
  std::vector<std::string> notes;
  if (!e.device_fallback.empty()) notes.push_back("device: " + e.device_fallback);
  for (const std::string* note : {&e.budget_raised, &e.lookahead_lowered, &e.lookahead_capped})
    if (!note->empty()) notes.push_back(*note);
  notes.insert(notes.end(), e.unused_options.begin(), e.unused_options.end());
  return notes;
}

nlohmann::json plan_json(const format::Checkpoint& ckpt, const runtime::EngineOptions& eo,
                         const Plan& p) {
  const format::ModelConfig& c = ckpt.config();
  const runtime::DevicePlan* device = p.engine.device ? &*p.engine.device : nullptr;
  nlohmann::json j{{"model", ckpt.dir().string()},
                   {"layers", c.num_hidden_layers},
                   {"moe_layers", c.num_moe_layers()},
                   {"experts_per_layer", c.num_experts},
                   {"top_k", c.num_experts_per_token},
                   {"positions", eo.workload.positions},
                   {"chunk", eo.workload.chunk},
                   // "last" (run) or "all" (serve, eval, perplexity: --for)
                   {"logit_rows", eo.workload.rows == model::LogitRows::kAll ? "all" : "last"},
                   {"lookahead", p.engine.lookahead},
                   {"mem_available_bytes", p.mem_available},
                   {"dial", nullptr},
                   {"device", nullptr},
                   {"device_fallback", p.engine.device_fallback.empty()
                                           ? nlohmann::ordered_json(nullptr)
                                           : nlohmann::ordered_json(p.engine.device_fallback)},
                   {"notes", plan_notes(p.engine)}};
  if (!p.engine.dial) {
    j["mapped"] = {{"trunk_layer_bytes", p.mapped_layers}, {"sequence_bytes", p.mapped_sequence}};
  } else {
    const runtime::DialPlan& d = *p.engine.dial;
    const runtime::DialPlan& here = p.here ? *p.here->dial : d;  // what a run here opens
    j["dial"] = {
        {"budget_bytes", d.budget},
        {"minimum_bytes", d.minimum.total()},
        {"minimum",
         {{"trunk", d.minimum.trunk},
          {"experts", d.minimum.experts()},
          {"routers", d.minimum.routers},
          {"sequence", d.minimum.sequence}}},
        {"sequence_bytes", d.minimum.sequence},
        {"trunk_layers_pinned", d.trunk.layers_pinned},
        {"trunk_first_pinned", d.trunk.first_pinned},
        {"trunk_layers_streamed", p.from_disk},  // read from disk every token
        {"trunk_ring_slots", d.ring_released ? 0 : d.trunk.ring_slots},
        {"trunk_ring_slot_bytes", d.trunk.ring_slot_bytes},
        {"trunk_bytes", d.trunk_held()},
        {"trunk_head_released_bytes", d.head_released},
        {"trunk_read_bytes_per_token", trunk_read_per_token(d, device)},
        {"router_bank_bytes", d.router_bytes},
        {"router_bank_from_layer", d.router_bytes ? d.routers_from : c.num_hidden_layers},
        {"ram_expert_slots", d.expert_slots},
        {"ram_expert_policy_slots", d.expert_slots - d.expert_batch},
        {"ram_expert_slot_bytes", d.expert_slot_bytes},
        {"ram_expert_slots_here", here.expert_slots},
        {"budget_bytes_here", here.budget},
        {"trunk_layers_pinned_here", here.trunk.layers_pinned},
        {"lookahead_here", p.here ? p.here->lookahead : p.engine.lookahead},
        {"expert_keys", d.expert_keys},
        {"held_bytes", d.held()}};
  }
  if (device) {
    const runtime::DevicePlan& v = *device;
    j["device"] = {{"vram_budget_bytes", v.vram},
                   {"working_set_bytes", v.working()},
                   {"state_bytes", v.working_set.state_bytes},
                   {"activation_bytes", v.working_set.activation_bytes},
                   {"blas_bytes", v.blas},
                   {"trunk_layers_resident", v.trunk.resident_layers},
                   {"trunk_bytes", v.trunk_bytes},
                   {"vram_expert_slots", v.tier_slots},
                   {"vram_expert_min_slots", v.tier_min_slots},
                   {"vram_expert_slot_bytes", v.tier_slot_bytes}};
  }
  return j;
}

// One line of the table: "  trunk        1.18 MiB: 3 of 13 layers pinned ...".
std::string row(const char* label, uint64_t bytes, const std::string& detail) {
  char head[32];
  std::snprintf(head, sizeof head, "  %-12s ", label);
  return head + format_size(bytes) + (detail.empty() ? "" : ": " + detail) + "\n";
}

std::string plan_text(const format::Checkpoint& ckpt, const runtime::EngineOptions& eo,
                      const Plan& p) {
  const format::ModelConfig& c = ckpt.config();
  const runtime::DevicePlan* device = p.engine.device ? &*p.engine.device : nullptr;
  const int64_t L = c.num_hidden_layers;
  const int64_t keys = c.num_moe_layers() * c.num_experts;
  const auto of_experts = [&](int64_t slots) {
    return percent(static_cast<uint64_t>(std::min(slots, keys)), static_cast<uint64_t>(keys)) +
           " of " + std::to_string(keys) + " experts";
  };
  std::string out = "model: " + ckpt.dir().string() + ": " + std::to_string(L) + " layers (" +
                    std::to_string(c.num_moe_layers()) + " MoE of " +
                    std::to_string(c.num_experts) + " experts, top-" +
                    std::to_string(c.num_experts_per_token) + ")\n";
  out += "sequence: " + std::to_string(eo.workload.positions) + " positions in chunks of " +
         std::to_string(eo.workload.chunk) +
         (eo.workload.rows == model::LogitRows::kAll ? ", every position's logits\n"
                                                     : ", the last position's logits\n");
  for (const std::string& note : plan_notes(p.engine)) out += "note: " + note + "\n";
  if (device) {
    const runtime::DevicePlan& v = *device;
    const int64_t res = v.trunk.resident_layers;
    out += "device: --vram " + format_size(v.vram) + "\n";
    out += row("working set", v.working(),
               "state " + format_size(v.working_set.state_bytes) + ", activations " +
                   format_size(v.working_set.activation_bytes) +
                   (v.blas ? ", cuBLAS " + format_size(v.blas) : std::string()));
    out += row("trunk", v.trunk_bytes,
               std::to_string(res) + " of " + std::to_string(L) + " layers resident (" +
                   layer_range(0, res) + ")" +
                   (res < L ? "; " + std::to_string(L - res) + " streamed through 2 slots of " +
                                  format_size(v.trunk.slot_bytes)
                            : std::string()));
    if (v.tier_slots > 0) {
      // As the RAM line: top_k of the slots are one fetch's bypass, the policy keeps the rest.
      const int64_t batch = std::min<int64_t>(c.num_experts_per_token, v.tier_slots);
      const int64_t kept = v.tier_slots - batch;
      out += row("experts", static_cast<uint64_t>(v.tier_slots) * v.tier_slot_bytes,
                 std::to_string(v.tier_slots) + " VRAM slots of " +
                     format_size(v.tier_slot_bytes) + " (" + std::to_string(kept) +
                     " kept: " + of_experts(kept) + "; " + std::to_string(batch) +
                     " for one fetch; at least " + std::to_string(v.tier_min_slots) + ")");
    }
  }
  if (!p.engine.dial) {
    out += "host: no memory dial (give --ram, --preset or --pack): the checkpoint is "
           "memory-mapped and the kernel pages the trunk's layers (" +
           format_size(p.mapped_layers) + ") and the experts in and out as they are read; the "
           "sequence needs " + format_size(p.mapped_sequence) + "\n";
    return out;
  }
  const runtime::DialPlan& d = *p.engine.dial;
  out += "host: budget " +
         (d.budget == UINT64_MAX ? std::string("unlimited (max)") : format_size(d.budget)) +
         " (minimum " + format_size(d.minimum.total()) + ")\n";
  if (d.minimum.sequence) out += row("sequence", d.minimum.sequence, "");
  const int64_t pinned = d.trunk.layers_pinned;
  std::string trunk = std::to_string(pinned) + " of " + std::to_string(L) + " layers pinned (" +
                      layer_range(d.trunk.first_pinned, pinned) + ")";
  if (p.from_disk == 0 && device && p.host_layers > 0)
    trunk += ", every layer the device streams";
  if (p.from_disk > 0) {
    trunk += "; " + std::to_string(p.from_disk) +
             (device ? " of the " + std::to_string(p.host_layers) + " the device streams"
                     : std::string()) +
             " read from disk";
    if (d.trunk.ring_slots > 0 && !d.ring_released)
      trunk += " through " + std::to_string(d.trunk.ring_slots) + " ring slots of " +
               format_size(d.trunk.ring_slot_bytes);
    trunk += ", " +
             format_size(trunk_read_per_token(d, device)) +
             " a token";
  }
  if (d.head_released)
    trunk += "; its head record (" + format_size(d.head_released) +
             ") freed once the device mirrors it";
  out += row("trunk", d.trunk_held(), trunk);
  if (d.router_bytes)
    out += row("routers", d.router_bytes,
               "for lookahead, of the MoE layers streamed (" +
                   layer_range(d.routers_from, L - d.routers_from) + ")");
  if (d.expert_slots > 0) {
    const int64_t kept = d.expert_slots - d.expert_batch;
    out += row("experts", static_cast<uint64_t>(d.expert_slots) * d.expert_slot_bytes,
               std::to_string(d.expert_slots) + " RAM slots of " +
                   format_size(d.expert_slot_bytes) + " (" + std::to_string(kept) +
                   " kept: " + of_experts(kept) + "; " + std::to_string(d.expert_batch) +
                   " for one fetch); policy " + std::string(strata::policy_name(eo.policy)) +
                   ", lookahead " + std::to_string(p.engine.lookahead));
  }
  out += "  held         " + format_size(d.held()) +
         (d.budget == UINT64_MAX ? std::string() : " of " + format_size(d.budget)) + "\n";
  if (p.here)
    out += "  note: a run on this machine now: " +
           runtime::lowered_budget_note(p.engine, *p.here, p.mem_available) + "\n";
  return out;
}

Status plan(const PlanArgs& a) {
  // eval's --chunk 0 (all ids in one pass) is taken as eval takes it.
  if (a.chunk < 1 && !(a.chunk == 0 && a.planned_for == "eval"))
    return Status::usage("--chunk must be >= 1 (0 with --for eval: one pass)");
  KTIER_RETURN_IF_ERROR(check_output_is_not_input(
      "--json", a.json,
      {{"-m", a.model, true}, {"--pack", a.memory.pack, true}, {"--profile", a.strata.profile}}));
  KTIER_RETURN_IF_ERROR(io::check_can_write("--json", a.json));
  KTIER_ASSIGN_OR_RETURN(runtime::EngineOptions eo,
                         model_engine_options(a.model, a.threads, std::nullopt, a.memory,
                                              a.strata));
  eo.workload.positions = a.ctx;
  eo.workload.chunk = a.chunk;
  if (a.planned_for == "run") eo.workload.positions_from = kRunPositionsFrom;
  if (a.planned_for != "run") eo.workload.rows = model::LogitRows::kAll;
  // The defaults of the command planned for: eval runs every id in one pass (its --chunk 0),
  // perplexity windows of 512 (its -c) in passes of at most 256.
  if (a.planned_for == "eval" && (!a.chunk_given || a.chunk == 0))
    eo.workload.chunk = eo.workload.positions;
  if (a.planned_for == "perplexity" && !a.ctx_given) {
    eo.workload.positions = 512;
    eo.workload.chunk = std::min<int64_t>(eo.workload.chunk, 512);
  }
  KTIER_RETURN_IF_ERROR(runtime::check_engine_options(eo));
  KTIER_ASSIGN_OR_RETURN(const format::Checkpoint ckpt,
                         format::Checkpoint::open(eo.model_dir, format::OpenMode::kPread));
  std::optional<pack::TrunkPack> pk;
  if (eo.pack_dir) {
    KTIER_ASSIGN_OR_RETURN(pk, pack::TrunkPack::open(*eo.pack_dir, ckpt));
  }
  KTIER_ASSIGN_OR_RETURN(const Plan p, make_plan(ckpt, pk ? &*pk : nullptr, eo,
                                                 runtime::resolve_threads(eo.threads)));
  KTIER_RETURN_IF_ERROR(write_stdout(plan_text(ckpt, eo, p)));
  if (!a.json.empty())
    KTIER_RETURN_IF_ERROR(io::write_output_file(a.json, json_output_text(plan_json(ckpt, eo, p))));
  return Status::ok();
}

}  // namespace

void register_plan_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<PlanArgs>();
  auto* sub = app.add_subcommand(
      "plan",
      "Where a run would put the model (trunk layers pinned or streamed, expert slots in RAM and "
      "VRAM) for run's memory, device and strata flags, without loading it");
  add_model_option(sub, a->model);
  auto* ctx = sub->add_option("-c,--ctx-size", a->ctx,
                              "Positions the sequence holds (a run's -c, else its prompt + -n - "
                              "1; serve's -c; eval's ids; default with --for perplexity: its "
                              "512)")
                   ->capture_default_str()
                   ->check(CLI::Range(int64_t{1}, int64_t{INT32_MAX}));
  auto* chunk = sub->add_option("--chunk", a->chunk,
                                "Prompt tokens per prefill pass (default with --for eval: -c, "
                                "eval's one pass, as its --chunk 0)")
                     ->capture_default_str();
  sub->add_option("--for", a->planned_for,
                  "The command planned for: run (the last position's logits), or serve, eval or "
                  "perplexity (every position's logits of a chunk: up to --chunk x the "
                  "vocabulary's floats more for the sequence)")
      ->check(CLI::IsMember({"run", "serve", "eval", "perplexity"}))
      ->capture_default_str();
  add_threads_option(sub, a->threads,
                     "Threads of the run planned for (a compressed pack's inflate scratch)");
  sub->add_option("--json", a->json, "Also write the plan to FILE as JSON");
  add_memory_options(sub, a->memory);
  add_strata_options(sub, a->strata);
  sub->footer(
      "Plans for `run` unless --for says another command. --io, --io-rate-limit, "
      "--no-lookahead-refresh and --profile are accepted so that run's memory, device and "
      "strata flags can be given as they are; they do not change where anything goes.");
  sub->callback([a, ctx, chunk, &exit_code] {
    a->ctx_given = ctx->count() > 0;
    a->chunk_given = chunk->count() > 0;
    exit_code = finish(plan(*a));
  });
}

}  // namespace ktier::cli
