#include "runtime/router_bank.h"

#include <algorithm>
#include <string>

#include "common/check.h"

namespace ktier::runtime {

namespace {

// Every MoE layer with a layer before it to predict it from: the first MoE layer too when dense
// layers precede it (they predict it), layer 0 never; none before `from_layer`.
int64_t first_held(const format::ModelConfig& c, int64_t from_layer) {
  return std::max<int64_t>({c.first_k_dense_replace, 1, from_layer});
}

// What the bank keeps of a bound layer: the router's stored bytes (an aligned buffer) and the
// f32 vectors bind_routing widened.
uint64_t kept_bytes(const model::LayerWeights& w, uint64_t router_nbytes) {
  const uint64_t floats =
      w.post_attention_norm.size() + w.f_mlp.size() + w.moe.router_bias.size();
  return io::align_up(router_nbytes, io::kDefaultAlignment) + floats * sizeof(float);
}

}  // namespace

uint64_t RouterBank::bytes_needed(const format::Checkpoint& ckpt, int64_t from_layer) {
  const std::vector<uint64_t> per_layer = layer_bytes(ckpt);
  uint64_t total = 0;
  for (int64_t l = first_held(ckpt.config(), from_layer); l < ckpt.config().num_hidden_layers; ++l)
    total += per_layer[static_cast<size_t>(l)];
  return total;
}

std::vector<uint64_t> RouterBank::layer_bytes(const format::Checkpoint& ckpt) {
  const format::ModelConfig& c = ckpt.config();
  std::vector<uint64_t> out(static_cast<size_t>(c.num_hidden_layers), 0);
  // Binds from shapes alone (reads nothing) to learn the vectors' sizes.
  const model::TensorLookup measure = model::shapes_in(ckpt);
  for (int64_t l = first_held(c, 0); l < c.num_hidden_layers; ++l) {
    auto w = model::bind_routing(c, l, measure);
    KTIER_CHECK(w.is_ok());
    out[static_cast<size_t>(l)] =
        kept_bytes(w.value(), ckpt.find(model::router_tensor_name(l))->info->nbytes);
  }
  return out;
}

Result<std::unique_ptr<RouterBank>> RouterBank::load(const format::Checkpoint& ckpt,
                                                     io::IoEngine& engine,
                                                     const std::vector<io::ReadFile>& shards,
                                                     int64_t from_layer) {
  const format::ModelConfig& c = ckpt.config();
  std::unique_ptr<RouterBank> bank(new RouterBank());
  bank->first_ = first_held(c, from_layer);
  for (int64_t l = bank->first_; l < c.num_hidden_layers; ++l) {
    // Each tensor bind_routing asks for is read into a buffer of its own; only the router
    // matrix's is kept (the vectors are widened copies).
    std::vector<io::AlignedBuffer> read;
    const model::TensorLookup find = [&](const std::string& name) -> Result<model::TensorView> {
      const std::optional<format::TensorRef> ref = ckpt.find(name);
      KTIER_CHECK_MSG(ref.has_value(), name.c_str());  // Checkpoint::open validated the names
      const format::TensorInfo& t = *ref->info;
      KTIER_ASSIGN_OR_RETURN(io::AlignedBuffer buf, io::AlignedBuffer::allocate(t.nbytes));
      const io::ReadRequest req{&shards[ref->shard], t.file_offset, t.nbytes, buf.data(), 0};
      KTIER_RETURN_IF_ERROR(io::read_all(engine, std::span<const io::ReadRequest>(&req, 1)));
      read.push_back(std::move(buf));
      return model::TensorView{t.dtype, t.numel(), read.back().data(),
                               ckpt.shard(ref->shard).path().native()};
    };
    KTIER_ASSIGN_OR_RETURN(model::LayerWeights w, model::bind_routing(c, l, find));
    for (io::AlignedBuffer& b : read) {
      if (b.data() != w.moe.router.data) continue;
      bank->bytes_ += kept_bytes(w, ckpt.find(model::router_tensor_name(l))->info->nbytes);
      bank->buffers_.push_back(std::move(b));
    }
    bank->layers_.push_back(std::move(w));
  }
  return bank;
}

const model::LayerWeights* RouterBank::routing(int64_t l) const {
  if (l < first_ || l - first_ >= static_cast<int64_t>(layers_.size())) return nullptr;
  return &layers_[static_cast<size_t>(l - first_)];
}

}  // namespace ktier::runtime
