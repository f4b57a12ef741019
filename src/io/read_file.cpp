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

Result<ReadFile> ReadFile::open(const std::filesystem::path& path, DirectMode mode) {
  ReadFile f;
  f.path_ = path.string();
  f.id_ = g_next_file_id.fetch_add(1, std::memory_order_relaxed);
  const int base_flags = O_RDONLY | O_CLOEXEC;
  std::string refused;  // why O_DIRECT was refused, empty if it was not tried or works

  if (mode != DirectMode::kBuffered) {
    f.fd_ = ::open(f.path_.c_str(), base_flags | O_DIRECT);
    if (f.fd_ < 0) {
      if (errno != EINVAL) {
        return Status::runtime("cannot open " + f.path_ + ": " + errno_text(errno));
      }
      refused = "open with O_DIRECT failed: " + errno_text(EINVAL);
    } else {
      f.direct_ = true;
    }
  }
  if (f.fd_ < 0) {
    f.fd_ = ::open(f.path_.c_str(), base_flags);
    if (f.fd_ < 0) return Status::runtime("cannot open " + f.path_ + ": " + errno_text(errno));
  }

  struct stat st {};
  if (fstat(f.fd_, &st) != 0) {
    return Status::runtime("cannot stat " + f.path_ + ": " + errno_text(errno));
  }
  if (!S_ISREG(st.st_mode)) return Status::runtime("not a regular file: " + f.path_);
  f.size_ = static_cast<uint64_t>(st.st_size);

  if (f.direct_) {
    const int64_t align = query_dio_alignment(f.fd_);
    if (align == 0) {
      refused = "statx reports no direct-I/O support for this file";
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
        f.fd_ = ::open(f.path_.c_str(), base_flags);
        if (f.fd_ < 0) return Status::runtime("cannot open " + f.path_ + ": " + errno_text(errno));
      }
    }
  }
  if (!refused.empty()) {
    if (mode == DirectMode::kDirect) {
      return Status::runtime("O_DIRECT was requested for " + f.path_ + " but " + refused +
                             " (use buffered I/O, or put the file on a filesystem such as "
                             "ext4 or xfs)");
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
