// `ktier pack`. See pack_writer.h for the contract and trunk_pack.h for the format.
#include "pack/pack_writer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <vector>

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "common/progress.h"
#include "common/xxh3_state.h"
#include "cpu/thread_pool.h"
#include "io/output_file.h"
#include "io/read_file.h"
#include "pack/block_codec.h"
#include "pack/trunk_pack.h"

namespace ktier::pack {
namespace fs = std::filesystem;

namespace {

using io::errno_text;

// The partial pack file: a staging buffer filled in place by shard reads and written with one
// write() per full buffer. Removes the partial file unless finish() succeeded.
class PartialFile {
 public:
  PartialFile(fs::path path, uint64_t buffer_bytes, ProgressMeter& meter)
      : path_(std::move(path)), buffer_(buffer_bytes), meter_(meter) {}
  PartialFile(const PartialFile&) = delete;
  PartialFile& operator=(const PartialFile&) = delete;
  ~PartialFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!finished_) ::unlink(path_.c_str());
  }

  Status open() {
    KTIER_ASSIGN_OR_RETURN(fd_, io::create_partial_file(path_));
    return Status::ok();
  }

  // Free buffer space for up to `max` bytes (at least one byte when max > 0); writes the buffer
  // out first when it is full.
  Result<std::span<uint8_t>> space(uint64_t max) {
    if (fill_ == buffer_.size()) KTIER_RETURN_IF_ERROR(flush());
    const uint64_t n = std::min<uint64_t>(max, buffer_.size() - fill_);
    return std::span<uint8_t>(buffer_.data() + fill_, n);
  }
  // The first `n` bytes of the last space() are now record bytes (hashed unless null).
  void commit(uint64_t n, XXH3_state_t* record_hash) {
    if (record_hash) XXH3_64bits_update(record_hash, buffer_.data() + fill_, n);
    fill_ += n;
    update_meter();
  }
  // A compressed record written: the meter counts its plain size (`size`, of the meter's total)
  // instead of the `stored` bytes written for it, so that it ends at its total.
  void count_as_plain(uint64_t size, uint64_t stored) {
    plain_less_stored_ += static_cast<int64_t>(size) - static_cast<int64_t>(stored);
    update_meter();
  }
  Status zeros(uint64_t n, XXH3_state_t* record_hash) {
    while (n > 0) {
      std::span<uint8_t> s;
      {
        KTIER_ASSIGN_OR_RETURN(s, space(n));
      }
      std::memset(s.data(), 0, s.size());
      commit(s.size(), record_hash);
      n -= s.size();
    }
    return Status::ok();
  }

  uint64_t bytes() const { return written_ + fill_; }

  // Appends `n` bytes (not hashed).
  Status append(const uint8_t* p, uint64_t n) {
    while (n > 0) {
      std::span<uint8_t> s;
      {
        KTIER_ASSIGN_OR_RETURN(s, space(n));
      }
      std::memcpy(s.data(), p, s.size());
      commit(s.size(), nullptr);
      p += s.size();
      n -= s.size();
    }
    return Status::ok();
  }

  // Writes what is buffered, fsyncs and closes. The file keeps its partial name.
  Status finish() {
    KTIER_RETURN_IF_ERROR(flush());
    if (::fsync(fd_) != 0) {
      const int err = errno;  // before the message's allocations
      return Status::runtime("cannot fsync " + path_.string() + ": " + errno_text(err));
    }
    const int rc = ::close(fd_);
    const int err = errno;
    fd_ = -1;
    if (rc != 0) return Status::runtime("cannot close " + path_.string() + ": " + errno_text(err));
    return Status::ok();
  }
  // After a successful rename: the destructor must not remove anything.
  void keep() { finished_ = true; }

 private:
  Status flush() {
    KTIER_RETURN_IF_ERROR(io::write_all(fd_, buffer_.data(), fill_, path_));
    written_ += fill_;
    fill_ = 0;
    return Status::ok();
  }

  fs::path path_;
  std::vector<uint8_t> buffer_;
  ProgressMeter& meter_;
  int64_t plain_less_stored_ = 0;  // over the compressed records written (count_as_plain)

  void update_meter() {
    meter_.update(static_cast<uint64_t>(static_cast<int64_t>(written_ + fill_) +
                                        plain_less_stored_));
  }
  int fd_ = -1;
  uint64_t fill_ = 0;
  uint64_t written_ = 0;
  bool finished_ = false;
};

// Keeps the kernel reading the shards ahead of the copy: posix_fadvise(WILLNEED) on the source
// ranges up to kPrefetchAhead bytes past the copy position, in the copy's order. Shard reads then
// find their pages cached or in flight, with many requests queued instead of readahead's few.
// Hints only: a failure to open or advise is ignored (the copy's own reads report errors).
class Prefetcher {
 public:
  static constexpr uint64_t kPrefetchAhead = uint64_t{256} << 20;
  static constexpr uint64_t kPrefetchStep = uint64_t{32} << 20;

  Prefetcher(const format::Checkpoint& ckpt, const PackLayout& layout) : ckpt_(ckpt), fds_(ckpt.num_shards(), -1) {
    for (const auto& rec : layout.sources)
      for (const format::TensorRef& t : rec) {
        if (t.info->nbytes == 0) continue;  // an advice of length 0 means "to the end of the file"
        if (!runs_.empty() && runs_.back().shard == t.shard &&
            runs_.back().offset + runs_.back().length == t.info->file_offset)
          runs_.back().length += t.info->nbytes;
        else
          runs_.push_back({t.shard, t.info->file_offset, t.info->nbytes});
      }
  }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;
  ~Prefetcher() {
    for (int fd : fds_)
      if (fd >= 0) ::close(fd);
  }

  // `copied`: source bytes the copy has read so far.
  void advance(uint64_t copied) {
    while (run_ < runs_.size() && advised_ < copied + kPrefetchAhead) {
      const Run& r = runs_[run_];
      const uint64_t n = std::min(kPrefetchStep, r.length - in_run_);
      int& fd = fds_[r.shard];
      if (fd == -1) fd = ::open(ckpt_.shard(r.shard).path().c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0)
        ::posix_fadvise(fd, static_cast<off_t>(r.offset + in_run_), static_cast<off_t>(n), POSIX_FADV_WILLNEED);
      advised_ += n;
      in_run_ += n;
      if (in_run_ == r.length) ++run_, in_run_ = 0;
    }
  }

 private:
  struct Run {
    uint32_t shard;
    uint64_t offset, length;
  };
  const format::Checkpoint& ckpt_;
  std::vector<int> fds_;
  std::vector<Run> runs_;  // source byte ranges in copy order, adjacent tensors merged
  size_t run_ = 0;
  uint64_t in_run_ = 0;
  uint64_t advised_ = 0;
};

Status write_small_file(const fs::path& path, const std::string& text) {
  KTIER_ASSIGN_OR_RETURN(const int fd, io::create_partial_file(path));
  if (Status written = io::write_all(fd, text.data(), text.size(), path); !written.is_ok()) {
    ::close(fd);
    return written;
  }
  const int synced = ::fsync(fd) == 0 ? 0 : errno;
  const int closed = ::close(fd) == 0 ? 0 : errno;  // closed whether or not fsync failed
  if (synced || closed)
    return Status::runtime("cannot write " + path.string() + ": " +
                           errno_text(synced ? synced : closed));
  return Status::ok();
}

// `dir`'s entries made durable. With `skip_unreadable`, a folder the user may not open for
// reading (write and search only) is left as it is.
Status fsync_dir(const fs::path& dir, bool skip_unreadable = false) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;  // before the message's allocations
    if (skip_unreadable && err == EACCES) return Status::ok();
    return Status::runtime("cannot open " + dir.string() + ": " + errno_text(err));
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // EINVAL/EOPNOTSUPP: a filesystem that does not sync folders (some FUSE and network ones),
  // where the renames are as durable as it makes them; failing would fail every pack there.
  if (rc != 0 && err != EINVAL && err != EOPNOTSUPP)
    return Status::runtime("cannot fsync " + dir.string() + ": " + errno_text(err));
  return Status::ok();
}

// One writer per folder, held from before the stale partials are removed to after the manifest
// is renamed: a second `ktier pack` into the folder would remove the first's partial as stale,
// and the first would then publish the second's half-written file. flock on the folder itself
// leaves no lock file; the kernel drops the lock however the process ends.
class FolderLock {
 public:
  FolderLock() = default;
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;
  ~FolderLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  Status take(const fs::path& dir) {
    fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ < 0) {
      const int err = errno;
      return Status::runtime("cannot open " + dir.string() + ": " + errno_text(err));
    }
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) return Status::ok();
    const int err = errno;
    if (err == EWOULDBLOCK)
      return Status::runtime(dir.string() + ": another ktier pack is writing this folder; wait "
                             "for it to end, or give another one");
    // A filesystem without locks: written as before locks were taken, one writer by custom.
    if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS) return Status::ok();
    return Status::runtime("cannot lock " + dir.string() + ": " + errno_text(err));
  }

 private:
  int fd_ = -1;
};

// The folders from `dir`'s parent up to `existing` (the deepest ancestor that was there before
// the pack created the rest), fsynced so that a power loss right after a pack keeps the new
// folders' entries, not only the files inside them. A parent the user may not open for reading
// (write and search only) is skipped: the pack itself is whole either way.
Status fsync_new_dir_entries(const fs::path& dir, const fs::path& existing) {
  if (dir == existing) return Status::ok();
  for (fs::path p = dir.parent_path(); !p.empty(); p = p.parent_path()) {
    KTIER_RETURN_IF_ERROR(fsync_dir(p, /*skip_unreadable=*/true));
    if (p == existing || p == p.parent_path()) break;
  }
  return Status::ok();
}

// The deepest ancestor of `dir` (itself included) that exists now.
fs::path deepest_existing(const fs::path& dir) {
  std::error_code ec;
  fs::path p = dir;
  while (!p.empty() && !fs::exists(p, ec) && p != p.parent_path()) p = p.parent_path();
  return p;
}

Status rename_file(const fs::path& from, const fs::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    const int err = errno;  // before the message's allocations
    return Status::runtime("cannot rename " + from.string() + " to " + to.string() + ": " +
                           errno_text(err));
  }
  return Status::ok();
}

// Fills [at, at + n) of record `ri`'s inflated bytes from the shards (zeros between tensors).
Status fill_range(const format::Checkpoint& ckpt, const PackLayout& layout, size_t ri, uint64_t at,
                  uint64_t n, uint8_t* dst) {
  std::memset(dst, 0, n);
  const Record& r = layout.records[ri];
  for (size_t k = 0; k < r.tensors.size(); ++k) {
    const TensorEntry& t = r.tensors[k];
    const uint64_t b = std::max(at, t.offset), e = std::min(at + n, t.offset + t.nbytes);
    if (b >= e) continue;
    const format::TensorRef& src = layout.sources[ri][k];
    KTIER_RETURN_IF_ERROR(
        ckpt.shard(src.shard).read_bytes(src.info->file_offset + (b - t.offset), e - b, dst + (b - at)));
  }
  return Status::ok();
}

// Writes layer record `ri` as compressed blocks (plan_blocks), `threads` blocks compressed at
// once; fills in its blocks, stored size and the xxh3 of its inflated bytes. `prefetch` is kept
// ahead of each batch's reads (a K3 layer record is up to 2.3 GB).
Status write_compressed_record(const format::Checkpoint& ckpt, PackLayout& layout, size_t ri,
                               const PackOptions& o, cpu::ThreadPool& pool, PartialFile& out,
                               XXH3_state_t* hash, uint64_t* copied, Prefetcher& prefetch) {
  Record& r = layout.records[ri];
  r.compressed = true;
  const std::vector<BlockPlan> plan = plan_blocks(r, o.block_size);
  const size_t batch = static_cast<size_t>(std::max(1, o.threads));
  std::vector<std::vector<uint8_t>> raw(batch), stored(batch);
  std::vector<Status> status(batch);
  for (size_t b0 = 0; b0 < plan.size(); b0 += batch) {
    const size_t n = std::min(batch, plan.size() - b0);
    for (size_t i = 0; i < n; ++i) {
      raw[i].resize(plan[b0 + i].inflated);
      KTIER_RETURN_IF_ERROR(fill_range(ckpt, layout, ri, plan[b0 + i].raw_offset, raw[i].size(), raw[i].data()));
      *copied += raw[i].size();
    }
    prefetch.advance(*copied);
    pool.parallel_for(static_cast<int64_t>(n), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        auto z = deflate_block(raw[i], plan[b0 + i].split, kZstdLevel);
        status[i] = z.is_ok() ? Status::ok() : z.status();
        if (z.is_ok()) stored[i] = std::move(z.value());
      }
    });
    for (size_t i = 0; i < n; ++i) {
      KTIER_RETURN_IF_ERROR(status[i]);
      Block k;
      k.offset = out.bytes();
      k.length = stored[i].size();
      k.inflated = raw[i].size();
      k.raw_offset = plan[b0 + i].raw_offset;
      k.xxh3 = XXH3_64bits(raw[i].data(), raw[i].size());
      XXH3_64bits_update(hash, raw[i].data(), raw[i].size());
      KTIER_RETURN_IF_ERROR(out.append(stored[i].data(), stored[i].size()));
      std::vector<uint8_t>().swap(stored[i]);  // not held through the next batch's deflate
      KTIER_RETURN_IF_ERROR(out.zeros(align_up(out.bytes(), kRecordAlignment) - out.bytes(), nullptr));
      r.blocks.push_back(k);
    }
  }
  r.stored_size = out.bytes() - r.offset;
  return Status::ok();
}

// Copies every record of `layout` into `out`, filling in the record checksums (and, compressing,
// the offsets, which then differ from the plain layout's).
Status copy_records(const format::Checkpoint& ckpt, PackLayout& layout, const PackOptions& o,
                    PartialFile& out) {
  const Xxh3State hash = new_xxh3_state();
  Prefetcher prefetch(ckpt, layout);
  uint64_t copied = 0;
  prefetch.advance(0);
  std::unique_ptr<cpu::ThreadPool> pool;
  if (o.block_size > 0) {
    pool = std::make_unique<cpu::ThreadPool>(std::max(1, o.threads));
    if (!pool->start_error().empty())
      spdlog::warn("threads: {}; compressing with {} (same pack)", pool->start_error(),
                   pool->size());
  }
  for (size_t ri = 0; ri < layout.records.size(); ++ri) {
    Record& r = layout.records[ri];
    XXH3_64bits_reset(hash.get());
    r.offset = out.bytes();
    r.stored_size = r.size;
    if (o.block_size > 0 && r.kind == RecordKind::kLayer) {
      KTIER_RETURN_IF_ERROR(
          write_compressed_record(ckpt, layout, ri, o, *pool, out, hash.get(), &copied, prefetch));
      r.xxh3 = XXH3_64bits_digest(hash.get());
      out.count_as_plain(r.size, r.stored_size);
      prefetch.advance(copied);
      continue;
    }
    uint64_t cursor = 0;
    for (size_t k = 0; k < r.tensors.size(); ++k) {
      const TensorEntry& t = r.tensors[k];
      const format::TensorRef& src = layout.sources[ri][k];
      const format::SafetensorsFile& shard = ckpt.shard(src.shard);
      KTIER_RETURN_IF_ERROR(out.zeros(t.offset - cursor, hash.get()));
      for (uint64_t done = 0; done < t.nbytes;) {
        std::span<uint8_t> s;
        {
          KTIER_ASSIGN_OR_RETURN(s, out.space(t.nbytes - done));
        }
        KTIER_RETURN_IF_ERROR(shard.read_bytes(src.info->file_offset + done, s.size(), s.data()));
        out.commit(s.size(), hash.get());
        done += s.size();
        copied += s.size();
        prefetch.advance(copied);
      }
      cursor = t.offset + t.nbytes;
    }
    KTIER_RETURN_IF_ERROR(out.zeros(r.size - cursor, hash.get()));
    r.xxh3 = XXH3_64bits_digest(hash.get());
  }
  return Status::ok();
}

// Whether `manifest` opens with a trunk pack's format line (the writer puts it first,
// trunk_layout.cpp): a manifest.json of another tool's is not ours to replace.
Result<bool> is_pack_manifest(const fs::path& manifest) {
  Result<int> fd = io::open_regular_file(manifest);
  if (!fd.is_ok() && fd.status().code() == ExitCode::kUsage) return false;  // a folder, a FIFO
  if (!fd.is_ok()) return fd.status();
  char head[256];
  const ssize_t n = ::pread(*fd, head, sizeof head, 0);
  const int err = errno;
  ::close(*fd);
  if (n < 0) return Status::runtime(manifest.string() + ": read error: " + io::errno_text(err));
  return std::string_view(head, static_cast<size_t>(n)).find(
             std::string("\"format\": \"") + kPackFormat + "\"") != std::string_view::npos;
}

}  // namespace

Status check_pack_output(const fs::path& out_dir, bool force) {
  std::error_code ec;
  if (fs::exists(out_dir, ec) && !fs::is_directory(out_dir, ec))
    return Status::usage(out_dir.string() + ": exists and is not a directory");
  const fs::path manifest = out_dir / kManifestFileName;
  if (fs::symlink_status(manifest, ec).type() != fs::file_type::not_found) {
    KTIER_ASSIGN_OR_RETURN(const bool ours, is_pack_manifest(manifest));
    if (!ours)
      return Status::usage(manifest.string() + " is not a trunk pack's manifest: ktier pack does "
                           "not replace it, --force or not (write the pack to another folder)");
  }
  if (force) return Status::ok();
  for (const char* name : {kManifestFileName, kPackFileName})
    if (fs::exists(out_dir / name, ec))
      return Status::usage(out_dir.string() + " already holds a trunk pack (" + name +
                           "); pass --force to replace it");
  return Status::ok();
}

Status check_block_size(uint64_t block_size) {
  if (block_size > 0 && (block_size % kRecordAlignment != 0 || block_size < kMinBlockSize ||
                         block_size > kMaxBlockSize))
    return Status::usage("--block-size " + std::to_string(block_size) + " must be a multiple of " +
                         std::to_string(kRecordAlignment) + " between " +
                         std::to_string(kMinBlockSize) + " and " + std::to_string(kMaxBlockSize) +
                         " bytes");
  return Status::ok();
}

Result<PackReport> write_trunk_pack(const format::Checkpoint& ckpt, const PackOptions& o) {
  try {
    const auto start = std::chrono::steady_clock::now();
    KTIER_RETURN_IF_ERROR(check_pack_output(o.out_dir, o.force));
    KTIER_RETURN_IF_ERROR(check_block_size(o.block_size));
    fs::path out_abs = fs::absolute(o.out_dir).lexically_normal();
    if (!out_abs.has_filename()) out_abs = out_abs.parent_path();  // "out/" names "out"
    const fs::path existed = deepest_existing(out_abs);
    KTIER_RETURN_IF_ERROR(io::create_output_dir(o.out_dir));
    FolderLock lock;
    KTIER_RETURN_IF_ERROR(lock.take(o.out_dir));
    // Again under the lock: a pack another run finished meanwhile needs --force as well.
    KTIER_RETURN_IF_ERROR(check_pack_output(o.out_dir, o.force));
    std::error_code ec;

    PackLayout layout = plan_trunk_pack(ckpt);
    SourceFingerprint source;
    {
      KTIER_ASSIGN_OR_RETURN(source, fingerprint_checkpoint(ckpt));
    }
    const fs::path pack_partial = o.out_dir / (std::string(".") + kPackFileName + ".partial");
    const fs::path manifest_partial =
        o.out_dir / (std::string(".") + kManifestFileName + ".partial");
    // A run killed mid-write (Ctrl-C, kill -9) leaves its hidden partials, as large as the pack;
    // they go before the free space is weighed, or a rerun on a disk that holds one pack is
    // refused for space the user cannot see.
    for (const fs::path& stale : {pack_partial, manifest_partial})
      KTIER_RETURN_IF_ERROR(io::remove_if_present(stale));
    // A compressed pack's size is known once written (its layer records shrink; K3 ~0.69): the
    // records stored plain (head, embedding) are what it needs at least, and a disk that fills
    // is the write's error (exit 1, naming the file).
    uint64_t need = layout.file_size;
    if (o.block_size > 0) {
      need = 0;
      for (const Record& r : layout.records)
        if (r.kind != RecordKind::kLayer) need += r.size;
    }
    const fs::space_info space = fs::space(o.out_dir, ec);
    if (!ec && space.available < need)
      return Status::runtime(o.out_dir.string() + ": trunk.pack needs " +
                             (o.block_size > 0 ? "at least " : "") + std::to_string(need) +
                             " bytes, only " + std::to_string(space.available) + " are free");

    PackReport rep;
    rep.pack_path = o.out_dir / kPackFileName;
    rep.manifest_path = o.out_dir / kManifestFileName;

    const uint64_t buffer = std::clamp<uint64_t>(align_up(layout.file_size, kRecordAlignment),
                                                 kRecordAlignment, align_up(o.buffer_bytes, kRecordAlignment));
    const uint64_t plain_size = layout.file_size;  // the meter's total, compressed or not
    ProgressMeter meter("pack", plain_size, o.progress);
    PartialFile out(pack_partial, buffer, meter);
    KTIER_RETURN_IF_ERROR(out.open());
    KTIER_RETURN_IF_ERROR(copy_records(ckpt, layout, o, out));
    if (o.block_size > 0) layout.file_size = out.bytes();
    if (out.bytes() != layout.file_size)  // the layout's own arithmetic; a bug if it fails
      return Status::runtime(pack_partial.string() + ": wrote " + std::to_string(out.bytes()) +
                             " bytes, the layout says " + std::to_string(layout.file_size));
    KTIER_RETURN_IF_ERROR(out.finish());

    Status s = write_small_file(manifest_partial, manifest_json(layout.records, layout.file_size, source, o.block_size));
    if (s.is_ok()) s = io::remove_if_present(rep.manifest_path);
    if (s.is_ok()) s = rename_file(pack_partial, rep.pack_path);
    // Renames not yet fsynced are not ordered: without this a power loss could bring back the
    // new manifest beside the old pack (refused at open, exit 3, but the old pack is lost too).
    if (s.is_ok()) s = fsync_dir(o.out_dir);
    if (s.is_ok()) {
      out.keep();
      s = rename_file(manifest_partial, rep.manifest_path);
    }
    if (!s.is_ok()) {
      ::unlink(manifest_partial.c_str());
      return s;
    }
    KTIER_RETURN_IF_ERROR(fsync_dir(o.out_dir));
    KTIER_RETURN_IF_ERROR(fsync_new_dir_entries(out_abs, existed));
    meter.finish(plain_size);

    rep.records = layout.records.size();
    rep.layers = layout.records.size() - 2;
    for (const Record& r : layout.records) rep.tensors += r.tensors.size();
    rep.payload_bytes = layout.payload_bytes;
    rep.file_size = layout.file_size;
    rep.expert_bytes = ckpt.census().experts.bytes;
    rep.ignored_bytes = ckpt.census().ignored.bytes;
    rep.block_size = o.block_size;
    for (const Record& r : layout.records) {
      if (r.kind != RecordKind::kLayer) continue;
      rep.blocks += r.blocks.size();
      rep.layer_bytes += r.size;
      rep.layer_stored += r.stored_size;
    }
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return rep;
  } catch (const std::bad_alloc&) {
    return Status::out_of_memory(o.out_dir.string() + ": out of memory while writing the pack");
  } catch (const std::exception& e) {  // filesystem errors; never escape
    return Status::runtime(o.out_dir.string() + ": " + e.what());
  }
}

std::string format_pack_report(const PackReport& r) {
  char buf[512];
  // MB/s of the tensors packed: the same work whether the layer records are compressed or not.
  const double mb_s = r.seconds > 0 ? static_cast<double>(r.payload_bytes) / r.seconds / 1e6 : 0.0;
  std::snprintf(buf, sizeof buf,
                "ktier pack: %llu records (%llu layers, head, embed), %llu tensors\n"
                "  trunk.pack   %llu bytes (%llu tensor bytes %s)\n"
                "  not packed   %llu expert bytes (read from the shards), %llu ignored bytes\n"
                "  time         %.2f s, %.0f MB/s of tensors\n",
                static_cast<unsigned long long>(r.records), static_cast<unsigned long long>(r.layers),
                static_cast<unsigned long long>(r.tensors), static_cast<unsigned long long>(r.file_size),
                static_cast<unsigned long long>(r.payload_bytes),
                r.block_size > 0 ? "+ alignment padding, the layer records compressed"
                                 : "+ alignment padding",
                static_cast<unsigned long long>(r.expert_bytes),
                static_cast<unsigned long long>(r.ignored_bytes), r.seconds, mb_s);
  std::string text = buf;
  if (r.block_size > 0) {
    std::snprintf(buf, sizeof buf,
                  "  compressed   layer records %llu -> %llu bytes (ratio %.4f), %llu blocks of <= %llu "
                  "bytes, zstd level %d, bf16 planes split\n",
                  static_cast<unsigned long long>(r.layer_bytes), static_cast<unsigned long long>(r.layer_stored),
                  r.layer_bytes ? static_cast<double>(r.layer_stored) / static_cast<double>(r.layer_bytes) : 1.0,
                  static_cast<unsigned long long>(r.blocks), static_cast<unsigned long long>(r.block_size),
                  kZstdLevel);
    text += buf;
  }
  return text + ("  -> " + r.manifest_path.parent_path().string() + "\n");
}

}  // namespace ktier::pack
