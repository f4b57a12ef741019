#include "runtime/router_bank.h"

#include <string>

#include "common/check.h"

namespace ktier::runtime {

uint64_t RouterBank::bytes_needed(const format::Checkpoint& ckpt) {
  const format::ModelConfig& c = ckpt.config();
  uint64_t total = 0;
  std::vector<uint8_t> zeros;
  // Binds against zero bytes of the right size, adding up what load() would allocate.
  const model::TensorLookup measure = [&](const std::string& name) -> Result<model::TensorView> {
    const format::TensorInfo& t = *ckpt.find(name)->info;
    if (zeros.size() < t.nbytes) zeros.resize(t.nbytes);
    total += io::align_up(t.nbytes, io::kDefaultAlignment);
    return model::TensorView{t.dtype, t.numel(), zeros.data()};
  };
  for (int64_t l = c.first_k_dense_replace + 1; l < c.num_hidden_layers; ++l)
    KTIER_CHECK(model::bind_routing(c, l, measure).is_ok());
  return total;
}

Result<std::unique_ptr<RouterBank>> RouterBank::load(const format::Checkpoint& ckpt,
                                                     io::IoEngine& engine,
                                                     const std::vector<io::ReadFile>& shards) {
  const format::ModelConfig& c = ckpt.config();
  std::unique_ptr<RouterBank> bank(new RouterBank());
  bank->first_ = c.first_k_dense_replace + 1;
  // Each tensor bind_routing asks for is read on demand into a buffer of its own.
  const model::TensorLookup read = [&](const std::string& name) -> Result<model::TensorView> {
    const std::optional<format::TensorRef> ref = ckpt.find(name);
    KTIER_CHECK_MSG(ref.has_value(), name.c_str());  // Checkpoint::open validated the names
    const format::TensorInfo& t = *ref->info;
    KTIER_ASSIGN_OR_RETURN(io::AlignedBuffer buf, io::AlignedBuffer::allocate(t.nbytes));
    const io::ReadRequest req{&shards[ref->shard], t.file_offset, t.nbytes, buf.data(), 0};
    KTIER_RETURN_IF_ERROR(io::read_all(engine, std::span<const io::ReadRequest>(&req, 1)));
    const model::TensorView view{t.dtype, t.numel(), buf.data()};
    bank->bytes_ += buf.size();
    bank->buffers_.push_back(std::move(buf));
    return view;
  };
  for (int64_t l = bank->first_; l < c.num_hidden_layers; ++l) {
    KTIER_ASSIGN_OR_RETURN(model::LayerWeights w, model::bind_routing(c, l, read));
    bank->layers_.push_back(std::move(w));
  }
  return bank;
}

const model::LayerWeights* RouterBank::routing(int64_t l) const {
  if (l < first_ || l - first_ >= static_cast<int64_t>(layers_.size())) return nullptr;
  return &layers_[static_cast<size_t>(l - first_)];
}

}  // namespace ktier::runtime
