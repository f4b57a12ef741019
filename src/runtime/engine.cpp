#include "runtime/engine.h"

#include <string>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "backend/cuda_backend.h"
#include "common/check.h"
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

namespace {
// MemTotal and MemAvailable from /proc/meminfo, bytes (0 when absent).
std::pair<uint64_t, uint64_t> meminfo() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0, total = 0, avail = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemTotal:") total = kb * 1024;
    if (key == "MemAvailable:") avail = kb * 1024;
  }
  return {total, avail};
}
std::string gib(uint64_t b) {  // GiB, or MiB below one GiB
  char buf[32];
  if (b < (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(b) / (1ull << 20));
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1ull << 30));
  return buf;
}
}  // namespace

Status check_dial_budget(uint64_t budget, const DialMinimum& min, const pack::TrunkPack* pack,
                         const EngineOptions::Workload& workload) {
  if (budget >= min.total()) return Status::ok();
  return Status::budget(
      "a budget of " + gib(budget) + " (" + std::to_string(budget) +
      " bytes) cannot be met: the minimum is " + gib(min.total()) + " = " +
      std::to_string(min.total()) + " bytes (trunk " + gib(min.trunk) +
      ": head, two ring slots, embedding rows" +
      (pack && pack->compressed() ? ", compressed staging per slot, inflate scratch per thread"
                                  : "") +
      "; experts " + gib(min.experts()) + ": " + std::to_string(min.expert_slots) +
      " slots of " + gib(min.slot_bytes) +
      (min.routers ? "; lookahead routers " + gib(min.routers) + ", 0 with --lookahead 0" : "") +
      (min.sequence ? "; the sequence " + gib(min.sequence) + ": state and activations for " +
                          std::to_string(workload.positions) +
                          " positions (run: the prompt and -n, or -c; perplexity: a window)"
                    : "") +
      ")");
}

Result<uint64_t> preset_budget_bytes(const std::string& name) {
  constexpr uint64_t G = 1ull << 30;
  if (name == "laptop") return 8 * G;
  if (name == "desktop") return 32 * G;
  if (name == "workstation") return 96 * G;
  if (name == "server") return 128 * G;
  if (name == "max") return UINT64_MAX;
  if (name == "auto") {
    const auto [total, avail] = meminfo();
    if (total == 0 || avail == 0)
      return Status::usage("--preset auto: cannot read MemTotal/MemAvailable from /proc/meminfo");
    const uint64_t cap = avail > 2 * G ? avail - 2 * G : avail / 2;
    return std::min<uint64_t>(total / 100 * 55, cap);
  }
  return Status::usage("--preset: '" + name +
                       "' is not one of laptop, desktop, workstation, server, max, auto");
}

namespace {
// No lookahead runs deeper than the layers after the first: a deeper one predicts nothing more,
// but would size the minimum budget by it; nor deeper than a trace records (255: far past what
// predicts anything, K3-MODEL's 93 layers included).
int clamped_lookahead(const EngineOptions& opts, const format::ModelConfig& c) {
  return static_cast<int>(std::min<int64_t>(
      {opts.lookahead, c.num_hidden_layers - 1, int64_t{strata::kMaxTraceLookahead}}));
}

// The lookahead the memory dial runs: `static` never prefetches, so it gets none (and its
// routers are not loaded).
int lookahead_depth(const EngineOptions& opts, const format::ModelConfig& c) {
  return opts.policy == strata::PolicyKind::kStatic ? 0 : clamped_lookahead(opts, c);
}

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

bool device_mode(const EngineOptions& opts) {
  return opts.device == backend::DeviceKind::kCuda || opts.emulate_device;
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
    elements = std::max(elements, T * c.num_experts_per_token *
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
}  // namespace

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

DialMinimum dial_minimum(const format::Checkpoint& ckpt, const pack::TrunkPack* pack,
                         int lookahead, int threads, bool host_routers,
                         const EngineOptions::Workload* sequence) {
  DialMinimum m;
  m.trunk = TrunkStore::minimum_bytes(ckpt, pack, 2, threads);
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

int resolve_threads(int requested) {
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  return requested > 0 ? requested : std::clamp(hw, 1, cpu::kMaxThreads);
}

Status Engine::open_trunk_dial(const EngineOptions& opts) {
  if (opts.pack_dir) {
    KTIER_ASSIGN_OR_RETURN(pack_, pack::TrunkPack::open(*opts.pack_dir, ckpt_));
  }
  const pack::TrunkPack* pk = pack_ ? &*pack_ : nullptr;
  KTIER_ASSIGN_OR_RETURN(io_, io::make_io_engine(opts.io));
  for (size_t i = 0; i < ckpt_.num_shards(); ++i) {
    KTIER_ASSIGN_OR_RETURN(io::ReadFile f, io_->open(ckpt_.shard(i).path()));
    shard_files_.push_back(std::move(f));
  }
  const format::ModelConfig& c = ckpt_.config();
  if (opts.ram_budget) {
    budget_ = *opts.ram_budget;
  } else {
    KTIER_ASSIGN_OR_RETURN(budget_, preset_budget_bytes("auto"));
  }
  // Trunk first; the expert tier needs one token's experts of one layer and the prefetch room.
  // In GPU mode lookahead scores the device trunk's copy of the routers, not a host RouterBank.
  // The sequence's working set lives in host memory on the CPU path; in GPU mode it is set
  // aside from the VRAM budget (plan_device).
  const EngineOptions::Workload* host_sequence = device_mode(opts) ? nullptr : &opts.workload;
  const DialMinimum min =
      dial_minimum(ckpt_, pk, lookahead_depth(opts, ckpt_.config()), pool_->size(),
                   /*host_routers=*/!device_mode(opts), host_sequence);
  dial_min_ = min;
  const uint64_t expert_min = min.experts(), bank_reserve = min.routers;
  KTIER_RETURN_IF_ERROR(check_dial_budget(budget_, min, pk, opts.workload));
  if (min.sequence)
    spdlog::info("budget: {} set aside for the sequence ({} positions in chunks of {})",
                 gib(min.sequence), opts.workload.positions, opts.workload.chunk);
  // The trunk pins what fits beside the routers of the layers it streams, which the bank then
  // holds (a pinned layer's router is read from the store); the rest goes to the expert tier.
  TrunkStoreOptions so;
  so.budget_bytes = budget_ == UINT64_MAX ? UINT64_MAX : budget_ - expert_min - min.sequence;
  so.pool = pool_.get();
  // GPU mode: the device holds the first layers, so the host pins the last ones, and only those
  // the device streams (RAM beyond them goes to the expert tier, not to layers the device holds).
  so.pin_last = device_mode(opts);
  if (device_mode(opts)) so.max_pinned = c.num_hidden_layers - device_plan_.resident_layers;
  std::vector<uint64_t> router_suffix;  // [l]: routers of layers l.. (the bank's bytes from l)
  if (bank_reserve) {
    const std::vector<uint64_t> per_layer = RouterBank::layer_bytes(ckpt_);
    router_suffix.assign(per_layer.size() + 1, 0);
    for (size_t l = per_layer.size(); l-- > 0;) router_suffix[l] = router_suffix[l + 1] + per_layer[l];
    KTIER_CHECK(router_suffix[0] == bank_reserve);
    so.streamed_extra = [&router_suffix](int64_t first) {
      return router_suffix[static_cast<size_t>(first)];
    };
  }
  KTIER_ASSIGN_OR_RETURN(store_, TrunkStore::open(ckpt_, pk, *io_, shard_files_, so));
  if (const int64_t streamed_from = store_->stats().layers_pinned;
      bank_reserve && router_suffix[static_cast<size_t>(streamed_from)] > 0) {
    KTIER_CHECK(store_->first_pinned() == 0);  // the bank holds the routers of a streamed suffix
    KTIER_ASSIGN_OR_RETURN(bank_, RouterBank::load(ckpt_, *io_, shard_files_, streamed_from));
    KTIER_CHECK(bank_->bytes_allocated() == router_suffix[static_cast<size_t>(streamed_from)]);
  }
  return Status::ok();
}

Status Engine::open_expert_tier(const EngineOptions& opts) {
  if (ckpt_.expert_storage() == format::ExpertStorage::kNone) return Status::ok();
  const format::ModelConfig& c = ckpt_.config();
  const DialMinimum& min = dial_min_;
  const uint64_t slot = min.slot_bytes;
  const uint64_t total_experts =
      static_cast<uint64_t>(c.num_moe_layers()) * static_cast<uint64_t>(c.num_experts);
  const uint64_t held = store_->stats().bytes_allocated + (bank_ ? bank_->bytes_allocated() : 0) +
                        min.sequence;
  // One fetch's worth of slots is lent to experts the policy does not keep; the rest is the
  // policy's capacity. More slots than every expert and one fetch are never needed.
  const uint64_t batch = static_cast<uint64_t>(c.num_experts_per_token);
  uint64_t left = budget_ == UINT64_MAX ? UINT64_MAX : (budget_ > held ? budget_ - held : 0);
  left = std::min(left, (total_experts + batch) * slot);
  // The tier is faulted in at start: never ask for more than the machine has free (a budget
  // above physical memory, or `max`, would otherwise end in the OOM killer).
  if (const uint64_t avail = meminfo().second; avail > 0) {
    // The sequence's state is allocated after the tier (new_sequence): still free now.
    const uint64_t usable = avail / 10 * 9 > min.sequence ? avail / 10 * 9 - min.sequence : 0;
    if (left > usable) {
      spdlog::warn("expert tier capped at {} (90% of MemAvailable), below what the budget leaves "
                   "for it ({})",
                   gib(usable), gib(left));
      left = usable;
    }
  }
  const uint64_t slots = std::clamp<uint64_t>(left / slot, min.expert_slots, total_experts + batch);
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
               strata::policy_name(opts.policy), slots, gib(slot), slots - batch, batch,
               lookahead_depth(opts, ckpt_.config()));
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

Status Engine::plan_device(const EngineOptions& opts) {
  uint64_t vram = 0;
  if (opts.emulate_device) {
    if (!opts.vram_budget)
      return Status::usage("--device emulated needs --vram SIZE (there is no GPU to ask)");
    vram = *opts.vram_budget;
    backend_ = backend::make_emulated_device_backend(exec_, vram);
  } else {
    KTIER_ASSIGN_OR_RETURN(backend_, backend::make_cuda_backend(backend::probe_cuda_module()));
    KTIER_ASSIGN_OR_RETURN(const uint64_t free_bytes, backend_->free_memory());
    vram = opts.vram_budget.value_or(free_bytes / 10 * 9);
    if (vram > free_bytes)
      return Status::budget("--vram " + std::to_string(vram) + " bytes: the GPU has only " +
                            std::to_string(free_bytes) + " bytes free");
  }
  const format::ModelConfig& c = ckpt_.config();
  const bool moe = ckpt_.expert_storage() != format::ExpertStorage::kNone && c.num_moe_layers() > 0;
  const int lookahead = lookahead_depth(opts, c);
  const int64_t tier_min_slots = moe ? VramExpertTier::minimum_slots(c, lookahead) : 0;
  const uint64_t vram_tier_min =
      static_cast<uint64_t>(tier_min_slots) * (moe ? VramExpertTier::slot_bytes_for(ckpt_) : 0);
  vram_bytes_ = vram;
  // The sequence's working set first: what every token needs, whatever the placement.
  const EngineOptions::Workload& wl = opts.workload;
  if (wl.positions < 1 || wl.chunk < 1)
    return Status::usage("the planned sequence needs at least one position and one token a chunk");
  const model::WorkingSet ws =
      model::working_set(c, wl.chunk, wl.positions, wl.rows, moe && lookahead > 0);
  const uint64_t blas = backend_->uses_blas() ? blas_bytes(ckpt_, std::min(wl.chunk, wl.positions)) : 0;
  working_bytes_ = ws.total() + blas;
  // What this backend allocates and keeps; cuBLAS's workspace and copies come on top of it.
  backend_->limit_memory(vram > blas ? vram - blas : 0);
  spdlog::info("device working set {} for {} positions in chunks of {}: state {}, activations {}{}",
               gib(working_bytes_), wl.positions, wl.chunk, gib(ws.state_bytes),
               gib(ws.activation_bytes), blas ? ", cuBLAS " + gib(blas) : std::string());
  // The trunk's placement, from the checkpoint's shapes: a budget too small for it is refused
  // here, before anything is read; DeviceTrunk::open places the trunk as planned.
  const model::TensorLookup shapes = model::shapes_in(ckpt_);
  KTIER_ASSIGN_OR_RETURN(model::HeadWeights head, model::bind_head(c, shapes));
  Result<DeviceTrunk::Plan> plan =
      DeviceTrunk::plan(c, [&](int64_t l) { return model::bind_layer(c, l, shapes); },
                        std::move(head), vram, vram_tier_min + working_bytes_);
  if (!plan.is_ok() && plan.status().code() == ExitCode::kBudget && moe) {
    // What the expert tier's share is made of, and what lowers it.
    const int64_t top_k = c.num_experts_per_token;
    const std::string k = std::to_string(top_k);
    const bool capped = tier_min_slots < top_k * (2 + lookahead);  // every expert + one fetch
    return plan.status().with_note(
        "The VRAM expert tier's minimum: " + std::to_string(tier_min_slots) + " expert slots (" +
        gib(vram_tier_min) + "): " +
        (capped ? "every expert and " + k + " for one fetch"
                : "top_k " + k + " for the policy and " + k + " for one fetch" +
                      (lookahead > 0 ? ", and " + k + " per lookahead depth (--lookahead " +
                                           std::to_string(lookahead) +
                                           "; --lookahead 0 needs fewer)"
                                     : std::string())));
  }
  KTIER_RETURN_IF_ERROR(plan.status());
  device_plan_ = std::move(*plan);
  return Status::ok();
}

Status Engine::open_device_trunk(model::TrunkSource& trunk) {
  // From the mirror's pass on, the host reads ahead only the layers the device streams.
  const auto start_host_cycle = [this](int64_t resident) {
    if (store_) store_->set_cycle_start(resident);
  };
  KTIER_ASSIGN_OR_RETURN(device_trunk_,
                         DeviceTrunk::open(trunk, *backend_, device_plan_, start_host_cycle));
  // When the host pins every layer the device streams, its ring has served its one pass: the
  // expert RAM tier, opened next, gets its RAM.
  if (const uint64_t freed = store_ ? store_->release_ring(device_trunk_->resident_layers()) : 0)
    spdlog::info("trunk: ring of {} freed (the device holds or the host pins every layer)",
                 gib(freed));
  return Status::ok();
}

Status Engine::open_device(const EngineOptions& opts, model::ExpertSource* experts) {
  const format::ModelConfig& c = ckpt_.config();
  const bool moe = experts != nullptr && c.num_moe_layers() > 0;
  const uint64_t slot = moe ? VramExpertTier::slot_bytes_for(ckpt_) : 0;
  const uint64_t vram = vram_bytes_;
  if (moe) {
    // Never more slots than every expert plus one fetch's bypass.
    const int64_t keys = c.num_moe_layers() * c.num_experts;
    const int64_t slots = std::min<int64_t>(
        static_cast<int64_t>((vram - working_bytes_ - device_trunk_->bytes()) / slot),
        keys + c.num_experts_per_token);
    strata::PolicyInputs in;
    in.temperature_seed = opts.temperature_seed.empty() ? nullptr : &opts.temperature_seed;
    in.static_ranking = &opts.static_ranking;
    KTIER_ASSIGN_OR_RETURN(vram_tier_, VramExpertTier::open(*experts, *backend_, c, slot, slots,
                                                            opts.policy, in));
  }
  // Experts reach the VRAM tier from the RAM tier's arena, streamed trunk layers from the
  // TrunkStore's records and ring: page-locked, the copies run at link speed and overlap the
  // ops. Refused (e.g. RLIMIT_MEMLOCK) it still works, from pageable memory, slower.
  auto pin = [&](void* p, size_t bytes, const char* what) {
    const Status s = backend_->pin_host(p, bytes);
    if (s.is_ok())
      pinned_host_.push_back(p);
    else
      spdlog::warn("{} not page-locked ({}); its copies to the device run slower", what, s.message());
    return s.is_ok();
  };
  if (cache_) pin(cache_->arena(), cache_->arena_bytes(), "RAM expert tier");
  if (store_ && device_trunk_->resident_layers() < c.num_hidden_layers)
    for (std::span<uint8_t> b : store_->layer_buffers(device_trunk_->resident_layers()))
      if (!b.empty() && !pin(b.data(), b.size(), "the streamed trunk layers' host memory")) break;
  spdlog::info("device: {}; trunk layers resident {} of {} ({:.1f} MB), VRAM expert slots {}",
               backend_->name(), device_trunk_->resident_layers(), c.num_hidden_layers,
               device_trunk_->bytes() / 1e6, vram_tier_ ? vram_tier_->stats().slots : 0);
  return Status::ok();
}

Result<std::unique_ptr<Engine>> Engine::open(const EngineOptions& opts) {
  if (opts.threads < 0 || opts.threads > cpu::kMaxThreads)
    return Status::usage("--threads " + std::to_string(opts.threads) + " is outside 0.." +
                         std::to_string(cpu::kMaxThreads) + " (0 = one per hardware thread)");
  if (opts.lookahead < 0) return Status::usage("--lookahead must be >= 0 (0 = off)");
  if (opts.policy == strata::PolicyKind::kBelady)
    return Status::usage("--policy belady needs the future: it is for `ktier trace replay` only");
  if (opts.policy == strata::PolicyKind::kStatic && opts.static_ranking.empty())
    return Status::usage("--policy static needs a routing profile: give --profile TRACE");
  const cpu::Isa isa = opts.isa.value_or(cpu::best_isa());
  if (!cpu::isa_supported(isa))
    return Status::usage(std::string("--isa ") + cpu::isa_name(isa) +
                         ": this CPU or build does not support it");
  // GPU mode always runs the memory dial (default budget: --preset auto): its page-locked RAM
  // tier is the warm tier and the staging buffer NVMe -> RAM -> VRAM, filled by io_uring reads;
  // a mapped checkpoint's pageable pages would be copied to the device at page-fault speed.
  const bool dial =
      opts.pack_dir.has_value() || opts.ram_budget.has_value() || device_mode(opts);
  if (!dial) {  // a mapped checkpoint has no expert tier and reads nothing itself
    const char* why = "ignored: the checkpoint is memory-mapped (give --pack, --ram or --preset)";
    if (opts.policy != strata::PolicyKind::kTemperature || !opts.temperature_seed.empty())
      spdlog::warn("--policy/--profile {}", why);
    if (opts.io.backend != io::IoBackend::kAuto || opts.io.rate_limit_bytes_per_s != 0)
      spdlog::warn("--io/--io-rate-limit {}", why);
  }
  KTIER_ASSIGN_OR_RETURN(format::Checkpoint ckpt,
                         format::Checkpoint::open(opts.model_dir,
                                                  dial ? format::OpenMode::kPread : opts.mode));
  std::unique_ptr<Engine> e(new Engine(std::move(ckpt)));
  // First: a compressed pack's blocks are inflated on this pool.
  e->pool_ = std::make_unique<cpu::ThreadPool>(resolve_threads(opts.threads));
  if (!e->pool_->start_error().empty())
    spdlog::warn("threads: {}; running with {} (same output)", e->pool_->start_error(),
                 e->pool_->size());
  e->exec_ = cpu::Exec{e->pool_.get(), isa};
  if (device_mode(opts)) KTIER_RETURN_IF_ERROR(e->plan_device(opts));
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
  if (const int depth = dial ? lookahead_depth(opts, e->ckpt_.config())
                             : clamped_lookahead(opts, e->ckpt_.config());
      depth > 0 && e->ckpt_.config().num_moe_layers() > 0) {
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
  if (!nonfinite_note_) {
    spdlog::info("looking for a weight that is not finite in {} ...", ckpt_.dir().string());
    Result<std::optional<std::string>> found = find_nonfinite_weight(ckpt_);
    if (!found.is_ok())
      return s.with_note("Looking for the weight that is not finite failed: " +
                         found.status().message());
    nonfinite_note_ = *found ? "The checkpoint's bytes are damaged: " + **found
                             : "Every weight of the checkpoint the trunk reads is finite: "
                               "activations overflowed, or a pack or expert bytes differ";
  }
  return s.with_note(*nonfinite_note_);
}

}  // namespace ktier::runtime
