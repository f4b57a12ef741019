#pragma once
// ReadFile: one file opened for reading by the I/O layer, with O_DIRECT where the filesystem
// allows it (DESIGN.md §6).
//
// Direct I/O: streamed trunk layers and cold experts are read once and not reused before they
// are evicted, so the page cache only doubles the copies and evicts other memory (the anchor
// engine measured buffered reads at 1.9 GB/s vs 6.6 GB/s direct under a 32 GB cgroup cap).
// DirectMode::kAuto tries O_DIRECT and falls back to buffered reads when the filesystem refuses
// it (open() fails with EINVAL, statx reports no direct-I/O support, or a probe read fails with
// EINVAL); the fallback is logged once per process.
//
// Alignment: while direct() is true, a read's file offset, length and destination address must
// all be multiples of alignment(). IoEngine handles unaligned requests itself (bounce buffers,
// see io_engine.h), so this matters to callers only for speed.
//
// Ownership and threads: a ReadFile owns its descriptor (closed by the destructor) and is
// move-only. It is immutable after open(), so any number of threads may read through it at once.
// It must outlive every IoEngine request that names it, and must not be moved while such a
// request is outstanding (requests hold its address).

#include <cstdint>
#include <filesystem>
#include <string>

#include "common/status.h"

namespace ktier::io {

enum class DirectMode {
  kAuto,      // O_DIRECT if the filesystem allows it, else buffered (logged once)
  kDirect,    // O_DIRECT or fail with Status::runtime (tests and benches; no flag selects it)
  kBuffered,  // never O_DIRECT
};

class ReadFile {
 public:
  // Opens `path` read-only (open_regular_file below). Status::runtime (exit 1) when it cannot
  // be opened, Status::usage (exit 2) when it is not a regular file; the message names the path
  // and the errno text.
  static Result<ReadFile> open(const std::filesystem::path& path,
                               DirectMode mode = DirectMode::kAuto);

  ReadFile() = default;  // not open: fd() == -1
  ReadFile(ReadFile&& other) noexcept;
  ReadFile& operator=(ReadFile&& other) noexcept;
  ReadFile(const ReadFile&) = delete;
  ReadFile& operator=(const ReadFile&) = delete;
  ~ReadFile();

  bool is_open() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // Size in bytes when opened (a file that shrinks later fails its reads with Status::runtime).
  uint64_t size() const { return size_; }
  // True when reads bypass the page cache (O_DIRECT is in effect).
  bool direct() const { return direct_; }
  // Required alignment in bytes of offset, length and memory for a read of this file: the
  // larger of statx's stx_dio_mem_align and stx_dio_offset_align, or 4096 where STATX_DIOALIGN
  // is unavailable; 1 when not direct.
  uint32_t alignment() const { return alignment_; }
  // Process-unique id (stable across moves); the io_uring engine keys registered files by it.
  uint64_t id() const { return id_; }

 private:
  void release();
  int fd_ = -1;
  std::string path_;
  uint64_t size_ = 0;
  bool direct_ = false;
  uint32_t alignment_ = 1;
  uint64_t id_ = 0;
};

// "Input/output error (EIO)": strerror text plus the symbolic name, for messages.
std::string errno_text(int err);

// Opens one of the engine's own input files (config.json, the index, a shard, the tokenizer's
// files) read-only with O_CLOEXEC | `extra_flags`, and refuses anything but a regular
// file: the open itself is non-blocking, so a FIFO in the model folder is refused at once
// instead of waiting forever for a writer, and a directory, socket or device is refused before
// a read. The descriptor returned is blocking again and owned by the caller.
// Errors name the path: Status::usage (exit 2) for one that is not a regular file ("is a FIFO
// (named pipe), not a regular file"), Status::runtime (exit 1) when open or fstat fail (errno
// named; callers with a better word for a missing file check that first); the errno of a failed
// open is in `*open_errno` when given (ReadFile retries without O_DIRECT on EINVAL).
Result<int> open_regular_file(const std::filesystem::path& path, int extra_flags = 0,
                              int* open_errno = nullptr);
// The same for inputs that may also come through a pipe (`<(zcat trace.gz)`): a FIFO is opened
// without waiting for a writer, so one that has none reads as empty at once ("is ..., not a file
// or a pipe" for the rest).
Result<int> open_file_or_pipe(const std::filesystem::path& path, int* open_errno = nullptr);

// Whether `path` names something (symbolic links followed): false when it or a folder on the
// way does not exist (ENOENT, ENOTDIR); Status::runtime (exit 1) naming the path and the errno
// when that cannot be told (EACCES: a folder that may be listed but not entered, ELOOP, ...),
// so a permission problem is not reported as a missing file.
Result<bool> path_exists(const std::filesystem::path& path);

// How large a file read whole may be: past `bytes` it is refused unread (by its size) or as
// soon as a read passes it (a file that grows), with `refuse` (e.g. Status::usage for a
// config, Status::corrupt for a checkpoint file) naming it, so that a damaged or hostile file
// never sizes an allocation.
struct SizeLimit {
  uint64_t bytes = 0;
  Status (*refuse)(std::string message) = nullptr;
};

// The whole of a regular file opened as above. Status::runtime on a read error; `limit`'s.
Result<std::string> read_regular_file(const std::filesystem::path& path, SizeLimit limit);

// Everything in the regular file open as `fd`, from its start (positioned reads: the
// descriptor's offset is not used). Status::runtime "WHAT: read error: ..." on a failed read;
// `limit`'s "WHAT: ... the N bytes a file of its kind may hold" past it.
Result<std::string> read_whole(int fd, const std::string& what, SizeLimit limit);

}  // namespace ktier::io
