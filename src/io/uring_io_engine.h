#pragma once
// UringIoEngine: IoEngine on io_uring (liburing), STYLE-ANCHORS.md practice 27.
//
// One reaper thread owns the ring: it takes chunks in submission order, keeps up to
// queue_depth reads in flight, reaps completions, and re-issues retries and short-read
// continuations. Callers never touch the ring; submit() wakes the reaper through an eventfd
// whose read is always armed on the ring, so a caller's batch goes out without waiting for an
// unrelated completion.
//
// Registered resources, each used when the kernel accepts the table and skipped otherwise (a
// read then goes out unregistered, which is only slower; register_buffer says why):
// - files: a sparse table of kFileSlots; a file is registered on its first read and its slot is
//   reused, when the table is full, once no read of it is in flight. A registered slot holds a
//   kernel reference to the file until it is reused or the engine is destroyed.
// - buffers: a sparse table of kBufferSlots: the engine's bounce buffers first, then regions the
//   caller registers (register_buffer; regions over 1 GiB take several slots, and a read that
//   straddles two slots goes unregistered). A read whose destination lies inside one registered
//   slot is issued as IORING_OP_READ_FIXED, which skips per-read page pinning.
//
// Availability: create() sets up a ring and runs one no-op through it, on the creating thread and
// on the reaper before it starts; in containers that block
// io_uring (ENOSYS, EPERM) or with kernel.io_uring_disabled it fails with Status::runtime and
// make_io_engine() falls back to PreadIoEngine.
//
// Thread-safety and contract: as IoEngine (io_engine.h). The destructor cancels requests not yet
// started, waits for reads in flight, and joins the reaper.

#include <liburing.h>

#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "io/queued_engine.h"

namespace ktier::io {

class UringIoEngine final : public detail::QueuedIoEngine {
 public:
  // K3's 96 shards and a trunk pack fit, so a decode step's reads never re-register a file.
  static constexpr unsigned kFileSlots = 256;
  // 2 TiB of registered regions in 1 GiB slots: a K3 expert tier on a large host is hundreds of
  // GiB, all of K3's experts 1.35 TiB (the kernel allows 16,384 slots; an empty one costs a
  // table entry).
  static constexpr unsigned kBufferSlots = 2048;

  // Status::runtime naming the failing step and errno when io_uring cannot be used here.
  static Result<std::unique_ptr<IoEngine>> create(const IoOptions& options);
  ~UringIoEngine() override;
  const char* name() const override { return "io_uring"; }

  Status register_buffer(void* base, uint64_t bytes) override;
  void unregister_buffer(void* base) override;

  // Whether the kernel accepted the registered file / buffer tables.
  bool files_registered() const { return files_registered_; }
  bool buffers_registered() const { return buffers_registered_; }

 private:
  struct Op;  // one chunk owned by the reaper, with its current attempt
  struct Region {
    uint8_t* owner = nullptr;  // base passed to register_buffer (bounce buffers: their data)
    uint8_t* base = nullptr;   // this slot's piece
    uint64_t bytes = 0;
    unsigned slot = 0;
  };

  explicit UringIoEngine(const IoOptions& options) : QueuedIoEngine(options) {}
  Status init();
  // Reads one byte of /dev/null through the ring: 0 (end of file) when IORING_OP_READ works,
  // else -errno. For init() where the opcode probe is refused.
  int read_dev_null();
  // Runs one no-op through the ring and waits for it (the calling thread's first submit, if
  // it is one, sets up its io_uring context). Status::runtime naming the failing call.
  Status run_nop();
  void wake() override;
  void on_bounce_allocated(uint32_t index, uint8_t* data, uint64_t bytes) override;

  // Reaper thread only.
  void reaper_loop();
  void arm_wake_read();
  io_uring_sqe* get_sqe();
  void start_attempt(Op* op);  // plan, then issue now or park until not_before
  void issue(Op* op);
  void complete(Op* op, int64_t res);
  // Hands the chunk back to the base (finish_chunk) and frees `op`.
  void finish(Op* op);
  int file_slot_for(const ReadFile& file);
  int buffer_slot_for(const uint8_t* buf, uint64_t bytes);

  io_uring ring_{};
  bool ring_ready_ = false;
  int wake_fd_ = -1;
  uint64_t wake_value_ = 0;  // destination of the armed eventfd read
  bool files_registered_ = false;
  bool buffers_registered_ = false;
  std::thread reaper_;

  // Reaper thread only.
  unsigned ops_active_ = 0;  // in the kernel or parked; bounded by queue_depth
  std::vector<Op*> parked_;  // waiting for their not_before
  std::unordered_map<uint64_t, unsigned> file_slot_of_;  // ReadFile::id() -> slot
  std::vector<uint64_t> slot_file_;                      // slot -> ReadFile::id(), 0 = free
  std::vector<uint32_t> slot_reads_;                     // slot -> reads in flight

  std::mutex register_mu_;  // serializes register_buffer / unregister_buffer (taken first)
  std::mutex regions_mu_;
  std::map<uint8_t*, Region> regions_;  // by base; guarded by regions_mu_
  std::vector<bool> buffer_slot_used_;  // guarded by regions_mu_
};

}  // namespace ktier::io
