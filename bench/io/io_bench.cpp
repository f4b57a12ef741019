// ktier_io_bench: sequential read bandwidth of one large file through each I/O engine, next to a
// plain single-threaded pread loop (the `dd bs=4M iflag=direct` baseline of ANCHOR-ENGINE.md §2.4).
//
//   ktier_io_bench [--file PATH] [--size BYTES] [--block BYTES] [--depth N] [--runs N]
//                  [--json FILE] [--keep]
//
// The file (default /tmp/ktier-io-bench.bin, 2 GiB) is created with pseudo-random bytes if it
// is missing, and removed at the end unless --keep. A file that exists is only read, never
// written or removed (a model shard can be measured in place): one of another size than --size
// is refused, exit 2. Before every run the file's page cache is dropped with
// posix_fadvise(POSIX_FADV_DONTNEED), so buffered runs start cold too. Each run reads the whole
// file once; the best of --runs is reported (GB = 1e9 bytes).
//
// Modes:
//   raw-pread        one thread, pread of --block bytes at a time, no engine
//   <engine>-blocks  the engine with --depth requests of --block bytes outstanding (expert-like)
//   <engine>-stream  the engine reading 256 MiB requests into two slots (trunk-ring-like)
// each with O_DIRECT and buffered.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/size.h"
#include "io/aligned_buffer.h"
#include "io/io_engine.h"
#include "io/output_file.h"

using namespace ktier;
using namespace ktier::io;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string file = "/tmp/ktier-io-bench.bin";
  uint64_t size = uint64_t{2} << 30;
  uint64_t block = uint64_t{4} << 20;
  uint32_t depth = 32;
  int runs = 3;
  std::string json;
  bool keep = false;
};

struct Row {
  std::string mode;
  std::string io;  // direct | buffered
  double gbps = 0;
  double io_wait_share = 0;  // engine runs: CompletionQueue wait time / wall time
  std::string note;
};

// common/size.h's grammar, as every ktier size flag; exit 2 naming the flag otherwise.
uint64_t size_arg(const std::string& flag, const char* s) {
  const Result<uint64_t> r = parse_size(s);
  if (r.is_ok()) return *r;
  std::fprintf(stderr, "%s: %s\n", flag.c_str(), r.status().message().c_str());
  std::exit(2);
}

enum class BenchFile { kExisting, kCreated };

// The file to read: an existing one of --size bytes as it is, or a new one of pseudo-random
// bytes (O_EXCL: never one that appeared meanwhile). Exit code and message on failure.
Result<BenchFile> ensure_file(const Args& a) {
  struct stat st {};
  if (::stat(a.file.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) return Status::usage(a.file + ": exists and is not a regular file");
    if (static_cast<uint64_t>(st.st_size) == a.size) return BenchFile::kExisting;
    return Status::usage(a.file + ": exists with " + std::to_string(st.st_size) +
                         " bytes, not --size " + std::to_string(a.size) +
                         "; it is never overwritten: give --size " +
                         std::to_string(st.st_size) + " to read it, or another --file");
  }
  std::fprintf(stderr, "creating %s (%llu bytes)...\n", a.file.c_str(),
               static_cast<unsigned long long>(a.size));
  const int fd = ::open(a.file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Status::runtime(a.file + ": cannot create: " + std::strerror(errno));
  std::vector<uint64_t> block((8u << 20) / 8);
  uint64_t state = 12345;
  int err = 0;  // a short write without an error is a full disk
  for (uint64_t done = 0; err == 0 && done < a.size;) {
    for (uint64_t& w : block) w = (state = state * 6364136223846793005ull + 1442695040888963407ull);
    const uint64_t n = std::min<uint64_t>(a.size - done, block.size() * 8);
    const ssize_t wrote = ::write(fd, block.data(), n);
    if (wrote < 0) err = errno;
    else if (static_cast<uint64_t>(wrote) != n) err = ENOSPC;
    done += n;
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  const bool ok = err == 0;
  ::close(fd);
  if (!ok) {
    std::remove(a.file.c_str());
    return Status::runtime(a.file + ": cannot write: " + std::strerror(err));
  }
  return BenchFile::kCreated;
}

void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

Row make_row(std::string mode, bool direct, std::string note = "") {
  Row r;
  r.mode = std::move(mode);
  r.io = direct ? "direct" : "buffered";
  r.note = std::move(note);
  return r;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Plain loop: one pread of `block` at a time.
Row run_raw(const Args& a, bool direct) {
  Row row = make_row("raw-pread", direct);
  auto file = ReadFile::open(a.file, direct ? DirectMode::kDirect : DirectMode::kBuffered);
  if (!file.is_ok()) return make_row(row.mode, direct, file.status().message());
  // O_DIRECT lengths are whole blocks of the file's alignment: a file's last part (a shard's
  // size is rarely aligned) is asked for rounded up, and the read stops at the end of the file.
  const uint64_t align = file->alignment();
  auto buf = AlignedBuffer::allocate(align_up(a.block, align), std::max<uint64_t>(align, 4096));
  if (!buf.is_ok()) return make_row(row.mode, direct, buf.status().message());
  for (int run = 0; run < a.runs; ++run) {
    drop_cache(a.file);
    const auto t0 = Clock::now();
    for (uint64_t off = 0; off < a.size;) {
      const uint64_t want = align_up(std::min(a.block, a.size - off), align);
      const ssize_t n = pread(file->fd(), buf->data(), want, off);
      if (n <= 0) return make_row(row.mode, direct, "pread failed");
      off += static_cast<uint64_t>(n);
    }
    row.gbps = std::max(row.gbps, a.size / seconds_since(t0) / 1e9);
  }
  return row;
}

// Engine: `slots` requests of `request_bytes` outstanding, each completion refilled at once.
Row run_engine(const Args& a, IoBackend backend, bool direct, uint64_t request_bytes,
               uint32_t slots, const char* shape) {
  IoOptions opt;
  opt.backend = backend;
  opt.direct = direct ? DirectMode::kDirect : DirectMode::kBuffered;
  opt.queue_depth = a.depth;
  Row row = make_row("?", direct);
  auto engine = make_io_engine(opt);
  if (!engine.is_ok()) return make_row("?", direct, engine.status().message());
  row.mode = std::string((*engine)->name()) + "-" + shape;
  auto file = (*engine)->open(a.file);
  if (!file.is_ok()) return make_row(row.mode, direct, file.status().message());
  auto arena = AlignedBuffer::allocate(request_bytes * slots, kDefaultAlignment, HugePages::kYes);
  if (!arena.is_ok()) return make_row(row.mode, direct, arena.status().message());
  (void)(*engine)->register_buffer(arena->data(), arena->size());
  for (int run = 0; run < a.runs; ++run) {
    drop_cache(a.file);
    CompletionQueue cq(**engine);
    uint64_t next = 0;
    auto submit_slot = [&](uint64_t slot) {
      const uint64_t len = std::min(request_bytes, a.size - next);
      const ReadRequest r{&*file, next, len, arena->data() + slot * request_bytes, slot};
      next += len;
      return cq.submit({&r, 1});
    };
    const auto t0 = Clock::now();
    const uint64_t wait0 = cq.wait_ns();
    for (uint32_t s = 0; s < slots && next < a.size; ++s) {
      if (!submit_slot(s).is_ok()) return make_row(row.mode, direct, "submit failed");
    }
    std::vector<Completion> done;
    while (cq.outstanding() > 0) {
      done.clear();
      cq.wait(1, done);
      for (const Completion& c : done) {
        if (!c.status.is_ok()) return make_row(row.mode, direct, c.status.message());
        if (next < a.size && !submit_slot(c.tag).is_ok()) return make_row(row.mode, direct, "submit");
      }
    }
    const double s = seconds_since(t0);
    const double gbps = a.size / s / 1e9;
    if (gbps > row.gbps) {
      row.gbps = gbps;
      row.io_wait_share = (cq.wait_ns() - wait0) / 1e9 / s;
    }
  }
  (*engine)->unregister_buffer(arena->data());
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--file") a.file = val();
    else if (k == "--size") a.size = size_arg(k, val());
    else if (k == "--block") a.block = size_arg(k, val());
    else if (k == "--depth") a.depth = static_cast<uint32_t>(std::atoi(val()));
    else if (k == "--runs") a.runs = std::atoi(val());
    else if (k == "--json") a.json = val();
    else if (k == "--keep") a.keep = true;
    else {
      std::fprintf(stderr, "usage: %s [--file PATH] [--size BYTES] [--block BYTES] [--depth N] "
                           "[--runs N] [--json FILE] [--keep]\n", argv[0]);
      return 2;
    }
  }
  if (a.size == 0 || a.block == 0 || a.depth == 0 || a.runs <= 0) {
    std::fprintf(stderr, "sizes, depth and runs must be positive\n");
    return 2;
  }
  if (const Status can = check_can_write("--json", a.json); !can.is_ok()) {
    std::fprintf(stderr, "%s\n", can.message().c_str());
    return 1;
  }
  const Result<BenchFile> file = ensure_file(a);
  if (!file.is_ok()) {
    std::fprintf(stderr, "%s\n", file.status().message().c_str());
    return file.status().exit_code();
  }
  const uint64_t stream_bytes = uint64_t{256} << 20;
  std::vector<Row> rows;
  for (bool direct : {true, false}) {
    rows.push_back(run_raw(a, direct));
    for (IoBackend b : {IoBackend::kUring, IoBackend::kPread}) {
      rows.push_back(run_engine(a, b, direct, a.block, a.depth, "blocks"));
      rows.push_back(run_engine(a, b, direct, stream_bytes, 2, "stream"));
    }
  }
  std::printf("file %s, %.2f GB, block %llu KiB, depth %u, best of %d, page cache dropped\n",
              a.file.c_str(), a.size / 1e9, static_cast<unsigned long long>(a.block >> 10),
              a.depth, a.runs);
  std::printf("%-18s %-9s %8s %10s  %s\n", "mode", "io", "GB/s", "wait", "note");
  for (const Row& r : rows) {
    std::printf("%-18s %-9s %8.3f %9.0f%%  %s\n", r.mode.c_str(), r.io.c_str(), r.gbps,
                100 * r.io_wait_share, r.note.c_str());
  }
  if (*file == BenchFile::kCreated && !a.keep) std::remove(a.file.c_str());
  if (!a.json.empty()) {
    nlohmann::json results = nlohmann::json::array();
    for (const Row& r : rows)
      results.push_back({{"mode", r.mode}, {"io", r.io}, {"gbps", r.gbps},
                         {"io_wait_share", r.io_wait_share}});
    const nlohmann::json out{{"file", a.file}, {"bytes", a.size}, {"block", a.block},
                             {"depth", a.depth}, {"results", results}};
    const Status written = io::write_output_file(a.json, out.dump(2) + "\n");
    if (!written.is_ok()) {
      std::fprintf(stderr, "%s\n", written.message().c_str());
      return 1;
    }
  }
  return 0;
}
