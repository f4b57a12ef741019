// safetensors reader. See safetensors.h for the contract.
#include "format/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/check.h"
#include "common/json_text.h"
#include "format/map_guard.h"
#include "io/read_file.h"

namespace ktier::format {
namespace {

using json = nlohmann::json;

using io::errno_text;

// Positioned read of exactly `n` bytes; retries EINTR and short reads. Returns 0 on success,
// -1 when the file ended early, or the errno of a failed read.
int pread_full(int fd, void* dst, uint64_t n, uint64_t offset) {
  auto* out = static_cast<uint8_t*>(dst);
  while (n > 0) {
    // Linux caps one read at ~2 GiB; ask for at most 1 GiB at a time.
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1ull << 30));
    const ssize_t got = ::pread(fd, out, chunk, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (got == 0) return -1;
    out += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
  return 0;
}

// A tensor entry as read from the header, before validation.
struct RawEntry {
  std::string name;
  std::optional<std::string> dtype;
  std::optional<std::vector<int64_t>> shape;
  std::optional<std::vector<uint64_t>> offsets;
};

// Streams the header JSON (nlohmann SAX) straight into TensorInfos. A DOM would cost 4x the time
// and, for ordered_json, grow quadratically with the ~5,400 members of a released shard header.
// Stops at the first problem; `error` then holds a Status::corrupt naming the file and tensor.
class HeaderSax final : public nlohmann::json_sax<json> {
 public:
  struct Parsed {
    TensorInfo info;
    uint64_t begin = 0, end = 0;
  };

  explicit HeaderSax(std::string file) : file_(std::move(file)) {}
  std::vector<Parsed> entries;
  Status error;

  bool null() override { return scalar("null"); }
  bool boolean(bool v) override { return scalar(v ? "true" : "false"); }
  bool number_integer(number_integer_t v) override {
    if (skip_ > 0) return true;
    if (level_ == kInArray && v < 0)
      return fail(where() + ": " + (field_ == "shape" ? "negative dimension " : "negative value ") +
                  std::to_string(v) + " in \"" + field_ + "\"");
    if (level_ == kInArray) return push(static_cast<uint64_t>(v));
    return scalar(std::to_string(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (skip_ > 0) return true;
    if (level_ == kInArray) return push(v);
    return scalar(std::to_string(v));
  }
  bool number_float(number_float_t, const string_t& text) override { return scalar(text); }
  bool string(string_t& v) override {
    if (skip_ > 0) return true;
    if (level_ == kInEntry && field_ == "dtype") {
      entry_.dtype = v;
      return true;
    }
    return scalar("\"" + v + "\"");
  }
  bool binary(binary_t&) override { return scalar("binary"); }

  bool start_object(std::size_t) override { return open_container(true); }
  bool start_array(std::size_t) override { return open_container(false); }
  bool end_object() override { return close_container(); }
  bool end_array() override { return close_container(); }

  bool key(string_t& k) override {
    if (skip_ > 0) return true;
    if (level_ == kInRoot) {
      entry_ = RawEntry{};
      entry_.name = k;
    } else if (level_ == kInEntry) {
      // A field given twice is ambiguous (JSON parsers differ: first or last wins).
      if ((k == "dtype" && entry_.dtype) || (k == "shape" && entry_.shape) ||
          (k == "data_offsets" && entry_.offsets))
        return fail(where() + ": \"" + k + "\" given twice");
      field_ = k;
    }
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    return fail(file_ + ": header is not valid UTF-8 JSON: " + e.what());
  }

 private:
  // Where the parser is: outside the root, in the root object (keys are tensor names), in one
  // entry object (keys are fields), or in the shape / data_offsets array of an entry.
  enum Level { kOutside, kInRoot, kInEntry, kInArray };

  std::string where() const { return file_ + ": tensor '" + entry_.name + "'"; }
  bool fail(std::string msg) {
    if (error.is_ok()) error = Status::corrupt(std::move(msg));
    return false;
  }
  bool is_metadata() const { return level_ == kInRoot && entry_.name == "__metadata__"; }
  bool is_array_field() const { return field_ == "shape" || field_ == "data_offsets"; }

  // A non-container value (`text` describes it for messages).
  bool scalar(const std::string& text) {
    if (skip_ > 0 || is_metadata()) return true;
    switch (level_) {
      case kOutside: return fail(file_ + ": header is " + text + ", expected a JSON object");
      case kInRoot: return fail(where() + ": entry is " + text + ", expected an object");
      case kInEntry:
        if (field_ == "dtype") return fail(where() + ": \"dtype\" is " + text + ", expected a string");
        if (is_array_field())
          return fail(where() + ": \"" + field_ + "\" is " + text + ", expected an array");
        return true;  // unknown fields are ignored
      case kInArray:
        return fail(where() + ": \"" + field_ + "\" must hold non-negative integers, got " + text);
    }
    return true;
  }

  bool push(uint64_t v) {
    if (field_ == "shape") {
      if (v > static_cast<uint64_t>(INT64_MAX))
        return fail(where() + ": dimension " + std::to_string(v) + " is impossibly large");
      entry_.shape->push_back(static_cast<int64_t>(v));
    } else {
      entry_.offsets->push_back(v);
    }
    return true;
  }

  bool open_container(bool object) {
    const char* what = object ? "an object" : "an array";
    if (skip_ > 0 || is_metadata()) return ++skip_, true;
    switch (level_) {
      case kOutside:
        if (!object) return fail(file_ + ": header is an array, expected a JSON object");
        level_ = kInRoot;
        return true;
      case kInRoot:
        if (!object) return fail(where() + ": entry is an array, expected an object");
        level_ = kInEntry;
        field_.clear();
        return true;
      case kInEntry:
        if (field_ == "dtype") return fail(where() + ": \"dtype\" is " + what + ", expected a string");
        if (!is_array_field()) return ++skip_, true;
        if (object) return fail(where() + ": \"" + field_ + "\" is an object, expected an array");
        if (field_ == "shape") entry_.shape.emplace(); else entry_.offsets.emplace();
        level_ = kInArray;
        return true;
      case kInArray:
        return fail(where() + ": \"" + field_ + "\" must hold non-negative integers, got " + what);
    }
    return true;
  }

  bool close_container() {
    if (skip_ > 0) return --skip_, true;
    switch (level_) {
      case kInArray: level_ = kInEntry; return true;
      case kInEntry: level_ = kInRoot; return finish_entry();
      case kInRoot: level_ = kOutside; return true;
      case kOutside: return true;
    }
    return true;
  }

  // Validates one complete entry; file_offset stays relative to the data section for now.
  bool finish_entry() {
    const RawEntry& r = entry_;
    if (!r.dtype) return fail(where() + ": entry has no \"dtype\"");
    if (!r.shape) return fail(where() + ": entry has no \"shape\"");
    if (!r.offsets) return fail(where() + ": entry has no \"data_offsets\"");
    const auto dt = parse_dtype(*r.dtype);
    if (!dt)
      return fail(where() + ": unknown dtype '" + *r.dtype +
                  "' (ktier reads F32, BF16, F16, U8, I32 and F8_E8M0)");
    if (r.shape->size() > kMaxTensorRank)
      return fail(where() + ": rank " + std::to_string(r.shape->size()) + " shape " +
                  shape_string(*r.shape) + " (ktier accepts rank <= " + std::to_string(kMaxTensorRank) + ")");
    // 2^48 elements (256 Ti) is thousands of times K3's largest tensor, and leaves the int64
    // products readers form from dimensions (an MXFP4 scale's columns times 32, times a byte
    // size) far from overflow. The product of the non-zero dimensions is what is bounded: a
    // zero would let any dimension after it through.
    constexpr unsigned __int128 kMaxElements = static_cast<unsigned __int128>(1) << 48;
    unsigned __int128 numel = 1, nonzero = 1;
    for (int64_t d : *r.shape) {
      numel *= static_cast<uint64_t>(d);
      if (d != 0) nonzero *= static_cast<uint64_t>(d);
      if (nonzero > kMaxElements)
        return fail(where() + ": shape " + shape_string(*r.shape) + " is impossibly large");
    }
    if (r.offsets->size() != 2)
      return fail(where() + ": \"data_offsets\" has " + std::to_string(r.offsets->size()) +
                  " values, expected [begin, end]");
    const uint64_t b = (*r.offsets)[0], e = (*r.offsets)[1];
    if (b > e)
      return fail(where() + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                  "] has begin > end");
    const unsigned __int128 need = numel * dtype_size(*dt);
    if (need != e - b)
      return fail(where() + ": shape " + shape_string(*r.shape) + " x " + std::string(dtype_name(*dt)) +
                  " needs " + std::to_string(static_cast<uint64_t>(need)) +
                  " bytes but data_offsets give " + std::to_string(e - b));
    Parsed p;
    p.info.name = std::move(entry_.name);
    p.info.dtype = *dt;
    p.info.shape = std::move(*entry_.shape);
    p.info.nbytes = e - b;
    p.begin = b;
    p.end = e;
    entries.push_back(std::move(p));
    return true;
  }

  std::string file_;
  Level level_ = kOutside;
  int skip_ = 0;  // > 0 while inside a value that is ignored (__metadata__, unknown fields)
  RawEntry entry_;
  std::string field_;
};

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this == &o) return *this;
  release();
  path_ = std::move(o.path_);
  mode_ = o.mode_;
  fd_ = std::exchange(o.fd_, -1);
  map_ = std::exchange(o.map_, nullptr);
  map_slot_ = std::exchange(o.map_slot_, -1);
  file_size_ = o.file_size_;
  device_ = o.device_;
  inode_ = o.inode_;
  data_offset_ = o.data_offset_;
  tensors_ = std::move(o.tensors_);
  by_name_ = std::move(o.by_name_);
  return *this;
}

SafetensorsFile::~SafetensorsFile() { release(); }

bool SafetensorsFile::same_file_as(int fd) const {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_dev) == device_ &&
         static_cast<uint64_t>(st.st_ino) == inode_;
}

void SafetensorsFile::release() {
  unregister_mapping(std::exchange(map_slot_, -1));
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), file_size_);
  if (fd_ >= 0) ::close(fd_);
  map_ = nullptr;
  fd_ = -1;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

Result<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path, OpenMode mode) {
  try {
    return open_unguarded(path, mode);
  } catch (const std::bad_alloc&) {
    return Status::out_of_memory(path.string() + ": out of memory while reading the header");
  } catch (const std::exception& e) {  // a bug; never escape
    return Status::runtime(path.string() + ": " + e.what());
  }
}

Result<SafetensorsFile> SafetensorsFile::open_unguarded(const std::filesystem::path& path,
                                                        OpenMode mode) {
  const std::string file = path.string();
  SafetensorsFile f;
  f.path_ = path;
  f.mode_ = mode;
  KTIER_ASSIGN_OR_RETURN(f.fd_, io::open_regular_file(path));
  struct stat st {};
  if (::fstat(f.fd_, &st) != 0) {
    const int err = errno;  // before the message's allocations
    return Status::runtime(file + ": cannot stat: " + errno_text(err));
  }
  f.file_size_ = static_cast<uint64_t>(st.st_size);
  f.device_ = static_cast<uint64_t>(st.st_dev);
  f.inode_ = static_cast<uint64_t>(st.st_ino);

  if (f.file_size_ < 8)
    return Status::corrupt(file + ": file is " + std::to_string(f.file_size_) +
                           " bytes, too short for the 8-byte header length");
  uint8_t len_bytes[8];
  if (int err = pread_full(f.fd_, len_bytes, 8, 0); err != 0)
    return Status::runtime(file + ": cannot read the header length: " +
                           (err < 0 ? std::string("unexpected end of file") : errno_text(err)));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > f.file_size_ - 8)
    return Status::corrupt(file + ": header length " + std::to_string(n) +
                           " is beyond the end of the file (" + std::to_string(f.file_size_) +
                           " bytes)");
  if (n > kMaxHeaderBytes)
    return Status::corrupt(file + ": header length " + std::to_string(n) + " exceeds ktier's " +
                           std::to_string(kMaxHeaderBytes) + "-byte limit");
  f.data_offset_ = 8 + n;
  const uint64_t data_len = f.file_size_ - f.data_offset_;

  std::string header(static_cast<size_t>(n), '\0');
  if (int err = pread_full(f.fd_, header.data(), n, 8); err != 0)
    return Status::runtime(file + ": cannot read the header: " +
                           (err < 0 ? std::string("unexpected end of file") : errno_text(err)));

  // As the format's reference reader: the JSON object begins the header (no byte-order mark)
  // and nothing but whitespace follows it. nlohmann alone skips a BOM and ends its input at a
  // NUL byte, so a header padded with NULs, or with bytes after one, would be read.
  if (header.empty() || header[0] != '{')
    return Status::corrupt(file + ": header does not begin with '{' (the format's JSON object)");
  if (const std::optional<size_t> nul = json_nul_byte(header))
    return Status::corrupt(file + ": header holds a NUL byte at byte " + std::to_string(8 + *nul) +
                           " (padding must be spaces)");
  HeaderSax sax(file);
  const bool parsed = json::sax_parse(header, &sax);
  if (!sax.error.is_ok()) return sax.error;
  if (!parsed) return Status::corrupt(file + ": header is not valid UTF-8 JSON");

  // File order: by begin, then end (an empty tensor before the one sharing its offset).
  auto& entries = sax.entries;
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.info.name < b.info.name;
  });
  f.tensors_.reserve(entries.size());
  f.by_name_.reserve(entries.size());
  for (auto& e : entries) {
    e.info.file_offset = f.data_offset_ + e.begin;
    if (!f.by_name_.emplace(e.info.name, f.tensors_.size()).second)
      return Status::corrupt(file + ": header names tensor '" + e.info.name + "' more than once");
    f.tensors_.push_back(std::move(e.info));
  }
  const HeaderSax::Parsed* prev = nullptr;  // the non-empty range that reaches furthest so far
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& r = entries[i];
    const std::string& name = f.tensors_[i].name;
    if (r.end > data_len)
      return Status::corrupt(file + ": truncated: tensor '" + name + "' needs data bytes [" +
                             std::to_string(r.begin) + ", " + std::to_string(r.end) +
                             ") but the data section holds " + std::to_string(data_len) +
                             " bytes (file is " + std::to_string(f.file_size_) + " bytes)");
    if (r.begin == r.end) continue;  // zero-length: may share its offset with a neighbour
    if (prev != nullptr && r.begin < prev->end)
      return Status::corrupt(file + ": tensors '" + f.tensors_[static_cast<size_t>(prev - entries.data())].name +
                             "' [" + std::to_string(prev->begin) + ", " + std::to_string(prev->end) +
                             ") and '" + name + "' [" + std::to_string(r.begin) + ", " +
                             std::to_string(r.end) + ") overlap");
    // The format indexes the whole data section, without holes: a header length off by a few
    // bytes still parses (the header ends in padding spaces) but shifts every tensor, and this
    // is what catches it.
    const uint64_t covered = prev == nullptr ? 0 : prev->end;
    if (r.begin > covered)
      return Status::corrupt(file + ": data bytes [" + std::to_string(covered) + ", " +
                             std::to_string(r.begin) + ") belong to no tensor (before '" + name +
                             "'): the header length (" + std::to_string(n) +
                             ") or the offsets are wrong");
    prev = &r;
  }
  if (const uint64_t covered = prev == nullptr ? 0 : prev->end; covered != data_len)
    return Status::corrupt(file + ": the tensors end at data byte " + std::to_string(covered) +
                           " but the data section holds " + std::to_string(data_len) +
                           " bytes (file is " + std::to_string(f.file_size_) +
                           " bytes): the header length (" + std::to_string(n) +
                           ") is wrong, or bytes were appended");

  if (mode == OpenMode::kMap) {
    void* p = ::mmap(nullptr, f.file_size_, PROT_READ, MAP_SHARED, f.fd_, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      return Status::runtime(file + ": mmap failed: " + errno_text(err));
    }
    f.map_ = static_cast<const uint8_t*>(p);
    f.map_slot_ = register_mapping(p, f.file_size_, file);
  }
  spdlog::debug("{}: {} tensors, header {} bytes, data at {}", file, f.tensors_.size(), n,
                f.data_offset_);
  return f;
}

std::span<const uint8_t> SafetensorsFile::bytes(const TensorInfo& t) const {
  KTIER_CHECK_MSG(map_ != nullptr, "SafetensorsFile::bytes needs OpenMode::kMap");
  KTIER_CHECK(t.file_offset >= data_offset_ && t.file_offset + t.nbytes <= file_size_);
  return {map_ + t.file_offset, static_cast<size_t>(t.nbytes)};
}

Status SafetensorsFile::read(const TensorInfo& t, void* dst) const {
  return read_bytes(t.file_offset, t.nbytes, dst)
      .with_context("tensor '" + t.name + "'");
}

Status SafetensorsFile::read_bytes(uint64_t file_offset, uint64_t nbytes, void* dst) const {
  KTIER_CHECK(file_offset <= file_size_ && nbytes <= file_size_ - file_offset);
  if (nbytes == 0) return Status::ok();
  if (map_ != nullptr) {
    std::memcpy(dst, map_ + file_offset, static_cast<size_t>(nbytes));
    return Status::ok();
  }
  int err = pread_full(fd_, dst, nbytes, file_offset);
  if (err > 0) err = pread_full(fd_, dst, nbytes, file_offset);  // once more, as the I/O engines
  if (err == 0) return Status::ok();
  return Status::runtime(path_.string() + ": read of " + std::to_string(nbytes) + " bytes at " +
                         std::to_string(file_offset) + " failed: " +
                         (err < 0 ? std::string("unexpected end of file (did it shrink?)")
                                  : errno_text(err) + ", read twice"));
}

}  // namespace ktier::format
