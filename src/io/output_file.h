#pragma once
// Output files of the commands (reports, logits, CSV/JSON tables): checked before the work and
// written whole after it, the same way for every command and below the CLI, so that no writer
// truncates a file early or erases what this process already printed to it.
//
// Threads: none of these keeps state; callers serialize writes to the same path.

#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

#include "common/status.h"

namespace ktier::io {

// `path` with a chain of symlinks that ends nowhere followed (up to 40 links) to the name a write
// through it would create; any other path as it is.
std::filesystem::path follow_dangling_symlinks(const std::filesystem::path& path);

// Status::runtime (exit 1) "FLAG: cannot write PATH: <errno>" unless `path` (empty: no output)
// can be written (Status::usage, exit 2, for a folder or a /proc or /sys path, which never can): an existing regular file is opened for writing without truncating it (a run
// that fails later leaves it as it was), a FIFO or device is checked with access(W_OK) only,
// and for a new file a probe of another name is created and removed in its folder. Called
// before the work, so that an output which cannot be written (a read-only file system, /proc) is
// refused before minutes of decoding or benchmarking, not after.
Status check_can_write(const std::string& flag, const std::string& path);

// Opens `path` for writing from its start (created or truncated), as fopen "wb"; the caller owns
// the stream. A FIFO no process reads yet is waited for, as any writer's open() waits, but said
// so once (a log line) and polled, so that Ctrl-C (or serve's SIGTERM) under a live
// InterruptRequest ends the wait (Status::interrupted), where a blocked open() outlasted it; one
// already requested when it is called (a run stopped, writing its report) does not.
// Other failures: Status::runtime "PATH: WHAT: <errno text>".
Result<std::FILE*> open_output_stream(const std::string& path, std::string_view what);

// Writes `bytes` as the file `path` (created or truncated), Status::runtime naming it on failure.
// A path that is this process's own stdout or stderr (/dev/stdout, /dev/stderr, or the file they
// are redirected to) is written through that stream instead, after what it already holds:
// truncating it would erase the text printed before.
Status write_output_file(const std::string& path, std::string_view bytes);

// For binary outputs written as a stream (a trace): Status::usage "FLAG: PATH is this process's
// own standard output or error ..." when `path` is the regular file or pipe our stdout or stderr
// goes to (/dev/stdout, or the file they are redirected to): the bytes would be mixed with the
// text printed there, and truncating the file would erase it. A device (/dev/null) is fine.
Status check_not_own_stdout(const std::string& flag, const std::string& path);

// Removes `path` (a file or a symlink) if it is there: ok when it was or is gone;
// Status::runtime (exit 1) "cannot remove PATH: <errno text>" otherwise.
Status remove_if_present(const std::filesystem::path& path);

// A writer's partial file (renamed over its real name when whole): `path` removed if it is there
// (a stale partial file, or a symlink, which is never written through), then created
// exclusively for writing (mode 0644 less the umask). Returns the descriptor (O_CLOEXEC), owned
// by the caller. Status::runtime (exit 1) naming the path and the errno text.
Result<int> create_partial_file(const std::filesystem::path& path);

// Writes all `n` bytes at `data` to `fd` (short writes continued, EINTR retried). Status::runtime
// (exit 1) "cannot write PATH: <errno text>", `path` naming the file for the message.
Status write_all(int fd, const void* data, size_t n, const std::filesystem::path& path);

// Creates the output folder `dir` and its parents (`ktier synth -o`, `ktier pack -o`); an
// existing folder is fine. A dangling symlink creates the folder it names, as writing a file
// through one creates the file. Status::runtime (exit 1) "cannot create DIR: <why>".
Status create_output_dir(const std::filesystem::path& dir);

}  // namespace ktier::io
