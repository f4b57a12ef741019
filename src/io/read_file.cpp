#include "io/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "common/check.h"
#include "io/aligned_buffer.h"

namespace ktier::io {
namespace {

std::atomic<uint64_t> g_next_file_id{1};
std::atomic<bool> g_fallback_logged{false};

void log_direct_fallback_once(const std::string& path, const std::string& why) {
  if (!g_fallback_logged.exchange(true)) {
    spdlog::warn("O_DIRECT is not available for {} ({}); reading through the page cache "
                 "(buffered). Said once per process; later files may fall back silently.",
                 path, why);
  }
}

// Direct-I/O alignment of an open file. 0 = the filesystem says this file cannot do direct I/O;
// -1 = unknown (no STATX_DIOALIGN on this kernel or filesystem).
int64_t query_dio_alignment(int fd) {
#ifdef STATX_DIOALIGN
  struct statx sx {};
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
    if (sx.stx_dio_mem_align == 0 || sx.stx_dio_offset_align == 0) return 0;
    return std::max(sx.stx_dio_mem_align, sx.stx_dio_offset_align);
  }
#endif
  (void)fd;
  return -1;
}

// Without STATX_DIOALIGN some filesystems accept O_DIRECT at open() and refuse the first read
// with EINVAL, so read one aligned block to find out. true = direct reads work.
bool probe_direct_read(int fd, uint64_t size) {
  if (size == 0) return true;
  auto buf = AlignedBuffer::allocate(kDefaultAlignment);
  if (!buf.is_ok()) return false;
  for (;;) {
    const ssize_t n = pread(fd, buf->data(), kDefaultAlignment, 0);
    if (n >= 0) return true;
    if (errno != EINTR && errno != EAGAIN) return errno != EINVAL;
  }
}

}  // namespace

std::string errno_text(int err) {
  const char* name = strerrorname_np(err);
  return std::string(std::strerror(err)) + " (" + (name ? name : std::to_string(err)) + ")";
}

namespace {
// What a file that is not a regular one is, for messages.
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "not a regular file";
}

// open_regular_file, or with `pipes` also a pipe (open_file_or_pipe).
Result<int> open_checked(const std::filesystem::path& path, int extra_flags, bool pipes,
                         int* open_errno) {
  const std::string name = path.string();
  const int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | extra_flags);
  if (fd < 0) {
    const int err = errno;
    if (open_errno) *open_errno = err;
    return Status::runtime(name + ": cannot open: " + errno_text(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::runtime(name + ": cannot stat: " + errno_text(err));
  }
  if (!S_ISREG(st.st_mode) && !(pipes && S_ISFIFO(st.st_mode))) {
    ::close(fd);
    const char* kind = kind_of(st.st_mode);
    return Status::usage(name + ": is " + (kind[0] == 'n' ? "" : std::string(kind) + ", ") +
                         (pipes ? "not a file or a pipe" : "not a regular file"));
  }
  // Blocking again: O_NONBLOCK would make io_uring fail reads with EAGAIN instead of waiting.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::runtime(name + ": cannot clear O_NONBLOCK: " + errno_text(err));
  }
  return fd;
}
}  // namespace

Result<int> open_regular_file(const std::filesystem::path& path, int extra_flags,
                              int* open_errno) {
  return open_checked(path, extra_flags, /*pipes=*/false, open_errno);
}

Result<int> open_file_or_pipe(const std::filesystem::path& path, int* open_errno) {
  return open_checked(path, 0, /*pipes=*/true, open_errno);
}

Result<std::string> read_whole(int fd, const std::string& what, SizeLimit limit) {
  KTIER_CHECK(limit.refuse != nullptr);
  const std::string most = std::to_string(limit.bytes) + " bytes a file of its kind may hold";
  std::string out;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    if (static_cast<uint64_t>(st.st_size) > limit.bytes)
      return limit.refuse(what + ": " + std::to_string(st.st_size) + " bytes, more than the " +
                          most);
    out.reserve(static_cast<size_t>(st.st_size));
  }
  char buf[1 << 16];
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, at);
    const int err = n < 0 ? errno : 0;  // before the message's allocations
    if (err == EINTR) continue;
    if (n < 0) return Status::runtime(what + ": read error: " + errno_text(err));
    if (n == 0) return out;
    if (static_cast<uint64_t>(n) > limit.bytes - out.size())
      return limit.refuse(what + ": read past the " + most);
    out.append(buf, static_cast<size_t>(n));
    at += n;
  }
}

Result<bool> path_exists(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return true;
  const int err = errno;
  if (err == ENOENT || err == ENOTDIR) return false;
  return Status::runtime(path.string() + ": cannot access: " + errno_text(err));
}

Result<std::string> read_regular_file(const std::filesystem::path& path, SizeLimit limit) {
  KTIER_ASSIGN_OR_RETURN(const int fd, open_regular_file(path));
  Result<std::string> bytes = read_whole(fd, path.string(), limit);
  ::close(fd);
  return bytes;
}

Result<ReadFile> ReadFile::open(const std::filesystem::path& path, DirectMode mode) {
  ReadFile f;
  f.path_ = path.string();
  f.id_ = g_next_file_id.fetch_add(1, std::memory_order_relaxed);
  std::string refused;  // why O_DIRECT was refused, empty if it was not tried or works

  if (mode != DirectMode::kBuffered) {
    int open_errno = 0;
    Result<int> fd = open_regular_file(path, O_DIRECT, &open_errno);
    if (fd.is_ok()) {
      f.fd_ = *fd;
      f.direct_ = true;
    } else if (open_errno != EINVAL) {
      return fd.status();
    } else {
      refused = "open with O_DIRECT failed: " + errno_text(EINVAL);
    }
  }
  if (f.fd_ < 0) {
    KTIER_ASSIGN_OR_RETURN(f.fd_, open_regular_file(path));
  }

  struct stat st {};
  if (fstat(f.fd_, &st) != 0) {
    const int err = errno;  // before the message's allocations
    return Status::runtime("cannot stat " + f.path_ + ": " + errno_text(err));
  }
  f.size_ = static_cast<uint64_t>(st.st_size);

  if (f.direct_) {
    const int64_t align = query_dio_alignment(f.fd_);
    if (align == 0) {
      refused = "statx reports no direct-I/O support for this file";
    } else if (align > int64_t{kMaxDirectAlignment} || (align > 0 && (align & (align - 1)) != 0)) {
      refused = "statx reports a direct-I/O alignment of " + std::to_string(align) +
                " bytes (ktier reads directly at powers of two up to 32 KiB)";
    } else if (align < 0 && !probe_direct_read(f.fd_, f.size_)) {
      refused = "a direct read failed with " + errno_text(EINVAL);
    } else {
      f.alignment_ = static_cast<uint32_t>(align > 0 ? align : int64_t{kDefaultAlignment});
    }
    if (!refused.empty()) {
      // Reopen without O_DIRECT rather than fcntl(F_SETFL): not every filesystem lets
      // F_SETFL clear O_DIRECT, and a fresh descriptor has no leftover state.
      ::close(f.fd_);
      f.fd_ = -1;
      f.direct_ = false;
      f.alignment_ = 1;
      if (mode == DirectMode::kAuto) {
        KTIER_ASSIGN_OR_RETURN(f.fd_, open_regular_file(path));
        if (fstat(f.fd_, &st) != 0) {  // the path may name another file by now (a rename)
          const int err = errno;
          return Status::runtime("cannot stat " + f.path_ + ": " + errno_text(err));
        }
        f.size_ = static_cast<uint64_t>(st.st_size);
      }
    }
  }
  if (!refused.empty()) {
    if (mode == DirectMode::kDirect) {
      return Status::runtime("O_DIRECT was requested for " + f.path_ + " but " + refused +
                             (refused.starts_with("statx reports a direct-I/O alignment")
                                  ? " (use buffered I/O)"
                                  : " (use buffered I/O, or put the file on a filesystem such "
                                    "as ext4 or xfs)"));
    }
    log_direct_fallback_once(f.path_, refused);
  }
  return f;
}

ReadFile::ReadFile(ReadFile&& other) noexcept
    : fd_(other.fd_),
      path_(std::move(other.path_)),
      size_(other.size_),
      direct_(other.direct_),
      alignment_(other.alignment_),
      id_(other.id_) {
  other.fd_ = -1;
}

ReadFile& ReadFile::operator=(ReadFile&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    size_ = other.size_;
    direct_ = other.direct_;
    alignment_ = other.alignment_;
    id_ = other.id_;
    other.fd_ = -1;
  }
  return *this;
}

ReadFile::~ReadFile() { release(); }

void ReadFile::release() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace ktier::io
