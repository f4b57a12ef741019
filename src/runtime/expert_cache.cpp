#include "runtime/expert_cache.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/check.h"
#include "model/weights.h"

namespace ktier::runtime {

namespace {

constexpr uint64_t kPage = 4096;

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// Where each part of an expert goes in its slot: a contiguous expert keeps its file layout
// (one read); otherwise each part starts on a fresh page, congruent to its file offset modulo
// the page, or page-aligned when the offset does not suit the element type (then the I/O layer
// bounces the read).
struct Placement {
  std::array<uint64_t, 6> offset{};
  uint64_t end = 0;
};
Placement place(const format::ExpertLocation& loc, const format::Checkpoint& ckpt) {
  Placement p;
  if (loc.contiguous) {
    const uint64_t base = loc.file_offset % kPage;
    for (uint32_t i = 0; i < loc.num_parts; ++i)
      p.offset[i] = base + (loc.parts[i].file_offset - loc.file_offset);
    p.end = base + loc.nbytes;
    return p;
  }
  const bool packed = ckpt.expert_storage() == format::ExpertStorage::kMxfp4;
  const size_t elem = packed ? 1 : dtype_traits(*ckpt.expert_summary().plain_dtype).size;
  uint64_t cursor = 0;
  for (uint32_t i = 0; i < loc.num_parts; ++i) {
    const uint64_t off = loc.parts[i].file_offset;
    const uint64_t start = (cursor + kPage - 1) / kPage * kPage;
    p.offset[i] = off % elem == 0 ? start + off % kPage : start;
    cursor = p.offset[i] + loc.parts[i].nbytes;
  }
  p.end = cursor;
  return p;
}

}  // namespace

uint64_t ExpertCache::slot_bytes(const format::Checkpoint& ckpt) {
  const format::ModelConfig& c = ckpt.config();
  uint64_t most = 0;
  for (int64_t l = c.first_k_dense_replace; l < c.num_hidden_layers; ++l)
    for (int64_t e = 0; e < c.num_experts; ++e)
      most = std::max(most, place(ckpt.expert(l, e), ckpt).end);
  return (most + kPage - 1) / kPage * kPage;
}

ExpertCache::~ExpertCache() { cq_.reset(); }  // waits for reads into the slots

Result<std::unique_ptr<ExpertCache>> ExpertCache::open(const format::Checkpoint& ckpt,
                                                       io::IoEngine& engine,
                                                       const std::vector<io::ReadFile>& files,
                                                       int64_t slots) {
  KTIER_CHECK(slots >= 1 && ckpt.expert_storage() != format::ExpertStorage::kNone);
  std::unique_ptr<ExpertCache> c(new ExpertCache(ckpt, engine, files));
  c->cq_ = std::make_unique<io::CompletionQueue>(engine);
  c->stats_.slots = slots;
  c->stats_.slot_bytes = slot_bytes(ckpt);
  KTIER_ASSIGN_OR_RETURN(c->arena_, io::AlignedBuffer::allocate(
                                        static_cast<size_t>(slots) * c->stats_.slot_bytes,
                                        io::kDefaultAlignment, io::HugePages::kYes));
  c->stats_.bytes_allocated = c->arena_.size();
  // Fault the arena in now: otherwise every first read into a slot pays for page allocation and
  // zeroing inside decode (measured: a tier larger than the working set ran 3x slower per token
  // on the development VM until every slot had been used once).
  std::memset(c->arena_.data(), 0, c->arena_.size());
  c->slots_.resize(static_cast<size_t>(slots));
  for (size_t i = 0; i < c->slots_.size(); ++i) {
    c->slots_[i].base = c->arena_.data() + i * c->stats_.slot_bytes;
    c->slots_[i].lru = c->lru_.insert(c->lru_.end(), i);
  }
  return c;
}

model::ExpertWeights ExpertCache::view(const Slot& s, int64_t layer, int32_t e) const {
  const format::ModelConfig& c = ckpt_.config();
  const int64_t I = c.moe_intermediate_size, lat = c.routed_expert_hidden_size;
  const uint8_t* base = s.base;
  model::ExpertWeights w;
  const int64_t shapes[3][2] = {{I, lat}, {lat, I}, {I, lat}};  // w1, w2, w3
  cpu::WeightMatrix* m[3] = {&w.w1, &w.w2, &w.w3};
  const bool packed = ckpt_.expert_storage() == format::ExpertStorage::kMxfp4;
  for (int i = 0; i < 3; ++i) {
    m[i]->rows = shapes[i][0];
    m[i]->cols = shapes[i][1];
    if (packed) {
      m[i]->type = cpu::WeightType::kMxfp4;
      m[i]->data = base + s.part_offset[2 * i];
      m[i]->scales = base + s.part_offset[2 * i + 1];
    } else {
      m[i]->type = model::weight_type_of(*ckpt_.expert_summary().plain_dtype);
      m[i]->data = base + s.part_offset[i];
    }
  }
  return w;
}

Status ExpertCache::fetch(int64_t layer, std::span<const int32_t> ids, model::ExpertWeights* out) {
  KTIER_CHECK(static_cast<int64_t>(ids.size()) <= stats_.slots);
  const format::ModelConfig& c = ckpt_.config();
  auto key_of = [&](int32_t e) { return layer * c.num_experts + e; };
  // Hits first: they must not be chosen as victims for this request's misses.
  std::vector<size_t> slot_of(ids.size(), SIZE_MAX);
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto it = where_.find(key_of(ids[i]));
    if (it == where_.end()) continue;
    slot_of[i] = it->second;
    lru_.splice(lru_.begin(), lru_, slots_[it->second].lru);
    stats_.hit_bytes += ckpt_.expert(layer, ids[i]).nbytes;
  }
  // Misses: take the least recently used slots (from the back), read them all at once.
  struct Pending {  // one read: a whole contiguous expert or one part
    size_t slot;
    uint32_t shard;
    uint64_t file_offset, nbytes, dst;
  };
  std::vector<Pending> reads;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (slot_of[i] != SIZE_MAX) continue;
    const size_t victim = lru_.back();
    lru_.splice(lru_.begin(), lru_, slots_[victim].lru);
    Slot& s = slots_[victim];
    if (s.key >= 0) where_.erase(s.key);
    s.key = key_of(ids[i]);
    where_[s.key] = victim;
    slot_of[i] = victim;
    const format::ExpertLocation& loc = ckpt_.expert(layer, ids[i]);
    const Placement p = place(loc, ckpt_);
    s.part_offset = p.offset;
    stats_.miss_bytes += loc.nbytes;
    if (loc.contiguous)
      reads.push_back({victim, loc.shard, loc.file_offset, loc.nbytes, p.offset[0]});
    for (uint32_t k = 0; !loc.contiguous && k < loc.num_parts; ++k)
      reads.push_back({victim, loc.parts[k].shard, loc.parts[k].file_offset, loc.parts[k].nbytes,
                       p.offset[k]});
  }
  if (!reads.empty()) {
    std::vector<io::ReadRequest> batch;
    for (const Pending& r : reads)
      batch.push_back({&files_[r.shard], r.file_offset, r.nbytes, slots_[r.slot].base + r.dst, 0});
    std::sort(batch.begin(), batch.end(), [](const io::ReadRequest& a, const io::ReadRequest& b) {
      return a.file->id() != b.file->id() ? a.file->id() < b.file->id() : a.offset < b.offset;
    });
    const uint64_t t0 = now_ns();
    Status st = cq_->submit(batch);
    if (st.is_ok()) st = cq_->wait_all();
    stats_.io_wait_ns += now_ns() - t0;
    if (!st.is_ok()) {
      // No partial expert may be used later: forget every slot of this request.
      for (const Pending& r : reads) {
        Slot& s = slots_[r.slot];
        if (s.key >= 0) where_.erase(s.key);
        s.key = -1;
      }
      return st;
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) out[i] = view(slots_[slot_of[i]], layer, ids[i]);
  return Status::ok();
}

}  // namespace ktier::runtime
