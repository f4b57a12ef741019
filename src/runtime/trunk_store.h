#pragma once
// The memory dial for the trunk (issue 4; DESIGN.md §4, §6): the non-expert weights held within
// a byte budget. The head record (lm_head, final norm, output AttnRes pair) is resident (until
// release_head: GPU mode, once the device mirrors it);
// a prefix of layers (GPU mode: a suffix, TrunkStoreOptions::pin_last) is pinned as far as the
// budget allows; the remaining layers stream through a ring of slots, layer l+1.. read while
// layer l computes, in the cyclic order the forward pass acquires them (from set_cycle_start's
// layer on). Embedding rows are read on demand, one small read per token.
//
// Source of the bytes: a trunk pack (pack/trunk_pack.h) — one read per layer record, whose xxh3
// is checked before the layer is bound; the head record once at open; the embed record streamed
// through the row buffer once at open, each row's own checksum kept and checked at every read
// of it — or, without a pack, the
// checkpoint's shards, one read per tensor into the same record layout (no checksum: the shards
// carry none). Reads go through
// the I/O layer (io_uring with O_DIRECT where possible, else pread; io/io_engine.h).
//
// Compressed packs (version 2): a layer record is read as one request per block into a staging
// buffer of its slot; blocks are inflated on the thread pool as they land (I/O of later blocks
// overlaps the inflation of earlier ones), each straight into its disjoint range of the slot (or
// pinned buffer), and each block's inflated bytes are checked against their xxh3 before the
// layer is bound. A failing block is Status::corrupt naming the pack file, the layer record and
// the block.
//
// Exactness: whatever the budget, slot count or source, the kernels see the stored bytes of
// every tensor, so the output bytes never change (tests/runtime/trunk_store_test.cpp).
//
// Memory: the weight buffers are io::AlignedBuffers, counted in bytes_allocated(): the head
// record, the pinned records, the ring slots and the fixed embedding-row buffer; for compressed
// packs also a staging buffer per slot (one at open when every layer is pinned) and one inflate
// scratch of the block size per pool thread. Not counted:
// the f32 copies of each bound layer's small vectors (norm gains, conv taps; ~0.75 MB per K3
// layer) — part of the fixed overhead documented in docs/TUNING.md.
//
// Threads: not thread-safe; the forward pass calls it from one thread. The I/O engine's threads
// write only into slots whose reads are outstanding; pool threads inflating a block write only
// that block's range of the destination and use one scratch each.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/check.h"
#include "common/status.h"
#include "cpu/thread_pool.h"
#include "format/checkpoint.h"
#include "io/aligned_buffer.h"
#include "io/io_engine.h"
#include "model/weights.h"
#include "pack/trunk_pack.h"

namespace ktier::runtime {

struct TrunkStoreOptions {
  uint64_t budget_bytes = UINT64_MAX;  // for the trunk; UINT64_MAX: everything pinned
  int ring_slots = 2;                  // >= 2 when any layer streams
  // Inflates the blocks of a compressed pack's records in parallel (the engine's kernel pool;
  // must outlive the store). Null: on the calling thread. Unused for plain packs and shards.
  cpu::ThreadPool* pool = nullptr;
  // Bytes the caller must also hold, within budget_bytes, when layers first_streamed.. stream
  // (the lookahead routers of the streamed layers, runtime::RouterBank); non-increasing in
  // first_streamed. Counted when choosing how many layers to pin, never allocated here; called
  // during open() only. Null: none.
  std::function<uint64_t(int64_t first_streamed)> streamed_extra;
  // Pin layers from the last one down instead of from the first (GPU mode: the device holds the
  // first layers, so the host's pinned ones complement them instead of duplicating them, and
  // fewer of the layers the device streams come from disk). Not with streamed_extra.
  bool pin_last = false;
  // At most this many layers pinned (-1: as many as the budget holds). GPU mode: the layers the
  // device streams; the budget left over is not held by the store.
  int64_t max_pinned = -1;
};

struct TrunkStoreStats {
  // Streamed: the layers acquire_layer() reads from disk every token, the served ones not pinned
  // (in GPU mode not those the device holds, read through the ring once at open to copy them).
  int64_t layers_pinned = 0, layers_streamed = 0;
  uint64_t bytes_allocated = 0;     // head + pinned + ring + row buffer (+ compressed staging
                                    // and inflate scratch): held after open() (which, with
                                    // every layer of a compressed pack pinned, also held one
                                    // staging buffer while it read them), until release_ring
                                    // frees the ring and release_head the head
  uint64_t minimum_bytes = 0;       // the smallest budget that works (head + ring + row buffer)
  uint64_t streamed_bytes_read = 0; // ring reads since open (pinned reads excluded): a pack's
                                    // records as stored, from the shards the tensors' bytes
  uint64_t streamed_bytes_inflated = 0;  // the same records inflated (== read for plain packs)
  uint64_t io_wait_ns = 0;          // time spent waiting for ring reads (acquire_layer(), and
                                    // release_ring's drain of reads ahead)
  uint64_t inflate_ns = 0;          // time acquire_layer() spent inflating blocks (wall)
  uint64_t staging_bytes = 0;       // compressed-byte staging buffers held (0 for plain packs)
  uint64_t scratch_bytes = 0;       // inflate scratch held (0 for plain packs)
};

// Where TrunkStore::open puts the trunk for its options, decided from the record sizes alone
// (nothing read or allocated). Bytes.
struct TrunkPlan {
  int64_t layers_pinned = 0;
  int64_t first_pinned = 0;    // the pinned layers are first_pinned .. + layers_pinned - 1
  // The layers the store's acquires serve: all, or in GPU mode those the device streams
  // (TrunkStoreOptions::max_pinned; the device holds the others).
  int64_t layers_served = 0;
  int ring_slots = 0;          // 0: every layer pinned, no ring
  uint64_t ring_slot_bytes = 0;  // each slot: the largest layer record (+ compressed staging)
  uint64_t minimum_bytes = 0;  // TrunkStoreStats::minimum_bytes
  uint64_t pinned_layer_bytes = 0;
  uint64_t bytes_held = 0;     // what the store holds after open (TrunkStoreStats::bytes_allocated)
  uint64_t head_bytes = 0;     // the head record's, part of bytes_held (release_head frees it)
  // [l]: the bytes one acquire of layer l reads when it streams (TrunkStoreStats's
  // streamed_bytes_read: a pack's record as stored, from the shards its tensors' bytes).
  std::vector<uint64_t> layer_read_bytes;
  uint64_t ring_bytes() const { return static_cast<uint64_t>(ring_slots) * ring_slot_bytes; }
};

class TrunkStore final : public model::TrunkSource {
 public:
  // What open(ckpt, pack, ..., opts) will pin and hold, with `inflate_threads` inflating a
  // compressed pack's blocks (open: its pool's size, 1 without one). Status::budget (exit 4)
  // when opts.budget_bytes is below the minimum, stating both (open's refusal).
  static Result<TrunkPlan> plan(const format::Checkpoint& ckpt, const pack::TrunkPack* pack,
                                const TrunkStoreOptions& opts, int inflate_threads);
  // `pack` may be null (read from the shards, `shard_files` in Checkpoint order). `ckpt`, `pack`,
  // `engine` and `shard_files` must outlive the store.
  // Errors: Status::budget (exit 4) when the budget is below the minimum, stating both; I/O
  // errors (exit 1) naming the file; Status::corrupt for a pinned record failing its checksum.
  static Result<std::unique_ptr<TrunkStore>> open(const format::Checkpoint& ckpt,
                                                  const pack::TrunkPack* pack,
                                                  io::IoEngine& engine,
                                                  const std::vector<io::ReadFile>& shard_files,
                                                  const TrunkStoreOptions& opts);
  // The same, placed as `placement` says (plan() of this checkpoint and pack, with `pool`'s size
  // as its inflate_threads, 1 without a pool): the engine plans first (runtime::plan_engine).
  static Result<std::unique_ptr<TrunkStore>> open(const format::Checkpoint& ckpt,
                                                  const pack::TrunkPack* pack,
                                                  io::IoEngine& engine,
                                                  const std::vector<io::ReadFile>& shard_files,
                                                  const TrunkPlan& placement,
                                                  cpu::ThreadPool* pool);
  // The records the store reads from the shards (no pack): plan_trunk_pack's, except that each
  // tensor sits congruent to its file offset modulo 4096 (when that offset suits its element
  // type), so that O_DIRECT reads it straight into the record instead of bouncing every byte
  // through the I/O engine's bounce buffers (the pack's 64-byte placement disagrees with the
  // shards' offsets: K3's data start 16 bytes past a multiple of 64). Up to 4 KiB of padding per
  // tensor. Record file offsets are meaningless here.
  static pack::PackLayout shard_layout(const format::Checkpoint& ckpt);
  // The smallest trunk budget open() accepts (head + ring + embedding-row buffer; all layers if
  // they are smaller than the ring and `max_pinned`, TrunkStoreOptions', lets them all be
  // pinned). For a compressed pack also one staging buffer per ring slot (the largest stored
  // layer record) and `inflate_threads` scratch buffers of the block size.
  static uint64_t minimum_bytes(const format::Checkpoint& ckpt, const pack::TrunkPack* pack,
                                int ring_slots = 2, int inflate_threads = 1,
                                int64_t max_pinned = -1);
  ~TrunkStore() override;

  const format::ModelConfig& config() const override { return ckpt_.config(); }
  Result<const model::LayerWeights*> acquire_layer(int64_t l) override;
  void release_layer(int64_t l) override;
  const model::HeadWeights& head() const override {
    KTIER_CHECK(!head_released_);  // release_head's contract: another source serves it
    return head_;
  }
  Status embed(std::span<const int32_t> ids, float* out) override;

  const TrunkStoreStats& stats() const { return stats_; }
  // Pinned layers are first_pinned() .. first_pinned() + layers_pinned - 1: the first ones, or
  // with TrunkStoreOptions::pin_last the last ones.
  int64_t first_pinned() const { return pin_first_; }
  bool is_pinned(int64_t l) const { return l >= pin_first_ && l < pin_first_ + stats_.layers_pinned; }
  // A pinned layer's weights (valid for the store's life, immutable: any thread), or null for a
  // layer the store streams.
  const model::LayerWeights* pinned_layer(int64_t l) const {
    return is_pinned(l) ? &pinned_weights_[static_cast<size_t>(l - pin_first_)] : nullptr;
  }
  const char* io_engine_name() const { return engine_->name(); }
  // The first layer the forward pass will acquire from the store once the current pass over
  // the layers is done; the layers before it are served by someone else (GPU mode: the device
  // holds them). From its next wrap on, the ring's read-ahead goes from the last layer to the
  // first streamed layer at or after `layer`, instead of reading layers nobody asks for every
  // token. The reads already under way are left as they are, for the pass that acquires the
  // layers once more first (GPU mode: the device mirror's, which calls this before it starts).
  // Any layer can still be acquired later: read then, and the read-ahead goes on from there
  // until it wraps.
  void set_cycle_start(int64_t layer);
  // From now on only layers first_layer.. are acquired (GPU mode, after the device's mirror pass:
  // the device holds the layers before). When the store pins every one of them, the ring (and a
  // compressed pack's staging) would never be read into again: it is freed, after the reads
  // under way land (their errors are dropped: nobody asks for those layers), and bytes_allocated
  // shrinks by it. Acquiring a layer the store does not pin afterwards is a bug (CHECK).
  // REQUIRES: no layer acquired. Returns the bytes freed (0 when some of those layers stream).
  uint64_t release_ring(int64_t first_layer);
  // Frees the head record (lm_head, final norm, output AttnRes pair), which nobody asks this
  // store for any more (GPU mode: the device mirrors it and serves head()); bytes_allocated
  // shrinks by it. head() afterwards is a bug (CHECK). Returns the bytes freed
  // (TrunkPlan::head_bytes), 0 when released before.
  uint64_t release_head();
  // The layer each ring slot holds or is reading (-1: free), for tests and reports.
  std::vector<int64_t> ring_layers() const {
    std::vector<int64_t> out;
    for (const Slot& s : ring_) out.push_back(s.layer);
    return out;
  }
  // The buffers layers first_layer.. are handed out from (the ring slots when any layer
  // streams, then their pinned records): what GPU mode page-locks so that its copies of the layers it
  // streams run at link speed. Valid for the store's life.
  std::vector<std::span<uint8_t>> layer_buffers(int64_t first_layer);

 private:
  struct Slot {
    io::AlignedBuffer buf;
    io::AlignedBuffer staging;  // compressed packs: the stored bytes of the record being read
    int64_t layer = -1;     // record held or being read; -1 free
    size_t outstanding = 0; // reads not yet completed
    Status status;          // first error of its reads
    bool ready = false;     // read, verified and bound
    bool in_use = false;    // acquired and not yet released
    std::vector<uint32_t> landed;  // compressed: blocks read, not yet inflated
    size_t inflated = 0;           // compressed: blocks inflated and verified
    model::LayerWeights weights;
  };
  struct Source {  // where one record's tensors come from
    const io::ReadFile* file;
    uint64_t offset, length, dst_offset;
  };

  TrunkStore(const format::Checkpoint& ckpt, const pack::TrunkPack* pack, io::IoEngine& engine,
             const std::vector<io::ReadFile>& shard_files)
      : ckpt_(ckpt), pack_(pack), engine_(&engine), shard_files_(&shard_files) {}
  static Result<TrunkPlan> plan_records(const std::vector<pack::Record>& records,
                                        const format::ModelConfig& c, const pack::TrunkPack* pack,
                                        const TrunkStoreOptions& opts, int inflate_threads);
  // Synchronous: pinned records, head. `staging`: room for a compressed record's stored bytes.
  Status read_now(const pack::Record& r, uint8_t* dst, uint8_t* staging);
  // Submits slot s's reads of `layer`. A submission that fails is kept in s.status and
  // reported by finish(s), as a failed read is: the slot is the error's one place.
  void start_read(Slot& s, int64_t layer);
  Status finish(Slot& s);  // waits for s's reads, verifies, binds
  static void free_slot(Slot& s);  // holds nothing (its reads must have landed)
  Status drain(Slot* until);  // takes completions until `until` has none outstanding
  void take(size_t min_count);  // takes completions (blocking for min_count) into their slots
  void take_one_for(const Slot& s);  // take(1) while s counts reads (the queue must hold them)
  Status finish_compressed(Slot& s);  // reads and inflates in parallel, as blocks land
  // Inflates `blocks` of compressed record `r` from `stored` into `dst` on the pool; the first
  // error in block order.
  Status inflate_blocks(const pack::Record& r, std::span<const uint32_t> blocks, const uint8_t* stored,
                        uint8_t* dst);
  Status verify_embed_record();  // pack mode: xxh3 of the embed record, streamed
  void prefetch();
  // Empties the slots not in use whose layer the forward will not take within the ring's reach
  // from last_acquired_ (a pass that stopped partway left them): the read-ahead skips a slot
  // that holds a layer, and would skip those until the forward came to their layers. A slot
  // still reading is left until its read lands. Called by prefetch().
  void drop_stale_slots();
  // Finds r's tensors at `base` (the record's bytes).
  model::TensorLookup lookup_in(const pack::Record& r, const uint8_t* base) const;
  std::vector<Source> sources_of(const pack::Record& r) const;

  const format::Checkpoint& ckpt_;
  const pack::TrunkPack* pack_;
  std::vector<pack::Record> records_;  // L layers, head, embed (pack's, or plan_trunk_pack's)
  std::vector<std::vector<format::TensorRef>> tensor_sources_;  // no-pack mode: [record][tensor]
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>> by_name_;
  io::IoEngine* engine_;
  const std::vector<io::ReadFile>* shard_files_;
  std::unique_ptr<io::CompletionQueue> cq_;
  std::vector<void*> registered_;  // ring buffers registered with the I/O engine
  // Registers a ring buffer for fixed-buffer reads (io_uring); a failure leaves it unregistered.
  void register_for_reads(io::AlignedBuffer& b);
  io::ReadFile pack_file_;
  std::vector<io::AlignedBuffer> pinned_;  // head first, then layers 0..n_pinned-1
  std::vector<model::LayerWeights> pinned_weights_;
  model::HeadWeights head_;
  bool head_released_ = false;  // release_head
  std::vector<Slot> ring_;
  int64_t next_prefetch_ = -1;  // next streamed layer to read
  int64_t last_acquired_ = -1;  // the streamed layer the forward acquired last
  int64_t cycle_start_ = 0;     // read-ahead wraps to the first streamed layer from here
  int64_t pin_first_ = 0;       // the first pinned layer
  // The first streamed layer at or after l; L when none.
  int64_t streamed_from(int64_t l) const {
    return is_pinned(l) ? pin_first_ + stats_.layers_pinned : l;
  }
  int64_t wrap_target() const { return streamed_from(cycle_start_); }
  // The streamed layer read after l, in the forward pass's cyclic order; L when none.
  int64_t streamed_after(int64_t l) const {
    const int64_t n = streamed_from(l + 1);
    return n < config().num_hidden_layers ? n : wrap_target();
  }
  io::AlignedBuffer row_buf_;
  // Pack mode: xxh3 of each embedding row, taken at open from the bytes the record's checksum
  // passed; embed() checks every row it reads against it. Empty without a pack.
  std::vector<uint64_t> row_sums_;
  TrunkStoreStats stats_;
  cpu::ThreadPool* pool_ = nullptr;
  int inflate_threads_ = 1;
  // One InflateScratch per inflating thread (compressed packs only).
  std::unique_ptr<pack::InflateScratchSet> scratch_;
};

}  // namespace ktier::runtime
