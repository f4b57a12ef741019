#include "io/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "io/read_file.h"

namespace ktier::io {

Status check_can_write(const std::string& flag, const std::string& path) {
  if (path.empty()) return Status::ok();
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto refuse = [&](const std::string& why) {
    return Status::runtime(flag + ": cannot write " + path + ": " + why);
  };
  const fs::file_status st = fs::status(path, ec);  // follows symlinks
  // Anything but "no such file" (a symlink loop, a name too long, a file used as a folder)
  // will not get better by the end of the work.
  if (ec && ec != std::errc::no_such_file_or_directory) return refuse(ec.message());
  if (fs::is_directory(st)) return refuse("it is a directory");
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
  fs::path target = path;
  if (fs::is_symlink(fs::symlink_status(path, ec))) {
    const fs::path link = fs::read_symlink(path, ec);
    if (!ec) target = link.is_absolute() ? link : fs::path(path).parent_path() / link;
  }
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string probe = (folder / ".ktier-write-probe-XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) return refuse(errno_text(errno));
  ::close(fd);
  ::unlink(probe.c_str());
  return Status::ok();
}

Status write_output_file(const std::string& path, std::string_view bytes) {
  struct stat target {};
  if (::stat(path.c_str(), &target) == 0) {
    for (std::FILE* stream : {stdout, stderr}) {
      struct stat open_file {};
      if (::fstat(::fileno(stream), &open_file) != 0 || open_file.st_dev != target.st_dev ||
          open_file.st_ino != target.st_ino)
        continue;
      if (std::fwrite(bytes.data(), 1, bytes.size(), stream) != bytes.size() ||
          std::fflush(stream) != 0)
        return Status::runtime(path + ": write error");
      return Status::ok();
    }
  }
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return Status::runtime(path + ": cannot open for writing: " + errno_text(errno));
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (std::fclose(f) != 0 || !ok) return Status::runtime(path + ": write error");
  return Status::ok();
}

namespace {

// True when `path` names the file behind our stdout or stderr.
bool is_own_stdout_or_stderr(const std::string& path) {
  struct stat target {};
  if (::stat(path.c_str(), &target) != 0) return false;
  for (int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    struct stat open_file {};
    if (::fstat(fd, &open_file) == 0 && open_file.st_dev == target.st_dev &&
        open_file.st_ino == target.st_ino)
      return true;
  }
  return false;
}

}  // namespace

Result<StagedOutputFile> StagedOutputFile::open(const std::string& path) {
  namespace fs = std::filesystem;
  if (is_own_stdout_or_stderr(path))
    return Status::usage(path + " is this process's own standard output or error: give a file "
                         "of its own (the output is binary)");
  StagedOutputFile f;
  f.path_ = path;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::exists(st) && !fs::is_regular_file(st)) {  // FIFO, device: no rename possible
    f.stream_ = std::fopen(path.c_str(), "wb");
    if (!f.stream_) return Status::runtime("cannot create " + path + ": " + errno_text(errno));
    return f;
  }
  // The file a rename must replace: symlinks followed (dangling ones to what they would create).
  fs::path target = path;
  for (int hops = 0; hops < 40 && fs::is_symlink(fs::symlink_status(target, ec)); ++hops) {
    const fs::path link = fs::read_symlink(target, ec);
    if (ec) break;
    target = link.is_absolute() ? link : target.parent_path() / link;
  }
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string staging =
      (folder / ("." + target.filename().string() + ".partial-XXXXXX")).string();
  const int fd = ::mkstemp(staging.data());
  if (fd < 0) return Status::runtime("cannot create " + path + ": " + errno_text(errno));
  ::fchmod(fd, 0644);  // mkstemp's 0600 would make traces unreadable to others
  f.stream_ = ::fdopen(fd, "wb");
  if (!f.stream_) {
    const int err = errno;
    ::close(fd);
    ::unlink(staging.c_str());
    return Status::runtime("cannot create " + path + ": " + errno_text(err));
  }
  f.target_ = target.string();
  f.staging_ = std::move(staging);
  return f;
}

StagedOutputFile::StagedOutputFile(StagedOutputFile&& other) noexcept { *this = std::move(other); }

StagedOutputFile& StagedOutputFile::operator=(StagedOutputFile&& other) noexcept {
  if (this == &other) return *this;
  discard();
  path_ = std::move(other.path_);
  target_ = std::move(other.target_);
  staging_ = std::move(other.staging_);
  stream_ = other.stream_;
  other.stream_ = nullptr;
  other.staging_.clear();
  return *this;
}

StagedOutputFile::~StagedOutputFile() { discard(); }

void StagedOutputFile::discard() {
  if (stream_) std::fclose(stream_);
  stream_ = nullptr;
  if (!staging_.empty()) ::unlink(staging_.c_str());
  staging_.clear();
}

Status StagedOutputFile::commit() {
  if (!stream_) return Status::runtime(path_ + ": nothing to commit");
  const bool flushed = std::fflush(stream_) == 0 && !std::ferror(stream_);
  const int err = errno;
  const bool closed = std::fclose(stream_) == 0;
  stream_ = nullptr;
  if (!flushed || !closed) {
    discard();
    return Status::runtime(path_ + ": write error: " + errno_text(flushed ? errno : err));
  }
  if (!staging_.empty() && ::rename(staging_.c_str(), target_.c_str()) != 0) {
    const int rename_err = errno;
    discard();
    return Status::runtime("cannot write " + path_ + ": " + errno_text(rename_err));
  }
  staging_.clear();
  return Status::ok();
}

Status create_output_dir(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path target = dir;
  if (fs::is_symlink(fs::symlink_status(dir, ec)) && !fs::exists(dir, ec)) {
    const fs::path link = fs::read_symlink(dir, ec);
    if (!ec) target = link.is_absolute() ? link : dir.parent_path() / link;
  }
  fs::create_directories(target, ec);
  if (ec) return Status::runtime("cannot create " + dir.string() + ": " + ec.message());
  return Status::ok();
}

}  // namespace ktier::io
