#include "format/safetensors_writer.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "format/safetensors.h"
#include "io/output_file.h"
#include "io/read_file.h"

namespace ktier::format {
namespace {

// Appends at or above this size skip the staging buffer (one write per large chunk).
constexpr size_t kDirectWriteBytes = 256u << 10;
constexpr size_t kBufferBytes = 1u << 20;

using io::errno_text;

// A partial file of a killed writer (Partial::kUnique) is left behind, as large as the file it
// was writing; the next writer of the same path removes those whose process is gone. A file
// unchanged for this long, too: a pid of another pid namespace sharing the folder looks gone
// from here, and this keeps its live writer's file.
constexpr auto kDeadPartialAge = std::chrono::minutes(10);

// Removes "<stem>.<pid>-<n>" files (the names a writer makes, spelled exactly so; regular
// files, never a symlink) whose pid is no other process here and that are older than
// kDeadPartialAge. Best effort: what cannot be read or removed is left.
void remove_dead_partials(const std::filesystem::path& stem) {
  namespace fs = std::filesystem;
  const std::string prefix = stem.filename().string() + ".";
  std::error_code ec;
  fs::directory_iterator it(stem.has_parent_path() ? stem.parent_path() : fs::path("."), ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const char* const end = name.data() + name.size();
    pid_t pid = 0;
    uint64_t n = 0;
    std::from_chars_result r = std::from_chars(name.data() + prefix.size(), end, pid);
    if (r.ec != std::errc() || pid <= 0 || r.ptr == end || *r.ptr != '-') continue;
    r = std::from_chars(r.ptr + 1, end, n);
    if (r.ec != std::errc() || r.ptr != end ||
        name != prefix + std::to_string(pid) + "-" + std::to_string(n))
      continue;
    // Alive (or not ours to signal): kept. This process's own pid is an earlier process's
    // (a container's PID 1 restarted); its own partial being written is never 10 minutes old.
    if (pid != ::getpid() && (::kill(pid, 0) == 0 || errno != ESRCH)) continue;
    std::error_code file_ec;
    if (!fs::is_regular_file(it->symlink_status(file_ec)) || file_ec) continue;
    const auto changed = fs::last_write_time(it->path(), file_ec);
    if (file_ec || fs::file_time_type::clock::now() - changed < kDeadPartialAge) continue;
    if (fs::remove(it->path(), file_ec))
      spdlog::info("removed {}: a partial file of process {}, which ended before finishing it",
                   it->path().string(), pid);
  }
}

Status validate_decls(const std::filesystem::path& path, const std::vector<TensorDecl>& tensors) {
  std::set<std::string> seen;
  for (const auto& t : tensors) {
    if (t.name.empty()) return Status::runtime(path.string() + ": a tensor has an empty name");
    if (t.name == "__metadata__")
      return Status::runtime(path.string() + ": '__metadata__' is reserved, not a tensor name");
    if (!seen.insert(t.name).second)
      return Status::runtime(path.string() + ": tensor '" + t.name + "' is declared twice");
    for (int64_t d : t.shape)
      if (d < 0)
        return Status::runtime(path.string() + ": tensor '" + t.name + "' has a negative dimension");
  }
  return Status::ok();
}

}  // namespace

uint64_t TensorDecl::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

std::string SafetensorsWriter::header_json(const std::vector<TensorDecl>& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps members in insertion order, i.e. file order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = std::string(dtype_name(t.dtype));
    entry["shape"] = t.shape;
    entry["data_offsets"] = {offset, offset + t.nbytes()};
    offset += t.nbytes();
    header[t.name] = std::move(entry);
  }
  // `replace` instead of throwing on a name that is not valid UTF-8.
  std::string text = header.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

Result<SafetensorsWriter> SafetensorsWriter::create(
    const std::filesystem::path& path, std::vector<TensorDecl> tensors,
    const std::map<std::string, std::string>& metadata, Partial partial) {
  KTIER_RETURN_IF_ERROR(validate_decls(path, tensors));
  SafetensorsWriter w;
  w.path_ = path;
  uint64_t end = 0;
  for (const auto& t : tensors) {
    end += t.nbytes();
    w.ends_.push_back(end);
  }
  w.data_bytes_ = end;
  const std::string header = header_json(tensors, metadata);
  if (header.size() > kMaxHeaderBytes)  // no reader (ours included) would open the file
    return Status::usage("cannot write " + path.string() + ": its header of " +
                         std::to_string(tensors.size()) + " tensors takes " +
                         std::to_string(header.size()) + " bytes, over the " +
                         std::to_string(kMaxHeaderBytes) + "-byte limit of safetensors readers");
  w.header_bytes_ = header.size();
  w.tensors_ = std::move(tensors);

  w.partial_path_ = path;
  w.partial_path_ += ".partial";
  if (partial == Partial::kShared) {
    KTIER_ASSIGN_OR_RETURN(w.fd_, io::create_partial_file(w.partial_path_));
  } else {  // a name no other writer uses (pid and counter), created exclusively; a name left
            // by a killed writer of the same pid (a container's pid 1) is passed over
    static std::atomic<uint64_t> next_unique{0};
    const std::filesystem::path stem = w.partial_path_;
    remove_dead_partials(stem);
    for (int attempt = 0; w.fd_ < 0; ++attempt) {
      w.partial_path_ = stem;
      w.partial_path_ += "." + std::to_string(::getpid()) + "-" + std::to_string(next_unique++);
      w.fd_ = ::open(w.partial_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (w.fd_ < 0 && (errno != EEXIST || attempt == 1000)) {
        const int err = errno;  // before the message's allocations
        return Status::runtime("cannot create " + w.partial_path_.string() + ": " +
                               errno_text(err));
      }
    }
  }
  w.buffer_.reserve(kBufferBytes);
  uint8_t len_le[8];
  for (int i = 0; i < 8; ++i) len_le[i] = static_cast<uint8_t>(w.header_bytes_ >> (8 * i));
  KTIER_RETURN_IF_ERROR(w.write_fd(len_le, 8));
  KTIER_RETURN_IF_ERROR(w.write_fd(header.data(), header.size()));
  return w;
}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& other) noexcept { *this = std::move(other); }

SafetensorsWriter& SafetensorsWriter::operator=(SafetensorsWriter&& other) noexcept {
  if (this != &other) {
    abandon();
    path_ = std::move(other.path_);
    partial_path_ = std::move(other.partial_path_);
    fd_ = std::exchange(other.fd_, -1);
    tensors_ = std::move(other.tensors_);
    ends_ = std::move(other.ends_);
    header_bytes_ = other.header_bytes_;
    data_bytes_ = other.data_bytes_;
    written_ = other.written_;
    buffer_ = std::move(other.buffer_);
    finished_ = std::exchange(other.finished_, true);
    skipped_ = other.skipped_;
  }
  return *this;
}

SafetensorsWriter::~SafetensorsWriter() { abandon(); }

void SafetensorsWriter::abandon() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
    if (!finished_) ::unlink(partial_path_.c_str());
  }
}

Status SafetensorsWriter::write_fd(const void* data, size_t n) {
  return io::write_all(fd_, data, n, partial_path_);
}

Status SafetensorsWriter::flush_buffer() {
  if (buffer_.empty()) return Status::ok();
  Status s = write_fd(buffer_.data(), buffer_.size());
  buffer_.clear();
  return s;
}

std::string SafetensorsWriter::tensor_at(uint64_t offset) const {
  for (size_t i = 0; i < ends_.size(); ++i)
    if (offset < ends_[i]) return "'" + tensors_[i].name + "'";
  return "(past the last tensor)";
}

Status SafetensorsWriter::append(const void* data, size_t n) {
  if (fd_ < 0 || finished_)
    return Status::runtime(path_.string() + ": append after the writer was finished or failed");
  if (n > data_bytes_ - written_) {
    return Status::runtime(path_.string() + ": " + std::to_string(n) + " bytes appended at data offset " +
                           std::to_string(written_) + " in tensor " + tensor_at(written_) +
                           ", but only " + std::to_string(data_bytes_ - written_) +
                           " bytes remain of the declared " + std::to_string(data_bytes_));
  }
  if (n >= kDirectWriteBytes) {
    KTIER_RETURN_IF_ERROR(flush_buffer());
    KTIER_RETURN_IF_ERROR(write_fd(data, n));
  } else {
    if (buffer_.size() + n > kBufferBytes) KTIER_RETURN_IF_ERROR(flush_buffer());
    const auto* p = static_cast<const uint8_t*>(data);
    buffer_.insert(buffer_.end(), p, p + n);
  }
  written_ += n;
  return Status::ok();
}

Status SafetensorsWriter::skip(uint64_t n) {
  if (fd_ < 0 || finished_)
    return Status::runtime(path_.string() + ": skip after the writer was finished or failed");
  if (n > data_bytes_ - written_)
    return Status::runtime(path_.string() + ": " + std::to_string(n) +
                           " bytes skipped at data offset " + std::to_string(written_) +
                           ", but only " + std::to_string(data_bytes_ - written_) +
                           " bytes remain of the declared " + std::to_string(data_bytes_));
  KTIER_RETURN_IF_ERROR(flush_buffer());
  if (::lseek(fd_, static_cast<off_t>(n), SEEK_CUR) < 0) {
    const int err = errno;
    return Status::runtime("cannot seek in " + partial_path_.string() + ": " + errno_text(err));
  }
  written_ += n;
  skipped_ = true;
  return Status::ok();
}

Status SafetensorsWriter::finish() {
  if (fd_ < 0 || finished_)
    return Status::runtime(path_.string() + ": finish after the writer was finished or failed");
  if (written_ != data_bytes_) {
    const Status s = Status::runtime(
        path_.string() + ": only " + std::to_string(written_) + " of " + std::to_string(data_bytes_) +
        " data bytes were written; tensor " + tensor_at(written_) + " is incomplete");
    abandon();
    return s;
  }
  Status s = flush_buffer();
  // Bytes skipped at the end were never written: the length comes from here.
  if (s.is_ok() && skipped_ && ::ftruncate(fd_, static_cast<off_t>(file_bytes())) != 0) {
    const int err = errno;
    s = Status::runtime("cannot set the length of " + partial_path_.string() + ": " +
                        errno_text(err));
  }
  // The bytes on disk before the name points at them: a power loss after the rename must not
  // leave FILE empty or partly written (a prompt cache read so is refused, not redone).
  if (s.is_ok() && ::fsync(fd_) != 0) {
    const int err = errno;
    s = Status::runtime("cannot fsync " + partial_path_.string() + ": " + errno_text(err));
  }
  if (!s.is_ok()) {
    abandon();
    return s;
  }
  if (::close(fd_) != 0) {
    const int err = errno;
    fd_ = -1;
    ::unlink(partial_path_.c_str());
    return Status::runtime("cannot close " + partial_path_.string() + ": " + errno_text(err));
  }
  fd_ = -1;
  if (::rename(partial_path_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(partial_path_.c_str());
    return Status::runtime("cannot rename " + partial_path_.string() + " to " + path_.string() +
                           ": " + errno_text(err));
  }
  finished_ = true;
  return Status::ok();
}

}  // namespace ktier::format
