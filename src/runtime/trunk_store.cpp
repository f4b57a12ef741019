#include "runtime/trunk_store.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <new>

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "common/check.h"
#include "common/on_exception.h"
#include "common/progress.h"
#include "common/size.h"
#include "common/xxh3_state.h"
#include "cpu/kernels.h"

namespace ktier::runtime {

namespace {
uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}
}  // namespace

TrunkStore::~TrunkStore() {
  cq_.reset();  // waits for reads into the ring before it is unregistered and freed
  for (void* base : registered_) engine_->unregister_buffer(base);
}

void TrunkStore::register_for_reads(io::AlignedBuffer& b) {
  // Fixed buffers spare io_uring the per-read page pinning; without them reads still work.
  if (engine_->register_buffer(b.data(), b.size()).is_ok()) registered_.push_back(b.data());
}

namespace {
// The tensors' bytes of a record (what is read of it from the shards; padding is not read).
uint64_t payload_bytes(const pack::Record& r) {
  uint64_t n = 0;
  for (const pack::TensorEntry& t : r.tensors) n += t.nbytes;
  return n;
}
// What streaming record `r` reads: a pack's record as stored, from the shards its tensors.
uint64_t read_bytes(const pack::Record& r, bool from_pack) {
  return from_pack ? r.stored_size : payload_bytes(r);
}
// Head, embedding-row buffer and ring sizes of a record table (L layers, head, embed); for a
// compressed pack the staging buffer (largest stored layer record) and the inflate scratch; with
// a pack, the embedding rows' checksums (8 bytes a row).
struct TrunkSizes {
  uint64_t head = 0, row_buf = 0, row_sums = 0, largest = 0, all_layers = 0;
  uint64_t staging = 0, scratch = 0;
  uint64_t fixed() const { return head + row_buf + row_sums + scratch; }
  // Everything pinned: one staging buffer while the layers are read at open.
  uint64_t all_pinned() const { return fixed() + all_layers + staging; }
  uint64_t ring(int slots) const { return static_cast<uint64_t>(slots) * (largest + staging); }
  // `every_layer`: all the layers may be pinned (TrunkStoreOptions::max_pinned allows it);
  // fewer than all need the ring, even where the layers together are smaller.
  uint64_t minimum(int slots, bool every_layer) const {
    return fixed() + (every_layer ? std::min<uint64_t>(all_layers + staging, ring(slots))
                                  : ring(slots));
  }
};
// The layers a store may pin of `L` with TrunkStoreOptions::max_pinned (-1: every one).
int64_t pinnable_layers(int64_t max_pinned, int64_t L) {
  return max_pinned >= 0 ? std::min<int64_t>(max_pinned, L) : L;
}
TrunkSizes sizes_of(const std::vector<pack::Record>& records, const format::ModelConfig& c,
                    const pack::TrunkPack* pack, int threads = 1) {
  const uint64_t block_size = pack ? pack->block_size() : 0;
  TrunkSizes z;
  for (const pack::Record& r : records)
    if (r.compressed) z.staging = std::max(z.staging, r.stored_size);
  if (z.staging > 0) z.scratch = static_cast<uint64_t>(std::max(1, threads)) * block_size;
  const size_t L = static_cast<size_t>(c.num_hidden_layers);
  z.head = records[L].size;
  const uint64_t row_bytes = records[L + 1].tensors.at(0).nbytes / static_cast<uint64_t>(c.vocab_size);
  z.row_buf = pack::align_up(row_bytes * 64, 4096);  // fixed: embed() batches rows to fit it
  if (pack) z.row_sums = static_cast<uint64_t>(c.vocab_size) * sizeof(uint64_t);
  for (size_t l = 0; l < L; ++l) {
    z.largest = std::max(z.largest, records[l].size);
    z.all_layers += records[l].size;
  }
  return z;
}
}  // namespace

pack::PackLayout TrunkStore::shard_layout(const format::Checkpoint& ckpt) {
  constexpr uint64_t kPage = 4096;
  pack::PackLayout layout = pack::plan_trunk_pack(ckpt);
  for (size_t ri = 0; ri < layout.records.size(); ++ri) {
    pack::Record& r = layout.records[ri];
    uint64_t cursor = 0;
    for (size_t t = 0; t < r.tensors.size(); ++t) {
      pack::TensorEntry& e = r.tensors[t];
      const uint64_t file = layout.sources[ri][t].info->file_offset;
      if (file % dtype_size(e.dtype) == 0)  // the next offset congruent to the file's
        e.offset = cursor + (file % kPage + kPage - cursor % kPage) % kPage;
      else                                  // would misalign its elements: bounced
        e.offset = pack::align_up(cursor, pack::kTensorAlignment);
      cursor = e.offset + e.nbytes;
    }
    r.bytes = cursor;
    r.size = pack::align_up(cursor, pack::kRecordAlignment);
  }
  return layout;
}

Result<TrunkPlan> TrunkStore::plan_records(const std::vector<pack::Record>& records,
                                           const format::ModelConfig& c,
                                           const pack::TrunkPack* pack,
                                           const TrunkStoreOptions& opts, int inflate_threads) {
  // Head + row buffer + ring are the minimum; layers are pinned in order while the rest of the
  // budget holds them; if every layer fits, there is no ring.
  const int64_t L = c.num_hidden_layers;
  const pack::Record& head = records[static_cast<size_t>(L)];
  const TrunkSizes z = sizes_of(records, c, pack, inflate_threads);
  const int slots = std::max(2, opts.ring_slots);
  const int64_t most = pinnable_layers(opts.max_pinned, L);
  TrunkPlan p;
  p.minimum_bytes = z.minimum(slots, most == L);
  if (opts.budget_bytes < p.minimum_bytes) {
    // The minimum is the ring, or (a small model) every layer pinned where that is less.
    const bool all_pinned = p.minimum_bytes < z.fixed() + z.ring(slots);
    const std::string staging = z.staging ? format_size(z.staging) + " compressed staging" : "";
    const std::string layers =
        all_pinned ? "all " + std::to_string(L) + " layers pinned, " + format_size(z.all_layers) +
                         (z.staging ? ", + " + staging + " while they are read" : "")
                   : std::to_string(slots) + " ring slots of " + format_size(z.largest) +
                         (z.staging ? " + " + staging + " each" : "");
    return Status::budget(
        "a trunk budget of " + format_size(opts.budget_bytes) + " cannot be met: the minimum is " +
        format_size(p.minimum_bytes) + " = " + std::to_string(p.minimum_bytes) + " bytes (head " +
        format_size(head.size) + " + " + layers +
        (z.scratch ? " + " + format_size(z.scratch) + " inflate scratch" : "") +
        " + embedding rows" + (z.row_sums ? " and their checksums" : "") + ")");
  }
  const auto extra = [&](int64_t first_streamed) -> uint64_t {
    return opts.streamed_extra ? opts.streamed_extra(first_streamed) : 0;
  };
  KTIER_CHECK(!(opts.pin_last && opts.streamed_extra));
  auto layer = [&](int64_t i) { return opts.pin_last ? L - 1 - i : i; };
  int64_t pinned = 0;
  if (most == L && z.all_pinned() + extra(L) <= opts.budget_bytes) {
    pinned = L;  // no ring
  } else {
    // Layer by layer, from the first (or the last) one, while the next fits beside the ring.
    uint64_t used = z.fixed() + z.ring(slots);
    while (pinned < most &&
           used + records[static_cast<size_t>(layer(pinned))].size + extra(pinned + 1) <=
               opts.budget_bytes)
      used += records[static_cast<size_t>(layer(pinned++))].size;
  }
  p.layers_pinned = pinned;
  p.layers_served = most;
  p.first_pinned = opts.pin_last ? L - pinned : 0;
  for (int64_t i = 0; i < pinned; ++i)
    p.pinned_layer_bytes += records[static_cast<size_t>(layer(i))].size;
  if (pinned < L) {
    p.ring_slots = slots;
    p.ring_slot_bytes = z.largest + z.staging;
  }
  p.bytes_held = z.fixed() + p.pinned_layer_bytes + p.ring_bytes();
  p.head_bytes = head.size;
  for (int64_t l = 0; l < L; ++l)
    p.layer_read_bytes.push_back(read_bytes(records[static_cast<size_t>(l)], pack != nullptr));
  return p;
}

Result<TrunkPlan> TrunkStore::plan(const format::Checkpoint& ckpt, const pack::TrunkPack* pack,
                                   const TrunkStoreOptions& opts, int inflate_threads) {
  return plan_records(pack ? pack->records() : shard_layout(ckpt).records, ckpt.config(), pack,
                      opts, inflate_threads);
}

uint64_t TrunkStore::minimum_bytes(const format::Checkpoint& ckpt, const pack::TrunkPack* pack,
                                   int ring_slots, int inflate_threads, int64_t max_pinned) {
  const int64_t L = ckpt.config().num_hidden_layers;
  const auto& records = pack ? pack->records() : shard_layout(ckpt).records;
  return sizes_of(records, ckpt.config(), pack, inflate_threads)
      .minimum(std::max(2, ring_slots), pinnable_layers(max_pinned, L) == L);
}

Result<std::unique_ptr<TrunkStore>> TrunkStore::open(const format::Checkpoint& ckpt,
                                                     const pack::TrunkPack* pack,
                                                     io::IoEngine& engine,
                                                     const std::vector<io::ReadFile>& shard_files,
                                                     const TrunkStoreOptions& opts) {
  KTIER_ASSIGN_OR_RETURN(const TrunkPlan placement,
                         plan(ckpt, pack, opts, opts.pool ? opts.pool->size() : 1));
  return open(ckpt, pack, engine, shard_files, placement, opts.pool);
}

Result<std::unique_ptr<TrunkStore>> TrunkStore::open(const format::Checkpoint& ckpt,
                                                     const pack::TrunkPack* pack,
                                                     io::IoEngine& engine,
                                                     const std::vector<io::ReadFile>& shard_files,
                                                     const TrunkPlan& placement,
                                                     cpu::ThreadPool* pool) {
  std::unique_ptr<TrunkStore> s(new TrunkStore(ckpt, pack, engine, shard_files));
  s->pool_ = pool;
  s->inflate_threads_ = pool ? pool->size() : 1;
  const format::ModelConfig& c = ckpt.config();
  const int64_t L = c.num_hidden_layers;
  if (pack) {
    s->records_ = pack->records();
  } else {
    pack::PackLayout layout = shard_layout(ckpt);
    s->records_ = std::move(layout.records);
    s->tensor_sources_ = std::move(layout.sources);
  }
  for (uint32_t r = 0; r < s->records_.size(); ++r)
    for (uint32_t t = 0; t < s->records_[r].tensors.size(); ++t)
      s->by_name_[s->records_[r].tensors[t].name] = {r, t};
  // The ring reads ahead of need, in one FIFO with expert prefetch; a layer the decode waits
  // for may queue behind prefetches, as it did before priorities existed (IO-LAYER.md).
  s->cq_ = std::make_unique<io::CompletionQueue>(engine, io::ReadPriority::kReadAhead);
  if (pack) {
    KTIER_ASSIGN_OR_RETURN(s->pack_file_, engine.open(pack->pack_path()));
  }

  const pack::Record& head = s->records_[static_cast<size_t>(L)];
  const int64_t pinned = placement.layers_pinned;
  KTIER_CHECK(pinned >= 0 && pinned <= L && (pinned == L) == (placement.ring_slots == 0));
  const TrunkSizes z = sizes_of(s->records_, c, pack, s->inflate_threads_);
  const uint64_t largest = z.largest;
  const int slots = placement.ring_slots;
  const uint64_t row_buf = z.row_buf;
  s->stats_.minimum_bytes = placement.minimum_bytes;
  s->stats_.layers_pinned = pinned;
  s->pin_first_ = placement.first_pinned;
  s->stats_.layers_streamed = placement.layers_served - pinned;

  // Compressed packs: inflate scratch, one per pool thread, allocated now (counted).
  if (z.staging > 0) {
    s->scratch_ =
        std::make_unique<pack::InflateScratchSet>(s->inflate_threads_, pack->block_size());
    s->stats_.scratch_bytes = s->scratch_->bytes();
  }
  // The ring (with its staging buffers) first: slot 0's staging serves the reads at open.
  uint64_t allocated = s->stats_.scratch_bytes;
  if (pinned < L) {
    s->ring_.resize(static_cast<size_t>(slots));
    for (Slot& slot : s->ring_) {
      KTIER_ASSIGN_OR_RETURN(slot.buf, io::AlignedBuffer::allocate(largest));
      allocated += slot.buf.size();
      if (z.staging > 0) {
        KTIER_ASSIGN_OR_RETURN(slot.staging, io::AlignedBuffer::allocate(z.staging));
        allocated += slot.staging.size();
        s->stats_.staging_bytes += slot.staging.size();
        s->register_for_reads(slot.staging);  // compressed: blocks are read into the staging
      } else {
        s->register_for_reads(slot.buf);
      }
    }
  }
  io::AlignedBuffer open_staging;  // every layer pinned: a staging buffer for open() only
  if (z.staging > 0 && pinned == L) {
    KTIER_ASSIGN_OR_RETURN(open_staging, io::AlignedBuffer::allocate(z.staging));
    allocated += open_staging.size();
  }
  uint8_t* staging = pinned < L ? s->ring_[0].staging.data() : open_staging.data();

  // Resident part: head and the pinned layers, read and verified now (K3's whole trunk is
  // ~115 GB: progress on stderr while it loads, at the info log level).
  uint64_t to_load = head.size, loaded = 0;
  for (int64_t l = s->pin_first_; l < s->pin_first_ + pinned; ++l)
    to_load += s->records_[static_cast<size_t>(l)].size;
  ProgressMeter meter("loading trunk", to_load, spdlog::should_log(spdlog::level::info));
  KTIER_ASSIGN_OR_RETURN(io::AlignedBuffer hb, io::AlignedBuffer::allocate(head.size));
  KTIER_RETURN_IF_ERROR(s->read_now(head, hb.data(), staging));
  KTIER_ASSIGN_OR_RETURN(s->head_, model::bind_head(c, s->lookup_in(head, hb.data())));
  s->pinned_.push_back(std::move(hb));
  meter.update(loaded += head.size);
  for (int64_t l = s->pin_first_; l < s->pin_first_ + pinned; ++l) {
    const pack::Record& r = s->records_[static_cast<size_t>(l)];
    KTIER_ASSIGN_OR_RETURN(io::AlignedBuffer b, io::AlignedBuffer::allocate(r.size));
    KTIER_RETURN_IF_ERROR(s->read_now(r, b.data(), staging));
    KTIER_ASSIGN_OR_RETURN(model::LayerWeights w, model::bind_layer(c, l, s->lookup_in(r, b.data())));
    s->pinned_weights_.push_back(std::move(w));
    s->pinned_.push_back(std::move(b));
    meter.update(loaded += r.size);
  }
  meter.finish_if_shown(loaded);
  if (open_staging.size() > 0) {  // served the reads above only: what is held from now on
    allocated -= open_staging.size();
    open_staging = io::AlignedBuffer();
  }
  for (const auto& b : s->pinned_) allocated += b.size();
  if (pinned < L) {
    s->next_prefetch_ = s->streamed_from(0);
    s->prefetch();
  }
  KTIER_ASSIGN_OR_RETURN(s->row_buf_, io::AlignedBuffer::allocate(row_buf));
  // Embedding rows are read one by one later: the whole record is verified here, streamed
  // through the row buffer, and each row's own checksum is kept for the reads that follow.
  if (pack) KTIER_RETURN_IF_ERROR(s->verify_embed_record());
  s->stats_.bytes_allocated =
      allocated + s->row_buf_.size() + s->row_sums_.size() * sizeof(uint64_t);
  KTIER_CHECK(s->stats_.bytes_allocated == placement.bytes_held);  // as `ktier plan` says
  const int64_t served = placement.layers_served;
  spdlog::info("trunk: {} of {} layers pinned{}, {} streamed through {} slots of {}{}; {} "
               "allocated ({}, {})", pinned, L,
               pinned > 0 && s->pin_first_ > 0 && pinned < L ? " (the last ones)" : "",
               served - pinned, pinned < L ? slots : 0, format_size(placement.ring_slot_bytes),
               served < L ? "; the device holds the other " + std::to_string(L - served) : "",
               format_size(s->stats_.bytes_allocated), s->engine_->name(),
               pack ? (pack->compressed() ? "compressed pack" : "pack") : "shards");
  return s;
}

void TrunkStore::free_slot(Slot& s) {
  s.in_use = false;
  s.ready = false;
  s.layer = -1;
  s.weights = {};
}

void TrunkStore::set_cycle_start(int64_t layer) {
  cycle_start_ = layer;
  // A read-ahead that has wrapped to the old cycle's start stops at a layer a slot already holds
  // (prefetch() does not read a layer twice): it goes on from there, in the new cycle.
  const int64_t next = next_prefetch_;
  if (next >= 0 && next < config().num_hidden_layers &&
      std::any_of(ring_.begin(), ring_.end(), [&](const Slot& s) { return s.layer == next; }))
    next_prefetch_ = streamed_after(next);
}

uint64_t TrunkStore::release_ring(int64_t first_layer) {
  const int64_t L = config().num_hidden_layers;
  for (int64_t l = std::max<int64_t>(first_layer, 0); l < L; ++l)
    if (!is_pinned(l)) return 0;
  uint64_t freed = 0;
  for (Slot& s : ring_) {
    KTIER_CHECK(!s.in_use);
    (void)drain(&s);  // a read ahead nobody will acquire: its status does not matter
    for (io::AlignedBuffer* b : {&s.buf, &s.staging}) {
      if (b->size() == 0) continue;
      const auto reg = std::find(registered_.begin(), registered_.end(), b->data());
      if (reg != registered_.end()) {
        engine_->unregister_buffer(b->data());
        registered_.erase(reg);
      }
      freed += b->size();
    }
    stats_.staging_bytes -= s.staging.size();
  }
  ring_.clear();
  next_prefetch_ = -1;
  stats_.bytes_allocated -= freed;
  return freed;
}

uint64_t TrunkStore::release_head() {
  if (head_released_) return 0;
  const uint64_t freed = pinned_.front().size();
  pinned_.front() = io::AlignedBuffer();  // [0] stays the head's place
  head_ = model::HeadWeights();
  head_released_ = true;
  stats_.bytes_allocated -= freed;
  return freed;
}

std::vector<std::span<uint8_t>> TrunkStore::layer_buffers(int64_t first_layer) {
  std::vector<std::span<uint8_t>> out;  // the ring first: what streams from disk
  for (Slot& s : ring_) out.emplace_back(s.buf.data(), s.buf.size());
  for (int64_t l = std::max(first_layer, pin_first_); l < pin_first_ + stats_.layers_pinned; ++l) {
    io::AlignedBuffer& b = pinned_[static_cast<size_t>(l - pin_first_) + 1];  // [0] is the head
    out.emplace_back(b.data(), b.size());
  }
  return out;
}

// For a compressed record: one source per block, into the staging buffer at the block's place
// in the stored record (the whole aligned extent, so O_DIRECT reads need no bounce buffer).
std::vector<TrunkStore::Source> TrunkStore::sources_of(const pack::Record& r) const {
  std::vector<Source> out;
  if (pack_ && r.compressed) {
    for (const pack::Block& b : r.blocks)
      out.push_back({&pack_file_, b.offset, pack::align_up(b.length, pack::kRecordAlignment),
                     b.offset - r.offset});
    return out;
  }
  if (pack_) {
    out.push_back({&pack_file_, r.offset, r.size, 0});
    return out;
  }
  const size_t ri = static_cast<size_t>(&r - records_.data());
  for (size_t t = 0; t < r.tensors.size(); ++t) {
    const format::TensorRef& ref = tensor_sources_[ri][t];
    out.push_back({&(*shard_files_)[ref.shard], ref.info->file_offset, ref.info->nbytes,
                   r.tensors[t].offset});
  }
  return out;
}

Status TrunkStore::read_now(const pack::Record& r, uint8_t* dst, uint8_t* staging) {
  if (!r.compressed) std::fill(dst, dst + r.size, uint8_t{0});  // padding, for records from shards
  uint8_t* into = r.compressed ? staging : dst;
  std::vector<io::ReadRequest> batch;
  for (const Source& src : sources_of(r))
    batch.push_back({src.file, src.offset, src.length, into + src.dst_offset, 0});
  KTIER_RETURN_IF_ERROR(io::read_all(*engine_, batch));
  if (r.compressed) {
    std::vector<uint32_t> all(r.blocks.size());
    for (uint32_t b = 0; b < all.size(); ++b) all[b] = b;
    return inflate_blocks(r, all, staging, dst);
  }
  return pack_ ? pack_->verify(r, dst) : Status::ok();
}

Status TrunkStore::inflate_blocks(const pack::Record& r, std::span<const uint32_t> blocks,
                                  const uint8_t* stored, uint8_t* dst) {
  const uint64_t t0 = now_ns();
  std::vector<Status> status(blocks.size());
  cpu::parallel_for(pool_, static_cast<int64_t>(blocks.size()), 1, [&](int64_t b, int64_t e) {
    const pack::InflateScratchSet::Lease scratch = scratch_->borrow();
    for (int64_t i = b; i < e; ++i) {
      const pack::Block& k = r.blocks[blocks[static_cast<size_t>(i)]];
      status[static_cast<size_t>(i)] = pack_->inflate_block(r, blocks[static_cast<size_t>(i)],
                                                            stored + (k.offset - r.offset), dst + k.raw_offset,
                                                            *scratch);
    }
  });
  stats_.inflate_ns += now_ns() - t0;
  for (Status& st : status) KTIER_RETURN_IF_ERROR(st);
  return Status::ok();
}

void TrunkStore::start_read(Slot& s, int64_t layer) {
  const pack::Record& r = records_[static_cast<size_t>(layer)];
  // Tag: slot index in the low 16 bits; for compressed records the block number above them.
  const uint64_t tag = static_cast<uint64_t>(&s - ring_.data());
  uint8_t* into = r.compressed ? s.staging.data() : s.buf.data();
  // What may throw (std::bad_alloc; submit then queues nothing) comes before the slot is marked:
  // a slot that said it held `layer` with no read queued would bind the bytes of the layer it
  // held before, or wait for reads that never come. Only take(), on this thread, consumes the
  // completions, so marking the slot after submit is in time.
  std::vector<io::ReadRequest> batch;
  for (const Source& src : sources_of(r))
    batch.push_back({src.file, src.offset, src.length, into + src.dst_offset, tag | (batch.size() << 16)});
  s.landed.clear();
  if (r.compressed) s.landed.reserve(r.blocks.size());  // take() appends without allocating
  const Status st = cq_->submit(batch);
  s.layer = layer;
  s.ready = false;
  s.status = st;
  s.inflated = 0;
  s.outstanding = st.is_ok() ? batch.size() : 0;
  stats_.streamed_bytes_read += read_bytes(r, pack_ != nullptr);
  stats_.streamed_bytes_inflated += pack_ ? r.size : payload_bytes(r);
}

void TrunkStore::drop_stale_slots() {
  if (last_acquired_ < 0 || ring_.empty()) return;
  take(0);  // reads that have landed: their slots count as done
  // The layers the forward takes next, as far as the ring reaches.
  std::vector<int64_t> upcoming;
  upcoming.reserve(ring_.size());
  for (int64_t l = last_acquired_; upcoming.size() < ring_.size();) {
    l = streamed_after(l);
    if (l >= config().num_hidden_layers) break;
    upcoming.push_back(l);
  }
  for (Slot& s : ring_) {
    if (s.in_use || s.layer < 0 || s.outstanding > 0 || s.layer == last_acquired_) continue;
    if (std::find(upcoming.begin(), upcoming.end(), s.layer) == upcoming.end()) free_slot(s);
  }
}

void TrunkStore::prefetch() {
  const int64_t L = config().num_hidden_layers;
  drop_stale_slots();
  for (Slot& s : ring_) {
    if (next_prefetch_ < 0 || next_prefetch_ >= L) return;  // nothing (more) to read ahead
    if (s.layer >= 0) continue;
    // Do not read a layer that some slot already holds (the ring is larger than the cycle).
    const bool held = std::any_of(ring_.begin(), ring_.end(),
                                  [&](const Slot& o) { return o.layer == next_prefetch_; });
    if (held) return;
    start_read(s, next_prefetch_);
    next_prefetch_ = streamed_after(next_prefetch_);
  }
}

void TrunkStore::take(size_t min_count) {
  std::vector<io::Completion> done;
  cq_->wait(min_count, done);
  for (io::Completion& c : done) {
    Slot& s = ring_[static_cast<size_t>(c.tag & 0xffff)];
    --s.outstanding;
    if (!c.status.is_ok() && s.status.is_ok()) s.status = c.status;
    if (c.status.is_ok() && s.layer >= 0 && records_[static_cast<size_t>(s.layer)].compressed)
      s.landed.push_back(static_cast<uint32_t>(c.tag >> 16));
  }
}

void TrunkStore::take_one_for(const Slot& s) {
  KTIER_CHECK(s.outstanding > 0);
  // A slot counting reads the queue does not hold would wait for ever: a bug, stopped here.
  KTIER_CHECK(cq_->outstanding() > 0);
  take(1);
}

Status TrunkStore::drain(Slot* until) {
  const uint64_t t0 = now_ns();
  while (until->outstanding > 0) take_one_for(*until);
  stats_.io_wait_ns += now_ns() - t0;
  return Status::ok();
}

Status TrunkStore::finish_compressed(Slot& s) {
  const pack::Record& r = records_[static_cast<size_t>(s.layer)];
  std::vector<uint32_t> batch;
  while (s.inflated < r.blocks.size()) {
    // Wait until a pool's worth of blocks has landed (or every read has), then inflate those
    // while the engine reads the rest.
    const uint64_t t0 = now_ns();
    const size_t want = std::min<size_t>(static_cast<size_t>(inflate_threads_), s.outstanding + s.landed.size());
    while (s.status.is_ok() && s.landed.size() < want && s.outstanding > 0) take_one_for(s);
    take(0);
    stats_.io_wait_ns += now_ns() - t0;
    if (!s.status.is_ok() || s.landed.empty()) break;
    batch.assign(s.landed.begin(), s.landed.end());  // s.landed keeps its room (take())
    s.landed.clear();
    std::sort(batch.begin(), batch.end());  // errors are reported for the first block
    Status st;
    {
      // Not inflated after all (std::bad_alloc): they wait in s.landed again for the next
      // finish(), which its room, reserved for every block, takes without allocating.
      const OnException unwind([&] { s.landed.assign(batch.begin(), batch.end()); });
      st = inflate_blocks(r, batch, s.staging.data(), s.buf.data());
    }
    s.inflated += batch.size();
    if (!st.is_ok() && s.status.is_ok()) s.status = st;
    if (!s.status.is_ok()) break;
  }
  if (!s.status.is_ok()) {
    KTIER_RETURN_IF_ERROR(drain(&s));  // no read may still write the staging buffer
    return s.status;
  }
  KTIER_CHECK(s.inflated == r.blocks.size() && s.outstanding == 0);
  return Status::ok();
}

Status TrunkStore::finish(Slot& s) {
  const pack::Record& r = records_[static_cast<size_t>(s.layer)];
  if (r.compressed) {
    KTIER_RETURN_IF_ERROR(finish_compressed(s));
  } else {
    KTIER_RETURN_IF_ERROR(drain(&s));
    KTIER_RETURN_IF_ERROR(s.status);
  }
  if (r.compressed) {  // every block was checked against its xxh3 as it was inflated
  } else if (pack_) {
    KTIER_RETURN_IF_ERROR(pack_->verify(r, s.buf.data()));
  } else {  // the padding between tensors (never read by a kernel) is left as it is
  }
  KTIER_ASSIGN_OR_RETURN(s.weights, model::bind_layer(config(), s.layer, lookup_in(r, s.buf.data())));
  s.ready = true;
  return Status::ok();
}

Result<const model::LayerWeights*> TrunkStore::acquire_layer(int64_t l) {
  if (const model::LayerWeights* w = pinned_layer(l)) return w;
  auto it = std::find_if(ring_.begin(), ring_.end(), [&](const Slot& s) { return s.layer == l; });
  if (it == ring_.end()) {
    // Not prefetched: a forward that stopped early (an error, an abandoned pass) left the ring
    // holding the layers that pass would have taken next. Start it again from `l`: the reads
    // under way land, every slot not in use is emptied, and `l` is read (the rest are read
    // ahead from it below).
    for (Slot& busy : ring_)
      if (busy.outstanding > 0) KTIER_RETURN_IF_ERROR(drain(&busy));
    for (Slot& slot : ring_)
      if (!slot.in_use) free_slot(slot);
    // At most one layer is in use at a time (Model::forward); no ring: release_ring's contract.
    it = std::find_if(ring_.begin(), ring_.end(), [](const Slot& s) { return !s.in_use; });
    KTIER_CHECK(it != ring_.end());
    start_read(*it, l);
    next_prefetch_ = streamed_after(l);
  }
  Slot& s = *it;
  if (!s.ready) {
    Status st = finish(s);
    if (!st.is_ok() && s.status.exit_code() == static_cast<int>(ExitCode::kRuntime)) {
      // A read ahead that failed (I/O) is speculative: read the record once more, now that it
      // is needed, before failing the forward pass. Checksum errors are not retried.
      start_read(s, l);
      st = finish(s);
    }
    if (!st.is_ok()) {
      s.layer = -1;  // the bytes are never bound; a later acquire reads the record again
      return st;
    }
  }
  s.in_use = true;
  last_acquired_ = l;
  // Read ahead while `l` computes: the slots the miss above emptied, or those a stopped pass
  // left holding its layers (one holding the wrapped-to first layer is found, the others not).
  // Nothing may throw once the slot is in use with no lease to release it: a read ahead that
  // could not be queued (std::bad_alloc) leaves its slot free, as in release_layer.
  try {
    prefetch();
  } catch (const std::bad_alloc&) {
  }
  return &s.weights;
}

void TrunkStore::release_layer(int64_t l) {
  if (is_pinned(l)) return;
  for (Slot& s : ring_) {
    if (s.layer == l && s.in_use) free_slot(s);
  }
  try {
    prefetch();
  } catch (...) {
    // Called from a destructor (Model's lease): nothing may escape. A read ahead that could not
    // be queued leaves its slot free (start_read), and acquire_layer reads the layer when needed.
  }
}

model::TensorLookup TrunkStore::lookup_in(const pack::Record& r, const uint8_t* base) const {
  return [this, &r, base](const std::string& name) -> Result<model::TensorView> {
    const auto it = by_name_.find(name);
    KTIER_CHECK_MSG(it != by_name_.end() && &records_[it->second.first] == &r, name.c_str());
    const pack::TensorEntry& t = r.tensors[it->second.second];
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    const std::filesystem::path& file =
        pack_ ? pack_->pack_path()
              : ckpt_.shard(tensor_sources_[it->second.first][it->second.second].shard).path();
    return model::TensorView{t.dtype, numel, base + t.offset, file.native()};
  };
}

Status TrunkStore::embed(std::span<const int32_t> ids, float* out) {
  const format::ModelConfig& c = config();
  const pack::Record& r = records_.back();
  const pack::TensorEntry& t = r.tensors.at(0);
  const uint64_t row_bytes = t.nbytes / static_cast<uint64_t>(c.vocab_size);
  const io::ReadFile* file = nullptr;
  uint64_t base = 0;
  if (pack_) {
    file = &pack_file_;
    base = r.offset + t.offset;
  } else {
    const format::TensorRef& ref = tensor_sources_.back().at(0);
    file = &(*shard_files_)[ref.shard];
    base = ref.info->file_offset;
  }
  // In batches that fit the fixed row buffer (its size is part of the budget's minimum).
  const size_t per_batch = std::max<size_t>(1, row_buf_.size() / row_bytes);
  const cpu::WeightType type = model::weight_type_of(t.dtype);
  for (size_t b0 = 0; b0 < ids.size(); b0 += per_batch) {
    const size_t n = std::min(per_batch, ids.size() - b0);
    std::vector<io::ReadRequest> batch;
    for (size_t i = 0; i < n; ++i)
      batch.push_back({file, base + static_cast<uint64_t>(ids[b0 + i]) * row_bytes, row_bytes,
                       row_buf_.data() + i * row_bytes, 0});
    KTIER_RETURN_IF_ERROR(io::read_all(*engine_, batch));
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* row = row_buf_.data() + i * row_bytes;
      const int32_t id = ids[b0 + i];
      // The pack's rows as checked at open: a file changed since then is not computed from.
      if (!row_sums_.empty() && XXH3_64bits(row, row_bytes) != row_sums_[static_cast<size_t>(id)])
        return Status::corrupt(pack_->pack_path().string() + ": record '" + r.name + "' row " +
                               std::to_string(id) + " no longer matches the bytes checked at "
                               "open: the pack changed during the run; rerun ktier pack");
      cpu::widen_to_f32(type, row, c.hidden_size, out + (b0 + i) * c.hidden_size);
    }
  }
  return Status::ok();
}

Status TrunkStore::verify_embed_record() {
  const pack::Record& r = records_.back();
  const pack::TensorEntry& t = r.tensors.at(0);
  const uint64_t vocab = static_cast<uint64_t>(config().vocab_size);
  const uint64_t row_bytes = t.nbytes / vocab;
  const Xxh3State state = new_xxh3_state();
  // Pieces of whole rows (the bytes before and after the rows on their own), so that each row's
  // checksum is taken from the same bytes as the record's.
  const uint64_t rows_per_piece = std::max<uint64_t>(1, row_buf_.size() / row_bytes);
  std::vector<uint64_t> sums(vocab);
  Status st = Status::ok();
  for (uint64_t off = 0; off < r.size && st.is_ok();) {
    uint64_t n = 0;
    if (off < t.offset) {
      n = std::min(t.offset - off, row_buf_.size());
    } else if (off < t.offset + vocab * row_bytes) {
      n = std::min(rows_per_piece * row_bytes, t.offset + vocab * row_bytes - off);
    } else {
      n = std::min(r.size - off, row_buf_.size());
    }
    const io::ReadRequest req{&pack_file_, r.offset + off, n, row_buf_.data(), 0};
    st = io::read_all(*engine_, std::span<const io::ReadRequest>(&req, 1));
    if (!st.is_ok()) break;
    XXH3_64bits_update(state.get(), row_buf_.data(), n);
    if (off >= t.offset && off < t.offset + vocab * row_bytes)
      for (uint64_t b = 0; b < n; b += row_bytes)
        sums[(off - t.offset + b) / row_bytes] = XXH3_64bits(row_buf_.data() + b, row_bytes);
    off += n;
  }
  const uint64_t digest = XXH3_64bits_digest(state.get());
  KTIER_RETURN_IF_ERROR(st);
  if (digest != r.xxh3)
    return Status::corrupt(pack_->pack_path().string() + ": record '" + r.name + "' at offset " +
                           std::to_string(r.offset) + " fails its xxh3 checksum (expected " +
                           pack::hex64(r.xxh3) + ", read " + pack::hex64(digest) +
                           "): the pack is damaged; rerun ktier pack");
  row_sums_ = std::move(sums);
  return Status::ok();
}

}  // namespace ktier::runtime
