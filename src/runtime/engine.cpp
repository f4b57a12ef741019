#include "runtime/engine.h"

#include <string>
#include <thread>

namespace ktier::runtime {

Result<std::optional<cpu::Isa>> parse_isa(const std::string& name) {
  if (name == "auto") return std::optional<cpu::Isa>();
  if (name == "scalar") return std::optional<cpu::Isa>(cpu::Isa::kScalar);
  if (name == "avx2") return std::optional<cpu::Isa>(cpu::Isa::kAvx2);
  return Status::usage("--isa: '" + name + "' is not one of auto, scalar, avx2");
}

Result<std::unique_ptr<Engine>> Engine::open(const EngineOptions& opts) {
  if (opts.threads < 0) return Status::usage("--threads must be >= 0 (0 = one per core)");
  const cpu::Isa isa = opts.isa.value_or(cpu::best_isa());
  if (!cpu::isa_supported(isa))
    return Status::usage(std::string("--isa ") + cpu::isa_name(isa) +
                         ": this CPU or build does not support it");
  const bool dial = opts.pack_dir.has_value() || opts.ram_budget.has_value();
  KTIER_ASSIGN_OR_RETURN(format::Checkpoint ckpt,
                         format::Checkpoint::open(opts.model_dir,
                                                  dial ? format::OpenMode::kPread : opts.mode));
  std::unique_ptr<Engine> e(new Engine(std::move(ckpt)));
  model::TrunkSource* trunk = nullptr;
  if (dial) {
    if (opts.pack_dir) {
      KTIER_ASSIGN_OR_RETURN(e->pack_, pack::TrunkPack::open(*opts.pack_dir, e->ckpt_));
    }
    TrunkStoreOptions so;
    so.budget_bytes = opts.ram_budget.value_or(UINT64_MAX);
    so.io = opts.io;
    KTIER_ASSIGN_OR_RETURN(e->store_,
                           TrunkStore::open(e->ckpt_, e->pack_ ? &*e->pack_ : nullptr, so));
    trunk = e->store_.get();
  } else {
    KTIER_ASSIGN_OR_RETURN(e->weights_, model::ModelWeights::load(e->ckpt_));
    trunk = e->weights_.get();
  }
  if (e->ckpt_.expert_storage() != format::ExpertStorage::kNone)
    e->experts_ = std::make_unique<model::CheckpointExpertSource>(e->ckpt_);
  e->model_ = std::make_unique<model::Model>(*trunk, e->experts_.get());
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  e->pool_ = std::make_unique<cpu::ThreadPool>(opts.threads > 0 ? opts.threads : (hw > 0 ? hw : 1));
  e->exec_ = cpu::Exec{e->pool_.get(), isa};
  return e;
}

}  // namespace ktier::runtime
