#pragma once
// Everything a run needs, opened once from the command line's choices: the validated
// checkpoint, the bound weights, the expert source, the thread pool and the Model over them.
//
// Ownership: an Engine owns all of these; the Model refers into them and lives as long as the
// Engine. Not thread-safe (one generation at a time).

#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "common/status.h"
#include "cpu/exec.h"
#include "cpu/thread_pool.h"
#include "format/checkpoint.h"
#include "model/experts.h"
#include "model/model.h"
#include "model/weights.h"
#include "pack/trunk_pack.h"
#include "runtime/device_trunk.h"
#include "runtime/expert_cache.h"
#include "runtime/router_bank.h"
#include "runtime/trunk_store.h"
#include "runtime/vram_expert_tier.h"
#include "strata/cache_policy.h"

namespace ktier::runtime {

struct EngineOptions {
  std::filesystem::path model_dir;
  int threads = 0;                        // 0: one per hardware thread
  std::optional<cpu::Isa> isa;            // nullopt: the fastest supported
  format::OpenMode mode = format::OpenMode::kMap;
  // The memory dial. When either is set the trunk goes through a TrunkStore (pinned prefix +
  // streamed ring, read with the I/O layer) and the checkpoint is opened without a mapping.
  std::optional<std::filesystem::path> pack_dir;  // trunk pack made by `ktier pack`
  // Bytes for the weights: trunk (TrunkStore) first, the rest is the expert RAM tier
  // (ExpertCache). nullopt with a pack: automatic (see auto_budget_bytes).
  std::optional<uint64_t> ram_budget;
  io::IoOptions io;
  // Strata (docs/STRATA.md): the expert tier's placement policy, router lookahead depth (0: off;
  // without the memory dial lookahead only feeds observers such as a trace) and its refresh
  // (layer l+1 rescored after layer l's FFN, §4), and what a recorded
  // profile gives the policy (temperatures at clock 0, per key; a ranking for kStatic).
  strata::PolicyKind policy = strata::PolicyKind::kTemperature;
  int lookahead = 1;
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
  // What one sequence will run: its working set (model::working_set; in GPU mode plus cuBLAS's
  // workspace and copies, on the CPU plus the MLA kernel's buffer and cpu::linear's widened
  // inputs) is set aside from
  // vram_budget (GPU mode) or ram_budget (the memory dial) before the trunk and the experts are
  // placed, so that the whole run fits in it; the sequence must reserve its caches for
  // `positions` (GenerationOptions::reserve_positions; evaluate() does). A longer sequence
  // grows its caches outside the budget: on a GPU that may fail out of memory (exit 1), on the
  // emulated device it does. `run` gives prompt + -n - 1 (or -c), `eval` its tokens. (The
  // emulated device runs the CPU MLA kernel, whose buffer is counted in neither budget.)
  struct Workload {
    int64_t positions = 4096;  // tokens the sequence holds at most
    int64_t chunk = 256;       // tokens per forward() at most
    model::LogitRows rows = model::LogitRows::kLast;
  };
  Workload workload;
};

// The smallest budget the memory dial accepts for `ckpt` (with `pack`, or null), part by part:
// the trunk's minimum (TrunkStore::minimum_bytes; a compressed pack's scratch grows with
// `threads`), expert slots for one fetch and top-k more per lookahead depth, the lookahead
// routers (RouterBank::bytes_needed) when lookahead > 0 and the host scores them
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

class Engine {
 public:
  // Errors: those of Checkpoint::open (exit 2/3/1), Status::usage for threads outside
  // 0..cpu::kMaxThreads, lookahead < 0, the belady policy (replay only), static without a
  // ranking, or an ISA this CPU or build lacks; with the memory dial also those of
  // TrunkPack::open (exit 2/3), I/O errors (exit 1), Status::corrupt for a pack record failing
  // its checksum, and Status::budget (exit 4) for a budget below the stated minimum.
  static Result<std::unique_ptr<Engine>> open(const EngineOptions& opts);
  ~Engine();

  const format::Checkpoint& checkpoint() const { return ckpt_; }
  // Resident weights (no memory dial); null when a TrunkStore holds the trunk.
  const model::ModelWeights* weights() const { return weights_.get(); }
  // The memory dial's trunk and expert tier; null without --pack / --ram.
  const TrunkStore* trunk_store() const { return store_.get(); }
  const ExpertCache* expert_cache() const { return cache_.get(); }
  // Routing weights held for lookahead with the memory dial; null otherwise.
  const RouterBank* router_bank() const { return bank_.get(); }
  // GPU mode only (null otherwise): the trunk mirror and the VRAM expert tier.
  const DeviceTrunk* device_trunk() const { return device_trunk_.get(); }
  const VramExpertTier* vram_tier() const { return vram_tier_.get(); }
  // Starts a report window in the expert tiers (ExpertCache/VramExpertTier::begin_window).
  void begin_report_window();
  // GPU mode (0 otherwise): --vram as applied, and the part of it set aside for the sequence's
  // working set.
  uint64_t device_vram_bytes() const { return vram_bytes_; }
  uint64_t device_working_bytes() const { return working_bytes_; }
  const backend::Backend& backend() const { return *backend_; }
  const io::IoEngine* io_engine() const { return io_.get(); }
  uint64_t budget_bytes() const { return budget_; }  // 0 without the dial
  model::Model& model() { return *model_; }
  const model::Model& model() const { return *model_; }
  // The ExpertSource the Model reads: the VRAM tier (GPU mode), the RAM tier (the memory dial)
  // or the checkpoint; null without MoE layers.
  const model::ExpertSource* experts() const {
    if (vram_tier_) return vram_tier_.get();
    return cache_ ? static_cast<const model::ExpertSource*>(cache_.get()) : experts_.get();
  }
  model::ExpertSource* experts() {
    if (vram_tier_) return vram_tier_.get();
    return cache_ ? static_cast<model::ExpertSource*>(cache_.get()) : experts_.get();
  }
  const cpu::Exec& exec() const { return exec_; }
  int threads() const { return pool_->size(); }

  // `s`, and where it is an error of values not finite (is_nonfinite_logits: the logits, a
  // router's scores), the first weight of the checkpoint that is not finite
  // (find_nonfinite_weight: read on the first such error only), or that none is. Thread-safe.
  Status explain_nonfinite(const Status& s) const;

 private:
  explicit Engine(format::Checkpoint ckpt) : ckpt_(std::move(ckpt)) {}
  // The memory dial in two steps, GPU mode's device trunk between them: pack, I/O engine,
  // TrunkStore, RouterBank; then the ExpertCache from the budget the others left.
  Status open_trunk_dial(const EngineOptions& opts);
  Status open_expert_tier(const EngineOptions& opts);
  // GPU mode, before the dial: the backend, --vram, the sequence's working set and where the
  // trunk will go (device_plan_), so that the host pins only the layers the device streams.
  Status plan_device(const EngineOptions& opts);
  // GPU mode: DeviceTrunk over `trunk` (frees the TrunkStore's ring when it is done with it);
  // then VramExpertTier over `experts` (may be null) and the host memory page-locked.
  Status open_device_trunk(model::TrunkSource& trunk);
  Status open_device(const EngineOptions& opts, model::ExpertSource* experts);
  format::Checkpoint ckpt_;
  std::unique_ptr<model::ModelWeights> weights_;
  std::optional<pack::TrunkPack> pack_;
  std::unique_ptr<io::IoEngine> io_;
  std::vector<io::ReadFile> shard_files_;
  std::unique_ptr<TrunkStore> store_;
  std::unique_ptr<RouterBank> bank_;
  std::unique_ptr<ExpertCache> cache_;
  uint64_t budget_ = 0;
  std::unique_ptr<model::ExpertSource> experts_;
  std::unique_ptr<backend::Backend> backend_;  // what the Model runs on
  std::unique_ptr<DeviceTrunk> device_trunk_;
  std::unique_ptr<VramExpertTier> vram_tier_;
  // GPU mode: host memory page-locked by backend_ (the RAM tier's arena, the TrunkStore buffers
  // of the layers the device streams); unpinned before they are freed.
  std::vector<void*> pinned_host_;
  uint64_t vram_bytes_ = 0;     // GPU mode: the budget applied
  uint64_t working_bytes_ = 0;  // GPU mode: set aside for the sequence (EngineOptions::Workload)
  DeviceTrunk::Plan device_plan_;  // GPU mode: where the trunk goes (plan_device)
  mutable std::mutex nonfinite_mutex_;                 // guards nonfinite_note_
  mutable std::optional<std::string> nonfinite_note_;  // explain_nonfinite's, once read
  DialMinimum dial_min_;            // the memory dial's minimum, part by part (open_trunk_dial)
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<cpu::ThreadPool> pool_;
  cpu::Exec exec_;
};

DialMinimum dial_minimum(const format::Checkpoint& ckpt, const pack::TrunkPack* pack,
                         int lookahead, int threads, bool host_routers,
                         const EngineOptions::Workload* sequence);
// dial_minimum(...).total() for the CPU engine (host routers, the sequence in host memory).
uint64_t minimum_budget_bytes(const format::Checkpoint& ckpt, const pack::TrunkPack* pack,
                              int lookahead, int threads = 1,
                              const EngineOptions::Workload& sequence = {});

// Status::budget (exit 4) naming every part of `min` when `budget` is below its total (the
// memory dial's refusal, also asked before a run that would open the engine late); ok otherwise.
Status check_dial_budget(uint64_t budget, const DialMinimum& min, const pack::TrunkPack* pack,
                         const EngineOptions::Workload& workload);

// Budget of a named preset (K3 scale; DESIGN.md §4, docs/TUNING.md): laptop 8G, desktop 32G,
// workstation 96G, server 128G, max (everything), auto (55 % of MemTotal, at most MemAvailable
// less 2 GiB). Status::usage for another name or when /proc/meminfo cannot be read for auto.
Result<uint64_t> preset_budget_bytes(const std::string& name);

// The engine's thread count for EngineOptions::threads (0: one per hardware thread).
int resolve_threads(int requested);

// "auto" -> nullopt, "scalar", "avx2"; Status::usage otherwise.
Result<std::optional<cpu::Isa>> parse_isa(const std::string& name);

}  // namespace ktier::runtime
