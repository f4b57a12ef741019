#pragma once
// What the engine is asked for (EngineOptions) and where it will put everything, decided from
// the checkpoint's shapes and sizes alone: nothing is read or allocated here. Engine::open
// places the trunk and the experts as these plans say (and CHECKs that it did); `ktier plan`
// prints them without loading anything.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/status.h"
#include "cpu/exec.h"
#include "format/checkpoint.h"
#include "io/io_engine.h"
#include "model/model.h"
#include "pack/trunk_pack.h"
#include "runtime/device_trunk.h"
#include "runtime/trunk_store.h"
#include "strata/cache_policy.h"

namespace ktier::runtime {

// The router lookahead depth a run gets when --lookahead is not given and memory allows.
inline constexpr int kDefaultLookahead = 1;

struct EngineOptions {
  std::filesystem::path model_dir;
  int threads = 0;                        // 0: one per hardware thread
  std::optional<cpu::Isa> isa;            // nullopt: the fastest supported
  format::OpenMode mode = format::OpenMode::kMap;
  // The memory dial. When either is set the trunk goes through a TrunkStore (pinned prefix +
  // streamed ring, read with the I/O layer) and the checkpoint is opened without a mapping.
  std::optional<std::filesystem::path> pack_dir;  // trunk pack made by `ktier pack`
  // Bytes for the weights: trunk (TrunkStore) first, the rest is the expert RAM tier
  // (ExpertCache). nullopt with a pack, GPU mode or `auto_budget`: automatic
  // (preset_budget_bytes("auto")).
  std::optional<uint64_t> ram_budget;
  bool auto_budget = false;  // --preset auto: the memory dial at the automatic budget
  io::IoOptions io;
  // Strata (docs/STRATA.md): the expert tier's placement policy, router lookahead depth (0: off;
  // without the memory dial lookahead only feeds observers such as a trace) and its refresh
  // (layer l+1 rescored after layer l's FFN, §4), and what a recorded
  // profile gives the policy (temperatures at clock 0, per key; a ranking for kStatic).
  // lookahead nullopt: automatic (choose_lookahead; in GPU mode plan_engine weighs --vram too):
  // kDefaultLookahead, or 0 where the dial's budget or --vram holds everything else but not
  // lookahead's share.
  strata::PolicyKind policy = strata::PolicyKind::kTemperature;
  std::optional<int> lookahead;
  bool lookahead_refresh = true;
  std::vector<double> temperature_seed;
  std::vector<uint32_t> static_ranking;
  // GPU mode (issue 6): decode on a device, with the trunk mirrored into its memory
  // (DeviceTrunk) and a VRAM expert tier (VramExpertTier) in front of the host tier. kCuda opens
  // the CUDA module's first GPU; emulate_device runs the same placement on the emulated device
  // (the CPU kernels behind a memory wall: tests, --device emulated). vram_budget: device bytes
  // for everything — the working set (below), the trunk mirror and the VRAM tier; nullopt: 90%
  // of the GPU's free memory (required when emulating, and the emulated device's capacity).
  backend::DeviceKind device = backend::DeviceKind::kCpu;
  bool emulate_device = false;
  std::optional<uint64_t> vram_budget;
  // kCuda chosen by `--device auto`: where the GPU's default share (vram_budget unset) cannot
  // hold the run, the plan falls back to the CPU (EnginePlan::device_fallback) instead of
  // refusing; `--device cuda` or a --vram given refuses (exit 4).
  bool device_auto = false;
  // kCuda: F32 and BF16 linears of 8 tokens or more through cuBLAS (`--gpu-prefill cublas`;
  // backend::make_cuda_backend). Off, the GPU's output does not depend on prefill chunking.
  bool cublas_prefill = false;
  // What one sequence will run: its working set (model::working_set; in GPU mode with cuBLAS
  // prefill plus cuBLAS's workspace and copies, on the CPU plus the MLA kernel's buffer and
  // cpu::linear's widened inputs) is set aside from vram_budget (GPU mode) or ram_budget (the
  // memory dial) before the trunk and the experts are
  // placed, so that the whole run fits in it; the sequence must reserve its caches for
  // `positions` (GenerationOptions::reserve_positions; evaluate() does). A longer sequence
  // grows its caches outside the budget: on a GPU that may fail out of memory (exit 1), on the
  // emulated device it does. `run` gives prompt + -n - 1 (or -c), `eval` its tokens. (The
  // emulated device runs the CPU MLA kernel, whose buffer is counted in neither budget.)
  struct Workload {
    int64_t positions = 4096;  // tokens the sequence holds at most
    int64_t chunk = 256;       // tokens per forward() at most
    model::LogitRows rows = model::LogitRows::kLast;
    // What set `positions`, for a refusal to name (the flag a user changes).
    std::string positions_from = "-c";
  };
  Workload workload;
};

// The smallest budget the memory dial accepts for `ckpt` (with `pack`, or null), part by part:
// the trunk's minimum (TrunkStore::minimum_bytes; a compressed pack's scratch grows with
// `threads`; `host_max_pinned` as TrunkStoreOptions::max_pinned: in GPU mode the layers the
// device streams, -1 otherwise), expert slots for one fetch and top-k more per lookahead depth,
// the lookahead routers (RouterBank::bytes_needed) when lookahead > 0 and the host scores them
// (`host_routers`; GPU mode scores the device trunk's copy instead), and the planned sequence's
// working set in host memory (`sequence`: model::working_set for the workload plus the CPU MLA
// kernel's buffer; null in GPU mode, where it is set aside from the VRAM budget). Bytes. The
// sequence's part is not a minimum of the dial but a fixed cost: the trunk and the experts get
// what the budget leaves after it.
struct DialMinimum {
  uint64_t trunk = 0;
  uint64_t expert_slots = 0, slot_bytes = 0;
  uint64_t routers = 0;
  uint64_t sequence = 0;
  uint64_t experts() const { return expert_slots * slot_bytes; }
  uint64_t total() const { return trunk + experts() + routers + sequence; }
};

DialMinimum dial_minimum(const format::Checkpoint& ckpt, const pack::TrunkPack* pack,
                         int lookahead, int threads, bool host_routers,
                         const EngineOptions::Workload* sequence, int64_t host_max_pinned = -1);
// dial_minimum(...).total() for the CPU engine (host routers, the sequence in host memory).
uint64_t minimum_budget_bytes(const format::Checkpoint& ckpt, const pack::TrunkPack* pack,
                              int lookahead, int threads = 1,
                              const EngineOptions::Workload& sequence = {});

// Status::budget (exit 4) naming every part of `min` when `budget` is below its total (the
// memory dial's refusal, also asked before a run that would open the engine late); ok otherwise.
Status check_dial_budget(uint64_t budget, const DialMinimum& min, const pack::TrunkPack* pack,
                         const EngineOptions::Workload& workload);

// Budget of a named preset (K3 scale; DESIGN.md §4, docs/TUNING.md): laptop 8G, desktop 32G,
// workstation 96G, server 128G, max (everything), auto (auto_preset_budget of /proc/meminfo).
// Status::usage for another name or when /proc/meminfo cannot be read for auto.
// `mem_available`, when given, receives the MemAvailable auto read (untouched otherwise).
Result<uint64_t> preset_budget_bytes(const std::string& name, uint64_t* mem_available = nullptr);
// --preset auto's budget on a machine with these MemTotal and MemAvailable bytes: 55 % of
// MemTotal, at most MemAvailable less 2 GiB (less half of it below 4 GiB) and 90 % of it.
// Never smaller for more MemAvailable.
uint64_t auto_preset_budget(uint64_t mem_total, uint64_t mem_available);

// What a run may hold on a machine with `mem_available` bytes free (MemAvailable): 90 % of it,
// the rest left to the page cache and what no budget covers (fit_plan_to_memory, the RAM tier's
// cap, --preset auto).
inline uint64_t usable_memory(uint64_t mem_available) { return mem_available / 10 * 9; }

// MemTotal and MemAvailable from /proc/meminfo in bytes; 0 for what cannot be read.
// KTIER_DEBUG_MEM_AVAILABLE_MIB (debugging and tests) replaces MemAvailable.
struct MemInfo {
  uint64_t total = 0, available = 0;
};
MemInfo read_meminfo();
// read_meminfo().available.
uint64_t mem_available_bytes();

// Status::usage for options no engine opens with: threads outside 0..cpu::kMaxThreads,
// lookahead < 0, the belady policy (replay only), static without a ranking, or an ISA this CPU
// or build lacks. Engine::open and `ktier plan` ask it first.
Status check_engine_options(const EngineOptions& opts);

// The memory dial's budget: EngineOptions::ram_budget, else preset "auto"'s (its errors; its
// MemAvailable into `mem_available` when given).
Result<uint64_t> dial_budget_bytes(const EngineOptions& opts, uint64_t* mem_available = nullptr);
// GPU mode's --vram on a GPU with `free_bytes` free: EngineOptions::vram_budget, else 90% of
// what is free; Status::budget (exit 4) for a --vram above what is free. The emulated device
// (`free_bytes` nullopt) has no free memory to ask: Status::usage without --vram.
Result<uint64_t> gpu_vram_bytes(const EngineOptions& opts, std::optional<uint64_t> free_bytes);

// Whether `opts` runs GPU mode (the CUDA device, or the emulated one).
inline bool device_mode(const EngineOptions& opts) {
  return opts.device == backend::DeviceKind::kCuda || opts.emulate_device;
}
// Whether `opts` runs the memory dial (the trunk through a TrunkStore, the experts through an
// ExpertCache): with --pack, --ram or --preset, and always in GPU mode.
inline bool dial_mode(const EngineOptions& opts) {
  return opts.pack_dir.has_value() || opts.ram_budget.has_value() || opts.auto_budget ||
         device_mode(opts);
}
// The router lookahead depth `opts` runs on `c` (kDefaultLookahead when automatic): at most the
// layers after the first and a trace's limit; with the dial, 0 for the static policy (it never
// prefetches).
int lookahead_depth(const EngineOptions& opts, const format::ModelConfig& c, bool dial);

// Automatic lookahead on the memory dial (EngineOptions::lookahead nullopt), decided before
// anything is placed: kDefaultLookahead, or 0 when `budget` is below the dial's minimum with it
// (`lowered` says why where the minimum without it is met; below that too plan_dial's refusal
// states the minimum without lookahead: the least an automatic run needs). On the dial
// lookahead needs the streamed layers' routers and prefetch slots (K3: 1.11 GiB of routers,
// beyond a laptop's 8 GiB with the rest); it changes the speed, never the output. A
// --lookahead given is kept (and refused below its minimum by plan_dial).
// `threads` as for plan_dial; in GPU mode (device_mode) the minimum is plan_dial's with a device
// when `host_max_pinned` is the layers the device streams (dial_minimum; -1, every layer, gives
// the CPU's trunk minimum): its routers and sequence are in VRAM.
struct LookaheadChoice {
  int depth = 0;
  std::string lowered;  // why automatic lookahead is off (for a log line); empty otherwise
  uint64_t minimum_with = 0;  // where `lowered`: the budget lookahead needs, bytes
};
LookaheadChoice choose_lookahead(const format::Checkpoint& ckpt, const pack::TrunkPack* pack,
                                 const EngineOptions& opts, uint64_t budget, int threads,
                                 int64_t host_max_pinned = -1);

// GPU mode's device memory, from --vram (`vram_bytes`): the sequence's working set first, then
// the trunk's mirror (DeviceTrunk::plan), then the VRAM expert tier in what is left. Bytes.
struct DevicePlan {
  uint64_t vram = 0;
  model::WorkingSet working_set;  // state and activations of EngineOptions::workload
  uint64_t blas = 0;              // cuBLAS's workspace and copies (backends that use it)
  DeviceTrunk::Plan trunk;
  uint64_t trunk_bytes = 0;       // DeviceTrunk::bytes() once open
  int64_t tier_min_slots = 0, tier_slots = 0;  // VramExpertTier (0 without MoE layers)
  uint64_t tier_slot_bytes = 0;
  // What the sequence takes: set aside first.
  uint64_t working() const { return working_set.total() + blas; }
};
// Errors: Status::usage for a workload without positions or chunk; Status::budget (exit 4) when
// --vram cannot hold the working set, the trunk's minimum and the expert tier's minimum, naming
// the parts. `uses_blas`: the backend runs cuBLAS (CUDA; not the emulated device).
Result<DevicePlan> plan_device(const format::Checkpoint& ckpt, const EngineOptions& opts,
                               uint64_t vram_bytes, bool uses_blas);
// The memory dial's host memory: the budget less the sequence, the trunk (TrunkStore), the
// lookahead routers of the layers it streams (RouterBank) and the expert RAM tier. Bytes.
struct DialPlan {
  uint64_t budget = 0;
  DialMinimum minimum;
  TrunkPlan trunk;
  uint64_t ring_released = 0;  // GPU mode: the ring freed once the host pins every layer the
                               // device streams (TrunkStore::release_ring)
  uint64_t head_released = 0;  // GPU mode: the head record, freed once the device mirrors it
                               // (TrunkStore::release_head)
  int64_t routers_from = 0;    // the RouterBank holds layers routers_from.. (their routers)
  uint64_t router_bytes = 0;   // 0: no bank
  int64_t expert_slots = 0;    // the RAM tier's slots, one fetch's top-k (expert_batch) of them
  int64_t expert_batch = 0;    // lent to experts the policy does not keep; 0 without experts
  uint64_t expert_slot_bytes = 0;
  int64_t expert_keys = 0;     // experts in the checkpoint: MoE layers x experts
  // What stays held once the engine is open, the expert tier's slots included (its arena may
  // round them up to whole huge pages).
  uint64_t held() const {
    return trunk_held() + router_bytes + minimum.sequence +
           static_cast<uint64_t>(expert_slots) * expert_slot_bytes;
  }
  // The TrunkStore's bytes once the engine is open (TrunkStoreStats::bytes_allocated).
  uint64_t trunk_held() const { return trunk.bytes_held - ring_released - head_released; }
  // The most held at once while the engine opens: held(), or before GPU mode frees the ring
  // and the head record, the whole store with the routers and the sequence.
  uint64_t held_at_open() const;
};
// The RAM tier's slots a run opens on a machine with `mem_available` bytes free: the plan's,
// capped at 90% of it less the sequence (the tier is faulted in at start: a budget above
// physical memory, or `max`, would otherwise end in the OOM killer), never below the minimum.
int64_t capped_expert_slots(const DialPlan& plan, uint64_t mem_available);

// `budget`: the dial's bytes (EngineOptions::ram_budget, or preset "auto"'s); `threads`: the
// engine's (a compressed pack's inflate scratch); `device`: GPU mode's plan (null on the CPU).
// The expert tier gets what the rest leaves; Engine::open caps it further at 90% of
// MemAvailable when it opens. Errors: Status::budget (exit 4) for a budget below the minimum
// (check_dial_budget's message).
Result<DialPlan> plan_dial(const format::Checkpoint& ckpt, const pack::TrunkPack* pack,
                           const EngineOptions& opts, uint64_t budget, int threads,
                           const DevicePlan* device);

// Everything Engine::open decides before it reads or allocates, in its order: the memory dial's
// budget (dial_budget_bytes), GPU mode's device plan (plan_device at --vram; automatic lookahead
// turned off where --vram holds the device's minimum without it but not with it), automatic
// lookahead on the dial's budget (choose_lookahead; turned off there, the device is planned
// again without it) and the dial's plan (plan_dial). `ktier plan` prints this plan; the engine
// places everything as it says and CHECKs that it did.
struct EnginePlan {
  EngineOptions opts;   // as requested, with lookahead decided where the dial runs
  uint64_t budget = 0;  // the dial's bytes; 0 without the dial
  std::optional<DevicePlan> device;  // GPU mode
  std::optional<DialPlan> dial;      // the memory dial (always in GPU mode)
  int lookahead = 0;  // the depth a run gets (lookahead_depth; 0 for a model without MoE layers)
  // Why automatic lookahead is off (a log line; a refusal's note); empty otherwise.
  std::string lookahead_lowered;
  // Why a --lookahead given runs shallower than asked (deeper than the layers after the first
  // or than a trace records, 255; --policy static, which never prefetches; a model without MoE
  // layers): a log line and a plan note; empty otherwise.
  std::string lookahead_capped;
  // Why GPU mode fell back to the CPU (EngineOptions::device_auto): opts.device is then kCpu and
  // the memory dial runs as GPU mode would have (its budget, --ram or --preset auto); a log
  // line and a plan note. Empty otherwise.
  std::string device_fallback;
  // Why the budget is more than --preset auto's: auto's was below the run's minimum (a machine
  // with little memory free), so the plan is that of a larger budget lowered to fit
  // (fit_plan_to_memory); a log line and a plan note. Empty otherwise.
  std::string budget_raised;
  // The MemAvailable --preset auto read for `budget` (0: a budget given): what the fit to
  // memory then weighs too, so that auto's budget is never lowered by a second, later read.
  uint64_t mem_available = 0;
  // What a run without the dial (a memory-mapped checkpoint) does not use of what was asked:
  // --policy/--profile, --io/--io-rate-limit, --lookahead's reads (its predictions still go to
  // a --trace); a log line and a plan note each. Empty with the dial.
  std::vector<std::string> unused_options{};
};
// --preset auto's budget below the run's minimum is raised as budget_raised says.
// `threads`: the engine's (plan_dial); `gpu`: the CUDA backend in GPU mode, asked for its free
// memory (gpu_vram_bytes) and whether it runs cuBLAS; null on the CPU and the emulated device
// (sized by --vram alone). Errors: those of dial_budget_bytes, Backend::free_memory,
// gpu_vram_bytes, plan_device and plan_dial (with lookahead_lowered as a note).
Result<EnginePlan> plan_engine(const format::Checkpoint& ckpt, const pack::TrunkPack* pack,
                               const EngineOptions& requested, int threads,
                               backend::Backend* gpu);

// What a run on a machine with `mem_available` bytes free (MemAvailable; 0: unknown) opens
// instead of `plan` (plan_engine's for `requested`, same `threads` and `gpu`) when what `plan`
// holds at open (DialPlan::held_at_open) is more than 90% of it: plan_engine at a --ram of 90%
// of it (automatic lookahead off where it no longer fits), or where that is below every minimum
// at the least a run needs (lookahead 0 unless given). The pinned layers are read and the
// expert tier faulted in when the engine opens: a budget past the machine's memory (`max`, a
// preset or --ram for a bigger one) would end in the OOM killer. Only the speed changes, never
// the output. nullopt where `plan` fits (or has no dial). Errors: plan_engine's.
Result<std::optional<EnginePlan>> fit_plan_to_memory(const format::Checkpoint& ckpt,
                                                     const pack::TrunkPack* pack,
                                                     const EngineOptions& requested,
                                                     const EnginePlan& plan, int threads,
                                                     backend::Backend* gpu,
                                                     uint64_t mem_available);
// The warning (run) and note (plan) for `here` replacing `asked` on a machine with
// `mem_available` bytes free: the budgets, why, and the layers, slots and lookahead changed.
std::string lowered_budget_note(const EnginePlan& asked, const EnginePlan& here,
                                uint64_t mem_available);

}  // namespace ktier::runtime
