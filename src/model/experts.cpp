#include "model/experts.h"

#include <cstring>
#include <string>

#include "common/check.h"
#include "model/weights.h"

namespace ktier::model {

CheckpointExpertSource::CheckpointExpertSource(const format::Checkpoint& ckpt) : ckpt_(ckpt) {
  const format::ModelConfig& c = ckpt.config();
  KTIER_CHECK(ckpt.expert_storage() != format::ExpertStorage::kNone);
  packed_ = ckpt.expert_storage() == format::ExpertStorage::kMxfp4;
  const char* names[3] = {"w1.", "w2.", "w3."};
  for (int64_t l = c.first_k_dense_replace; l < c.num_hidden_layers; ++l) {
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const std::string prefix = format::expert_prefix(l, e);
      std::array<Matrix, 3> m;
      for (int i = 0; i < 3; ++i) {
        const std::string base = prefix + names[i];
        const auto data = ckpt.find(base + (packed_ ? "weight_packed" : "weight"));
        KTIER_CHECK_MSG(data.has_value(), base.c_str());  // Checkpoint::open verified the set
        m[i].data_shard = data->shard;
        m[i].data = data->info;
        if (packed_) {
          const auto scales = ckpt.find(base + "weight_scale");
          KTIER_CHECK_MSG(scales.has_value(), base.c_str());
          m[i].scales_shard = scales->shard;
          m[i].scales = scales->info;
        }
      }
      matrices_.push_back(m);
    }
  }
}

Result<cpu::WeightMatrix> CheckpointExpertSource::view(const Matrix& m, int64_t rows,
                                                       int64_t cols, size_t slot) {
  // Where one tensor's bytes can be read from: the mapping when its address suits the element
  // type, else buffer `buf` (grown as needed, reused across fetches).
  auto place = [&](uint32_t shard_index, const format::TensorInfo& t,
                   size_t buf) -> Result<const void*> {
    const format::SafetensorsFile& shard = ckpt_.shard(shard_index);
    const bool mapped = shard.mode() == format::OpenMode::kMap;
    if (mapped) {
      const uint8_t* p = shard.bytes(t).data();
      if (reinterpret_cast<uintptr_t>(p) % dtype_traits(t.dtype).size == 0) return p;
    }
    if (buffers_.size() <= buf) {
      buffers_.resize(buf + 1);
      buffer_sizes_.resize(buf + 1, 0);
    }
    if (buffer_sizes_[buf] < t.nbytes) {
      buffers_[buf] = std::make_unique<uint8_t[]>(t.nbytes);
      buffer_sizes_[buf] = t.nbytes;
    }
    if (mapped)
      std::memcpy(buffers_[buf].get(), shard.bytes(t).data(), t.nbytes);
    else
      KTIER_RETURN_IF_ERROR(shard.read(t, buffers_[buf].get()));
    return static_cast<const void*>(buffers_[buf].get());
  };
  cpu::WeightMatrix w;
  w.rows = rows;
  w.cols = cols;
  KTIER_ASSIGN_OR_RETURN(w.data, place(m.data_shard, *m.data, 2 * slot));
  bytes_fetched_ += m.data->nbytes;
  if (packed_) {
    w.type = cpu::WeightType::kMxfp4;
    KTIER_ASSIGN_OR_RETURN(const void* s, place(m.scales_shard, *m.scales, 2 * slot + 1));
    w.scales = static_cast<const uint8_t*>(s);
    bytes_fetched_ += m.scales->nbytes;
  } else {
    w.type = weight_type_of(m.data->dtype);
  }
  return w;
}

Status ExpertSource::fetch_each(int64_t layer, std::span<const int32_t> ids, ExpertWeights* out,
                                const ReadyFn& ready) {
  KTIER_RETURN_IF_ERROR(fetch(layer, ids, out));
  std::vector<size_t> all(ids.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  return ready(all);
}

uint64_t expert_bytes(const ExpertWeights& e) {
  return matrix_bytes(e.w1) + matrix_bytes(e.w2) + matrix_bytes(e.w3);
}

bool CheckpointExpertSource::peek(int64_t layer, int32_t id, ExpertWeights* out) {
  const format::ModelConfig& c = ckpt_.config();
  const int64_t I = c.moe_intermediate_size, lat = c.routed_expert_hidden_size;
  const auto& m = matrices_[static_cast<size_t>((layer - c.first_k_dense_replace) * c.num_experts + id)];
  // Only where every part is mapped and aligned for its element type: nothing to read or copy.
  auto mapped = [&](uint32_t shard_index, const format::TensorInfo& t) -> const void* {
    const format::SafetensorsFile& shard = ckpt_.shard(shard_index);
    if (shard.mode() != format::OpenMode::kMap) return nullptr;
    const uint8_t* p = shard.bytes(t).data();
    return reinterpret_cast<uintptr_t>(p) % dtype_traits(t.dtype).size == 0 ? p : nullptr;
  };
  cpu::WeightMatrix* parts[3] = {&out->w1, &out->w2, &out->w3};
  const int64_t rows[3] = {I, lat, I}, cols[3] = {lat, I, lat};
  for (int i = 0; i < 3; ++i) {
    cpu::WeightMatrix& w = *parts[i];
    w.rows = rows[i];
    w.cols = cols[i];
    w.data = mapped(m[i].data_shard, *m[i].data);
    if (!w.data) return false;
    w.scales = nullptr;
    if (packed_) {
      w.type = cpu::WeightType::kMxfp4;
      w.scales = static_cast<const uint8_t*>(mapped(m[i].scales_shard, *m[i].scales));
      if (!w.scales) return false;
    } else {
      w.type = weight_type_of(m[i].data->dtype);
    }
  }
  return true;
}

Status CheckpointExpertSource::fetch(int64_t layer, std::span<const int32_t> ids,
                                     ExpertWeights* out) {
  const format::ModelConfig& c = ckpt_.config();
  KTIER_CHECK(layer >= c.first_k_dense_replace && layer < c.num_hidden_layers);
  const int64_t I = c.moe_intermediate_size, lat = c.routed_expert_hidden_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    KTIER_CHECK(ids[i] >= 0 && ids[i] < c.num_experts);
    const auto& m =
        matrices_[static_cast<size_t>((layer - c.first_k_dense_replace) * c.num_experts + ids[i])];
    KTIER_ASSIGN_OR_RETURN(out[i].w1, view(m[0], I, lat, 3 * i));
    KTIER_ASSIGN_OR_RETURN(out[i].w2, view(m[1], lat, I, 3 * i + 1));
    KTIER_ASSIGN_OR_RETURN(out[i].w3, view(m[2], I, lat, 3 * i + 2));
  }
  return Status::ok();
}

}  // namespace ktier::model
