#include "runtime/engine.h"

#include <string>
#include <algorithm>
#include <thread>

#include <spdlog/spdlog.h>

#include "backend/cuda_backend.h"
#include "common/check.h"
#include "common/size.h"
#include "cpu/kernels.h"
#include "runtime/weight_scan.h"
#include "strata/trace_format.h"

namespace ktier::runtime {

Result<std::optional<cpu::Isa>> parse_isa(const std::string& name) {
  if (name == "auto") return std::optional<cpu::Isa>();
  if (name == "scalar") return std::optional<cpu::Isa>(cpu::Isa::kScalar);
  if (name == "avx2") return std::optional<cpu::Isa>(cpu::Isa::kAvx2);
  if (name == "avx512") return std::optional<cpu::Isa>(cpu::Isa::kAvx512);
  return Status::usage("--isa: '" + name + "' is not one of auto, scalar, avx2, avx512");
}

int resolve_threads(int requested) {
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  return requested > 0 ? requested : std::clamp(hw, 1, cpu::kMaxThreads);
}

Status Engine::open_plan(const EngineOptions& requested) {
  if (requested.pack_dir) {
    KTIER_ASSIGN_OR_RETURN(pack_, pack::TrunkPack::open(*requested.pack_dir, ckpt_));
  }
  // The CUDA backend first: the plan asks it for its free memory.
  if (device_mode(requested) && !requested.emulate_device) {
    KTIER_ASSIGN_OR_RETURN(backend_, backend::make_cuda_backend(backend::probe_cuda_module(),
                                                                requested.cublas_prefill));
  }
  KTIER_ASSIGN_OR_RETURN(plan_, plan_engine(ckpt_, pack_ ? &*pack_ : nullptr, requested,
                                            pool_->size(), backend_.get()));
  // On a machine with less memory than the plan holds, a plan that fits (a warning).
  // (MemAvailable as --preset auto read it, if it did: one reading decides both.)
  if (const uint64_t avail = plan_.mem_available ? plan_.mem_available : mem_available_bytes();
      plan_.dial) {
    KTIER_ASSIGN_OR_RETURN(std::optional<EnginePlan> here,
                           fit_plan_to_memory(ckpt_, pack_ ? &*pack_ : nullptr, requested, plan_,
                                              pool_->size(), backend_.get(), avail));
    if (here) {
      spdlog::warn("{}", lowered_budget_note(plan_, *here, avail));
      plan_ = std::move(*here);
    } else if (avail > 0 && plan_.dial->held_at_open() > avail) {  // already the least
      spdlog::warn("the plan holds {} while the engine opens, more than the {} MemAvailable, and "
                   "is the least this run needs: the system may end it for memory",
                   format_size(plan_.dial->held_at_open()), format_size(avail));
    }
  }
  if (!plan_.device_fallback.empty()) {
    spdlog::warn("device: {}", plan_.device_fallback);
    backend_.reset();  // the CPU backend is made with the model
  }
  if (!plan_.budget_raised.empty()) spdlog::warn("{}", plan_.budget_raised);
  if (!plan_.lookahead_lowered.empty()) spdlog::warn("{}", plan_.lookahead_lowered);
  if (!plan_.lookahead_capped.empty()) spdlog::warn("{}", plan_.lookahead_capped);
  for (const std::string& unused : plan_.unused_options) spdlog::warn("{}", unused);
  if (!plan_.device) return Status::ok();
  const DevicePlan& d = *plan_.device;
  if (requested.emulate_device) backend_ = backend::make_emulated_device_backend(exec_, d.vram);
  // What this backend allocates and keeps; cuBLAS's workspace and copies come on top of it.
  backend_->limit_memory(d.vram > d.blas ? d.vram - d.blas : 0);
  const EngineOptions::Workload& wl = requested.workload;
  spdlog::info("device working set {} for {} positions in chunks of {}: state {}, activations {}{}",
               format_size(d.working()), wl.positions, wl.chunk,
               format_size(d.working_set.state_bytes), format_size(d.working_set.activation_bytes),
               d.blas ? ", cuBLAS " + format_size(d.blas) : std::string());
  return Status::ok();
}

Status Engine::open_trunk_dial(const EngineOptions& opts) {
  const pack::TrunkPack* pk = pack_ ? &*pack_ : nullptr;
  KTIER_ASSIGN_OR_RETURN(io_, io::make_io_engine(opts.io));
  for (size_t i = 0; i < ckpt_.num_shards(); ++i) {
    KTIER_ASSIGN_OR_RETURN(io::ReadFile f, io_->open(ckpt_.shard(i).path()));
    // The bytes read through `f` are those the checkpoint checked only if it is the same file:
    // one replaced since (a rename: a download or a conversion finishing) would be read at the
    // old header's offsets, and its experts carry no checksum.
    if (!ckpt_.shard(i).same_file_as(f.fd()))
      return Status::runtime(f.path() + ": replaced while the model was opened (another file "
                             "has this name now): run again once it stays as it is");
    shard_files_.push_back(std::move(f));
  }
  const DialPlan& plan = *plan_.dial;
  if (plan.minimum.sequence)
    spdlog::info("budget: {} set aside for the sequence ({} positions in chunks of {})",
                 format_size(plan.minimum.sequence), opts.workload.positions,
                 opts.workload.chunk);
  KTIER_ASSIGN_OR_RETURN(store_,
                         TrunkStore::open(ckpt_, pk, *io_, shard_files_, plan.trunk, pool_.get()));
  // The bank holds the routers of the streamed suffix (a pinned layer's router is read from
  // the store).
  if (plan.router_bytes > 0) {
    KTIER_CHECK(store_->first_pinned() == 0);
    KTIER_ASSIGN_OR_RETURN(bank_,
                           RouterBank::load(ckpt_, *io_, shard_files_, plan.routers_from));
    KTIER_CHECK(bank_->bytes_allocated() == plan.router_bytes);
  }
  return Status::ok();
}

Status Engine::open_expert_tier(const EngineOptions& opts) {
  if (ckpt_.expert_storage() == format::ExpertStorage::kNone) return Status::ok();
  const DialPlan& plan = *plan_.dial;
  KTIER_CHECK(store_->stats().bytes_allocated + (bank_ ? bank_->bytes_allocated() : 0) +
                  plan.minimum.sequence ==
              plan.held() - static_cast<uint64_t>(plan.expert_slots) * plan.expert_slot_bytes);
  const uint64_t slot = plan.expert_slot_bytes;
  const uint64_t batch = static_cast<uint64_t>(plan.expert_batch);
  uint64_t slots = static_cast<uint64_t>(plan.expert_slots);
  if (const uint64_t avail = mem_available_bytes(); avail > 0) {
    const uint64_t fit = static_cast<uint64_t>(capped_expert_slots(plan, avail));
    if (fit < slots) {
      spdlog::warn("expert tier capped at {} slots ({}) by MemAvailable ({}; the tier takes at "
                   "most 90% of it), below the {} the budget leaves room for",
                   fit, format_size(fit * slot), format_size(avail), slots);
      slots = fit;
    }
  }
  ExpertCacheOptions xo;
  xo.policy = opts.policy;
  xo.temperature_seed = opts.temperature_seed;
  xo.static_ranking = opts.static_ranking;
  xo.policy_slots = static_cast<int64_t>(slots - batch);
  xo.batch_slots = static_cast<int64_t>(batch);
  xo.prefetch_in_flight = std::max<uint32_t>(1, opts.io.queue_depth / 2);
  xo.pool = pool_.get();
  KTIER_ASSIGN_OR_RETURN(cache_, ExpertCache::open(ckpt_, *io_, shard_files_, std::move(xo)));
  spdlog::info("experts: {} policy, {} slots of {} ({} kept, {} for one fetch), lookahead {}",
               strata::policy_name(opts.policy), slots, format_size(slot), slots - batch, batch,
               plan_.lookahead);
  return Status::ok();
}

void Engine::begin_report_window() {
  if (cache_) cache_->begin_window();
  if (vram_tier_) vram_tier_->begin_window();
}

Engine::~Engine() {
  if (!pinned_host_.empty()) {
    // After an error return copies from these may still run: wait for them (their errors
    // were or will not be reported; nothing is left to report them to) before unpinning.
    for (backend::Backend::CopyQueue q : backend::Backend::kCopyQueues)
      (void)backend_->sync_copies(q);
    (void)backend_->synchronize();
    // Before cache_ and store_ free them. ~DeviceTrunk then gives back a host layer it copied
    // ahead, which may start a TrunkStore read into an unpinned buffer: harmless, nothing is
    // copied to the device any more.
    for (void* p : pinned_host_) backend_->unpin_host(p);
  }
}

Status Engine::open_device_trunk(model::TrunkSource& trunk) {
  // From the mirror's pass on, the host reads ahead only the layers the device streams.
  const auto start_host_cycle = [this](int64_t resident) {
    if (store_) store_->set_cycle_start(resident);
  };
  KTIER_ASSIGN_OR_RETURN(device_trunk_,
                         DeviceTrunk::open(trunk, *backend_, plan_.device->trunk,
                                           start_host_cycle));
  // When the host pins every layer the device streams, its ring has served its one pass: the
  // expert RAM tier, opened next, gets its RAM.
  const uint64_t freed = store_ ? store_->release_ring(device_trunk_->resident_layers()) : 0;
  KTIER_CHECK(!plan_.dial || freed == plan_.dial->ring_released);
  if (freed)
    spdlog::info("trunk: ring of {} freed (the device holds or the host pins every layer)",
                 format_size(freed));
  // The device serves the head from its mirror (DeviceTrunk::open copied it synchronously).
  const uint64_t head = store_ ? store_->release_head() : 0;
  KTIER_CHECK(!plan_.dial || head == plan_.dial->head_released);
  return Status::ok();
}

Status Engine::open_device(const EngineOptions& opts, model::ExpertSource* experts) {
  const format::ModelConfig& c = ckpt_.config();
  const DevicePlan& d = *plan_.device;
  KTIER_CHECK(device_trunk_->bytes() == d.trunk_bytes);
  if (experts != nullptr && d.tier_slots > 0) {
    strata::PolicyInputs in;
    in.temperature_seed = opts.temperature_seed.empty() ? nullptr : &opts.temperature_seed;
    in.static_ranking = &opts.static_ranking;
    KTIER_ASSIGN_OR_RETURN(vram_tier_, VramExpertTier::open(*experts, *backend_, c,
                                                            d.tier_slot_bytes, d.tier_slots,
                                                            opts.policy, in));
  }
  // Experts reach the VRAM tier from the RAM tier's arena, streamed trunk layers from the
  // TrunkStore's records and ring: page-locked, the copies run at link speed and overlap the
  // ops. Refused (e.g. RLIMIT_MEMLOCK) it still works, from pageable memory, slower.
  auto pin = [&](void* p, size_t bytes, const char* what) {
    const Status s = backend_->pin_host(p, bytes);
    if (s.is_ok()) {
      pinned_host_.push_back(p);
      pinned_host_bytes_ += bytes;
    } else {
      pin_refused_bytes_ += bytes;
      spdlog::warn("{} not page-locked ({}); its copies to the device run slower", what, s.message());
    }
    return s.is_ok();
  };
  const std::vector<std::span<uint8_t>> streamed =
      store_ && device_trunk_->resident_layers() < c.num_hidden_layers
          ? store_->layer_buffers(device_trunk_->resident_layers())
          : std::vector<std::span<uint8_t>>{};
  pinned_host_.reserve(1 + streamed.size());  // a pin recorded cannot throw (unpinned at close)
  if (cache_) pin(cache_->arena(), cache_->arena_bytes(), "RAM expert tier");
  {
    bool refused = false;  // the first refusal is warned; the rest are not tried
    for (std::span<uint8_t> b : streamed) {
      if (b.empty()) continue;
      if (refused)
        pin_refused_bytes_ += b.size();
      else
        refused = !pin(b.data(), b.size(), "the streamed trunk layers' host memory");
    }
  }
  spdlog::info("device: {}; trunk layers resident {} of {} ({:.1f} MB), VRAM expert slots {}",
               backend_->name(), device_trunk_->resident_layers(), c.num_hidden_layers,
               device_trunk_->bytes() / 1e6, vram_tier_ ? vram_tier_->stats().slots : 0);
  return Status::ok();
}

Result<std::unique_ptr<Engine>> Engine::open(const EngineOptions& requested) {
  KTIER_RETURN_IF_ERROR(check_engine_options(requested));
  const cpu::Isa isa = requested.isa.value_or(cpu::best_isa());
  // GPU mode always runs the memory dial (default budget: --preset auto): its page-locked RAM
  // tier is the warm tier and the staging buffer NVMe -> RAM -> VRAM, filled by io_uring reads;
  // a mapped checkpoint's pageable pages would be copied to the device at page-fault speed.
  const bool dial = dial_mode(requested);
  KTIER_ASSIGN_OR_RETURN(
      format::Checkpoint ckpt,
      format::Checkpoint::open(requested.model_dir,
                               dial ? format::OpenMode::kPread : requested.mode));
  std::unique_ptr<Engine> e(new Engine(std::move(ckpt)));
  // First: a compressed pack's blocks are inflated on this pool.
  e->pool_ = std::make_unique<cpu::ThreadPool>(resolve_threads(requested.threads));
  if (!e->pool_->start_error().empty())
    spdlog::warn("threads: {}; running with {} (same output)", e->pool_->start_error(),
                 e->pool_->size());
  e->exec_ = cpu::Exec{e->pool_.get(), isa};
  KTIER_RETURN_IF_ERROR(e->open_plan(requested));
  const EngineOptions& opts = e->plan_.opts;  // lookahead decided
  model::TrunkSource* trunk = nullptr;
  if (dial) {
    KTIER_RETURN_IF_ERROR(e->open_trunk_dial(opts));
    trunk = e->store_.get();
  } else {
    KTIER_ASSIGN_OR_RETURN(e->weights_, model::ModelWeights::load(e->ckpt_));
    trunk = e->weights_.get();
    if (e->ckpt_.expert_storage() != format::ExpertStorage::kNone)
      e->experts_ = std::make_unique<model::CheckpointExpertSource>(e->ckpt_);
  }
  KTIER_ASSIGN_OR_RETURN(e->finite_trunk_, FiniteTrunk::open(*trunk, e->ckpt_, e->pool_.get()));
  trunk = e->finite_trunk_.get();
  // GPU mode mirrors the trunk before the expert RAM tier opens: the host's ring may be freed
  // for it then.
  if (device_mode(opts)) {
    KTIER_RETURN_IF_ERROR(e->open_device_trunk(*trunk));
    trunk = e->device_trunk_.get();
  }
  if (dial) KTIER_RETURN_IF_ERROR(e->open_expert_tier(opts));
  model::ExpertSource* experts = e->cache_ ? static_cast<model::ExpertSource*>(e->cache_.get())
                                           : e->experts_.get();
  if (device_mode(opts)) {
    KTIER_RETURN_IF_ERROR(e->open_device(opts, experts));
    if (e->vram_tier_) experts = e->vram_tier_.get();
  } else {
    e->backend_ = backend::make_cpu_backend(e->exec_);
  }
  e->model_ = std::make_unique<model::Model>(*trunk, experts, *e->backend_);
  // Without the dial, lookahead only feeds observers such as a trace.
  if (const int depth = e->plan_.lookahead; depth > 0) {
    model::Model::RoutingWeightsFn routing;
    if (e->device_trunk_) {  // resident layers, or the device's copy of a streamed one's router
      routing = [t = e->device_trunk_.get()](int64_t l) { return t->routing_layer(l); };
    } else if (e->store_) {  // a pinned layer from the store, a streamed one from the bank
      routing = [store = e->store_.get(), bank = e->bank_.get()](int64_t l)
          -> const model::LayerWeights* {
        if (store->config().is_dense(l)) return nullptr;
        if (const model::LayerWeights* w = store->pinned_layer(l)) return w;
        return bank ? bank->routing(l) : nullptr;
      };
    } else if (e->weights_) {
      routing = [w = e->weights_.get()](int64_t l) -> const model::LayerWeights* {
        return w->config().is_dense(l) ? nullptr : &w->layer(l);
      };
    }
    e->model_->set_lookahead(depth, opts.lookahead_refresh, std::move(routing));
    // The RAM tier first: it issues the reads; the VRAM tier then copies what RAM holds.
    if (e->cache_) e->model_->add_lookahead_observer(e->cache_.get());
    if (e->vram_tier_) e->model_->add_lookahead_observer(e->vram_tier_.get());
  }
  return e;
}

Status Engine::explain_nonfinite(const Status& s) const {
  if (!is_nonfinite_logits(s)) return s;
  std::lock_guard<std::mutex> lock(nonfinite_mutex_);
  if (!nonfinite_trunk_) {
    spdlog::info("looking for a weight that is not finite in {} ...", ckpt_.dir().string());
    Result<std::optional<std::string>> found = find_nonfinite_weight(ckpt_);
    if (!found.is_ok())
      return s.with_note("Looking for the weight that is not finite failed: " +
                         found.status().message());
    nonfinite_trunk_ = found->value_or("");
  }
  if (!nonfinite_trunk_->empty())
    return s.with_note("The checkpoint's bytes are damaged: " + *nonfinite_trunk_);
  // The trunk is finite: the experts the stream last went through are looked at.
  const model::Model::MoeRouting& routed = model_->last_moe_routing();
  const bool packed = ckpt_.expert_storage() == format::ExpertStorage::kMxfp4;
  const bool scanned =
      routed.layer >= 0 && ckpt_.expert_storage() != format::ExpertStorage::kNone;
  if (scanned) {
    Result<std::optional<std::string>> damage =
        packed ? find_damaged_expert_scale(ckpt_, routed.layer, routed.ids)
               : find_nonfinite_expert(ckpt_, routed.layer, routed.ids);
    if (!damage.is_ok())
      return s.with_note(std::string("Looking for a damaged expert ") +
                         (packed ? "scale" : "weight") + " failed: " + damage.status().message());
    if (*damage) return s.with_note("The checkpoint's bytes are damaged: " + **damage);
  }
  return s.with_note(std::string("Every weight of the checkpoint the trunk reads is finite") +
                     (!scanned ? ""
                      : packed ? ", and no scale of the experts last routed to is out of range"
                               : ", and so are the experts last routed to") +
                     ": activations overflowed, or a pack or expert bytes differ");
}

}  // namespace ktier::runtime
