#pragma once
// Output files of the commands (reports, logits, CSV/JSON tables): checked before the work and
// written whole after it, the same way for every command and below the CLI, so that no writer
// truncates a file early or erases what this process already printed to it.
//
// Threads: both functions touch only the named path (and stdout/stderr for a path that is one of
// them); callers serialize writes to the same path.

#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

#include "common/status.h"

namespace ktier::io {

// Status::runtime (exit 1) "FLAG: cannot write PATH: <errno>" unless `path` (empty: no output)
// can be written: an existing regular file is opened for writing without truncating it (a run
// that fails later leaves it as it was), a FIFO or device is checked with access(W_OK) only,
// and for a new file a probe of another name is created and removed in its folder. Called
// before the work, so that an output which cannot be written (a read-only file system, /proc) is
// refused before minutes of decoding or benchmarking, not after.
Status check_can_write(const std::string& flag, const std::string& path);

// Writes `bytes` as the file `path` (created or truncated), Status::runtime naming it on failure.
// A path that is this process's own stdout or stderr (/dev/stdout, /dev/stderr, or the file they
// are redirected to) is written through that stream instead, after what it already holds:
// truncating it would erase the text printed before.
Status write_output_file(const std::string& path, std::string_view bytes);

// An output file written in pieces and made visible whole (a trace): while open, the bytes go
// to a temporary ".NAME.partial-XXXXXX" in the folder the path resolves to (symlinks followed),
// and commit() renames it over that target, so a command that fails or is cut short leaves an
// existing file as it was. A path that exists and is not a regular file (a FIFO, /dev/null) is
// written directly. A path that is this process's own stdout or stderr (/dev/stdout, or the file
// they are redirected to) is refused with Status::usage: binary output would be mixed with the
// text. Move-only; one thread at a time.
class StagedOutputFile {
 public:
  // Status::usage for our own stdout/stderr, Status::runtime "cannot create PATH: <errno>".
  static Result<StagedOutputFile> open(const std::string& path);
  StagedOutputFile() = default;
  StagedOutputFile(StagedOutputFile&& other) noexcept;
  StagedOutputFile& operator=(StagedOutputFile&& other) noexcept;
  StagedOutputFile(const StagedOutputFile&) = delete;
  StagedOutputFile& operator=(const StagedOutputFile&) = delete;
  // Not committed: the stream is closed and the temporary removed (the target is untouched).
  ~StagedOutputFile();

  std::FILE* stream() const { return stream_; }  // null once committed
  const std::string& path() const { return path_; }
  // Flushes, closes and renames the temporary over the target; Status::runtime naming the path
  // on failure (the temporary is removed). The object holds nothing afterwards.
  Status commit();

 private:
  void discard();
  std::string path_;     // as given
  std::string target_;   // what the rename replaces (empty: written directly)
  std::string staging_;  // the temporary (empty: written directly)
  std::FILE* stream_ = nullptr;
};

// Creates the output folder `dir` and its parents (`ktier synth -o`, `ktier pack -o`); an
// existing folder is fine. A dangling symlink creates the folder it names, as writing a file
// through one creates the file. Status::runtime (exit 1) "cannot create DIR: <why>".
Status create_output_dir(const std::filesystem::path& dir);

}  // namespace ktier::io
