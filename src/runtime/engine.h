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
#include "runtime/engine_plan.h"
#include "runtime/finite_trunk.h"
#include "runtime/expert_cache.h"
#include "runtime/router_bank.h"
#include "runtime/trunk_store.h"
#include "runtime/vram_expert_tier.h"
#include "strata/cache_policy.h"

namespace ktier::runtime {

class Engine {
 public:
  // Errors: those of Checkpoint::open (exit 2/3/1), Status::usage for threads outside
  // 0..cpu::kMaxThreads, lookahead < 0, the belady policy (replay only), static without a
  // ranking, or an ISA this CPU or build lacks; with the memory dial also those of
  // TrunkPack::open (exit 2/3), I/O errors (exit 1), Status::corrupt for a pack record failing
  // its checksum, and Status::budget (exit 4) for a budget below the stated minimum. Automatic
  // lookahead (plan_engine) is decided here; model().lookahead_depth() says what it was.
  static Result<std::unique_ptr<Engine>> open(const EngineOptions& requested);
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
  uint64_t device_vram_bytes() const { return plan_.device ? plan_.device->vram : 0; }
  uint64_t device_working_bytes() const { return plan_.device ? plan_.device->working() : 0; }
  // GPU mode: host memory the device copies from that is page-locked, and that which the
  // backend refused to lock (its copies run from pageable memory: slower, and a copy ahead may
  // wait for the ops queued before it).
  uint64_t host_page_locked_bytes() const { return pinned_host_bytes_; }
  uint64_t host_page_lock_refused_bytes() const { return pin_refused_bytes_; }
  const backend::Backend& backend() const { return *backend_; }
  const io::IoEngine* io_engine() const { return io_.get(); }
  uint64_t budget_bytes() const { return plan_.budget; }  // 0 without the dial
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
  // router's scores), the first trunk weight of the checkpoint that is not finite
  // (find_nonfinite_weight: read on the first such error only); where none is, a damaged scale
  // of the experts the pass's last MoE layer routed to (find_damaged_expert_scale), or that none
  // is. Call it after the failed pass, before another (it reads the model's last routing, which
  // a pass writes: not concurrently with one; the trunk scan is thread-safe).
  Status explain_nonfinite(const Status& s) const;

 private:
  explicit Engine(format::Checkpoint ckpt) : ckpt_(std::move(ckpt)) {}
  // Before anything is read or allocated: the memory dial's pack, GPU mode's backend and
  // plan_engine's plan (plan_), automatic lookahead decided; then the device's memory limited
  // to the plan.
  Status open_plan(const EngineOptions& requested);
  // The memory dial in two steps, GPU mode's device trunk between them: I/O engine,
  // TrunkStore, RouterBank; then the ExpertCache from the budget the others left.
  Status open_trunk_dial(const EngineOptions& opts);
  Status open_expert_tier(const EngineOptions& opts);
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
  // Over weights_ or store_: what the device trunk mirrors and the model reads (declared after
  // them, so destroyed before them).
  std::unique_ptr<FiniteTrunk> finite_trunk_;
  std::unique_ptr<ExpertCache> cache_;
  std::unique_ptr<model::ExpertSource> experts_;
  std::unique_ptr<backend::Backend> backend_;  // what the Model runs on
  std::unique_ptr<DeviceTrunk> device_trunk_;
  std::unique_ptr<VramExpertTier> vram_tier_;
  // GPU mode: host memory page-locked by backend_ (the RAM tier's arena, the TrunkStore buffers
  // of the layers the device streams); unpinned before they are freed.
  std::vector<void*> pinned_host_;
  uint64_t pinned_host_bytes_ = 0, pin_refused_bytes_ = 0;
  EnginePlan plan_;  // open_plan's: the options with lookahead decided, where everything goes
  mutable std::mutex nonfinite_mutex_;  // guards nonfinite_trunk_
  // explain_nonfinite's trunk scan, once read: "TENSOR in SHARD: ..." or "" (all finite).
  mutable std::optional<std::string> nonfinite_trunk_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<cpu::ThreadPool> pool_;
  cpu::Exec exec_;
};

// The engine's thread count for EngineOptions::threads (0: one per hardware thread).
int resolve_threads(int requested);

// "auto" -> nullopt, "scalar", "avx2"; Status::usage otherwise.
Result<std::optional<cpu::Isa>> parse_isa(const std::string& name);

}  // namespace ktier::runtime
