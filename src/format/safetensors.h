#pragma once
// One safetensors file (K3-MODEL.md §3.2): u64 LE header length N, N bytes of UTF-8 JSON, then
// the data section at 8+N. Each header member except `__metadata__` describes one tensor as
// {"dtype", "shape", "data_offsets": [begin, end)} relative to the data section.
//
// open() reads and validates the whole header; afterwards every TensorInfo is known to lie inside
// the file, to have exactly numel x dtype_size bytes, and to overlap no other non-empty tensor.
// Header problems are Status::corrupt (exit 3) naming the file and the tensor; failing to open or
// read the file is Status::runtime (exit 1).
//
// Ownership and threads: a SafetensorsFile owns its descriptor and (in kMap mode) a read-only
// mapping of the whole file; both are released by the destructor. It is move-only. After open()
// it is immutable, and bytes() / read() / read_bytes() may be called from any number of threads
// at once (pread has no shared file position). Spans from bytes() live as long as the object.
// A mapped file that another process truncates after open() faults (SIGBUS) on access; kPread
// turns the same situation into a Status::runtime instead.

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace ktier::format {

// Upper bound on a header (N). The released headers are below 1 MiB; the reference safetensors
// implementation refuses headers over 100 MB, and so do we, before allocating anything.
inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
// Highest tensor rank ktier accepts (the release uses ranks 0..3; the conformance files rank 4).
inline constexpr size_t kMaxTensorRank = 4;

struct TensorInfo {
  std::string name;            // exact, JSON escapes already decoded
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // row-major; empty = rank 0 (one element)
  uint64_t file_offset = 0;    // absolute offset of the first byte in the file (8 + N + begin)
  uint64_t nbytes = 0;         // numel() * dtype_size(dtype)

  int64_t numel() const;
};

enum class OpenMode {
  kMap,    // mmap the whole file read-only; bytes() gives zero-copy spans
  kPread,  // no mapping; tensors are fetched with read() (positioned reads)
};

class SafetensorsFile {
 public:
  // Opens and validates `path`. Never throws.
  static Result<SafetensorsFile> open(const std::filesystem::path& path,
                                      OpenMode mode = OpenMode::kMap);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  // Every tensor, in file order (ascending data offset; a zero-length tensor sorts before the
  // non-empty tensor that starts at the same offset). `__metadata__` is not a tensor.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // nullptr when the file has no tensor of that name. The pointer lives as long as the object.
  const TensorInfo* find(const std::string& name) const;

  const std::filesystem::path& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }
  // Whether descriptor `fd` is this file (its device and inode): a path opened again may name
  // another file by now (replaced by a rename since open() checked this one).
  bool same_file_as(int fd) const;
  uint64_t data_offset() const { return data_offset_; }  // 8 + N
  OpenMode mode() const { return mode_; }

  // Zero-copy view of a tensor's bytes. Requires kMap mode and a TensorInfo of this file
  // (anything else is a bug and aborts).
  std::span<const uint8_t> bytes(const TensorInfo& t) const;

  // Copies a tensor's nbytes into `dst` (caller-owned, at least t.nbytes bytes). Works in both
  // modes; in kPread mode it issues positioned reads, retrying on EINTR and short reads.
  // Status::runtime on an I/O error or if the file shrank since open().
  Status read(const TensorInfo& t, void* dst) const;
  // Same for an arbitrary byte range of the file, e.g. one expert's contiguous run of tensors.
  // The range must lie inside the file (a bug otherwise).
  Status read_bytes(uint64_t file_offset, uint64_t nbytes, void* dst) const;

 private:
  SafetensorsFile() = default;
  static Result<SafetensorsFile> open_unguarded(const std::filesystem::path& path, OpenMode mode);
  void release();

  std::filesystem::path path_;
  OpenMode mode_ = OpenMode::kMap;
  int fd_ = -1;
  const uint8_t* map_ = nullptr;  // whole file, PROT_READ; null in kPread mode
  int map_slot_ = -1;             // map_guard.h: a SIGBUS in map_ names this file
  uint64_t file_size_ = 0;
  uint64_t device_ = 0, inode_ = 0;  // of the file checked
  uint64_t data_offset_ = 0;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> by_name_;
};

// "[2, 3, 4]" for messages.
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace ktier::format
