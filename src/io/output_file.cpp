#include "io/output_file.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "common/interrupt.h"
#include "io/read_file.h"

namespace ktier::io {
namespace {

// STDOUT_FILENO or STDERR_FILENO when `target` is the file (or pipe) that descriptor writes to,
// else -1.
int own_output_fd(const struct stat& target) {
  for (int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    struct stat open_file {};
    if (::fstat(fd, &open_file) == 0 && open_file.st_dev == target.st_dev &&
        open_file.st_ino == target.st_ino)
      return fd;
  }
  return -1;
}

}  // namespace

Status check_can_write(const std::string& flag, const std::string& path) {
  if (path.empty()) return Status::ok();
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto refuse = [&](const std::string& why) {
    return Status::runtime(flag + ": cannot write " + path + ": " + why);
  };
  // A path that can never name an output file is the command line's mistake, as an input
  // folder given for a file is.
  const auto misnamed = [&](const std::string& why) {
    return Status::usage(flag + ": cannot write " + path + ": " + why);
  };
  const fs::file_status st = fs::status(path, ec);  // follows symlinks
  // Anything but "no such file" (a symlink loop, a name too long, a file used as a folder)
  // will not get better by the end of the work.
  if (ec && ec != std::errc::no_such_file_or_directory) return refuse(ec.message());
  if (fs::is_directory(st)) return misnamed("it is a directory");
  // /proc and /sys files open for writing and then refuse the bytes (or, as root, change the
  // kernel's settings): no output goes there.
  {
    const fs::path existing = fs::exists(st) ? fs::path(path)
                              : follow_dangling_symlinks(path).parent_path();
    struct statfs fs_info {};
    if (::statfs(existing.empty() ? "." : existing.c_str(), &fs_info) == 0 &&
        (fs_info.f_type == PROC_SUPER_MAGIC || fs_info.f_type == SYSFS_MAGIC))
      return misnamed("/proc and /sys are not for output files");
  }
  if (fs::exists(st)) {
    // A FIFO or a device is not opened here: closing a FIFO's write end would end its reader's
    // input before the real output comes.
    if (!fs::is_regular_file(st))
      return ::access(path.c_str(), W_OK) == 0 ? Status::ok() : refuse(errno_text(errno));
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);  // no O_TRUNC: left as it is
    if (fd < 0) return refuse(errno_text(errno));
    ::close(fd);
    return Status::ok();
  }
  // A new file (or a dangling symlink's target): a probe file of another name is created and
  // removed in the folder it will live in, so no name anyone may be using is touched.
  const fs::path target = follow_dangling_symlinks(path);
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string probe = (folder / ".ktier-write-probe-XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) return refuse(errno_text(errno));
  ::close(fd);
  ::unlink(probe.c_str());
  return Status::ok();
}

Result<std::FILE*> open_output_stream(const std::string& path, std::string_view what) {
  const auto failed = [&](int err) {
    return Status::runtime(path + ": " + std::string(what) + ": " + errno_text(err));
  };
  struct stat target {};
  if (::stat(path.c_str(), &target) != 0 || !S_ISFIFO(target.st_mode)) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return failed(errno);
    return f;
  }
  // A Ctrl-C before the call (the run stopped, its report still to write) does not end the wait;
  // one during it does.
  const bool stopped_before = InterruptRequest::requested();
  for (bool said = false;;) {
    // O_NONBLOCK: ENXIO at once while no process has the FIFO open for reading.
    const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
      const int flags = ::fcntl(fd, F_GETFL);
      std::FILE* f = flags >= 0 && ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == 0
                         ? ::fdopen(fd, "wb")
                         : nullptr;
      if (f) return f;
      const int err = errno;
      ::close(fd);
      return failed(err);
    }
    if (errno != ENXIO && errno != EINTR) return failed(errno);
    if (!stopped_before && InterruptRequest::requested())
      return Status::interrupted("stopped (Ctrl-C or SIGTERM) waiting for a process to read " +
                                 path);
    if (!said) spdlog::info("waiting for a process to read the FIFO {} (Ctrl-C stops)", path);
    said = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Status write_output_file(const std::string& path, std::string_view bytes) {
  struct stat target {};
  if (::stat(path.c_str(), &target) == 0) {
    if (const int fd = own_output_fd(target); fd >= 0) {
      std::FILE* stream = fd == STDOUT_FILENO ? stdout : stderr;
      if (std::fwrite(bytes.data(), 1, bytes.size(), stream) != bytes.size() ||
          std::fflush(stream) != 0) {
        const int err = errno;  // before the message's allocations
        return Status::runtime(path + ": write error: " + errno_text(err));
      }
      return Status::ok();
    }
  }
  KTIER_ASSIGN_OR_RETURN(std::FILE* f, open_output_stream(path, "cannot open for writing"));
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size() &&
                  std::fflush(f) == 0;
  const int write_err = errno;
  const bool closed = std::fclose(f) == 0;
  const int err = ok ? errno : write_err;  // before the message's allocations
  if (!closed || !ok) return Status::runtime(path + ": write error: " + errno_text(err));
  return Status::ok();
}

Status write_all(int fd, const void* data, size_t n, const std::filesystem::path& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t r = ::write(fd, p, n);
    const int err = r < 0 ? errno : 0;  // before the message's allocations
    if (err == EINTR) continue;
    if (r < 0) return Status::runtime("cannot write " + path.string() + ": " + errno_text(err));
    p += r;
    n -= static_cast<size_t>(r);
  }
  return Status::ok();
}

Status check_not_own_stdout(const std::string& flag, const std::string& path) {
  struct stat target {};
  if (path.empty() || ::stat(path.c_str(), &target) != 0) return Status::ok();
  if (!S_ISREG(target.st_mode) && !S_ISFIFO(target.st_mode)) return Status::ok();
  const int fd = own_output_fd(target);
  if (fd < 0) return Status::ok();
  return Status::usage(flag + ": " + path + " is this process's own standard " +
                       (fd == STDOUT_FILENO ? "output" : "error") +
                       ": give a file of its own (the output is binary)");
}

std::filesystem::path follow_dangling_symlinks(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(path, ec)) return path;  // resolvable: the system follows it
  fs::path p = path;
  if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();  // "link/" names the link
  for (int hops = 0; hops < 40 && fs::is_symlink(fs::symlink_status(p, ec)); ++hops) {
    const fs::path link = fs::read_symlink(p, ec);
    if (ec) break;
    p = link.is_absolute() ? link : p.parent_path() / link;
  }
  return p;
}

Status create_output_dir(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(follow_dangling_symlinks(dir), ec);
  if (ec) return Status::runtime("cannot create " + dir.string() + ": " + ec.message());
  return Status::ok();
}

Status remove_if_present(const std::filesystem::path& path) {
  if (::unlink(path.c_str()) == 0 || errno == ENOENT) return Status::ok();
  const int err = errno;  // before the message's allocations
  return Status::runtime("cannot remove " + path.string() + ": " + errno_text(err));
}

Result<int> create_partial_file(const std::filesystem::path& path) {
  KTIER_RETURN_IF_ERROR(remove_if_present(path));
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    return Status::runtime("cannot create " + path.string() + ": " + errno_text(err));
  }
  return fd;
}

}  // namespace ktier::io
