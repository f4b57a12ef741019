#include "runtime/engine_plan.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>

#include "common/check.h"
#include "common/debug_env.h"
#include "common/size.h"
#include "cpu/kernels.h"
#include "runtime/expert_cache.h"
#include "runtime/router_bank.h"
#include "runtime/vram_expert_tier.h"
#include "strata/trace_format.h"

namespace ktier::runtime {

MemInfo read_meminfo() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  MemInfo m;
  while (in >> key >> kb >> unit) {
    if (key == "MemTotal:") m.total = kb * 1024;
    if (key == "MemAvailable:") m.available = kb * 1024;
  }
  // A smaller machine, for tests and for trying the caps that MemAvailable sets.
  // main() has refused a bad value (exit 2) before any command runs.
  const Result<DebugEnv>& env = debug_env();
  KTIER_CHECK_MSG(env.is_ok(), env.status().message().c_str());
  if (env->mem_available_mib) m.available = *env->mem_available_mib << 20;
  return m;
}

uint64_t mem_available_bytes() { return read_meminfo().available; }

Status check_engine_options(const EngineOptions& opts) {
  if (opts.threads < 0 || opts.threads > cpu::kMaxThreads)
    return Status::usage("--threads " + std::to_string(opts.threads) + " is outside 0.." +
                         std::to_string(cpu::kMaxThreads) + " (0 = one per hardware thread)");
  if (opts.lookahead.value_or(0) < 0) return Status::usage("--lookahead must be >= 0 (0 = off)");
  if (opts.policy == strata::PolicyKind::kBelady)
    return Status::usage("--policy belady needs the future: it is for `ktier trace replay` only");
  if (opts.policy == strata::PolicyKind::kStatic && opts.static_ranking.empty())
    return Status::usage("--policy static needs a routing profile: give --profile TRACE");
  const cpu::Isa isa = opts.isa.value_or(cpu::best_isa());
  if (!cpu::isa_supported(isa))
    return Status::usage(std::string("--isa ") + cpu::isa_name(isa) +
                         ": this CPU or build does not support it");
  return Status::ok();
}

Result<uint64_t> dial_budget_bytes(const EngineOptions& opts, uint64_t* mem_available) {
  if (opts.ram_budget) return *opts.ram_budget;
  return preset_budget_bytes("auto", mem_available);
}

Result<uint64_t> gpu_vram_bytes(const EngineOptions& opts, std::optional<uint64_t> free_bytes) {
  if (!free_bytes) {
    if (!opts.vram_budget)
      return Status::usage("--device emulated needs --vram SIZE (there is no GPU to ask)");
    return *opts.vram_budget;
  }
  const uint64_t vram = opts.vram_budget.value_or(*free_bytes / 10 * 9);
  if (vram > *free_bytes)
    return Status::budget("--vram " + std::to_string(vram) + " bytes: the GPU has only " +
                          std::to_string(*free_bytes) + " bytes free");
  return vram;
}

int lookahead_depth(const EngineOptions& opts, const format::ModelConfig& c, bool dial) {
  // No lookahead runs deeper than the layers after the first: a deeper one predicts nothing
  // more, but would size the minimum budget by it; nor deeper than a trace records (255: far
  // past what predicts anything, K3-MODEL's 93 layers included). With the dial `static` never
  // prefetches, so it gets none (and its routers are not loaded).
  if (dial && opts.policy == strata::PolicyKind::kStatic) return 0;
  return static_cast<int>(std::min<int64_t>(
      {opts.lookahead.value_or(kDefaultLookahead), c.num_hidden_layers - 1,
       int64_t{strata::kMaxTraceLookahead}}));
}

Status check_dial_budget(uint64_t budget, const DialMinimum& min, const pack::TrunkPack* pack,
                         const EngineOptions::Workload& workload) {
  if (budget >= min.total()) return Status::ok();
  return Status::budget(
      "a budget of " + format_size(budget) + " (" + std::to_string(budget) +
      " bytes) cannot be met: the minimum is " + format_size(min.total()) + " = " +
      std::to_string(min.total()) + " bytes (trunk " + format_size(min.trunk) +
      ": head, two ring slots, embedding rows" +
      (pack && pack->compressed() ? ", compressed staging per slot, inflate scratch per thread"
                                  : "") +
      "; experts " + format_size(min.experts()) + ": " + std::to_string(min.expert_slots) +
      " slots of " + format_size(min.slot_bytes) +
      (min.routers
           ? "; lookahead routers " + format_size(min.routers) + ", 0 with --lookahead 0"
           : "") +
      (min.sequence ? "; the sequence " + format_size(min.sequence) +
                          ": state and activations for " + std::to_string(workload.positions) +
                          " positions (" + workload.positions_from + ")"
                    : "") +
      ")");
}

uint64_t auto_preset_budget(uint64_t mem_total, uint64_t mem_available) {
  constexpr uint64_t G = 1ull << 30;
  // 2 GiB left to the system, or half where that is less (below 4 GiB free): the two meet at
  // 4 GiB, so that more free memory never gives a smaller budget (it once fell from 1 GiB to
  // 1 MiB past 2 GiB free). Within what a run keeps (fit_plan_to_memory) on large machines.
  const uint64_t left = std::min(2 * G, mem_available / 2);
  return std::min({mem_total / 100 * 55, mem_available - left, usable_memory(mem_available)});
}

Result<uint64_t> preset_budget_bytes(const std::string& name, uint64_t* mem_available) {
  constexpr uint64_t G = 1ull << 30;
  if (name == "laptop") return 8 * G;
  if (name == "desktop") return 32 * G;
  if (name == "workstation") return 96 * G;
  if (name == "server") return 128 * G;
  if (name == "max") return UINT64_MAX;
  if (name == "auto") {
    const auto [total, avail] = read_meminfo();
    if (total == 0 || avail == 0)
      return Status::usage("--preset auto: cannot read MemTotal/MemAvailable from /proc/meminfo");
    if (mem_available) *mem_available = avail;
    return auto_preset_budget(total, avail);
  }
  return Status::usage("--preset: '" + name +
                       "' is not one of laptop, desktop, workstation, server, max, auto");
}

namespace {
// The fewest expert slots: one fetch's top-k and, with lookahead, room for its prefetches: the
// last routed layer's top-k, which the policy keeps pinned until the next layer is routed (so
// past the predictions made in between), and top-k per depth. Without the former the deepest
// depth had no room, and at lookahead 1 no prefetch was ever issued at the minimum (tiny:
// 0 issued, 0% hits; one more slot: 170 issued).
// Never more than every expert plus one fetch's top-k (a deep lookahead on a model with few
// experts), the most the tier ever opens.
uint64_t min_expert_slots(const format::ModelConfig& c, int lookahead) {
  const uint64_t k = static_cast<uint64_t>(c.num_experts_per_token);
  const uint64_t all = static_cast<uint64_t>(c.num_moe_layers() * c.num_experts) + k;
  return std::min(all, k * (1 + (lookahead > 0 ? 1 + static_cast<uint64_t>(lookahead) : 0)));
}

// Elements of the distinct inputs x of the widest linear call in a forward() chunk of T
// tokens: T rows of the widest trunk input or, with `expert_calls`, a MoE call's T * top_k rows
// of an expert's input (its jobs differ in x: each expert's tokens are gathered apart).
int64_t widest_linear_inputs(const format::ModelConfig& c, int64_t T, bool expert_calls) {
  const int64_t cols = std::max({c.hidden_size, c.kda_width(), c.q_lora_rank,
                                 c.num_attention_heads * c.v_head_dim, c.intermediate_size,
                                 c.shared_expert_width(), c.routed_expert_hidden_size});
  int64_t elements = T * cols;
  if (expert_calls && c.num_moe_layers() > 0)
    elements = std::max(elements,
                        T * c.num_experts_per_token *
                            std::max(c.moe_intermediate_size, c.routed_expert_hidden_size));
  return elements;
}

// Device memory cuBLAS takes beside the Backend's allocations, for forward() chunks of up to T
// tokens: its workspace (32 MiB, NVIDIA's recommendation for Hopper; 4 MiB before) and the
// module's copies of x split into three bf16 parts (6 bytes per element), one per distinct x
// of a linear call, kept grown to 1.25x the largest call (cuda/cublas_gemm.cu). cuBLAS runs the
// float weights only: expert calls count with float experts.
uint64_t blas_bytes(const format::Checkpoint& ckpt, int64_t T) {
  const int64_t elements = widest_linear_inputs(
      ckpt.config(), T, ckpt.expert_storage() == format::ExpertStorage::kPlainFloat);
  constexpr uint64_t kWorkspace = 32ull << 20;
  return kWorkspace + backend::device_aligned(static_cast<uint64_t>(elements) * 6) / 4 * 5 +
         (1ull << 20);  // + the copies' 256-byte padding, many calls' worth
}

uint64_t host_sequence_bytes(const format::ModelConfig& c, const EngineOptions::Workload& wl,
                             bool lookahead) {
  const int64_t positions = std::max<int64_t>(wl.positions, 1);
  uint64_t bytes = model::working_set(c, std::max<int64_t>(wl.chunk, 1), positions, wl.rows,
                                      lookahead)
                       .total();
  if (c.num_mla_layers() > 0) bytes += cpu::mla_buffer_bytes(model::mla_dims(c), positions);
  // cpu::linear widens each distinct x of a call to double once, in a buffer of the forward
  // thread kept at its largest (K3, chunk 256: a MoE call's 117 MB), plus each block's padding
  // to 64 bytes (one block per expert at most).
  const int64_t T = std::min(std::max<int64_t>(wl.chunk, 1), positions);
  bytes += static_cast<uint64_t>(widest_linear_inputs(c, T, true) + 8 * (c.num_experts + 1)) *
           sizeof(double);
  return bytes;
}
}  // namespace

namespace {
// The layers the host may pin (TrunkStoreOptions::max_pinned): in GPU mode those the device
// streams, else every one (-1).
int64_t host_max_pinned(const format::ModelConfig& c, const DevicePlan* device) {
  return device ? c.num_hidden_layers - device->trunk.resident_layers : -1;
}
}  // namespace

DialMinimum dial_minimum(const format::Checkpoint& ckpt, const pack::TrunkPack* pack,
                         int lookahead, int threads, bool host_routers,
                         const EngineOptions::Workload* sequence, int64_t host_max_pinned) {
  DialMinimum m;
  m.trunk = TrunkStore::minimum_bytes(ckpt, pack, 2, threads, host_max_pinned);
  const bool moe = ckpt.expert_storage() != format::ExpertStorage::kNone &&
                   ckpt.config().num_moe_layers() > 0;
  if (sequence) m.sequence = host_sequence_bytes(ckpt.config(), *sequence, moe && lookahead > 0);
  if (ckpt.expert_storage() == format::ExpertStorage::kNone) return m;
  m.expert_slots = min_expert_slots(ckpt.config(), lookahead);
  m.slot_bytes = ExpertCache::slot_bytes(ckpt);
  if (lookahead > 0 && host_routers) m.routers = RouterBank::bytes_needed(ckpt);
  return m;
}

uint64_t minimum_budget_bytes(const format::Checkpoint& ckpt, const pack::TrunkPack* pack,
                              int lookahead, int threads,
                              const EngineOptions::Workload& sequence) {
  return dial_minimum(ckpt, pack, lookahead, threads, /*host_routers=*/true, &sequence).total();
}

int64_t capped_expert_slots(const DialPlan& plan, uint64_t mem_available) {
  // The sequence's state is allocated after the tier (new_sequence): still free when it opens.
  const uint64_t seq = plan.minimum.sequence;
  const uint64_t room = usable_memory(mem_available);
  const uint64_t usable = room > seq ? room - seq : 0;
  const uint64_t fit = std::max(plan.minimum.expert_slots, usable / plan.expert_slot_bytes);
  return static_cast<int64_t>(std::min(static_cast<uint64_t>(plan.expert_slots), fit));
}

LookaheadChoice choose_lookahead(const format::Checkpoint& ckpt, const pack::TrunkPack* pack,
                                 const EngineOptions& opts, uint64_t budget, int threads,
                                 int64_t host_max_pinned) {
  const int depth = lookahead_depth(opts, ckpt.config(), /*dial=*/true);
  if (opts.lookahead || depth == 0) return {depth, {}};
  const bool device = device_mode(opts);
  const auto minimum = [&](int d) {
    return dial_minimum(ckpt, pack, d, threads, /*host_routers=*/!device,
                        device ? nullptr : &opts.workload, host_max_pinned);
  };
  const DialMinimum with = minimum(depth);
  if (budget >= with.total()) return {depth, {}};
  // Below both: plan_dial refuses, stating the least an automatic run needs.
  if (budget < minimum(0).total()) return {0, {}};
  return {0,
          "lookahead off: the budget of " + format_size(budget) +
              " is below the minimum with lookahead " + std::to_string(depth) + ", " +
              format_size(with.total()) + " (" +
              (with.routers ? "routers " + format_size(with.routers) + ", " : "") +
              std::to_string(with.expert_slots) +
              " expert slots): the output is the same, experts are not prefetched; a budget "
              "of " + format_size(with.total()) + " or more turns it on",
          with.total()};
}

Result<DevicePlan> plan_device(const format::Checkpoint& ckpt, const EngineOptions& opts,
                               uint64_t vram_bytes, bool uses_blas) {
  const format::ModelConfig& c = ckpt.config();
  const bool moe = ckpt.expert_storage() != format::ExpertStorage::kNone && c.num_moe_layers() > 0;
  const int lookahead = lookahead_depth(opts, c, /*dial=*/true);
  DevicePlan d;
  d.vram = vram_bytes;
  d.tier_min_slots = moe ? VramExpertTier::minimum_slots(c, lookahead) : 0;
  d.tier_slot_bytes = moe ? VramExpertTier::slot_bytes_for(ckpt) : 0;
  const uint64_t tier_min = static_cast<uint64_t>(d.tier_min_slots) * d.tier_slot_bytes;
  // The sequence's working set first: what every token needs, whatever the placement.
  const EngineOptions::Workload& wl = opts.workload;
  if (wl.positions < 1 || wl.chunk < 1)
    return Status::usage("the planned sequence needs at least one position and one token a chunk");
  d.working_set = model::working_set(c, wl.chunk, wl.positions, wl.rows, moe && lookahead > 0);
  d.blas = uses_blas ? blas_bytes(ckpt, std::min(wl.chunk, wl.positions)) : 0;
  // The trunk's placement, from the checkpoint's shapes: a budget too small for it is refused
  // here, before anything is read; DeviceTrunk::open places the trunk as planned.
  const model::TensorLookup shapes = model::shapes_in(ckpt);
  KTIER_ASSIGN_OR_RETURN(model::HeadWeights head, model::bind_head(c, shapes));
  Result<DeviceTrunk::Plan> trunk =
      DeviceTrunk::plan(c, [&](int64_t l) { return model::bind_layer(c, l, shapes); },
                        std::move(head), vram_bytes, tier_min + d.working());
  if (!trunk.is_ok() && trunk.status().code() == ExitCode::kBudget) {
    // What the sequence's share is made of (fewer positions lower its state), then the expert
    // tier's, and what lowers it.
    Status refused = trunk.status().with_note(
        "The sequence's working set: " + format_size(d.working()) + " (state " +
        format_size(d.working_set.state_bytes) + " for " + std::to_string(wl.positions) +
        " positions, from " + wl.positions_from + "; activations " +
        format_size(d.working_set.activation_bytes) + " for chunks of " +
        std::to_string(wl.chunk) + (d.blas ? "; cuBLAS " + format_size(d.blas) : "") + ")");
    if (!moe) return refused;
    const std::string k = std::to_string(c.num_experts_per_token);
    const bool capped = d.tier_min_slots < c.num_experts_per_token * (2 + lookahead);
    return refused.with_note(
        "The VRAM expert tier's minimum: " + std::to_string(d.tier_min_slots) +
        " expert slots (" + format_size(tier_min) + "): " +
        (capped ? "every expert and " + k + " for one fetch"
                : "top_k " + k + " for the policy and " + k + " for one fetch" +
                      (lookahead > 0 ? ", and " + k + " per lookahead depth (--lookahead " +
                                           std::to_string(lookahead) +
                                           "; --lookahead 0 needs fewer)"
                                     : std::string())));
  }
  KTIER_RETURN_IF_ERROR(trunk.status());
  d.trunk = std::move(*trunk);
  d.trunk_bytes = d.trunk.device_bytes();
  if (moe) {
    // What the trunk leaves (the plan kept the tier's minimum free), never more slots than
    // every expert plus one fetch's bypass.
    const int64_t keys = c.num_moe_layers() * c.num_experts;
    d.tier_slots = std::min<int64_t>(
        static_cast<int64_t>((vram_bytes - d.working() - d.trunk_bytes) / d.tier_slot_bytes),
        keys + c.num_experts_per_token);
    KTIER_CHECK(d.tier_slots >= d.tier_min_slots);
  }
  return d;
}

Result<DialPlan> plan_dial(const format::Checkpoint& ckpt, const pack::TrunkPack* pack,
                           const EngineOptions& opts, uint64_t budget, int threads,
                           const DevicePlan* device) {
  const format::ModelConfig& c = ckpt.config();
  const int64_t L = c.num_hidden_layers;
  DialPlan p;
  p.budget = budget;
  // Trunk first; the expert tier needs one token's experts of one layer and the prefetch room.
  // In GPU mode lookahead scores the device trunk's copy of the routers, not a host RouterBank,
  // and the sequence's working set is set aside from the VRAM budget (plan_device).
  const EngineOptions::Workload* host_sequence = device ? nullptr : &opts.workload;
  // GPU mode: the host pins at most the layers the device streams.
  p.minimum = dial_minimum(ckpt, pack, lookahead_depth(opts, c, /*dial=*/true), threads,
                           /*host_routers=*/device == nullptr, host_sequence,
                           host_max_pinned(c, device));
  KTIER_RETURN_IF_ERROR(check_dial_budget(budget, p.minimum, pack, opts.workload));
  // The trunk pins what fits beside the routers of the layers it streams, which the bank then
  // holds (a pinned layer's router is read from the store); the rest goes to the expert tier.
  // GPU mode: the device holds the first layers, so the host pins the last ones, and only those
  // the device streams (RAM beyond them goes to the expert tier, not to layers the device holds).
  TrunkStoreOptions so;
  so.budget_bytes =
      budget == UINT64_MAX ? UINT64_MAX : budget - p.minimum.experts() - p.minimum.sequence;
  so.pin_last = device != nullptr;
  so.max_pinned = host_max_pinned(c, device);
  std::vector<uint64_t> router_suffix;  // [l]: routers of layers l.. (the bank's bytes from l)
  if (p.minimum.routers) {
    const std::vector<uint64_t> per_layer = RouterBank::layer_bytes(ckpt);
    router_suffix.assign(per_layer.size() + 1, 0);
    for (size_t l = per_layer.size(); l-- > 0;)
      router_suffix[l] = router_suffix[l + 1] + per_layer[l];
    KTIER_CHECK(router_suffix[0] == p.minimum.routers);
    so.streamed_extra = [&router_suffix](int64_t first) {
      return router_suffix[static_cast<size_t>(first)];
    };
  }
  KTIER_ASSIGN_OR_RETURN(p.trunk, TrunkStore::plan(ckpt, pack, so, threads));
  if (!router_suffix.empty()) {
    p.routers_from = p.trunk.layers_pinned;
    p.router_bytes = router_suffix[static_cast<size_t>(p.routers_from)];
  }
  // GPU mode: once the device's mirror pass is done, a host that pins every layer the device
  // streams never reads into its ring again.
  if (device && p.trunk.ring_slots > 0 &&
      p.trunk.layers_pinned >= L - device->trunk.resident_layers)
    p.ring_released = p.trunk.ring_bytes();
  // The device serves the head from its mirror: the host's copy goes to the expert tier.
  if (device) p.head_released = p.trunk.head_bytes;
  if (ckpt.expert_storage() == format::ExpertStorage::kNone) return p;
  // One fetch's worth of slots is lent to experts the policy does not keep; the rest is the
  // policy's capacity. More slots than every expert and one fetch are never needed.
  p.expert_slot_bytes = p.minimum.slot_bytes;
  p.expert_keys = c.num_moe_layers() * c.num_experts;
  p.expert_batch = c.num_experts_per_token;
  const uint64_t held = p.held();  // no expert slots yet
  const uint64_t most = static_cast<uint64_t>(p.expert_keys + p.expert_batch);
  const uint64_t left = budget == UINT64_MAX ? UINT64_MAX : (budget > held ? budget - held : 0);
  p.expert_slots = static_cast<int64_t>(
      std::clamp<uint64_t>(left / p.expert_slot_bytes, p.minimum.expert_slots, most));
  return p;
}

namespace {

// plan_device, with automatic lookahead (`automatic`: --lookahead was not given, opts.lookahead
// is unset) turned off where --vram holds the device's minimum without it but not
// with it (the VRAM tier's top_k slots per depth, the lookahead copy of the activations):
// opts.lookahead becomes 0 and `lowered` says why. Below both, the refusal at 0 (the least an
// automatic run needs); a depth given: plan_device's result at it.
Result<DevicePlan> plan_device_choosing_lookahead(const format::Checkpoint& ckpt,
                                                  EngineOptions& opts, bool automatic,
                                                  uint64_t vram_bytes, bool uses_blas,
                                                  std::string& lowered) {
  Result<DevicePlan> asked = plan_device(ckpt, opts, vram_bytes, uses_blas);
  const int depth = lookahead_depth(opts, ckpt.config(), /*dial=*/true);
  if (asked.is_ok() || !automatic || depth == 0 || asked.status().code() != ExitCode::kBudget)
    return asked;
  EngineOptions without = opts;
  without.lookahead = 0;
  Result<DevicePlan> fits = plan_device(ckpt, without, vram_bytes, uses_blas);
  opts.lookahead = 0;
  if (!fits.is_ok()) return fits;  // the least an automatic run needs, stated
  lowered = "lookahead off: --vram " + format_size(vram_bytes) +
            " holds the device's minimum without lookahead, not with lookahead " +
            std::to_string(depth) + " (its VRAM expert slots and the activations' copy): the " +
            "output is the same, experts are not prefetched; --lookahead " +
            std::to_string(depth) + " refuses instead, stating its minimum";
  return fits;
}

// plan_engine for the budget `requested` names (--ram, or --preset auto's). `host_short`, when
// given, is set where the refusal is the dial's budget's (not --vram's).
Result<EnginePlan> plan_engine_as_asked(const format::Checkpoint& ckpt,
                                        const pack::TrunkPack* pack,
                                        const EngineOptions& requested, int threads,
                                        backend::Backend* gpu, bool* host_short = nullptr) {
  EnginePlan p;
  p.opts = requested;
  const bool dial = dial_mode(requested);
  if (dial) {
    KTIER_ASSIGN_OR_RETURN(p.budget, dial_budget_bytes(requested, &p.mem_available));
  } else {  // a mapped checkpoint has no expert tier and reads nothing itself
    const std::string why = "the checkpoint is memory-mapped (give --pack, --ram or --preset)";
    if (requested.policy != strata::PolicyKind::kTemperature || !requested.temperature_seed.empty())
      p.unused_options.push_back("--policy/--profile ignored: " + why);
    if (requested.io.backend != io::IoBackend::kAuto || requested.io.rate_limit_bytes_per_s != 0)
      p.unused_options.push_back("--io/--io-rate-limit ignored: " + why);
    if (requested.lookahead.value_or(0) > 0)  // the depth a trace records
      p.unused_options.push_back("--lookahead reads nothing ahead: " + why +
                                 "; its predictions only go to a --trace");
  }
  // GPU mode plans the device first: the layers it holds are those the host never pins, which
  // the host's minimum depends on. Automatic lookahead is weighed against --vram there, then
  // against the dial's budget; turned off by the budget, the device is planned again without it
  // (its VRAM tier then needs fewer slots).
  uint64_t vram = 0;
  const bool uses_blas = gpu && gpu->uses_blas();
  if (device_mode(requested)) {
    std::optional<uint64_t> free_bytes;
    if (gpu) {
      KTIER_ASSIGN_OR_RETURN(free_bytes, gpu->free_memory());
    }
    KTIER_ASSIGN_OR_RETURN(vram, gpu_vram_bytes(requested, free_bytes));
    Result<DevicePlan> device = plan_device_choosing_lookahead(
        ckpt, p.opts, /*automatic=*/!requested.lookahead, vram, uses_blas, p.lookahead_lowered);
    if (!device.is_ok() && device.status().code() == ExitCode::kBudget && free_bytes &&
        !requested.vram_budget)
      device = device.status().with_note("--vram was not given: it is 90% of the " +
                                         std::to_string(*free_bytes) + " bytes the GPU has free");
    if (!device.is_ok() && device.status().code() == ExitCode::kBudget &&
        requested.device_auto && !requested.vram_budget) {
      p.device_fallback = std::string("the GPU is too small for this run, decoding on the CPU "
                                      "(same output; --device cuda --vram SIZE refuses instead") +
                          (requested.cublas_prefill ? "; --gpu-prefill cublas ignored" : "") +
                          "): " + device.status().message();
      p.opts.device = backend::DeviceKind::kCpu;
      p.opts.lookahead = requested.lookahead;
      p.lookahead_lowered.clear();
    } else {
      KTIER_ASSIGN_OR_RETURN(p.device, std::move(device));
    }
  }
  if (dial) {
    // Weighed even where --vram turned it off: the note then names both (more VRAM alone
    // would not turn it on).
    EngineOptions automatic = p.opts;
    if (!requested.lookahead) automatic.lookahead.reset();
    LookaheadChoice choice =
        choose_lookahead(ckpt, pack, automatic, p.budget, threads,
                         host_max_pinned(ckpt.config(), p.device ? &*p.device : nullptr));
    if (!choice.lowered.empty() && p.lookahead_lowered.empty()) {
      p.lookahead_lowered = std::move(choice.lowered);
    } else if (!choice.lowered.empty()) {
      const std::string need = format_size(choice.minimum_with);
      p.lookahead_lowered += "; the budget of " + format_size(p.budget) +
                             " is below its minimum with lookahead too, " + need +
                             ": more --vram and a budget of " + need + " or more turn it on";
    }
    const bool lowered = !p.opts.lookahead && choice.depth == 0 &&
                         lookahead_depth(p.opts, ckpt.config(), /*dial=*/true) > 0;
    if (!p.opts.lookahead) p.opts.lookahead = choice.depth;  // else given, or 0 for --vram
    if (lowered && p.device) {
      // Without lookahead the device may hold more layers and the host pin fewer. That raises
      // the host's minimum weighed above only where the device held none (the host could pin
      // all) and all layers together weigh less than the host's ring, two of the largest. With
      // two layers a device that fits its own minimum, two streaming slots of the largest
      // (DeviceTrunk::plan), holds them all, never none. With more, the host's records (4 KiB
      // rounding, a compressed pack's staging in its ring) and the device's layers differ in
      // size, so it could happen: the run is then refused, as --lookahead 0 is (its device
      // holds layers too), where a device holding none would have fit.
      KTIER_ASSIGN_OR_RETURN(p.device, plan_device(ckpt, p.opts, vram, uses_blas));
    }
  }
  const format::ModelConfig& c = ckpt.config();
  p.lookahead = c.num_moe_layers() > 0 ? lookahead_depth(p.opts, c, dial) : 0;
  if (const std::optional<int> asked = requested.lookahead; asked && *asked > p.lookahead) {
    const std::string given = "--lookahead " + std::to_string(*asked);
    if (c.num_moe_layers() == 0)
      p.lookahead_capped = given + " is not used: the model has no MoE layer to predict";
    else if (dial && requested.policy == strata::PolicyKind::kStatic)
      p.lookahead_capped = given + " is not used: --policy static never prefetches";
    else
      p.lookahead_capped = given + " runs " + std::to_string(p.lookahead) +
                           " deep: no deeper than the layers after the first (" +
                           std::to_string(c.num_hidden_layers - 1) + " here) nor than a " +
                           "trace records (" + std::to_string(strata::kMaxTraceLookahead) +
                           "); a deeper one predicts nothing more";
  }
  if (dial) {
    Result<DialPlan> planned = plan_dial(ckpt, pack, p.opts, p.budget, threads,
                                         p.device ? &*p.device : nullptr);
    if (host_short) *host_short = !planned.is_ok() && planned.status().code() == ExitCode::kBudget;
    // A refusal at lookahead 0 says why it is 0 (the --vram note is not logged then); one after
    // a fallback to the CPU, that the host now holds what the device would have.
    if (!planned.is_ok() && !p.device_fallback.empty())
      return planned.status().with_note("device: " + p.device_fallback);
    if (!planned.is_ok() && !p.lookahead_lowered.empty())
      return planned.status().with_note(p.lookahead_lowered);
    KTIER_ASSIGN_OR_RETURN(p.dial, std::move(planned));
  }
  return p;
}

}  // namespace

Result<EnginePlan> plan_engine(const format::Checkpoint& ckpt, const pack::TrunkPack* pack,
                               const EngineOptions& requested, int threads,
                               backend::Backend* gpu) {
  bool host_short = false;
  Result<EnginePlan> asked =
      plan_engine_as_asked(ckpt, pack, requested, threads, gpu, &host_short);
  if (asked.is_ok() || !host_short || requested.ram_budget || !dial_mode(requested))
    return asked;
  // --preset auto below the run's minimum (below 4 GiB free it leaves half of MemAvailable to
  // the system): 90% of MemAvailable, what a larger budget given is lowered to
  // (fit_plan_to_memory), rather than a refusal where a `--ram` of any size runs.
  uint64_t mem_available = 0;
  KTIER_ASSIGN_OR_RETURN(const uint64_t automatic, dial_budget_bytes(requested, &mem_available));
  const uint64_t room = usable_memory(mem_available);
  const std::string automatic_named = "--preset auto's budget of " + format_size(automatic);
  EngineOptions at = requested;
  at.ram_budget = room;
  Result<EnginePlan> raised =
      room > automatic ? plan_engine_as_asked(ckpt, pack, at, threads, gpu) : asked.status();
  if (!raised.is_ok() && raised.status().code() != ExitCode::kBudget) return raised.status();
  if (!raised.is_ok())
    return asked.status().with_note(
        "It is " + automatic_named + " (MemAvailable " +
        format_size(mem_available) + "), and not even 90% of MemAvailable holds this run: a " +
        "--ram of the minimum or more runs it anyway, with a warning");
  raised->mem_available = mem_available;
  raised->budget_raised = automatic_named + " is below this run's minimum: " +
                          format_size(room) + " instead, 90% of MemAvailable (" +
                          format_size(mem_available) + "); the output is the same";
  return raised;
}

uint64_t DialPlan::held_at_open() const {
  // The store holds its ring and the head record until the device's mirror is made (GPU mode),
  // beside the routers; the expert tier opens after they are freed.
  return std::max(held(), trunk.bytes_held + router_bytes + minimum.sequence);
}

Result<std::optional<EnginePlan>> fit_plan_to_memory(const format::Checkpoint& ckpt,
                                                     const pack::TrunkPack* pack,
                                                     const EngineOptions& requested,
                                                     const EnginePlan& plan, int threads,
                                                     backend::Backend* gpu,
                                                     uint64_t mem_available) {
  if (!plan.dial || mem_available == 0) return std::optional<EnginePlan>();
  const uint64_t room = usable_memory(mem_available);
  if (plan.dial->held_at_open() <= room) return std::optional<EnginePlan>();
  // The whole plan again at `room`: automatic lookahead goes off where it no longer fits.
  EngineOptions at = requested;
  at.ram_budget = room;
  Result<EnginePlan> fits = plan_engine(ckpt, pack, at, threads, gpu);
  if (!fits.is_ok() && fits.status().code() != ExitCode::kBudget) return fits.status();
  if (!fits.is_ok()) {
    // Below every minimum: the least a run needs (without lookahead, unless it was given).
    if (!requested.lookahead) at.lookahead = 0;
    at.ram_budget = UINT64_MAX;
    KTIER_ASSIGN_OR_RETURN(const EnginePlan everything, plan_engine(ckpt, pack, at, threads, gpu));
    at.ram_budget = everything.dial->minimum.total();
    fits = plan_engine(ckpt, pack, at, threads, gpu);
  }
  KTIER_RETURN_IF_ERROR(fits.status());
  if (fits->budget >= plan.budget) return std::optional<EnginePlan>();
  return std::optional<EnginePlan>(std::move(*fits));
}

std::string lowered_budget_note(const EnginePlan& asked, const EnginePlan& here,
                                uint64_t mem_available) {
  KTIER_CHECK(asked.dial && here.dial);
  const DialPlan &a = *asked.dial, &h = *here.dial;
  const uint64_t room = usable_memory(mem_available);
  std::string note = "budget lowered from " +
                     (a.budget == UINT64_MAX ? std::string("max") : format_size(a.budget)) +
                     " to " + format_size(h.budget);
  if (h.budget <= room)
    note += ", 90% of MemAvailable (" + format_size(mem_available) + ")";
  else
    note += ", the least a run needs: 90% of MemAvailable (" + format_size(mem_available) +
            ") is below it" +
            (h.held_at_open() > mem_available ? ", and so is MemAvailable itself" : "");
  // What changed only ("0 trunk layers pinned instead of 0" said nothing).
  std::string changed;
  const auto instead = [&](int64_t now, int64_t was, const char* before, const char* after) {
    if (now != was)
      changed += (changed.empty() ? ": " : ", ") + std::string(before) + std::to_string(now) +
                 after + " instead of " + std::to_string(was);
  };
  instead(h.trunk.layers_pinned, a.trunk.layers_pinned, "", " trunk layers pinned");
  instead(h.expert_slots, a.expert_slots, "", " expert slots");
  instead(here.lookahead, asked.lookahead, "lookahead ", "");
  return note + changed + "; the output is the same";
}

}  // namespace ktier::runtime
