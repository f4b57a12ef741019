#pragma once
// Streaming safetensors writer (K3-MODEL.md §3.2), for `ktier synth` and test fixtures.
//
// A file is described up front (tensor names, dtypes and shapes, in file order); the header is
// written at once, then the tensors' bytes are streamed in that order in chunks of any size, so a
// multi-GB tensor never has to sit in memory whole (or passed over with skip(), left as a hole
// that reads as zeros):
//
//   std::vector<TensorDecl> decls = {{"a", DType::kBF16, {4096, 4096}}, {"b", DType::kF32, {8}}};
//   KTIER_ASSIGN_OR_RETURN(auto w, SafetensorsWriter::create(dir / "x.safetensors", decls));
//   while (...) KTIER_RETURN_IF_ERROR(w.append(chunk.data(), chunk.size()));
//   KTIER_RETURN_IF_ERROR(w.finish());
//
// Contracts:
//  * The header is compact JSON (`{"name":{"dtype":"BF16","shape":[..],"data_offsets":[b,e]},..}`,
//    the spelling of the released shards), tensors in declared order, data ranges back to back
//    from 0, space-padded so that N is a multiple of 8 like the release. `__metadata__` is
//    written only when metadata is given (the release has none).
//  * Bytes go to "<path>.partial" (or a name of this process's own, Partial::kUnique); finish()
//    checks that exactly the declared number of bytes
//    arrived and renames the file to <path>. A writer destroyed before finish() (an error, an
//    early return) closes and deletes the partial file, so a complete-looking file at <path> is
//    always complete. There is no fsync: this protects against interrupted runs, not power loss.
//  * Every failure is a Status, never an exception. I/O failures are Status::runtime (exit 1) and
//    name the file; appending more bytes than declared, finishing short, or an invalid
//    declaration (empty, duplicate or reserved name, negative dimension) is Status::runtime too,
//    naming the file and the tensor.
//  * Not thread-safe: one thread drives one writer. Move-only.

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace ktier::format {

struct TensorDecl {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // row-major; empty = rank 0 (one element)

  uint64_t numel() const;
  uint64_t nbytes() const { return numel() * dtype_size(dtype); }
};

class SafetensorsWriter {
 public:
  // Where the bytes go until finish(): kShared is "<path>.partial" (a stale one, or a symlink
  // there, is removed first: never written through), for one writer of `path` at a time;
  // kUnique is "<path>.partial.<pid>-<n>", created exclusively, for files that several
  // processes may write at once (a prompt cache): each renames a whole file, the last one wins;
  // one left by a writer that was killed (its process gone, the file unchanged for 10 minutes)
  // is removed by the next kUnique writer of `path`.
  enum class Partial { kShared, kUnique };
  // Validates the declarations, creates the partial file and writes the 8-byte length and the
  // header. The parent directory must exist.
  static Result<SafetensorsWriter> create(const std::filesystem::path& path,
                                          std::vector<TensorDecl> tensors,
                                          const std::map<std::string, std::string>& metadata = {},
                                          Partial partial = Partial::kShared);

  // The padded header text exactly as create() would write it (N = its size). Lets a caller
  // compute file sizes before writing anything. Requires valid declarations (see create()).
  static std::string header_json(const std::vector<TensorDecl>& tensors,
                                 const std::map<std::string, std::string>& metadata = {});

  SafetensorsWriter(SafetensorsWriter&& other) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&& other) noexcept;
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  ~SafetensorsWriter();

  // Appends the next `n` bytes of the data section (they may span tensor boundaries).
  Status append(const void* data, size_t n);
  // Passes over the next `n` bytes of the data section without writing them: they read as
  // zeros, and take no disk space where the file system keeps holes (a sparse file). The same
  // bound as append().
  Status skip(uint64_t n);
  // Completes the file: all declared bytes must have arrived (appended or skipped). After
  // success the writer is closed; calling append(), skip() or finish() again is an error.
  Status finish();

  const std::filesystem::path& path() const { return path_; }
  uint64_t header_bytes() const { return header_bytes_; }  // N
  uint64_t data_bytes() const { return data_bytes_; }      // sum of the tensors' bytes
  uint64_t file_bytes() const { return 8 + header_bytes_ + data_bytes_; }
  uint64_t data_written() const { return written_; }

 private:
  SafetensorsWriter() = default;
  Status flush_buffer();
  Status write_fd(const void* data, size_t n);
  // Name of the tensor that data byte `offset` belongs to (for messages).
  std::string tensor_at(uint64_t offset) const;
  void abandon();  // close and delete the partial file

  std::filesystem::path path_;
  std::filesystem::path partial_path_;
  int fd_ = -1;
  std::vector<TensorDecl> tensors_;
  std::vector<uint64_t> ends_;  // ends_[i] = data offset one past tensor i
  uint64_t header_bytes_ = 0;
  uint64_t data_bytes_ = 0;
  uint64_t written_ = 0;
  // Small appends are gathered here so that many tiny tensors cost few system calls.
  std::vector<uint8_t> buffer_;
  bool finished_ = false;
  bool skipped_ = false;  // skip() left bytes unwritten: finish() sets the file's length
};

}  // namespace ktier::format
