#pragma once
// Output files of the commands (reports, logits, CSV/JSON tables): checked before the work and
// written whole after it, the same way for every command and below the CLI, so that no writer
// truncates a file early or erases what this process already printed to it.
//
// Threads: both functions touch only the named path (and stdout/stderr for a path that is one of
// them); callers serialize writes to the same path.

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

// Creates the output folder `dir` and its parents (`ktier synth -o`, `ktier pack -o`); an
// existing folder is fine. A dangling symlink creates the folder it names, as writing a file
// through one creates the file. Status::runtime (exit 1) "cannot create DIR: <why>".
Status create_output_dir(const std::filesystem::path& dir);

}  // namespace ktier::io
